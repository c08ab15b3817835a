"""The host probe: one POSIX sh script that gathers every host fact in one SSH round trip.

``probe_command`` builds the exact remote command (argv, quoted by the SSH layer); ``probe_sh``
is the script sent on stdin. Parsing lives in :mod:`llmfleet.host.facts`.
"""

from __future__ import annotations

import secrets
from importlib import resources

from llmfleet.host.probe.state_reader import STATE_READER

# Largest probe document we parse; the script caps each section well below this.
MAX_DOCUMENT = 8 * 1024 * 1024


def probe_sh() -> bytes:
    """The script sent on stdin: the release state reader (``state_reader.STATE_READER``, a shell function
    the probe runs as its ``release_state`` section), the model manifest reader
    (``host.model_scripts.MANIFEST_READER``, its ``model_manifest`` sections), the GPU health reader
    (``host.gpu_health.HEALTH_READER``, its ``kernel_xid`` and ``pci_gpus`` sections), then probe.sh."""
    from llmfleet.host.gpu_health import HEALTH_READER
    from llmfleet.host.model_scripts import MANIFEST_READER

    probe = resources.files("llmfleet.host.probe").joinpath("probe.sh").read_bytes()
    return STATE_READER.encode() + b"\n" + MANIFEST_READER.encode() + HEALTH_READER.encode() + probe


def new_mark() -> str:
    """The probe's section mark: random per probe, so that nothing a host prints can pose as a section."""
    return "llmfleet-" + secrets.token_hex(8)


def probe_command(mark: str, root: str, model_paths: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``sh -s -- MARK ROOT [MODEL_PATH ...]``: the script is read from stdin."""
    return ["sh", "-s", "--", mark, root, *model_paths]
