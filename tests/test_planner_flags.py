"""The flags step (``knowledge/planner/flags.py``): the engine flags a deploy puts on the container,
and the preflight's verdict on them for the card (a FAIL refuses the plan)."""

from __future__ import annotations

import pytest

from tests.planner_stages import stages

L70 = "llama-3.1-70b-instruct"


def pairs(args):
    return {a: b for a, b in zip(args, [*args[1:], None], strict=True) if a.startswith("-")}


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="a100-sxm4-80gb"),
         {"--gpu-memory-utilization": "0.90", "--max-model-len": "4096", "--max-num-seqs": "1",
          "--kv-cache-dtype": "auto", "--tensor-parallel-size": "1"}),
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4"), {"--dtype": "float16"}),  # no bf16 on a T4
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4),
         {"--quantization": "gptq", "--tensor-parallel-size": "4"}),  # no Marlin below compute capability 8.0
        (dict(model=L70, quant="gptq-int4", gpu="rtx-4090", gpus=2), {"--quantization": "gptq_marlin"}),
        (dict(model="qwen3-30b-a3b", quant="awq-int4", gpu="a10"), {"--quantization": "awq_marlin"}),
        (dict(model="qwen2.5-7b-instruct", quant="fp16", gpu="h100-sxm-80gb", kv_dtype="fp8"),
         {"--kv-cache-dtype": "fp8"}),
        (dict(model="qwen2.5-32b-instruct", quant="gptq-int8", gpu="rtx-4090", offload=True),
         {"--cpu-offload-gb": "15"}),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"),
         {"-ngl": "29", "-c": "4096", "-np": "1", "-ctk": "f16", "-ctv": "f16"}),  # every layer + the output
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2, context=8192),
         {"--split-mode": "layer", "--tensor-split": "1,1", "-c": "8192"}),
        (dict(model="qwen2.5-7b-instruct", quant="q8_0", gpu="t4", kv_dtype="q8_0"), {"-ctk": "q8_0", "-ctv": "q8_0"}),
    ],
)
def test_the_flags_emitted(kw, want):
    fl = stages(**{"context": 4096, **kw}).flags
    got = pairs(list(fl.args))
    assert {k: got.get(k) for k in want} == want, fl.args


@pytest.mark.parametrize(
    ("kw", "refused"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4", kv_dtype="fp8"), "kv-dtype"),  # Triton, no fp8 < 8.9
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="h100-sxm-80gb", kv_dtype="fp8"), None),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"), None),
    ],
)
def test_the_preflights_rules_judge_the_flags(kw, refused):
    fl = stages(context=8192, **kw).flags
    verdicts = dict(fl.preflight)
    if refused:
        assert verdicts[refused].status == "fail"
        assert fl.refusal.startswith("REFUSED by the preflight's rules for ") and refused in fl.refusal
    else:
        assert all(v.status != "fail" for v in verdicts.values()) and fl.refusal == ""


def test_no_image_for_the_card_means_flags_without_verdicts():
    fl = stages(model="qwen2.5-7b-instruct", quant="bf16", gpu="p40", context=4096).flags
    assert fl.preflight == () and fl.refusal == "" and "--max-model-len" in fl.args


def test_the_services_own_args_are_judged_with_the_planned_ones():
    base = dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="h100-sxm-80gb", context=8192)
    plain = dict(stages(**base).flags.preflight)
    eager = dict(stages(**base, extra_args=("--kv-cache-dtype", "fp8")).flags.preflight)
    assert plain["kv-dtype"].message != eager["kv-dtype"].message
