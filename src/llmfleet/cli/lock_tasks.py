"""``invoke lock.status`` and ``invoke lock.release``: inspect and break a host's deploy lock."""

from __future__ import annotations

from invoke import task
from invoke.exceptions import Exit
from rich.markup import escape
from rich.table import Table

from llmfleet.cli.common import (
    INVENTORY_HELP,
    console,
    handles_errors,
    inventory_path,
    load_settings,
    print_json,
)
from llmfleet.errors import RemoteError, UsageError
from llmfleet.inventory.ansible import load_inventory, settings_for


@task(
    help={
        "host": "host name or pattern (Ansible --limit syntax)",
        "group": "inventory group (pattern allowed)",
        "inventory": INVENTORY_HELP,
        "accept_new_host_keys": "record unknown SSH host keys (changed keys are refused)",
        "json": "print {host, held, holder} per host as JSON",
    },
)
@handles_errors
def status(c, host=None, group=None, inventory=None, accept_new_host_keys=False, json=False):
    """Show who holds each host's deploy lock (holder, origin, time, action, message)."""
    from llmfleet.release.executor import lock_status

    inv = load_inventory(inventory_path(c, inventory))
    rows = []
    failed = False
    for h in inv.select(host=host, group=group):
        try:
            rows.append(lock_status(h, settings_for(h), config=load_settings(c), accept_new_host_keys=accept_new_host_keys))
        except RemoteError as exc:
            failed = True
            rows.append({"host": h.name, "held": None, "holder": None, "description": f"unreachable: {exc}"})
    if json:
        print_json(rows[0] if len(rows) == 1 else rows)
    else:
        t = Table(title="deploy locks")
        for col in ("host", "lock", "holder"):
            t.add_column(col, overflow="fold")
        for r in rows:
            state = {True: "[bold yellow]held[/]", False: "[green]free[/]", None: "[red]?[/]"}[r["held"]]
            t.add_row(r["host"], state, escape(r["description"]))
        console.print(t)
    if failed:
        raise Exit(code=1)


@task(
    help={
        "host": "the host whose lock to break (one name)",
        "inventory": INVENTORY_HELP,
        "yes": "break it without asking (required when not on a terminal)",
        "accept_new_host_keys": "record unknown SSH host keys (changed keys are refused)",
        "json": "print the result as JSON",
    },
)
@handles_errors
def release(c, host, inventory=None, yes=False, accept_new_host_keys=False, json=False):
    """Break a host's deploy lock (a stale one left by a dead deploy); asks first unless --yes. Audited."""
    import sys

    from llmfleet.release.executor import lock_break, lock_status

    inv = load_inventory(inventory_path(c, inventory))
    hosts = inv.select(host=host)
    if len(hosts) != 1:
        raise UsageError(f"lock.release takes one host; {host!r} matches {len(hosts)}")
    h = hosts[0]
    settings = settings_for(h)
    if not yes:
        st = lock_status(h, settings, config=load_settings(c), accept_new_host_keys=accept_new_host_keys)
        if not st["held"]:
            console.print(f"{h.name}: the deploy lock is free")
            return
        if not sys.stdin.isatty():
            raise UsageError(f"{h.name}: lock {st['description']}; pass --yes to break it (no terminal to ask on)")
        answer = input(f"{h.name}: lock {st['description']}.\nBreak it? A deploy that still runs would lose "
                       "its protection. [y/N] ")
        if answer.strip().lower() not in {"y", "yes"}:
            raise Exit("not broken", code=1)
    res = lock_break(h, settings, config=load_settings(c), accept_new_host_keys=accept_new_host_keys)
    if json:
        print_json(res)
    elif res["broken"]:
        console.print(f"{h.name}: broke the deploy lock ({escape(res['description'])})")
    else:
        console.print(f"{h.name}: the deploy lock was free")
