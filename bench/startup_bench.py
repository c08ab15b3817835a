"""Start-up: whole-process wall time of `invoke --list` and `invoke --help deploy`, median of N runs.

    python bench/startup_bench.py [-n 7] [--src before=/tmp/base/src,after=src]

Each command runs as its own process from the project root (as a user types it: the venv's `invoke`
reading tasks.py), alternating the sources compared so both sides see the same machine load. Printed
per command and side: median wall, min-max spread, median CPU (user+sys of the process), and which
heavy modules the process imported (``-X importtime``, one extra run). The machine's load is printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("rich", "pydantic", "httpx", "jinja2", "gguf", "numpy", "paramiko", "fabric", "yaml", "cryptography")
COMMANDS = {"invoke --list": ["--list"], "invoke --help deploy": ["--help", "deploy"]}


def invoke_bin() -> str:
    here = Path(sys.executable).with_name("invoke")
    return str(here) if here.exists() else (shutil.which("invoke") or "invoke")


def _env(src: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(src))
    # As on a user's machine, Python keeps compiled bytecode (some shells here set this variable, which
    # makes every start compile every module again).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def one(argv: list[str], src: Path) -> tuple[float, float]:
    env = _env(src)
    t0 = time.monotonic()
    proc = subprocess.Popen([invoke_bin(), *argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"`invoke {' '.join(argv)}` failed with PYTHONPATH={src}")
    return wall, ru.ru_utime + ru.ru_stime


def heavy_imported(argv: list[str], src: Path) -> list[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", invoke_bin(), *argv], cwd=ROOT, env=_env(src),
                          capture_output=True, text=True, timeout=120)
    names = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return sorted(h for h in HEAVY if h in names)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=7, help="runs per command and side (default 7)")
    p.add_argument("--src", default=f"this={ROOT / 'src'}", help="NAME=PATH,... package sources to compare")
    a = p.parse_args()
    sources = {k: Path(v).resolve() for k, v in (x.split("=", 1) for x in a.src.split(","))}
    print(f"{a.n} runs each, alternating sides; load before {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for label, argv in COMMANDS.items():
        for src in sources.values():
            one(argv, src)  # warm the page cache and .pyc files: a user's second run, not the first ever
        walls: dict[str, list[float]] = {s: [] for s in sources}
        cpus: dict[str, list[float]] = {s: [] for s in sources}
        for _ in range(max(1, a.n)):
            for side, src in sources.items():
                w, c = one(argv, src)
                walls[side].append(w)
                cpus[side].append(c)
        for side, src in sources.items():
            w = walls[side]
            print(f"{label:<22} {side:<8} median {statistics.median(w):.3f}s (spread {min(w):.3f}-{max(w):.3f}s), "
                  f"cpu {statistics.median(cpus[side]):.3f}s; heavy modules: "
                  f"{', '.join(heavy_imported(argv, src)) or 'none'}")
    print(f"load after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
