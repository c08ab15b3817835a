"""Alternatives (``knowledge/planner/suggest.py``): for a plan that does not fit, the changes that
would, best first: a smaller quant, a smaller KV dtype, a shorter context, fewer sequences, more GPUs,
more hosts, offload last. The planner it asks is passed in, so the order it tries is a table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmfleet.knowledge.planner import plan
from llmfleet.knowledge.planner.request import PlanRequest
from llmfleet.knowledge.planner.resolve import _resolve
from llmfleet.knowledge.planner.suggest import _suggest

Q32 = "qwen2.5-32b-instruct"


def tried(**kw):
    """The changes ``_suggest`` tries, in order, when none of them fits."""
    req = PlanRequest(**kw)
    p = plan(req)
    seen = []

    def replan(changed):
        seen.append({k: v for k, v in changed.__dict__.items() if v != getattr(req, k)})
        return replace(p, fits=False)

    assert _suggest(req, p, _resolve(req), replan) == []
    return seen


@pytest.mark.parametrize(
    ("kw", "first", "last"),
    [
        # not resident: smaller GGUF quants, more GPUs, more hosts, then offload
        (dict(model=Q32, quant="q8_0", gpu="rtx-4090", context=4096), {"quant": "q6_k"}, {"offload": True}),
        # resident, the KV cache too big: a smaller KV dtype, a shorter context and fewer sequences come
        # before more GPUs and hosts; no offload for a resident plan
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4", context=32768, concurrency=64),
         {"kv_dtype": "q8_0"}, {"hosts": 4}),
    ],
)
def test_the_order_of_the_changes_tried(kw, first, last):
    seen = tried(**kw)
    assert seen[0] == first and seen[-1] == last
    kinds = [next(iter(c)) if len(c) == 1 else "hosts" for c in seen]
    order = ["quant", "kv_dtype", "context", "concurrency", "gpus", "hosts", "offload"]
    assert [order.index(k) for k in kinds] == sorted(order.index(k) for k in kinds), kinds


@pytest.mark.parametrize(
    ("kw", "gpus"),
    [
        (dict(model=Q32, quant="q8_0", gpu="rtx-4090", context=4096), [2, 4, 8]),
        (dict(model=Q32, quant="q8_0", gpu="rtx-4090", context=4096, gpus_available=3), [2, 3]),
    ],
)
def test_more_gpus_tries_the_cards_the_host_has(kw, gpus):
    assert [c["gpus"] for c in tried(**kw) if set(c) == {"gpus"}] == gpus


@pytest.mark.parametrize(
    ("kw", "best"),
    [
        # the largest smaller quant that fits comes first (q6_k and q5_k_m do not fit a 4090)
        (dict(model=Q32, quant="q8_0", gpu="rtx-4090", context=4096), "--quant q4_k_m"),
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4", context=4096), "--quant int8"),  # no fp8 below 8.9
    ],
)
def test_a_plan_that_does_not_fit_gets_ranked_alternatives(kw, best):
    p = plan(PlanRequest(**kw))
    assert not p.fits and p.alternatives
    assert p.alternatives[0]["flags"] == best
    assert [a["rank"] for a in p.alternatives] == list(range(1, len(p.alternatives) + 1))
