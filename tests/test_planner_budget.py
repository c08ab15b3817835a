"""The budget step (``knowledge/planner/budget.py``): how much of a card the engine may use and the
basis the fit runs on. It decides whether the weights fit at all: per card for vLLM's tensor parallel
(every layer sharded), all cards together for llama.cpp's layer or row split."""

from __future__ import annotations

import pytest

from llmfleet.knowledge.catalog import default_memory_reserved_mib, engine_assumptions, find_gpu
from tests.planner_stages import GB, stages

L70 = "llama-3.1-70b-instruct"


@pytest.mark.parametrize(
    ("kw", "split_mode", "devices", "shards", "weights_fit"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="t4"), "tensor", 1, 1, False),  # 15.2 GB > 13 GiB
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="rtx-4090"), "tensor", 1, 1, True),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4"), "layer", 1, 1, True),
        (dict(model="qwen2.5-32b-instruct", quant="q8_0", gpu="rtx-4090"), "layer", 1, 1, False),
        (dict(model="qwen2.5-32b-instruct", quant="q8_0", gpu="rtx-4090", gpus=2), "layer", 2, 1, True),
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb"), "tensor", 1, 1, False),
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=4), "tensor", 4, 4, True),
        (dict(model=L70, quant="gptq-int4", gpu="v100-sxm2-32gb", gpus=2, hosts=2), "tensor", 4, 2, True),
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=4, split_mode="row"), "row", 4, 1, True),
        (dict(model=L70, quant="q4_k_m", gpu="p40", gpus=2, hosts=2), "layer", 4, 1, True),
    ],
)
def test_the_basis_decides_whether_the_weights_fit(kw, split_mode, devices, shards, weights_fit):
    b = stages(context=4096, **kw).budget
    assert (b.split_mode, b.devices, b.shards) == (split_mode, devices, shards)
    assert b.tensor is (split_mode == "tensor")
    # tensor parallel: one card's budget against 1/devices of the weights; a layer/row split: all cards' memory
    assert b.basis_bytes == pytest.approx(b.card_bytes if b.tensor else b.card_bytes * devices)
    assert b.basis_weights_bytes == pytest.approx(b.weights_gpu_bytes / devices if b.tensor else b.weights_gpu_bytes)
    assert (b.basis_weights_bytes + b.fixed_bytes < b.basis_bytes) is weights_fit


@pytest.mark.parametrize(
    ("kw", "gmu"),
    [
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="a100-sxm4-80gb"), None),  # vLLM's default
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="a100-sxm4-80gb"), None),  # llama.cpp's default
        (dict(model="qwen2.5-7b-instruct", quant="bf16", gpu="a100-sxm4-80gb", gpu_memory_utilization=0.5), 0.5),
        (dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4", gpu_memory_utilization=0.8), 0.8),
    ],
)
def test_one_card_is_its_cuda_visible_memory_times_the_utilization(kw, gmu):
    s = stages(context=4096, **kw)
    b, gpu = s.budget, find_gpu(kw["gpu"])
    want_gmu = gmu if gmu is not None else engine_assumptions(s.r.engine).gpu_memory_utilization
    reserved = gpu.memory_reserved_mib if gpu.memory_reserved_mib is not None else default_memory_reserved_mib()
    assert b.gpu_memory_utilization == want_gmu
    assert b.card_bytes == pytest.approx((gpu.memory_bytes - reserved * 2**20) * want_gmu)
    assert b.card_bytes < gpu.memory_bytes


def test_llamacpp_keeps_an_untied_embedding_table_off_the_gpu_vllm_loads_it():
    vllm = stages(model="qwen2.5-7b-instruct", quant="bf16", gpu="a100-sxm4-80gb", context=4096)
    gguf = stages(model="qwen2.5-7b-instruct", quant="q8_0", gpu="a100-sxm4-80gb", context=4096)
    w = gguf.r.weights
    assert vllm.budget.weights_gpu_bytes == vllm.r.weights.total_bytes
    assert gguf.budget.weights_gpu_bytes == w.total_bytes - w.embed_bytes
    assert w.embed_bytes > 0.5 * GB


def test_a_quadro_rtx_8000_plans_with_the_memory_nvidia_smi_shows_with_ecc_on():
    """A Quadro RTX 8000 runs with ECC on: nvidia-smi shows 45556 MiB (driver 460.39) or 46080 MiB (610.43)
    of its 48 GiB. A plan that budgets the full 49152 MiB promises memory the card does not give."""
    from llmfleet.knowledge.catalog import find_gpu

    gpu = find_gpu("quadro-rtx-8000")
    assert gpu.memory_mib <= 46080  # ECC on keeps at least 1/16 of 49152 MiB
    s = stages(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="quadro-rtx-8000", context=8192)
    assert s.budget.card_bytes <= 46080 * 2**20 * s.budget.gpu_memory_utilization
