"""Print the table docs/planner.md "The V100 27B field report and public figures" shows: for the V100 27B field report
(a field report, not public) and a handful of public batch-1 figures (catalog/decode_public.yaml), the
measured tok/s beside the planner's point estimate and range for that engine and quant at that context,
and where `invoke plan --compare` ranks it among every engine and quant of the model on that card.

Pure arithmetic from the catalogs (no GPU). Run: python bench/compare_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

# (card, model, engine, quant, context, measured tok/s, what it is): the field report of a Qwen 27B on a
# Tesla V100 32GB at 4096 tokens of context, single stream (not public, so not in decode_public.yaml)
FIELD_REPORT = [
    ("v100-sxm2-32gb", "qwen3.5-27b", "llamacpp", "q4_k_m", 4096, 24.0, "field report (not public)"),
    ("v100-sxm2-32gb", "qwen3.5-27b", "vllm", "gptq-int4", 4096, 42.0, "field report (not public)"),
]
PUBLIC_ROWS = 8  # the first figures of the public record on distinct (card, engine) pairs of catalog models


def _public() -> list[tuple[str, str, str, str, int, float, str]]:
    from llmfleet.errors import UsageError
    from llmfleet.knowledge.catalog import find_model, load_public_decode

    out, seen = [], set()
    for f in load_public_decode():
        if f.offloaded or (f.card.id, f.engine) in seen:
            continue
        try:
            find_model(f.model.name)
        except UsageError:  # a shape the catalog does not carry
            continue
        seen.add((f.card.id, f.engine))
        out.append((f.card.id, f.model.name, f.engine, f.quant.name, f.context, f.tokps, f"public: {f.id}"))
        if len(out) == PUBLIC_ROWS:
            break
    return out


def table() -> str:
    from llmfleet.knowledge.catalog import find_gpu, find_model
    from llmfleet.knowledge.plan_compare import compare
    from llmfleet.knowledge.planner import PlanRequest

    lines = ["| card | model | engine quant | context | measured | planner (range) | measured in range | "
             "--compare rank (of fitting) | --compare first | source |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for card, model, engine, quant, context, tokps, source in FIELD_REPORT + _public():
        spec, gpu = find_model(model), find_gpu(card)
        c = compare(PlanRequest(model=spec.name, gpu=gpu, context=context), spec)
        mine = compare(PlanRequest(model=spec.name, gpu=gpu, context=context), spec, engine=engine, quant=quant)
        row = mine.ranked[0] if mine.ranked else None
        names = [r.name for r in c.ranked]
        at = f"{names.index(row.name) + 1} of {len(names)}" if row is not None and row.name in names else "not ranked"
        pred = f"{row.point:.1f} ({row.low:.1f}-{row.high:.1f})" if row else "does not fit"
        inside = "yes" if row and row.low <= tokps <= row.high else "no"
        first = f"{c.ranked[0].name} {c.ranked[0].point:.1f}" if c.ranked else "none"
        lines.append(f"| {card} | {model} | {engine} {quant} | {context:,} | {tokps:g} | {pred} | {inside} | {at} | "
                     f"{first} | {source} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
