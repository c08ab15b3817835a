"""The audit trail: one JSON line per action, on each host (``<root>/audit.jsonl``) and on the
workstation that ran llmfleet (``llmfleet.audit_log`` in invoke.yaml).

Pure apart from ``read_local`` / ``append_local`` (the local file). The remote read is a script the
caller runs over SSH; ``parse_lines`` reads its output. A line that is not a JSON object is kept as
``{"raw": ...}`` so that nothing in the log is hidden, and never crashes the reader.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.release.store import audit_path

MAX_LINES = 10_000  # the most lines one `audit -n` asks for
_TAIL_CHUNK = 64 * 1024

COLUMNS = ("time", "host", "who", "action", "service", "release", "image_digest", "result", "detail")


def check_count(n: int) -> int:
    try:
        n = int(n)
    except (TypeError, ValueError):
        raise UsageError(f"-n: {n!r} is not a number") from None
    if not 1 <= n <= MAX_LINES:
        raise UsageError(f"-n: {n} is out of range; give 1 to {MAX_LINES}")
    return n


def tail_script(root: str, n: int) -> str:
    """The last ``n`` lines of the host's audit log; ``@@none`` when there is none yet."""
    path = shlex.quote(audit_path(root))
    return f"if [ -f {path} ]; then tail -n {int(n)} {path}; else echo '@@none'; fi"


def parse_lines(text: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line == "@@none":
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        out.append(rec if isinstance(rec, dict) else {"raw": line[:500]})
    return out


def read_local(path: str | os.PathLike[str], n: int) -> list[dict[str, Any]]:
    """The last ``n`` records of the local audit log (reads only the file's tail)."""
    p = Path(os.path.expanduser(str(path)))
    if not p.exists():
        return []
    size = p.stat().st_size
    want = n + 1
    with p.open("rb") as fh:
        offset = size
        data = b""
        while offset > 0 and data.count(b"\n") <= want:
            step = min(_TAIL_CHUNK, offset)
            offset -= step
            fh.seek(offset)
            data = fh.read(step) + data
    lines = data.decode("utf-8", "replace").splitlines()
    if offset > 0:
        lines = lines[1:]  # the first line may be cut
    return parse_lines("\n".join(lines[-n:]))


def append_local(path: str | os.PathLike[str], records: dict[str, Any] | Iterable[dict[str, Any]]) -> None:
    """Append records to the local audit log: the one writer of that file. Created 0600 (its folder
    0700), so a shared workstation's other users cannot read who deployed what."""
    recs = [records] if isinstance(records, dict) else list(records)
    if not recs:
        return
    p = Path(os.path.expanduser(str(path)))
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r, separators=(",", ":"), default=str) + "\n" for r in recs))


def merged(records: Iterable[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Records from several hosts as one timeline, oldest first, the last ``n`` kept."""
    recs = list(records)
    recs.sort(key=lambda r: str(r.get("time", "")))
    return recs[-n:]


def short(value: Any, width: int = 12) -> str:
    if value is None or value == "":
        return "-"
    text = str(value)
    if text.startswith("sha256:"):
        return text[7 : 7 + width]
    return text


def row(rec: dict[str, Any]) -> list[str]:
    """A record as table cells, in ``COLUMNS`` order."""
    if "raw" in rec and len(rec) <= 2:
        return ["?", str(rec.get("host", "-")), "-", "-", "-", "-", "-", "-", rec["raw"][:120]]
    cells = []
    for col in COLUMNS:
        v = rec.get(col)
        if col == "image_digest":
            cells.append(short(v))
        elif col == "detail":
            cells.append(str(v)[:120] if v else "")
        else:
            cells.append("-" if v in (None, "") else str(v))
    return cells
