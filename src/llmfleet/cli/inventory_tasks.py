"""``invoke inventory``: show or check an inventory the way ansible-inventory does."""

from __future__ import annotations

import builtins

from llmfleet.cli.common import console, inventory_path, print_json
from llmfleet.cli.flags import fleet_task
from llmfleet.errors import UsageError


@fleet_task(
    help={
        "inventory": "inventory file or folder (default: llmfleet.inventory in invoke.yaml, 'inventory/lab/')",
        "list": "print every group and host as JSON, like `ansible-inventory --list`",
        "host": "print one host's merged variables as JSON, like `ansible-inventory --host NAME`",
        "check": "validate the llmfleet_* variables of every host (or of --limit) against the schema",
        "limit": "with --check: only hosts matching this pattern",
        "json": "with --check: print a JSON summary",
    },
)
def inventory(c, inventory=None, list=False, host=None, check=False, limit=None, json=False):  # noqa: A002
    """Show or validate an Ansible-format inventory (--list, --host NAME, --check)."""
    from rich.table import Table

    from llmfleet.inventory.ansible import check_all, load_inventory

    inv = load_inventory(inventory_path(c, inventory))
    if list:
        print_json(inv.to_ansible_list())
        return
    if host:
        if host not in inv.hosts:
            raise UsageError(f"{inv.path}: no host {host!r}; hosts: {', '.join(inv.hosts)}")
        print_json(inv.hosts[host].vars)
        return
    hosts = inv.select(host=limit) if limit else builtins.list(inv.hosts.values())
    settings = check_all(inv, hosts)
    if json:
        print_json(
            {
                "inventory": inv.path,
                "ok": True,
                "hosts": {
                    name: [s.model_dump(mode="json", exclude={"api_key"}) | {"api_key": bool(s.api_key)}
                           for s in st.services]
                    for name, st in settings.items()
                },
            }
        )
        return
    table = Table(title=f"inventory {inv.path}", show_lines=False)
    for col in ("host", "address", "groups", "services"):
        table.add_column(col)
    for h in hosts:
        st = settings[h.name]
        svc = ", ".join(f"{s.name} ({s.engine}, {s.model}, :{s.port})" for s in st.services) or "-"
        addr = h.address + (f":{h.vars['ansible_port']}" if "ansible_port" in h.vars else "")
        table.add_row(h.name, addr, ", ".join(h.groups) or "ungrouped", svc)
    console.print(table)
    if check:
        console.print(f"[green]ok[/green]: {len(hosts)} host(s), llmfleet variables valid")
