"""What the planner knows about models, files, builds and speed, each against a public source.

Sources are named next to each figure: model cards (parameter counts), published GGUF file sizes
(bartowski and llama-bench listings), llama.cpp's src/llama-quant.cpp (llama_tensor_get_type),
llama.cpp PR tables and catalog/decode_public.yaml (batch-1 decode speed), the H200 runs measured by llmfleet and a device run
(CUDA-visible memory on an H200).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from llmfleet.errors import UsageError
from llmfleet.knowledge import compat
from llmfleet.knowledge.catalog import (
    Quant,
    find_gpu,
    find_model,
    find_quant,
    load_gpus,
    load_models,
    speed_assumptions,
)
from llmfleet.knowledge.modelinfo import read_model
from llmfleet.knowledge.planner import (
    HEALTH_PROBE_CONTEXT,
    PlanRequest,
    compute_weights,
    kv_layout,
    plan,
)

REPO = Path(__file__).resolve().parents[1]
GB, GIB = 1e9, 2**30


def P(model, quant=None, gpu="rtx-3090", **kw):
    return plan(PlanRequest(model=model, quant=quant, gpu=gpu, **kw))


# --------------------------------------------------------------------------- mixture of experts


@pytest.mark.parametrize(
    ("model", "total", "active", "without_input_embedding", "source"),
    [
        ("qwen3-30b-a3b", 30.5e9, 3.3e9, False, "Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"),
        ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, False, "Qwen1.5-MoE-A2.7B model card: 14.3B, 2.7B activated"),
        ("mixtral-8x7b-instruct", 46.7e9, 12.9e9, False, "Mistral: Mixtral 8x7B 46.7B total, 12.9B active"),
        ("deepseek-v2-lite-chat", 15.7e9, 2.4e9, True, "DeepSeek-V2-Lite model card: 15.7B total, 2.4B activated"),
        ("gpt-oss-20b", 20.91e9, 3.61e9, True, "gpt-oss model card: 20.91B total, 3.61B active"),
        ("gpt-oss-120b", 116.83e9, 5.13e9, True, "gpt-oss model card: 116.83B total, 5.13B active"),
        ("deepseek-v3", 671e9, 37e9, True, "DeepSeek-V3 model card: 671B (+14B MTP), 37B activated"),
    ],
)
def test_moe_total_and_active_parameters_match_the_model_cards(model, total, active, without_input_embedding, source):
    spec = find_model(model)
    w = compute_weights(spec, find_quant("bf16"))
    params = w.params - w.mtp_bytes // 2  # DeepSeek-V3 publishes 671B without its MTP module
    assert params == pytest.approx(total, rel=0.015), source
    # DeepSeek and OpenAI count the active parameters without the input embedding (a lookup).
    got = w.active_params_without_input_embedding if without_input_embedding else w.active_params
    assert got == pytest.approx(active, rel=0.03), source


def test_a_moe_model_is_held_whole_but_read_by_its_active_experts():
    # Qwen3-30B-A3B in bf16: 61 GB of weights (bartowski Qwen3-30B-A3B-bf16.gguf 61.10 GB), of which a
    # token reads ~3.3B parameters' worth. A 24 GB card does not hold it; an H200 decodes it ~10x
    # faster than a dense 30B would.
    p = P("qwen3-30b-a3b", "bf16", gpu="rtx-4090", context=4096)
    assert p.weights_bytes == pytest.approx(61.1e9, rel=0.01) and not p.fits
    h = P("qwen3-30b-a3b", "bf16", gpu="h200-141gb", context=4096)
    dense = P("qwen2.5-32b-instruct", "bf16", gpu="h200-141gb", context=4096)
    assert h.fits and h.decode_tokps_ceiling > 8 * dense.decode_tokps_ceiling
    assert any("128 experts per layer, 8 used per token" in n for n in h.notes)


def _write_config(folder: Path, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


# config.json figures of the published models (their Hugging Face repositories)
QWEN3_MOE = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
             "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
             "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 40960,
             "torch_dtype": "bfloat16"}
DEEPSEEK_V2_LITE = {"model_type": "deepseek_v2", "num_hidden_layers": 27, "hidden_size": 2048,
                    "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 10944,
                    "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
                    "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512,
                    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                    "vocab_size": 102400, "tie_word_embeddings": False, "max_position_embeddings": 163840,
                    "torch_dtype": "bfloat16"}
MIXTRAL = {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 32000, "tie_word_embeddings": False, "max_position_embeddings": 32768,
           "torch_dtype": "bfloat16"}
QWEN2_MOE = {"model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
             "num_key_value_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408,
             "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
             "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936, "tie_word_embeddings": False,
             "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
GPT_OSS = {"model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32,
           "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088, "tie_word_embeddings": False,
           "attention_bias": True, "sliding_window": 128, "max_position_embeddings": 131072,
           "layer_types": ["sliding_attention", "full_attention"] * 12,
           "quantization_config": {"quant_method": "mxfp4"}}


@pytest.mark.parametrize(
    ("cfg", "total", "active", "without_input_embedding"),
    [(QWEN3_MOE, 30.5e9, 3.3e9, False), (DEEPSEEK_V2_LITE, 15.7e9, 2.4e9, True), (MIXTRAL, 46.7e9, 12.9e9, False),
     (QWEN2_MOE, 14.3e9, 2.7e9, False), (GPT_OSS, 20.91e9, 3.61e9, True)],
    ids=["qwen3_moe", "deepseek_v2", "mixtral", "qwen2_moe", "gpt_oss"],
)
def test_a_moe_config_json_is_sized_from_all_experts(tmp_path, cfg, total, active, without_input_embedding):
    spec = read_model(_write_config(tmp_path / cfg["model_type"], cfg))
    w = compute_weights(spec, find_quant("bf16"))
    assert w.params == pytest.approx(total, rel=0.015)
    got = w.active_params_without_input_embedding if without_input_embedding else w.active_params
    assert got == pytest.approx(active, rel=0.03)


def test_gpt_oss_config_is_planned_as_mxfp4_experts(tmp_path):
    # gpt-oss checkpoints keep the experts in MXFP4 and the rest in bf16: 13.8 GB (model card: fits 16 GB)
    p = P(str(_write_config(tmp_path / "gpt-oss-20b", GPT_OSS)), gpu="h100-sxm-80gb", context=8192)
    assert p.quant == "mxfp4" and 13 * GB < p.weights_bytes < 14.5 * GB
    assert p.kv_sliding_window == 128  # 12 of 24 layers: a 128-token window


@pytest.mark.parametrize(
    ("model_type", "extra", "says"),
    [
        ("dbrx", {"num_experts": 16, "num_experts_per_tok": 4}, "does not know"),
        ("jamba", {"num_experts": 16, "num_experts_per_tok": 2, "expert_layer_period": 2}, "does not know"),
        ("qwen3_moe", {**QWEN3_MOE, "decoder_sparse_step": 2}, "not modelled"),
        ("qwen2_moe", {**QWEN2_MOE, "mlp_only_layers": [0, 1]}, "not modelled"),
    ],
)
def test_a_moe_layout_the_planner_cannot_model_is_refused_in_one_line(tmp_path, model_type, extra, says):
    cfg = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
           "vocab_size": 256, **extra, "model_type": model_type}
    with pytest.raises(UsageError, match=says) as exc:
        read_model(_write_config(tmp_path / model_type, cfg))
    assert "\n" not in str(exc.value) and "config.json" in str(exc.value)


@pytest.mark.parametrize("layout", ["3d", "per-expert"])  # per-expert: the first Mixtral GGUFs (blk.N.ffn_up.E)
def test_a_moe_gguf_file_reads_only_its_active_experts_per_token(tmp_path, layout):
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFWriter

    f = tmp_path / "tiny-moe.gguf"
    w = GGUFWriter(str(f), "qwen3moe")
    for key, val in (("block_count", 2), ("embedding_length", 64), ("attention.head_count", 4),
                     ("attention.head_count_kv", 2), ("feed_forward_length", 128), ("context_length", 4096),
                     ("expert_count", 8), ("expert_used_count", 2), ("expert_feed_forward_length", 32)):
        w.add_uint32(f"qwen3moe.{key}", val)
    w.add_file_type(0)
    exps = 0
    for name, shape in [("token_embd.weight", (256, 64)), ("output.weight", (256, 64))]:
        w.add_tensor(name, np.zeros(shape, dtype=np.float32), raw_dtype=None)
    for i in range(2):
        for name, shape in (("attn_q", (64, 64)), ("attn_k", (32, 64)), ("attn_v", (32, 64)),
                            ("attn_output", (64, 64)), ("ffn_gate_inp", (8, 64))):
            w.add_tensor(f"blk.{i}.{name}.weight", np.zeros(shape, dtype=np.float32), raw_dtype=None)
        for name, shape in (("ffn_gate_exps", (8, 32, 64)), ("ffn_up_exps", (8, 32, 64)), ("ffn_down_exps", (8, 64, 32))):
            a = np.zeros(shape, dtype=np.float32)
            exps += a.nbytes
            if layout == "3d":
                w.add_tensor(f"blk.{i}.{name}.weight", a, raw_dtype=T.F32)
            else:
                for e in range(8):
                    w.add_tensor(f"blk.{i}.{name.removesuffix('_exps')}.{e}.weight", a[e], raw_dtype=T.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    spec = read_model(f)
    assert spec.num_experts == 8 and spec.num_experts_per_tok == 2 and spec.file_expert_bytes == exps
    p = P(str(f), gpu="t4", context=1024)
    # every expert is loaded; a token reads 2 of 8: the other 6/8 of the expert bytes are not read
    assert p.weights_gpu_bytes == spec.file_weights_bytes - spec.file_embed_bytes
    read = 320e9 / p.decode_tokps_ceiling  # bytes per token back from the ceiling (T4: 320 GB/s)
    expected = spec.file_weights_bytes - spec.file_embed_bytes - exps * 6 / 8 + p.kv_bytes_per_sequence
    assert read == pytest.approx(expected, rel=1e-3)


# --------------------------------------------------------------------------- tied embeddings


def test_an_absent_tie_word_embeddings_means_tied_and_gemma_2_9b_has_its_published_size(tmp_path):
    # google/gemma-2-9b config.json has no tie_word_embeddings key (transformers default: True).
    cfg = {"model_type": "gemma2", "num_hidden_layers": 42, "hidden_size": 3584, "num_attention_heads": 16,
           "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
           "sliding_window": 4096, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
    spec = read_model(_write_config(tmp_path / "gemma-2-9b", cfg))
    assert spec.tie_embeddings
    w = compute_weights(spec, find_quant("bf16"))
    assert w.params == pytest.approx(9.24e9, rel=0.005)  # Hugging Face: google/gemma-2-9b, 9.24B params
    untied = compute_weights(spec.__class__(**{**spec.__dict__, "tie_embeddings": False}), find_quant("bf16"))
    assert untied.params > 1.09 * w.params  # read as untied it was 10% too big


# --------------------------------------------------------------------------- GGUF sizes


@pytest.mark.parametrize(
    ("model", "quant", "published_gb", "tol", "source"),
    [
        # bartowski/phi-4-GGUF (llama.cpp b4456): Phi-3 layout with fused attn_qkv and gate/up
        ("phi-4", "q4_k_m", 9.05, 0.005, "phi-4-Q4_K_M.gguf 9.05GB"),
        ("phi-4", "q5_k_m", 10.60, 0.015, "phi-4-Q5_K_M.gguf 10.60GB (b4456 gave attn_qkv Q6_K on every layer)"),
        ("phi-4", "q6_k", 12.03, 0.005, "phi-4-Q6_K.gguf 12.03GB"),
        ("phi-4", "q8_0", 15.58, 0.005, "phi-4-Q8_0.gguf 15.58GB"),
        ("phi-4", "q4_0", 8.41, 0.01, "phi-4-Q4_0.gguf 8.41GB (imatrix: first ffn_down layers Q4_1)"),
        ("phi-4", "f16-gguf", 29.32, 0.002, "phi-4-f16.gguf 29.32GB"),
        # bartowski/Qwen_Qwen3-30B-A3B-GGUF (b5200): 128 experts, MoE tensor rules
        ("qwen3-30b-a3b", "q8_0", 32.48, 0.005, "Qwen3-30B-A3B-Q8_0.gguf 32.48GB"),
        ("qwen3-30b-a3b", "q6_k", 25.10, 0.005, "Qwen3-30B-A3B-Q6_K.gguf 25.10GB"),
        ("qwen3-30b-a3b", "q5_k_m", 21.74, 0.005, "Qwen3-30B-A3B-Q5_K_M.gguf 21.74GB"),
        ("qwen3-30b-a3b", "f16-gguf", 61.10, 0.002, "Qwen3-30B-A3B-bf16.gguf 61.10GB"),
        # bartowski/openai_gpt-oss-20b-GGUF (b6096): MXFP4 experts, everything else Q8_0
        ("gpt-oss-20b", "mxfp4-moe", 12.1, 0.01, "gpt-oss-20b-MXFP4.gguf 12.1GB"),
        # every published quant keeps the expert FFNs at MXFP4 (bartowski README; unsloth/gpt-oss-20b-GGUF)
        ("gpt-oss-20b", "q4_k_m", 11.6, 0.01, "unsloth gpt-oss-20b-Q4_K_M.gguf about 11.6GB"),
        ("gpt-oss-20b", "q6_k", 12.04, 0.01, "bartowski gpt-oss-20b-Q6_K.gguf 12.04GB, FFN kept at MXFP4"),
    ],
)
def test_gguf_sizes_follow_llama_tensor_get_type(model, quant, published_gb, tol, source):
    w = compute_weights(find_model(model), find_quant(quant))
    assert w.total_bytes / GB == pytest.approx(published_gb, rel=tol), source


@pytest.mark.parametrize("gpu", ["v100-sxm2-16gb", "t4"])
def test_gpt_oss_20b_q4_k_m_fits_a_16_gb_card_because_its_experts_stay_mxfp4(gpu):
    # Published Q4_K_M files are ~11.6 GB (experts MXFP4), not the 15.8 GB of a K-quant mix of every tensor.
    p = P("gpt-oss-20b", "q4_k_m", gpu=gpu, engine="llamacpp", context=8192)
    assert p.weights_bytes / GB < 12.0
    assert p.fits and p.resident


def test_fused_qkv_takes_the_attn_v_rule_and_changes_the_size():
    # llama-quant.cpp: attn_qkv is an "attn_v-like" tensor: Q6_K on the use_more_bits layers in Q4_K_M.
    spec = find_model("phi-4")
    fused = compute_weights(spec, find_quant("q4_k_m")).total_bytes
    split = compute_weights(spec.__class__(**{**spec.__dict__, "fused_qkv": False, "fused_gate_up": False}),
                            find_quant("q4_k_m")).total_bytes
    assert fused / GB == pytest.approx(9.05, rel=0.005) and split / GB < 8.95  # only the fused rule gives 9.05 GB


def test_llama_bench_file_sizes_of_the_speed_figures():
    # llama-bench prints these sizes for the files the speed figures below were measured with.
    pure_q4_0 = Quant(name="q4_0-pure", family="gguf", bits=4.5, base="q4_0")
    for model, quant, gib in (("llama-2-7b", find_quant("q4_0"), 3.56), ("llama-2-7b", find_quant("f16-gguf"), 12.55),
                              ("llama-3.1-8b-instruct", find_quant("q4_0"), 4.33)):
        assert compute_weights(find_model(model), quant).total_bytes / GIB == pytest.approx(gib, abs=0.01), model
    # measured on an H200 by llmfleet, 2026-12-01: random-weight "all matrices Q4_0" files of 4.29 and 18.43 GB
    for model, gb in (("qwen2.5-7b-instruct", 4.29), ("qwen2.5-32b-instruct", 18.43)):
        assert compute_weights(find_model(model), pure_q4_0).total_bytes / GB == pytest.approx(gb, rel=0.005)


def test_eight_expert_rules_apply_to_mixtral():
    # n_expert == 8 (llama_tensor_get_type): attn_v and attn_k Q8_0, attn_output Q5_K in Q4_K_M
    import dataclasses

    spec = find_model("mixtral-8x7b-instruct")
    q = find_quant("q4_k_m")
    plain = dataclasses.replace(q, rules=tuple((k, v) for k, v in q.rules if not k.startswith("moe8")))
    delta = compute_weights(spec, q).total_bytes - compute_weights(spec, plain).total_bytes
    more_bits = sum(1 for i in range(32) if i < 4 or i >= 28 or (i - 4) % 3 == 2)  # use_more_bits(i, 32)
    kv = 4096 * 1024
    expected = (kv * (more_bits * (8.5 - 6.5625) + (32 - more_bits) * (8.5 - 4.5))  # attn_v -> Q8_0
                + 32 * kv * (8.5 - 4.5) + 32 * 4096 * 4096 * (5.5 - 4.5)) / 8  # attn_k -> Q8_0, attn_output -> Q5_K
    assert more_bits == 16 and delta == pytest.approx(expected, rel=1e-6)


# --------------------------------------------------------------------------- KV layout per build


def test_gemma_on_a_build_without_an_swa_cache_needs_the_full_context_on_every_layer():
    # llama.cpp's SWA cache (PR #13194, May 2025) came after b5000: Gemma-3's 52 sliding layers keep
    # the whole context there; server-cuda keeps only their 1024-token window.
    new = P("gemma-3-27b-it", "q4_k_m", gpu="h100-sxm-80gb", context=32768, image="llamacpp:server-cuda-12.8")
    old = P("gemma-3-27b-it", "q4_k_m", gpu="h100-sxm-80gb", context=32768, image="llamacpp:b5000-cu122")
    spec = find_model("gemma-3-27b-it")
    full = kv_layout(spec, 2.0, swa_cache=False).per_sequence(32768)
    assert old.kv_bytes_per_sequence == pytest.approx(full, rel=1e-6)
    assert old.kv_bytes_per_sequence > 4.5 * new.kv_bytes_per_sequence  # "~5x the KV"
    assert old.kv_sliding_window is None and new.kv_sliding_window == 1024
    assert any("keeps the full context on them" in n for n in old.notes)


def test_gemma_2_on_vllm_v0_keeps_the_full_context():
    # vLLM 0.10.1.1 runs V0 below compute capability 8.0: no hybrid allocator (vllm RFC #11382)
    v0 = P("gemma-2-27b-it", "gptq-int4", gpu="t4", gpus=2, context=8192, image="vllm:0.10.1.1")
    v1 = P("gemma-2-27b-it", "gptq-int4", gpu="a10", gpus=2, context=8192, image="vllm:0.10.1.1")
    assert v0.kv_sliding_window is None and v1.kv_sliding_window == 4096


def test_a_services_image_decides_the_kv_layout():
    from llmfleet.inventory.services import Service
    from llmfleet.knowledge.planner import plan_for_service

    svc = Service(name="g", engine="llamacpp", model="gemma-3-27b-it", quant="q4_k_m", image="llamacpp:b5000-cu122",
                  model_path="/srv/models/gemma.gguf", context=16384, port=8080)
    p = plan_for_service(svc, "h100-sxm-80gb", 1)
    assert p.image == "llamacpp:b5000-cu122" and p.kv_sliding_window is None


def test_qwen35_state_is_fp32_and_vision_and_mtp_are_counted():
    spec = find_model("qwen3.5-27b")
    st = kv_layout(spec, 2.0).state_bytes_per_sequence
    # 48 Gated DeltaNet layers x 48 value heads x 128 x 128 state in fp32 + the conv state in 16 bit
    assert st == pytest.approx(48 * (48 * 128 * 128 * 4 + (2 * 16 * 128 + 48 * 128) * 3 * 2))
    w = compute_weights(spec, find_quant("bf16"))
    # Qwen3.6-27B (same qwen3_5 shapes) safetensors total_size 55.56 GB: vision tower and MTP included
    assert w.total_bytes / GB == pytest.approx(55.56, rel=0.005)
    assert w.vision_bytes > 0.8 * GB and w.mtp_bytes > 0.7 * GB


# --------------------------------------------------------------------------- vLLM memory


def test_vllm_budget_is_the_cuda_visible_total_not_memory_total():
    # Device run on an H200 (driver 580.159.04): nvidia-smi memory.total 143771 MiB, Reserved 616 MiB,
    # torch.cuda.mem_get_info total 150109880320 B = 143155.9 MiB (bench/cuda_visible_memory.py).
    h200 = find_gpu("h200-141gb")
    p = P("qwen2.5-7b-instruct", "bf16", gpu=h200.id, context=8192, gpu_memory_utilization=0.9)
    assert p.budget_bytes == pytest.approx(150109880320 * 0.9, rel=1e-4)


# --------------------------------------------------------------------------- flags and Marlin


def test_marlin_comes_from_the_release_not_a_hard_coded_8_0():
    # engines.yaml: gptq_marlin from 8.0 in vllm:0.10.1.1, from 7.5 in vllm:0.19.1 / 0.20.0
    flag = {}
    for image in ("vllm:0.10.1.1", "vllm:0.20.0"):
        p = P("qwen2.5-7b-instruct", "gptq-int4", gpu="t4", context=4096, image=image)
        a = p.engine_args
        flag[image] = a[a.index("--quantization") + 1]
        rel = compat.load_engine_catalog().release(image)
        assert flag[image] == ("gptq_marlin" if compat.cc_ok((7, 5), rel.quantizations["gptq_marlin"]) else "gptq")
    assert flag == {"vllm:0.10.1.1": "gptq", "vllm:0.20.0": "gptq_marlin"}
    src = "".join(f.read_text() for f in sorted((REPO / "src/llmfleet/knowledge/planner").glob("*.py")))
    assert "vllm_cc80" not in src and "(8, 0)" not in src


def test_fp8_kv_on_a_card_below_8_9_is_not_suggested_with_triton():
    # vllm#26431: TRITON_ATTN has no fp8e4nv below compute capability 8.9
    p = P("qwen2.5-7b-instruct", "bf16", gpu="t4", context=16384, kv_dtype="fp8")
    assert not p.fits and any("fp8" in n and "preflight" in n for n in p.notes)
    h = P("qwen2.5-7b-instruct", "bf16", gpu="h100-sxm-80gb", context=16384, kv_dtype="fp8")
    assert h.fits and h.preflight["kv-dtype"]["status"] == "pass"  # FA3 on Hopper takes fp8 (vllm PR #15191)


def _catalog_cases():
    models = [m.name for m in load_models() if m.name != "tiny-qwen2"]
    cards = [g.id for g in load_gpus()]
    return [(m, g) for m in models for g in cards]


@pytest.mark.parametrize(("model", "gpu"), _catalog_cases())
def test_every_ranked_alternative_passes_the_preflights_rules_on_the_same_card(model, gpu):
    """Property over the whole catalog: whatever the planner ranks, the preflight's own flag rules
    (compat.flag_checks) pass on the same card with the same image, judged here independently."""
    cat = compat.load_engine_catalog()
    requests = [dict(engine="vllm", quant="bf16", kv_dtype="fp8", context=65536),
                dict(engine="vllm", quant="bf16", context=65536)]
    requests += [dict(engine="llamacpp", quant="q8_0", kv_dtype=kv, context=65536, image=img)
                 for img in ("llamacpp:server-cuda-12.8", "llamacpp:b5000-cu122") for kv in ("f16", "q8_0")]
    card = find_gpu(gpu)
    for req in requests:
        p = P(model, gpu=gpu, **req)
        for alt in p.alternatives:
            rel = cat.release(alt["image"]) if alt["image"] else None
            if rel is None:
                continue
            change = alt["change"]
            quant = change.get("quant", req["quant"])
            kv = change.get("kv_dtype", req.get("kv_dtype", "auto"))
            rules = cat.engines[rel.engine]
            kv_flag = {"auto": "auto", "fp8": "fp8"}.get(kv, kv) if rel.engine == "vllm" else kv
            verdicts = compat.flag_checks(rel, rules, quant=quant, kv_dtype=kv_flag, args=alt["engine_args"],
                                          env=alt["engine_env"], cc=card.compute_capability, bf16_native=card.bf16)
            bad = {k: v.message for k, v in verdicts.items() if v.status == "fail"}
            assert not bad, (req, alt["flags"], bad)


# --------------------------------------------------------------------------- speed model
# The public batch-1 decode figures the speed model and the default floor are held to live in
# catalog/decode_public.yaml and are checked one by one in tests/test_public_decode.py.


def test_the_h200_offload_measurements_lie_below_the_floor():
    # Measured on an H200 by llmfleet, 2026-12-01: 56 of 64 layers on the GPU decode 20.8 tok/s,
    # 81.3-92.7 all on the GPU.
    p = P("qwen2.5-32b-instruct", "q4_0", gpu="h200-141gb", context=512)
    assert 20.8 < p.health_floor_tokps < 81.3


def floor_table() -> list[tuple[str, str, float, float, float, float, float, str]]:
    """Per catalog card: Llama-3.1-8B Q4_K_M on llama.cpp at the health probe's context."""
    rows = []
    for g in load_gpus():
        p = P("llama-3.1-8b-instruct", "q4_k_m", gpu=g.id, engine="llamacpp", context=HEALTH_PROBE_CONTEXT)
        cls, _ = speed_assumptions("llamacpp").efficiency_for(g.memory_type)
        lo, hi = p.decode_tokps_realistic
        off_lo, off_hi = p.decode_tokps_offload_eighth
        floor = p.health_floor_tokps
        catches = "always" if off_hi < floor else ("sometimes" if off_lo < floor else "no")
        rows.append((g.id, cls, lo, hi, off_lo, off_hi, floor, catches))
    return rows


def render_floor_table() -> str:
    lines = ["| card | memory class | resident tok/s | 1/8 of the layers offloaded, tok/s | default floor | "
             "catches a 1/8 offload |",
             "| --- | --- | --- | --- | --- | --- |"]
    for gid, cls, lo, hi, off_lo, off_hi, floor, catches in floor_table():
        lines.append(f"| {gid} | {cls} | {lo:.1f}-{hi:.1f} | {off_lo:.1f}-{off_hi:.1f} | {floor:.1f} | {catches} |")
    return "\n".join(lines)


def test_the_default_floor_is_a_sanity_bound_below_every_resident_prediction():
    share = speed_assumptions("llamacpp").floor_share_of_low
    for gid, _cls, lo, _hi, _off_lo, _off_hi, floor, _ in floor_table():
        assert floor == pytest.approx(share * lo, rel=0.02), gid  # a resident deploy passes the gate
        assert floor < lo, gid


def test_the_floor_fails_a_one_eighth_offload_where_the_memory_is_fast():
    # HBM3 cards: a 1/8 offload to ~69 GB/s host memory costs far more than the model's spread.
    catches = {gid: c for gid, *_, c in floor_table()}
    assert catches["h200-141gb"] == "always" and catches["h200-nvl-141gb"] == "always"
    # Slow-memory cards cannot tell a 1/8 offload from a slow resident run: the plan says so.
    assert catches["p40"] == "no"
    p = P("llama-3.1-8b-instruct", "q4_k_m", gpu="p40", engine="llamacpp", context=HEALTH_PROBE_CONTEXT)
    assert any("passes it on this card" in n for n in p.notes), p.notes


def test_the_docs_floor_table_is_the_codes():
    doc = (REPO / "docs/planner.md").read_text()
    m = re.search(r"<!-- floor-table -->\n(.*?)\n<!-- /floor-table -->", doc, re.S)
    assert m, "docs/planner.md lacks the floor table markers"
    assert m.group(1).strip() == render_floor_table(), "regenerate: python bench/planner_floor_table.py"


def test_plan_json_reports_the_health_floor():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "invoke", "plan", "--model", "llama-3.1-8b-instruct", "--quant", "q4_k_m",
                        "--gpu", "rtx-3090", "--context", "4k", "--image", "llamacpp:b5000-cu122", "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["image"] == "llamacpp:b5000-cu122" and d["health_floor_tokps"] > 0
    assert d["health_floor_tokps"] < d["decode_tokps_realistic"][0]
