"""Engine metrics from ``/metrics`` (Prometheus text), normalised across vLLM and llama.cpp.

Pure. The two engines name the same things differently, and names change between releases (vLLM's
``gpu_cache_usage_perc`` became ``kv_cache_usage_perc``; llama.cpp dropped ``kv_cache_usage_ratio``),
so each field lists every name it is known by, newest first, and is ``None`` when none is present.
"""

from __future__ import annotations

import math
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

# How a field combines several series of one name (labels such as model_name, or vLLM's engine label:
# one series per engine core when it runs data parallel). Counts and token counters add up; the
# KV-cache usage is a share of one engine's cache, so several engines give the fullest one's share
# (adding 0.6 and 0.7 would claim a 130 % full cache).
COMBINE: dict[str, str] = {
    "requests_running": "sum",
    "requests_waiting": "sum",
    "kv_cache_usage": "max",
    "generation_tokens_total": "sum",
    "prompt_tokens_total": "sum",
}
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


Sample = tuple[str, dict[str, str], float]


def samples(text: str) -> list[Sample]:
    """Every sample (name, labels, value) of a Prometheus text exposition, read with
    ``prometheus_client``'s parser (label values may hold any character, ``}`` and escaped quotes
    included). A line the parser refuses is skipped, not the whole page; NaN values are dropped."""
    from prometheus_client.parser import text_string_to_metric_families

    lines = text.splitlines()[:MAX_LINES]
    body = "\n".join(lines) + "\n"
    try:
        found = [(s.name, dict(s.labels), float(s.value))
                 for fam in text_string_to_metric_families(body) for s in fam.samples]
    except (ValueError, TypeError, IndexError, KeyError):
        found = []
        for line in lines:  # the page has a bad line somewhere: read line by line, skip the bad ones
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                for fam in text_string_to_metric_families(line + "\n"):
                    found.extend((s.name, dict(s.labels), float(s.value)) for s in fam.samples)
            except (ValueError, TypeError, IndexError, KeyError):
                continue
    return [(n, labels, v) for n, labels, v in found if not math.isnan(v)]


def parse_prometheus(text: str, combine: dict[str, str] | None = None) -> dict[str, float]:
    """One value per metric name over its series: summed, or the largest for names ``combine``
    maps to ``"max"``."""
    how = combine or {}
    out: dict[str, float] = {}
    for name, _labels, value in samples(text):
        if name not in out:
            out[name] = value
        elif how.get(name) == "max":
            out[name] = max(out[name], value)
        else:
            out[name] += value
    return out


def engine_metrics(engine: str, text: str) -> EngineMetrics:
    combine = {n: COMBINE[field] for field, by_engine in NAMES.items() for names in by_engine.values()
               for n in names}
    values_by_name = parse_prometheus(text, combine)
    values: dict[str, float | None] = {}
    for field, by_engine in NAMES.items():
        values[field] = next((values_by_name[n] for n in by_engine.get(engine, ()) if n in values_by_name), None)
    return EngineMetrics(**values)
