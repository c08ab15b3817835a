"""The pure core stays readable: no function or method in ``src/llmfleet/knowledge/`` is longer than
100 lines (from its ``def`` to its last line, nested functions included in their parent's count and
checked on their own). A longer one is split into named steps."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KNOWLEDGE = Path(__file__).resolve().parents[1] / "src" / "llmfleet" / "knowledge"
LIMIT = 100


def long_functions(root: Path, limit: int = LIMIT) -> list[str]:
    """``path:line name (n lines)`` for every function under ``root`` longer than ``limit`` lines."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_in_knowledge_is_over_100_lines():
    assert long_functions(KNOWLEDGE) == []


@pytest.mark.parametrize(("body_lines", "too_long"), [(98, False), (99, False), (100, True), (150, True)])
def test_the_check_counts_from_def_to_the_last_line(tmp_path, body_lines, too_long):
    # def line + body_lines lines: 99 body lines make a 100-line function, the limit itself
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n\nclass C:\n    def g(self):\n{body.replace('    ', '        ')}")
    found = long_functions(tmp_path)
    assert bool(found) is too_long
    if too_long:
        assert found == [f"m.py:1 f ({body_lines + 1} lines)", f"m.py:{body_lines + 5} g ({body_lines + 1} lines)"]
