"""The request resolved against the catalogs: the model, card, engine, quant, weights, KV dtype and
the image the plan is judged against, with the notes resolving them leaves."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.knowledge import compat
from llmfleet.knowledge.catalog import (
    Gpu,
    ModelSpec,
    Quant,
    find_gpu,
    find_model,
    find_quant,
    ggml_type_bits,
    kv_dtypes,
    load_quants,
)
from llmfleet.knowledge.engines import EngineKnowledge, for_engine, for_quant_family
from llmfleet.knowledge.engines import names as engine_names
from llmfleet.knowledge.planner.image import _judged_release, _no_image_refusal, _toolkit_refusal
from llmfleet.knowledge.planner.request import PlanRequest, _check_request
from llmfleet.knowledge.planner.weights import Weights, _file_weights, compute_weights


@dataclass(frozen=True)
class _Resolved:
    spec: ModelSpec
    quant: Quant
    gpu: Gpu
    engine: str
    kv_name: str
    kv_bytes: float
    kv_flag: str
    weights: Weights
    notes: tuple[str, ...]
    release: Any = None  # compat.EngineRelease judged against (None: no catalog image runs on the card)
    image_note: str = ""
    image_refusal: str = ""  # no catalog image of the engine runs on the card: what to serve it with instead


def _resolve_model(model: str | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    text = str(model)
    looks_like_path = text.lower().endswith((".gguf", "config.json")) or text.startswith((".", "~", os.sep))
    if looks_like_path or os.path.exists(os.path.expanduser(text)):
        from llmfleet.knowledge import modelinfo  # files are read only when a path is given

        return modelinfo.read_model(text)
    return find_model(text)  # a catalog name, alias or Hugging Face id ("Qwen/Qwen2.5-7B-Instruct")


def _resolve_model_id(model: str | ModelSpec) -> tuple[ModelSpec, Any]:
    """``_resolve_model``, and for a quantized repository id or GGUF file name that is not there
    (``Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4``, ``Qwen2.5-7B-Instruct-Q4_K_M.gguf``) whose base is in the
    catalog: that model, with what was assumed (``model_ids.Assumed``: its quant and a note)."""
    try:
        return _resolve_model(model), None
    except UsageError:
        if not isinstance(model, str) or os.path.exists(os.path.expanduser(model)):
            raise
        from llmfleet.knowledge.model_ids import split_quantized

        assumed = split_quantized(model)
        if assumed is None:
            raise
        return find_model(assumed.model), assumed


def _quant_named(name: str) -> Quant:
    """A catalog quant, or for a GGUF file of a type the catalog lacks, a stand-in named after it."""
    try:
        return find_quant(name)
    except UsageError:
        if not name.startswith("gguf"):
            raise
        bits = ggml_type_bits()
        base = name.removeprefix("gguf-") if name.startswith("gguf-") else "f16"
        base = base if base in bits else "f16"
        return Quant(name=name, family="gguf", bits=bits[base], base=base, sources=("the file's own tensor types",))


def _pick_engine(req: PlanRequest, spec: ModelSpec, quant: Quant | None, release: compat.EngineRelease | None) -> str:
    """--engine, else the image's engine, else the engine that serves the quant's family natively."""
    if req.engine:
        engine = str(req.engine).lower().replace(".", "").replace("-", "").replace("_", "")
        if engine not in engine_names():
            raise UsageError(f"unknown engine {req.engine!r}; known: {', '.join(engine_names())}")
        if release is not None and release.engine != engine:
            raise UsageError(f"image {req.image} is a {release.engine} image, not {engine}; drop --engine or pick "
                             f"a {engine} image")
    elif release is not None:
        engine = release.engine
    else:
        family = quant.family if quant else ("gguf" if spec.origin == "gguf" else "hf")
        engine = for_quant_family(family).name
    know = for_engine(engine)
    if req.split_mode and req.split_mode not in know.split_modes:
        raise UsageError(f"--split-mode is llama.cpp's; {know.label} splits a model by tensor parallel "
                         "(--gpus) and pipeline parallel (--hosts)")
    if req.split_mode == "row" and req.hosts > 1:
        raise UsageError("--split-mode row splits matrices over the CUDA devices of one host; RPC devices take "
                         "whole layers: use --split-mode layer with --hosts")
    return engine


def _pick_quant(req: PlanRequest, spec: ModelSpec, know: EngineKnowledge, quant: Quant | None,
                notes: list[str]) -> Quant:
    """The quant asked (or named by the model id), else the file's, else the engine's default for a plan."""
    if quant is not None:
        pass
    elif spec.file_quant:
        quant = _quant_named(spec.file_quant)
    elif know.plan_default_quant:
        quant = find_quant(know.plan_default_quant)
        notes.append(f"no --quant given: planning the model's 16-bit weights ({quant.name})")
    else:
        fam = know.quant_family
        names = ", ".join(q.name for q in load_quants() if q.family == fam)
        raise UsageError(f"{know.label} serves {fam.upper()} files: give --quant ({names}) or a .{fam} file as --model")
    explicit_group = bool(req.quant and "-g" in str(req.quant).lower().replace("_", "-").split("int")[-1])
    if spec.file_group_size and quant.group_size and quant.name == spec.file_quant and not explicit_group:
        quant = quant.with_group_size(spec.file_group_size)
    if know.serves_only_quant_family and quant.family != know.quant_family:
        names = ", ".join(q.name for q in load_quants() if q.family == know.quant_family)
        raise UsageError(f"{know.label} serves {know.quant_family.upper()} files, not {quant.name}; pick one of: {names}")
    if know.foreign_quant_note and quant.family != know.quant_family:
        notes.append(know.foreign_quant_note)
    return quant


def _pick_weights(req: PlanRequest, spec: ModelSpec, quant: Quant, notes: list[str]) -> Weights:
    """The files' real sizes where they hold the planned quant, else sizes computed from the shapes."""
    computed = compute_weights(spec, quant)
    use_files = spec.file_weights_bytes is not None and (
        not req.quant or not spec.file_quant or _quant_named(spec.file_quant).name == quant.name
    )
    if spec.file_weights_bytes is not None and not use_files:
        notes.append(
            f"the files hold {spec.file_quant}; sizes computed from shapes for {quant.name} instead of read from files"
        )
    return _file_weights(spec, computed) if use_files else computed


def _pick_kv(req: PlanRequest, engine: str, gpu: Gpu, notes: list[str]) -> tuple[str, float, str]:
    """(KV dtype name, bytes per value, the flag value the engine takes for it on this card)."""
    kv_table = kv_dtypes(engine)
    kv_key = str(req.kv_dtype or "auto").lower()
    if kv_key not in kv_table:
        raise UsageError(f"unknown KV cache dtype {req.kv_dtype!r} for {engine}; known: {', '.join(kv_table)}")
    kv = kv_table[kv_key]
    kv_flag = str(kv["flag"])
    if kv_key == "bf16" and not gpu.bf16:
        kv_flag = for_engine(engine).kv_flag_without_bf16
        notes.append(f"{gpu.name} has no bf16 (CC {gpu.compute_capability}): KV cache in fp16 instead")
    return kv_key, float(kv["bytes"]), kv_flag


def _resolve(req: PlanRequest) -> _Resolved:
    _check_request(req)
    gpu = req.gpu if isinstance(req.gpu, Gpu) else find_gpu(str(req.gpu))
    spec, assumed = _resolve_model_id(req.model)
    quant = find_quant(req.quant) if req.quant else (find_quant(assumed.quant) if assumed else None)
    cat = compat.load_engine_catalog()
    release = cat.release(req.image) if req.image else None
    if req.image and release is None:
        raise UsageError(f"unknown image {req.image!r}; known (engines.yaml): {', '.join(cat.images)}")
    engine = _pick_engine(req, spec, quant, release)
    notes: list[str] = [assumed.said] if assumed else []
    quant = _pick_quant(req, spec, for_engine(engine), quant, notes)
    weights = _pick_weights(req, spec, quant, notes)
    release, image_note = _judged_release(req, cat, engine, gpu, release)
    image_refusal = (_no_image_refusal(cat, engine, gpu) if release is None
                     else _toolkit_refusal(req, cat, engine, gpu, release))
    if image_refusal:
        image_note = ""  # the refusal says it
    kv_key, kv_bytes, kv_flag = _pick_kv(req, engine, gpu, notes)
    return _Resolved(spec, quant, gpu, engine, kv_key, kv_bytes, kv_flag, weights, tuple(notes), release, image_note,
                     image_refusal)
