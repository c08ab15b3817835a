"""The SSH layer against a real OpenSSH server on loopback."""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading
import time

import paramiko
import pytest

from llmfleet.errors import RemoteError
from llmfleet.host.ssh import HostKeyError, Target, connect, connect_failure
from llmfleet.inventory.ansible import Host


def host_for(sshd, **extra) -> Host:
    return Host(
        name="test-host",
        vars={
            "ansible_host": "127.0.0.1",
            "ansible_port": sshd.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(sshd.client_key),
            **extra,
        },
    )


@pytest.fixture
def known_hosts(tmp_path):
    return tmp_path / "known_hosts"


@pytest.fixture
def remote(sshd, known_hosts):
    r = connect(host_for(sshd), config={"known_hosts": str(known_hosts)}, accept_new_host_keys=True)
    yield r
    r.close()


def test_unknown_host_key_is_refused_with_fingerprint(sshd, known_hosts):
    with pytest.raises(HostKeyError, match=r"unknown host key ssh-ed25519 SHA256:\S+; verify it, then rerun with --accept-new-host-keys"):
        connect(host_for(sshd), config={"known_hosts": str(known_hosts)})
    assert not known_hosts.exists()


def test_accept_new_records_the_key_then_strict_check_passes(sshd, known_hosts):
    connect(host_for(sshd), config={"known_hosts": str(known_hosts)}, accept_new_host_keys=True).close()
    line = known_hosts.read_text()
    assert line.startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    assert stat.S_IMODE(os.stat(known_hosts).st_mode) == 0o600
    with connect(host_for(sshd), config={"known_hosts": str(known_hosts)}) as r:
        assert r.run(["echo", "ok"]).stdout == "ok\n"


def test_changed_host_key_is_refused_even_with_accept_new(sshd, tmp_path):
    kh = tmp_path / "kh"
    # record a different key for this address, as if the host had been reinstalled since
    other = tmp_path / "other"
    os.system(f"ssh-keygen -q -t ed25519 -N '' -f {other}")  # noqa: S605 (fixed test command)
    kh.write_text(f"[127.0.0.1]:{sshd.port} " + " ".join(other.with_suffix(".pub").read_text().split()[:2]) + "\n")
    with pytest.raises(HostKeyError, match=r"HOST KEY CHANGED: got SHA256:\S+, expected SHA256:\S+; .*ssh-keygen -R"):
        connect(host_for(sshd), config={"known_hosts": str(kh)}, accept_new_host_keys=True)


def _host_line(sshd, name: str) -> str:
    return f"{name} " + " ".join(sshd.host_pub.read_text().split()[:2]) + "\n"


def test_a_large_known_hosts_file_finds_the_hosts_key_among_many(sshd, tmp_path):
    import paramiko

    kh = tmp_path / "kh"
    other = paramiko.Ed25519Key.from_private_key_file(str(sshd.client_key))  # any other ed25519 key
    filler = "".join(f"[127.0.0.1]:{20000 + i} ssh-ed25519 {other.get_base64()}\n" for i in range(1500))
    kh.write_text(filler + _host_line(sshd, f"[127.0.0.1]:{sshd.port}"))
    for _ in range(2):  # the second connection reads the parsed file from memory: same answer
        with connect(host_for(sshd), config={"known_hosts": str(kh)}) as r:
            assert r.run(["echo", "ok"]).stdout == "ok\n"


def test_a_hashed_known_hosts_entry_is_honoured(sshd, tmp_path):
    import paramiko

    kh = tmp_path / "kh"
    name = f"[127.0.0.1]:{sshd.port}"
    kh.write_text(_host_line(sshd, paramiko.HostKeys.hash_host(name)))
    with connect(host_for(sshd), config={"known_hosts": str(kh)}) as r:
        assert r.run(["true"]).rc == 0


def test_a_rewritten_known_hosts_file_is_read_again(sshd, tmp_path):
    kh = tmp_path / "kh"
    kh.write_text(_host_line(sshd, f"[127.0.0.1]:{sshd.port}"))
    connect(host_for(sshd), config={"known_hosts": str(kh)}).close()
    other = tmp_path / "other"
    os.system(f"ssh-keygen -q -t ed25519 -N '' -f {other}")  # noqa: S605 (fixed test command)
    kh.write_text(f"[127.0.0.1]:{sshd.port} " + " ".join(other.with_suffix(".pub").read_text().split()[:2]) + "\n")
    with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
        connect(host_for(sshd), config={"known_hosts": str(kh)})


def test_run_returns_exit_code_and_both_streams(remote):
    res = remote.run("echo out; echo err >&2; exit 3")
    assert (res.rc, res.stdout, res.stderr) == (3, "out\n", "err\n")
    with pytest.raises(RemoteError, match=r"command failed \(exit 3\)"):
        remote.run("exit 3", check=True)


def test_argv_lists_are_quoted_not_interpreted(remote, tmp_path):
    marker = tmp_path / "pwned"
    hostile = f"$(touch {marker}); `touch {marker}` ; touch {marker}"
    res = remote.run(["printf", "%s", hostile])
    assert res.stdout == hostile
    assert not marker.exists()


def test_a_result_carries_the_command_that_produced_it(remote):
    res = remote.run("echo hi; exit 3")
    assert (res.rc, res.stdout, res.command) == (3, "hi\n", "echo hi; exit 3")
    assert remote.run(["printf", "%s", "a b"]).command == "printf %s 'a b'"


def test_a_connection_that_drops_mid_command_is_an_error_not_an_exit_status(remote):
    # the command kills the server's session process: no exit status ever comes
    with pytest.raises(RemoteError, match="the SSH connection dropped before the command ended"):
        remote.run("echo started; kill -9 $PPID; sleep 5")


def test_command_timeout_is_enforced(remote):
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match="timed out after 1s"):
        remote.run("sleep 30", timeout=1)
    assert time.monotonic() - t0 < 5


def test_round_trips_are_counted(remote):
    before = remote.round_trips
    remote.run("true")
    remote.run(["true"])
    assert remote.round_trips == before + 2


def test_forward_reaches_a_port_on_the_host(remote):
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve():
        conn, _ = srv.accept()
        conn.sendall(b"hello from the host")
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    with remote.forward(port) as local_port, socket.create_connection(("127.0.0.1", local_port), timeout=5) as c:
        assert c.recv(100) == b"hello from the host"
    srv.close()


def test_closing_a_forward_wakes_its_listener_without_reaching_the_host(remote):
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(1.0)
    with remote.forward(srv.getsockname()[1]) as local_port:
        pass
    with pytest.raises(TimeoutError):  # the wake-up connection is never forwarded to the host
        srv.accept()
    with pytest.raises(OSError):  # and the local port is closed
        socket.create_connection(("127.0.0.1", local_port), timeout=1)
    srv.close()


def test_unreachable_host_is_one_line_error(tmp_path):
    h = Host(name="down", vars={"ansible_host": "127.0.0.1", "ansible_port": 1})
    with pytest.raises(RemoteError, match=r"^host down: cannot connect to 127.0.0.1:1: connection refused: is sshd "):
        connect(h, config={"known_hosts": str(tmp_path / "kh"), "connect_timeout": 2})


def _banner_error(cause: BaseException) -> paramiko.SSHException:
    """What paramiko's transport raises when reading the server's banner fails with ``cause``."""
    try:
        try:
            raise cause
        except BaseException as e:
            raise paramiko.SSHException("Error reading SSH protocol banner" + str(e)) from None
    except paramiko.SSHException as wrapped:
        wrapped.__context__ = cause
        return wrapped


def _refused(*codes: int) -> OSError:
    return paramiko.ssh_exception.NoValidConnectionsError(
        {(f"10.0.0.{i}", 22): OSError(code, os.strerror(code)) for i, code in enumerate(codes)})


@pytest.mark.parametrize(
    ("exc", "banner", "says"),
    [
        # accepts TCP, never speaks: paramiko's banner timeout, or its negotiation wait ending first
        (_banner_error(TimeoutError()), "", "host h: cannot connect: no SSH banner from 10.0.0.1:22 within 3 s: "
                                            "is sshd listening there?"),
        (paramiko.SSHException("No existing session"), "", "no SSH banner from 10.0.0.1:22 within 3 s"),
        (paramiko.SSHException("Negotiation failed."), "", "no SSH banner from 10.0.0.1:22 within 3 s"),
        (_banner_error(EOFError()), "", "10.0.0.1:22 closed the connection before sending an SSH banner"),
        (paramiko.SSHException('Indecipherable protocol version "HTTP/1.1 400 Bad Request"'), "",
         "10.0.0.1:22 does not speak SSH (it sent 'HTTP/1.1 400 Bad Request')"),
        (paramiko.SSHException("No existing session"), "SSH-2.0-OpenSSH_9.6",
         "host h: cannot connect to 10.0.0.1:22: the SSH handshake did not finish within 3 s (the server said "
         "'SSH-2.0-OpenSSH_9.6')"),
        (paramiko.SSHException("Incompatible ssh peer (no acceptable kex algorithm)"), "SSH-2.0-old",
         "host h: cannot connect to 10.0.0.1:22: Incompatible ssh peer (no acceptable kex algorithm)"),
        (_refused(errno.ECONNREFUSED), None, "host h: cannot connect to 10.0.0.1:22: connection refused: is sshd "
                                             "running there, and is the port right (ansible_port)?"),
        (_refused(errno.ECONNREFUSED, errno.EHOSTUNREACH), None, "cannot connect to 10.0.0.1:22: 10.0.0.0: Connection refused; 10.0.0.1: No route to host"),
        (_refused(errno.EHOSTUNREACH), None, "cannot connect to 10.0.0.1:22: no route to the host"),
        (socket.gaierror(-2, "Name or service not known"), None,
         "cannot connect to 10.0.0.1:22: cannot resolve 10.0.0.1: Name or service not known; check ansible_host"),
        (TimeoutError("timed out"), None, "cannot connect to 10.0.0.1:22: no answer within 3 s: is the host up"),
        (OSError(errno.ENETDOWN, "Network is down"), None, "cannot connect to 10.0.0.1:22: [Errno 100] Network is down"),
    ],
)
def test_a_failed_connection_is_said_in_one_line_with_what_to_check(exc, banner, says):
    line = connect_failure("h", "10.0.0.1", 22, 3, exc, banner)
    assert says in line and "\n" not in line


def test_a_host_that_never_speaks_ssh_is_one_line_and_paramiko_prints_nothing(tmp_path, capfd):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    h = Host(name="mute", vars={"ansible_host": "127.0.0.1", "ansible_port": port})
    try:
        with pytest.raises(RemoteError) as err:
            connect(h, config={"known_hosts": str(tmp_path / "kh"), "connect_timeout": 1})
        for t in threading.enumerate():  # paramiko's transport thread logs its failure as it ends
            if isinstance(t, paramiko.Transport):
                t.join(10)
    finally:
        srv.close()
    assert str(err.value) == f"host mute: cannot connect: no SSH banner from 127.0.0.1:{port} within 1 s: " \
                             "is sshd listening there?"
    assert capfd.readouterr().err == ""


def test_missing_key_file_is_named(tmp_path):
    h = Host(name="h", vars={"ansible_ssh_private_key_file": "/nonexistent/key"})
    with pytest.raises(RemoteError, match="ansible_ssh_private_key_file /nonexistent/key does not exist"):
        connect(h, config={"known_hosts": str(tmp_path / "kh")})


@pytest.mark.parametrize(
    ("hostvars", "expected"),
    [
        ({}, ("h", None, None, False)),
        ({"ansible_host": "10.1.2.3", "ansible_port": "2222", "ansible_user": "deploy", "ansible_become": "yes"},
         ("10.1.2.3", 2222, "deploy", True)),
        ({"ansible_ssh_host": "a", "ansible_ssh_port": 22, "ansible_ssh_user": "u", "ansible_become": False},
         ("a", 22, "u", False)),
    ],
)
def test_target_from_inventory_vars(hostvars, expected):
    t = Target.from_host(Host(name="h", vars=hostvars))
    assert (t.address, t.port, t.user, t.become) == expected


def test_become_wraps_commands_in_sudo():
    t = Target.from_host(Host(name="h", vars={"ansible_user": "deploy", "ansible_become": True}))
    from llmfleet.host.ssh import Remote

    r = Remote(t, conn=None, command_timeout=1)  # type: ignore[arg-type]
    assert r._wrap(["echo", "a b"], sudo=False) == "sudo -n -u root -- sh -c 'echo '\"'\"'a b'\"'\"''"


def test_ssh_config_alias_supplies_address_port_user_and_key(sshd, tmp_path):
    """A host known only by an ~/.ssh/config alias: HostName, Port, User and IdentityFile come from it."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host gpu-alias-01\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n"
        f"  IdentityFile {sshd.client_key}\n"
    )
    kh = tmp_path / "kh"
    host = Host(name="gpu-alias-01", vars={})
    with connect(host, config={"known_hosts": str(kh), "config_file": str(cfg)}, accept_new_host_keys=True) as r:
        assert r.run(["whoami"]).stdout == "root\n"
    # the key is recorded under the real address and port, as OpenSSH records it
    assert kh.read_text().startswith(f"[127.0.0.1]:{sshd.port} ")


def test_inventory_vars_win_over_ssh_config(sshd, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host test-host\n  HostName 127.0.0.9\n  Port 1\n")  # refused if it were used
    with connect(host_for(sshd), config={"known_hosts": str(tmp_path / "kh"), "config_file": str(cfg)},
                 accept_new_host_keys=True) as r:
        assert r.run(["echo", "ok"]).stdout == "ok\n"
