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

Sooner still, from the last run (``recall`` / ``remember``): preparing the hosts means loading the
inventory and its schema (pydantic), about a third of a second. ``remember`` keeps, per inventory and
host selection, each host's resolved login, llmfleet root and model paths in a 0600 file under
``$XDG_CACHE_HOME/llmfleet/early/`` (no secrets: addresses, ports, users, key file paths), with the
size and modification time of every file of the inventory. The next ``deploy`` with the same
inventory, selection and unchanged files opens those connections and sends their probes before the
inventory is even parsed (``recall``). Nothing trusts the guess: ``start`` keeps a connection only when
the freshly prepared host resolves to the very same login and settings (else it is closed unused and
the host connected again), and the probe is taken only when it is the very same command. A guess is
never made with ``accept_new_host_keys`` (no host key is recorded on a guess), for an executable
(dynamic) inventory, or for more hosts than one batch. The probe is read-only: a guess that turns
out wrong, or input refused later, changes nothing on any host.

Measured against the same code with ``recall``, ``start`` and ``remember`` doing nothing
(docs/bench.md "Start-up tricks"): a no-change deploy on a lab host 0.95 -> 1.10 s (medians of three
sittings; its timeline's connect 0.00 -> 0.09 s and probe 0.22-0.30 -> 0.38-0.41 s). Kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmfleet import cache
from llmfleet.host import probe, ssh
from llmfleet.settings import Settings, SshSettings

PROBE_TIMEOUT_S = 180.0  # as facts.gather's default
CACHE_VERSION = 1
MAX_INVENTORY_FILES = 2000  # an inventory folder larger than this is not fingerprinted (no guess)
MAX_KEPT = 64  # selections remembered; the least recently written go first
CACHE = "early"  # llmfleet.cache folder


@dataclass
class _Early:
    key: tuple[str, ...]
    done: threading.Event = field(default_factory=threading.Event)
    remote: ssh.Remote | None = None
    error: BaseException | None = None


_lock = threading.Lock()
_pending: dict[str, _Early] = {}


def _target(host: Any, settings: Settings) -> ssh.Target:
    return ssh.Target.from_host(host, default_user=SshSettings.of(settings).user)


def _key_of(target: ssh.Target, ssh_settings: SshSettings, accept_new_host_keys: bool) -> tuple[str, ...]:
    return (target.name, repr(target), repr(ssh_settings), str(bool(accept_new_host_keys)))


def _key(host: Any, settings: Settings, accept_new_host_keys: bool) -> tuple[str, ...]:
    """What the connection was opened with: the host's resolved login and llmfleet's SSH settings."""
    return _key_of(_target(host, settings), SshSettings.of(settings), accept_new_host_keys)


def _open(entry: _Early, target: ssh.Target, ssh_settings: SshSettings, accept_new_host_keys: bool, root: str,
          model_paths: list[str]) -> None:
    try:
        remote = ssh.connect_target(target, ssh_settings, accept_new_host_keys=accept_new_host_keys)
        mark = probe.new_mark()
        remote.probe_mark = mark  # facts.gather builds the same command with it
        remote.send_ahead(probe.probe_command(mark, root, model_paths), stdin=probe.probe_sh(), sudo=True,
                          timeout=PROBE_TIMEOUT_S)
        entry.remote = remote
    except BaseException as exc:  # noqa: BLE001 - handed to the deploy that takes this host
        entry.error = exc
    finally:
        entry.done.set()


def _launch(target: ssh.Target, ssh_settings: SshSettings, accept_new_host_keys: bool, root: str,
            model_paths: list[str]) -> None:
    entry = _Early(_key_of(target, ssh_settings, accept_new_host_keys))
    with _lock:
        old = _pending.pop(target.name, None)
        _pending[target.name] = entry
    if old is not None:
        _close_later(old)
    threading.Thread(target=_open, args=(entry, target, ssh_settings, accept_new_host_keys, root, model_paths),
                     name=f"llmfleet-early-{target.name}", daemon=True).start()


def start(prepared: list[Any], settings: Settings, *, accept_new_host_keys: bool, forks: int) -> int:
    """Open the connection and send the probe of each prepared host (``PreparedHost``) with services,
    each in a thread; returns how many were started (none when the hosts do not fit in one batch). A host
    whose connection ``recall`` already opened with the very same login and settings keeps it."""
    todo = [p for p in prepared if p.services]
    if not todo or len(todo) > forks:
        return 0
    ssh_settings = SshSettings.of(settings)
    for ready in todo:
        target = _target(ready.host, settings)
        with _lock:
            guessed = _pending.get(ready.host.name)
            if guessed is not None and guessed.key == _key_of(target, ssh_settings, accept_new_host_keys):
                continue
        _launch(target, ssh_settings, accept_new_host_keys, ready.settings.root,
                [p.service.model_path for p in ready.services])
    return len(todo)


def _fingerprint(sources: Sequence[Path]) -> list[list[Any]] | None:
    """Every file of the inventory sources with its size and modification time; None when they cannot
    be fingerprinted (missing, executable, too large)."""
    rows: list[list[Any]] = []
    try:
        for source in sources:
            if source.is_file():
                if os.access(source, os.X_OK):
                    return None  # a dynamic inventory answers anew each run
                st = source.stat()
                rows.append([str(source), st.st_size, st.st_mtime_ns])
                continue
            if not source.is_dir():
                return None
            for folder, dirs, files in os.walk(source, followlinks=True):
                dirs.sort()
                for name in sorted(files):
                    path = os.path.join(folder, name)
                    st = os.stat(path)
                    if os.access(path, os.X_OK) and not name.endswith((".yml", ".yaml", ".json", ".ini", ".toml")):
                        return None
                    rows.append([path, st.st_size, st.st_mtime_ns])
                    if len(rows) > MAX_INVENTORY_FILES:
                        return None
    except OSError:
        return None
    return rows or None


def _sources(inventory: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    items = [inventory] if isinstance(inventory, str | os.PathLike) else list(inventory)
    return [Path(i).resolve() for i in items]


def _cache_name(sources: Sequence[Path], selection: Sequence[Any]) -> str:
    name = json.dumps([[str(p) for p in sources], list(selection)], default=str)
    return hashlib.sha256(name.encode()).hexdigest()[:32] + ".json"


def _cache_file(sources: Sequence[Path], selection: Sequence[Any]) -> Path:
    return cache.cache_dir(CACHE) / _cache_name(sources, selection)


def recall(inventory: str | os.PathLike[str] | Sequence[str], selection: Sequence[Any], settings: Settings, *,
           accept_new_host_keys: bool, forks: int) -> int:
    """Open the connections and send the probes the last ``deploy`` of this inventory and host selection
    prepared, when no file of the inventory changed since; returns how many were started."""
    if accept_new_host_keys:
        return 0
    folder = cache.private_dir(CACHE, create=False)
    if folder is None:
        return 0
    try:
        sources = _sources(inventory)
        record = json.loads((folder / _cache_name(sources, selection)).read_text())
        if record.get("version") != CACHE_VERSION or record.get("files") != _fingerprint(sources):
            return 0
        hosts = record["hosts"]
        if not hosts or len(hosts) > forks:
            return 0
        ssh_settings = SshSettings.of(settings)
        guesses = [(ssh.Target(**dict(h["target"], ignored_args=tuple(h["target"]["ignored_args"]))), str(h["root"]),
                    [str(m) for m in h["model_paths"]]) for h in hosts]
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    for target, root, model_paths in guesses:
        _launch(target, ssh_settings, False, root, model_paths)
    return len(guesses)


def remember(inventory: str | os.PathLike[str] | Sequence[str], selection: Sequence[Any], prepared: list[Any],
             settings: Settings) -> None:
    """Keep what ``recall`` needs for the next deploy of this inventory and host selection (best effort:
    a cache that cannot be written only makes the next deploy connect as usual)."""
    try:
        sources = _sources(inventory)
    except OSError:
        return
    files = _fingerprint(sources)
    todo = [p for p in prepared if p.services]
    if files is None or not todo:
        return
    hosts = []
    for ready in todo:
        target = asdict(_target(ready.host, settings))
        target["ssh_options"] = {k: list(v) for k, v in target["ssh_options"].items()}
        target["ignored_args"] = list(target["ignored_args"])
        hosts.append({"target": target, "root": ready.settings.root,
                      "model_paths": [p.service.model_path for p in ready.services]})
    record = {"version": CACHE_VERSION, "files": files, "hosts": hosts}
    folder = cache.private_dir(CACHE)
    if folder is None:
        return
    # key order kept: a login's options compare in their own order
    cache.write_private(folder / _cache_name(sources, selection), json.dumps(record).encode())
    try:
        kept = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in kept[:-MAX_KEPT]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


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


def _close_later(entry: _Early) -> None:
    """Close a connection nobody will take without waiting for it to finish opening."""
    threading.Thread(target=_close, args=(entry,), name="llmfleet-early-close", daemon=True).start()


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
