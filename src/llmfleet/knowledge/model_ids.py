"""Quantized repository ids and GGUF file names read as a catalog model plus a quant.

``Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4``, ``Qwen/Qwen2.5-7B-Instruct-AWQ``, ``...-FP8``, ``...-GGUF`` and a
GGUF file name such as ``Qwen2.5-7B-Instruct-Q4_K_M.gguf`` (or ``qwen2.5-7b-instruct-q4_k_m.gguf``) name a
quantized copy of a catalog model. When the base is in the catalog they resolve to it and to the quant,
and say what was assumed (the repository or file itself is not read). Pure: catalog lookups only.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.errors import UsageError

# Repository-id suffix (lowercase, after the base name and a "-") -> catalog quant. Longest first.
REPO_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("gptq-int4", "gptq-int4"),
    ("gptq-int8", "gptq-int8"),
    ("awq-int4", "awq-int4"),
    ("fp8-dynamic", "fp8"),
    ("w8a8", "int8"),
    ("awq", "awq-int4"),
    ("gptq", "gptq-int4"),
    ("fp8", "fp8"),
    ("int8", "int8"),
    ("gguf", "q4_k_m"),  # a GGUF repository holds several files: Q4_K_M assumed, --quant picks another
)
GGUF_NAMES = {"f16": "f16-gguf", "bf16": "f16-gguf"}  # a GGUF file's 16-bit type -> the catalog's GGUF quant


@dataclass(frozen=True)
class Assumed:
    model: str  # catalog model name
    quant: str  # catalog quant name
    said: str  # what was assumed, for the plan's notes


def _catalog_model(org: str, base: str) -> str | None:
    from llmfleet.knowledge.catalog import find_model

    for name in ([f"{org}/{base}"] if org else []) + [base]:
        try:
            return find_model(name).name
        except UsageError:
            continue
    return None


def _gguf_quant(tail: str) -> str | None:
    from llmfleet.knowledge.catalog import find_quant

    tail = GGUF_NAMES.get(tail.lower(), tail)
    try:
        q = find_quant(tail)
    except UsageError:
        return None
    return q.name if q.family == "gguf" else None


def split_quantized(text: str) -> Assumed | None:
    """The catalog model and quant a quantized repository id or GGUF file name stands for; None when
    ``text`` is not one or its base model is not in the catalog."""
    org, _, base = text.strip().rpartition("/")
    lower = base.lower()
    if lower.endswith(".gguf"):
        stem = base[:-5]
        for sep in ("-", "."):
            head, found, tail = stem.rpartition(sep)
            if not found or not head:
                continue
            quant = _gguf_quant(tail)
            model = _catalog_model(org, head) if quant else None
            if model and quant:
                return Assumed(model, quant, f"{text} read as catalog model {model} with quant {quant} "
                                             "(a GGUF file name; the file was not read)")
        return None
    for suffix, quant in REPO_SUFFIXES:
        if lower.endswith("-" + suffix):
            model = _catalog_model(org, base[: -len(suffix) - 1])
            if not model:
                return None
            extra = ("; a GGUF repository holds several files: give --quant for another" if suffix == "gguf"
                     else "")
            return Assumed(model, quant, f"{text} read as catalog model {model} with quant {quant} "
                                         f"(a quantized copy of it, by its name{extra})")
    return None
