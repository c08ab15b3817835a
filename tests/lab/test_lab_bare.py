"""A bare lab host: real apt from the lab package repository, a hold, a reboot over SSH, and the
stand-in driver (SIMULATOR) reported by nvidia-smi only after that reboot."""

from __future__ import annotations

import socket
import time

import pytest

pytestmark = pytest.mark.lab

# gpu-bare-02: this test changes its host for good; tests/lab/test_provision.py needs gpu-bare-01 bare
HOST = "gpu-bare-02"
APT = "DEBIAN_FRONTEND=noninteractive apt-get -y -q -o Dpkg::Options::=--force-confold"
OLD, NEW = "535.247.01-1~deb12u1", "570.172.08-1"
DRIVER = ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi")


def _banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.settimeout(0.5)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _reboot(lab, host: str, timeout: float = 60) -> float:
    """``systemctl reboot`` over SSH as the deploy user; seconds until sshd answers again (bounded)."""
    port = lab.port(host)
    t0 = time.monotonic()
    with lab.connect(host) as remote:
        try:
            remote.run("systemctl reboot", sudo=True, check=False, timeout=10)
        except Exception:  # noqa: BLE001 - the host may drop the connection while it goes down
            pass
    went = False
    while time.monotonic() - t0 < timeout:
        up = _banner(port)
        went = went or not up
        if went and up:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"{host} not back on 127.0.0.1:{port} within {timeout:.0f}s (went down: {went})")


def _sh(lab, script: str, check: bool = True):
    return lab.exec(HOST, ["sh", "-c", script], check=check, timeout=300)


def test_bare_host_installs_holds_and_reboots_into_the_new_driver(lab):
    lab.ensure_hosts(HOST)
    # bare: no Docker, no nvidia-smi, the deploy user outside the docker group, apt only from lab-apt
    assert _sh(lab, "command -v docker nvidia-smi", check=False).returncode != 0
    assert "docker" not in _sh(lab, "id -nG deploy").stdout.split()
    _sh(lab, "apt-get update -q")
    pinned = " ".join(f"{p}={OLD}" for p in DRIVER)
    _sh(lab, f"{APT} install docker.io docker-compose {pinned} nvidia-container-toolkit=1.19.1-1")
    _sh(lab, "apt-mark hold " + " ".join(DRIVER))
    assert set(_sh(lab, "apt-mark showhold").stdout.split()) == set(DRIVER)
    # a held driver stays where it is through an upgrade
    _sh(lab, f"{APT} upgrade")
    assert _sh(lab, "dpkg-query -W -f '${Version}' nvidia-driver").stdout == OLD
    # installed, not yet rebooted: no module loaded, as with a real driver
    smi = _sh(lab, "nvidia-smi", check=False)
    assert smi.returncode == 9 and "couldn't communicate with the NVIDIA driver" in smi.stdout
    assert _sh(lab, "test -e /run/reboot-required", check=False).returncode == 0
    assert "NVIDIA Container Toolkit CLI version 1.19.1" in _sh(lab, "nvidia-ctk --version").stdout

    seconds = _reboot(lab, HOST)
    print(f"{HOST}: reboot to SSH banner in {seconds:.2f}s")
    with lab.connect(HOST) as remote:
        out = remote.run("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
    assert out.stdout.strip() == "Tesla T4, 535.247.01"
    assert _sh(lab, "test -e /run/reboot-required", check=False).returncode != 0
    # Docker came back with the host (it may still be starting when sshd already answers: bounded wait)
    assert _sh(lab, "for i in $(seq 1 120); do systemctl is-active -q docker && break; sleep 0.5; done; "
                    "systemctl is-active docker").stdout.strip() == "active"
    assert set(_sh(lab, "apt-mark showhold").stdout.split()) == set(DRIVER)  # holds survive the reboot

    # an upgrade: the old module stays loaded until the next boot (NVML's version mismatch meanwhile)
    _sh(lab, "apt-mark unhold " + " ".join(DRIVER))
    _sh(lab, f"{APT} install " + " ".join(f"{p}={NEW}" for p in DRIVER))
    smi = _sh(lab, "nvidia-smi", check=False)
    assert smi.returncode == 18 and "Driver/library version mismatch" in smi.stdout
    _reboot(lab, HOST)
    smi = _sh(lab, "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert smi.stdout.strip() == "570.172.08"
