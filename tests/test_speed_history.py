"""The fleet's own decode measurements: records from a host's release state (recorded host output),
the floor they give, the cache that keeps them on this machine, and the overlay file."""

from __future__ import annotations

import json
import os
import stat

import pytest

from llmfleet import cache
from llmfleet.fleet import speed as fleet_speed
from llmfleet.health import speed_cache, speed_overlay
from llmfleet.health import speed_history as sh
from llmfleet.knowledge import release_state
from llmfleet.knowledge.planner import PlanSummary

R1 = "20261101T100000Z-aaaaaaaaaa"
R2 = "20261102T100000Z-bbbbbbbbbb"
R3 = "20261103T100000Z-cccccccccc"
R4 = "20261104T100000Z-dddddddddd"
DIGEST = "sha256:" + "ab" * 32
IMAGE = "llamacpp:b5000-cu122"


def plan(card="v100-sxm2-32gb", engine="llamacpp", model="qwen2.5-7b-instruct", quant="q4_k_m", context=8192,
         gpus=1, hosts=1):
    return {"engine": engine, "model": model, "quant": quant, "gpu": card, "gpus": gpus, "hosts": hosts,
            "context": context, "concurrency": 1, "fits": True, "resident": True,
            "engine_args": ["--ctx-size", str(context)], "decode_tokps_ceiling": 200.0,
            "decode_tokps_realistic": [90.0, 150.0]}


def manifest(rid, *, image=IMAGE, digest=DIGEST, **kw):
    return {"release": rid, "service": "chat", "engine": kw.get("engine", "llamacpp"), "host": "gpu-v100-01",
            "time": "2026-11-01T10:00:00+00:00",
            "image": {"key": image, "ref": f"reg:5000/llamacpp@{digest}", "digest": digest},
            "inputs": {"name": "chat", "api_key": {"file": "/etc/llmfleet/key"}}, "plan": plan(**kw)}


def healthy(tokps, time="2026-11-01T10:05:00+00:00"):
    return {"result": "healthy", "decode_tokps": tokps, "time": time, "floor_tokps": 20.0}


def state_output(services):
    """What store.state_script prints, built from {svc: (current, {rid: (manifest, health)})}."""
    lines = []
    for name, (current, rels) in services.items():
        lines += [f"@@service {name}", f"@@current releases/{current}", "@@unit active"]
        for rid, (m, h) in rels.items():
            lines.append(f"@@release {rid}")
            if m is not None:
                lines.append("@@manifest " + (m if isinstance(m, str) else json.dumps(m)))
            if h is not None:
                lines.append("@@health " + (h if isinstance(h, str) else json.dumps(h)))
    lines.append("@@end")
    return "\n".join(lines) + "\n"


def bench_doc(levels, lab=False):
    return {"schema": "llmfleet.bench/1", "time": "2026-11-02T11:00:00+00:00", "lab": lab, "levels": levels}


def level(c, prompt, tokps, ok=4):
    return {"concurrency": c, "prompt_tokens_asked": prompt, "ok": ok, "decode_tokps_p50": tokps}


KEY = sh.SpeedKey(card="v100-sxm2-32gb", engine="llamacpp", image=IMAGE, model="qwen2.5-7b-instruct",
                  quant="q4_k_m", context="<=16k")


# ---------------------------------------------------------------------------------------------
# keys


@pytest.mark.parametrize(("context", "cls"), [
    (None, "?"), (0, "?"), (True, "?"), ("8192", "?"), (512, "<=4k"), (4096, "<=4k"), (4097, "<=16k"),
    (16384, "<=16k"), (32768, "<=64k"), (65536, "<=64k"), (131072, ">64k"),
])
def test_context_class(context, cls):
    assert sh.context_class(context) == cls


@pytest.mark.parametrize(("image", "expected"), [
    (IMAGE, IMAGE),
    ({"key": IMAGE, "digest": DIGEST}, IMAGE),
    ({"key": "", "digest": DIGEST}, DIGEST),
    ({"ref": f"reg:5000/llamacpp@{DIGEST}"}, DIGEST),
    (f"reg:5000/llamacpp@{DIGEST}", DIGEST),
    (None, ""),
    ({"key": 3}, ""),
])
def test_image_id(image, expected):
    assert sh.image_id(image) == expected


def test_key_for_a_plan_summary_a_plan_dict_and_a_split_plan():
    summary = PlanSummary.from_dict(plan())
    assert sh.key_for(summary, {"key": IMAGE}) == KEY
    assert sh.key_for(plan(), IMAGE) == KEY
    split = sh.key_for(plan(gpus=2, hosts=2, context=131072), IMAGE)
    assert (split.gpus, split.hosts, split.context, split.split) == (2, 2, ">64k", "2 GPU(s) x 2 hosts")
    assert split != KEY and split.card_class != KEY.card_class


@pytest.mark.parametrize("bad", [None, {}, {"engine": "llamacpp", "model": "m"}, {"gpu": "v100", "model": "m"},
                                 "not a plan", 42, PlanSummary()])
def test_key_for_a_plan_that_does_not_name_card_engine_and_model_is_none(bad):
    assert sh.key_for(bad, IMAGE) is None


# ---------------------------------------------------------------------------------------------
# records from recorded host output


def test_records_from_state_marks_unhealthy_and_unchecked_runs_and_reads_bench_results():
    out = state_output({
        "chat": (R3, {
            R1: (manifest(R1), healthy(118.4)),
            R2: (manifest(R2), {"result": "unhealthy", "decode_tokps": 11.0}),  # failed its floor
            R3: (manifest(R3), None),  # switched, not checked yet
            R4: (None, healthy(50.0)),  # no manifest: no key
        }),
    })
    bench = {"chat": {R1: bench_doc([level(1, 2048, 101.0), level(1, 128, 112.5), level(4, 128, 90.0)]),
                      R3: bench_doc([level(1, 128, 120.0)])}}
    recs = sh.records_from_state("gpu-v100-01", release_state.parse_state(out), bench=bench)
    got = {(r.release, r.source): (r.tokps, r.healthy) for r in recs}
    assert got == {(R1, "health"): (118.4, True), (R1, "bench"): (112.5, True), (R2, "health"): (11.0, False),
                   (R3, "bench"): (120.0, False)}
    r1 = next(r for r in recs if r.release == R1 and r.source == "health")
    assert (r1.host, r1.service, r1.key, r1.time) == ("gpu-v100-01", "chat", KEY, "2026-11-01T10:05:00+00:00")
    assert (r1.ceiling, r1.predicted) == (200.0, (90.0, 150.0))
    # one run per release: the health record wins over the bench record; unhealthy and unchecked never count
    assert [(r.release, r.source) for r in sh.runs(recs, KEY)] == [(R1, "health")]


@pytest.mark.parametrize("output", [
    "",
    "garbage\n@@release x\n",
    "@@service chat\n@@release " + R1 + "\n@@manifest {not json\n@@health [1,2]\n@@end\n",
    state_output({"chat": (R1, {R1: ("[]", '"healthy"')})}),
    state_output({"chat": (R1, {R1: (manifest(R1), {"result": "healthy", "decode_tokps": "fast"})})}),
    state_output({"chat": (R1, {R1: (manifest(R1), {"result": "healthy", "decode_tokps": float("nan")})})}),
    state_output({"chat": (R1, {R1: (manifest(R1), {"result": "healthy", "decode_tokps": -3})})}),
    state_output({"chat": (R1, {R1: (manifest(R1), {"result": "healthy", "decode_tokps": True})})}),
    state_output({"chat": (R1, {R1: (dict(manifest(R1), plan={"gpu": 7, "engine": [], "model": None}), healthy(9.0))})}),
    state_output({"chat": (R1, {R1: (dict(manifest(R1), plan="big"), healthy(9.0))})}),
    state_output({"chat": (R1, {R1: (dict(manifest(R1), image="llamacpp"), healthy(9.0))})}),
])
def test_odd_host_output_never_raises_and_gives_no_made_up_record(output):
    recs = sh.records_from_state("h1", release_state.parse_state(output),
                                 bench={"chat": {R1: {"levels": "x"}}, "other": "y", 3: None})  # type: ignore[dict-item]
    assert all(r.tokps > 0 for r in recs)
    assert not [r for r in recs if r.key.card == "7"]


@pytest.mark.parametrize("state", [None, {}, [], "text", {"chat": "not a state"}, [object()]])
def test_records_from_anything_that_is_not_a_state_is_empty(state):
    assert sh.records_from_state("h1", state) == []


@pytest.mark.parametrize(("doc", "expected"), [
    (bench_doc([level(1, 128, 40.0), level(1, 2048, 35.0)]), 40.0),
    (bench_doc([level(2, 128, 80.0), level(1, 2048, 35.0)]), 35.0),
    (bench_doc([level(1, 128, 40.0, ok=0), level(1, 2048, 35.0)]), 35.0),  # a level where nothing answered
    (bench_doc([level(True, 128, 40.0)]), None),
    (bench_doc([level(4, 128, 40.0)]), None),
    ({"levels": None}, None),
    ([], None),
    (None, None),
])
def test_bench_batch1_tokps(doc, expected):
    assert sh.bench_batch1_tokps(doc) == expected


def test_a_lab_bench_result_is_a_lab_record():
    out = state_output({"chat": (R1, {R1: (manifest(R1), healthy(30.0))})})
    recs = sh.records_from_state("lab1", release_state.parse_state(out), bench={"chat": {R1: bench_doc([level(1, 128, 9.0)], lab=True)}})
    assert {(r.source, r.lab) for r in recs} == {("health", False), ("bench", True)}
    assert all(r.lab for r in sh.records_from_state("lab1", release_state.parse_state(out), lab=True))


# ---------------------------------------------------------------------------------------------
# the floor


def rec(host, tokps, *, release=R1, healthy=True, key=KEY, source="health", lab=False, service="chat"):
    return sh.SpeedRecord(key=key, host=host, service=service, release=release, time="2026-11-01T10:00:00+00:00",
                          tokps=tokps, source=source, healthy=healthy, lab=lab)


OTHER_IMAGE = sh.SpeedKey(**{**KEY.to_dict(), "image": "llamacpp:b6000-cu122"})
OTHER_CONTEXT = sh.SpeedKey(**{**KEY.to_dict(), "context": ">64k"})
OTHER_CARD = sh.SpeedKey(**{**KEY.to_dict(), "card": "p40"})


@pytest.mark.parametrize(("records", "fraction", "min_runs", "floor", "median", "n"), [
    # the median of the healthy runs, times the fraction
    ([rec("a", 117.0), rec("b", 118.4), rec("c", 121.0)], 0.6, 1, 71.04, 118.4, 3),
    ([rec("a", 100.0), rec("b", 120.0)], 0.5, 1, 55.0, 110.0, 2),
    ([rec("a", 100.0)], 1.0, 1, 100.0, 100.0, 1),
    # too few runs
    ([rec("a", 117.0), rec("b", 118.4)], 0.6, 3, None, None, 0),
    ([], 0.6, 1, None, None, 0),
    # unhealthy runs are not counted (here they would pull the median down to 11)
    ([rec("a", 120.0), rec("b", 11.0, healthy=False), rec("c", 10.0, healthy=False)], 0.6, 1, 72.0, 120.0, 1),
    ([rec("a", 11.0, healthy=False)], 0.6, 1, None, None, 0),
    # other keys are not counted: another image, another context class, another card
    ([rec("a", 120.0), rec("b", 400.0, key=OTHER_IMAGE), rec("c", 400.0, key=OTHER_CONTEXT),
      rec("d", 400.0, key=OTHER_CARD)], 0.6, 1, 72.0, 120.0, 1),
    # lab runs do not count for a real card
    ([rec("a", 120.0), rec("lab", 4.0, lab=True)], 0.6, 1, 72.0, 120.0, 1),
    # one release measured twice (health and bench) is one run, by its health check
    ([rec("a", 120.0), rec("a", 60.0, source="bench")], 0.5, 2, None, None, 0),
    ([rec("a", 60.0, source="bench"), rec("a", 120.0)], 0.5, 1, 60.0, 120.0, 1),
    # two releases on one host are two runs
    ([rec("a", 100.0), rec("a", 110.0, release=R2)], 0.5, 2, 52.5, 105.0, 2),
    # a fraction outside (0, 1] gives no floor
    ([rec("a", 100.0)], 0.0, 1, None, None, 0),
    ([rec("a", 100.0)], 1.5, 1, None, None, 0),
])
def test_fleet_gate(records, fraction, min_runs, floor, median, n):
    gate = sh.fleet_gate(records, KEY, fraction=fraction, min_runs=min_runs)
    if floor is None:
        assert gate is None
        return
    assert (gate.tokps, gate.median, len(gate.runs)) == (floor, median, n)
    assert gate.source.startswith(f"{fraction:g} x the median {median:.1f} tok/s of {n} healthy run")
    for r in gate.runs:
        assert f"{r.host} (chat {r.release}: {r.tokps:.1f} tok/s)" in gate.source


def test_fleet_gate_names_five_runs_and_counts_the_rest():
    gate = sh.fleet_gate([rec(f"gpu-v100-{i:02d}", 100.0 + i) for i in range(8)], KEY)
    assert gate.source.count("tok/s)") == 5 and gate.source.endswith("and 3 more")
    assert (gate.low, gate.high) == (100.0, 107.0)


def test_a_lab_gate_counts_only_lab_runs():
    gate = sh.fleet_gate([rec("a", 120.0), rec("lab", 4.0, lab=True)], KEY, lab=True)
    assert gate.median == 4.0 and "of 1 lab run of this card" in gate.source


def test_gate_for_takes_the_hosts_own_state_over_its_cached_records():
    out = state_output({"chat": (R2, {R2: (manifest(R2), healthy(60.0))})})
    states = release_state.parse_state(out)
    cached = [rec("gpu-v100-01", 200.0), rec("gpu-v100-02", 100.0)]  # the first host's R1 was pruned since
    gate = sh.gate_for(PlanSummary.from_dict(plan()), {"key": IMAGE}, host="gpu-v100-01", states=states,
                       cached=cached, fraction=0.5)
    assert [(r.host, r.release, r.tokps) for r in gate.runs] == [("gpu-v100-01", R2, 60.0), ("gpu-v100-02", R1, 100.0)]
    assert gate.tokps == 40.0
    assert sh.gate_for(plan(), IMAGE, host="gpu-v100-01", states=states, cached=cached, min_runs=3) is None
    assert sh.gate_for({}, IMAGE, host="gpu-v100-01", states=states, cached=cached) is None


def test_merge_keeps_cached_records_only_of_hosts_not_read_now():
    fresh = [rec("a", 1.0)]
    cached = [rec("a", 2.0, release=R2), rec("b", 3.0), rec("c", 4.0)]
    assert [(r.host, r.tokps) for r in sh.merge(fresh, cached, contacted=["c"])] == [("a", 1.0), ("b", 3.0)]


@pytest.mark.parametrize(("records", "same_class", "line"), [
    ([rec("a", 117.0), rec("b", 121.0), rec("c", 119.0)], False, "measured on 3 hosts: 117-121 tok/s (median 119)"),
    ([rec("a", 42.0), rec("a", 44.0, release=R2)], False, "measured on 1 host, 2 runs: 42.0-44.0 tok/s (median 43.0)"),
    ([rec("a", 42.0)], False, "measured on 1 host: 42.0 tok/s (median 42.0)"),
    ([rec("a", 42.0, key=OTHER_IMAGE)], False, None),
    ([rec("a", 42.0, key=OTHER_IMAGE)], True, "measured on 1 host: 42.0 tok/s (median 42.0)"),
    ([rec("a", 42.0, healthy=False)], True, None),
])
def test_measured_line(records, same_class, line):
    assert sh.measured_line(records, KEY, same_class=same_class) == line


def test_record_round_trip_and_odd_cached_data():
    r = rec("a", 42.0)
    assert sh.SpeedRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    for bad in (None, [], {"key": KEY.to_dict(), "host": "a", "release": R1, "tokps": "42", "source": "health"},
                {"key": {"card": "x"}, "host": "a", "release": R1, "tokps": 4.0, "source": "health"},
                {"key": KEY.to_dict(), "host": "a", "release": R1, "tokps": 4.0, "source": "rumour"}):
        assert sh.SpeedRecord.from_dict(bad) is None


# ---------------------------------------------------------------------------------------------
# measured against predicted


@pytest.mark.parametrize(("measured", "expected"), [
    # the planner's own ends give its own efficiencies back
    (90.0, 0.5), (150.0, 0.9),
    (None, None), (0.0, None),
    (10_000.0, None),  # faster than the fixed costs allow
])
def test_fitted_efficiency(measured, expected):
    ceiling, e = 200.0, (0.5, 0.9)
    # a model with fixed costs: 1/low = 1/(ceiling*0.5) + f_hi; 1/high = 1/(ceiling*0.9) + f_lo; f_lo == f_hi here
    f = 0.0005
    predicted = (1 / (1 / (ceiling * e[0]) + f), 1 / (1 / (ceiling * e[1]) + f))
    if measured in (90.0, 150.0):
        measured = predicted[0] if measured == 90.0 else predicted[1]
    got = sh.fitted_efficiency(measured, ceiling, predicted, e)
    assert got == (pytest.approx(expected, abs=0.001) if expected else None)


def test_class_summaries_group_by_card_class_across_images():
    recs = [dataclass_replace(rec("a", 100.0), predicted=(90.0, 150.0), ceiling=200.0),
            rec("b", 140.0, key=OTHER_IMAGE), rec("c", 10.0, healthy=False), rec("d", 300.0, key=OTHER_CARD)]
    rows = sh.class_summaries(recs)
    assert [(s.card, s.count, s.low, s.high, s.median) for s in rows] == [
        ("p40", 1, 300.0, 300.0, 300.0), ("v100-sxm2-32gb", 2, 100.0, 140.0, 120.0)]
    v100 = rows[1]
    assert v100.images == (IMAGE, "llamacpp:b6000-cu122")
    assert (v100.predicted, v100.verdict) == ((90.0, 150.0), "within")
    assert v100.source == "measured on a at 2026-11-01T10:00:00+00:00, b at 2026-11-01T10:00:00+00:00"


def dataclass_replace(r, **kw):
    import dataclasses

    return dataclasses.replace(r, **kw)


# ---------------------------------------------------------------------------------------------
# the cache


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return cache.cache_dir(speed_cache.CACHE)


def test_cache_is_private_and_a_host_read_now_replaces_its_kept_records(folder):
    assert speed_cache.load() == []
    speed_cache.remember({"a": [rec("a", 100.0)], "b": [rec("b", 120.0)]})
    path = folder / speed_cache.FILE
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    speed_cache.remember({"a": [rec("a", 90.0, release=R2)]})
    assert sorted((r.host, r.release, r.tokps) for r in speed_cache.load()) == [("a", R2, 90.0), ("b", R1, 120.0)]
    assert [r.host for r in speed_cache.load(exclude=["a"])] == ["b"]
    speed_cache.remember({"a": []})  # the host holds none now
    assert [r.host for r in speed_cache.load()] == ["b"]
    assert set(speed_cache.seen()) == {"a", "b"}


def test_cache_is_not_read_or_written_when_others_can_write_the_folder(folder):
    speed_cache.remember({"a": [rec("a", 100.0)]})
    os.chmod(folder, 0o777)
    try:
        assert speed_cache.load() == []
        assert speed_cache.remember({"b": [rec("b", 1.0)]}) is False
    finally:
        os.chmod(folder, 0o700)
    assert [r.host for r in speed_cache.load()] == ["a"]


def test_a_host_with_no_records_writes_nothing(folder):
    assert speed_cache.remember({"a": []}) is False
    assert not folder.exists()


@pytest.mark.parametrize("text", ["", "{", "[]", '{"schema": "other", "hosts": {}}',
                                  '{"schema": "llmfleet.speed-cache/1", "hosts": {"a": {"records": [1, {"x": 2}]}}}'])
def test_an_odd_cache_file_is_an_empty_cache(folder, text):
    folder.mkdir(parents=True, mode=0o700)
    (folder / speed_cache.FILE).write_text(text)
    assert speed_cache.load() == []


def test_status_keeps_the_records_it_read_and_never_a_secret(folder):
    from llmfleet.fleet.status import HostStatus
    from llmfleet.inventory.ansible import Host

    secret = "sk-topsecret-0123456789"
    m = manifest(R1)
    m["inputs"]["api_key"] = secret  # a manifest never holds one; if it did, the cache must not copy it
    m["engine_args"] = ["--api-key", secret]
    out = state_output({"chat": (R1, {R1: (m, healthy(118.4) | {"who": secret})})})
    up = HostStatus(host="gpu-v100-01", reachable=True, states=release_state.parse_state(out))
    down = HostStatus(host="gpu-v100-02", reachable=False, error="timeout")
    speed_cache.remember({"gpu-v100-02": [rec("gpu-v100-02", 99.0)]})
    fleet_speed.remember_status([up, down], [Host("gpu-v100-01"), Host("gpu-v100-02")])
    assert sorted((r.host, r.tokps) for r in speed_cache.load()) == [("gpu-v100-01", 118.4), ("gpu-v100-02", 99.0)]
    assert secret not in (folder / speed_cache.FILE).read_text()


# ---------------------------------------------------------------------------------------------
# reading a host: state and bench results in one round trip


def test_speed_script_quotes_names_and_its_output_parses(tmp_path):
    import subprocess

    root = tmp_path / "root it's"
    d = root / "services" / "chat" / "releases" / R1
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps(manifest(R1)) + "\n")
    (d / "health.json").write_text(json.dumps(healthy(118.4)) + "\n")
    (d / "bench.json").write_text(json.dumps(bench_doc([level(1, 128, 112.0)])) + "\n")
    (root / "services" / "chat" / "current").symlink_to(f"releases/{R1}")
    script = fleet_speed.speed_script(str(root), ["chat", "bad;name", "idle"])
    assert "bad;name" not in script
    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    recs = fleet_speed.parse_speed("gpu-v100-01", res.stdout)
    assert sorted((r.source, r.tokps, r.healthy) for r in recs) == [("bench", 112.0, True), ("health", 118.4, True)]


# ---------------------------------------------------------------------------------------------
# the overlay


def test_overlay_round_trip_and_its_source():
    import dataclasses
    from datetime import UTC, datetime

    s = dataclasses.replace(sh.class_summaries([dataclass_replace(rec("gpu-v100-01", 118.0), predicted=(90.0, 150.0),
                                                                  ceiling=200.0)])[0], efficiency=(0.5, 0.9), fitted=0.61)
    text = speed_overlay.overlay_text(speed_overlay.overlay_document([s], datetime(2026, 12, 1, tzinfo=UTC)))
    assert "measured on gpu-v100-01 at 2026-11-01T10:00:00+00:00" in text
    entries, problems = speed_overlay.parse_overlay(text)
    assert problems == []
    (e,) = entries
    assert (e.card_class, e.count, e.median, e.fitted, e.efficiency) == (KEY.card_class, 1, 118.0, 0.61, (0.5, 0.9))
    assert speed_overlay.entry_for(entries, OTHER_IMAGE) == e  # any image of the card class
    assert speed_overlay.entry_for(entries, OTHER_CARD) is None


@pytest.mark.parametrize(("text", "problem"), [
    (": : :", "not YAML"),
    ("cards: []", "not a speed overlay"),
    ("schema: llmfleet.speed-overlay/1\nentries: 3", "entries: needs a list"),
    ("schema: llmfleet.speed-overlay/1\nentries: [3]", "entries[0]: not a mapping"),
    ("schema: llmfleet.speed-overlay/1\nentries: [{card: v100}]", "entries[0]: needs engine, model, source"),
    ("schema: llmfleet.speed-overlay/1\nentries: [{card: v100, engine: vllm, model: m, source: s, "
     "decode_tokps: {count: 1, min: 5, max: 4, median: 4}}]", "entries[0]: decode_tokps needs"),
])
def test_an_odd_overlay_is_a_problem_line_never_an_error(text, problem):
    entries, problems = speed_overlay.parse_overlay(text)
    assert entries == [] and problems[0].startswith(problem)


def test_a_hosts_state_read_again_keeps_bench_records_of_releases_it_still_holds(folder):
    speed_cache.remember({"h1": [rec("h1", 110.0, source="bench"), rec("h1", 90.0, release=R2, source="bench")]})
    out = state_output({"chat": (R1, {R1: (manifest(R1), healthy(118.4))})})  # R2 was pruned since
    fleet_speed.remember_hosts({"h1": release_state.parse_state(out)})
    assert sorted((r.release, r.source, r.tokps) for r in speed_cache.load()) == [
        (R1, "bench", 110.0), (R1, "health", 118.4)]
