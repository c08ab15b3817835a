"""Planning a service over several hosts, before any SSH: its workers (groups expanded) and their
conflicts, what every host of it runs (the service with this run's overrides, its secret, each host's
image), the cluster as far as the inventory tells it (``invoke render``), which such services a host
selection touches, and what the manifests of the releases a rollback goes back to say (the image,
the cluster). Pure over a loaded inventory, but for the images lock and the secret it reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.images import lock as images
from llmfleet.inventory.ansible import Host, Inventory, load_inventory, settings_for
from llmfleet.inventory.services import HostSettings, Service, resolve_workers
from llmfleet.knowledge import release_state
from llmfleet.knowledge.engines import for_engine
from llmfleet.knowledge.release_state import Manifest
from llmfleet.release import cluster as C
from llmfleet.release.prepare import DeployOptions, Prepared, PreparedHost, apply_overrides
from llmfleet.release.render import load_role
from llmfleet.release.secret import resolve_secret
from llmfleet.settings import Settings

# ---------------------------------------------------------------------------------------------
# Which services span hosts (pure over a loaded inventory)


def workers_of(inv: Inventory, head: str, service: Service, roles_dir: Any = None) -> list[str]:
    """The service's worker hosts (groups expanded, inventory order); a usage error names the fix."""
    def group_hosts(name: str) -> list[str] | None:
        return inv.group_hosts(name) if name in inv.groups else None

    try:
        return resolve_workers(service, head, list(inv.hosts), group_hosts, C.multihost_engines(roles_dir))
    except ValueError as exc:
        where = inv.hosts[head].sources.get("llmfleet_services", str(inv.path)) if head in inv.hosts else inv.path
        raise UsageError(f"{where}: host {head}: service {service.name}: {exc}") from None


def worker_conflicts(service: Service, worker: str, settings: HostSettings, port: int) -> list[str]:
    """A worker's own services that collide with the multi-host service (same name, or the cluster port)."""
    out = []
    for s in settings.services:
        if s.name == service.name:
            out.append(f"host {worker} has a service of its own named {service.name}; a worker release "
                       "of the same name would replace it: rename one")
        elif s.port == port:
            out.append(f"host {worker}: service {s.name} uses port {port}, the cluster port of {service.name}; "
                       "set cluster_port")
    return out


def services_of_hosts(inv: Inventory, names: list[str], service: str | None = None) -> list[tuple[str, str]]:
    """(head, service) of every service with workers that one of ``names`` is the head or a worker of
    (``service``: only that one), each once, in the inventory's order."""
    out: list[tuple[str, str]] = []
    wanted = set(names)
    for head, h in inv.hosts.items():
        for s in settings_for(h).services:
            if not s.workers or (service is not None and s.name != service) or (head, s.name) in out:
                continue
            if head in wanted or wanted & set(workers_of(inv, head, s)):
                out.append((head, s.name))
    return out


# ---------------------------------------------------------------------------------------------
# Preparation (before any SSH)


@dataclass(frozen=True)
class WorkerPrep:
    host: Host
    settings: HostSettings
    image: images.ImageRef


@dataclass(frozen=True)
class PreparedService:
    inventory: Inventory
    head: PreparedHost  # with exactly this service
    workers: tuple[WorkerPrep, ...]

    @property
    def service(self) -> Service:
        return self.head.services[0].service

    @property
    def names(self) -> list[str]:
        return [self.head.host.name, *(w.host.name for w in self.workers)]


def prepare_service(inventory: Inventory | str, head: str, service: str, settings: Settings,
                    options: DeployOptions) -> PreparedService:
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    host = inv.hosts.get(head)
    if host is None:
        raise UsageError(f"{inv.path}: no host {head!r}")
    hs = settings_for(host)
    found = next((s for s in hs.services if s.name == service), None)
    if found is None:
        from llmfleet.suggest import did_you_mean

        names = [s.name for s in hs.services]
        raise UsageError(f"{inv.path}: host {head} has no service {service!r}{did_you_mean(service, names)} "
                         f"(services: {', '.join(names) or 'none'})")
    where = f"host {head}: service {service}"
    svc = apply_overrides(found, options.overrides, where)
    names = workers_of(inv, head, svc)
    role = load_role(svc.engine)
    port = C.cluster_port(svc, role)
    if for_engine(svc.engine).checks_worker_image:  # before any SSH: an image known to lack rpc-server
        problem = C.rpc_image_problem(svc)
        if problem:
            where_file = host.sources.get("llmfleet_services", str(inv.path))
            raise UsageError(f"{where_file}: host {head}: {problem}")
    key = resolve_secret(svc.api_key, where)
    cache: dict[str, images.ImageLock] = {}

    def image_for(h: Host, s: HostSettings, image_key: str) -> images.ImageRef:
        path = images.lock_path_for(h.vars, inv.path, settings.images_lock)
        if str(path) not in cache:
            cache[str(path)] = images.load_lock(path)
        return images.resolve(image_key, cache[str(path)], mirrors=dict(s.image_mirrors),
                              allow_unpinned=options.allow_unpinned, where=f"host {h.name}: service {service}")

    head_ref = image_for(host, hs, svc.image)
    workers = []
    problems: list[str] = []
    for n in names:
        wh = inv.hosts[n]
        ws = settings_for(wh)
        problems += worker_conflicts(svc, n, ws, port)
        workers.append(WorkerPrep(wh, ws, image_for(wh, ws, svc.worker_image or svc.image)))
    if problems:
        raise UsageError(f"{inv.path}: service {service}: {problems[0]}")
    ready = PreparedHost(inv, host, hs, (Prepared(svc, key, head_ref),))
    return PreparedService(inv, ready, tuple(workers))


def offline_cluster(inv: Inventory, head: str, service: Service) -> tuple[C.Cluster, dict[str, HostSettings], list[str]]:
    """The cluster as far as the inventory tells it, for ``invoke render`` (no connection): an address
    read from an interface at deploy time is shown as ``<eth0 of HOST>``. Returns the cluster, each
    worker's settings, and notes."""
    role = load_role(service.engine)
    notes: list[str] = []

    def member(name: str, s: HostSettings) -> C.Member:
        if s.cluster_address:
            return C.member_for(name, s)
        if s.cluster_interface:
            notes.append(f"{name}: its address is read from {s.cluster_interface} at deploy time; shown as a placeholder")
            return C.Member(name, f"<{s.cluster_interface} of {name}>", s.cluster_interface)
        raise UsageError(f"host {name}: service {service.name} spans hosts: set llmfleet_cluster_address or "
                         "llmfleet_cluster_interface")

    workers = workers_of(inv, head, service)
    wsettings = {w: settings_for(inv.hosts[w]) for w in workers}
    cl = C.make_cluster(service, role, member(head, settings_for(inv.hosts[head])),
                        [member(w, wsettings[w]) for w in workers])
    return cl, wsettings, notes


# ---------------------------------------------------------------------------------------------
# What a worker's release was rendered for (its manifest)


def release_endpoint(state: release_state.ServiceState | None, release_id: str | None, host: str) -> tuple[str, int] | None:
    """(address, port) a worker's release listens on, from its manifest's cluster inputs; None if unknown."""
    info = state.releases.get(release_id) if state and release_id else None
    cl = (info.manifest.inputs.get("cluster") if info and info.manifest else None) or {}
    port = cl.get("port")
    me = next((w for w in cl.get("workers") or [] if isinstance(w, dict) and w.get("host") == host), None)
    if not isinstance(port, int) or not me or not isinstance(me.get("address"), str):
        return None
    return me["address"], port


def image_of(manifest: Manifest) -> images.ImageRef:
    """The image a release ran, as its manifest recorded it (what the audit line names)."""
    m = manifest.image
    ref = manifest.image_ref or ""
    return images.ImageRef(key=str(m.get("key") or ref), repository=str(m.get("repository") or ref.split("@")[0]),
                           digest=manifest.digest, tag=m.get("tag") if isinstance(m.get("tag"), str) else None,
                           pinned=bool(m.get("pinned", True)),
                           upstream_repository=str(m.get("upstream_repository") or m.get("repository") or ""))


def cluster_of(service: str, manifest: Manifest) -> C.Cluster | None:
    """The cluster a worker's release was rendered for (its manifest's inputs)."""
    d = manifest.inputs.get("cluster")
    if not isinstance(d, dict):
        return None
    try:
        head = C.Member(**d["head"])
        workers = tuple(C.Member(**w) for w in d["workers"])
        return C.Cluster(service, str(d["kind"]), int(d["port"]), head, workers)
    except (KeyError, TypeError, ValueError):
        return None
