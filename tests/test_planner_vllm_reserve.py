"""vLLM's own reserved memory per release line and model kind (planner.yaml ``engines.vllm.reserve``),
and the hybrid page rule, held to vLLM 0.26's recorded log and to the rules read in its code.

The dense figures are measured (the H200 log in tests/data/engine-logs); the MoE and hybrid reserves
are read from vLLM 0.26's code, not measured, and the plan says so."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from llmfleet.knowledge.catalog import engine_assumptions, engine_assumptions_for, find_model, model_kind
from llmfleet.knowledge.engines.loadlog import parse_vllm
from llmfleet.knowledge.planner import PlanRequest, plan, summarize

LOGS = Path(__file__).parent / "data" / "engine-logs"
GIB = 2**30


def _plan(model: str, context: int, image: str | None = "vllm:0.26.0", concurrency: int = 4):
    return plan(PlanRequest(model=model, quant="bf16", gpu="h200-141gb", engine="vllm", context=context,
                            concurrency=concurrency, image=image))


@pytest.mark.parametrize(("model", "kind"), [
    ("llama-3.1-8b-instruct", "dense"),
    ("qwen3-30b-a3b", "moe"),
    ("qwen3.5-27b", "hybrid"),
])
def test_model_kinds(model, kind):
    assert model_kind(find_model(model)) == kind


def test_dense_reserve_is_the_one_vllm_026_logged():
    """The catalog's dense reserve is the log's own breakdown (peak activation + non-torch; the V2 model
    runner captures its graphs after sizing the pool, so none are deducted), and the pool it leaves is
    the log's 'Available KV cache memory'."""
    text = (LOGS / "vllm-0.26.0-h200-llama8b-bf16.log").read_text()
    m = re.search(r"Desired GPU memory utilization is \(0\.9, ([\d.]+) GiB\)\. Actual usage is ([\d.]+) GiB for "
                  r"weight, ([\d.]+) GiB for peak activation, ([\d.]+) GiB for non-torch memory", text)
    assert m
    requested, weights, activation, non_torch = (float(x) for x in m.groups())
    a = engine_assumptions_for("vllm", "0.26.0", "dense")
    assert a.activation_bytes / GIB == pytest.approx(activation, abs=0.005)
    assert a.cuda_context_bytes / GIB == pytest.approx(non_torch, abs=0.005)
    assert a.cuda_graph_bytes == 0 and a.reserve_confidence == "H" and not a.reserve_note
    rep = parse_vllm(text)
    assert rep.kv_memory_gib == pytest.approx(requested - weights - activation - non_torch, abs=0.02)


def test_dense_plan_matches_the_recorded_log():
    """Llama-3.1-8B bf16 on the H200 with vLLM 0.26, 16384 x 4: the plan's KV tokens within 0.2 % of
    vLLM's 'GPU KV cache size' (the generic 2 GiB overhead was 0.6 % short) and its concurrency not
    above vLLM's 'Maximum concurrency'."""
    rep = parse_vllm((LOGS / "vllm-0.26.0-h200-llama8b-bf16.log").read_text())
    assert rep.kv_tokens and rep.max_concurrency
    p = _plan("llama-3.1-8b-instruct", 16384)
    assert summarize(p).kv_cache_tokens == pytest.approx(rep.kv_tokens, rel=0.002)
    tokens, conc = rep.max_concurrency
    assert tokens == 16384 and p.max_concurrency == math.floor(conc)


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "qwen3.5-27b"])
def test_moe_and_hybrid_deduct_the_v1_runners_graph_estimate_and_say_it_is_not_measured(model):
    """vLLM 0.26 runs MoE and hybrid models on its V1 model runner, which deducts its CUDA-graph
    estimate from the KV pool (the dense V2 runner does not): the plan keeps more back for them than
    for a dense model, and, the figures being read from code, says so in a note."""
    dense = engine_assumptions_for("vllm", "0.26.0", "dense")
    a = engine_assumptions_for("vllm", "0.26.0", model_kind(find_model(model)))
    assert a.cuda_graph_bytes > 0 and a.fixed_overhead_bytes > dense.fixed_overhead_bytes
    assert a.reserve_confidence != "H"
    p = _plan(model, 32768)
    assert any("not measured" in n and "0.26" in n for n in p.notes)
    assert p.overhead_bytes == pytest.approx(a.fixed_overhead_bytes, rel=1e-6)


def test_other_releases_keep_the_generic_overhead():
    """A release line without its own reserve keeps the generic figures (no 0.26 data carried over)."""
    assert engine_assumptions_for("vllm", "0.34.0", "moe") == engine_assumptions("vllm")
    assert engine_assumptions_for("vllm", None, "dense") == engine_assumptions("vllm")


def test_hybrid_pages_follow_vllm_026():
    """Qwen3.5-27B (16 full-attention + 48 Gated DeltaNet layers, fp32 recurrent state) on vLLM 0.26:
    one layer's state is 48 x 128 x 128 x 4 + (2 x 16 x 128 + 48 x 128) x 3 x 2 = 3,207,168 bytes;
    an attention token of one layer 2 x 4 x 256 x 2 = 4096 bytes; FlashAttention pages are multiples
    of 16 tokens, so the attention page holds 16 x ceil(3207168 / (16 x 4096)) = 784 tokens
    ('Setting attention block size to 784 tokens'). Layers group by 16 (one attention group, three
    state groups), so a 32768-token sequence takes ceil(32768 / 784) + 3 = 45 page blocks of
    784 x 4096 x 16 bytes, and vLLM's 'GPU KV cache size' is concurrency x max-model-len."""
    p = _plan("qwen3.5-27b", 32768)
    block = 784 * 4096 * 16
    assert p.kv_bytes_per_sequence == 45 * block
    pool = p.budget_bytes - p.weights_gpu_bytes - p.overhead_bytes
    blocks = int(pool // block)
    assert p.max_concurrency == blocks // 45
    assert summarize(p).kv_cache_tokens == int(blocks / 45 * 32768)
