"""Real inventories from public projects resolve exactly as ``ansible-inventory`` resolves them.

Each case holds the ``-i`` arguments (``INVENTORY``) and ansible-core's own ``--list`` and ``--host``
output, recorded beside it. The cases in ``tests/data/realinv`` always run; the full collection in
``../shared/realinv`` (beside the repository) runs when that folder is present.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llmfleet.inventory.ansible import load_inventory

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / "tests" / "data" / "realinv"
SHARED = Path(os.environ.get("LLMFLEET_REALINV") or ROOT.parent / "shared" / "realinv")


def _cases(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if (p / "expected.json").is_file())


def _params():
    for case in _cases(LOCAL):
        yield pytest.param(case, id=f"local/{case.name}")
    shared = _cases(SHARED)
    if not shared:
        yield pytest.param(None, id="shared", marks=pytest.mark.skip(
            reason=f"{SHARED} is absent (the full collection lives beside the repository); local cases still run"))
    for case in shared:
        yield pytest.param(case, id=f"shared/{case.name}")


def _args(case: Path) -> list[str]:
    return [line for line in (case / "INVENTORY").read_text().splitlines() if line]


def _plain(doc):
    return json.loads(json.dumps(doc))


def test_local_subset_is_there() -> None:
    assert len(_cases(LOCAL)) >= 6


@pytest.mark.parametrize("case", list(_params()))
def test_list_and_host_match_ansible_inventory(case: Path) -> None:
    inv = load_inventory(_args(case), cwd=case)
    assert _plain(inv.to_ansible_list()) == json.loads((case / "expected.json").read_text())
    for host, expected in json.loads((case / "expected-hosts.json").read_text()).items():
        assert _plain(inv.host_json(host)) == expected, host
