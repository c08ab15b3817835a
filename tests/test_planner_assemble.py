"""Assembly (``knowledge/planner/assemble.py``): the overhead a plan reserves, the split layout a deploy
reads (tensor and pipeline sizes, llama.cpp's tensor split, the tightest card) and the ``Plan`` put
together from the steps' records, consistent with them."""

from __future__ import annotations

import pytest

from llmfleet.knowledge.planner.assemble import _assemble, _overhead, _split_layout
from tests.planner_stages import GIB, stages

L70 = "llama-3.1-70b-instruct"


def assembled(**kw):
    s = stages(**kw)
    over = _overhead(s.a, s.pa, s.budget, s.fit, s.req.concurrency)
    split = _split_layout(s.req, s.r, s.know, s.a, s.pa, s.budget, s.fit, s.speed.comm)
    return s, over, split, _assemble(s.req, s.r, s.a, s.budget, s.fit, s.speed, s.offload, s.flags, s.notes, over,
                                     split)


@pytest.mark.parametrize(
    ("kw", "tp", "pp", "split_mode", "tensor_split", "layers_per_host"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="a100-sxm4-80gb"), 1, 1, "", None, [28]),
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4), 4, 1, "tensor", None, [80]),
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, hosts=2), 2, 2, "tensor", None, [40, 40]),
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2), 1, 1, "layer", [1, 1], [80]),
        # head first; the head's last card also holds the output layer, so it takes fewer layers
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2, hosts=2), 1, 1, "layer", [1, 1, 1, 1], [39, 41]),
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=4, split_mode="row"), 1, 1, "row", [1, 1, 1, 1], [80]),
    ],
)
def test_the_split_layout_a_deploy_reads(kw, tp, pp, split_mode, tensor_split, layers_per_host):
    s, _, split, plan = assembled(context=8192, **kw)
    assert (split.tensor_parallel_size, split.pipeline_parallel_size, split.split_mode) == (tp, pp, split_mode)
    assert split.tensor_split == tensor_split
    assert split.layers_per_host == layers_per_host
    assert split.per_gpu["budget_bytes"] == int(s.budget.card_bytes)
    assert split.deploy_adds == s.know.deploy_adds(s.req.hosts, s.req.gpus)
    assert (plan.tensor_parallel_size, plan.pipeline_parallel_size, plan.tensor_split) == (tp, pp, tensor_split)


@pytest.mark.parametrize(
    ("kw", "parts"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="a100-sxm4-80gb"), ["2.00 GiB per GPU"]),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"), ["of the KV cache for compute buffers"]),
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4), ["GiB per GPU of communication buffers"]),
    ],
)
def test_the_overhead_says_what_it_is_made_of(kw, parts):
    s, over, _, plan = assembled(context=8192, **kw)
    assert over.bytes >= s.a.fixed_overhead_bytes * s.budget.devices
    assert all(p in over.text for p in parts), over.text
    assert (plan.overhead_bytes, plan.overhead_assumption) == (int(over.bytes), over.text)
    assert plan.assumptions["overhead"] == over.text
    assert over.bytes < 8 * GIB * s.budget.devices


@pytest.mark.parametrize(
    "kw",
    [
        dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"),
        dict(model="qwen2.5-32b-instruct", quant="q8_0", gpu="rtx-4090", offload=True),
        dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4", kv_dtype="fp8"),
        dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, hosts=2),
    ],
)
def test_the_plan_agrees_with_the_steps(kw):
    s, _, _, plan = assembled(context=4096, **kw)
    assert plan.fits is s.notes.fits and plan.resident is s.fit.resident
    assert plan.notes == [*s.notes.problems, *s.notes.notes]
    assert plan.engine_args == list(s.flags.args) and plan.engine_env == dict(s.flags.env)
    assert plan.budget_bytes == int(s.budget.card_bytes * s.budget.devices)
    assert plan.gpu_layers == s.offload.gpu_layers and plan.health_floor_tokps == round(s.notes.floor, 2)
    assert plan.decode_tokps_realistic == (round(s.offload.realistic[0], 2), round(s.offload.realistic[1], 2))
    assert plan.alternatives == []  # assembly alone adds none: that is the suggest step's
    assert ("offload" in plan.assumptions) is (not s.fit.resident)
