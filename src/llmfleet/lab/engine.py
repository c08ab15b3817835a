"""The lab's Docker engine: find or install it (docker.io, compose v2, debootstrap), start dockerd if it
is not running, and detect how system containers can run here.

Two ways a lab host container can get what systemd + an inner dockerd need:
- ``privileged``: ``--privileged --cgroupns private`` (a normal Docker host);
- ``restricted``: kernels whose capability bounding set lacks CAP_SYS_RESOURCE refuse --privileged
  ("unable to apply caps: operation not permitted"); the explicit flag set below works there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from llmfleet.errors import CheckFailed
from llmfleet.lab import docker
from llmfleet.lab.images import debian_mirror, fill_mirror
from llmfleet.lab.paths import BASE_IMAGE

DOCKERD_LOG = Path("/var/log/llmfleet/dockerd.log")
DOCKERD_START_TIMEOUT = 180.0  # a first start on a busy 2-core machine can take a minute
TRIXIE_SOURCES = Path("/etc/apt/sources.list.d/llmfleet-trixie.sources")
TRIXIE_PREF = Path("/etc/apt/preferences.d/llmfleet-trixie-compose")
LAB_DOCKERFILES = Path(__file__).resolve().parents[3] / "dockerfiles"

SYSTEM_CONTAINER_FLAGS = {
    "privileged": ["--privileged", "--cgroupns", "private"],
    "restricted": [
        "--cgroupns", "private", "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--security-opt", "systempaths=unconfined", "--device-cgroup-rule", "a *:* rwm",
    ],
}
COMMON_HOST_FLAGS = ["--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp"]


@dataclass
class EngineReport:
    docker_version: str
    compose_version: str
    started_dockerd: bool
    installed: list[str]


def _is_root() -> bool:
    return os.geteuid() == 0


def _apt_install(pkgs: list[str], log) -> None:
    if not _is_root() or not shutil.which("apt-get"):
        raise CheckFailed(
            f"missing {' '.join(pkgs)}: install them (as root on Debian: apt-get install -y {' '.join(pkgs)})"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log(f"apt-get install {' '.join(pkgs)}")
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *pkgs]):
        proc = subprocess.run(argv, capture_output=True, env=env, timeout=900)
        if proc.returncode != 0:
            tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:]
            raise CheckFailed(f"`{' '.join(argv)}` failed: {tail}")


def _compose_v2() -> str | None:
    proc = subprocess.run([docker.DOCKER, "compose", "version", "--short"], capture_output=True, timeout=30)
    if proc.returncode == 0:
        return proc.stdout.decode().strip()
    return None


def install_compose_v2(log) -> None:
    """Compose v2 (Go binary) from Debian trixie, pinned so nothing else ever comes from trixie."""
    src = fill_mirror((LAB_DOCKERFILES / "lab-host" / "trixie.sources").read_text(), debian_mirror())
    pref = (LAB_DOCKERFILES / "lab-host" / "trixie-compose.pref").read_text()
    if _is_root():
        TRIXIE_SOURCES.write_text(src)
        TRIXIE_PREF.write_text(pref)
    _apt_install(["docker-compose/trixie"], log)


def daemon_up(timeout: float = 10) -> str | None:
    """The engine's version, or None while it does not answer. A dockerd that is still initialising (first
    start: storage driver, iptables, containerd) accepts on its socket and answers late: that is "not yet",
    not an error."""
    try:
        proc = docker.run(["version", "--format", "{{.Server.Version}}"], check=False, timeout=timeout)
    except CheckFailed:
        return None
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return "\n".join("  " + line[:300] for line in tail)


def start_dockerd(log) -> None:
    if not shutil.which("dockerd"):
        raise CheckFailed("dockerd not found: apt-get install -y docker.io")
    if not _is_root():
        raise CheckFailed("the Docker engine is not running and starting dockerd needs root: start it (dockerd &)")
    DOCKERD_LOG.parent.mkdir(parents=True, exist_ok=True)
    log(f"starting dockerd (log: {DOCKERD_LOG})")
    with open(DOCKERD_LOG, "ab") as fh:
        proc = subprocess.Popen(["dockerd"], stdout=fh, stderr=fh, stdin=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < DOCKERD_START_TIMEOUT:
        if proc.poll() is not None:
            raise CheckFailed(f"dockerd exited with code {proc.returncode}; {DOCKERD_LOG} ends:\n"
                              + _log_tail(DOCKERD_LOG))
        if daemon_up(timeout=10):
            log(f"dockerd answered after {time.monotonic() - t0:.0f}s")
            return
        time.sleep(0.5)
    raise CheckFailed(f"dockerd did not answer within {DOCKERD_START_TIMEOUT:.0f}s; {DOCKERD_LOG} ends:\n"
                      + _log_tail(DOCKERD_LOG))


def ensure_engine(log=lambda msg: None, install: bool = True) -> EngineReport:
    """Idempotent: docker CLI + engine, compose v2, debootstrap. Starts dockerd when it is not running."""
    installed: list[str] = []
    want = []
    if not shutil.which(docker.DOCKER) or not shutil.which("dockerd"):
        want.append("docker.io")
    if not shutil.which("debootstrap"):
        want.append("debootstrap")
    if not shutil.which("cmake") or not shutil.which("g++"):
        want += ["cmake", "g++", "make"]
    # Optional, for the llama-server compile: a compiler cache kept across runs, and ninja's done/total
    # steps. Installed along with anything else missing; without them the compile still works.
    if want:
        want += [pkg for tool, pkg in (("ccache", "ccache"), ("ninja", "ninja-build")) if not shutil.which(tool)]
    if want:
        if not install:
            raise CheckFailed(f"missing: {' '.join(want)}; run `invoke lab.setup` as root or apt-get install them")
        _apt_install(want, log)
        installed += want
    started = False
    version = daemon_up()
    if not version:
        start_dockerd(log)
        started = True
        version = daemon_up() or "?"
    ensure_kernel_limits(log)
    compose = _compose_v2()
    if not compose or compose.startswith("1."):
        if not install:
            raise CheckFailed("compose v2 missing: run `invoke lab.setup` (installs docker-compose from trixie)")
        install_compose_v2(log)
        installed.append("docker-compose/trixie")
        compose = _compose_v2() or "?"
    return EngineReport(docker_version=version, compose_version=compose, started_dockerd=started,
                        installed=installed)


# Each lab host runs systemd, dbus and containerd, ~7 inotify instances together; the kernel's default
# of 128 per user stops systemd in the 19th host ("Failed to allocate manager object", exit 1).
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_WANTED = 8192


def ensure_kernel_limits(log) -> None:
    """Raise fs.inotify.max_user_instances for many lab hosts (root); otherwise say how."""
    try:
        current = int(INOTIFY_INSTANCES.read_text().strip())
    except (OSError, ValueError):
        return
    if current >= INOTIFY_WANTED:
        return
    if _is_root():
        try:
            INOTIFY_INSTANCES.write_text(f"{INOTIFY_WANTED}\n")
            log(f"raised fs.inotify.max_user_instances {current} -> {INOTIFY_WANTED} (systemd in every lab host)")
            return
        except OSError:
            pass
    log(f"warning: fs.inotify.max_user_instances is {current}: about {current // 7} lab hosts fit on this "
        f"machine; as root: sysctl -w fs.inotify.max_user_instances={INOTIFY_WANTED}")


def detect_container_mode(image: str = BASE_IMAGE) -> str:
    """'privileged' where ``docker run --privileged`` works, else 'restricted' (see module doc)."""
    forced = os.environ.get("LLMFLEET_LAB_MODE")
    if forced in SYSTEM_CONTAINER_FLAGS:
        return forced
    proc = docker.run(["run", "--rm", "--pull", "never", "--network", "none", "--privileged",
                       "--entrypoint", "/bin/true", image], check=False, timeout=60)
    if proc.returncode == 0:
        return "privileged"
    return "restricted"
