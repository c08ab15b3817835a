"""An installed llmfleet wheel, outside the checkout: built with `python -m build`, installed with pip into
a fresh virtualenv under a temporary folder (shared by the wheel tests of one session).

The wheel is installed with ``--no-deps``; its dependencies come from the virtualenv running the tests,
added as a plain path (a ``.pth`` line: that folder's own ``.pth`` files, the checkout's editable
install among them, are not read), so ``import llmfleet`` can only find the wheel. With
``LLMFLEET_TEST_WHEEL_DEPS=pip`` pip resolves and installs the dependencies too, as a user's
``pip install llmfleet-ops`` would (from the package index pip is configured with; slower).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class InstalledWheel:
    wheel: Path
    venv: Path

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def llmfleet(self) -> str:
        return str(self.venv / "bin" / "llmfleet")

    def metadata(self) -> str:
        with zipfile.ZipFile(self.wheel) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            return z.read(name).decode()

    def names(self) -> list[str]:
        with zipfile.ZipFile(self.wheel) as z:
            return z.namelist()

    def run(self, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120):
        return subprocess.run([self.llmfleet, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env={**clean_env(), "COLUMNS": "200", **(env or {})})


def clean_env() -> dict[str, str]:
    """This process's environment without what points Python or Invoke at the checkout."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("INVOKE_", "PYTHONPATH", "VIRTUAL_ENV"))}


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, env=clean_env(), **kw)
    if res.returncode != 0:
        raise AssertionError(f"{argv[:4]} exited {res.returncode}: {(res.stdout + res.stderr)[-3000:]}")
    return res


def build_and_install(tmp: Path) -> InstalledWheel:
    # Build from a copy of what the wheel is made of: two builds at once (pytest-xdist workers) never
    # share setuptools' build/ folder, and the checkout is left as it was.
    source = tmp / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    dist = tmp / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)], timeout=600)
    (wheel,) = dist.glob("llmfleet_ops-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if os.environ.get("LLMFLEET_TEST_WHEEL_DEPS") == "pip":
        _run([*pip, "--find-links", str(dist), "llmfleet-ops"], timeout=900)
    else:
        # by its distribution name, as a user's `pip install llmfleet-ops` would (offline: from dist/)
        _run([*pip, "--no-deps", "--no-index", "--find-links", str(dist), "llmfleet-ops"], timeout=300)
        site = Path(_run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                    .stdout.strip())
        (site / "llmfleet-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return InstalledWheel(wheel=wheel, venv=venv)
