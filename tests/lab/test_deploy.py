"""deploy / rollback end to end in the lab: real sshd, systemd, Docker, llama-server and vLLM (CPU).

The llama.cpp tests share one host (``gpu-v100-02``, brought up here) and run in file order: first
deploy, no-change redeploy, --check/--diff, changed flags, a killed engine restarted by systemd,
broken image, speed floor, concurrency, interrupted deploys, hostile values, rollback. The vLLM test uses ``gpu-4090-01``.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from llmfleet.knowledge import release_state
from llmfleet.release import decide as Dc
from llmfleet.release import store as R
from llmfleet.release.deploy import DeployOptions, deploy_host, rollback_host
from llmfleet.release.executor import lock_break, lock_status

pytestmark = pytest.mark.lab

HOST = "gpu-v100-02"
VLLM_HOST = "gpu-4090-01"
UNIT = "llmfleet-tiny.service"
CONTAINER = "llmfleet-tiny"
ROOT = "/opt/llmfleet"
FAST_HEALTH = {"load_timeout_s": 15, "stage_timeout_s": 20, "min_tokps": 2, "max_tokens": 32}


class Ctx:
    def __init__(self, lab, tmp):
        self.lab = lab
        self.config = dict(lab.config, audit_log=str(tmp / "audit.jsonl"))
        self.lines: list[str] = []
        self.first: str | None = None
        self.releases: list[str] = []

    def deploy(self, host=HOST, **opts) -> object:
        self.lines.clear()
        o = deploy_host(self.lab.inventory_path, host, config=self.config,
                        options=DeployOptions(**{"who": "tester", **opts}), log=self.lines.append)
        return o

    def state(self, host=HOST) -> release_state.ServiceState:
        out = self.lab.exec(host, ["sh", "-c", R.state_script(ROOT)]).stdout
        return release_state.parse_state(out)["tiny" if host == HOST else "tiny-vllm"]

    def started_at(self, host=HOST, container=CONTAINER) -> str:
        return self.lab.exec(host, ["docker", "inspect", "-f", "{{.State.StartedAt}}", container]).stdout.strip()

    def health_now(self, host=HOST, port=8000) -> int:
        with self.lab.connect(host) as remote, remote.forward(port) as lp:
            return httpx.get(f"http://127.0.0.1:{lp}/health", timeout=10, trust_env=False).status_code

    def audit(self, host=HOST) -> list[dict]:
        text = self.lab.exec(host, ["sh", "-c", f"cat {R.audit_path(ROOT)} 2>/dev/null || true"]).stdout
        return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def ctx(lab, tmp_path_factory):
    lab.ensure_hosts(HOST)
    return Ctx(lab, tmp_path_factory.mktemp("deploy"))


def test_first_deploy(ctx):
    o = ctx.deploy(message="first")
    assert o.result == "deployed", o.reason
    rid = o.releases["tiny"]
    assert release_state.RELEASE_ID_RE.match(rid)
    st = ctx.state()
    assert st.current == rid and st.releases[rid].healthy and st.unit == "active"
    h = o.health["tiny"]
    assert h["result"] == "healthy" and h["decode_tokps"] > 0 and h["ttft_s"] is not None
    assert [s["name"] for s in h["stages"]] == ["unit", "container", "health", "models", "residency", "completion"]
    # the engine's own load report, read back and compared with the plan (the lab's CPU engine keeps its
    # layers in host memory by design: llmfleet_health_residency: cpu in the lab inventory)
    res = h["residency"]
    assert res["status"] == "pass" and res["mode"] == "cpu", res
    rep = res["engine_report"]
    assert rep["layers_offloaded"] == rep["layers_total"] and rep["kv_cells"] >= 512 and rep["build"]
    assert any(f["what"] == "layers" and f["status"] == "pass" for f in res["findings"])
    assert res.get("gpu_memory_mib", 0) > 0  # the nvidia-smi simulator's witness: the engine's real memory
    # the secrets file is 0600 in the release folder; the manifest names the digest and who
    mode = ctx.lab.exec(HOST, ["stat", "-c", "%a", f"{ROOT}/services/tiny/releases/{rid}/service.env"]).stdout.strip()
    assert mode == "600"
    m = st.releases[rid].manifest
    assert m.who == "tester" and m.digest.startswith("sha256:") and m.release == rid
    # audit on the host and locally
    last = ctx.audit()[-1]
    assert (last["action"], last["result"], last["release"], last["message"]) == ("deploy", "deployed", rid, "first")
    local = [json.loads(x) for x in open(ctx.config["audit_log"]).read().splitlines()]
    assert local[-1]["release"] == rid
    ctx.first = rid
    ctx.releases.append(rid)


def test_no_change_redeploy_restarts_nothing(ctx):
    before = ctx.started_at()
    o = ctx.deploy()
    assert o.result == "unchanged", o.reason
    assert o.releases["tiny"] == ctx.first
    assert ctx.started_at() == before
    assert o.round_trips == 2  # the probe (which reads the release state too) and the audit line
    assert ctx.audit()[-1]["result"] == "unchanged"
    assert any("no restart" in line for line in ctx.lines)


def test_check_and_diff_change_nothing(ctx):
    before = ctx.started_at()
    o = ctx.deploy(check=True, overrides={"engine_args": ["--ctx-size", "256"]})
    assert o.result == "check" and any("new release" in c for c in o.changes)
    d = ctx.deploy(diff=True, overrides={"engine_args": ["--ctx-size", "256"]})
    assert d.result == "check"
    diff = d.diffs["tiny/compose.yml"]
    assert '+      - "256"' in diff and "--- current/compose.yml" in diff
    env = d.diffs.get("tiny/service.env", "")
    assert "sk-" not in env
    assert ctx.state().current == ctx.first and ctx.started_at() == before


def test_changed_flags_make_a_new_release(ctx):
    o = ctx.deploy(overrides={"engine_args": ["--ctx-size", "256"]}, message="smaller context")
    assert o.result == "deployed", o.reason
    rid = o.releases["tiny"]
    assert rid != ctx.first
    st = ctx.state()
    assert st.current == rid and set(ctx.releases) <= set(st.releases)  # the old one is kept
    assert "256" in " ".join(st.releases[rid].manifest.engine_args)
    ctx.releases.append(rid)
    # probe, lock + pull, upload + arm + switch + container start, confirm, the last round trip (a
    # health probe more when the engine was slow to start)
    assert 5 <= o.round_trips <= 6, [(t["stage"], t["round_trips"]) for t in o.timeline]
    stages = [t["stage"] for t in o.timeline]
    assert "tiny: upload + arm revert + switch + restart + container start" in stages and "lock + pull" in stages


def test_a_killed_engine_is_restarted_by_systemd_in_a_new_container_on_the_kept_network(ctx):
    """compose exits with the engine; systemd runs no ExecStop then, so the stopped container stays
    until the restart (RestartSec later), whose ExecStartPre removes it before `up` makes a new one on
    the project's network, which no stop removed."""

    def look() -> tuple[str, str, str]:
        c = ctx.lab.exec(HOST, ["docker", "inspect", "-f", "{{.Id}} {{.State.Status}}", CONTAINER], check=False)
        cid, status = (c.stdout.split() + ["", ""])[:2] if c.returncode == 0 else ("", "absent")
        unit = ctx.lab.exec(HOST, ["systemctl", "is-active", UNIT], check=False).stdout.strip()
        return cid, status, unit

    network = ctx.lab.exec(HOST, ["docker", "network", "inspect", "-f", "{{.Id}}", "llmfleet-tiny_default"]).stdout
    old, status, unit = look()
    assert (status, unit) == ("running", "active")
    restarts = int(ctx.lab.exec(HOST, ["systemctl", "show", "-p", "NRestarts", "--value", UNIT]).stdout)
    ctx.lab.exec(HOST, ["docker", "kill", CONTAINER])
    time.sleep(1)
    assert look()[:2] == (old, "exited")  # the crashed run's container, until the restart
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (look()[0] not in ("", old) and look()[1:] == ("running", "active")):
        time.sleep(0.5)
    new, status, unit = look()
    assert new not in ("", old) and (status, unit) == ("running", "active"), (new, status, unit)
    assert int(ctx.lab.exec(HOST, ["systemctl", "show", "-p", "NRestarts", "--value", UNIT]).stdout) == restarts + 1
    ids = ctx.lab.exec(HOST, ["docker", "ps", "-aq", "--no-trunc", "--filter", "label=io.llmfleet.service=tiny"]).stdout
    assert ids.split() == [new]  # no leftover beside it
    assert ctx.lab.exec(HOST, ["docker", "network", "inspect", "-f", "{{.Id}}", "llmfleet-tiny_default"]).stdout == network
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if ctx.health_now() == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    assert ctx.health_now() == 200


def test_broken_image_rolls_back_and_the_old_release_still_answers(ctx):
    good = ctx.state().current
    o = ctx.deploy(overrides={"engine_args": ["--ctx-size", "256"], "image": "llamacpp:lab-broken",
                              "health": FAST_HEALTH})
    assert o.result == "rolled_back", o.reason
    assert f"back on release {good}" in o.reason
    assert "stage health failed" in o.reason and "engine log:" in o.reason
    st = ctx.state()
    assert st.current == good and st.unit == "active"
    failed = [r for r in st.releases.values() if r.manifest and "broken" in r.manifest.image_ref]
    assert failed and failed[0].health and failed[0].health["result"] == "unhealthy"
    assert ctx.health_now() == 200
    assert ctx.audit()[-1]["result"] == "rolled_back"


def test_ctrl_c_during_the_health_check_goes_back_to_the_old_release(ctx):
    import signal
    import subprocess
    import sys

    good = ctx.state().current
    code = (
        "import json, sys\n"
        "from llmfleet.release.deploy import DeployOptions, deploy_host\n"
        "o = deploy_host(sys.argv[1], sys.argv[2], config=json.loads(sys.argv[3]),\n"
        "                options=DeployOptions(overrides=json.loads(sys.argv[4]), who='ctrl-c'),\n"
        "                log=lambda line: print(line, flush=True))\n"
        "print('RESULT', o.result, flush=True)\n"
    )
    over = {"engine_args": ["--ctx-size", "256"], "image": "llamacpp:lab-broken",
            "health": dict(FAST_HEALTH, load_timeout_s=120)}
    # SIGINT as at a terminal: a run started in the background of a non-interactive shell (nohup ... &)
    # passes SIGINT on ignored, and Python then installs no KeyboardInterrupt handler
    proc = subprocess.Popen([sys.executable, "-c", code, ctx.lab.inventory_path, HOST, json.dumps(ctx.config),
                             json.dumps(over)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen: list[str] = []
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if "health check of release" in line or time.monotonic() > deadline:
            break
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=180)
    out = "".join(seen) + rest
    assert "KeyboardInterrupt" in out and "RESULT" not in out, out[-3000:]
    assert "interrupted; going back to " + good in out
    st = ctx.state()
    assert st.current == good and st.unit == "active"
    assert ctx.health_now() == 200
    assert ctx.lab.exec(HOST, ["test", "-d", f"{ROOT}/locks/deploy"], check=False).returncode != 0  # unlocked
    last = ctx.audit()[-1]
    assert last["result"] == "rolled_back" and "interrupted" in last["detail"]


def test_fewer_gpu_layers_than_the_model_has_are_rolled_back_by_the_engines_own_report(ctx):
    """-ngl below the model's layer count: the engine says so in its load log, and the deploy goes back
    although the speed clears the floor (the CPU engine decodes fast either way)."""
    good = ctx.state().current
    o = ctx.deploy(overrides={"engine_args": ["-ngl", "1"], "health": FAST_HEALTH})
    assert o.result == "rolled_back", o.reason
    assert "stage residency failed" in o.reason and "offloaded 1/3 layers to GPU" in o.reason, o.reason
    assert f"back on release {good}" in o.reason
    h = o.health["tiny"]
    assert h["residency"]["engine_report"]["layers_offloaded"] == 1
    assert "completion" not in [s["name"] for s in h["stages"]]  # decided before any speed was measured
    assert ctx.state().current == good and ctx.health_now() == 200


def test_a_second_deploy_is_gated_by_the_first_ones_measured_speed(ctx):
    """No floor set on the service or host: the fleet's own healthy runs of this combination set it.
    The lab's runs decode at hundreds of tok/s, so 0.6 x their median fails a release that the planner's
    floor alone would pass; the floor names the runs it came from."""
    good = ctx.state().current
    gated = {k: v for k, v in FAST_HEALTH.items() if k != "min_tokps"}
    o = ctx.deploy(overrides={"health": gated, "engine_args": ["--ctx-size", "448"]})
    floor_lines = [ln for ln in ctx.lines if "decode floor from the fleet" in ln]
    assert floor_lines and "0.6 x the median" in floor_lines[0] and "runs of this card" in floor_lines[0], ctx.lines
    assert HOST in floor_lines[0]  # it names the runs it came from
    h = o.health["tiny"]
    assert "0.6 x the median" in h.get("floor_source", ""), h
    if o.result == "deployed":  # it decoded at its usual speed: above 0.6 x the median
        assert h["decode_tokps"] >= h["floor_tokps"]
        # back to a release with the lab's absolute floor: a later test's rollback may land on this one,
        # and without min_tokps it would be judged against the simulated card's figures (health settings
        # alone make no new release: the flags differ too)
        again = ctx.deploy(overrides={"health": FAST_HEALTH, "engine_args": ["--ctx-size", "464"]})
        assert again.result == "deployed", again.reason
    else:  # a busy shared machine slowed it below the fleet's floor: the floor said why
        assert o.result == "rolled_back" and "median" in o.reason and ctx.state().current == good


def test_decode_below_the_floor_is_not_resident_and_rolls_back(ctx):
    good = ctx.state().current
    o = ctx.deploy(overrides={"health": dict(FAST_HEALTH, min_tokps=1_000_000)})
    assert o.result == "rolled_back", o.reason
    assert "probably not resident" in o.reason and f"back on release {good}" in o.reason
    assert ctx.state().current == good and ctx.health_now() == 200


def test_concurrent_deploy_is_refused_with_the_holders_details(ctx):
    results: dict[str, object] = {}
    opts = {"overrides": {"engine_args": ["--ctx-size", "384"]}, "message": "alice's canary", "who": "alice"}

    def first():
        results["a"] = deploy_host(ctx.lab.inventory_path, HOST, config=ctx.config,
                                   options=DeployOptions(**opts), log=lambda _: None)

    t = threading.Thread(target=first)
    t.start()
    holder = f"{ROOT}/locks/deploy/holder.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and t.is_alive():
        if ctx.lab.exec(HOST, ["test", "-f", holder], check=False).returncode == 0:
            break
        time.sleep(0.05)
    b = ctx.deploy(overrides={"engine_args": ["--ctx-size", "320"]}, who="bob")
    t.join(timeout=180)
    a = results["a"]
    assert a.result == "deployed", a.reason
    assert b.result == "refused"
    assert "alice" in b.reason and "alice's canary" in b.reason and "lock.release" in b.reason
    ctx.releases.append(a.releases["tiny"])


def test_an_operators_lock_refuses_and_lock_release_breaks_it(ctx):
    holder = R.holder_document(token="x", who="carol", origin="carol@elsewhere", action="deploy",
                               message="driver upgrade", now=R.datetime.now(R.UTC), pid=1)
    ctx.lab.exec(HOST, ["sh", "-c", R.lock_acquire_script(ROOT, holder)])
    o = ctx.deploy(overrides={"engine_args": ["--ctx-size", "320"]})
    assert o.result == "refused" and "carol" in o.reason and "driver upgrade" in o.reason
    inv = ctx.lab.inventory()
    h = inv.hosts[HOST]
    st = lock_status(h, inv.settings_for(h), config=ctx.config)
    assert st["held"] and "carol" in st["description"]
    assert lock_break(h, inv.settings_for(h), config=ctx.config)["broken"]
    assert ctx.audit()[-1]["action"] == "lock-break"


def test_interrupted_deploys_are_completed_by_the_next_one(ctx):
    import subprocess

    cur = ctx.state().current
    # 1. a deploy from this machine died holding the lock (its process is gone)
    dead = subprocess.Popen(["true"])
    dead.wait()
    from llmfleet.release.who import default_who

    stale = R.holder_document(token="y", who="tester", origin=default_who(), action="deploy", message="",
                              now=R.datetime.now(R.UTC), pid=dead.pid)
    ctx.lab.exec(HOST, ["sh", "-c", R.lock_acquire_script(ROOT, stale)])
    # 2. ... after switching but before marking the release healthy
    ctx.lab.exec(HOST, ["rm", "-f", f"{ROOT}/services/tiny/releases/{cur}/health.json"])
    before = ctx.started_at()
    o = ctx.deploy(overrides={"engine_args": ["--ctx-size", "384"]})
    assert o.result == "deployed", o.reason
    assert o.releases["tiny"] == cur
    assert ctx.state().releases[cur].healthy
    assert ctx.started_at() == before  # verified, not restarted
    assert any("stale lock" in line for line in ctx.lines)
    # 3. the unit died: the next deploy restarts the same release
    ctx.lab.exec(HOST, ["systemctl", "stop", UNIT])
    o = ctx.deploy(overrides={"engine_args": ["--ctx-size", "384"]})
    assert o.result == "deployed" and o.releases["tiny"] == cur, o.reason
    assert ctx.state().unit == "active"


def test_unknown_host_key_is_refused(ctx, tmp_path):
    conf = dict(ctx.config, known_hosts=str(tmp_path / "empty_known_hosts"))
    o = deploy_host(ctx.lab.inventory_path, HOST, config=conf, options=DeployOptions(), log=lambda _: None)
    assert o.result == "refused"
    assert "unknown host key" in o.reason and "SHA256:" in o.reason and "--accept-new-host-keys" in o.reason
    assert not (tmp_path / "empty_known_hosts").exists()


def test_hostile_values_are_quoted_never_executed(ctx):
    hostile_dir = "/srv/models/x $(touch /tmp/pwned-a);`touch /tmp/pwned-b`'\"&&touch /tmp/pwned-c"
    ctx.lab.exec(HOST, ["sh", "-c", 'mkdir -p "$1" && cp "$2" "$1/m.gguf"', "sh", hostile_dir, ctx.lab.gguf_path])
    name = "tiny$(touch /tmp/pwned-d);'; touch /tmp/pwned-e; echo '${HOME}"
    o = ctx.deploy(overrides={"model_path": hostile_dir + "/m.gguf", "served_name": name,
                              "engine_args": ["--ctx-size", "384"]},
                   message="msg $(touch /tmp/pwned-f) `touch /tmp/pwned-g`")
    assert o.result == "deployed", o.reason
    assert ctx.lab.exec(HOST, ["sh", "-c", "ls /tmp/pwned-* 2>/dev/null || true"]).stdout.strip() == ""
    st = ctx.state()
    assert st.releases[st.current].manifest.inputs["served_name"] == name
    assert ctx.audit()[-1]["message"].startswith("msg $(touch")
    ctx.releases.append(o.releases["tiny"])


def test_rollback_to_a_named_release_and_to_the_previous_one(ctx):
    for size in ("344", "352"):  # healthy releases to go back to (failed ones above fill the kept five)
        assert ctx.deploy(overrides={"engine_args": ["--ctx-size", size]}).result == "deployed"
    st = ctx.state()
    cur = st.current
    healthy = sorted(rid for rid, r in st.releases.items() if r.healthy and rid != cur)
    assert len(healthy) >= 2, st.releases.keys()
    named = healthy[0]  # the oldest one still kept (earlier ones were pruned: keep 5)
    o = rollback_host(ctx.lab.inventory_path, HOST, to=named, config=ctx.config,
                      options=DeployOptions(who="tester", message="back to a named release"), log=lambda _: None)
    assert o.result == "rolled_back", o.reason
    assert o.releases["tiny"] == named
    assert ctx.state().current == named and ctx.health_now() == 200
    last = ctx.audit()[-1]
    assert (last["action"], last["release"], last["result"]) == ("rollback", named, "rolled_back")
    # without --to: the newest healthy release before the current one (none is older than `named`:
    # then the newest healthy other one)
    o2 = rollback_host(ctx.lab.inventory_path, HOST, config=ctx.config, options=DeployOptions(), log=lambda _: None)
    assert o2.result == "rolled_back", o2.reason
    assert ctx.state().current == Dc.rollback_target(st.__class__(
        name="tiny", current=named, releases=ctx.state().releases))
    # a release that does not exist is refused with the hint
    o3 = rollback_host(ctx.lab.inventory_path, HOST, to="20000101T000000Z-0000000000", config=ctx.config,
                       options=DeployOptions(), log=lambda _: None)
    assert o3.result == "failed" and "does not exist" in o3.reason and "invoke releases" in o3.reason
    # the inventory's own inputs deploy again as usual
    o4 = ctx.deploy()
    assert o4.result in {"deployed", "unchanged"}, o4.reason
    assert cur in ctx.state().releases


def test_prune_keeps_the_configured_number(ctx):
    for ctxsize in ("288", "296", "304", "312", "328"):
        o = ctx.deploy(overrides={"engine_args": ["--ctx-size", ctxsize]})
        assert o.result == "deployed", o.reason
    st = ctx.state()
    assert len(st.releases) <= 5 + 1  # keep 5, plus the rollback target when older
    assert st.current in st.releases and Dc.rollback_target(st) in st.releases


def test_the_cli_deploy_lock_and_rollback_tasks(ctx):
    import os
    import subprocess
    import sys
    from pathlib import Path

    exe = str(Path(sys.executable).parent / "llmfleet")
    env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=ctx.config["known_hosts"],
               INVOKE_LLMFLEET_AUDIT_LOG=ctx.config["audit_log"])

    def cli(*argv):
        return subprocess.run([exe, *argv, "-i", ctx.lab.inventory_path], capture_output=True, text=True,
                              timeout=600, env=env, cwd=Path(__file__).resolve().parents[2])

    assert ctx.deploy(overrides={"engine_args": ["--ctx-size", "272"]}).result == "deployed"  # something to go back to
    r = cli("deploy", "--host", HOST, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert [o["result"] for o in json.loads(r.stdout)["hosts"]] in (["deployed"], ["unchanged"])
    r = cli("deploy", "--host", HOST, "--check")
    assert r.returncode == 0 and "no change" in r.stdout
    holder = R.holder_document(token="z", who="dave", origin="dave@ws", action="deploy", message="hands off",
                               now=R.datetime.now(R.UTC), pid=1)
    ctx.lab.exec(HOST, ["sh", "-c", R.lock_acquire_script(ROOT, holder)])
    r = cli("lock.status", "--host", HOST, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["hosts"][0]["holder"]["who"] == "dave"
    r = cli("rollback", "--host", HOST)
    assert r.returncode == 1 and "dave" in r.stdout + r.stderr
    r = cli("lock.release", "--host", HOST)  # no terminal to ask on: refused, lock kept
    assert r.returncode == 2 and "--yes" in r.stderr
    r = cli("lock.release", "--host", HOST, "--yes")
    assert r.returncode == 0 and "broke" in r.stdout
    r = cli("rollback", "--host", HOST, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["hosts"][0]["result"] == "rolled_back"


@pytest.mark.vllm
def test_vllm_first_deploy_and_no_change_redeploy(lab, ctx):
    lab.ensure_hosts(VLLM_HOST)
    # ~30 s to load on a quiet machine; minutes while the 2 cores are shared with other lab runs. An
    # environment of its own makes a release of its own: the bench test deploys the group's service to
    # this host too (the same worker's lab), and then a first deploy here would change nothing.
    slow = {"health": {"load_timeout_s": 900, "stage_timeout_s": 120, "min_tokps": 1, "max_tokens": 16},
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "LLMFLEET_LAB_TEST": "first-deploy-and-no-change"}}
    o = ctx.deploy(host=VLLM_HOST, overrides=slow)
    assert o.result == "deployed", o.reason + "\n" + "\n".join(ctx.lines[-20:])
    h = o.health["tiny-vllm"]
    assert h["result"] == "healthy" and h["tokens"] > 0
    # vLLM's own KV capacity, read from its log and compared with what the command line asks
    res = h["residency"]
    assert res["engine_report"]["kv_tokens"] >= 512 * 2, res
    assert any(f["what"] == "kv" and f["status"] == "pass" and ">= 1,024" in f["message"] for f in res["findings"])
    before = ctx.started_at(VLLM_HOST, "llmfleet-tiny-vllm")
    again = ctx.deploy(host=VLLM_HOST, overrides=slow)
    assert again.result == "unchanged"
    assert ctx.started_at(VLLM_HOST, "llmfleet-tiny-vllm") == before
    # vLLM refuses connections while loading: the checker waited through that, and the compose
    # file gave it the host's IPC namespace
    compose = lab.exec(VLLM_HOST, ["cat", f"{ROOT}/services/tiny-vllm/current/compose.yml"]).stdout
    assert 'ipc: "host"' in compose
    lab.exec(VLLM_HOST, ["systemctl", "stop", "llmfleet-tiny-vllm.service"], timeout=120)


def test_api_key_reaches_only_the_0600_env_file_and_guards_the_api(ctx, monkeypatch):
    """An API key (from_env on the operator's machine) protects the server, and appears nowhere else:
    not in the rendered compose file, unit or manifest, the --diff, the deploy log, the audit lines
    (host and local), the unit's journal, or any process's command line on the host."""
    import secrets as _secrets

    secret = "sk-lab-" + _secrets.token_hex(12)
    monkeypatch.setenv("LLMFLEET_TEST_API_KEY", secret)
    with_key = {"api_key": {"from_env": "LLMFLEET_TEST_API_KEY"}, "engine_args": ["--ctx-size", "416"]}
    d = ctx.deploy(diff=True, overrides=with_key)
    assert d.result == "check", d.reason
    assert any("LLAMA_API_KEY" in text for text in d.diffs.values())  # the change is shown ...
    assert secret not in json.dumps(d.to_dict())  # ... masked
    o = ctx.deploy(overrides=with_key, message="with an API key")
    assert o.result == "deployed", o.reason  # the health check itself authenticated
    rid = o.releases["tiny"]
    with ctx.lab.connect(HOST) as remote, remote.forward(8000) as lp:
        url = f"http://127.0.0.1:{lp}/v1/models"
        assert httpx.get(url, timeout=10, trust_env=False).status_code == 401
        ok = httpx.get(url, timeout=10, trust_env=False, headers={"Authorization": f"Bearer {secret}"})
        assert ok.status_code == 200
    release_dir = f"{ROOT}/services/tiny/releases/{rid}"
    found = ctx.lab.exec(HOST, ["grep", "-rlF", secret, ROOT]).stdout.split()
    assert found == [f"{release_dir}/service.env"]
    assert ctx.lab.exec(HOST, ["stat", "-c", "%a %U", found[0]]).stdout.split() == ["600", "root"]
    journal = ctx.lab.exec(HOST, ["journalctl", "--no-pager", "-u", UNIT]).stdout
    assert journal and secret not in journal
    cmdlines = ctx.lab.exec(HOST, ["ps", "-eo", "args"]).stdout
    assert secret not in cmdlines
    assert secret not in "\n".join(ctx.lines) and secret not in json.dumps(o.to_dict())
    assert secret not in open(ctx.config["audit_log"]).read()
    assert secret not in json.dumps(ctx.audit())
