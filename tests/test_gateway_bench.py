"""bench/gateway_bench.py's arithmetic: the percentiles it prints, the latency the gateway adds, requests/s."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "gateway_bench", Path(__file__).resolve().parents[1] / "bench" / "gateway_bench.py")
assert _SPEC is not None and _SPEC.loader is not None
gb = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gb)


@pytest.mark.parametrize(("latencies_s", "want"), [
    ([], {"n": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}),
    ([0.004], {"n": 1, "p50_ms": 4.0, "p90_ms": 4.0, "p99_ms": 4.0, "max_ms": 4.0}),
    # 1..100 ms: linear interpolation between order statistics (numpy's default)
    ([i / 1000 for i in range(100, 0, -1)], {"n": 100, "p50_ms": 50.5, "p90_ms": 90.1, "p99_ms": 99.01,
                                             "max_ms": 100.0}),
    # one slow request out of 200 shows at max and in p99's interpolation, not at p50
    ([0.002] * 199 + [0.5], {"n": 200, "p50_ms": 2.0, "p90_ms": 2.0, "p99_ms": 2.0, "max_ms": 500.0}),
    ([0.002] * 99 + [0.5], {"n": 100, "p50_ms": 2.0, "p90_ms": 2.0, "p99_ms": 6.98, "max_ms": 500.0}),
])
def test_summarize_gives_milliseconds_at_each_percentile(latencies_s, want):
    assert gb.summarize(latencies_s) == want


def test_added_is_the_difference_of_percentiles_and_none_where_a_side_is_empty():
    direct = {"p50_ms": 3.0, "p90_ms": 4.0, "p99_ms": 6.5, "max_ms": 20.0}
    through = {"p50_ms": 3.4, "p90_ms": 4.25, "p99_ms": 6.0, "max_ms": 25.125}
    assert gb.added(direct, through) == {"p50_ms": 0.4, "p90_ms": 0.25, "p99_ms": -0.5, "max_ms": 5.125}
    assert gb.added(gb.summarize([]), through) == {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}


@pytest.mark.parametrize(("ok", "wall_s", "want"), [(0, 0.0, 0.0), (100, 10.0, 10.0), (7, 3.0, 2.33), (5, 0.0, 0.0)])
def test_rate_is_requests_per_second_of_the_level(ok, wall_s, want):
    assert gb.rate(ok, wall_s) == want


METRICS = """\
# HELP haproxy_frontend_connections_total Total number of new connections
# TYPE haproxy_frontend_connections_total counter
haproxy_frontend_connections_total{proxy="gateway"} 3
haproxy_frontend_connections_total{proxy="metrics"} 41
# TYPE haproxy_frontend_http_requests_total counter
haproxy_frontend_http_requests_total{proxy="gateway"} 3021
haproxy_frontend_http_requests_total{proxy="metrics"} 41
haproxy_backend_http_requests_total{proxy="tiny-qwen2"} 3000
"""


def test_frontend_counts_reads_the_gateway_frontend_only():
    assert gb.frontend_counts(METRICS) == {"connections": 3, "requests": 3021}
    assert gb.frontend_counts(METRICS, "metrics") == {"connections": 41, "requests": 41}
    assert gb.frontend_counts("haproxy_frontend_connections_total{proxy=\"gateway\"} x\n") == {}
    assert gb.frontend_counts("") == {}


LOG = """\
172.29.0.1:33986 [06/Dec/2026:08:17:07.878] gateway m_tiny-qwen2/gpu-v100-01__tiny 0/0/0/4/4 200 720 ---- 1/1/0/0/0 0/0 key=bench model=tiny-qwen2 POST /v1/completions
172.29.0.1:33986 [06/Dec/2026:08:17:07.933] gateway m_tiny-qwen2/gpu-v100-02__tiny2 1/0/2/3/7 200 720 ---- 1/1/0/0/0 0/0 key=bench model=tiny-qwen2 POST /v1/completions
172.29.0.1:33986 [06/Dec/2026:08:17:07.950] gateway m_tiny-qwen2/<NOSRV> 0/-1/-1/-1/0 401 120 ---- 1/1/0/0/0 0/0 key=- model=- POST /v1/completions
172.29.0.1:33986 [06/Dec/2026:08:17:07.960] gateway gateway/<NOSRV> 0/0/0/0/0 200 98 ---- 1/1/0/0/0 0/0 key=bench model=- GET /v1/models
[WARNING]  (8) : Server m_tiny-qwen2/gpu-v100-01__tiny is UP
"""


def test_log_timers_splits_the_gateway_time_from_the_replica_time():
    t = gb.log_timers(LOG)
    assert t["before_server"] == gb.summarize([0.0, 0.003])
    assert t["server"] == gb.summarize([0.004, 0.003])
    assert t["after"] == gb.summarize([0.0, 0.001])
    assert gb.log_timers("")["server"]["n"] == 0
