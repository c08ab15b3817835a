"""Careless commands: what a hurried operator types, run as they would run it.

Each row is one command line given to the installed wheel's `llmfleet` in a fresh folder holding a small
fleet whose hosts cannot answer: `gpu-v100-01` is a loopback port that accepts TCP and never speaks SSH,
`gpu-4090-01` a loopback port where nothing listens (the other example hosts point there too). What every
row asserts, whatever the command:
- it ends within its time limit (no hang) and prints no Python traceback;
- its exit code is the one the row names (0 ok, 1 check failed, 2 usage error);
- a failure is one line naming what to do (``says``: a part of that line): on stderr, or for a fleet
  command whose report is the per-host outcome, on stdout;
- ``--json`` rows print one JSON document on stdout whatever the outcome;
- a row that needs no connection opens none (the listening host counts every TCP connection).

Rows live in ``tests/careless_rows_*.py`` modules (one per area); ``tests/test_careless_commands.py`` runs
them all.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
import pytest

REPO = Path(__file__).resolve().parents[1]
SILENT = "gpu-v100-01"  # accepts TCP, never sends an SSH banner
CLOSED = "gpu-4090-01"  # nothing listens


@dataclass(frozen=True)
class Cmd:
    """One careless command and what it must do."""

    args: tuple[str, ...]
    rc: int
    says: str = ""  # part of the one line a failure prints (case-insensitive); for rc 0, of stdout
    connects: bool = False  # may open a connection to a fleet host
    stdin: str = "devnull"  # devnull | closed | any other text: fed on stdin
    stdout: str = "pipe"  # pipe | closed (the reader went away, e.g. `| head -0`)
    json: bool = False  # stdout must be one JSON document
    one_line: bool = True  # a failure is exactly one line on stderr
    silent: bool = False  # ends saying nothing (the reader of stdout went away: exit 141, as `head` leaves a tool)
    # written into the folder first (relative paths); one starting with #! is made executable (a script)
    files: dict[str, bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 90.0

    @property
    def id(self) -> str:
        extra = [] if self.stdin == "devnull" else [f"stdin={self.stdin[:10]}"]
        extra += [] if self.stdout == "pipe" else [f"stdout={self.stdout}"]
        return " ".join([*self.args, *extra])[:90] or "(no args)"


class Listener:
    """A loopback TCP port that accepts and then says nothing (a host whose sshd is stuck, or some other
    service on port 22), counting the connections it is given."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.held.append(conn)

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self.held:
            c.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def write_fleet(folder: Path, silent_port: int, closed: int) -> None:
    """The example fleet's groups and services, every host on loopback."""
    inv = folder / "inventory"
    shutil.copytree(REPO / "inventory" / "example" / "group_vars", inv / "group_vars")
    shutil.copytree(REPO / "inventory" / "example" / "host_vars", inv / "host_vars")
    lo = {"ansible_host": "127.0.0.1", "ansible_port": closed}
    hosts = {
        "all": {"children": {"gpu": {"children": {
            "v100": {"hosts": {SILENT: {"ansible_host": "127.0.0.1", "ansible_port": silent_port},
                               "gpu-v100-02": lo}},
            "v100_16g": {"hosts": {"gpu-v100-11": lo}},
            "rtx4090": {"hosts": {CLOSED: lo}},
            "t4": {"hosts": {"gpu-t4-01": lo}},
            "p40": {"hosts": {"gpu-p40-01": lo}},
        }}}}
    }
    (inv / "hosts.yml").write_text(json.dumps(hosts))  # JSON is YAML
    (folder / "invoke.yaml").write_text("llmfleet:\n  ssh:\n    connect_timeout: 3\n    command_timeout: 10\n")


@dataclass
class Result:
    rc: int | None  # None: it did not end in time
    out: str
    err: str


class Fleet:
    def __init__(self, llmfleet: str, folder: Path, env: dict[str, str]) -> None:
        self.llmfleet, self.folder, self.env = llmfleet, folder, env
        self.listener = Listener()
        key = Path(env["HOME"]) / ".ssh" / "fleet_ed25519"  # the example fleet's key file (any key will do)
        key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        paramiko.RSAKey.generate(2048).write_private_key_file(str(key))
        write_fleet(folder, self.listener.port, closed_port())

    def run(self, cmd: Cmd) -> Result:
        for rel, data in cmd.files.items():
            p = self.folder / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            if data.startswith(b"#!"):
                p.chmod(0o755)
        env = {**self.env, **cmd.env}
        stdin: int | None = subprocess.DEVNULL
        feed: bytes | None = None
        if cmd.stdin == "closed":
            stdin = None  # replaced below by a closed descriptor
        elif cmd.stdin != "devnull":
            stdin, feed = subprocess.PIPE, cmd.stdin.encode()
        read_end = None
        stdout: int = subprocess.PIPE
        if cmd.stdout == "closed":  # a pipe whose reader has gone: writes fail with EPIPE
            read_end, write_end = os.pipe()
            os.close(read_end)
            stdout = write_end
        pre = None
        if cmd.stdin == "closed":
            def pre() -> None:  # noqa: E306 - in the child: fd 0 closed, as `llmfleet ... <&-`
                os.close(0)
        try:
            proc = subprocess.Popen([self.llmfleet, *cmd.args], cwd=self.folder, env=env, stdin=stdin,
                                    stdout=stdout, stderr=subprocess.PIPE, preexec_fn=pre)
        finally:
            if cmd.stdout == "closed":
                os.close(stdout)
        try:
            out, err = proc.communicate(feed, timeout=cmd.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return Result(None, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace"))
        return Result(proc.returncode, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace"))

    def close(self) -> None:
        self.listener.close()


def check(fleet: Fleet, cmd: Cmd) -> None:
    before = fleet.listener.accepted
    res = fleet.run(cmd)
    shown = f"$ llmfleet {' '.join(cmd.args)}\nexit {res.rc}\nstdout: {res.out[-1500:]}\nstderr: {res.err[-3000:]}"
    assert res.rc is not None, f"no end within {cmd.timeout_s:g} s (a hang)\n{shown}"
    assert "Traceback (most recent call last)" not in res.out + res.err, f"a traceback\n{shown}"
    assert res.rc == cmd.rc, f"exit {res.rc}, not {cmd.rc}\n{shown}"
    if cmd.silent:
        assert not res.err.strip(), f"a closed stdout is not worth a word on stderr\n{shown}"
    elif cmd.rc != 0:
        # on stderr; a fleet command's per-host outcome may be its report on stdout
        lines = [ln for ln in res.err.splitlines() if ln.strip()] or [ln for ln in res.out.splitlines() if ln.strip()]
        assert lines, f"a failure that says nothing\n{shown}"
        if cmd.one_line:
            assert len(lines) == 1, f"{len(lines)} lines, not one\n{shown}"
        if cmd.says:
            assert cmd.says.lower() in "\n".join(lines).lower(), f"the failure does not say {cmd.says!r}\n{shown}"
    elif cmd.says:
        assert cmd.says.lower() in (res.out + res.err).lower(), f"the output does not say {cmd.says!r}\n{shown}"
    if cmd.json:
        try:
            json.loads(res.out)
        except ValueError:
            pytest.fail(f"--json printed no JSON document\n{shown}")
    if not cmd.connects:
        assert fleet.listener.accepted == before, f"it connected to a host, though it needs none\n{shown}"
