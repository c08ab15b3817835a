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


def main() -> int:
    from test_planner_models import render_floor_table

    table = render_floor_table()
    if "--write" in sys.argv[1:]:
        doc = REPO / "docs/planner.md"
        text = doc.read_text(encoding="utf-8")
        new, n = re.subn(r"<!-- floor-table -->\n.*?\n<!-- /floor-table -->",
                         lambda _: f"<!-- floor-table -->\n{table}\n<!-- /floor-table -->", text, flags=re.S)
        if n != 1:
            print("docs/planner.md: no <!-- floor-table --> markers", file=sys.stderr)
            return 2
        doc.write_text(new, encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
