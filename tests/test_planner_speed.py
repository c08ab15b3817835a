"""The speed step (``knowledge/planner/speed.py``): the batch-1 decode ceiling and realistic range a
plan promises, and the health floor a deploy applies (below every resident prediction)."""

from __future__ import annotations

import pytest

from llmfleet.knowledge.catalog import find_gpu
from llmfleet.knowledge.planner.speed import decode_ceiling, decode_speed
from tests.planner_stages import GB, stages

L70 = "llama-3.1-70b-instruct"

CASES = [
    dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"),
    dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="a100-sxm4-80gb"),
    dict(model="qwen2.5-7b-instruct", quant="fp16", gpu="h100-sxm-80gb", kv_dtype="fp8"),
    dict(model="gemma-3-27b-it", quant="q4_k_m", gpu="h100-sxm-80gb"),
    dict(model="qwen3-30b-a3b", quant="awq-int4", gpu="a10"),
    dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4),
    dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2),
]


@pytest.mark.parametrize("kw", CASES)
def test_ceiling_is_bandwidth_over_bytes_read_and_the_range_and_floor_sit_below_it(kw):
    s = stages(context=8192, **kw)
    sp, gpu = s.speed, find_gpu(kw["gpu"])
    assert sp.ceiling == pytest.approx(decode_ceiling(gpu.bandwidth_gbps, sp.read_bytes))
    assert 0 < sp.floor < sp.resident.low < sp.resident.high < sp.ceiling
    assert sp.offload_eighth.high < sp.resident.high  # an eighth of the layers off the GPU is slower


@pytest.mark.parametrize(
    ("kw", "share"),
    [
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4), 1 / 4),  # a tensor-parallel rank: 1/n
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, hosts=2), 1 / 2),  # stages add up
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2), 1.0),  # a layer split reads every layer once
    ],
)
def test_weights_read_per_token_by_split(kw, share):
    s = stages(context=8192, **kw)
    assert s.speed.weights_read_bytes == pytest.approx(s.r.weights.read_per_token * share)


@pytest.mark.parametrize(
    ("kw", "comm"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"), False),
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4), True),
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2, hosts=2), True),
    ],
)
def test_a_split_pays_communication_per_token_and_says_so(kw, comm):
    sp = stages(context=8192, **kw).speed
    assert (sp.comm.high_us > 0) is comm
    assert ("split over" in sp.efficiency_text) is comm


def test_moe_reads_only_the_active_experts():
    sp = stages(model="qwen3-30b-a3b", quant="awq-int4", gpu="a10", context=8192).speed
    dense = stages(model="qwen3-32b", quant="awq-int4", gpu="a10", context=8192).speed
    assert sp.moe_layers == 48 and dense.moe_layers == 0
    assert sp.weights_read_bytes < dense.weights_read_bytes / 4


def test_a_measured_efficiency_replaces_the_catalog_range():
    base = dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="rtx-4090", context=8192)
    sp = stages(**base, measured_efficiency=(0.55, "measured on gpu-a")).speed
    assert sp.resident.efficiency == (0.55, 0.55)
    assert "0.55 fitted to this fleet's measurements" in sp.efficiency_text and "measured on gpu-a" in sp.efficiency_text


@pytest.mark.parametrize(
    ("change", "slower"),
    [
        (dict(cuda_graphs=False), True),  # every kernel launched from the host
        (dict(host_bytes=1 * GB, host_gbps=(10.0, 20.0)), True),  # weights streamed from host memory
        (dict(extra_us=(500.0, 1000.0)), True),  # a split's communication
        (dict(efficiency=(0.9, 0.95)), False),
    ],
)
def test_decode_speed_model(change, slower):
    args = ("llamacpp", 1000.0, "gddr", 10 * GB, 32)
    base = decode_speed(*args)
    other = decode_speed(*args, **change)
    assert (other.high < base.high) is slower
    assert other.low <= other.high


@pytest.mark.parametrize(("engine", "gpu", "quant"), [("vllm", "h200-141gb", "bf16"), ("vllm", "a100-sxm4-80gb", "bf16"),
                                                      ("llamacpp", "h200-141gb", "q8_0")])
def test_a_deltanet_layer_costs_its_state_write_back_and_its_own_kernels(engine, gpu, quant):
    """Qwen3.5-27B: 48 Gated DeltaNet layers read their float32 recurrent state and write it back every
    token, and run kernels an attention layer does not (conv1d update, gating, the recurrent update):
    the plan reads the state twice and adds the catalog's linear_layer_us per DeltaNet layer."""
    s = stages(model="qwen3.5-27b", quant=quant, gpu=gpu, engine=engine, context=4096)
    sp, fit = s.speed, s.fit
    state = fit.layout.state_bytes_per_sequence
    assert state > 100e6  # 48 layers x (48 x 128 x 128 x 4 bytes + conv state)
    assert sp.read_bytes == pytest.approx(sp.weights_read_bytes + fit.per_sequence_bytes + state)
    lin = sp.resident.linear_layer_us
    assert 0 < lin[0] <= lin[1]
    assert "48 linear-attention layers" in sp.efficiency_text
    # The same bytes and layers without the DeltaNet terms decode faster at both ends.
    gpu_spec = find_gpu(gpu)
    plain = decode_speed(engine, gpu_spec.bandwidth_gbps, gpu_spec.memory_type, sp.read_bytes - state, 64,
                         cuda_graphs=sp.cuda_graphs, compute_capability=gpu_spec.compute_capability)
    assert sp.resident.low < plain.low and sp.resident.high < plain.high
