"""``invoke inventory --check``: everything about an inventory that can be checked without a host.

Every error is reported, not the first: the schema of ``llmfleet_*`` variables (with ``{{ }}``
resolved), the GPU name in the card catalog, each service's quant in the quant catalog (and of the
engine's family: GGUF for llama.cpp, Hugging Face formats for vLLM), its image key in the
images.lock the host uses (and of the service's engine), GPU indexes given to one service only, one
service per host port, and the plan fitting the declared ``llmfleet_gpu``. Connection variables
llmfleet does not honour are warnings. Pure apart from reading the catalogs and images.lock. It sits
in release/ because it asks what a deploy would ask: the catalogs, images.lock, the planner and the
engine roles a multi-host service renders with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from llmfleet.errors import LlmfleetError, UsageError
from llmfleet.images import lock as images
from llmfleet.inventory.ansible import Host, Inventory
from llmfleet.inventory.connection import connection_settings
from llmfleet.inventory.services import HostSettings, Service, host_settings_all, resolve_workers
from llmfleet.inventory.templating import TemplateError, resolve_namespace
from llmfleet.knowledge.catalog import Gpu, Quant, find_gpu, find_quant
from llmfleet.knowledge.compat import image_engine_mismatch
from llmfleet.knowledge.engines import for_engine
from llmfleet.knowledge.planner import plan_for_service
from llmfleet.release import cluster
from llmfleet.release.render import load_role


@dataclass(frozen=True)
class Finding:
    host: str
    level: Literal["error", "warning"]
    message: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class HostReport:
    host: str
    settings: HostSettings | None
    services: list[Service]
    findings: list[Finding]
    address: str | None = None  # where llmfleet would connect ({{ }} resolved), None when it cannot

    @property
    def ok(self) -> bool:
        return not any(f.level == "error" for f in self.findings)


def _gpu_overlaps(services: list[Service]) -> list[str]:
    out: list[str] = []
    owner: dict[int, str] = {}
    all_users = [s.name for s in services if s.gpus == "all"]
    for s in services:
        if isinstance(s.gpus, list):
            dup = sorted({i for i in s.gpus if s.gpus.count(i) > 1})
            if dup:
                out.append(f"service {s.name}: gpus lists GPU {', '.join(map(str, dup))} twice")
            for i in dict.fromkeys(s.gpus):
                if i in owner:
                    out.append(f"GPU {i} is given to services {owner[i]} and {s.name}; give each service its own GPUs")
                else:
                    owner[i] = s.name
    if all_users and len(services) > 1:
        others = [s.name for s in services if s.name != all_users[0]]
        out.append(f"service {all_users[0]} takes gpus: all, so it shares GPUs with {', '.join(others)}; "
                   "list the GPU indexes of each service")
    return out


def _duplicates(services: list[Service]) -> list[str]:
    out: list[str] = []
    names: set[str] = set()
    ports: dict[int, str] = {}
    for s in services:
        if s.name in names:
            out.append(f"service name {s.name!r} appears twice")
        names.add(s.name)
        if s.port in ports:
            out.append(f"services {ports[s.port]} and {s.name} both use host port {s.port}")
        else:
            ports[s.port] = s.name
    return out


def _worker_findings(inventory: Inventory, head: str, service: Service) -> tuple[list[str], list[str]]:
    """A multi-host service's workers (resolved) and what is wrong with them: known hosts or groups, not
    the head, each once, an engine whose role renders workers, no clash with a worker's own services
    (name, cluster port)."""
    from llmfleet.release.multihost import worker_conflicts  # multihost imports the deploy machinery

    def group_hosts(name: str) -> list[str] | None:
        return inventory.group_hosts(name) if name in inventory.groups else None

    try:
        names = resolve_workers(service, head, list(inventory.hosts), group_hosts, cluster.multihost_engines())
    except ValueError as exc:
        return [], [str(exc)]
    out: list[str] = []
    port = cluster.cluster_port(service, load_role(service.engine))
    for n in names:
        try:
            ws = inventory.settings_for(inventory.hosts[n])
        except LlmfleetError:
            continue  # reported on that host
        out += worker_conflicts(service, n, ws, port)
    return names, out


Say = Callable[[str], None]


def _quant_of(s: Service, at: str, err: Say) -> Quant | None:
    """The service's quant from the catalog, of the engine's family; None (reported) if not."""
    if not s.quant:
        return None
    try:
        quant = find_quant(s.quant)
    except UsageError as exc:
        err(f"{at}: quant: {exc}")
        return None
    want = for_engine(s.engine).quant_family
    if quant.family != want:
        err(f"{at}: quant {s.quant!r} is a {quant.family} format; engine {s.engine} takes "
            f"{'GGUF quants (q4_k_m, q8_0, ...)' if want == 'gguf' else 'Hugging Face formats (fp16, awq-int4, ...)'}")
        return None
    return quant


def _image_findings(s: Service, at: str, lock: Any, mirrors: dict[str, str], err: Say, warn: Say) -> None:
    """The service's image key: of its engine, and in the host's images.lock, pinned."""
    mismatch = image_engine_mismatch(s.image, s.engine, lock)
    if mismatch:
        err(f"{at}: {mismatch}")
    elif lock is not None:
        try:
            images.resolve(s.image, lock, mirrors=mirrors, where=at)
        except UsageError as exc:
            locked = lock.get(s.image)
            if locked is not None and locked.digest is None:
                warn(f"{at}: image {s.image!r} is in {lock.path} but not pinned to a digest yet; "
                     f"deploy needs `invoke images.pin` first (or --allow-unpinned)")
            else:
                err(str(exc))


def _plan_findings(s: Service, at: str, host: str, card: Gpu, n_hosts: int, settings: HostSettings | None,
                   err: Say, warn: Say) -> None:
    """The plan fitting the declared card (on each host of a service over several)."""
    try:
        p = plan_for_service(s, card, gpu_count=len(s.gpus) if isinstance(s.gpus, list) else 1, hosts=n_hosts,
                             network_gbps=settings.network_gbps if settings else None)
    except LlmfleetError as exc:
        warn(f"{at}: not planned: {exc}")
        return
    if not p.fits:
        cards = f"{p.gpus} x {card.id}" + (f" on each of {n_hosts} hosts" if n_hosts > 1 else "")
        msg = (f"{at}: the plan does not fit {cards} ({s.model}, {p.quant}, context {p.context}, "
               f"{p.concurrency} sequence(s)); see `invoke plan --host {host}`")
        if s.gpus == "all":
            warn(msg + " (gpus: all: the host's card count decides; planned on one card)")
        else:
            err(msg)


def check_host(
    host: Host,
    inventory: Inventory | None = None,
    *,
    lock_for: Callable[[Host], Any] | None = None,
) -> HostReport:
    """Every offline finding for one host. ``lock_for(host)`` gives the ImageLock its keys resolve in."""
    findings: list[Finding] = []

    def err(msg: str) -> None:
        findings.append(Finding(host.name, "error", msg))

    def warn(msg: str) -> None:
        findings.append(Finding(host.name, "warning", msg))

    address = None
    try:
        cs = connection_settings(host)
        address = cs.address + (f":{cs.port}" if cs.port else "")
    except LlmfleetError as exc:
        err(str(exc))
    try:
        hostvars = resolve_namespace(host, inventory)
    except TemplateError as exc:
        err(str(exc))
        return HostReport(host.name, None, [], findings, address)
    settings, services, errors = host_settings_all(host.name, hostvars, host.sources)
    for e in errors:
        err(e)
    where = f"host {host.name}"
    for msg in _duplicates(services) + _gpu_overlaps(services):
        err(f"{host.sources.get('llmfleet_services', 'inventory')}: {where}: llmfleet_services: {msg}")

    gpu_name = settings.gpu if settings else hostvars.get("llmfleet_gpu")
    card = None
    if isinstance(gpu_name, str) and gpu_name:
        try:
            card = find_gpu(gpu_name)
        except UsageError as exc:
            err(f"{host.sources.get('llmfleet_gpu', 'inventory')}: {where}: llmfleet_gpu: {exc}")

    lock = None
    if lock_for is not None and services:
        try:
            lock = lock_for(host)
        except LlmfleetError as exc:
            err(f"{where}: images.lock: {exc}")
        else:
            if lock is None:
                warn(f"{where}: no images.lock for this host; image keys not checked")
    mirrors = settings.image_mirrors if settings else {}
    src = host.sources.get("llmfleet_services", "inventory")
    for s in services:
        at = f"{src}: {where}: service {s.name}"
        n_hosts = 1
        if s.workers and inventory is not None:
            worker_names, msgs = _worker_findings(inventory, host.name, s)
            for msg in msgs:
                err(f"{at}: {msg}")
            n_hosts = 1 + len(worker_names)
        quant = _quant_of(s, at, err)
        _image_findings(s, at, lock, mirrors, err, warn)
        if card is None:
            continue
        if s.quant and quant is None:
            continue
        _plan_findings(s, at, host.name, card, n_hosts, settings, err, warn)
    return HostReport(host.name, settings, services, findings, address)


def check_inventory(
    inventory: Inventory, hosts: Iterable[Host] | None = None, *, lock_for: Callable[[Host], Any] | None = None
) -> list[HostReport]:
    return [check_host(h, inventory, lock_for=lock_for) for h in (hosts if hosts is not None else inventory.hosts.values())]

