"""Fleet upgrades in the lab: one host against N hosts at --forks N, and where a host's seconds go.

Brings up its own lab hosts (``bench-node-NN``, identical llama.cpp hosts like the lab's ``lab_fleet``),
deploys them once (not measured: that includes the first image pull), then times ``run_upgrade`` (the
code behind ``invoke upgrade``, in this process) for one host and for all N hosts in one batch at
``--forks N``, ``--runs`` times each, for each kind:

- ``check``: ``upgrade --check`` (connect, probe, preflight, plan, render, decide; nothing changes);
- ``no-change``: ``upgrade`` with the inventory's own values (every host unchanged: probe, decide,
  audit line);
- ``changed`` (with ``--changed``): a new ``context`` each run (a new release, engine restart, health
  check with a streamed completion, on every host).

Conditions: ``quiet`` (whatever else this machine runs; its load is printed) and ``busy`` (one CPU-bound
process per core started by this script), in one run. Printed per kind and condition: median wall time
and spread for 1 and N hosts, their ratio, and the median seconds of each stage of a host's run
(``deploy --timeline``'s stages) alone and among N: a stage that grows with N is what serialises.

Needs the lab set up once (``invoke lab.setup``). Run from the project root:

    .venv/bin/python bench/fleet_upgrade_bench.py [--hosts 12] [--runs 5] [--changed] [--no-busy] [--keep]

Every lab host shares this machine's CPU cores (sshd, sudo, docker, the nvidia-smi simulator, the
engines), so N hosts at once compete for the same cores as the controller; on a real fleet each host
brings its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from machine_load import Burner, load  # noqa: E402

from llmfleet.fleet.upgrade import HostChange, deploy_fn, prepare, run_upgrade  # noqa: E402
from llmfleet.inventory.ansible import load_inventory  # noqa: E402
from llmfleet.lab import hosts as lab_hosts  # noqa: E402
from llmfleet.release.deploy import DeployOptions  # noqa: E402
from llmfleet.settings import Settings  # noqa: E402

KEY = ROOT / ".lab" / "id_ed25519"
LOCK = ROOT / ".lab" / "images.lock"
BASE_CONTEXT = 512




def make_inventory(dest: Path, count: int) -> tuple[Path, list[str]]:
    """The lab's group_vars (services, login) with ``count`` A10 hosts on free loopback ports."""
    (dest / "group_vars").mkdir(parents=True)
    all_vars = yaml.safe_load((ROOT / "inventory" / "lab" / "group_vars" / "all.yml").read_text())
    all_vars["ansible_ssh_private_key_file"] = str(KEY)
    all_vars["llmfleet_images_lock"] = str(LOCK)
    # Twelve CPU engines on two cores decode at ~1.5 tok/s each while all of them answer their health
    # check at once (measured: forks 12 with the lab's floor of 2 tok/s rolled 7 of 12 hosts back).
    # The floor is a property of the card, tested in tests/lab/test_deploy.py; here it only has to
    # tell "answers" from "does not", so it is set low and the timing is of the fleet machinery.
    all_vars["llmfleet_services"] = [
        dict(s, context=BASE_CONTEXT, health=dict(s.get("health") or {}, min_tokps=0.2))
        for s in all_vars["llmfleet_services"]]
    (dest / "group_vars" / "all.yml").write_text(yaml.safe_dump(all_vars, sort_keys=False))
    names = [f"bench-node-{i:02d}" for i in range(1, count + 1)]
    hosts = {n: {"ansible_port": p} for n, p in zip(names, lab_hosts.free_ports(count), strict=True)}
    inv = {"all": {"children": {"bench_fleet": {
        "hosts": hosts, "vars": {"lab_gpu": "NVIDIA A10", "lab_driver": "550.127.05", "llmfleet_gpu": "NVIDIA A10"},
    }}}}
    (dest / "hosts.yml").write_text(yaml.safe_dump(inv, sort_keys=False))
    return dest, names


def one_run(inv_path: str, hosts: list[str], forks: int, context: int, config: dict, check: bool = False) -> dict:
    """As `invoke upgrade --group G --set context=N [--check]` does it, from loading the inventory on."""
    options = DeployOptions(who="bench", message=f"bench context={context}", check=check)
    changes = {h: HostChange({"context": context}) for h in hosts}
    outcomes = []
    t0, cpu0 = time.monotonic(), os.times()
    inv = load_inventory(inv_path)
    settings = Settings.of(config)
    prepared = prepare(inv, hosts, changes, config=settings, options=options)
    deploy = deploy_fn(inv, config=settings, options=options, changes=changes, log=lambda line: None,
                       prepared=prepared)

    def keep(h: str):
        o = deploy(h)
        outcomes.append(o)
        return o

    report = run_upgrade(hosts, deploy=keep, serial=[], forks=forks)
    wall, cpu1 = time.monotonic() - t0, os.times()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)  # this controller process, all its threads
    stages: dict[str, list[float]] = {}
    for o in outcomes:
        for st in o.timeline:
            name = st["stage"].split(": ", 1)[-1] if st["stage"].startswith("tiny: ") else st["stage"]
            stages.setdefault(name, []).append(st["seconds"])
    return {"wall_s": wall, "cpu_s": cpu, "counts": report.counts(), "reasons": {h.host: h.reason for h in report.hosts if h.failed},
            "stages": stages}


def series(inv: str, hosts: list[str], forks: int, runs: int, config: dict, kind: str, ctx: list[int]) -> dict:
    walls: list[float] = []
    cpus: list[float] = []
    stages: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for _ in range(runs):
        if kind == "changed":
            ctx[0] = BASE_CONTEXT if ctx[0] != BASE_CONTEXT else BASE_CONTEXT // 2
        r = one_run(inv, hosts, forks, ctx[0], config, check=kind == "check")
        walls.append(r["wall_s"])
        cpus.append(r["cpu_s"])
        for k, v in r["counts"].items():
            counts[k] = counts.get(k, 0) + v
        for h, why in r["reasons"].items():
            print(f"  {kind} {len(hosts)} host(s): {h}: {why[:300]}", file=sys.stderr)
        for k, v in r["stages"].items():
            stages.setdefault(k, []).extend(v)
    return {"median_s": round(statistics.median(walls), 3), "min_s": round(min(walls), 3),
            "max_s": round(max(walls), 3), "controller_cpu_s": round(statistics.median(cpus), 3), "counts": counts,
            "stages_s": {k: round(statistics.median(v), 3) for k, v in stages.items()}}


def measure(inv: str, names: list[str], runs: int, config: dict, kinds: list[str], ctx: list[int]) -> dict:
    out: dict = {"load_before": load()}
    for kind in kinds:
        if kind == "no-change" and ctx[0] != BASE_CONTEXT:  # back to the inventory's values first
            ctx[0] = BASE_CONTEXT
            one_run(inv, names, len(names), ctx[0], config)
        one = series(inv, names[:1], 1, runs, config, kind, ctx)
        many = series(inv, names, len(names), runs, config, kind, ctx)
        out[kind] = {"one": one, "many": many, "ratio": round(many["median_s"] / one["median_s"], 2)}
        print(f"{kind}: 1 host {one['median_s']:.2f}s, {len(names)} hosts {many['median_s']:.2f}s", file=sys.stderr)
    out["load_after"] = load()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=12, help="hosts of the fleet run (at --forks of the same number)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each kind and size (median reported)")
    ap.add_argument("--changed", action="store_true", help="also time upgrades that change every host")
    ap.add_argument("--no-busy", action="store_true", help="measure the quiet condition only")
    ap.add_argument("--keep", action="store_true", help="leave the bench hosts running afterwards")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    if not LOCK.exists():
        print("the lab is not set up: run `invoke lab.setup` first", file=sys.stderr)
        return 2
    kinds = ["check", "no-change"] + (["changed"] if args.changed else [])
    work = Path(tempfile.mkdtemp(prefix="llmfleet-bench-"))
    lab = f"llmfleet-bench-{os.getpid() % 100000}"
    inv_dir, names = make_inventory(work / "inventory", args.hosts)
    known_hosts = work / "known_hosts"
    config = {"connect_timeout": 10, "command_timeout": 120, "user": None, "known_hosts": str(known_hosts),
              "audit_log": str(work / "audit.jsonl"), "images_lock": None, "pull_timeout": None}
    res: dict = {"hosts": args.hosts, "runs": args.runs, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "conditions": {}}
    try:
        t0 = time.monotonic()
        lab_hosts.up(str(inv_dir), lab=lab, names=names, known_hosts=known_hosts, key_path=KEY,
                     log=lambda m: print(m, file=sys.stderr))
        print(f"lab up of {len(names)} hosts: {time.monotonic() - t0:.1f}s", file=sys.stderr)
        t0 = time.monotonic()
        first = one_run(str(inv_dir), names, len(names), BASE_CONTEXT, config)
        print(f"first deploy (image pull included) at forks {len(names)}: {time.monotonic() - t0:.1f}s "
              f"{first['counts']}", file=sys.stderr)
        ctx = [BASE_CONTEXT]
        res["conditions"]["quiet"] = measure(str(inv_dir), names, args.runs, config, kinds, ctx)
        if not args.no_busy:
            with Burner():
                res["conditions"]["busy"] = measure(str(inv_dir), names, args.runs, config, kinds, ctx)
    finally:
        if not args.keep:
            lab_hosts.down(lab, known_hosts=known_hosts)
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    n = args.hosts
    print(f"\nfleet upgrade in the lab, {res['date']}: 1 host vs {n} hosts at --forks {n}, one batch, "
          f"median of {args.runs} runs (spread min-max)")
    print(f"{'condition':<9} {'kind':<10} {'1 host s':>18} {f'{n} hosts s':>18} {'ratio':>6} "
          f"{'controller CPU s (1 / N)':>24}  machine")
    for cond, r in res["conditions"].items():
        for kind in kinds:
            k = r[kind]
            one, many = k["one"], k["many"]
            print(f"{cond:<9} {kind:<10} {one['median_s']:>6.2f} ({one['min_s']:.2f}-{one['max_s']:.2f}) "
                  f"{many['median_s']:>6.2f} ({many['min_s']:.2f}-{many['max_s']:.2f}) {k['ratio']:>5.1f}x "
                  f"{one['controller_cpu_s']:>11.2f} / {many['controller_cpu_s']:<10.2f}  {r['load_before']}")
    for cond, r in res["conditions"].items():
        for kind in kinds:
            one, many = r[kind]["one"]["stages_s"], r[kind]["many"]["stages_s"]
            print(f"\n{cond}, {kind}: median seconds per stage of a host's run, alone / among {n}")
            for stage in one:
                print(f"  {one[stage]:6.2f} / {many.get(stage, float('nan')):6.2f}  {stage}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
