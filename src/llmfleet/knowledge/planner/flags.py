"""The flags step: the engine flags of a plan and the environment they need, judged by the
preflight's own rules (``compat.flag_checks``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from llmfleet.knowledge import compat
from llmfleet.knowledge.engines import for_engine
from llmfleet.knowledge.engines.base import PlanFlags
from llmfleet.knowledge.planner.budget import Budget
from llmfleet.knowledge.planner.fit import Fit
from llmfleet.knowledge.planner.offload import Offload
from llmfleet.knowledge.planner.request import PlanRequest
from llmfleet.knowledge.planner.resolve import _Resolved


@dataclass(frozen=True)
class Flags:
    """The engine flags of the plan, the environment they need and the preflight's verdicts on them."""

    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    preflight: tuple[tuple[str, compat.Verdict], ...]
    note: str  # the attention backend chosen instead of the default, if any
    refusal: str  # the preflight's FAILs, in one line ("": none)


def _flags(req: PlanRequest, r: _Resolved, b: Budget, fit: Fit, off: Offload) -> Flags:
    args, env, checks, note = _checked_args(req, r, fit.context, req.concurrency, b.gpu_memory_utilization,
                                            off.gpu_layers, fit.resident, off.offload_bytes)
    failed = [f"{cid}: {v.message}" + (f" (fix: {v.fix})" if v.fix else "") for cid, v in checks.items()
              if v.status == "fail"]
    refusal = ""
    if failed and r.release is not None:
        refusal = f"REFUSED by the preflight's rules for {r.release.key} on {r.gpu.name}: " + "; ".join(failed)
    return Flags(tuple(args), tuple(env.items()), tuple(checks.items()), note, refusal)


def _checked_args(
    req: PlanRequest, r: _Resolved, context: int, k: int, gmu: float, gpu_layers: int, resident: bool, offload: float
) -> tuple[list[str], dict[str, str], dict[str, Any], str]:
    """(engine flags, environment they need, the preflight's flag verdicts on the card, a note). The flags come from the
    engine's own knowledge (``llmfleet.knowledge.engines``); they are judged by the same rules the
    preflight applies (``compat.flag_checks``), and where the default attention backend cannot hold
    the KV dtype another backend of the release that can is chosen."""
    know = for_engine(r.engine)
    rel = r.release
    cat = compat.load_engine_catalog()
    rules = cat.engines[r.engine]
    cc = r.gpu.compute_capability
    select = rel.attention.select if rel is not None and rel.attention is not None else "arg"
    # Every engine gets the whole plan and takes the fields it needs.
    base = PlanFlags(
        quantization=know.quantization_flag(rel, rules, r.quant, cc), float16=not r.gpu.bf16 or r.quant.name == "fp16",
        gpu_memory_utilization=gmu, context=context, concurrency=k, kv_flag=r.kv_flag, gpus=req.gpus,
        hosts=req.hosts, split_mode=req.split_mode or know.split_modes[0],
        tensor_split=(1,) * (req.gpus * req.hosts) if req.gpus * req.hosts > 1 else None,
        offload_bytes=offload if (not resident and req.offload) else 0.0, backend_select=select,
        num_layers=r.spec.num_layers, resident=resident, gpu_layers=gpu_layers, release=rel, rules=rules,
    )
    args = know.engine_args(base)
    if rel is None:
        return args, {}, {}, ""

    # A GGUF file of a type the catalog has no name for is still a GGUF file to the engine.
    qname = r.quant.name if (r.quant.name in rules.quant_methods or r.quant.family != "gguf") else "gguf"

    def judge(a: list[str], env: dict[str, str]) -> dict[str, Any]:
        return compat.flag_checks(rel, rules, quant=qname, kv_dtype=r.kv_flag, args=a + list(req.extra_args),
                                  env={**dict(req.extra_env), **env}, cc=cc, bf16_native=r.gpu.bf16,
                                  head_dim=r.spec.head_dim or None)

    checks = judge(args, {})
    var = know.attention_backend_env
    if var and checks["kv-dtype"].status == "fail" and rel.attention is not None:
        for backend in rel.attention.backends:
            env = {var: backend} if select == "env" else {}
            alt_args = know.engine_args(replace(base, attention_backend=backend))
            alt = judge(alt_args, env)
            # a backend no source confirms for this KV dtype on this card is not picked
            if alt["kv-dtype"].status == "pass" and all(v.status != "fail" for v in alt.values()):
                how = f"env {var}={backend}" if select == "env" else f"--attention-backend {backend}"
                return alt_args, env, alt, (f"{r.kv_flag} KV cache: the default attention backend of {rel.key} on compute "
                                       f"capability {cc} cannot hold it; planned with {how}")
    return args, {}, checks, ""
