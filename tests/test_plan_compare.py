"""`invoke plan --compare` ranks every engine and quant of a model on a card at one context; the
headline decode of a plan without --context is at the typical context; --min-tokps is a decode target.

Expected figures are computed through the planner (the speed model moves), never written down."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from llmfleet.knowledge.catalog import find_gpu, find_model, find_quant, typical_context
from llmfleet.knowledge.plan_answer import expected_tokps
from llmfleet.knowledge.plan_compare import (
    BELOW,
    MEETS,
    STRADDLES,
    Evidence,
    Row,
    candidates,
    compare,
    rank,
    target_verdict,
)
from llmfleet.knowledge.planner import PlanRequest, plan
from tests.test_plan_cli import _invoke as _plan_cli_invoke

V100 = ("--model", "qwen3.5-27b", "--gpu", "v100-sxm2-32gb")


def _invoke(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return _plan_cli_invoke(*args, home=home, columns=200)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("home")


def _row(name: str, point: float, *, fits: bool = True, max_context: int = 1000, weights: int = 1) -> Row:
    engine, quant = name.split()
    return Row(engine, quant, None, fits, "" if fits else "does not fit", point - 1, point + 1, point,
               max_context=max_context, weights_bytes=weights, evidence=Evidence("model", ""))


@pytest.mark.parametrize(("rows", "order", "refused"), [
    ([_row("a x", 10), _row("b y", 30), _row("c z", 20)], ["b y", "c z", "a x"], []),
    # a tie on the point estimate: the larger context that fits first, then the smaller weights
    ([_row("a x", 10, max_context=5), _row("b y", 10, max_context=9)], ["b y", "a x"], []),
    ([_row("a x", 10, weights=5), _row("b y", 10, weights=3)], ["b y", "a x"], []),
    # what does not fit is never ranked, whatever its figure, and keeps its order
    ([_row("a x", 99, fits=False), _row("b y", 5), _row("c z", 98, fits=False)], ["b y"], ["a x", "c z"]),
    ([_row("a x", 1, fits=False)], [], ["a x"]),
])
def test_rank_orders_fitting_rows_by_point_estimate(rows, order, refused):
    fitting, rest = rank(rows)
    assert [r.name for r in fitting] == order and [r.name for r in rest] == refused


@pytest.mark.parametrize(("point", "low", "target", "verdict"), [
    (30.0, 25.0, None, None),
    (30.0, 25.0, 20.0, MEETS),      # the whole range above
    (30.0, 20.0, 20.0, MEETS),      # the low end on the target meets it
    (30.0, 15.0, 20.0, STRADDLES),  # the point above, the low end below: a warning
    (20.0, 15.0, 20.0, STRADDLES),
    (19.9, 15.0, 20.0, BELOW),      # the point below: not met
])
def test_target_verdict(point, low, target, verdict):
    assert target_verdict(point, low, target) == verdict


@pytest.mark.parametrize(("model", "engine", "quant", "has", "lacks"), [
    # each engine's own family: GGUF for llama.cpp, checkpoints for vLLM (its GGUF loader is experimental)
    ("qwen3.5-27b", None, None, {("vllm", "gptq-int4"), ("llamacpp", "q4_k_m")}, {("llamacpp", "gptq-int4"),
                                                                                 ("vllm", "q4_k_m")}),
    # formats of a mixture-of-experts model's experts are not a choice for a dense one
    ("qwen3.5-27b", None, None, set(), {("vllm", "mxfp4"), ("llamacpp", "mxfp4-moe")}),
    # --quant fixes the quant: every engine is planned with it (the planner refuses those that cannot)
    ("qwen3.5-27b", None, "q4_k_m", {("vllm", "q4_k_m"), ("llamacpp", "q4_k_m")}, {("llamacpp", "q8_0")}),
    ("qwen3.5-27b", "llamacpp", None, {("llamacpp", "q8_0")}, {("vllm", "gptq-int4")}),
])
def test_candidates(model, engine, quant, has, lacks):
    got = set(candidates(find_model(model), engine, quant))
    assert has <= got and not (lacks & got), (has - got, lacks & got)


def test_compare_plans_each_row_as_the_planner_does_at_one_context():
    spec, gpu = find_model("qwen3.5-27b"), find_gpu("v100-sxm2-32gb")
    c = compare(PlanRequest(model=spec.name, gpu=gpu), spec)
    assert c.context == typical_context(spec.max_context)
    names = [r.name for r in c.ranked]
    assert "vllm gptq-int4" in names and "llamacpp q4_k_m" in names  # both engines in one answer
    for r in c.ranked:
        p = plan(PlanRequest(model=spec.name, gpu=gpu, engine=r.engine, quant=r.quant, context=c.context))
        assert p.fits and r.point == pytest.approx(expected_tokps(p)) and r.max_context == p.max_context_tokens
    assert [r.point for r in c.ranked] == sorted((r.point for r in c.ranked), reverse=True)
    refused = {r.name: r.reason for r in c.refused}
    assert "awq" in refused["vllm awq-int4"] and "do not fit" in refused["vllm bf16"]


def test_a_fleet_calibration_narrows_the_range_and_says_so():
    spec, gpu = find_model("qwen3.5-27b"), find_gpu("v100-sxm2-32gb")
    req = PlanRequest(model=spec.name, gpu=gpu)
    plain = {r.name: r for r in compare(req, spec).ranked}
    cal = {r.name: r for r in compare(req, spec, calibrate=lambda p: (0.5, "speed overlay: test")).ranked}
    for name, r in cal.items():
        assert r.evidence.narrowed and "speed overlay: test" in r.evidence.text
        assert r.high - r.low < plain[name].high - plain[name].low
    assert not any(r.evidence.narrowed for r in plain.values())


def test_a_public_figure_of_the_same_engine_on_the_card_backs_a_row():
    spec, gpu = find_model("llama-3.1-8b-instruct"), find_gpu("rtx-4090")
    from llmfleet.knowledge.catalog import load_public_decode

    c = compare(PlanRequest(model=spec.name, gpu=gpu), spec, engine="llamacpp", public=load_public_decode())
    q4 = next(r for r in c.ranked if r.quant == find_quant("q4_k_m").name)
    assert q4.evidence.kind == "public" and "rtx" not in q4.evidence.text.lower().split("public: ")[0]
    assert "range not narrowed" in q4.evidence.text


def test_the_v100_case_ranks_both_engines_in_one_answer_at_the_typical_context(home):
    r = _invoke(*V100, "--compare", "--json", home=home)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    spec = find_model("qwen3.5-27b")
    assert d["context"] == typical_context(spec.max_context) < spec.max_context
    ranked = [(x["engine"], x["quant"]) for x in d["ranked"]]
    assert ("vllm", "gptq-int4") in ranked and ("llamacpp", "q4_k_m") in ranked
    points = [x["decode_tokps_expected"] for x in d["ranked"]]
    assert points == sorted(points, reverse=True) and [x["rank"] for x in d["ranked"]] == list(range(1, len(points) + 1))
    assert all(x["fits"] is False and x["reason"] for x in d["refused"])
    text = _invoke(*V100, "--compare", home=home)
    assert text.returncode == 0 and "vllm" in text.stdout and "llamacpp" in text.stdout
    assert f"at {d['context']:,} tokens in context" in text.stdout and "refused or does not fit" in text.stdout


def test_compare_with_a_quant_compares_the_engines_only(home):
    d = json.loads(_invoke(*V100, "--compare", "--quant", "q4_k_m", "--json", home=home).stdout)
    assert {x["quant"] for x in d["ranked"] + d["refused"]} == {"q4_k_m"}
    assert {x["engine"] for x in d["ranked"]} == {"vllm", "llamacpp"}


def test_without_context_the_headline_decode_is_at_the_typical_context(home):
    """The flags keep the largest context that fits; the decode figure is the typical context's."""
    r = _invoke(*V100, "--quant", "q4_k_m", "--json", home=home)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    typical = typical_context(find_model("qwen3.5-27b").max_context)
    at = plan(PlanRequest(model="qwen3.5-27b", gpu="v100-sxm2-32gb", quant="q4_k_m", context=typical))
    assert d["decode_context"] == typical and d["context"] > typical  # the flags: the most that fits
    assert d["decode_at_context"]["decode_tokps_expected"] == pytest.approx(expected_tokps(at), abs=0.01)
    text = " ".join(_invoke(*V100, "--quant", "q4_k_m", home=home).stdout.split())
    assert f"with {typical:,} tokens in context" in text and f"-c {d['context']}" in text
    # --context N keeps meaning exactly N
    d8 = json.loads(_invoke(*V100, "--quant", "q4_k_m", "--context", "4096", "--json", home=home).stdout)
    assert d8["context"] == 4096 and "decode_context" not in d8


def _headline(quant: str) -> tuple[float, float]:
    typical = typical_context(find_model("qwen3.5-27b").max_context)
    p = plan(PlanRequest(model="qwen3.5-27b", gpu="v100-sxm2-32gb", quant=quant, context=typical))
    return expected_tokps(p), p.decode_tokps_realistic[0]


def test_min_tokps_exit_codes(home):
    point, low = _headline("q4_k_m")
    above = _invoke(*V100, "--quant", "q4_k_m", "--min-tokps", f"{point * 1.5:.1f}", home=home)
    assert above.returncode == 1 and above.stderr.count("\n") == 1, above.stderr
    assert "does not meet --min-tokps" in above.stderr and f"about {point:,.1f} tok/s" in above.stderr
    straddle = _invoke(*V100, "--quant", "q4_k_m", "--min-tokps", f"{(point + low) / 2:.1f}", home=home)
    assert straddle.returncode == 0 and "WARN" in straddle.stdout and "straddles" in straddle.stdout
    met = _invoke(*V100, "--quant", "q4_k_m", "--min-tokps", f"{low * 0.9:.1f}", home=home)
    assert met.returncode == 0 and "WARN" not in met.stdout
    for bad in ("0", "-3", "fast"):
        r = _invoke(*V100, "--min-tokps", bad, home=home)
        assert r.returncode == 2 and "--min-tokps" in r.stderr, (bad, r.stderr)


def test_min_tokps_in_compare_marks_rows_and_fails_only_when_none_meets(home):
    d = json.loads(_invoke(*V100, "--compare", "--json", home=home).stdout)
    best = d["ranked"][0]["decode_tokps_expected"]
    some = _invoke(*V100, "--compare", "--json", "--min-tokps", f"{best - 0.05:.2f}", home=home)
    assert some.returncode == 0, some.stderr
    marks = [x["target"] for x in json.loads(some.stdout)["ranked"]]
    assert marks[0] in (MEETS, STRADDLES) and BELOW in marks
    none = _invoke(*V100, "--compare", "--min-tokps", f"{best * 2:.1f}", home=home)
    assert none.returncode == 1 and "nothing that fits meets --min-tokps" in none.stderr
    assert "below target" in none.stdout
