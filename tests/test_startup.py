"""Listing tasks and showing a task's help import nothing heavy (start-up stays a fraction of a second).

`invoke --list` and `invoke --help TASK` need only the task definitions: no terminal tables (rich), no
models (pydantic), no HTTP (httpx), no templates (jinja2), no SSH (paramiko, fabric, cryptography), no
model files (gguf, numpy) and no catalogs (llmfleet.knowledge). bench/startup_bench.py measures the time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("rich", "pydantic", "httpx", "jinja2", "gguf", "numpy", "paramiko", "fabric", "cryptography",
         "llmfleet.knowledge", "llmfleet.release", "llmfleet.host")

_PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: sys.stderr.write('@@modules ' + ' '.join(sorted(sys.modules)) + '\\n'))\n"
    "from invoke.main import program\n"
    "program.run(['invoke', *sys.argv[1:]])\n"
)


def modules_imported_by(*argv: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("@@modules "))
    return set(line.split()[1:])


@pytest.mark.parametrize("argv", [("--list",), ("--help", "deploy"), ("--help", "upgrade")])
def test_listing_and_help_import_no_heavy_module(argv):
    mods = modules_imported_by(*argv)
    assert "llmfleet.cli" in mods  # the probe did load the task collection
    heavy = sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not heavy, f"`invoke {' '.join(argv)}` imported {', '.join(heavy)}: import them inside the task body"
