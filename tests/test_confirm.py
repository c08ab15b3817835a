"""Commit confirmed and the host-side watchdog: the exact scripts, then real ``sh`` runs of them in a
scratch root with stand-ins for systemctl, systemd-run, docker, install and curl on PATH (each logs
its argv), so the host-side behaviour is tested without a host: the timer reverts an unconfirmed
switch, a confirmation wins over a later timer, the watchdog restarts after N failed probes and
stops at its hourly bound, and hostile values stay inert."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from llmfleet.health import watchdog
from llmfleet.inventory.services import host_settings
from llmfleet.knowledge import release_state
from llmfleet.release import confirm
from llmfleet.release import store as R

OLD = "20261128T120000Z-aaaaaaaaaa"
NEW = "20261129T120000Z-bbbbbbbbbb"
TOKEN = "0123456789abcdef0123456789abcdef"

FAKES = {
    # systemctl: log; `is-active` answers $FAKE_ACTIVE; `show` answers 0 (started at boot)
    "systemctl": 'echo "systemctl $*" >> "$FAKE_LOG"\n'
                 'case "$1" in is-active) echo "${FAKE_ACTIVE:-active}";; show) echo 0;; '
                 'restart) exit "${FAKE_RESTART_RC:-0}";; esac\nexit 0\n',
    "systemd-run": 'echo "systemd-run $*" >> "$FAKE_LOG"\nexit "${FAKE_RUN_RC:-0}"\n',
    "docker": 'echo "docker $*" >> "$FAKE_LOG"\n'
              'if [ -n "${FAKE_COMPOSE_BAD:-}" ]; then echo "services.engine.bogus_key: additional property not allowed"; '
              'exit 15; fi\nexit 0\n',
    "install": 'echo "install $*" >> "$FAKE_LOG"\nexit 0\n',
    "curl": 'echo "curl $*" >> "$FAKE_LOG"\nexit "${FAKE_CURL_RC:-0}"\n',
    "hostname": "echo lab-host-1\n",
}


@pytest.fixture
def host(tmp_path):
    """A scratch llmfleet root with two releases of service ``chat``, ``current`` on OLD."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        p = bin_dir / name
        p.write_text("#!/bin/sh\n" + body)
        p.chmod(0o755)
    root = tmp_path / "root"
    paths = R.Paths(str(root), "chat")
    for rid in (OLD, NEW):
        d = Path(paths.release(rid))
        d.mkdir(parents=True)
        (d / "compose.yml").write_text("services: {}\n")
        (d / "llmfleet-chat.service").write_text("[Service]\n")
    os.symlink(f"releases/{OLD}", paths.current)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=str(tmp_path / "calls.log"))
    return paths, env, tmp_path


def sh(script: str, env: dict, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, env=env | extra)


def calls(tmp: Path) -> list[str]:
    p = tmp / "calls.log"
    return p.read_text().splitlines() if p.exists() else []


def current(paths: R.Paths) -> str:
    return os.readlink(paths.current)


def audit_lines(paths: R.Paths) -> list[dict]:
    p = Path(R.audit_path(paths.root))
    return [json.loads(ln) for ln in p.read_text().splitlines()] if p.exists() else []


def arm(paths, env, previous=OLD, timeout=90, **extra):
    script = confirm.arm_script(paths, release_id=NEW, previous=previous, token=TOKEN, action="deploy",
                                timeout=timeout)
    return sh(script, env, **extra)


# ---------------------------------------------------------------------------------------------
# exact text


def test_confirm_script_golden():
    assert confirm.confirm_script(R.Paths("/opt/llmfleet", "chat"), token="0123abcd", watchdog_on=False) == (
        "cd /opt/llmfleet/services/chat || exit 1\n"
        "if [ \"$(cat .confirm-pending 2>/dev/null)\" = 0123abcd ] && mv .confirm-pending .confirm-taken.ok "
        "2>/dev/null; then\n"
        "  systemctl stop llmfleet-chat-revert.timer >/dev/null 2>&1 || true\n"
        "  rm -f .confirm-taken.ok .revert.sh\n"
        "  echo '@@confirmed'\n"
        "else\n"
        "  echo '@@too-late'\n"
        "fi"
    )


def test_compose_check_golden():
    assert confirm.compose_check_script(R.Paths("/opt/llmfleet", "chat"), NEW) == (
        f"cd /opt/llmfleet/services/chat/releases/{NEW} || exit 5\n"
        "set -- -f compose.yml\n"
        "[ -f compose.override.yml ] && set -- \"$@\" -f compose.override.yml\n"
        "if ! out=$(docker compose -p llmfleet-chat \"$@\" config -q 2>&1); then\n"
        "  printf '@@compose-invalid %s\\n' \"$(printf '%s' \"$out\" | tr '\\n' ' ' | head -c 600)\"\n"
        "  exit 5\n"
        "fi\n"
        "echo '@@compose-valid'"
    )


def test_arm_starts_a_transient_timer_with_the_timeout():
    script = confirm.arm_script(R.Paths("/opt/llmfleet", "chat"), release_id=NEW, previous=OLD, token=TOKEN,
                                action="deploy", timeout=321)
    assert ("systemd-run --unit=llmfleet-chat-revert --on-active=321 --timer-property=AccuracySec=1s "
            "--description='llmfleet revert of chat unless confirmed' /bin/sh /opt/llmfleet/services/chat/.revert.sh"
            ) in script
    assert script.index("config -q") < script.index("systemd-run")


@pytest.mark.parametrize("bad", ["", "ABC", "12; rm -rf /", "g" * 8, "a" * 65])
def test_tokens_are_hex_only(bad):
    with pytest.raises(ValueError):
        confirm.confirm_script(R.Paths("/r", "chat"), token=bad)


def test_timeout_defaults_to_the_health_budget_and_the_host_setting_wins():
    hs = host_settings("h", {"llmfleet_services": [{"name": "a", "engine": "vllm", "model": "m", "model_path": "/m",
                                                    "image": "i:1", "health": {"load_timeout_s": 600,
                                                                                "stage_timeout_s": 30}}]})
    assert confirm.timeout_s(hs.services[0], hs) == 600 + 4 * 30 + 120
    hs2 = host_settings("h", {"llmfleet_services": [{"name": "a", "engine": "vllm", "model": "m", "model_path": "/m",
                                                     "image": "i:1"}], "llmfleet_confirm_timeout_s": 45})
    assert confirm.timeout_s(hs2.services[0], hs2) == 45


@pytest.mark.parametrize(("rc", "out", "armed", "says"), [
    (0, "@@compose-valid\n@@armed 90\n", True, ""),
    (5, "@@compose-invalid services.engine.x: additional property\n", False, "docker compose config rejected"),
    (5, "@@compose-valid\n@@arm-failed systemd-run: Failed to connect to bus\n", False, "Failed to connect to bus"),
    (255, "", False, "exit status 255"),
])
def test_parse_arm(rc, out, armed, says):
    got = confirm.parse_arm(rc, out)
    assert got.armed is armed and says in got.reason


# ---------------------------------------------------------------------------------------------
# real sh runs


def test_unconfirmed_switch_is_reverted_by_the_host_timer(host):
    paths, env, tmp = host
    res = arm(paths, env)
    assert res.returncode == 0 and "@@armed 90" in res.stdout, res.stdout + res.stderr
    sdir = Path(paths.service_dir)
    assert (sdir / ".confirm-pending").read_text() == TOKEN
    assert (sdir / ".revert.sh").stat().st_mode & 0o077 == 0
    assert any(c.startswith("docker compose -p llmfleet-chat -f compose.yml config -q") for c in calls(tmp))
    # the deploy switches, then the controller vanishes: the timer runs the script
    sh(R.switch_script(paths, NEW), env)
    assert current(paths) == f"releases/{NEW}"
    out = sh(f"sh {sdir / '.revert.sh'}", env)
    assert out.returncode == 0, out.stderr
    assert current(paths) == f"releases/{OLD}"
    assert "systemctl restart llmfleet-chat.service" in calls(tmp)
    (rec,) = audit_lines(paths)
    assert rec["result"] == "reverted" and rec["release"] == OLD and rec["who"] == "host timer"
    assert rec["detail"].startswith(f"reverted by host timer: release {NEW} was not confirmed within 90 s")
    # a confirmation arriving now is told it is too late
    late = sh(confirm.confirm_script(paths, token=TOKEN), env)
    assert "@@too-late" in late.stdout and confirm.parse_confirm(late.stdout) is False


def test_a_timer_armed_but_never_switched_leaves_the_serving_release_running(host):
    """The controller vanished between arming and switching: nothing to undo, no restart (no outage)."""
    paths, env, tmp = host
    arm(paths, env)
    out = sh(f"sh {Path(paths.service_dir) / '.revert.sh'}", env)
    assert out.returncode == 0, out.stderr
    assert current(paths) == f"releases/{OLD}"
    assert not any("restart llmfleet-chat.service" in c or "stop llmfleet-chat.service" in c for c in calls(tmp))
    (rec,) = audit_lines(paths)
    assert rec["result"] == "unchanged" and rec["release"] == OLD and rec["who"] == "host timer"
    assert "was never made current; nothing to undo" in rec["detail"]
    assert not (Path(paths.service_dir) / ".confirm-pending").exists()


def test_an_unswitched_head_of_a_split_service_is_restarted_by_its_timer(host):
    """The head of a service over several hosts: its workers' timers put them back first; the head,
    never switched, restarts its serving release so that it attaches to them again."""
    paths, env, tmp = host
    sh(confirm.arm_script(paths, release_id=NEW, previous=OLD, token=TOKEN, action="deploy", timeout=90,
                          restart_unswitched=True), env)
    out = sh(f"sh {Path(paths.service_dir) / '.revert.sh'}", env)
    assert out.returncode == 0, out.stderr
    assert current(paths) == f"releases/{OLD}"
    assert "systemctl restart llmfleet-chat.service" in calls(tmp)
    (rec,) = audit_lines(paths)
    assert rec["result"] == "unchanged" and rec["release"] == OLD
    assert "restarted to attach to its workers again" in rec["detail"]


def test_an_unswitched_head_whose_restart_fails_says_so(host):
    paths, env, tmp = host
    sh(confirm.arm_script(paths, release_id=NEW, previous=OLD, token=TOKEN, action="deploy", timeout=90,
                          restart_unswitched=True), env)
    sh(f"sh {Path(paths.service_dir) / '.revert.sh'}", env, FAKE_RESTART_RC="1")
    (rec,) = audit_lines(paths)
    assert rec["result"] == "failed" and "could not be restarted" in rec["detail"]


def test_cluster_timeouts_let_every_worker_timer_fire_before_the_head_timer():
    svc = host_settings("h", {"llmfleet_services": [{
        "name": "big", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf", "image": "i:1",
        "health": {"load_timeout_s": 100, "stage_timeout_s": 10}}]}).services[0]
    slow = host_settings("w2", {"llmfleet_confirm_timeout_s": 900})
    plain = host_settings("w1", {})
    got = confirm.cluster_timeouts(svc, "head", {"head": plain, "w1": plain, "w2": slow})
    # the largest host budget (900) plus one health stage per worker (2 x 10); the head 60 s later
    assert got == {"w1": 920, "w2": 920, "head": 980}


def test_confirmation_wins_and_a_late_timer_does_nothing(host):
    paths, env, tmp = host
    arm(paths, env)
    sh(R.switch_script(paths, NEW), env)
    ok = sh(confirm.confirm_script(paths, token=TOKEN), env)
    assert confirm.parse_confirm(ok.stdout), ok.stdout + ok.stderr
    assert "systemctl stop llmfleet-chat-revert.timer" in calls(tmp)
    assert not (Path(paths.service_dir) / ".confirm-pending").exists()
    # the revert script is gone; even an old copy run now changes nothing (the token was taken)
    script = confirm.revert_script(paths, release_id=NEW, previous=OLD, token=TOKEN, action="deploy", timeout=90)
    sh(script, env)
    assert current(paths) == f"releases/{NEW}"
    assert audit_lines(paths) == []


def test_first_deploy_revert_stops_the_unit_and_forgets_current(host):
    paths, env, tmp = host
    os.unlink(paths.current)
    arm(paths, env, previous=None)
    sh(R.switch_script(paths, NEW), env)
    sh(f"sh {Path(paths.service_dir) / '.revert.sh'}", env)
    assert not os.path.lexists(paths.current)
    assert "systemctl stop llmfleet-chat.service" in calls(tmp)
    assert "no release confirmed healthy to go back to, service stopped" in audit_lines(paths)[0]["detail"]


def test_an_invalid_compose_file_arms_nothing(host):
    paths, env, tmp = host
    res = arm(paths, env, FAKE_COMPOSE_BAD="1")
    assert res.returncode == confirm.ARM_FAILED_RC
    got = confirm.parse_arm(res.returncode, res.stdout)
    assert not got.armed and "additional property not allowed" in got.reason
    assert not (Path(paths.service_dir) / ".confirm-pending").exists()
    assert not any(c.startswith("systemd-run") for c in calls(tmp))


def test_a_timer_that_cannot_start_leaves_no_pending_token(host):
    paths, env, tmp = host
    res = arm(paths, env, FAKE_RUN_RC="1")
    assert res.returncode == confirm.ARM_FAILED_RC and "@@arm-failed" in res.stdout
    assert not (Path(paths.service_dir) / ".confirm-pending").exists()


def test_hostile_root_and_action_stay_literal(tmp_path):
    """Values the schema would refuse still cannot run anything (every one is one quoted word)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=str(tmp_path / "calls.log"))
    pwned = tmp_path / "pwned"
    root = tmp_path / f"r $(touch {pwned}) `touch {pwned}` ';touch {pwned};'"
    paths = R.Paths(str(root), "chat")
    for rid in (OLD, NEW):
        Path(paths.release(rid)).mkdir(parents=True)
        (Path(paths.release(rid)) / "compose.yml").write_text("x")
    os.symlink(f"releases/{OLD}", paths.current)
    script = confirm.arm_script(paths, release_id=NEW, previous=OLD, token=TOKEN,
                                action=f"deploy\"; touch {pwned}; echo \"", timeout=5)
    res = sh(script, env)
    assert "@@armed" in res.stdout, res.stdout + res.stderr
    sh(f"sh {sh_quote(paths.service_dir + '/.revert.sh')}", env)
    assert not pwned.exists()
    assert current(paths) == f"releases/{OLD}"
    assert not list(tmp_path.glob("pwned*"))


def sh_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


# ---------------------------------------------------------------------------------------------
# watchdog


def _wd(tmp_path, **wd):
    root = tmp_path / "root"
    hs = host_settings("h", {
        "llmfleet_root": str(root),
        # /health alone here (the judgement by work done: tests/test_watchdog_script.py)
        "llmfleet_watchdog": {"failures": 2, "max_restarts_per_hour": 2, "progress": False, **wd},
        "llmfleet_services": [{"name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf",
                               "image": "i:1", "port": 8123, "bind_address": "127.0.0.1",
                               "health": {"load_timeout_s": 10}}],
    })
    svc = hs.services[0]
    files = watchdog.release_files(svc, hs)
    rel = root / "services" / "chat" / "releases" / NEW
    rel.mkdir(parents=True)
    for name, (text, mode) in files.items():
        (rel / name).write_text(text)
        (rel / name).chmod(mode)
    os.symlink(f"releases/{NEW}", root / "services" / "chat" / "current")
    return root, root / "services" / "chat"


def test_watchdog_restarts_after_n_failures_then_gives_up_at_its_bound(tmp_path):
    root, sdir = _wd(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=str(tmp_path / "calls.log"))
    run = lambda **e: sh(f"sh {sdir}/current/watchdog.sh", env, **e)  # noqa: E731
    run()  # healthy
    assert "curl -fsS -o /dev/null --max-time 10 http://127.0.0.1:8123/health" in calls(tmp_path)
    restarts = lambda: [c for c in calls(tmp_path) if c == "systemctl restart llmfleet-chat.service"]  # noqa: E731
    run(FAKE_CURL_RC="7")
    assert restarts() == []  # one failure is not enough
    run(FAKE_CURL_RC="7")
    assert len(restarts()) == 1
    for _ in range(6):
        run(FAKE_CURL_RC="7")
    assert len(restarts()) == 2  # the hourly bound
    audit = [json.loads(ln) for ln in (root / "audit.jsonl").read_text().splitlines()]
    assert [a["result"] for a in audit] == ["restarted", "restarted", "gave-up"]  # gave up once, not each run
    assert all(a["action"] == "watchdog-restart" and a["release"] == NEW for a in audit)
    # status reads it back
    out = sh(watchdog.status_script(str(root)), env)
    sup = watchdog.parse_status(out.stdout)["chat"]
    assert sup.watchdog_restarts == 2 and sup.last["result"] == "gave-up"


@pytest.mark.parametrize(("setup", "extra"), [
    ("touch {sdir}/.confirm-pending", {}),        # a switch awaits its confirmation
    ("true", {"FAKE_ACTIVE": "failed"}),          # the unit gave up (start limit): not the watchdog's
])
def test_watchdog_stands_aside(tmp_path, setup, extra):
    root, sdir = _wd(tmp_path, failures=1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=str(tmp_path / "calls.log"))
    sh(setup.format(root=root, sdir=sdir), env)
    for _ in range(3):
        sh(f"sh {sdir}/current/watchdog.sh", env, FAKE_CURL_RC="7", **extra)
    assert not any("restart llmfleet-chat.service" in c for c in calls(tmp_path))


def test_watchdog_records_a_unit_failed_by_its_start_limit_once(tmp_path):
    root, sdir = _wd(tmp_path, failures=1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=str(tmp_path / "calls.log"))
    for _ in range(3):
        sh(f"sh {sdir}/current/watchdog.sh", env, FAKE_CURL_RC="7", FAKE_ACTIVE="failed")
    audit = [json.loads(ln) for ln in (root / "audit.jsonl").read_text().splitlines()]
    assert [(a["action"], a["result"], a["who"]) for a in audit] == [("unit-failed", "start-limit", "watchdog")]
    assert "systemd start limit" in audit[0]["detail"]
    sup = watchdog.parse_status(sh(watchdog.status_script(str(root)), env).stdout)["chat"]
    assert sup.last["result"] == "start-limit"
    # active again (a deploy restarted it): the next failure is recorded again
    sh(f"sh {sdir}/current/watchdog.sh", env)
    sh(f"sh {sdir}/current/watchdog.sh", env, FAKE_ACTIVE="failed")
    assert len((root / "audit.jsonl").read_text().splitlines()) == 2


def test_watchdog_units_golden_bits():
    hs = host_settings("h", {"llmfleet_watchdog": {"interval_s": 20},
                             "llmfleet_services": [{"name": "chat", "engine": "vllm", "model": "m",
                                                    "model_path": "/m", "image": "i:1"}]})
    files = watchdog.release_files(hs.services[0], hs)
    assert set(files) == {"watchdog.sh", "llmfleet-chat-watchdog.service", "llmfleet-chat-watchdog.timer"}
    assert "OnUnitActiveSec=20\n" in files["llmfleet-chat-watchdog.timer"][0]
    assert "ExecStart=/bin/sh /opt/llmfleet/services/chat/current/watchdog.sh\n" in files[
        "llmfleet-chat-watchdog.service"][0]
    # a wildcard bind is probed on loopback
    assert "URL=http://127.0.0.1:8000/health\n" in files["watchdog.sh"][0]
    off = host_settings("h", {"llmfleet_watchdog": {"enabled": False},
                              "llmfleet_services": [{"name": "chat", "engine": "vllm", "model": "m",
                                                     "model_path": "/m", "image": "i:1"}]})
    assert watchdog.release_files(off.services[0], off) == {}


def test_parse_status_tolerates_garbage():
    out = ("@@watchdog chat 2 1 active {\"result\":\"restarted\",\"time\":\"t\"}\n"
           "@@watchdog other x y inactive not-json\nnoise\n@@watchdog short\n")
    got = watchdog.parse_status(out)
    assert got["chat"].watchdog_restarts == 2 and got["chat"].last_action == "restarted at t"
    assert got["other"].watchdog_restarts == 0 and got["other"].last is None
    assert "short" not in got


def test_status_rows_carry_restarts_and_the_last_watchdog_action():
    from llmfleet.fleet import status as S

    probe = ("@@service chat\n@@current releases/" + NEW + "\n@@unit active\n@@release " + NEW + "\n@@end\n"
             "@@gpu\nTesla T4\n"
             '@@watchdog chat 1 2 active {"result":"restarted","time":"2026-12-01T05:00:00+00:00"}\n')
    assert "@@watchdog" in S.status_script("/opt/llmfleet")
    st = S.HostStatus(host="h", reachable=True, gpus=S.parse_card_names(probe), states=release_state.parse_state(probe),
                      supervision=watchdog.parse_status(probe))
    (row,) = S.host_rows(st, None)
    assert st.gpus == ["Tesla T4"]
    assert row.supervision["watchdog_restarts"] == 1 and row.supervision["unit_restarts"] == 2
    assert "restarts since deploy: 3 (watchdog 1)" in row.note
    assert "last watchdog action: restarted at 2026-12-01T05:00:00+00:00" in row.note


def test_watchdog_does_not_wait_for_a_stale_deploy_lock(tmp_path):
    """A lock left by a killed controller must not switch supervision off."""
    root, sdir = _wd(tmp_path, failures=1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=str(tmp_path / "calls.log"))
    (root / "locks" / "deploy").mkdir(parents=True)
    sh(f"sh {sdir}/current/watchdog.sh", env, FAKE_CURL_RC="7")
    assert "systemctl restart llmfleet-chat.service" in calls(tmp_path)


def _worker_wd(tmp_path, port: int):
    root = tmp_path / "root"
    hs = host_settings("w", {"llmfleet_root": str(root), "llmfleet_watchdog": {"failures": 2, "max_restarts_per_hour": 2},
                             "llmfleet_services": []})
    svc = host_settings("h", {"llmfleet_services": [{
        "name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf", "image": "i:1",
        "health": {"load_timeout_s": 10}}]}).services[0]
    files = watchdog.worker_release_files(svc, hs, kind="rpc", address="127.0.0.1", port=port)
    rel = root / "services" / "chat" / "releases" / NEW
    rel.mkdir(parents=True)
    for name, (text, mode) in files.items():
        (rel / name).write_text(text)
        (rel / name).chmod(mode)
    os.symlink(f"releases/{NEW}", root / "services" / "chat" / "current")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = FAKES | {"docker": 'echo "docker $*" >> "$FAKE_LOG"\necho "${FAKE_RUNNING:-true}"\n'}
    for name, body in fakes.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=str(tmp_path / "calls.log"))
    return root, env


def test_a_worker_watchdog_restarts_when_its_rpc_port_stops_listening_or_its_container_stops(tmp_path):
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    head = socket.create_connection(("127.0.0.1", port))  # the head attached: rpc-server accepts no other client
    root, env = _worker_wd(tmp_path, port)
    run = lambda **e: sh(f"sh {root}/services/chat/current/watchdog.sh", env, **e)  # noqa: E731
    restarts = lambda: [c for c in calls(tmp_path) if c == "systemctl restart llmfleet-chat.service"]  # noqa: E731
    for _ in range(6):
        run()  # container running, port listening: healthy, and no probe queued a connection behind the head's
    assert restarts() == [] and not (root / "audit.jsonl").exists()
    srv.settimeout(0.2)
    srv.accept()[0].close()  # the head's
    with pytest.raises(TimeoutError):
        srv.accept()
    run(FAKE_RUNNING="false")
    run(FAKE_RUNNING="false")
    assert len(restarts()) == 1  # the container stopped: two failed probes restart the unit
    head.close()
    srv.close()
    run()
    run()
    assert len(restarts()) == 2  # nothing listens on the rpc-server's port any more
    audit = [json.loads(ln) for ln in (root / "audit.jsonl").read_text().splitlines()]
    assert [a["result"] for a in audit] == ["restarted", "restarted"]
    assert f"rpc-server 127.0.0.1:{port}" in audit[-1]["detail"]
