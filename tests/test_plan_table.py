"""`invoke plan`'s table says at which context each decode figure is computed: the ceiling and the
realistic range at the planned context, the health floor at the health probe's short one, so that a floor
above a long context's ceiling reads as what it is."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest
from rich.console import Console

from llmfleet.cli import plan_tasks
from llmfleet.knowledge.planner import HEALTH_PROBE_CONTEXT, PlanRequest, plan


def table(p, monkeypatch) -> dict[str, str]:
    out = io.StringIO()
    monkeypatch.setattr(plan_tasks, "console", Console(file=out, width=500, color_system=None))
    plan_tasks.render_plan(p)
    rows = {}
    for line in out.getvalue().splitlines():
        m = re.match(r"│ (.+?)\s+│ (.*?)\s*│$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


@pytest.fixture(scope="module")
def long_plan():
    return plan(PlanRequest(model="llama-3.1-8b-instruct", gpu="rtx-4090", quant="q4_k_m", context=131072))


def test_each_decode_figure_names_its_context(long_plan, monkeypatch):
    rows = table(long_plan, monkeypatch)
    assert "with 131,072 tokens in context" in rows["decode ceiling"]
    assert "with 131,072 tokens in context" in rows["decode realistic"]
    assert f"with the health probe's {HEALTH_PROBE_CONTEXT:,} tokens in context" in rows["health floor"]


def test_a_floor_above_the_long_context_ceiling_is_explained(long_plan, monkeypatch):
    above = dataclasses.replace(long_plan, health_floor_tokps=round(long_plan.decode_tokps_ceiling * 1.15, 2))
    floor = table(above, monkeypatch)["health floor"]
    assert floor.startswith(f"{above.health_floor_tokps:,.1f} tok/s")
    assert (f"above the ceiling at 131,072 tokens, where each token also reads the KV of 131,072 tokens, "
            f"the health check's only {HEALTH_PROBE_CONTEXT:,}") in floor
    below = dataclasses.replace(long_plan, health_floor_tokps=round(long_plan.decode_tokps_ceiling * 0.5, 2))
    assert "above the ceiling" not in table(below, monkeypatch)["health floor"]


def test_a_context_shorter_than_the_probe_is_the_floor_context_too(monkeypatch):
    p = plan(PlanRequest(model="qwen2.5-7b-instruct", gpu="a100-sxm4-80gb", context=256))
    rows = table(p, monkeypatch)
    assert "with 256 tokens in context" in rows["decode ceiling"]
    assert "with the health probe's 256 tokens in context" in rows["health floor"]
