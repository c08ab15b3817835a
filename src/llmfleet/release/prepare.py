"""Everything a deploy decides before any SSH: the services of a host chosen for this run, its overrides
applied and validated like the inventory, their secrets and their pinned images resolved.

Light on purpose (the inventory, images.lock and secrets only): ``invoke deploy`` prepares every host
first, so that bad input is refused in one line before any host is contacted, and only then loads the
release machinery (``llmfleet.release.deploy``) while the hosts' connections open.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.images import lock as images
from llmfleet.inventory.ansible import Host, Inventory, load_inventory, settings_for
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.release.secret import resolve_secret
from llmfleet.settings import Settings


@dataclass
class DeployOptions:
    check: bool = False
    diff: bool = False
    accept_new_host_keys: bool = False
    allow_unpinned: bool = False
    message: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    who: str | None = None
    services: list[str] | None = None  # only these services of the host (default: all)
    bundle: Any = None  # deploy --bundle: a verified bundle (llmfleet.bundle.check.Verified); images never pulled



def apply_overrides(service: Service, overrides: dict[str, Any], where: str) -> Service:
    """``--set key=value`` / ``--image`` on top of the inventory's service; validated like the inventory."""
    if not overrides:
        return service
    data = service.model_dump(mode="json", exclude_unset=True)
    data.update(overrides)
    try:
        return Service.model_validate(data)
    except Exception as exc:  # noqa: BLE001 - pydantic's error, shortened to one line
        first = str(exc).splitlines()
        raise UsageError(f"{where}: overrides {sorted(overrides)} do not fit the service schema: "
                         f"{' '.join(first[1:3]) if len(first) > 2 else first[0]}") from None



@dataclass(frozen=True)
class Prepared:
    """One service ready to deploy: this run's overrides applied, its secret and pinned image resolved."""

    service: Service
    api_key: str | None
    image: images.ImageRef
    gateway: Any = None  # a gateway service: its release.gateway_plan.GatewayPlan (replicas, keys, TLS)


@dataclass(frozen=True)
class PreparedHost:
    inventory: Inventory
    host: Host
    settings: HostSettings
    services: tuple[Prepared, ...]


def load_host(inventory: Inventory | str | os.PathLike[str], host_name: str) -> tuple[Inventory, Host, HostSettings]:
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    host = inv.hosts.get(host_name)
    if host is None:
        from llmfleet.suggest import did_you_mean

        raise UsageError(f"{inv.path}: no host {host_name!r}{did_you_mean(host_name, inv.hosts)}; hosts: {', '.join(inv.hosts) or '(none)'}")
    return inv, host, settings_for(host)


def prepare_host(inventory: Inventory | str, host_name: str, settings: Settings, options: DeployOptions,
                 lock_cache: dict[str, images.ImageLock] | None = None) -> PreparedHost:
    """Everything decided before SSH: the services chosen, this run's overrides, secrets, images.
    Raises ``UsageError`` for the first thing that does not fit (nothing contacted)."""
    inv, host, host_settings = load_host(inventory, host_name)
    path = images.lock_path_for(host.vars, inv.path, settings.images_lock)
    cache = lock_cache if lock_cache is not None else {}
    if str(path) not in cache:
        cache[str(path)] = images.load_lock(path)
    lock = cache[str(path)]
    chosen = host_settings.services
    if options.services:
        names = {s.name for s in chosen}
        unknown = [s for s in options.services if s not in names]
        if unknown:
            from llmfleet.suggest import did_you_mean

            raise UsageError(f"{inv.path}: host {host.name} has no service {unknown[0]!r}{did_you_mean(unknown[0], names)} "
                             f"(services: {', '.join(sorted(names)) or 'none'})")
        chosen = [s for s in chosen if s.name in options.services]
    # A service with workers spans hosts: llmfleet.release.multihost deploys it on all of them together.
    chosen = [s for s in chosen if not s.workers]
    out = []
    for svc in chosen:
        where = f"host {host.name}: service {svc.name}"
        svc = apply_overrides(svc, options.overrides, where)
        from llmfleet.knowledge.compat import image_engine_mismatch

        mismatch = image_engine_mismatch(svc.image, svc.engine, lock)
        if mismatch:
            raise UsageError(f"{inv.path}: host {host.name}: service {svc.name}: {mismatch}")
        key = resolve_secret(svc.api_key, where)
        ref = images.resolve(svc.image, lock, mirrors=dict(host_settings.image_mirrors),
                             allow_unpinned=options.allow_unpinned, where=where)
        if options.bundle is not None:  # loaded from the bundle, named by a local tag, checked by image ID
            ref = options.bundle.localize(ref, path, where)
        gateway = None
        if svc.engine == "gateway":
            from llmfleet.release import gateway_plan

            gateway = gateway_plan.plan_gateway(inv, host, svc)
        out.append(Prepared(svc, key, ref, gateway))
    return PreparedHost(inv, host, host_settings, tuple(out))
