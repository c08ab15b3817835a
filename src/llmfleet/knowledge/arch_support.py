"""Does the image's build know the model's architecture? (pure: catalog in, verdict out)

vLLM looks a checkpoint's config.json ``architectures`` up in its model registry; llama.cpp looks a
GGUF's ``general.architecture`` up in ``LLM_ARCH_NAMES`` (src/llama-arch.cpp). A name the build
lacks is refused when the server loads the model, after the pull and the copy. catalog/architectures.yaml
says, per image, which of the catalog models' names its build's code knows (each read from that code,
with a source); models.yaml says which name each model is loaded by.

PASS: the build knows it. FAIL: it does not; the message names the first build that does and the
first catalog image that knows it. WARN: the image's list is not recorded, or the model's name is not
known to the catalog.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from llmfleet.knowledge.catalog import ModelSpec, _read_yaml
from llmfleet.knowledge.compat import EngineRelease, Verdict


@dataclass(frozen=True)
class BuildArchs:
    image: str
    build: str
    order: int
    known: frozenset[str]
    confidence: str
    source: str
    ggml_types: frozenset[str] | None = None  # llama.cpp: enum ggml_type of the build's ggml.h (None: not read)


@functools.cache
def _catalog() -> tuple[dict[str, BuildArchs], dict[str, dict[str, dict[str, Any]]]]:
    data = _read_yaml("architectures.yaml")
    images = {k: BuildArchs(k, str(e["build"]), int(e["order"]), frozenset(str(a) for a in e.get("known") or ()),
                            str(e.get("confidence", "U")), str(e.get("source", "")),
                            frozenset(str(t) for t in e["ggml_types"]) if e.get("ggml_types") is not None else None)
              for k, e in (data.get("images") or {}).items()}
    return images, dict(data.get("first_known") or {})


def build_archs(image: str) -> BuildArchs | None:
    """What catalog/architectures.yaml records of ``image`` (None: not recorded)."""
    return _catalog()[0].get(image)


def model_arch(engine: str, spec: ModelSpec) -> str:
    """The name ``engine`` loads ``spec`` by ("" when the catalog does not say)."""
    return spec.gguf_architecture if engine == "llamacpp" else spec.hf_architecture


def _first_image(rel: EngineRelease, arch: str, cpu: bool) -> str:
    """The oldest recorded image of the engine (CPU or GPU as ``rel``) whose build knows ``arch``."""
    images = _catalog()[0]
    fits = [b for k, b in images.items() if k.split(":", 1)[0] == rel.engine and arch in b.known
            and (k == rel.key or _is_cpu(k) == cpu)]
    return min(fits, key=lambda b: b.order).image if fits else ""


def _is_cpu(key: str) -> bool:
    from llmfleet.knowledge.compat import load_engine_catalog

    rel = load_engine_catalog().images.get(key)
    return bool(rel is not None and rel.cpu)


def check(rel: EngineRelease, spec: ModelSpec | None) -> Verdict:
    """PASS / FAIL / WARN: does ``rel``'s build know ``spec``'s architecture?"""
    if spec is None:
        return Verdict("warn", "the model is not a catalog model: its architecture is not known here, so "
                       f"whether {rel.key} can load it is not judged", "name a catalog model (--model)")
    arch = model_arch(rel.engine, spec)
    if not arch:
        return Verdict("warn", f"{spec.name}: the catalog does not say which architecture name {rel.engine} loads it by, "
                       f"so whether {rel.key} knows it is not judged",
                       "add architecture: to its entry in catalog/models.yaml")
    rec = build_archs(rel.key)
    if rec is None:
        return Verdict("warn", f"{rel.key}: which architectures its build knows is not recorded, so whether it "
                       f"loads {arch} ({spec.name}) is not judged",
                       "record it in catalog/architectures.yaml (bench/record_vllm_rules.py, bench/record_llamacpp_arch.py)")
    if arch in rec.known:
        return Verdict("pass", f"{rel.key} (build {rec.build}) knows {arch} ({spec.name}) [{rec.confidence}]")
    first = (_catalog()[1].get(rel.engine) or {}).get(arch)
    first_txt = f": first known in {first['build']}" if first else ""
    image = _first_image(rel, arch, rel.cpu)
    fix = f"use {image}" if image else f"no catalog {rel.engine} image knows {arch}: record a newer build"
    return Verdict("fail", f"{rel.key} does not know {arch} ({spec.name}){first_txt}; its build {rec.build} "
                   f"does not name it [{rec.confidence}]", fix)


def refusal(rel: EngineRelease | None, spec: ModelSpec) -> str:
    """The planner's refusal when ``rel``'s build does not know the model ("" otherwise)."""
    if rel is None:
        return ""
    v = check(rel, spec)
    return f"REFUSED: {v.message}; {v.fix}" if v.status == "fail" else ""


@functools.cache
def _type_catalog() -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    data = _read_yaml("architectures.yaml")
    quants = {str(q): [str(t) for t in ts] for q, ts in ((data.get("gguf_quant_types") or {}).get("quants") or {}).items()}
    return quants, dict(data.get("first_ggml_type") or {})


def check_ggml_types(rel: EngineRelease, quant: str | None) -> Verdict | None:
    """FAIL when a GGUF of ``quant`` holds a tensor type ``rel``'s llama.cpp build does not name (its
    ggml.h ``enum ggml_type``): the file does not load. None when the engine is not llama.cpp or the
    quant says nothing about its types; WARN when the build's types are not recorded."""
    if rel.engine != "llamacpp" or not quant:
        return None
    needs = _type_catalog()[0].get(quant.lower())
    if not needs:
        return None
    rec = build_archs(rel.key)
    if rec is None or rec.ggml_types is None:
        return Verdict("warn", f"{rel.key}: which GGUF tensor types its build knows is not recorded, so whether it "
                       f"loads a {quant} GGUF ({', '.join(needs)}) is not judged",
                       "record ggml_types in catalog/architectures.yaml (bench/record_llamacpp_rules.py)")
    missing = [t for t in needs if t not in rec.ggml_types]
    if not missing:
        return Verdict("pass", f"{rel.key} (build {rec.build}) knows the GGUF tensor types of {quant} ({', '.join(needs)})")
    first = (_type_catalog()[1].get(rel.engine) or {}).get(missing[0])
    first_txt = f" (first in {first['build']}: {first['source']})" if first else ""
    images = _catalog()[0]
    fits = [b for k, b in images.items() if k.split(":", 1)[0] == rel.engine and b.ggml_types is not None
            and all(t in b.ggml_types for t in needs) and _is_cpu(k) == rel.cpu]
    fix = f"use {min(fits, key=lambda b: b.order).image}" if fits else f"no catalog {rel.engine} image knows {missing[0]}"
    return Verdict("fail", f"{rel.key} cannot load a {quant} GGUF: its build {rec.build} has no ggml type "
                   f"{missing[0]}{first_txt}", fix + " or another quant")


def type_refusal(rel: EngineRelease | None, quant: str | None) -> str:
    """The planner's refusal when ``rel``'s build cannot load a GGUF of ``quant`` ("" otherwise)."""
    v = check_ggml_types(rel, quant) if rel is not None else None
    return f"REFUSED: {v.message}; {v.fix}" if v is not None and v.status == "fail" else ""
