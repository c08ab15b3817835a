"""The watchdog's judgement by work done, run for real in ``sh`` on this machine: the script a release
ships (``watchdog.script_text``) with stand-ins for curl (answers from files), systemctl and docker.

Each case sets what the engine answers (/health, /metrics, a 1-token completion) and how long its
counters have stood still, runs the script as the timer would, and checks the verdict it records for
``invoke status``, whether it restarted the unit and the evidence in the audit line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from llmfleet.health import watchdog
from llmfleet.inventory.services import host_settings

STUB_CURL = Path(__file__).parent / "data" / "watchdog" / "curl_stub.py"

VLLM_BUSY = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny chat"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny chat"} 1.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny chat"} %d
vllm:generation_tokens_created{engine="0",model_name="tiny chat"} 1.7e+09
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny chat"} 1.234e+03
"""
VLLM_IDLE = VLLM_BUSY.replace("} 2.0", "} 0.0").replace("} 1.0", "} 0.0")
LLAMA_BUSY = """# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 40
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 12
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total %d
"""


class Host:
    """One service directory, the stand-ins on PATH, and a run of the script."""

    def __init__(self, tmp: Path, engine: str = "vllm", **watchdog_settings: object) -> None:
        self.tmp = tmp
        self.root = tmp / "opt"
        services = [{"name": "chat", "engine": engine, "model": "m", "model_path": "/srv/models/m",
                     "image": f"{engine}:x", "port": 8000, "served_name": "tiny chat"}]
        wd = {"interval_s": 5, "failures": 2, "max_restarts_per_hour": 3, "probe_timeout_s": 2,
              "stall_window_s": 60, **watchdog_settings}
        self.settings = host_settings("h1", {"llmfleet_root": str(self.root), "llmfleet_services": services,
                                              "llmfleet_watchdog": wd})
        self.sdir = self.root / "services" / "chat"
        cur = self.sdir / "releases" / "r1"
        cur.mkdir(parents=True)
        (self.sdir / "current").symlink_to(cur)
        self.key_env: str | None = None
        self.stub = tmp / "stub"
        self.stub.mkdir()
        self.bin = tmp / "bin"
        self.bin.mkdir()
        shutil.copy(STUB_CURL, self.bin / "curl")
        (self.bin / "curl").chmod(0o755)
        log = self.stub / "systemctl.log"
        (self.bin / "systemctl").write_text(
            "#!/bin/sh\n"
            f"echo \"$*\" >> {log}\n"
            'case "$1" in is-active) echo active ;; show) cat "$STUB/started_us" 2>/dev/null || echo 0 ;; esac\n'
        )
        (self.bin / "systemctl").chmod(0o755)
        (self.bin / "docker").write_text(f"#!/bin/sh\necho \"docker $*\" >> {log}\nexit 1\n")
        (self.bin / "docker").chmod(0o755)

    def with_key(self, key: str, engine_env: str = "VLLM_API_KEY") -> None:
        self.key_env = engine_env
        (self.sdir / "current" / "service.env").write_text(f"# secrets\n{engine_env}='{key}'\n")

    def answers(self, *, health: int = 0, metrics: str | None = None, completion: str = "ok") -> None:
        (self.stub / "health").write_text(str(health))
        m = self.stub / "metrics"
        if metrics is None:
            m.unlink(missing_ok=True)
        else:
            m.write_text(metrics)
        (self.stub / "completion").write_text(completion)

    def stalled_for(self, seconds: int) -> None:
        """The counters were last seen moving ``seconds`` ago (as a real clock would have it)."""
        state = self.sdir / f"{watchdog.STATE}.progress"
        value, _since = state.read_text().split()
        state.write_text(f"{value} {int(time.time()) - seconds}\n")

    def run(self) -> dict[str, object]:
        text = watchdog.script_text(self.settings.services[0], self.settings, bind_address="127.0.0.1",
                                    key_env=self.key_env)
        script = self.sdir / "current" / watchdog.SCRIPT
        script.write_text(text)
        env = {"PATH": f"{self.bin}:{os.environ['PATH']}", "STUB": str(self.stub)}
        res = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return json.loads((self.sdir / f"{watchdog.STATE}.judgement").read_text())

    def restarts(self) -> int:
        log = self.stub / "systemctl.log"
        return sum(1 for ln in log.read_text().splitlines() if ln.startswith("restart")) if log.exists() else 0

    def audit(self) -> list[dict[str, object]]:
        path = self.root / "audit.jsonl"
        return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []

    def calls(self) -> list[dict[str, object]]:
        return [json.loads(ln) for ln in (self.stub / "calls.jsonl").read_text().splitlines()]


def stalled(detail: object, load: str) -> int:
    """The seconds in '<load>, 0 tokens generated in N s' (N grows with the machine's own delays)."""
    m = re.fullmatch(re.escape(load) + r", 0 tokens generated in (\d+) s", str(detail))
    assert m, detail
    return int(m.group(1))


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


def test_counters_that_move_mean_the_engine_works(host):
    host.answers(metrics=VLLM_BUSY % 100)
    assert host.run()["verdict"] == "working"
    host.answers(metrics=VLLM_BUSY % 164)
    assert host.run()["verdict"] == "working"
    assert host.restarts() == 0


def test_busy_with_still_counters_inside_the_window_is_not_judged_yet(host):
    host.answers(metrics=VLLM_BUSY % 100)
    host.run()
    host.stalled_for(30)
    assert host.run()["verdict"] == "busy"
    assert host.restarts() == 0


def test_busy_with_still_counters_past_the_window_is_hung_and_restarted_after_n_judgements(host):
    host.answers(metrics=VLLM_BUSY % 100)
    host.run()
    host.stalled_for(65)
    first = host.run()
    assert first["verdict"] == "hung"
    assert stalled(first["detail"], "2 requests running, 1 waiting") >= 65
    assert host.restarts() == 0  # failures: 2
    second = host.run()
    assert host.restarts() == 1
    (line,) = host.audit()
    assert line["action"] == "watchdog-restart" and line["result"] == "restarted"
    assert line["detail"].startswith("2 failed judgements in a row; last: 2 requests running, 1 waiting, 0 tokens")
    # what status reads after the restart: the restart and its evidence, no longer "hung"
    assert (second["verdict"], second["detail"]) == ("restarted", line["detail"])
    # the hung container is killed first (it would not act on the stop's SIGTERM), then the unit restarted
    calls = (host.stub / "systemctl.log").read_text().splitlines()
    assert calls.index("docker kill llmfleet-chat") < calls.index("restart llmfleet-chat.service")
    # the restart forgets the counters: the restarted engine starts a new window
    assert not (host.sdir / f"{watchdog.STATE}.progress").exists()


def test_idle_engine_that_answers_one_token_is_never_restarted(host):
    host.answers(metrics=VLLM_IDLE % 100)
    for _ in range(5):
        host.run()
    assert host.run()["verdict"] == "idle"
    assert host.restarts() == 0
    # a completion only when nothing was counted since the last probe; one token, bounded in time
    posts = [c for c in host.calls() if str(c["argv"][-1]).endswith("/v1/completions")]
    assert len(posts) == 5
    argv = posts[0]["argv"]
    assert argv[argv.index("--max-time") + 1] == "2"
    body = json.loads(argv[argv.index("-d") + 1])
    assert body == {"model": "tiny chat", "prompt": "ping", "max_tokens": 1, "temperature": 0}


def test_idle_engine_whose_completion_hangs_is_hung(host):
    host.answers(metrics=VLLM_IDLE % 100, completion="hang")
    assert host.run()["verdict"] == "working"  # first sight of the counters after a start
    verdict = host.run()
    assert verdict == {"time": verdict["time"], "verdict": "hung",
                       "detail": "idle; a 1-token completion did not finish within 2 s"}
    assert host.restarts() == 0
    host.run()
    assert host.restarts() == 1


def test_idle_engine_whose_completion_fails_is_hung_with_the_status(host):
    host.answers(metrics=VLLM_IDLE % 100, completion="503")
    host.run()
    assert host.run()["detail"] == "idle; a 1-token completion answered HTTP 503"


def test_metrics_that_do_not_answer_while_health_does_is_hung(host):
    host.answers(metrics="hang")
    v = host.run()
    assert v["verdict"] == "hung"
    assert v["detail"] == "/health answers but /metrics did not within 2 s (HTTP 000)"


def test_health_failing_is_down(host):
    host.answers(health=22, metrics=VLLM_BUSY % 1)
    v = host.run()
    assert (v["verdict"], v["detail"]) == ("down", "/health did not answer 200 within 2 s")
    host.run()
    assert host.restarts() == 1
    assert host.audit()[0]["detail"].startswith("2 failed judgements in a row; last: /health did not answer")


def test_an_engine_without_metrics_is_judged_by_the_completion(host):
    host.answers(metrics=None, completion="hang")
    assert host.run()["verdict"] == "hung"


def test_a_counter_that_went_back_is_a_restarted_engine_not_a_stall(host):
    host.answers(metrics=VLLM_BUSY % 5000)
    host.run()
    host.stalled_for(600)
    host.answers(metrics=VLLM_BUSY % 3)
    assert host.run()["verdict"] == "working"


def test_llamacpp_decode_calls_count_as_progress_during_a_long_stream(tmp_path):
    """llama-server adds tokens_predicted_total only when a request ends; n_decode_total moves."""
    host = Host(tmp_path, engine="llamacpp")
    host.answers(metrics=LLAMA_BUSY % 10)
    host.run()
    host.stalled_for(65)
    host.answers(metrics=LLAMA_BUSY % 11)
    assert host.run()["verdict"] == "working"
    host.stalled_for(65)
    v = host.run()
    assert v["verdict"] == "hung"
    assert stalled(v["detail"], "1 requests running, 0 waiting") >= 65


def test_progress_off_judges_by_health_alone(tmp_path):
    host = Host(tmp_path, progress=False)
    host.answers(metrics="hang", completion="hang")
    assert host.run()["verdict"] == "healthy"
    assert not (host.stub / "calls.jsonl").read_text().count("/metrics")


def test_restart_limit_per_hour_then_gives_up_once(tmp_path):
    host = Host(tmp_path, failures=1, max_restarts_per_hour=2)
    host.answers(metrics=VLLM_IDLE % 100, completion="hang")
    for _ in range(7):  # after each restart, the first sight of the counters counts as work
        host.run()
    assert host.restarts() == 2
    results = [a["result"] for a in host.audit()]
    assert results == ["restarted", "restarted", "gave-up"]


@pytest.mark.parametrize("key", ["s3cr3t-key", 'odd"key\\with quotes', "k1,k1"])
def test_the_api_key_goes_to_curl_on_stdin_never_in_argv(tmp_path, key):
    host = Host(tmp_path)
    host.with_key(key)
    host.answers(metrics=VLLM_IDLE % 100)
    host.run()
    host.run()
    calls = host.calls()
    plain = key.split(",")[0]
    for c in calls:
        assert plain not in " ".join(c["argv"])
    keyed = [c for c in calls if "-K" in c["argv"]]
    assert len(keyed) == 3  # /metrics twice and the completion
    escaped = plain.replace("\\", "\\\\").replace('"', '\\"')
    assert keyed[0]["stdin"] == f'header = "Authorization: Bearer {escaped}"\n'
    # nothing of the key in the files the status read-back shows
    for f in host.sdir.glob(f"{watchdog.STATE}*"):
        assert plain not in f.read_text(errors="replace")


def _row(host: Host, probe: str):
    from llmfleet.fleet import status as S
    from llmfleet.knowledge import release_state

    st = S.HostStatus(host="h1", reachable=True, states=release_state.parse_state(probe),
                      supervision=watchdog.parse_status(probe))
    (row,) = S.host_rows(st, host.settings)
    return row


RID = "20261206T010000Z-0123456789"
STATE_LINES = f"@@service chat\n@@current releases/{RID}\n@@unit active\n@@release {RID}\n@@end\n"


def test_status_shows_a_hung_engine_as_hung_with_the_evidence(host):
    host.answers(metrics=VLLM_BUSY % 100)
    host.run()
    host.stalled_for(70)
    host.run()
    out = subprocess.run(["sh", "-c", watchdog.status_script(str(host.root))], capture_output=True, text=True,
                         env={"PATH": f"{host.bin}:{os.environ['PATH']}"}, timeout=30).stdout
    row = _row(host, STATE_LINES + out)
    assert row.health == "hung"
    assert re.search(r"watchdog: 2 requests running, 1 waiting, 0 tokens generated in \d+ s \(\d+ s ago\)", row.note)
    assert row.supervision["judgement"]["verdict"] == "hung"


@pytest.mark.parametrize(("verdict", "age", "health"), [
    ("hung", 10, "hung"),
    ("down", 10, "down"),
    ("hung", 3 * 5 + 6, "healthy"),  # older than three timer periods (interval 5 s): no longer speaks for now
    ("working", 1, "healthy"),
    ("idle", 1, "healthy"),
    ("busy", 1, "healthy"),
])
def test_status_health_from_the_judgement_and_its_age(host, verdict, age, health):
    probe = (STATE_LINES.replace("@@end", '@@health {"result":"healthy"}\n@@end')
             + '@@watchdog chat 0 0 active\n'
             + f'@@watchdog-judgement chat {age} {{"time":"t","verdict":"{verdict}","detail":"why"}}\n')
    row = _row(host, probe)
    assert row.health == health


def test_status_parse_tolerates_a_broken_judgement():
    got = watchdog.parse_status("@@watchdog chat 0 0 active\n@@watchdog-judgement chat x {bad\n"
                                "@@watchdog-judgement chat 5 [1]\n@@watchdog-judgement\n")
    assert got["chat"].judgement is None


def test_a_young_engine_that_does_not_answer_yet_is_loading_not_down(host):
    """Within its load budget (health.load_timeout_s) a /health failure is the engine loading; an engine
    that already answers is judged by its work at once."""
    uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    (host.stub / "started_us").write_text(str(int((uptime_s - 3) * 1_000_000)))
    host.answers(health=22)
    for _ in range(3):
        v = host.run()
    assert v["verdict"] == "starting" and v["detail"].endswith("within its load budget of 900 s")
    assert host.restarts() == 0
    host.answers(metrics=VLLM_IDLE % 7, completion="hang")
    for _ in range(3):
        host.run()
    assert host.restarts() == 1
