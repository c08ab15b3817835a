"""The capacity planner against published and measured numbers (pure: no host, no network).

Sources of the expected figures: the field reports in the seeds (27B FP16 = 54 GB does not fit a
32 GB V100; INT4 = 14-16 GB fits with KV room; 900 GB/s / 14 GB = 64 tok/s), llama.cpp's
tools/quantize/README.md (Llama-3.1-8B GGUF sizes), model configs (KV bytes per token), vLLM's KV
pool rule, and llama-bench runs on an H200 (decode speed, memory in use, partial offload).
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmfleet.errors import UsageError
from llmfleet.knowledge.catalog import (
    FULL,
    LINEAR,
    SLIDING,
    default_memory_reserved_mib,
    find_gpu,
    find_model,
    find_quant,
    ggml_type_bits,
    load_models,
)
from llmfleet.knowledge.planner import (
    PlanRequest,
    compute_weights,
    decode_ceiling,
    decode_speed,
    kv_layout,
    plan,
    plan_for_service,
)

REPO = Path(__file__).resolve().parents[1]
GB, GIB, KIB = 1e9, 2**30, 1024


def P(model, quant=None, gpu="v100-sxm2-32gb", **kw):
    return plan(PlanRequest(model=model, quant=quant, gpu=gpu, **kw))


# ------------------------------------------------------------------------------- the seeds' arithmetic


@pytest.mark.parametrize("model", ["gemma-2-27b-it", "gemma-3-27b-it", "qwen3.5-27b"])
@pytest.mark.parametrize("quant", ["fp16", "bf16"])
def test_a_27b_model_in_16_bit_does_not_fit_a_32gb_v100(model, quant):
    p = P(model, quant, context=4096)
    assert 52 * GB <= p.weights_bytes <= 56 * GB  # "27B x 2 bytes = 54 GB"
    assert not p.fits and not p.resident
    assert p.notes[0].startswith("REFUSED"), p.notes
    assert 0 < p.gpu_layers < p.total_layers  # the device_map=auto failure: part of the layers only
    assert p.decode_tokps_realistic[1] < 5  # the seeds saw 4 tok/s; PCIe-bound


@pytest.mark.parametrize(
    ("model", "quant", "engine"),
    [("gemma-2-27b-it", "gptq-int4", "vllm"), ("gemma-2-27b-it", "q4_k_m", "llamacpp"),
     ("qwen3.5-27b", "gptq-int4", "vllm"), ("gemma-3-27b-it", "q4_k_m", "llamacpp")],
)
def test_int4_27b_fits_a_32gb_v100_with_room_for_kv(model, quant, engine):
    p = P(model, quant, engine=engine, context=4096)
    # "INT4 ~14-16 GB" (+ 16-bit embeddings of large vocabularies; Qwen3.5 also loads its vision tower)
    assert 14 * GB <= p.weights_gpu_bytes <= (20 if model == "qwen3.5-27b" else 18) * GB
    assert p.fits and p.resident
    assert p.max_concurrency >= 4  # KV room left for several 4k sequences
    assert p.max_context_tokens >= 8192


def test_int8_27b_fits_only_with_a_cramped_kv_cache():
    p = P("gemma-2-27b-it", "int8", context=4096, gpu_memory_utilization=0.95)  # the seeds' setting
    assert 27 * GB <= p.weights_bytes <= 30 * GB
    assert p.resident and p.max_context_tokens < 8192  # "barely fits, KV cache very tight"
    # and vLLM has no INT8 W8A8 kernel on Volta (needs compute capability 7.5): the preflight's rule
    assert not p.fits and "REFUSED by the preflight's rules" in p.notes[0] and "int8" in p.notes[0]


def test_decode_ceiling_is_bandwidth_over_bytes_read():
    assert decode_ceiling(900, 14e9) == pytest.approx(64.3, abs=0.1)  # the seeds' 900 GB/s / 14 GB
    p = P("gemma-2-27b-it", "gptq-int4", context=4096)
    w = compute_weights(find_model("gemma-2-27b-it"), find_quant("gptq-int4"))
    kv = kv_layout(find_model("gemma-2-27b-it"), 2.0, block_size=16).per_sequence(4096)
    assert p.decode_tokps_ceiling == pytest.approx(900e9 / (w.read_per_token + kv), rel=1e-3)
    lo, hi = p.decode_tokps_realistic
    s = decode_speed("vllm", 900, "hbm2", w.read_per_token + kv, 46)  # the speed model on the same bytes
    assert (lo, hi) == (pytest.approx(s.low, rel=1e-3), pytest.approx(s.high, rel=1e-3))
    assert hi < p.decode_tokps_ceiling


# ------------------------------------------------------------------------------ published references


@pytest.mark.parametrize(
    ("model", "kv_dtype", "engine", "per_token"),
    [
        ("qwen2.5-32b-instruct", "auto", "vllm", 256 * KIB),  # 2 x 64 x 8 x 128 x 2 B
        ("qwen2.5-32b-instruct", "fp8", "vllm", 128 * KIB),
        ("qwen2.5-14b-instruct", "auto", "vllm", 192 * KIB),
        ("qwen2.5-7b-instruct", "auto", "vllm", 56 * KIB),
        ("qwen3-32b", "auto", "vllm", 256 * KIB),
        ("llama-3.1-8b-instruct", "auto", "vllm", 128 * KIB),
        ("llama-3.1-70b-instruct", "q8_0", "llamacpp", 2 * 80 * 8 * 128 * 1.0625),
        ("qwen3.5-27b", "auto", "vllm", 64 * KIB),  # only the 16 full-attention layers
        ("gemma-3-27b-it", "auto", "vllm", 80 * KIB),  # 10 global layers; 52 sliding ones apart
    ],
)
def test_kv_bytes_per_token(model, kv_dtype, engine, per_token):
    quant = "q4_k_m" if engine == "llamacpp" else "gptq-int4"
    p = P(model, quant, gpu="h200-141gb", engine=engine, kv_dtype=kv_dtype, context=4096)
    assert p.kv_bytes_per_token == int(per_token)


@pytest.mark.parametrize(
    ("quant", "gib", "bpw"),  # llama.cpp tools/quantize/README.md, Llama-3.1-8B
    [("q4_k_m", 4.58, 4.8944), ("q4_k_s", 4.36, 4.6672), ("q5_k_m", 5.33, 5.7036), ("q6_k", 6.14, 6.5633), ("q8_0", 7.95, 8.5008),
     ("f16-gguf", 14.96, 16.0005)],
)
def test_gguf_sizes_match_llama_cpp_published_figures(quant, gib, bpw):
    w = compute_weights(find_model("llama-3.1-8b-instruct"), find_quant(quant))
    assert w.total_bytes / GIB == pytest.approx(gib, abs=0.01)
    assert w.total_bytes * 8 / w.params == pytest.approx(bpw, abs=0.002)


def test_ggml_bits_per_weight_match_the_gguf_package():
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for name, bits in ggml_type_bits().items():
        elems, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]]
        assert bits == pytest.approx(8 * nbytes / elems), name


@pytest.mark.parametrize("model", [m.name for m in load_models()])
def test_computed_parameter_counts_match_the_model_cards(model):
    m = find_model(model)
    w = compute_weights(m, find_quant("bf16"))
    # DeepSeek-V3's 671B leaves out its MTP module (685B with it: model card)
    params = w.params - (w.mtp_bytes // 2 if m.name == "deepseek-v3" else 0)
    assert params == pytest.approx(m.params_published, rel=0.015)


def test_vllm_kv_pool_follows_its_formula():
    # KV pool = CUDA-visible total x gpu_memory_utilization - weights - overhead; tokens rounded down
    # to blocks. The CUDA-visible total is memory.total less the driver's reservation.
    gpu = find_gpu("h100-sxm-80gb")
    p = P("qwen2.5-7b-instruct", "bf16", gpu=gpu.id, context=8192, gpu_memory_utilization=0.9)
    pool = (gpu.memory_bytes - default_memory_reserved_mib() * 2**20) * 0.9 - p.weights_bytes - p.overhead_bytes
    tokens = int(pool // (56 * KIB))
    assert p.kv_cache_tokens == tokens - tokens % 16
    assert p.max_concurrency == int(pool // (56 * KIB * 8192))
    assert "--gpu-memory-utilization" in p.engine_args


def test_measured_llama_cpp_memory_in_use_is_predicted_within_3_percent():
    # H200, Qwen2.5-32B shape Q4_0, f16 KV: peak memory.used 18.87 GB at ~256 tokens, 23.38 GB at ~16,640.
    for ctx, measured in ((256, 18.87e9), (16640, 23.38e9)):
        p = P("qwen2.5-32b-instruct", "q4_0", gpu="h200-141gb", context=ctx)
        used = p.weights_gpu_bytes + p.overhead_bytes + p.kv_cache_bytes
        assert used == pytest.approx(measured, rel=0.03), ctx


@pytest.mark.parametrize(
    ("model", "measured"),  # llama-bench tg128 on an H200, flash-attn off and on
    [("qwen2.5-32b-instruct", (81.3, 92.7)), ("qwen2.5-7b-instruct", (272, 312))],
)
def test_measured_llama_cpp_decode_speed_lies_in_the_realistic_range(model, measured):
    p = P(model, "q4_0", gpu="h200-141gb", context=128)
    lo, hi = p.decode_tokps_realistic
    for m in measured:
        assert lo <= m <= hi, (m, p.decode_tokps_realistic)
    assert p.decode_tokps_ceiling > 2.5 * max(measured)  # the raw ceiling would promise ~3x too much


@pytest.mark.parametrize(
    ("model", "measured"),  # bench/planner_decode_bench.py on an H200: graph-captured bf16 decode step
    [("qwen2.5-32b-instruct", 52.3), ("qwen2.5-7b-instruct", 192.2)],
)
def test_measured_bf16_decode_step_lies_in_the_vllm_range(model, measured):
    p = P(model, "bf16", gpu="h200-141gb", context=128)
    lo, hi = p.decode_tokps_realistic
    assert lo <= measured <= hi, (measured, p.decode_tokps_realistic)


@pytest.mark.parametrize(("on_gpu_share", "measured"), [(7 / 8, 20.8), (1 / 2, 6.9)])
def test_measured_partial_offload_speed_lies_in_the_offload_range(on_gpu_share, measured):
    spec = find_model("qwen2.5-32b-instruct")
    w = compute_weights(spec, find_quant("q4_0"))
    h200 = find_gpu("h200-141gb")
    # A card just big enough for that share of the layers (plus output, overhead and a 512-token KV).
    need = w.layer_bytes * on_gpu_share + (w.read_per_token - w.layer_bytes) + 0.81e9 + 512 * 262144 * 1.05
    card = dataclasses.replace(h200, memory_mib=int(need / 0.95 / 2**20) + 1 + h200.memory_reserved_mib)
    refused = P(spec, "q4_0", gpu=card, context=512)
    assert not refused.fits and refused.notes[0].startswith("REFUSED")
    accepted = P(spec, "q4_0", gpu=card, context=512, offload=True)
    assert accepted.fits and not accepted.resident
    assert accepted.gpu_layers == pytest.approx(64 * on_gpu_share, abs=1)
    lo, hi = accepted.decode_tokps_realistic
    assert lo <= measured <= hi, (measured, accepted.decode_tokps_realistic)
    assert "offload" in accepted.assumptions
    assert accepted.engine_args[accepted.engine_args.index("-ngl") + 1] == str(accepted.gpu_layers)


# ------------------------------------------------------------------------------------ hybrid models


def test_linear_attention_layers_keep_no_kv_cache():
    spec = find_model("qwen3.5-27b")
    assert spec.count(FULL) == 16 and spec.count(LINEAR) == 48
    lay = kv_layout(spec, 2.0)
    assert lay.full_bytes_per_token == 2 * 16 * 4 * 256 * 2
    assert lay.state_bytes_per_sequence > 0  # a fixed recurrent state per sequence
    grow = lay.per_sequence(65536) - lay.per_sequence(32768)
    assert grow == 32768 * 64 * KIB  # growth comes from the full-attention layers only
    p = P("qwen3.5-27b", "gptq-int4", gpu="h200-141gb", context=32768)
    assert p.kv_state_bytes_per_sequence == int(lay.state_bytes_per_sequence)
    assert any("linear attention" in n for n in p.notes)


def test_sliding_window_layers_stop_growing_at_their_window():
    spec = find_model("gemma-3-27b-it")
    assert spec.count(FULL) == 10 and spec.count(SLIDING) == 52
    lay = kv_layout(spec, 2.0)
    per_layer = 2 * 16 * 128 * 2
    assert lay.per_sequence(512) == 512 * 62 * per_layer  # inside the window every layer grows
    assert lay.per_sequence(65536) - lay.per_sequence(32768) == 32768 * 10 * per_layer
    naive = 32768 * 62 * per_layer
    assert lay.per_sequence(32768) < naive / 4  # 2.5 GiB + 52 windows instead of 15.5 GiB


def test_hybrid_model_fits_far_more_context_than_a_dense_one_of_the_same_size():
    hybrid = P("qwen3.5-27b", "gptq-int4", concurrency=1)
    dense = P("qwen2.5-32b-instruct", "gptq-int4", concurrency=1)
    assert hybrid.max_context_tokens > 4 * dense.max_context_tokens


# ------------------------------------------------------------------------------------ alternatives


def _apply(req: PlanRequest, change: dict) -> PlanRequest:
    return dataclasses.replace(req, **change)


@pytest.mark.parametrize(
    ("req", "first"),
    [
        # weights do not fit: a smaller quantization first (the least lossy one that fits)
        (PlanRequest(model="qwen3.5-27b", quant="bf16", gpu="v100-sxm2-32gb", context=4096), {"quant": "gptq-int4"}),
        (PlanRequest(model="qwen2.5-7b-instruct", quant="fp16", gpu="t4", context=4096), {"quant": "int8"}),
        (PlanRequest(model="qwen2.5-32b-instruct", quant="q8_0", gpu="rtx-4090", context=4096), {"quant": "q4_k_m"}),
        # weights fit, the KV cache does not: a smaller KV dtype, then a shorter context
        (PlanRequest(model="qwen2.5-14b-instruct", quant="gptq-int4", gpu="rtx-4090", context=32768, concurrency=2),
         {"kv_dtype": "fp8"}),
    ],
)
def test_alternatives_are_ranked_and_each_one_fits(req, first):
    p = plan(req)
    assert not p.fits
    alts = p.alternatives
    assert alts and [a["rank"] for a in alts] == list(range(1, len(alts) + 1))
    assert alts[0]["change"] == first
    for a in alts:
        assert plan(_apply(req, a["change"])).fits, a
    kinds = [next(iter(a["change"])) for a in alts]
    if "offload" in kinds:
        assert kinds[-1] == "offload"  # slow: always last


def test_no_alternatives_when_it_fits():
    assert P("qwen2.5-7b-instruct", "gptq-int4", context=4096).alternatives == []


# ------------------------------------------------------------------------------------ engine flags


def _flag(args, name):
    return args[args.index(name) + 1]


def test_vllm_flags_on_a_v100():
    p = P("qwen2.5-32b-instruct", "gptq-int4", context=8192, concurrency=2)
    a = p.engine_args
    assert _flag(a, "--quantization") == "gptq"  # no Marlin below CC 8.0
    assert _flag(a, "--dtype") == "float16"  # no bf16 on Volta
    assert _flag(a, "--max-model-len") == "8192" and _flag(a, "--max-num-seqs") == "2"
    assert _flag(a, "--tensor-parallel-size") == "1" and _flag(a, "--kv-cache-dtype") == "auto"
    assert _flag(a, "--gpu-memory-utilization") == "0.90"
    assert "--cpu-offload-gb" not in a


def test_vllm_flags_on_an_a100_with_tensor_parallel():
    p = P("qwen2.5-32b-instruct", "gptq-int4", gpu="a100-sxm4-80gb", gpus=2, context=8192, kv_dtype="fp8")
    a = p.engine_args
    assert _flag(a, "--quantization") == "gptq_marlin" and "--dtype" not in a
    assert _flag(a, "--tensor-parallel-size") == "2" and _flag(a, "--kv-cache-dtype") == "fp8"


def test_llama_cpp_flags_put_every_layer_on_the_gpu():
    p = P("qwen2.5-14b-instruct", "q4_k_m", context=8192, concurrency=3, kv_dtype="q8_0")
    a = p.engine_args
    assert int(_flag(a, "-ngl")) == 48 + 1  # every block and the output layer
    assert _flag(a, "-c") == str(8192 * 3) and _flag(a, "-np") == "3"  # -c is shared by the slots
    assert _flag(a, "-ctk") == _flag(a, "-ctv") == "q8_0"
    # server-cuda builds turn flash attention on by themselves (-fa auto): no flag needed
    assert p.image == "llamacpp:server-cuda-12.8" and "-fa" not in a and p.preflight["kv-dtype"]["status"] == "pass"


def test_a_quantized_v_cache_on_a_build_without_flash_attention_by_default_gets_a_bare_fa():
    # llama.cpp refuses a quantized V cache without flash attention; b5000 takes a bare -fa switch
    # and has it off unless given (engines.yaml llamacpp:b5000-cu122 flash_attn_flag: bare).
    p = P("qwen2.5-14b-instruct", "q4_k_m", context=8192, kv_dtype="q8_0", image="llamacpp:b5000-cu122")
    assert "-fa" in p.engine_args and p.engine_args[p.engine_args.index("-fa") + 1 : p.engine_args.index("-fa") + 2] != ["on"]
    assert p.fits and all(v["status"] == "pass" for v in p.preflight.values()), p.preflight


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
def test_plan_flags_are_all_known_to_the_engine_role(engine):
    from llmfleet.release.render import load_role, merge_engine_args, plan_engine_args, split_flags

    quant = "q4_k_m" if engine == "llamacpp" else "gptq-int4"
    p = P("qwen2.5-14b-instruct", quant, engine=engine, context=4096, kv_dtype="fp8" if engine == "vllm" else "q8_0")
    role = load_role(engine)
    for name, values in split_flags(plan_engine_args(p), role):
        flag = role.flag(name)
        assert flag is not None, name
        assert len(values) == (1 if flag.value else 0), name
    assert merge_engine_args(plan_engine_args(p), [], role) == p.engine_args


def test_tensor_parallel_must_split_the_heads_evenly():
    p = P("qwen2.5-32b-instruct", "bf16", gpu="a100-sxm4-80gb", gpus=3, context=4096)
    assert not p.fits and "split evenly" in p.notes[0]


def test_tensor_parallel_spreads_weights_and_kv():
    one = P("llama-3.1-70b-instruct", "gptq-int4", gpu="a100-sxm4-80gb", context=8192)
    two = P("llama-3.1-70b-instruct", "gptq-int4", gpu="a100-sxm4-80gb", gpus=2, context=8192)
    assert two.max_concurrency > 2 * one.max_concurrency
    assert two.decode_tokps_ceiling > one.decode_tokps_ceiling


# ------------------------------------------------------------------------------------ inputs and errors


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"model": "no-such-model"}, "known: qwen2.5-7b-instruct"),
        ({"quant": "q3_weird"}, "known: fp16"),
        ({"gpu": "GeForce 256"}, "known (id or nvidia-smi name): v100-sxm2-32gb"),
        ({"engine": "tgi"}, "known: vllm, llamacpp"),
        ({"kv_dtype": "int3"}, "known: auto"),
        ({"engine": "llamacpp", "quant": "gptq-int4"}, "llama.cpp serves GGUF files"),
        ({"context": 0}, "--context"),
        ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization"),
    ],
)
def test_bad_inputs_are_one_line_errors_listing_what_is_known(kw, needle):
    base = {"model": "qwen2.5-7b-instruct", "quant": "gptq-int4", "gpu": "t4"} | kw
    with pytest.raises(UsageError) as exc:
        plan(PlanRequest(**base))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"), ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("t4", "t4")],
)
def test_gpu_by_catalog_id_or_nvidia_smi_name(name, expected):
    assert P("qwen2.5-7b-instruct", "GPTQ-INT4", gpu=name, context=4096).gpu == expected


def test_quant_names_are_case_insensitive_and_take_a_group_size():
    g128 = P("qwen2.5-32b-instruct", "GPTQ-Int4", context=4096)
    g32 = P("qwen2.5-32b-instruct", "gptq-int4-g32", context=4096)
    assert g32.weights_bytes > g128.weights_bytes  # more scales and zeros
    assert g32.quant == "gptq-int4-g32"


def test_catalog_model_by_hugging_face_id():
    assert P("Qwen/Qwen2.5-7B-Instruct", "gptq-int4", context=4096).model == "qwen2.5-7b-instruct"


def test_no_context_plans_the_most_that_fits():
    p = P("qwen2.5-7b-instruct", "gptq-int4")
    assert p.context == min(32768, p.max_context_tokens - p.max_context_tokens % 256)
    assert p.fits


# ------------------------------------------------------------------------------------ model files


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """A real safetensors file (via the safetensors package); returns the data bytes."""
    from safetensors.numpy import save_file

    dt = {"F16": np.float16, "F32": np.float32, "I32": np.int32}
    arrays = {k: np.zeros(shape, dtype=dt[d]) for k, (d, shape) in tensors.items()}
    save_file(arrays, str(path))
    return sum(a.nbytes for a in arrays.values())


def _tiny_config(**extra):
    cfg = {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 2048,
           "tie_word_embeddings": False, "torch_dtype": "float16"}
    cfg.update(extra)
    return cfg


def _tiny_tensors(prefix="model.", layers=2, tied=False):
    t = {f"{prefix}embed_tokens.weight": ("F16", (256, 64)), f"{prefix}norm.weight": ("F16", (64,))}
    for i in range(layers):
        b = f"{prefix}layers.{i}."
        t |= {b + "self_attn.q_proj.weight": ("F16", (64, 64)), b + "self_attn.k_proj.weight": ("F16", (32, 64)),
              b + "self_attn.v_proj.weight": ("F16", (32, 64)), b + "self_attn.o_proj.weight": ("F16", (64, 64)),
              b + "mlp.gate_proj.weight": ("F16", (128, 64)), b + "mlp.up_proj.weight": ("F16", (128, 64)),
              b + "mlp.down_proj.weight": ("F16", (64, 128)), b + "input_layernorm.weight": ("F16", (64,)),
              b + "post_attention_layernorm.weight": ("F16", (64,))}
    if not tied:
        t["lm_head.weight"] = ("F16", (256, 64))
    return t


def test_hf_folder_uses_the_real_safetensors_sizes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_tiny_config()))
    tensors = _tiny_tensors()
    half = dict(list(tensors.items())[:10])
    nbytes = _write_safetensors(tmp_path / "model-00001-of-00002.safetensors", half)
    nbytes += _write_safetensors(tmp_path / "model-00002-of-00002.safetensors",
                                 {k: v for k, v in tensors.items() if k not in half})
    p = P(str(tmp_path), gpu="t4", context=1024)
    assert p.model_origin == "hf" and p.quant == "fp16" and p.engine == "vllm"
    assert p.weights_bytes == nbytes
    assert p.params == sum(math.prod(s) for _, s in tensors.values())
    assert p.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2  # 2 layers x 2 KV heads x head_dim 16
    assert "safetensors" in p.weights_source
    # the same folder planned as another quant: sizes computed from the shapes instead
    q = P(str(tmp_path), "gptq-int4", gpu="t4", context=1024)
    assert q.weights_bytes < p.weights_bytes and q.weights_source.startswith("computed")


def test_hf_multimodal_wrapper_reads_text_config_and_keeps_vision_16bit(tmp_path):
    cfg = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
           "text_config": _tiny_config(model_type="gemma3_text", sliding_window=512, num_hidden_layers=6,
                                       tie_word_embeddings=True),
           "vision_config": {"hidden_size": 32}, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tensors = _tiny_tensors("language_model.model.", layers=6, tied=True)
    tensors["vision_tower.encoder.weight"] = ("F16", (32, 32))
    nbytes = _write_safetensors(tmp_path / "model.safetensors", tensors)
    from llmfleet.knowledge.modelinfo import read_model

    spec = read_model(tmp_path)
    assert spec.num_layers == 6 and spec.hidden == 64 and spec.tie_embeddings
    assert spec.layer_types == (SLIDING,) * 5 + (FULL,)  # gemma3: 5 local : 1 global
    assert spec.vision_params == 32 * 32
    p = P(str(tmp_path), gpu="a100-sxm4-80gb", context=1024)
    assert p.quant == "bf16" and p.weights_bytes == nbytes
    assert p.kv_sliding_window == 512


def test_hf_hybrid_config_lists_its_layer_types(tmp_path):
    types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2
    cfg = _tiny_config(model_type="qwen3_5_text", num_hidden_layers=8, layer_types=types, head_dim=32,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=16, linear_conv_kernel_dim=4)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    p = P(str(tmp_path), "bf16", gpu="h200-141gb", context=2048)
    assert p.kv_bytes_per_token == 2 * 2 * 2 * 32 * 2  # the 2 full-attention layers only
    assert p.kv_state_bytes_per_sequence > 0
    assert "no weight files" in find_model_or_spec(tmp_path).sources[0]


def find_model_or_spec(path):
    from llmfleet.knowledge.modelinfo import read_model

    return read_model(path)


def test_hf_gptq_folder_takes_quant_and_group_size_from_its_config(tmp_path):
    cfg = _tiny_config(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 32})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    index = {"metadata": {"total_size": 123456}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    p = P(str(tmp_path), gpu="t4", context=1024)
    assert p.quant == "gptq-int4-g32" and p.weights_bytes == 123456
    # the default, the newest catalog vLLM (0.34.0; its floors as vllm:0.20.0), has Marlin from compute
    # capability 7.5 (engines.yaml quantizations.gptq_marlin)
    assert p.image == "vllm:0.34.0" and _flag(p.engine_args, "--quantization") == "gptq_marlin"
    old = P(str(tmp_path), gpu="t4", context=1024, image="vllm:0.10.1.1")  # Marlin from 8.0 there
    assert _flag(old.engine_args, "--quantization") == "gptq"


@pytest.mark.parametrize("bad", ["{not json", "[]", json.dumps({"hidden_size": 64})])
def test_a_broken_config_is_a_one_line_error_naming_the_file(tmp_path, bad):
    (tmp_path / "config.json").write_text(bad)
    with pytest.raises(UsageError) as exc:
        P(str(tmp_path), gpu="t4")
    assert "config.json" in str(exc.value) and "\n" not in str(exc.value)


def test_a_truncated_safetensors_file_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_tiny_config()))
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(UsageError, match="model.safetensors"):
        P(str(tmp_path), gpu="t4")


def _write_gguf(path: Path, *, file_type=7, qtype="Q8_0", layers=2, ssm_layers=(), tied=False, arch="llama"):
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFWriter
    from gguf.quants import quantize

    w = GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(layers)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_feed_forward_length(128)
    w.add_context_length(4096)
    w.add_file_type(file_type)
    q = T[qtype]
    total = 0

    def add(name, shape, t=q):
        nonlocal total
        a = np.zeros(shape, dtype=np.float32)
        data = a if t == T.F32 else quantize(a, t)
        w.add_tensor(name, data, raw_dtype=None if t == T.F32 else t)
        total += data.nbytes

    add("token_embd.weight", (256, 64))
    for i in range(layers):
        if i in ssm_layers:
            add(f"blk.{i}.ssm_in.weight", (128, 64))
            add(f"blk.{i}.ssm_out.weight", (64, 64))
        else:
            for n, s in (("attn_q", (64, 64)), ("attn_k", (32, 64)), ("attn_v", (32, 64)), ("attn_output", (64, 64))):
                add(f"blk.{i}.{n}.weight", s)
        for n, s in (("ffn_gate", (128, 64)), ("ffn_up", (128, 64)), ("ffn_down", (64, 128))):
            add(f"blk.{i}.{n}.weight", s)
        add(f"blk.{i}.attn_norm.weight", (64,), T.F32)
    add("output_norm.weight", (64,), T.F32)
    if not tied:
        add("output.weight", (256, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return total


def test_gguf_file_brings_its_sizes_quant_and_architecture(tmp_path):
    f = tmp_path / "tiny-q8_0.gguf"
    nbytes = _write_gguf(f)
    p = P(str(f), gpu="t4", context=1024)  # no --quant, no --engine: taken from the file
    assert p.model_origin == "gguf" and p.quant == "q8_0" and p.engine == "llamacpp"
    assert p.weights_bytes == nbytes
    assert p.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2
    assert int(_flag(p.engine_args, "-ngl")) == 3
    assert "GGUF tensor table" in p.weights_source
    # the file's real size equals what the catalog's bits per weight compute for these shapes
    from llmfleet.knowledge.modelinfo import read_model

    spec = read_model(f)
    assert compute_weights(spec, find_quant("q8_0")).total_bytes == pytest.approx(nbytes, rel=0.01)


def test_gguf_hybrid_file_linear_blocks_keep_no_kv(tmp_path):
    f = tmp_path / "tiny-hybrid.gguf"
    _write_gguf(f, layers=4, ssm_layers=(0, 1, 2))
    p = P(str(f), gpu="t4", context=1024)
    assert p.kv_bytes_per_token == 1 * 2 * 2 * 16 * 2  # one attention block


def test_gguf_file_of_a_type_outside_the_catalog_still_plans(tmp_path):
    f = tmp_path / "tiny-q5_0.gguf"
    nbytes = _write_gguf(f, file_type=8, qtype="Q5_0")
    p = P(str(f), gpu="t4", context=1024)
    assert p.quant == "gguf-q5_0" and p.weights_bytes == nbytes and p.fits


def test_a_missing_path_or_a_non_gguf_file_is_an_error(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        P(str(tmp_path / "absent.gguf"), gpu="t4")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(UsageError, match="bad.gguf"):
        P(str(bad), gpu="t4")


# ------------------------------------------------------------------------------------ plan_for_service


def _service(**kw):
    from llmfleet.inventory.services import Service

    base = {"name": "chat", "engine": "vllm", "model": "qwen2.5-32b-instruct", "model_path": "/srv/models/q",
            "image": "vllm:x", "quant": "gptq-int4", "context": 8192, "concurrency": 2}
    return Service(**(base | kw))


def test_plan_for_service_uses_the_service_fields():
    p = plan_for_service(_service(), find_gpu("v100-sxm2-32gb"), 1)
    assert p.fits and p.context == 8192 and p.concurrency == 2 and p.engine == "vllm"
    assert plan_for_service(_service(gpus=[0, 1]), "a100-sxm4-80gb", 8).gpus == 2
    assert plan_for_service(_service(), "a100-sxm4-80gb", 4).gpus == 4  # gpus: all


def test_plan_for_service_takes_real_memory_and_cards_from_facts():
    from llmfleet.knowledge.facts import Facts, ModelFile
    from llmfleet.knowledge.facts import GpuFact as FactGpu

    facts = Facts(host="h", gpus=[FactGpu(index=0, name="Tesla V100-SXM2-32GB", memory_total_mib=32510,
                                          catalog_id="v100-sxm2-32gb")],
                  models=[ModelFile(path="/srv/models/q.gguf", kind="file", size_bytes=30 * 10**9)])
    p = plan_for_service(_service(), None, 1, facts=facts)
    assert p.gpu == "v100-sxm2-32gb" and p.memory_bytes == 32510 * 2**20
    assert any("32510 MiB" in n for n in p.notes)
    g = plan_for_service(_service(engine="llamacpp", quant="q4_k_m", model_path="/srv/models/q.gguf"), None, 1,
                         facts=facts)
    assert any("check the quant" in n for n in g.notes)  # a 30 GB file is not a 20 GB Q4_K_M


# ------------------------------------------------------------------------------------ the task


def _invoke(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "invoke", "plan", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_cli_json_has_the_documented_keys_and_exit_0_when_it_fits():
    r = _invoke("--model", "gemma-2-27b-it", "--quant", "GPTQ-Int4", "--gpu", "Tesla V100-SXM2-32GB",
                "--context", "4k", "--concurrency", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in ("params", "weights_bytes", "kv_bytes_per_token", "overhead_bytes", "fits", "max_context_tokens",
                "max_concurrency", "decode_tokps_ceiling", "engine_args", "notes", "health_floor_tokps", "image"):
        assert key in d, key
    assert d["fits"] is True and d["context"] == 4096 and isinstance(d["weights_bytes"], int)
    assert all(isinstance(a, str) for a in d["engine_args"])


def test_cli_exit_1_when_it_does_not_fit_and_still_prints_the_plan():
    r = _invoke("--model", "qwen3.5-27b", "--quant", "bf16", "--gpu", "v100-sxm2-32gb", "--json")
    assert r.returncode == 1
    d = json.loads(r.stdout)
    assert d["fits"] is False and d["alternatives"][0]["flags"].startswith("--quant")
    assert r.stderr.count("\n") == 1 and "does not fit" in r.stderr
    table = _invoke("--model", "qwen3.5-27b", "--quant", "bf16", "--gpu", "v100-sxm2-32gb")
    assert table.returncode == 1 and "DOES NOT FIT" in table.stdout and "what would fit" in table.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--model", "nope", "--gpu", "t4"], "unknown model"), (["--model", "qwen2.5-7b", "--gpu", "GTX 1"], "unknown GPU"),
     (["--model", "qwen2.5-7b", "--gpu", "t4", "--context", "lots"], "--context")],
)
def test_cli_usage_errors_exit_2(args, needle):
    r = _invoke(*args)
    assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1


def test_cli_host_from_the_inventory(tmp_path):
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("gpus:\n  hosts:\n    gpu-a:\n      ansible_host: 127.0.0.1\n")
    (inv / "host_vars" / "gpu-a.yml").write_text(
        "llmfleet_gpu: Tesla V100-SXM2-32GB\nllmfleet_services:\n"
        "  - {name: chat, engine: vllm, model: qwen2.5-32b-instruct, model_path: /srv/m, image: 'vllm:x',"
        " quant: gptq-int4, context: 8192}\n"
        "  - {name: big, engine: vllm, model: qwen2.5-32b-instruct, model_path: /srv/m2, image: 'vllm:x',"
        " quant: bf16, context: 8192, port: 8001}\n"
    )
    r = _invoke("--inventory", str(inv), "--host", "gpu-a", "--json")
    assert r.returncode == 1, r.stderr  # "big" does not fit
    d = json.loads(r.stdout)
    assert d["services"]["chat"]["fits"] is True and d["services"]["big"]["fits"] is False
    r = _invoke("--inventory", str(inv), "--model", "qwen2.5-7b-instruct", "--quant", "gptq-int4", "--gpu", "gpu-a",
                "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["gpu"] == "v100-sxm2-32gb"


def test_the_lab_services_plan_from_the_catalog_and_the_hosts_facts():
    from llmfleet.knowledge.facts import Facts, ModelFile
    from llmfleet.knowledge.facts import GpuFact as FactGpu

    gguf = _service(name="tiny", engine="llamacpp", model="tiny-qwen2", quant=None, context=512, concurrency=1,
                    model_path="/srv/models/tiny-qwen2-gguf/tiny-qwen2.gguf")
    facts = Facts(host="lab", gpus=[FactGpu(index=0, name="Tesla T4", memory_total_mib=15360, catalog_id="t4")],
                  models=[ModelFile(path=gguf.model_path, kind="file", size_bytes=412345, magic="GGUF")])
    p = plan_for_service(gguf, None, 1, facts=facts)
    assert p.fits and p.engine == "llamacpp" and p.weights_bytes == 412345
    assert "size" in p.weights_source
    with pytest.raises(UsageError, match="service tiny: .*--gather"):  # no quant and no file size: nothing to go on
        plan_for_service(gguf, "t4", 1)
    hf = _service(name="tiny-vllm", model="tiny-qwen2", quant=None, context=512, model_path="/srv/models/tiny-qwen2-hf")
    assert plan_for_service(hf, "t4", 1, facts=facts).fits


def test_an_explicit_short_context_is_the_operators_call():
    assert P("qwen2.5-7b-instruct", "gptq-int4", context=512).fits
    # the planner's own pick must be useful: 14B in bf16 on a 32 GB V100 leaves room for < 1024 tokens
    auto = P("qwen2.5-14b-instruct", "bf16", gpu="v100-pcie-32gb", gpu_memory_utilization=0.95)
    assert auto.resident and not auto.fits and "not a useful service" in auto.notes[0]


def test_cli_gather_plans_a_hosts_services_with_its_real_model_files(sshd, tmp_path):
    import os

    import yaml

    model = tmp_path / "models" / "tiny.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF" + b"\0" * 8188)
    inv = tmp_path / "inv"
    inv.mkdir()
    service = {"name": "tiny", "engine": "llamacpp", "model": "tiny-qwen2", "model_path": str(model),
               "image": "llamacpp:x", "context": 512}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"test-host": {
        "ansible_host": "127.0.0.1", "ansible_port": sshd.port, "ansible_user": "root",
        "ansible_ssh_private_key_file": str(sshd.client_key), "llmfleet_gpu": "Tesla T4",
        "llmfleet_root": str(tmp_path / "root"), "llmfleet_services": [service]}}}}))
    env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(tmp_path / "known_hosts"))
    args = [sys.executable, "-m", "invoke", "plan", "--inventory", str(inv), "--host", "test-host", "--json"]
    without = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert without.returncode == 2 and "--gather" in without.stderr  # no quant, no file size known
    r = subprocess.run(args + ["--gather", "--accept-new-host-keys"], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["services"]["tiny"]
    assert p["weights_bytes"] == 8192 and p["gpu"] == "t4" and p["fits"] is True


# -- the host's driver: the default image runs on it; an image given is judged against it -------------------


@pytest.mark.parametrize(
    "engine, quant, gpu, driver, image, want_image, note_has, note_lacks",
    [
        # R470 T4: no CUDA 12 image runs; the CUDA 11.8 llama.cpp build does, through minor-version compat
        ("llamacpp", "q4_k_m", "Tesla T4", "470.256.02", None, "llamacpp:vendored-0.3.36-cu118",
         ["that runs on driver 470.256.02", "minor-version compatibility", "SASS for sm_75"], ["does not run"]),
        # no driver known: the newest build with kernels for the card, as before
        ("llamacpp", "q4_k_m", "Tesla T4", None, None, "llamacpp:server-cuda-12.8", ["with kernels for"],
         ["driver"]),
        # a recent driver: the newest build again
        ("llamacpp", "q4_k_m", "Tesla T4", "580.95.05", None, "llamacpp:server-cuda-12.8",
         ["that runs on driver 580.95.05"], ["does not run"]),
        # vLLM on R470: nothing runs; the plan says so and what does (llama.cpp cu118, the upgrade, the wheels)
        ("vllm", "gptq-int4", "Tesla T4", "470.256.02", None, None,
         ["no catalog vllm image", "does not run on this host", "runs on this driver today: "
          "llamacpp:vendored-0.3.36-cu118", "upgrade: driver >= 525.60.13", "CUDA 11.8 wheels"], []),
        # an image given that cannot run on the driver: judged anyway, with the reason and the alternatives
        ("llamacpp", "q4_k_m", "Tesla V100-SXM2-32GB", "470.256.02", "llamacpp:server-cuda-12.8",
         "llamacpp:server-cuda-12.8", ["image llamacpp:server-cuda-12.8 does not run on this host",
                                       "runs on this driver today: llamacpp:vendored-0.3.36-cu118"], []),
        # an image given that runs: no driver note
        ("llamacpp", "q4_k_m", "Tesla V100-SXM2-32GB", "580.95.05", "llamacpp:server-cuda-12.8",
         "llamacpp:server-cuda-12.8", [], ["does not run", "driver"]),
    ],
)
def test_plan_picks_and_judges_the_image_by_the_hosts_driver(engine, quant, gpu, driver, image, want_image,
                                                            note_has, note_lacks):
    p = plan(PlanRequest(model="qwen2.5-7b-instruct", quant=quant, gpu=gpu, engine=engine, driver=driver,
                         image=image, context=4096))
    if want_image:
        assert p.image == want_image
    text = " ".join(p.notes)
    for part in note_has:
        assert part in text
    for part in note_lacks:
        assert part not in " ".join(n for n in p.notes if "image" in n)


def test_plan_for_a_gathered_host_uses_its_driver(tmp_path):
    from types import SimpleNamespace

    from llmfleet.inventory.services import Service
    svc = Service.model_validate({"name": "chat", "engine": "llamacpp", "model": "qwen2.5-7b-instruct",
                                  "quant": "q4_k_m", "model_path": "/srv/m.gguf", "image": "llamacpp:server-cuda-12.8",
                                  "port": 8000, "context": 4096})
    facts = SimpleNamespace(gpus=[], driver_version="470.256.02", model=lambda path: None)
    p = plan_for_service(svc, "Tesla T4", facts=facts)
    assert any("does not run on this host" in n and "470.256.02" in n for n in p.notes)
    p = plan_for_service(svc, "Tesla T4", facts=facts, driver="580.95.05")  # --driver wins
    assert not any("does not run on this host" in n for n in p.notes)
