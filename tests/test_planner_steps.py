"""The planner's steps, each a pure function returning a small record: budget, fit, speed, offload,
refusals and notes, split layout. ``_plan`` composes them; these tables pin what each one decides."""

from __future__ import annotations

import pytest

from llmfleet.knowledge import planner as P
from llmfleet.knowledge.catalog import engine_assumptions, find_gpu, parallel_assumptions
from llmfleet.knowledge.engines import for_engine

GB = 1e9


def steps(**kw):
    req = P.PlanRequest(**kw)
    r = P._resolve(req)
    know, a, pa = for_engine(r.engine), engine_assumptions(r.engine), parallel_assumptions()
    b = P._budget(req, r, know, a)
    fit = P._fit(req, r, know, a, pa, b)
    speed = P._speed(req, r, a, pa, b, fit)
    off = P._offload(req, r, know, a, b, fit, speed)
    return req, r, know, a, pa, b, fit, speed, off


# ------------------------------------------------------------------------------------------ budget


@pytest.mark.parametrize(("kw", "split_mode", "shards", "devices"), [
    (dict(model="qwen2.5-7b-instruct", gpu="a100-sxm4-80gb"), "tensor", 1, 1),
    (dict(model="llama-3.1-70b-instruct", quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4), "tensor", 4, 4),
    (dict(model="llama-3.1-70b-instruct", quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, hosts=2), "tensor", 2, 4),
    (dict(model="llama-3.1-70b-instruct", quant="q4_k_m", gpu="p40", gpus=2), "layer", 1, 2),
    (dict(model="llama-3.1-70b-instruct", quant="q4_k_m", gpu="p40", gpus=4, split_mode="row"), "row", 1, 4),
    (dict(model="llama-3.1-70b-instruct", quant="q4_k_m", gpu="p40", gpus=2, hosts=2), "layer", 1, 4),
])
def test_budget_basis_is_per_card_for_tensor_parallel_and_all_cards_for_a_layer_split(kw, split_mode, shards, devices):
    _, r, _, a, _, b, *_ = steps(context=8192, **kw)
    assert (b.split_mode, b.shards, b.devices) == (split_mode, shards, devices)
    gpu = find_gpu(kw["gpu"])
    reserved = gpu.memory_reserved_mib if gpu.memory_reserved_mib is not None else P.default_memory_reserved_mib()
    assert b.card_bytes == pytest.approx((gpu.memory_bytes - reserved * 2**20) * b.gpu_memory_utilization)
    if split_mode == "tensor":
        assert b.basis_bytes == b.card_bytes and b.basis_weights_bytes == pytest.approx(b.weights_gpu_bytes / devices)
    else:
        assert b.basis_bytes == pytest.approx(b.card_bytes * devices) and b.basis_weights_bytes == b.weights_gpu_bytes
        assert b.fixed_bytes == pytest.approx(a.fixed_overhead_bytes * devices)


def test_budget_keeps_llamacpps_untied_embedding_in_host_memory():
    *_, b_l, _, _, _ = steps(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="rtx-4090", context=4096)
    _, r, *_ = steps(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="rtx-4090", context=4096)
    assert not r.weights.tied and b_l.weights_gpu_bytes == r.weights.total_bytes - r.weights.embed_bytes


# ------------------------------------------------------------------------------------------ fit


@pytest.mark.parametrize(("kw", "context", "note"), [
    (dict(model="qwen2.5-7b-instruct", gpu="a100-sxm4-80gb"), None, "no --context given: planned at"),
    (dict(model="qwen2.5-7b-instruct", gpu="a100-sxm4-80gb", context=200000), 200000, "beyond the model's"),
    (dict(model="qwen2.5-7b-instruct", gpu="a100-sxm4-80gb", context=8192), 8192, None),
])
def test_fit_searches_the_context_and_says_why(kw, context, note):
    *_, fit, _, _ = steps(**kw)
    if context is None:
        assert fit.context % 256 == 0 and fit.context <= fit.max_context
    else:
        assert fit.context == context
    assert (note is None and not fit.notes) or any(note in n for n in fit.notes)


def test_fit_pool_holds_the_max_context_and_not_one_block_more():
    *_, fit, _, _ = steps(model="qwen2.5-32b-instruct", gpu="rtx-4090", quant="awq-int4", context=4096)
    assert fit.resident and fit.context_fits and fit.problems == ()
    assert fit.max_context < 32768  # memory binds, not the model's positions
    assert fit.kv_need(fit.max_context, 1) <= fit.pool_bytes < fit.kv_need(fit.max_context + 1, 1)
    assert fit.max_concurrency == int(fit.pool_bytes // fit.kv_need(4096, 1))
    assert fit.kv_cache_tokens is not None and fit.kv_cache_tokens % 16 == 0  # vLLM's blocks


@pytest.mark.parametrize(("kw", "resident", "problem"), [
    (dict(model="qwen2.5-32b-instruct", quant="q8_0", gpu="rtx-4090", context=4096), False, None),
    (dict(model="qwen2.5-7b-instruct", quant="fp16", gpu="rtx-4090", context=131072), True, "exceeds the"),
    (dict(model="qwen2.5-7b-instruct", quant="fp16", gpu="t4"), False, None),
])
def test_fit_says_when_the_weights_or_the_kv_cache_do_not_fit(kw, resident, problem):
    *_, fit, _, _ = steps(**kw)
    assert fit.resident is resident and not fit.context_fits
    assert (problem is None and not fit.problems) or problem in fit.problems[0]


def test_fit_of_a_split_is_set_by_its_tightest_card():
    *_, fit, _, _ = steps(model="llama-3.1-70b-instruct", quant="q4_k_m", gpu="v100-sxm2-32gb", gpus=4, context=8192)
    assert len(fit.devices) == 4 and sum(d.layers for d in fit.devices) == 80
    tight = fit.devices[fit.binding]
    assert tight.weights_bytes == max(d.weights_bytes for d in fit.devices)


# ------------------------------------------------------------------------------------------ speed


def test_speed_tensor_parallel_reads_a_shard_and_pays_all_reduces():
    _, r, *_, b1, _, s1, _ = steps(model="llama-3.1-70b-instruct", quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2,
                                   context=8192)
    *_, b4, _, s4, _ = steps(model="llama-3.1-70b-instruct", quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4,
                             context=8192)
    assert s1.weights_read_bytes == pytest.approx(r.weights.read_per_token / 2)
    assert s4.weights_read_bytes == pytest.approx(r.weights.read_per_token / 4)
    assert s4.ceiling > s1.ceiling and s4.comm.high_us > 0
    assert s1.ceiling == pytest.approx(find_gpu("v100-sxm2-32gb").bandwidth_gbps * GB / s1.read_bytes)
    assert s1.floor < s1.resident.low  # the floor is a sanity bound below the slowest prediction


def test_speed_layer_split_reads_every_layer_a_row_split_shares_them():
    _, r, *_, s_layer, _ = steps(model="llama-3.1-70b-instruct", quant="q4_k_m", gpu="v100-sxm2-32gb", gpus=4,
                                 context=8192)
    *_, s_row, _ = steps(model="llama-3.1-70b-instruct", quant="q4_k_m", gpu="v100-sxm2-32gb", gpus=4,
                         split_mode="row", context=8192)
    assert s_layer.weights_read_bytes == r.weights.read_per_token
    assert s_row.weights_read_bytes < s_layer.weights_read_bytes


# ------------------------------------------------------------------------------------------ offload


@pytest.mark.parametrize(("engine_quant", "offload", "fits", "problem", "note"), [
    (("llamacpp", "q8_0"), False, False, "REFUSED: the weights", None),
    (("llamacpp", "q8_0"), True, True, None, "run from host memory (CPU)"),
    (("vllm", "gptq-int8"), True, True, None, "host memory over PCIe (--cpu-offload-gb)"),
])
def test_offload_is_refused_unless_asked_then_priced(engine_quant, offload, fits, problem, note):
    engine, quant = engine_quant
    *_, fit, speed, off = steps(model="qwen2.5-32b-instruct", quant=quant, engine=engine, gpu="rtx-4090",
                                context=4096, offload=offload)
    assert not fit.resident and off.fits is fits and off.offload_bytes > 0
    assert off.gpu_layers < 64 and off.realistic[1] < speed.resident.low
    assert (problem is None and not off.problems) or problem in off.problems[0]
    assert (note is None and not off.notes) or note in off.notes[0]
    if offload:  # the split is made for what was asked: the plan holds exactly that
        assert (off.max_context, off.max_concurrency) == (4096, 1)


def test_offload_of_a_resident_plan_changes_nothing():
    *_, fit, speed, off = steps(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="rtx-4090", context=4096)
    assert fit.resident and off.offload_bytes == 0 and off.gpu_layers == 28 and off.fits
    assert off.ceiling == speed.ceiling and off.realistic == (speed.resident.low, speed.resident.high)


# ------------------------------------------------------------------------------------------ refusals and notes


@pytest.mark.parametrize(("kw", "refusal"), [
    (dict(model="qwen2.5-7b-instruct", gpu="a100-sxm4-80gb", gpus=3), "heads do not split evenly over 3 GPUs"),
    (dict(model="tiny-qwen2", quant="q4_k_m", gpu="t4", hosts=3), "3 hosts for 2 layers"),
    (dict(model="qwen2.5-7b-instruct", gpu="a100-sxm4-80gb", gpus=2), None),
    (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4", gpus=3), None),  # a layer split takes any count
])
def test_refusals_no_budget_fixes(kw, refusal):
    req, r, _, _, _, b, *_ = steps(context=512, **kw)
    got = P._refusals(req, r, b)
    assert (refusal is None and got == []) or refusal in got[0]


@pytest.mark.parametrize(("kw", "says", "not_says"), [
    (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"), "llama.cpp keeps the token-embedding table", None),
    (dict(model="qwen2.5-7b-instruct", quant="awq-int4", gpu="t4"), None, "token-embedding table"),
    (dict(model="gemma-2-27b-it", quant="gptq-int4", gpu="v100-sxm2-32gb"), "Gemma models are trained in bf16", None),
    (dict(model="gemma-2-27b-it", quant="q4_k_m", gpu="v100-sxm2-32gb"), "sliding window", "Gemma models"),
    (dict(model="qwen3-30b-a3b", quant="q4_k_m", gpu="rtx-4090"), "mixture of experts: 128 experts", None),
])
def test_figure_notes_say_what_the_figures_rest_on(kw, says, not_says):
    _, r, know, *_, fit, _, _ = steps(context=4096, **kw)
    notes = " | ".join(P._figure_notes(r, know, fit))
    assert says is None or says in notes
    assert not_says is None or not_says not in notes


def test_notes_put_problems_first_and_end_with_the_health_floor():
    req, r, know, a, pa, b, fit, speed, off = steps(model="qwen2.5-32b-instruct", quant="q8_0", gpu="rtx-4090",
                                                    context=4096)
    notes = P._notes(req, r, know, pa, b, fit, speed, off, P._flags(req, r, b, fit, off))
    assert not notes.fits and notes.problems[0].startswith("REFUSED: the weights")
    assert notes.notes[-1].startswith("health floor") and notes.floor == pytest.approx(off.realistic[0] * 0.5)


# ------------------------------------------------------------------------------------------ split layout


@pytest.mark.parametrize(("kw", "tp", "pp", "tensor_split", "adds"), [
    (dict(model="llama-3.1-70b-instruct", quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, hosts=2), 2, 2, None,
     "ray start --head"),
    (dict(model="llama-3.1-70b-instruct", quant="q4_k_m", gpu="p40", gpus=2, hosts=2), 1, 1, [1, 1, 1, 1],
     "`rpc-server` on each worker"),
    (dict(model="qwen2.5-7b-instruct", gpu="a100-sxm4-80gb"), 1, 1, None, None),
])
def test_split_layout(kw, tp, pp, tensor_split, adds):
    req, r, know, a, pa, b, fit, speed, _ = steps(context=8192, **kw)
    s = P._split_layout(req, r, know, a, pa, b, fit, speed.comm)
    assert (s.tensor_parallel_size, s.pipeline_parallel_size, s.tensor_split) == (tp, pp, tensor_split)
    assert sum(s.layers_per_host) == r.spec.num_layers
    assert s.per_gpu["budget_bytes"] == int(b.card_bytes)
    assert (adds is None and s.deploy_adds == []) or any(adds in x for x in s.deploy_adds)
    assert s.split_mode == ("" if b.devices == 1 else b.split_mode)
