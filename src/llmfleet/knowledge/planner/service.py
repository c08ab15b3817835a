"""Plan an inventory service on a card: the request a service and its host's facts make."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.knowledge import compat
from llmfleet.knowledge.catalog import Gpu, ModelSpec, find_gpu, load_quants
from llmfleet.knowledge.engines import for_engine
from llmfleet.knowledge.planner.core import plan
from llmfleet.knowledge.planner.request import GB, PlanRequest
from llmfleet.knowledge.planner.resolve import _resolve_model
from llmfleet.knowledge.planner.result import Plan


def plan_for_service(
    service: Any,
    gpu: Gpu | str | None,
    gpu_count: int = 1,
    facts: Any = None,
    model: ModelSpec | None = None,
    *,
    hosts: int = 1,
    network_gbps: float | None = None,
    network_latency_us: float | None = None,
    driver: str | None = None,
    measured_efficiency: tuple[float, str] | None = None,
) -> Plan:
    """Plan an inventory Service (llmfleet.inventory.services.Service) on a card. ``driver``: the
    host's NVIDIA driver (default: the facts'), for the image's driver note.

    ``hosts``: the hosts the service spans (the head and its workers, each with ``gpus`` cards like the
    head); ``network_gbps`` (Gbit/s, the slowest link between them: llmfleet_network_gbps) and
    ``network_latency_us`` price the hops between them (None: planner.yaml's defaults).

    ``gpu`` is the card (catalog entry, id or nvidia-smi name); ``gpu_count`` the host's card count,
    used when the service takes ``gpus: all``. With ``facts`` (llmfleet.host.facts.Facts) the cards the
    service uses are read from the host: their real memory.total replaces the catalog figure, the
    card is taken from them when ``gpu`` is None, and a GGUF file's real size is compared with the
    plan. ``model`` overrides the catalog lookup of ``service.model`` (e.g. a spec read from files).
    """
    card, n, facts_note = _service_cards(service, gpu, gpu_count, facts)
    spec, size = _service_model(service, model, facts)
    image = getattr(service, "image", None)
    image_note = None
    if image and compat.load_engine_catalog().release(str(image)) is None:
        image_note = f"image {image!r} is not in the engine catalog: judged against the catalog's default instead"
        image = None
    req = PlanRequest(
        image=str(image) if image else None,
        model=spec,
        quant=service.quant,
        gpu=card,
        gpus=max(1, n),
        context=service.context,
        concurrency=service.concurrency,
        engine=service.engine,
        kv_dtype=service.kv_dtype,
        gpu_memory_utilization=service.gpu_memory_utilization,
        offload=service.offload,
        extra_args=tuple(str(a) for a in (getattr(service, "engine_args", None) or [])),
        extra_env=tuple(sorted((str(k), str(v)) for k, v in (getattr(service, "env", None) or {}).items())),
        hosts=max(1, int(hosts)),
        network_gbps=network_gbps,
        network_latency_us=network_latency_us,
        gpus_available=(len(facts.gpus) if facts is not None and getattr(facts, "gpus", None) else int(gpu_count))
        if max(len(getattr(facts, "gpus", None) or []), int(gpu_count)) > 1 else None,
        driver=driver or getattr(facts, "driver_version", None) or None,
        measured_efficiency=measured_efficiency,
    )
    result = plan(req)
    if facts_note:
        result.notes.append(facts_note)
    if image_note:
        result.notes.append(image_note)
    if size and result.model_origin == "catalog" and abs(size - result.weights_bytes) > 0.1 * result.weights_bytes:
        result.notes.append(
            f"{service.model_path} on the host holds {size / GB:.1f} GB; the plan assumes {result.weights_bytes / GB:.1f} GB "
            f"of {result.quant} weights: check the quant"
        )
    return result


def _service_cards(service: Any, gpu: Gpu | str | None, gpu_count: int, facts: Any) -> tuple[Gpu, int, str | None]:
    """(the card, how many the service uses, a note when the host's facts change its memory)."""
    chosen = list(getattr(facts, "gpus", None) or []) if facts is not None else []
    if chosen and isinstance(service.gpus, list):
        chosen = [g for g in chosen if g.index in service.gpus]
    if gpu is None:
        if not chosen:
            raise UsageError(f"service {service.name}: no GPU known (set llmfleet_gpu or gather facts)")
        gpu = chosen[0].catalog_id or chosen[0].name
    card = gpu if isinstance(gpu, Gpu) else find_gpu(str(gpu))
    facts_note = None
    mib = [g.memory_total_mib for g in chosen if g.memory_total_mib]
    if mib and min(mib) != card.memory_mib:
        facts_note = f"GPU memory from the host's facts: {min(mib)} MiB (catalog: {card.memory_mib} MiB)"
        card = replace(card, memory_mib=int(min(mib)))
    if isinstance(service.gpus, list):
        n = len(service.gpus)
    elif chosen:
        n = len(chosen)
    else:
        n = int(gpu_count)
    return card, n, facts_note


def _service_model(service: Any, model: ModelSpec | None, facts: Any) -> tuple[str | ModelSpec, int | None]:
    """(the model to plan, the size of its file on the host to compare the plan with). An engine that
    sizes a service without a quant from its file on the host (llama.cpp: a GGUF file is what it is)
    plans that file's real size."""
    mf = facts.model(service.model_path) if facts is not None and hasattr(facts, "model") else None
    size = getattr(mf, "size_bytes", None) if mf is not None and getattr(mf, "kind", "") == "file" else None
    spec: str | ModelSpec = model if model is not None else service.model
    know = for_engine(service.engine)
    from_file = know.sizes_from_host_file
    if from_file and not service.quant and size and getattr(mf, "magic", "GGUF") == "GGUF":
        # No quant named: the GGUF file on the host is what it is; take its real size.
        base = spec if isinstance(spec, ModelSpec) else _resolve_model(spec)
        spec = replace(base, origin="gguf", path=f"{service.model_path} (size from the host's facts)",
                       file_weights_bytes=int(size), file_quant="gguf", file_embed_bytes=None,
                       file_output_bytes=None, file_params=None)
        size = None  # nothing to compare: the plan uses it
    elif (
        from_file
        and not service.quant
        and not (isinstance(spec, ModelSpec) and spec.file_quant)
        and not (isinstance(spec, str) and spec.lower().endswith(".gguf"))
    ):
        fam = know.quant_family
        names = ", ".join(q.name for q in load_quants() if q.family == fam)
        raise UsageError(
            f"service {service.name}: {know.label} with no quant and the {fam.upper()} file's size unknown; set quant "
            f"({names}) on the service, or gather the host's facts (invoke plan --host HOST --gather)"
        )
    return spec, (int(size) if size else None)
