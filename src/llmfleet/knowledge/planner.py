"""Capacity planner: will a model fit a card, with which engine flags, and how fast can it decode.

Pure: a ``PlanRequest`` in, a ``Plan`` out. Figures come from the catalogs (GPUs, quantization
formats, models, planner assumptions) or, for a model folder / .gguf file, from ``modelinfo``.

The arithmetic, per GPU for vLLM tensor parallel (everything shards) and over all cards for
llama.cpp (layers split across cards):

    budget      = memory.total x gpu_memory_utilization
    KV pool     = budget - weights on the GPU - overhead (CUDA context, activations, CUDA graphs)
    KV/sequence = context x bytes/token of full-attention layers
                  + min(context, window) x bytes/token of sliding-window layers
                  + a fixed recurrent state for linear-attention layers
    ceiling     = memory bandwidth / (weights read per token + KV read at that context)

A plan that leaves weights off the GPU is refused unless offload is asked for explicitly; then
the predicted speed is bound by host memory (llama.cpp) or PCIe (vLLM).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.knowledge import arch_support, compat, parallel
from llmfleet.knowledge.catalog import (
    FULL,
    LINEAR,
    SLIDING,
    EngineAssumptions,
    Gpu,
    ModelSpec,
    ParallelAssumptions,
    Quant,
    default_memory_reserved_mib,
    engine_assumptions,
    find_gpu,
    find_model,
    find_quant,
    ggml_type_bits,
    kv_dtypes,
    load_quants,
    min_context,
    parallel_assumptions,
    speed_assumptions,
)
from llmfleet.knowledge.engines import EngineKnowledge, KvLayoutInfo, for_engine, for_quant_family
from llmfleet.knowledge.engines import names as engine_names
from llmfleet.knowledge.engines.base import PlanFlags

# Tokens in context while the health check measures decode speed (a one-line prompt and a short
# answer, release.health): the floor is computed for this context, not the planned one.
HEALTH_PROBE_CONTEXT = 512
GB = 1e9
GIB = 1024**3


# ------------------------------------------------------------------------------------------ request


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    model: str | ModelSpec
    quant: str | None = None
    gpu: Gpu | str
    gpus: int = 1
    context: int | None = None
    concurrency: int = 1
    engine: str | None = None  # None: llamacpp for GGUF, vllm otherwise
    kv_dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    offload: bool = False
    image: str | None = None  # engine catalog key of the image that serves (engines.yaml images)
    # The service's own engine_args / env: they come after the planned flags (later flags win), so
    # the flag rules judge the two together, as the preflight does.
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    # Split over hosts: ``gpus`` is then the GPUs of EACH host. vLLM: pipeline parallel over Ray, one
    # stage per host; llama.cpp: the head plus hosts - 1 workers running rpc-server.
    hosts: int = 1
    network_gbps: float | None = None  # Gbit/s between the hosts (llmfleet_network_gbps); None: planner.yaml
    network_latency_us: float | None = None  # one way per message; None: planner.yaml's range
    split_mode: str | None = None  # llama.cpp: layer (default) or row (one host)
    interconnect: str | None = None  # nvlink / pcie between the cards of a host; None: the card's catalog entry
    gpus_available: int | None = None  # cards on the host, for the alternatives (None: try 2, 4, 8)
    # The host's NVIDIA driver (facts, or --driver): the default image is one that runs on it, and an
    # image given is judged against it (a note with what runs instead: compat.driver_alternatives).
    driver: str | None = None
    # The bandwidth efficiency a fleet measured for this card class (``invoke speed --write``: the
    # speed overlay's fitted figure) and where: it replaces the catalog's range in the realistic figure.
    measured_efficiency: tuple[float, str] | None = None


# ------------------------------------------------------------------------------------------ weights


@dataclass(frozen=True)
class Weights:
    params: int
    total_bytes: int
    embed_bytes: int  # token-embedding table
    output_bytes: int  # lm_head / output.weight; 0 when tied to the embeddings
    layer_bytes: int  # all transformer blocks together (every expert)
    other_bytes: int  # final norm, vision tower, multi-token-prediction layers
    source: str
    vision_bytes: int = 0  # part of other_bytes: a vision tower, not read while decoding text
    mtp_bytes: int = 0  # part of other_bytes: multi-token-prediction layers, loaded only for MTP speculation
    inactive_expert_bytes: int = 0  # part of layer_bytes: the routed experts a token does not use
    active_params: int = 0  # parameters on one token's path (both embedding tables counted)
    embed_params: int = 0

    @property
    def tied(self) -> bool:
        return self.output_bytes == 0

    @property
    def read_per_token(self) -> int:
        """Bytes a batch-1 decode step reads: everything except an untied embedding table (one row
        per token is gathered), a vision tower (idle while decoding text), multi-token-prediction
        layers and the routed experts the token is not sent to."""
        untied_embed = 0 if self.tied else self.embed_bytes
        return self.total_bytes - untied_embed - self.vision_bytes - self.mtp_bytes - self.inactive_expert_bytes

    def loaded_bytes(self, engine: str) -> int:
        """Bytes the engine keeps in GPU memory: vLLM loads everything but the MTP layers; llama.cpp
        keeps an untied token-embedding table in host memory (its vision tower is a separate file)."""
        on_gpu = for_engine(engine).embedding_on_gpu
        return self.total_bytes - (0 if self.tied or on_gpu else self.embed_bytes) - self.mtp_bytes

    @property
    def active_params_without_input_embedding(self) -> int:
        """Active parameters the way DeepSeek and OpenAI count them: the input embedding table is a
        lookup, not a matmul."""
        return self.active_params - self.embed_params


def _use_more_bits(i: int, n: int) -> bool:
    # llama.cpp src/llama-quant.cpp: first and last eighth of the layers, and every third between.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# llama-quant.cpp tensor_type_fallback: K-quants need rows that are a multiple of 256.
_K_FALLBACK = {"q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
_BLOCK = {"q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q8_0": 32, "mxfp4": 32,
          "q2_k": 256, "q3_k": 256, "q4_k": 256, "q5_k": 256, "q6_k": 256}


@dataclass(frozen=True)
class _Mat:
    role: str  # llama.cpp tensor name stem (attn_q, ffn_down_exps, ...)
    rows: int  # row length (ggml ne[0]: the input dimension)
    cols: int  # output dimension
    count: int = 1  # copies (experts)
    active: int = 1  # copies one token reads
    expert: bool = False  # routed experts (quantized by expert-only formats)
    quantize: bool = True  # llama-quantize leaves the router (ffn_gate_inp) alone

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count


def _attention_matrices(spec: ModelSpec, i: int) -> list[_Mat]:
    h = spec.hidden
    if spec.layer_types[i] == LINEAR:  # Gated DeltaNet linear attention
        kdim = spec.linear_num_key_heads * spec.linear_key_head_dim
        vdim = spec.linear_num_value_heads * spec.linear_value_head_dim
        return [_Mat("ssm_in", h, 2 * kdim + 2 * vdim), _Mat("ssm_ba", h, 2 * spec.linear_num_value_heads),
                _Mat("ssm_out", vdim, h)]
    if spec.is_mla:  # DeepSeek multi-head latent attention
        qk = spec.mla_qk_nope_head_dim + spec.mla_qk_rope_head_dim
        mats = []
        if spec.mla_q_lora_rank:
            mats += [_Mat("attn_q_a", h, spec.mla_q_lora_rank), _Mat("attn_q_b", spec.mla_q_lora_rank, spec.heads * qk)]
        else:
            mats += [_Mat("attn_q", h, spec.heads * qk)]
        mats += [
            _Mat("attn_kv_a_mqa", h, spec.mla_kv_lora_rank + spec.mla_qk_rope_head_dim),
            _Mat("attn_kv_b", spec.mla_kv_lora_rank, spec.heads * (spec.mla_qk_nope_head_dim + spec.mla_v_head_dim)),
            _Mat("attn_output", spec.heads * spec.mla_v_head_dim, h),
        ]
        return mats
    q_out = spec.heads * spec.head_dim * (2 if spec.attn_output_gate else 1)
    kv_out = spec.kv_heads * spec.head_dim
    if spec.fused_qkv:
        qkv = [_Mat("attn_qkv", h, q_out + 2 * kv_out)]
    else:
        qkv = [_Mat("attn_q", h, q_out), _Mat("attn_k", h, kv_out), _Mat("attn_v", h, kv_out)]
    return qkv + [_Mat("attn_output", spec.heads * spec.head_dim, h)]


def _mlp_matrices(spec: ModelSpec, i: int) -> list[_Mat]:
    h = spec.hidden
    if not spec.is_moe_layer(i):
        ff = spec.intermediate
        if spec.fused_gate_up:
            return [_Mat("ffn_up", h, 2 * ff), _Mat("ffn_down", ff, h)]
        return [_Mat("ffn_gate", h, ff), _Mat("ffn_up", h, ff), _Mat("ffn_down", ff, h)]
    e, k, ff = spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate
    mats = [
        _Mat("ffn_gate_inp", h, e, quantize=False),
        _Mat("ffn_gate_exps", h, ff, e, k, expert=True),
        _Mat("ffn_up_exps", h, ff, e, k, expert=True),
        _Mat("ffn_down_exps", ff, h, e, k, expert=True),
    ]
    if spec.shared_intermediate:
        s = spec.shared_intermediate
        mats += [_Mat("ffn_gate_shexp", h, s), _Mat("ffn_up_shexp", h, s), _Mat("ffn_down_shexp", s, h)]
    return mats


def _layer_small_params(spec: ModelSpec, i: int) -> tuple[int, int]:
    """(parameters, of which read per token) of layer i's norms, biases, conv kernels and other 1-D
    tensors (kept 16/32 bit)."""
    h = spec.hidden
    n = 2 * h
    kind = spec.layer_types[i]
    if kind == LINEAR:
        kdim = spec.linear_num_key_heads * spec.linear_key_head_dim
        vdim = spec.linear_num_value_heads * spec.linear_value_head_dim
        n += (2 * kdim + vdim) * spec.linear_conv_kernel_dim + 2 * spec.linear_num_value_heads + spec.linear_value_head_dim
    elif spec.is_mla:
        n += spec.mla_kv_lora_rank + spec.mla_q_lora_rank
    elif spec.attention_bias:
        n += spec.heads * spec.head_dim + 2 * spec.kv_heads * spec.head_dim + h + spec.heads  # q/k/v/o biases, sinks
    if spec.is_moe_layer(i) and spec.moe_bias:  # gpt-oss: biases per expert and on the router
        per_expert = 2 * spec.moe_intermediate + h
        return n + spec.num_experts * (per_expert + 1), n + spec.num_experts_per_tok * per_expert + spec.num_experts
    return n, n


def _layer_is_attention(spec: ModelSpec, i: int) -> bool:
    return spec.layer_types[i] != LINEAR


class _GgufTypes:
    """llama.cpp's llama_tensor_get_type for one file type (quants.yaml rules; src/llama-quant.cpp):
    which ggml type each tensor gets, with its counters over the attention-V-like tensors."""

    def __init__(self, spec: ModelSpec, quant: Quant):
        self.spec, self.quant = spec, quant
        self.base = quant.base or "f16"
        self.quantized = self.base in _BLOCK
        self.n_wv = sum(1 for i in range(spec.num_layers) if _layer_is_attention(spec, i))
        self.i_wv = 0
        self.moe8 = spec.num_experts == 8
        # LLM_TYPE_70B: llama / qwen2 with 80 layers (llama-model.cpp load_hparams).
        self.is_70b = spec.num_layers == 80 and spec.model_type in ("llama", "qwen2")

    def _fallback(self, t: str, row: int) -> str:
        if t in _BLOCK and row % _BLOCK[t]:
            t = _K_FALLBACK.get(t, "f16")
            if t in _BLOCK and row % _BLOCK[t]:
                t = "f16"
        return t

    def output(self, row: int) -> str:
        if not self.quantized:
            return self.base
        if row % _BLOCK.get(self.base, 1):
            return "q8_0"
        if self.quant.rule("output") and self.base != "q8_0":
            return self.quant.rule("output") or self.base
        return self.base

    def token_embd(self, row: int) -> str:
        return self._fallback(self.quant.rule("token_embd") or self.base, row) if self.quantized else self.base

    def matrix(self, m: _Mat, layer: int) -> str:
        if m.quantize and m.role.endswith("_exps") and self.spec.gguf_expert_type:
            return self.spec.gguf_expert_type  # kept as published (gpt-oss: MXFP4 in every quant)
        if not self.quantized or not m.quantize:
            return "f32" if not m.quantize else self.base
        t = self.base
        role = m.role
        if role == "ffn_gate_exps" and self.quant.rule("experts"):
            t = self.quant.rule("experts") or t
        elif role in ("ffn_up_exps", "ffn_down_exps") and self.quant.rule("experts"):
            t = self.quant.rule("experts") or t
        elif self.quant.rule("non_experts") and not m.expert:
            t = self.quant.rule("non_experts") or t
        elif role in ("attn_v", "attn_qkv", "attn_kv_b"):  # category_is_attn_v
            more = self.quant.rule("attn_v_more_bits")
            if more and _use_more_bits(self.i_wv, self.n_wv):
                t = more
            if self.quant.rule("attn_v_first4") and self.i_wv < 4:
                t = self.quant.rule("attn_v_first4") or t
            if self.is_70b and t in ("q3_k", "q4_k") and self.quant.rule("attn_v_70b"):
                t = self.quant.rule("attn_v_70b") or t
            if self.moe8 and self.quant.rule("moe8_attn_v"):
                t = self.quant.rule("moe8_attn_v") or t
            self.i_wv += 1
        elif role == "attn_k" and self.moe8 and self.quant.rule("moe8_attn_k"):
            t = self.quant.rule("moe8_attn_k") or t
        elif role.startswith("ffn_down"):
            more = self.quant.rule("ffn_down_more_bits")
            if more and _use_more_bits(layer, self.spec.num_layers):
                t = more
            if self.quant.rule("ffn_down_first_eighth") and layer < self.spec.num_layers // 8:
                t = self.quant.rule("ffn_down_first_eighth") or t
        elif role == "attn_output" and self.moe8 and self.quant.rule("moe8_attn_output"):
            t = self.quant.rule("moe8_attn_output") or t
        return self._fallback(t, m.rows)


def compute_weights(spec: ModelSpec, quant: Quant) -> Weights:
    """Weight bytes of a model in a quantization format, from its shapes: every expert counts toward
    the size; only the experts a token is routed to count toward the bytes read per token."""
    bits = ggml_type_bits()
    embed_params = spec.vocab * spec.hidden
    gguf = quant.family == "gguf"
    small_bits = 32.0 if gguf else 16.0
    types = _GgufTypes(spec, quant) if gguf else None
    layer_bits = inactive_bits = 0.0
    params = active = 0
    for i in range(spec.num_layers):
        for m in _attention_matrices(spec, i) + _mlp_matrices(spec, i):
            params += m.params
            active += m.rows * m.cols * m.active
            if types is not None:
                b = bits[types.matrix(m, i)]
            elif not m.quantize or (quant.experts_only and not m.expert):
                b = 16.0
            else:
                b = quant.linear_bits_per_weight
                if quant.per_channel_scale:
                    b += 32.0 / m.rows  # one fp32 scale per output channel
            layer_bits += m.params * b
            inactive_bits += m.rows * m.cols * (m.count - m.active) * b
        small, small_active = _layer_small_params(spec, i)
        params += small
        active += small_active
        layer_bits += small * small_bits
        inactive_bits += (small - small_active) * small_bits
    if types is not None:
        out_type = types.output(spec.hidden)
        if spec.tie_embeddings:
            embed_bits, output_bits = bits[out_type], 0.0  # token_embd doubles as output: output rule
        else:
            embed_bits, output_bits = bits[types.token_embd(spec.hidden)], bits[out_type]
        vision_bytes = 0  # llama.cpp keeps a vision tower in a separate mmproj file
        mtp_params = 0  # converters leave multi-token-prediction layers out (U)
    else:
        embed_bits = 16.0
        output_bits = 0.0 if spec.tie_embeddings else 16.0
        vision_bytes = int(spec.vision_params * 2)
        mtp_params = _mtp_params(spec)
    embed_bytes = int(embed_params * embed_bits / 8)
    output_bytes = int(embed_params * output_bits / 8)
    final_norm_bytes = int(spec.hidden * small_bits / 8)
    mtp_bytes = int(mtp_params * 2)
    layer_bytes = int(layer_bits / 8)
    n_embed = embed_params * (1 if spec.tie_embeddings else 2)
    params += n_embed + spec.hidden + int(0 if gguf else spec.vision_params) + mtp_params
    active += n_embed + spec.hidden
    total = embed_bytes + output_bytes + layer_bytes + final_norm_bytes + vision_bytes + mtp_bytes
    return Weights(
        params=params,
        total_bytes=total,
        embed_bytes=embed_bytes,
        output_bytes=output_bytes,
        layer_bytes=layer_bytes,
        other_bytes=final_norm_bytes + vision_bytes + mtp_bytes,
        source=f"computed from the model's shapes and {quant.name} bits per weight"
        + (" (llama.cpp llama_tensor_get_type rules)" if gguf else ""),
        vision_bytes=vision_bytes,
        mtp_bytes=mtp_bytes,
        inactive_expert_bytes=int(inactive_bits / 8),
        active_params=active,
        embed_params=embed_params,
    )


def _mtp_params(spec: ModelSpec) -> int:
    """Multi-token-prediction layers: one full-attention decoder layer each, plus the projection of
    [embedding; hidden] (2h -> h) and its norms (Qwen3-Next / Qwen3.5 and DeepSeek-V3 layout)."""
    if not spec.mtp_layers:
        return 0
    h = spec.hidden
    one = sum(m.params for m in _attention_matrices(spec, spec.num_layers - 1) + _mlp_matrices(spec, spec.num_layers - 1))
    one += _layer_small_params(spec, spec.num_layers - 1)[0] + 2 * h * h + 3 * h
    return spec.mtp_layers * one


def _file_weights(spec: ModelSpec, computed: Weights) -> Weights:
    total = int(spec.file_weights_bytes or 0)
    embed = int(spec.file_embed_bytes if spec.file_embed_bytes is not None else computed.embed_bytes)
    output = int(spec.file_output_bytes if spec.file_output_bytes is not None else computed.output_bytes)
    other = computed.other_bytes if spec.origin == "hf" else 0
    layers = max(0, total - embed - output - other)
    if spec.origin == "hf":
        src = "safetensors headers"
    elif spec.file_embed_bytes is None:
        src = "GGUF file's size (per-tensor sizes computed)"
    else:
        src = "GGUF tensor table"
    # The share of routed experts a token skips, from the file's own bytes when it lists them.
    if spec.file_expert_bytes is not None and spec.num_experts:
        inactive = int(spec.file_expert_bytes * (1 - spec.num_experts_per_tok / spec.num_experts))
    elif computed.layer_bytes:
        inactive = int(layers * computed.inactive_expert_bytes / computed.layer_bytes)
    else:
        inactive = 0
    return Weights(
        params=int(spec.file_params or computed.params),
        total_bytes=total,
        embed_bytes=embed,
        output_bytes=output,
        layer_bytes=layers,
        other_bytes=other,
        source=f"real byte sizes from the {src} of {spec.path}",
        vision_bytes=computed.vision_bytes if spec.origin == "hf" else 0,
        mtp_bytes=computed.mtp_bytes if spec.origin == "hf" else 0,
        inactive_expert_bytes=inactive,
        active_params=computed.active_params,
        embed_params=computed.embed_params,
    )


# ------------------------------------------------------------------------------------------ KV cache


@dataclass(frozen=True)
class KvLayout:
    """KV cache of one sequence, on one basis (per GPU for tensor parallel, or all cards)."""

    full_bytes_per_token: float
    sliding_bytes_per_token: float
    window: int | None
    state_bytes_per_sequence: float
    block_size: int = 1

    def per_sequence(self, context: int) -> float:
        ctx = context
        if self.block_size > 1:
            ctx = math.ceil(context / self.block_size) * self.block_size
        swa = min(ctx, self.window) if self.window else ctx
        return ctx * self.full_bytes_per_token + swa * self.sliding_bytes_per_token + self.state_bytes_per_sequence


def kv_layout(spec: ModelSpec, kv_bytes: float, tp: int = 1, block_size: int = 1, swa_cache: bool = True) -> KvLayout:
    """KV bytes per token: 2 (K and V) x layers x KV heads x head_dim x bytes per value.

    With tensor parallel each GPU holds max(1, kv_heads // tp) heads (vLLM replicates heads when
    tp > kv_heads). Multi-head latent attention (DeepSeek) caches one compressed vector of
    kv_lora_rank + qk_rope_head_dim values per layer and token, on every GPU. Linear-attention
    layers keep a recurrent state (``linear_state_bytes`` per value; float32 where the engine runs it
    so) and a convolution state (16 bit) instead. ``swa_cache`` False: the engine build keeps a full
    context of KV on the sliding-window layers too (llama.cpp before its SWA cache, vLLM V0).
    """
    if spec.is_mla:
        per_layer = (spec.mla_kv_lora_rank + spec.mla_qk_rope_head_dim) * kv_bytes
    else:
        heads = max(1, spec.kv_heads // tp) if tp > 1 else spec.kv_heads
        per_layer = 2 * heads * spec.head_dim * kv_bytes
    full = spec.count(FULL) * per_layer
    sliding = spec.count(SLIDING) * per_layer
    window = spec.sliding_window if spec.count(SLIDING) else None
    if (window is None or not swa_cache) and sliding:
        full, sliding, window = full + sliding, 0.0, None
    state = 0.0
    n_linear = spec.count(LINEAR)
    if n_linear:
        v_heads = max(1, spec.linear_num_value_heads // tp)
        k_heads = max(1, spec.linear_num_key_heads // tp)
        recurrent = v_heads * spec.linear_key_head_dim * spec.linear_value_head_dim * spec.linear_state_bytes
        conv = (2 * k_heads * spec.linear_key_head_dim + v_heads * spec.linear_value_head_dim) * max(
            0, spec.linear_conv_kernel_dim - 1
        ) * 2.0
        state = n_linear * (recurrent + conv)
    return KvLayout(full, sliding, window, state, block_size)


# ------------------------------------------------------------------------------------------ plan


@dataclass
class Plan:
    model: str
    model_origin: str
    quant: str
    gpu: str
    gpu_name: str
    gpus: int
    engine: str
    context: int
    concurrency: int
    kv_dtype: str
    gpu_memory_utilization: float
    params: int
    weights_bytes: int
    weights_gpu_bytes: int
    weights_source: str
    kv_bytes_per_token: int
    kv_sliding_bytes_per_token: int
    kv_sliding_window: int | None
    kv_state_bytes_per_sequence: int
    kv_bytes_per_sequence: int
    kv_cache_bytes: int
    overhead_bytes: int
    overhead_assumption: str
    memory_bytes: int
    budget_bytes: int
    fits: bool
    resident: bool
    gpu_layers: int
    total_layers: int
    max_context_tokens: int
    max_concurrency: int
    kv_cache_tokens: int | None
    decode_tokps_ceiling: float
    decode_tokps_realistic: tuple[float, float]
    efficiency: tuple[float, float]
    efficiency_assumption: str
    engine_args: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    alternatives: list[dict[str, Any]] = field(default_factory=list)

    offload_assumption: str = ""
    image: str | None = None  # the engine catalog image the flags and KV layout were judged for
    health_floor_tokps: float | None = None  # the decode floor a deploy applies (release.health)
    decode_tokps_offload_eighth: tuple[float, float] | None = None  # 1/8 of the layers off the GPU
    preflight: dict[str, Any] = field(default_factory=dict)  # the preflight's flag verdicts on the card
    engine_env: dict[str, str] = field(default_factory=dict)  # environment the flags need (VLLM_ATTENTION_BACKEND)
    # Split over cards and hosts (``gpus`` is per host). per_gpu: the tightest card's weights, KV at the
    # plan, overhead and budget; tensor_split: llama.cpp's shares in its device order (RPC devices
    # first); comm: what the split adds per token; deploy_adds: what the deploy side must add itself.
    hosts: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    split_mode: str = ""
    per_gpu: dict[str, Any] = field(default_factory=dict)
    layers_per_host: list[int] = field(default_factory=list)
    layers_per_device: list[int] = field(default_factory=list)
    tensor_split: list[int] | None = None
    comm: dict[str, Any] = field(default_factory=dict)
    deploy_adds: list[str] = field(default_factory=list)

    # The names other modules use (llmfleet.knowledge.preflight, llmfleet.release.deploy, llmfleet.release.health).
    @property
    def weight_bytes(self) -> int:
        return self.weights_bytes

    @property
    def max_context_at_concurrency(self) -> int:
        return self.max_context_tokens

    @property
    def max_concurrency_at_context(self) -> int:
        return self.max_concurrency

    @property
    def decode_ceiling_tokps(self) -> float:
        return self.decode_tokps_ceiling

    @property
    def realistic_tokps(self) -> tuple[float, float]:
        return self.decode_tokps_realistic

    @property
    def assumptions(self) -> dict[str, str]:
        """Each assumption the figures rest on, by name, with where it comes from."""
        out = {
            "weights": self.weights_source,
            "overhead": self.overhead_assumption,
            "efficiency": self.efficiency_assumption,
            "kv_cache": (
                "2 (K and V) x attention layers x KV heads x head_dim x "
                f"{self.kv_dtype} bytes per value; sliding-window layers stop at their window only where "
                f"the build ({self.image or 'unknown'}) keeps just the window, linear-attention layers keep a "
                "fixed state"
            ),
        }
        if self.offload_assumption:
            out["offload"] = self.offload_assumption
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["decode_tokps_realistic"] = list(self.decode_tokps_realistic)
        d["efficiency"] = list(self.efficiency)
        if self.decode_tokps_offload_eighth is not None:
            d["decode_tokps_offload_eighth"] = list(self.decode_tokps_offload_eighth)
        d["assumptions"] = self.assumptions
        return d


@dataclass(frozen=True)
class _Resolved:
    spec: ModelSpec
    quant: Quant
    gpu: Gpu
    engine: str
    kv_name: str
    kv_bytes: float
    kv_flag: str
    weights: Weights
    notes: tuple[str, ...]
    release: Any = None  # compat.EngineRelease judged against (None: no catalog image runs on the card)
    image_note: str = ""
    image_refusal: str = ""  # no catalog image of the engine runs on the card: what to serve it with instead


def _resolve_model(model: str | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    text = str(model)
    looks_like_path = text.lower().endswith((".gguf", "config.json")) or text.startswith((".", "~", os.sep))
    if looks_like_path or os.path.exists(os.path.expanduser(text)):
        from llmfleet.knowledge import modelinfo  # files are read only when a path is given

        return modelinfo.read_model(text)
    return find_model(text)  # a catalog name, alias or Hugging Face id ("Qwen/Qwen2.5-7B-Instruct")


def _resolve_model_id(model: str | ModelSpec) -> tuple[ModelSpec, Any]:
    """``_resolve_model``, and for a quantized repository id or GGUF file name that is not there
    (``Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4``, ``Qwen2.5-7B-Instruct-Q4_K_M.gguf``) whose base is in the
    catalog: that model, with what was assumed (``model_ids.Assumed``: its quant and a note)."""
    try:
        return _resolve_model(model), None
    except UsageError:
        if not isinstance(model, str) or os.path.exists(os.path.expanduser(model)):
            raise
        from llmfleet.knowledge.model_ids import split_quantized

        assumed = split_quantized(model)
        if assumed is None:
            raise
        return find_model(assumed.model), assumed


def _quant_named(name: str) -> Quant:
    """A catalog quant, or for a GGUF file of a type the catalog lacks, a stand-in named after it."""
    try:
        return find_quant(name)
    except UsageError:
        if not name.startswith("gguf"):
            raise
        bits = ggml_type_bits()
        base = name.removeprefix("gguf-") if name.startswith("gguf-") else "f16"
        base = base if base in bits else "f16"
        return Quant(name=name, family="gguf", bits=bits[base], base=base, sources=("the file's own tensor types",))


def _check_request(req: PlanRequest) -> None:
    """Usage errors in the request's numbers and choices, before anything is looked up."""
    if req.gpus < 1:
        raise UsageError(f"--gpus must be 1 or more, got {req.gpus}")
    if req.hosts < 1:
        raise UsageError(f"--hosts must be 1 or more, got {req.hosts}")
    if req.network_gbps is not None and not req.network_gbps > 0:
        raise UsageError(f"--network-gbps must be above 0 (Gbit/s between the hosts), got {req.network_gbps}")
    if req.network_latency_us is not None and req.network_latency_us < 0:
        raise UsageError(f"--network-latency-us must be 0 or more, got {req.network_latency_us}")
    if req.interconnect is not None and req.interconnect not in ("nvlink", "pcie"):
        raise UsageError(f"--interconnect must be nvlink or pcie, got {req.interconnect!r}")
    if req.split_mode is not None and req.split_mode not in parallel.SPLIT_MODES:
        raise UsageError(f"--split-mode must be one of {', '.join(parallel.SPLIT_MODES)} (llama.cpp), got {req.split_mode!r}")
    if req.hosts > 1 and req.offload:
        raise UsageError("--offload with --hosts: a model split over hosts is planned resident only; drop one of them")
    if req.concurrency < 1:
        raise UsageError(f"--concurrency must be 1 or more, got {req.concurrency}")
    if req.context is not None and req.context < 1:
        raise UsageError(f"--context must be 1 or more tokens, got {req.context}")
    gmu = req.gpu_memory_utilization
    if gmu is not None and not 0.0 < gmu <= 1.0:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {gmu}")


def _pick_engine(req: PlanRequest, spec: ModelSpec, quant: Quant | None, release: compat.EngineRelease | None) -> str:
    """--engine, else the image's engine, else the engine that serves the quant's family natively."""
    if req.engine:
        engine = str(req.engine).lower().replace(".", "").replace("-", "").replace("_", "")
        if engine not in engine_names():
            raise UsageError(f"unknown engine {req.engine!r}; known: {', '.join(engine_names())}")
        if release is not None and release.engine != engine:
            raise UsageError(f"image {req.image} is a {release.engine} image, not {engine}; drop --engine or pick "
                             f"a {engine} image")
    elif release is not None:
        engine = release.engine
    else:
        family = quant.family if quant else ("gguf" if spec.origin == "gguf" else "hf")
        engine = for_quant_family(family).name
    know = for_engine(engine)
    if req.split_mode and req.split_mode not in know.split_modes:
        raise UsageError(f"--split-mode is llama.cpp's; {know.label} splits a model by tensor parallel "
                         "(--gpus) and pipeline parallel (--hosts)")
    if req.split_mode == "row" and req.hosts > 1:
        raise UsageError("--split-mode row splits matrices over the CUDA devices of one host; RPC devices take "
                         "whole layers: use --split-mode layer with --hosts")
    return engine


def _pick_quant(req: PlanRequest, spec: ModelSpec, know: EngineKnowledge, quant: Quant | None,
                notes: list[str]) -> Quant:
    """The quant asked (or named by the model id), else the file's, else the engine's default for a plan."""
    if quant is not None:
        pass
    elif spec.file_quant:
        quant = _quant_named(spec.file_quant)
    elif know.plan_default_quant:
        quant = find_quant(know.plan_default_quant)
        notes.append(f"no --quant given: planning the model's 16-bit weights ({quant.name})")
    else:
        fam = know.quant_family
        names = ", ".join(q.name for q in load_quants() if q.family == fam)
        raise UsageError(f"{know.label} serves {fam.upper()} files: give --quant ({names}) or a .{fam} file as --model")
    explicit_group = bool(req.quant and "-g" in str(req.quant).lower().replace("_", "-").split("int")[-1])
    if spec.file_group_size and quant.group_size and quant.name == spec.file_quant and not explicit_group:
        quant = quant.with_group_size(spec.file_group_size)
    if know.serves_only_quant_family and quant.family != know.quant_family:
        names = ", ".join(q.name for q in load_quants() if q.family == know.quant_family)
        raise UsageError(f"{know.label} serves {know.quant_family.upper()} files, not {quant.name}; pick one of: {names}")
    if know.foreign_quant_note and quant.family != know.quant_family:
        notes.append(know.foreign_quant_note)
    return quant


def _pick_weights(req: PlanRequest, spec: ModelSpec, quant: Quant, notes: list[str]) -> Weights:
    """The files' real sizes where they hold the planned quant, else sizes computed from the shapes."""
    computed = compute_weights(spec, quant)
    use_files = spec.file_weights_bytes is not None and (
        not req.quant or not spec.file_quant or _quant_named(spec.file_quant).name == quant.name
    )
    if spec.file_weights_bytes is not None and not use_files:
        notes.append(
            f"the files hold {spec.file_quant}; sizes computed from shapes for {quant.name} instead of read from files"
        )
    return _file_weights(spec, computed) if use_files else computed


def _judged_release(req: PlanRequest, cat: compat.EngineCatalog, engine: str, gpu: Gpu,
                    release: compat.EngineRelease | None) -> tuple[compat.EngineRelease | None, str]:
    """(the image the flags are judged against, a note on how it was chosen or why it does not run)."""
    if release is not None:
        if req.driver and not release.cpu and _driver_verdict(cat, release, gpu, req.driver).status == "fail":
            return release, _driver_note(cat, release, gpu, req.driver)
        return release, ""
    release = _default_release(cat, engine, gpu, req.driver)
    if release is None:
        return None, (f"no catalog {engine} image has kernels for compute capability {gpu.compute_capability}: "
                      "the engine flags are not checked against a build")
    on_driver = f" that runs on driver {req.driver}" if req.driver else ""
    verdict = _driver_verdict(cat, release, gpu, req.driver) if req.driver else None
    if verdict is not None and verdict.status == "fail":
        return release, (f"no catalog {engine} image with kernels for compute capability {gpu.compute_capability} "
                         f"runs on driver {req.driver}: judged against {release.key}; "
                         + _driver_note(cat, release, gpu, str(req.driver)))
    return release, (f"judged against image {release.key} (no image given: the newest catalog {engine} image "
                     f"with kernels for compute capability {gpu.compute_capability}{on_driver}); "
                     "pass --image KEY for another"
                     + (f"; on this driver: {verdict.message}" if verdict is not None and verdict.status == "warn"
                        else "")
                     + _newer_without_kernels(cat, engine, release, gpu))


def _pick_kv(req: PlanRequest, engine: str, gpu: Gpu, notes: list[str]) -> tuple[str, float, str]:
    """(KV dtype name, bytes per value, the flag value the engine takes for it on this card)."""
    kv_table = kv_dtypes(engine)
    kv_key = str(req.kv_dtype or "auto").lower()
    if kv_key not in kv_table:
        raise UsageError(f"unknown KV cache dtype {req.kv_dtype!r} for {engine}; known: {', '.join(kv_table)}")
    kv = kv_table[kv_key]
    kv_flag = str(kv["flag"])
    if kv_key == "bf16" and not gpu.bf16:
        kv_flag = for_engine(engine).kv_flag_without_bf16
        notes.append(f"{gpu.name} has no bf16 (CC {gpu.compute_capability}): KV cache in fp16 instead")
    return kv_key, float(kv["bytes"]), kv_flag


def _resolve(req: PlanRequest) -> _Resolved:
    _check_request(req)
    gpu = req.gpu if isinstance(req.gpu, Gpu) else find_gpu(str(req.gpu))
    spec, assumed = _resolve_model_id(req.model)
    quant = find_quant(req.quant) if req.quant else (find_quant(assumed.quant) if assumed else None)
    cat = compat.load_engine_catalog()
    release = cat.release(req.image) if req.image else None
    if req.image and release is None:
        raise UsageError(f"unknown image {req.image!r}; known (engines.yaml): {', '.join(cat.images)}")
    engine = _pick_engine(req, spec, quant, release)
    notes: list[str] = [assumed.said] if assumed else []
    quant = _pick_quant(req, spec, for_engine(engine), quant, notes)
    weights = _pick_weights(req, spec, quant, notes)
    release, image_note = _judged_release(req, cat, engine, gpu, release)
    image_refusal = _no_image_refusal(cat, engine, gpu) if release is None else ""
    if image_refusal:
        image_note = ""  # the refusal says it
    kv_key, kv_bytes, kv_flag = _pick_kv(req, engine, gpu, notes)
    return _Resolved(spec, quant, gpu, engine, kv_key, kv_bytes, kv_flag, weights, tuple(notes), release, image_note,
                     image_refusal)


def _no_image_refusal(cat: Any, engine: str, gpu: Gpu) -> str:
    """Why a plan for an engine none of whose catalog GPU images has kernels for the card is refused:
    the engine's own lowest compute capability (catalog engines.yaml, with its source) where the card is
    below it, and the engines whose catalog images do run there."""
    label = for_engine(engine).label
    cc = gpu.compute_capability
    rules = cat.engines.get(engine)
    floor = ""
    if rules is not None and rules.min_cc and (compat.cc_tuple(cc) or (0, 0)) < (compat.cc_tuple(rules.min_cc) or (0, 0)):
        floor = (f": {label} needs compute capability {rules.min_cc} or higher (catalog engines.yaml, confidence "
                 f"{rules.min_cc_confidence or 'U'}: {rules.min_cc_source or 'no source recorded'})")
    others = [for_engine(e) for e in engine_names() if e != engine and _default_release(cat, e, gpu) is not None]
    fix = ("; serve this card with " + " or ".join(
        f"{k.label} (--engine {k.name}" + (f" and a {k.quant_family.upper()} --quant or file" if k.serves_only_quant_family
                                           else "") + ")" for k in others)
           if others else "; no catalog image of any engine runs on it")
    return (f"REFUSED: no {label} image in the catalog runs on {gpu.name} (compute capability {cc}){floor}"
            + fix)


def _default_release(cat: Any, engine: str, gpu: Gpu, driver: str | None = None) -> Any:
    """The catalog image a plan without --image is judged against: a GPU image of the engine whose
    kernels run on the card; with the host's ``driver`` known, one that runs on that driver first;
    then builds that keep only the window of sliding-window layers, then the highest version (a
    floating tag such as server-cuda counts as newest)."""
    found = []
    for pos, rel in enumerate(cat.images.values()):
        if rel.engine != engine or rel.cpu or compat.kernel_coverage(rel, gpu.compute_capability) is None:
            continue
        runs = not driver or _driver_verdict(cat, rel, gpu, driver).status != "fail"
        window = rel.kv_layout is not None and rel.kv_layout.sliding_window == "window"
        m = re.match(r"v?(\d+(?:\.\d+)+)", rel.version)
        version = tuple(int(x) for x in m.group(1).split(".")) if m else (1 << 30,)  # a floating tag: newest
        found.append((runs, window, version, -pos, rel))
    return max(found, key=lambda f: f[:4])[4] if found else None


def _release_version(rel: Any) -> tuple[int, ...] | None:
    m = re.match(r"v?(\d+(?:\.\d+)+)", rel.version)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _newer_without_kernels(cat: Any, engine: str, release: Any, gpu: Gpu) -> str:
    """"; vllm:0.20.0 ... vllm:0.33.0 (newer) have no kernels for CC 7.0" where the catalog holds newer
    releases of the engine that do not run on the card: the default is then the last one that does."""
    mine = _release_version(release)
    if mine is None:
        return ""
    newer = []
    for rel in cat.images.values():
        v = _release_version(rel)
        if rel.engine == engine and not rel.cpu and v is not None and v > mine \
                and compat.kernel_coverage(rel, gpu.compute_capability) is None:
            newer.append((v, rel))
    if not newer:
        return ""
    newer.sort(key=lambda n: n[0])
    first, last = newer[0][1], newer[-1][1]
    span = first.key if first is last else f"{first.key} to {last.key}"
    why = ""
    if first.torch is not None and compat.kernels_cover(first.torch.kernels, gpu.compute_capability) is None:
        why = f" (from {first.key} on, the torch build has none either: torch {first.torch.version})"
    n = len(newer)
    return (f"; {release.key} is the newest {engine} release in the catalog that runs on compute capability "
            f"{gpu.compute_capability}: the {n} newer release{'s' if n > 1 else ''} ({span}) "
            f"{'have' if n > 1 else 'has'} no kernels for it{why}")


def _driver_host(gpu: Gpu, driver: str) -> dict[str, Any]:
    """What a plan knows of a host for the driver rule: the driver and the card (nothing of its toolkit
    or runtimes, which only forward compatibility needs: the rule says what it could not judge)."""
    return dict(driver=driver, cuda_driver=None, gpu_name=gpu.name, cc=gpu.compute_capability,
                data_center=gpu.data_center, toolkit_version=None, runtimes=[])


def _driver_verdict(cat: Any, rel: Any, gpu: Gpu, driver: str) -> Any:
    return compat.check_cuda_driver(rel, cat, **_driver_host(gpu, driver))


def _driver_note(cat: Any, rel: Any, gpu: Gpu, driver: str) -> str:
    """Why ``rel`` does not run on ``driver``, and what does (the preflight's own answer)."""
    verdict = _driver_verdict(cat, rel, gpu, driver)
    alternatives = compat.driver_alternatives(rel, cat, **_driver_host(gpu, driver))
    return "; ".join([f"image {rel.key} does not run on this host: {verdict.message}", *alternatives])


# ------------------------------------------------------------------------------------------ speed


@dataclass(frozen=True)
class DecodeSpeed:
    """Batch-1 decode tokens/s by the speed model: (low, high) and what it rests on."""

    low: float
    high: float
    efficiency_class: str
    efficiency: tuple[float, float]
    per_layer_us: tuple[float, float]
    moe_layer_us: tuple[float, float] = (0.0, 0.0)
    cuda_graphs: bool | None = True


def decode_speed(
    engine: str,
    bandwidth_gbps: float,
    memory_type: str,
    gpu_bytes: float,
    layers: int,
    host_bytes: float = 0.0,
    host_gbps: tuple[float, float] | None = None,
    legacy: bool = False,
    extra_us: tuple[float, float] = (0.0, 0.0),
    *,
    moe_layers: int = 0,
    cuda_graphs: bool | None = True,
    compute_capability: str | None = None,
    efficiency: tuple[float, float] | None = None,
) -> DecodeSpeed:
    """time per token = gpu_bytes / (bandwidth x efficiency) + layers x per-layer cost + MoE layers x
    MoE per-layer cost + per-token cost + host_bytes / host bandwidth; the low speed pairs the low
    efficiency with the high costs. ``cuda_graphs``: the build decodes as one CUDA graph (True), launches
    every kernel from the host (False), or either (None: low end without graphs, high end with);
    ``legacy`` is the old name of ``cuda_graphs=False``. ``compute_capability`` scales the efficiency
    on cards without DP4A (planner.yaml no_dp4a_*). ``extra_us``: (low, high) microseconds per token of
    communication (all-reduces, network hops) added on top. ``efficiency``: a measured (low, high)
    instead of the catalog's (a fleet's fitted figure already holds the card's own factors)."""
    sp = speed_assumptions(engine)
    cls, (e_lo, e_hi) = sp.efficiency_for(memory_type)
    f_lo, f_hi = sp.efficiency_factor(compute_capability)
    e_lo, e_hi = (e_lo * f_lo, e_hi * f_hi) if efficiency is None else efficiency
    graphs = False if legacy else cuda_graphs
    with_g = sp.per_layer_for(cls)
    without_g = sp.legacy_per_layer_us or with_g
    moe_g = sp.moe_layer_us
    moe_ng = sp.moe_layer_us_no_graphs or moe_g
    if graphs is True:
        (c_lo, c_hi), (m_lo, m_hi) = with_g, moe_g
    elif graphs is False:
        (c_lo, c_hi), (m_lo, m_hi) = without_g, moe_ng
    else:
        (c_lo, c_hi), (m_lo, m_hi) = (with_g[0], without_g[1]), (moe_g[0], moe_ng[1])
    p_lo, p_hi = sp.per_token_us
    bw = bandwidth_gbps * GB
    h_lo, h_hi = host_gbps or (1.0, 1.0)
    x_lo, x_hi = extra_us
    t_slow = (gpu_bytes / (bw * e_lo) + (layers * c_hi + moe_layers * m_hi + p_hi + x_hi) * 1e-6
              + (host_bytes / (h_lo * GB) if host_bytes else 0.0))
    t_fast = (gpu_bytes / (bw * e_hi) + (layers * c_lo + moe_layers * m_lo + p_lo + x_lo) * 1e-6
              + (host_bytes / (h_hi * GB) if host_bytes else 0.0))
    return DecodeSpeed(1.0 / t_slow, 1.0 / t_fast, cls, (e_lo, e_hi), (c_lo, c_hi), (m_lo, m_hi), graphs)


def health_floor(engine: str, gpu: Gpu, read_bytes: float, layer_read_bytes: float, layers: int,
                 offload_gbps: tuple[float, float], gpus: int = 1,
                 extra_us: tuple[float, float] = (0.0, 0.0), moe_layers: int = 0,
                 ) -> tuple[float, DecodeSpeed, DecodeSpeed, str]:
    """(floor tok/s, resident speed, speed with a share of the layers in host memory, why).

    The default floor is a sanity bound, not a residency test (the engine's load report decides
    residency; a fleet's own measured floor takes over where it has history): ``floor_share_of_low``
    (0.5) x the slowest resident prediction for the card (its CUDA-graph state, at ``read_bytes``), which
    sits below every public healthy figure of the card class (catalog decode_public.yaml). It fails gross
    offloads; whether it also fails an offload of ``floor_share_offloaded`` (1/8) of the layers (host
    memory for llama.cpp, PCIe for vLLM) depends on the card, and the reason says which."""
    sp = speed_assumptions(engine)
    share = sp.floor_share_offloaded
    graphs = sp.cuda_graphs_for(gpu.compute_capability)
    cc = gpu.compute_capability
    per_gpu = read_bytes / gpus
    resident = decode_speed(engine, gpu.bandwidth_gbps, gpu.memory_type, per_gpu, layers, extra_us=extra_us,
                            moe_layers=moe_layers, cuda_graphs=graphs, compute_capability=cc)
    off_bytes = layer_read_bytes / gpus * share
    moves = for_engine(engine).offload_moves_layers
    offloaded = decode_speed(engine, gpu.bandwidth_gbps, gpu.memory_type, per_gpu - off_bytes,
                             layers - int(layers * share) if moves else layers,
                             host_bytes=off_bytes, host_gbps=offload_gbps, extra_us=extra_us,
                             moe_layers=moe_layers - int(moe_layers * share) if moves else moe_layers,
                             cuda_graphs=graphs, compute_capability=cc)
    floor = sp.floor_share_of_low * resident.low
    why = (f"{sp.floor_share_of_low:g} x the slowest resident prediction ({resident.low:.1f} tok/s): a sanity bound "
           "below every public healthy figure of this card class (catalog decode_public.yaml), not a residency "
           "test; ")
    if offloaded.high < floor:
        why += f"it also fails {share:.3g} of the layers off the GPU (at most {offloaded.high:.1f} tok/s)"
    else:
        why += (f"{share:.3g} of the layers off the GPU ({offloaded.low:.1f}-{offloaded.high:.1f} tok/s) passes it "
                "on this card, only larger offloads fail; set health.min_tokps from a measured run to catch smaller ones")
    return floor, resident, offloaded, why


def _round_down(n: int, step: int) -> int:
    return n - n % step if n >= step else n


def _largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """Largest x in [lo, hi] with ok(x), assuming ok is monotone (True then False); lo - 1 if none."""
    if hi < lo or not ok(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class _Device:
    """One card of a split plan: where it is, what it holds."""

    host: int  # 0: the head
    layers: int  # repeating layers on it (all of them for tensor parallel ranks of a stage)
    weights_bytes: float
    kv_share: float  # share of the whole model's KV (per GPU for tensor parallel) it keeps
    fixed_bytes: float


def _split_devices(r: _Resolved, req: PlanRequest, split_mode: str, fixed_gpu: float) -> list[_Device]:
    """The cards of a plan split over several GPUs or hosts, each with its weights and share of the KV
    cache, by the engine's own rules (``llmfleet.knowledge.parallel``)."""
    spec, w, engine = r.spec, r.weights, r.engine
    n, hosts, layers = req.gpus, req.hosts, spec.num_layers
    loaded = w.loaded_bytes(engine)
    per_layer = w.layer_bytes / max(1, layers)
    head = loaded - w.layer_bytes  # embeddings, output layer, final norm, vision tower (what is loaded)
    out: list[_Device] = []
    if split_mode == "tensor":
        # K/V projections replicated when tp > KV heads (QKVParallelLinear): each GPU keeps 1/kv_heads.
        kv_proj = 0.0
        if n > spec.kv_heads > 0 and not spec.is_mla:
            attn = sum(1 for i in range(layers) if _layer_is_attention(spec, i))
            kv_proj = attn * 2 * spec.hidden * spec.kv_heads * spec.head_dim * r.quant.bits / 8
        extra = kv_proj * (1 / max(1, spec.kv_heads) - 1 / n) if kv_proj else 0.0
        first = w.embed_bytes + w.vision_bytes
        last = (w.output_bytes or w.embed_bytes) + (w.other_bytes - w.vision_bytes - w.mtp_bytes)
        stages = parallel.pp_partition(layers, hosts)
        for s, lay in enumerate(stages):
            if hosts == 1:
                stage_w = float(loaded)
            else:
                stage_w = lay * per_layer + (first if s == 0 else 0.0) + (last if s == hosts - 1 else 0.0)
            dev = _Device(s, lay, stage_w / n + extra * lay / layers, lay / layers, fixed_gpu)
            out += [dev] * n
        return out
    d = n * hosts
    if split_mode == "row":
        # Matrices split by rows over the cards; the main GPU keeps the rest, the KV cache and the results.
        out.append(_Device(0, layers, w.layer_bytes / d + head, 1.0, fixed_gpu))
        out += [_Device(0, layers, w.layer_bytes / d, 0.0, fixed_gpu)] * (d - 1)
        return out
    counts, out_dev = parallel.layer_split(layers, [1.0] * d)
    # Device order: the workers' RPC devices first (hosts 1..M-1, gpus each), then the head's cards.
    for i, c in enumerate(counts):
        host = 1 + i // n if i < (hosts - 1) * n else 0
        out.append(_Device(host, c, c * per_layer + (head if i == out_dev else 0.0), c / layers, fixed_gpu))
    return out


def _pool_of(devices: Sequence[_Device], budget_gpu: float) -> tuple[float, int]:
    """(the whole model's KV bytes the split can hold, the index of the card that binds it): each card
    holds its share of the KV, so the tightest card sets the total."""
    best, where = math.inf, 0
    for i, dv in enumerate(devices):
        room = budget_gpu - dv.weights_bytes - dv.fixed_bytes
        eq = room / dv.kv_share if dv.kv_share > 0 else (math.inf if room >= 0 else room)
        if eq < best:
            best, where = eq, i
    return best, where


def _network(req: PlanRequest, pa: Any) -> tuple[float, tuple[float, float] | None]:
    gbps = req.network_gbps if req.network_gbps is not None else pa.network_default_gbps
    lat = (req.network_latency_us, req.network_latency_us) if req.network_latency_us is not None else None
    return gbps, lat


def _interconnect(req: PlanRequest, gpu: Gpu) -> tuple[str, float]:
    """(nvlink / pcie, GB/s per direction) between the cards of a host: asked, else the catalog's."""
    kind = req.interconnect or gpu.interconnect or "pcie"
    if kind == "nvlink":
        gbps = gpu.interconnect_gbps if gpu.interconnect == "nvlink" else (gpu.nvlink_bridge_gbps or 0.0)
    else:
        gbps = gpu.interconnect_gbps if gpu.interconnect == "pcie" else 15.75
    return kind, gbps


def _comm_cost(req: PlanRequest, r: _Resolved, pa: Any, split_mode: str, devices: list[_Device]) -> parallel.Cost:
    """Time per token the split adds on top of reading the weights (planner.yaml ``parallel``)."""
    spec, n, hosts = r.spec, req.gpus, req.hosts
    gbps, lat = _network(req, pa)
    if split_mode == "tensor":
        kind, link = _interconnect(req, r.gpu)
        return (parallel.allreduce_cost(pa, interconnect=kind, link_gbps=link, tp=n, layers=spec.num_layers,
                                        hidden=spec.hidden)
                + parallel.pipeline_cost(pa, hosts=hosts, hidden=spec.hidden, network_gbps=gbps, latency_us=lat))
    if split_mode == "row":
        mats = sum(len([m for m in _attention_matrices(spec, i) + _mlp_matrices(spec, i) if m.quantize])
                   for i in range(spec.num_layers))
        return parallel.row_sync_cost(pa, mats if n > 1 else 0)
    rpc_devices = (hosts - 1) * n
    return (parallel.rpc_cost(pa, rpc_devices=rpc_devices, layers_per_device=[d.layers for d in devices],
                              hidden=spec.hidden, network_gbps=gbps, latency_us=lat)
            + parallel.layer_hops_cost(pa, n - 1))


def _split_notes(req: PlanRequest, r: _Resolved, pa: Any, split_mode: str, devices: list[_Device], binding: int,
                 comm: parallel.Cost) -> list[str]:
    """What a split plan rests on, in words: the layout per card and host, and what decode speed to expect."""
    n, hosts, spec = req.gpus, req.hosts, r.spec
    if n * hosts <= 1:
        return []
    out: list[str] = []
    ms = f"{comm.low_us / 1000:.2f}-{comm.high_us / 1000:.2f} ms per token"
    if split_mode == "tensor":
        kind, link = _interconnect(req, r.gpu)
        if n > 1:
            heads = parallel.kv_heads_per_gpu(spec.kv_heads, n)
            rep = (f"; {spec.kv_heads} KV heads < {n}: each GPU keeps a replica of one, so the KV cache does not "
                   "shrink further" if n > spec.kv_heads and not spec.is_mla else "")
            out.append(
                f"tensor parallel over {n} GPUs per host ({kind}, {link:g} GB/s per direction): each GPU holds 1/{n} "
                f"of the weights and {heads if not spec.is_mla else 'the MLA latent of'} KV head(s) per layer"
                f"{rep}; decode reads 1/{n} of the weights per GPU and pays {ms} of all-reduces")
            if kind == "pcie" and n > 2:
                out.append("vLLM's custom all-reduce is off for more than two PCIe-only GPUs: NCCL carries the "
                           "all-reduces (vllm/distributed/device_communicators/custom_all_reduce.py)")
        if hosts > 1:
            stages = parallel.pp_partition(spec.num_layers, hosts)
            gbps, _ = _network(req, pa)
            out.append(
                f"pipeline parallel over {hosts} hosts (vLLM get_pp_indices): layers per host {stages}; at batch 1 "
                f"the stages run one after another, so a host adds memory, not speed: decode is what one host with "
                f"all the weights would do, plus {ms} for the network ({gbps:g} Gbit/s) and Ray; with several "
                "sequences in flight the stages overlap and throughput scales")
    else:
        if split_mode == "row":
            out.append(
                f"llama.cpp row split over {n} GPUs: every weight matrix is split by rows and read at the same time; "
                f"the main GPU keeps the KV cache and the intermediate results and gathers each matmul ({ms}, an "
                "estimate: measure it)")
        else:
            counts = [d.layers for d in devices]
            per_host = [sum(d.layers for d in devices if d.host == h) for h in range(hosts)]
            out.append(
                f"llama.cpp layer split over {n * hosts} device(s): layers per device {counts} (device order: "
                + ("the workers' RPC devices first, then the head's GPUs; " if hosts > 1 else "")
                + f"the output layer on the last); the devices run one after another, so memory adds up and decode "
                f"speed does not (+ {ms})")
            if hosts > 1:
                out.append(f"layers per host (head first): {per_host}; every token crosses the network to each RPC "
                           "device and back")
    if devices:
        dv = devices[binding]
        out.append(f"tightest card: {'the head' if dv.host == 0 else f'worker {dv.host}'}, {dv.layers} layers, "
                   f"{dv.weights_bytes / GB:.2f} GB of weights")
    return out


# ------------------------------------------------------------------------------------------ plan steps
#
# ``_plan`` composes small pure steps, each returning a frozen record: ``_budget`` (one card's memory
# and the basis the fit runs on), ``_fit`` (the KV layout and the context search), ``_speed`` (batch-1
# decode, the split's communication, the health floor), ``_offload`` (what a plan that is not resident
# does), ``_flags`` (the engine flags, judged by the preflight's rules) and ``_notes`` (the notes and
# refusals, in the order people read them). What differs by engine is asked of its knowledge
# (``llmfleet.knowledge.engines``); what differs by the split is the budget's ``split_mode``.


@dataclass(frozen=True)
class Budget:
    """Memory of a plan: one card's budget, and the basis the fit runs on: per card for a tensor
    parallel split (every layer is sharded over the host's cards), all cards together for a layer or
    row split (the cards' memory adds up)."""

    gpu_memory_utilization: float
    card_bytes: float  # one card: CUDA-visible memory (memory.total less the driver's) x utilization
    devices: int  # cards in all (gpus x hosts)
    shards: int  # cards each layer is sharded over: the host's gpus for tensor parallel, else 1
    split_mode: str  # tensor | layer | row
    basis_bytes: float  # the budget on the basis
    fixed_bytes: float  # the engine's fixed overhead on the basis
    weights_gpu_bytes: int  # weights the engine loads to GPU memory, all cards
    basis_weights_bytes: float  # of them on the basis

    @property
    def tensor(self) -> bool:
        return self.split_mode == "tensor"


def _budget(req: PlanRequest, r: _Resolved, know: EngineKnowledge, a: EngineAssumptions) -> Budget:
    gpu, devices = r.gpu, req.gpus * req.hosts
    split_mode = req.split_mode or know.split_modes[0]
    tensor = split_mode == "tensor"
    gmu = req.gpu_memory_utilization or a.gpu_memory_utilization
    reserved_mib = gpu.memory_reserved_mib if gpu.memory_reserved_mib is not None else default_memory_reserved_mib()
    card = (gpu.memory_bytes - reserved_mib * 2**20) * gmu
    loaded = r.weights.loaded_bytes(r.engine)  # llama.cpp keeps an untied token-embedding table in host memory
    return Budget(
        gpu_memory_utilization=gmu, card_bytes=card, devices=devices, shards=req.gpus if tensor else 1,
        split_mode=split_mode, basis_bytes=card if tensor else card * devices,
        fixed_bytes=a.fixed_overhead_bytes if tensor else a.fixed_overhead_bytes * devices,
        weights_gpu_bytes=loaded, basis_weights_bytes=loaded / devices if tensor else loaded,
    )


@dataclass(frozen=True)
class Fit:
    """Where the KV cache fits: its layout on the basis, the pool the cards leave it, the context."""

    layout: KvLayout
    kv_info: KvLayoutInfo | None  # what the build keeps for sliding-window layers (None: not known)
    window_kept: bool  # sliding-window layers keep only their window
    grow: float  # 1 + the share of the KV cache the engine adds for compute buffers
    pool_bytes: float  # KV bytes the basis holds (a split: what the tightest card allows)
    fixed_bytes: float  # fixed overhead on the basis (a tensor-parallel split: per card, buffers included)
    devices: tuple[_Device, ...]  # the cards of a split (empty: one card)
    binding: int  # the index of the tightest card
    resident: bool  # every weight on the GPUs, with room for KV
    max_context: int  # at the asked concurrency
    context: int  # planned: the asked one, or the most that fits
    per_sequence_bytes: float  # KV of one sequence at the context
    max_concurrency: int  # at the context
    kv_cache_tokens: int | None  # tokens the pool holds (None: sliding windows or states make it per sequence)
    context_fits: bool
    notes: tuple[str, ...]
    problems: tuple[str, ...]

    def kv_need(self, context: int, sequences: int) -> float:
        return sequences * self.layout.per_sequence(context) * self.grow


def _fit(req: PlanRequest, r: _Resolved, know: EngineKnowledge, a: EngineAssumptions, pa: ParallelAssumptions,
         b: Budget) -> Fit:
    spec, k = r.spec, req.concurrency
    kv_info = know.kv_layout(r.release, r.gpu.compute_capability) if r.release is not None else None
    window = kv_info is not None and kv_info.sliding_window == "window"
    layout = kv_layout(spec, r.kv_bytes, tp=b.shards, block_size=a.block_size, swa_cache=window)
    grow = 1.0 + a.kv_fraction
    pool = b.basis_bytes - b.basis_weights_bytes - b.fixed_bytes
    fixed = b.fixed_bytes
    devices: tuple[_Device, ...] = ()
    binding = 0
    if b.devices > 1:
        # Each card holds its layers (or its shard) and their KV: the tightest card sets the pool.
        fixed_gpu = a.fixed_overhead_bytes + (pa.tp_overhead_bytes if b.tensor else 0)
        devices = tuple(_split_devices(r, req, b.split_mode, fixed_gpu))
        pool, binding = _pool_of(devices, b.card_bytes)
        if b.tensor:
            fixed = fixed_gpu
    resident = pool > 0
    max_ctx_model = spec.max_context

    def fits_ctx(ctx: int) -> bool:
        return k * layout.per_sequence(ctx) * grow <= pool

    max_context = max(0, _largest(1, max_ctx_model, fits_ctx)) if resident else 0
    notes: list[str] = []
    if req.context is not None:
        context = req.context
        if context > max_ctx_model:
            notes.append(f"context {context} is beyond the model's {max_ctx_model} positions (needs rope scaling to work)")
    else:
        if max_context:
            context = min(max_ctx_model, _round_down(max_context, 256))
            why = f"the most that fits, up to the model's {max_ctx_model}"
        else:
            context = min(max_ctx_model, 4096)
            why = "nothing fits at any context; 4096 shown"
        notes.append(f"no --context given: planned at {context} tokens ({why})")
    per_seq = layout.per_sequence(context)
    max_conc = int(pool // (per_seq * grow)) if resident and per_seq > 0 else 0
    kv_cache_tokens = None
    if resident and layout.sliding_bytes_per_token == 0 and layout.state_bytes_per_sequence == 0:
        tokens = int(pool // (layout.full_bytes_per_token * grow))
        kv_cache_tokens = tokens - tokens % a.block_size
    # A context asked for explicitly is the operator's call; one the planner picks must be useful.
    useful = req.context is not None or context >= min(min_context(), max_ctx_model)
    context_fits = resident and fits_ctx(context) and useful
    problems: list[str] = []
    if resident and not context_fits and not useful:
        problems.append(f"only {max_context} tokens of context fit; below {min_context()} tokens is not a useful service")
    elif resident and not context_fits:
        problems.append(
            f"the weights fit but the KV cache for {k} x {context} tokens "
            f"({k * per_seq * grow / GB:.1f} GB) exceeds the {max(0.0, pool) / GB:.1f} GB left; "
            f"fits: {max_context} tokens at {k} sequences or {max_conc} sequences at {context} tokens"
        )
    return Fit(layout=layout, kv_info=kv_info, window_kept=window, grow=grow, pool_bytes=pool, fixed_bytes=fixed,
               devices=devices, binding=binding, resident=resident, max_context=max_context, context=context,
               per_sequence_bytes=per_seq, max_concurrency=max_conc, kv_cache_tokens=kv_cache_tokens,
               context_fits=context_fits, notes=tuple(notes), problems=tuple(problems))


@dataclass(frozen=True)
class Speed:
    """Batch-1 decode with every weight on the GPUs, what the split adds, and the health floor."""

    weights_read_bytes: float  # weights the cards on the critical path read per token
    read_bytes: float  # with the KV of one sequence at the context
    ceiling: float  # tok/s: bandwidth / bytes read
    resident: DecodeSpeed  # the speed model's range
    comm: parallel.Cost  # per token, on top of reading the weights
    cuda_graphs: bool | None
    moe_layers: int
    offload_gbps: tuple[float, float]  # host memory (or PCIe) bandwidth for offloaded weights
    floor: float  # the health floor of a resident plan
    floor_why: str
    offload_eighth: DecodeSpeed  # with 1/8 of the layers off the GPU
    efficiency_text: str


def _speed(req: PlanRequest, r: _Resolved, a: EngineAssumptions, pa: ParallelAssumptions, b: Budget,
           fit: Fit) -> Speed:
    spec, gpu, engine, weights = r.spec, r.gpu, r.engine, r.weights
    layer_read = weights.layer_bytes - weights.inactive_expert_bytes
    # Bytes one card reads per token, the cards running one after another: a tensor-parallel rank reads
    # its 1/n shard (pipeline stages add up to the whole model again); a layer split reads every layer
    # once over all cards; a row split reads the cards' shares of the matrices at the same time.
    if b.tensor:
        weights_read = weights.read_per_token / req.gpus
    elif b.split_mode == "row" and b.devices > 1:
        weights_read = weights.read_per_token - layer_read + layer_read / b.devices
    else:
        weights_read = weights.read_per_token
    read_bytes = weights_read + fit.per_sequence_bytes
    comm = _comm_cost(req, r, pa, b.split_mode, list(fit.devices))
    extra = (comm.low_us, comm.high_us)
    off_gbps = (a.offload_gbps_low, a.offload_gbps_high)
    # The health probe decodes a short answer to a short prompt: its floor is for that context.
    probe_read = weights_read + fit.layout.per_sequence(min(fit.context, HEALTH_PROBE_CONTEXT))
    moe_layers = sum(1 for i in range(spec.num_layers) if spec.is_moe_layer(i))
    floor, _, eighth, floor_why = health_floor(
        engine, gpu, probe_read * b.shards, layer_read, spec.num_layers, off_gbps, gpus=b.shards,
        extra_us=extra, moe_layers=moe_layers)
    graphs = speed_assumptions(engine).cuda_graphs_for(gpu.compute_capability)
    measured = req.measured_efficiency
    resident = decode_speed(engine, gpu.bandwidth_gbps, gpu.memory_type, read_bytes, spec.num_layers,
                            extra_us=extra, moe_layers=moe_layers, cuda_graphs=graphs,
                            compute_capability=gpu.compute_capability,
                            efficiency=(measured[0], measured[0]) if measured else None)
    return Speed(weights_read_bytes=weights_read, read_bytes=read_bytes, ceiling=gpu.bandwidth_gbps * GB / read_bytes,
                 resident=resident, comm=comm, cuda_graphs=graphs, moe_layers=moe_layers, offload_gbps=off_gbps,
                 floor=floor, floor_why=floor_why, offload_eighth=eighth,
                 efficiency_text=_efficiency_text(r, b, resident, comm, graphs, moe_layers, measured))


_GRAPHS_TEXT = {True: "with CUDA graphs", False: "without CUDA graphs",
                None: "without CUDA graphs at the low end, with them at the high end (it depends on the build)"}


def _efficiency_text(r: _Resolved, b: Budget, speed: DecodeSpeed, comm: parallel.Cost, graphs: bool | None,
                     moe_layers: int, measured: tuple[float, str] | None) -> str:
    """The speed model in words, with its sources (the plan's ``efficiency_assumption``)."""
    gpu, spec, engine = r.gpu, r.spec, r.engine
    sp = speed_assumptions(engine)
    eff_lo, eff_hi = speed.efficiency
    no_dp4a = sp.efficiency_factor(gpu.compute_capability) != (1.0, 1.0)
    return (
        f"time per token = bytes read / ({gpu.bandwidth_gbps:.0f} GB/s x {eff_lo:.2f}-{eff_hi:.2f}) + "
        f"{spec.num_layers} layers x {speed.per_layer_us[0]:.0f}-{speed.per_layer_us[1]:.0f} us"
        + (f" + {moe_layers} MoE layers x {speed.moe_layer_us[0]:.0f}-{speed.moe_layer_us[1]:.0f} us"
           if moe_layers and speed.moe_layer_us[1] else "")
        + (f" + {sp.per_token_us[0] / 1000:.1f}-{sp.per_token_us[1] / 1000:.1f} ms per token" if sp.per_token_us[1] else "")
        + f" ({engine}, memory class {speed.efficiency_class}"
        + (f", {_GRAPHS_TEXT[graphs]}" if sp.graphs_min_cc else "")
        + (", no DP4A on this card" if no_dp4a else "")
        + "): "
        + "; ".join(sp.efficiency_sources.get(speed.efficiency_class, ()) + sp.cost_sources
                    + (sp.no_dp4a_sources if no_dp4a else ()))
        + (f"; split over {b.devices} cards: + {comm.low_us / 1000:.2f}-{comm.high_us / 1000:.2f} ms per token ({comm.text})"
           if comm.text else "")
        + (f"; efficiency {measured[0]:.2f} fitted to this fleet's measurements instead of the catalog's range "
           f"({measured[1]})" if measured else "")
    )


@dataclass(frozen=True)
class Offload:
    """Where the weights run: all on the GPUs (resident), or some layers off them (refused unless
    --offload), and what that does to the figures."""

    gpu_layers: int  # repeating layers on the GPUs
    offload_bytes: float  # weights off the GPUs, on the basis
    fits: bool
    ceiling: float
    realistic: tuple[float, float]  # tok/s (low, high)
    max_context: int
    max_concurrency: int
    notes: tuple[str, ...]
    problems: tuple[str, ...]


def _offload(req: PlanRequest, r: _Resolved, know: EngineKnowledge, a: EngineAssumptions, b: Budget, fit: Fit,
             speed: Speed) -> Offload:
    spec, gpu, weights, n, k, context = r.spec, r.gpu, r.weights, req.gpus, req.concurrency, fit.context
    if fit.resident:
        return Offload(spec.num_layers, 0.0, fit.context_fits, speed.ceiling, (speed.resident.low, speed.resident.high),
                       fit.max_context, fit.max_concurrency, (), ())
    # How much would stay on the GPU with the KV cache for the asked context on it.
    room = b.basis_bytes - fit.fixed_bytes - fit.kv_need(context, k)
    per_layer = weights.layer_bytes / max(1, spec.num_layers) / b.shards
    if b.tensor:
        head = (weights.total_bytes - weights.layer_bytes) / b.shards
    else:
        head = weights.loaded_bytes(r.engine) - weights.layer_bytes  # output + final norm on the GPU
    if room <= 0:
        gpu_layers, offload_bytes = 0, b.basis_weights_bytes
    else:
        gpu_layers = max(0, min(spec.num_layers, int(max(0.0, room - head) // per_layer)))
        offload_bytes = max(0.0, b.basis_weights_bytes - room)
    # Offloaded weights stream from host memory (llama.cpp) or over PCIe (vLLM) every token; of
    # MoE experts only the active share is read.
    host_read = offload_bytes * min(1.0, weights.read_per_token / max(1, weights.loaded_bytes(r.engine)))
    gpu_read = max(0.0, speed.read_bytes - host_read)
    on_gpu_layers = gpu_layers if know.offload_moves_layers else spec.num_layers
    off = decode_speed(r.engine, gpu.bandwidth_gbps, gpu.memory_type, gpu_read, on_gpu_layers,
                       host_bytes=host_read, host_gbps=speed.offload_gbps,
                       moe_layers=speed.moe_layers * on_gpu_layers // max(1, spec.num_layers),
                       cuda_graphs=speed.cuda_graphs, compute_capability=gpu.compute_capability)
    t_min = gpu_read / (gpu.bandwidth_gbps * GB) + host_read / (a.offload_gbps_high * GB)
    t_lo, t_hi = 1.0 / off.low, 1.0 / off.high
    expected = (1.0 / t_lo, 1.0 / t_hi)
    share = offload_bytes / b.basis_weights_bytes if b.basis_weights_bytes else 1.0
    rate = f"{expected[0]:.1f}-{expected[1]:.1f} tok/s"
    gmu = b.gpu_memory_utilization
    notes: list[str] = []
    problems: list[str] = []
    fits = False
    if room <= 0:
        problems.append(f"the KV cache for {k} x {context} tokens plus overhead alone exceed the {gmu:.0%} budget of "
                        f"{n} x {gpu.name}: nothing fits")
    elif req.offload:
        fits = context >= 1
        notes.append(
            f"OFFLOAD: {share:.0%} of the weights ({offload_bytes / GB:.1f} GB) run from {know.offload_where}; "
            f"expect {rate} instead of ~{speed.resident.low:.0f}-{speed.resident.high:.0f} tok/s "
            f"resident (bound by {a.offload_gbps_low:.0f}-{a.offload_gbps_high:.0f} GB/s: "
            + "; ".join(a.offload_sources)
            + ")"
        )
    else:
        problems.append(
            f"REFUSED: the weights ({b.weights_gpu_bytes / GB:.1f} GB on the GPU) do not fit {n} x {gpu.name} "
            f"({gpu.memory_bytes / GIB:.1f} GiB, {gmu:.0%} usable) with overhead; only {gpu_layers} of "
            f"{spec.num_layers} layers would be resident and decode would fall to ~{rate} "
            f"(measured: 1/8 of the layers off the GPU is 4.5x slower, half is 13x). "
            f"Use a smaller quant, a shorter context or more GPUs, or pass --offload to accept it"
        )
    # The layer split is made for the asked context and sequences: more of either moves more layers off
    # the GPU, so an offloaded plan holds exactly what was asked.
    held = (context, k) if req.offload and fits else (fit.max_context, fit.max_concurrency)
    return Offload(gpu_layers, offload_bytes, fits, 1.0 / t_min, expected, held[0], held[1], tuple(notes),
                   tuple(problems))


@dataclass(frozen=True)
class Flags:
    """The engine flags of the plan, the environment they need and the preflight's verdicts on them."""

    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    preflight: tuple[tuple[str, compat.Verdict], ...]
    note: str  # the attention backend chosen instead of the default, if any
    refusal: str  # the preflight's FAILs, in one line ("": none)


def _flags(req: PlanRequest, r: _Resolved, b: Budget, fit: Fit, off: Offload) -> Flags:
    args, env, checks, note = _checked_args(req, r, fit.context, req.concurrency, b.gpu_memory_utilization,
                                            off.gpu_layers, fit.resident, off.offload_bytes)
    failed = [f"{cid}: {v.message}" + (f" (fix: {v.fix})" if v.fix else "") for cid, v in checks.items()
              if v.status == "fail"]
    refusal = ""
    if failed and r.release is not None:
        refusal = f"REFUSED by the preflight's rules for {r.release.key} on {r.gpu.name}: " + "; ".join(failed)
    return Flags(tuple(args), tuple(env.items()), tuple(checks.items()), note, refusal)


@dataclass(frozen=True)
class Overhead:
    bytes: float  # all cards: fixed overhead, communication buffers, the KV share for compute buffers
    text: str  # the plan's overhead_assumption


def _overhead(a: EngineAssumptions, pa: ParallelAssumptions, b: Budget, fit: Fit, sequences: int) -> Overhead:
    comm_buffers = pa.tp_overhead_bytes if b.tensor and b.devices > 1 else 0
    total = ((a.fixed_overhead_bytes + comm_buffers) * b.devices
             + a.kv_fraction * fit.kv_need(fit.context, sequences) / fit.grow * b.shards)
    text = (
        f"{a.fixed_overhead_bytes / GIB:.2f} GiB per GPU (CUDA context {a.cuda_context_bytes / GIB:.2f}, "
        f"activations {a.activation_bytes / GIB:.2f}, CUDA graphs {a.cuda_graph_bytes / GIB:.2f} GiB)"
        + (f" + {a.kv_fraction:.0%} of the KV cache for compute buffers" if a.kv_fraction else "")
        + (f" + {comm_buffers / GIB:.2f} GiB per GPU of communication buffers" if comm_buffers else "")
        + ": "
        + "; ".join(a.overhead_sources + (pa.tp_overhead_sources if comm_buffers else ()))
    )
    return Overhead(total, text)


def _figure_notes(r: _Resolved, know: EngineKnowledge, fit: Fit) -> list[str]:
    """What the figures rest on: sliding windows, experts, MTP layers, linear attention, dtypes."""
    spec, weights, gpu, quant = r.spec, r.weights, r.gpu, r.quant
    notes: list[str] = []
    sliding = spec.count(SLIDING)
    build = r.release.key if r.release is not None else None
    if sliding and fit.window_kept:
        notes.append(
            f"{sliding} of {spec.num_layers} layers use a {spec.sliding_window}-token sliding window: "
            f"their KV stops growing there ({build or 'the build'} keeps only the "
            f"window: {fit.kv_info.source if fit.kv_info else ''})"
        )
    elif sliding:
        why = fit.kv_info.source if fit.kv_info is not None else "the catalog does not say what the build keeps"
        notes.append(
            f"{sliding} of {spec.num_layers} layers use a {spec.sliding_window}-token sliding window, "
            f"but {build or 'the engine build'} keeps the full context on them "
            f"too, so their KV grows with the context ({why})"
        )
    if spec.is_moe:
        notes.append(
            f"mixture of experts: {spec.num_experts} experts per layer, {spec.num_experts_per_tok} used per token; "
            f"all {weights.params / 1e9:.1f}B parameters sit in memory, {weights.active_params / 1e9:.1f}B are read "
            f"per token ({weights.read_per_token / GB:.1f} GB)"
        )
    if weights.mtp_bytes:
        notes.append(
            f"the checkpoint's multi-token-prediction layer ({weights.mtp_bytes / GB:.2f} GB) is not loaded unless "
            "MTP speculative decoding is turned on (then add it to the weights)"
        )
    if spec.count(LINEAR):
        notes.append(
            f"{spec.count(LINEAR)} of {spec.num_layers} layers are linear attention: no KV cache, a fixed "
            f"{fit.layout.state_bytes_per_sequence / 2**20:.0f} MiB state per sequence; only the {spec.count(FULL)} "
            f"full-attention layers keep KV"
        )
    if not gpu.bf16 and quant.name in ("bf16", "fp16"):
        notes.append(f"{gpu.name} has no bf16 (CC {gpu.compute_capability}): weights run as float16")
    if know.fp16_activations and (not gpu.bf16 or quant.name == "fp16") and spec.model_type.startswith("gemma"):
        notes.append("Gemma models are trained in bf16: float16 activations may overflow (U); test the output")
    if not know.embedding_on_gpu and not weights.tied:
        notes.append(f"{know.label} keeps the token-embedding table ({weights.embed_bytes / GB:.2f} GB) in host memory")
    return notes


def _refusals(req: PlanRequest, r: _Resolved, b: Budget) -> list[str]:
    """What no budget fixes: attention heads that do not shard evenly, more hosts than layers."""
    spec, out = r.spec, []
    why = parallel.tp_problem(spec.heads, spec.kv_heads, req.gpus, mla=spec.is_mla) if b.tensor else None
    if why:
        out.append(f"REFUSED: the heads do not split evenly over {req.gpus} GPUs (tensor parallel): {why}")
    if req.hosts > spec.num_layers:
        out.append(f"REFUSED: {req.hosts} hosts for {spec.num_layers} layers: every host needs at least one layer")
    if r.image_refusal:
        out.append(r.image_refusal)
    if arch_support.refusal(r.release, spec):
        out.append(arch_support.refusal(r.release, spec))
    return out


@dataclass(frozen=True)
class Notes:
    problems: tuple[str, ...]  # why it does not fit: shown first
    notes: tuple[str, ...]
    floor: float  # the health floor
    fits: bool


def _notes(req: PlanRequest, r: _Resolved, know: EngineKnowledge, pa: ParallelAssumptions, b: Budget, fit: Fit,
           speed: Speed, off: Offload, flags: Flags) -> Notes:
    """Every note and refusal of the plan, in the order people read them, and the health floor."""
    spec, quant, weights = r.spec, r.quant, r.weights
    refusals = _refusals(req, r, b)
    problems = [*fit.problems, *off.problems, *refusals, *([flags.refusal] if flags.refusal else [])]
    notes = [*r.notes, *fit.notes, *off.notes, *([r.image_note] if r.image_note else [])]
    notes += _figure_notes(r, know, fit)
    notes += _split_notes(req, r, pa, b.split_mode, list(fit.devices), fit.binding, speed.comm)
    if weights.source.startswith("computed") and spec.origin == "catalog" and quant.family == "hf" and quant.group_size:
        notes.append(f"{quant.name}: group size {quant.group_size} assumed (scales and zeros add "
                     f"{quant.group_bits / quant.group_size:.2f} bits/weight)")
    if flags.note:
        notes.append(flags.note)
    if fit.resident:
        floor = speed.floor
        notes.append(f"health floor {floor:.1f} tok/s: {speed.floor_why}")
    else:
        floor = off.realistic[0] * 0.5
        notes.append(f"health floor {floor:.1f} tok/s: half the predicted offloaded speed (the plan is not resident)")
    fits = off.fits and not refusals and not flags.refusal
    return Notes(tuple(problems), tuple(notes), floor, fits)


@dataclass(frozen=True)
class SplitLayout:
    """A plan over several cards or hosts: the tightest card, the layers per host and device, the
    llama.cpp shares, the split's cost and what the deploy adds (one card: the whole model on it)."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    split_mode: str
    per_gpu: dict[str, int]
    layers_per_host: list[int]
    layers_per_device: list[int]
    tensor_split: list[int] | None
    comm: dict[str, float | str | list[float]]
    deploy_adds: list[str]


def _split_layout(req: PlanRequest, r: _Resolved, know: EngineKnowledge, a: EngineAssumptions,
                  pa: ParallelAssumptions, b: Budget, fit: Fit, comm: parallel.Cost) -> SplitLayout:
    spec, n, hosts = r.spec, req.gpus, req.hosts
    kv_plan = fit.kv_need(fit.context, req.concurrency) / fit.grow
    if fit.devices:
        dv = fit.devices[fit.binding]
        w, kv, fx = dv.weights_bytes, kv_plan * dv.kv_share, dv.fixed_bytes
        layers_per_device = [d.layers for d in fit.devices]
        # tensor parallel ranks and row-split cards each see every layer of their host (sharded)
        shard = n if b.tensor or b.split_mode == "row" else 1
        layers_per_host = [sum(d.layers for d in fit.devices if d.host == h) // shard for h in range(hosts)]
    else:
        w = b.basis_weights_bytes if b.tensor else b.weights_gpu_bytes
        kv, fx = kv_plan, fit.fixed_bytes if b.tensor else a.fixed_overhead_bytes
        layers_per_device = layers_per_host = [spec.num_layers]
    gbps, lat = _network(req, pa)
    kind, link = _interconnect(req, r.gpu)
    return SplitLayout(
        tensor_parallel_size=n if b.tensor else 1,
        pipeline_parallel_size=hosts if b.tensor else 1,
        split_mode=b.split_mode if b.devices > 1 else "",
        per_gpu={"weights_bytes": int(w), "kv_cache_bytes": int(kv), "overhead_bytes": int(fx + a.kv_fraction * kv),
                 "budget_bytes": int(b.card_bytes),
                 "kv_heads": parallel.kv_heads_per_gpu(spec.kv_heads, n) if b.tensor else spec.kv_heads},
        layers_per_host=layers_per_host,
        layers_per_device=list(layers_per_device),
        tensor_split=[1] * b.devices if not b.tensor and b.devices > 1 else None,
        comm={"low_us": round(comm.low_us, 1), "high_us": round(comm.high_us, 1), "how": comm.text,
              "interconnect": kind if n > 1 else "", "interconnect_gbps": link if n > 1 else 0.0,
              "network_gbps": gbps if hosts > 1 else 0.0,
              "network_latency_us": list(lat or pa.network_latency_us) if hosts > 1 else []},
        deploy_adds=know.deploy_adds(hosts, n),
    )


def _plan(req: PlanRequest, with_suggestions: bool) -> Plan:
    r = _resolve(req)
    know = for_engine(r.engine)
    a, pa = engine_assumptions(r.engine), parallel_assumptions()
    budget = _budget(req, r, know, a)
    fit = _fit(req, r, know, a, pa, budget)
    speed = _speed(req, r, a, pa, budget, fit)
    off = _offload(req, r, know, a, budget, fit, speed)
    flags = _flags(req, r, budget, fit, off)
    notes = _notes(req, r, know, pa, budget, fit, speed, off, flags)
    plan = _assemble(req, r, a, budget, fit, speed, off, flags, notes, _overhead(a, pa, budget, fit, req.concurrency),
                     _split_layout(req, r, know, a, pa, budget, fit, speed.comm))
    if with_suggestions and not plan.fits:
        _add_alternatives(req, plan, r, has_problems=bool(notes.problems))
    return plan


def _assemble(req: PlanRequest, r: _Resolved, a: EngineAssumptions, b: Budget, fit: Fit, speed: Speed, off: Offload,
              flags: Flags, notes: Notes, overhead: Overhead, split: SplitLayout) -> Plan:
    spec, quant, gpu, weights, k, context = r.spec, r.quant, r.gpu, r.weights, req.concurrency, fit.context
    model_kv = kv_layout(spec, r.kv_bytes, swa_cache=fit.window_kept)  # the whole model, all cards: the figure people compare
    ceiling, expected = off.ceiling, off.realistic
    return Plan(
        model=spec.name,
        model_origin=spec.origin,
        quant=quant.name + (f"-g{quant.group_size}" if quant.group_size and quant.group_size != 128 else ""),
        gpu=gpu.id,
        gpu_name=gpu.name,
        gpus=req.gpus,
        engine=r.engine,
        context=context,
        concurrency=k,
        kv_dtype=r.kv_name,
        gpu_memory_utilization=b.gpu_memory_utilization,
        params=int(weights.params),
        weights_bytes=int(weights.total_bytes),
        weights_gpu_bytes=int(b.weights_gpu_bytes - off.offload_bytes * b.shards),
        weights_source=weights.source,
        kv_bytes_per_token=int(model_kv.full_bytes_per_token),
        kv_sliding_bytes_per_token=int(model_kv.sliding_bytes_per_token),
        kv_sliding_window=model_kv.window,
        kv_state_bytes_per_sequence=int(model_kv.state_bytes_per_sequence),
        kv_bytes_per_sequence=int(model_kv.per_sequence(context)),
        kv_cache_bytes=int(model_kv.per_sequence(context) * k),
        overhead_bytes=int(overhead.bytes),
        overhead_assumption=overhead.text,
        memory_bytes=gpu.memory_bytes * b.devices,
        budget_bytes=int(b.card_bytes * b.devices),
        fits=bool(notes.fits),
        resident=bool(fit.resident),
        gpu_layers=off.gpu_layers,
        total_layers=spec.num_layers,
        max_context_tokens=int(off.max_context),
        max_concurrency=int(off.max_concurrency),
        kv_cache_tokens=fit.kv_cache_tokens,
        decode_tokps_ceiling=round(ceiling, 2),
        decode_tokps_realistic=(round(expected[0], 2), round(expected[1], 2)),
        efficiency=(round(expected[0] / ceiling, 3), round(expected[1] / ceiling, 3)),
        efficiency_assumption=speed.efficiency_text,
        image=r.release.key if r.release is not None else None,
        health_floor_tokps=round(notes.floor, 2),
        decode_tokps_offload_eighth=(round(speed.offload_eighth.low, 2), round(speed.offload_eighth.high, 2)),
        preflight={cid: {"status": v.status, "message": v.message, "fix": v.fix} for cid, v in flags.preflight},
        engine_env=dict(flags.env),
        offload_assumption=(
            f"weights off the GPU stream at {a.offload_gbps_low:.0f}-{a.offload_gbps_high:.0f} GB/s: "
            + "; ".join(a.offload_sources)
        ) if not fit.resident else "",
        engine_args=list(flags.args),
        notes=[*notes.problems, *notes.notes],
        hosts=req.hosts,
        tensor_parallel_size=split.tensor_parallel_size,
        pipeline_parallel_size=split.pipeline_parallel_size,
        split_mode=split.split_mode,
        per_gpu=dict(split.per_gpu),
        layers_per_host=list(split.layers_per_host),
        layers_per_device=list(split.layers_per_device),
        tensor_split=split.tensor_split,
        comm=dict(split.comm),
        deploy_adds=list(split.deploy_adds),
    )


def _add_alternatives(req: PlanRequest, plan: Plan, r: _Resolved, *, has_problems: bool) -> None:
    """A plan that does not fit gets the changes that would make it fit, and a note for a split that does."""
    plan.alternatives = _suggest(req, plan, r)
    split = [x for x in plan.alternatives if set(x["change"]) <= {"gpus", "hosts"}]
    others = [x for x in plan.alternatives if x not in split and "offload" not in x["change"]]
    if split:
        x = split[0]
        plan.notes.insert(1 if has_problems else 0,
                          f"fits {'only ' if not others else ''}when split: {x['flags']} ({x['why']}): "
                          f"{x['per_gpu_weights_bytes'] / GB:.1f} GB of weights per GPU, layers per host "
                          f"{x['layers_per_host']}, up to {x['max_context_tokens']:,} tokens of context")


def _checked_args(
    req: PlanRequest, r: _Resolved, context: int, k: int, gmu: float, gpu_layers: int, resident: bool, offload: float
) -> tuple[list[str], dict[str, str], dict[str, Any], str]:
    """(engine flags, environment they need, the preflight's flag verdicts on the card, a note). The flags come from the
    engine's own knowledge (``llmfleet.knowledge.engines``); they are judged by the same rules the
    preflight applies (``compat.flag_checks``), and where the default attention backend cannot hold
    the KV dtype another backend of the release that can is chosen."""
    know = for_engine(r.engine)
    rel = r.release
    cat = compat.load_engine_catalog()
    rules = cat.engines[r.engine]
    cc = r.gpu.compute_capability
    select = rel.attention.select if rel is not None and rel.attention is not None else "arg"
    # Every engine gets the whole plan and takes the fields it needs.
    base = PlanFlags(
        quantization=know.quantization_flag(rel, rules, r.quant, cc), float16=not r.gpu.bf16 or r.quant.name == "fp16",
        gpu_memory_utilization=gmu, context=context, concurrency=k, kv_flag=r.kv_flag, gpus=req.gpus,
        hosts=req.hosts, split_mode=req.split_mode or know.split_modes[0],
        tensor_split=(1,) * (req.gpus * req.hosts) if req.gpus * req.hosts > 1 else None,
        offload_bytes=offload if (not resident and req.offload) else 0.0, backend_select=select,
        num_layers=r.spec.num_layers, resident=resident, gpu_layers=gpu_layers, release=rel, rules=rules,
    )
    args = know.engine_args(base)
    if rel is None:
        return args, {}, {}, ""

    # A GGUF file of a type the catalog has no name for is still a GGUF file to the engine.
    qname = r.quant.name if (r.quant.name in rules.quant_methods or r.quant.family != "gguf") else "gguf"

    def judge(a: list[str], env: dict[str, str]) -> dict[str, Any]:
        return compat.flag_checks(rel, rules, quant=qname, kv_dtype=r.kv_flag, args=a + list(req.extra_args),
                                  env={**dict(req.extra_env), **env}, cc=cc, bf16_native=r.gpu.bf16)

    checks = judge(args, {})
    var = know.attention_backend_env
    if var and checks["kv-dtype"].status == "fail" and rel.attention is not None:
        for backend in rel.attention.backends:
            env = {var: backend} if select == "env" else {}
            alt_args = know.engine_args(replace(base, attention_backend=backend))
            alt = judge(alt_args, env)
            # a backend no source confirms for this KV dtype on this card is not picked
            if alt["kv-dtype"].status == "pass" and all(v.status != "fail" for v in alt.values()):
                how = f"env {var}={backend}" if select == "env" else f"--attention-backend {backend}"
                return alt_args, env, alt, (f"{r.kv_flag} KV cache: the default attention backend of {rel.key} on compute "
                                       f"capability {cc} cannot hold it; planned with {how}")
    return args, {}, checks, ""


def _suggest(req: PlanRequest, plan: Plan, r: _Resolved) -> list[dict[str, Any]]:
    """Changes that would make the request fit, best first: keep quality and capacity where possible."""
    out: list[dict[str, Any]] = []

    def attempt(change: dict[str, Any], why: str, flags: str) -> bool:
        try:
            alt = _plan(replace(req, **change), with_suggestions=False)
        except UsageError:
            return False
        if not alt.fits:
            return False
        out.append(
            {
                "rank": len(out) + 1,
                "change": change,
                "flags": flags,
                "why": why,
                "max_context_tokens": alt.max_context_tokens,
                "max_concurrency": alt.max_concurrency,
                "decode_tokps_realistic": list(alt.decode_tokps_realistic),
                "weights_bytes": alt.weights_bytes,
                "engine_args": list(alt.engine_args),
                "engine_env": dict(alt.engine_env),
                "image": alt.image,
                "preflight": {cid: v["status"] for cid, v in alt.preflight.items()},
                "gpus": alt.gpus,
                "hosts": alt.hosts,
                "per_gpu_weights_bytes": alt.per_gpu.get("weights_bytes"),
                "layers_per_host": list(alt.layers_per_host),
            }
        )
        return True

    # 1. A smaller quantization of the same family (catalog models; files are what they are).
    if r.spec.origin == "catalog":
        family = for_engine(r.engine).quant_family
        smaller = sorted(
            (q for q in load_quants() if q.family == family and q.bits < r.quant.bits and r.gpu.cc >= q.min_cc
             and (r.spec.is_moe or not (q.experts_only or q.rule("experts")))),  # expert-only formats: MoE only
            key=lambda q: -q.bits,
        )
        for q in smaller:
            if attempt({"quant": q.name}, f"{q.name} weights fit with the asked context", f"--quant {q.name}"):
                break
    # 2. A smaller KV cache dtype.
    small_kv = for_engine(r.engine).small_kv_dtype
    if r.kv_bytes > 1.5 and plan.resident:
        attempt({"kv_dtype": small_kv}, f"{small_kv} KV cache halves KV memory", f"--kv-dtype {small_kv}")
    # 3. A shorter context, 4. fewer sequences.
    if plan.resident and plan.max_context_tokens >= min_context():
        ctx = _round_down(plan.max_context_tokens, 256)
        attempt({"context": ctx}, f"the most context that fits {plan.concurrency} sequences", f"--context {ctx}")
    if plan.resident and req.concurrency > 1 and plan.max_concurrency >= 1:
        attempt(
            {"concurrency": plan.max_concurrency},
            f"the most sequences that fit at {plan.context} tokens",
            f"--concurrency {plan.max_concurrency}",
        )
    # 5. More GPUs of the host (tensor parallel / layer split), then more hosts (pipeline parallel / RPC).
    know = for_engine(r.engine)
    how = know.split_word
    have = req.gpus_available
    counts = [c for c in range(req.gpus + 1, have + 1)] if have else [c for c in (2, 4, 8) if c > req.gpus]
    split_found = False
    for n in counts:
        # the smallest split that fits and the next one up (more room for context and sequences)
        if attempt({"gpus": n}, f"{how} over {n} x {plan.gpu_name}", f"--gpus {n}"):
            if split_found:
                break
            split_found = True
    if not split_found and not req.offload:
        per_host = max(req.gpus, have or req.gpus)
        cross = know.cross_host_word
        for h in (2, 3, 4):
            if h > req.hosts and attempt({"hosts": h, "gpus": per_host},
                                         f"{cross} over {h} hosts of {per_host} x {plan.gpu_name}",
                                         f"--hosts {h} --gpus {per_host}"):
                break
    # 6. Offload, last: it works but is slow.
    if not plan.resident and not req.offload:
        attempt({"offload": True}, "accept CPU offload (slow, see notes)", "--offload")
    return out


def plan(req: PlanRequest) -> Plan:
    """Plan one deployment. Raises UsageError for unknown models, quants, GPUs or bad values."""
    return _plan(req, with_suggestions=True)


def plan_for_service(
    service: Any,
    gpu: Gpu | str | None,
    gpu_count: int = 1,
    facts: Any = None,
    model: ModelSpec | None = None,
    *,
    hosts: int = 1,
    network_gbps: float | None = None,
    network_latency_us: float | None = None,
    driver: str | None = None,
    measured_efficiency: tuple[float, str] | None = None,
) -> Plan:
    """Plan an inventory Service (llmfleet.inventory.services.Service) on a card. ``driver``: the
    host's NVIDIA driver (default: the facts'), for the image's driver note.

    ``hosts``: the hosts the service spans (the head and its workers, each with ``gpus`` cards like the
    head); ``network_gbps`` (Gbit/s, the slowest link between them: llmfleet_network_gbps) and
    ``network_latency_us`` price the hops between them (None: planner.yaml's defaults).

    ``gpu`` is the card (catalog entry, id or nvidia-smi name); ``gpu_count`` the host's card count,
    used when the service takes ``gpus: all``. With ``facts`` (llmfleet.host.facts.Facts) the cards the
    service uses are read from the host: their real memory.total replaces the catalog figure, the
    card is taken from them when ``gpu`` is None, and a GGUF file's real size is compared with the
    plan. ``model`` overrides the catalog lookup of ``service.model`` (e.g. a spec read from files).
    """
    card, n, facts_note = _service_cards(service, gpu, gpu_count, facts)
    spec, size = _service_model(service, model, facts)
    image = getattr(service, "image", None)
    image_note = None
    if image and compat.load_engine_catalog().release(str(image)) is None:
        image_note = f"image {image!r} is not in the engine catalog: judged against the catalog's default instead"
        image = None
    req = PlanRequest(
        image=str(image) if image else None,
        model=spec,
        quant=service.quant,
        gpu=card,
        gpus=max(1, n),
        context=service.context,
        concurrency=service.concurrency,
        engine=service.engine,
        kv_dtype=service.kv_dtype,
        gpu_memory_utilization=service.gpu_memory_utilization,
        offload=service.offload,
        extra_args=tuple(str(a) for a in (getattr(service, "engine_args", None) or [])),
        extra_env=tuple(sorted((str(k), str(v)) for k, v in (getattr(service, "env", None) or {}).items())),
        hosts=max(1, int(hosts)),
        network_gbps=network_gbps,
        network_latency_us=network_latency_us,
        gpus_available=(len(facts.gpus) if facts is not None and getattr(facts, "gpus", None) else int(gpu_count))
        if max(len(getattr(facts, "gpus", None) or []), int(gpu_count)) > 1 else None,
        driver=driver or getattr(facts, "driver_version", None) or None,
        measured_efficiency=measured_efficiency,
    )
    result = plan(req)
    if facts_note:
        result.notes.append(facts_note)
    if image_note:
        result.notes.append(image_note)
    if size and result.model_origin == "catalog" and abs(size - result.weights_bytes) > 0.1 * result.weights_bytes:
        result.notes.append(
            f"{service.model_path} on the host holds {size / GB:.1f} GB; the plan assumes {result.weights_bytes / GB:.1f} GB "
            f"of {result.quant} weights: check the quant"
        )
    return result


def _service_cards(service: Any, gpu: Gpu | str | None, gpu_count: int, facts: Any) -> tuple[Gpu, int, str | None]:
    """(the card, how many the service uses, a note when the host's facts change its memory)."""
    chosen = list(getattr(facts, "gpus", None) or []) if facts is not None else []
    if chosen and isinstance(service.gpus, list):
        chosen = [g for g in chosen if g.index in service.gpus]
    if gpu is None:
        if not chosen:
            raise UsageError(f"service {service.name}: no GPU known (set llmfleet_gpu or gather facts)")
        gpu = chosen[0].catalog_id or chosen[0].name
    card = gpu if isinstance(gpu, Gpu) else find_gpu(str(gpu))
    facts_note = None
    mib = [g.memory_total_mib for g in chosen if g.memory_total_mib]
    if mib and min(mib) != card.memory_mib:
        facts_note = f"GPU memory from the host's facts: {min(mib)} MiB (catalog: {card.memory_mib} MiB)"
        card = replace(card, memory_mib=int(min(mib)))
    if isinstance(service.gpus, list):
        n = len(service.gpus)
    elif chosen:
        n = len(chosen)
    else:
        n = int(gpu_count)
    return card, n, facts_note


def _service_model(service: Any, model: ModelSpec | None, facts: Any) -> tuple[str | ModelSpec, int | None]:
    """(the model to plan, the size of its file on the host to compare the plan with). An engine that
    sizes a service without a quant from its file on the host (llama.cpp: a GGUF file is what it is)
    plans that file's real size."""
    mf = facts.model(service.model_path) if facts is not None and hasattr(facts, "model") else None
    size = getattr(mf, "size_bytes", None) if mf is not None and getattr(mf, "kind", "") == "file" else None
    spec: str | ModelSpec = model if model is not None else service.model
    know = for_engine(service.engine)
    from_file = know.sizes_from_host_file
    if from_file and not service.quant and size and getattr(mf, "magic", "GGUF") == "GGUF":
        # No quant named: the GGUF file on the host is what it is; take its real size.
        base = spec if isinstance(spec, ModelSpec) else _resolve_model(spec)
        spec = replace(base, origin="gguf", path=f"{service.model_path} (size from the host's facts)",
                       file_weights_bytes=int(size), file_quant="gguf", file_embed_bytes=None,
                       file_output_bytes=None, file_params=None)
        size = None  # nothing to compare: the plan uses it
    elif (
        from_file
        and not service.quant
        and not (isinstance(spec, ModelSpec) and spec.file_quant)
        and not (isinstance(spec, str) and spec.lower().endswith(".gguf"))
    ):
        fam = know.quant_family
        names = ", ".join(q.name for q in load_quants() if q.family == fam)
        raise UsageError(
            f"service {service.name}: {know.label} with no quant and the {fam.upper()} file's size unknown; set quant "
            f"({names}) on the service, or gather the host's facts (invoke plan --host HOST --gather)"
        )
    return spec, (int(size) if size else None)


def decode_ceiling(bandwidth_gbps: float, bytes_per_token: float) -> float:
    """Batch-1 decode ceiling in tokens/s: memory bandwidth over the bytes read per token."""
    return bandwidth_gbps * GB / bytes_per_token


# ------------------------------------------------------------------------------------------ summary


@dataclass(frozen=True)
class PlanSummary:
    """What a deploy, its health check and status need from a plan: the engine flags, the shape of
    the deployment and the decode figures the health check's floor is measured against.

    Built from a ``Plan`` (``summarize``) or read back from a release's manifest (``from_dict``,
    which holds the whole plan as ``Plan.to_dict`` wrote it; unknown or mistyped keys are left empty).
    """

    engine: str = ""
    model: str = ""
    quant: str = ""
    gpu: str = ""
    gpus: int = 1
    hosts: int = 1
    context: int | None = None
    concurrency: int | None = None
    fits: bool | None = None
    resident: bool | None = None
    engine_args: tuple[str, ...] = ()
    decode_tokps_ceiling: float | None = None
    decode_tokps_realistic: tuple[float, float] | None = None  # (low, high), batch 1
    health_floor_tokps: float | None = None  # the planner's own decode floor (release.health)
    image: str = ""  # the engine catalog image the plan was judged for
    # What the engine's load report is compared with (release.residency)
    gpu_layers: int | None = None  # repeating layers on the GPU
    total_layers: int | None = None  # repeating layers of the model
    weights_bytes: int | None = None  # all weights
    weights_gpu_bytes: int | None = None  # weights in GPU memory, all cards together
    weights_per_gpu_bytes: int | None = None  # the tightest card's share (split plans)
    kv_cache_tokens: int | None = None  # tokens the KV cache holds at the plan (None: not computed)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    @property
    def realistic_low(self) -> float | None:
        """The low end of the realistic batch-1 decode range, when positive."""
        r = self.decode_tokps_realistic
        return r[0] if r is not None and r[0] > 0 else None

    @classmethod
    def from_dict(cls, data: Any) -> PlanSummary | None:
        if not isinstance(data, dict):
            return None

        def num(key: str) -> float | None:
            v = data.get(key)
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        def whole(key: str) -> int | None:
            v = data.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        def text(key: str) -> str:
            v = data.get(key)
            return v if isinstance(v, str) else ""

        def flag(key: str) -> bool | None:
            v = data.get(key)
            return v if isinstance(v, bool) else None

        rng = data.get("decode_tokps_realistic")
        realistic = None
        if isinstance(rng, list | tuple) and len(rng) == 2 and all(isinstance(x, int | float) for x in rng):
            realistic = (float(rng[0]), float(rng[1]))
        args = data.get("engine_args")
        per_gpu = data.get("per_gpu")
        per_gpu_w = per_gpu.get("weights_bytes") if isinstance(per_gpu, dict) else None
        floor = num("health_floor_tokps")
        return cls(
            engine=text("engine"), model=text("model"), quant=text("quant"), gpu=text("gpu"),
            gpus=whole("gpus") or 1, hosts=whole("hosts") or 1, context=whole("context"), concurrency=whole("concurrency"),
            fits=flag("fits"), resident=flag("resident"),
            engine_args=tuple(str(a) for a in args) if isinstance(args, list | tuple) else (),
            decode_tokps_ceiling=num("decode_tokps_ceiling"), decode_tokps_realistic=realistic,
            health_floor_tokps=floor if floor is not None and floor > 0 else None, image=text("image"),
            gpu_layers=whole("gpu_layers"), total_layers=whole("total_layers"), weights_bytes=whole("weights_bytes"),
            weights_gpu_bytes=whole("weights_gpu_bytes"),
            weights_per_gpu_bytes=per_gpu_w if isinstance(per_gpu_w, int) and not isinstance(per_gpu_w, bool) else None,
            kv_cache_tokens=whole("kv_cache_tokens"),
            tensor_parallel_size=whole("tensor_parallel_size") or 1,
            pipeline_parallel_size=whole("pipeline_parallel_size") or 1,
        )


def summarize(plan: Plan | PlanSummary | None) -> PlanSummary | None:
    """The summary of a plan (a summary is returned as it is; no plan, no summary)."""
    if plan is None or isinstance(plan, PlanSummary):
        return plan
    return PlanSummary(
        engine=plan.engine, model=plan.model, quant=plan.quant, gpu=plan.gpu, gpus=plan.gpus, hosts=plan.hosts,
        context=plan.context, concurrency=plan.concurrency, fits=plan.fits, resident=plan.resident,
        engine_args=tuple(plan.engine_args), decode_tokps_ceiling=plan.decode_tokps_ceiling,
        decode_tokps_realistic=(float(plan.decode_tokps_realistic[0]), float(plan.decode_tokps_realistic[1])),
        health_floor_tokps=plan.health_floor_tokps, image=plan.image or "",
        gpu_layers=plan.gpu_layers, total_layers=plan.total_layers, weights_bytes=plan.weights_bytes,
        weights_gpu_bytes=plan.weights_gpu_bytes,
        weights_per_gpu_bytes=int(plan.per_gpu["weights_bytes"]) if "weights_bytes" in plan.per_gpu else None,
        kv_cache_tokens=plan.kv_cache_tokens, tensor_parallel_size=plan.tensor_parallel_size,
        pipeline_parallel_size=plan.pipeline_parallel_size,
    )
