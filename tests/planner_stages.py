"""Run the planner's steps one by one for a request, each from its own module, for the per-step tables
(tests/test_planner_<step>.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmfleet.knowledge.catalog import engine_assumptions, parallel_assumptions
from llmfleet.knowledge.engines import for_engine
from llmfleet.knowledge.planner.budget import Budget, _budget
from llmfleet.knowledge.planner.fit import Fit, _fit
from llmfleet.knowledge.planner.flags import Flags, _flags
from llmfleet.knowledge.planner.notes import Notes, _notes
from llmfleet.knowledge.planner.offload import Offload, _offload
from llmfleet.knowledge.planner.request import PlanRequest
from llmfleet.knowledge.planner.resolve import _resolve, _Resolved
from llmfleet.knowledge.planner.speed import Speed, _speed

GB, GIB = 1e9, 2**30


@dataclass(frozen=True)
class Stages:
    req: PlanRequest
    r: _Resolved
    know: Any
    a: Any
    pa: Any
    budget: Budget
    fit: Fit
    speed: Speed
    offload: Offload
    flags: Flags
    notes: Notes


def stages(**kw: Any) -> Stages:
    """Every step's record for ``PlanRequest(**kw)``, in the order ``core._plan`` runs them."""
    req = PlanRequest(**kw)
    r = _resolve(req)
    know, a, pa = for_engine(r.engine), engine_assumptions(r.engine), parallel_assumptions()
    b = _budget(req, r, know, a)
    fit = _fit(req, r, know, a, pa, b)
    speed = _speed(req, r, a, pa, b, fit)
    off = _offload(req, r, know, a, b, fit, speed)
    flags = _flags(req, r, b, fit, off)
    notes = _notes(req, r, know, pa, b, fit, speed, off, flags)
    return Stages(req, r, know, a, pa, b, fit, speed, off, flags, notes)
