"""A real OpenSSH server on 127.0.0.1 for tests of the SSH layer (no lab needed).

It runs as a child of the test process with its own host key, port and authorized_keys, and is
stopped at the end of the test session.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@dataclass
class Sshd:
    port: int
    dir: Path
    client_key: Path
    host_pub: Path
    proc: subprocess.Popen

    def regenerate_host_key(self) -> None:
        """Give the server a new host key (as a reinstalled machine would have)."""
        key = self.dir / "host_ed25519"
        key.unlink()
        self.host_pub.unlink()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        self.proc.send_signal(1)  # SIGHUP: re-read keys
        time.sleep(0.5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp: Path) -> Sshd:
    tmp.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o700)
    host_key = tmp / "host_ed25519"
    client_key = tmp / "client_ed25519"
    for k in (host_key, client_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True)
    auth = tmp / "authorized_keys"
    shutil.copy(client_key.with_suffix(".pub"), auth)
    os.chmod(auth, 0o600)
    port = _free_port()
    cfg = tmp / "sshd_config"
    cfg.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nAuthorizedKeysFile {auth}\n"
        f"PidFile {tmp}/sshd.pid\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\nAllowTcpForwarding yes\n"
        "LogLevel ERROR\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {proc.stderr.read().decode()}")
        time.sleep(0.05)
    return Sshd(port=port, dir=tmp, client_key=client_key, host_pub=host_key.with_suffix(".pub"), proc=proc)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    if not os.path.exists(SSHD):
        pytest.fail("sshd is not installed: run scripts/test.sh (it installs openssh-server)")
    server = _start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.proc.terminate()
    server.proc.wait(timeout=10)
