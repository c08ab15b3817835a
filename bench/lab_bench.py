"""Lab figures: image builds (last cold build, warm rebuild), `lab.up` of 3 hosts, idle memory per host.

    .venv/bin/python bench/lab_bench.py [--hosts gpu-v100-01,gpu-t4-01,gpu-4090-01] [--json]

Needs `invoke lab.setup` first. Brings up a uniquely named lab from a generated copy of
inventory/lab/ (free ports), measures, and removes it. Budgets (docs/lab.md): lab.up of 3 hosts
< 30 s once built; idle memory per host < 100 MiB; cold build of host + llama.cpp images < 10 min.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from llmfleet.lab import hosts, images, setup  # noqa: E402
from llmfleet.lab.paths import cache_dir  # noqa: E402

UP_BUDGET_S = 30
IDLE_BUDGET_MIB = 100
COLD_BUDGET_S = 600


def cold_figures() -> dict:
    manifest = images.load_manifest()
    out = {k: manifest.get(k, {}).get("build_seconds") for k in ("base", "host", "llamacpp", "registry", "broken",
                                                                 "vllm-cpu")}
    compiles = sorted((cache_dir() / "llama-server").glob("*/build-seconds"))
    out["llama-server compile"] = float(compiles[-1].read_text()) if compiles else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="gpu-v100-01,gpu-t4-01,gpu-4090-01", help="hosts to bring up")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds to wait before reading idle memory")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    names = [h for h in args.hosts.split(",") if h]

    t0 = time.monotonic()
    images.build_all(images.DEFAULT_IMAGES, quiet=True)
    warm = time.monotonic() - t0

    lab = f"llmfleet-b{secrets.token_hex(3)}"
    with tempfile.TemporaryDirectory() as tmp:
        inv = hosts.generate_inventory(ROOT / "inventory" / "lab", Path(tmp) / "inventory",
                                       key_path=setup.KEY_PATH, lock_path=setup.LOCK_PATH)
        known = Path(tmp) / "known_hosts"
        try:
            res = hosts.up(str(inv), lab=lab, names=names, known_hosts=known, key_path=setup.KEY_PATH)
            again = hosts.up(str(inv), lab=lab, names=names, known_hosts=known, key_path=setup.KEY_PATH)
            time.sleep(args.settle)
            mem = {s.name: s.mem_mib for s in hosts.status(lab)}
        finally:
            t1 = time.monotonic()
            hosts.down(lab, known_hosts=known)
            down_s = time.monotonic() - t1

    cold = cold_figures()
    host_llama_cold = None
    if cold.get("host") and cold.get("llama-server compile"):
        host_llama_cold = cold["base"] or 0
        host_llama_cold += cold["host"] + cold["llama-server compile"] + (cold.get("llamacpp") or 0)
    result = {
        "warm_build_s": round(warm, 2),
        "cold_build_s": cold,
        "cold_host_plus_llamacpp_s": host_llama_cold,
        "up_hosts": names,
        "up_s": res.seconds,
        "up_again_s": again.seconds,
        "down_s": round(down_s, 2),
        "idle_mib": mem,
        "budgets": {
            "up_under_30s": res.seconds < UP_BUDGET_S if len(names) == 3 else None,
            "idle_under_100mib": all(v is not None and v < IDLE_BUDGET_MIB for v in mem.values()),
            "cold_under_10min": host_llama_cold < COLD_BUDGET_S if host_llama_cold else None,
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"warm build (all default lab images cached): {result['warm_build_s']} s")
    for k, v in cold.items():
        print(f"last cold build {k:>22}: {v if v is not None else 'not recorded'} s")
    if host_llama_cold:
        print(f"cold base + host + llama-server + llama.cpp image: {host_llama_cold:.0f} s "
              f"(budget {COLD_BUDGET_S} s)")
    print(f"lab.up of {len(names)} hosts: {res.seconds} s (budget {UP_BUDGET_S} s); again (running): "
          f"{again.seconds} s; lab.down: {result['down_s']} s")
    for h, v in mem.items():
        print(f"idle memory {h}: {v} MiB (budget {IDLE_BUDGET_MIB} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
