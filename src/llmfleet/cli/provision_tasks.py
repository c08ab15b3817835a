"""``invoke provision``: converge hosts to what their services need (driver, container runtime, the rest)."""

from __future__ import annotations

import functools
import os

from invoke.exceptions import Exit

from llmfleet.cli.common import (
    INVENTORY_HELP,
    can_ask,
    cfg,
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
from llmfleet.cli.flags import PERCENT, fleet_task
from llmfleet.errors import UsageError

VERBOSE_HELP = "print each remote command (secrets masked) with its exit status and duration"
_STYLE = {"would change": "cyan", "changed": "yellow", "failed": "bold red", "not run": "dim", "ok": "green",
          "converged": "green", "refused": "bold red", "pass": "green", "warn": "yellow", "fail": "bold red",
          "went back": "bold yellow"}


def _print(o, diff: bool) -> None:
    t = new_table("step", "status", "changes", title=escape(f"provision {o.host}: {o.result}"))
    for s in o.steps:
        changes = "\n".join(s.changes) + (f"\n[bold red]error:[/] {escape(s.error)}\nfix: {escape(s.fix)}"
                                          if s.error else "")
        t.add_row(escape(s.name) + (" (reboot)" if s.reboot else ""), f"[{_STYLE.get(s.status, 'default')}]{s.status}[/]",
                  changes if s.error else escape(changes))
    if not o.steps and o.result == "converged":
        t.add_row("all", "[green]ok[/]", "nothing to change")
    console.print(t)
    if o.driver:
        console.print(f"driver: R{o.driver.get('branch')} {escape(o.driver.get('version') or '')} "
                      f"(running {escape(o.driver.get('running') or '-')}): {escape(o.driver.get('why', ''))}")
    for w in o.warnings:
        console.print(f"[yellow]{escape(w)}[/]")
    if diff:
        for s in o.steps:
            if s.diff:
                console.print(escape(s.diff), highlight=False)
    for c in o.checks:
        console.print(f"  {escape(c['id'])}: [{_STYLE.get(c['status'], 'default')}]{c['status'].upper()}[/] "
                      f"{escape(c['message'])}")
    if o.rebooted:
        console.print(f"  rebooted: back after {o.reboot_seconds} s")
    from llmfleet.provision.gated import changes_driver

    if changes_driver(o):
        console.print(f"  gated: driver {escape(o.previous.version)} is kept on the host for a go-back; the services "
                      "that run are drained and stopped first, started and health-checked after the reboot")
    g = o.gate
    if g:  # a driver change gated by serving (provision/gated.py)
        console.print(f"  previous driver {escape(str(g.get('previous')))} kept on the host "
                      f"({len(g.get('kept') or [])} package(s)); services stopped: "
                      f"{escape(', '.join(g.get('services') or []) or 'none running')}")
        if g.get("health"):
            console.print(f"  services on the new driver: {escape(str(g['health']))}")
        back = g.get("go_back")
        if back:
            checks = "; ".join(f"{c['id']}: {c['status'].upper()} {c['message']}" for c in back.get("checks", []))
            console.print(f"  go-back: {escape(str(back.get('result')))}: {escape(str(back.get('message')))}"
                          + (f" ({escape(checks)})" if checks else ""))
        if g.get("health_after_go_back"):
            console.print(f"  services on the old driver again: {escape(str(g['health_after_go_back']))}")
    line = f"{o.host}: {o.result}" + (f": {o.message}" if o.message else "")
    style = _STYLE.get(o.result, "default")
    console.print(f"[{style}]{escape(line)}[/] ({o.round_trips} round trip(s), {o.seconds:.2f} s)")


def _logger(name: str, *, quiet: bool):
    def log(line: str) -> None:
        if not quiet:
            log_line(f"{name}: {line}")
    return log


def _source_files(h, hs, inv_path: str):
    """``llmfleet_apt_sources``' files for host ``h``: each key read from the inventory folder (one-line
    error naming the host, the field and the file; before any host is contacted)."""
    from pathlib import Path

    from llmfleet.provision import desired as D

    base = Path(h.inventory_dir or (inv_path if Path(inv_path).is_dir() else Path(inv_path).parent))
    keys = {}
    for i, src in enumerate(hs.apt_sources):
        path = Path(src.key_file).expanduser()
        path = path if path.is_absolute() else base / path
        where = f"host {h.name}: llmfleet_apt_sources[{i}].key_file {path}"
        try:
            text = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{where}: cannot be read ({getattr(exc, 'strerror', None) or exc}); give the path "
                             "of the source's ASCII-armored key, relative to the inventory folder") from None
        keys[src.name] = D.check_key(text, where)
    return D.source_files(hs.apt_sources, keys)


def _offline_repos(bundle_dir):
    """The bundle's offline repositories, their archives checked by size and sha256 (nothing else of the
    bundle is read): before any host is contacted."""
    from pathlib import Path

    from llmfleet.bundle import check
    from llmfleet.provision.offline import OfflineRepo

    b = check.verified_packages(bundle_dir)
    files = {f.path: f for f in b.files}
    return [OfflineRepo(pk.distro, pk.version, pk.arch, Path(bundle_dir) / pk.archive, files[pk.archive].sha256,
                        files[pk.archive].size, pk.packages) for pk in b.packages]


def _service_gate(h, hs, inv, settings, who, accept_new_host_keys, log):
    """The host's services around a driver change: stop what runs (drained at its gateways first), start
    it again and health-check it (release/service_ops.py)."""
    from llmfleet.provision.gated import ServiceGate

    names = [s.name for s in hs.services]

    def stop():
        from llmfleet.release.service_ops import (
            service_op,  # only for a driver change: not on a converged host
        )

        if not names:
            return [], None
        r = service_op(h, hs, "stop", names, config=settings, message="driver change", who=who,
                       accept_new_host_keys=accept_new_host_keys, log=log, inventory=inv, only_active=True)
        return list(r.acted), (None if r.ok else (r.reason or str(r.result)))

    def start(which):
        from llmfleet.release.service_ops import service_op

        r = service_op(h, hs, "start", which, config=settings, message="driver change", who=who,
                       accept_new_host_keys=accept_new_host_keys, log=log, inventory=inv)
        said = "; ".join(f"{n}: {r.health.get(n) or r.services.get(n, '?')}" for n in which)
        return r.ok, (said if r.ok or said.strip() else str(r.reason or r.result))

    return ServiceGate(stop=stop, start=start)


@fleet_task(
    numbers={"max_fail_percentage": PERCENT},
    help={
        "host": "host name or pattern (Ansible --limit syntax)",
        "group": "inventory group (pattern allowed)",
        "inventory": INVENTORY_HELP,
        "check": "show per step what would change (packages, holds, files, reboot) and change nothing",
        "diff": "show the files' differences (with --check: what would be written)",
        "json": 'print {"hosts": [{host, result, ok, steps, driver, checks, round_trips, ...}], "unreachable": []}',
        "yes": "reboot a host whose driver changes without asking (required when not on a terminal)",
        "driver_branch": "install this driver branch (e.g. 580) instead of the one chosen from the catalog; "
                         "refused when it drops a card or is too old for an image",
        "serial": "batch sizes, Ansible's serial: '1' = one host at a time, '1,25%,100%' = a canary, quarter "
                  "fleets, then the rest (default: all hosts in one batch; hosts of a batch run one after another)",
        "max_fail_percentage": "stop before the next batch when a batch's failed share exceeds this (default: only "
                               "when a whole batch failed)",
        "accept_new_host_keys": "record unknown SSH host keys (changed keys are refused)",
        "verbose": VERBOSE_HELP,
        "bundle": "install packages only from this bundle's offline repository (bundle.create --packages-from): "
                  "sent to each host, checked by sha256, the only apt source of the run (an air-gapped site)",
    },
)
def provision(c, host=None, group=None, inventory=None, check=False, diff=False, json=False, yes=False,
              driver_branch=None, serial=None, max_fail_percentage=None, accept_new_host_keys=False, verbose=False,
              bundle=None):
    """Converge hosts to what their services need: NVIDIA driver (held, reboot when it changes), Docker and
    compose v2, the NVIDIA Container Toolkit wired into Docker, the deploy user, folders and limits.

    A converged host is one SSH round trip. Changes take the host's deploy lock and are audited; a failed
    step stops the host's run with the command's own error and the fix. A driver change on a host that has
    a driver is gated by serving: the old driver kept on the host, its running services drained and
    stopped, the change and reboot, the services started and health-checked; a host that does not come
    back healthy goes back to its old driver (reported "went back"). Exit 1 when a host failed.
    """
    from llmfleet.fleet.rollout import batch_aborts, batches, parse_serial
    from llmfleet.host import ssh
    from llmfleet.images import lock as images
    from llmfleet.inventory.ansible import settings_for
    from llmfleet.provision import gated
    from llmfleet.provision import run as prun
    from llmfleet.release.who import default_who

    if not host and not group:
        raise UsageError("provision needs --host or --group (which hosts to converge)")
    branch = None
    if driver_branch is not None:
        if not str(driver_branch).isdigit() or not 300 <= int(driver_branch) <= 999:
            raise UsageError(f"--driver-branch {driver_branch!r}: give a driver branch number such as 580")
        branch = int(driver_branch)
    serial_list = parse_serial(serial)
    inv, hosts = select_hosts(c, inventory, host, group)
    offline = _offline_repos(bundle) if bundle else None
    settings = load_settings(c)
    jobs = []
    for h in hosts:  # every host's settings and images valid before any connection
        hs = settings_for(h)
        lock = images.load_lock(images.images_lock_path(h.vars, inv.path, cfg(c, "images_lock")))
        refs = []
        for svc in hs.services:
            try:
                ref = images.resolve(svc.image, lock, mirrors=hs.image_mirrors, allow_unpinned=True)
                if ref.cuda:  # a CUDA image: the one a container GPU check means something for
                    refs.append(ref.pull_ref)
            except UsageError:
                pass  # the deploy refuses it; the GPU container check uses the images it can name
        jobs.append((h, hs, lock, refs, _source_files(h, hs, inv.path)))
    who = default_who()

    def confirm(name):
        def ask(plan) -> bool:
            if yes:
                return True
            if json or not can_ask():
                return False
            answer = input(f"{name}: the driver changes and the host reboots. Go on? [y/N] ")
            return answer.strip().lower() in {"y", "yes"}
        return ask

    outcomes = []
    todo = batches(jobs, serial_list)
    for i, batch in enumerate(todo):
        failed = 0
        for h, hs, lock, refs, files in batch:
            log = _logger(h.name, quiet=json)

            def make(is_check: bool, ask: bool, h=h, hs=hs, lock=lock, refs=refs, log=log, files=files):
                return prun.Provisioner(
                    h.name, hs, functools.partial(ssh.connect, h, config=settings,
                                                  accept_new_host_keys=accept_new_host_keys),
                    log=log, who=who, origin=who, pid=os.getpid(), check=is_check, pinned_branch=branch,
                    image_refs=refs, extra_files=files, preflight=prun.preflight_checks(h.name, hs, lock),
                    confirm=confirm(h.name) if ask else None, offline=offline, bundle=str(bundle or ""))

            if check:
                o = make(True, False).provision()
            else:
                ask = confirm(h.name)

                def asked(_check, ask=ask) -> bool:
                    return ask([])

                o = gated.provision_gated(make, _service_gate(h, hs, inv, settings, who, accept_new_host_keys, log),
                                          log, confirm=asked)
            outcomes.append(o)
            failed += not o.ok
            if not json:
                _print(o, diff)
        if i < len(todo) - 1 and failed and batch_aborts(failed, len(batch), max_fail_percentage):
            rest = [h.name for b in todo[i + 1:] for h, *_ in b]
            if not json:
                console.print(f"[bold red]stopped: {failed} of {len(batch)} host(s) of batch {i + 1} failed "
                              f"(max-fail-percentage {max_fail_percentage if max_fail_percentage is not None else '-'}); "
                              f"not provisioned: {escape(', '.join(rest))}[/]")
            for name in rest:
                skipped = prun.Outcome(name, result="not run", message=f"batch {i + 1} failed: provisioning stopped")
                outcomes.append(skipped)
            break
    if json:
        unreachable = [unreachable_entry(o.host, o.message) for o in outcomes if o.result == "failed"
                       and o.round_trips == 0]
        print_json(host_document("hosts", [o.to_dict() for o in outcomes], unreachable))
    if len(outcomes) == 1 and outcomes[0].usage:
        raise Exit(code=2)
    if not all(o.ok for o in outcomes):
        raise Exit(code=1)
