"""A plan split over several cards or hosts: what each card holds (by the engine's own rules,
``llmfleet.knowledge.parallel``), the card that binds the KV pool, the interconnect and network, what
the split costs per token, and the split in words."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmfleet.knowledge import parallel
from llmfleet.knowledge.catalog import Gpu
from llmfleet.knowledge.planner.request import GB, PlanRequest
from llmfleet.knowledge.planner.resolve import _Resolved
from llmfleet.knowledge.planner.weights import _attention_matrices, _layer_is_attention, _mlp_matrices


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
