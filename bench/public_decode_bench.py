"""Print (or write into docs/planner.md) the public record of batch-1 decode speed against the planner:
for every figure in catalog/decode_public.yaml its card, model, quant, test, build, the measured tok/s,
the speed model's predicted range for it (its context and CUDA-graph state), the default health floor
the planner would apply, whether it was offloaded, and the source; then the two counts

  healthy runs the default floor would fail     (goal 0)
  known offloaded runs the default floor passes (goal 0; tests/test_public_decode.py lists the exceptions)

Pure arithmetic from the catalogs (no GPU). Run: python bench/public_decode_bench.py [--write]
tests/test_public_decode.py checks every row and that the docs table equals this output.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))


def main() -> int:
    from planner_floor_table import write_between_markers

    from test_public_decode import OFFLOAD_EXCEPTIONS, OUT_OF_SCOPE, counts, render_public_table, rows

    rs = rows()
    table = render_public_table(rs)
    if "--write" in sys.argv[1:] and not write_between_markers("public-decode", table):
        return 2
    print(table)
    failed, passed = counts(rs)
    healthy = [r for r in rs if not r.fig.offloaded]
    print()
    print(f"figures: {len(rs)} ({len(healthy)} healthy, {len(rs) - len(healthy)} offloaded) on "
          f"{len({r.fig.card.id for r in rs})} cards")
    print(f"healthy figures outside the predicted range: {sum(1 for r in healthy if not r.in_range)} "
          f"(out of scope: {', '.join(OUT_OF_SCOPE) or 'none'})")
    print(f"healthy runs the default floor would fail: {failed}")
    print(f"known offloaded runs the default floor would pass: {passed} "
          f"(exceptions: {', '.join(OFFLOAD_EXCEPTIONS) or 'none'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
