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

The package, one module per step, each depending only on those above it:

    request   PlanRequest, its checks, the units          weights   weight bytes from shapes or files
    kv        the KV cache of one sequence                 image     the catalog image a plan is judged against
    resolve   the request against the catalogs             split     cards and hosts of a split, its cost
    budget    one card's memory, the basis of the fit      fit       the KV pool, context and sequences
    speed     the decode speed model, the health floor     offload   weights that do not fit the GPUs
    flags     engine flags, judged by the preflight        notes     notes and refusals, in reading order
    result    the Plan                                     assemble  overhead, split layout, the Plan put together
    suggest   alternatives for a plan that does not fit    summary   PlanSummary, what a deploy keeps
    core      plan: the steps composed                     service   plan_for_service: an inventory service
"""

from __future__ import annotations

from llmfleet.knowledge.catalog import default_memory_reserved_mib
from llmfleet.knowledge.planner.assemble import Overhead, SplitLayout, _assemble, _overhead, _split_layout
from llmfleet.knowledge.planner.budget import Budget, _budget
from llmfleet.knowledge.planner.core import _plan, plan
from llmfleet.knowledge.planner.fit import Fit, _fit
from llmfleet.knowledge.planner.flags import Flags, _checked_args, _flags
from llmfleet.knowledge.planner.kv import KvLayout, kv_layout
from llmfleet.knowledge.planner.notes import Notes, _figure_notes, _notes, _refusals
from llmfleet.knowledge.planner.offload import Offload, _offload
from llmfleet.knowledge.planner.request import GB, GIB, HEALTH_PROBE_CONTEXT, PlanRequest
from llmfleet.knowledge.planner.resolve import _resolve
from llmfleet.knowledge.planner.result import Plan
from llmfleet.knowledge.planner.service import plan_for_service
from llmfleet.knowledge.planner.speed import (
    DecodeSpeed,
    Speed,
    _speed,
    decode_ceiling,
    decode_speed,
    health_floor,
)
from llmfleet.knowledge.planner.split import _split_notes
from llmfleet.knowledge.planner.suggest import _suggest
from llmfleet.knowledge.planner.summary import PlanSummary, summarize
from llmfleet.knowledge.planner.weights import Weights, compute_weights

__all__ = [
    "Budget",
    "compute_weights",
    "decode_ceiling",
    "decode_speed",
    "DecodeSpeed",
    "default_memory_reserved_mib",
    "Fit",
    "Flags",
    "GB",
    "GIB",
    "health_floor",
    "HEALTH_PROBE_CONTEXT",
    "kv_layout",
    "KvLayout",
    "Notes",
    "Offload",
    "Overhead",
    "plan",
    "Plan",
    "plan_for_service",
    "PlanRequest",
    "PlanSummary",
    "Speed",
    "SplitLayout",
    "summarize",
    "Weights",
    "_assemble",
    "_budget",
    "_checked_args",
    "_figure_notes",
    "_fit",
    "_flags",
    "_notes",
    "_offload",
    "_overhead",
    "_plan",
    "_refusals",
    "_resolve",
    "_speed",
    "_split_layout",
    "_split_notes",
    "_suggest",
]
