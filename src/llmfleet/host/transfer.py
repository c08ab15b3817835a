"""Resumable file sending to hosts over llmfleet's SSH layer (paramiko), from this machine or host to host.

``send_file`` streams one local file (from a byte offset) into a staging path on a host through one
SSH channel: the host appends what it receives (``scripts.receive_script``), so a copy that is cut
leaves a staging file holding an exact prefix, and the next call resumes from its size. It knows
nothing of models: any large file (a model shard, a container-image archive) can go this way::

    from llmfleet.host.transfer import send_file
    done = send_file(remote, "/data/img.tar", "/var/tmp/img.tar.part", offset=0,
                     size=os.path.getsize("/data/img.tar"), limit_rate=50_000_000,
                     progress=lambda n: bar.advance(task, n))

``send_between`` makes the source host send to the target directly (sparing this machine's uplink):
a one-use ed25519 key made on the source (its private half never leaves it, mode 0600 in a private
temporary folder), authorised on the target for one command only::

    restrict,from="<source address>",command="<receive this staging file from this offset>" ssh-ed25519 ...

with the target's host key (the one this machine verified) as the source's only known host; the
source runs ``tail -c +OFF FILE | python3 pump | ssh -i KEY target``. The key line and the folder are
removed afterwards, also when the copy fails. Hosts need sh, coreutils, python3 and (the source) the
OpenSSH client.
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paramiko

from llmfleet.errors import RemoteError
from llmfleet.host import model_scripts as S
from llmfleet.host import trace

CHUNK = 256 * 1024
STALL_S = 60.0  # a send that cannot move one chunk for this long is cut
EXIT_WAIT_S = 120.0  # after the last byte: how long the host may take to answer
PEER_ALIAS = "llmfleet-peer"
PEER_MARK = "llmfleet-transfer-"
q = shlex.quote


class TransferError(RemoteError):
    """A copy did not complete. ``position``: the bytes the staging file is known to hold at least
    (the resume point is re-read from the host before the next try)."""

    def __init__(self, message: str, *, host: str = "", path: str = "", position: int = 0) -> None:
        super().__init__(message)
        self.host = host
        self.path = path
        self.position = position


class StagingTaken(TransferError):
    """The staging file stopped being this copy's while it was written: its owner stamp names another
    writer (``owner``: that writer's token, ``none`` when the stamp is gone, ``replaced`` when the file
    written to was swapped). Not a cut: running it again would not resume this copy."""

    def __init__(self, message: str, *, owner: str, host: str = "", path: str = "") -> None:
        super().__init__(message, host=host, path=path, position=0)
        self.owner = owner


def _taken(host: str, dest_part: str, owner: str, path: str) -> StagingTaken:
    return StagingTaken(f"host {host}: {dest_part} was taken by another writer while this copy was written to it "
                        f"(its owner stamp: {owner})", owner=owner, host=host, path=path)


def _buffered(chan: Any) -> str:
    """What the host's command printed that is still in the channel's buffer (never blocks)."""
    got = b""
    try:
        while chan is not None and chan.recv_ready() and len(got) < 65536:
            got += chan.recv(65536)
    except (OSError, EOFError, paramiko.SSHException):
        pass
    return got.decode("utf-8", "replace")


@dataclass(frozen=True)
class Sent:
    """One completed ``send_file``: bytes sent now, the staging file's size after, seconds taken."""

    sent: int
    size_after: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0


class Pacer:
    """``limit_rate`` in bytes/s over the whole send (sleeps before a chunk that would run ahead)."""

    def __init__(self, limit_rate: int | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.limit = limit_rate if limit_rate and limit_rate > 0 else None
        self.clock, self.sleep = clock, sleep
        self.t0 = clock()
        self.done = 0

    def chunk(self, default: int = CHUNK) -> int:
        """A chunk that keeps the pace smooth: about a tenth of a second's worth under a limit."""
        return default if self.limit is None else max(4096, min(default, self.limit // 10))

    def wait(self, n: int) -> None:
        """Account ``n`` bytes about to be sent, sleeping first when they would exceed the limit."""
        self.done += n
        if self.limit is None:
            return
        ahead = self.done / self.limit - (self.clock() - self.t0)
        if ahead > 0:
            self.sleep(ahead)


def send_file(remote: Any, local_path: str, dest_part: str, *, offset: int, size: int,
              limit_rate: int | None = None, progress: Callable[[int], None] | None = None,
              sudo: bool = True, stall_s: float = STALL_S, owner: tuple[str, str] | None = None) -> Sent:
    """Send bytes ``offset`` .. ``size`` of ``local_path`` to ``dest_part`` on the host of ``remote``
    (an open ``llmfleet.host.ssh.Remote``), appending to what ``dest_part`` holds.

    ``offset``: the resume point, the bytes ``dest_part`` already holds (0 starts it afresh; a staging
    file shorter than ``offset`` is refused, a longer one is cut back to it). ``size``: the file's whole
    size (the staging file holds exactly ``size`` bytes after). ``limit_rate``: bytes per second at
    most (None: as fast as the link goes). ``progress(n)``: called with each ``n`` bytes sent (an
    increment, as rich's ``advance``). ``sudo``: write as the deploy's user (root). A send that makes
    no progress for ``stall_s`` seconds is cut.

    Returns ``Sent``. Raises ``TransferError`` (one line naming the host, the file and the bytes
    reached) when the connection drops, the host refuses, or the sizes disagree; whatever reached the
    host stays in ``dest_part`` for the next call to resume. ``owner``: (the owner stamp's path, this
    copy's token): the host writes only while the stamp holds the token (``scripts.receive_script``),
    else ``StagingTaken``: another writer took the staging file."""
    name = getattr(remote, "name", "?")
    if not 0 <= offset <= size:
        raise ValueError(f"offset {offset} outside 0..{size}")
    local_size = os.path.getsize(local_path)
    if local_size != size:
        raise TransferError(f"host {name}: {local_path} is {local_size} bytes, not the {size} expected "
                            "(it changed since it was hashed)", host=name, path=local_path, position=offset)
    command = S.receive_script(dest_part, offset, owner)
    t0 = time.monotonic()
    pos = offset
    rc: int | None = None
    chan: paramiko.Channel | None = None

    def cut(why: str) -> TransferError:
        return TransferError(f"host {name}: copy of {local_path} to {dest_part} cut at {pos:,} of {size:,} bytes: "
                             f"{why}; run it again to resume", host=name, path=local_path, position=pos)

    try:
        chan = remote.open_command(command, sudo=sudo)
        chan.settimeout(stall_s)
        pacer = Pacer(limit_rate)
        buf = bytearray(pacer.chunk())
        view = memoryview(buf)
        with open(local_path, "rb") as fh:
            fh.seek(offset)
            while pos < size:
                n = fh.readinto(view[: min(len(buf), size - pos)])
                if not n:
                    raise cut(f"{local_path} ended early")
                if chan.exit_status_ready():
                    break  # the host's command ended (refused the resume point, disk full, ...)
                pacer.wait(n)
                chan.sendall(bytes(view[:n]))
                pos += n
                if progress is not None:
                    progress(n)
        out = _answer(chan, cut)
        rc = chan.recv_exit_status()
        err = b""
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
    except TransferError:
        raise
    except EOFError:
        raise cut("the SSH connection closed") from None
    except (OSError, paramiko.SSHException, RemoteError) as exc:
        said = _buffered(chan)  # a host that stopped the copy itself may have said why before it closed
        if S.parse_staging_taken(said) is not None:
            raise _taken(name, dest_part, str(S.parse_staging_taken(said)), local_path) from None
        raise cut(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
    finally:
        if chan is not None:
            chan.close()
        shown = remote.command_line(command, sudo=sudo) if hasattr(remote, "command_line") else command
        trace.emit(name, f"[{size - offset:,} bytes on stdin] {shown}", rc, time.monotonic() - t0)
    after = _received(name, local_path, dest_part, offset, size, out.decode("utf-8", "replace"), rc, err, cut)
    return Sent(sent=pos - offset, size_after=after, seconds=time.monotonic() - t0)


def _answer(chan: paramiko.Channel, cut: Callable[[str], TransferError]) -> bytearray:
    """After the last byte: what the host printed (its first 64 KiB), once its command has ended."""
    chan.shutdown_write()
    chan.settimeout(EXIT_WAIT_S)
    out = bytearray()
    deadline = time.monotonic() + EXIT_WAIT_S
    while time.monotonic() < deadline:
        try:
            chunk = chan.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            break
        if len(out) < 65536:
            out += chunk
    if not chan.exit_status_ready() and not chan.status_event.wait(max(0.0, deadline - time.monotonic())):
        raise cut(f"no answer from the host within {EXIT_WAIT_S:.0f}s after the last byte")
    return out


def _received(name: str, local_path: str, dest_part: str, offset: int, size: int, text: str, rc: int, err: bytes,
              cut: Callable[[str], TransferError]) -> int:
    """The bytes the staging file holds after the copy, from the host's answer; else why not, raised."""
    taken = S.parse_staging_taken(text)
    if taken is not None:
        raise _taken(name, dest_part, taken, local_path)
    lost = S.parse_resume_lost(text)
    if lost is not None:
        raise TransferError(f"host {name}: {dest_part} holds {lost:,} bytes, fewer than the resume point "
                            f"{offset:,}; probe the host again", host=name, path=local_path, position=0)
    after = S.parse_received(text)
    if rc != 0:
        detail = (err.decode("utf-8", "replace").strip() or text.strip() or f"exit {rc}").splitlines()[-1][:300]
        raise cut(f"the host's receive ended with exit {rc}: {detail}")
    if after != size:
        raise cut(f"the host holds {after if after is not None else 'an unknown number of'} bytes after the copy")
    return after


# ---------------------------------------------------------------------------------------------
# Host to host


@dataclass(frozen=True)
class Peer:
    """How the source host reaches the target's sshd: an address (name or IP) and port, the target's
    login user (its deploy user), and the target's host key as this machine verified it."""

    address: str
    port: int
    user: str
    host_key_line: str  # "<type> <base64>"


def authorized_line(public_key: str, *, source_address: str, command: str, token: str) -> str:
    """One ``authorized_keys`` line: the key may run ``command`` only, from ``source_address`` only,
    with no pty, agent, X11 or port forwarding (``restrict``)."""
    if any(c in command for c in "\n\r\\"):
        raise ValueError("a forced command must be one line without backslashes")
    if any(c in source_address for c in '",\n '):
        raise ValueError(f"bad source address {source_address!r}")
    key = " ".join(public_key.split()[:2])
    cmd = command.replace('"', '\\"')
    return f'restrict,from="{source_address}",command="{cmd}" {key} {PEER_MARK}{token}'


def peer_setup_script(peer: Peer) -> str:
    """On the source, as its login user: a private folder with a new ed25519 key and a known_hosts
    holding only the target's key; prints the folder, the public key and the source's own address on
    the route to the target (what the target's ``from=`` must name)."""
    kh = f"{PEER_ALIAS} {peer.host_key_line}"
    resolve = ("import socket, sys\n"
               "ai = socket.getaddrinfo(sys.argv[1], int(sys.argv[2]), 0, socket.SOCK_DGRAM)[0]\n"
               "s = socket.socket(ai[0], socket.SOCK_DGRAM)\n"
               "s.connect(ai[4])\n"
               "print('@@source-address', s.getsockname()[0])\n")
    return "\n".join([
        "umask 077",
        "d=$(mktemp -d \"${TMPDIR:-/tmp}/llmfleet-peer.XXXXXXXX\") || exit 1",
        'echo "@@peer-dir $d"',
        'ssh-keygen -q -t ed25519 -N "" -C llmfleet-transfer -f "$d/key" </dev/null >/dev/null || exit 1',
        f'printf "%s\\n" {q(kh)} > "$d/known_hosts" || exit 1',
        'echo "@@peer-key $(cat "$d/key.pub")"',
        f"python3 -c {q(resolve)} {q(peer.address)} {int(peer.port)} || exit 1",
    ])


def parse_peer_setup(stdout: str) -> tuple[str | None, str | None, str | None]:
    """(the private folder, the public key, the source's address)."""
    got: dict[str, str] = {}
    for line in stdout.splitlines():
        for key in ("@@peer-dir ", "@@peer-key ", "@@source-address "):
            if line.startswith(key):
                got[key] = line[len(key):].strip()
    return got.get("@@peer-dir "), got.get("@@peer-key "), got.get("@@source-address ")


_HOME = "import pwd, sys; print(pwd.getpwnam(sys.argv[1]).pw_dir)"


def _keys_file(user: str) -> list[str]:
    """sh lines that set ``$f`` to ``user``'s authorized_keys (whoever runs them: sudo changes $HOME)."""
    return [f"h=$(python3 -c {q(_HOME)} {q(user)}) || exit 1", 'f="$h/.ssh/authorized_keys"']


def authorize_script(line: str, user: str) -> str:
    """On the target: add the one-use key line to ``user``'s ``~/.ssh/authorized_keys`` (the folder
    and file made, owned by ``user``, when missing)."""
    return "\n".join([
        "umask 077",
        *_keys_file(user),
        'if [ ! -d "$h/.ssh" ]; then mkdir -p "$h/.ssh" && chown ' + q(user) + ' "$h/.ssh" || exit 1; fi',
        'if [ ! -f "$f" ]; then : > "$f" && chown ' + q(user) + ' "$f" || exit 1; fi',
        f'printf "%s\\n" {q(line)} >> "$f" || exit 1',
        'echo "@@authorized"',
    ])


def deauthorize_script(token: str, user: str) -> str:
    """On the target: remove the key line marked with ``token`` from ``user``'s authorized_keys (the
    file keeps its inode, owner and mode)."""
    mark = q(PEER_MARK + token)
    return "\n".join([
        *_keys_file(user),
        '[ -f "$f" ] || { echo "@@deauthorized"; exit 0; }',
        f'grep -vF -- {mark} "$f" > "$f.llmfleet.tmp"',
        'cat "$f.llmfleet.tmp" > "$f" && rm -f "$f.llmfleet.tmp" || exit 1',
        f'if grep -qF -- {mark} "$f"; then exit 1; fi',
        'echo "@@deauthorized"',
    ])


# python3 between tail and ssh on the source: copies stdin to stdout, at most LIMIT bytes/s (0: no
# limit), and reports the bytes passed on stderr ("@@sent N") a few times a second.
PUMP = r"""import os, sys, time
limit = int(sys.argv[1])
chunk = 1 << 20 if limit <= 0 else max(4096, min(1 << 20, limit // 10))
t0 = shown = time.monotonic()
sent = 0
while True:
    b = os.read(0, chunk)
    if not b:
        break
    if limit > 0:
        ahead = (sent + len(b)) / limit - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    view = memoryview(b)
    try:
        while view:
            view = view[os.write(1, view):]
    except BrokenPipeError:
        sys.stderr.write("@@sent %d\n" % sent)
        sys.exit(1)  # ssh ended: its own message says why
    sent += len(b)
    if time.monotonic() - shown > 0.25:
        shown = time.monotonic()
        sys.stderr.write("@@sent %d\n" % sent)
        sys.stderr.flush()
sys.stderr.write("@@sent %d\n" % sent)
"""


def peer_send_script(peer_dir: str, source_file: str, offset: int, peer: Peer, limit_rate: int | None) -> str:
    """On the source, as its login user: stream the file from ``offset`` to the target through the
    one-use key (the target runs its forced command, whatever is asked)."""
    ssh = ["ssh", "-F", "/dev/null", "-i", f"{peer_dir}/key", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
           "-o", f"UserKnownHostsFile={peer_dir}/known_hosts", "-o", "GlobalKnownHostsFile=/dev/null",
           "-o", "StrictHostKeyChecking=yes", "-o", f"HostKeyAlias={PEER_ALIAS}", "-o", "ConnectTimeout=15",
           "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "-p", str(int(peer.port)),
           f"{peer.user}@{peer.address}", "llmfleet-receive"]
    return "\n".join([
        f"tail -c +{int(offset) + 1} -- {q(source_file)} | python3 -c {q(PUMP)} {int(limit_rate or 0)} | "
        + shlex.join(ssh),
        'echo "@@ssh-rc $?"',
    ])


def peer_cleanup_script(peer_dir: str) -> str:
    """On the source: remove the private folder (the key with it)."""
    return f"rm -rf -- {q(peer_dir)}\necho @@peer-cleaned"


def _sent_total(line: str) -> int | None:
    if line.startswith("@@sent "):
        v = line[7:].strip()
        return int(v) if v.isdigit() else None
    return None


def send_between(source: Any, target: Any, source_file: str, dest_part: str, *, offset: int, size: int,
                 peer: Peer, limit_rate: int | None = None, progress: Callable[[int], None] | None = None,
                 timeout: float | None = None, sudo: bool = True, owner: tuple[str, str] | None = None) -> Sent:
    """The source host (``source``, an open Remote) sends bytes ``offset`` .. ``size`` of its
    ``source_file`` to ``dest_part`` on the target (``target``, an open Remote), directly: this
    machine only sets the one-use key up, watches the progress the source reports, and removes the
    key and its folder afterwards (also on failure). ``peer``: how the source reaches the target
    (``Peer``). Raises ``TransferError`` as ``send_file`` does; other arguments as ``send_file``."""
    tname, sname = getattr(target, "name", "?"), getattr(source, "name", "?")
    t0 = time.monotonic()
    token = secrets.token_hex(8)
    peer_dir: str | None = None
    authorized = False
    pos = offset

    def cut(why: str) -> TransferError:
        return TransferError(f"host {tname}: copy of {source_file} from {sname} to {dest_part} cut at {pos:,} of "
                             f"{size:,} bytes: {why}; run it again to resume", host=tname, path=source_file,
                             position=pos)

    try:
        res = source.run(peer_setup_script(peer), timeout=60)
        peer_dir, pub, src_addr = parse_peer_setup(res.stdout)
        if res.rc != 0 or not (peer_dir and pub and src_addr):
            detail = (res.stderr.strip() or res.stdout.strip() or f"exit {res.rc}").splitlines()[-1][:300]
            raise TransferError(f"host {sname}: cannot prepare the copy to {tname} ({peer.address}:{peer.port}): "
                                f"{detail}", host=tname, path=source_file, position=pos)
        forced = target.command_line(S.receive_script(dest_part, offset, owner), sudo=sudo)
        line = authorized_line(pub, source_address=src_addr, command=forced, token=token)
        res = target.run(authorize_script(line, peer.user), timeout=60)
        authorized = res.rc == 0 and "@@authorized" in res.stdout
        if not authorized:
            raise cut(f"cannot add the one-use key to the target's authorized_keys (exit {res.rc})")
        last = [""]
        out: list[str] = []

        def on_line(text: str) -> None:
            nonlocal pos
            n = _sent_total(text)
            if n is not None:
                if progress is not None and offset + n > pos:
                    progress(offset + n - pos)
                pos = max(pos, offset + n)
            elif text.strip():
                last[0] = text.strip()
                if len(out) < 200:
                    out.append(text)

        limit = timeout if timeout is not None else 300 + (size - offset) / max(1, min(limit_rate or 2**20, 2**20))
        rc = source.stream(peer_send_script(peer_dir, source_file, offset, peer, limit_rate), on_line, timeout=limit)
        text = "\n".join(out)
        taken = S.parse_staging_taken(text)
        if taken is not None:
            raise _taken(tname, dest_part, taken, source_file)
        ssh_rc = next((int(x[8:]) for x in reversed(out) if x.startswith("@@ssh-rc ") and x[8:].strip().isdigit()),
                      None)
        lost = S.parse_resume_lost(text)
        if lost is not None:
            raise TransferError(f"host {tname}: {dest_part} holds {lost:,} bytes, fewer than the resume point "
                                f"{offset:,}; probe the host again", host=tname, path=source_file, position=0)
        after = S.parse_received(text)
        if rc is None:
            raise cut(f"no end within {limit:.0f}s")
        if ssh_rc != 0 or after != size:
            why = next((x.strip() for x in reversed(out) if x.strip() and not x.startswith("@@")), "") or last[0]
            raise cut(f"the source's ssh to {peer.address}:{peer.port} ended with exit {ssh_rc}"
                      + (f": {why[:300]}" if why else "") + (f"; the target holds {after:,} bytes" if after is not None
                                                            else ""))
        pos = after
        return Sent(sent=after - offset, size_after=after, seconds=time.monotonic() - t0)
    except TransferError:
        raise
    except (OSError, EOFError, paramiko.SSHException, RemoteError) as exc:
        raise cut(f"{type(exc).__name__}: {exc}") from None
    finally:
        # the key and its folder go, whatever happened; a failure to remove them fails the copy (or,
        # when the copy failed already, is traced beside it)
        problems = []
        if authorized:
            try:
                r = target.run(deauthorize_script(token, peer.user), timeout=60)
                if "@@deauthorized" not in r.stdout:
                    problems.append(f"host {tname}: remove the line marked {PEER_MARK}{token} from authorized_keys")
            except RemoteError as exc:
                problems.append(f"host {tname}: the one-use key line {PEER_MARK}{token} may remain: {exc}")
        if peer_dir:
            try:
                source.run(peer_cleanup_script(peer_dir), timeout=60)
            except RemoteError as exc:
                problems.append(f"host {sname}: remove {peer_dir}: {exc}")
        if problems:
            trace.emit(tname, "cleanup: " + "; ".join(problems), 1, 0.0)
            if sys.exc_info()[0] is None:
                raise RemoteError("; ".join(problems))  # noqa: B012 - the copy is done, its cleanup is not
