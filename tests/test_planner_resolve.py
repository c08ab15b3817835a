"""The request (``knowledge/planner/request.py``) and its resolution against the catalogs
(``knowledge/planner/resolve.py``): the engine, quant, KV dtype a plan runs with, and the usage errors
a wrong request gets before anything is computed."""

from __future__ import annotations

import pytest

from llmfleet.errors import UsageError
from llmfleet.knowledge.planner.request import PlanRequest, _check_request
from llmfleet.knowledge.planner.resolve import _resolve

BASE = dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4")


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (dict(gpus=0), "--gpus must be 1 or more"),
        (dict(hosts=0), "--hosts must be 1 or more"),
        (dict(network_gbps=0.0), "--network-gbps must be above 0"),
        (dict(network_latency_us=-1.0), "--network-latency-us must be 0 or more"),
        (dict(interconnect="infiniband"), "--interconnect must be nvlink or pcie"),
        (dict(split_mode="diagonal"), "--split-mode must be one of layer, row"),
        (dict(hosts=2, offload=True), "--offload with --hosts"),
        (dict(concurrency=0), "--concurrency must be 1 or more"),
        (dict(context=0), "--context must be 1 or more tokens"),
        (dict(gpu_memory_utilization=1.2), "--gpu-memory-utilization must be in (0, 1]"),
    ],
)
def test_bad_numbers_and_choices_are_usage_errors(change, error):
    with pytest.raises(UsageError, match=error.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        _check_request(PlanRequest(**{**BASE, **change}))


@pytest.mark.parametrize(
    ("kw", "engine", "quant", "note"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"), "llamacpp", "q4_k_m", None),
        (dict(model="qwen2.5-7b-instruct", quant="gptq-int4", gpu="t4"), "vllm", "gptq-int4", None),
        (dict(model="qwen2.5-7b-instruct", gpu="t4"), "vllm", "bf16", "no --quant given"),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="l4", engine="vllm"), "vllm", "q4_k_m", "GGUF"),
        (dict(model="Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4", gpu="rtx-4090"), "vllm", "gptq-int4",
         "read as catalog model qwen2.5-32b-instruct"),
        (dict(model="qwen2.5-7b-instruct", quant="q8_0", gpu="t4", image="llamacpp:b5000-cu122"), "llamacpp", "q8_0",
         None),
    ],
)
def test_engine_and_quant(kw, engine, quant, note):
    r = _resolve(PlanRequest(**kw))
    assert (r.engine, r.quant.name) == (engine, quant)
    if note:
        assert any(note in n for n in r.notes), r.notes


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        (dict(model="qwen2.5-7b-instruct", gpu="t4", engine="llamacpp"), "llama.cpp serves GGUF files: give --quant"),
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4", engine="llamacpp"), "not bf16; pick one of"),
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4", engine="vllm", split_mode="row"),
         "--split-mode is llama.cpp's"),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4", image="llamacpp:lab-cpu", engine="vllm"),
         "is a llamacpp image, not vllm"),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4", image="vllm:9.9.9"), "unknown image"),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4", kv_dtype="int3"), "unknown KV cache dtype"),
        (dict(model="no-such-model", gpu="t4"), "unknown model"),
    ],
)
def test_what_cannot_be_resolved_is_a_usage_error(kw, error):
    with pytest.raises(UsageError, match=error.replace("(", r"\(")):
        _resolve(PlanRequest(**kw))


@pytest.mark.parametrize(
    ("kw", "kv", "bytes_per_value", "flag", "note"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="a100-sxm4-80gb"), "auto", 2.0, "auto", None),
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="h100-sxm-80gb", kv_dtype="fp8"), "fp8", 1.0, "fp8", None),
        (dict(model="qwen2.5-7b-instruct", quant="fp16", gpu="t4", kv_dtype="bf16"), "bf16", 2.0, "auto",
         "KV cache in fp16 instead"),
        (dict(model="qwen2.5-7b-instruct", quant="q8_0", gpu="t4", kv_dtype="q8_0"), "q8_0", 1.0625, "q8_0", None),
    ],
)
def test_kv_dtype(kw, kv, bytes_per_value, flag, note):
    r = _resolve(PlanRequest(**kw))
    assert (r.kv_name, r.kv_bytes, r.kv_flag) == (kv, bytes_per_value, flag)
    assert (note is None) or any(note in n for n in r.notes)
