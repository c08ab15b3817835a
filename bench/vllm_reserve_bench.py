"""vLLM's own reserved memory per model kind: one random-weight engine start per model, its log kept.

What it records: for Llama-3.1-8B (dense), Qwen3-30B-A3B (MoE) and Qwen3.5-27B language model only
(hybrid: Gated DeltaNet + full attention), all bf16 with the shapes of the planner's catalog
(src/llmfleet/knowledge/catalog/models.yaml), vLLM's engine log at DEBUG level ("Model loading
took", "Available KV cache memory", the profile breakdown, "Setting attention block size", "GPU KV
cache size", "Maximum concurrency", CUDA-graph memory) and nvidia-smi's memory per process, with
gpu_memory_utilization 0.90, max_model_len 32768 and max_num_seqs 4. The weights are random
(load_format="dummy"): the memory figures are those of the real shapes.

Needs vLLM (0.26.0 for the catalog's reserve figures) and an NVIDIA GPU with room for 60 GB of
weights. FlashInfer is not needed (VLLM_USE_FLASHINFER_SAMPLER=0; Qwen3.5 uses the Triton GDN
prefill). Run: python bench/vllm_reserve_bench.py OUTDIR [--max-model-len 32768] [--max-num-seqs 4]
Writes OUTDIR/vllm-<model>.log and OUTDIR/nvidia-smi-compute-apps-vllm-<model>.csv per model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

LLAMA8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128009,
    "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN3MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "torch_dtype": "bfloat16",
    "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
}
QWEN35 = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "torch_dtype": "bfloat16",
    "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
    "vision_end_token_id": 248054, "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_text", "torch_dtype": "bfloat16", "hidden_size": 5120, "intermediate_size": 17408,
        "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
        "vocab_size": 248320, "full_attention_interval": 4, "attn_output_gate": True,
        "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False, "mtp_num_hidden_layers": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "eos_token_id": 248044,
    },
    "vision_config": {"model_type": "qwen3_5_vision", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                      "num_heads": 16, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "out_hidden_size": 5120, "num_position_embeddings": 2304, "in_channels": 3,
                      "hidden_act": "gelu_pytorch_tanh"},
}
MODELS = {"llama8b": LLAMA8B, "qwen3moe": QWEN3MOE, "qwen35": QWEN35}


def run_one(name: str, root: Path, out: Path, max_model_len: int, max_num_seqs: int) -> None:
    """One engine start in this process: LLM(...) as the plan's flags set it, nvidia-smi, one request."""
    from vllm import LLM, SamplingParams  # type: ignore[import-not-found]

    kw: dict[str, object] = dict(model=str(root / name), load_format="dummy", skip_tokenizer_init=True,
                                 dtype="bfloat16", gpu_memory_utilization=0.90, max_model_len=max_model_len,
                                 max_num_seqs=max_num_seqs, tensor_parallel_size=1, kv_cache_dtype="auto")
    if name == "qwen35":
        kw.update(language_model_only=True, gdn_prefill_backend="triton")
    print("LLM kwargs:", kw, flush=True)
    llm = LLM(**kw)
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
                         capture_output=True, text=True, check=False).stdout
    (out / f"nvidia-smi-compute-apps-vllm-{name}.csv").write_text(smi)
    print(smi, flush=True)
    t = time.time()
    o = llm.generate([{"prompt_token_ids": list(range(1000, 1128))}],
                     SamplingParams(max_tokens=64, ignore_eos=True, detokenize=False))
    print("generated", len(o[0].outputs[0].token_ids), "tokens in", round(time.time() - t, 2), "s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--only", help="run one model in this process (used by the driver)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    root = args.out / "models"
    for name, cfg in MODELS.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.json").write_text(json.dumps(cfg, indent=1))
    if args.only:
        run_one(args.only, root, args.out, args.max_model_len, args.max_num_seqs)
        return
    env = dict(os.environ, VLLM_USE_FLASHINFER_SAMPLER="0", VLLM_LOGGING_LEVEL="DEBUG", PYTHONUNBUFFERED="1")
    for name in MODELS:  # one process per engine: each start sees the whole card
        with open(args.out / f"vllm-{name}.log", "w") as log:
            rc = subprocess.run([sys.executable, __file__, str(args.out), "--only", name,
                                 "--max-model-len", str(args.max_model_len), "--max-num-seqs",
                                 str(args.max_num_seqs)], stdout=log, stderr=subprocess.STDOUT, env=env,
                                check=False).returncode
        print(json.dumps({"model": name, "rc": rc, "log": str(args.out / f"vllm-{name}.log")}), flush=True)


if __name__ == "__main__":
    main()
