"""Engine metrics from ``/metrics`` (Prometheus text), normalised across vLLM and llama.cpp.

Pure. The two engines name the same things differently, and names change between releases (vLLM's
``gpu_cache_usage_perc`` became ``kv_cache_usage_perc``; llama.cpp dropped ``kv_cache_usage_ratio``),
so each field lists every name it is known by, newest first, and is ``None`` when none is present.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass


# field -> names by engine, newest first (each engine's module in llmfleet.knowledge.engines holds its own)
def _names() -> dict[str, dict[str, tuple[str, ...]]]:
    from llmfleet.knowledge import engines

    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for name in engines.names():
        for field, metric_names in engines.for_engine(name).metrics.items():
            out.setdefault(field, {})[name] = metric_names
    return out


NAMES: dict[str, dict[str, tuple[str, ...]]] = _names()

_LINE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>[-+]?(?:[0-9.]+(?:[eE][-+]?\d+)?|NaN|[+-]?Inf))(?:\s+\d+)?$"
)
MAX_LINES = 100_000


@dataclass(frozen=True)
class EngineMetrics:
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    generation_tokens_total: float | None = None
    prompt_tokens_total: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum samples per metric name (labels such as model_name or engine are summed over)."""
    out: dict[str, float] = {}
    for i, line in enumerate(text.splitlines()):
        if i >= MAX_LINES:
            break
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        name = m.group("name")
        out[name] = out.get(name, 0.0) + value
    return out


def engine_metrics(engine: str, text: str) -> EngineMetrics:
    samples = parse_prometheus(text)
    values: dict[str, float | None] = {}
    for field, by_engine in NAMES.items():
        values[field] = next((samples[n] for n in by_engine.get(engine, ()) if n in samples), None)
    return EngineMetrics(**values)
