"""The fit step (``knowledge/planner/fit.py``): the KV pool the weights leave, the context asked or
the most that fits, the sequences it holds, and the sentence that says why a plan does not fit."""

from __future__ import annotations

import pytest

from llmfleet.knowledge.catalog import min_context
from llmfleet.knowledge.planner.fit import _largest, _round_down
from tests.planner_stages import stages

L70 = "llama-3.1-70b-instruct"


@pytest.mark.parametrize(
    ("kw", "resident", "context_fits", "problem"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4", context=4096), True, True, None),
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4", context=4096), False, False, None),
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2, context=8192), True, False,
         "the weights fit but the KV cache for 1 x 8192 tokens"),
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4, context=8192), True, True, None),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4", context=32768, concurrency=64), True, False,
         "exceeds the"),
    ],
)
def test_resident_and_context_verdicts(kw, resident, context_fits, problem):
    f = stages(**kw).fit
    assert (f.resident, f.context_fits) == (resident, context_fits)
    if problem:
        assert any(problem in p for p in f.problems), f.problems
    else:
        assert f.problems == ()


@pytest.mark.parametrize(
    "kw",
    [
        dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"),
        dict(model="qwen2.5-32b-instruct", quant="gptq-int4", gpu="rtx-4090", concurrency=2),
        dict(model="gemma-3-27b-it", quant="q4_k_m", gpu="rtx-3090"),
        dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2, hosts=2),
    ],
)
def test_max_context_is_the_largest_that_fits_the_pool(kw):
    s = stages(context=4096, **kw)
    f, k = s.fit, s.req.concurrency
    assert f.kv_need(f.max_context, k) <= f.pool_bytes
    if f.max_context < s.r.spec.max_context:
        assert f.kv_need(f.max_context + 1, k) > f.pool_bytes
    assert f.max_concurrency == int(f.pool_bytes // f.kv_need(f.context, 1))


@pytest.mark.parametrize(
    ("kw", "context", "why"),
    [
        # the most that fits, rounded down to 256, up to the model's positions
        (dict(model="qwen2.5-7b-instruct", gpu="a100-sxm4-80gb"), 32768, "the most that fits"),
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4"), 4096, "nothing fits at any context"),
        (dict(model="tiny-qwen2", quant="q4_k_m", gpu="t4"), 512, "the most that fits"),
    ],
)
def test_no_context_given_plans_the_most_that_fits(kw, context, why):
    f = stages(**kw).fit
    assert f.context == context
    assert any("no --context given" in n and why in n for n in f.notes), f.notes


def test_a_picked_context_below_the_useful_minimum_is_a_problem():
    f = stages(model="llama-3.1-70b-instruct", quant="q4_k_m", gpu="rtx-4090", gpus=2, concurrency=32).fit
    assert f.resident and f.context < min_context() and not f.context_fits
    assert any("not a useful service" in p for p in f.problems)


@pytest.mark.parametrize(
    ("kw", "tokens_known"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"), True),  # full attention: a token pool
        (dict(model="gemma-3-27b-it", quant="q4_k_m", gpu="h100-sxm-80gb"), False),  # sliding windows: per sequence
        (dict(model="qwen3.5-27b", quant="bf16", gpu="h200-141gb"), False),  # linear attention: fixed state
    ],
)
def test_kv_cache_tokens_only_where_every_layer_keeps_full_kv(kw, tokens_known):
    f = stages(context=8192, **kw).fit
    assert (f.kv_cache_tokens is not None) is tokens_known


@pytest.mark.parametrize(("n", "step", "want"), [(1000, 256, 768), (256, 256, 256), (100, 256, 100), (0, 256, 0)])
def test_round_down(n, step, want):
    assert _round_down(n, step) == want


@pytest.mark.parametrize(("lo", "hi", "limit", "want"), [(1, 100, 37, 37), (1, 100, 0, 0), (1, 100, 500, 100),
                                                         (5, 4, 10, 4)])
def test_largest_is_a_binary_search_over_a_monotone_test(lo, hi, limit, want):
    assert _largest(lo, hi, lambda x: x <= limit) == want
