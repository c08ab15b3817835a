"""Deploy cost on one lab host: SSH round trips and wall time of a no-change and of a changed deploy.

    .venv/bin/python bench/deploy_bench.py [--host gpu-v100-01] [--runs 3] [--json]

Needs `invoke lab.setup` once. Brings up its own uniquely named lab host from a generated copy of
inventory/lab/ (so it never disturbs a running lab), deploys the host's service, then measures:
- no-change deploy: the inventory's inputs again (nothing restarted);
- changed deploy: the service's context alternated between two values (a new release, then a switch
  back to the existing one): upload/switch, systemd restart, the staged health check.
"model load" is the health check's /health stage (the engine loading its model); it is shown and
subtracted, so the last column is llmfleet's own cost. Medians over --runs.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from llmfleet.inventory.ansible import load_inventory  # noqa: E402
from llmfleet.lab import hosts, setup  # noqa: E402
from llmfleet.release.deploy import DeployOptions, deploy_host  # noqa: E402


def load_s(outcome) -> float:
    return sum(s["seconds"] for h in outcome.health.values() for s in h.get("stages", []) if s["name"] == "health")


def measure(inv_path: str, host: str, runs: int, known_hosts: Path, audit: Path) -> dict:
    inv = load_inventory(inv_path)
    svc = inv.settings_for(inv.hosts[host]).services[0]
    base_ctx = svc.context or 512
    conf = {"connect_timeout": 10, "command_timeout": 120, "known_hosts": str(known_hosts), "audit_log": str(audit)}

    def deploy(ctx: int | None, msg: str):
        over = {"context": ctx} if ctx is not None else {}
        o = deploy_host(inv, host, config=conf, options=DeployOptions(overrides=over, message=msg, who="bench"),
                        log=lambda _: None)
        if not o.ok:
            raise SystemExit(f"{host}: {o.result}: {o.reason}")
        return o

    first = deploy(None, "bench: first deploy")
    unchanged = [deploy(None, "bench: no change") for _ in range(runs)]
    assert all(o.result == "unchanged" for o in unchanged), [o.result for o in unchanged]
    changed = [deploy(base_ctx // 2 if i % 2 == 0 else None, "bench: changed") for i in range(runs)]
    assert all(o.result == "deployed" for o in changed), [o.result for o in changed]

    def row(outs):
        wall = statistics.median(o.duration_s for o in outs)
        load = statistics.median(load_s(o) for o in outs)
        return {"round_trips": statistics.median(o.round_trips for o in outs), "wall_s": round(wall, 2),
                "model_load_s": round(load, 2), "wall_minus_load_s": round(wall - load, 2)}

    stages: dict[str, list[float]] = {}
    for o in changed:
        for h in o.health.values():
            for st in h.get("stages", []):
                stages.setdefault(st["name"], []).append(st["seconds"])
    return {"host": host, "service": svc.name, "engine": svc.engine, "runs": runs,
            "first_deploy": row([first]), "no_change": row(unchanged), "changed": row(changed),
            "changed_health_stages_s": {k: round(statistics.median(v), 2) for k, v in stages.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="gpu-v100-01", help="lab host to bring up and deploy")
    ap.add_argument("--runs", type=int, default=3, help="deploys of each kind (median reported)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--trace", action="store_true", help="print each SSH round trip of the last changed deploy")
    args = ap.parse_args()
    trace: list[tuple[str, float]] = []
    if args.trace:
        from llmfleet.host import ssh

        real_run = ssh.Remote.run

        def timed(self, command, **kw):
            t = time.monotonic()
            try:
                return real_run(self, command, **kw)
            finally:
                first = (command if isinstance(command, str) else " ".join(command)).strip().splitlines()[0]
                trace.append((first[:70], time.monotonic() - t))

        ssh.Remote.run = timed
    lab = f"llmfleet-db{secrets.token_hex(3)}"
    with tempfile.TemporaryDirectory() as tmp:
        inv = hosts.generate_inventory(ROOT / "inventory" / "lab", Path(tmp) / "inventory",
                                       key_path=setup.KEY_PATH, lock_path=setup.LOCK_PATH)
        known = Path(tmp) / "known_hosts"
        try:
            hosts.up(str(inv), lab=lab, names=[args.host], known_hosts=known, key_path=setup.KEY_PATH)
            t0 = time.monotonic()
            res = measure(str(inv), args.host, args.runs, known, Path(tmp) / "audit.jsonl")
            res["total_s"] = round(time.monotonic() - t0, 1)
        finally:
            hosts.down(lab, known_hosts=known)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"host {res['host']} (lab), service {res['service']} ({res['engine']}), median of {res['runs']} runs\n")
    print(f"{'deploy':<34} {'round trips':>11} {'wall s':>8} {'model load s':>13} {'wall - load s':>14}")
    for key, name in (("first_deploy", "first deploy (pull + start)"), ("no_change", "no-change deploy"),
                      ("changed", "changed deploy (restart + health)")):
        r = res[key]
        print(f"{name:<34} {r['round_trips']:>11.0f} {r['wall_s']:>8.2f} {r['model_load_s']:>13.2f} "
              f"{r['wall_minus_load_s']:>14.2f}")
    if args.trace:
        n = int(res["changed"]["round_trips"])
        print("\nround trips of the last changed deploy:")
        for cmd, secs in trace[-n:]:
            print(f"  {secs:6.2f}s  {cmd}")
    print("\nchanged deploy, health stages (median s): "
          + ", ".join(f"{k} {v}" for k, v in res["changed_health_stages_s"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
