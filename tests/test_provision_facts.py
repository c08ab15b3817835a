"""The provisioning facts script (golden file) and its parser, from answers recorded on Debian 12:
a bare host (the lab's debootstrap base: no Docker, no NVIDIA bits) and a lab host (Docker and compose
from the distribution, the nvidia-smi SIMULATOR without its card file), plus cut and hostile answers.
The parser never raises."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from llmfleet.provision import facts as F

DATA = Path(__file__).parent / "data" / "provision"
GOLDEN = Path(__file__).parent / "golden" / "provision"
QUERY = F.FactsQuery(user="deploy", folders=("/opt/llmfleet", "/srv/models"),
                     files=("/etc/security/limits.d/90-llmfleet.conf", "/etc/systemd/journald.conf"),
                     units=("docker.service", "nvidia-persistenced.service"))


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("LLMFLEET_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no golden file {name}; run with LLMFLEET_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(encoding="utf-8")


def test_facts_script_is_exactly_the_golden_file():
    _golden("facts.sh", F.facts_script("MARK", QUERY))


def test_inventory_values_are_quoted_in_the_script():
    script = F.facts_script("MARK", F.FactsQuery(user="x; reboot", folders=("/srv/m $(id)",), files=("/etc/a b",)))
    assert "id -nG -- 'x; reboot'" in script
    assert "'/srv/m $(id)'" in script and "'/etc/a b'" in script


def test_bare_debian_12_host():
    f = F.parse_facts((DATA / "facts_bare_bookworm.txt").read_text(), "MARK")
    assert f.complete and f.errors == []
    assert f.distro == ("debian", "12") and f.os["VERSION_CODENAME"] == "bookworm"
    assert f.arch == "amd64" and f.kernel
    assert f.packages == {} and f.holds == set() and f.dpkg_audit == ""
    assert f.smi == "absent" and f.driver_running is None and f.gpus == []
    assert f.docker_version is None and f.compose_version is None and f.ctk_version is None
    assert f.daemon_json is None and not f.nvidia_runtime
    assert not f.user_exists and f.groups == set()
    assert f.paths["/opt/llmfleet"].kind == "absent" and f.paths["/srv/models"].kind == "absent"
    assert not f.files["/etc/security/limits.d/90-llmfleet.conf"].present
    assert f.units["docker.service"] == ("absent", "unknown")
    assert not f.reboot_required


def test_lab_host_with_docker_and_a_failing_nvidia_smi():
    f = F.parse_facts((DATA / "facts_labhost_bookworm.txt").read_text(), "MARK")
    assert f.complete and f.errors == []
    assert f.installed("docker.io") == "20.10.24+dfsg1-1+deb12u1+b6"
    assert f.installed("docker-compose") == "2.26.1-4"
    assert f.installed("docker-ce") is None and f.packages["docker-ce"].status.strip() == "un"
    assert f.smi == "error" and "couldn't communicate with the NVIDIA driver" in f.smi_error
    assert f.driver_running is None
    assert f.docker_version is None  # the daemon does not run in the recording container
    assert f.compose_version == "2.26.1"
    assert f.user_exists and f.groups == {"deploy", "sudo", "docker"}
    assert f.paths["/srv/models"] == F.PathState("directory", "755", "root", "root")
    journald = f.files["/etc/systemd/journald.conf"]
    assert journald.present and journald.mode == "644" and b"Storage=volatile" in (journald.content or b"")
    assert f.units["docker.service"] == ("enabled", "unknown")


def _doc(**sections: str) -> str:
    out = [""]
    for name, body in sections.items():
        out += [f"==M== {name.replace('_', '-')}", body]
    return "\n".join(out + ["==M== done", ""])


def test_converged_host_sections():
    content = b"deploy soft memlock unlimited\n"
    text = _doc(
        os_release='ID=ubuntu\nVERSION_ID="24.04"',
        dpkg="nvidia-container-toolkit\t1.17.8-1\tii \nlibnvidia-container1:amd64\t1.17.8-1\tii \n"
             "nvidia-driver-570-server\t570.172.08-0ubuntu1\thi ",
        holds="nvidia-driver-570-server\nlibnvidia-container1:amd64",
        nvidia_smi="570.172.08, Tesla T4\n570.172.08, Tesla T4\nrc=0",
        docker="27.5.1", compose="2.33.1", ctk="NVIDIA Container Toolkit CLI version 1.17.8\ncommit: abc",
        daemon_json='{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}',
        user="deploy docker",
        paths="directory\t755\troot\troot\t/opt/llmfleet",
        files=f"644\troot\troot\t/etc/x\n{base64.b64encode(content).decode()}",
        units="nvidia-persistenced.service\tenabled\tactive",
        reboot_required="yes",
    )
    f = F.parse_facts(text, "M")
    assert f.errors == [] and f.complete
    assert f.distro == ("ubuntu", "24.04")
    assert f.installed("libnvidia-container1") == "1.17.8-1"
    assert f.installed("nvidia-driver-570-server") == "570.172.08-0ubuntu1"  # "hi": held, installed
    assert f.holds == {"nvidia-driver-570-server", "libnvidia-container1"}
    assert f.smi == "ok" and f.driver_running == "570.172.08" and f.gpus == ["Tesla T4", "Tesla T4"]
    assert (f.docker_version, f.compose_version, f.ctk_version) == ("27.5.1", "2.33.1", "1.17.8")
    assert f.nvidia_runtime
    assert f.files["/etc/x"].content == content
    assert f.units["nvidia-persistenced.service"] == ("enabled", "active")
    assert f.reboot_required


@pytest.mark.parametrize("text,error", [
    ("", "cut short"),
    ("\n==M== os-release\nID=debian\n==M== dpkg\nnvidia-driver\t535", "cut short"),
    (_doc(dpkg="garbage line"), "dpkg: unreadable line"),
    (_doc(daemon_json="{not json"), "daemon.json is not JSON"),
    (_doc(daemon_json="[1, 2]"), "not a JSON object"),
    (_doc(files="644\troot\troot\t/etc/x\n!!!notbase64"), "content not readable"),
    (_doc(paths="what"), "paths: unreadable line"),
])
def test_bad_answers_become_errors_never_exceptions(text, error):
    f = F.parse_facts(text, "M")
    assert any(error in e for e in f.errors), f.errors


def test_a_line_that_poses_as_a_section_needs_the_random_mark():
    text = _doc(os_release="ID=debian\n==OTHER== done\n==M==x", user="deploy")
    f = F.parse_facts(text, "M")
    assert f.os == {"ID": "debian"} and f.user_exists


@pytest.mark.parametrize("body,state,running", [
    ("absent", "absent", None),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\nrc=9", "error", None),
    ("No devices were found\nrc=6", "error", None),
    ("535.247.01, Tesla V100-SXM2-32GB\nrc=0", "ok", "535.247.01"),
    ("535.247.01, Tesla V100-SXM2-32GB\nrc=", "ok", "535.247.01"),
])
def test_nvidia_smi_section(body, state, running):
    f = F.parse_facts(_doc(nvidia_smi=body), "M")
    assert (f.smi, f.driver_running) == (state, running)


@pytest.mark.parametrize("pkg,running,same", [
    ("535.247.01-1~deb12u1", "535.247.01", True),
    ("1:570.172.08-0ubuntu1", "570.172.08", True),
    ("550.163.01-1", "535.247.01", False),
    ("550.163.01-1", None, False),
    (None, "535.247.01", False),
])
def test_driver_matches(pkg, running, same):
    assert F.driver_matches(pkg, running) is same
