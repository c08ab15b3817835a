"""The host probe on a lab host: its round trip and each section's time on the host, slowest first.

    .venv/bin/python bench/probe_bench.py [--host gpu-v100-01] [--runs 7] [--no-busy] [--json]

Needs `invoke lab.setup` once. Brings up its own uniquely named lab host from a generated copy of
inventory/lab/, then runs the probe (`llmfleet.host.facts.gather`, as a deploy does: as the deploy's
user, with the host's model paths) ``--runs`` times over one connection, on a quiet machine and with one
CPU-bound process per core started by this script (``busy``). Prints the round trip's median and
spread, then each section's median time on the host (the probe's own ``t=``), slowest first; the
slow groups run at once, so the round trip follows the slowest group, not the sum. Also the cost of an
empty round trip (`true`) with and without sudo, for comparison.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from machine_load import Burner, load  # noqa: E402

from llmfleet.host import facts, ssh  # noqa: E402
from llmfleet.inventory.ansible import load_inventory  # noqa: E402
from llmfleet.lab import hosts, setup  # noqa: E402


def spread(values: list[float]) -> dict:
    return {"median_s": round(statistics.median(values), 3), "min_s": round(min(values), 3),
            "max_s": round(max(values), 3)}


def host_cpu_s(container: str) -> float | None:
    """CPU seconds the lab host (its container's cgroup: sshd, sudo, sh, docker, dockerd) has used."""
    cid = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", container], capture_output=True, text=True,
                         timeout=30).stdout.strip()
    v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")  # cgroup v1: nanoseconds
    if cid and v1.exists():
        return int(v1.read_text()) / 1e9
    res = subprocess.run(["docker", "exec", container, "cat", "/sys/fs/cgroup/cpu.stat"], capture_output=True,
                         text=True, timeout=30)  # cgroup v2, seen from inside the container
    for line in res.stdout.splitlines():
        if line.startswith("usage_usec "):
            return int(line.split()[1]) / 1e6
    return None


def measure(remote, root: str, models: list[str], runs: int, container: str) -> dict:
    walls: list[float] = []
    sections: dict[str, list[float]] = {}
    errors: list[str] = []
    cpu0 = host_cpu_s(container)
    for _ in range(runs):
        t0 = time.monotonic()
        f = facts.gather(remote, root=root, model_paths=models, sudo=True)
        walls.append(time.monotonic() - t0)
        errors = f.errors
        for name, secs in f.probe_seconds.items():
            sections.setdefault(name, []).append(secs)
    cpu1 = host_cpu_s(container)
    empty = {}
    for sudo in (False, True):
        w = []
        for _ in range(runs):
            t0 = time.monotonic()
            remote.run("true", sudo=sudo)
            w.append(time.monotonic() - t0)
        empty["sudo" if sudo else "login user"] = spread(w)
    ranked = sorted(((n, statistics.median(v)) for n, v in sections.items()), key=lambda kv: -kv[1])
    return {"load": load(), "probe": spread(walls), "sections_s": {n: round(v, 3) for n, v in ranked},
            "empty_round_trip": empty, "probe_errors": errors,
            # the host's whole container, the engine included: an idle llama-server adds little
            "host_cpu_per_probe_s": round((cpu1 - cpu0) / runs, 3) if cpu0 is not None and cpu1 is not None else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="gpu-v100-01")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--no-busy", action="store_true", help="measure the quiet condition only")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    lab = f"llmfleet-pb{secrets.token_hex(3)}"
    out: dict = {"host": args.host, "runs": args.runs, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "conditions": {}}
    with tempfile.TemporaryDirectory() as tmp:
        inv_path = hosts.generate_inventory(ROOT / "inventory" / "lab", Path(tmp) / "inventory",
                                            key_path=setup.KEY_PATH, lock_path=setup.LOCK_PATH)
        known = Path(tmp) / "known_hosts"
        try:
            hosts.up(str(inv_path), lab=lab, names=[args.host], known_hosts=known, key_path=setup.KEY_PATH)
            inv = load_inventory(str(inv_path))
            host = inv.hosts[args.host]
            hs = inv.settings_for(host)
            models = [s.model_path for s in hs.services]
            with ssh.connect(host, config={"known_hosts": str(known)}) as remote:
                facts.gather(remote, root=hs.root, model_paths=models, sudo=True)  # warm: first docker calls
                container = f"{lab}-{args.host}"
                out["conditions"]["quiet"] = measure(remote, hs.root, models, args.runs, container)
                if not args.no_busy:
                    with Burner():
                        out["conditions"]["busy"] = measure(remote, hs.root, models, args.runs, container)
        finally:
            hosts.down(lab, known_hosts=known)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"host probe on lab host {args.host}, {out['date']}, median of {args.runs} runs (as a deploy: sudo)\n")
    for cond, r in out["conditions"].items():
        p = r["probe"]
        e = r["empty_round_trip"]
        print(f"{cond} ({r['load']}): probe round trip {p['median_s']:.3f} s ({p['min_s']:.3f}-{p['max_s']:.3f}); "
              f"an empty round trip {e['login user']['median_s'] * 1000:.0f} ms, with sudo "
              f"{e['sudo']['median_s'] * 1000:.0f} ms; host CPU per probe {r['host_cpu_per_probe_s']} s")
        print("  slowest sections (median s on the host):")
        for name, secs in list(r["sections_s"].items())[:8]:
            print(f"    {secs:6.2f}  {name}")
        if r["probe_errors"]:
            print(f"  probe errors: {r['probe_errors']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
