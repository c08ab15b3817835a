"""The fit step: the KV layout, the pool the cards leave it, and the context and sequences it holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmfleet.knowledge.catalog import EngineAssumptions, ParallelAssumptions, min_context
from llmfleet.knowledge.engines import EngineKnowledge, KvLayoutInfo
from llmfleet.knowledge.planner.budget import Budget
from llmfleet.knowledge.planner.kv import KvLayout, kv_layout
from llmfleet.knowledge.planner.request import GB, PlanRequest
from llmfleet.knowledge.planner.resolve import _Resolved
from llmfleet.knowledge.planner.split import _Device, _pool_of, _split_devices


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
    layout = kv_layout(spec, r.kv_bytes, tp=b.shards, block_size=a.block_size, swa_cache=window,
                       page_multiple=a.hybrid_page_multiple)
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
    notes: list[str] = [a.reserve_note] if a.reserve_note else []
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
    elif resident and layout.page_tokens and per_seq > 0:
        # vLLM's hybrid pages: its "GPU KV cache size" is concurrency x max-model-len
        # (vllm/v1/core/kv_cache_utils.py get_kv_cache_capacity)
        kv_cache_tokens = int(layout.pages_in(pool) / layout.pages_per_sequence(context) * context)
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
