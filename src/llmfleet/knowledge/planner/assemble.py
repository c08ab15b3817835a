"""Assembly: the overhead and the split layout of a plan, and the ``Plan`` put together from the
steps' records."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.knowledge import parallel
from llmfleet.knowledge.catalog import EngineAssumptions, ParallelAssumptions
from llmfleet.knowledge.engines import EngineKnowledge
from llmfleet.knowledge.planner.budget import Budget
from llmfleet.knowledge.planner.fit import Fit
from llmfleet.knowledge.planner.flags import Flags
from llmfleet.knowledge.planner.kv import kv_layout
from llmfleet.knowledge.planner.notes import Notes
from llmfleet.knowledge.planner.offload import Offload
from llmfleet.knowledge.planner.request import GIB, PlanRequest
from llmfleet.knowledge.planner.resolve import _Resolved
from llmfleet.knowledge.planner.result import Plan
from llmfleet.knowledge.planner.speed import Speed
from llmfleet.knowledge.planner.split import _interconnect, _network


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


def _assemble(req: PlanRequest, r: _Resolved, a: EngineAssumptions, b: Budget, fit: Fit, speed: Speed, off: Offload,
              flags: Flags, notes: Notes, overhead: Overhead, split: SplitLayout) -> Plan:
    spec, quant, gpu, weights, k, context = r.spec, r.quant, r.gpu, r.weights, req.concurrency, fit.context
    model_kv = kv_layout(spec, r.kv_bytes, swa_cache=fit.window_kept,
                         page_multiple=a.hybrid_page_multiple)  # the whole model, all cards: the figure people compare
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
