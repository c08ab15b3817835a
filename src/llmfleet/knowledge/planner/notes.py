"""The notes step: every note and refusal of a plan, in the order people read them, and its health
floor."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.knowledge import arch_support, parallel
from llmfleet.knowledge.catalog import FULL, LINEAR, SLIDING, ParallelAssumptions
from llmfleet.knowledge.engines import EngineKnowledge
from llmfleet.knowledge.planner.budget import Budget
from llmfleet.knowledge.planner.fit import Fit
from llmfleet.knowledge.planner.flags import Flags
from llmfleet.knowledge.planner.offload import Offload
from llmfleet.knowledge.planner.request import GB, PlanRequest
from llmfleet.knowledge.planner.resolve import _Resolved
from llmfleet.knowledge.planner.speed import Speed
from llmfleet.knowledge.planner.split import _split_notes


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
    """What no budget fixes: attention heads that do not shard evenly, more hosts than layers, an image
    whose build does not know the model's architecture."""
    spec, out = r.spec, []
    why = parallel.tp_problem(spec.heads, spec.kv_heads, req.gpus, mla=spec.is_mla) if b.tensor else None
    if why:
        out.append(f"REFUSED: the heads do not split evenly over {req.gpus} GPUs (tensor parallel): {why}")
    if req.hosts > spec.num_layers:
        out.append(f"REFUSED: {req.hosts} hosts for {spec.num_layers} layers: every host needs at least one layer")
    if r.image_refusal:
        out.append(r.image_refusal)
    unknown = arch_support.refusal(r.release, spec)
    if unknown:
        out.append(unknown)
    types = arch_support.type_refusal(r.release, r.quant.name)
    if types:
        out.append(types)
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
