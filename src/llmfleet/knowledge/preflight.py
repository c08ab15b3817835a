"""Preflight: can this service run on this host? Named checks, each PASS, WARN or FAIL with a fix.

Pure core: ``run_checks`` takes the host's settings, the service (``llmfleet.inventory.services``), the host's
facts (``llmfleet.host.facts``), the capacity plan (``llmfleet.knowledge.planner``) and the resolved image
(``llmfleet.images.lock``, judged through ``catalog/engines.yaml``) and returns checks. ``invoke preflight``
prints them; deploy runs the same checks and stops before any change when one fails. A check never
raises on odd facts: it says what it saw.

The shell is ``llmfleet.release.preflight``: it resolves each service's image, connects, gathers the
facts in one round trip and runs the checks for each service of the host.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from llmfleet.errors import LlmfleetError, UsageError
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.knowledge import arch_support, compat, engines, gpu_health
from llmfleet.knowledge.catalog import ModelSpec
from llmfleet.knowledge.compat import EngineCatalog, EngineRelease, Kernels, Verdict
from llmfleet.knowledge.facts import Facts, GpuFact, ModelFile

Status = Literal["pass", "warn", "fail"]

# A container is this service's own when it carries the label deploy writes, or has its name.
SERVICE_LABEL = "io.llmfleet.service"
# Room to unpack an image beyond its size (layers are stored compressed and extracted).
IMAGE_DISK_FACTOR = 1.5
# A GPU with more than this share of its memory in use by something else gets a warning.
GPU_BUSY_FRACTION = 0.05
# Every check id, in the order run_checks emits them (docs/preflight.md describes each).
CHECK_IDS = (
    "image", "exporter", "gpu", "gpu-health", "cuda-driver", "arch", "quant", "dtype", "attention", "kv-dtype", "known-issue", "model-arch",
    "model-types",
    "plan",
    "docker", "gpu-runtime", "compose", "disk-image", "model-files", "model-verified", "disk-model", "port", "bind",
    "facts",
)


@dataclass(frozen=True)
class Check:
    id: str
    status: Status
    message: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Report:
    """The checks of one service on one host (``checks`` empty only when the host was not reached)."""

    host: str
    service: str | None
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return ok(self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "service": self.service, "ok": self.ok,
                "checks": [c.to_dict() for c in self.checks]}


def ok(checks: list[Check]) -> bool:
    return not any(c.status == "fail" for c in checks)


def _c(check_id: str, v: Verdict) -> Check:
    return Check(check_id, v.status, v.message, v.fix)


def _gib(mib: int | float) -> str:
    return f"{mib / 1024:.1f} GiB"


def container_name(service: Service) -> str:
    return f"llmfleet-{service.name}"


def owned_by(container: Any, service: Service) -> bool:
    labels = getattr(container, "labels", {}) or {}
    if labels.get(SERVICE_LABEL) == service.name:
        return True
    if labels.get("com.docker.compose.project") == container_name(service):
        return True
    names = {n.strip().lstrip("/") for n in str(getattr(container, "name", "")).split(",")}
    return container_name(service) in names


def selected_gpus(service: Service, facts: Facts) -> tuple[list[GpuFact], list[int]]:
    """(GPUs the service asks for that exist, indexes it asks for that do not)."""
    if service.gpus == "all":
        return list(facts.gpus), []
    by_index = {g.index: g for g in facts.gpus}
    found = [by_index[i] for i in service.gpus if i in by_index]
    missing = [i for i in service.gpus if i not in by_index]
    return found, missing


def _lowest_cc(gpus: list[GpuFact]) -> GpuFact | None:
    known = [g for g in gpus if compat.cc_tuple(g.compute_capability)]
    if not known:
        return gpus[0] if gpus else None
    return min(known, key=lambda g: compat.cc_tuple(g.compute_capability))  # type: ignore[arg-type,return-value]


def _canonical_quant(quant: str | None) -> str | None:
    if not quant:
        return None
    try:
        from llmfleet.knowledge.catalog import find_quant

        return find_quant(quant).name
    except Exception:  # unknown names are judged (and reported) by the quantization rule
        return quant.lower()


def _bf16(gpu: GpuFact | None) -> bool | None:
    if gpu is None or not gpu.name:
        return None
    try:
        from llmfleet.knowledge.catalog import find_gpu

        return bool(find_gpu(gpu.catalog_id or gpu.name).bf16)
    except Exception:
        return None


def effective_args(service: Service, plan: Any) -> list[str]:
    """The flags the engine will get: the plan's recommendations, then the operator's overrides
    (later flags win, as in the engines' argument parsers and in render.merge_engine_args)."""
    planned = [str(a) for a in (getattr(plan, "engine_args", None) or [])] if plan is not None else []
    return planned + [str(a) for a in service.engine_args]


# ------------------------------------------------------------------------------------------------
# The image: images.lock (what is pinned) + catalog/engines.yaml (what it can run)


def parse_archs(archs: list[str] | tuple[str, ...]) -> Kernels | None:
    """Lock ``archs`` -> kernels (``compat.parse_archs``: ``"7.0"`` SASS, ``"8.9+PTX"`` both,
    ``"5.0-virtual"``/``"compute_90"`` PTX, ``"12.0a"`` that exact CC); None if one does not parse."""
    return compat.parse_archs(archs)


def release_for(image_ref: Any, catalog: EngineCatalog) -> tuple[EngineRelease | None, list[str]]:
    """The catalog release an image is judged by, with the lock's facts applied on top.

    ``image_ref`` is an ``images.ImageRef`` (or a plain key). Found by key, else by upstream
    repository and tag. The lock's CUDA, kernel archs and torch build replace the catalog's; facts
    the lock records as ``archs_source: inspected`` (read from the image by ``images.inspect``) are
    preferred and named. Returns (release, notes about lock/catalog disagreements).
    """
    key = image_ref if isinstance(image_ref, str) else getattr(image_ref, "key", "")
    rel = catalog.release(key)
    if rel is None and not isinstance(image_ref, str):
        repo = str(getattr(image_ref, "upstream_repository", "") or "").removeprefix("docker.io/")
        tag = getattr(image_ref, "tag", None)
        rel = next((r for r in catalog.images.values()
                    if r.repository.removeprefix("docker.io/") == repo and (tag is None or r.tag == tag)), None)
    if rel is None or isinstance(image_ref, str):
        return rel, []
    notes: list[str] = []
    update: dict[str, Any] = {}
    archs_source = getattr(image_ref, "archs_source", None)
    inspected = archs_source == "inspected"
    source = "inspected" if inspected else ("catalog" if archs_source == "catalog" else "lock")
    lock_cuda = getattr(image_ref, "cuda", None)
    if lock_cuda and not rel.cpu and lock_cuda != rel.cuda:
        if compat.cuda_major_minor(lock_cuda) is None:
            notes.append(f"images.lock CUDA {lock_cuda!r} does not parse; judged by the catalog's {rel.cuda}")
        else:
            notes.append(f"images.lock says CUDA {lock_cuda}, the catalog {rel.cuda}; judged by the lock")
            update["cuda"] = lock_cuda
    lock_archs = tuple(getattr(image_ref, "archs", ()) or ())
    if lock_archs and not rel.cpu:
        kernels = parse_archs(lock_archs)
        if kernels is None:
            notes.append(f"images.lock archs {list(lock_archs)} do not parse; judged by the catalog's kernels")
        else:
            if sorted(kernels.sass) != sorted(rel.kernels.sass) or sorted(kernels.ptx) != sorted(rel.kernels.ptx):
                notes.append(f"images.lock archs {list(lock_archs)} ({'inspected from the image' if inspected else 'recorded'})"
                             " differ from the catalog's kernels; judged by the lock")
            update["kernels"] = kernels
            update["facts_source"] = source
    torch_archs = tuple(getattr(image_ref, "torch_archs", ()) or ())
    if torch_archs and not rel.cpu:
        tk = parse_archs(torch_archs)
        if tk is None:
            notes.append(f"images.lock torch_archs {list(torch_archs)} do not parse; judged by the catalog's")
        else:
            old = rel.torch
            if old is None or sorted(old.archs) != sorted(torch_archs):
                notes.append(f"images.lock torch archs {list(torch_archs)} differ from the catalog's; judged by the lock")
            update["torch"] = compat.TorchBuild(
                version=str(getattr(image_ref, "torch", None) or (old.version if old else "?")),
                cuda=getattr(image_ref, "torch_cuda", None) or (old.cuda if old else None),
                archs=list(torch_archs),
                confidence="H" if inspected else (old.confidence if old else "M"),
                sources=["read from the image by `invoke images.inspect` (images.lock)" if inspected
                         else "images.lock"],
            )
            update["facts_source"] = source
    require = getattr(image_ref, "require_cuda", None)
    if require and not rel.cpu:  # read from the image: wins over the catalog's base string
        update.update(require_cuda=str(require), require_cuda_source="inspected" if inspected else "lock",
                      require_cuda_confidence="H")
    return (rel.model_copy(update=update) if update else rel), notes


# ------------------------------------------------------------------------------------------------
# The plan (the planner is pure; an unknown model or card is a warning, not a crash)


def plan_for(service: Service, facts: Facts, settings: HostSettings | None = None,
             hosts: int | None = None) -> tuple[Any, str | None]:
    """(plan, error) for a service on the host's cards: the card the service gets with the least
    memory, its memory as the host reports it, the host's card count. ``hosts``: the hosts the service
    spans (its head and workers, groups expanded); None: 1 + the names in its ``workers``, if any."""
    if not service.is_engine:  # no model: nothing to plan
        return None, None
    from llmfleet.knowledge import planner
    from llmfleet.knowledge.catalog import find_gpu

    gpus, _ = selected_gpus(service, facts)
    card: Any = None
    if gpus:
        g = min(gpus, key=lambda x: x.memory_total_mib or 1 << 40)
        try:
            card = find_gpu(g.catalog_id or g.name)
        except UsageError:
            return None, f"card {g.name!r} is not in catalog/gpus.yaml"
    elif settings is not None and settings.gpu:
        card = settings.gpu
    else:
        return None, "no GPU seen on the host and no llmfleet_gpu in the inventory"
    try:
        # The planner takes the host's real memory.total for the cards the service uses.
        n_hosts = hosts if hosts is not None else 1 + len(getattr(service, "workers", None) or [])
        return planner.plan_for_service(service, card, max(1, len(facts.gpus)), facts=facts if gpus else None,
                                        hosts=n_hosts, network_gbps=getattr(settings, "network_gbps", None)), None
    except LlmfleetError as exc:
        return None, str(exc)
    except Exception as exc:  # the planner must not take the preflight down with it
        return None, f"planner error: {type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------------------------


def run_checks(
    host_settings: HostSettings | str | None,
    service: Service,
    facts: Facts,
    plan: Any,
    image_ref: Any = None,
    *,
    release: EngineRelease | None = None,
    catalog: EngineCatalog | None = None,
    plan_error: str | None = None,
    image_error: str | None = None,
    today: str | None = None,
    settings: HostSettings | None = None,
) -> list[Check]:
    """Every preflight check for one service on one host, in a stable order (``CHECK_IDS``).

    ``image_ref`` is what ``images.resolve`` gave for ``service.image`` (None: judge the catalog entry
    of the key itself); ``image_error`` is why it could not be resolved. ``release`` overrides the
    catalog lookup. ``plan_error`` is why there is no plan. ``today`` (``YYYY-MM-DD``) dates the
    driver branches' end of life; None: today's date.
    """
    if today is None:
        import datetime as _dt

        today = _dt.date.today().isoformat()
    host_name = host_settings if isinstance(host_settings, str) else (facts.host or "the host")
    cat = catalog or compat.load_engine_catalog()
    checks: list[Check] = []
    notes: list[str] = []
    rel = release
    if rel is None:
        rel, notes = release_for(image_ref if image_ref is not None else service.image, cat)

    image_check, rel = _image_check(service, image_ref, image_error, rel, notes, cat)
    checks.append(image_check)

    if service.is_exporter:
        return checks + _exporter_checks(host_name, service, facts, rel, image_ref, settings)
    if not service.is_engine:  # the gateway
        return checks + _gateway_checks(host_name, service, facts, rel, image_ref, settings)

    gpus, missing = selected_gpus(service, facts)
    gpu = _lowest_cc(gpus)
    checks.append(_gpu_check(service, facts, rel, gpus, missing))
    # the cards' hardware: Xid events, ECC, pending retirements and remaps, PCIe link, missing cards
    # (only when the probe read it: saved facts of an older probe have none)
    health = gpu_health.judge(facts.gpu_health, None if service.gpus == "all" else list(service.gpus), service.name)
    if health is not None:
        checks.append(_c("gpu-health", health))
    if rel is not None:
        checks += _release_checks(rel, cat, service, facts, gpu, effective_args(service, plan), dict(service.env),
                                  today)

    if rel is not None and service.model:
        checks.append(_c("model-arch", arch_support.check(rel, _catalog_model(service.model))))
        types = arch_support.check_ggml_types(rel, _canonical_quant(service.quant))
        if types is not None:
            checks.append(_c("model-types", types))
    checks.append(_plan_check(service, plan, plan_error))
    checks.append(_docker_check(facts))
    checks.append(_gpu_runtime_check(facts, rel))
    checks.append(_compose_check(facts))
    checks.append(_disk_image_check(facts, rel, image_ref))
    model = facts.model(service.model_path or "")
    checks.append(_model_files_check(host_name, service, model))
    if model is not None and model.manifest_read and model.kind in ("file", "dir"):
        checks.append(model_verified_check(host_name, service, model))
    checks.append(_disk_model_check(service, facts, model, plan))
    checks.append(_port_check(service, facts))
    checks.append(bind_check(service, settings))
    if facts.errors:
        shown = "; ".join(facts.errors[:6]) + (f"; and {len(facts.errors) - 6} more" if len(facts.errors) > 6 else "")
        checks.append(Check("facts", "warn", f"the probe reported: {shown}",
                            "see `invoke facts --host " + host_name + "` for everything it found"))
    return checks


def _image_check(service: Service, image_ref: Any, image_error: str | None, rel: EngineRelease | None,
                 notes: list[str], cat: EngineCatalog) -> tuple[Check, EngineRelease | None]:
    """The image check of an engine service, and the release the other checks judge (None where the
    image is unknown or of another engine)."""
    pinned = ""
    if image_ref is not None:
        pinned = f"; pull {getattr(image_ref, 'pull_ref', '?')}" + ("" if getattr(image_ref, "pinned", True)
                                                                     else " (UNPINNED tag)")
    if image_error:
        check = Check("image", "fail", f"image {service.image!r} of service {service.name}: {image_error}",
                      "pin it with `invoke images.pin` (images.lock), or fix llmfleet_services[].image")
        return check, (None if rel is not None and rel.engine != service.engine else rel)
    if rel is None:
        return Check("image", "fail",
                     f"image {service.image!r} of service {service.name} is not in the engine catalog, so "
                     "its CUDA version and kernels are unknown",
                     f"use one of: {', '.join(cat.images)}, or add it to catalog/engines.yaml"), None
    if rel.engine != service.engine:
        return Check("image", "fail",
                     f"image {rel.key} is a {rel.engine} image but service {service.name} says engine {service.engine}",
                     "make engine and image agree in the inventory"), None
    if image_ref is not None and not getattr(image_ref, "pinned", True):
        return Check("image", "warn", f"{rel.key}: {_image_desc(rel)}{pinned}: a floating tag can change "
                     "under a running fleet", "pin it with `invoke images.pin`"), rel
    status: Status = "warn" if notes else "pass"
    return Check("image", status, f"{rel.key}: {_image_desc(rel)}{pinned}"
                 + (f"; {'; '.join(notes)}" if notes else ""),
                 "make images.lock and catalog/engines.yaml agree" if notes else ""), rel


def _release_checks(rel: EngineRelease, cat: EngineCatalog, service: Service, facts: Facts, gpu: GpuFact | None,
                    args: list[str], env: dict[str, str], today: str) -> list[Check]:
    """The checks of the engine release against the card and host: driver, architecture, quant, dtype,
    attention backend, KV dtype, known issues (warnings where there is no GPU to judge against)."""
    checks: list[Check] = []
    cc = gpu.compute_capability if gpu else None
    name = gpu.name if gpu else None
    rules = cat.engines.get(rel.engine)
    if not rel.cpu and gpu is None:
        why = _gpu_errors(facts) or "no GPU listed"
        for cid in ("cuda-driver", "arch", "quant", "dtype", "attention", "kv-dtype"):
            checks.append(Check(cid, "warn", f"not judged: no GPU to judge {rel.key} against ({why})",
                                "fix the gpu check first, then run preflight again"))
        return checks
    host = compat.DriverHost(
        driver=facts.driver_version, cuda_driver=facts.cuda_driver_version, gpu_name=name, cc=cc,
        data_center=gpu.data_center if gpu else None,
        toolkit_version=facts.toolkit.version or facts.toolkit.cli_version, runtimes=facts.docker.runtimes,
        env=env, default_runtime=facts.docker.default_runtime, today=today,
        kernel_modules=facts.driver_kernel_modules)
    driver_verdict = compat.check_cuda_driver(rel, cat, **host)
    if driver_verdict.status == "fail" and facts.driver_version:
        # The honest answer for an old driver: what runs today, and what an upgrade unlocks.
        alternatives = compat.driver_alternatives(rel, cat, **host)
        if alternatives:
            driver_verdict = replace(driver_verdict, fix="; ".join([driver_verdict.fix, *alternatives]))
    checks.append(_c("cuda-driver", driver_verdict))
    checks.append(_c("arch", compat.check_architecture(rel, name, cc)))
    if rules is None:
        checks.append(Check("quant", "fail", f"engine {rel.engine} has no rules in the catalog",
                            "add it under engines: in catalog/engines.yaml"))
    else:
        quant = _canonical_quant(service.quant)
        checks.append(_c("quant", compat.check_quantization(rel, rules, quant, args, cc)))
        checks.append(_c("dtype", compat.check_dtype(rel, rules, quant, args, cc, _bf16(gpu))))
        checks.append(_c("attention", compat.check_attention(rel, args, env, cc)))
        spec = _catalog_model(service.model) if service.model else None
        checks.append(_c("kv-dtype", compat.check_kv_dtype(rel, rules, service.kv_dtype, args, env, cc,
                                                           spec.head_dim if spec is not None else None)))
    issue = compat.check_known_issues(rel, cc, _is_multimodal(service))
    if issue is not None:
        checks.append(_c("known-issue", issue))
    return checks


def _exporter_checks(host_name: str, service: Service, facts: Facts, rel: EngineRelease | None, image_ref: Any,
                     settings: HostSettings | None) -> list[Check]:
    """An exporter's checks after its image: whether it works on the host's cards and driver
    (``knowledge.exporters``), the cards' hardware for the DCGM exporter, the container engine, its
    port and where it listens. No plan, no model."""
    from llmfleet.knowledge import exporters

    gpus, missing = selected_gpus(service, facts)
    needs_gpu = exporters.for_kind(service.engine).gpus
    checks = [_c("exporter", exporters.support(service.engine, gpus, facts.driver_version))]
    if needs_gpu:
        if missing:
            checks.append(Check("gpu", "fail", f"service {service.name} asks for GPU {missing[0]}, which the host "
                                "does not report", "fix llmfleet_services[].gpus"))
        health = gpu_health.judge(facts.gpu_health, None if service.gpus == "all" else list(service.gpus), service.name)
        if health is not None:
            checks.append(_c("gpu-health", health))
    checks.append(_docker_check(facts))
    if needs_gpu:
        checks.append(_gpu_runtime_check(facts, rel))
    checks.append(_compose_check(facts))
    checks.append(_disk_image_check(facts, rel, image_ref))
    checks.append(_port_check(service, facts))
    checks.append(exporter_bind_check(service, settings))
    if facts.errors:
        shown = "; ".join(facts.errors[:6]) + (f"; and {len(facts.errors) - 6} more" if len(facts.errors) > 6 else "")
        checks.append(Check("facts", "warn", f"the probe reported: {shown}",
                            "see `invoke facts --host " + host_name + "` for everything it found"))
    return checks


def _gateway_checks(host_name: str, service: Service, facts: Facts, rel: EngineRelease | None, image_ref: Any,
                    settings: HostSettings | None) -> list[Check]:
    """The gateway's checks after its image: the container engine, its port and who may use it. Its
    replicas are resolved from the inventory before any host is contacted (release/gateway_plan.py)."""
    checks = [_docker_check(facts), _compose_check(facts), _disk_image_check(facts, rel, image_ref),
              _port_check(service, facts), gateway_bind_check(service, settings)]
    if service.gateway is not None:  # its runtime API and its metrics, on 127.0.0.1 (docs/gateway.md)
        admin = service.gateway.admin_port
        checks += [_port_check(service, facts, admin, "port-admin", "another gateway.admin_port"),
                   _port_check(service, facts, admin + 1, "port-metrics", "another gateway.admin_port (metrics use the next port)")]
    if facts.errors:
        shown = "; ".join(facts.errors[:6]) + (f"; and {len(facts.errors) - 6} more" if len(facts.errors) > 6 else "")
        checks.append(Check("facts", "warn", f"the probe reported: {shown}",
                            "see `invoke facts --host " + host_name + "` for everything it found"))
    return checks


def gateway_bind_check(service: Service, settings: HostSettings | None) -> Check:
    """Beyond loopback the gateway needs client keys (or ``allow_unauthenticated: true``), and keys in
    clear over the network WARN without TLS."""
    import ipaddress

    hs = settings or HostSettings()
    addr = hs.bind_address_for(service)
    gw = service.gateway
    keys = len(gw.api_keys) if gw else 0
    tls = gw is not None and gw.tls is not None
    where = f"gateway {service.name} listens on {addr}:{service.port} ({'TLS' if tls else 'plain HTTP'})"
    if ipaddress.ip_address(addr).is_loopback:
        return Check("bind", "pass", f"{where} (loopback: reachable from the host only)")
    if keys == 0:
        if hs.allow_unauthenticated_for(service):
            return Check("bind", "warn", f"{where} without client keys (allow_unauthenticated: true): anyone who "
                         "reaches the address can use every model behind it",
                         "add gateway.api_keys: [{name: NAME, key: {from_env: VAR}}]")
        return Check("bind", "fail", f"{where} without client keys: anyone who reaches the address could use "
                     "every model behind it", "add gateway.api_keys: [{name: NAME, key: {from_env: VAR}}], or "
                     "bind_address: 127.0.0.1, or allow_unauthenticated: true to accept it")
    if not tls:
        return Check("bind", "warn", f"{where} with {keys} client key{'s' if keys != 1 else ''}: keys and prompts "
                     "cross the network in clear", "add gateway.tls: {cert: {from_file: PEM}, key: {from_file: PEM}}")
    return Check("bind", "pass", f"{where} with {keys} client key{'s' if keys != 1 else ''}")


def exporter_bind_check(service: Service, settings: HostSettings | None) -> Check:
    """An exporter has no API key: its /metrics answers whoever reaches the address. Loopback and a
    private address pass; every interface (0.0.0.0) or a public address WARNs (host details for anyone
    who reaches it; Docker's published ports bypass the host firewall)."""
    import ipaddress

    hs = settings or HostSettings()
    addr = hs.bind_address_for(service)
    ip = ipaddress.ip_address(addr)
    where = f"exporter {service.name} listens on {addr}:{service.port}"
    if ip.is_loopback:
        return Check("bind", "pass", f"{where} (loopback: Prometheus must run on this host to scrape it)")
    if ip.is_unspecified or not ip.is_private:
        how = ("it listens in the host's network: only the host firewall limits who reaches it"
               if service.engine == "node-exporter" else "Docker's published ports bypass the host firewall")
        return Check("bind", "warn", f"{where}: its metrics (host and GPU details) answer anyone who reaches "
                     f"the address; {how}",
                     f"set llmfleet_services[{service.name}].bind_address to the address Prometheus scrapes")
    return Check("bind", "pass", f"{where} (a private address)")


def _catalog_model(name: str) -> ModelSpec | None:
    """The catalog model of that name (None: not a catalog model)."""
    from llmfleet.knowledge.catalog import find_model

    try:
        return find_model(name)
    except UsageError:
        return None


def _is_multimodal(service: Service) -> bool:
    """The service's model carries a vision tower (catalog ``vision_params``); False when not known."""
    from llmfleet.knowledge.catalog import find_model

    try:
        return service.model is not None and (find_model(service.model).vision_params or 0) > 0
    except UsageError:
        return False


def _image_desc(rel: EngineRelease) -> str:
    torch = ""
    if rel.torch is not None and not rel.cpu:
        torch = ", " + compat.torch_label(rel.torch)
    facts = {"catalog": "catalog", "lock": "images.lock", "inspected": "inspected from the image"}[rel.facts_source]
    return (f"{rel.repository}:{rel.tag}, " + ("CPU only" if rel.cpu else f"CUDA {rel.cuda}") + torch
            + f" (kernels: {facts}; catalog confidence {rel.confidence})")


def _gpu_errors(facts: Facts) -> str:
    return "; ".join(e for e in facts.errors
                     if any(w in e.lower() for w in ("nvidia", "driver", "gpu", "compute capability")))


# ------------------------------------------------------------------------------------------------
# Checks on the host itself


def _gpu_check(service: Service, facts: Facts, rel: EngineRelease | None, gpus: list[GpuFact],
               missing: list[int]) -> Check:
    # Every release reserves its GPUs (compose device reservations), CPU images included: a host
    # whose driver is gone cannot start the container either way.
    asked = "all GPUs" if service.gpus == "all" else "GPU(s) " + ", ".join(map(str, service.gpus))
    if not facts.gpus:
        why = _gpu_errors(facts) or "nvidia-smi listed none"
        return Check("gpu", "fail", f"service {service.name} reserves {asked}, but no NVIDIA GPU was seen: {why}",
                     "install or load the NVIDIA driver (check `nvidia-smi` on the host), then run preflight again")
    cpu = rel is not None and rel.cpu
    if missing:
        have = ", ".join(str(g.index) for g in facts.gpus)
        return Check("gpu", "fail",
                     f"service {service.name} asks for GPU(s) {', '.join(map(str, missing))}; the host has {have}",
                     "fix llmfleet_services[].gpus in the inventory")
    names = sorted({g.name for g in gpus})
    ccs = sorted({g.compute_capability or "?" for g in gpus})
    desc = f"{len(gpus)} x {', '.join(names)} (compute capability {', '.join(ccs)}"
    srcs = sorted({g.compute_capability_source or "unknown" for g in gpus})
    desc += f", from {'/'.join(srcs)})"
    if any(g.compute_capability is None for g in gpus):
        return Check("gpu", "warn" if cpu else "fail", desc + ": compute capability unknown",
                     "add the card's nvidia-smi name to catalog/gpus.yaml")
    if len(ccs) > 1:
        return Check("gpu", "warn", desc + ": mixed cards; checks use the oldest",
                     "pin the service to identical cards with gpus: [...]")
    ours_running = any(owned_by(c, service) for c in facts.containers)
    busy = [g for g in gpus if g.memory_total_mib and g.memory_used_mib is not None
            and g.memory_used_mib > GPU_BUSY_FRACTION * g.memory_total_mib]
    if busy and not ours_running:
        used = ", ".join(f"GPU {g.index}: {g.memory_used_mib} of {g.memory_total_mib} MiB" for g in busy)
        return Check("gpu", "warn", desc + f"; memory already in use ({used}) by something other than this service",
                     "stop what holds the GPU memory (nvidia-smi lists the processes), or pick another GPU")
    return Check("gpu", "pass", desc)


# A planner error that only means "cannot size it" is a warning; anything else (a quant the engine
# cannot serve, a bad setting) is a failure.
_PLAN_UNKNOWN = ("unknown model", "not in catalog/gpus.yaml", "unknown gpu", "no gpu seen")


def _plan_check(service: Service, plan: Any, plan_error: str | None) -> Check:
    if plan is None:
        err = plan_error or "no plan was made"
        unknown = any(u in err.lower() for u in _PLAN_UNKNOWN) or not plan_error
        return Check("plan", "warn" if unknown else "fail", f"no capacity plan for {service.name}: {err}",
                     "add the model to catalog/models.yaml (or the card to catalog/gpus.yaml) and check with "
                     "`invoke plan`" if unknown else "fix the service so that `invoke plan` accepts it")
    fits = bool(getattr(plan, "fits", False))
    notes = [str(n) for n in (getattr(plan, "notes", None) or [])]
    if fits:
        ctx = getattr(plan, "max_context_tokens", None)
        k = getattr(plan, "max_concurrency", None)
        wb = getattr(plan, "weights_bytes", None)
        tok = getattr(plan, "decode_tokps_realistic", None) or getattr(plan, "decode_tokps_expected", None)
        parts = []
        if wb:
            parts.append(f"weights {wb / 1e9:.1f} GB")
        if ctx:
            parts.append(f"context up to {ctx} tokens at concurrency {service.concurrency}")
        if k:
            parts.append(f"up to {k} sequences at the planned context")
        if tok and len(tok) == 2:
            parts.append(f"expected decode {tok[0]:.0f}-{tok[1]:.0f} tok/s")
        hosts = getattr(plan, "hosts", 1) or 1
        return Check("plan", "pass", f"{service.model} ({getattr(plan, 'quant', service.quant)}) fits "
                     f"{getattr(plan, 'gpus', 1)} x {getattr(plan, 'gpu_name', 'the card')}"
                     + (f" on each of {hosts} hosts" if isinstance(hosts, int) and hosts > 1 else "")
                     + (f": {', '.join(parts)}" if parts else ""))
    why = next((n for n in notes if n.startswith("REFUSED")), None) or "; ".join(notes[:2]) or \
        "the planner says it does not fit"
    alts = getattr(plan, "alternatives", None) or getattr(plan, "suggestions", None) or []
    sugg = [a for a in alts if isinstance(a, dict)]
    fix = ("; ".join(f"{s.get('flags') or s.get('change')} ({s.get('why', '')})" for s in sugg[:3])
           if sugg else "a smaller quantization, a shorter context, fewer concurrent sequences or more GPUs")
    return Check("plan", "fail", f"{service.model} does not fit: {why}", f"{fix} (`invoke plan` ranks them)")


def _docker_check(facts: Facts) -> Check:
    d = facts.docker
    if d.error or not d.server_version:
        return Check("docker", "fail", f"Docker engine not usable: {d.error or 'no server version'}",
                     "install Docker and start it (systemctl start docker), and let the SSH user reach "
                     "its socket (docker group)")
    return Check("docker", "pass", f"Docker {d.server_version}, default runtime {d.default_runtime or '?'}")


def _gpu_runtime_check(facts: Facts, rel: EngineRelease | None) -> Check:
    # Needed for CPU images too: the release reserves GPUs through the nvidia device driver.
    d, tk = facts.docker, facts.toolkit
    ways = []
    if "nvidia" in d.runtimes:
        ways.append("nvidia runtime" + (" (default)" if d.default_runtime == "nvidia" else ""))
    if tk.hook_path:
        ways.append("nvidia-container-runtime-hook (docker --gpus)")
    if any("nvidia.com/gpu" in k for k in tk.cdi_kinds):
        ways.append("CDI spec nvidia.com/gpu")
    version = tk.version or tk.cli_version
    if ways:
        return Check("gpu-runtime", "pass",
                     f"containers can get GPUs: {', '.join(ways)}; toolkit {version or 'version unknown'}")
    return Check("gpu-runtime", "fail",
                 "Docker cannot hand GPUs to containers: no nvidia runtime, no nvidia-container-runtime-hook, "
                 "no CDI spec for nvidia.com/gpu" + (" (the release reserves GPUs even for a CPU image)"
                                                     if rel is not None and rel.cpu else ""),
                 "install nvidia-container-toolkit, run `nvidia-ctk runtime configure --runtime=docker` and "
                 "restart Docker")


def _compose_check(facts: Facts) -> Check:
    if facts.compose.v2:
        return Check("compose", "pass", f"docker compose v2 plugin {facts.compose.v2}")
    if facts.compose.v1:
        v = compat.version_tuple(facts.compose.v1.split("-")[0].split("+")[0])
        if v and v[0] >= 2:
            return Check("compose", "pass", f"docker-compose {facts.compose.v1} (v2 standalone)")
        return Check("compose", "warn", f"only compose v1 (docker-compose {facts.compose.v1})",
                     "install the compose v2 plugin (docker-compose-plugin)")
    return Check("compose", "fail", "no docker compose (neither the v2 plugin nor docker-compose)",
                 "install the compose v2 plugin (docker-compose-plugin)")


def _disk_image_check(facts: Facts, rel: EngineRelease | None, image_ref: Any = None) -> Check:
    if rel is None:
        return Check("disk-image", "warn", "image unknown: cannot size it", "fix the image first")
    wanted = {str(getattr(image_ref, "pull_ref", ""))} if image_ref is not None else set()
    if image_ref is not None and getattr(image_ref, "digest", None):
        for repo in (image_ref.repository, image_ref.upstream_repository):
            wanted.add(f"{repo}@{image_ref.digest}")
            wanted.add(f"{repo.removeprefix('docker.io/')}@{image_ref.digest}")
    present = [i for i in facts.images if i in wanted]
    if present:
        return Check("disk-image", "pass", f"{present[0]} is already on the host")
    disk = facts.disk("docker_root")
    need = int(rel.image_size_mib * IMAGE_DISK_FACTOR)
    if disk is None or disk.free_mib is None:
        return Check("disk-image", "warn", f"free space under the Docker root unknown; {rel.key} needs about {_gib(need)}",
                     "check `df -h /var/lib/docker` on the host")
    if disk.free_mib < need:
        return Check("disk-image", "fail",
                     f"{_gib(disk.free_mib)} free on {disk.mount or disk.path} (Docker root); {rel.key} needs about {_gib(need)}",
                     "free space (docker image prune) or move the Docker root")
    return Check("disk-image", "pass", f"{_gib(disk.free_mib)} free for images; {rel.key} needs about {_gib(need)}")


def _model_files_check(host: str, service: Service, model: ModelFile | None) -> Check:
    path = service.model_path or ""
    if model is None:
        return Check("model-files", "warn", f"{path} was not probed", f"run `invoke preflight --host {host}` again")
    if model.kind == "missing":
        return Check("model-files", "fail", f"{path} does not exist on {host}",
                     f"copy the model to {host}:{path}: `invoke models.push --host {host} --service {service.name}` "
                     "(docs/models.md)")
    if model.readable is False:
        return Check("model-files", "fail", f"{path} on {host} is not readable by the SSH user",
                     f"chmod -R a+rX {path} (the engine container reads it read-only)")
    gguf_path = path.lower().endswith(".gguf")
    if engines.for_engine(service.engine).model_is_file or gguf_path:
        if model.kind != "file":
            return Check("model-files", "fail", f"{path} is a {model.kind}, not a .gguf file",
                         "point model_path at the .gguf file (the first shard of a split model)")
        if model.magic != "GGUF":
            return Check("model-files", "fail", f"{path} is not a GGUF file (starts with {model.magic or 'nothing'!r})",
                         "copy the right file; a partial copy has no GGUF header")
        return Check("model-files", "pass", f"{path}: GGUF, {_gib((model.size_bytes or 0) / 2**20)}")
    if model.kind != "dir":
        return Check("model-files", "fail", f"{path} is a {model.kind}; vLLM needs a model folder",
                     "point model_path at the Hugging Face model folder (with config.json)")
    names = set(model.entries)
    weights = [n for n in names if n.endswith((".safetensors", ".bin", ".pt"))]
    if "config.json" not in names:
        return Check("model-files", "fail", f"{path} has no config.json ({len(names)} entries)",
                     "copy the whole Hugging Face model folder")
    if not weights:
        return Check("model-files", "fail", f"{path} has config.json but no weight files (*.safetensors)",
                     "copy the weight files too")
    return Check("model-files", "pass",
                 f"{path}: config.json and {len(weights)} weight file(s), {_gib((model.size_bytes or 0) / 2**20)}")


def model_verified_check(host: str, service: Service, model: ModelFile) -> Check:
    """The copy against its manifest (``invoke models.push``), by size and mtime: PASS verified, FAIL a
    file changed since, WARN no manifest (a hand-copied model stays deployable)."""
    from llmfleet.knowledge.model_manifest import judge

    v = judge(service.model_path or "", model.manifest, model.observed)
    push = f"`invoke models.push --host {host} --service {service.name}`"
    fix = {"no-manifest": f"{push} (a copy already there is checked with sha256sum on the host, not sent again)",
           "unreadable": push, "unchecked": push,
           "changed": f"{push} puts the verified copy back (only what differs is sent); or find what changed it",
           "missing": f"{push} puts the verified copy back"}.get(v.state, "")
    return Check("model-verified", v.status, v.message, fix)


def _disk_model_check(service: Service, facts: Facts, model: ModelFile | None, plan: Any) -> Check:
    if model is not None and model.kind in ("dir", "file"):
        return Check("disk-model", "pass", f"model already on the host ({_gib((model.size_bytes or 0) / 2**20)})")
    disk = facts.disk("model:" + (service.model_path or ""))
    need = getattr(plan, "weights_bytes", None) if plan is not None else None
    if disk is None or disk.free_mib is None:
        return Check("disk-model", "warn", f"free space for {service.model_path} unknown",
                     "check `df -h` on the host")
    if need is None:
        return Check("disk-model", "warn", f"{_gib(disk.free_mib)} free at {disk.path}; model size unknown (no plan)",
                     "run `invoke plan` to size the model")
    need_mib = int(need) / 2**20
    if disk.free_mib < need_mib:
        return Check("disk-model", "fail", f"{_gib(disk.free_mib)} free at {disk.path}; the model needs about {_gib(need_mib)}",
                     "free space or choose another model_path")
    return Check("disk-model", "pass", f"{_gib(disk.free_mib)} free at {disk.path}; the model needs about {_gib(need_mib)}")


def _port_check(service: Service, facts: Facts, port: int | None = None, name: str = "port",
                what: str = "another port") -> Check:
    """``port`` (default: the service's) free, or held by the service's own container."""
    port = service.port if port is None else port
    holders = [c for c in facts.containers if port in c.ports]
    if port not in facts.ports and not holders:
        return Check(name, "pass", f"port {port} is free")
    ours = [c for c in holders if owned_by(c, service)]
    if ours:
        return Check(name, "pass", f"port {port} is held by this service's own container {ours[0].name} "
                                     "(a deploy replaces it)")
    if holders:
        return Check(name, "fail", f"port {port} is held by container {holders[0].name} ({holders[0].image})",
                     f"stop that container or give service {service.name} {what}")
    if service.engine in ("node-exporter", "gateway"):  # in the host's network: its own container publishes no port
        own = [c for c in facts.containers if owned_by(c, service) and c.state in ("running", "restarting")]
        if own:
            return Check(name, "pass", f"port {port} is held by this service's own container {own[0].name} "
                                         "(host network; a deploy replaces it)")
    rel = facts.releases.get(service.name)
    current = rel.current_release if rel is not None else None
    if current is not None and current.manifest and current.manifest.inputs.get("port", Service.model_fields["port"].default) == port:
        return Check(name, "warn", f"port {port} is in use; release {current.id} of {service.name} claims it, "
                                     "but no container of it publishes the port",
                     f"check `ss -ltnp 'sport = :{port}'` on the host")
    if facts.docker.error and facts.releases.get(service.name):
        return Check(name, "warn", f"port {port} is in use and Docker cannot be asked who holds it",
                     f"check `ss -ltnp 'sport = :{port}'` on the host")
    return Check(name, "fail", f"port {port} is in use by a process outside llmfleet",
                 f"stop it (`ss -ltnp 'sport = :{port}'` shows which) or give service {service.name} {what}")


# ------------------------------------------------------------------------------------------------
# One host (``llmfleet.release.preflight`` resolves each service's image, plans it and runs these)


def bind_check(service: Service, settings: HostSettings | None) -> Check:
    """A published port on a non-loopback address needs an API key, or the inventory's explicit
    ``allow_unauthenticated: true``. Docker publishes ports with its own iptables rules, ahead of the
    host's firewall (ufw, firewalld), so a host firewall does not make such a port private."""
    import ipaddress

    hs = settings or HostSettings()
    addr = hs.bind_address_for(service)
    loopback = ipaddress.ip_address(addr).is_loopback
    where = f"service {service.name} publishes port {service.port} on {addr}"
    if loopback:
        return Check("bind", "pass", f"{where} (loopback: reachable from the host only)")
    if service.api_key is not None:
        return Check("bind", "pass", f"{where}, with an API key")
    if hs.allow_unauthenticated_for(service):
        return Check("bind", "warn", f"{where} without an API key (allow_unauthenticated: true): anyone who "
                     "reaches the address can use the model; Docker's published ports bypass the host firewall",
                     "set api_key: {from_env: VAR}, or bind_address: 127.0.0.1 behind a proxy")
    return Check("bind", "fail", f"{where} without an API key; Docker's published ports bypass the host "
                 "firewall, so anyone who reaches the address can use the model",
                 f"set llmfleet_services[{service.name}].api_key: {{from_env: VAR}}, or bind_address: 127.0.0.1, "
                 "or allow_unauthenticated: true to accept it")


def unreachable(host_name: str, error: str, services: list[Service]) -> list[Report]:
    """What a host that could not be reached reports: one failed ``ssh`` check per service."""
    check = Check("ssh", "fail", error, "check the address, user and key in the inventory, and that sshd runs")
    return [Report(host_name, s.name, [check]) for s in services] or [Report(host_name, None, [check])]


# ------------------------------------------------------------------------------------------------
# Judging a host without reaching it: facts saved by `invoke facts --json`, plus assumptions


# --assume KEY=VALUE: what may be assumed, and what it changes in the facts
ASSUMABLE = {
    "driver": "the NVIDIA driver version (the highest CUDA it supports follows from its branch)",
    "cuda": "the highest CUDA the driver supports (the nvidia-smi banner), e.g. 12.8",
    "toolkit": "the nvidia-container-toolkit version, e.g. 1.17.8",
    "default_runtime": "Docker's default runtime, e.g. nvidia or runc",
}


def facts_file_for(host: str, given: str) -> str:
    """A file name to save ``host``'s facts in, for a hint: never ``given`` (the file the user passed,
    which a hint must not suggest overwriting)."""
    import os

    name = f"facts-{host}.json"
    if os.path.basename(str(given)) == name or os.path.exists(name):
        name = f"facts-{host}-new.json"
    return name


def facts_from_saved(data: Any, host: str, path: str) -> Facts:
    """The facts of ``host`` from what ``invoke facts --json`` printed (``{"hosts": [...], "unreachable":
    [...]}``; also one object, or a list of them). Pure. Raises UsageError naming the file and what is wrong."""
    if isinstance(data, dict) and isinstance(data.get("hosts"), list):  # {"hosts": [...], "unreachable": [...]}
        data = data["hosts"] + [u for u in data.get("unreachable") or [] if isinstance(u, dict)]
    entries = data if isinstance(data, list) else [data]
    if not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"{path}: expected the JSON that `invoke facts --host {host} --json` prints")
    match = [e for e in entries if e.get("host") == host]
    if not match:
        seen = ", ".join(sorted(str(e.get("host")) for e in entries)) or "none"
        raise UsageError(f"{path}: no facts for host {host} (hosts in the file: {seen}); save them with "
                         f"`invoke facts --host {host} --out {facts_file_for(host, path)}` and pass that file")
    entry = match[0]
    if "error" in entry and "gpus" not in entry:
        raise UsageError(f"{path}: the saved facts of {host} are an error ({str(entry['error'])[:120]}); "
                         "gather them again where the host is reachable")
    try:
        return Facts.model_validate(entry)
    except Exception as exc:  # pydantic's message, first line: the field that is wrong
        first = str(exc).splitlines()
        raise UsageError(f"{path}: facts of {host} do not parse: {' '.join(first[:3])[:200]}") from None


def parse_assumptions(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["driver=550.127.05", ...]`` -> {key: value}. Pure; UsageError for an unknown key or a
    value that does not parse."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        key = key.strip().replace("-", "_")
        value = value.strip()
        if not sep or not value:
            raise UsageError(f"--assume {item!r}: write KEY=VALUE, e.g. driver=550.127.05")
        if key not in ASSUMABLE:
            raise UsageError(f"--assume {item!r}: unknown key {key!r}; known: "
                             + "; ".join(f"{k} ({v})" for k, v in ASSUMABLE.items()))
        if key in ("driver", "toolkit", "cuda"):
            v = compat.version_tuple(re.sub(r"[-~+].*$", "", value))
            if v is None or len(v) < 2:
                raise UsageError(f"--assume {item!r}: {value!r} is not a version like "
                                 + {"driver": "550.127.05", "toolkit": "1.17.8", "cuda": "12.8"}[key])
        out[key] = value
    return out


def apply_assumptions(facts: Facts, assumed: dict[str, str], catalog: EngineCatalog) -> tuple[Facts, list[str]]:
    """The facts with the assumed values in place, and one line per change. Pure (a copy).

    An assumed driver also sets the CUDA it supports, from its branch (``driver_branches``), unless
    ``cuda`` is assumed too."""
    f = facts.model_copy(deep=True)
    notes: list[str] = []
    if "driver" in assumed:
        old = f.driver_version
        f.driver_version = assumed["driver"]
        cuda = compat.branch_cuda(assumed["driver"], catalog.driver_branches)
        f.cuda_driver_version = cuda
        f.cuda_driver_source = "driver-branch" if cuda else None
        notes.append(f"driver {old or '?'} -> {assumed['driver']} (CUDA {cuda or '?'} from its branch)")
    if "cuda" in assumed:
        notes.append(f"driver CUDA {f.cuda_driver_version or '?'} -> {assumed['cuda']}")
        f.cuda_driver_version = assumed["cuda"]
        f.cuda_driver_source = "banner"
    if "toolkit" in assumed:
        notes.append(f"nvidia-container-toolkit {f.toolkit.version or '?'} -> {assumed['toolkit']}")
        f.toolkit.version = assumed["toolkit"]
    if "default_runtime" in assumed:
        notes.append(f"Docker default runtime {f.docker.default_runtime or '?'} -> {assumed['default_runtime']}")
        f.docker.default_runtime = assumed["default_runtime"]
        if assumed["default_runtime"] not in f.docker.runtimes:
            f.docker.runtimes = [*f.docker.runtimes, assumed["default_runtime"]]
    return f, notes


# ------------------------------------------------------------------------------------------------
# A service split over several GPUs and hosts: rules over the facts of every host it uses (pure)

# Every check id check_service_hosts emits, in order (docs/preflight.md describes each).
MULTI_CHECK_IDS = ("gpu-count", "gpu-identical", "driver-match", "tp-heads", "topology", "network")

# `nvidia-smi topo -m` link kinds: NV# (NVLink), PIX/PXB (PCIe switches), PHB (host bridge),
# NODE (host bridges of one NUMA node), SYS (across the CPUs' interconnect).
_PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE")


def parse_topology(text: str | None) -> dict[tuple[int, int], str]:
    """GPU-to-GPU links from `nvidia-smi topo -m` output: {(i, j): "NV2" | "PIX" | ... } for i != j.
    Empty when the text holds no matrix. Pure; unknown tokens are kept as they are."""
    if not text:
        return {}
    # nvidia-smi underlines the header with terminal escapes, even into a pipe: drop them
    lines = [ln for ln in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", str(text)).splitlines() if ln.strip()]
    # The header names the columns (GPU0 GPU1 ... NICs, CPU Affinity); a row is GPUi then its links, "X" to itself.
    header = next((ln for ln in lines if ln.split()[0] == "GPU0" and ln.split()[1:2] != ["X"]), None)
    if header is None:
        return {}
    cols = [int(c[3:]) for c in header.split() if re.fullmatch(r"GPU\d+", c)]
    links: dict[tuple[int, int], str] = {}
    for ln in lines:
        parts = ln.split()
        if ln is header or not re.fullmatch(r"GPU\d+", parts[0]):
            continue
        i = int(parts[0][3:])
        for j, val in zip(cols, parts[1:1 + len(cols)], strict=False):
            if i != j and val != "X":
                links[(i, j)] = val
    return links


def _hosts_gpus(service: Service, facts_by_host: dict[str, Facts], head: str) -> dict[str, list[GpuFact]]:
    return {h: selected_gpus(service, f)[0] for h, f in facts_by_host.items()} | (
        {} if head in facts_by_host else {head: []})


def check_service_hosts(
    service: Service,
    facts_by_host: dict[str, Facts],
    *,
    head: str,
    plan: Any = None,
    model: Any = None,
    topology_by_host: dict[str, str] | None = None,
    network_gbps: float | None = None,
) -> list[Check]:
    """The rules a service split over several GPUs or hosts must pass, over the facts of every host
    it uses (``facts_by_host``: the head and its workers). Pure; each check names the hosts it judged.

    - ``gpu-count``: each host has the GPUs the service uses (the plan's ``gpus``, else the service's
      list, else the head's count for ``gpus: all``), at the indexes it names;
    - ``gpu-identical``: the same card (nvidia-smi name, memory.total) on every GPU used, on every host;
    - ``driver-match``: the same driver and CUDA driver version on every host (a difference is a WARN:
      each host must still pass its own ``cuda-driver`` check, which ``run_checks`` makes per host);
    - ``tp-heads``: vLLM's tensor parallel rule (attention heads divide by the GPUs per host, KV heads
      divide or are replicated) and at least one layer per pipeline stage (``model``: a catalog
      ``ModelSpec``; None: looked up by the service's model name);
    - ``topology``: how the GPUs of each host are linked, from `nvidia-smi topo -m` text
      (``topology_by_host``, else a ``gpu_topology`` attribute of the facts); unknown = WARN;
    - ``network``: with several hosts, the link speed the plan used (``network_gbps``; unknown = WARN).
      Whether the NCCL / RPC ports are reachable is checked from the hosts by the deploy, not here.
    """
    hosts = [head] + sorted(h for h in facts_by_host if h != head)
    gpus_by_host = _hosts_gpus(service, facts_by_host, head)
    head_facts = facts_by_host.get(head)
    if plan is not None and getattr(plan, "gpus", None):
        per_host = int(plan.gpus)
    elif isinstance(service.gpus, list):
        per_host = len(service.gpus)
    else:
        per_host = len(head_facts.gpus) if head_facts is not None else 0
    return [
        _gpu_count_check(service, facts_by_host, hosts, gpus_by_host, per_host),
        _gpu_identical_check(service, hosts, gpus_by_host, per_host),
        _driver_match_check(facts_by_host, hosts, head),
        _tp_heads_check(service, model, hosts, per_host),
        _topology_check(facts_by_host, hosts, head, gpus_by_host, per_host, topology_by_host),
        _network_check(hosts, network_gbps),
    ]


def _gpu_count_check(service: Service, facts_by_host: dict[str, Facts], hosts: list[str],
                     gpus_by_host: dict[str, list[GpuFact]], per_host: int) -> Check:
    """``gpu-count``: each host has the GPUs the service uses, at the indexes it names."""
    short = []
    for h in hosts:
        f = facts_by_host.get(h)
        if f is None:
            short.append(f"{h}: no facts")
            continue
        _, missing = selected_gpus(service, f)
        if missing:
            short.append(f"{h}: no GPU {', '.join(map(str, missing))} (has {len(f.gpus)})")
        elif len(gpus_by_host[h]) < per_host:
            short.append(f"{h}: {len(gpus_by_host[h])} GPU(s)")
    if short:
        return Check("gpu-count", "fail", f"service {service.name} needs {per_host} GPU(s) on each of "
                     f"{len(hosts)} host(s): {'; '.join(short)}",
                     "give every host of the service the same GPUs (llmfleet_services[].gpus), or plan "
                     "with fewer (`invoke plan --gpus N`)")
    else:
        return Check("gpu-count", "pass", f"{per_host} GPU(s) on each of {len(hosts)} host(s): "
                     + ", ".join(hosts))


def _gpu_identical_check(service: Service, hosts: list[str], gpus_by_host: dict[str, list[GpuFact]],
                         per_host: int) -> Check:
    """``gpu-identical``: the same card (nvidia-smi name, memory.total) on every GPU used, on every host."""
    seen: dict[tuple[str, int | None], list[str]] = {}
    unknown_cc = []
    for h in hosts:
        for g in gpus_by_host[h][:per_host] if per_host else gpus_by_host[h]:
            seen.setdefault((g.name, g.memory_total_mib), []).append(f"{h}:{g.index}")
            if not g.compute_capability:
                unknown_cc.append(f"{h}:{g.index}")
    names = {name for name, _ in seen}
    desc = "; ".join(f"{name} ({mib if mib is not None else '?'} MiB) on {', '.join(where)}"
                     for (name, mib), where in seen.items())
    if len(names) > 1:
        return Check("gpu-identical", "fail", f"service {service.name} would split over different cards: "
                     f"{desc}", "use identical cards on every GPU of the service (pin gpus: [...] per host)")
    elif len(seen) > 1:
        return Check("gpu-identical", "warn", f"same card, different memory.total: {desc}; the plan uses "
                     "the smallest", "check ECC mode (nvidia-smi -q) and what else holds memory")
    elif not seen:
        return Check("gpu-identical", "fail", f"service {service.name}: no GPU seen on {', '.join(hosts)}",
                     "gather the hosts' facts (`invoke facts`) and check the driver")
    elif unknown_cc:
        return Check("gpu-identical", "warn", f"{desc}; compute capability unknown on "
                     f"{', '.join(unknown_cc)}", "add the card's nvidia-smi name to catalog/gpus.yaml")
    else:
        return Check("gpu-identical", "pass", desc)


def _driver_match_check(facts_by_host: dict[str, Facts], hosts: list[str], head: str) -> Check:
    """``driver-match``: the same driver and CUDA driver version on every host (a difference is a WARN)."""
    drivers = {h: (facts_by_host[h].driver_version, facts_by_host[h].cuda_driver_version)
               for h in hosts if h in facts_by_host}
    missing_drv = [h for h, (d, _) in drivers.items() if not d]
    if len(hosts) == 1:
        return Check("driver-match", "pass", f"one host ({head}): its cuda-driver check applies")
    elif missing_drv:
        return Check("driver-match", "warn", f"driver version unknown on {', '.join(missing_drv)}",
                     "gather the facts again (`invoke facts`); nvidia-smi must run on every host")
    elif len(set(drivers.values())) > 1:
        return Check("driver-match", "warn", "different drivers across the hosts of the service: "
                     + ", ".join(f"{h} {d} (CUDA {c or '?'})" for h, (d, c) in drivers.items()),
                     "each host must pass its own cuda-driver check; keep the driver equal on every host "
                     "so NCCL and the engine behave the same everywhere")
    else:
        d, c = next(iter(drivers.values()))
        return Check("driver-match", "pass", f"driver {d} (CUDA {c or '?'}) on every host")


def _tp_heads_check(service: Service, model: Any, hosts: list[str], per_host: int) -> Check:
    """``tp-heads``: the heads divide over the GPUs per host, and every pipeline stage has a layer."""
    from llmfleet.knowledge import parallel

    spec = model
    if spec is None:
        try:
            from llmfleet.knowledge.catalog import find_model

            spec = find_model(service.model or "")
        except UsageError:
            spec = None
    n_hosts = len(hosts)
    if spec is None:
        return Check("tp-heads", "warn", f"model {service.model} is not in the catalog: its heads and layers "
                     "are unknown, so the split is not judged", "add it to catalog/models.yaml")
    else:
        tp = per_host if engines.for_engine(service.engine).split_modes[0] == "tensor" else 1
        why = parallel.tp_problem(spec.heads, spec.kv_heads, tp, mla=spec.is_mla)
        if why:
            return Check("tp-heads", "fail", why, "use a GPU count per host that divides the heads "
                         f"({', '.join(str(c) for c in (1, 2, 4, 8) if not parallel.tp_problem(spec.heads, spec.kv_heads, c, mla=spec.is_mla))})")
        elif n_hosts > spec.num_layers:
            return Check("tp-heads", "fail", f"{n_hosts} hosts for {spec.num_layers} layers",
                         "use fewer hosts")
        else:
            return Check("tp-heads", "pass", f"{spec.heads} attention heads, {spec.kv_heads} KV heads over "
                         f"{tp} GPU(s) per host; {spec.num_layers} layers over {n_hosts} host(s)")


def _topology_check(facts_by_host: dict[str, Facts], hosts: list[str], head: str,
                    gpus_by_host: dict[str, list[GpuFact]], per_host: int,
                    topology_by_host: dict[str, str] | None) -> Check:
    """``topology``: how the GPUs of each host are linked, from `nvidia-smi topo -m` text."""
    topo = topology_by_host or {}
    if per_host <= 1:
        return Check("topology", "pass", "one GPU per host: no GPU-to-GPU traffic inside a host")
    else:
        unknown, slow, notes = [], [], []
        nvlink_all = True
        for h in hosts:
            text = topo.get(h) if h in topo else getattr(facts_by_host.get(h), "gpu_topology", None)
            links = parse_topology(text)
            idx = [g.index for g in gpus_by_host[h][:per_host]]
            pairs = [(i, j) for i in idx for j in idx if i < j]
            if not links or any((i, j) not in links for i, j in pairs):
                unknown.append(h)
                nvlink_all = False
                continue
            kinds = {links[p] for p in pairs}
            if not all(k.startswith("NV") for k in kinds):
                nvlink_all = False
            if "SYS" in kinds:
                slow.append(f"{h} ({', '.join(f'GPU{i}-GPU{j} SYS' for i, j in pairs if links[(i, j)] == 'SYS')})")
            notes.append(f"{h}: " + ", ".join(sorted(kinds)))
        catalog_nvlink = False
        if gpus_by_host.get(head):
            try:
                from llmfleet.knowledge.catalog import find_gpu

                g0 = gpus_by_host[head][0]
                catalog_nvlink = find_gpu(g0.catalog_id or g0.name).interconnect == "nvlink"
            except UsageError:
                pass
        if unknown:
            return Check("topology", "warn", f"GPU links unknown on {', '.join(unknown)}: P2P/NVLink between "
                         "the service's GPUs is not confirmed"
                         + (f"; seen: {'; '.join(notes)}" if notes else ""),
                         "gather `nvidia-smi topo -m` from the host; the plan assumes the card's catalog link")
        elif slow:
            return Check("topology", "warn", f"GPU pairs across the CPUs' interconnect (SYS) on "
                         f"{'; '.join(slow)}: every all-reduce crosses it",
                         "pick GPUs under one CPU (gpus: [...]) or plan with --interconnect pcie")
        elif catalog_nvlink and not nvlink_all:
            return Check("topology", "warn", f"the card is an NVLink part but the links are PCIe: "
                         f"{'; '.join(notes)}; the plan priced NVLink all-reduces",
                         "re-plan with `invoke plan --interconnect pcie`, or check the board's NVLink")
        else:
            return Check("topology", "pass", "; ".join(notes)
                         + (" (NVLink between every pair)" if nvlink_all else " (PCIe)"))


def _network_check(hosts: list[str], network_gbps: float | None) -> Check:
    """``network``: with several hosts, the link speed the plan used."""
    n_hosts = len(hosts)
    if n_hosts <= 1:
        return Check("network", "pass", "one host: no traffic between hosts")
    elif network_gbps is None:
        return Check("network", "warn", f"link speed between {', '.join(hosts)} unknown: the plan assumed "
                     "the planner's default (planner.yaml parallel.network)",
                     "set llmfleet_network_gbps on the hosts (Gbit/s, the slowest link counts)")
    else:
        return Check("network", "pass", f"{network_gbps:g} Gbit/s between {', '.join(hosts)} (from the "
                     "inventory; port reachability is checked from the hosts when deploying)")
