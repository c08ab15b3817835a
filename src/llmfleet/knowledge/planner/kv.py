"""The KV cache of one sequence: bytes per token of full-attention and sliding-window layers and the
fixed state of linear-attention layers."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmfleet.knowledge.catalog import FULL, LINEAR, SLIDING, ModelSpec


@dataclass(frozen=True)
class KvLayout:
    """KV cache of one sequence, on one basis (per GPU for tensor parallel, or all cards)."""

    full_bytes_per_token: float
    sliding_bytes_per_token: float
    window: int | None
    state_bytes_per_sequence: float
    block_size: int = 1
    # vLLM's hybrid layout: attention pages of page_tokens tokens as large as one layer's state; a page
    # block is one page in each of group_layers layers; a sequence takes ceil(context / page_tokens)
    # blocks per attention group and one per state group (0: not paged so)
    page_tokens: int = 0
    page_block_bytes: float = 0.0
    attention_groups: int = 0
    state_groups: int = 0

    def pages_per_sequence(self, context: int) -> int:
        return math.ceil(context / self.page_tokens) * self.attention_groups + self.state_groups

    def pages_in(self, pool: float) -> int:
        return int(pool // self.page_block_bytes) if self.page_block_bytes else 0

    def per_sequence(self, context: int) -> float:
        if self.page_tokens:
            return self.pages_per_sequence(context) * self.page_block_bytes
        ctx = context
        if self.block_size > 1:
            ctx = math.ceil(context / self.block_size) * self.block_size
        swa = min(ctx, self.window) if self.window else ctx
        return ctx * self.full_bytes_per_token + swa * self.sliding_bytes_per_token + self.state_bytes_per_sequence


def kv_layout(spec: ModelSpec, kv_bytes: float, tp: int = 1, block_size: int = 1, swa_cache: bool = True,
              page_multiple: int = 0) -> KvLayout:
    """KV bytes per token: 2 (K and V) x layers x KV heads x head_dim x bytes per value.

    With tensor parallel each GPU holds max(1, kv_heads // tp) heads (vLLM replicates heads when
    tp > kv_heads). Multi-head latent attention (DeepSeek) caches one compressed vector of
    kv_lora_rank + qk_rope_head_dim values per layer and token, on every GPU. Linear-attention
    layers keep a recurrent state (``linear_state_bytes`` per value; float32 where the engine runs it
    so) and a convolution state (16 bit) instead. ``swa_cache`` False: the engine build keeps a full
    context of KV on the sliding-window layers too (llama.cpp before its SWA cache, vLLM V0).

    ``page_multiple`` (vLLM, models with full-attention and linear-attention layers): vLLM sizes one
    attention page to hold a layer's state (16 bit: the model's dtype), page_multiple x ceil(state / (page_multiple x one token's
    KV of a layer)) tokens, pads the state to that page, and groups the layers by kind into groups of
    min(full, linear) layers (max where max < 1.5 x min): a sequence takes ceil(context / page tokens)
    pages per attention group and one per state group, each page in every layer of a group
    (vllm/platforms/interface.py _align_hybrid_block_size, vllm/v1/core/kv_cache_utils.py
    _get_kv_cache_groups_uniform_page_size and get_max_concurrency_for_kv_cache_config, 0.26.0).
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
        n_full = spec.count(FULL)
        if page_multiple and n_full and not sliding and not spec.is_mla:
            # vLLM keeps the recurrent state in the model's dtype (mamba_ssm_cache_dtype "auto"): a 16-bit
            # state; measured on 0.26: Qwen3.5-27B's attention page is 400 tokens and its state padded by
            # 0.25 % (tests/data/engine-logs/vllm-0.26.0-h100-qwen3.5-27b-bf16-batched8192.log)
            layer_state = v_heads * spec.linear_key_head_dim * spec.linear_value_head_dim * 2.0 + conv
            page_tokens = page_multiple * math.ceil(layer_state / (page_multiple * per_layer))
            group = min(n_full, n_linear)
            if max(n_full, n_linear) < 1.5 * group:
                group = max(n_full, n_linear)
            return KvLayout(full, sliding, window, state, block_size, page_tokens=page_tokens,
                            page_block_bytes=page_tokens * per_layer * group,
                            attention_groups=math.ceil(n_full / group), state_groups=math.ceil(n_linear / group))
    return KvLayout(full, sliding, window, state, block_size)
