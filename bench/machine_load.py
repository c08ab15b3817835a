"""What the benches say about the machine they ran on, and the busy condition they measure under.

Imported by the bench scripts (``python bench/NAME.py`` puts this folder on ``sys.path``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


class Burner:
    """One CPU-bound process per core while the ``with`` lasts (a busy machine)."""

    def __enter__(self) -> Burner:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
        time.sleep(1.0)  # let the load take hold
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(timeout=10)
