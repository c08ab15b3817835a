"""Did you mean": the closest known name to a mistyped one (difflib), for error lines."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close_matches(word: str, known: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """Known names close to ``word``, best first; compared without case, returned as spelled."""
    by_lower: dict[str, str] = {}
    for k in known:
        by_lower.setdefault(str(k).lower(), str(k))
    found = difflib.get_close_matches(str(word).lower(), list(by_lower), n=n, cutoff=cutoff)
    return [by_lower[f] for f in found]


def did_you_mean(word: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """``" (did you mean 'x'?)"`` or ``""``: a suffix for an error line. A second name is offered only
    when it is about as close as the first."""
    found = close_matches(word, known, n=2, cutoff=cutoff)
    if not found:
        return ""
    ratio = [difflib.SequenceMatcher(None, str(word).lower(), f.lower()).ratio() for f in found]
    found = [f for f, r in zip(found, ratio, strict=True) if r >= ratio[0] - 0.05]
    return f" (did you mean {' or '.join(repr(f) for f in found)}?)"
