"""Weight bytes of a model in a quantization format: computed from its shapes (llama.cpp's per-tensor
type rules for GGUF), or the real sizes read from its files."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.knowledge.catalog import LINEAR, ModelSpec, Quant, ggml_type_bits
from llmfleet.knowledge.engines import for_engine


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
