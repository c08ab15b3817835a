"""The lab package repository's pure parts: stand-in NVIDIA packages (SIMULATOR), repository indexes,
the nvidia-ctk and nvidia-smi simulators' stand-in behaviour, bare host argv."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest
import yaml

from llmfleet.errors import UsageError
from llmfleet.inventory.ansible import load_inventory
from llmfleet.lab import aptrepo, hosts, nvidia_ctk_sim, nvidia_smi_sim, standin_debs

ROOT = Path(__file__).resolve().parents[1]
SMI = (ROOT / "src/llmfleet/lab/nvidia_smi_sim.py").read_text()
CTK = (ROOT / "src/llmfleet/lab/nvidia_ctk_sim.py").read_text()


def _all():
    return standin_debs.all_standins(smi_source=SMI, ctk_source=CTK, kernel_release="6.1.0-28-amd64")


def _by(name: str, version: str) -> standin_debs.StandinDeb:
    return next(d for d in _all() if d.name == name and d.version == version)


def test_every_package_name_and_version_is_unique_and_valid():
    debs = _all()
    assert len({(d.name, d.version) for d in debs}) == len(debs)
    for d in debs:
        assert d.name == d.name.lower() and " " not in d.name and d.filename.endswith(f"_{d.architecture}.deb")


def test_the_catalogs_debian_12_pins_resolve_in_the_lab_repository():
    """What provisioning installs on the lab's Debian 12 bare hosts (catalog/provisioning.yaml) is there."""
    text = resources.files("llmfleet.knowledge.catalog").joinpath("provisioning.yaml").read_text()
    cat = yaml.safe_load(text)
    have = {(d.name, d.version) for d in _all()}
    for drv in cat["distributions"]["debian-12"]["drivers"]:
        for pkg in drv["packages"]:
            assert (pkg, drv["deb_version"]) in have, (pkg, drv["deb_version"])
    for pkg in cat["toolkit"]["packages"]:
        assert (pkg, cat["toolkit"]["deb_version"]) in have
    assert ("nvidia-persistenced", "535.247.01-1~deb12u1") in have
    assert {"linux-headers-amd64", "linux-headers-6.1.0-28-amd64"} <= {d.name for d in _all()}


@pytest.mark.parametrize("version,kmod,smi,meta", [
    ("535.247.01", "nvidia-kernel-dkms", "nvidia-smi", "nvidia-driver"),
    ("580.95.05", "nvidia-kernel-dkms", "nvidia-smi", "nvidia-driver"),
    ("470.256.02", "nvidia-tesla-470-kernel-dkms", "nvidia-tesla-470-smi", "nvidia-tesla-470-driver"),
])
def test_driver_packages_pin_each_other_and_carry_the_module_version(version, kmod, smi, meta):
    debs = {d.name: d for d in standin_debs.driver_debs(version, SMI)}
    v = debs[meta].version
    assert debs[meta].depends == (f"{kmod} (= {v})", f"{smi} (= {v})")
    module = {f.path: f for f in debs[kmod].files}[nvidia_smi_sim.MODULE_PATH]
    assert module.content.decode().strip() == version
    # only one module and one nvidia-smi at a time: apt swaps branches instead of failing on file clashes
    assert debs[kmod].conflicts == debs[kmod].provides == debs[kmod].replaces == ("nvidia-kernel-module",)
    assert debs[smi].conflicts == debs[smi].provides == ("nvidia-smi-binary",)
    assert {f.path: f.mode for f in debs[smi].files} == {"/usr/bin/nvidia-smi": 0o755}
    assert "/run/reboot-required" in dict(debs[kmod].scripts)["postinst"]


def test_toolkit_packages_depend_with_equal_versions_and_ship_the_stand_in_ctk():
    debs = {d.name: d for d in standin_debs.toolkit_debs("1.19.1", CTK)}
    assert debs["nvidia-container-toolkit"].depends == (
        "nvidia-container-toolkit-base (= 1.19.1-1)", "libnvidia-container-tools (= 1.19.1-1)")
    files = {f.path: f for f in debs["nvidia-container-toolkit-base"].files}
    assert 'VERSION = "1.19.1"' in files["/usr/bin/nvidia-ctk"].content.decode()
    assert files["/usr/bin/nvidia-ctk"].mode == 0o755
    assert "/usr/bin/nvidia-container-runtime-hook" in {f.path for f in debs["nvidia-container-toolkit"].files}
    assert debs["nvidia-container-toolkit-base"].conffiles == ("/etc/nvidia-container-runtime/config.toml",)


def test_control_text_names_the_simulator():
    text = standin_debs.control_text(_by("nvidia-driver", "570.172.08-1"))
    fields = dict(aptrepo.parse_control(text))
    assert fields["Package"] == "nvidia-driver" and fields["Version"] == "570.172.08-1"
    assert fields["Depends"] == "nvidia-kernel-dkms (= 570.172.08-1), nvidia-smi (= 570.172.08-1)"
    assert fields["Architecture"] == "amd64" and "SIMULATOR" in fields["Description"]
    assert "Conflicts" not in fields  # empty fields are left out


def test_bad_kernel_release_gives_no_headers_stand_in():
    assert standin_debs.headers_debs("6.1; rm -rf /") == []


@pytest.mark.skipif(not shutil.which("dpkg-deb"), reason="needs dpkg-deb")
def test_built_deb_holds_control_files_and_scripts(tmp_path):
    deb = standin_debs.build_deb(_by("nvidia-kernel-dkms", "550.163.01-1"), tmp_path)
    info = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    assert dict(aptrepo.parse_control(info))["Version"] == "550.163.01-1"
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "root/root" in listing and "./usr/lib/llmfleet-sim/nvidia-kernel-module" in listing
    body = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    assert b"550.163.01\n" in body
    scripts = subprocess.run(["dpkg-deb", "-I", str(deb), "postinst"], capture_output=True, text=True).stdout
    assert "reboot-required" in scripts


def test_packages_stanza_puts_where_and_hashes_before_description():
    control = "Package: tini\nVersion: 0.19.0-1+b3\nArchitecture: amd64\nDescription: tiny init\n more text\n"
    stanza = aptrepo.packages_stanza(control, "pool/main/tini_0.19.0-1+b3_amd64.deb", 12, "m" * 32, "s" * 64)
    keys = [k for k, _ in aptrepo.parse_control(stanza)]
    assert keys == ["Package", "Version", "Architecture", "Filename", "Size", "MD5sum", "SHA256", "Description"]
    assert stanza.endswith("Description: tiny init\n more text\n")


def test_packages_index_is_sorted_and_separated_by_blank_lines():
    a = "Package: b\nVersion: 1\nFilename: pool/main/b_1.deb\n"
    b = "Package: a\nVersion: 2\nFilename: pool/main/a_2.deb\n"
    c = "Package: a\nVersion: 1\nFilename: pool/main/a_1.deb\n"
    assert aptrepo.packages_index([a, b, c]) == f"{c}\n{b}\n{a}"


def test_pool_name_drops_the_epoch():
    control = "Package: dmsetup\nVersion: 2:1.02.185-2\nArchitecture: amd64\n"
    assert aptrepo.pool_name(control) == "dmsetup_1.02.185-2_amd64.deb"


def test_release_lists_every_index_with_its_size_and_hashes():
    data = b"Package: x\n"
    packed = gzip.compress(data, mtime=0)
    text = aptrepo.release_text({"main/binary-amd64/Packages": data, "main/binary-amd64/Packages.gz": packed},
                                date=0)
    fields = dict(aptrepo.parse_control(text))
    assert fields["Codename"] == "bookworm" and fields["Components"] == "main non-free non-free-firmware"
    assert fields["Date"] == "Thu, 01 Jan 1970 00:00:00 UTC"
    sha = hashlib.sha256(data).hexdigest()
    assert f" {sha} {len(data):>8} main/binary-amd64/Packages" in text.splitlines()
    assert f" {hashlib.md5(packed).hexdigest()} {len(packed):>8} main/binary-amd64/Packages.gz" in text.splitlines()


def test_bare_image_source_is_the_repositorys():
    lines = (ROOT / "dockerfiles/lab-bare/llmfleet-lab.sources").read_text().splitlines()
    assert "\n".join(ln for ln in lines if not ln.startswith("#")) + "\n" == aptrepo.host_sources()


def test_fetch_script_quotes_package_names():
    script = aptrepo.fetch_script(("docker.io", "docker-compose/trixie", "x;y"))
    assert "--download-only --no-install-recommends" in script and "'x;y'" in script


# -- nvidia-ctk SIMULATOR ----------------------------------------------------------------------------


def test_ctk_configure_keeps_the_lab_settings_and_adds_the_runtime():
    current = json.dumps({"bip": "10.199.0.1/24", "runtimes": {"other": {"path": "x"}}})
    out = json.loads(nvidia_ctk_sim.configure_docker(current))
    assert out["bip"] == "10.199.0.1/24" and out["runtimes"]["other"] == {"path": "x"}
    assert out["runtimes"]["nvidia"] == {"args": [], "path": "nvidia-container-runtime"}
    assert "default-runtime" not in out
    assert json.loads(nvidia_ctk_sim.configure_docker(None, set_as_default=True))["default-runtime"] == "nvidia"


def test_ctk_run():
    files: dict[str, str] = {}
    out, err, rc = nvidia_ctk_sim.run(["runtime", "configure", "--runtime=docker"], files.get, files.__setitem__)
    assert rc == 0 and "does not exist" in err and "nvidia" in json.loads(files["/etc/docker/daemon.json"])["runtimes"]
    assert nvidia_ctk_sim.run(["--version"], files.get, files.__setitem__, version="1.19.1")[0].startswith(
        "NVIDIA Container Toolkit CLI version 1.19.1\n")
    assert nvidia_ctk_sim.run(["runtime", "configure", "--runtime=containerd"], files.get, files.__setitem__)[2] == 1
    files["/bad.json"] = "[1]"
    assert nvidia_ctk_sim.run(["runtime", "configure", "--config", "/bad.json"], files.get, files.__setitem__)[2] == 1


# -- nvidia-smi SIMULATOR with the stand-in driver -----------------------------------------------------


@pytest.mark.parametrize("installed,loaded,rc,driver", [
    (None, None, 0, "535.183.01"),  # no stand-in package: the lab host's configured driver
    ("570.172.08", None, nvidia_smi_sim.DEAD_DRIVER_RC, None),  # installed, not rebooted yet
    ("570.172.08", "535.247.01", nvidia_smi_sim.MISMATCH_RC, None),  # upgraded, not rebooted yet
    ("570.172.08", "570.172.08", 0, "570.172.08"),
])
def test_standin_driver(installed, loaded, rc, driver):
    cfg = {"driver_version": "535.183.01", "cuda_version": "12.2", "gpus": []}
    out, message, code = nvidia_smi_sim.standin_driver(cfg, installed, loaded)
    assert code == rc
    assert (out or {}).get("driver_version") == driver
    if driver == "570.172.08":
        assert out["cuda_version"] == "12.8"
    if rc == nvidia_smi_sim.MISMATCH_RC:
        assert message == "Failed to initialize NVML: Driver/library version mismatch\n"


# -- bare hosts -----------------------------------------------------------------------------------------


def test_bare_host_argv():
    spec = hosts.HostSpec(name="gpu-bare-01", port=2241, gpu="Tesla T4", driver="535", gpu_count=1, lab="l",
                          bare=True)
    argv = hosts.run_argv(spec, image="bare:1", mode="restricted", network="l", public_key="k",
                          apt_keyring_b64="QUJD")
    assert argv[argv.index("--restart") + 1] == "unless-stopped"  # a reboot brings it back
    assert "LAB_APT_KEYRING=QUJD" in argv and not any(a.startswith("LAB_DRIVER_VERSION_FILE=") for a in argv)
    plain = hosts.run_argv(hosts.HostSpec(name="gpu-t4-01", port=2204, gpu="Tesla T4", driver="470", gpu_count=1,
                                          lab="l"), image="h:1", mode="restricted", network="l", public_key="k")
    assert "--restart" not in plain


def test_lab_inventory_bare_hosts():
    inv = load_inventory(str(ROOT / "inventory/lab"))
    specs = {s.name: s for s in hosts.host_specs(inv, "t", ["gpu-bare-01", "gpu-bare-02"])}
    assert specs["gpu-bare-01"].bare and specs["gpu-bare-01"].gpu == "Tesla V100-SXM2-32GB"
    assert specs["gpu-bare-02"].bare and specs["gpu-bare-02"].gpu == "Tesla T4"


def test_lab_bare_must_be_a_boolean(tmp_path):
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    a: {ansible_host: 127.0.0.1, ansible_port: 2201, lab_gpu: Tesla T4, lab_bare: 'yes'}\n")
    with pytest.raises(UsageError, match="lab_bare must be true or false"):
        hosts.host_specs(load_inventory(str(tmp_path)), "t")
