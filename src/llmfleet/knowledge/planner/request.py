"""What a plan is asked for: the request, its checks before anything is looked up, and the units
the planner's figures are in."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.errors import UsageError
from llmfleet.knowledge import parallel
from llmfleet.knowledge.catalog import Gpu, ModelSpec

# Tokens in context while the health check measures decode speed (a one-line prompt and a short
# answer, health.check): the floor is computed for this context, not the planned one.
HEALTH_PROBE_CONTEXT = 512
GB = 1e9
GIB = 1024**3


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    model: str | ModelSpec
    quant: str | None = None
    gpu: Gpu | str
    gpus: int = 1
    context: int | None = None
    concurrency: int = 1
    engine: str | None = None  # None: llamacpp for GGUF, vllm otherwise
    kv_dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    offload: bool = False
    image: str | None = None  # engine catalog key of the image that serves (engines.yaml images)
    # The service's own engine_args / env: they come after the planned flags (later flags win), so
    # the flag rules judge the two together, as the preflight does.
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    # Split over hosts: ``gpus`` is then the GPUs of EACH host. vLLM: pipeline parallel over Ray, one
    # stage per host; llama.cpp: the head plus hosts - 1 workers running rpc-server.
    hosts: int = 1
    network_gbps: float | None = None  # Gbit/s between the hosts (llmfleet_network_gbps); None: planner.yaml
    network_latency_us: float | None = None  # one way per message; None: planner.yaml's range
    split_mode: str | None = None  # llama.cpp: layer (default) or row (one host)
    interconnect: str | None = None  # nvlink / pcie between the cards of a host; None: the card's catalog entry
    gpus_available: int | None = None  # cards on the host, for the alternatives (None: try 2, 4, 8)
    # The host's NVIDIA driver (facts, or --driver): the default image is one that runs on it, and an
    # image given is judged against it (a note with what runs instead: compat.driver_alternatives).
    driver: str | None = None
    # The bandwidth efficiency a fleet measured for this card class (``invoke speed --write``: the
    # speed overlay's fitted figure) and where: it replaces the catalog's range in the realistic figure.
    measured_efficiency: tuple[float, str] | None = None


def _check_request(req: PlanRequest) -> None:
    """Usage errors in the request's numbers and choices, before anything is looked up."""
    if req.gpus < 1:
        raise UsageError(f"--gpus must be 1 or more, got {req.gpus}")
    if req.hosts < 1:
        raise UsageError(f"--hosts must be 1 or more, got {req.hosts}")
    if req.network_gbps is not None and not req.network_gbps > 0:
        raise UsageError(f"--network-gbps must be above 0 (Gbit/s between the hosts), got {req.network_gbps}")
    if req.network_latency_us is not None and req.network_latency_us < 0:
        raise UsageError(f"--network-latency-us must be 0 or more, got {req.network_latency_us}")
    if req.interconnect is not None and req.interconnect not in ("nvlink", "pcie"):
        raise UsageError(f"--interconnect must be nvlink or pcie, got {req.interconnect!r}")
    if req.split_mode is not None and req.split_mode not in parallel.SPLIT_MODES:
        raise UsageError(f"--split-mode must be one of {', '.join(parallel.SPLIT_MODES)} (llama.cpp), got {req.split_mode!r}")
    if req.hosts > 1 and req.offload:
        raise UsageError("--offload with --hosts: a model split over hosts is planned resident only; drop one of them")
    if req.concurrency < 1:
        raise UsageError(f"--concurrency must be 1 or more, got {req.concurrency}")
    if req.context is not None and req.context < 1:
        raise UsageError(f"--context must be 1 or more tokens, got {req.context}")
    gmu = req.gpu_memory_utilization
    if gmu is not None and not 0.0 < gmu <= 1.0:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {gmu}")
