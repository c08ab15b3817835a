"""A simulated fleet: many SSH hosts on loopback that answer with recorded outputs of a real lab host.

For measuring the controller past what one machine's lab can hold (200, 1,000 hosts). One process
listens on N loopback ports (one per simulated host) with paramiko's server side; every command a
client runs is answered from a *recording*: the exact commands llmfleet sent to a real lab host and
what that host answered (stdout, stderr, exit status, and how long it took).

A recording is matched on the command and its stdin with their volatile parts masked (random tokens
such as the probe's section mark, timestamps); the recorded answer gets the caller's tokens put back
in, so a probe document framed by a fresh random mark parses as it did on the real host. A command
with no recording is answered with exit status 127 and a line saying so (and counted): a recording
made before llmfleet's remote scripts changed shows up as failures, never as silent success.

Pure parts: ``mask``, ``Recording.answer``, ``fleet_inventory``. I/O: ``SimFleet`` (the server),
``recorder`` (captures what a real ``Remote`` sends), ``main`` (``python -m llmfleet.lab.simfleet``).
Everything listens on 127.0.0.1 only; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import selectors
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RECORDING_VERSION = 1
MAX_STDIN = 16 * 1024 * 1024
MAX_CONNECTIONS = 512  # connections served at once; more are closed at accept (a fleet-wide bound)
CHANNEL_TIMEOUT_S = 60.0  # a client that sends no EOF on stdin within this is dropped
ACCEPT_BACKLOG = 128

# Volatile parts of a command: random hex tokens (probe marks, lock tokens, content hashes of a
# fresh release), ISO timestamps, process ids in lock holder documents, and who sent it from where to which
# host in audit records and lock holders (the recording machine's user@host and the lab host's name are
# not the replaying controller's, nor a simulated host's).
_VOLATILE = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?"  # ISO time
    r"|\b\d{8}T\d{6}Z?\b"  # compact time (release ids)
    r"|[0-9a-f]{8,}"  # hex tokens
    r"|\"pid\":\s*\d+"
    r'|"(?:who|from|host)":\s*"[^"\\]*"'  # JSON fields naming the controller or the host
)


def mask(text: str) -> tuple[str, list[str]]:
    """``text`` with its volatile parts replaced by ``\\x00N\\x00`` placeholders, and those parts in order."""
    found: list[str] = []

    def sub(m: re.Match[str]) -> str:
        found.append(m.group(0))
        return f"\x00{len(found) - 1}\x00"

    return _VOLATILE.sub(sub, text), found


def key_of(command: str, stdin: bytes | None) -> tuple[str, list[str]]:
    """The lookup key of a command (its masked text and the digest of its masked stdin) and its tokens."""
    masked_cmd, tokens = mask(command)
    masked_in, in_tokens = mask((stdin or b"").decode("utf-8", "replace"))
    digest = hashlib.sha256(masked_cmd.encode() + b"\x01" + masked_in.encode()).hexdigest()
    return digest, tokens + in_tokens


@dataclass
class Entry:
    """One recorded command and the real host's answer."""

    command: str
    stdin_sha256: str | None
    tokens: list[str]
    rc: int
    stdout: str
    stderr: str
    seconds: float
    label: str = ""


@dataclass
class Recording:
    """Recorded answers of one real host, looked up by masked command."""

    host: str
    host_vars: dict[str, Any]
    entries: dict[str, Entry] = field(default_factory=dict)
    version: int = RECORDING_VERSION
    recorded_at: str = ""
    notes: str = ""
    # The images.lock entries of the recorded host's services, as the recording run used them (lock text):
    # a replaying controller must render the same releases, whatever the lab's images are now.
    images_lock: str = ""

    def add(self, command: str, stdin: bytes | None, rc: int, stdout: str, stderr: str, seconds: float,
            label: str = "") -> None:
        key, tokens = key_of(command, stdin)
        old = self.entries.get(key)
        if old is not None and label and label not in old.label.split(","):
            label = f"{old.label},{label}"
        self.entries[key] = Entry(command=command,
                                  stdin_sha256=hashlib.sha256(stdin).hexdigest() if stdin else None,
                                  tokens=tokens, rc=rc, stdout=stdout, stderr=stderr,
                                  seconds=round(seconds, 4), label=label)

    def answer(self, command: str, stdin: bytes | None) -> Entry | None:
        """The recorded answer for ``command`` with the caller's volatile tokens put back, or None."""
        key, tokens = key_of(command, stdin)
        entry = self.entries.get(key)
        if entry is None:
            return None
        stdout, stderr = entry.stdout, entry.stderr
        if len(tokens) == len(entry.tokens):
            for old, new in zip(entry.tokens, tokens, strict=True):
                if old != new and len(old) >= 8:  # only tokens long enough not to hit unrelated text
                    stdout = stdout.replace(old, new)
                    stderr = stderr.replace(old, new)
        return Entry(command=command, stdin_sha256=entry.stdin_sha256, tokens=tokens, rc=entry.rc,
                     stdout=stdout, stderr=stderr, seconds=entry.seconds, label=entry.label)

    def to_json(self) -> str:
        doc = {"version": self.version, "host": self.host, "recorded_at": self.recorded_at, "notes": self.notes,
               "host_vars": self.host_vars, "images_lock": self.images_lock,
               "entries": [asdict(e) | {"key": k} for k, e in self.entries.items()]}
        return json.dumps(doc, indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "recording") -> Recording:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("version") != RECORDING_VERSION:
            raise ValueError(f"{where}: not a version {RECORDING_VERSION} simulated-fleet recording")
        rec = cls(host=doc.get("host", ""), host_vars=doc.get("host_vars") or {},
                  recorded_at=doc.get("recorded_at", ""), notes=doc.get("notes", ""),
                  images_lock=doc.get("images_lock") or "")
        for raw in doc.get("entries", []):
            key = raw.pop("key")
            rec.entries[key] = Entry(**raw)
        return rec

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Recording:
        return cls.from_json(Path(path).read_text(encoding="utf-8"), str(path))


# -- inventory of a simulated fleet (pure) ------------------------------------------------------------


def host_name(i: int) -> str:
    return f"sim-{i + 1:04d}"


def fleet_inventory(ports: list[int], host_vars: dict[str, Any], *, group: str = "simfleet") -> dict[str, Any]:
    """An Ansible YAML inventory document: one host per port on 127.0.0.1, all sharing ``host_vars``."""
    shared = {k: v for k, v in host_vars.items() if k not in {"ansible_port", "ansible_ssh_port", "ansible_host"}}
    shared["ansible_host"] = "127.0.0.1"
    hosts = {host_name(i): {"ansible_port": p} for i, p in enumerate(ports)}
    return {"all": {"children": {group: {"hosts": hosts, "vars": shared}}}}


def known_hosts_text(ports: list[int], key_type: str, key_b64: str) -> str:
    return "".join(f"[127.0.0.1]:{p} {key_type} {key_b64}\n" for p in ports)


# -- recording from a real host (I/O) -------------------------------------------------------------------


@contextlib.contextmanager
def recorder(recording: Recording, label: str = "") -> Iterator[Recording]:
    """Record every command ``llmfleet.host.ssh.Remote.run`` sends (as it goes on the wire) and its answer."""
    from llmfleet.host import ssh

    original = ssh.Remote.run

    def run(self, command, *, timeout=None, stdin=None, sudo=False, check=False):
        wire = self._wrap(command, sudo)
        t0 = time.monotonic()
        res = original(self, command, timeout=timeout, stdin=stdin, sudo=sudo, check=False)
        recording.add(wire, stdin, res.rc, res.stdout, res.stderr, time.monotonic() - t0, label)
        if check and res.rc != 0:
            return original(self, command, timeout=timeout, stdin=stdin, sudo=sudo, check=True)
        return res

    ssh.Remote.run = run  # type: ignore[method-assign]
    try:
        yield recording
    finally:
        ssh.Remote.run = original  # type: ignore[method-assign]


# -- the server (I/O) ---------------------------------------------------------------------------------


@dataclass
class Counters:
    connections: int = 0
    refused: int = 0
    commands: int = 0
    unmatched: int = 0
    unmatched_examples: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"connections": self.connections, "refused": self.refused, "commands": self.commands,
                    "unmatched": self.unmatched, "unmatched_examples": list(self.unmatched_examples)}


def new_host_key() -> Any:
    """A fresh Ed25519 host key (paramiko cannot generate one itself)."""
    import paramiko
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode()))


class SimFleet:
    """N simulated hosts: one listening socket per host on 127.0.0.1, one accept thread for all."""

    def __init__(self, recording: Recording, *, hosts: int, authorized_key: Any, host_key: Any | None = None,
                 latency: float = 1.0, max_connections: int = MAX_CONNECTIONS) -> None:
        if hosts < 1 or hosts > 5000:
            raise ValueError(f"hosts must be 1..5000, got {hosts}")
        self.recording = recording
        self.n = hosts
        self.authorized = authorized_key
        self.host_key = host_key or new_host_key()
        self.latency = max(0.0, float(latency))  # scale of the recorded command times (0: answer at once)
        self.max_connections = max_connections
        self.counters = Counters()
        self.ports: list[int] = []
        self._listeners: list[socket.socket] = []
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._thread: threading.Thread | None = None
        self._transports: set[Any] = set()
        self._tlock = threading.Lock()

    def start(self) -> SimFleet:
        for _ in range(self.n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            s.listen(ACCEPT_BACKLOG)
            s.setblocking(False)
            self._listeners.append(s)
            self.ports.append(s.getsockname()[1])
        self._thread = threading.Thread(target=self._accept_loop, name="simfleet-accept", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for s in self._listeners:
            s.close()
        with self._tlock:
            transports = list(self._transports)
        for t in transports:
            with contextlib.suppress(Exception):
                t.close()

    def __enter__(self) -> SimFleet:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        sel = selectors.DefaultSelector()
        for s in self._listeners:
            sel.register(s, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    try:
                        sock, _peer = key.fileobj.accept()  # type: ignore[union-attr]
                    except (BlockingIOError, OSError):
                        continue
                    if not self._slots.acquire(blocking=False):
                        with self.counters.lock:
                            self.counters.refused += 1
                        sock.close()
                        continue
                    threading.Thread(target=self._serve, args=(sock,), daemon=True).start()
        finally:
            sel.close()

    def _serve(self, sock: socket.socket) -> None:
        import paramiko

        transport = None
        try:
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.counters.lock:
                self.counters.connections += 1
            transport = paramiko.Transport(sock)
            transport.add_server_key(self.host_key)
            with self._tlock:
                self._transports.add(transport)
            transport.start_server(server=_Server(self))
            # The transport thread serves the session; keep the slot until it ends (bounded).
            deadline = time.monotonic() + 600
            while transport.is_active() and not self._stop.is_set() and time.monotonic() < deadline:
                transport.join(timeout=0.5)
        except (paramiko.SSHException, OSError, EOFError):
            pass
        finally:
            if transport is not None:
                with contextlib.suppress(Exception):
                    transport.close()
                with self._tlock:
                    self._transports.discard(transport)
            else:
                sock.close()
            self._slots.release()

    def handle(self, channel: Any, command: str) -> None:
        """Read stdin to EOF, answer from the recording, close (runs on its own thread)."""
        data = bytearray()
        try:
            channel.settimeout(CHANNEL_TIMEOUT_S)
            while len(data) <= MAX_STDIN:
                chunk = channel.recv(65536)
                if not chunk:
                    break
                data += chunk
            got = self.recording.answer(command, bytes(data) if data else None)
            with self.counters.lock:
                self.counters.commands += 1
                if got is None:
                    self.counters.unmatched += 1
                    if len(self.counters.unmatched_examples) < 5:
                        self.counters.unmatched_examples.append(command[:160])
            if got is None:
                out, err, rc, pause = "", f"simfleet: no recording for this command: {command[:120]}\n", 127, 0.0
            else:
                out, err, rc, pause = got.stdout, got.stderr, got.rc, got.seconds * self.latency
            if pause > 0:
                self._stop.wait(min(pause, 60.0))
            if out:
                channel.sendall(out.encode())
            if err:
                channel.sendall_stderr(err.encode())
            channel.send_exit_status(rc)
            channel.shutdown_write()
        except Exception:  # noqa: BLE001 - a client that went away ends only its own channel
            pass
        finally:
            with contextlib.suppress(Exception):
                channel.close()


def _server_interface() -> type:
    import paramiko
    from paramiko.common import (
        AUTH_FAILED,
        AUTH_SUCCESSFUL,
        OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
        OPEN_SUCCEEDED,
    )

    class Server(paramiko.ServerInterface):
        def __init__(self, fleet: SimFleet) -> None:
            self.fleet = fleet

        def get_allowed_auths(self, username: str) -> str:
            return "publickey"

        def check_auth_publickey(self, username: str, key: Any) -> int:
            if key.asbytes() == self.fleet.authorized.asbytes():
                return AUTH_SUCCESSFUL
            return AUTH_FAILED

        def check_channel_request(self, kind: str, chanid: int) -> int:
            if kind == "session":
                return OPEN_SUCCEEDED
            return OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

        def check_channel_exec_request(self, channel: Any, command: bytes) -> bool:
            cmd = command.decode("utf-8", "replace")
            threading.Thread(target=self.fleet.handle, args=(channel, cmd), daemon=True).start()
            return True

    return Server


def _Server(fleet: SimFleet) -> Any:  # noqa: N802 - built lazily: paramiko only when a fleet runs
    return _server_interface()(fleet)


def public_key(path: str | os.PathLike[str]) -> Any:
    """A public key from an OpenSSH ``.pub`` line."""
    import base64

    import paramiko

    parts = Path(path).read_text().split()
    if len(parts) < 2:
        raise ValueError(f"{path}: not an OpenSSH public key line")
    return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))


def main(argv: list[str] | None = None) -> int:
    """``python -m llmfleet.lab.simfleet --recording F --hosts N --authorized-key K.pub --out DIR``

    Starts the fleet, writes DIR/ports.json (ports, host key) and prints one JSON line when ready;
    serves until stdin closes or SIGTERM, then prints the counters as one JSON line.
    """
    import argparse
    import signal

    p = argparse.ArgumentParser(prog="python -m llmfleet.lab.simfleet")
    p.add_argument("--recording", required=True)
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--authorized-key", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--latency", type=float, default=1.0, help="scale of recorded command times (0: none)")
    p.add_argument("--max-seconds", type=float, default=3600)
    a = p.parse_args(argv)
    import logging
    import resource

    # A client that closes its connection without a goodbye is a reset here: normal, not worth a line.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, a.hosts + 4 * MAX_CONNECTIONS + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    fleet = SimFleet(Recording.load(a.recording), hosts=a.hosts, authorized_key=public_key(a.authorized_key),
                     latency=a.latency).start()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ports.json").write_text(json.dumps({"ports": fleet.ports, "key_type": fleet.host_key.get_name(),
                                                "key": fleet.host_key.get_base64()}))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())

    def watch_stdin() -> None:
        with contextlib.suppress(Exception):
            sys.stdin.read()
        done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    print(json.dumps({"ready": True, "hosts": a.hosts}), flush=True)
    done.wait(a.max_seconds)
    print(json.dumps(fleet.counters.snapshot()), flush=True)
    fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
