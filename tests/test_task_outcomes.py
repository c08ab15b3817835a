"""Task outcomes a user relies on (issue 39): the answers tasks give on careless input, table-driven."""

from __future__ import annotations

import pytest

from llmfleet.knowledge.planner import PlanRequest, plan


@pytest.mark.parametrize(
    ("gpu", "engine", "quant", "served"),
    [
        ("p40", "vllm", None, False),  # compute capability 6.1: below every vLLM image
        ("p40", None, None, False),  # vLLM by default for a 16-bit model
        ("p40", "llamacpp", "q4_k_m", True),
        ("v100-sxm2-32gb", "vllm", None, True),
        ("rtx-4090", "vllm", None, True),
    ],
)
def test_a_plan_for_an_engine_without_an_image_for_the_card_is_refused(gpu, engine, quant, served):
    p = plan(PlanRequest(model="qwen2.5-7b", gpu=gpu, engine=engine, quant=quant))
    first = p.notes[0] if p.notes else ""
    refused = first.startswith("REFUSED: no ")
    assert refused is not served
    if not served:
        assert not p.fits and p.image is None
        # the engine's catalog minimum, its source, and what serves the card instead
        assert "compute capability 7.0 or higher" in first and "docs.vllm.ai" in first
        assert "--engine llamacpp" in first
