"""The short answer `invoke plan` prints first (knowledge/plan_answer.py): fit or not with the reason,
the engine flags, the decode speed (point and range), the health floor a deploy gates on with where it
comes from, and what to do next, in a few lines."""

from __future__ import annotations

import dataclasses

import pytest

from llmfleet.knowledge import plan_answer as A
from llmfleet.knowledge.planner import HEALTH_PROBE_CONTEXT, PlanRequest, plan

FITS = plan(PlanRequest(model="qwen3-32b", quant="gptq-int4", gpu="Tesla V100-SXM2-32GB"))
TOO_BIG = plan(PlanRequest(model="qwen3-32b", gpu="Tesla V100-SXM2-32GB"))
NO_IMAGE = plan(PlanRequest(model="qwen2.5-7b", engine="vllm", gpu="p40"))
SPLIT = plan(PlanRequest(model="llama-3.1-70b-instruct", quant="q4_k_m", gpu="p40", gpus=2, hosts=2, context=8192))
SHORT = plan(PlanRequest(model="qwen2.5-7b-instruct", gpu="a100-sxm4-80gb", context=256))
OWN = FITS.health_floor_tokps
INV = "inventory/lab/group_vars/all.yml"


def labels(rows):
    return [k for k, _ in rows]


def row(rows, label):
    return next(v for k, v in rows if k == label)


def test_the_seed_plans_are_what_the_rows_below_assume():
    assert FITS.fits and not TOO_BIG.fits and TOO_BIG.alternatives and not NO_IMAGE.fits and NO_IMAGE.image is None
    assert SPLIT.fits and SPLIT.hosts == 2 and SPLIT.deploy_adds and OWN is not None and SHORT.context == 256


@pytest.mark.parametrize(
    ("p", "want"),
    [
        (FITS, ["FITS", "engine flags", "decode", "health floor", "next", "more"]),
        (SPLIT, ["FITS", "split", "engine flags", "deploy adds", "decode", "health floor", "next", "more"]),
        (TOO_BIG, ["DOES NOT FIT"] + ["what would fit"] * min(3, len(TOO_BIG.alternatives)) + ["next"]),
        (NO_IMAGE, ["NO IMAGE RUNS ON THIS CARD", "next"]),
    ],
)
def test_rows_and_their_order(p, want):
    rows = A.short_answer(p)
    assert labels(rows) == want
    assert len(A.lines(rows)) == len(want) <= 10


@pytest.mark.parametrize(
    ("p", "has", "lacks"),
    [
        (FITS, ["qwen3-32b (gptq-int4) on 1 x Tesla V100-SXM2-32GB, vllm (vllm:0.19.1)",
                f"{FITS.context:,} tokens of context x 1 sequence(s)"], ["REFUSED"]),
        (TOO_BIG, ["qwen3-32b (bf16)", ": the weights (65.5 GB on the GPU) do not fit"], ["REFUSED", "; only"]),
        (NO_IMAGE, ["no vLLM image in the catalog runs on Tesla P40"], ["REFUSED"]),
        (SPLIT, ["on each of 2 hosts"], []),
    ],
)
def test_the_verdict_line(p, has, lacks):
    first = A.short_answer(p)[0][1]
    for h in has:
        assert h in first
    for n in lacks:
        assert n not in first


def test_a_refusal_is_cut_to_its_first_clause_only_when_long():
    short = dataclasses.replace(TOO_BIG, notes=["REFUSED: only 300 tokens of context fit; below 1024 is not useful"])
    assert A.reason(short) == "only 300 tokens of context fit; below 1024 is not useful"
    assert len(A.reason(TOO_BIG)) <= A.MAX_REASON_CHARS < len(TOO_BIG.notes[0])
    assert A.reason(FITS) == ""


def test_flags_speed_point_and_range():
    rows = A.short_answer(FITS)
    assert row(rows, "engine flags").startswith("--quantization gptq") and "--max-model-len" in row(rows, "engine flags")
    lo, hi = FITS.decode_tokps_realistic
    assert row(rows, "decode") == (f"about {(lo + hi) / 2:,.1f} tok/s at batch 1 (predicted {lo:,.1f}-{hi:,.1f}) "
                                   f"with {FITS.context:,} tokens in context")
    line = "measured on 3 hosts: 17-19 tok/s (median 18)"
    measured = A.short_answer(FITS, measured=line, calibrated="speed overlay: measured on h1 at 2026-12-01")
    assert row(measured, "decode") == (
        f"about {(lo + hi) / 2:,.1f} tok/s at batch 1 (predicted {lo:,.1f}-{hi:,.1f}, with the efficiency from the "
        f"speed overlay: measured on h1 at 2026-12-01) with {FITS.context:,} tokens in context; this fleet: {line}")


@pytest.mark.parametrize(
    ("floor", "want"),
    [
        # no floor given, or decode_floor's answer without history or settings: the planner's own
        (None, f"{OWN:,.1f} tok/s with {HEALTH_PROBE_CONTEXT} tokens in context: the planner's sanity bound"),
        (A.AnswerFloor(OWN, f"the planner's floor {OWN:.1f} tok/s: a sanity bound below every public measurement"),
         f"{OWN:,.1f} tok/s with {HEALTH_PROBE_CONTEXT} tokens in context: the planner's sanity bound"),
        # the lab: an absolute floor from the service, and the file that set it
        (A.AnswerFloor(2.0, "the service's health.min_tokps 2 tok/s", INV),
         f"2.0 tok/s with {HEALTH_PROBE_CONTEXT} tokens in context from the service's health.min_tokps ({INV}), "
         f"not the planner's {OWN:,.1f} tok/s"),
        (A.AnswerFloor(3.0, "the host's llmfleet_health_min_tokps 3 tok/s", "inv/hosts.yml (host h)"),
         "from the host's llmfleet_health_min_tokps (inv/hosts.yml (host h)), not the planner's"),
        (A.AnswerFloor(6.75, "0.5 x the planner's realistic 13.5 tok/s (the service's health.floor_fraction)", INV),
         f"6.8 tok/s with {HEALTH_PROBE_CONTEXT} tokens in context = 0.5 x the planner's realistic 13.5 tok/s "
         f"(the service's health.floor_fraction, {INV}), not the planner's"),
        (A.AnswerFloor(15.0, "0.5 x the median 30.0 tok/s of 3 healthy runs of this card/engine/image/model/quant/"
                             "context (v100/vllm/...) on h1 (chat r1: 30.0 tok/s)"),
         "15.0 tok/s with 512 tokens in context = 0.5 x the median 30.0 tok/s of 3 healthy runs, not the planner's"),
        (A.AnswerFloor(None, "decode floor disabled (the service's health.floor_fraction is 0)", INV),
         f"none: decode floor disabled (the service's health.floor_fraction is 0, {INV})"),
        # the planner's figure itself, from an inventory setting: nothing to contrast
        (A.AnswerFloor(OWN, f"the service's health.min_tokps {OWN:g} tok/s", INV), f"({INV})"),
    ],
)
def test_the_floor_says_where_it_comes_from(floor, want):
    text = row(A.short_answer(FITS, floor), "health floor")
    assert want in text, text
    if floor is not None and floor.tokps is not None:  # the figure the deploy gates on comes first
        assert text.startswith(f"{floor.tokps:,.1f} tok/s"), text


def test_a_context_within_the_probe_is_not_restated():
    assert row(A.short_answer(SHORT), "health floor").startswith(f"{SHORT.health_floor_tokps:,.1f} tok/s: the planner's")


@pytest.mark.parametrize(
    ("p", "kwargs", "has"),
    [
        (FITS, {}, "name it in a host's llmfleet_services"),
        (FITS, {"service": True, "host": "gpu-v100-01"}, "`invoke deploy --host gpu-v100-01`"),
        (TOO_BIG, {}, "plan again with one of these changes"),
        (NO_IMAGE, {}, "--explain"),
    ],
)
def test_next(p, kwargs, has):
    assert has in row(A.short_answer(p, **kwargs), "next")


def test_what_would_fit_shows_at_most_three_and_says_how_many_more():
    rows = A.short_answer(TOO_BIG)
    alts = [v for k, v in rows if k == "what would fit"]
    assert alts[0].startswith(TOO_BIG.alternatives[0]["flags"] + ": up to ")
    assert len(alts) == min(3, len(TOO_BIG.alternatives))
    more = len(TOO_BIG.alternatives) - 3
    assert (f"({more} more with --explain)" in row(rows, "next")) is (more > 0)


def test_lines_align_the_labels():
    out = A.lines([("FITS", "a"), ("health floor", "b")])
    assert out == ["FITS          a", "health floor  b"]
