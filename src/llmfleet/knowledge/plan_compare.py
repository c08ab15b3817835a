"""``invoke plan --compare``: which engine and quantization decodes fastest for a model on a card.

Every engine llmfleet knows and every catalog quantization is planned by the planner itself (its
refusals are the reasons shown: an engine that does not load the format, an image without kernels for
the card, weights that do not fit), all at the same context and concurrency; the fitting plans are
ranked by the point estimate of batch-1 decode (``plan_answer.expected_tokps``, the middle of the
predicted range). Each row says what evidence backs its figure: the fleet's fitted efficiency (which
narrows the range), the fleet's own runs, a public figure of the same engine on the same card, or the
speed model alone.

A decode target (``--min-tokps``) is judged on the point estimate: below it the plan does not meet
the target; at or above it with the low end below, it meets it with a warning that the range straddles.

Pure: a ``PlanRequest`` in (and, from the shell, the fleet's calibration and measurements as
functions of a plan), a ``Comparison`` out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from llmfleet.errors import UsageError
from llmfleet.knowledge import engines as engine_registry
from llmfleet.knowledge.catalog import ModelSpec, PublicDecode, Quant, load_quants, typical_context
from llmfleet.knowledge.plan_answer import expected_tokps, reason
from llmfleet.knowledge.planner import Plan, PlanRequest, compute_weights, plan

# A public figure backs a row when it is the same engine on the same card with weights within this
# share of the plan's (a figure of a much smaller or larger model says little of this one's speed).
PUBLIC_WEIGHTS_WITHIN = 0.5

MEETS, STRADDLES, BELOW = "meets", "straddles", "below"


def target_verdict(point: float, low: float, target: float | None) -> str | None:
    """How a plan's decode stands against a target: ``meets`` (the whole range at or above it),
    ``straddles`` (the point estimate at or above it, the low end below), ``below`` (the point estimate
    below it); None without a target."""
    if target is None:
        return None
    if point < target:
        return BELOW
    return STRADDLES if low < target else MEETS


@dataclass(frozen=True)
class Evidence:
    """What backs a row's decode figure, in one line, and whether it narrowed the range."""

    kind: str  # fleet-calibrated, fleet-measured, public, model
    text: str
    narrowed: bool = False


def evidence_for(p: Plan, *, calibrated: str | None = None, measured: str | None = None,
                 public: Sequence[PublicDecode] = ()) -> Evidence:
    """The strongest evidence behind ``p``'s figure: the fleet's fitted efficiency (``calibrated``: its
    source; the plan was made with it, so its range is narrowed), the fleet's runs of this combination
    (``measured``: ``speed_history.measured_line``), a public figure of the same engine on the same
    card with weights within ``PUBLIC_WEIGHTS_WITHIN``, else the speed model alone."""
    if calibrated:
        return Evidence("fleet-calibrated", f"efficiency fitted to this fleet's runs ({calibrated}): range narrowed",
                        narrowed=True)
    if measured:
        return Evidence("fleet-measured", f"this fleet measured {measured}; range not narrowed "
                                          "(`invoke speed --write` fits it)")
    same = [f for f in public if f.engine == p.engine and f.card.id == p.gpu and not f.offloaded]
    if same:
        def gap(f: PublicDecode) -> float:
            w = compute_weights(f.model, f.quant).total_bytes
            return abs(w - p.weights_bytes) / p.weights_bytes
        close = [f for f in same if gap(f) <= PUBLIC_WEIGHTS_WITHIN]
        near = min(close or same, key=lambda f: (f.quant.name != p.quant.split("-g")[0], gap(f)))
        if close:
            return Evidence("public", f"public: {p.engine} on this card, {near.model.name} {near.quant.name} "
                                      f"{near.tokps:g} tok/s ({near.id}); range not narrowed")
        return Evidence("model", f"model only: {len(same)} public figure(s) of {p.engine} on this card, none "
                                 f"within {PUBLIC_WEIGHTS_WITHIN:.0%} of these weights; range not narrowed")
    return Evidence("model", "model only: range not narrowed")


@dataclass(frozen=True)
class Row:
    """One (engine, quant, image) combination planned at the comparison's context."""

    engine: str
    quant: str
    image: str | None
    fits: bool
    reason: str  # why it does not fit or is refused (empty when it fits)
    low: float = 0.0
    high: float = 0.0
    point: float = 0.0
    context: int = 0
    max_context: int = 0  # the largest context that fits at the comparison's concurrency
    headroom_bytes: int = 0  # budget left at the plan's context (weights, overhead and KV taken)
    weights_bytes: int = 0
    evidence: Evidence = Evidence("model", "")
    target: str | None = None  # target_verdict
    engine_args: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.engine} {self.quant}"

    def to_dict(self) -> dict[str, object]:
        return {"engine": self.engine, "quant": self.quant, "image": self.image, "fits": self.fits,
                "reason": self.reason or None, "decode_tokps_expected": round(self.point, 2),
                "decode_tokps_realistic": [round(self.low, 2), round(self.high, 2)], "context": self.context,
                "max_context_tokens": self.max_context, "headroom_bytes": self.headroom_bytes,
                "weights_bytes": self.weights_bytes,
                "evidence": {"kind": self.evidence.kind, "text": self.evidence.text,
                             "narrowed": self.evidence.narrowed},
                "target": self.target, "engine_args": list(self.engine_args)}


def row_of(p: Plan, evidence: Evidence, target: float | None = None) -> Row:
    """A plan as a comparison row (a plan that does not fit keeps its reason and no speed)."""
    if not p.fits:
        return Row(p.engine, p.quant, p.image, False, reason(p), context=p.context, max_context=p.max_context_tokens,
                   weights_bytes=p.weights_bytes, evidence=evidence)
    lo, hi = p.decode_tokps_realistic
    point = expected_tokps(p)
    used = p.weights_gpu_bytes + p.overhead_bytes + p.kv_cache_bytes
    return Row(p.engine, p.quant, p.image, True, "", lo, hi, point, p.context, p.max_context_tokens,
               int(p.budget_bytes - used), p.weights_bytes, evidence, target_verdict(point, lo, target),
               tuple(p.engine_args))


def rank(rows: Sequence[Row]) -> tuple[list[Row], list[Row]]:
    """(fitting rows, fastest point estimate first; the rest in their given order). Ties: the larger
    context that fits, then the smaller weights, then the name, so the order is stable."""
    fitting = sorted((r for r in rows if r.fits), key=lambda r: (-round(r.point, 2), -r.max_context, r.weights_bytes,
                                                               r.name))
    return fitting, [r for r in rows if not r.fits]


@dataclass(frozen=True)
class Comparison:
    model: str
    gpu_name: str
    gpus: int
    hosts: int
    context: int
    concurrency: int
    min_tokps: float | None
    ranked: tuple[Row, ...]  # fitting, fastest first
    refused: tuple[Row, ...]  # refused or not fitting, with the reason

    @property
    def meeting(self) -> list[Row]:
        """Fitting rows whose point estimate meets the target (all fitting rows without one)."""
        return [r for r in self.ranked if r.target != BELOW]

    @property
    def ok(self) -> bool:
        """Exit 0: at least one combination fits (and, with a target, meets it)."""
        return bool(self.meeting)

    def to_dict(self) -> dict[str, object]:
        return {"model": self.model, "gpu_name": self.gpu_name, "gpus": self.gpus, "hosts": self.hosts,
                "context": self.context, "concurrency": self.concurrency, "min_tokps": self.min_tokps,
                "ranked": [r.to_dict() | {"rank": i} for i, r in enumerate(self.ranked, 1)],
                "refused": [r.to_dict() for r in self.refused], "ok": self.ok}


def _family(quant: str) -> str:
    """The family (hf, gguf) of a catalog quant name; empty when it is not one."""
    q = quant.lower().split("-g")[0]
    return next((x.family for x in load_quants() if x.name == q or q in x.aliases), "")


def _for_moe_only(q: Quant) -> bool:
    """A format that quantizes only a mixture-of-experts model's experts (MXFP4 checkpoints, GGUF MXFP4_MOE)."""
    return q.experts_only or any(name == "experts" for name, _ in q.rules)


def candidates(spec: ModelSpec, engine: str | None = None, quant: str | None = None) -> list[tuple[str, str]]:
    """(engine, quant) pairs to plan: every engine llmfleet knows (or ``engine``) by every catalog
    quantization of the engine's own family (``EngineKnowledge.quant_family``: GGUF for llama.cpp,
    Hugging Face checkpoints for vLLM, whose GGUF loader is experimental), or ``quant`` on every
    engine (the planner then refuses the engines that cannot load it). Formats that quantize only a
    mixture-of-experts model's experts are left out for a dense model."""
    engines = [engine] if engine else engine_registry.names()
    if quant:
        return [(e, quant) for e in engines]
    out = []
    for e in engines:
        family = engine_registry.for_engine(e).quant_family
        out += [(e, q.name) for q in load_quants() if q.family == family and not (_for_moe_only(q) and not spec.is_moe)]
    return out


def compare(req: PlanRequest, spec: ModelSpec, *, engine: str | None = None, quant: str | None = None,
            min_tokps: float | None = None, calibrate: Callable[[Plan], tuple[float, str] | None] | None = None,
            measured: Callable[[Plan], str | None] | None = None, public: Sequence[PublicDecode] = ()) -> Comparison:
    """Plan every candidate of ``spec`` on ``req``'s cards at ``req.context`` (None: the typical
    context, capped at the model's window) and ``req.concurrency``, and rank them. ``calibrate``: the
    fleet's fitted efficiency for a plan (``cli.plan_tasks.calibration``), with which it is planned
    again; ``measured``: the fleet's runs of a plan's combination in one line."""
    context = req.context if req.context is not None else typical_context(spec.max_context)
    base = replace(req, model=spec, context=context)
    rows: list[Row] = []
    gpu_name = req.gpu if isinstance(req.gpu, str) else req.gpu.name
    for e, q in candidates(spec, engine, quant):
        r = replace(base, engine=e, quant=q)
        try:
            p = plan(r)
        except UsageError as exc:
            rows.append(Row(e, q, None, False, str(exc).split("\n", 1)[0], context=context))
            continue
        gpu_name = p.gpu_name
        cal = calibrate(p) if calibrate is not None and p.fits else None
        if cal is not None:
            p = plan(replace(r, measured_efficiency=cal))
        line = measured(p) if measured is not None and p.fits else None
        ev = evidence_for(p, calibrated=cal[1] if cal else None, measured=line, public=public)
        know = engine_registry.for_engine(e)
        if p.fits and know.foreign_quant_note and _family(q) not in ("", know.quant_family):
            ev = replace(ev, text=f"{ev.text}; {know.foreign_quant_note}")
        rows.append(row_of(p, ev, min_tokps))
    fitting, refused = rank(rows)
    return Comparison(spec.name, gpu_name, req.gpus, req.hosts, context, req.concurrency, min_tokps,
                      tuple(fitting), tuple(refused))


def what_meets(c: Comparison, limit: int = 3) -> str:
    """The fastest combinations that meet the comparison's target, in a few words (empty: none)."""
    return ", ".join(f"{r.name} (about {r.point:,.1f} tok/s)" for r in c.meeting[:limit])
