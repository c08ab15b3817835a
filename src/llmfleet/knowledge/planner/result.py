"""The plan: what the planner answers, field by field (``Plan.to_dict`` is what a release's manifest
and ``invoke plan --json`` hold)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Plan:
    model: str
    model_origin: str
    quant: str
    gpu: str
    gpu_name: str
    gpus: int
    engine: str
    context: int
    concurrency: int
    kv_dtype: str
    gpu_memory_utilization: float
    params: int
    weights_bytes: int
    weights_gpu_bytes: int
    weights_source: str
    kv_bytes_per_token: int
    kv_sliding_bytes_per_token: int
    kv_sliding_window: int | None
    kv_state_bytes_per_sequence: int
    kv_bytes_per_sequence: int
    kv_cache_bytes: int
    overhead_bytes: int
    overhead_assumption: str
    memory_bytes: int
    budget_bytes: int
    fits: bool
    resident: bool
    gpu_layers: int
    total_layers: int
    max_context_tokens: int
    max_concurrency: int
    kv_cache_tokens: int | None
    decode_tokps_ceiling: float
    decode_tokps_realistic: tuple[float, float]
    efficiency: tuple[float, float]
    efficiency_assumption: str
    engine_args: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    alternatives: list[dict[str, Any]] = field(default_factory=list)

    offload_assumption: str = ""
    image: str | None = None  # the engine catalog image the flags and KV layout were judged for
    health_floor_tokps: float | None = None  # the decode floor a deploy applies (health.check)
    decode_tokps_offload_eighth: tuple[float, float] | None = None  # 1/8 of the layers off the GPU
    preflight: dict[str, Any] = field(default_factory=dict)  # the preflight's flag verdicts on the card
    engine_env: dict[str, str] = field(default_factory=dict)  # environment the flags need (VLLM_ATTENTION_BACKEND)
    # Split over cards and hosts (``gpus`` is per host). per_gpu: the tightest card's weights, KV at the
    # plan, overhead and budget; tensor_split: llama.cpp's shares in its device order (RPC devices
    # first); comm: what the split adds per token; deploy_adds: what the deploy side must add itself.
    hosts: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    split_mode: str = ""
    per_gpu: dict[str, Any] = field(default_factory=dict)
    layers_per_host: list[int] = field(default_factory=list)
    layers_per_device: list[int] = field(default_factory=list)
    tensor_split: list[int] | None = None
    comm: dict[str, Any] = field(default_factory=dict)
    deploy_adds: list[str] = field(default_factory=list)

    # The names other modules use (llmfleet.knowledge.preflight, llmfleet.release.deploy, llmfleet.health.check).
    @property
    def weight_bytes(self) -> int:
        return self.weights_bytes

    @property
    def max_context_at_concurrency(self) -> int:
        return self.max_context_tokens

    @property
    def max_concurrency_at_context(self) -> int:
        return self.max_concurrency

    @property
    def decode_ceiling_tokps(self) -> float:
        return self.decode_tokps_ceiling

    @property
    def realistic_tokps(self) -> tuple[float, float]:
        return self.decode_tokps_realistic

    @property
    def assumptions(self) -> dict[str, str]:
        """Each assumption the figures rest on, by name, with where it comes from."""
        out = {
            "weights": self.weights_source,
            "overhead": self.overhead_assumption,
            "efficiency": self.efficiency_assumption,
            "kv_cache": (
                "2 (K and V) x attention layers x KV heads x head_dim x "
                f"{self.kv_dtype} bytes per value; sliding-window layers stop at their window only where "
                f"the build ({self.image or 'unknown'}) keeps just the window, linear-attention layers keep a "
                "fixed state"
            ),
        }
        if self.offload_assumption:
            out["offload"] = self.offload_assumption
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["decode_tokps_realistic"] = list(self.decode_tokps_realistic)
        d["efficiency"] = list(self.efficiency)
        if self.decode_tokps_offload_eighth is not None:
            d["decode_tokps_offload_eighth"] = list(self.decode_tokps_offload_eighth)
        d["assumptions"] = self.assumptions
        return d
