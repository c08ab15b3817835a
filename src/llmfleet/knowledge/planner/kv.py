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
