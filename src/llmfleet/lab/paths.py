"""Names and places the lab uses: one constant each, so other modules and tests import, not repeat."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from llmfleet.errors import UsageError

DEFAULT_LAB_NAME = "llmfleet-lab"
LAB_NAME_ENV = "LLMFLEET_LAB_NAME"
DEFAULT_INVENTORY = "inventory/lab"

# llmfleet's own known_hosts file (same default as llmfleet.ssh.known_hosts in invoke.yaml).
KNOWN_HOSTS_PATH = Path(os.path.expanduser("~/.local/state/llmfleet/known_hosts"))
STATE_ROOT = Path(os.path.expanduser("~/.local/state/llmfleet/lab"))

IMAGE_PREFIX = "llmfleet-lab"
BASE_IMAGE = f"{IMAGE_PREFIX}/base:bookworm"
REGISTRY_CONTAINER = "llmfleet-registry"
REGISTRY_VOLUME = "llmfleet-registry-data"
REGISTRY_PORT_ENV = "LLMFLEET_LAB_REGISTRY_PORT"
DEFAULT_REGISTRY_PORT = 5000
REGISTRY_INNER_PORT = 5000

# Where models are staged on every lab host (as a fleet would keep them: one folder per model).
HOST_MODELS_DIR = "/srv/models"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")


def cache_dir() -> Path:
    """Build cache outside the repository (binaries, build contexts, rootfs)."""
    env = os.environ.get("LLMFLEET_CACHE_DIR")
    if env:
        return Path(env)
    system = Path("/var/cache/llmfleet")
    if os.geteuid() == 0 or (system.exists() and os.access(system, os.W_OK)):
        return system
    return Path(os.path.expanduser("~/.cache/llmfleet"))


def lab_name(name: str | None = None) -> str:
    name = name or os.environ.get(LAB_NAME_ENV) or DEFAULT_LAB_NAME
    if not _NAME_RE.match(name):
        raise UsageError(
            f"lab name {name!r}: use 1-31 lowercase letters, digits and dashes (flag --name or ${LAB_NAME_ENV})"
        )
    return name


def state_dir(name: str) -> Path:
    return STATE_ROOT / name


def key_path(name: str) -> Path:
    return state_dir(name) / "id_ed25519"


def registry_port() -> int:
    return int(os.environ.get(REGISTRY_PORT_ENV) or DEFAULT_REGISTRY_PORT)


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock file, so two lab runs at once never build or create the same thing twice."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
