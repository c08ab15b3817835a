"""The short answer ``invoke plan`` prints first: does it fit (and if not, why), the engine flags, the
decode speed to expect, the health floor a deploy gates on and where that floor comes from, and what
to do next. Everything else a plan holds (memory, the speed model's bands and sources, notes) is for
``invoke plan --explain``.

Pure: a ``Plan`` and the floor the deploy computes for it (``health.check.decode_floor``, which
the caller runs) in, rows of (label, text) out, one line each.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from llmfleet.knowledge.planner import HEALTH_PROBE_CONTEXT, Plan

MAX_ALTERNATIVES = 3  # "what would fit" rows in the short answer; --explain shows them all
# A refusal longer than this is cut at its first clause in the short answer (--explain has it whole).
MAX_REASON_CHARS = 160
PLANNER_FLOOR = "the planner's floor"  # how ``decode_floor`` names the planner's own figure
FLEET_FLOOR = " of this card/engine/image/model/quant/context"  # where its fleet sentence turns to detail


@dataclass(frozen=True)
class AnswerFloor:
    """A floor as the answer shows it: the figure, ``decode_floor``'s sentence, and the inventory file
    that set the figure (empty when it does not come from the inventory)."""

    tokps: float | None
    source: str
    where: str = ""


def expected_tokps(p: Plan) -> float:
    """The point figure of the realistic batch-1 decode range: its middle."""
    lo, hi = p.decode_tokps_realistic
    return (lo + hi) / 2


def _tokps(v: float) -> str:
    return f"{v:,.1f}"


def verdict(p: Plan) -> str:
    """FITS, DOES NOT FIT, or NO IMAGE RUNS ON THIS CARD."""
    if p.fits:
        return "FITS"
    if p.image is None and p.notes and p.notes[0].startswith("REFUSED: no "):
        return "NO IMAGE RUNS ON THIS CARD"
    return "DOES NOT FIT"


def reason(p: Plan) -> str:
    """Why a plan does not fit, in one line: the first note without its REFUSED marker, cut at its
    first clause when it is long."""
    if p.fits:
        return ""
    text = p.notes[0] if p.notes else "does not fit"
    text = text.removeprefix("REFUSED: ").removeprefix("REFUSED ")
    if len(text) > MAX_REASON_CHARS:
        cut = min((i for i in (text.find("; "), text.find(". ")) if i > 0), default=-1)
        if cut > 0:
            text = text[:cut]
    return text


def _where(p: Plan) -> str:
    return f"{p.gpus} x {p.gpu_name}" + (f" on each of {p.hosts} hosts" if p.hosts > 1 else "")


def _split(p: Plan) -> str:
    if p.gpus * p.hosts <= 1:
        return ""
    if p.tensor_parallel_size > 1 or p.pipeline_parallel_size > 1:
        return f"tensor parallel {p.tensor_parallel_size}" + (
            f" x pipeline parallel {p.pipeline_parallel_size} (one stage per host, Ray)" if p.hosts > 1 else "")
    return f"llama.cpp {p.split_mode} split over {p.gpus * p.hosts} device(s)" + (
        f" ({(p.hosts - 1) * p.gpus} over RPC)" if p.hosts > 1 else "")


def floor_text(p: Plan, floor: AnswerFloor | None) -> str:
    """The health floor the deploy gates on and where it comes from; when that is not the planner's
    own figure, which planner figure it replaces."""
    own = p.health_floor_tokps
    if floor is None:  # no floor computed by the caller: the planner's own
        floor = AnswerFloor(own, f"{PLANNER_FLOOR} {own:.1f} tok/s" if own is not None else "no floor")
    source = floor.source.split(FLEET_FLOOR, 1)[0]
    source = re.sub(r" [0-9.,]+ tok/s$", "", source)  # the figure is said once, first
    if floor.where:
        source = f"{source[:-1]}, {floor.where})" if source.endswith(")") else f"{source} ({floor.where})"
    if floor.tokps is None:
        return f"none: {source}"
    at = f" with {HEALTH_PROBE_CONTEXT:,} tokens in context" if p.context > HEALTH_PROBE_CONTEXT else ""
    head = f"{_tokps(floor.tokps)} tok/s{at}"
    if floor.source.startswith(PLANNER_FLOOR):
        return (f"{head}: the planner's sanity bound, below every public measurement of this card class; "
                "a deploy that decodes slower fails")
    instead = (f", not the planner's {_tokps(own)} tok/s" if own is not None and round(own, 1) != round(floor.tokps, 1)
               else "")
    return f"{head} {'=' if source[:1].isdigit() else 'from'} {source}{instead}"


def short_answer(p: Plan, floor: AnswerFloor | None = None, *, measured: str | None = None,
                 calibrated: str | None = None, service: bool = False,
                 host: str | None = None, at: Plan | None = None) -> list[tuple[str, str]]:
    """The rows ``invoke plan`` prints before anything else, one line each.

    ``floor``: the floor the deploy would use (``health.check.decode_floor``'s answer for the
    service, or for a service with default health settings); None: the planner's own. ``measured``:
    what the fleet measured for this combination, in ``speed_history.measured_line``'s words;
    ``calibrated``: the source of the efficiency the plan was made with, when a speed overlay gave it.
    ``service``: the plan is for an inventory service of ``host`` (so the next step is its deploy).
    ``at``: the same request planned at the typical context (no --context given): the flags stay
    ``p``'s (the most that fits), the decode figures are ``at``'s, with ``p``'s beside them.
    """
    v = verdict(p)
    what = f"{p.model} ({p.quant}) on {_where(p)}, {p.engine}" + (f" ({p.image})" if p.image else "")
    rows: list[tuple[str, str]] = []
    if not p.fits:
        rows.append((v, f"{what}: {reason(p)}"))
        for a in p.alternatives[:MAX_ALTERNATIVES]:
            lo, hi = a["decode_tokps_realistic"]
            rows.append(("what would fit", f"{a['flags']}: up to {a['max_context_tokens']:,} tokens, "
                                           f"{_tokps(lo)}-{_tokps(hi)} tok/s ({a['why']})"))
        more = len(p.alternatives) - MAX_ALTERNATIVES
        nxt = ("plan again with one of these changes" + (f" ({more} more with --explain)" if more > 0 else "")
               if p.alternatives else "see the reason above; --explain for the notes")
        rows.append(("next", nxt))
        return rows
    if at is not None:
        rows.append((v, f"{what}: flags for {p.context:,} tokens of context x {p.concurrency} sequence(s) "
                        f"(fits up to {p.max_context_tokens:,}); decode at a typical {at.context:,}"))
    else:
        rows.append((v, f"{what}: {p.context:,} tokens of context x {p.concurrency} sequence(s); "
                        f"up to {p.max_context_tokens:,} tokens fit"))
    split = _split(p)
    if split:
        rows.append(("split", split))
    rows.append(("engine flags", shlex.join(p.engine_args)))
    if p.deploy_adds:
        rows.append(("deploy adds", "; ".join(p.deploy_adds)))
    h = at or p
    lo, hi = h.decode_tokps_realistic
    how = f", with the efficiency from the {calibrated}" if calibrated else ""
    speed = (f"about {_tokps(expected_tokps(h))} tok/s at batch 1 (predicted {_tokps(lo)}-{_tokps(hi)}{how}) "
             f"with {h.context:,} tokens in context")
    if at is not None:
        speed += f" (typical; --context N for another); with {p.context:,}: about {_tokps(expected_tokps(p))}"
    if measured:
        speed += f"; this fleet: {measured}"
    rows.append(("decode", speed))
    rows.append(("health floor", floor_text(p, floor)))
    if service:
        rows.append(("next", f"`invoke deploy --host {host or 'HOST'}` (its preflight checks the image, driver "
                             "and model files first)"))
    else:
        rows.append(("next", "name it in a host's llmfleet_services (docs/inventory.md), then "
                             "`invoke deploy --host HOST`"))
    rows.append(("more", f"--explain: memory, speed model, assumptions and {len(p.notes)} note(s)"))
    return rows


def lines(rows: list[tuple[str, str]]) -> list[str]:
    """The rows as plain lines, labels aligned."""
    width = max((len(k) for k, _ in rows), default=0)
    return [f"{k.ljust(width)}  {v}" for k, v in rows]
