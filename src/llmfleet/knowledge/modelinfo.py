"""Read a model's shapes and real byte sizes from local files: a Hugging Face folder or a .gguf file.

- Hugging Face folder: ``config.json`` (for multimodal wrappers the text model under
  ``text_config``), its ``quantization_config``, and the safetensors headers (the first 8 bytes give
  the length of a JSON table of every tensor's dtype, shape and byte range; nothing else is read).
  When only ``model.safetensors.index.json`` is present its ``metadata.total_size`` is used.
- GGUF file: the header and tensor table (``gguf_header``, the standard library only) (architecture, shapes, the
  file type, each tensor's ggml type and byte size). The tensor data is memory-mapped, never read.

Returns a ``catalog.ModelSpec`` with ``origin`` "hf" or "gguf" and the ``file_*`` figures set, so
the planner uses real sizes instead of formulas. Errors are one line naming the file and the field.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.knowledge.catalog import (
    FULL,
    LINEAR,
    SLIDING,
    ModelSpec,
    find_gguf_quant,
    layer_types_from_interval,
)

_HEADER_CAP = 100 * 1024 * 1024  # a safetensors JSON header larger than this is not a real file
_VISION_MARKERS = ("vision", "visual", "multi_modal_projector", "mm_projector", "image_newline")


def read_model(path: str | os.PathLike[str]) -> ModelSpec:
    """A ModelSpec from a Hugging Face model folder or a .gguf file."""
    p = Path(path).expanduser()
    if p.is_dir():
        return read_hf_folder(p)
    if p.is_file() and p.suffix.lower() == ".gguf":
        return read_gguf(p)
    if p.is_file() and p.name == "config.json":
        return read_hf_folder(p.parent)
    if not p.exists():
        raise UsageError(f"{p}: no such file or folder (give a catalog model name, a model folder or a .gguf file)")
    raise UsageError(f"{p}: not a model folder (with config.json) or a .gguf file")


# ----------------------------------------------------------------------------------- Hugging Face


def _cfg_int(cfg: dict[str, Any], where: str, *keys: str, default: int | None = None) -> int:
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            try:
                return int(v)
            except (TypeError, ValueError):
                raise UsageError(f"{where}: {k} must be a number, got {v!r}") from None
    if default is not None:
        return default
    raise UsageError(f"{where}: missing {keys[0]} (needed to size the model)")


_LAYER_TYPE_NAMES = {
    "full_attention": FULL,
    "attention": FULL,
    "global": FULL,
    "sliding_attention": SLIDING,
    "sliding_window": SLIDING,
    "local": SLIDING,
    "linear_attention": LINEAR,
    "linear": LINEAR,
    "mamba": LINEAR,
}


def _hf_layer_types(cfg: dict[str, Any], n: int, model_type: str, where: str) -> tuple[str, ...]:
    listed = cfg.get("layer_types")
    if isinstance(listed, list) and listed:
        out = []
        for t in listed:
            kind = _LAYER_TYPE_NAMES.get(str(t).lower())
            if kind is None:
                raise UsageError(f"{where}: layer_types has unknown entry {t!r}; known: {', '.join(_LAYER_TYPE_NAMES)}")
            out.append(kind)
        if len(out) != n:
            raise UsageError(f"{where}: layer_types lists {len(out)} layers, num_hidden_layers is {n}")
        return tuple(out)
    interval = cfg.get("full_attention_interval")
    if interval:
        return layer_types_from_interval(n, int(interval), LINEAR)
    window = cfg.get("sliding_window")
    if window and model_type.startswith("gemma2"):
        return layer_types_from_interval(n, 2, SLIDING)
    pattern = cfg.get("sliding_window_pattern")
    if window and model_type.startswith("gemma3"):
        return layer_types_from_interval(n, int(pattern or 6), SLIDING)
    if window and cfg.get("use_sliding_window") and pattern:
        return layer_types_from_interval(n, int(pattern), SLIDING)
    return (FULL,) * n


def _hf_quant(cfg: dict[str, Any], top: dict[str, Any], where: str) -> tuple[str | None, int | None]:
    q = top.get("quantization_config") or cfg.get("quantization_config")
    if not q:
        dtype = str(top.get("torch_dtype") or top.get("dtype") or cfg.get("torch_dtype") or "").lower()
        return {"bfloat16": "bf16", "float16": "fp16", "float32": None}.get(dtype, None), None
    method = str(q.get("quant_method", "")).lower()
    bits = q.get("bits")
    group = q.get("group_size")
    group = int(group) if isinstance(group, int) and group > 0 else None
    if method in ("gptq", "gptq_marlin"):
        return f"gptq-int{int(bits or 4)}" if int(bits or 4) in (4, 8) else None, group
    if method in ("awq", "awq_marlin"):
        return "awq-int4", group
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", None
    if method == "mxfp4":
        return "mxfp4", None
    if method == "compressed-tensors":
        text = json.dumps(q).lower()
        if '"type": "float"' in text and '"num_bits": 8' in text:
            return "fp8", None
        if '"num_bits": 8' in text:
            return "int8", None
        if '"num_bits": 4' in text:
            return "gptq-int4", group
    raise UsageError(f"{where}: quantization_config.quant_method {method!r} is not one the planner knows; "
                     "give --quant explicitly")


def _safetensors_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise UsageError(f"{path}: too short for a safetensors file")
        (length,) = struct.unpack("<Q", raw)
        if length > _HEADER_CAP:
            raise UsageError(f"{path}: safetensors header claims {length} bytes; not a safetensors file")
        try:
            header = json.loads(fh.read(length))
        except ValueError:
            raise UsageError(f"{path}: safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise UsageError(f"{path}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    return header


def _tensor_sizes(folder: Path) -> tuple[dict[str, tuple[int, int, str]], int | None, str]:
    """name -> (bytes, elements, dtype) from every *.safetensors file; or the index's total_size."""
    files = sorted(folder.glob("*.safetensors"))
    tensors: dict[str, tuple[int, int, str]] = {}
    for f in files:
        for name, info in _safetensors_header(f).items():
            try:
                start, end = info["data_offsets"]
                elements = 1
                for d in info["shape"]:
                    elements *= int(d)
            except (KeyError, TypeError, ValueError):
                raise UsageError(f"{f}: tensor {name!r} has no valid data_offsets/shape") from None
            tensors[name] = (int(end) - int(start), elements, str(info.get("dtype", "")))
    if tensors:
        return tensors, None, f"{len(files)} safetensors file(s)"
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text(encoding="utf-8"))["metadata"]["total_size"]
            return {}, int(total), "model.safetensors.index.json total_size"
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"{index}: no metadata.total_size") from None
    return {}, None, ""


# Mixture-of-experts config keys by architecture (transformers' configuration_*.py):
# (experts, experts per token, expert FFN width, shared-expert width key, shared experts count key,
#  dense-first-layers key, expert biases)
_MOE_KEYS: dict[str, tuple[str, str, str, str | None, str | None, str | None, bool]] = {
    "qwen2_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "shared_expert_intermediate_size", None, None, False),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size", None, None, None, False),
    "mixtral": ("num_local_experts", "num_experts_per_tok", "intermediate_size", None, None, None, False),
    "deepseek_v2": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", None, "n_shared_experts",
                    "first_k_dense_replace", False),
    "deepseek_v3": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", None, "n_shared_experts",
                    "first_k_dense_replace", False),
    "gpt_oss": ("num_local_experts", "num_experts_per_tok", "intermediate_size", None, None, None, True),
}
_MOE_HINTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok",
              "expert_interval", "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers")


def _hf_moe(cfg: dict[str, Any], model_type: str, n: int, where: str) -> dict[str, Any]:
    """MoE fields of a ModelSpec from config.json; a MoE layout the planner does not know is refused
    (sized as dense it would be wrong by up to 10x)."""
    keys = _MOE_KEYS.get(model_type)
    hinted = [k for k in _MOE_HINTS if cfg.get(k) not in (None, 0, [], 1) or (k == "num_experts" and cfg.get(k))]
    if keys is None:
        if any(cfg.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts")):
            raise UsageError(
                f"{where}: model_type {model_type!r} is a mixture of experts ({', '.join(hinted)}) whose layout the "
                f"planner does not know (it knows {', '.join(sorted(_MOE_KEYS))}); it cannot size it without "
                "being wrong, so it refuses"
            )
        return {}
    e_key, k_key, ff_key, shared_key, n_shared_key, dense_key, bias = keys
    experts = _cfg_int(cfg, where, e_key)
    per_tok = _cfg_int(cfg, where, k_key)
    ff = _cfg_int(cfg, where, ff_key)
    shared = int(cfg.get(shared_key) or 0) if shared_key else 0
    if n_shared_key:
        shared = int(cfg.get(n_shared_key) or 0) * ff
    first = int(cfg.get(dense_key) or 0) if dense_key else 0
    sparse_step = int(cfg.get("decoder_sparse_step") or 1)
    mlp_only = cfg.get("mlp_only_layers") or []
    if sparse_step != 1 or mlp_only or cfg.get("moe_layer_freq") not in (None, 1):
        raise UsageError(
            f"{where}: MoE layers on only some layers (decoder_sparse_step {sparse_step}, mlp_only_layers "
            f"{mlp_only}, moe_layer_freq {cfg.get('moe_layer_freq')}) are not modelled; the planner refuses rather "
            "than size it wrong"
        )
    if not 0 < per_tok <= experts or first >= n:
        raise UsageError(f"{where}: {k_key} {per_tok} / {e_key} {experts} / {dense_key} {first} do not describe a "
                         "mixture of experts")
    return {"num_experts": experts, "num_experts_per_tok": per_tok, "moe_intermediate": ff,
            "shared_intermediate": shared, "moe_first_layer": first, "moe_bias": bias}


def _hf_mla(cfg: dict[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """DeepSeek multi-head latent attention fields (kv_lora_rank present)."""
    if not cfg.get("kv_lora_rank"):
        return {}
    return {
        "mla_kv_lora_rank": _cfg_int(cfg, where, "kv_lora_rank"),
        "mla_q_lora_rank": int(cfg.get("q_lora_rank") or 0),
        "mla_qk_nope_head_dim": _cfg_int(cfg, where, "qk_nope_head_dim"),
        "mla_qk_rope_head_dim": _cfg_int(cfg, where, "qk_rope_head_dim"),
        "mla_v_head_dim": _cfg_int(cfg, where, "v_head_dim"),
    }


def read_hf_folder(folder: Path) -> ModelSpec:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"{folder}: no config.json (a Hugging Face model folder has one)")
    try:
        top = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{cfg_path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(top, dict):
        raise UsageError(f"{cfg_path}: expected a JSON object")
    text_config = top.get("text_config")
    cfg: dict[str, Any] = text_config if isinstance(text_config, dict) else top
    where = f"{cfg_path}" + (" text_config" if cfg is not top else "")
    model_type = str(cfg.get("model_type") or top.get("model_type") or "")
    n = _cfg_int(cfg, where, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _cfg_int(cfg, where, "hidden_size", "n_embd", "d_model")
    heads = _cfg_int(cfg, where, "num_attention_heads", "n_head")
    kv_heads = _cfg_int(cfg, where, "num_key_value_heads", default=heads)
    head_dim = _cfg_int(cfg, where, "head_dim", default=hidden // heads)
    intermediate = _cfg_int(cfg, where, "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)
    vocab = _cfg_int(cfg, where, "vocab_size")
    # transformers' PretrainedConfig defaults tie_word_embeddings to True: a config without the key
    # (Gemma's) ties lm_head to the embeddings.
    tie = bool(cfg.get("tie_word_embeddings", top.get("tie_word_embeddings", True)))
    moe = _hf_moe(cfg, model_type, n, where)
    mla = _hf_mla(cfg, model_type, where)
    max_ctx = _cfg_int(cfg, where, "max_position_embeddings", "n_positions", "max_sequence_length", default=4096)
    layer_types = _hf_layer_types(cfg, n, model_type, where)
    window = cfg.get("sliding_window") if SLIDING in layer_types else None
    file_quant, group = _hf_quant(cfg, top, where)

    tensors, index_total, size_source = _tensor_sizes(folder)
    total = embed = output = None
    vision_elems = 0
    params = None
    if tensors:
        total = sum(b for b, _, _ in tensors.values())
        embed = sum(b for name, (b, _, _) in tensors.items() if name.endswith("embed_tokens.weight")
                    and not any(m in name for m in _VISION_MARKERS))
        output = sum(b for name, (b, _, _) in tensors.items() if name.endswith("lm_head.weight"))
        vision_elems = sum(e for name, (_, e, _) in tensors.items() if any(m in name for m in _VISION_MARKERS))
        float_only = all(dt in ("F16", "BF16", "F32", "F64") for _, _, dt in tensors.values())
        if float_only:
            params = sum(e for _, e, _ in tensors.values())
        if not embed:
            embed = None
    elif index_total is not None:
        total = index_total
    if mla:
        head_dim = mla["mla_qk_nope_head_dim"] + mla["mla_qk_rope_head_dim"]
    return ModelSpec(
        name=folder.name,
        num_layers=n,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=vocab,
        tie_embeddings=tie,
        max_context=max_ctx,
        layer_types=layer_types,
        sliding_window=int(window) if window else None,
        attn_output_gate=bool(cfg.get("attn_output_gate", False)),
        linear_num_key_heads=int(cfg.get("linear_num_key_heads") or 0),
        linear_num_value_heads=int(cfg.get("linear_num_value_heads") or 0),
        linear_key_head_dim=int(cfg.get("linear_key_head_dim") or 0),
        linear_value_head_dim=int(cfg.get("linear_value_head_dim") or 0),
        linear_conv_kernel_dim=int(cfg.get("linear_conv_kernel_dim") or 0),
        vision_params=float(vision_elems),
        mtp_layers=int(cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 0),
        attention_bias=bool(cfg.get("attention_bias", False)) and model_type == "gpt_oss",
        fused_qkv=model_type == "phi3",
        fused_gate_up=model_type == "phi3",
        **moe,
        **mla,
        model_type=model_type,
        sources=(f"{cfg_path}" + (f"; sizes from {size_source}" if size_source else "; no weight files: sizes computed"),),
        origin="hf",
        path=str(folder),
        file_params=params,
        file_weights_bytes=total,
        file_embed_bytes=embed,
        file_output_bytes=(0 if tie and not output else output) if tensors else None,
        file_quant=file_quant,
        file_group_size=group,
    )


# -------------------------------------------------------------------------------------------- GGUF


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception:  # a field the package cannot decode is as good as absent
        return None


def _per_layer(value: Any, n: int) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [int(v) for v in value] if len(value) == n else None
    return [int(value)] * n


def read_gguf(path: Path) -> ModelSpec:
    from llmfleet.knowledge.gguf_header import GGUFHeader  # the standard library only: no gguf, no numpy

    try:
        reader = GGUFHeader(str(path), "r")
    except Exception as exc:
        raise UsageError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    arch = _field(reader, "general.architecture")
    if not arch:
        raise UsageError(f"{path}: no general.architecture in the GGUF header")
    arch = str(arch)

    def key(name: str) -> Any:
        return _field(reader, f"{arch}.{name}")

    n = key("block_count")
    hidden = key("embedding_length")
    heads = key("attention.head_count")
    if n is None or hidden is None or heads is None:
        raise UsageError(f"{path}: GGUF header lacks {arch}.block_count / embedding_length / attention.head_count")
    n, hidden = int(n), int(hidden)
    heads_l = _per_layer(heads, n) or [0] * n
    kv_l = _per_layer(key("attention.head_count_kv"), n) or list(heads_l)
    n_heads = max(heads_l)
    head_dim = int(key("attention.key_length") or hidden // max(1, n_heads))
    ffn = _per_layer(key("feed_forward_length"), n)
    intermediate = max(ffn) if ffn else 4 * hidden

    tensors = {t.name: t for t in reader.tensors}
    window = key("attention.sliding_window")
    types = _gguf_layer_types(key, tensors, n, kv_l, arch, bool(window))

    emb = tensors.get("token_embd.weight")
    out = tensors.get("output.weight")
    vocab = int(key("vocab_size") or (len(_field(reader, "tokenizer.ggml.tokens") or []) or 0)
                or (int(max(emb.shape)) if emb is not None else 0))
    if not vocab:
        raise UsageError(f"{path}: cannot tell the vocabulary size (no token_embd.weight, no tokenizer)")
    attn_kv = [kv_l[i] for i in range(n) if types[i] != LINEAR and kv_l[i] > 0]
    file_type = _field(reader, "general.file_type")
    quant = find_gguf_quant(int(file_type)) if file_type is not None else None
    quant_name = quant.name if quant else _dominant_type(reader)
    total = sum(int(t.n_bytes) for t in reader.tensors)
    params = sum(int(t.n_elements) for t in reader.tensors)
    name = _field(reader, "general.name") or path.stem
    n_expert, n_used, exps_bytes = _gguf_experts(reader, key, path, arch)
    lin_k_heads = int(key("ssm.group_count") or 0)
    lin_v_heads = int(key("ssm.time_step_rank") or 0)
    inner = int(key("ssm.inner_size") or 0)
    return ModelSpec(
        name=str(name),
        num_layers=n,
        hidden=hidden,
        heads=n_heads,
        kv_heads=max(attn_kv) if attn_kv else max(kv_l),
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=vocab,
        tie_embeddings=out is None,
        max_context=int(key("context_length") or 4096),
        layer_types=tuple(types),
        sliding_window=int(window) if window else None,
        linear_num_key_heads=lin_k_heads,
        linear_num_value_heads=lin_v_heads,
        linear_key_head_dim=int(key("ssm.state_size") or 0),
        linear_value_head_dim=inner // lin_v_heads if lin_v_heads else 0,
        linear_conv_kernel_dim=int(key("ssm.conv_kernel") or 0),
        model_type=arch,
        sources=(f"{path}: GGUF header and tensor table ({len(reader.tensors)} tensors)",),
        origin="gguf",
        path=str(path),
        file_params=params,
        file_weights_bytes=total,
        file_embed_bytes=int(emb.n_bytes) if emb is not None else 0,
        file_output_bytes=int(out.n_bytes) if out is not None else 0,
        file_quant=quant_name,
        num_experts=n_expert if n_expert > 1 else 0,
        num_experts_per_tok=n_used if n_expert > 1 else 0,
        moe_intermediate=int(key("expert_feed_forward_length") or intermediate) if n_expert > 1 else 0,
        file_expert_bytes=exps_bytes if n_expert > 1 else None,
    )


def _gguf_layer_types(key: Callable[[str], Any], tensors: dict[str, Any], n: int, kv_l: list[int], arch: str,
                      window: bool) -> list[str]:
    """Which layers attend: a block with attn_k / attn_qkv weights keeps a KV cache; a block with
    ssm_* weights is linear attention (recurrent state); a sliding-window pattern or a full-attention
    interval marks the others."""
    types: list[str] = []
    for i in range(n):
        has_attn = any(f"blk.{i}.{t}.weight" in tensors for t in ("attn_k", "attn_qkv", "attn_q"))
        has_ssm = any(name.startswith(f"blk.{i}.ssm_") for name in tensors)
        types.append(LINEAR if (has_ssm and not has_attn) or (kv_l[i] == 0 and has_ssm) else FULL)
    if window:
        pattern = key("attention.sliding_window_pattern")
        if isinstance(pattern, list) and len(pattern) == n:
            # llama.cpp stores a bool per layer: true = sliding window
            types = [SLIDING if (bool(s) and t == FULL) else t for s, t in zip(pattern, types, strict=True)]
        else:
            every = int(pattern) if isinstance(pattern, int) and pattern > 0 else (2 if arch == "gemma2" else 6)
            types = [SLIDING if (t == FULL and (i + 1) % every) else t for i, t in enumerate(types)]
    interval = key("full_attention_interval")
    if interval and not any(t == LINEAR for t in types):
        types = list(layer_types_from_interval(n, int(interval), LINEAR))
    return types


def _gguf_experts(reader: Any, key: Callable[[str], Any], path: Path, arch: str) -> tuple[int, int, int]:
    """(experts per layer, experts a token uses, bytes of the routed-expert tensors) of a GGUF file.
    Routed experts are stored as 3-D *_exps tensors (one per layer and role)."""
    n_expert = int(key("expert_count") or 0)
    n_used = int(key("expert_used_count") or 0)
    # (older files, e.g. the first Mixtral GGUFs, keep one 2-D tensor per expert: blk.N.ffn_up.E.weight)
    exps_bytes = sum(int(t.n_bytes) for t in reader.tensors
                     if "_exps." in t.name or re.fullmatch(r"blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight", t.name))
    if n_expert and not (0 < n_used <= n_expert):
        raise UsageError(f"{path}: {arch}.expert_used_count {n_used} / expert_count {n_expert} do not describe a "
                         "mixture of experts")
    if n_expert > 1 and not exps_bytes:
        raise UsageError(f"{path}: {arch}.expert_count {n_expert} but no expert tensors; the planner cannot tell "
                         "which bytes a token reads and refuses rather than size it wrong")
    return n_expert, n_used, exps_bytes


def _dominant_type(reader: Any) -> str:
    """The ggml type holding the most bytes, for files whose general.file_type is not in the catalog."""
    by_type: dict[str, int] = {}
    for t in reader.tensors:
        name = getattr(t.tensor_type, "name", str(t.tensor_type)).lower()
        by_type[name] = by_type.get(name, 0) + int(t.n_bytes)
    return "gguf-" + max(by_type, key=by_type.__getitem__) if by_type else "gguf"
