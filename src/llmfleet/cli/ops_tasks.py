"""Day-2 tasks: ``status``, ``releases``, ``audit`` and ``upgrade`` (rolling fleet upgrades)."""

from __future__ import annotations

from typing import Any

from llmfleet.cli import monitoring_tasks
from llmfleet.cli.common import (
    INVENTORY_HELP,
    console,
    escape,
    host_document,
    load_settings,
    log_line,
    new_table,
    print_json,
    select_hosts,
    unreachable_entry,
)
from llmfleet.cli.flags import LINES, PERCENT, POSITIVE, SECONDS, SECONDS_OR_ZERO, fleet_task, hints
from llmfleet.errors import CheckFailed, UsageError

DEFAULT_FORKS = 10
DEFAULT_TIMEOUT = 20
VERBOSE_HELP = "print each remote command (secrets masked) with its exit status and duration"



# ---------------------------------------------------------------------------------------------
# status


def _model_cell(label: str) -> str:
    if label.startswith("verified"):
        return f"[green]{escape(label)}[/green]"
    return f"[red]{escape(label)}[/red]" if label in ("CHANGED", "MISSING") else escape(label)


@fleet_task(
    numbers={"forks": POSITIVE, "timeout": SECONDS},
    help={
        "host": "hosts to query (Ansible pattern, e.g. 'gpu-v100-*')",
        "group": "groups to query (Ansible pattern)",
        "inventory": INVENTORY_HELP,
        "json": 'print {"rows": [one per service], "orphans": [...], "unreachable": [{"host", "error"}], '
                '"gateway_replicas": [one per replica at each gateway], "gateway_errors": [{"host", "gateway", "error"}]}',
        "forks": f"hosts queried at once (default {DEFAULT_FORKS})",
        "timeout": f"seconds allowed per host for SSH connect and each command (default {DEFAULT_TIMEOUT})",
        "no_metrics": "skip the live /metrics read (faster; release, unit and health only)",
        "verbose": VERBOSE_HELP,
    },
)
def status(c, host=None, group=None, inventory=None, json=False, forks=DEFAULT_FORKS, timeout=DEFAULT_TIMEOUT,
           no_metrics=False, verbose=False):
    """Per service: card, release, image digest, unit, health, tok/s, live metrics; services no longer in the inventory;
    each replica's state at each gateway (in rotation, draining, out, and why)."""
    from llmfleet.fleet import status as status_mod
    from llmfleet.inventory.ansible import settings_for
    from llmfleet.release import multihost as mh

    inv, hosts = select_hosts(c, inventory, host, group)
    # services over several hosts that a selected host is the head or a worker of: every host of them
    # is read, so that the head's row carries each worker's state
    split = []
    for head, svc_name in mh.services_of_hosts(inv, [h.name for h in hosts]):
        svc = next(s for s in settings_for(inv.hosts[head]).services if s.name == svc_name)
        split.append((head, svc_name, mh.workers_of(inv, head, svc)))
    more = sorted({n for head, _s, ws in split for n in (head, *ws)} - {h.name for h in hosts})
    hosts = list(hosts) + [inv.hosts[n] for n in more]
    results = status_mod.query_hosts(hosts, config=load_settings(c), forks=forks, timeout=timeout,
                                     metrics=not no_metrics)
    rows = [r for st, settings in results for r in status_mod.host_rows(st, settings)]
    status_mod.cluster_rows(rows, {st.host: st for st, _ in results}, split)
    gw_rows: list[Any] = []
    gw_problems: list[Any] = []
    for st, settings in results:
        g_rows, g_problems = status_mod.gateway_rows(
            st, settings, status_mod.expected_replicas(inv, inv.hosts[st.host], settings))
        gw_rows += g_rows
        gw_problems += g_problems
    status_mod.gateway_notes(rows, gw_rows, gw_problems)
    unreachable = [unreachable_entry(st.host, st.error or "no answer") for st, _ in results if not st.reachable]
    worker_of = {(w, svc) for _head, svc, ws in split for w in ws}
    orphans = [
        {"host": st.host, "service": name, "release": st.states[name].current, "unit": st.states[name].unit}
        for st, settings in results if st.reachable
        for name in sorted(st.states) if name not in {s.name for s in (settings.services if settings else [])}
        and (st.host, name) not in worker_of
    ]
    if json:
        print_json({"rows": [r.to_dict() for r in rows], "orphans": orphans, "unreachable": unreachable,
                    "gateway_replicas": [g.to_dict() for g in gw_rows],
                    "gateway_errors": [p.to_dict() for p in gw_problems]})
    else:
        table = new_table("host", "card", "service", "release", "digest", "unit", "health", title="fleet status")
        for col in ("tok/s", "run", "wait", "KV", "gen tok"):
            table.add_column(col, justify="right")
        table.add_column("model")
        table.add_column("note")
        for r in rows:
            unit = r.unit
            if unit == "unreachable":
                unit = "[red]unreachable[/red]"
            elif unit == "active":
                unit = "[green]active[/green]"
            health = {"healthy": "[green]healthy[/green]", "unhealthy": "[red]unhealthy[/red]",
                      "unconfirmed": "[yellow]unconfirmed[/yellow]", "hung": "[red]hung[/red]",
                      "down": "[red]down[/red]"}.get(r.health, r.health)
            run_, wait_, kv, gen = status_mod.fmt_metrics(r.metrics)
            table.add_row(
                r.host, escape(r.card), r.service, r.release or "-", status_mod.short_digest(r.digest), unit, health,
                status_mod.fmt_tokps(r.tokps), run_, wait_, kv, gen, _model_cell(status_mod.model_label(r.model)),
                escape(r.note),
            )
        console.print(table)
        _print_gateways(gw_rows, gw_problems)
        for o in orphans:
            console.print(hints(f"[yellow]orphan[/yellow]: {o['host']}/{escape(o['service'])} runs there but is no "
                                f"longer in the inventory; remove it with `invoke remove --host {o['host']} "
                                f"--service {o['service']}`"))
        if unreachable:
            console.print(f"[red]{len(unreachable)} host(s) unreachable[/red]: "
                          + ", ".join(u["host"] for u in unreachable))
    if unreachable:
        # one host: its reason too (the table may be cut, or not read); many: the table says each
        one = unreachable[0]
        why = "" if len(unreachable) > 1 else " (" + one["error"].removeprefix("host " + one["host"] + ": ") + ")"
        raise CheckFailed(f"{len(unreachable)} of {len(results)} host(s) unreachable: "
                          + ", ".join(u["host"] for u in unreachable) + why)


_GATEWAY_STATE_STYLE = {"in rotation": "green", "draining": "yellow"}


def _print_gateways(gw_rows: list[Any], problems: list[Any]) -> None:
    """Each replica's state at each gateway (a table), then one line per gateway whose runtime API gave nothing."""
    if gw_rows:
        table = new_table("gateway", "backend", "server", "replica", "status", title="replicas at the gateways")
        table.add_column("sessions", justify="right")
        table.add_column("state")
        table.add_column("why")
        for g in gw_rows:
            style = _GATEWAY_STATE_STYLE.get(g.state, "red")
            table.add_row(f"{g.host}/{escape(g.gateway)}", escape(g.backend), escape(g.server), escape(g.replica or "-"),
                          escape(g.status), "-" if g.sessions is None else str(g.sessions),
                          f"[{style}]{escape(g.state)}[/{style}]", escape(g.why))
        console.print(table)
    for p in problems:
        console.print(f"[red]gateway {p.host}/{escape(p.gateway)}[/red]: {escape(p.error)}")


# ---------------------------------------------------------------------------------------------
# releases


@fleet_task(
    numbers={"timeout": SECONDS},
    help={
        "host": "host (or Ansible pattern) whose kept releases to list",
        "inventory": INVENTORY_HELP,
        "json": 'print {"releases": [...], "unreachable": [{"host", "error"}]}',
        "timeout": f"seconds allowed for SSH connect and the command (default {DEFAULT_TIMEOUT})",
        "verbose": VERBOSE_HELP,
    },
)
def releases(c, host=None, inventory=None, json=False, timeout=DEFAULT_TIMEOUT, verbose=False):
    """List the releases kept on a host: id, time, image digest, health, who (current one marked).

    Health ``unconfirmed``: a deploy switched to the release and never confirmed it healthy (killed or
    cut off after the switch); ``(go back)`` marks the release a failed deploy would go back to now,
    the last one confirmed healthy.
    """
    from llmfleet.fleet import status as status_mod

    if not host:
        raise UsageError("releases: choose the host with --host NAME")
    _inv, hosts = select_hosts(c, inventory, host, None)
    results = status_mod.query_hosts(hosts, config=load_settings(c), forks=DEFAULT_FORKS, timeout=timeout,
                                     metrics=False)
    rows = [r for st, _ in results if st.reachable for r in status_mod.release_rows(st.host, st.states)]
    unreachable = [unreachable_entry(st.host, st.error or "no answer") for st, _ in results if not st.reachable]
    if json:
        print_json(host_document("releases", [r.to_dict() for r in rows], unreachable))
    else:
        table = new_table("host", "service", "release", "time", "digest", "health", "tok/s", "who", "message",
                          title=f"releases on {host}")
        for r in rows:
            rid = f"[bold]{r.release}[/bold] (current)" if r.current else r.release
            if r.go_back:
                rid += " (go back)"
            health = {"healthy": "[green]healthy[/green]", "unhealthy": "[red]unhealthy[/red]",
                      "unconfirmed": "[yellow]unconfirmed[/yellow]"}.get(r.health, r.health)
            table.add_row(r.host, r.service, rid, r.time, status_mod.short_digest(r.digest), health,
                          status_mod.fmt_tokps(r.tokps), escape(r.who or "-"), escape(r.message or ""))
        console.print(table)
        if not rows and not unreachable:
            console.print("no releases on the selected host(s)")
    if unreachable:
        raise CheckFailed("; ".join(f"{u['host']}: unreachable: {u['error']}" for u in unreachable))


# ---------------------------------------------------------------------------------------------
# audit


@fleet_task(
    numbers={"n": LINES, "timeout": SECONDS},
    help={
        "host": "read the audit log on these hosts (Ansible pattern); without it, the local log",
        "group": "read the audit log on the hosts of these groups",
        "n": "how many of the latest records to show (default 50)",
        "inventory": INVENTORY_HELP,
        "json": 'print {"records": [...], "unreachable": [{"host", "error"}]}',
        "timeout": f"seconds allowed per host (default {DEFAULT_TIMEOUT})",
        "verbose": VERBOSE_HELP,
    },
)
def audit(c, host=None, group=None, n=50, inventory=None, json=False, timeout=DEFAULT_TIMEOUT, verbose=False):
    """Show the audit trail: deploys, rollbacks, stops, removals, lock breaks, upgrades (hosts or the local log)."""
    from llmfleet.release import audit as audit_mod

    unreachable: list[dict[str, str]] = []
    if host or group:
        _inv, hosts = select_hosts(c, inventory, host, group)
        records = _remote_audit(c, hosts, n, timeout, unreachable)
        source = ", ".join(h.name for h in hosts)
    else:
        path = load_settings(c).audit_log
        records = audit_mod.read_local(path, n)
        source = f"local log {path}"
    if json:
        print_json(host_document("records", records, unreachable))
    else:
        table = new_table(*("digest" if col == "image_digest" else col for col in audit_mod.COLUMNS),
                          title=f"audit: {source}")
        for rec in records:
            table.add_row(*(escape(x) for x in audit_mod.row(rec)))
        console.print(table)
    if unreachable:
        raise CheckFailed("; ".join(f"{u['host']}: unreachable: {u['error']}" for u in unreachable))


def _remote_audit(c, hosts: list[Any], n: int, timeout: float, unreachable: list[dict[str, str]]) -> list[dict]:
    from llmfleet.host.group import run_on_hosts
    from llmfleet.host.ssh import connect
    from llmfleet.inventory.ansible import settings_for
    from llmfleet.release import audit as audit_mod

    config = load_settings(c).ssh.bounded(timeout)
    roots = {h.name: settings_for(h).root for h in hosts}

    def one(h: Any) -> list[dict]:
        with connect(h, config=config) as remote:
            res = remote.run(audit_mod.tail_script(roots[h.name], n), sudo=True, check=True)
        recs = audit_mod.parse_lines(res.stdout)
        for r in recs:
            r.setdefault("host", h.name)
        return recs

    out: list[dict] = []
    for r in run_on_hosts(one, hosts, forks=DEFAULT_FORKS, timeout=timeout * 2 + 5):
        if r.ok:
            out.extend(r.value or [])
        else:  # the host's own words (RemoteError: ...), without the exception's class name
            unreachable.append(unreachable_entry(r.host.name, (r.error or "").split(": ", 1)[-1]))
    return audit_mod.merged(out, n)


# ---------------------------------------------------------------------------------------------
# upgrade


@fleet_task(
    iterable=["image", "set_"],
    numbers={"forks": POSITIVE, "pause": SECONDS_OR_ZERO, "max_fail_percentage": PERCENT, "bench_gate": PERCENT},
    help={
        "group": "hosts to upgrade (Ansible group pattern), e.g. lab_fleet",
        "host": "further limit to these hosts (Ansible pattern)",
        "image": "ENGINE=VERSION: new image key for that engine's services (repeatable), e.g. llamacpp=b6123",
        "set_": "key=value: set a service field on every service (repeatable), e.g. context=8192",
        "serial": "batch sizes, Ansible's serial: '1,25%,100%' = a canary host, quarter fleets, then the rest "
                  "(default: all hosts in one batch)",
        "max_fail_percentage": "abort when a batch's failed share exceeds this (default: only when a whole "
                               "batch fails)",
        "forks": "hosts deployed at once inside a batch (default 5)",
        "pause": "seconds to wait between batches (default 0)",
        "rollback_on_abort": "on abort, roll the already upgraded hosts back to their previous release",
        "check": "show the batches and each host's changes; touch nothing",
        "json": 'print the summary as JSON (one object: batches, hosts, counts, "unreachable": [{"host", "error"}])',
        "json_lines": "print one JSON line per host as it finishes (its result), then one line with the summary "
                      "(for large fleets: a live progress line per batch on stderr instead of every host's steps)",
        "inventory": INVENTORY_HELP,
        "message": "a note kept in each release's manifest and the audit log",
        "accept_new_host_keys": "record unknown SSH host keys (as OpenSSH accept-new); changed keys still refused",
        "allow_unpinned": "allow images that images.lock does not pin (not for production)",
        "verbose": VERBOSE_HELP,
        "bench_gate": "PCT: bench each host before and after its deploy; a new release that decodes more than "
                      "PCT% slower is rolled back and fails the host (docs/bench.md)",
        "bundle": "upgrade from a bundle folder (bundle.create), never from a registry: the bundle is verified "
                  "before any host is touched; each batch's hosts get the image archives they lack (docker load, "
                  "image ID checked) and the bundle's models before they deploy (docs/bundle.md)",
    },
)
def upgrade(c, group=None, host=None, inventory=None, image=None, set_=None, serial=None, max_fail_percentage=None,
            forks=5, pause=0.0, rollback_on_abort=False, check=False, json=False, message="",
            accept_new_host_keys=False, allow_unpinned=False, verbose=False, json_lines=False,
            bench_gate=None, bundle=None):
    """Rolling upgrade of a group: full deploy per host in serial batches, abort on max-fail-percentage."""
    from datetime import UTC, datetime

    from llmfleet.fleet import upgrade as upgrade_mod
    from llmfleet.fleet.rollout import parse_serial
    from llmfleet.inventory.ansible import settings_for
    from llmfleet.release import audit as audit_mod
    from llmfleet.release import store as rel
    from llmfleet.release.prepare import DeployOptions

    if not group:
        raise UsageError("upgrade: choose the hosts with --group NAME (and optionally --host PATTERN)")
    images = upgrade_mod.parse_image(image or [])
    sets = upgrade_mod.parse_sets(set_ or [])
    if "image" in sets and images:
        raise UsageError("give the image either with --image ENGINE=VERSION or with --set image=..., not both")
    serial_list = parse_serial(serial)
    mfp = max_fail_percentage
    inv, hosts = select_hosts(c, inventory, host, group)
    changes: dict[str, Any] = {}
    excluded: dict[str, str] = {}
    for h in hosts:
        got = upgrade_mod.host_overrides(settings_for(h).services, images, sets)
        if isinstance(got, str):
            excluded[h.name] = got
        else:
            changes[h.name] = got
    names = [h.name for h in hosts if h.name in changes]
    if not names:
        raise UsageError("upgrade: no selected host runs the engine to upgrade: " +
                         "; ".join(f"{k}: {v}" for k, v in excluded.items()))

    config = load_settings(c)
    from llmfleet.release.who import default_who

    who = default_who()
    msg = message or (f"upgrade --group {group}" + "".join(f" --image {v}" for v in images.values())
                      + (f" --bundle {bundle}" if bundle else ""))
    verified = None
    if bundle:  # as deploy --bundle: every file checked and no service spanning hosts, before any host is touched
        from llmfleet.bundle import apply as bundle_apply

        verified = bundle_apply.open_bundle(bundle, [h for h in hosts if h.name in changes],
                                            lambda n: changes[n].services, task="upgrade")
    options = DeployOptions(check=bool(check), accept_new_host_keys=bool(accept_new_host_keys),
                            allow_unpinned=bool(allow_unpinned), message=msg, who=who, bundle=verified)
    # a service over several hosts is one rollout unit with its workers (counted once in its batch)
    from llmfleet.release import multihost as mh

    own: dict[str, bool] = {}
    multi: list[tuple[str, str, list[str]]] = []
    for n in names:
        ch = changes[n]
        wanted = [s for s in settings_for(inv.hosts[n]).services if ch.services is None or s.name in ch.services]
        own[n] = any(not s.workers for s in wanted)
        multi += [(n, s.name, mh.workers_of(inv, n, s)) for s in wanted if s.workers]
    units = upgrade_mod.rollout_units(names, own, multi)
    in_units = {h for u in units for h in u.hosts}
    for n in names:
        if n not in in_units:
            excluded[n] = "no service of its own to deploy"
    for h in in_units:
        excluded.pop(h, None)
    if not units:
        raise UsageError("upgrade: no selected host has a service to deploy: " +
                         "; ".join(f"{k}: {v}" for k, v in excluded.items()))
    # every host's deploy prepared (overrides, secrets, pinned images; with --bundle each image localized:
    # the bundle's images.lock, the image in the bundle) before any host is touched
    prepared = upgrade_mod.prepare(inv, [h for u in units for h in u.singles], changes, config=config, options=options)
    prepared_services = {(h, svc): mh.prepare_service(inv, h, svc, config, upgrade_mod._host_options(
        options, changes[h])) for u in units for h, svc in u.services}
    log = log_line
    for name, why in excluded.items():
        log(f"{name}: not part of this upgrade: {why}")
    # --json-lines: a live line per batch on stderr stands for the hosts' steps (-v shows them too)
    host_log = log if (verbose or not json_lines) else (lambda line: None)
    run_log = log if (verbose or not json_lines) else (
        lambda line: log(line) if line.startswith(("ABORT", "STOP", "rolling back", "pausing")) else None)
    deploy_one = upgrade_mod.deploy_fn(inv, config=config, options=options, changes=changes, log=host_log,
                                       prepared=prepared, bench_gate=bench_gate, bench_dir=config.bench_dir)
    deploy_unit = upgrade_mod.unit_deploy_fn(inv, units, host_deploy=deploy_one, config=config, options=options,
                                             changes=changes, log=host_log, prepared_services=prepared_services)
    unreachable: list[dict[str, str]] = []

    from llmfleet.cli.deploy_tasks import never_reached

    def deploy(name: str) -> Any:
        outcome = deploy_unit(name)
        if not isinstance(outcome, upgrade_mod.UnitOutcome) and never_reached(outcome):
            unreachable.append(unreachable_entry(outcome.host, outcome.reason))
        return outcome

    def put_batch(batch: list[str]) -> dict[str, Any]:
        """This batch's hosts get the bundle's images and models (as deploy --bundle) before they deploy."""
        from llmfleet.bundle import apply as bundle_apply

        if verified is None:
            return {}
        keep = {h: prepared[h] for u in units if u.key in batch for h in u.singles}
        _ready, not_ready = bundle_apply.put_in_place(verified, keep, config, forks=forks, log=host_log,
                                                      accept_new_host_keys=options.accept_new_host_keys,
                                                      task="upgrade")
        for o in not_ready:
            if never_reached(o):
                unreachable.append(unreachable_entry(o.host, o.reason))
        return {o.host: o for o in not_ready}

    rollback = (upgrade_mod.unit_rollback_fn(inv, units, config=config, options=options, log=log)
                if rollback_on_abort else None)
    progress, on_host = None, None
    if json_lines:
        import json as json_mod
        import sys
        import threading

        from llmfleet.fleet.progress import LiveLine

        progress = LiveLine(sys.stderr.write, terminal=sys.stderr.isatty())
        out_lock = threading.Lock()

        def on_host(res: Any) -> None:
            with out_lock:
                sys.stdout.write(json_mod.dumps(res.to_dict(), separators=(",", ":"), default=str) + "\n")
                sys.stdout.flush()

    report = upgrade_mod.run_upgrade(
        [u.key for u in units], deploy=deploy, members={u.key: list(u.hosts) for u in units if len(u.hosts) > 1}, serial=serial_list, max_fail_percentage=mfp, forks=forks, pause=pause,
        rollback_on_abort=bool(rollback_on_abort), rollback=rollback, check=bool(check), log=run_log,
        progress=progress, on_host=on_host, before_batch=put_batch if verified is not None else None,
    )
    report.excluded = excluded
    if not check:
        monitoring_tasks.refresh_after(hosts, report.hosts, config)  # Prometheus follows the upgrade
    if not check:
        record = rel.audit_record(
            now=datetime.now(UTC), who=who, host=f"group:{group}", action="upgrade", service=None, release=None,
            digest=None, result="ok" if report.ok else ("aborted" if report.aborted else "failed"),
            detail=(report.abort_reason or msg), counts=report.counts(),
        )
        try:
            audit_mod.append_local(config.audit_log, record)
        except OSError as exc:
            log(f"warning: local audit log not written: {exc}")
    if json_lines:
        import json as json_mod

        summary = {k: v for k, v in report.to_dict().items() if k != "hosts"}
        print(json_mod.dumps(summary | {"summary": True, "unreachable": unreachable}, separators=(",", ":")),
              flush=True)
    elif json:
        print_json(report.to_dict() | {"unreachable": unreachable})
    else:
        _print_upgrade(report)
    if not report.ok:
        if report.aborted:
            raise CheckFailed(f"upgrade aborted: {report.abort_reason}")
        failed = [h.host for h in report.hosts if h.failed]
        raise CheckFailed(f"upgrade finished with {len(failed)} failed host(s): {', '.join(failed)}")


def _changes_text(changes: Any) -> str:
    if not changes:
        return "no change"
    if isinstance(changes, dict):
        return "; ".join(f"{k}: {_changes_text(v)}" for k, v in changes.items())
    if isinstance(changes, list | tuple):
        return ", ".join(str(x) for x in changes)
    return str(changes)


def _print_upgrade(report: Any) -> None:
    title = "upgrade check (nothing changed)" if report.check else "upgrade summary"
    table = new_table("host", "batch", "result", "release", "duration", "changes" if report.check else "reason",
                      title=title)
    colours = {"deployed": "green", "unchanged": "green", "check": "cyan", "skipped": "yellow"}
    for h in report.hosts:
        colour = colours.get(h.result, "red")
        rels = ", ".join(f"{k}={v}" for k, v in sorted(h.releases.items())) or "-"
        last = _changes_text(h.changes) if report.check else h.reason
        table.add_row(h.host + (f" (+{', '.join(x for x in h.hosts if x != h.host)})" if h.hosts else ""), str(h.batch), f"[{colour}]{h.result}[/{colour}]", rels,
                      f"{h.duration_s:.1f}s" if h.result != "skipped" else "-", escape(last or ""))
    console.print(table)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(report.counts().items()))
    state = "[red]ABORTED[/red]: " + escape(report.abort_reason) if report.aborted else (
        "[green]ok[/green]" if report.ok else "[red]failed[/red]")
    console.print(f"{state}; {counts}; {len(report.batches)} batch(es) in {report.duration_s:.1f}s")
    for name, why in report.excluded.items():
        console.print(f"not upgraded: {name}: {escape(why)}")
