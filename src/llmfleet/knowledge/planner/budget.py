"""The budget step: one card's memory and the basis the fit runs on."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.knowledge.catalog import EngineAssumptions, default_memory_reserved_mib
from llmfleet.knowledge.engines import EngineKnowledge
from llmfleet.knowledge.planner.request import PlanRequest
from llmfleet.knowledge.planner.resolve import _Resolved


@dataclass(frozen=True)
class Budget:
    """Memory of a plan: one card's budget, and the basis the fit runs on: per card for a tensor
    parallel split (every layer is sharded over the host's cards), all cards together for a layer or
    row split (the cards' memory adds up)."""

    gpu_memory_utilization: float
    card_bytes: float  # one card: CUDA-visible memory (memory.total less the driver's) x utilization
    devices: int  # cards in all (gpus x hosts)
    shards: int  # cards each layer is sharded over: the host's gpus for tensor parallel, else 1
    split_mode: str  # tensor | layer | row
    basis_bytes: float  # the budget on the basis
    fixed_bytes: float  # the engine's fixed overhead on the basis
    weights_gpu_bytes: int  # weights the engine loads to GPU memory, all cards
    basis_weights_bytes: float  # of them on the basis

    @property
    def tensor(self) -> bool:
        return self.split_mode == "tensor"


def _budget(req: PlanRequest, r: _Resolved, know: EngineKnowledge, a: EngineAssumptions) -> Budget:
    gpu, devices = r.gpu, req.gpus * req.hosts
    split_mode = req.split_mode or know.split_modes[0]
    tensor = split_mode == "tensor"
    gmu = req.gpu_memory_utilization or a.gpu_memory_utilization
    reserved_mib = gpu.memory_reserved_mib if gpu.memory_reserved_mib is not None else default_memory_reserved_mib()
    card = (gpu.memory_bytes - reserved_mib * 2**20) * gmu
    loaded = r.weights.loaded_bytes(r.engine)  # llama.cpp keeps an untied token-embedding table in host memory
    return Budget(
        gpu_memory_utilization=gmu, card_bytes=card, devices=devices, shards=req.gpus if tensor else 1,
        split_mode=split_mode, basis_bytes=card if tensor else card * devices,
        fixed_bytes=a.fixed_overhead_bytes if tensor else a.fixed_overhead_bytes * devices,
        weights_gpu_bytes=loaded, basis_weights_bytes=loaded / devices if tensor else loaded,
    )
