"""Splitting a model over cards and hosts, the way the engines do it (pure arithmetic).

- vLLM tensor parallel (``--tensor-parallel-size N``): every weight matrix is split over the N GPUs of
  a host; attention heads must divide evenly, KV heads divide or are replicated
  (``vllm/config/model.py`` ``ModelConfig.get_num_kv_heads`` and ``verify_with_parallel_config``;
  ``vllm/model_executor/layers/linear.py`` ``QKVParallelLinear``). Two all-reduces per layer.
- vLLM pipeline parallel (``--pipeline-parallel-size M``, over Ray across hosts): whole layers per
  stage by ``vllm/distributed/utils.py`` ``get_pp_indices``; the stages run one after another.
- llama.cpp ``--split-mode layer``: whole layers per device by ``--tensor-split`` shares
  (``src/llama-model.cpp``), RPC devices first in the device list (``src/llama.cpp``);
  ``--split-mode row``: weight matrices split by rows, KV and intermediate results on the main GPU.

The costs per token are priced with ``catalog/planner.yaml`` ``parallel`` (each figure with its
source and confidence).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.knowledge.catalog import ParallelAssumptions

SPLIT_MODES = ("layer", "row")


def tp_problem(heads: int, kv_heads: int, tp: int, mla: bool = False) -> str | None:
    """Why vLLM refuses tensor parallel size ``tp`` for a model, or None.

    ``verify_with_parallel_config``: the attention heads must be divisible by tp. ``QKVParallelLinear``:
    with tp < KV heads the KV heads are divided (``divide`` asserts divisibility), with tp >= KV heads
    each GPU holds one KV head and tp must be a multiple of the KV heads (``divide(tp, kv_heads)``).
    Multi-head latent attention keeps one latent per GPU: only the heads rule applies."""
    if tp <= 1:
        return None
    if heads % tp:
        return (f"vLLM needs the {heads} attention heads to divide by the tensor parallel size {tp} "
                "(vllm/config/model.py verify_with_parallel_config)")
    if not mla and kv_heads and (kv_heads % tp if tp < kv_heads else tp % kv_heads):
        return (f"vLLM needs the {kv_heads} KV heads to divide by the tensor parallel size {tp}, or {tp} to be a "
                "multiple of them (replicated; vllm/model_executor/layers/linear.py QKVParallelLinear)")
    return None


def kv_heads_per_gpu(kv_heads: int, tp: int) -> int:
    """vLLM ``get_num_kv_heads``: max(1, total KV heads // tp) -- replicated when tp > KV heads."""
    return max(1, kv_heads // max(1, tp))


def pp_partition(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, as vLLM's ``get_pp_indices`` splits them without
    VLLM_PP_LAYER_PARTITION: even shares, the remainder one each to the stages before the last
    (the last holds the final norm and the LM head)."""
    if pp < 1:
        raise ValueError("pipeline parallel size must be 1 or more")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def layer_split(num_layers: int, shares: list[float]) -> tuple[list[int], int]:
    """(repeating layers per device, index of the device with the output layer) for llama.cpp's
    ``--split-mode layer`` with every layer offloaded: layer ``il`` (0..n_layer, n_layer being the
    output layer) goes to the first device whose normalised cumulative share is above
    il / (n_layer + 1) (``src/llama-model.cpp``, ``std::upper_bound`` over the split points)."""
    total = float(sum(shares))
    if not shares or total <= 0:
        raise ValueError("tensor split needs positive shares")
    points, acc = [], 0.0
    for s in shares:
        acc += s
        points.append(acc / total)
    counts = [0] * len(shares)

    def device(il: int) -> int:
        x = il / (num_layers + 1)
        for d, p in enumerate(points):
            if p > x:
                return d
        return len(shares) - 1

    for il in range(num_layers):
        counts[device(il)] += 1
    return counts, device(num_layers)


@dataclass(frozen=True)
class Cost:
    """Extra time per decoded token, (low, high) microseconds, and how it was priced."""

    low_us: float
    high_us: float
    text: str

    def __add__(self, other: Cost) -> Cost:
        text = "; ".join(t for t in (self.text, other.text) if t)
        return Cost(self.low_us + other.low_us, self.high_us + other.high_us, text)


NO_COST = Cost(0.0, 0.0, "")


def allreduce_cost(pa: ParallelAssumptions, *, interconnect: str, link_gbps: float, tp: int, layers: int,
                   hidden: int, activation_bytes: int = 2) -> Cost:
    """Tensor parallel all-reduces of one decode step at batch 1: (2 x layers + per-token ones) x
    (latency of the link class + ring bandwidth term 2 (tp-1)/tp x hidden x bytes / link)."""
    if tp <= 1:
        return NO_COST
    cls, (lo, hi) = pa.allreduce_for(interconnect)
    count = pa.allreduces_per_layer * layers + pa.allreduces_per_token
    bw_us = 2 * (tp - 1) / tp * hidden * activation_bytes / (link_gbps * 1e3) if link_gbps else 0.0
    return Cost(count * (lo + bw_us), count * (hi + bw_us),
                f"{count} all-reduces per token ({pa.allreduces_per_layer} per layer x {layers} + "
                f"{pa.allreduces_per_token}) over {cls} at {lo:.0f}-{hi:.0f} us each"
                + (f" + {bw_us:.2f} us of transfer at {link_gbps:g} GB/s" if bw_us else ""))


def message_us(pa: ParallelAssumptions, nbytes: float, network_gbps: float,
               latency_us: tuple[float, float] | None = None) -> tuple[float, float]:
    """One message between hosts: one-way latency + bytes over the line rate x efficiency."""
    lat = latency_us or pa.network_latency_us
    wire = nbytes * 8 / (network_gbps * 1e3 * pa.network_efficiency)  # Gbit/s -> bits per us
    return lat[0] + wire, lat[1] + wire


def pipeline_cost(pa: ParallelAssumptions, *, hosts: int, hidden: int, network_gbps: float,
                  latency_us: tuple[float, float] | None = None, activation_bytes: int = 2) -> Cost:
    """vLLM pipeline parallel over hosts, batch 1: the stages run one after another, so the weights'
    time is that of one host holding them all; on top, each token crosses hosts - 1 stage boundaries
    (hidden_states + residual: 2 x hidden x bytes), the sampled token returns to the driver, and Ray
    dispatches the step."""
    if hosts <= 1:
        return NO_COST
    act = 2 * hidden * activation_bytes
    m_lo, m_hi = message_us(pa, act, network_gbps, latency_us)
    r_lo, r_hi = message_us(pa, 64, network_gbps, latency_us)
    s_lo, s_hi = pa.pp_step_us
    return Cost((hosts - 1) * m_lo + r_lo + s_lo, (hosts - 1) * m_hi + r_hi + s_hi,
                f"{hosts - 1} stage boundary crossing(s) per token of {act:,} bytes at {network_gbps:g} Gbit/s "
                f"({m_lo:.0f}-{m_hi:.0f} us each) + the sampled token back to the head ({r_lo:.0f}-{r_hi:.0f} us) "
                f"+ {s_lo / 1000:.1f}-{s_hi / 1000:.1f} ms Ray step dispatch")


def rpc_cost(pa: ParallelAssumptions, *, rpc_devices: int, layers_per_device: list[int], hidden: int,
             network_gbps: float, latency_us: tuple[float, float] | None = None) -> Cost:
    """llama.cpp RPC, per token and RPC device: ``round_trips_per_device`` blocking round trips
    (input in, graph compute, output back), the activation (hidden x 4 bytes, f32) in and out, and
    the serialized graph on builds without graph reuse."""
    if rpc_devices <= 0:
        return NO_COST
    lat = latency_us or pa.network_latency_us
    g_lo, g_hi = pa.rpc_graph_bytes_per_layer
    lo = hi = 0.0
    for d in range(rpc_devices):
        layers = layers_per_device[d] if d < len(layers_per_device) else 0
        rt = pa.rpc_round_trips_per_device
        b_lo = 2 * hidden * 4 + g_lo * layers
        b_hi = 2 * hidden * 4 + g_hi * layers
        lo += 2 * rt * lat[0] + message_us(pa, b_lo, network_gbps, (0.0, 0.0))[0]
        hi += 2 * rt * lat[1] + message_us(pa, b_hi, network_gbps, (0.0, 0.0))[0]
    return Cost(lo, hi, f"{rpc_devices} RPC device(s) x {pa.rpc_round_trips_per_device} round trips per token "
                        f"at {lat[0]:.0f}-{lat[1]:.0f} us one way, activations {2 * hidden * 4:,} bytes and up to "
                        f"{g_hi:,.0f} bytes of graph per layer at {network_gbps:g} Gbit/s")


def layer_hops_cost(pa: ParallelAssumptions, hops: int) -> Cost:
    if hops <= 0:
        return NO_COST
    lo, hi = pa.layer_split_hop_us
    return Cost(hops * lo, hops * hi, f"{hops} card boundary hop(s) per token at {lo:.0f}-{hi:.0f} us (layer split)")


def row_sync_cost(pa: ParallelAssumptions, matmuls: int) -> Cost:
    if matmuls <= 0:
        return NO_COST
    lo, hi = pa.row_split_sync_us
    return Cost(matmuls * lo, matmuls * hi,
                f"{matmuls} split matmuls per token gathered on the main GPU at {lo:.0f}-{hi:.0f} us (row split)")
