"""The host probe: one POSIX sh script that gathers every host fact in one SSH round trip.

``probe_command`` builds the exact remote command (argv, quoted by the SSH layer); ``probe_script``
is the script sent on stdin. Parsing lives in :mod:`llmfleet.host.facts`.
"""

from __future__ import annotations

from importlib import resources

# Largest probe document we parse; the script caps each section well below this.
MAX_DOCUMENT = 8 * 1024 * 1024


def probe_script() -> bytes:
    return resources.files("llmfleet.host.probe").joinpath("probe.sh").read_bytes()


def probe_command(mark: str, root: str, model_paths: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``sh -s -- MARK ROOT [MODEL_PATH ...]``: the script is read from stdin."""
    return ["sh", "-s", "--", mark, root, *model_paths]
