"""Faults injected on a lab host during and after deploys, each measured the same way.

Used by ``tests/lab/test_faults.py`` and ``test_faults_cuts.py`` (asserts) and ``bench/fault_report.py`` (prints the table). One
``FaultBench`` wraps one lab host that serves the lab's llama.cpp service ``tiny``; every scenario
starts from a healthy deploy, injects one fault, then records: what the deploy (or the host) did,
which release serves afterwards (``current``, with ``/health`` 200 asked on the host itself), how long
from the injection until it served again, what was lost (releases that vanished, audit lines
rewritten), and whether the next plain deploy converges.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llmfleet.knowledge import release_state
from llmfleet.release import store as R

SERVICE = "tiny"
ROOT = "/opt/llmfleet"
UNIT = f"llmfleet-{SERVICE}.service"
CONTAINER = f"llmfleet-{SERVICE}"
PORT = 8000
# Short load budget: the lab's CPU engine loads its tiny model in about a second. Stages get 60 s: on a
# shared 2-core machine under load a 32-token completion once took over 20 s. The confirmation timeout
# (60 s) stays above a healthy deploy's arm-to-confirm time under that load.
HEALTH = {"load_timeout_s": 20, "stage_timeout_s": 60, "min_tokps": 2, "max_tokens": 32}
BROKEN = "llamacpp:lab-broken"
CONFIRM_TIMEOUT_S = 60
WATCHDOG = {"interval_s": 5, "failures": 2, "max_restarts_per_hour": 3, "probe_timeout_s": 2, "stall_window_s": 10}
KEY_ENV = "LLMFLEET_FAULT_KEY"
KEEP_RELEASES = 5  # inventory/lab: llmfleet_keep_releases


@dataclass
class FaultResult:
    fault: str
    injected_at: str
    outcome: str
    serving: str | None = None
    time_to_serving_s: float | None = None
    data_lost: str = "none"
    converged: bool | None = None
    ok: bool = False
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prepare_inventory(inventory_path: str | Path, host: str) -> None:
    """Host variables the faults need: a short confirmation timeout and a fast watchdog."""
    hv = Path(inventory_path) / "host_vars"
    hv.mkdir(exist_ok=True)
    path = hv / f"{host}.yml"
    data = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    data.update({"llmfleet_confirm_timeout_s": CONFIRM_TIMEOUT_S, "llmfleet_watchdog": WATCHDOG})
    path.write_text(yaml.safe_dump(data, sort_keys=True))


class FaultBench:
    """One lab host under faults. Every deploy carries an API key (``api_key: {from_env: ...}``, a fresh
    value per bench) so that the secrets scan at the end sees what the whole suite left behind: every
    line the controllers printed is kept (``lines``), and every command sent over SSH is checked for
    the key (``argv_hits``)."""

    def __init__(self, inventory_path: str, host: str, container: str, config: dict[str, Any],
                 log: Callable[[str], None] = lambda _: None) -> None:
        self.inventory_path = inventory_path
        self.host = host
        self.container = container
        self.config = config
        self.key = "sk-fault-" + os.urandom(12).hex()
        os.environ[KEY_ENV] = self.key
        self.lines: list[str] = []
        self.argv_hits = watch_argv(self.key)
        self._log = log

    def log(self, line: str) -> None:
        self.lines.append(line)
        self._log(line)

    # -- plumbing ---------------------------------------------------------------------------------

    def exec(self, script: str, *, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
        proc = subprocess.run(["docker", "exec", self.container, "sh", "-c", script], capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{self.host}: {script[:80]!r} exited {proc.returncode}: {proc.stderr[-300:]}")
        return proc

    def overrides(self, **overrides: Any) -> dict[str, Any]:
        return {"health": HEALTH, "api_key": {"from_env": KEY_ENV}, **overrides}

    def deploy(self, *, log: Callable[[str], object] | None = None, diff: bool = False, **overrides: Any):
        from llmfleet.release.deploy import deploy_host
        from llmfleet.release.prepare import DeployOptions

        def both(line: str) -> None:
            self.log(line)
            if log is not None:
                log(line)

        o = deploy_host(self.inventory_path, self.host, config=self.config,
                        options=DeployOptions(overrides=self.overrides(**overrides), who="faults", diff=diff),
                        log=both)
        self.lines.append(f"outcome: {o.result}: {o.reason}")
        return o

    def deploy_in_thread(self, on_line: Callable[[str], bool], **overrides: Any) -> tuple[threading.Thread, list]:
        """A deploy in a thread; ``on_line`` sees each log line (it returns True once it acted)."""
        box: list[Any] = []

        def body() -> None:
            try:
                box.append(self.deploy(log=on_line, **overrides))
            except Exception as exc:  # noqa: BLE001 - reported by the scenario
                box.append(exc)

        t = threading.Thread(target=body, daemon=True)
        t.start()
        return t, box

    def state(self) -> release_state.ServiceState:
        return release_state.parse_state(self.exec(R.state_script(ROOT)).stdout).get(SERVICE) or release_state.ServiceState(SERVICE)

    def answers(self, port: int = PORT) -> bool:
        return self.exec(f"curl -fsS -o /dev/null --max-time 3 http://127.0.0.1:{port}/health",
                         timeout=20).returncode == 0

    def serving(self) -> str | None:
        st = self.state()
        return st.current if st.current and st.unit == "active" and self.answers() else None

    def wait_serving(self, t0: float, timeout: float, release: str | None = None) -> float | None:
        """Seconds from ``t0`` until the host serves (``release``, when given); None if it never did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.serving()
            if got and (release is None or got == release):
                return round(time.monotonic() - t0, 1)
            time.sleep(1)
        return None

    def audit(self) -> list[dict[str, Any]]:
        return parse_audit(self.exec(f"cat {R.audit_path(ROOT)} 2>/dev/null || true").stdout)

    def snapshot(self) -> dict[str, Any]:
        st = self.state()
        return {"releases": set(st.releases), "current": st.current, "audit": self.audit()}

    def lost(self, before: dict[str, Any]) -> str:
        """What a fault took away: the release that served before it, releases beyond what pruning
        removes (the newest ``keep_releases`` stay), audit lines rewritten."""
        now = self.snapshot()
        gone = sorted(before["releases"] - now["releases"])
        problems = []
        # a newer release serving now may have pruned the old one (keep_releases): that is policy
        if before["current"] and before["current"] in gone and not (now["current"] or "") > before["current"]:
            problems.append(f"the serving release {before['current']} is gone")
        if len(now["releases"]) < min(len(before["releases"]), KEEP_RELEASES):
            problems.append(f"releases gone beyond pruning: {', '.join(gone)}")
        if now["audit"][: len(before["audit"])] != before["audit"]:
            problems.append("audit log rewritten")
        return "; ".join(problems) or "none"

    def healthy_baseline(self) -> str:
        o = self.deploy()
        if o.result not in {"deployed", "unchanged"}:
            raise RuntimeError(f"baseline deploy: {o.result}: {o.reason}")
        got = self.serving()
        if not got:
            raise RuntimeError("baseline deploy did not leave the host serving")
        return got

    def converge(self) -> tuple[bool, str]:
        o = self.deploy()
        ok = o.result in {"deployed", "unchanged"} and self.serving() is not None
        return ok, f"{o.result}: {o.reason[:200]}"

    def finish(self, r: FaultResult, before: dict[str, Any], *, expect: str | None) -> FaultResult:
        r.serving = r.serving or self.serving()
        r.data_lost = self.lost(before)
        r.converged, said = self.converge()
        if not r.converged:
            r.extra["next_deploy"] = said
            r.detail = "; ".join(x for x in (r.detail, f"next deploy: {said}") if x)
        r.ok = bool(r.serving) and (expect is None or r.serving == expect) and r.data_lost == "none" and r.converged
        if r.serving and expect is not None and r.serving != expect:
            r.detail = "; ".join(x for x in (r.detail, f"serving {r.serving}, expected {expect}") if x)
        return r

    # -- faults -----------------------------------------------------------------------------------

    def controller_killed_mid_health(self) -> FaultResult:
        """The controller dies (SIGKILL) while it health-checks a new release: the host timer reverts."""
        good = self.healthy_baseline()
        before = self.snapshot()
        code = (
            "import json, sys\n"
            "from llmfleet.release.deploy import DeployOptions, deploy_host\n"
            "o = deploy_host(sys.argv[1], sys.argv[2], config=json.loads(sys.argv[3]),\n"
            "                options=DeployOptions(overrides=json.loads(sys.argv[4]), who='faults-killed'),\n"
            "                log=lambda line: print(line, flush=True))\n"
            "print('RESULT', o.result, flush=True)\n"
        )
        over = self.overrides(image=BROKEN, health=dict(HEALTH, load_timeout_s=300))
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        proc = subprocess.Popen([sys.executable, "-c", code, self.inventory_path, self.host, json.dumps(self.config),
                                 json.dumps(over)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env)
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "health check of release" in line:
                break
        time.sleep(2)
        proc.send_signal(signal.SIGKILL)
        self.lines.extend(seen)
        t0 = time.monotonic()
        proc.wait(timeout=30)
        r = FaultResult("controller killed (SIGKILL)", "health check of the new release (/health stage)",
                        outcome="controller gone")
        if not any("host reverts to" in ln for ln in seen):
            r.detail = "the deploy never armed: " + "".join(seen)[-300:]
        r.time_to_serving_s = self.wait_serving(t0, CONFIRM_TIMEOUT_S + 90, release=good)
        reverts = [a for a in self.audit() if a.get("who") == "host timer"]
        if reverts:
            r.outcome = f"{reverts[-1].get('result')}: {reverts[-1].get('detail', '')[:90]}"
        r.extra["confirm_timeout_s"] = CONFIRM_TIMEOUT_S
        return self.finish(r, before, expect=good)

    def hung_engine(self) -> FaultResult:
        """The engine stops answering (SIGSTOP) after a healthy deploy: the host watchdog restarts it."""
        good = self.healthy_baseline()
        # the watchdog leaves a young engine alone for its load budget
        time.sleep(HEALTH["load_timeout_s"] + 1)
        before = self.snapshot()
        self.exec(f"docker kill --signal STOP {CONTAINER}", check=True)
        t0 = time.monotonic()
        r = FaultResult("hung engine (SIGSTOP)", "after a healthy deploy", outcome="no restart seen")
        # wait until it stopped answering, then until it answers again
        time.sleep(2)
        r.time_to_serving_s = self.wait_serving(t0, 180, release=good)
        acts = [a for a in self.audit() if a.get("action") == "watchdog-restart"]
        if acts:
            r.outcome = f"watchdog {acts[-1].get('result')}: {acts[-1].get('detail', '')[:80]}"
        return self.finish(r, before, expect=good)

    def frozen_engine_loop(self, health: Callable[[], str] | None = None) -> FaultResult:
        """llama-server's main loop stops (its thread held, ``freeze_thread``) while its HTTP threads
        still answer /health 200: only a judgement by work done sees it. The host watchdog restarts it,
        and the service's health (``health``: ``invoke status``'s, else the judgement read on the host)
        says hung in between."""
        good = self.healthy_baseline()
        time.sleep(HEALTH["load_timeout_s"] + 1)  # the watchdog leaves a young engine alone
        before = self.snapshot()
        pid = int(self.exec(f"docker inspect -f '{{{{.State.Pid}}}}' {CONTAINER}", check=True).stdout.strip())
        started = self.engine_started()
        freeze_thread(self.container, pid, seconds=300)
        t0 = time.monotonic()
        r = FaultResult("engine loop frozen (/health still 200)", "after a healthy deploy", outcome="no restart seen")
        # /health answers from an HTTP thread: asked a few times, as one answer can be slow on a busy machine
        r.extra["health_while_frozen"] = False
        for _ in range(4):
            if self.answers():
                r.extra["health_while_frozen"] = True
                break
            time.sleep(1)
        r.extra.update(watch_until_restarted(self, started, t0, timeout=240, health=health))
        r.time_to_serving_s = self.wait_serving(t0, 180, release=good)
        acts = [a for a in self.audit() if a.get("action") == "watchdog-restart"]
        if acts:
            r.outcome = f"watchdog {acts[-1].get('result')}: {acts[-1].get('detail', '')}"
        return self.finish(r, before, expect=good)

    def two_controllers(self) -> FaultResult:
        """Two deploys of the same host at once: exactly one proceeds, the other is refused."""
        good = self.healthy_baseline()
        before = self.snapshot()
        results: list[Any] = []
        barrier = threading.Barrier(2)

        def one(ctx: int) -> None:
            barrier.wait()
            results.append(self.deploy(context=ctx))

        t0 = time.monotonic()
        threads = [threading.Thread(target=one, args=(c,)) for c in (384, 448)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        kinds = sorted(o.result for o in results)
        r = FaultResult("two controllers at once", "lock", outcome=" + ".join(kinds))
        r.extra["results"] = kinds
        r.time_to_serving_s = self.wait_serving(t0, 60)
        ok = kinds == ["deployed", "refused"] and any("deploy lock" in o.reason for o in results)
        res = self.finish(r, before, expect=None)
        res.ok = res.ok and ok
        res.detail = "" if ok else "; ".join(o.reason[:120] for o in results)
        res.extra["before"] = good
        return res

    def registry_unreachable(self) -> FaultResult:
        """The image of the new release cannot be pulled (the registry's name does not resolve)."""
        good = self.healthy_baseline()
        before = self.snapshot()
        # a new image for the host: remove the -next image if an earlier run pulled it
        self.exec("docker image rm -f $(docker image ls -q --filter reference='*/lab/*next*') >/dev/null 2>&1; "
                  "cp /etc/hosts /tmp/hosts.fault && echo '127.0.0.9 lab-registry' >> /etc/hosts", check=True)
        t0 = time.monotonic()
        try:
            o = self.deploy(image="llamacpp:lab-cpu-next")
        finally:
            self.exec("cat /tmp/hosts.fault > /etc/hosts", check=True)
        r = FaultResult("image pull failure (registry unreachable)", "pull", outcome=f"{o.result}: {o.reason[:100]}")
        r.time_to_serving_s = self.wait_serving(t0, 30, release=good)
        res = self.finish(r, before, expect=good)
        res.ok = res.ok and o.result == "failed" and "nothing was changed" in o.reason
        return res

    def unknown_digest(self) -> FaultResult:
        """The image named by a digest the registry does not have (a lock edited by hand)."""
        good = self.healthy_baseline()
        before = self.snapshot()
        ref = "lab-registry:5000/lab/llama-server@sha256:" + "0" * 64
        t0 = time.monotonic()
        try:
            o = self.deploy(image=ref)
            outcome = f"{o.result}: {o.reason[:100]}"
            refused = o.result in {"failed", "refused"}
        except Exception as exc:  # noqa: BLE001 - a usage error before any contact is a refusal too
            outcome, refused = f"usage error: {str(exc)[:100]}", True
        r = FaultResult("digest unknown to the registry", "pull (by digest)", outcome=outcome)
        r.time_to_serving_s = self.wait_serving(t0, 30, release=good)
        res = self.finish(r, before, expect=good)
        res.ok = res.ok and refused
        return res

    def port_taken(self) -> FaultResult:
        """A stranger process listens on the port a changed service wants: the preflight refuses."""
        good = self.healthy_baseline()
        before = self.snapshot()
        self.exec("nohup python3 -m http.server 8011 --bind 127.0.0.1 >/dev/null 2>&1 & echo $! > /tmp/stranger.pid",
                  check=True)
        time.sleep(1.5)
        t0 = time.monotonic()
        try:
            o = self.deploy(port=8011)
        finally:
            self.exec("kill $(cat /tmp/stranger.pid) 2>/dev/null; rm -f /tmp/stranger.pid")
        r = FaultResult("port taken by a stranger process", "preflight", outcome=f"{o.result}: {o.reason[:100]}")
        r.time_to_serving_s = self.wait_serving(t0, 30, release=good)
        res = self.finish(r, before, expect=good)
        res.ok = res.ok and o.result == "refused" and "port" in o.reason
        return res

    def model_missing(self) -> FaultResult:
        """The model file a changed service names is not on the host: the preflight refuses."""
        good = self.healthy_baseline()
        before = self.snapshot()
        t0 = time.monotonic()
        o = self.deploy(model_path="/srv/models/absent/model.gguf")
        r = FaultResult("model file missing", "preflight", outcome=f"{o.result}: {o.reason[:100]}")
        r.time_to_serving_s = self.wait_serving(t0, 30, release=good)
        res = self.finish(r, before, expect=good)
        res.ok = res.ok and o.result == "refused" and "model-files" in o.reason
        return res

    def model_truncated(self) -> FaultResult:
        """The model file is cut in half: the engine cannot load it, the deploy goes back."""
        good = self.healthy_baseline()
        before = self.snapshot()
        src = "/srv/models/tiny-qwen2-gguf/tiny-qwen2.gguf"
        dst = "/srv/models/truncated/tiny-qwen2.gguf"
        self.exec(f"mkdir -p /srv/models/truncated && head -c $(( $(stat -c %s {src}) / 2 )) {src} > {dst} "
                  f"&& chmod -R a+rX /srv/models/truncated", check=True)
        t0 = time.monotonic()
        o = self.deploy(model_path=dst)
        r = FaultResult("model file truncated", "engine load (health check)", outcome=f"{o.result}: {o.reason[:100]}")
        r.time_to_serving_s = self.wait_serving(t0, 60, release=good)
        res = self.finish(r, before, expect=good)
        res.ok = res.ok and o.result == "rolled_back"
        return res

    def crash_loop(self) -> FaultResult:
        """The engine exits at once on every start (a flag it rejects): the deploy goes back."""
        good = self.healthy_baseline()
        before = self.snapshot()
        t0 = time.monotonic()
        o = self.deploy(engine_args=["--no-such-flag-llmfleet"])
        r = FaultResult("engine crash loop", "engine start (health check)", outcome=f"{o.result}: {o.reason[:100]}")
        r.time_to_serving_s = self.wait_serving(t0, 60, release=good)
        res = self.finish(r, before, expect=good)
        res.ok = res.ok and o.result == "rolled_back"
        return res

    def hostile_values(self) -> FaultResult:
        """Shell and compose metacharacters in the served name and the environment: deployed as
        literal text, nothing executed on the host."""
        self.healthy_baseline()
        before = self.snapshot()
        self.exec("rm -f /tmp/llmfleet-pwned*")
        hostile = "a$(touch /tmp/llmfleet-pwned1)`touch /tmp/llmfleet-pwned2`;touch /tmp/llmfleet-pwned3 ${HOME}'\""
        t0 = time.monotonic()
        o = self.deploy(served_name=hostile, env={"LLMFLEET_NOTE": hostile})
        ran = self.exec("ls /tmp/llmfleet-pwned* 2>/dev/null").stdout.split()
        local = list(Path("/tmp").glob("llmfleet-pwned*"))
        r = FaultResult("hostile values (served name, env)", "render, compose, health",
                        outcome=f"{o.result}; commands run from them: {len(ran) + len(local)}")
        r.time_to_serving_s = self.wait_serving(t0, 60)
        res = self.finish(r, before, expect=None)
        res.ok = res.ok and not ran and not local and o.result == "deployed"
        return res

    # -- SSH cut at a named step ------------------------------------------------------------------

    def drop_ssh(self) -> None:
        """The host stops answering on its SSH port, silently (no reset): a dropped VPN, a laptop asleep."""
        self.exec("iptables -I INPUT -p tcp --dport 22 -j DROP && iptables -I OUTPUT -p tcp --sport 22 -j DROP",
                  check=True)

    def restore_ssh(self) -> None:
        self.exec("while iptables -D INPUT -p tcp --dport 22 -j DROP 2>/dev/null; do :; done; "
                  "while iptables -D OUTPUT -p tcp --sport 22 -j DROP 2>/dev/null; do :; done")

    def engine_started(self) -> str:
        return self.exec(f"docker inspect --format '{{{{.State.StartedAt}}}}' {CONTAINER} 2>/dev/null").stdout.strip()

    def inflight(self) -> bool:
        """An arm, switch or confirm script of a deploy still runs on the host."""
        return self.exec("pgrep -f '[@]@(armed|switched|too-late)' >/dev/null").returncode == 0

    def pending(self) -> bool:
        """A switch awaits its confirmation, or the host timer is reverting it right now."""
        sdir = f"{ROOT}/services/{SERVICE}"
        return self.exec(f"test -e {sdir}/.confirm-pending -o -e {sdir}/.confirm-taken || "
                         f"systemctl is-active --quiet llmfleet-{SERVICE}-revert.service").returncode == 0

    def spawn_controller(self, overrides: dict[str, Any], cut: str) -> subprocess.Popen:
        """A controller in a child process that stops dead at step ``cut`` (``cut_controller_main``)."""
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        code = "from llmfleet.lab.faults import cut_controller_main; cut_controller_main()"
        return subprocess.Popen([sys.executable, "-c", code, self.inventory_path, self.host, json.dumps(self.config),
                                 json.dumps(overrides), cut], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)

    def read_until(self, proc: subprocess.Popen, marker: str, timeout: float) -> tuple[bool, list[str]]:
        """The child's lines until one starts with ``marker`` (True), it exits, or ``timeout`` passes."""
        assert proc.stdout is not None
        lines: list[str] = []
        found = threading.Event()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if line.startswith(marker):
                    found.set()
                    return

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        t.join(timeout)
        self.lines.extend(lines)
        return found.is_set(), lines

    def ssh_cut(self, step: str) -> FaultResult:
        """The controller is killed and the host's SSH port dropped at ``step`` of a deploy of a new,
        healthy release (CUT_STEPS): the host ends on the old release (the host timer reverts what was
        switched) or, when the confirmation got through, on the new one; the next deploy takes the
        stale lock over and converges."""
        at, expect = CUT_STEPS[step]
        good = self.healthy_baseline()
        time.sleep(1)
        before = self.snapshot()
        started = self.engine_started()
        r = FaultResult(f"SSH cut: {step}", at, outcome="step never reached")
        proc = self.spawn_controller(self.overrides(env={"LLMFLEET_FAULT": f"{step}-{os.urandom(3).hex()}"}), step)
        t0 = time.monotonic()
        try:
            reached, lines = self.read_until(proc, CUT_MARK, timeout=240)
            if not reached:
                r.detail = " | ".join(lines[-4:])[-400:]
                proc.kill()
                return self.finish(r, before, expect=good)
            self.drop_ssh()
            proc.kill()
            proc.wait(timeout=30)
            if step == "upload":
                # the session dies with the link (sshd's keepalive, minutes later in real life): its
                # half-read tar ends, and with it the round trip's later steps (arm, switch), unrun
                self.exec("pkill -f 'sshd: [^ ]*@notty' ; pkill -f '[@]@uploaded' ; true")
            t0 = time.monotonic()
            # the step's command, sent before the cut, runs to its end on the host (not the upload:
            # its tar waits for the rest of the release until the session dies)
            deadline = t0 + 120
            while self.inflight() and time.monotonic() < deadline:
                time.sleep(0.5)
            # the outcome: the expected release serves and nothing awaits confirmation any more
            deadline = t0 + CONFIRM_TIMEOUT_S + 150
            new = None
            while time.monotonic() < deadline:
                got = self.serving()
                if got and not self.pending():
                    if (expect == "old" and got == good) or (expect == "new" and got != good):
                        r.time_to_serving_s = round(time.monotonic() - t0, 1)
                        new = got
                        break
                time.sleep(1)
            r.serving = new
        finally:
            self.restore_ssh()
        timer = [a for a in self.audit()[len(before["audit"]):] if a.get("who") == "host timer"]
        if timer:
            r.outcome = f"host timer: {timer[-1].get('result')}"
        elif expect == "new" and r.serving:
            r.outcome = "confirmed before the cut (new release serving)"
        elif r.serving:
            r.outcome = "nothing switched (old release serving throughout)"
        r.extra["expected"] = expect
        r.extra["settled_s"] = r.time_to_serving_s  # serving, and no revert pending any more
        untouched = self.engine_started() == started
        if step in NO_RESTART_STEPS and untouched and r.serving:
            r.time_to_serving_s = 0.0  # the old engine served throughout (never restarted)
            r.outcome += f"; settled after {r.extra['settled_s']} s"
        res = self.finish(r, before, expect=good if expect == "old" else None)
        if res.ok and step in NO_RESTART_STEPS and not untouched:
            res.ok = False
            res.detail = "the serving engine was restarted although nothing was switched"
        return res

    def killed_after_switch_then_failed(self) -> FaultResult:
        """A deploy killed right after its switch (its release current, never confirmed, its host timer
        still pending), then at once a deploy whose engine crashes: that deploy's host-side revert is
        armed to, and its failure goes back to, the last release confirmed healthy, not the unconfirmed
        one the killed deploy left current."""
        good = self.healthy_baseline()
        before = self.snapshot()
        r = FaultResult("deploy killed after its switch, then a failed deploy", "restart (killed), then the "
                        "next deploy's health check", outcome="the first deploy never reached its switch")
        proc = self.spawn_controller(self.overrides(env={"LLMFLEET_FAULT": f"killed-{os.urandom(3).hex()}"}), "restart")
        reached, lines = self.read_until(proc, CUT_MARK, timeout=240)
        proc.kill()
        proc.wait(timeout=30)
        if not reached:
            r.detail = " | ".join(lines[-4:])[-400:]
            return self.finish(r, before, expect=good)
        st = self.state()
        unconfirmed = st.current
        r.extra["unconfirmed"] = unconfirmed
        r.extra["unconfirmed_health"] = st.releases[unconfirmed].health if unconfirmed in st.releases else "gone"
        said: list[str] = []
        t0 = time.monotonic()
        o = self.deploy(log=said.append, engine_args=["--no-such-flag-llmfleet"])
        # the head and the end of the reason: the end says where the deploy went back and how that went
        r.outcome = f"{o.result}: {o.reason[:100]}" + (f" ... {o.reason[-300:]}" if len(o.reason) > 100 else "")
        r.time_to_serving_s = self.wait_serving(t0, 60, release=good)
        r.extra["armed"] = [ln for ln in said if "host reverts to" in ln]
        r.extra["went_back_to"] = o.services[SERVICE].current if SERVICE in o.services else None
        st = self.state()
        r.extra["unconfirmed_after"] = st.releases[unconfirmed].health if unconfirmed in st.releases else "gone"
        r.extra["timer_reverts"] = [a for a in self.audit()[len(before["audit"]):] if a.get("who") == "host timer"]
        res = self.finish(r, before, expect=good)
        res.ok = (res.ok and o.result == "rolled_back" and unconfirmed not in (None, good)
                  and r.extra["went_back_to"] == good and bool(r.extra["armed"])
                  and all(f"host reverts to {good} " in ln for ln in r.extra["armed"]))
        return res

    # -- the host's own daemons restarted mid-deploy ------------------------------------------------

    def _restart_mid_deploy(self, name: str, at_line: str, at: str, command: str) -> FaultResult:
        good = self.healthy_baseline()
        before = self.snapshot()
        fired = threading.Event()

        def on_line(line: str) -> bool:
            if not fired.is_set() and at_line in line:
                fired.set()  # the deploy goes on while the daemon restarts
                threading.Thread(target=self.exec, args=(command,), kwargs={"timeout": 120}, daemon=True).start()
                return True
            return False

        t0 = time.monotonic()
        t, box = self.deploy_in_thread(on_line, env={"LLMFLEET_FAULT": f"{name}-{os.urandom(3).hex()}"})
        t.join(timeout=400)
        o = box[0] if box else None
        if isinstance(o, Exception) or o is None:
            r = FaultResult(name, at, outcome=f"deploy raised: {o}"[:200])
        else:
            r = FaultResult(name, at, outcome=f"{o.result}: {o.reason[:110]}")
        if not fired.is_set():
            r.detail = f"the deploy never logged {at_line!r}"
        r.time_to_serving_s = self.wait_serving(t0, 120)
        res = self.finish(r, before, expect=None)
        res.ok = res.ok and fired.is_set() and not isinstance(o, Exception) and o is not None \
            and o.result in {"deployed", "rolled_back"}
        res.extra["before"] = good
        return res

    def sshd_restarted(self) -> FaultResult:
        """sshd restarts on the host right after the upload: the open connection carries on."""
        return self._restart_mid_deploy("sshd restarted mid-deploy", "uploaded release",
                                        "after the upload (before arm, switch, health check, confirm)",
                                        "systemctl restart ssh")

    def dockerd_restarted(self) -> FaultResult:
        """dockerd restarts on the host while the new release is health-checked: every container
        stops; the unit (Requires=docker.service) restarts with it."""
        return self._restart_mid_deploy("dockerd restarted mid-deploy", "health check of release",
                                        "health check of the new release", "systemctl restart docker")

    # -- engine crash loop after a healthy deploy -------------------------------------------------

    def crash_loop_after_deploy(self) -> FaultResult:
        """After a healthy deploy the engine dies and cannot start again (its model file vanished):
        systemd restarts it until its start limit, the watchdog records the failed unit once, status
        shows the restarts; with the file back, the next deploy restarts and checks it."""
        good = self.healthy_baseline()
        time.sleep(HEALTH["load_timeout_s"] + 1)
        before = self.snapshot()
        model = "/srv/models/tiny-qwen2-gguf/tiny-qwen2.gguf"
        r = FaultResult("engine crash loop after a healthy deploy", "engine killed, model file gone",
                        outcome="no start limit seen")
        self.exec(f"mv {model} {model}.away && docker kill {CONTAINER}", check=True)
        t0 = time.monotonic()
        try:
            deadline = t0 + 240
            while time.monotonic() < deadline:
                if self.exec(f"systemctl is-active {UNIT}").stdout.strip() == "failed" and any(
                        a.get("action") == "unit-failed" for a in self.audit()[len(before["audit"]):]):
                    break
                time.sleep(3)
            sup = watchdog_status(self)
            r.extra["status"] = sup
            fails = [a for a in self.audit()[len(before["audit"]):] if a.get("action") == "unit-failed"]
            unit = self.exec(f"systemctl is-active {UNIT}").stdout.strip()
            if fails:
                r.outcome = (f"unit {unit} after {sup.get('unit_restarts')} restarts (start limit); watchdog: "
                             f"{fails[-1].get('result')}; status last action: "
                             f"{(sup.get('last_watchdog_action') or {}).get('result', '-')}")
            r.extra["limit_s"] = round(time.monotonic() - t0, 1)
        finally:
            self.exec(f"mv {model}.away {model}")
        # the file is back: the host does not restart a failed unit by itself; a deploy does
        t1 = time.monotonic()
        o = self.deploy()
        r.extra["repair_deploy"] = f"{o.result}: {o.reason[:100]}"
        r.time_to_serving_s = self.wait_serving(t1, 60, release=good)
        r.injected_at = "engine killed, model file gone (repaired, then one deploy)"
        res = self.finish(r, before, expect=good)
        unit_restarts = int((r.extra["status"] or {}).get("unit_restarts") or 0)
        res.ok = res.ok and bool(fails) and unit_restarts >= 1 and o.result == "deployed"
        if not res.ok and not res.detail:
            res.detail = f"status {r.extra['status']}; repair {r.extra['repair_deploy']}"
        return res

    # -- disk full ------------------------------------------------------------------------------

    def disk_full(self) -> FaultResult:
        """The llmfleet root is a small tmpfs filled to a few KiB: the upload fails with a clear
        error, nothing is switched, the old release serves, and with space back the next deploy
        converges. The root is put back on the host's disk afterwards."""
        good = self.healthy_baseline()
        stage = "/var/tmp/llmfleet-root-stage"
        self.exec(f"rm -rf {stage} && cp -a {ROOT} {stage} && mount -t tmpfs -o size=8m,mode=0755 llmfleet-root "
                  f"{ROOT} && cp -a {stage}/. {ROOT}/ && rm -rf {stage}", check=True)
        r = FaultResult("disk full on the llmfleet root", "upload (tmpfs root filled)", outcome="-")
        try:
            before = self.snapshot()
            # leave two pages: the lock's holder file fits, the release's files do not
            self.exec(f"avail=$(df -B1 --output=avail {ROOT} | tail -1); "
                      f"fallocate -l $((avail - 8192)) {ROOT}/.filler", check=True)
            t0 = time.monotonic()
            o = self.deploy(env={"LLMFLEET_FAULT": f"disk-{os.urandom(3).hex()}"})
            r.extra["reason"] = o.reason
            said = "No space left on device" if "No space left on device" in o.reason else o.reason[:100]
            r.outcome = f"{o.result}: upload: {said}" + ("; nothing was switched" * ("nothing was switched" in o.reason))
            half = self.exec(f"ls -a {ROOT}/services/{SERVICE}/releases | grep -c '^\\.tmp-' || true").stdout.strip()
            r.extra["left_tmp"] = half
            self.exec(f"rm -f {ROOT}/.filler", check=True)
            r.time_to_serving_s = self.wait_serving(t0, 30, release=good)
            res = self.finish(r, before, expect=good)
            res.ok = (res.ok and o.result == "failed" and "No space left" in o.reason
                      and "nothing was switched" in o.reason and half == "0")
            if half != "0":
                res.detail = f"{half} half-written release folder(s) left"
        finally:
            self.exec(f"rm -f {ROOT}/.filler; rm -rf {stage} && cp -a {ROOT} {stage} && umount -l {ROOT} && "
                      f"rm -rf {ROOT}/* && cp -a {stage}/. {ROOT}/ && rm -rf {stage}")
        return res

    # -- hostile inventory values -----------------------------------------------------------------

    def ssh_sessions(self) -> int:
        out = self.exec("journalctl --no-pager -o cat _COMM=sshd 2>/dev/null | grep -ac 'Accepted publickey' || true")
        return int(out.stdout.strip() or 0)

    def hostile_inventory(self) -> FaultResult:
        """Very long strings, a YAML alias bomb, ``../`` and newlines in names and keys, each in a copy
        of the inventory: every deploy is refused in one line naming the file and the field, before
        any connection (no SSH session, so no command and no file on the host); the alias bomb is
        refused in bounded time and memory."""
        import shutil
        import tempfile

        good = self.healthy_baseline()
        before = self.snapshot()
        sessions = self.ssh_sessions()
        base = dict(yaml.safe_load((Path(self.inventory_path) / "group_vars" / "all.yml").read_text())
                    ["llmfleet_services"][0])
        bomb = "lol0: &a [" + ",".join(['"lol"'] * 9) + "]\n" + "".join(
            f"lol{i}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n"
            for i, (p, c) in enumerate(zip("abcdefgh", "bcdefghi", strict=True), start=1))
        cases: dict[str, tuple[dict[str, Any], str | None, str]] = {
            "served_name 100,000 characters": ({"served_name": "x" * 100_000}, None, "served_name"),
            "env value 1 MB": ({"env": {"NOTE": "y" * 1_000_000}}, None, "env.NOTE"),
            "model_path 5,000 characters": ({"model_path": "/srv/" + "m" * 5000}, None, "model_path"),
            "engine_args 10,000 items": ({"engine_args": ["--x"] * 10_000}, None, "engine_args"),
            "name with ../": ({"name": "../../etc"}, None, "name"),
            "env key with a newline and $()": ({"env": {"A\n$(touch /tmp/llmfleet-pwned-inv)": "1"}}, None, "env"),
            "YAML alias bomb (9^9 values)": ({}, bomb, "lol"),
            "alias bomb as engine_args": ({}, bomb + "llmfleet_services:\n" + yaml.safe_dump(
                [{k: v for k, v in base.items() if k != "engine_args"}]) + "  engine_args: *i\n", "lol"),
        }
        rows, bad = [], []
        t0 = time.monotonic()
        for label, (svc_over, raw, fld) in cases.items():
            with tempfile.TemporaryDirectory() as tmp:
                inv = Path(tmp) / "inv"
                shutil.copytree(self.inventory_path, inv)
                hv = inv / "host_vars" / f"{self.host}.yml"
                data = yaml.safe_load(hv.read_text()) or {}
                if svc_over:
                    data["llmfleet_services"] = [dict(base, **svc_over)]
                else:
                    data.pop("llmfleet_services", None)
                hv.write_text(yaml.safe_dump(data, width=10**9) + (raw or ""))
                got = refuse_in_child(str(inv), self.host, self.config)
            where_ok = str(hv.name) in got.get("error", "") and fld in got.get("error", "")
            one_line = "\n" not in got.get("error", "x\n") and len(got.get("error", "")) < 500
            rows.append({"case": label, "refused": got.get("kind") in {"InventoryError", "UsageError"},
                         "one_line": one_line, "names_file_and_field": where_ok, "s": got.get("s"),
                         "max_rss_mib": got.get("max_rss_mib"), "error": got.get("error", "")[:200]})
            if not (rows[-1]["refused"] and one_line and where_ok):
                bad.append(f"{label}: {got}"[:300])
        after = self.ssh_sessions()
        pwned = self.exec("ls /tmp/llmfleet-pwned* 2>/dev/null").stdout.split() + [
            str(x) for x in Path("/tmp").glob("llmfleet-pwned*")]
        slowest = max(rows, key=lambda x: x["s"] or 0)
        biggest = max(rows, key=lambda x: x["max_rss_mib"] or 0)
        r = FaultResult("hostile inventory values", "inventory load (8 cases)",
                        outcome=(f"{sum(x['refused'] and x['one_line'] and x['names_file_and_field'] for x in rows)} "
                                 f"of {len(rows)} refused in one line with file and field; SSH sessions opened: "
                                 f"{after - sessions}; slowest {slowest['s']} s, largest {biggest['max_rss_mib']} MiB"))
        r.extra["cases"] = rows
        r.time_to_serving_s = self.wait_serving(t0, 30, release=good)
        res = self.finish(r, before, expect=good)
        res.ok = res.ok and not bad and after == sessions and not pwned and all(
            (x["s"] or 99) < 20 and (x["max_rss_mib"] or 9999) < 400 for x in rows)
        if bad or pwned or after != sessions:
            res.detail = "; ".join(bad + [f"files made: {pwned}"] * bool(pwned)
                                   + [f"{after - sessions} SSH sessions"] * (after != sessions))
        return res

    # -- secrets --------------------------------------------------------------------------------

    def secrets_scan(self, local_paths: list[Path]) -> FaultResult:
        """After every other fault (each deployed with the bench's API key): the key is nowhere but the
        0600 env files. Host: every file holding it that is not mode 0600 or that is a log, audit,
        compose, manifest or unit file; the journal; the engine's Docker log; every process's argv.
        Local: every line the controllers printed, the local audit log, a ``--diff`` with a changed
        key, and every command sent over SSH during the suite."""
        self.healthy_baseline()
        before = self.snapshot()
        t0 = time.monotonic()
        # a diff with a changed key: the change is said, neither value shown
        other = "sk-fault-other-" + os.urandom(8).hex()
        os.environ[KEY_ENV] = other
        try:
            d = self.deploy(diff=True)
        finally:
            os.environ[KEY_ENV] = self.key
        diffs = "\n".join(d.diffs.values())
        key = self.key
        r = FaultResult("secrets scan (after the whole suite)", "every deploy of the suite carried the key",
                        outcome="")
        r.time_to_serving_s = self.wait_serving(t0, 30)
        # The key reaches the scan through the environment of `docker exec`, never its argv.
        scan = subprocess.run(["docker", "exec", "-e", f"K={key}", self.container, "sh", "-c", SCAN],
                              capture_output=True, text=True, timeout=300).stdout
        found, runtime = [], []
        for ln in scan.splitlines():
            parts = ln.split()
            if ln.startswith("FILE ") and len(parts) >= 4:
                mode, others, path = parts[1], parts[2], parts[3]
                named = any(w in path for w in ("audit", "compose", ".log", "journal", "manifest", ".service"))
                if mode == "600" and others == "private" and not named:
                    continue  # the 0600 env files
                if others == "private" and path.startswith(RUNTIME_STATE) and not named:
                    # the container's environment as Docker and containerd keep it, in root-only folders
                    runtime.append(f"{path} (mode {mode})")
                    continue
                found.append(f"{path} (mode {mode}, {others})")
            elif ln.startswith(("JOURNAL ", "DOCKERLOG ")) and parts[-1] != "0":
                found.append(f"{parts[0].lower()}: {parts[-1]} lines")
            elif ln.startswith("ARGV "):
                found.append(f"argv of {parts[1]}")
        for p in local_paths:
            if p.exists() and key in p.read_text(errors="replace"):
                found.append(f"local {p}")
        if any(key in ln or other in ln for ln in self.lines):
            found.append("local controller output")
        if key in diffs or other in diffs:
            found.append("deploy --diff")
        found += [f"SSH command: {c}" for c in self.argv_hits]
        scanned = {"host_files": scan.count("\n"), "local_lines": len(self.lines), "diff_bytes": len(diffs)}
        r.extra.update(found=found, scanned=scanned, runtime_state=runtime)
        changed = "secret values changed (masked)" in diffs
        r.outcome = (f"key found in {len(found)} place(s); diff says the secret changed: {'yes' if changed else 'NO'}; "
                     f"{len(self.lines)} local lines checked")
        r.detail = "; ".join(found) or "the key is only in the 0600 env files"
        res = self.finish(r, before, expect=None)
        res.ok = res.ok and not found and changed
        return res


def parse_audit(text: str) -> list[dict[str, Any]]:
    """A host's audit log, a record per line (a line that is not JSON kept as ``unparsed``)."""
    lines: list[dict[str, Any]] = []
    for ln in text.splitlines():
        try:
            lines.append(json.loads(ln))
        except ValueError:
            lines.append({"unparsed": ln})
    return lines


# Holds one thread of a process in ptrace-stop (PTRACE_SEIZE + PTRACE_INTERRUPT stop that thread alone;
# SIGSTOP would stop the whole process, its HTTP threads too) until the process is gone or SECONDS pass;
# the thread runs on when this exits. Run on the lab host, as root, against an engine's main thread.
FREEZE_PY = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
tid, seconds = int(sys.argv[1]), float(sys.argv[2])
for request in (0x4206, 0x4207):  # PTRACE_SEIZE, PTRACE_INTERRUPT
    if libc.ptrace(request, tid, None, None) != 0:
        sys.exit(f"ptrace {request:#x} {tid}: {os.strerror(ctypes.get_errno())}")
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    try:  # reap the thread's exit as its tracer (a killed tracee stays a zombie until its tracer waits)
        pid, status = os.waitpid(tid, os.WNOHANG | 0x40000000)  # __WALL
    except ChildProcessError:
        break
    if pid == tid and (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
        break
    time.sleep(0.2)
"""


def freeze_thread(container: str, tid: int, *, seconds: int) -> None:
    """Hold thread ``tid`` (a PID on the lab host) stopped for at most ``seconds``, in the background."""
    subprocess.run(["docker", "exec", "-d", container, "python3", "-c", FREEZE_PY, str(int(tid)), str(int(seconds))],
                   check=True, capture_output=True, timeout=60)


def judged_health(bench: Any, service: str = SERVICE, interval_s: int = WATCHDOG["interval_s"]) -> str:
    """The health ``invoke status`` gives a service from the watchdog's fresh judgement (``hung``,
    ``down``), read on the host; ``-`` when the judgement says nothing against it."""
    from llmfleet.health import watchdog

    sup = watchdog.parse_status(bench.exec(watchdog.status_script(ROOT)).stdout).get(service)
    stuck = sup.stuck(interval_s) if sup else None
    return stuck.verdict if stuck else "-"


def watch_until_restarted(bench: Any, started: str, t0: float, *, timeout: float, service: str = SERVICE,
                          health: Callable[[], str] | None = None) -> dict[str, Any]:
    """Poll the service's health (``health``: e.g. a row of ``invoke status``; default
    ``judged_health``) until the engine's container was started again (the watchdog's restart) or
    ``timeout``: the health values seen meanwhile, when it first said hung and when the restart came
    (the stop waits out the engine's stop grace: a hung engine does not exit on SIGTERM). ``bench``: anything
    with ``exec(script)`` on the host."""
    ask = health or (lambda: judged_health(bench, service))
    health_seen: list[str] = []
    restarted_after = hung_after = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = ask()
        if not health_seen or health_seen[-1] != now:
            health_seen.append(now)
        if now == "hung" and hung_after is None:
            hung_after = round(time.monotonic() - t0, 1)
        now_started = bench.exec(f"docker inspect --format '{{{{.State.StartedAt}}}}' llmfleet-{service} 2>/dev/null"
                                 ).stdout.strip()
        if now_started and now_started != started:
            restarted_after = round(time.monotonic() - t0, 1)
            break
        time.sleep(0.5)
    return {"health_seen": health_seen, "hung_after_s": hung_after, "restarted_after_s": restarted_after}


def watchdog_status(bench: FaultBench) -> dict[str, Any]:
    from llmfleet.health import watchdog

    sup = watchdog.parse_status(bench.exec(watchdog.status_script(ROOT)).stdout).get(SERVICE)
    return sup.to_dict() if sup else {}


def refuse_in_child(inventory: str, host: str, config: dict[str, Any]) -> dict[str, Any]:
    """Deploy from a child process; what it raised, how long it took and its peak memory (MiB)."""
    code = (
        "import json, resource, sys, time\n"
        "t0 = time.monotonic()\n"
        "from llmfleet.release.deploy import DeployOptions, deploy_host\n"
        "t1 = time.monotonic()\n"
        "out = {}\n"
        "try:\n"
        "    o = deploy_host(sys.argv[1], sys.argv[2], config=json.loads(sys.argv[3]),\n"
        "                    options=DeployOptions(overrides={}, who='faults-hostile'), log=lambda l: None)\n"
        "    out = {'kind': 'none', 'error': f'{o.result}: {o.reason}'}\n"
        "except Exception as exc:\n"
        "    out = {'kind': type(exc).__name__, 'error': str(exc)}\n"
        "out['s'] = round(time.monotonic() - t1, 2)\n"
        "out['max_rss_mib'] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    try:
        proc = subprocess.run([sys.executable, "-c", code, inventory, host, json.dumps(config)], capture_output=True,
                              text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        return {"kind": "timeout", "error": "did not finish within 120 s", "s": 120}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"kind": f"exit {proc.returncode}", "error": (proc.stderr or proc.stdout)[-300:], "s": None}


# ---------------------------------------------------------------------------------------------
# The controller that stops dead at a step (a child process of FaultBench.ssh_cut)

CUT_MARK = "@@CUT "
# step: (where the deploy is when the link goes, which release serves afterwards)
CUT_STEPS: dict[str, tuple[str, str]] = {
    "upload": ("upload (half the release sent)", "old"),
    "switch": ("switch (upload, arm, switch and restart sent in one round trip; the answer lost)", "old"),
    "restart": ("restart (switched and restarted; before the first probe)", "old"),
    "health-unit": ("health check: unit stage", "old"),
    "health-container": ("health check: container stage", "old"),
    "health-health": ("health check: /health stage", "old"),
    "health-models": ("health check: /v1/models stage", "old"),
    "health-completion": ("health check: completion stage", "old"),
    "confirm-unsent": ("confirm (healthy; the confirmation never sent)", "old"),
    "confirm": ("confirm (sent; the answer lost)", "new"),
}
NO_RESTART_STEPS = ("upload", "arm")  # nothing was switched: the serving engine must not restart
# A deploy sends the upload, the arm of the host timer, the switch and the wait for the container in one
# round trip (``store.chain_script``), so "armed but never switched" is no cut point of a deploy any
# more; the revert script's answer to it ("unchanged", no restart) is checked in tests/test_confirm.py.


def _step_of(command: Any, stdin: bytes | None) -> str | None:
    text = command if isinstance(command, str) else " ".join(command)
    if "@@step 0" in text and "@@switched" in text:
        return "release"  # the chained round trip: upload, arm, switch, container wait
    if stdin is not None and "@@uploaded" in text:
        return "upload"
    if "@@armed" in text:  # before "switch": the arm script carries the revert script, which switches
        return "arm"
    if "@@switched" in text:
        return "switch"
    if "@@confirmed" in text and "@@too-late" in text:
        return "confirm"
    return None


def install_cut(step: str, key: str | None = None) -> None:
    """Make this process stop dead at ``step``: print ``@@CUT <step>`` and sleep until killed.

    The remote command of the step is sent first where the step says so (its answer is then never
    read), so the host carries on with it while the link is down. Test machinery of the fault bench,
    installed only in its child process; ``key``: report any SSH command that carries it."""
    import paramiko

    from llmfleet.health import check as health
    from llmfleet.host import ssh

    if step not in CUT_STEPS:
        raise SystemExit(f"unknown step {step!r}; known: {', '.join(CUT_STEPS)}")
    local = threading.local()

    def stop_here() -> None:
        print(CUT_MARK + step, flush=True)
        time.sleep(3600)  # the bench drops the SSH port, then kills this process
        os._exit(3)

    orig_run = ssh.Remote._run

    def run(self: Any, command: Any, **kw: Any) -> Any:
        text = command if isinstance(command, str) else " ".join(command)
        if key and key in text:
            print(f"@@KEY-IN-ARGV {text[:80]!r}", flush=True)
        kind = _step_of(command, kw.get("stdin"))
        when = {("upload", "release"): "mid-stdin", ("switch", "release"): "after-stdin",
                ("restart", "release"): "after-return", ("upload", "upload"): "mid-stdin", ("arm", "arm"): "after-exec", ("switch", "switch"): "after-exec",
                ("restart", "switch"): "after-return", ("confirm-unsent", "confirm"): "before",
                ("confirm", "confirm"): "after-exec"}.get((step, kind or ""))
        if when == "before":
            stop_here()
        local.when = when
        try:
            res = orig_run(self, command, **kw)
        finally:
            local.when = None
        if when == "after-return":
            stop_here()
        return res

    orig_exec = paramiko.Channel.exec_command
    orig_sendall = paramiko.Channel.sendall

    def exec_command(chan: Any, command: Any) -> None:
        orig_exec(chan, command)
        if getattr(local, "when", None) == "after-exec":
            stop_here()

    def sendall(chan: Any, data: Any) -> None:
        if getattr(local, "when", None) == "mid-stdin" and len(data) > 1:
            orig_sendall(chan, data[: len(data) // 2])
            stop_here()
        orig_sendall(chan, data)

    orig_shutdown_write = paramiko.Channel.shutdown_write

    def shutdown_write(chan: Any) -> None:
        orig_shutdown_write(chan)
        if getattr(local, "when", None) == "after-stdin":  # the whole release sent with the round trip
            stop_here()

    # the fault is injected by patching the transport's methods for this one deploy
    setattr(ssh.Remote, "_run", run)  # noqa: B010
    setattr(paramiko.Channel, "exec_command", exec_command)  # noqa: B010
    setattr(paramiko.Channel, "shutdown_write", shutdown_write)  # noqa: B010
    setattr(paramiko.Channel, "sendall", sendall)  # noqa: B010
    if step.startswith("health-"):
        stage = "_" + step.split("-", 1)[1]

        def at_stage(self: Any, *a: Any, **k: Any) -> Any:
            stop_here()

        setattr(health.HealthChecker, stage, at_stage)


def cut_controller_main(argv: list[str] | None = None) -> None:
    """``python -c 'from llmfleet.lab.faults import cut_controller_main; cut_controller_main()' INVENTORY
    HOST CONFIG_JSON OVERRIDES_JSON STEP``: a deploy that stops dead at STEP."""
    from llmfleet.release.deploy import deploy_host
    from llmfleet.release.prepare import DeployOptions

    inventory, host, config, overrides, step = (argv or sys.argv[1:])[:5]
    install_cut(step, os.environ.get(KEY_ENV))
    o = deploy_host(inventory, host, config=json.loads(config),
                    options=DeployOptions(overrides=json.loads(overrides), who="faults-cut"),
                    log=lambda line: print(line, flush=True))
    print("RESULT", o.result, o.reason, flush=True)


_watched: list[tuple[str, list[str]]] = []


def watch_argv(key: str) -> list[str]:
    """Every command this process sends over SSH from now on is checked for ``key``; the commands
    that carry it are appended to the list returned (the fault bench's argv check)."""
    from llmfleet.host import ssh

    if not getattr(ssh.Remote._run, "_fault_watch", False):
        orig = ssh.Remote._run

        def run(self: Any, command: Any, **kw: Any) -> Any:
            text = command if isinstance(command, str) else " ".join(command)
            for k, hits in _watched:
                if k in text:
                    hits.append(text[:80])
            return orig(self, command, **kw)

        run._fault_watch = True  # type: ignore[attr-defined]
        ssh.Remote._run = run  # type: ignore[method-assign]
    hits: list[str] = []
    _watched.append((key, hits))
    return hits


# Where the container runtime keeps a container's environment (root-only folders): not llmfleet's files.
RUNTIME_STATE = ("/var/lib/docker/containers/", "/run/containerd/", "/run/docker/", "/var/lib/containerd/")

# Every file holding the key (its mode, and whether a non-root user can read it), the journal, the
# engine's Docker log, and every process's argv; the scan's own shell has the key only in its environment.
SCAN = r"""
for f in $(grep -rlF "$K" /opt /etc /var/log /tmp /var/tmp /root /home /run /srv /var/lib/docker/containers 2>/dev/null); do
  if runuser -u nobody -- test -r "$f" 2>/dev/null; then o=readable-by-others; else o=private; fi
  echo "FILE $(stat -c %a "$f") $o $f"
done
echo "JOURNAL $(journalctl --no-pager 2>/dev/null | grep -acF "$K")"
for p in /proc/[0-9]*; do tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF "$K" && echo "ARGV $p"; done
echo "DOCKERLOG $(docker logs llmfleet-tiny 2>&1 | grep -acF "$K")"
true
"""

CUT_FAULTS = tuple(f"ssh_cut_{s.replace('-', '_')}" for s in CUT_STEPS)
FAULTS = ("controller_killed_mid_health", *CUT_FAULTS, "killed_after_switch_then_failed", "sshd_restarted", "dockerd_restarted", "hung_engine", "frozen_engine_loop",
          "crash_loop_after_deploy", "two_controllers", "registry_unreachable", "unknown_digest", "port_taken",
          "disk_full", "model_missing", "model_truncated", "crash_loop", "hostile_values", "hostile_inventory",
          "secrets_scan")
NOT_DONE = (
    "two controllers from two machines (both here run from one machine)",
    "stale lock from a dead controller of another machine (covered by tests/lab/test_deploy.py; the SSH cuts "
    "here leave this machine's stale lock, which the next deploy takes over)",
)


def run_fault(bench: FaultBench, name: str, local_paths: list[Path]) -> FaultResult:
    """One fault by its name in ``FAULTS``."""
    if name == "secrets_scan":
        return bench.secrets_scan(local_paths)
    if name.startswith("ssh_cut_"):
        return bench.ssh_cut(name[len("ssh_cut_"):].replace("_", "-"))
    return getattr(bench, name)()
