"""Print (or write into docs/planner.md) the health-floor table: per catalog card, the speed model's
resident decode range for Llama-3.1-8B Q4_K_M on llama.cpp at the health probe's context, the range
with one eighth of the layers in host memory, the default floor a deploy applies (0.5 x the resident
low end) and whether that floor catches such an offload (always / sometimes / no).

Pure arithmetic from the catalogs (no GPU). Run: python bench/planner_floor_table.py [--write]
tests/test_planner_models.py checks the docs table equals this output.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))


def write_between_markers(marker: str, table: str, doc: Path = REPO / "docs/planner.md") -> bool:
    """Replace what stands between ``<!-- marker -->`` and ``<!-- /marker -->`` in ``doc``; False (and a
    line on stderr) when the markers are not there once."""
    text = doc.read_text(encoding="utf-8")
    new, n = re.subn(rf"<!-- {marker} -->\n.*?\n<!-- /{marker} -->",
                     lambda _: f"<!-- {marker} -->\n{table}\n<!-- /{marker} -->", text, flags=re.S)
    if n != 1:
        print(f"{doc.relative_to(REPO)}: no <!-- {marker} --> markers", file=sys.stderr)
        return False
    doc.write_text(new, encoding="utf-8")
    return True


def main() -> int:
    from test_planner_models import render_floor_table

    table = render_floor_table()
    if "--write" in sys.argv[1:] and not write_between_markers("floor-table", table):
        return 2
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
