"""Engine knowledge, one module per engine over one interface (``base.EngineKnowledge``).

``for_engine("vllm")`` gives the engine's knowledge: its flag rules on a card, what it needs from an
image, how its builds lay out the KV cache, its health endpoint and metric names, the flags for a
plan, and how it runs over several hosts. ``names()`` lists the engines (every closed list of engine
names asks it), ``for_cluster_kind("rpc")`` finds the engine by its multi-host runtime, and
``for_quant_family("gguf")`` the engine a plan without --engine gets for a quant of that family. The
per-release facts stay in ``catalog/engines.yaml``; ``base``'s docstring lists what a new engine must
provide.
"""

from __future__ import annotations

from llmfleet.errors import UsageError
from llmfleet.knowledge.engines.base import EngineKnowledge, KvLayoutInfo

__all__ = ["ENGINES", "EngineKnowledge", "KvLayoutInfo", "for_cluster_kind", "for_engine", "for_quant_family",
           "names"]


def _load() -> dict[str, EngineKnowledge]:
    from llmfleet.knowledge.engines import llamacpp, vllm

    return {k.name: k for k in (vllm.KNOWLEDGE, llamacpp.KNOWLEDGE)}


ENGINES: dict[str, EngineKnowledge] = {}


def _all() -> dict[str, EngineKnowledge]:
    if not ENGINES:
        ENGINES.update(_load())
    return ENGINES


def for_engine(name: str) -> EngineKnowledge:
    engines = _all()
    try:
        return engines[name]
    except KeyError:
        raise UsageError(f"unknown engine {name!r}; known: {', '.join(sorted(engines))}") from None


def names() -> list[str]:
    """Every engine llmfleet knows, in the registry's order (vLLM first, as messages list them)."""
    return list(_all())


def for_cluster_kind(kind: str) -> EngineKnowledge:
    """The engine whose multi-host runtime is ``kind`` (``rpc``, ``ray``: a role's ``cluster.kind``,
    a release manifest's ``cluster.kind``)."""
    for name in names():
        if _all()[name].cluster_kind == kind:
            return _all()[name]
    kinds = sorted(str(k.cluster_kind) for k in _all().values() if k.cluster_kind)
    raise UsageError(f"unknown cluster kind {kind!r}; known: {', '.join(kinds)}")


def for_quant_family(family: str) -> EngineKnowledge:
    """The engine that serves a quant family natively (``gguf``: llama.cpp, ``hf``: vLLM): the engine a
    plan without --engine or --image gets."""
    for name in names():
        if _all()[name].quant_family == family:
            return _all()[name]
    raise UsageError(f"no engine serves {family!r} quants; known engines: {', '.join(names())}")
