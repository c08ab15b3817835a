"""``invoke prometheus.targets`` / ``prometheus.rules`` / ``grafana.dashboard``: the fleet in Prometheus and
Grafana (docs/monitoring.md)."""

from __future__ import annotations

from typing import Any

from invoke import Collection

from llmfleet.cli.common import (
    INVENTORY_HELP,
    console,
    escape,
    load_settings,
    new_table,
    print_json,
    select_hosts,
)
from llmfleet.cli.flags import POSITIVE, SECONDS, fleet_task

DEFAULT_FORKS = 10
DEFAULT_TIMEOUT = 20
KEYS_DIR = "/etc/prometheus/llmfleet-keys"  # fleet.prom_targets.KEYS_DIR (not imported: start-up time)


CHANGING = ("deployed", "rolled_back", "failed", "stopped", "started", "removed")


def refresh_after(hosts: list[Any], outcomes: list[Any], settings: Any) -> None:
    """After a deploy, rollback, upgrade, stop, start or remove: re-write the targets files of the hosts whose
    services changed (or may have: a failed run that went back) when ``llmfleet.prometheus_targets`` names
    the folder; one round trip per such host. Said on stderr; a failure here is never the action's."""
    out = getattr(settings, "prometheus_targets", None)
    changed = {str(getattr(o, "host", "")) for o in outcomes if str(getattr(o, "result", "")) in CHANGING}
    todo = [h for h in hosts if h.name in changed]
    if not out or not todo:
        return
    from llmfleet.cli.common import log_line
    from llmfleet.errors import LlmfleetError
    from llmfleet.fleet.prom_write import write_targets

    try:
        res = write_targets(todo, out, config=settings)
    except (LlmfleetError, OSError) as exc:
        log_line(f"prometheus targets in {out} not re-written: {exc}")
        return
    log_line(f"prometheus targets in {out}: {len(res.written)} file(s) re-written, {len(res.removed)} removed"
             + (f"; not read: {', '.join(k['host'] for k in res.kept)}" if res.kept else ""))


def _render(res: Any, out: str) -> None:
    doc = res.to_dict()
    if doc["targets"]:
        table = new_table("host", "service", "address", "job", "release", "card", "driver", title="prometheus targets")
        for t in doc["targets"]:
            lb = t["labels"]
            table.add_row(escape(t["host"]), escape(t["service"]), escape(t["address"]), escape(t["job"]),
                          escape(lb.get("release", "-")), escape(lb.get("card", "-")), escape(lb.get("driver", "-")))
        console.print(table)
    for u in doc["unreachable"]:
        console.print(f"[yellow]{escape(u['host'])} {escape(u['service'])}: cannot be scraped: {escape(u['reason'])}; "
                      f"fix: {escape(u['fix'])}[/yellow]")
    for t in doc["targets"]:
        if t["key_source"]:
            console.print(f"{escape(t['host'])} {escape(t['service'])}: llama-server's /metrics needs the API key "
                          f"({escape(t['key_source'])}): job llmfleet-{escape(t['job'])} reads it from its "
                          "credentials_file (see the jobs file); write the key there, mode 0600")
    for s in doc["skipped"]:
        console.print(f"[dim]{escape(s['host'])} {escape(s['service'])}: {escape(s['reason'])}[/dim]")
    for k in doc["kept"]:
        console.print(f"[red]{escape(k['host'])}: not read ({escape(k['error'])}); its files are kept as they were[/red]")
    console.print(f"[dim]{len(doc['written'])} file(s) written, {len(doc['removed'])} removed in {escape(out)}; "
                  f"scrape jobs: {escape(out.rstrip('/'))}/{escape(doc['jobs_file'])}[/dim]")


@fleet_task(
    numbers={"forks": POSITIVE, "timeout": SECONDS},
    help={
        "out": "the folder Prometheus' file_sd_configs read (created; one file per host per scrape job)",
        "host": "hosts to write targets for (Ansible pattern)",
        "group": "groups to write targets for (Ansible pattern)",
        "inventory": INVENTORY_HELP,
        "keys_dir": f"where the scrape jobs read llama-server API keys from (default {KEYS_DIR}); the key is never written",
        "json": 'print {"targets": [...], "unreachable": [{"host", "service", "reason", "fix"}], "skipped", '
                '"hosts_not_read", "unconfirmed", "written", "removed", "kept", "jobs_file"}',
        "forks": f"hosts read at once (default {DEFAULT_FORKS})",
        "timeout": f"seconds allowed per host (default {DEFAULT_TIMEOUT})",
        "verbose": "print each remote command (secrets masked) with its exit status and duration",
    },
)
def targets(c, out, host=None, group=None, inventory=None, keys_dir=None, json=False, forks=DEFAULT_FORKS,
            timeout=DEFAULT_TIMEOUT, verbose=False):
    """Write Prometheus file_sd targets: every engine's /metrics with host, service, release, card, ... labels."""
    from llmfleet.errors import CheckFailed
    from llmfleet.fleet.prom_write import write_targets

    _inv, hosts = select_hosts(c, inventory, host, group)
    res = write_targets(hosts, out, config=load_settings(c), forks=forks, timeout=timeout, keys_dir=keys_dir)
    if json:
        print_json(res.to_dict())
    else:
        _render(res, str(out))
    if res.kept:
        raise CheckFailed(f"{len(res.kept)} host(s) not read; their targets files were kept as they were")


@fleet_task(help={"out": "folder to copy the rules file into, as llmfleet-rules.yml (e.g. /etc/prometheus/rules)",
                  "runbook_base": "the address of your copy of docs/runbooks/ (e.g. https://wiki.example/llmfleet/"
                                  "runbooks/): written into each alert's runbook_url",
                  "json": 'print {"path": ...}'})
def rules(c, out=None, runbook_base=None, json=False):
    """The alert rules file (engine down, hung, below floor, KV full, queue, restarts, Xid/ECC, driver)."""
    _copy_packaged(c, "rules.yml", out, json, dest_name="llmfleet-rules.yml", runbook_base=runbook_base)


def _copy_packaged(c: Any, name: str, out: Any, json: bool, *, dest_name: str | None = None,
                   runbook_base: str | None = None) -> None:
    from pathlib import Path

    from llmfleet.errors import UsageError
    from llmfleet.monitoring import packaged

    src = packaged(name)
    dest = src
    if runbook_base and not out:
        raise UsageError("--runbook-base needs --out DIR: the packaged file is not changed in place")
    if out:
        d = Path(str(out)).expanduser()
        if not d.is_dir():
            raise UsageError(f"--out {out}: not a folder; create it or give another")
        dest = d / (dest_name or name)
        text = src.read_text()
        if runbook_base:
            text = text.replace("runbook_url: docs/runbooks/", f"runbook_url: {runbook_base.rstrip('/')}/")
        from llmfleet.fleet.prom_write import write_atomic

        write_atomic(dest, text)
    if json:
        print_json({"path": str(dest)})
    else:
        console.print(str(dest))


@fleet_task(help={"out": "folder to copy the dashboard into (the folder a Grafana file provider reads)",
                  "json": 'print {"path": ...}'})
def dashboard(c, out=None, json=False):
    """The fleet's Grafana dashboard JSON (tok/s per card class vs floor, TTFT, queue, KV, restarts, releases)."""
    _copy_packaged(c, "llmfleet-dashboard.json", out, json)


prometheus_ns = Collection("prometheus", targets, rules)
grafana_ns = Collection("grafana", dashboard)
