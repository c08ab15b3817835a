"""Engine knowledge, one module per engine over one interface (``base.EngineKnowledge``).

``for_engine("vllm")`` gives the engine's knowledge: its flag rules on a card, what it needs from an
image, how its builds lay out the KV cache, its health endpoint and metric names, and the flags for
a plan. The per-release facts stay in ``catalog/engines.yaml``; ``base``'s docstring lists what a new
engine must provide.
"""

from __future__ import annotations

from llmfleet.errors import UsageError
from llmfleet.knowledge.engines.base import EngineKnowledge, KvLayoutInfo

__all__ = ["ENGINES", "EngineKnowledge", "KvLayoutInfo", "for_engine", "names"]


def _load() -> dict[str, EngineKnowledge]:
    from llmfleet.knowledge.engines import llamacpp, vllm

    return {k.name: k for k in (vllm.KNOWLEDGE, llamacpp.KNOWLEDGE)}


ENGINES: dict[str, EngineKnowledge] = {}


def for_engine(name: str) -> EngineKnowledge:
    if not ENGINES:
        ENGINES.update(_load())
    try:
        return ENGINES[name]
    except KeyError:
        raise UsageError(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}") from None


def names() -> list[str]:
    if not ENGINES:
        ENGINES.update(_load())
    return sorted(ENGINES)
