"""``invoke inventory``: show or check an inventory the way ansible-inventory does."""

from __future__ import annotations

import builtins
from pathlib import Path

from llmfleet.cli import common
from llmfleet.cli.common import console, err_console, escape, inventory_path, load_settings, print_json
from llmfleet.cli.flags import fleet_task
from llmfleet.errors import InventoryError, UsageError


def _lock_for(c, inv):
    from llmfleet.images import lock as images

    configured = common.cfg(c, "images_lock")
    cache: dict[str | None, object] = {}

    def lock_for(host):
        path = images.images_lock_path(host.vars, inv.path, configured)
        if path not in cache:
            p = Path(path) if path else images.default_lock_path()
            cache[path] = images.load_lock(path) if p.exists() else None
        return cache[path]

    return lock_for


@fleet_task(
    iterable=["inventory"],
    help={
        "inventory": "inventory source: file, folder, script or 'h1,h2,' host list; repeat -i to merge several "
                     "(default: as Ansible finds it: ANSIBLE_INVENTORY, ansible.cfg, ./inventory)",
        "list": "print every group and host as JSON, like `ansible-inventory --list`",
        "host": "print one host's merged variables as JSON, like `ansible-inventory --host NAME`",
        "check": "validate everything checkable offline (schema, catalogs, images.lock, GPUs, ports, plans); "
                 "every error is reported",
        "limit": "only hosts matching this pattern (Ansible --limit), in the table and with --check",
        "json": "with --check: print the findings as JSON",
        "vault_password_file": "decrypt !vault values llmfleet needs with this file "
                               "(default: $ANSIBLE_VAULT_PASSWORD_FILE)",
    },
)
def inventory(c, inventory=None, list=False, host=None, check=False, limit=None, json=False,  # noqa: A002
              vault_password_file=None):
    """Show or validate an Ansible inventory (--list, --host NAME, --check)."""
    from rich.table import Table

    from llmfleet.inventory.ansible import load_inventory
    from llmfleet.release.check import check_inventory

    if limit and (list or host):
        raise UsageError(f"inventory: -l/--limit {limit} picks the hosts of the table and of --check; --list and "
                         "--host print the whole inventory and one host")
    # its warnings print on stderr (cli.common)
    inv = load_inventory(inventory_path(c, inventory), vault_password_file=vault_password_file,
                         script_timeout=load_settings(c).inventory_timeout)
    if list:
        print_json(inv.to_ansible_list())
        return
    if host:
        if host not in inv.hosts:
            raise UsageError(f"{inv.path}: no host {host!r}; hosts: {', '.join(inv.hosts)}")
        print_json(inv.host_json(host))
        return
    hosts = inv.select(host=limit) if limit else builtins.list(inv.hosts.values())
    reports = check_inventory(inv, hosts, lock_for=_lock_for(c, inv))
    if vault_password_file:
        _check_vault(vault_password_file, reports)
    errors = [f for r in reports for f in r.findings if f.level == "error"]
    warnings = [f for r in reports for f in r.findings if f.level == "warning"]
    if json:
        print_json({
            "inventory": inv.path,
            "ok": not errors,
            "errors": [f.to_dict() for f in errors],
            "warnings": [{"host": None, "level": "warning", "message": w} for w in inv.warnings]
                        + [f.to_dict() for f in warnings],
            "hosts": {
                r.host: [s.model_dump(mode="json", exclude={"api_key"}) | {"api_key": bool(s.api_key)}
                         for s in r.services]
                for r in reports
            },
        })
    else:
        table = Table(title=f"inventory {inv.path}", show_lines=False)
        for col in ("host", "address", "groups", "services"):
            table.add_column(col)
        for h, r in zip(hosts, reports, strict=True):
            svc = ", ".join(f"{s.name} ({s.engine}, {s.model}, :{s.port})" for s in r.services) or "-"
            addr = r.address or "?"
            table.add_row(escape(h.name), escape(addr), escape(", ".join(h.groups) or "ungrouped"), escape(svc))
        console.print(table)
        from llmfleet.cli.flags import hints

        for f in warnings:
            err_console.print(f"[yellow]warning[/yellow]: {escape(hints(f.message))}")
        for f in errors[:-1]:
            err_console.print(f"error: {escape(hints(f.message))}")
    if errors:
        # bad input: exit 2; one line per error (the last one through the error handler)
        raise InventoryError(f"{len(errors)} error(s) in {inv.path}" if json else errors[-1].message)
    if check and not json:
        console.print(f"[green]ok[/green]: {len(hosts)} host(s), llmfleet variables valid"
                      + (f", {len(warnings)} warning(s)" if warnings else ""))


def _check_vault(path: str, reports) -> None:
    """With a password file: every vault-held api_key must decrypt with it."""
    from llmfleet.inventory.vault import Vault

    vault = Vault(path)
    for r in reports:
        for s in r.services:
            if s.api_key is not None and s.api_key.vault is not None:
                vault.decrypt(s.api_key.vault, f"host {r.host}: service {s.name}: api_key")
