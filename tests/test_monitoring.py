"""The packaged alert rules (src/llmfleet/monitoring/rules.yml): `promtool check rules`, and `promtool test
rules` feeding each alert the series that should fire it and a healthy fleet's that should not.

promtool is Debian's (the prometheus package; scripts/bootstrap.sh installs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from llmfleet.fleet import prom_targets as pt
from llmfleet.monitoring import packaged

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/bootstrap.sh installs it)")
RULES = packaged("rules.yml")
RUNBOOKS = Path(__file__).resolve().parents[1] / "docs" / "runbooks"

T = 'job="llmfleet-engines", instance="10.0.0.5:8080", host="gpu-01", service="chat"'
G = 'gpu="0", Hostname="gpu-01", modelName="Tesla V100-SXM2-32GB"'
GW = 'job="llmfleet-gateways", instance="10.0.0.9:9902", host="gw-01", service="gateway", engine="gateway"'
X = 'job="llmfleet-exporters", instance="10.0.0.5:9100", host="gpu-01", service="node-exporter", engine="node-exporter"'


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False)


def test_promtool_checks_the_rules():
    res = promtool("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def _host_rules_file(tmp_path: Path, floor: float, deadline: int | None = None) -> Path:
    """The rules file `invoke prometheus.targets` writes for a host whose release has this floor (and, with
    ``deadline``, an unconfirmed release whose revert timer ends then: Unix time)."""
    ht = pt.HostTargets(host="gpu-01", targets=[pt.Target(
        host="gpu-01", service="chat", address="10.0.0.5:8080", job="engines",
        labels={"host": "gpu-01", "service": "chat", "release": "r1", "floor_tokps": f"{floor:.1f}"})],
        unconfirmed=[{"service": "chat", "release": "r1", "deadline": deadline}] if deadline is not None else [])
    p = tmp_path / "host-rules.yml"
    p.write_text(pt.host_rules(ht))
    return p


# alert, the input series {series: values} (one sample a minute), when to look, whether it fires
SCENARIOS = [
    ("LlmfleetEngineDown", {f"up{{{T}}}": "1 1 1 0x20"}, "10m", True),
    ("LlmfleetEngineDown", {f"up{{{T}}}": "1x20"}, "10m", False),
    ("LlmfleetEngineDown", {f"up{{{T}}}": "1 1 1 0 1x20"}, "10m", False),  # one missed scrape is not down
    # an exporter down is not an engine down: its own alert, later and milder
    ("LlmfleetEngineDown", {f"up{{{X}}}": "1 1 1 0x20"}, "10m", False),
    ("LlmfleetExporterDown", {f"up{{{X}}}": "1 1 1 0x20"}, "10m", True),
    ("LlmfleetExporterDown", {f"up{{{X}}}": "1 1 1 0 0 0 1x20"}, "10m", False),  # back within 5 minutes
    ("LlmfleetExporterDown", {f"up{{{T}}}": "1 1 1 0x20"}, "10m", False),  # an engine: LlmfleetEngineDown
    ("LlmfleetGatewayDown", {f"up{{{GW}}}": "1 1 1 0x20"}, "10m", True),
    ("LlmfleetGatewayDown", {f"up{{{GW}}}": "1x20"}, "10m", False),
    ("LlmfleetEngineDown", {f"up{{{GW}}}": "1 1 1 0x20"}, "10m", False),  # the gateway's own alert
    ("LlmfleetGatewayNoReplica", {f"haproxy_backend_active_servers{{{GW}, proxy=\"m_tiny\"}}": "2 1 0x20"}, "10m", True),
    ("LlmfleetGatewayNoReplica", {f"haproxy_backend_active_servers{{{GW}, proxy=\"m_tiny\"}}": "2 1 1x20"}, "10m", False),
    # vLLM: requests running and waiting, its token counters still
    ("LlmfleetEngineHung", {f"vllm:num_requests_running{{{T}}}": "2x30", f"vllm:num_requests_waiting{{{T}}}": "3x30",
                            f"vllm:generation_tokens_total{{{T}}}": "500x30",
                            f"vllm:prompt_tokens_total{{{T}}}": "900x30"}, "20m", True),
    ("LlmfleetEngineHung", {f"vllm:num_requests_running{{{T}}}": "2x30", f"vllm:num_requests_waiting{{{T}}}": "3x30",
                            f"vllm:generation_tokens_total{{{T}}}": "500+300x30",
                            f"vllm:prompt_tokens_total{{{T}}}": "900+100x30"}, "20m", False),
    # llama-server: one request processing for 20 minutes, n_decode_total still
    ("LlmfleetEngineHung", {f"llamacpp:requests_processing{{{T}}}": "1x30",
                            f"llamacpp:requests_deferred{{{T}}}": "0x30", f"llamacpp:n_decode_total{{{T}}}": "7000x30",
                            f"llamacpp:tokens_predicted_total{{{T}}}": "4000x30",
                            f"llamacpp:prompt_tokens_total{{{T}}}": "3000x30"}, "20m", True),
    # ... a long stream: tokens_predicted_total moves only at its end, n_decode_total every step
    ("LlmfleetEngineHung", {f"llamacpp:requests_processing{{{T}}}": "1x30",
                            f"llamacpp:requests_deferred{{{T}}}": "0x30",
                            f"llamacpp:n_decode_total{{{T}}}": "7000+600x30",
                            f"llamacpp:tokens_predicted_total{{{T}}}": "4000x30",
                            f"llamacpp:prompt_tokens_total{{{T}}}": "3000x30"}, "20m", False),
    # idle: nothing waits, nothing moves: not hung
    ("LlmfleetEngineHung", {f"llamacpp:requests_processing{{{T}}}": "0x30",
                            f"llamacpp:requests_deferred{{{T}}}": "0x30", f"llamacpp:n_decode_total{{{T}}}": "7000x30",
                            f"llamacpp:tokens_predicted_total{{{T}}}": "4000x30",
                            f"llamacpp:prompt_tokens_total{{{T}}}": "3000x30"}, "20m", False),
    # decode speed below the release's floor (20 tok/s) for 15 minutes
    # llama-server: tokens generated over the slots' generation seconds (540 tokens in 60 s: 9 tok/s)
    ("LlmfleetDecodeBelowFloor", {f"llamacpp:tokens_predicted_total{{{T}}}": "0+540x40",
                                  f"llamacpp:tokens_predicted_seconds_total{{{T}}}": "0+60x40"}, "30m", True),
    ("LlmfleetDecodeBelowFloor", {f"llamacpp:tokens_predicted_total{{{T}}}": "0+1860x40",
                                  f"llamacpp:tokens_predicted_seconds_total{{{T}}}": "0+60x40"}, "30m", False),
    # ... and a service idle for part of the window is judged by the requests it did serve
    ("LlmfleetDecodeBelowFloor", {f"llamacpp:tokens_predicted_total{{{T}}}": "0+540x10 5400x10 5400+540x20",
                                  f"llamacpp:tokens_predicted_seconds_total{{{T}}}": "0+60x10 600x10 600+60x20"},
     "40m", True),
    ("LlmfleetDecodeBelowFloor", {  # vLLM: 0.1 s per output token = 10 tok/s
        f"vllm:time_per_output_token_seconds_sum{{{T}}}": "0+6x40",
        f"vllm:time_per_output_token_seconds_count{{{T}}}": "0+60x40"}, "30m", True),
    ("LlmfleetDecodeBelowFloor", {  # 0.02 s per output token = 50 tok/s
        f"vllm:inter_token_latency_seconds_sum{{{T}}}": "0+1.2x40",
        f"vllm:inter_token_latency_seconds_count{{{T}}}": "0+60x40"}, "30m", False),
    ("LlmfleetKvCacheNearFull", {f"vllm:kv_cache_usage_perc{{{T}}}": "0.98x20"}, "15m", True),
    ("LlmfleetKvCacheNearFull", {f"llamacpp:kv_cache_usage_ratio{{{T}}}": "0.99x20"}, "15m", True),
    ("LlmfleetKvCacheNearFull", {f"vllm:kv_cache_usage_perc{{{T}}}": "0.6x20"}, "15m", False),
    ("LlmfleetQueueOverThreshold", {f"llamacpp:requests_deferred{{{T}}}": "12x20"}, "10m", True),
    ("LlmfleetQueueOverThreshold", {f"vllm:num_requests_waiting{{{T}}}": "3x20"}, "10m", False),
    ("LlmfleetRestartStorm", {f"process_start_time_seconds{{{T}}}": "100 100 200 200 300 300 400 400x10"},
     "12m", True),
    ("LlmfleetRestartStorm", {f"llamacpp:n_decode_total{{{T}}}": "10 20 0 10 0 10 0 5x10"}, "12m", True),
    ("LlmfleetRestartStorm", {f"process_start_time_seconds{{{T}}}": "100x20", f"up{{{T}}}": "1x20"}, "12m", False),
    # scrapes that failed three times and worked at the next, the engine never restarted: no storm
    ("LlmfleetRestartStorm", {f"up{{{T}}}": "1 0 1 0 1 0 1 0 1x10", f"llamacpp:n_decode_total{{{T}}}": "100+10x20"},
     "12m", False),
    # one stop and start: down a while, counters from zero again
    ("LlmfleetRestartStorm", {f"up{{{T}}}": "1 1 0 0 0 1x15", f"llamacpp:n_decode_total{{{T}}}": "500 600 _ _ _ 0+10x15"},
     "12m", False),
    ("LlmfleetDriverDropsCard", {f'up{{{T}, driver="590.44.01", card="Tesla V100-SXM2-32GB", '
                                 'driver_drives_card="false"}': "0x5"}, "3m", True),
    ("LlmfleetDriverDropsCard", {f'up{{{T}, driver="580.95.05", driver_drives_card="true"}}': "1x5"}, "3m", False),
    # a release never confirmed: its revert timer ended a minute into the test (promtool's clock starts at 0)
    ("LlmfleetReleaseUnconfirmed", {"deadline": "passed", f"up{{{T}}}": "1x20"}, "10m", True),
    ("LlmfleetReleaseUnconfirmed", {"deadline": "ahead", f"up{{{T}}}": "1x20"}, "10m", False),
    ("LlmfleetGpuXid", {f"DCGM_FI_DEV_XID_ERRORS{{{G}}}": "0 0 79x5"}, "4m", True),
    ("LlmfleetGpuXid", {f"DCGM_FI_DEV_XID_ERRORS{{{G}}}": "0x10"}, "8m", False),
    ("LlmfleetGpuUncorrectableEcc", {f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{G}}}": "0 0 1x5"}, "4m", True),
    ("LlmfleetGpuUncorrectableEcc", {f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{G}}}": "0 0 2x5"}, "4m", True),
    ("LlmfleetGpuUncorrectableEcc", {f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{G}}}": "0x10",
                                     f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{G}}}": "0x10"}, "8m", False),
]


# the revert timer's end (Unix time) the host's rules file gives an unconfirmed release, per scenario
UNCONFIRMED = {"LlmfleetReleaseUnconfirmed": {"passed": 60, "ahead": 2_000_000_000}}


def _test_file(tmp_path: Path, alert: str, series: dict[str, str], at: str, fires: bool) -> Path:
    deadline = UNCONFIRMED.get(alert, {}).get(series.get("deadline", ""))
    series = {k: v for k, v in series.items() if k != "deadline"}
    expr = f'count by (alertname) (ALERTS{{alertname="{alert}", alertstate="firing"}})'
    doc = {
        "rule_files": [str(RULES), str(_host_rules_file(tmp_path, 20.0, deadline))],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "promql_expr_test": [{"expr": expr, "eval_time": at,
                                  "exp_samples": [{"labels": f'{{alertname="{alert}"}}', "value": 1}] if fires else []}],
        }],
    }
    p = tmp_path / "test.yml"
    p.write_text(json.dumps(doc))  # JSON is YAML
    return p


@pytest.mark.parametrize(("alert", "series", "at", "fires"), SCENARIOS,
                         ids=[f"{a}-{'fires' if f else 'quiet'}-{i}" for i, (a, _s, _t, f) in enumerate(SCENARIOS)])
def test_each_alert_fires_on_its_condition_and_stays_quiet_otherwise(tmp_path, alert, series, at, fires):
    res = promtool("test", "rules", str(_test_file(tmp_path, alert, series, at, fires)))
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_has_a_scenario_both_ways_and_its_texts():
    import yaml

    alerts = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]
    names = {r["alert"] for r in alerts}
    assert names == {a for a, _s, _t, f in SCENARIOS if f} == {a for a, _s, _t, f in SCENARIOS if not f}
    runbook = (RUNBOOKS / "alerts.md").read_text()
    for r in alerts:
        ann = r["annotations"]
        assert ann["summary"] and ann["description"], r["alert"]
        assert ann["runbook_url"] == f"docs/runbooks/alerts.md#{r['alert'].lower()}"
        assert f"## {r['alert']}" in runbook, f"docs/runbooks/alerts.md has no section for {r['alert']}"


def test_the_down_alert_says_which_engine_and_where_its_runbook_is(tmp_path):
    doc = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": f'up{{{T}, engine="llamacpp", release="r7"}}', "values": "0x10"}],
        "alert_rule_test": [{"eval_time": "5m", "alertname": "LlmfleetEngineDown", "exp_alerts": [{
            "exp_labels": {"severity": "critical", "job": "llmfleet-engines", "instance": "10.0.0.5:8080",
                           "host": "gpu-01", "service": "chat", "engine": "llamacpp", "release": "r7"},
            "exp_annotations": {
                "summary": "gpu-01 chat: engine metrics endpoint down",
                "description": "Prometheus has not scraped 10.0.0.5:8080 (llamacpp, release r7) for 2 minutes: the "
                               "engine is stopped, crashed, or its port is not reachable from Prometheus.",
                "runbook_url": "docs/runbooks/alerts.md#llmfleetenginedown"}}]}],
    }]}
    p = tmp_path / "t.yml"
    p.write_text(json.dumps(doc))
    res = promtool("test", "rules", str(p))
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_host_rules_file_prometheus_targets_writes_is_valid_rules(tmp_path):
    res = promtool("check", "rules", str(_host_rules_file(tmp_path, 41.5, 1_800_000_000)))
    assert res.returncode == 0, res.stdout + res.stderr
    empty = tmp_path / "empty.yml"
    empty.write_text(pt.host_rules(pt.HostTargets(host="h")))
    assert promtool("check", "rules", str(empty)).returncode == 0
