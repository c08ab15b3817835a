"""Fleet-upgrade wall time in the lab: 1, 4 and 12 hosts at --forks 1 and --forks 12.

Brings up its own lab hosts (``bench-node-NN``, identical llama.cpp hosts like the lab's
``lab_fleet``), deploys them once (not measured: that includes the first image pull), then times
rolling upgrades that change every host (a new ``context`` each run, so each host renders a new
release, restarts its engine and passes the full health check), one batch, at each fork count.

Needs the lab set up once (``invoke lab.setup``). Run from the project root:

    .venv/bin/python bench/fleet_upgrade_bench.py [--sizes 1,4,12] [--forks 1,12] [--keep]

Prints a table, then the same sizes with ``--check`` (SSH-bound work only, nothing restarted).
Every lab host shares this machine's CPU cores (llama-server start, health-check completions, SSH),
so the upgrade's speed-up from forks is bounded by the cores here, not by SSH latency; on a real
fleet each host brings its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from llmfleet.fleet.upgrade import HostChange, deploy_fn, run_upgrade  # noqa: E402
from llmfleet.lab import hosts as lab_hosts  # noqa: E402
from llmfleet.release.deploy import DeployOptions  # noqa: E402

KEY = ROOT / ".lab" / "id_ed25519"
LOCK = ROOT / ".lab" / "images.lock"


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
        dict(s, health=dict(s.get("health") or {}, min_tokps=0.2)) for s in all_vars["llmfleet_services"]]
    (dest / "group_vars" / "all.yml").write_text(yaml.safe_dump(all_vars, sort_keys=False))
    names = [f"bench-node-{i:02d}" for i in range(1, count + 1)]
    hosts = {n: {"ansible_port": p} for n, p in zip(names, free_ports(count), strict=True)}
    inv = {"all": {"children": {"bench_fleet": {
        "hosts": hosts, "vars": {"lab_gpu": "NVIDIA A10", "lab_driver": "550.127.05", "llmfleet_gpu": "NVIDIA A10"},
    }}}}
    (dest / "hosts.yml").write_text(yaml.safe_dump(inv, sort_keys=False))
    return dest, names


def one_run(inv: str, hosts: list[str], forks: int, context: int, config: dict, check: bool = False) -> dict:
    options = DeployOptions(who="bench", message=f"bench context={context}", check=check)
    changes = {h: HostChange({"context": context}) for h in hosts}
    deploy = deploy_fn(inv, config=config, options=options, changes=changes, log=lambda line: None)
    t0 = time.monotonic()
    report = run_upgrade(hosts, deploy=deploy, serial=[], forks=forks)
    wall = time.monotonic() - t0
    durations = [h.duration_s for h in report.hosts]
    return {"kind": "check" if check else "upgrade", "hosts": len(hosts), "forks": forks, "wall_s": wall, "mean_host_s": sum(durations) / len(durations),
            "counts": report.counts(), "reasons": {h.host: h.reason for h in report.hosts if h.failed}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,12", help="host counts to time (comma list)")
    ap.add_argument("--forks", default="1,12", help="fork counts to time (comma list)")
    ap.add_argument("--keep", action="store_true", help="leave the bench hosts running afterwards")
    ap.add_argument("--no-check", action="store_true", help="skip the --check rows (SSH-bound: facts, preflight, "
                    "render, diff; no restart)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    forks_list = [int(x) for x in args.forks.split(",")]
    if not LOCK.exists():
        print("the lab is not set up: run `invoke lab.setup` first", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="llmfleet-bench-"))
    lab = f"llmfleet-bench-{os.getpid() % 100000}"
    inv_dir, names = make_inventory(work / "inventory", max(sizes))
    known_hosts = work / "known_hosts"
    config = {"connect_timeout": 10, "command_timeout": 120, "user": None, "known_hosts": str(known_hosts),
              "audit_log": str(work / "audit.jsonl"), "images_lock": None, "pull_timeout": None}
    rows = []
    try:
        t0 = time.monotonic()
        lab_hosts.up(str(inv_dir), lab=lab, names=names, known_hosts=known_hosts, key_path=KEY,
                     log=lambda m: print(m, file=sys.stderr))
        up_s = time.monotonic() - t0
        t0 = time.monotonic()
        first = one_run(str(inv_dir), names, 12, 512, config)
        print(f"lab up of {len(names)} hosts: {up_s:.1f}s; first deploy (image pull included) at forks 12: "
              f"{time.monotonic() - t0:.1f}s {first['counts']}", file=sys.stderr)
        for h, why in first["reasons"].items():
            print(f"  {h}: {why[:300]}", file=sys.stderr)
        context = 512
        for n in sizes:
            for f in forks_list:
                context += 64  # a new value each run: every host gets a new release
                r = one_run(str(inv_dir), names[:n], f, context, config)
                print(f"{n} host(s), forks {f}: {r['wall_s']:.1f}s {r['counts']}", file=sys.stderr)
                for h, why in r["reasons"].items():
                    print(f"  {h}: {why[:300]}", file=sys.stderr)
                rows.append(r)
        if not args.no_check:
            for n in sizes:
                for f in forks_list:
                    r = one_run(str(inv_dir), names[:n], f, context + 64, config, check=True)
                    print(f"check, {n} host(s), forks {f}: {r['wall_s']:.1f}s {r['counts']}", file=sys.stderr)
                    rows.append(r)
    finally:
        if not args.keep:
            lab_hosts.down(lab, known_hosts=known_hosts)
            shutil.rmtree(work, ignore_errors=True)
    cores = os.cpu_count()
    print(f"\nfleet upgrade wall time, {cores} CPU cores. upgrade: one batch, the full deploy per host (render, "
          f"upload, switch, engine restart, health check with a streamed completion); check: upgrade --check "
          f"(SSH, facts, preflight, render, diff; nothing restarted)")
    print(f"{'kind':>7} {'hosts':>5} {'forks':>5} {'wall s':>8} {'s/host':>8} {'mean host s':>12} {'speed-up':>9}  results")
    base: dict[tuple[str, int], float] = {}
    for r in rows:
        key = (r["kind"], r["hosts"])
        if r["forks"] == min(forks_list):
            base[key] = r["wall_s"]
        speed = base.get(key, r["wall_s"]) / r["wall_s"] if r["wall_s"] else 0
        print(f"{r['kind']:>7} {r['hosts']:>5} {r['forks']:>5} {r['wall_s']:>8.1f} {r['wall_s'] / r['hosts']:>8.2f} "
              f"{r['mean_host_s']:>12.2f} {speed:>8.1f}x  {r['counts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
