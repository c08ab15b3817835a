"""Pure parts of ``invoke bench``: flags, percentiles, level figures, the plan beside them, comparison,
the upgrade gate's decision, and the bench.json scripts (run in a local shell on a temporary root)."""

from __future__ import annotations

import json
import subprocess

import pytest

from llmfleet.fleet import bench as B
from llmfleet.release import store

# ---------------------------------------------------------------------------------------------
# flags


@pytest.mark.parametrize("kw, expect", [
    ({}, B.BenchParams()),
    ({"concurrency": "4,1,2,2"}, B.BenchParams(concurrency=(1, 2, 4))),
    ({"concurrency": 8, "prompt_tokens": "64"}, B.BenchParams(concurrency=(8,), prompt_tokens=(64,))),
    ({"max_tokens": "32", "requests": "5"}, B.BenchParams(max_tokens=32, requests=5)),
    ({"duration": "2.5"}, B.BenchParams(duration_s=2.5)),
])
def test_params_from_flags(kw, expect):
    assert B.parse_params(**kw) == expect


@pytest.mark.parametrize("kw, words", [
    ({"concurrency": "0"}, "--concurrency: 0 is out of range"),
    ({"concurrency": "1,x"}, "--concurrency: 'x' is not a whole number"),
    ({"concurrency": ","}, "--concurrency: give a comma-separated list"),
    ({"concurrency": "1000"}, "out of range (1-256)"),
    ({"max_tokens": "1"}, "--max-tokens: 1 is out of range"),
    ({"max_tokens": "lots"}, "--max-tokens: 'lots'"),
    ({"duration": "-1"}, "--duration: -1 is out of range"),
    ({"duration": "99999"}, "--duration: 99999 is out of range"),
    ({"requests": "0"}, "--requests: 0 is out of range"),
    ({"prompt_tokens": "0"}, "--prompt-tokens: 0 is out of range"),
])
def test_bad_flags_name_the_flag(kw, words):
    with pytest.raises(ValueError) as exc:
        B.parse_params(**kw)
    assert words in str(exc.value)


@pytest.mark.parametrize("params, c, n", [
    (B.BenchParams(), 1, 4), (B.BenchParams(), 8, 16),
    (B.BenchParams(requests=3), 8, 3),
    (B.BenchParams(duration_s=10), 4, None),
    (B.BenchParams(duration_s=10, requests=7), 4, 7),
])
def test_requests_per_level_is_always_bounded(params, c, n):
    assert params.requests_for(c) == n
    assert n is not None or params.duration_s is not None


# ---------------------------------------------------------------------------------------------
# percentiles: numpy's default (linear) method, as vllm bench serve reports them


@pytest.mark.parametrize("values, p, expect", [
    ([], 50, None),
    ([None, None], 50, None),
    ([5.0], 95, 5.0),
    ([1, 2, 3, 4], 50, 2.5),
    ([1, 2, 3, 4, 5], 50, 3.0),
    ([1, 2, 3, 4, 5], 95, 4.8),
    ([10, None, 20], 50, 15.0),
    ([3, 1, 2], 0, 1.0),
    ([3, 1, 2], 100, 3.0),
])
def test_percentile(values, p, expect):
    got = B.percentile(values, p)
    assert got == pytest.approx(expect) if expect is not None else got is None


def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    xs = [0.31, 0.12, 0.95, 0.44, 0.5, 0.07, 0.66]
    for p in (5, 50, 90, 95, 99):
        assert B.percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)))


# ---------------------------------------------------------------------------------------------
# levels


def req(start, ttft, dec, tokens=64, ok=True, end=None, prompt=130, error=""):
    end = end if end is not None else start + ttft + (tokens - 1) / dec
    return B.RequestResult(started=start, ended=end, ok=ok, ttft_s=ttft if ok else None,
                           decode_tokps=dec if ok else None, output_tokens=tokens if ok else 0,
                           prompt_tokens=prompt if ok else None, error=error)


def test_level_figures():
    results = [req(0.0, 0.2, 40.0, end=2.0), req(0.0, 0.3, 30.0, end=2.5), req(2.0, 0.1, 50.0, end=4.0),
               req(2.5, 0, 0, ok=False, end=3.0, error="HTTP 503: busy")]
    lv = B.aggregate_level(2, 128, 64, results)
    assert (lv.requests, lv.ok, lv.errors) == (4, 3, 1)
    assert lv.error_samples == ["HTTP 503: busy"]
    assert lv.wall_s == 4.0
    assert lv.output_tokens == 192
    assert lv.aggregate_tokps == pytest.approx(192 / 4.0)
    assert lv.ttft_p50_s == pytest.approx(0.2) and lv.ttft_p95_s == pytest.approx(0.29)
    assert lv.decode_tokps_p50 == 40.0 and lv.decode_tokps_min == 30.0
    assert lv.prompt_tokens == 130


def test_level_samples_count_only_inside_its_window_and_cards_add_up():
    gpu = [B.GpuSample(0.5, 0, 1000, 32768), B.GpuSample(0.5, 1, 3000, 32768),  # one reading, two cards
           B.GpuSample(1.5, 0, 1500, 32768), B.GpuSample(1.5, 1, 3100, 32768),
           B.GpuSample(9.0, 0, 30000, 32768)]  # after the level: not counted
    metrics = [B.MetricsSample(1.0, 2, 0, 0.10), B.MetricsSample(1.9, 2, 3, 0.35), B.MetricsSample(9.5, 9, 9, 0.9)]
    lv = B.aggregate_level(2, 128, 64, [req(0.0, 0.1, 50.0, end=2.0)], gpu, metrics)
    assert lv.gpu_memory_used_mib_max == 4600 and lv.gpu_memory_total_mib == 65536 and lv.gpu_samples == 2
    assert lv.kv_cache_usage_max == 0.35 and lv.requests_waiting_max == 3 and lv.requests_running_max == 2
    assert lv.metrics_samples == 2
    # a level shorter than the sampling period: the last GPU reading before its end, no stale metrics
    short = B.aggregate_level(2, 128, 64, [req(2.0, 0.1, 50.0, end=2.3)], gpu, metrics)
    assert short.gpu_memory_used_mib_max == 4600 and short.gpu_samples == 1
    assert short.kv_cache_usage_max is None and short.metrics_samples == 0


def test_an_empty_or_failed_level_has_no_speed():
    assert B.aggregate_level(1, 128, 64, []).aggregate_tokps is None
    lv = B.aggregate_level(1, 128, 64, [req(0, 0, 0, ok=False, end=1.0, error="x")])
    assert lv.aggregate_tokps is None and lv.decode_tokps_p50 is None and lv.errors == 1


@pytest.mark.parametrize("stdout, expect", [
    ("0, 15873, 32768, 87\n", [(0, 15873.0, 32768.0, 87.0)]),
    ("0, 100, 16384, [N/A]\n1, 200, 16384, 5\n", [(0, 100.0, 16384.0, None), (1, 200.0, 16384.0, 5.0)]),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", []),
    ("", []),
])
def test_gpu_samples_parse(stdout, expect):
    got = [(s.index, s.memory_used_mib, s.memory_total_mib, s.utilization_pct) for s in B.parse_gpu_sample(stdout, 1.0)]
    assert got == expect


def test_gpu_query_is_the_nvidia_smi_csv_query():
    assert B.gpu_query_command() == ("nvidia-smi --query-gpu=index,memory.used,memory.total,utilization.gpu "
                                     "--format=csv,noheader,nounits")


# ---------------------------------------------------------------------------------------------
# the plan beside the figures


def doc_with(levels, release="20261201T050000Z-aaaaaaaaaa", plan=None):
    p = B.BenchParams(concurrency=tuple(sorted({lv.concurrency for lv in levels})) or (1,),
                      prompt_tokens=tuple(sorted({lv.prompt_tokens_asked for lv in levels})) or (128,))
    return B.result_document(host="h1", service="s", engine="vllm", release=release, model="m", image=None,
                             params=p, levels=levels, plan=plan or B.PlanFigures(64.0, (30.0, 45.0), "test"),
                             time="2026-12-01T05:00:00+00:00", who="me")


def lv(c, dec, agg=None, ttft=0.2, p=128, errors=0, ok=4):
    x = B.Level(concurrency=c, prompt_tokens_asked=p, max_tokens=64, requests=ok + errors, ok=ok, errors=errors)
    x.decode_tokps_p50, x.aggregate_tokps, x.ttft_p50_s, x.ttft_p95_s = dec, agg, ttft, ttft
    return x


@pytest.mark.parametrize("plan, expect", [
    ({"decode_tokps_ceiling": 64.3, "decode_tokps_realistic": [27.0, 41.8], "gpu_name": "Tesla V100-SXM2-32GB"},
     (64.3, (27.0, 41.8), "Tesla V100-SXM2-32GB")),
    ({"decode_tokps_ceiling": 0, "decode_tokps_realistic": 12}, (None, (12.0, 12.0), None)),
    (None, (None, None, None)),
])
def test_plan_figures_from_a_plan_or_a_manifests_plan(plan, expect):
    f = B.plan_figures(plan, "src")
    assert (f.ceiling_tokps, f.realistic_tokps, f.card) == expect


def test_plan_figures_from_the_planners_plan_object():
    from llmfleet.knowledge import planner

    plan = planner.plan(planner.PlanRequest(model="qwen2.5-32b-instruct", quant="q4_k_m", gpu="v100-sxm2-32gb")) \
        if hasattr(planner, "plan") else None
    if plan is None:
        pytest.skip("planner has no plan() entry point")
    f = B.plan_figures(plan, "planner")
    assert f.ceiling_tokps == pytest.approx(plan.decode_tokps_ceiling)
    assert f.realistic_tokps[0] <= f.realistic_tokps[1] <= f.ceiling_tokps


@pytest.mark.parametrize("measured, rng, expect", [
    (20.0, (30.0, 45.0), "below"), (30.0, (30.0, 45.0), "within"), (50.0, (30.0, 45.0), "above"),
    (None, (30.0, 45.0), "-"), (20.0, None, "-"),
])
def test_against_the_realistic_range(measured, rng, expect):
    assert B.against_range(measured, rng) == expect


def test_table_rows_carry_the_ratio_to_the_ceiling():
    rows = B.table_rows(doc_with([lv(4, 32.0, 100.0), lv(1, 42.0, 41.0)]))
    assert [r["concurrency"] for r in rows] == [1, 4]
    assert rows[0]["decode_vs_ceiling"] == pytest.approx(42 / 64, abs=1e-3)
    assert rows[0]["decode_vs_realistic"] == "within" and rows[1]["decode_vs_realistic"] == "within"
    assert rows[1]["aggregate_tokps"] == 100.0


# ---------------------------------------------------------------------------------------------
# comparison


def test_compare_two_releases():
    a = doc_with([lv(1, 40.0, 40.0, 0.20), lv(4, 30.0, 100.0, 0.40)], release="20261201T050000Z-aaaaaaaaaa")
    b = doc_with([lv(1, 30.0, 30.0, 0.25), lv(8, 20.0, 150.0, 0.9)], release="20261201T060000Z-bbbbbbbbbb")
    rows = {r["concurrency"]: r for r in B.compare(a, b)}
    assert sorted(rows) == [1, 4, 8]
    one = rows[1]
    assert one["in_both"] and one["decode_tokps_p50"] == {"a": 40.0, "b": 30.0, "change_pct": -25.0, "better": False}
    assert one["ttft_p50_s"]["change_pct"] == 25.0 and one["ttft_p50_s"]["better"] is False
    assert not rows[4]["in_both"] and rows[4]["decode_tokps_p50"]["b"] is None
    assert rows[8]["aggregate_tokps"] == {"a": None, "b": 150.0, "change_pct": None, "better": None}


@pytest.mark.parametrize("a, b, expect", [(10, 12, 20.0), (10, 10, 0.0), (0, 5, None), (None, 5, None)])
def test_change_pct(a, b, expect):
    assert B.change_pct(a, b) == expect


# ---------------------------------------------------------------------------------------------
# the upgrade gate


@pytest.mark.parametrize("base, cand, pct, ok, slower", [
    ([lv(1, 40.0)], [lv(1, 39.0)], 10, True, 2.5),
    ([lv(1, 40.0)], [lv(1, 44.0)], 10, True, -10.0),
    ([lv(1, 40.0)], [lv(1, 35.0)], 10, False, 12.5),
    ([lv(1, 40.0)], [lv(1, 36.0)], 10, True, 10.0),  # exactly PCT slower still passes
    ([lv(1, 40.0), lv(4, 30.0)], [lv(1, 40.0), lv(4, 15.0)], 20, False, 50.0),  # the worst level decides
    ([lv(1, 40.0)], [lv(1, 1.0)], 100, True, 97.5),
])
def test_gate_verdicts(base, cand, pct, ok, slower):
    v = B.gate_verdict(doc_with(base), doc_with(cand), pct)
    assert v.ok is ok and v.slower_pct == slower
    if not ok:
        assert "slower than" in v.message and f"allowed: {pct}%" in v.message


def test_gate_without_a_baseline_passes_and_says_so():
    v = B.gate_verdict(None, doc_with([lv(1, 40.0)]), 10)
    assert v.ok and "gate not applied" in v.message


@pytest.mark.parametrize("cand, words", [
    (None, "could not be benchmarked"),
    ("all-failed", "no request to the new release succeeded"),
])
def test_gate_fails_closed_when_the_new_release_cannot_be_measured(cand, words):
    if cand == "all-failed":
        x = lv(1, None, ok=0, errors=5)
        x.error_samples = ["HTTP 500: boom"]
        cand = doc_with([x])
    v = B.gate_verdict(doc_with([lv(1, 40.0)]), cand, 10)
    assert not v.ok and words in v.message


def test_gate_percentage_is_range_checked():
    with pytest.raises(ValueError, match="between 0 and 100"):
        B.gate_verdict(None, None, 150)


# ---------------------------------------------------------------------------------------------
# bench.json on the host: the scripts, run by a local shell on a temporary root


def sh(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)


def test_bench_json_is_written_into_the_release_and_read_back(tmp_path):
    paths = store.Paths(str(tmp_path), "tiny")
    r1, r2, r3 = "20261201T050000Z-aaaaaaaaaa", "20261201T060000Z-bbbbbbbbbb", "20261201T070000Z-cccccccccc"
    for r in (r1, r2, r3):
        (tmp_path / "services" / "tiny" / "releases" / r).mkdir(parents=True)
    doc = doc_with([lv(1, 40.0)], release=r1)
    doc["notes"] = ["it's \"quoted\" $(not run) `nor this`"]
    res = sh(store.bench_write_script(paths, r1, doc))
    assert res.returncode == 0 and "@@benchsaved" in res.stdout
    sh(store.bench_write_script(paths, r2, doc_with([lv(1, 30.0)], release=r2)))
    saved = json.loads((tmp_path / "services/tiny/releases" / r1 / "bench.json").read_text())
    assert saved == doc
    got = store.parse_bench(sh(store.bench_read_script(paths)).stdout)
    assert sorted(got) == [r1, r2] and got[r1] == doc  # r3 has none
    got = store.parse_bench(sh(store.bench_read_script(paths, [r2, r3])).stdout)
    assert sorted(got) == [r2]


def test_bench_json_refuses_a_release_that_does_not_exist(tmp_path):
    paths = store.Paths(str(tmp_path), "tiny")
    res = sh(store.bench_write_script(paths, "20261201T050000Z-aaaaaaaaaa", doc_with([lv(1, 1.0)])))
    assert res.returncode == 3 and "@@norelease" in res.stdout
    assert not (tmp_path / "services").exists()
    with pytest.raises(ValueError):
        store.bench_read_script(paths, ["../../etc"])


def test_parse_bench_skips_garbage():
    out = "@@bench 20261201T050000Z-aaaaaaaaaa {\"a\": 1}\n@@bench ../x {}\n@@bench 20261201T060000Z-bbbbbbbbbb {nope\n"
    assert store.parse_bench(out) == {"20261201T050000Z-aaaaaaaaaa": {"a": 1}}
