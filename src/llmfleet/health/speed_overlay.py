"""A local speed overlay: the fleet's measured decode figures per card class, as a catalog-like YAML
file (``invoke speed --write PATH`` writes it; docs/planner.md "The fleet's measurements").

The planner's speed model lives in the catalog (planner.yaml: a bandwidth efficiency per engine and
memory class). The overlay does not change it: it sits beside it, one entry per card class (card,
engine, model, quant, context class, split) with what was measured, the efficiency that fits it and
where it came from ("measured on HOST at DATE"). ``invoke plan`` shows an overlay's entry for the
plan beside the prediction when ``llmfleet.speed_overlay`` names the file (invoke.yaml or
``INVOKE_LLMFLEET_SPEED_OVERLAY``); a site can keep one file in version control and hand it to
operators who have not read the hosts themselves.

Pure: ``overlay_document`` / ``overlay_text`` build the file, ``parse_overlay`` reads it back and never
raises (what it cannot read is a problem line, not an error).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llmfleet.health.speed_history import ClassSummary, SpeedKey

SCHEMA = "llmfleet.speed-overlay/1"
HEADER = """\
# llmfleet speed overlay: decode speeds this fleet measured, per card class (written by `invoke speed
# --write`). Each entry: the class (card, engine, model, quant, context class, GPUs per host, hosts),
# the healthy runs' batch-1 decode (count, min, max, median tok/s), the planner's prediction and
# bandwidth efficiency for it, the efficiency that fits the measurement, and where it was measured.
# `invoke plan` shows the entry for its plan when llmfleet.speed_overlay names this file
# (docs/planner.md). The planner's own figures stay in its catalog (planner.yaml).
"""


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) and f > 0 else None


def _pair(v: Any) -> tuple[float, float] | None:
    if isinstance(v, list | tuple) and len(v) == 2:
        a, b = _num(v[0]), _num(v[1])
        if a is not None and b is not None:
            return (min(a, b), max(a, b))
    return None


@dataclass(frozen=True)
class OverlayEntry:
    card: str
    engine: str
    model: str
    quant: str
    context: str
    gpus: int
    hosts: int
    count: int
    low: float
    high: float
    median: float
    source: str
    predicted: tuple[float, float] | None = None
    ceiling: float | None = None
    efficiency: tuple[float, float] | None = None
    fitted: float | None = None
    images: tuple[str, ...] = ()

    @property
    def card_class(self) -> tuple[str, str, str, str, str, int, int]:
        return (self.card, self.engine, self.model, self.quant, self.context, self.gpus, self.hosts)

    def line(self) -> str:
        """``overlay: 117-121 tok/s (median 119, 3 runs; measured on ...)``"""
        spread = f"{self.low:g}" if self.low == self.high else f"{self.low:g}-{self.high:g}"
        fit = f"; fitted efficiency {self.fitted:.2f}" if self.fitted is not None else ""
        return f"{spread} tok/s (median {self.median:g}, {self.count} run(s){fit}; {self.source})"


def entry_document(s: ClassSummary) -> dict[str, Any]:
    return {
        "card": s.card, "engine": s.engine, "model": s.model, "quant": s.quant, "context": s.context,
        "gpus": s.gpus, "hosts": s.hosts, "images": list(s.images),
        "decode_tokps": {"count": s.count, "min": s.low, "max": s.high, "median": s.median},
        "predicted_tokps": list(s.predicted) if s.predicted else None,
        "ceiling_tokps": s.ceiling,
        "efficiency": {"planner": list(s.efficiency) if s.efficiency else None, "fitted": s.fitted},
        "source": s.source,
    }


def overlay_document(summaries: Iterable[ClassSummary], written: datetime) -> dict[str, Any]:
    return {"schema": SCHEMA, "written": written.astimezone(UTC).isoformat(timespec="seconds"),
            "entries": [entry_document(s) for s in summaries]}


def overlay_text(doc: dict[str, Any]) -> str:
    import yaml

    return HEADER + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)


def _entry(d: Any) -> OverlayEntry | str:
    if not isinstance(d, dict):
        return "not a mapping"
    def text_of(k: str) -> str:
        v = d.get(k)
        return v if isinstance(v, str) else ""

    text = {k: text_of(k) for k in ("card", "engine", "model", "quant", "context", "source")}
    missing = [k for k in ("card", "engine", "model", "source") if not text[k]]
    if missing:
        return f"needs {', '.join(missing)}"
    raw_dec = d.get("decode_tokps")
    dec: dict[str, Any] = raw_dec if isinstance(raw_dec, dict) else {}
    low, high, median = _num(dec.get("min")), _num(dec.get("max")), _num(dec.get("median"))
    count = dec.get("count")
    if low is None or high is None or median is None or not isinstance(count, int) or isinstance(count, bool) \
            or count < 1 or not low <= median <= high:
        return "decode_tokps needs count >= 1 and min <= median <= max (positive tok/s)"
    raw_eff = d.get("efficiency")
    eff: dict[str, Any] = raw_eff if isinstance(raw_eff, dict) else {}

    def whole(k: str) -> int:
        v = d.get(k)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else 1

    images = d.get("images")
    return OverlayEntry(
        card=text["card"], engine=text["engine"], model=text["model"],
        quant=text["quant"], context=text["context"] or "?",
        gpus=whole("gpus"), hosts=whole("hosts"), count=count, low=low, high=high, median=median,
        source=text["source"], predicted=_pair(d.get("predicted_tokps")), ceiling=_num(d.get("ceiling_tokps")),
        efficiency=_pair(eff.get("planner")), fitted=_num(eff.get("fitted")),
        images=tuple(str(i) for i in images) if isinstance(images, list) else (),
    )


def parse_overlay(text: str) -> tuple[list[OverlayEntry], list[str]]:
    """(entries, problems) of an overlay file's text; never raises."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return [], [f"not YAML: {str(exc).splitlines()[0]}"]
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return [], [f"not a speed overlay (schema: {SCHEMA})"]
    raw = doc.get("entries")
    if not isinstance(raw, list):
        return [], ["entries: needs a list"]
    entries: list[OverlayEntry] = []
    problems: list[str] = []
    for i, d in enumerate(raw):
        e = _entry(d)
        if isinstance(e, str):
            problems.append(f"entries[{i}]: {e}")
        else:
            entries.append(e)
    return entries, problems


def entry_for(entries: Iterable[OverlayEntry], key: SpeedKey | None) -> OverlayEntry | None:
    """The entry of ``key``'s card class (any image), or None."""
    if key is None:
        return None
    return next((e for e in entries if e.card_class == key.card_class), None)
