"""How long resolving an inventory takes: llmfleet vs ansible-inventory, on the real inventories.

    python bench/inventory_bench.py [FOLDER]   # default: tests/data/realinv, or ../shared/realinv

Prints, per case: hosts, groups, llmfleet's load + --list time (best of 5) and ansible-inventory
--list wall time (one run, when ansible-inventory is installed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from llmfleet.inventory.ansible import load_inventory

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else (
        ROOT.parent / "shared" / "realinv" if (ROOT.parent / "shared" / "realinv").is_dir() else ROOT / "tests/data/realinv")
    exe = shutil.which("ansible-inventory") or str(Path(sys.executable).parent / "ansible-inventory")
    print(f"{'case':34} {'hosts':>5} {'groups':>6} {'llmfleet ms':>11} {'ansible ms':>10}")
    for case in sorted(p for p in folder.iterdir() if (p / "INVENTORY").is_file() and (p / "expected.json").is_file()):
        args = [a for a in (case / "INVENTORY").read_text().splitlines() if a]
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            inv = load_inventory(args, cwd=case)
            json.dumps(inv.to_ansible_list())
            best = min(best, time.perf_counter() - t0)
        ans = "-"
        if Path(exe).exists():
            cmd = [exe, *[x for a in args for x in ("-i", a)], "--list"]
            t0 = time.perf_counter()
            subprocess.run(cmd, cwd=case, capture_output=True, check=False)
            ans = f"{(time.perf_counter() - t0) * 1000:.0f}"
        print(f"{case.name:34} {len(inv.hosts):5d} {len(inv.groups):6d} {best * 1000:11.1f} {ans:>10}")


if __name__ == "__main__":
    main()
