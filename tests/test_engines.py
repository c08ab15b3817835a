"""Engine knowledge, one module per engine: the interface, the KV layout a build keeps for
sliding-window layers, the Marlin floor as one source, the flags for a plan, and the flag rules the
planner runs its alternatives through."""

from __future__ import annotations

import pytest

from llmfleet.errors import UsageError
from llmfleet.knowledge import compat, engines
from llmfleet.knowledge.engines import llamacpp, vllm

CAT = compat.load_engine_catalog()


def rel(key: str) -> compat.EngineRelease:
    r = CAT.release(key)
    assert r is not None
    return r


def test_every_catalog_engine_has_a_knowledge_module_and_the_interface_says_what_a_new_one_needs():
    assert set(engines.names()) == set(CAT.engines)
    for name in engines.names():
        k = engines.for_engine(name)
        assert k.name == name and k.label and k.health_path.startswith("/")
        # the fields fleet.metrics.EngineMetrics reads, every one named by every engine
        from dataclasses import fields

        from llmfleet.fleet.metrics import EngineMetrics
        assert set(k.metrics) == {f.name for f in fields(EngineMetrics)}
    doc = engines.base.__doc__ or ""
    for must in ("catalog/engines.yaml", "roles/<name>", "EngineKnowledge", "kv_layout", "engine_args", "lab image"):
        assert must in doc, must
    with pytest.raises(UsageError, match="unknown engine 'sglang'"):
        engines.for_engine("sglang")


@pytest.mark.parametrize(
    ("key", "cc", "layout"),
    [
        # llama.cpp keeps the full context on sliding-window layers before its SWA cache (PR #13194,
        # merged 2025-05-20, after b5000): Gemma-2/3 need the full KV there
        ("llamacpp:b5000-cu122", "6.1", "full"),
        ("llamacpp:server-cuda-12.8", "8.6", "window"),
        # vLLM V1 has the hybrid allocator (PR #17996); V0 (below v1_min_cc until 0.10.1) does not (RFC #11382)
        ("vllm:0.10.1.1", "8.0", "window"),
        ("vllm:0.10.1.1", "7.5", "full"),
        ("vllm:0.9.2", "7.5", "full"),
        ("vllm:0.19.1", "7.0", "window"),
    ],
)
def test_kv_layout_per_build_and_card(key, cc, layout):
    r = rel(key)
    got = engines.for_engine(r.engine).kv_layout(r, cc)
    assert got is not None and got.sliding_window == layout, got
    assert got.source and got.confidence in "HMU"


def test_every_gpu_release_says_its_kv_layout_with_a_source():
    for key, r in CAT.images.items():
        if not r.cpu:
            assert r.kv_layout is not None and r.kv_layout.source, key


@pytest.mark.parametrize(
    ("key", "cc", "method"),
    [
        # the Marlin floor is the release's own: 8.0 in 0.10.1.1, 7.5 from the newer fp8.md (s2.4)
        ("vllm:0.10.1.1", "7.5", "gptq"),
        ("vllm:0.10.1.1", "8.0", "gptq_marlin"),
        ("vllm:0.19.1", "7.5", "gptq_marlin"),
        ("vllm:0.19.1", "7.0", "gptq"),
    ],
)
def test_the_marlin_floor_comes_from_the_release(key, cc, method):
    r = rel(key)
    assert compat.quant_method_for(r, CAT.engines["vllm"], "gptq-int4", [], cc) == method
    assert vllm.marlin_min_cc(r) == r.quantizations["gptq_marlin"]


def test_vllm_flags_for_a_plan():
    args = engines.for_engine("vllm").engine_args(
        quantization="gptq", float16=True, gpu_memory_utilization=0.9, context=8192, concurrency=4, kv_flag="auto",
        gpus=2, attention_backend="FLASH_ATTN")
    assert args == ["--quantization", "gptq", "--dtype", "float16", "--gpu-memory-utilization", "0.90",
                    "--max-model-len", "8192", "--max-num-seqs", "4", "--kv-cache-dtype", "auto",
                    "--tensor-parallel-size", "2", "--attention-backend", "FLASH_ATTN"]


def test_llamacpp_flags_add_flash_attention_for_a_quantized_v_cache_where_it_is_off_by_default():
    k = engines.for_engine("llamacpp")
    common = {"num_layers": 28, "resident": True, "gpu_layers": 0, "context": 4096, "concurrency": 2,
              "kv_flag": "q8_0", "rules": CAT.engines["llamacpp"]}
    old = k.engine_args(release=rel("llamacpp:b5000-cu122"), **common)
    new = k.engine_args(release=rel("llamacpp:server-cuda-12.8"), **common)
    assert old[-1] == "-fa" and "-fa" not in new  # bare switch on b5000; auto is the default on newer builds
    assert old[:6] == ["-ngl", "29", "-c", "8192", "-np", "2"]
    for r, args in ((rel("llamacpp:b5000-cu122"), old), (rel("llamacpp:server-cuda-12.8"), new)):
        v = compat.check_kv_dtype(r, CAT.engines["llamacpp"], "q8_0", args, {}, "6.1")
        assert v.status == "pass", v
        assert compat.check_attention(r, args, {}, "6.1").status == "pass"


@pytest.mark.parametrize(
    ("key", "backend", "kv", "cc", "status"),
    [
        ("vllm:0.19.1", "TRITON_ATTN", "fp8", "7.0", "fail"),   # vllm#26431, #7714
        ("vllm:0.19.1", "TRITON_ATTN", "fp8", "7.5", "fail"),
        ("vllm:0.19.1", "TRITON_ATTN", "fp8", "8.6", "fail"),
        ("vllm:0.19.1", "TRITON_ATTN", "fp8", "8.9", "pass"),
        ("vllm:0.19.1", "FLASH_ATTN", "fp8", "9.0", "pass"),    # FA3, vllm PR #15191
        ("vllm:0.19.1", "FLASH_ATTN", "fp8", "8.0", "fail"),    # FA2
        ("vllm:0.19.1", "FLASH_ATTN", "fp8_e5m2", "9.0", "fail"),
        ("vllm:0.19.1", "FLASHINFER", "fp8", "8.0", "warn"),    # unconfirmed: never a silent pass
        ("vllm:0.19.1", "TRITON_ATTN", "auto", "7.0", "pass"),
    ],
)
def test_kv_dtype_verdict_is_a_pure_rule(key, backend, kv, cc, status):
    assert vllm.kv_dtype_verdict(rel(key), backend, kv, cc).status == status


@pytest.mark.parametrize(
    ("key", "kv_v", "fa", "status"),
    [
        ("llamacpp:b5000-cu122", "q8_0", None, "fail"),   # off by default: absent -fa counts as off
        ("llamacpp:b5000-cu122", "q8_0", "bare", "pass"),
        ("llamacpp:server-cuda-12.8", "q8_0", None, "pass"),  # -fa auto by default
        ("llamacpp:server-cuda-12.8", "q4_0", "off", "fail"),
        ("llamacpp:server-cuda-12.8", "f16", "off", "pass"),
    ],
)
def test_v_cache_verdict_is_a_pure_rule(key, kv_v, fa, status):
    assert llamacpp.v_cache_verdict(rel(key), CAT.engines["llamacpp"], kv_v, fa).status == status


def test_flag_checks_gives_the_preflight_rules_for_one_set_of_flags():
    """What the planner runs every ranked alternative through: the same rules as the preflight."""
    r = rel("vllm:0.19.1")
    got = compat.flag_checks(r, CAT.engines["vllm"], quant="gptq-int4", kv_dtype="fp8",
                             args=["--dtype", "float16"], env={}, cc="7.5")
    assert set(got) == {"quant", "dtype", "attention", "kv-dtype"}
    assert got["kv-dtype"].status == "fail" and got["quant"].status == "pass"
