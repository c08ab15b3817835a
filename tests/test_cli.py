"""The task surface: every task and flag documented; `llmfleet` and `invoke` run the same collection."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.cli import ns

REPO = Path(__file__).resolve().parents[1]
LLMFLEET = str(Path(sys.executable).parent / "llmfleet")


def all_tasks():
    for name in ns.task_names:
        yield name, ns[name]


@pytest.mark.parametrize(("name", "task"), list(all_tasks()), ids=[n for n, _ in all_tasks()])
def test_every_task_has_a_help_line_and_every_flag_is_documented(name, task):
    doc = inspect.getdoc(task.body) or ""
    assert doc.strip(), f"task {name} has no docstring (its line in --list)"
    params = [p for p in inspect.signature(task.body).parameters if p not in ("c", "ctx")]
    undocumented = [p for p in params if p not in (task.help or {})]
    assert not undocumented, f"task {name}: flags without help: {undocumented}"


def test_console_script_and_invoke_list_the_same_tasks():
    a = subprocess.run([sys.executable, "-m", "invoke", "--list"], cwd=REPO, capture_output=True, text=True, timeout=60)
    b = subprocess.run([LLMFLEET, "--list"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert a.returncode == b.returncode == 0
    names = lambda out: sorted(line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.strip() and not line.startswith("    "))  # noqa: E731
    assert names(a.stdout) == names(b.stdout)
    assert "inventory" in names(a.stdout)


def test_console_script_reads_invoke_yaml_from_the_working_directory(tmp_path):
    inv = tmp_path / "fleet"
    inv.mkdir()
    (inv / "hosts.yml").write_text("g:\n  hosts:\n    only-host:\n      x: 1\n")
    (tmp_path / "invoke.yaml").write_text(f"llmfleet:\n  inventory: {inv}\n")
    res = subprocess.run([LLMFLEET, "inventory", "--host", "only-host"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert '"x": 1' in res.stdout


def test_env_var_overrides_the_default_inventory(tmp_path):
    inv = tmp_path / "fleet"
    inv.mkdir()
    (inv / "hosts.yml").write_text("g:\n  hosts:\n    env-host:\n")
    res = subprocess.run(
        [sys.executable, "-m", "invoke", "inventory", "--list"], cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "INVOKE_LLMFLEET_INVENTORY": str(inv)},
    )
    assert res.returncode == 0, res.stderr
    assert "env-host" in res.stdout


def test_listing_the_tasks_imports_no_heavy_module():
    """Task modules import rich, pydantic, httpx, jinja2, paramiko (and the like) inside task bodies:
    `invoke --list` and shell completion never pay for them."""
    heavy = ("rich", "pydantic", "httpx", "jinja2", "paramiko", "fabric", "prometheus_client", "numpy", "gguf")
    code = ("import sys, llmfleet.cli; "
            f"print(','.join(m for m in {heavy!r} if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ""


def test_shell_completion_offers_the_chosen_flags():
    res = subprocess.run([sys.executable, "-m", "invoke", "--complete", "--", "invoke", "deploy", "--"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    flags = set(res.stdout.split())
    assert {"--limit", "--host", "--forks", "--check", "--diff", "--verbose", "--inventory"} <= flags
