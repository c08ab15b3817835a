"""A hint never suggests a command that writes to a path the user gave as input: `preflight --facts
inventory/hosts.yml` (the wrong file) must not suggest `... > inventory/hosts.yml`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LLMFLEET = str(Path(sys.executable).parent / "llmfleet")


@pytest.mark.parametrize(("name", "text"), [
    ("inventory/hosts.yml", None),  # the inventory itself: not JSON
    ("facts.json", '{"hosts": [{"host": "other"}]}'),  # JSON, but not this host's facts
    ("facts-gpu-v100-01.json", '{"hosts": [{"host": "other"}]}'),  # the very name a hint would pick
])
def test_the_facts_hint_names_another_file(tmp_path, name, text):
    shutil.copytree(REPO / "inventory/example", tmp_path / "inventory")
    given = tmp_path / name
    if text is not None:
        given.write_text(text)
    before = given.read_bytes()
    res = subprocess.run([LLMFLEET, "preflight", "--host", "gpu-v100-01", "--facts", name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    hint = res.stderr.split("save", 1)[1]
    assert name not in hint and ">" not in hint, res.stderr
    assert "llmfleet facts --host gpu-v100-01 --out facts-gpu-v100-01" in hint
    assert given.read_bytes() == before
