"""host.transfer.send_file against a real OpenSSH server on loopback (tests/sshd_fixture.py): whole
copies, resumes, a refused resume point, a cut connection that leaves an exact prefix, the pace."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
import time

import pytest

from llmfleet.host.ssh import connect
from llmfleet.host.transfer import Pacer, TransferError, authorized_line, send_file
from tests.test_ssh import host_for


@pytest.fixture
def remote(sshd, tmp_path):
    r = connect(host_for(sshd), config={"known_hosts": str(tmp_path / "known_hosts")}, accept_new_host_keys=True)
    yield r
    r.close()


def _blob(path, n: int) -> bytes:
    data = hashlib.sha256(b"seed").digest() * (n // 32 + 1)
    data = bytes(b ^ (i % 251) for i, b in enumerate(data[:n]))
    path.write_bytes(data)
    return data


def test_a_whole_file_arrives_and_progress_adds_up(remote, tmp_path):
    src = tmp_path / "model.bin"
    data = _blob(src, 3 * 1024 * 1024 + 17)
    dest = tmp_path / "remote" / "sub" / "model.bin.llmfleet.part"  # its folder is made
    seen: list[int] = []
    done = send_file(remote, str(src), str(dest), offset=0, size=len(data), progress=seen.append)
    assert dest.read_bytes() == data
    assert sum(seen) == len(data) == done.sent == done.size_after
    assert oct(dest.stat().st_mode & 0o777) == "0o644"


def test_a_resume_sends_only_the_rest_and_drops_bytes_past_the_resume_point(remote, tmp_path):
    src = tmp_path / "model.bin"
    data = _blob(src, 1_000_000)
    dest = tmp_path / "part"
    dest.write_bytes(data[:400_000] + b"garbage past the resume point")
    seen: list[int] = []
    done = send_file(remote, str(src), str(dest), offset=400_000, size=len(data), progress=seen.append)
    assert dest.read_bytes() == data
    assert done.sent == sum(seen) == 600_000


def test_a_resume_point_the_host_does_not_hold_is_refused_without_writing(remote, tmp_path):
    src = tmp_path / "model.bin"
    data = _blob(src, 100_000)
    dest = tmp_path / "part"
    dest.write_bytes(data[:10])
    with pytest.raises(TransferError) as exc:
        send_file(remote, str(src), str(dest), offset=50_000, size=len(data))
    assert "holds 10 bytes, fewer than the resume point 50,000" in str(exc.value)
    assert dest.read_bytes() == data[:10]


def test_a_local_file_of_another_size_is_refused(remote, tmp_path):
    src = tmp_path / "model.bin"
    _blob(src, 1000)
    with pytest.raises(TransferError, match="is 1000 bytes, not the 2000 expected"):
        send_file(remote, str(src), str(tmp_path / "part"), offset=0, size=2000)


def test_a_cut_connection_is_one_line_and_the_staging_file_holds_an_exact_prefix(remote, sshd, tmp_path):
    src = tmp_path / "model.bin"
    data = _blob(src, 4 * 1024 * 1024)
    dest = tmp_path / "part"

    def kill_the_session() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not dest.exists() or dest.stat().st_size < 100_000):
            time.sleep(0.05)
        # the session's own sshd process (a child of the listening sshd): as a killed connection
        kids = subprocess.run(["pgrep", "-P", str(sshd.proc.pid)], capture_output=True, text=True).stdout.split()
        for pid in kids:
            os.kill(int(pid), 9)

    killer = threading.Thread(target=kill_the_session)
    killer.start()
    with pytest.raises(TransferError) as exc:
        # paced to take a minute: the cut comes first however slowly this machine schedules the killer
        send_file(remote, str(src), str(dest), offset=0, size=len(data), limit_rate=64_000)
    killer.join()
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("host test-host: copy of ") and "run it again to resume" in msg
    held = dest.stat().st_size
    assert 0 < held < len(data)
    assert dest.read_bytes() == data[:held]
    # a new connection resumes from what the host holds
    r2 = connect(host_for(sshd), config={"known_hosts": str(tmp_path / "known_hosts")})
    try:
        done = send_file(r2, str(src), str(dest), offset=held, size=len(data))
    finally:
        r2.close()
    assert dest.read_bytes() == data and done.sent == len(data) - held


def test_the_pace_holds_a_rate_limit():
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    p = Pacer(1000, clock=lambda: now[0], sleep=sleep)
    assert p.chunk() == 4096  # a tenth of a second's worth, at least 4 KiB
    for _ in range(10):
        p.wait(500)
    assert now[0] == pytest.approx(5.0)  # 5,000 bytes at 1,000 bytes/s
    unlimited = Pacer(None, clock=lambda: 0.0, sleep=lambda s: pytest.fail("no limit, no sleep"))
    unlimited.wait(10**9)
    assert unlimited.chunk() == 256 * 1024


def test_a_one_use_key_line_is_restricted_to_one_command_from_one_address():
    line = authorized_line("ssh-ed25519 AAAAC3Nza llmfleet-transfer", source_address="10.0.0.7",
                           command="sudo -n -u root -- sh -c 'echo \"x\"'", token="ab12")
    assert line == ('restrict,from="10.0.0.7",command="sudo -n -u root -- sh -c \'echo \\"x\\"\'" '
                    "ssh-ed25519 AAAAC3Nza llmfleet-transfer-ab12")
    with pytest.raises(ValueError):
        authorized_line("ssh-ed25519 AAAA", source_address="10.0.0.7", command="a\nb", token="t")
    with pytest.raises(ValueError):
        authorized_line("ssh-ed25519 AAAA", source_address='1.2.3.4",command="sh', command="x", token="t")
