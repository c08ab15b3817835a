"""Desired state vs facts -> steps (pure): a converged host gives none; each difference gives exactly
its step with human changes and the exact script (golden files under tests/golden/provision/)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from llmfleet.errors import UsageError
from llmfleet.inventory.services import HostSettings
from llmfleet.provision import desired as D
from llmfleet.provision import steps as S
from llmfleet.provision.facts import FileState, PathState, PkgState, ProvisionFacts

GOLDEN = Path(__file__).parent / "golden" / "provision"
SETTINGS = HostSettings.model_validate({
    "gpu": "Tesla V100-SXM2-32GB",
    "services": [{"name": "tiny", "engine": "llamacpp", "model": "tiny-qwen2", "image": "llamacpp:lab-cpu",
                  "model_path": "/srv/models/tiny-qwen2-gguf/tiny-qwen2.gguf", "port": 8000}],
})


def bare() -> ProvisionFacts:
    return ProvisionFacts(complete=True, os={"ID": "debian", "VERSION_ID": "12"}, kernel="6.1.0-28-amd64",
                          arch="amd64", user_exists=True, groups={"deploy", "sudo"})


def desired(facts: ProvisionFacts | None = None, **kw) -> D.Desired:
    return D.desired_state("gpu-bare-01", SETTINGS, facts or bare(), user="deploy", **kw)


def converged(d: D.Desired) -> ProvisionFacts:
    f = bare()
    for p in d.packages:
        f.packages[p.name] = PkgState(p.version or "1.0-1", "hi " if p.hold else "ii ")
    f.holds = {p.name for p in d.packages if p.hold}
    driver = f.packages[d.driver_package].version
    f.smi, f.driver_running, f.gpus = "ok", driver.rsplit("-", 1)[0], ["Tesla V100-SXM2-32GB"]
    f.daemon_json = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}
    f.groups |= set(d.groups)
    for folder in d.folders:
        f.paths[folder.path] = PathState("directory", f"{folder.mode:o}", folder.owner, folder.group)
    for mf in d.files:
        f.files[mf.path] = FileState(True, f"{mf.mode:o}", mf.owner, mf.group, mf.content.encode())
    f.units = {D.DOCKER_UNIT: ("enabled", "active"), D.PERSISTENCE_UNIT: ("enabled", "active")}
    return f


def names(steps: list[S.Step]) -> list[str]:
    return [s.name for s in steps]


def test_a_converged_host_gives_no_steps():
    d = desired()
    assert S.plan_steps(d, converged(d)) == []


def test_a_bare_host_gives_every_step_in_order_and_one_reboot():
    d = desired()
    steps = S.plan_steps(d, bare())
    assert names(steps) == ["sources", "packages-runtime", "toolkit", "driver", "hold", "files", "user", "folders",
                            "docker-runtime-config", "persistence"]
    assert steps[0].changes == (f"write {D.DRIVER_PIN_FILE} (new, 0644 root:root)",)
    assert [s.name for s in steps if s.reboot] == ["driver"]
    assert sum(s.script.count("apt-get -q update") for s in steps) == 1  # once, in the first apt step
    persistence = steps[-1]
    assert "--now" not in persistence.script  # the driver is not loaded before the reboot
    for s in steps:
        assert s.changes and all(isinstance(c, str) and c for c in s.changes)


@pytest.mark.parametrize("name,change", [
    ("packages-runtime", lambda f: f.packages.pop("docker.io")),
    ("toolkit", lambda f: f.packages.__setitem__("nvidia-container-toolkit", PkgState("1.17.4-1", "hi "))),
    ("hold", lambda f: f.holds.discard("nvidia-container-toolkit")),
    ("files", lambda f: f.files.pop(D.JOURNALD_FILE)),
    ("user", lambda f: f.groups.discard("docker")),
    ("folders", lambda f: f.paths.pop("/opt/llmfleet")),
    ("docker-runtime-config", lambda f: setattr(f, "daemon_json", None)),
    ("persistence", lambda f: f.units.__setitem__(D.PERSISTENCE_UNIT, ("disabled", "inactive"))),
    ("dpkg-repair", lambda f: setattr(f, "dpkg_audit", "The following packages are only half configured")),
])
def test_one_difference_gives_its_step(name, change):
    d = desired()
    f = converged(d)
    change(f)
    got = S.plan_steps(d, f)
    assert name in names(got)
    assert not any(s.reboot for s in got)
    # a changed held package is unheld for the install and held again after
    if name == "toolkit":
        assert names(got) == ["toolkit", "hold"]
        assert "apt-mark unhold nvidia-container-toolkit" in got[0].script
        want = next(p.version for p in d.packages if p.name == "nvidia-container-toolkit")
        assert got[0].changes == (f"change nvidia-container-toolkit 1.17.4-1 -> {want}",)


def test_a_driver_change_reboots_once():
    d = desired(pinned_branch=580)
    f = converged(desired(pinned_branch=535))  # runs the R535 driver
    got = S.plan_steps(d, f)
    assert names(got) == ["sources", "driver", "hold"]
    assert "-Pin: version 535.247.01-1~deb12u1\n+Pin: version 580.95.05-1\n" in got[0].diff  # the apt pin moves
    assert got[1].reboot and any("reboot" in c for c in got[1].changes)


def test_an_installed_driver_not_yet_running_asks_for_a_reboot_only():
    d = desired()
    f = converged(d)
    f.smi, f.driver_running, f.gpus = "absent", None, []
    got = S.plan_steps(d, f)
    assert names(got) == ["reboot"] and got[0].script == "" and got[0].reboot
    assert "is not the running one" in got[0].changes[0]


def test_a_changed_file_shows_a_diff_and_its_mode():
    d = desired()
    f = converged(d)
    f.files[D.LIMITS_FILE] = FileState(True, "600", "root", "root", b"deploy soft memlock 64\n")
    (step,) = S.plan_steps(d, f)
    assert step.name == "files"
    assert step.changes == (f"write {D.LIMITS_FILE} (content, mode 600 -> 0644)",)
    assert "-deploy soft memlock 64" in step.diff and "+deploy hard memlock unlimited" in step.diff


def test_a_sources_file_runs_apt_update_before_the_installs():
    src = D.ManagedFile("/etc/apt/sources.list.d/site.sources", "Types: deb\n", step="sources")
    d = desired(extra_files=[src])
    steps = S.plan_steps(d, bare())
    assert names(steps)[0] == "sources" and steps[0].script.endswith("apt-get -q update")
    assert "apt-get -q update" not in steps[1].script


def test_no_card_known_is_a_one_line_usage_error():
    with pytest.raises(UsageError, match=r"llmfleet_gpu unset\); set llmfleet_gpu"):
        D.desired_state("h", HostSettings.model_validate({}), bare(), user="deploy")


def test_nvidia_smi_cards_win_over_the_inventory():
    f = bare()
    f.gpus = ["Tesla T4"]
    assert desired(f).cards == ("Tesla T4",)


def test_unsupported_distribution_is_refused_naming_the_host():
    f = bare()
    f.os = {"ID": "fedora", "VERSION_ID": "41"}
    with pytest.raises(UsageError, match=r"^host gpu-bare-01: unsupported distribution .fedora 41.: .*debian 12"):
        desired(f)


def test_root_login_needs_no_groups():
    d = D.desired_state("h", SETTINGS, bare(), user="root")
    f = converged(d)
    f.groups = set()
    assert S.plan_steps(d, f) == []


def test_model_folders_belong_to_the_deploy_user():
    d = desired()
    assert [(x.path, x.owner) for x in d.folders] == [("/opt/llmfleet", "root"), ("/srv/models/tiny-qwen2-gguf", "deploy")]


# -- golden scripts ------------------------------------------------------------------------------


def _golden_steps() -> dict[str, str]:
    d = dataclasses.replace(desired(), user="deploy")
    out = {f"step_{s.name}.sh": s.script for s in S.plan_steps(d, bare())}
    f = converged(d)
    f.dpkg_audit = "half configured"
    out["step_dpkg-repair.sh"] = S.plan_steps(d, f)[0].script
    return out


@pytest.mark.parametrize("name", sorted(_golden_steps()))
def test_step_script_is_exactly_the_golden_file(name):
    text = _golden_steps()[name] + "\n"
    path = GOLDEN / name
    if os.environ.get("LLMFLEET_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no golden file {name}; run with LLMFLEET_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(encoding="utf-8")
