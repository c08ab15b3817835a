"""Alternatives for a plan that does not fit: the changes (quant, KV dtype, context, sequences, more
GPUs or hosts, offload) that would make it fit, best first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.knowledge.catalog import load_quants, min_context
from llmfleet.knowledge.engines import for_engine
from llmfleet.knowledge.planner.fit import _round_down
from llmfleet.knowledge.planner.request import GB, PlanRequest
from llmfleet.knowledge.planner.resolve import _Resolved
from llmfleet.knowledge.planner.result import Plan


def _add_alternatives(req: PlanRequest, plan: Plan, r: _Resolved, *, has_problems: bool,
                      replan: Callable[[PlanRequest], Plan]) -> None:
    """A plan that does not fit gets the changes that would make it fit, and a note for a split that does.
    ``replan``: the planner without suggestions, for each change tried."""
    plan.alternatives = _suggest(req, plan, r, replan)
    split = [x for x in plan.alternatives if set(x["change"]) <= {"gpus", "hosts"}]
    others = [x for x in plan.alternatives if x not in split and "offload" not in x["change"]]
    if split:
        x = split[0]
        plan.notes.insert(1 if has_problems else 0,
                          f"fits {'only ' if not others else ''}when split: {x['flags']} ({x['why']}): "
                          f"{x['per_gpu_weights_bytes'] / GB:.1f} GB of weights per GPU, layers per host "
                          f"{x['layers_per_host']}, up to {x['max_context_tokens']:,} tokens of context")


def _suggest(req: PlanRequest, plan: Plan, r: _Resolved,
             replan: Callable[[PlanRequest], Plan]) -> list[dict[str, Any]]:
    """Changes that would make the request fit, best first: keep quality and capacity where possible
    (``replan``: the planner without suggestions)."""
    out: list[dict[str, Any]] = []

    def attempt(change: dict[str, Any], why: str, flags: str) -> bool:
        try:
            alt = replan(replace(req, **change))
        except UsageError:
            return False
        if not alt.fits:
            return False
        out.append(
            {
                "rank": len(out) + 1,
                "change": change,
                "flags": flags,
                "why": why,
                "max_context_tokens": alt.max_context_tokens,
                "max_concurrency": alt.max_concurrency,
                "decode_tokps_realistic": list(alt.decode_tokps_realistic),
                "weights_bytes": alt.weights_bytes,
                "engine_args": list(alt.engine_args),
                "engine_env": dict(alt.engine_env),
                "image": alt.image,
                "preflight": {cid: v["status"] for cid, v in alt.preflight.items()},
                "gpus": alt.gpus,
                "hosts": alt.hosts,
                "per_gpu_weights_bytes": alt.per_gpu.get("weights_bytes"),
                "layers_per_host": list(alt.layers_per_host),
            }
        )
        return True

    # 1. A smaller quantization of the same family (catalog models; files are what they are).
    if r.spec.origin == "catalog":
        family = for_engine(r.engine).quant_family
        smaller = sorted(
            (q for q in load_quants() if q.family == family and q.bits < r.quant.bits and r.gpu.cc >= q.min_cc
             and (r.spec.is_moe or not (q.experts_only or q.rule("experts")))),  # expert-only formats: MoE only
            key=lambda q: -q.bits,
        )
        for q in smaller:
            if attempt({"quant": q.name}, f"{q.name} weights fit with the asked context", f"--quant {q.name}"):
                break
    # 2. A smaller KV cache dtype.
    small_kv = for_engine(r.engine).small_kv_dtype
    if r.kv_bytes > 1.5 and plan.resident:
        attempt({"kv_dtype": small_kv}, f"{small_kv} KV cache halves KV memory", f"--kv-dtype {small_kv}")
    # 3. A shorter context, 4. fewer sequences.
    if plan.resident and plan.max_context_tokens >= min_context():
        ctx = _round_down(plan.max_context_tokens, 256)
        attempt({"context": ctx}, f"the most context that fits {plan.concurrency} sequences", f"--context {ctx}")
    if plan.resident and req.concurrency > 1 and plan.max_concurrency >= 1:
        attempt(
            {"concurrency": plan.max_concurrency},
            f"the most sequences that fit at {plan.context} tokens",
            f"--concurrency {plan.max_concurrency}",
        )
    # 5. More GPUs of the host (tensor parallel / layer split), then more hosts (pipeline parallel / RPC).
    know = for_engine(r.engine)
    how = know.split_word
    have = req.gpus_available
    counts = [c for c in range(req.gpus + 1, have + 1)] if have else [c for c in (2, 4, 8) if c > req.gpus]
    split_found = False
    for n in counts:
        # the smallest split that fits and the next one up (more room for context and sequences)
        if attempt({"gpus": n}, f"{how} over {n} x {plan.gpu_name}", f"--gpus {n}"):
            if split_found:
                break
            split_found = True
    if not split_found and not req.offload:
        per_host = max(req.gpus, have or req.gpus)
        cross = know.cross_host_word
        for h in (2, 3, 4):
            if h > req.hosts and attempt({"hosts": h, "gpus": per_host},
                                         f"{cross} over {h} hosts of {per_host} x {plan.gpu_name}",
                                         f"--hosts {h} --gpus {per_host}"):
                break
    # 6. Offload, last: it works but is slow.
    if not plan.resident and not req.offload:
        attempt({"offload": True}, "accept CPU offload (slow, see notes)", "--offload")
    return out
