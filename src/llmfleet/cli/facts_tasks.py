"""``invoke facts`` and ``invoke preflight``: what a host is, and whether its services can run there."""

from __future__ import annotations

from invoke.exceptions import Exit

from llmfleet.cli.common import (
    INVENTORY_HELP,
    cfg,
    console,
    escape,
    host_document,
    load_settings,
    print_json,
    select_hosts,
    unreachable_entry,
)
from llmfleet.cli.flags import fleet_task, hints
from llmfleet.errors import RemoteError, UsageError
from llmfleet.suggest import did_you_mean

VERBOSE_HELP = "print each remote command (secrets masked) with its exit status and duration"

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}
# Hosts probed at once (one SSH connection each); results are printed in inventory order.
PARALLEL_HOSTS = 8


def _each(fn, items: list) -> list:
    """fn over items on a few hosts at once, results in the items' order (an exception is raised as it was)."""
    from llmfleet.host.group import run_on_hosts

    out = []
    for r in run_on_hosts(fn, items, forks=PARALLEL_HOSTS):
        if r.exception is not None:
            raise r.exception
        out.append(r.value)
    return out


@fleet_task(
    help={
        "host": "host name or pattern (Ansible --limit syntax, e.g. 'gpu-v100-*')",
        "group": "inventory group (pattern allowed)",
        "inventory": INVENTORY_HELP,
        "json": 'print {"hosts": [facts per host], "unreachable": [{"host", "error"}]}',
        "accept_new_host_keys": "record unknown SSH host keys (changed keys are still refused)",
        "out": "also write the JSON to FILE (what `invoke preflight --facts FILE` reads)",
        "verbose": VERBOSE_HELP,
    },
)
def facts(c, host=None, group=None, inventory=None, json=False, accept_new_host_keys=False, out=None,
          verbose=False):
    """Gather a host's facts in one SSH round trip: GPUs, driver, CUDA, Docker, toolkit, disk, ports."""
    from llmfleet.host import facts as facts_mod
    from llmfleet.host import ssh
    from llmfleet.inventory.ansible import settings_for

    inv, hosts = select_hosts(c, inventory, host, group)
    jobs = [(h, settings_for(h)) for h in hosts]  # every host's settings valid before any connection

    def probe(job):
        h, settings = job
        try:
            with ssh.connect(h, config=load_settings(c), accept_new_host_keys=accept_new_host_keys) as remote:
                return facts_mod.gather(remote, root=settings.root,
                                        model_paths=[s.model_path for s in settings.services])
        except RemoteError as exc:
            return exc

    rows: list[dict] = []
    unreachable: list[dict[str, str]] = []
    for (h, _), found in zip(jobs, _each(probe, jobs), strict=True):
        if isinstance(found, RemoteError):
            unreachable.append(unreachable_entry(h.name, str(found)))
            if not json:
                console.print(f"[bold red]{escape(h.name)}[/]: {escape(str(found))}")
            continue
        rows.append(found.model_dump(mode="json"))
        if not json:
            _print_facts(found)
    if json:
        print_json(host_document("hosts", rows, unreachable))
    if out:
        import json as _json
        from pathlib import Path

        try:
            Path(out).write_text(_json.dumps(host_document("hosts", rows, unreachable), indent=2) + "\n",
                                 encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{out}: cannot write the facts: {exc.strerror}") from None
        if not json:
            console.print(f"facts written to {escape(str(out))}")
    if unreachable:
        raise Exit(code=1)


def facts_rows(f) -> list[tuple[str, str]]:
    """(what, value) rows of the facts table; values are host output, shown as plain text."""
    rows: list[tuple[str, str]] = []
    for g in f.gpus:
        mem = f"{g.memory_total_mib} MiB" if g.memory_total_mib is not None else "? MiB"
        used = f", {g.memory_used_mib} MiB used" if g.memory_used_mib is not None else ""
        cc = f"CC {g.compute_capability or '?'} ({g.compute_capability_source or 'unknown'})"
        dc = {True: "data-center", False: "not data-center", None: "not in catalog"}[g.data_center]
        rows.append((f"GPU {g.index}", f"{g.name}, {mem}{used}, {cc}, {dc}"))
    if not f.gpus:
        rows.append(("GPUs", "none seen"))
    if len(f.gpus) > 1 or f.gpu_topology:
        from llmfleet.knowledge.preflight import parse_topology

        links = parse_topology(f.gpu_topology)
        pairs = [f"GPU{i}-GPU{j} {k}" for (i, j), k in sorted(links.items()) if i < j]
        rows.append(("GPU links", ("; ".join(pairs[:12]) + (f"; {len(pairs) - 12} more" if len(pairs) > 12 else ""))
                     if pairs else ("one GPU" if f.gpu_topology else "unknown (no `nvidia-smi topo -m`)")))
    rows.extend(gpu_health_rows(f))
    rows.append(("driver", f"{f.driver_version or '-'} (CUDA {f.cuda_driver_version or '?'}"
                 + (f" from {f.cuda_driver_source}" if f.cuda_driver_source else "") + ")"))
    d = f.docker
    rows.append(("docker", f"{d.server_version or '-'}; runtimes {', '.join(d.runtimes) or '-'}; "
                 f"default {d.default_runtime or '-'}" + (f"; {d.error}" if d.error else "")))
    tk = f.toolkit
    rows.append(("nvidia toolkit", f"ctk {tk.version or '-'}, libnvidia-container {tk.cli_version or '-'}, "
                 f"hook {'yes' if tk.hook_path else 'no'}, CDI {', '.join(tk.cdi_kinds) or '-'}"))
    rows.append(("compose", f"v2 {f.compose.v2 or '-'}, v1 {f.compose.v1 or '-'}"))
    for disk in f.disks:
        rows.append((f"disk {disk.label}", f"{disk.path}: {disk.free_mib} MiB free of {disk.total_mib} MiB "
                     f"({disk.mount or '?'})"))
    rows.append(("RAM", f"{f.ram_total_mib or '?'} MiB, {f.ram_available_mib or '?'} MiB available"))
    rows.append(("kernel", f"{f.kernel or '?'} {f.machine or ''}; systemd {'yes' if f.systemd else 'no'}"))
    rows.append(("releases", ", ".join(f"{r.name}={r.current or '-'}" for r in f.releases.values()) or "-"))
    rows.append(("ports", " ".join(map(str, f.ports)) or "-"))
    for m in f.models:
        rows.append(("model", f"{m.path}: {m.kind}" + (f", {m.size_bytes} bytes" if m.size_bytes is not None else "")))
    rows.extend(("problem", e) for e in f.errors)
    return rows


def gpu_health_rows(f) -> list[tuple[str, str]]:
    """The cards' hardware health: one row per condition (knowledge.gpu_health), else what was read."""
    from llmfleet.knowledge.gpu_health import findings

    h = f.gpu_health
    if h is None:
        return []
    found = findings(h)
    rows = [("GPU health", f"{x.where}: {x.what} ({x.severity if x.severity != 'app' else 'application-level'})")
            for x in found]
    if not [x for x in found if x.severity != "app"]:
        read = [f"nvidia-smi -q: {len(h.cards)} card(s), no condition"]
        read.append(f"kernel log ({h.xid_source}): {h.xid_lines} Xid line(s) since boot" if h.xid_source
                    else "kernel log not read")
        if h.pci_source:
            read.append(f"PCI bus ({h.pci_source}): {len(h.pci_gpus)} NVIDIA card(s)")
        rows.append(("GPU health", "; ".join(read)))
    rows.extend(("GPU health", n) for n in h.notes)
    return rows


def _print_facts(f) -> None:
    from rich.table import Table

    t = Table(title=escape(f"facts {f.host}"), show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", overflow="fold")
    for what, value in facts_rows(f):
        t.add_row(f"[yellow]{what}[/]" if what == "problem" else escape(what), escape(value))
    console.print(t)


@fleet_task(
    help={
        "host": "host name or pattern (Ansible --limit syntax)",
        "group": "inventory group (pattern allowed)",
        "service": "check only this service (default: every service of the host)",
        "inventory": INVENTORY_HELP,
        "json": 'print {"reports": [{host, service, ok, checks} per service], "unreachable": [{"host", "error"}]}',
        "allow_unpinned": "judge a floating image tag instead of failing the image check",
        "accept_new_host_keys": "record unknown SSH host keys (changed keys are still refused)",
        "facts": "judge from facts saved with `invoke facts --host H --json > FILE`, without connecting "
                 "(needs --host naming one host)",
        "assume": "with --facts: assume KEY=VALUE instead of what was saved (repeatable): driver=550.127.05, "
                  "cuda=12.8, toolkit=1.17.8, default_runtime=nvidia",
        "verbose": VERBOSE_HELP,
    },
    iterable=["assume"],
)
def preflight(c, host=None, group=None, service=None, inventory=None, json=False, allow_unpinned=False,
              accept_new_host_keys=False, facts=None, assume=None, verbose=False):
    """Check that each service can run on its host (image vs driver and card, plan, runtime, disk, port).

    With --facts FILE the host is not contacted: the checks run on saved facts, with --assume values
    in place ("would this image still run after the planned driver upgrade?"). Exit 1 when any check
    fails.
    """
    from llmfleet.images import lock as images
    from llmfleet.inventory.ansible import settings_for
    from llmfleet.release.preflight import preflight_host

    if assume and not facts:
        raise UsageError("--assume needs --facts FILE (assumptions apply to saved facts; a live preflight "
                         "judges what the host has)")
    if facts:
        return _preflight_saved(c, host, group, service, inventory, json, allow_unpinned, facts, assume or [])
    inv, hosts = select_hosts(c, inventory, host, group)
    selected = []
    for h in hosts:
        settings = settings_for(h)
        svcs = settings.services
        if service:
            svcs = [s for s in settings.services if s.name == service]
            if not svcs and len(hosts) == 1:
                known = ", ".join(s.name for s in settings.services) or "none"
                raise UsageError(f"{inv.path}: host {h.name} has no service {service!r}"
                                 f"{did_you_mean(service, [s.name for s in settings.services])} (services: {known})")
            if not svcs:
                continue
        lock = images.load_lock(images.images_lock_path(h.vars, inv.path, cfg(c, "images_lock")))
        selected.append((h, settings, svcs, lock))
    if not selected:
        raise UsageError(f"{inv.path}: no selected host has service {service!r}")

    def check(job):
        h, settings, svcs, lock = job
        return h, preflight_host(h, settings, lock=lock, config=load_settings(c), services=svcs,
                                 accept_new_host_keys=accept_new_host_keys, allow_unpinned=allow_unpinned)

    reports = []
    unreachable: list[dict[str, str]] = []
    for h, (found, host_reports) in _each(check, selected):
        reports.extend(host_reports)
        if found is None:  # never reached: each service reports one failed ssh check
            unreachable.append(unreachable_entry(h.name, host_reports[0].checks[0].message if host_reports else ""))
        if not json:
            for r in host_reports:
                _print_report(r)
    if json:
        print_json(host_document("reports", [r.to_dict() for r in reports], unreachable))
    if not all(r.ok for r in reports):
        if not json:
            bad = sorted({f"{r.host}/{r.service}" if r.service else r.host for r in reports if not r.ok})
            console.print(f"[bold red]preflight failed[/]: {escape(', '.join(bad))}")
        raise Exit(code=1)


def _preflight_saved(c, host, group, service, inventory, json, allow_unpinned, facts_path, assume) -> None:
    """preflight --facts: one host's saved facts (plus assumptions) through the same checks."""
    import json as _json
    from pathlib import Path

    from llmfleet.images import lock as images
    from llmfleet.inventory.ansible import settings_for
    from llmfleet.knowledge import compat
    from llmfleet.knowledge.preflight import apply_assumptions, facts_from_saved, parse_assumptions
    from llmfleet.release.preflight import check_saved

    if group or not host:
        raise UsageError("--facts judges one host: give --host NAME (the host the facts were saved from)")
    assumed = parse_assumptions(assume)
    inv, hosts = select_hosts(c, inventory, host, None)
    if len(hosts) != 1:
        raise UsageError(f"{inv.path}: --facts needs --host to name exactly one host; {host!r} matches {len(hosts)}")
    h = hosts[0]
    settings = settings_for(h)
    svcs = settings.services
    if service:
        svcs = [s for s in settings.services if s.name == service]
        if not svcs:
            known = ", ".join(s.name for s in settings.services) or "none"
            raise UsageError(f"{inv.path}: host {h.name} has no service {service!r}"
                                 f"{did_you_mean(service, [s.name for s in settings.services])} (services: {known})")
    p = Path(facts_path)
    try:
        data = _json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{p}: cannot read the saved facts: {exc.strerror}") from None
    except ValueError as exc:
        from llmfleet.knowledge.preflight import facts_file_for

        raise UsageError(f"{p}: not JSON ({exc}); save facts with `invoke facts --host {h.name} --out "
                         f"{facts_file_for(h.name, str(p))}` and pass that file with --facts") from None
    saved = facts_from_saved(data, h.name, str(p))
    found, notes = apply_assumptions(saved, assumed, compat.load_engine_catalog())
    lock = images.load_lock(images.images_lock_path(h.vars, inv.path, cfg(c, "images_lock")))
    reports = check_saved(h.name, settings, found, lock=lock, source=str(p), assumed_notes=notes, services=svcs,
                          allow_unpinned=allow_unpinned)
    if json:
        print_json(host_document("reports", [r.to_dict() for r in reports], []))
    else:
        for r in reports:
            _print_report(r)
    if not all(r.ok for r in reports):
        if not json:
            bad = sorted({f"{r.host}/{r.service}" if r.service else r.host for r in reports if not r.ok})
            console.print(f"[bold red]preflight failed[/]: {escape(', '.join(bad))}")
        raise Exit(code=1)


def _print_report(r) -> None:
    from rich.table import Table

    title = f"preflight {r.host}" + (f" / {r.service}" if r.service else "")
    t = Table(title=escape(title))
    for col in ("check", "status", "message", "fix"):
        t.add_column(col, overflow="fold")
    for ch in r.checks:
        style = _STYLE.get(ch.status, "")
        t.add_row(ch.id, f"[{style}]{ch.status.upper()}[/]", escape(hints(ch.message)), escape(hints(ch.fix)))
    console.print(t)
