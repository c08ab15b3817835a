"""``invoke lock.status`` and ``invoke lock.release``: inspect and break a host's deploy lock."""

from __future__ import annotations

from invoke.exceptions import Exit

from llmfleet.cli.common import (
    INVENTORY_HELP,
    can_ask,
    console,
    escape,
    host_document,
    load_settings,
    new_table,
    print_json,
    select_hosts,
    unreachable_entry,
)
from llmfleet.cli.flags import fleet_task
from llmfleet.errors import RemoteError, UsageError

VERBOSE_HELP = "print each remote command (secrets masked) with its exit status and duration"


@fleet_task(
    help={
        "host": "host name or pattern (Ansible --limit syntax)",
        "group": "inventory group (pattern allowed)",
        "inventory": INVENTORY_HELP,
        "accept_new_host_keys": "record unknown SSH host keys (changed keys are refused)",
        "verbose": VERBOSE_HELP,
        "json": 'print {"hosts": [{host, held, holder, description}], "unreachable": [{"host", "error"}]}',
    },
)
def status(c, host=None, group=None, inventory=None, accept_new_host_keys=False, verbose=False, json=False):
    """Show who holds each host's deploy lock (holder, origin, time, action, message)."""
    from llmfleet.inventory.ansible import settings_for
    from llmfleet.release.executor import lock_status

    _inv, hosts = select_hosts(c, inventory, host, group)
    rows = []
    unreachable: list[dict[str, str]] = []
    for h in hosts:
        try:
            rows.append(lock_status(h, settings_for(h), config=load_settings(c), accept_new_host_keys=accept_new_host_keys))
        except RemoteError as exc:
            unreachable.append(unreachable_entry(h.name, str(exc)))
            rows.append({"host": h.name, "held": None, "holder": None, "description": f"unreachable: {exc}"})
    if json:
        print_json(host_document("hosts", rows, unreachable))
    else:
        t = new_table("host", "lock", "holder", title="deploy locks")
        for r in rows:
            state = {True: "[bold yellow]held[/]", False: "[green]free[/]", None: "[red]?[/]"}[r["held"]]
            t.add_row(r["host"], state, escape(r["description"]))
        console.print(t)
    if unreachable:
        raise Exit(code=1)


@fleet_task(
    help={
        "host": "the host whose lock to break (one name)",
        "inventory": INVENTORY_HELP,
        "yes": "break it without asking (required when not on a terminal)",
        "accept_new_host_keys": "record unknown SSH host keys (changed keys are refused)",
        "verbose": VERBOSE_HELP,
        "json": 'print {"hosts": [{host, was_held, broken, holder, description}], "unreachable": []}',
    },
)
def release(c, host, inventory=None, yes=False, accept_new_host_keys=False, verbose=False, json=False):
    """Break a host's deploy lock (a stale one left by a dead deploy); asks first unless --yes. Audited."""

    from llmfleet.inventory.ansible import settings_for
    from llmfleet.release.executor import lock_break, lock_status

    inv, hosts = select_hosts(c, inventory, host, None)
    if len(hosts) != 1:
        raise UsageError(f"lock.release takes one host; {host!r} matches {len(hosts)}")
    h = hosts[0]
    settings = settings_for(h)
    try:
        if not yes:
            st = lock_status(h, settings, config=load_settings(c), accept_new_host_keys=accept_new_host_keys)
            if not st["held"]:
                if json:
                    print_json(host_document("hosts", [{"host": h.name, "was_held": False, "broken": False,
                                                        "holder": None, "description": st.get("description")}], []))
                else:
                    console.print(f"{h.name}: the deploy lock is free")
                return
            if not can_ask():
                raise UsageError(f"{h.name}: lock {st['description']}; pass --yes to break it (no terminal to ask on)")
            answer = input(f"{h.name}: lock {st['description']}.\nBreak it? A deploy that still runs would lose "
                           "its protection. [y/N] ")
            if answer.strip().lower() not in {"y", "yes"}:
                raise Exit("not broken", code=1)
        res = lock_break(h, settings, config=load_settings(c), accept_new_host_keys=accept_new_host_keys)
    except RemoteError as exc:
        if json:  # the fleet tasks' shape: the host that could not be reached under "unreachable"
            print_json(host_document("hosts", [], [unreachable_entry(h.name, str(exc))]))
        raise
    if json:
        print_json(host_document("hosts", [res], []))
    elif res["broken"]:
        console.print(f"{h.name}: broke the deploy lock ({escape(res['description'])})")
    else:
        console.print(f"{h.name}: the deploy lock was free")
