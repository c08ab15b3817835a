"""Day-2 tasks on one service: ``render`` (offline), ``logs``, ``stop``, ``start``, ``remove``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from invoke.exceptions import Exit

from llmfleet.cli.common import (
    INVENTORY_HELP,
    can_ask,
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
from llmfleet.cli.deploy_tasks import VERBOSE_HELP
from llmfleet.cli.flags import LINES, POSITIVE, SECONDS, fleet_task, hints
from llmfleet.errors import CheckFailed, UsageError
from llmfleet.suggest import did_you_mean

DEFAULT_FORKS = 5
LOG_TIMEOUT = 30.0  # seconds for `logs` without -f
FOLLOW_TIMEOUT = 3600.0  # `logs -f` ends after this unless --timeout says otherwise (or Ctrl-C)
PLACEHOLDER_KEY = "********"


# ---------------------------------------------------------------------------------------------
# render


def _render_service(inv: Any, host: Any, settings: Any, svc: Any, lock: Any, conf: Any) -> dict[str, Any]:
    """What a deploy would write for one service, computed here without connecting (secrets masked). An image
    without a digest is rendered with its floating tag and marked unpinned (``pinned``: false, and a note):
    render connects nowhere, so it needs no pin; deploy still refuses it without --allow-unpinned."""
    from llmfleet.images import lock as images
    from llmfleet.knowledge import planner
    from llmfleet.release import render as render_mod
    from llmfleet.release.secret import resolve_secret

    where = f"host {host.name}: service {svc.name}"
    from llmfleet.knowledge.compat import image_engine_mismatch

    mismatch = image_engine_mismatch(svc.image, svc.engine, lock)
    if mismatch:
        raise UsageError(f"{inv.path}: {where}: {mismatch}")
    notes: list[str] = []
    ref = images.resolve(svc.image, lock, mirrors=dict(settings.image_mirrors), allow_unpinned=True, where=where)
    unpinned = images.unpinned_note(ref, lock)
    if unpinned:
        notes.append(hints(unpinned))
    plan = None
    if settings.gpu:
        try:
            count = len(svc.gpus) if isinstance(svc.gpus, list) else 1
            plan = planner.plan_for_service(svc, settings.gpu, count)
        except Exception as exc:  # noqa: BLE001 - the plan is advice here: render without its flags
            notes.append(f"no plan ({exc}); the engine flags below lack the planner's, which a deploy adds "
                         "from the host's facts")
    else:
        notes.append("llmfleet_gpu is not set: the engine flags lack the planner's, which a deploy adds from "
                     "the host's facts")
    if plan is not None:
        notes.append("planned for llmfleet_gpu from the catalog; a deploy plans with the host's gathered facts "
                     "(real card memory, model file size), so its flags can differ")
    try:
        key = resolve_secret(svc.api_key, where)
        exact = True
    except UsageError as exc:
        key, exact = (PLACEHOLDER_KEY if svc.api_key is not None else None), False
        notes.append(f"API key not readable here ({exc}); the env file shows it masked either way")
    head = None
    workers: dict[str, Any] = {}
    if svc.workers:  # a service over several hosts: the head's overlay, and each worker's release
        from llmfleet.release import cluster, multihost

        cl, wsettings, more = multihost.offline_cluster(inv, host.name, svc)
        notes += more
        role = render_mod.load_role(svc.engine)
        head = cluster.head_overlay(svc, role, cl, render_mod.plan_engine_args(plan))
        for m in cl.workers:
            ws = wsettings[m.host]
            wref = images.resolve(svc.worker_image or svc.image, lock, mirrors=dict(ws.image_mirrors),
                                  allow_unpinned=True, where=f"host {m.host}: service {svc.name}")
            wnote = images.unpinned_note(wref, lock)
            if wnote and wref.key != ref.key:
                notes.append(hints(f"worker {m.host}: {wnote}"))
            workers[m.host] = cluster.render_worker(svc, ws, wref, cl, m).masked_files()
    rendered = render_mod.render(svc, settings, ref, plan, api_key=key, head=head,
                                 **render_mod.search_paths(host.vars, inv.path, conf.search_config))
    return {
        "workers": workers,
        "service": svc.name,
        "engine": svc.engine,
        "image": ref.pull_ref,
        "pinned": ref.pinned,
        "engine_args": list(rendered.engine_args),
        "content_hash": rendered.content_hash if exact else None,
        "files": rendered.masked_files(),
        "modes": {k: oct(v) for k, v in rendered.modes.items()},
        "notes": notes,
    }


def _unpinned_line(host: str, svc: dict[str, Any]) -> str:
    """The first line for an unpinned service (console.print names the command as typed)."""
    return (f"[bold yellow]# {host}/{escape(svc['service'])}: UNPINNED image {escape(svc['image'])}[/bold yellow] "
            "(a floating tag, not a digest): deploy refuses it until `invoke images.pin` pins it, "
            "or with --allow-unpinned")


@fleet_task(
    help={
        "host": "hosts: name or Ansible --limit pattern",
        "group": "inventory group (pattern allowed)",
        "service": "only this service (default: every service of the host)",
        "out": "write the files to OUT/HOST/SERVICE/ (secrets masked) instead of printing them",
        "inventory": INVENTORY_HELP,
        "allow_unpinned": "accepted for older scripts; render always renders an image without a digest, marked "
                          "unpinned (deploy refuses it without --allow-unpinned)",
        "json": 'print {"hosts": [{"host", "services": [{service, image, engine_args, files, notes}]}]}',
    },
)
def render(c, host=None, group=None, service=None, out=None, inventory=None, allow_unpinned=False, json=False):
    """Show the compose file, systemd unit and env file a deploy would write (secrets masked); connects nowhere."""
    del allow_unpinned  # render needs no pin: an image without a digest is rendered and marked unpinned
    from llmfleet.images import lock as images
    from llmfleet.inventory.ansible import settings_for

    inv, hosts = select_hosts(c, inventory, host, group)
    conf = load_settings(c)
    docs = []
    for h in hosts:
        settings = settings_for(h)
        svcs = [s for s in settings.services if not service or s.name == service]
        if service and not svcs and len(hosts) == 1:
            known = ", ".join(s.name for s in settings.services) or "none"
            raise UsageError(f"{inv.path}: host {h.name} has no service {service!r}"
                                 f"{did_you_mean(service, [s.name for s in settings.services])} (services: {known})")
        lock = images.load_lock(images.images_lock_path(h.vars, inv.path, conf.images_lock))
        docs.append({"host": h.name, "services": [_render_service(inv, h, settings, s, lock, conf) for s in svcs]})
    if service and not any(d["services"] for d in docs):
        raise UsageError(f"{inv.path}: no selected host has service {service!r}")
    if out:
        base = Path(out).expanduser()
        for d in docs:
            for s in d["services"]:
                folder = base / d["host"] / s["service"]
                folder.mkdir(parents=True, exist_ok=True)
                for name, text in s["files"].items():
                    (folder / name).write_text(text, encoding="utf-8")
                    os.chmod(folder / name, int(s["modes"][name], 8))
                for worker, files in s["workers"].items():
                    wfolder = base / worker / s["service"]
                    wfolder.mkdir(parents=True, exist_ok=True)
                    for name, text in files.items():
                        (wfolder / name).write_text(text, encoding="utf-8")
                        os.chmod(wfolder / name, 0o600 if name == "service.env" else 0o644)
                if not json:
                    console.print(f"wrote {folder}/ ({', '.join(sorted(s['files']))})")
                    if not s["pinned"]:
                        console.print(_unpinned_line(d["host"], s))
    if json:
        print_json({"hosts": docs})
    elif not out:
        for d in docs:
            for s in d["services"]:
                if not s["pinned"]:  # said first, before the files, and again among the notes below them
                    console.print(_unpinned_line(d["host"], s))
                for name, text in s["files"].items():
                    console.print(f"[bold]# {d['host']}/{escape(s['service'])}/{escape(name)}[/bold]")
                    console.print(escape(text), end="" if text.endswith("\n") else "\n")
                for worker, files in s["workers"].items():
                    for name, text in files.items():
                        console.print(f"[bold]# {worker}/{escape(s['service'])}/{escape(name)} (worker)[/bold]")
                        console.print(escape(text), end="" if text.endswith("\n") else "\n")
                for note in s["notes"]:
                    console.print(f"[dim]# note: {escape(note)}[/dim]")
            if not d["services"]:
                console.print(f"{d['host']}: no llmfleet_services")


# ---------------------------------------------------------------------------------------------
# logs


@fleet_task(
    numbers={"n": LINES, "timeout": SECONDS},
    help={
        "host": "the host (one name)",
        "service": "the service whose engine log to show",
        "n": "lines to show (default 100; at most 10000)",
        "follow": "keep printing new lines until Ctrl-C or --timeout",
        "timeout": f"seconds allowed (default {LOG_TIMEOUT:.0f}; with --follow {FOLLOW_TIMEOUT:.0f})",
        "inventory": INVENTORY_HELP,
        "accept_new_host_keys": "record unknown SSH host keys (changed keys are refused)",
        "verbose": VERBOSE_HELP,
    },
)
def logs(c, host=None, service=None, n=100, follow=False, timeout=None, inventory=None, accept_new_host_keys=False,
         verbose=False):
    """Show a service's engine log (its journal, else the container log) through SSH; -f follows it."""
    from llmfleet.inventory.ansible import settings_for
    from llmfleet.release import service_ops

    if not host or not service:
        raise UsageError("logs: give --host NAME and --service NAME")
    _inv, hosts = select_hosts(c, inventory, host, None)
    if len(hosts) != 1:
        raise UsageError(f"logs takes one host; {host!r} matches {len(hosts)}: {', '.join(h.name for h in hosts)}")
    h = hosts[0]
    seconds = float(timeout) if timeout is not None else (FOLLOW_TIMEOUT if follow else LOG_TIMEOUT)

    def show(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    rc = service_ops.logs(h, settings_for(h), service, lines=n, follow=bool(follow), seconds=seconds,
                          config=load_settings(c), on_line=show, accept_new_host_keys=accept_new_host_keys)
    if follow and rc is None:
        log_line(f"{h.name}: stopped following after {seconds:.0f}s")


# ---------------------------------------------------------------------------------------------
# stop / start / remove


_OP_STYLE = {"stopped": "yellow", "started": "green", "removed": "green", "absent": "dim", "unchanged": "green",
             "failed": "bold red", "refused": "bold red"}


def _service_op(c, action: str, *, host, group, service, orphans, inventory, message, forks, json,
                accept_new_host_keys) -> None:
    from llmfleet.inventory.ansible import settings_for
    from llmfleet.release import service_ops

    if not service and not orphans:
        raise UsageError(f"{action}: give --service NAME" + (" (or --orphans)" if action == "remove" else ""))
    if service:
        service_ops.check_service_name(service)
    inv, hosts = select_hosts(c, inventory, host, group)
    conf = load_settings(c)
    jobs = [(h, settings_for(h)) for h in hosts]  # every host's settings valid before any connection
    msg = message or f"{action} {service or '--orphans'}"

    def one(job: tuple[Any, Any]) -> service_ops.ServiceOpResult:
        h, settings = job

        def log_host(line: str) -> None:
            log_line(f"{h.name}: {line}")

        return service_ops.service_op(h, settings, action, [service] if service else None, config=conf,
                                      orphans_only=bool(orphans), message=msg,
                                      accept_new_host_keys=accept_new_host_keys, log=log_host, inventory=inv)

    results = service_ops.run_hosts(one, jobs, forks)
    if action == "remove":  # a removed service leaves Prometheus' targets (stop and start change none)
        from llmfleet.cli.monitoring_tasks import refresh_after

        refresh_after(hosts, results, conf)
    if json:
        print_json(host_document("hosts", [r.to_dict() for r in results],
                                 [unreachable_entry(r.host, r.reason) for r in results if r.unreachable]))
    else:
        t = new_table("host", "result", "services", "reason", title=action)
        for r in results:
            svcs = ", ".join(f"{k}: {v}" for k, v in r.services.items()) or "-"
            t.add_row(r.host, f"[{_OP_STYLE.get(r.result, '')}]{r.result}[/]", escape(svcs), escape(r.reason))
        console.print(t)
    bad = [r for r in results if not r.ok]
    if bad:
        raise CheckFailed(f"{action} failed on {len(bad)} of {len(results)} host(s): "
                          + "; ".join(f"{r.host}: {r.reason}" for r in bad))


_OP_HELP = {
    "host": "hosts: name or Ansible --limit pattern",
    "group": "inventory group (pattern allowed)",
    "inventory": INVENTORY_HELP,
    "message": "why: recorded in the deploy lock and the audit log",
    "forks": f"hosts worked on at once (default {DEFAULT_FORKS})",
    "accept_new_host_keys": "record unknown SSH host keys (changed keys are refused)",
    "verbose": VERBOSE_HELP,
    "json": 'print {"hosts": [{host, action, result, services, reason}], "unreachable": [{"host", "error"}]}',
}


@fleet_task(numbers={"forks": POSITIVE}, help=_OP_HELP | {"service": "the service to stop"})
def stop(c, host=None, group=None, service=None, inventory=None, message="", forks=DEFAULT_FORKS,
         accept_new_host_keys=False, verbose=False, json=False):
    """Stop a service (unit stopped and disabled at boot; its releases stay; `start` or a deploy brings it back). Audited."""
    _service_op(c, "stop", host=host, group=group, service=service, orphans=False, inventory=inventory,
                message=message, forks=forks, json=json, accept_new_host_keys=accept_new_host_keys)


@fleet_task(numbers={"forks": POSITIVE}, help=_OP_HELP | {"service": "the service to start"})
def start(c, host=None, group=None, service=None, inventory=None, message="", forks=DEFAULT_FORKS,
          accept_new_host_keys=False, verbose=False, json=False):
    """Start a stopped service on its current release (unit enabled again) and health-check it. Audited."""
    _service_op(c, "start", host=host, group=group, service=service, orphans=False, inventory=inventory,
                message=message, forks=forks, json=json, accept_new_host_keys=accept_new_host_keys)


@fleet_task(
    numbers={"forks": POSITIVE},
    help=_OP_HELP | {
        "service": "the service to remove (one the inventory no longer lists, or any: a deploy brings it back)",
        "orphans": "remove every service on the host that the inventory no longer lists for it",
        "yes": "remove without asking (required when not on a terminal)",
    },
)
def remove(c, host=None, group=None, service=None, orphans=False, inventory=None, message="", yes=False,
           forks=DEFAULT_FORKS, accept_new_host_keys=False, verbose=False, json=False):
    """Remove a service from hosts: unit, containers, releases and the images only it used. Audited."""
    if service and orphans:
        raise UsageError("remove: give --service NAME or --orphans, not both")
    if not yes:
        what = f"service {service}" if service else "every orphaned service"
        where = host or group or "?"
        if not can_ask():
            raise UsageError(f"remove: pass --yes to remove {what} from {where} (no terminal to ask on)")
        answer = input(f"Remove {what} from {where}: unit, containers, releases and images only it uses? [y/N] ")
        if answer.strip().lower() not in {"y", "yes"}:
            raise Exit("not removed", code=1)
    _service_op(c, "remove", host=host, group=group, service=service, orphans=orphans, inventory=inventory,
                message=message, forks=forks, json=json, accept_new_host_keys=accept_new_host_keys)



