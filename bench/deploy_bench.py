"""Deploy cost on one lab host: SSH round trips and wall time of a no-change and of a changed deploy.

    invoke lab.up                      # once (or any inventory whose host runs a llama.cpp service)
    .venv/bin/python bench/deploy_bench.py [--host gpu-v100-01] [-i inventory/lab/] [--runs 3]

A changed deploy alternates the service's context between two values (a new release each time,
then a switch back to an existing one). "model load" is the health check's /health stage (the
engine loading its model), shown and subtracted, so the figure is llmfleet's own overhead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from llmfleet.deploy import DeployOptions, deploy_host  # noqa: E402
from llmfleet.inventory import load_inventory  # noqa: E402


def config() -> dict:
    import yaml

    conf = (yaml.safe_load((ROOT / "invoke.yaml").read_text()) or {}).get("llmfleet", {})
    ssh = dict(conf.get("ssh") or {})
    ssh["audit_log"] = conf.get("audit_log")
    return ssh


def load_s(outcome) -> float:
    return sum(s["seconds"] for h in outcome.health.values() for s in h.get("stages", []) if s["name"] == "health")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="gpu-v100-01")
    ap.add_argument("-i", "--inventory", default=str(ROOT / "inventory" / "lab"))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    inv = load_inventory(args.inventory)
    svc = inv.settings_for(inv.hosts[args.host]).services[0]
    base_ctx = svc.context or 512
    conf = config()

    def deploy(ctx: int | None, msg: str):
        over = {"context": ctx} if ctx is not None else {}
        o = deploy_host(inv, args.host, config=conf, options=DeployOptions(overrides=over, message=msg, who="bench"),
                        log=lambda _: None)
        if not o.ok:
            raise SystemExit(f"{args.host}: {o.result}: {o.reason}")
        return o

    deploy(None, "bench: baseline")  # whatever it was, the inventory's own inputs now
    rows = []
    unchanged = [deploy(None, "bench: no change") for _ in range(args.runs)]
    assert all(o.result == "unchanged" for o in unchanged), [o.result for o in unchanged]
    rows.append(("no-change deploy", unchanged))
    changed = []
    for i in range(args.runs):
        changed.append(deploy(base_ctx // 2 if i % 2 == 0 else None, "bench: changed"))
    rows.append(("changed deploy (restart + health)", changed))

    print(f"host {args.host}, service {svc.name} ({svc.engine}), {args.runs} runs each, median\n")
    print(f"{'deploy':<36} {'round trips':>11} {'wall s':>8} {'model load s':>13} {'wall - load s':>14}")
    for name, outs in rows:
        rt = statistics.median(o.round_trips for o in outs)
        wall = statistics.median(o.duration_s for o in outs)
        load = statistics.median(load_s(o) for o in outs)
        print(f"{name:<36} {rt:>11.0f} {wall:>8.2f} {load:>13.2f} {wall - load:>14.2f}")
    deploy(None, "bench: back to the inventory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
