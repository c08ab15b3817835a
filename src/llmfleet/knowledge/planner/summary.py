"""What a deploy, its health check and status keep of a plan (``PlanSummary``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmfleet.knowledge.planner.result import Plan


@dataclass(frozen=True)
class PlanSummary:
    """What a deploy, its health check and status need from a plan: the engine flags, the shape of
    the deployment and the decode figures the health check's floor is measured against.

    Built from a ``Plan`` (``summarize``) or read back from a release's manifest (``from_dict``,
    which holds the whole plan as ``Plan.to_dict`` wrote it; unknown or mistyped keys are left empty).
    """

    engine: str = ""
    model: str = ""
    quant: str = ""
    gpu: str = ""
    gpus: int = 1
    hosts: int = 1
    context: int | None = None
    concurrency: int | None = None
    fits: bool | None = None
    resident: bool | None = None
    engine_args: tuple[str, ...] = ()
    decode_tokps_ceiling: float | None = None
    decode_tokps_realistic: tuple[float, float] | None = None  # (low, high), batch 1
    health_floor_tokps: float | None = None  # the planner's own decode floor (health.check)
    image: str = ""  # the engine catalog image the plan was judged for
    # What the engine's load report is compared with (health.residency)
    gpu_layers: int | None = None  # repeating layers on the GPU
    total_layers: int | None = None  # repeating layers of the model
    weights_bytes: int | None = None  # all weights
    weights_gpu_bytes: int | None = None  # weights in GPU memory, all cards together
    weights_per_gpu_bytes: int | None = None  # the tightest card's share (split plans)
    kv_cache_tokens: int | None = None  # tokens the KV cache holds at the plan (None: not computed)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    @property
    def realistic_low(self) -> float | None:
        """The low end of the realistic batch-1 decode range, when positive."""
        r = self.decode_tokps_realistic
        return r[0] if r is not None and r[0] > 0 else None

    @classmethod
    def from_dict(cls, data: Any) -> PlanSummary | None:
        if not isinstance(data, dict):
            return None

        def num(key: str) -> float | None:
            v = data.get(key)
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        def whole(key: str) -> int | None:
            v = data.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        def text(key: str) -> str:
            v = data.get(key)
            return v if isinstance(v, str) else ""

        def flag(key: str) -> bool | None:
            v = data.get(key)
            return v if isinstance(v, bool) else None

        rng = data.get("decode_tokps_realistic")
        realistic = None
        if isinstance(rng, list | tuple) and len(rng) == 2 and all(isinstance(x, int | float) for x in rng):
            realistic = (float(rng[0]), float(rng[1]))
        args = data.get("engine_args")
        per_gpu = data.get("per_gpu")
        per_gpu_w = per_gpu.get("weights_bytes") if isinstance(per_gpu, dict) else None
        floor = num("health_floor_tokps")
        return cls(
            engine=text("engine"), model=text("model"), quant=text("quant"), gpu=text("gpu"),
            gpus=whole("gpus") or 1, hosts=whole("hosts") or 1, context=whole("context"), concurrency=whole("concurrency"),
            fits=flag("fits"), resident=flag("resident"),
            engine_args=tuple(str(a) for a in args) if isinstance(args, list | tuple) else (),
            decode_tokps_ceiling=num("decode_tokps_ceiling"), decode_tokps_realistic=realistic,
            health_floor_tokps=floor if floor is not None and floor > 0 else None, image=text("image"),
            gpu_layers=whole("gpu_layers"), total_layers=whole("total_layers"), weights_bytes=whole("weights_bytes"),
            weights_gpu_bytes=whole("weights_gpu_bytes"),
            weights_per_gpu_bytes=per_gpu_w if isinstance(per_gpu_w, int) and not isinstance(per_gpu_w, bool) else None,
            kv_cache_tokens=whole("kv_cache_tokens"),
            tensor_parallel_size=whole("tensor_parallel_size") or 1,
            pipeline_parallel_size=whole("pipeline_parallel_size") or 1,
        )


def summarize(plan: Plan | PlanSummary | None) -> PlanSummary | None:
    """The summary of a plan (a summary is returned as it is; no plan, no summary)."""
    if plan is None or isinstance(plan, PlanSummary):
        return plan
    return PlanSummary(
        engine=plan.engine, model=plan.model, quant=plan.quant, gpu=plan.gpu, gpus=plan.gpus, hosts=plan.hosts,
        context=plan.context, concurrency=plan.concurrency, fits=plan.fits, resident=plan.resident,
        engine_args=tuple(plan.engine_args), decode_tokps_ceiling=plan.decode_tokps_ceiling,
        decode_tokps_realistic=(float(plan.decode_tokps_realistic[0]), float(plan.decode_tokps_realistic[1])),
        health_floor_tokps=plan.health_floor_tokps, image=plan.image or "",
        gpu_layers=plan.gpu_layers, total_layers=plan.total_layers, weights_bytes=plan.weights_bytes,
        weights_gpu_bytes=plan.weights_gpu_bytes,
        weights_per_gpu_bytes=int(plan.per_gpu["weights_bytes"]) if "weights_bytes" in plan.per_gpu else None,
        kv_cache_tokens=plan.kv_cache_tokens, tensor_parallel_size=plan.tensor_parallel_size,
        pipeline_parallel_size=plan.pipeline_parallel_size,
    )
