"""Deploy cost on one lab host, whole process: `invoke deploy --host H` as a user runs it, timed from
process start to exit, on a quiet machine and on a busy one, in one run.

    .venv/bin/python bench/deploy_bench.py [--host gpu-v100-01] [--runs 5] [--no-busy] [--json] [--timeline]
                                          [--src before=/tmp/base/src,after=src]

Needs `invoke lab.setup` once. Brings up its own uniquely named lab host from a generated copy of
inventory/lab/ (so it never disturbs a running lab), deploys the host's service once (not measured),
then, for each condition, runs the `invoke deploy` command line ``--runs`` times of each kind:

- no change: the inventory as deployed (nothing restarted);
- changed: the service's ``context`` in the inventory alternated between two values before each run
  (a new release, then switches between the two): upload, arm, switch, restart, the staged health check.

Conditions: ``quiet`` (whatever else this machine runs; its load average is printed) and ``busy``
(this script starts one CPU-bound process per core for the duration). Printed per condition and kind:
median, min-max spread, SSH round trips and, for a changed deploy, the engine's model load (the health
check's /health stage; the engine's own time, not llmfleet's) and the round trip that switches and
restarts (median and spread over the runs), and the median CPU (user + sys) of the `invoke` process.
``--timeline`` prints the timeline
(`deploy --timeline`) of the median no-change and changed run.

``--src NAME=PATH,...`` compares package sources (each run's process gets ``PYTHONPATH=PATH``; byte-compile
each first, as scripts/bootstrap.sh does): on the one lab host, each run of each kind goes to every
source in turn, so every source sees the same machine load; figures are printed per source.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from machine_load import Burner, load  # noqa: E402

from llmfleet.lab import hosts, setup  # noqa: E402


def low_floor(inv: Path) -> None:
    """The service's decode floor set low: on 2 shared cores under the busy condition the CPU engine
    decodes at ~2 tok/s, the lab's floor; the floor itself is tested in tests/lab/test_deploy.py, here
    it only has to tell "answers" from "does not" (as in bench/fleet_upgrade_bench.py)."""
    path = inv / "group_vars" / "all.yml"
    data = yaml.safe_load(path.read_text())
    for s in data["llmfleet_services"]:
        s["health"] = dict(s.get("health") or {}, min_tokps=0.2)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def set_context(inv: Path, context: int) -> None:
    path = inv / "group_vars" / "all.yml"
    data = yaml.safe_load(path.read_text())
    data["llmfleet_services"][0]["context"] = context
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def deploy_cli(inv: Path, cfg: Path, host: str, message: str, src: str | None = None) -> tuple[float, dict]:
    """One `invoke deploy` process: (wall seconds, the host's outcome from --json); ``src``: the package
    source it runs (PYTHONPATH), else the installed one."""
    cmd = [sys.executable, "-m", "invoke", "-f", str(cfg), "deploy", "--host", host, "-i", str(inv), "--json",
           "--message", message]
    env = dict(os.environ, PYTHONPATH=str(Path(src).resolve())) if src else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        outcome = json.loads(res.stdout)["hosts"][0]
    except (ValueError, KeyError, IndexError):
        raise SystemExit(f"deploy failed (exit {res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}") from None
    if outcome["result"] not in ("deployed", "unchanged"):
        raise SystemExit(f"{host}: {outcome['result']}: {outcome['reason']}")
    outcome["cpu_s"] = cpu  # the controller process's own CPU (user + sys): steadier than wall on a busy machine
    return wall, outcome


def model_load_s(outcome: dict) -> float:
    return sum(s["seconds"] for h in outcome["health"].values() for s in h.get("stages", []) if s["name"] == "health")


def switch_s(outcome: dict) -> float | None:
    """The seconds of the round trip that switches and restarts (upload, arm, switch, restart, the wait
    for the container): None in a deploy that switched nothing."""
    got = [st["seconds"] for st in outcome["timeline"] if "switch + restart" in st["stage"]]
    return sum(got) if got else None


def summary(runs: list[tuple[float, dict]]) -> dict:
    walls = [w for w, _ in runs]
    med = statistics.median(walls)
    out = {"runs": len(runs), "median_s": round(med, 3), "min_s": round(min(walls), 3), "max_s": round(max(walls), 3),
           "round_trips": statistics.median(o["round_trips"] for _, o in runs),
           "cpu_s": round(statistics.median(o["cpu_s"] for _, o in runs), 3),
           "model_load_s": round(statistics.median(model_load_s(o) for _, o in runs), 3),
           "timeline": min(runs, key=lambda r: abs(r[0] - med))[1]["timeline"]}
    switches = [s for s in (switch_s(o) for _, o in runs) if s is not None]
    if switches:
        out["switch_s"] = {"median_s": round(statistics.median(switches), 3), "min_s": round(min(switches), 3),
                           "max_s": round(max(switches), 3)}
    return out


def measure(inv: Path, cfg: Path, host: str, runs: int, base_ctx: int,
            srcs: dict[str, str | None] | None = None) -> dict:
    """Per source (``srcs``: name -> package path; one unnamed source by default): its no-change and
    changed runs, the sources taking turns run by run."""
    srcs = srcs or {"": None}
    out: dict = {"load_before": load()}
    unchanged: dict[str, list] = {n: [] for n in srcs}
    changed: dict[str, list] = {n: [] for n in srcs}
    for _ in range(runs):
        for name, src in srcs.items():
            unchanged[name].append(deploy_cli(inv, cfg, host, "bench: no change", src))
    flips = 0
    for _ in range(runs):
        for name, src in srcs.items():
            set_context(inv, base_ctx // 2 if flips % 2 == 0 else base_ctx)
            flips += 1
            changed[name].append(deploy_cli(inv, cfg, host, "bench: changed", src))
    set_context(inv, base_ctx)
    if flips % 2:  # back to the inventory's context, so the next condition starts unchanged
        deploy_cli(inv, cfg, host, "bench: back")
    for name in srcs:
        assert all(o["result"] == "unchanged" for _, o in unchanged[name]), [o["result"] for _, o in unchanged[name]]
        assert all(o["result"] == "deployed" for _, o in changed[name]), [o["result"] for _, o in changed[name]]
    per = {name: {"no_change": summary(unchanged[name]), "changed": summary(changed[name])} for name in srcs}
    if list(srcs) == [""]:
        out.update(per[""])
    else:
        out["sources"] = per
    out["load_after"] = load()
    return out


def print_timeline(title: str, tl: list[dict]) -> None:
    print(f"  {title}:")
    for st in tl:
        rt = st.get("round_trips")
        print(f"    +{st['start_s']:6.2f}s {st['seconds']:6.2f}s {(str(rt) + ' rt') if rt else '':>5} {st['stage']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="gpu-v100-01", help="lab host to bring up and deploy")
    ap.add_argument("--runs", type=int, default=5, help="deploys of each kind per condition (median reported)")
    ap.add_argument("--no-busy", action="store_true", help="measure the quiet condition only")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--timeline", action="store_true", help="print the median runs' timelines")
    ap.add_argument("--src", default="", help="NAME=PATH,... package sources to compare, runs alternating")
    args = ap.parse_args()
    srcs: dict[str, str | None] | None = None
    if args.src:
        srcs = {}
        for item in args.src.split(","):
            name, sep, path = item.partition("=")
            if not sep or not (Path(path) / "llmfleet" / "__init__.py").is_file():
                ap.error(f"--src {item!r}: NAME=PATH, PATH a folder holding the llmfleet package")
            srcs[name] = path
    lab = f"llmfleet-db{secrets.token_hex(3)}"
    results: dict = {"host": args.host, "runs": args.runs, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "command": f"invoke deploy --host {args.host} (whole process)", "conditions": {}}
    with tempfile.TemporaryDirectory() as tmp:
        inv = hosts.generate_inventory(ROOT / "inventory" / "lab", Path(tmp) / "inventory",
                                       key_path=setup.KEY_PATH, lock_path=setup.LOCK_PATH)
        known = Path(tmp) / "known_hosts"
        cfg = Path(tmp) / "invoke.yaml"
        cfg.write_text(yaml.safe_dump({"llmfleet": {"ssh": {"known_hosts": str(known)},
                                                    "audit_log": str(Path(tmp) / "audit.jsonl")}}))
        low_floor(inv)
        base_ctx = yaml.safe_load((inv / "group_vars" / "all.yml").read_text())["llmfleet_services"][0]["context"]
        try:
            hosts.up(str(inv), lab=lab, names=[args.host], known_hosts=known, key_path=setup.KEY_PATH)
            deploy_cli(inv, cfg, args.host, "bench: first deploy")
            results["conditions"]["quiet"] = measure(inv, cfg, args.host, args.runs, base_ctx, srcs)
            if not args.no_busy:
                with Burner():
                    results["conditions"]["busy"] = measure(inv, cfg, args.host, args.runs, base_ctx, srcs)
        finally:
            hosts.down(lab, known_hosts=known)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{results['command']}, lab host {args.host}, {results['date']}, median of {args.runs} runs each\n")
    print(f"{'condition':<8} {'deploy':<10} {'median s':>9} {'spread s':>13} {'round trips':>11} {'model load s':>13}"
          f" {'CPU s':>6}  machine")
    for cond, r in results["conditions"].items():
        for src, per in (r["sources"].items() if "sources" in r else [("", r)]):
            print_condition(f"{cond} {src}".strip(), per, r["load_before"])
    if args.timeline:
        for cond, r in results["conditions"].items():
            for src, per in (r["sources"].items() if "sources" in r else [("", r)]):
                print(f"\n{cond} {src}:".replace(" :", ":"))
                print_timeline("no-change deploy (median run)", per["no_change"]["timeline"])
                print_timeline("changed deploy (median run)", per["changed"]["timeline"])
    return 0


def print_condition(cond: str, r: dict, load_before: str) -> None:
    for key, name in (("no_change", "no change"), ("changed", "changed")):
        s = r[key]
        print(f"{cond:<8} {name:<10} {s['median_s']:>9.2f} {s['min_s']:>6.2f}-{s['max_s']:<6.2f} "
              f"{s['round_trips']:>11.0f} {s['model_load_s']:>13.2f} {s['cpu_s']:>6.2f}  {load_before}")
        if "switch_s" in s:
            sw = s["switch_s"]
            print(f"{'':<8} {'':<10} {sw['median_s']:>9.2f} {sw['min_s']:>6.2f}-{sw['max_s']:<6.2f} "
                  f"{'':>11} {'':>13}  of which the switch round trip (upload, arm, switch, restart, "
                  "container start)")


if __name__ == "__main__":
    raise SystemExit(main())
