"""SSH to inventory hosts: strict host keys, one-line errors, counted round trips.

The thin I/O layer every remote step goes through. Connection parameters come from the inventory the
way Ansible reads them (``ansible_host``, ``ansible_port``, ``ansible_user``,
``ansible_ssh_private_key_file``, ``ansible_become``); everything else (Host aliases, ProxyJump,
IdentityFile, ...) from ``~/.ssh/config`` through Fabric.

Host keys are checked against ``~/.ssh/known_hosts`` and llmfleet's own known-hosts file. An unknown
or changed key stops with the fingerprint and how to accept it; ``accept_new_host_keys`` behaves like
OpenSSH's ``StrictHostKeyChecking=accept-new`` (new keys are recorded, changed keys still refused).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import paramiko
from fabric import Config, Connection

from llmfleet.errors import RemoteError
from llmfleet.host import trace
from llmfleet.inventory.connection import ConnectionSettings, connection_settings
from llmfleet.settings import Settings, SshSettings

if TYPE_CHECKING:
    from llmfleet.inventory.ansible import Host

EOF_GRACE_S = 2.0  # how long to wait for the end of the output after the exit status
# Longest pause between polls of a silent command (the exit status wakes the wait at once; output
# waits at most this long in paramiko's buffer). Each wake-up costs CPU under the GIL: with 100 hosts
# waiting on a 3 s probe, 20 ms meant 5,000 wake-ups a second.
POLL_MAX_S = 0.1
MAX_OUTPUT = 16 * 1024 * 1024  # cap per stream: a hostile host cannot exhaust our memory

# Paramiko logs its transport thread's failures itself, with a traceback, at ERROR ("Exception (client):
# Error reading SSH protocol banner" and 20 lines). With no handler configured Python's last-resort handler
# prints them on stderr. The same failure reaches llmfleet as an exception and is reported there in one
# line (``connect_failure``), so paramiko's records go nowhere; ``-v`` traces the commands llmfleet sends.
_PARAMIKO_LOG = logging.getLogger("paramiko")
_PARAMIKO_LOG.addHandler(logging.NullHandler())
_PARAMIKO_LOG.propagate = False


class HostKeyError(RemoteError):
    """The host's key is unknown or has changed."""


@dataclass(frozen=True)
class Result:
    """What one remote command answered, with the command that produced it (as sent, before sudo)."""

    rc: int
    stdout: str
    stderr: str
    command: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass(frozen=True)
class Target(ConnectionSettings):
    """Where and how to log in: the host's resolved connection settings (pure), with its inventory name."""

    name: str = ""

    @classmethod
    def from_host(cls, host: Host, default_user: str | None = None) -> Target:
        """From the host's ``ansible_*`` variables, ``{{ }}`` resolved (llmfleet.inventory.connection)."""
        cs = connection_settings(host, default_user=default_user)
        return cls(name=host.name, **{f.name: getattr(cs, f.name) for f in fields(cs)})


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


class _StrictPolicy(paramiko.MissingHostKeyPolicy):
    def __init__(self, target: Target, known_hosts: Path, accept_new: bool) -> None:
        self.target = target
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.accepted: str | None = None

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fp = fingerprint(key)
        if not self.accept_new:
            raise HostKeyError(
                f"host {self.target.name} ({hostname}): unknown host key {key.get_name()} {fp}; "
                f"verify it, then rerun with --accept-new-host-keys (or add it to {self.known_hosts})"
            )
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(self.known_hosts, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.accepted = fp


class Runner(Protocol):
    """What a caller that only runs commands needs of a host's connection: ``Remote``, or a scripted
    remote in tests."""

    name: str

    def run(self, command: str | Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None,
            sudo: bool = False, check: bool = False) -> Result: ...


class Link(Runner, Protocol):
    """What a deploy's executor needs of a host's connection (``Remote``, or a scripted remote in
    tests): commands, a counted round trip, a forwarded port for the health check, a close."""

    round_trips: int

    def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> contextlib.AbstractContextManager[int]: ...

    def close(self) -> None: ...


class Remote:
    """An open SSH connection to one host."""

    def __init__(self, target: Target, conn: Connection, command_timeout: float) -> None:
        self.target = target
        self.name = target.name
        self._conn = conn
        self.command_timeout = command_timeout
        self.round_trips = 0
        self.probe_mark: str | None = None  # the mark of a host probe sent ahead (llmfleet.host.early)
        self._ahead: dict[tuple[str, bytes | None], tuple[threading.Thread, list[Any]]] = {}

    # -- commands ---------------------------------------------------------------------------------

    def _wrap(self, command: str | Sequence[str], sudo: bool) -> str:
        cmd = command if isinstance(command, str) else shlex.join(list(command))
        if (sudo or self.target.become) and self.target.user not in (None, "root"):
            cmd = f"sudo -n -u {shlex.quote(self.target.become_user)} -- sh -c {shlex.quote(cmd)}"
        return cmd

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        sudo: bool = False,
        check: bool = False,
    ) -> Result:
        """Run one command (a list is shlex-joined). One round trip; traced under ``-v``. The very same
        command (and stdin, and sudo) sent ahead (``send_ahead``) is not sent again: its answer is taken."""
        if self._ahead:
            sent = self._ahead.pop((self._wrap(command, sudo), stdin), None)
            if sent is not None:
                return self._take_ahead(sent, check)
        return self._run_traced(command, timeout=timeout, stdin=stdin, sudo=sudo, check=check)

    def _run_traced(self, command: str | Sequence[str], *, timeout: float | None, stdin: bytes | None, sudo: bool,
                    check: bool) -> Result:
        if trace.active():
            t0, rc = time.monotonic(), None
            try:
                res = self._run(command, timeout=timeout, stdin=stdin, sudo=sudo, check=False)
                rc = res.rc
            finally:
                trace.emit(self.name, self._wrap(command, sudo), rc, time.monotonic() - t0)
            if check and res.rc != 0:
                self._raise_failed(self._wrap(command, sudo), res)
            return res
        return self._run(command, timeout=timeout, stdin=stdin, sudo=sudo, check=check)

    def send_ahead(self, command: str | Sequence[str], *, stdin: bytes | None = None, sudo: bool = False,
                   timeout: float | None = None) -> None:
        """Send a read-only command now, in a thread, and keep its answer for the ``run`` of the very same
        command: a deploy sends its probe while the controller still loads the code that reads the
        answer. Still one round trip; a command sent ahead that nobody runs is answered and dropped."""
        box: list[Any] = []

        def send() -> None:
            try:
                box.append(self._run_traced(command, timeout=timeout, stdin=stdin, sudo=sudo, check=False))
            except BaseException as exc:  # noqa: BLE001 - kept for the run that takes the answer
                box.append(exc)

        thread = threading.Thread(target=send, name=f"llmfleet-ahead-{self.name}", daemon=True)
        self._ahead[(self._wrap(command, sudo), stdin)] = (thread, box)
        thread.start()

    def _take_ahead(self, sent: tuple[threading.Thread, list[Any]], check: bool) -> Result:
        thread, box = sent
        thread.join()  # bounded: the command runs under its own timeout
        if not box:
            raise RemoteError(f"host {self.name}: a command sent ahead left no answer")
        if isinstance(box[0], BaseException):
            raise box[0]
        res: Result = box[0]
        if check and res.rc != 0:
            self._raise_failed(self._wrap(res.command, False), res)
        return res

    def _raise_failed(self, cmd: str, res: Result) -> None:
        detail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [""]
        raise RemoteError(f"host {self.name}: command failed (exit {res.rc}): {_short(cmd)}: {detail[0][:300]}")

    def _run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        sudo: bool = False,
        check: bool = False,
    ) -> Result:
        cmd = self._wrap(command, sudo)
        limit = timeout if timeout is not None else self.command_timeout
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError(f"host {self.name}: SSH connection is closed")
        self.round_trips += 1
        try:
            chan = transport.open_session(timeout=limit)
            chan.settimeout(1.0)
            chan.exec_command(cmd)
            if stdin is not None:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + limit
            exit_seen: float | None = None
            # Poll with back-off: a quick command answers within the first 1-2 ms polls; a long one
            # (an image pull, a health wait) costs at most 10 wake-ups a second, even with many
            # hosts in parallel.
            pause = 0.001
            while True:
                got = False
                while chan.recv_ready():
                    chunk = chan.recv(65536)
                    got = True
                    if len(out) < MAX_OUTPUT:
                        out += chunk
                while chan.recv_stderr_ready():
                    chunk = chan.recv_stderr(65536)
                    got = True
                    if len(err) < MAX_OUTPUT:
                        err += chunk
                # The exit status may arrive before the last output (RFC 4254 allows it; a loaded
                # sshd does it): after it, wait for EOF too, at most EOF_GRACE_S.
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    if exit_seen is None:
                        exit_seen = time.monotonic()
                    if chan.eof_received or chan.closed or time.monotonic() - exit_seen > EOF_GRACE_S:
                        break
                if time.monotonic() > deadline:
                    chan.close()
                    raise RemoteError(f"host {self.name}: command timed out after {limit:.0f}s: {_short(cmd)}")
                pause = 0.001 if got else min(pause * 1.5, POLL_MAX_S)
                if exit_seen is None:
                    chan.status_event.wait(pause)  # wakes at once when the exit status arrives
                else:
                    time.sleep(min(pause, 0.01))  # the event stays set after the exit status: waiting on it would spin
            rc = chan.recv_exit_status()
            chan.close()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise RemoteError(f"host {self.name}: SSH command failed: {exc or type(exc).__name__}") from None
        if rc == -1 and not transport.is_active():  # closed with no exit status: the connection dropped
            raise RemoteError(f"host {self.name}: the SSH connection dropped before the command ended "
                              f"(what it did on the host is unknown): {_short(cmd)}")
        res = Result(rc=rc, stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
                     command=command if isinstance(command, str) else shlex.join(list(command)))
        if check and rc != 0:
            self._raise_failed(cmd, res)
        return res

    def stream(self, command: str | Sequence[str], on_line: Callable[[str], None], *, timeout: float,
               sudo: bool = False) -> int | None:
        """Run a command and hand its output (stdout and stderr merged) to ``on_line`` line by line as
        it arrives, for at most ``timeout`` seconds (``logs -f``). Returns the exit status, or None when
        the time ran out or the caller interrupted it (the channel is closed; so is the command)."""
        cmd = self._wrap(command, sudo)
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError(f"host {self.name}: SSH connection is closed")
        self.round_trips += 1
        t0 = time.monotonic()
        rc: int | None = None
        buf = b""
        try:
            chan = transport.open_session(timeout=min(timeout, 30))
            chan.set_combine_stderr(True)
            chan.settimeout(0.5)
            chan.exec_command(cmd)
            chan.shutdown_write()
            deadline = t0 + timeout
            try:
                while time.monotonic() < deadline:
                    try:
                        chunk = chan.recv(65536)
                    except TimeoutError:
                        continue
                    if not chunk:
                        rc = chan.recv_exit_status()
                        break
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        on_line(line.decode("utf-8", "replace"))
            finally:
                if buf:
                    on_line(buf.decode("utf-8", "replace"))
                chan.close()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise RemoteError(f"host {self.name}: SSH command failed: {exc or type(exc).__name__}") from None
        finally:
            trace.emit(self.name, cmd, rc, time.monotonic() - t0)
        return rc

    # -- streaming --------------------------------------------------------------------------------

    def command_line(self, command: str | Sequence[str], *, sudo: bool = False) -> str:
        """The command exactly as ``run`` sends it (wrapped in ``sudo -n`` where the host asks for it)."""
        return self._wrap(command, sudo)

    def open_command(self, command: str | Sequence[str], *, sudo: bool = False,
                     timeout: float = 30.0) -> paramiko.Channel:
        """Start one command on a channel of its own and return the channel with its stdin open, for a
        caller that streams data into it (llmfleet.host.transfer sends files this way). One round
        trip; the caller closes the channel."""
        cmd = self._wrap(command, sudo)
        transport: paramiko.Transport | None = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError(f"host {self.name}: SSH connection is closed")
        self.round_trips += 1
        try:
            chan = transport.open_session(timeout=timeout)
            chan.exec_command(cmd)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise RemoteError(f"host {self.name}: SSH command failed: {exc or type(exc).__name__}") from None
        return chan

    @property
    def user(self) -> str:
        """The user this connection logged in as (inventory, ssh config, or the local user)."""
        return str(self._conn.user)

    def host_key(self) -> paramiko.PKey | None:
        """The host key this connection verified (strict checking), None when closed."""
        transport = self._conn.client.get_transport()
        return transport.get_remote_server_key() if transport is not None and transport.is_active() else None

    # -- port forwarding --------------------------------------------------------------------------

    @contextlib.contextmanager
    def forward(self, remote_port: int, remote_host: str = "127.0.0.1") -> Iterator[int]:
        """Tunnel a local port on 127.0.0.1 to ``remote_host:remote_port`` as seen from the host.

        The listening socket is bound before this returns (no race with the first connection);
        each accepted connection gets its own direct-tcpip channel, pumped by a daemon thread.
        """
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError(f"host {self.name}: SSH connection is closed; cannot forward port {remote_port}")
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.2)
        local_port = listener.getsockname()[1]
        stop = threading.Event()

        def pump(sock: socket.socket, chan: paramiko.Channel) -> None:
            # No select() on the channel: Channel.fileno() makes a pipe that paramiko's transport
            # thread may write to while close() frees its descriptors; with many hosts in one
            # process the freed number is soon another connection's socket, whose stream then gets
            # stray bytes. Two loops with timeouts instead; only this thread closes the two ends.
            sock.settimeout(0.2)
            chan.settimeout(0.2)
            done = threading.Event()

            def upstream() -> None:
                try:
                    while not stop.is_set() and not done.is_set():
                        try:
                            data = sock.recv(65536)
                        except TimeoutError:
                            continue
                        if not data:
                            chan.shutdown_write()
                            return
                        chan.sendall(data)
                except (OSError, EOFError, paramiko.SSHException):
                    done.set()

            up = threading.Thread(target=upstream, daemon=True)
            up.start()
            try:
                while not stop.is_set() and not done.is_set():
                    try:
                        data = chan.recv(65536)
                    except TimeoutError:
                        continue
                    if not data:
                        break
                    sock.sendall(data)
            except (OSError, EOFError, paramiko.SSHException):
                pass
            finally:
                done.set()
                up.join()
                # the connection may be gone already (closed under a running tunnel): nothing to tell
                for closing in (chan.close, sock.close):
                    try:
                        closing()
                    except (OSError, EOFError, paramiko.SSHException):
                        pass

        def accept_loop() -> None:
            while not stop.is_set():
                try:
                    sock, peer = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                if stop.is_set():  # the wake-up connection of the closing ``finally`` below
                    sock.close()
                    return
                # Streamed answers arrive a token per write: without this, Nagle holds each small write
                # until the client's delayed ACK (~40 ms), and a 400 tok/s stream reads as ~25 tok/s.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    chan = transport.open_channel(
                        "direct-tcpip", (remote_host, remote_port), peer, timeout=10
                    )
                except (paramiko.SSHException, OSError, EOFError):
                    sock.close()  # the client sees a closed connection, like a refused port
                    continue
                threading.Thread(target=pump, args=(sock, chan), daemon=True).start()

        acceptor = threading.Thread(target=accept_loop, daemon=True)
        acceptor.start()
        try:
            yield local_port
        finally:
            stop.set()
            with contextlib.suppress(OSError):  # wake accept() at once instead of at its next timeout
                socket.create_connection(("127.0.0.1", local_port), timeout=1).close()
            acceptor.join(timeout=2)  # before close: a descriptor closed under accept() can be reused
            listener.close()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _short(cmd: str, n: int = 120) -> str:
    return cmd if len(cmd) <= n else cmd[: n - 3] + "..."


# known_hosts files parsed once per file version for the process: paramiko's own loader is quadratic in
# the file's length (each line is checked against all before it), and runs for every connection; with
# 1,000 hosts that is 0.2 s of CPU per connection, the largest cost of a fleet run.
_KNOWN: dict[str, tuple[bytes, dict[str, list[Any]], list[tuple[str, Any]]]] = {}
_KNOWN_LOCK = threading.Lock()


def _known_entries(path: Path) -> tuple[dict[str, list[Any]], list[tuple[str, Any]]]:
    """(plain host name -> entries, [(hashed name, entry)]) of an OpenSSH known_hosts file."""
    from paramiko.hostkeys import HostKeyEntry

    data = path.read_bytes()
    ident = hashlib.sha256(data).digest()  # the content, not the mtime: a rewrite within a clock tick counts
    with _KNOWN_LOCK:
        hit = _KNOWN.get(str(path))
    if hit is not None and hit[0] == ident:
        return hit[1], hit[2]
    plain: dict[str, list[Any]] = {}
    hashed: list[tuple[str, Any]] = []
    for lineno, line in enumerate(data.decode("utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = HostKeyEntry.from_line(line, lineno)
        except paramiko.SSHException:
            continue  # as paramiko's loader: a line it cannot read is skipped
        if entry is None:
            continue
        for h in entry.hostnames:
            if h.startswith("|1|"):
                hashed.append((h, entry))
            else:
                plain.setdefault(h, []).append(entry)
    with _KNOWN_LOCK:
        _KNOWN[str(path)] = (ident, plain, hashed)
    return plain, hashed


def add_known_keys(client: paramiko.SSHClient, path: Path, name: str) -> None:
    """Add the keys ``path`` holds for ``name`` (``host`` or ``[host]:port``) to the client's host keys."""
    if not path.exists():
        return
    plain, hashed = _known_entries(path)
    keys = client.get_host_keys()
    for entry in plain.get(name, []):
        keys.add(name, entry.key.get_name(), entry.key)
    for h, entry in hashed:
        if paramiko.HostKeys.hash_host(name, h) == h:
            keys.add(h, entry.key.get_name(), entry.key)


def _fabric_config(config: SshSettings, target: Target | None = None) -> Config:
    """Fabric config carrying the OpenSSH client config resolved for this target as ``ssh -G`` would
    (llmfleet.host.ssh_config: Include, Match, first value wins): ~/.ssh/config and
    /etc/ssh/ssh_config, or the file named by the llmfleet.ssh.config_file setting (or by -F in
    ansible_ssh_common_args). Inventory ansible_* variables win over it, as in Ansible, where they
    become ssh's command-line options."""
    from llmfleet.host import ssh_config

    path = (target.config_file if target else None) or config.config_file
    if target is None:
        if path:
            return Config(runtime_ssh_path=os.path.expanduser(str(path)))
        return Config(overrides={"load_ssh_configs": True})
    cmdline = {k: list(v) for k, v in target.ssh_options.items()}
    if target.port is not None:
        cmdline["port"] = [str(target.port)]
    if target.user:
        cmdline["user"] = [str(target.user)]
    if target.key_file:
        cmdline["identityfile"] = [str(target.key_file), *cmdline.get("identityfile", [])]
    try:
        blocks = [_ssh_block(target.address, ssh_config.resolve(target.address, config_file=path, options=cmdline))]
        jumps = blocks[0][1]
        for hop in jumps:
            blocks.append(_ssh_block(hop, ssh_config.resolve(hop, config_file=path)))
    except (ssh_config.SshConfigError, OSError) as exc:
        raise RemoteError(f"host {target.name}: ssh config: {exc}") from None
    return Config(ssh_config=paramiko.SSHConfig.from_text("\n".join(text for text, _ in blocks)))


def _ssh_block(alias: str, r: Any) -> tuple[str, list[str]]:
    """One ``Host`` block for paramiko holding the resolved options, and the ProxyJump hop names."""

    def esc(v: str) -> str:
        return v.replace("%", "%%")

    lines = [f"Host {alias}", f"  HostName {esc(r.hostname)}", f"  Port {r.port}"]
    if r.user:
        lines.append(f"  User {r.user}")
    lines += [f"  IdentityFile {esc(f)}" for f in r.expanded("identityfile")]
    hops: list[str] = []
    jump = r.get("proxyjump")
    if jump and jump.lower() != "none":
        lines.append(f"  ProxyJump {jump}")
        for hop in jump.split(","):
            name = hop.rsplit("@", 1)[-1]
            hops.append(name.rsplit(":", 1)[0] if name.count(":") == 1 else name)
    elif r.get("proxycommand") and r.get("proxycommand").lower() != "none":
        lines.append(f"  ProxyCommand {esc(r.expanded('proxycommand')[0])}")
    return "\n".join(lines) + "\n", hops


def connect(
    host: Host,
    *,
    config: SshSettings | Settings | Mapping[str, Any] | None = None,
    accept_new_host_keys: bool = False,
) -> Remote:
    """Open an SSH connection to an inventory host (strict host-key checking)."""
    ssh = SshSettings.of(config)
    return connect_target(Target.from_host(host, default_user=ssh.user), ssh, accept_new_host_keys=accept_new_host_keys)


def connect_target(target: Target, ssh: SshSettings, *, accept_new_host_keys: bool = False) -> Remote:
    """Open an SSH connection to a host's resolved login (``Target``; strict host-key checking)."""
    known_hosts = ssh.known_hosts_path
    connect_timeout = int(target.timeout or ssh.connect_timeout)
    connect_kwargs: dict[str, Any] = {"banner_timeout": connect_timeout, "auth_timeout": connect_timeout}
    if target.key_file:
        key_path = os.path.expanduser(str(target.key_file))
        if not os.path.exists(key_path):
            raise RemoteError(
                f"host {target.name}: ansible_ssh_private_key_file {key_path} does not exist; fix the inventory"
            )
        connect_kwargs["key_filename"] = [key_path]
    conn = Connection(
        target.address,
        user=target.user,
        port=target.port,
        config=_fabric_config(ssh, target),
        connect_timeout=connect_timeout,
        connect_kwargs=connect_kwargs,
    )
    client = conn.client
    name = known_hosts_name(str(conn.host), int(conn.port or 22))
    if known_hosts.exists():
        try:
            add_known_keys(client, known_hosts, name)
        except (OSError, UnicodeDecodeError) as exc:
            raise RemoteError(f"{known_hosts}: unreadable known-hosts file: {exc}") from None
    with contextlib.suppress(OSError, UnicodeDecodeError):  # added last: its keys win, as paramiko's system keys do
        add_known_keys(client, Path(os.path.expanduser("~/.ssh/known_hosts")), name)
    policy = _StrictPolicy(target, known_hosts, accept_new_host_keys)
    client.set_missing_host_key_policy(policy)
    try:
        conn.open()
    except HostKeyError:
        raise
    except paramiko.BadHostKeyException as exc:
        raise HostKeyError(
            f"host {target.name} ({exc.hostname}): HOST KEY CHANGED: got {fingerprint(exc.key)}, expected "
            f"{fingerprint(exc.expected_key)}; if the host was reinstalled, remove the old key with "
            f"ssh-keygen -R {shlex.quote(exc.hostname)} -f {known_hosts} (and ~/.ssh/known_hosts), then rerun"
        ) from None
    except paramiko.AuthenticationException as exc:
        raise RemoteError(
            f"host {target.name}: SSH authentication failed for user {conn.user!r} at "
            f"{target.address}:{conn.port}: {exc}; check ansible_user / ansible_ssh_private_key_file"
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        failed = client.get_transport()
        banner = None if failed is None else failed.remote_version
        with contextlib.suppress(Exception):  # its thread may still wait for a banner: stop it now
            client.close()
        raise RemoteError(
            connect_failure(target.name, str(target.address), int(conn.port or 22), connect_timeout, exc, banner)
        ) from None
    transport = client.get_transport()
    if transport is not None:
        with contextlib.suppress(OSError):
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return Remote(target, conn, float(ssh.command_timeout))


def _cause(exc: BaseException) -> BaseException | None:
    """The innermost exception ``exc`` was raised while handling (paramiko wraps a socket timeout or EOF in
    ``SSHException("Error reading SSH protocol banner")``)."""
    seen = exc
    while seen.__context__ is not None and seen.__context__ is not seen:
        seen = seen.__context__
    return None if seen is exc else seen


def connect_failure(name: str, address: str, port: int, timeout: float, exc: BaseException,
                    banner: str | None) -> str:
    """The one line that says why a connection to ``address:port`` failed, and what to look at.

    ``exc`` is what opening the connection raised; ``banner`` the SSH identification the server sent
    (``""``: none yet; ``None``: no SSH transport was made, the failure came before or with TCP). Paramiko
    reports a server that accepts TCP and never speaks SSH as "Error reading SSH protocol banner", or, when
    its own negotiation wait ends first, as "No existing session": both are said here as what they mean.
    """
    where = f"{address}:{port}"
    head = f"host {name}: cannot connect to {where}"
    text = str(exc).strip()
    if banner == "" and isinstance(exc, (paramiko.SSHException, EOFError)):
        cause = _cause(exc)
        if isinstance(exc, EOFError) or isinstance(cause, (EOFError, ConnectionResetError)):
            return (f"host {name}: cannot connect: {where} closed the connection before sending an SSH banner: "
                    f"is sshd listening there (and does it accept this client)?")
        if text.startswith("Indecipherable protocol version"):
            said = text.split('"', 1)[-1].rstrip('"')[:60]
            return (f"host {name}: cannot connect: {where} does not speak SSH (it sent {said!r}): "
                    f"is this the host's SSH port (ansible_port)?")
        return f"host {name}: cannot connect: no SSH banner from {where} within {timeout:g} s: is sshd listening there?"
    if banner and isinstance(exc, paramiko.SSHException) and text in ("No existing session", "Negotiation failed.", ""):
        return (f"{head}: the SSH handshake did not finish within {timeout:g} s (the server said "
                f"{banner[:60]!r}): is the host overloaded?")
    if isinstance(exc, socket.gaierror):
        return f"{head}: cannot resolve {address}: {exc.strerror or text}; check ansible_host (or ~/.ssh/config)"
    errors = getattr(exc, "errors", None)  # paramiko's NoValidConnectionsError: one socket error per address
    codes = {getattr(e, "errno", None) for e in errors.values()} if isinstance(errors, dict) else {
        getattr(exc, "errno", None)}
    if codes == {errno.ECONNREFUSED}:
        return f"{head}: connection refused: is sshd running there, and is the port right (ansible_port)?"
    if codes <= {errno.EHOSTUNREACH, errno.ENETUNREACH} and codes:
        return f"{head}: no route to the host: is it up, and is the address right (ansible_host)?"
    if isinstance(errors, dict) and errors:
        each = (f"{a[0]}: {getattr(e, 'strerror', None) or e}" for a, e in sorted(errors.items(), key=str))
        return f"{head}: " + "; ".join(each)
    if isinstance(exc, TimeoutError):
        return f"{head}: no answer within {timeout:g} s: is the host up, and is the port open?"
    return f"{head}: {text or type(exc).__name__}"
