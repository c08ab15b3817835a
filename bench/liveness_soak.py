"""Liveness soak: healthy engines under mixed idle and load for a long time must never be restarted by
the watchdog's judgement by work done; prints what the judgement saw and what it cost.

    .venv/bin/python bench/liveness_soak.py [--minutes 30] [--vllm] [--json]

Needs `invoke lab.setup` once (`--vllm`: `invoke lab.setup --vllm` too). Brings up its own uniquely
named lab (gpu-v100-01 serving llama.cpp's ``tiny``; with ``--vllm`` also gpu-4090-01 serving vLLM's
``tiny-vllm``), with a watchdog stricter than the default (every 5 s, 3 failed judgements, a stall
window of 60 s, probes bounded by 10 s), deploys, then alternates phases until the time is up: idle,
one stream, four streams of long answers, idle, a burst of short requests. Every 5 s it reads each
host's last judgement; at the end it counts the watchdog's restarts (the audit log) and times the
watchdog script itself (wall and CPU, idle and under load). Every request loop is bounded in count and
time and talks only to the lab's hosts through SSH tunnels. SOAK_IDLE_S shortens the first idle
phase (a quick check of the script itself).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import secrets
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import yaml  # noqa: E402

from llmfleet.fleet import loadgen  # noqa: E402
from llmfleet.health import watchdog  # noqa: E402
from llmfleet.host import ssh  # noqa: E402
from llmfleet.inventory.ansible import load_inventory  # noqa: E402
from llmfleet.lab import faults as F  # noqa: E402
from llmfleet.lab import hosts, setup  # noqa: E402
from llmfleet.release import store as R  # noqa: E402
from llmfleet.release.deploy import DeployOptions, deploy_host  # noqa: E402

WATCHDOG = {"interval_s": 5, "failures": 3, "max_restarts_per_hour": 3, "probe_timeout_s": 10, "stall_window_s": 60}
# (name, seconds, concurrency, max_tokens, words): the cycle, repeated until --minutes have passed
PHASES = [("idle", int(os.environ.get("SOAK_IDLE_S", "120")), 0, 0, 0), ("one stream", 90, 1, 200, 15), ("four streams", 120, 4, 300, 15),
          ("idle", 60, 0, 0, 0), ("burst", 60, 8, 8, 10)]
# (the lab's tiny models serve a 512-token context and count about four tokens a word: prompt and answer fit)
ENGINES = {"gpu-v100-01": ("tiny", "llamacpp", {"load_timeout_s": 60, "stage_timeout_s": 60, "min_tokps": 1,
                                                 "max_tokens": 16}),
           "gpu-4090-01": ("tiny-vllm", "vllm", {"load_timeout_s": 900, "stage_timeout_s": 120, "min_tokps": 1,
                                                  "max_tokens": 16})}


class Soak:
    def __init__(self, inv: Path, lab: str, names: list[str], config: dict[str, Any]) -> None:
        self.inv, self.lab, self.names, self.config = inv, lab, names, config
        self.verdicts: dict[str, collections.Counter[str]] = {n: collections.Counter() for n in names}
        self.hung_seen: dict[str, list[str]] = {n: [] for n in names}
        self.requests: dict[str, collections.Counter[str]] = {n: collections.Counter() for n in names}
        self.errors: dict[str, list[str]] = {n: [] for n in names}
        self.stop = threading.Event()

    def exec(self, host: str, script: str, timeout: float = 60) -> str:
        return subprocess.run(["docker", "exec", f"{self.lab}-{host}", "sh", "-c", script], capture_output=True,
                              text=True, timeout=timeout).stdout

    def sample(self) -> None:
        while not self.stop.wait(5):
            for h in self.names:
                service = ENGINES[h][0]
                try:
                    out = self.exec(h, watchdog.status_script("/opt/llmfleet"))
                except subprocess.TimeoutExpired:  # a machine loaded beyond its cores: a sample lost, not the run
                    self.verdicts[h]["(not read in 60 s)"] += 1
                    continue
                sup = watchdog.parse_status(out).get(service)
                if sup and sup.judgement:
                    self.verdicts[h][sup.judgement.verdict] += 1
                    if sup.judgement.verdict in watchdog.STUCK:
                        self.hung_seen[h].append(sup.judgement.detail)

    def load(self, host: str, phase: tuple[str, int, int, int, int], seed: int) -> None:
        name, seconds, conc, max_tokens, words = phase
        if conc == 0:
            return
        service = ENGINES[host][0]
        h = load_inventory(str(self.inv)).hosts[host]
        with ssh.connect(h, config=self.config) as remote, remote.forward(8000) as lp:
            target = loadgen.Target(f"http://127.0.0.1:{lp}", "tiny-qwen2" if service == "tiny-vllm" else service)
            res = loadgen.run_level(target, concurrency=conc, words=words, max_tokens=max_tokens, requests=5000,
                                    duration_s=seconds, timeout_s=300, seed=seed)
        for r in res:
            self.requests[host]["ok" if r.ok else "failed"] += 1
            if not r.ok and len(self.errors[host]) < 5:
                self.errors[host].append(f"{name}: {r.error}")

    def probe_cost(self, host: str, runs: int = 10) -> dict[str, Any]:
        """Run the release's watchdog.sh by hand ``runs`` times: wall and CPU (the script and its children)."""
        service = ENGINES[host][0]
        script = f"/opt/llmfleet/services/{service}/current/{watchdog.SCRIPT}"
        code = ("import resource, subprocess, sys, time\n"
                f"runs = {runs}\nt0 = time.monotonic()\n"
                f"for _ in range(runs): subprocess.run(['sh', {script!r}])\n"
                "wall = (time.monotonic() - t0) / runs\n"
                "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
                "print(wall, (ru.ru_utime + ru.ru_stime) / runs)\n")
        out = self.exec(host, f"python3 -c {shlex.quote(code)}", timeout=600).split()
        if len(out) != 2:
            return {"error": "the timing run printed nothing"}
        return {"wall_ms": round(float(out[0]) * 1000, 1), "cpu_ms": round(float(out[1]) * 1000, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="how long to soak (default 30)")
    ap.add_argument("--vllm", action="store_true", help="also soak a vLLM host (gpu-4090-01)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    names = ["gpu-v100-01"] + (["gpu-4090-01"] if args.vllm else [])
    lab = f"llmfleet-soak{secrets.token_hex(2)}"
    report: dict[str, Any] = {"minutes": args.minutes, "watchdog": WATCHDOG, "hosts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        inv = hosts.generate_inventory(ROOT / "inventory" / "lab", Path(tmp) / "inventory",
                                       key_path=setup.KEY_PATH, lock_path=setup.LOCK_PATH)
        for h in names:
            path = inv / "host_vars" / f"{h}.yml"
            data = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
            data["llmfleet_watchdog"] = WATCHDOG
            path.write_text(yaml.safe_dump(data, sort_keys=True))
        known = Path(tmp) / "known_hosts"
        config = {"connect_timeout": 10, "command_timeout": 120, "known_hosts": str(known),
                  "audit_log": str(Path(tmp) / "audit.jsonl")}
        hosts.up(str(inv), lab=lab, names=names, known_hosts=known, key_path=setup.KEY_PATH)
        soak = Soak(inv, lab, names, config)
        try:
            for h in names:
                o = deploy_host(str(inv), h, config=config,
                                options=DeployOptions(who="soak", overrides={"health": ENGINES[h][2]}),
                                log=lambda _line: None)
                if o.result not in {"deployed", "unchanged"}:
                    print(f"{h}: deploy {o.result}: {o.reason}", file=sys.stderr)
                    return 1
            sampler = threading.Thread(target=soak.sample, daemon=True)
            sampler.start()
            t_end = time.monotonic() + args.minutes * 60
            cost: dict[str, dict[str, Any]] = {h: {} for h in names}
            cycle = 0
            while time.monotonic() < t_end:
                for phase in PHASES:
                    left = t_end - time.monotonic()
                    if left <= 0:
                        break
                    ph = (phase[0], int(min(phase[1], left)), *phase[2:])
                    print(f"[{time.strftime('%H:%M:%S')}] {ph[0]} for {ph[1]} s", file=sys.stderr, flush=True)
                    if ph[2] == 0:
                        if cycle == 0 and "idle" not in cost[names[0]]:
                            for h in names:
                                cost[h]["idle"] = soak.probe_cost(h)
                        time.sleep(ph[1])
                        continue
                    threads = [threading.Thread(target=soak.load, args=(h, ph, cycle * 100_000), daemon=True)
                               for h in names]
                    for t in threads:
                        t.start()
                    if ph[0] == "four streams" and "loaded" not in cost[names[0]]:
                        time.sleep(20)
                        for h in names:
                            cost[h]["loaded"] = soak.probe_cost(h)
                    for t in threads:
                        t.join(ph[1] + 400)
                cycle += 1
            soak.stop.set()
            sampler.join(30)
            for h in names:
                service = ENGINES[h][0]
                audit = F.parse_audit(soak.exec(h, f"cat {R.audit_path('/opt/llmfleet')} 2>/dev/null || true"))
                restarts = [a for a in audit if a.get("action") == "watchdog-restart" and a.get("service") == service]
                report["hosts"][h] = {
                    "service": service, "engine": ENGINES[h][1], "watchdog_restarts": len(restarts),
                    "restart_details": [a.get("detail") for a in restarts],
                    "judgements_sampled": dict(soak.verdicts[h]), "stuck_seen": soak.hung_seen[h][:10],
                    "requests": dict(soak.requests[h]), "request_errors": soak.errors[h], "probe_cost": cost[h],
                }
        finally:
            hosts.down(lab, known_hosts=known)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"liveness soak: {args.minutes:g} min, watchdog {WATCHDOG}")
        for h, r in report["hosts"].items():
            print(f"{h} ({r['engine']} {r['service']}): watchdog restarts {r['watchdog_restarts']}; "
                  f"judgements seen {r['judgements_sampled']}; requests {r['requests']}; "
                  f"watchdog.sh per run {r['probe_cost']}")
            for d in r["restart_details"]:
                print(f"  restart: {d}")
    return 0 if all(r["watchdog_restarts"] == 0 for r in report["hosts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
