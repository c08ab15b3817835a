"""The CLI side of inventories: ``-i`` is repeatable on every task that reads one, and
``invoke inventory --list`` run from a case folder prints what ``ansible-inventory`` printed there."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from llmfleet.cli import ns

REPO = Path(__file__).resolve().parents[1]


def _tasks(coll, prefix=""):
    for name, t in coll.tasks.items():
        yield prefix + name, t
    for cname, sub in coll.collections.items():
        yield from _tasks(sub, f"{prefix}{cname}.")


def test_every_task_that_reads_an_inventory_takes_several_i() -> None:
    takers = [(n, t) for n, t in _tasks(ns) if "inventory" in inspect.signature(t.body).parameters]
    assert len(takers) >= 10
    assert [n for n, t in takers if "inventory" not in t.iterable] == []


def test_cli_list_with_two_sources_matches_ansible(tmp_path: Path) -> None:
    (tmp_path / "static.yml").write_text("all:\n  hosts:\n    h0: {tier: gold}\n")
    (tmp_path / "constructed.yml").write_text("plugin: constructed\nkeyed_groups:\n  - key: tier\n")
    (tmp_path / "hosts").write_text("[db]\nd1 ansible_port=2201\n")
    res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), "inventory", "--list", "-i", "static.yml",
                          "-i", "hosts", "-i", "constructed.yml", "-i", "x1,x2"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    exe = shutil.which("ansible-inventory") or str(Path(sys.executable).parent / "ansible-inventory")
    expected = subprocess.run([exe, "-i", "static.yml", "-i", "hosts", "-i", "constructed.yml", "-i", "x1,x2", "--list"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True,
                              env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
                                   "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".t")}).stdout
    assert doc == json.loads(expected)
    assert doc["_gold"] == {"hosts": ["h0"]} and doc["db"] == {"hosts": ["d1"]}
