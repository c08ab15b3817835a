"""Tracing of remote commands (``-v``): every command sent over SSH, secrets masked, with its duration.

``llmfleet.host.ssh`` calls ``emit`` after each command; a task run with ``-v`` installs a printer
with ``tracing``. Thread-safe (hosts run in parallel). Secrets never travel in a command line
(they go on stdin), but a value that looks like one is masked anyway before it is printed.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

MASK = "********"
# key=value / key: value / "key": "value" where the key names a secret; Bearer tokens.
_SECRET = re.compile(
    r"""(?ix)
    (?P<key>["']?[A-Za-z0-9_.-]*(?:api[_-]?key|token|secret|passw(?:or)?d|credential)[A-Za-z0-9_.-]*["']?
       \s*[:=]\s*["']?)
    (?P<value>[^\s"',;}&]+)
    """
)
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")


@dataclass(frozen=True)
class Traced:
    host: str
    command: str
    rc: int | None  # None: no exit status (timed out, connection lost)
    seconds: float


_lock = threading.Lock()
_sinks: list[Callable[[Traced], None]] = []


def mask(text: str) -> str:
    """``text`` with anything that looks like a secret value replaced by ``********``."""
    text = _SECRET.sub(lambda m: m.group("key") + MASK, text)
    return _BEARER.sub(lambda m: m.group(1) + MASK, text)


def active() -> bool:
    return bool(_sinks)


def emit(host: str, command: str, rc: int | None, seconds: float) -> None:
    if not _sinks:
        return
    event = Traced(host=host, command=mask(command), rc=rc, seconds=seconds)
    with _lock:
        for sink in list(_sinks):
            sink(event)


@contextlib.contextmanager
def tracing(sink: Callable[[Traced], None]) -> Iterator[None]:
    with _lock:
        _sinks.append(sink)
    try:
        yield
    finally:
        with _lock:
            _sinks.remove(sink)
