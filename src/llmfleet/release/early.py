"""Connections opened early: ``invoke deploy`` opens each host's SSH connection and sends its probe
while the controller still loads the release machinery (planner, preflight, renderer: about half a
second of imports), so that the network round trips and the imports overlap instead of adding up.

- ``start`` runs once the hosts are prepared (``llmfleet.release.prepare``): bad input is refused
  before, and nothing is contacted for it. Only when every host fits in one batch (``forks``): a
  larger fleet keeps its ``forks`` bound on open connections.
- ``llmfleet.release.executor.connect`` takes a host's connection (``take``), or the error opening it
  met (a host-key refusal stays a refusal); a host whose connection was opened with other settings
  is connected again, as before.
- The probe goes through ``Remote.send_ahead``: ``facts.gather`` sends the very same command and takes
  its answer (still one round trip). A probe is read-only: one that nobody takes changes nothing.
- ``close_all`` (the task's end) closes what nobody took.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from llmfleet.host import probe, ssh
from llmfleet.settings import Settings, SshSettings

PROBE_TIMEOUT_S = 180.0  # as facts.gather's default


@dataclass
class _Early:
    key: tuple[str, ...]
    done: threading.Event = field(default_factory=threading.Event)
    remote: ssh.Remote | None = None
    error: BaseException | None = None


_lock = threading.Lock()
_pending: dict[str, _Early] = {}


def _key(host: Any, settings: Settings, accept_new_host_keys: bool) -> tuple[str, ...]:
    """What the connection was opened with: the host's resolved login and llmfleet's SSH settings."""
    ssh_settings = SshSettings.of(settings)
    target = ssh.Target.from_host(host, default_user=ssh_settings.user)
    return (host.name, repr(target), repr(ssh_settings), str(bool(accept_new_host_keys)))


def _open(entry: _Early, host: Any, settings: Settings, accept_new_host_keys: bool, root: str,
          model_paths: list[str]) -> None:
    try:
        remote = ssh.connect(host, config=settings.ssh, accept_new_host_keys=accept_new_host_keys)
        mark = probe.new_mark()
        remote.probe_mark = mark  # type: ignore[attr-defined] - facts.gather builds the same command with it
        remote.send_ahead(probe.probe_command(mark, root, model_paths), stdin=probe.probe_sh(), sudo=True,
                          timeout=PROBE_TIMEOUT_S)
        entry.remote = remote
    except BaseException as exc:  # noqa: BLE001 - handed to the deploy that takes this host
        entry.error = exc
    finally:
        entry.done.set()


def start(prepared: list[Any], settings: Settings, *, accept_new_host_keys: bool, forks: int) -> int:
    """Open the connection and send the probe of each prepared host (``PreparedHost``) with services,
    each in a thread; returns how many were started (none when the hosts do not fit in one batch)."""
    todo = [p for p in prepared if p.services]
    if not todo or len(todo) > forks:
        return 0
    for ready in todo:
        entry = _Early(_key(ready.host, settings, accept_new_host_keys))
        with _lock:
            old = _pending.pop(ready.host.name, None)
            _pending[ready.host.name] = entry
        if old is not None:
            _close(old)
        paths = [p.service.model_path for p in ready.services]
        threading.Thread(target=_open, args=(entry, ready.host, settings, accept_new_host_keys, ready.settings.root,
                                             paths), name=f"llmfleet-early-{ready.host.name}", daemon=True).start()
    return len(todo)


def take(host: Any, settings: Settings, accept_new_host_keys: bool) -> ssh.Remote | None:
    """The connection opened early for ``host`` with these settings (raising what opening it raised),
    or None: connect as usual."""
    with _lock:
        entry = _pending.get(host.name)
        if entry is None or entry.key != _key(host, settings, accept_new_host_keys):
            return None
        del _pending[host.name]
    entry.done.wait()  # bounded: ssh.connect has its own timeouts; sending the probe does not wait
    if entry.error is not None:
        raise entry.error
    return entry.remote


def _close(entry: _Early) -> None:
    entry.done.wait()
    if entry.remote is not None:
        try:
            entry.remote.close()
        except Exception:  # noqa: BLE001,S110 - closing a connection nobody used must not hide the outcome
            pass


def close_all() -> None:
    """Close every connection opened early that no deploy took."""
    with _lock:
        left = list(_pending.values())
        _pending.clear()
    for entry in left:
        _close(entry)
