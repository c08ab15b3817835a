"""No function over 100 lines in the deploy pipeline, the host layer or the health package: a longer
one is split into named steps (docs/architecture.md "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

import llmfleet

MAX_LINES = 100
PACKAGES = ("release", "host", "health")
ROOT = Path(llmfleet.__file__).parent


def _too_long(package: str) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > MAX_LINES:
                    out.append(f"{path.relative_to(ROOT.parent)}:{first}: {node.name} is {lines} lines")
    return out


def test_no_function_over_100_lines() -> None:
    too_long = [line for package in PACKAGES for line in _too_long(package)]
    assert not too_long, "split into named steps:\n" + "\n".join(too_long)


def test_the_walk_sees_every_package() -> None:
    for package in PACKAGES:
        assert any((ROOT / package).rglob("*.py")), package
