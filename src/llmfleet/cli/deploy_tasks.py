"""``invoke deploy`` and ``invoke rollback``: put releases on hosts, or go back to an earlier one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from invoke import task
from invoke.exceptions import Exit
from rich.markup import escape
from rich.table import Table

from llmfleet.cli.common import (
    INVENTORY_HELP,
    console,
    err_console,
    handles_errors,
    inventory_path,
    load_settings,
    print_json,
)
from llmfleet.inventory.ansible import load_inventory

_STYLE = {"deployed": "green", "unchanged": "green", "check": "cyan", "rolled_back": "bold yellow",
          "failed": "bold red", "refused": "bold red"}


def _log(line: str) -> None:
    err_console.print(f"{datetime.now(UTC):%H:%M:%S} {escape(line)}")


def _summary(outcomes: list[Any], title: str) -> None:
    t = Table(title=title)
    for col in ("host", "result", "releases", "duration", "reason"):
        t.add_column(col, overflow="fold")
    for o in outcomes:
        rels = ", ".join(f"{k}={v}" for k, v in o.releases.items()) or "-"
        t.add_row(o.host, f"[{_STYLE.get(o.result, '')}]{o.result}[/]", rels, f"{o.duration_s:.1f}s",
                  escape(o.reason or ""))
    console.print(t)


@task(
    help={
        "host": "host name or pattern (Ansible --limit syntax, e.g. 'gpu-v100-*')",
        "group": "inventory group (pattern allowed)",
        "inventory": INVENTORY_HELP,
        "check": "show what would change on each host; change nothing",
        "diff": "print unified diffs of the rendered files against the current release (secrets masked); "
                "change nothing",
        "accept_new_host_keys": "record unknown SSH host keys (like OpenSSH accept-new; changed keys are refused)",
        "allow_unpinned": "allow an image given as a floating tag instead of a digest pinned in images.lock",
        "message": "why: recorded in the deploy lock and the audit log",
        "service": "deploy only this service of the host (default: every service)",
        "json": "print one result object per host as JSON",
    },
)
@handles_errors
def deploy(c, host=None, group=None, inventory=None, check=False, diff=False, accept_new_host_keys=False,
           allow_unpinned=False, message="", service=None, json=False):
    """Deploy each host's services: preflight, render, pull by digest, switch, health-check, roll back on failure.

    Exit 0 when every host is deployed or unchanged, 1 otherwise.
    """
    from llmfleet.release.deploy import DeployOptions, deploy_host

    inv = load_inventory(inventory_path(c, inventory))
    hosts = inv.select(host=host, group=group)
    options = DeployOptions(check=bool(check), diff=bool(diff), accept_new_host_keys=bool(accept_new_host_keys),
                            allow_unpinned=bool(allow_unpinned), message=message or "",
                            services=[service] if service else None)
    conf = load_settings(c)
    outcomes = []
    for h in hosts:
        o = deploy_host(inv, h.name, config=conf, options=options, log=lambda line, n=h.name: _log(f"{n}: {line}"))
        outcomes.append(o)
        if not json:
            for ch in o.changes if (check or diff) else []:
                console.print(f"{h.name}: would change: {escape(ch)}")
            for name, text in o.diffs.items():
                console.print(f"[bold]{h.name}: {escape(name)}[/]")
                console.print(escape(text), end="")
    if json:
        data = [o.to_dict() for o in outcomes]
        print_json(data[0] if len(data) == 1 else data)
    else:
        _summary(outcomes, "deploy --diff" if diff else ("deploy --check" if check else "deploy"))
    if not all(o.ok for o in outcomes):
        raise Exit(code=1)


@task(
    help={
        "host": "the host (one name)",
        "service": "roll back only this service (default: every deployed service of the host)",
        "to": "the release id to go back to (default: the newest healthy release before the current one)",
        "inventory": INVENTORY_HELP,
        "accept_new_host_keys": "record unknown SSH host keys (changed keys are refused)",
        "message": "why: recorded in the deploy lock and the audit log",
        "json": "print the result as JSON",
    },
)
@handles_errors
def rollback(c, host, service=None, to=None, inventory=None, accept_new_host_keys=False, message="", json=False):
    """Point a host's service back at an earlier release, restart it and health-check it.

    Exit 0 when the host is healthy on the target release, 1 otherwise (the reason says what still answers).
    """
    from llmfleet.release.deploy import DeployOptions, rollback_host

    inv = load_inventory(inventory_path(c, inventory))
    options = DeployOptions(accept_new_host_keys=bool(accept_new_host_keys), message=message or f"rollback {to or ''}".strip())
    o = rollback_host(inv, host, service=service, to=to, config=load_settings(c), options=options,
                      log=lambda line: _log(f"{host}: {line}"))
    if json:
        print_json(o.to_dict())
    else:
        _summary([o], "rollback")
    if o.result != "rolled_back":
        raise Exit(code=1)
