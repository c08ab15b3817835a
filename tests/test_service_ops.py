"""Day-2 operations without a lab: the stop/start/remove/logs scripts run by sh against stand-in
systemctl, journalctl and docker commands (each logs its argv), orphans, the many-hosts runner, the
-v tracer's masking. End-to-end runs on the lab: tests/lab/test_service_ops.py."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from llmfleet.errors import UsageError
from llmfleet.host import trace
from llmfleet.knowledge import release_state
from llmfleet.release import service_ops
from llmfleet.release import store as R

RID = "20261129T120000Z-0123456789"
OLD = "20261128T120000Z-abcdefabcd"
REF = "reg.lab/llamacpp@sha256:" + "ab" * 32


def fake_bin(tmp: Path, unit_state: str = "inactive", journal: str = "") -> tuple[Path, Path]:
    """systemctl / journalctl / docker stand-ins that append their argv to calls.log."""
    bin_ = tmp / "bin"
    bin_.mkdir(parents=True)
    log = tmp / "calls.log"
    for name, body in {
        "systemctl": f'[ "$1" = is-active ] && {{ echo {unit_state}; exit 0; }}; exit 0',
        "journalctl": f"printf '%b' {json.dumps(journal)}",
        "docker": '[ "$1" = ps ] && exit 0; [ "$1" = logs ] && { echo container-line-1; echo container-line-2; }; exit 0',
    }.items():
        p = bin_ / name
        p.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n{body}\n')
        p.chmod(0o755)
    return bin_, log


def sh(script: str, bin_: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": f"{bin_}:/usr/bin:/bin"})


def service_tree(root: Path, name: str = "chat") -> R.Paths:
    paths = R.Paths(str(root), name)
    for rid in (OLD, RID):
        d = Path(paths.release(rid))
        d.mkdir(parents=True)
        (d / "compose.yml").write_text("services: {}\n")
        (d / f"llmfleet-{name}.service").write_text("[Unit]\n")
    os.symlink(f"releases/{RID}", paths.current)
    return paths


def test_remove_takes_unit_containers_releases_and_the_images_it_alone_used(tmp_path):
    bin_, log = fake_bin(tmp_path)
    paths = service_tree(tmp_path / "root")
    res = sh(R.service_remove_script(paths, [REF]), bin_)
    assert res.returncode == 0, res.stderr
    assert "@@removed" in res.stdout and R.parse_removed_images(res.stdout) == [REF]
    assert not Path(paths.service_dir).exists()
    calls = log.read_text().splitlines()
    assert "systemctl stop llmfleet-chat.service" in calls and "systemctl disable llmfleet-chat.service" in calls
    assert "docker compose -p llmfleet-chat -f compose.yml down --remove-orphans --timeout 30" in calls
    assert "docker ps -aq --filter label=io.llmfleet.service=chat" in calls
    # the unit's stop keeps the compose project's network; removing the service removes it too
    assert "docker network rm llmfleet-chat_default" in calls
    assert f"docker image rm {REF}" in calls
    assert calls.index("systemctl stop llmfleet-chat.service") < calls.index(f"docker image rm {REF}")


def test_remove_of_a_hostile_name_stays_inside_its_folder(tmp_path):
    bin_, _log = fake_bin(tmp_path)
    keep = tmp_path / "root" / "services" / "keep"
    keep.mkdir(parents=True)
    with pytest.raises(UsageError):
        service_ops.check_service_name("../keep")
    with pytest.raises(UsageError):
        service_ops.check_service_name("x; rm -rf /")
    paths = R.Paths(str(tmp_path / "root"), "a b'c")  # quoted everywhere even if it got this far
    res = sh(R.service_remove_script(paths, []), bin_)
    assert res.returncode == 0 and keep.exists()


@pytest.mark.parametrize(("state", "expect"), [("inactive", "inactive"), ("failed", "failed")])
def test_stop_reports_the_unit_state_after(tmp_path, state, expect):
    bin_, log = fake_bin(tmp_path, unit_state=state)
    paths = service_tree(tmp_path / "root")
    res = sh(R.service_stop_script(paths), bin_)
    assert "@@stopped" in res.stdout and R.parse_unit_state(res.stdout) == expect
    assert Path(paths.current).exists()  # the releases stay; `start` or a deploy brings it back
    assert "systemctl disable llmfleet-chat.service" in log.read_text()


def test_start_needs_a_current_release(tmp_path):
    bin_, log = fake_bin(tmp_path, unit_state="active")
    paths = R.Paths(str(tmp_path / "root"), "chat")
    res = sh(R.service_start_script(paths), bin_)
    assert "@@nocurrent" in res.stdout and "@@started" not in res.stdout
    assert not log.exists()  # nothing was started
    paths = service_tree(tmp_path / "root2")
    res = sh(R.service_start_script(paths), bin_)
    assert "@@started" in res.stdout and R.parse_unit_state(res.stdout) == "active"
    calls = log.read_text().splitlines()
    assert calls.index("systemctl enable llmfleet-chat.service") < calls.index("systemctl start llmfleet-chat.service")


def test_logs_read_the_journal_else_the_container(tmp_path):
    paths = R.Paths("/opt/llmfleet", "chat")
    bin_, log = fake_bin(tmp_path, journal="journal-line\n")
    res = sh(R.service_logs_script(paths, 20), bin_)
    assert res.stdout.strip() == "journal-line"
    assert "journalctl -u llmfleet-chat.service -n 20 --no-pager -o cat" in log.read_text()
    bin2, _ = fake_bin(tmp_path / "b", journal="")
    res = sh(R.service_logs_script(paths, 20), bin2)
    assert res.stdout.split() == ["container-line-1", "container-line-2"]
    res = sh(R.service_logs_script(paths, 5, follow=True, seconds=2), bin2)  # docker logs -f fallback
    assert "container-line-1" in res.stdout
    assert "docker logs -f --tail 5 llmfleet-chat" in (tmp_path / "b" / "calls.log").read_text()
    with pytest.raises(ValueError):
        R.service_logs_script(paths, 0)
    assert "timeout 7 journalctl" in R.service_logs_script(paths, 5, follow=True, seconds=7)


def test_orphans_are_host_services_the_inventory_no_longer_lists():
    states = {n: release_state.ServiceState(name=n) for n in ("chat", "old-chat", "embed")}
    assert service_ops.orphans(states, ["chat", "embed"]) == ["old-chat"]
    assert service_ops.orphans(states, ["chat", "embed", "old-chat"]) == []
    assert service_ops.orphans({}, ["chat"]) == []


def test_run_hosts_runs_forks_hosts_at_once_in_order():
    barrier = threading.Barrier(3, timeout=10)  # passes only if three run at the same time

    def one(i):
        barrier.wait()
        return i * 10

    assert service_ops.run_hosts(one, [1, 2, 3], forks=3) == [10, 20, 30]
    seen = []
    assert service_ops.run_hosts(lambda i: seen.append(threading.current_thread().name) or i, [1, 2], forks=1) == [1, 2]
    assert set(seen) == {threading.main_thread().name}  # one fork: in this thread (Ctrl-C reaches it)


def test_an_unreachable_host_is_a_result_not_an_exception(tmp_path):
    from llmfleet.inventory.ansible import load_inventory, settings_for

    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    h1:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n")
    inv = load_inventory(str(tmp_path / "hosts.yml"))
    h = inv.hosts["h1"]
    r = service_ops.service_op(h, settings_for(h), "stop", ["chat"], config={"connect_timeout": 2,
                               "known_hosts": str(tmp_path / "kh")})
    assert (r.result, r.unreachable) == ("failed", True) and "cannot connect" in r.reason


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("printf '%s' '{\"token\":\"abc123\",\"who\":\"me\"}'", "printf '%s' '{\"token\":\"********\",\"who\":\"me\"}'"),
        ("export LLAMA_API_KEY=sk-live-1 && run", "export LLAMA_API_KEY=******** && run"),
        ("curl -H 'Authorization: Bearer sk-abc.def'", "curl -H 'Authorization: Bearer ********'"),
        ("password: hunter2", "password: ********"),
        ("systemctl restart llmfleet-chat.service", "systemctl restart llmfleet-chat.service"),
    ],
)
def test_trace_masks_what_looks_like_a_secret(text, masked):
    assert trace.mask(text) == masked


def test_trace_reaches_the_sink_only_while_tracing():
    got = []
    trace.emit("h", "echo x", 0, 0.1)
    with trace.tracing(got.append):
        assert trace.active()
        trace.emit("h", "VLLM_API_KEY=abc echo", 0, 0.25)
    trace.emit("h", "later", 0, 0.1)
    assert [(e.host, e.command, e.rc) for e in got] == [("h", "VLLM_API_KEY=******** echo", 0)]
    assert not trace.active()


def test_stop_over_ssh_is_locked_audited_and_traced(sshd, tmp_path):
    """Against a real sshd on loopback (the stop script's systemctl finds no such unit here: it stays
    inactive): the lock is taken and given back, the audit record lands on the host and locally, and -v's
    tracer sees every command with its exit status."""
    from llmfleet.inventory.ansible import load_inventory
    from tests.test_release_shell import make_inventory

    inv = load_inventory(str(make_inventory(tmp_path, sshd)))
    h = inv.hosts["h1"]
    settings = inv.settings_for(h)
    service_tree(Path(settings.root))
    conf = {"known_hosts": str(tmp_path / "kh"), "audit_log": str(tmp_path / "local.jsonl")}
    seen: list[trace.Traced] = []
    with trace.tracing(seen.append):
        r = service_ops.service_op(h, settings, "stop", ["chat"], config=conf, message="maintenance",
                                   who="ops@ws", accept_new_host_keys=True)
    assert (r.result, r.unreachable) == ("stopped", False), r.reason
    assert r.services["chat"] in ("inactive", "unknown")  # "unknown": no systemd where the tests run
    assert not Path(R.lock_dir(settings.root)).exists()  # the lock was given back
    remote = [json.loads(x) for x in Path(R.audit_path(settings.root)).read_text().splitlines()]
    local = [json.loads(x) for x in (tmp_path / "local.jsonl").read_text().splitlines()]
    assert remote[-1] == local[-1]
    assert (remote[-1]["action"], remote[-1]["service"], remote[-1]["result"], remote[-1]["who"],
            remote[-1]["release"]) == ("stop", "chat", "stopped", "ops@ws", RID)
    cmds = [e.command for e in seen]
    assert any("mkdir" in c and "locks/deploy" in c for c in cmds) and any("systemctl stop" in c for c in cmds)
    assert all(e.host == "h1" and e.rc is not None and e.seconds >= 0 for e in seen)
    assert not any('"token":"' in c and '"token":"********"' not in c for c in cmds)  # the lock token is masked
    # a service the host does not run: nothing to do, said so
    r = service_ops.service_op(h, settings, "stop", ["nope"], config=conf)
    assert r.result == "absent" and r.services == {"nope": "absent"}


# ---------------------------------------------------------------------------------------------
# stop / start / remove through the pipeline, against a scripted remote (tests/fake_remote.py): the
# deploy's lock (with the state read in its round trip), one script per service, the audit and unlock


def _op_run(commands, *, alive=True, health=None):
    from llmfleet.release import executor as E
    from llmfleet.settings import Settings
    from tests.deploy_fixtures import NOW
    from tests.fake_remote import FakeRemote
    from tests.test_deploy_executor import HS, ORIGIN, PID, TOKEN

    remote = FakeRemote(commands)
    lines: list[str] = []
    checked: list[str] = []

    def health_fn(run, target):
        checked.append(target.release_id)
        return health

    run = E.HostRun("h1", HS, remote, settings=Settings.of({"audit_log": "/dev/null"}), log=lines.append,
                    health_fn=health_fn, now=lambda: NOW, token=lambda: TOKEN, alive=lambda pid: alive,
                    origin=ORIGIN, pid=PID)
    return run, remote, lines, checked


def _lock_state(action: str, states_text: str, got: str = "@@acquired"):
    from tests.fake_remote import Command
    from tests.test_deploy_executor import acquire, chain

    return chain(acquire(got, exit=0 if got == "@@acquired" else R.LOCK_HELD_RC, action=action),
                 Command(R.state_script("/opt/llmfleet"), out=states_text))


def _states(current: str | None = RID) -> str:
    from tests.deploy_fixtures import svc_state
    from tests.test_deploy_executor import state_text

    return state_text(svc_state({RID: ("f" * 64, True)}, current))


def _audit(last: str) -> list[tuple[str, str, str]]:
    import shlex

    recs = [json.loads(shlex.split(ln)[2]) for ln in last.splitlines()
            if ln.startswith("printf '%s\\n' ") and "audit.jsonl" in ln]
    return [(r["action"], r["service"], r["result"]) for r in recs]


def _finish(run, remote) -> str:
    from tests.fake_remote import Command

    remote.expected.append(Command(None, out="@@released"))
    run.finish()
    remote.assert_done()
    return remote.sent[-1]


def test_stop_locks_reads_the_state_in_that_round_trip_stops_audits_and_unlocks():
    from tests.fake_remote import Command
    from tests.test_deploy_executor import PATHS, TOKEN

    run, remote, _lines, _ = _op_run([_lock_state("stop", _states()),
                                      Command(R.service_stop_script(PATHS), out="@@unit inactive\n@@stopped")])
    out = service_ops.ServiceOpResult("h1", "stop", service_ops.Result.FAILED)
    service_ops.run_service_op(run, "stop", ["chat"], out)
    assert (out.result, out.services) == ("stopped", {"chat": "inactive"})
    last = _finish(run, remote)
    assert _audit(last) == [("stop", "chat", "stopped")] and R.lock_release_script("/opt/llmfleet", TOKEN) in last
    assert remote.round_trips == 3  # lock + state, the stop, the audit and unlock


@pytest.mark.parametrize(("report_ok", "result"), [(True, "started"), (False, "failed")])
def test_start_health_checks_the_current_release(report_ok, result):
    from llmfleet.health.check import HealthReport, StageResult
    from tests.fake_remote import Command
    from tests.test_deploy_executor import PATHS

    report = HealthReport(report_ok, [StageResult("completion", report_ok, 0.1, "ok" if report_ok else "503")])
    run, remote, _lines, checked = _op_run(
        [_lock_state("start", _states()), Command(R.service_start_script(PATHS), out="@@unit active\n@@started")],
        health=report)
    out = service_ops.ServiceOpResult("h1", "start", service_ops.Result.FAILED)
    service_ops.run_service_op(run, "start", ["chat"], out)
    assert out.result == result and checked == [RID]
    assert ("not healthy" in out.reason) is (not report_ok)
    assert _audit(_finish(run, remote)) == [("start", "chat", result)]


def test_start_without_a_current_release_fails_and_says_deploy_it():
    from tests.fake_remote import Command
    from tests.test_deploy_executor import PATHS

    run, remote, _lines, checked = _op_run([_lock_state("start", _states(current=None)),
                                            Command(R.service_start_script(PATHS), out="@@nocurrent")])
    out = service_ops.ServiceOpResult("h1", "start", service_ops.Result.FAILED)
    service_ops.run_service_op(run, "start", ["chat"], out)
    assert out.result == "failed" and "deploy it" in out.reason and checked == []


def test_remove_removes_the_images_only_it_used_and_a_missing_service_is_absent():
    from tests.deploy_fixtures import svc_state
    from tests.fake_remote import Command
    from tests.test_deploy_executor import PATHS

    REF = svc_state({RID: ("f" * 64, True)}, RID).releases[RID].image_ref  # noqa: N806 - the release's image

    run, remote, _lines, _ = _op_run([_lock_state("remove", _states()),
                                      Command(R.service_remove_script(PATHS, [REF]),
                                              out=f"@@image-removed {REF}\n@@removed")])
    out = service_ops.ServiceOpResult("h1", "remove", service_ops.Result.FAILED)
    service_ops.run_service_op(run, "remove", ["chat", "ghost"], out)
    assert (out.result, out.services, out.images_removed) == ("removed", {"chat": "removed", "ghost": "absent"},
                                                              [REF])
    assert _audit(_finish(run, remote)) == [("remove", "chat", "removed")]


def test_a_service_op_takes_over_a_stale_lock_of_this_machine_and_refuses_anyone_elses():
    from llmfleet.release.decide import Refusal
    from tests.fake_remote import Command
    from tests.test_deploy_executor import PATHS, holder

    held = "@@held\n" + json.dumps({**holder("deploy"), "pid": 999})  # another process of this machine
    stale = [_lock_state("stop", "", got=held), Command(R.lock_break_script("/opt/llmfleet"), out="@@broken"),
             _lock_state("stop", _states()), Command(R.service_stop_script(PATHS), out="@@unit inactive\n@@stopped")]
    run, remote, lines, _ = _op_run(stale, alive=False)  # the holder's process is gone
    out = service_ops.ServiceOpResult("h1", "stop", service_ops.Result.FAILED)
    service_ops.run_service_op(run, "stop", ["chat"], out)
    assert out.result == "stopped" and any("taking over a stale lock" in ln for ln in lines)
    assert _audit(_finish(run, remote)) == [("lock-break", None, "stale"), ("stop", "chat", "stopped")]
    run, remote, _lines, _ = _op_run([_lock_state("stop", "", got=held)], alive=True)  # it still runs
    with pytest.raises(Refusal) as exc:
        service_ops.run_service_op(run, "stop", ["chat"], service_ops.ServiceOpResult("h1", "stop",
                                                                                      service_ops.Result.FAILED))
    assert exc.value.result == "refused" and "lock.release" in exc.value.reason
