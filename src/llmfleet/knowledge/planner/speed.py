"""The speed model (batch-1 decode: bandwidth x efficiency, per-layer and per-token costs, host
memory for offloaded weights), the health floor, and the speed step of a plan."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.knowledge import parallel
from llmfleet.knowledge.catalog import LINEAR, EngineAssumptions, Gpu, ParallelAssumptions, speed_assumptions
from llmfleet.knowledge.engines import for_engine
from llmfleet.knowledge.planner.budget import Budget
from llmfleet.knowledge.planner.fit import Fit
from llmfleet.knowledge.planner.request import GB, HEALTH_PROBE_CONTEXT, PlanRequest
from llmfleet.knowledge.planner.resolve import _Resolved
from llmfleet.knowledge.planner.split import _comm_cost


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
    linear_layer_us: tuple[float, float] = (0.0, 0.0)


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
    linear_layers: int = 0,
) -> DecodeSpeed:
    """time per token = gpu_bytes / (bandwidth x efficiency) + layers x per-layer cost + MoE layers x
    MoE per-layer cost + per-token cost + host_bytes / host bandwidth; the low speed pairs the low
    efficiency with the high costs. ``cuda_graphs``: the build decodes as one CUDA graph (True), launches
    every kernel from the host (False), or either (None: low end without graphs, high end with);
    ``legacy`` is the old name of ``cuda_graphs=False``. ``compute_capability`` scales the efficiency
    on cards without DP4A (planner.yaml no_dp4a_*). ``extra_us``: (low, high) microseconds per token of
    communication (all-reduces, network hops) added on top. ``efficiency``: a measured (low, high)
    instead of the catalog's (a fleet's fitted figure already holds the card's own factors).
    ``linear_layers``: linear-attention (Gated DeltaNet) layers, each costing ``linear_layer_us`` on top of
    the per-layer cost (their state's bytes are in ``gpu_bytes``: read and written back every token)."""
    sp = speed_assumptions(engine)
    cls, (e_lo, e_hi) = sp.efficiency_for(memory_type)
    f_lo, f_hi = sp.efficiency_factor(compute_capability)
    e_lo, e_hi = (e_lo * f_lo, e_hi * f_hi) if efficiency is None else efficiency
    graphs = False if legacy else cuda_graphs
    with_g = sp.per_layer_for(cls)
    without_g = sp.legacy_per_layer_us or with_g
    moe_g = sp.moe_layer_us
    moe_ng = sp.moe_layer_us_no_graphs or moe_g
    lin_g = sp.linear_layer_us
    lin_ng = sp.linear_layer_us_no_graphs or lin_g
    if graphs is True:
        (c_lo, c_hi), (m_lo, m_hi), (l_lo, l_hi) = with_g, moe_g, lin_g
    elif graphs is False:
        (c_lo, c_hi), (m_lo, m_hi), (l_lo, l_hi) = without_g, moe_ng, lin_ng
    else:
        (c_lo, c_hi), (m_lo, m_hi), (l_lo, l_hi) = ((with_g[0], without_g[1]), (moe_g[0], moe_ng[1]),
                                                    (lin_g[0], lin_ng[1]))
    p_lo, p_hi = sp.per_token_us
    bw = bandwidth_gbps * GB
    h_lo, h_hi = host_gbps or (1.0, 1.0)
    x_lo, x_hi = extra_us
    t_slow = (gpu_bytes / (bw * e_lo) + (layers * c_hi + moe_layers * m_hi + linear_layers * l_hi + p_hi + x_hi) * 1e-6
              + (host_bytes / (h_lo * GB) if host_bytes else 0.0))
    t_fast = (gpu_bytes / (bw * e_hi) + (layers * c_lo + moe_layers * m_lo + linear_layers * l_lo + p_lo + x_lo) * 1e-6
              + (host_bytes / (h_hi * GB) if host_bytes else 0.0))
    return DecodeSpeed(1.0 / t_slow, 1.0 / t_fast, cls, (e_lo, e_hi), (c_lo, c_hi), (m_lo, m_hi), graphs,
                       (l_lo, l_hi) if linear_layers else (0.0, 0.0))


def health_floor(engine: str, gpu: Gpu, read_bytes: float, layer_read_bytes: float, layers: int,
                 offload_gbps: tuple[float, float], gpus: int = 1,
                 extra_us: tuple[float, float] = (0.0, 0.0), moe_layers: int = 0, linear_layers: int = 0,
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
                            moe_layers=moe_layers, cuda_graphs=graphs, compute_capability=cc,
                            linear_layers=linear_layers)
    off_bytes = layer_read_bytes / gpus * share
    moves = for_engine(engine).offload_moves_layers
    offloaded = decode_speed(engine, gpu.bandwidth_gbps, gpu.memory_type, per_gpu - off_bytes,
                             layers - int(layers * share) if moves else layers,
                             host_bytes=off_bytes, host_gbps=offload_gbps, extra_us=extra_us,
                             moe_layers=moe_layers - int(moe_layers * share) if moves else moe_layers,
                             cuda_graphs=graphs, compute_capability=cc,
                             linear_layers=linear_layers - int(linear_layers * share) if moves else linear_layers)
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


def decode_ceiling(bandwidth_gbps: float, bytes_per_token: float) -> float:
    """Batch-1 decode ceiling in tokens/s: memory bandwidth over the bytes read per token."""
    return bandwidth_gbps * GB / bytes_per_token


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
    # A linear-attention layer reads its recurrent state and writes it back every token: the KV of one
    # sequence counts the state once (the read), the write-back adds it again.
    state_write = fit.layout.state_bytes_per_sequence
    read_bytes = weights_read + fit.per_sequence_bytes + state_write
    comm = _comm_cost(req, r, pa, b.split_mode, list(fit.devices))
    extra = (comm.low_us, comm.high_us)
    off_gbps = (a.offload_gbps_low, a.offload_gbps_high)
    # The health probe decodes a short answer to a short prompt: its floor is for that context.
    probe_read = weights_read + fit.layout.per_sequence(min(fit.context, HEALTH_PROBE_CONTEXT)) + state_write
    moe_layers = sum(1 for i in range(spec.num_layers) if spec.is_moe_layer(i))
    linear_layers = spec.count(LINEAR)
    floor, _, eighth, floor_why = health_floor(
        engine, gpu, probe_read * b.shards, layer_read, spec.num_layers, off_gbps, gpus=b.shards,
        extra_us=extra, moe_layers=moe_layers, linear_layers=linear_layers)
    graphs = speed_assumptions(engine).cuda_graphs_for(gpu.compute_capability)
    measured = req.measured_efficiency
    resident = decode_speed(engine, gpu.bandwidth_gbps, gpu.memory_type, read_bytes, spec.num_layers,
                            extra_us=extra, moe_layers=moe_layers, cuda_graphs=graphs,
                            compute_capability=gpu.compute_capability,
                            efficiency=(measured[0], measured[0]) if measured else None,
                            linear_layers=linear_layers)
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
        + (f" + {spec.count(LINEAR)} linear-attention layers x {speed.linear_layer_us[0]:.0f}-{speed.linear_layer_us[1]:.0f} us"
           if speed.linear_layer_us[1] else "")
        + (f" + {sp.per_token_us[0] / 1000:.1f}-{sp.per_token_us[1] / 1000:.1f} ms per token" if sp.per_token_us[1] else "")
        + f" ({engine}, memory class {speed.efficiency_class}"
        + (f", {_GRAPHS_TEXT[graphs]}" if sp.graphs_min_cc else "")
        + (", no DP4A on this card" if no_dp4a else "")
        + "): "
        + "; ".join(sp.efficiency_sources.get(speed.efficiency_class, ()) + sp.cost_sources
                    + (sp.no_dp4a_sources if no_dp4a else ())
                    + (sp.linear_sources if speed.linear_layer_us[1] else ()))
        + (f"; split over {b.devices} cards: + {comm.low_us / 1000:.2f}-{comm.high_us / 1000:.2f} ms per token ({comm.text})"
           if comm.text else "")
        + (f"; efficiency {measured[0]:.2f} fitted to this fleet's measurements instead of the catalog's range "
           f"({measured[1]})" if measured else "")
    )
