"""What llmfleet prints and ships cites public sources (an issue, a PR, a file at a commit, a URL), never a
file its users do not have (a private reference sheet, measurement notes, seed folders)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRIVATE = re.compile(r"engines-gpus-drivers\.md|decode-measurements\.md|\blab-facts\b|device-notes\.md|"
                     r"ops-tools-anchors\.md|\bseeds/|\.\./shared/|\bfact sheet\b|\breference set\b|"
                     r"\bids? \d{9,}")  # "id 70417149504": a search hit no reader can open
# Still citing private notes: shrink this list, never grow it.
PENDING: set[str] = set()


def shipped() -> list[Path]:
    files = [p for p in (REPO / "src").rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".yml", ".j2", ".sh")]
    files += sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
    return [p for p in files if "__pycache__" not in p.parts]


def test_nothing_cites_a_file_users_do_not_have():
    found = []
    for p in shipped():
        rel = str(p.relative_to(REPO))
        if rel in PENDING:
            continue
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if PRIVATE.search(line):
                found.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


def test_the_pending_list_only_shrinks():
    still = {rel for rel in PENDING if (REPO / rel).exists() and PRIVATE.search((REPO / rel).read_text(encoding="utf-8"))}
    assert still == PENDING, f"no private citation left in {sorted(PENDING - still)}: drop them from PENDING"
