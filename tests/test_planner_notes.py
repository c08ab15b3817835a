"""The notes step (``knowledge/planner/notes.py``): every note and refusal a plan prints, refusals
first, and the health floor a deploy measures decode against."""

from __future__ import annotations

import pytest

from tests.planner_stages import stages

L70 = "llama-3.1-70b-instruct"


@pytest.mark.parametrize(
    ("kw", "refusal"),
    [
        (dict(model=L70, quant="gptq-int4", gpu="rtx-4090", gpus=3), "the heads do not split evenly over 3 GPUs"),
        (dict(model="tiny-qwen2", quant="q4_k_m", gpu="t4", hosts=3), "3 hosts for 2 layers"),
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="p40"), "no vLLM image in the catalog runs on Tesla P40"),
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4", kv_dtype="fp8"), "REFUSED by the preflight's rules"),
    ],
)
def test_what_no_budget_fixes_refuses_the_plan(kw, refusal):
    n = stages(context=4096, **kw).notes
    assert not n.fits
    assert any(refusal in p for p in n.problems), n.problems


@pytest.mark.parametrize(
    ("kw", "note"),
    [
        (dict(model="qwen3-30b-a3b", quant="awq-int4", gpu="a10"), "mixture of experts: 128 experts per layer, 8 used"),
        (dict(model="gemma-3-27b-it", quant="q4_k_m", gpu="h100-sxm-80gb"), "-token sliding window"),
        (dict(model="qwen3.5-27b", quant="bf16", gpu="h200-141gb"), "48 of 64 layers are linear attention"),
        (dict(model="qwen3.5-27b", quant="bf16", gpu="h200-141gb"), "multi-token-prediction layer"),
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4"), "Tesla T4 has no bf16 (CC 7.5)"),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"), "llama.cpp keeps the token-embedding table"),
        (dict(model="qwen3-30b-a3b", quant="awq-int4", gpu="a10"), "awq-int4: group size 128 assumed"),
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4), "tensor parallel over 4 GPUs per host"),
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2, hosts=2), "layers per host (head first)"),
        (dict(model="qwen2.5-7b-instruct", quant="fp16", gpu="t4", driver="470.82.01"), "does not run on this host"),
    ],
)
def test_what_the_figures_rest_on_is_said(kw, note):
    n = stages(context=8192, **kw).notes
    assert any(note in x for x in (*n.problems, *n.notes)), n.notes  # a driver that refuses the image: a problem


@pytest.mark.parametrize(
    ("kw", "resident"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"), True),
        (dict(model="qwen2.5-32b-instruct", quant="q8_0", gpu="rtx-4090", offload=True), False),
    ],
)
def test_the_health_floor_and_its_reason_is_the_last_note(kw, resident):
    s = stages(context=4096, **kw)
    n = s.notes
    assert n.notes[-1].startswith(f"health floor {n.floor:.1f} tok/s: ")
    if resident:
        assert n.floor == s.speed.floor and "sanity bound" in n.notes[-1]
    else:
        assert n.floor == pytest.approx(s.offload.realistic[0] * 0.5) and "not resident" in n.notes[-1]


def test_problems_come_in_reading_order():
    # the fit's problem, then the offload's, then refusals, then the preflight's
    n = stages(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4", kv_dtype="fp8", context=16384).notes
    assert [p.split(":")[0] for p in n.problems] == ["REFUSED", "REFUSED by the preflight's rules for vllm"]
