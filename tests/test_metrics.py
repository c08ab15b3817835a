"""Engine metrics are read under each engine's names, old and new."""

from __future__ import annotations

import pytest

from llmfleet.fleet.metrics import engine_metrics, parse_prometheus

VLLM_NEW = """
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.125
vllm:generation_tokens_total{engine="0",model_name="tiny"} 640.0
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 90.0
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="tiny"} 0.0
"""
VLLM_OLD = """
vllm:num_requests_running{model_name="m"} 0.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:generation_tokens_total{model_name="m"} 1e+03
"""
LLAMACPP = """
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 12
llamacpp:tokens_predicted_total 64
llamacpp:requests_processing 1
llamacpp:requests_deferred 0
"""


@pytest.mark.parametrize(
    ("engine", "text", "expected"),
    [
        ("vllm", VLLM_NEW, {"requests_running": 2.0, "requests_waiting": 1.0, "kv_cache_usage": 0.125,
                            "generation_tokens_total": 640.0, "prompt_tokens_total": 90.0}),
        ("vllm", VLLM_OLD, {"requests_running": 0.0, "requests_waiting": None, "kv_cache_usage": 0.5,
                            "generation_tokens_total": 1000.0, "prompt_tokens_total": None}),
        ("llamacpp", LLAMACPP, {"requests_running": 1.0, "requests_waiting": 0.0, "kv_cache_usage": None,
                                "generation_tokens_total": 64.0, "prompt_tokens_total": 12.0}),
        ("llamacpp", VLLM_NEW, dict.fromkeys(["requests_running", "requests_waiting", "kv_cache_usage",
                                             "generation_tokens_total", "prompt_tokens_total"])),
    ],
)
def test_engine_metrics(engine, text, expected):
    assert engine_metrics(engine, text).to_dict() == expected


def test_labels_are_summed_and_garbage_ignored():
    text = 'a{x="1"} 1\na{x="2"} 2.5\nnot a metric line\nb NaN\nc +Inf\n' + "junk " * 1000
    assert parse_prometheus(text) == {"a": 3.5, "c": float("inf")}


def test_a_label_value_holding_a_brace_or_an_escaped_quote_is_read():
    # A served model name is free text and lands in the model_name label; the exposition format
    # allows any character in a quoted label value (prometheus_client's parser reads it).
    text = ('vllm:num_requests_running{model_name="qwen}32b"} 3\n'
            'vllm:num_requests_running{model_name="say \\"hi\\"",engine="1"} 1\n')
    assert parse_prometheus(text) == {"vllm:num_requests_running": 4.0}
    assert engine_metrics("vllm", text).requests_running == 4.0


def test_kv_cache_usage_is_never_added_across_engines():
    # vLLM V1 exports one series per engine core (label engine="0", "1", ...) when it runs data
    # parallel (vllm/v1/metrics/loggers.py labels every gauge with engine). Requests add up; the
    # KV-cache share is per engine's cache: the fullest engine's share, never 0.625 + 0.75.
    text = """
vllm:num_requests_running{engine="0",model_name="m"} 2
vllm:num_requests_running{engine="1",model_name="m"} 3
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.625
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:generation_tokens_total{engine="0",model_name="m"} 10
vllm:generation_tokens_total{engine="1",model_name="m"} 5
"""
    m = engine_metrics("vllm", text)
    assert (m.requests_running, m.kv_cache_usage, m.generation_tokens_total) == (5.0, 0.75, 15.0)
