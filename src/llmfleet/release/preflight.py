"""Preflight of one host, the shell around the pure checks (``llmfleet.knowledge.preflight``): resolve
each service's image in the host's images.lock, plan it on the host's cards, run the checks; connect
and gather the facts in one round trip first (``preflight_host``), or judge facts saved earlier
(``check_saved``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmfleet.errors import RemoteError, UsageError
from llmfleet.host import facts as facts_mod
from llmfleet.host import ssh
from llmfleet.images import lock as images
from llmfleet.inventory.ansible import Host
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.knowledge.compat import EngineCatalog
from llmfleet.knowledge.facts import Facts
from llmfleet.knowledge.preflight import Check, Report, plan_for, run_checks, unreachable
from llmfleet.settings import Settings, SshSettings


def check_host(
    host_name: str,
    settings: HostSettings,
    facts: Facts,
    *,
    lock: images.ImageLock,
    services: list[Service] | None = None,
    allow_unpinned: bool = False,
    catalog: EngineCatalog | None = None,
    today: str | None = None,
    hosts_by_service: dict[str, int] | None = None,
) -> list[Report]:
    """Reports for the given services of a host (default: all of them) from facts already gathered
    (``today``, ``YYYY-MM-DD``, dates the driver branches' end of life; None: today). ``hosts_by_service``:
    the hosts a service split over several spans (head and workers, groups expanded); the plan check
    plans it over them (absent: ``plan_for``'s default)."""
    chosen = settings.services if services is None else services
    if not chosen:
        return [Report(host_name, None, [Check("services", "warn", f"{host_name} has no llmfleet_services",
                                               "add services to the inventory (docs/inventory.md)")])]
    reports: list[Report] = []
    for svc in chosen:
        image_ref, image_error = None, None
        try:
            image_ref = images.resolve(svc.image, lock, mirrors=dict(settings.image_mirrors),
                                       allow_unpinned=allow_unpinned, where=f"host {host_name}: service {svc.name}")
        except UsageError as exc:
            image_error = str(exc).split(": image ", 1)[-1]
        plan, plan_error = plan_for(svc, facts, settings, hosts=(hosts_by_service or {}).get(svc.name))
        checks = run_checks(host_name, svc, facts, plan, image_ref, catalog=catalog, plan_error=plan_error,
                            image_error=image_error, today=today, settings=settings)
        reports.append(Report(host_name, svc.name, checks))
    return reports


def preflight_host(
    host: Host,
    settings: HostSettings,
    *,
    lock: images.ImageLock,
    config: SshSettings | Settings | Mapping[str, Any] | None = None,
    services: list[Service] | None = None,
    accept_new_host_keys: bool = False,
    allow_unpinned: bool = False,
) -> tuple[Facts | None, list[Report]]:
    """Connect (strict host keys), gather the facts in one round trip, run the checks.

    Never raises for the host's own failures: an SSH failure becomes a failed ``ssh`` check.
    """
    chosen = settings.services if services is None else services
    try:
        with ssh.connect(host, config=config, accept_new_host_keys=accept_new_host_keys) as remote:
            found = facts_mod.gather(remote, root=settings.root, model_paths=[s.model_path for s in chosen if s.model_path])
    except RemoteError as exc:
        return None, unreachable(host.name, str(exc), chosen)
    return found, check_host(host.name, settings, found, lock=lock, services=chosen, allow_unpinned=allow_unpinned)


def check_saved(host_name: str, settings: HostSettings, facts: Facts, *, lock: images.ImageLock, source: str,
                assumed_notes: list[str], services: list[Service] | None = None, allow_unpinned: bool = False,
                catalog: EngineCatalog | None = None, today: str | None = None) -> list[Report]:
    """``check_host`` on saved facts, each report with a leading ``offline`` WARN that says the host
    was not contacted, where the facts came from and what was assumed."""
    reports = check_host(host_name, settings, facts, lock=lock, services=services, allow_unpinned=allow_unpinned,
                         catalog=catalog, today=today)
    said = f"judged without connecting, from facts saved in {source}"
    if assumed_notes:
        said += "; assumed: " + "; ".join(assumed_notes)
    note = Check("offline", "warn", said, f"run `invoke preflight --host {host_name}` against the host itself "
                                          "before deploying")
    for r in reports:
        r.checks.insert(0, note)
    return reports
