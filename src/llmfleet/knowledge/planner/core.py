"""The planner's entry: ``plan`` runs the steps, each from its own module, in order.

``_plan`` composes small pure steps, each returning a frozen record: ``_budget`` (one card's memory
and the basis the fit runs on), ``_fit`` (the KV layout and the context search), ``_speed`` (batch-1
decode, the split's communication, the health floor), ``_offload`` (what a plan that is not resident
does), ``_flags`` (the engine flags, judged by the preflight's rules) and ``_notes`` (the notes and
refusals, in the order people read them). What differs by engine is asked of its knowledge
(``llmfleet.knowledge.engines``); what differs by the split is the budget's ``split_mode``.
"""

from __future__ import annotations

from llmfleet.knowledge.catalog import engine_assumptions_for, model_kind, parallel_assumptions
from llmfleet.knowledge.engines import for_engine
from llmfleet.knowledge.planner.assemble import _assemble, _overhead, _split_layout
from llmfleet.knowledge.planner.budget import _budget
from llmfleet.knowledge.planner.fit import _fit
from llmfleet.knowledge.planner.flags import _flags
from llmfleet.knowledge.planner.notes import _notes
from llmfleet.knowledge.planner.offload import _offload
from llmfleet.knowledge.planner.request import PlanRequest
from llmfleet.knowledge.planner.resolve import _resolve
from llmfleet.knowledge.planner.result import Plan
from llmfleet.knowledge.planner.speed import _speed
from llmfleet.knowledge.planner.suggest import _add_alternatives


def _plan(req: PlanRequest, with_suggestions: bool) -> Plan:
    r = _resolve(req)
    know = for_engine(r.engine)
    version = r.release.version if r.release is not None else None
    a, pa = engine_assumptions_for(r.engine, version, model_kind(r.spec)), parallel_assumptions()
    budget = _budget(req, r, know, a)
    fit = _fit(req, r, know, a, pa, budget)
    speed = _speed(req, r, a, pa, budget, fit)
    off = _offload(req, r, know, a, budget, fit, speed)
    flags = _flags(req, r, budget, fit, off)
    notes = _notes(req, r, know, pa, budget, fit, speed, off, flags)
    plan = _assemble(req, r, a, budget, fit, speed, off, flags, notes, _overhead(a, pa, budget, fit, req.concurrency),
                     _split_layout(req, r, know, a, pa, budget, fit, speed.comm))
    if with_suggestions and not plan.fits:
        _add_alternatives(req, plan, r, has_problems=bool(notes.problems), replan=_plan_alone)
    return plan


def _plan_alone(req: PlanRequest) -> Plan:
    """A plan without alternatives (each change ``_suggest`` tries)."""
    return _plan(req, with_suggestions=False)


def plan(req: PlanRequest) -> Plan:
    """Plan one deployment. Raises UsageError for unknown models, quants, GPUs or bad values."""
    return _plan(req, with_suggestions=True)
