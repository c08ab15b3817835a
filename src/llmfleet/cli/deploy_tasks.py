"""``invoke deploy`` and ``invoke rollback``: put releases on hosts, or go back to an earlier one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from invoke.exceptions import Exit

from llmfleet.cli import monitoring_tasks
from llmfleet.cli.common import (
    INVENTORY_HELP,
    console,
    escape,
    host_document,
    inventory_path,
    load_settings,
    log_line,
    new_table,
    print_json,
    print_timeline,
    process_age_s,
    select_hosts,
    unreachable_entry,
)
from llmfleet.cli.flags import POSITIVE, fleet_task

if TYPE_CHECKING:  # the release machinery loads only when a task runs
    from llmfleet.release.decide import HostOutcome

_STYLE = {"deployed": "green", "unchanged": "green", "check": "cyan", "rolled_back": "bold yellow",
          "failed": "bold red", "refused": "bold red"}
DEFAULT_FORKS = 5  # as Ansible's forks
VERBOSE_HELP = "print each remote command (secrets masked) with its exit status and duration, then the timeline"
TIMELINE_HELP = "print where each host's seconds went: stage by stage, with SSH round trips (on stderr)"


def never_reached(o: HostOutcome) -> bool:
    """A deploy/rollback outcome of a host that was never reached (no command ran on it)."""
    return o.result in ("failed", "refused") and not o.round_trips and not o.preflight


def outcomes_document(outcomes: list[HostOutcome]) -> dict[str, Any]:
    return host_document("hosts", [o.to_dict() for o in outcomes],
                         [unreachable_entry(o.host, o.reason) for o in outcomes if never_reached(o)])


def _summary(outcomes: list[HostOutcome], title: str) -> None:
    t = new_table("host", "result", "releases", "duration", "reason", title=title)
    for o in outcomes:
        rels = ", ".join(f"{k}={v}" for k, v in o.releases.items()) or "-"
        t.add_row(o.host, f"[{_STYLE.get(o.result, '')}]{o.result}[/]", rels, f"{o.duration_s:.1f}s",
                  escape(o.reason or ""))
    console.print(t)


@fleet_task(
    numbers={"forks": POSITIVE},
    help={
        "host": "hosts: name or Ansible --limit pattern (groups allowed, e.g. 'gpu-v100-*:!gpu-v100-02')",
        "group": "inventory group (pattern allowed)",
        "inventory": INVENTORY_HELP,
        "check": "show what would change on each host; change nothing (no lock, no audit record)",
        "diff": "print unified diffs of the rendered files against the current release (secrets masked); "
                "change nothing (no lock, no audit record)",
        "accept_new_host_keys": "record unknown SSH host keys (like OpenSSH accept-new; changed keys are refused)",
        "allow_unpinned": "allow an image given as a floating tag instead of a digest pinned in images.lock",
        "message": "why: recorded in the deploy lock and the audit log",
        "service": "deploy only this service of the host (default: every service)",
        "forks": f"hosts deployed at once (default {DEFAULT_FORKS}); each host keeps its own lock",
        "verbose": VERBOSE_HELP,
        "timeline": TIMELINE_HELP,
        "json": 'print {"hosts": [one result per host], "unreachable": [{"host", "error"}]}',
        "bundle": "deploy from a bundle folder (bundle.create), never from a registry: the bundle is verified, "
                  "each host gets the image archives it lacks (docker load, image ID checked) and the bundle's models "
                  "(models.push)",
    },
)
def deploy(c, host=None, group=None, inventory=None, check=False, diff=False, accept_new_host_keys=False,
           allow_unpinned=False, message="", service=None, forks=DEFAULT_FORKS, verbose=False, timeline=False,
           json=False, bundle=None):
    """Deploy each host's services: preflight, render, pull by digest, switch, health-check, roll back on failure.

    With --bundle DIR the images come from a bundle (bundle.create): verified, sent, loaded, never pulled.

    Exit 0 when every host is deployed or unchanged, 1 otherwise.
    """
    import time

    from llmfleet.host import early

    startup_s, t_select = process_age_s(), time.monotonic()
    settings = load_settings(c)
    source, selection = inventory_path(c, inventory), (host, group, service)
    try:
        # The connections and probes the last deploy of this selection prepared go out before the
        # inventory is even parsed, when none of its files changed since (llmfleet.host.early: a
        # guess, kept only where the prepared hosts resolve to the very same logins).
        if not bundle:  # a bundle's loads change what the hosts hold before the probes would be read
            early.recall(source, selection, settings,
                         accept_new_host_keys=bool(accept_new_host_keys), forks=forks)
        from llmfleet.bundle import apply as bundle_apply
        from llmfleet.release.prepare import DeployOptions, prepare_host

        inv, hosts = select_hosts(c, inventory, host, group)
        # every file of the bundle checked (a corrupt one stops here), no service spanning hosts
        verified = (bundle_apply.open_bundle(bundle, hosts, lambda _h: [service] if service else None)
                    if bundle else None)
        # --diff is a --check that also prints diffs: neither takes the lock or writes an audit record.
        options = DeployOptions(check=bool(check or diff), diff=bool(diff),
                                accept_new_host_keys=bool(accept_new_host_keys), allow_unpinned=bool(allow_unpinned),
                                message=message or "", services=[service] if service else None, bundle=verified)
        # Every host prepared (services, secrets, pinned images): bad input stops here, and nothing is
        # changed on any host for it. Then the hosts' connections open and their probes go out while
        # the release machinery loads (llmfleet.host.early).
        locks: dict[str, Any] = {}
        prepared = {h.name: prepare_host(inv, h.name, settings, options, lock_cache=locks) for h in hosts}
        if verified is not None and not options.check:
            prepared, not_loaded = bundle_apply.put_in_place(verified, prepared, settings, forks=forks, log=log_line,
                                                             accept_new_host_keys=options.accept_new_host_keys)
        select_s = time.monotonic() - t_select
        early.start(list(prepared.values()), settings, accept_new_host_keys=options.accept_new_host_keys, forks=forks)
        from llmfleet.release.service_ops import deploy_hosts

        outcomes = deploy_hosts(inv, [h for h in (h.name for h in hosts) if h in prepared], config=settings,
                                options=options, forks=forks, log=log_line, prepared=prepared)
        if verified is not None and not options.check:
            outcomes = not_loaded + outcomes
        early.remember(source, selection, list(prepared.values()), settings)
    finally:
        early.close_all()
    if timeline or verbose:
        for o in outcomes:
            print_timeline(o, [("process start-up (Python, imports)", startup_s),
                               ("inventory (load, select hosts, prepare)", select_s)])
    if json:
        print_json(outcomes_document(outcomes))
    else:
        for o in outcomes:
            for ch in o.changes if (check or diff) else []:
                console.print(f"{o.host}: would change: {escape(ch)}")
            for name, text in o.diffs.items():
                console.print(f"[bold]{o.host}: {escape(name)}[/]")
                console.print(escape(text), end="")
        _summary(outcomes, "deploy --diff" if diff else ("deploy --check" if check else "deploy"))
    monitoring_tasks.refresh_after(hosts, outcomes, settings)  # Prometheus follows the rollout
    if not all(o.ok for o in outcomes):
        raise Exit(code=1)


@fleet_task(
    numbers={"forks": POSITIVE},
    help={
        "host": "hosts: name or Ansible --limit pattern",
        "group": "inventory group (pattern allowed): roll back every host of it",
        "service": "roll back only this service (default: every deployed service of the host)",
        "to": "the release id to go back to (default: the newest release confirmed healthy before the current one)",
        "inventory": INVENTORY_HELP,
        "accept_new_host_keys": "record unknown SSH host keys (changed keys are refused)",
        "message": "why: recorded in the deploy lock and the audit log",
        "forks": f"hosts rolled back at once (default {DEFAULT_FORKS})",
        "verbose": VERBOSE_HELP,
        "json": 'print {"hosts": [one result per host], "unreachable": [{"host", "error"}]}',
    },
)
def rollback(c, host=None, group=None, service=None, to=None, inventory=None, accept_new_host_keys=False, message="",
             forks=DEFAULT_FORKS, verbose=False, json=False):
    """Point services back at an earlier release, restart and health-check them (one host or a group).

    Exit 0 when every host is healthy on its target release, 1 otherwise (the reason says what still answers).
    """
    from llmfleet.release.prepare import DeployOptions
    from llmfleet.release.service_ops import rollback_hosts

    inv, hosts = select_hosts(c, inventory, host, group)
    options = DeployOptions(accept_new_host_keys=bool(accept_new_host_keys),
                            message=message or f"rollback {to or ''}".strip())
    settings = load_settings(c)
    outcomes = rollback_hosts(inv, [h.name for h in hosts], service=service, to=to, config=settings,
                              options=options, forks=forks, log=log_line)
    monitoring_tasks.refresh_after(hosts, outcomes, settings)  # Prometheus follows the rollback
    if json:
        print_json(outcomes_document(outcomes))
    else:
        _summary(outcomes, "rollback")
    if not all(o.result == "rolled_back" for o in outcomes):
        raise Exit(code=1)
