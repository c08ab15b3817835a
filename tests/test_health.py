"""Staged health checks: SSE parsing, speed arithmetic, the floor, and the checker against a local
HTTP server that behaves like the engines (503 while loading, refused connections, slow streams)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llmfleet.health import check as H
from llmfleet.inventory.services import host_settings
from llmfleet.knowledge.planner import PlanSummary
from llmfleet.release.store import UnitProbe


def chunk(text: str | None = None, **extra) -> dict:
    c: dict = {"choices": [{"delta": {"content": text}}] if text is not None else []}
    c.update(extra)
    return c


# ---------------------------------------------------------------------------------------------
# SSE


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (['data: {"a":1}', "", "data: [DONE]", 'data: {"b":2}'], [{"a": 1}, "[DONE]"]),
        ([": keep-alive", "event: x", 'data:{"a":1}\r\n'], [{"a": 1}]),
        (["data: not json", "data: ", 'data: [1,2]', 'data: {"ok":true}'], [{"ok": True}]),
        ([], []),
    ],
)
def test_iter_sse(lines, expected):
    assert list(H.iter_sse(lines)) == expected


@pytest.mark.parametrize(
    ("c", "text"),
    [
        (chunk("hi"), "hi"),
        ({"choices": [{"delta": {"reasoning_content": "th"}}, {"delta": {"content": "x"}}]}, "thx"),
        ({"choices": [{"text": "legacy"}]}, "legacy"),
        ({"choices": ["junk", {"delta": None}]}, ""),
        ({}, ""),
    ],
)
def test_chunk_text(c, text):
    assert H.chunk_text(c) == text


def test_stream_stats_excludes_prefill_and_prefers_usage():
    # first token at 0.5 s (prefill), then 10 more tokens over 1 s: 10 tok/s decode
    events = [(0.5 + 0.1 * i, chunk("t")) for i in range(11)]
    events.append((1.6, chunk(usage={"completion_tokens": 11})))
    s = H.stream_stats(0.0, events, 1.7)
    assert s.tokens == 11 and s.ttft_s == pytest.approx(0.5)
    assert s.decode_tokps == pytest.approx(10.0)
    # a usage figure smaller than the chunks seen is not believed
    s2 = H.stream_stats(0.0, [(0.1, chunk("a")), (0.2, chunk("b")), (0.3, chunk(usage={"completion_tokens": 1}))], 0.3)
    assert s2.tokens == 2
    # one chunk of one token: no speed can be measured
    assert H.stream_stats(0.0, [(0.1, chunk("a"))], 0.2).decode_tokps is None


@pytest.mark.parametrize("events", [
    [(1.0, chunk("all 32 tokens at once")), (1.0, chunk(usage={"completion_tokens": 32}))],  # one burst
    [(1.0, chunk("a")), (1.0, chunk("b")), (1.0, chunk(usage={"completion_tokens": 32}))],  # two chunks, one instant
])
def test_a_stream_sent_in_one_burst_is_measured_over_the_whole_stream(events):
    s = H.stream_stats(0.0, events, 2.0)
    assert s.whole_stream and s.tokens == 32 and s.decode_tokps == pytest.approx(16.0)  # a lower bound: prefill in it
    spread = H.stream_stats(0.0, [(0.5 + 0.1 * i, chunk("t")) for i in range(11)], 1.7)
    assert not spread.whole_stream


# ---------------------------------------------------------------------------------------------
# the floor


def _Plan(low: float = 40.0, high: float = 60.0, **kw) -> PlanSummary:  # noqa: N802 - reads as a type
    return PlanSummary(decode_tokps_realistic=(low, high), **kw)


def _svc_settings(health: dict | None = None, **host):
    svc = {"name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf", "image": "llamacpp:x"}
    if health is not None:
        svc["health"] = health
    hv = {"llmfleet_services": [svc]} | {f"llmfleet_{k}": v for k, v in host.items()}
    hs = host_settings("h", hv)
    return hs.services[0], hs


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        (_Plan(), 40.0),
        (_Plan(12.0, 30.0), 12.0),
        (_Plan(0.0, 0.0), None),
        (PlanSummary(), None),
        (None, None),
        # a manifest's plan read back (the deploy's seam): only the typed field counts
        (PlanSummary.from_dict({"decode_tokps_realistic": [7.5, 9.0]}), 7.5),
        (PlanSummary.from_dict({"decode_tokps_expected": [12.0, 30.0]}), None),
    ],
)
def test_realistic_tokps(plan, expected):
    assert H.realistic_tokps(plan) == expected


@pytest.mark.parametrize(
    ("health", "host", "plan", "tokps", "source_has"),
    [
        (None, {}, _Plan(), 10.0, "0.25 x"),                                        # default
        ({"floor_fraction": 0.5}, {}, _Plan(), 20.0, "service's health.floor_fraction"),
        (None, {"health_floor_fraction": 0.1}, _Plan(), 4.0, "host's"),
        ({"floor_fraction": 0.5}, {"health_min_tokps": 999}, _Plan(), 20.0, "service"),  # service wins
        (None, {"health_min_tokps": 300}, _Plan(), 300.0, "llmfleet_health_min_tokps"),
        ({"min_tokps": 50}, {"health_min_tokps": 300}, None, 50.0, "health.min_tokps"),
        ({"floor_fraction": 0}, {}, _Plan(), None, "disabled"),
        (None, {}, None, None, "no realistic"),
    ],
)
def test_decode_floor_precedence(health, host, plan, tokps, source_has):
    svc, hs = _svc_settings(health, **host)
    f = H.decode_floor(svc, hs, plan)
    assert f.tokps == (pytest.approx(tokps) if tokps is not None else None)
    assert source_has in f.source


@pytest.mark.parametrize(
    ("measured", "floor", "ok", "says"),
    [
        (64.0, 10.0, True, ">= floor"),
        (4.0, 10.0, False, "probably not resident"),   # the field report's offloaded deploy
        (None, 10.0, False, "too few tokens"),
        (1.0, None, True, "n/a"),
    ],
)
def test_judge_speed(measured, floor, ok, says):
    v = H.judge_speed(measured, H.Floor(floor, "n/a"))
    assert v.ok is ok and says in v.message


def test_default_floor_separates_the_field_reports_resident_and_offloaded_runs():
    """V100 32 GB, 27B INT4: resident llama.cpp 24 tok/s, vLLM 42-64; offloaded 4 tok/s. With a plan
    whose realistic low end is the resident llama.cpp figure, the default floor passes every resident
    run and fails the offloaded one, and the measured 1/8-offload cut (4.5x) too."""
    plan = _Plan(24.0, 64.0)
    svc, hs = _svc_settings()
    floor = H.decode_floor(svc, hs, plan)
    for resident in (24.0, 42.0, 64.0):
        assert H.judge_speed(resident, floor).ok
    assert not H.judge_speed(4.0, floor).ok
    assert not H.judge_speed(24.0 / 4.5, floor).ok



def test_models_list_ids():
    body = {"data": [{"id": "a"}, {"id": "b", "aliases": ["c"]}, "junk", {"x": 1}]}
    assert H.models_list_ids(body) == ["a", "b", "c"]
    assert H.models_list_ids([]) == []


# ---------------------------------------------------------------------------------------------
# the checker against a fake engine on loopback


class FakeEngine:
    def __init__(self, *, loading_s: float = 0.0, served: str = "tiny", token_gap_s: float = 0.001,
                 tokens: int = 16, key: str | None = None, status_code: int = 200):
        self.loading_until = time.monotonic() + loading_s
        self.served, self.gap, self.tokens, self.key, self.code = served, token_gap_s, tokens, key, status_code
        self.requests: list[str] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, code, body: dict):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                engine.requests.append(self.path)
                if time.monotonic() < engine.loading_until:
                    return self._send(503, {"error": {"message": "Loading model"}})
                if self.path == "/health":
                    return self._send(200, {"status": "ok"})
                if self.path == "/v1/models":
                    if engine.key and self.headers.get("Authorization") != f"Bearer {engine.key}":
                        return self._send(401, {"error": "no"})
                    return self._send(200, {"data": [{"id": engine.served}]})
                self._send(404, {})

            def do_POST(self):
                engine.requests.append(self.path)
                n = int(self.headers.get("Content-Length", 0))
                req = json.loads(self.rfile.read(n))
                if engine.code != 200:
                    return self._send(engine.code, {"error": {"message": "boom"}})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for _ in range(min(engine.tokens, req["max_tokens"])):
                    self.wfile.write(b'data: {"choices":[{"delta":{"content":"x "}}]}\n\n')
                    self.wfile.flush()
                    time.sleep(engine.gap)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine_factory():
    made: list[FakeEngine] = []

    def make(**kw):
        e = FakeEngine(**kw)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


NO_FLOOR = H.Floor(None, "none")


def checker(url: str, *, probe=None, floor=NO_FLOOR, **kw) -> H.HealthChecker:
    lines: list[str] = []
    c = H.HealthChecker(
        probe=probe or (lambda: UnitProbe("active", "running", 0)),
        base_url=url, served_name=kw.pop("served_name", "tiny"), floor=floor,
        load_timeout_s=kw.pop("load_timeout_s", 10), stage_timeout_s=kw.pop("stage_timeout_s", 10),
        max_tokens=kw.pop("max_tokens", 16), poll_interval_s=0.05, probe_every_s=0.2,
        progress=lines.append, **kw,
    )
    c.lines = lines  # type: ignore[attr-defined]
    return c


def test_healthy_engine_passes_every_stage_after_loading(engine_factory):
    e = engine_factory(loading_s=1.5)
    c = checker(e.url)
    rep = c.run()
    assert rep.ok, rep.message
    assert [s.name for s in rep.stages] == ["unit", "container", "health", "models", "completion"]
    assert rep.tokens == 16 and rep.decode_tokps and rep.ttft_s is not None
    assert e.requests.count("/health") >= 2  # it waited through the 503s
    assert any(line.strip().startswith("completion") for line in c.lines)
    d = rep.to_dict()
    assert d["result"] == "healthy" and json.dumps(d)


def test_slow_decode_fails_as_not_resident(engine_factory):
    e = engine_factory(token_gap_s=0.05, tokens=8)  # ~20 tok/s
    rep = checker(e.url, floor=H.Floor(1000.0, "test floor"), max_tokens=8).run()
    assert not rep.ok and rep.failed.name == "completion"
    assert "probably not resident" in rep.message and rep.floor_tokps == 1000.0


def test_wrong_served_name_fails_at_models(engine_factory):
    e = engine_factory(served="other")
    rep = checker(e.url).run()
    assert rep.failed.name == "models" and "'other'" in rep.message


def test_refused_api_key_is_named(engine_factory):
    e = engine_factory(key="right")
    rep = checker(e.url, api_key="wrong").run()
    assert rep.failed.name == "models" and "API key" in rep.message
    assert checker(e.url, api_key="right").run().ok


def test_completion_error_status_is_reported(engine_factory):
    e = engine_factory(status_code=500)
    rep = checker(e.url).run()
    assert rep.failed.name == "completion" and "500" in rep.message


def test_engine_that_dies_while_loading_fails_fast(engine_factory):
    # nothing listens on this port; the container has exited
    probe = iter([UnitProbe("active", "running", 0)] * 2 + [UnitProbe("activating", "exited", 1)] * 50)
    t0 = time.monotonic()
    rep = checker("http://127.0.0.1:9", probe=lambda: next(probe), load_timeout_s=30).run()
    assert not rep.ok and rep.failed.name == "health"
    assert "engine stopped while loading" in rep.message and "exit 1" in rep.message
    assert time.monotonic() - t0 < 10


def test_failed_unit_stops_at_the_first_stage():
    rep = checker("http://127.0.0.1:9", probe=lambda: UnitProbe("failed", None, None)).run()
    assert rep.failed.name == "unit" and "failed" in rep.message


def test_every_wait_is_bounded_in_time():
    rep = checker("http://127.0.0.1:9", probe=lambda: UnitProbe("activating", None, None), stage_timeout_s=1).run()
    assert rep.failed.name == "unit" and "within 1s" in rep.message


def test_the_planners_own_floor_is_the_default_and_explicit_settings_still_win():
    """A plan from the speed model carries health_floor_tokps; without explicit settings the deploy
    applies it, from the planner's object, from its summary and from the summary a release's manifest
    holds (the seam the deploy passes). H200, Qwen2.5-32B shape Q4_0: all layers on the GPU measured
    81.3-92.7 tok/s on an H200 by llmfleet."""
    from llmfleet.knowledge.planner import PlanRequest, plan, summarize

    p = plan(PlanRequest(model="qwen2.5-32b-instruct", quant="q4_0", gpu="h200-141gb", context=4096))
    assert p.health_floor_tokps is not None
    svc, hs = _svc_settings()
    for seam in (summarize(p), PlanSummary.from_dict(p.to_dict())):
        floor = H.decode_floor(svc, hs, seam)
        assert floor.tokps == pytest.approx(p.health_floor_tokps) and "planner's floor" in floor.source
        for resident in (81.3, 92.7):
            assert H.judge_speed(resident, floor).ok
    svc, hs = _svc_settings({"floor_fraction": 0.5})
    assert H.decode_floor(svc, hs, summarize(p)).tokps == pytest.approx(0.5 * p.decode_tokps_realistic[0])


def test_a_wait_polls_soon_then_backs_off_and_stays_bounded():
    """The unit stage against a unit that never becomes active, on an injected clock: the pauses
    double from poll_min_s to poll_interval_s, the last one ends at the deadline, nothing more."""
    now = [0.0]
    pauses: list[float] = []

    def sleep(s: float) -> None:
        pauses.append(round(s, 3))
        now[0] += s

    probes = [0]

    def probe() -> UnitProbe:
        probes[0] += 1
        return UnitProbe("activating", None, None)

    c = H.HealthChecker(probe=probe, base_url="http://127.0.0.1:9", served_name="tiny", stage_timeout_s=2.0,
                        poll_min_s=0.05, poll_interval_s=0.5, clock=lambda: now[0], sleep=sleep)
    rep = c.run()
    assert rep.failed.name == "unit" and "within 2s" in rep.message
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.25]
    assert probes[0] == len(pauses) + 1 and now[0] == pytest.approx(2.0)


# ---------------------------------------------------------------------------------------------
# the residency stage: the engine's own report, before any speed is measured


def _verdict(text: str, mode: str = "gpu"):
    from llmfleet.health.residency import judge
    from llmfleet.knowledge.engines.loadlog import ComputeApps, parse_llamacpp
    from tests.test_residency import PLAN

    return lambda: judge(parse_llamacpp(text), ComputeApps(used_mib={7: 6100.0}), {7}, PLAN, mode)


def test_a_layer_off_the_gpu_fails_the_check_whatever_the_speed(engine_factory):
    from tests.test_residency import GPU_PARTIAL

    e = engine_factory()
    rep = checker(e.url, residency=_verdict(GPU_PARTIAL)).run()
    assert not rep.ok and rep.failed.name == "residency"
    assert "offloaded 20/33 layers to GPU" in rep.message  # the engine's own line, quoted
    assert "completion" not in [s.name for s in rep.stages]  # no speed was needed to decide
    assert rep.to_dict()["residency"]["status"] == "fail"


def test_a_resident_engine_passes_the_residency_stage_and_is_recorded(engine_factory):
    from tests.test_residency import GPU_FULL

    e = engine_factory()
    rep = checker(e.url, residency=_verdict(GPU_FULL)).run()
    assert rep.ok, rep.message
    assert [s.name for s in rep.stages] == ["unit", "container", "health", "models", "residency", "completion"]
    assert rep.to_dict()["residency"]["engine_report"]["layers_offloaded"] == 33


def test_unreadable_evidence_is_a_warn_never_a_crash(engine_factory):
    e = engine_factory()

    def broken():
        raise ValueError("the round trip answered nothing")

    rep = checker(e.url, residency=broken).run()
    assert rep.ok and "WARN" in rep.stages[4].message and "answered nothing" in rep.stages[4].message
    rep = checker(e.url, residency=_verdict("")).run()  # a log rotated away
    assert rep.ok and "residency is unproven" in rep.stages[4].message
