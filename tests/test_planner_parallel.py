"""The planner split over several cards and hosts: vLLM tensor / pipeline parallel, llama.cpp layer and
row split and RPC (pure: no host, no network).

The rules come from the engines' own code (vllm/config/model.py, vllm/distributed/utils.py,
vllm/model_executor/layers/linear.py; llama.cpp src/llama-model.cpp, src/llama.cpp), the costs from
catalog/planner.yaml ``parallel`` (docs/planner.md, "Split over cards and hosts").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.errors import UsageError
from llmfleet.knowledge import parallel
from llmfleet.knowledge.catalog import find_gpu, load_gpus, parallel_assumptions
from llmfleet.knowledge.planner import PlanRequest, PlanSummary, plan, plan_for_service, summarize

REPO = Path(__file__).resolve().parents[1]
GB = 1e9
L70 = "llama-3.1-70b-instruct"  # 80 layers, 64 heads, 8 KV heads, hidden 8192


def P(model, quant=None, gpu="v100-sxm2-32gb", **kw):
    return plan(PlanRequest(model=model, quant=quant, gpu=gpu, **kw))


def _flag(args, name):
    return args[args.index(name) + 1] if name in args else None


# ------------------------------------------------------------------------------- the engines' rules


@pytest.mark.parametrize(("layers", "pp", "want"), [
    (80, 1, [80]),
    (80, 2, [40, 40]),
    (81, 2, [41, 40]),       # the remainder goes to the stages before the last (get_pp_indices)
    (80, 3, [27, 27, 26]),
    (10, 4, [2, 3, 3, 2]),
    (64, 4, [16, 16, 16, 16]),
])
def test_pipeline_stages_split_layers_like_vllm(layers, pp, want):
    assert parallel.pp_partition(layers, pp) == want


@pytest.mark.parametrize(("layers", "shares", "want", "out"), [
    (80, [1], [80], 0),
    (80, [1, 1, 1, 1], [21, 20, 20, 19], 3),  # 81 slots (80 + output): device d takes il < 81 (d+1)/4
    (32, [1, 1], [17, 15], 1),
    (80, [3, 1], [61, 19], 1),
    (4, [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], 4),  # more devices than layers: the output layer on the 5th, the 6th idle
])
def test_layer_split_places_layers_like_llama_cpp(layers, shares, want, out):
    counts, output_device = parallel.layer_split(layers, shares)
    assert counts == want and output_device == out and sum(counts) == layers


@pytest.mark.parametrize(("heads", "kv", "tp", "bad"), [
    (64, 8, 1, None),
    (64, 8, 4, None),
    (64, 8, 8, None),
    (64, 8, 16, None),          # tp > KV heads: replicated, tp a multiple of them
    (64, 8, 3, "attention heads"),
    (40, 8, 8, None),           # Qwen2.5-32B over 8
    (28, 4, 8, "attention heads"),  # Qwen2.5-7B over 8
    (32, 6, 4, "KV heads"),
    (32, 4, 8, None),
    (24, 4, 6, "KV heads"),     # 6 is not a multiple of 4
])
def test_tensor_parallel_head_rules(heads, kv, tp, bad):
    why = parallel.tp_problem(heads, kv, tp)
    assert (why is None) if bad is None else (bad in why)


@pytest.mark.parametrize(("kv", "tp", "per_gpu"), [(8, 1, 8), (8, 2, 4), (8, 8, 1), (8, 16, 1), (1, 4, 1)])
def test_kv_heads_per_gpu_like_get_num_kv_heads(kv, tp, per_gpu):
    assert parallel.kv_heads_per_gpu(kv, tp) == per_gpu


def test_every_card_says_how_it_is_linked():
    for g in load_gpus():
        assert g.interconnect in ("nvlink", "pcie") and g.interconnect_gbps > 0 and g.interconnect_sources, g.id
    assert find_gpu("v100-sxm2-32gb").interconnect == "nvlink" and find_gpu("v100-sxm2-32gb").interconnect_gbps == 150
    assert find_gpu("p40").interconnect == "pcie" and find_gpu("p40").interconnect_gbps == 15.75


def _pa():
    """Fixed figures, so the arithmetic is checked, not the catalog's current values."""
    import dataclasses

    return dataclasses.replace(
        parallel_assumptions(), allreduce_us={"nvlink": (5.0, 15.0), "pcie": (15.0, 55.0)}, allreduces_per_layer=2,
        allreduces_per_token=2, network_latency_us=(25.0, 100.0), network_efficiency=0.8, pp_step_us=(300.0, 1500.0),
        rpc_round_trips_per_device=3, rpc_graph_bytes_per_layer=(0.0, 10000.0), layer_split_hop_us=(5.0, 30.0))


@pytest.mark.parametrize(("cost", "low", "high"), [
    # 162 all-reduces x (5 | 15 us + 2 x 3/4 x 16384 B / 150 GB/s = 0.164 us)
    (lambda pa: parallel.allreduce_cost(pa, interconnect="nvlink", link_gbps=150, tp=4, layers=80, hidden=8192),
     162 * 5.16384, 162 * 15.16384),
    # PCIe class, 2 cards: 2 x 1/2 x 8192 B / 15.75 GB/s = 0.52 us each
    (lambda pa: parallel.allreduce_cost(pa, interconnect="pcie", link_gbps=15.75, tp=2, layers=32, hidden=4096),
     66 * (15 + 8192 / 15750), 66 * (55 + 8192 / 15750)),
    (lambda pa: parallel.allreduce_cost(pa, interconnect="nvlink", link_gbps=150, tp=1, layers=80, hidden=8192), 0, 0),
    # one stage boundary: 32768 B at 10 Gbit/s x 0.8 = 32.768 us + latency; the token back (64 B); Ray's step
    (lambda pa: parallel.pipeline_cost(pa, hosts=2, hidden=8192, network_gbps=10),
     25 + 32.768 + 25 + 0.064 + 300, 100 + 32.768 + 100 + 0.064 + 1500),
    # two RPC devices: 3 round trips each (6 x 25 | 100 us) + 65536 B of activations (+ 10 KB of graph per layer)
    (lambda pa: parallel.rpc_cost(pa, rpc_devices=2, layers_per_device=[21, 20], hidden=8192, network_gbps=10),
     2 * (150 + 65.536), 2 * 600 + (65536 + 210000) * 8 / 8000 + (65536 + 200000) * 8 / 8000),
    (lambda pa: parallel.layer_hops_cost(pa, 3), 15, 90),
])
def test_communication_cost_arithmetic(cost, low, high):
    c = cost(_pa())
    assert c.low_us == pytest.approx(low, rel=1e-6) and c.high_us == pytest.approx(high, rel=1e-6)


# ------------------------------------------------------------------------------- one card: unchanged


@pytest.mark.parametrize(("model", "quant", "gpu"), [
    ("qwen2.5-7b-instruct", "gptq-int4", "v100-sxm2-32gb"),
    ("qwen2.5-14b-instruct", "q4_k_m", "p40"),
])
def test_a_single_card_plan_has_no_split(model, quant, gpu):
    p = P(model, quant, gpu=gpu, context=8192)
    same = P(model, quant, gpu=gpu, context=8192, hosts=1, split_mode=None)
    assert p.to_dict() == same.to_dict()
    assert p.hosts == p.tensor_parallel_size == p.pipeline_parallel_size == 1 and p.split_mode == ""
    assert p.comm["low_us"] == p.comm["high_us"] == 0 and not p.deploy_adds and p.tensor_split is None
    assert p.per_gpu["weights_bytes"] == p.weights_gpu_bytes
    assert not {"--pipeline-parallel-size", "--distributed-executor-backend", "--split-mode", "--tensor-split"} \
        & set(p.engine_args)


# ------------------------------------------------------------------------------- vLLM tensor parallel


def test_a_70b_int4_does_not_fit_one_v100_and_the_plan_gives_the_split():
    p = P(L70, "gptq-int4", context=8192)
    assert not p.fits
    flags = [a["flags"] for a in p.alternatives]
    assert flags[:2] == ["--gpus 2", "--gpus 4"], flags
    note = next(n for n in p.notes if "when split" in n)
    assert "fits only when split: --gpus 2" in note and "GB of weights per GPU" in note


def test_70b_int4_on_four_v100s_per_gpu_figures():
    one = P(L70, "gptq-int4", context=8192, offload=True)
    p = P(L70, "gptq-int4", gpus=4, context=8192)
    assert p.fits and p.tensor_parallel_size == 4
    assert p.per_gpu["weights_bytes"] == pytest.approx(p.weights_bytes / 4, rel=1e-6)  # 8 KV heads: no replica
    assert p.per_gpu["kv_heads"] == 2
    # KV per GPU: 2 of 8 KV heads -> a quarter of the model's 327,680 B/token
    assert p.per_gpu["kv_cache_bytes"] == pytest.approx(8192 * 327680 / 4, rel=1e-6)
    assert p.max_context_tokens == 131072 and p.max_concurrency >= 20
    assert _flag(p.engine_args, "--tensor-parallel-size") == "4"
    # 2 all-reduces per layer + 2 per token, 5-15 us each over NVLink, plus the transfer term
    assert p.comm["interconnect"] == "nvlink" and "162 all-reduces" in p.comm["how"]
    assert 162 * 5 < p.comm["low_us"] < 162 * 6 and 162 * 15 < p.comm["high_us"] < 162 * 16
    assert p.decode_tokps_realistic[0] > 5 * one.decode_tokps_realistic[1]


def test_all_reduces_over_pcie_cost_more_than_over_nvlink():
    sxm = P(L70, "gptq-int4", gpu="v100-sxm2-32gb", gpus=4, context=8192)
    pcie = P(L70, "gptq-int4", gpu="v100-pcie-32gb", gpus=4, context=8192)
    asked = P(L70, "gptq-int4", gpu="v100-sxm2-32gb", gpus=4, context=8192, interconnect="pcie")
    assert pcie.comm["interconnect"] == asked.comm["interconnect"] == "pcie"
    assert pcie.comm["high_us"] > 3 * sxm.comm["high_us"]
    assert asked.decode_tokps_realistic[1] < sxm.decode_tokps_realistic[1]
    assert any("custom all-reduce is off" in n for n in pcie.notes)


def test_more_gpus_than_kv_heads_replicate_the_kv_heads():
    eight = P("llama-3.1-8b-instruct", "fp16", gpu="a100-sxm4-80gb", gpus=8, context=8192)
    sixteen = P("llama-3.1-8b-instruct", "fp16", gpu="a100-sxm4-80gb", gpus=16, context=8192)
    assert eight.per_gpu["kv_heads"] == sixteen.per_gpu["kv_heads"] == 1
    assert sixteen.per_gpu["kv_cache_bytes"] == eight.per_gpu["kv_cache_bytes"]  # KV per GPU does not shrink
    assert any("replica" in n for n in sixteen.notes)
    # the replicated K/V projections: each GPU keeps 1/8 of them, not 1/16
    assert sixteen.per_gpu["weights_bytes"] > sixteen.weights_bytes / 16


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_refused():
    p = P("qwen2.5-32b-instruct", "bf16", gpu="a100-sxm4-80gb", gpus=3, context=4096)
    assert not p.fits and "verify_with_parallel_config" in p.notes[0]


# ------------------------------------------------------------------------------- vLLM pipeline parallel


def test_two_hosts_give_pipeline_parallel_flags_and_layers_per_host():
    p = P(L70, "gptq-int4", gpus=2, hosts=2, context=8192)
    assert p.fits and p.pipeline_parallel_size == 2 and p.layers_per_host == [40, 40]
    a = p.engine_args
    assert _flag(a, "--tensor-parallel-size") == "2" and _flag(a, "--pipeline-parallel-size") == "2"
    assert _flag(a, "--distributed-executor-backend") == "ray"
    assert any("ray start" in d for d in p.deploy_adds) and any("NCCL_SOCKET_IFNAME" in d for d in p.deploy_adds)
    assert p.comm["network_gbps"] == parallel_assumptions().network_default_gbps


def test_a_second_host_adds_memory_not_speed():
    tp4 = P(L70, "gptq-int4", gpus=4, context=8192)
    pp2 = P(L70, "gptq-int4", gpus=2, hosts=2, context=8192)
    tp2 = P(L70, "gptq-int4", gpus=2, context=8192)
    # the weights each GPU holds halve with the second host, as with twice the GPUs in one host
    assert pp2.per_gpu["weights_bytes"] == pytest.approx(tp4.per_gpu["weights_bytes"], rel=0.02)
    assert pp2.max_concurrency > tp2.max_concurrency
    # batch-1 decode: stages run one after another; the network makes it slower than one host of 2
    assert pp2.decode_tokps_ceiling == pytest.approx(tp2.decode_tokps_ceiling, rel=0.01)
    assert pp2.decode_tokps_realistic[1] < tp2.decode_tokps_realistic[1] < tp4.decode_tokps_realistic[1]
    assert any("adds memory, not speed" in n for n in pp2.notes)


@pytest.mark.parametrize(("slow", "fast"), [
    ({"network_gbps": 1}, {"network_gbps": 100}),
    ({"network_latency_us": 500}, {"network_latency_us": 10}),
])
def test_a_slower_network_gives_a_slower_decode(slow, fast):
    s = P(L70, "gptq-int4", gpus=2, hosts=2, context=8192, **slow)
    f = P(L70, "gptq-int4", gpus=2, hosts=2, context=8192, **fast)
    assert s.comm["high_us"] > f.comm["high_us"] and s.decode_tokps_realistic[0] < f.decode_tokps_realistic[0]


def test_a_model_too_big_for_one_host_suggests_more_hosts():
    p = plan(PlanRequest(model=L70, quant="gptq-int4", gpu="v100-sxm2-16gb", gpus=2, context=8192,
                         gpus_available=2))
    assert not p.fits
    alt = next(a for a in p.alternatives if "hosts" in a["change"])
    assert alt["flags"] == "--hosts 2 --gpus 2" and alt["layers_per_host"] == [40, 40]


# ------------------------------------------------------------------------------- llama.cpp


def test_llama_cpp_layer_split_adds_memory_not_speed():
    one = P("qwen2.5-14b-instruct", "q4_k_m", gpu="rtx-3090", context=8192)
    two = P("qwen2.5-14b-instruct", "q4_k_m", gpu="rtx-3090", gpus=2, context=8192)
    assert two.max_concurrency > 2 * one.max_concurrency - 1
    assert two.decode_tokps_ceiling == pytest.approx(one.decode_tokps_ceiling, rel=1e-6)
    assert two.decode_tokps_realistic[1] < one.decode_tokps_realistic[1]  # one card boundary per token
    assert _flag(two.engine_args, "--split-mode") == "layer" and _flag(two.engine_args, "--tensor-split") == "1,1"
    assert two.layers_per_device == [25, 23]  # 48 layers + output over 2 devices


def test_llama_cpp_row_split_reads_in_parallel_and_keeps_kv_on_the_main_gpu():
    layer = P(L70, "q4_k_m", gpus=4, context=8192)
    row = P(L70, "q4_k_m", gpus=4, context=8192, split_mode="row")
    assert row.decode_tokps_ceiling > 3 * layer.decode_tokps_ceiling
    assert row.max_context_tokens < layer.max_context_tokens  # the whole KV cache on one card
    assert row.per_gpu["kv_cache_bytes"] == pytest.approx(4 * layer.per_gpu["kv_cache_bytes"], rel=0.06)
    assert _flag(row.engine_args, "--split-mode") == "row" and row.layers_per_host == [80]
    assert row.comm["high_us"] > row.comm["low_us"] > 0


def test_llama_cpp_rpc_over_two_hosts():
    p = P(L70, "q4_k_m", gpu="p40", gpus=2, hosts=2, context=8192)
    assert p.fits and p.tensor_split == [1, 1, 1, 1] and _flag(p.engine_args, "--tensor-split") == "1,1,1,1"
    # RPC devices come first: the worker holds the first layers, the head the last and the output layer
    assert p.layers_per_device == [21, 20, 20, 19] and p.layers_per_host == [39, 41]
    assert "--rpc" not in p.engine_args and any("--rpc HOST:PORT" in d for d in p.deploy_adds)
    assert "2 RPC device(s)" in p.comm["how"]
    local = P(L70, "q4_k_m", gpu="p40", gpus=4, context=8192)
    assert p.decode_tokps_realistic[0] < local.decode_tokps_realistic[0]


def test_a_70b_q4_needs_two_p40_hosts_and_the_plan_says_so():
    p = plan(PlanRequest(model=L70, quant="q4_k_m", gpu="p40", gpus=2, context=8192, gpus_available=2))
    assert not p.fits
    assert any(a["flags"] == "--hosts 2 --gpus 2" for a in p.alternatives)
    assert any("when split: --hosts 2 --gpus 2" in n for n in p.notes)


# ------------------------------------------------------------------------------- the health floor


@pytest.mark.parametrize("kw", [
    {"model": L70, "quant": "gptq-int4", "gpus": 4},
    {"model": L70, "quant": "gptq-int4", "gpus": 4, "gpu": "v100-pcie-32gb"},
    {"model": L70, "quant": "gptq-int4", "gpus": 2, "hosts": 2, "network_gbps": 1},
    {"model": L70, "quant": "q4_k_m", "gpus": 2, "hosts": 2, "gpu": "p40"},
    {"model": L70, "quant": "q4_k_m", "gpus": 4, "split_mode": "row"},
])
def test_the_health_floor_of_a_split_plan_stays_below_its_slowest_prediction(kw):
    p = P(context=8192, **({"gpu": "v100-sxm2-32gb"} | kw))
    assert p.fits and p.health_floor_tokps < p.decode_tokps_realistic[0]


# ------------------------------------------------------------------------------- inputs


@pytest.mark.parametrize(("kw", "needle"), [
    ({"hosts": 0}, "--hosts must be 1 or more"),
    ({"hosts": 2, "network_gbps": 0}, "--network-gbps must be above 0"),
    ({"hosts": 2, "network_latency_us": -1}, "--network-latency-us"),
    ({"quant": "q4_k_m", "split_mode": "diagonal"}, "--split-mode must be one of layer, row"),
    ({"quant": "q4_k_m", "split_mode": "row", "hosts": 2}, "use --split-mode layer with --hosts"),
    ({"split_mode": "row"}, "--split-mode is llama.cpp's"),
    ({"hosts": 2, "offload": True}, "--offload with --hosts"),
    ({"interconnect": "infiniband"}, "--interconnect must be nvlink or pcie"),
])
def test_bad_split_input_is_one_clear_error(kw, needle):
    base = {"model": "qwen2.5-7b-instruct", "quant": "gptq-int4", "gpu": "v100-sxm2-32gb", "context": 4096}
    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        plan(PlanRequest(**(base | kw)))


def test_plan_for_service_takes_hosts_and_the_network():
    from llmfleet.inventory.services import Service

    svc = Service(name="big", engine="vllm", model=L70, model_path="/srv/models/l70", image="vllm:x",
                  quant="gptq-int4", context=8192, gpus=[0, 1])
    p = plan_for_service(svc, "v100-sxm2-32gb", 2, hosts=2, network_gbps=25)
    assert p.hosts == 2 and p.gpus == 2 and p.comm["network_gbps"] == 25
    s = summarize(p)
    assert s.hosts == 2 and PlanSummary.from_dict(p.to_dict()).hosts == 2


# ------------------------------------------------------------------------------- the task


def _invoke(*args):
    return subprocess.run([sys.executable, "-m", "invoke", "plan", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_invoke_plan_gpus_4_json_has_the_split():
    r = _invoke("--model", L70, "--quant", "gptq-int4", "--gpu", "v100-sxm2-32gb", "--gpus", "4", "--context", "8k",
                "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["tensor_parallel_size"] == 4 and d["per_gpu"]["kv_heads"] == 2 and d["comm"]["interconnect"] == "nvlink"


def test_invoke_plan_hosts_2_table_shows_the_split_and_what_deploy_adds():
    r = _invoke("--model", L70, "--quant", "q4_k_m", "--gpu", "p40", "--gpus", "2", "--hosts", "2", "--context", "8k")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "on each of 2 hosts" in out and "llama.cpp layer split over 4 device(s) (2 over RPC)" in out
    assert "deploy adds" in out and "--tensor-split 1,1,1,1" in out
