"""Every field of the plans of a table of representative requests (vLLM and llama.cpp, one card and
splits over cards and hosts, offload, KV dtypes, images, drivers, refusals), pinned in
``tests/golden/planner/plans.json``: a change to how the planner is put together must leave them as
they are.

After an intended change to the figures: ``LLMFLEET_UPDATE_GOLDEN=1 pytest tests/test_planner_golden.py``
rewrites the file; review it with ``git diff tests/golden/planner``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from llmfleet.errors import LlmfleetError
from llmfleet.knowledge.planner import PlanRequest, plan, summarize

GOLDEN = Path(__file__).parent / "golden" / "planner" / "plans.json"

L70 = "llama-3.1-70b-instruct"
CASES: list[dict[str, Any]] = [
    dict(model="qwen2.5-7b-instruct", gpu="a100-sxm4-80gb"),
    dict(model="qwen2.5-7b-instruct", gpu="t4", context=4096),
    dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="rtx-4090", context=32768),
    dict(model="qwen2.5-7b-instruct", quant="q4_k_m", engine="vllm", gpu="l4", context=4096),
    dict(model="qwen2.5-32b-instruct", quant="gptq-int4", gpu="v100-sxm2-32gb", context=16384),
    dict(model="qwen2.5-32b-instruct", quant="q8_0", gpu="rtx-4090", context=4096),
    dict(model="qwen2.5-32b-instruct", quant="q8_0", gpu="rtx-4090", context=4096, offload=True),
    dict(model="qwen2.5-32b-instruct", quant="gptq-int8", gpu="rtx-4090", context=4096, offload=True),
    dict(model="qwen2.5-14b-instruct", quant="gptq-int4", gpu="rtx-4090", context=32768, concurrency=2),
    dict(model="gemma-2-27b-it", quant="gptq-int4", gpu="v100-sxm2-32gb", context=4096),
    dict(model="gemma-2-27b-it", quant="q4_k_m", gpu="v100-sxm2-32gb", context=4096),
    dict(model="gemma-3-27b-it", quant="q4_k_m", gpu="h100-sxm-80gb", context=32768),
    dict(model="qwen3.5-27b", quant="bf16", gpu="v100-sxm2-32gb", context=4096),
    dict(model="qwen3.5-27b", quant="bf16", gpu="h200-141gb"),
    dict(model="qwen3-30b-a3b", quant="q4_k_m", gpu="v100-sxm2-32gb", context=4096),
    dict(model="qwen3-30b-a3b", quant="awq-int4", gpu="a10", context=8192, concurrency=4),
    dict(model="deepseek-v2-lite-chat", quant="fp16", gpu="a100-sxm4-80gb", context=8192),
    dict(model="gpt-oss-20b", quant="mxfp4", gpu="h100-sxm-80gb", context=8192),
    dict(model="gpt-oss-20b", quant="mxfp4-moe", gpu="rtx-3090", context=8192),
    dict(model="mixtral-8x7b-instruct", quant="q4_k_m", gpu="a40", context=8192),
    dict(model="phi-4", quant="fp8", gpu="l40s", context=8192),
    dict(model="phi-4", quant="fp8", gpu="rtx-2080-ti", context=8192),
    dict(model="llama-3.1-8b-instruct", quant="q4_k_m", gpu="p40", context=131072),
    dict(model="llama-2-7b", quant="q4_0", gpu="p100-pcie-16gb", context=4096),
    dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", context=8192),
    dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, context=8192),
    dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4, context=8192),
    dict(model=L70, quant="gptq-int4", gpu="v100-pcie-32gb", gpus=4, context=8192),
    dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, hosts=2, context=8192),
    dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, hosts=2, network_gbps=25.0,
         network_latency_us=40.0, context=8192),
    dict(model=L70, quant="gptq-int4", gpu="rtx-4090", gpus=3, context=8192),
    dict(model=L70, quant="q4_k_m", gpu="v100-sxm2-32gb", gpus=4, context=8192),
    dict(model=L70, quant="q4_k_m", gpu="v100-sxm2-32gb", gpus=4, split_mode="row", context=8192),
    dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2, context=8192, gpus_available=2),
    dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2, hosts=2, context=8192),
    dict(model=L70, quant="q4_k_m", gpu="rtx-3090", gpus=2, interconnect="nvlink", context=8192),
    dict(model="qwen2.5-7b-instruct", quant="fp16", gpu="h100-sxm-80gb", kv_dtype="fp8", context=8192),
    dict(model="qwen2.5-7b-instruct", quant="fp16", gpu="a100-sxm4-80gb", kv_dtype="fp8", context=8192),
    dict(model="qwen2.5-7b-instruct", quant="q8_0", gpu="t4", kv_dtype="q8_0", context=8192),
    dict(model="qwen2.5-7b-instruct", quant="fp16", gpu="t4", kv_dtype="bf16", context=8192),
    dict(model="gemma-2-27b-it", quant="gptq-int4", gpu="t4", image="vllm:0.9.2", context=8192),
    dict(model="gemma-2-27b-it", quant="gptq-int4", gpu="v100-sxm2-32gb", image="vllm:0.10.1.1", context=8192),
    dict(model="gemma-2-27b-it", quant="q4_k_m", gpu="p40", image="llamacpp:vendored-0.3.36-cu118", context=8192),
    dict(model="qwen2.5-7b-instruct", quant="q8_0", gpu="t4", image="llamacpp:lab-cpu", context=8192),
    dict(model="qwen2.5-7b-instruct", quant="fp16", gpu="t4", driver="470.82.01", context=8192),
    dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="rtx-4090", driver="535.104.05", context=8192),
    dict(model="qwen2.5-7b-instruct", gpu="rtx-4090", context=8192,
         measured_efficiency=(0.55, "measured on gpu-a at 2026-01-01")),
    dict(model="Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4", gpu="rtx-4090", context=8192),
    dict(model="tiny-qwen2", quant="q4_k_m", gpu="t4", hosts=3),
    dict(model="qwen2.5-7b-instruct", gpu="t4", engine="llamacpp"),
]


def _run(case: dict[str, Any]) -> dict[str, Any]:
    try:
        p = plan(PlanRequest(**case))
    except LlmfleetError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    d = p.to_dict()
    summary = summarize(p)
    assert summary is not None
    d["summary"] = {k: list(v) if isinstance(v, tuple) else v for k, v in summary.__dict__.items()}
    return d


def test_the_plans_of_the_table_are_the_pinned_ones():
    got = json.loads(json.dumps([{"case": c, "plan": _run(c)} for c in CASES], sort_keys=True))
    if os.environ.get("LLMFLEET_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    assert GOLDEN.exists(), f"no {GOLDEN}; run with LLMFLEET_UPDATE_GOLDEN=1 and review it"
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert [w["case"] for w in want] == [g["case"] for g in got], "the table changed: regenerate the golden file"
    for w, g in zip(want, got, strict=True):
        assert g["plan"] == w["plan"], w["case"]
