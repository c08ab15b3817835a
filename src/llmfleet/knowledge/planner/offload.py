"""The offload step: what a plan whose weights do not all fit on the GPUs does: refused, or with
--offload, the layers that stay and the speed the rest costs."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.knowledge.catalog import EngineAssumptions
from llmfleet.knowledge.engines import EngineKnowledge
from llmfleet.knowledge.planner.budget import Budget
from llmfleet.knowledge.planner.fit import Fit
from llmfleet.knowledge.planner.request import GB, GIB, PlanRequest
from llmfleet.knowledge.planner.resolve import _Resolved
from llmfleet.knowledge.planner.speed import Speed, decode_speed


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
