"""``invoke models.push``: a service's model at its ``model_path`` on each host, verified (docs/models.md)."""

from __future__ import annotations

from typing import Any

from invoke import Collection

from llmfleet.cli.common import (
    INVENTORY_HELP,
    console,
    err_console,
    escape,
    host_document,
    load_settings,
    new_table,
    print_json,
    select_hosts,
    unreachable_entry,
)
from llmfleet.cli.flags import POSITIVE, SECONDS_OR_ZERO, fleet_task
from llmfleet.errors import CheckFailed

DEFAULT_FORKS = 5
_STYLE = {"verified": "green", "adopted": "green", "pushed": "green", "downloaded": "green", "failed": "bold red"}


def _stderr_console() -> Any:
    err_console.width  # noqa: B018 - makes the lazy console (rich imported on first use)
    return err_console._console


class _RichReporter:
    """Per host: bytes, rate and time left (rich, on stderr); a line per host as it ends."""

    def __init__(self, live: bool) -> None:
        self.live = live
        self.progress: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> _RichReporter:
        if self.live:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                                     TransferSpeedColumn(), TimeRemainingColumn(), console=_stderr_console(),
                                     transient=True)
            self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def begin(self, key: str, description: str, total: int, done: int) -> None:
        if self.progress is not None:
            self.tasks[key] = self.progress.add_task(escape(description), total=total, completed=done)

    def advance(self, key: str, n: int) -> None:
        if self.progress is not None and key in self.tasks:
            self.progress.advance(self.tasks[key], n)

    def end(self, key: str, outcome: Any = None) -> None:
        if self.progress is not None and key in self.tasks:
            self.progress.remove_task(self.tasks.pop(key))

    def log(self, line: str) -> None:
        if self.progress is not None:
            self.progress.console.print(escape(line))
        else:
            from llmfleet.cli.common import log_line

            log_line(line)


@fleet_task(
    numbers={"forks": POSITIVE, "lock_wait": SECONDS_OR_ZERO},
    help={
        "host": "hosts: name or Ansible --limit pattern (groups allowed)",
        "group": "inventory group (pattern allowed)",
        "inventory": INVENTORY_HELP,
        "service": "only this service's model (default: every service of the host)",
        "source": "the model file or folder on this machine (default: the service's model_source)",
        "from_": "copy host to host from HOST, which holds a verified copy at the same model_path (spares this "
                 "machine's uplink; default: the service's model_source)",
        "limit_rate": "at most this many bytes/s per host: 50M (50 MB/s), 100Mi, 1G, 500000",
        "forks": f"hosts pushed to at once (default {DEFAULT_FORKS})",
        "accept_new_host_keys": "record unknown SSH host keys (like OpenSSH accept-new; changed keys are refused)",
        "verbose": "print each remote command with its exit status and duration",
        "json": 'print {"hosts": [one result per host and model path], "unreachable": [{"host", "error"}]}',
        "no_seed": "every host copies from the source itself (this machine, or --from HOST); by default, with "
                   "--forks above 1 and more than 2 hosts, a host holding a verified copy sends to the next "
                   "(a tree: this machine sends the file once; docs/models.md)",
        "lock_wait": "seconds to wait for a host's deploy lock while another writer (a deploy, another push) holds "
                     "it, then refuse naming the holder (default 60; 0: refuse at once)",
    },
)
def push(c, host=None, group=None, inventory=None, service=None, source=None, from_=None, limit_rate=None,
         forks=DEFAULT_FORKS, accept_new_host_keys=False, verbose=False, json=False, no_seed=False, lock_wait=None):
    """Copy each service's model to its model_path, sha256-verified, resumable; skip hosts whose copy is verified."""
    import sys

    from llmfleet.models import push as P
    from llmfleet.release.who import default_who

    inv, hosts = select_hosts(c, inventory, host, group)
    settings = load_settings(c)
    rate = P.parse_rate(limit_rate)
    lock_cache: dict[str, Any] = {}

    def pinned(h: Any, svc: Any) -> str:
        from llmfleet.images import lock as images
        from llmfleet.inventory.ansible import settings_for
        path = images.images_lock_path(h.vars, inv.path, settings.images_lock) or ""  # "": the default lock
        if path not in lock_cache:
            lock_cache[path] = images.load_lock(path or None)
        hs = settings_for(h)
        return images.resolve(svc.image, lock_cache[path], mirrors=dict(hs.image_mirrors),
                              where=f"host {h.name}: service {svc.name}").pull_ref

    jobs = P.plan_jobs(inv, hosts, service=service, source=source, from_host=from_, lock=pinned)
    options = P.Options(limit_rate=rate, who=default_who(), forks=forks, accept_new_host_keys=accept_new_host_keys,
                        seed=False if no_seed else None,
                        lock_wait=P.LOCK_WAIT_S if lock_wait is None else float(lock_wait))
    with _RichReporter(live=sys.stderr.isatty() and not verbose) as reporter:
        outcomes = P.push(inv, jobs, config=settings, options=options, reporter=reporter,
                          audit_log=settings.audit_log)
    failed = [o for o in outcomes if not o.ok]
    if json:
        print_json(host_document("hosts", [o.to_dict() for o in outcomes],
                                 [unreachable_entry(o.host, o.error or "") for o in failed if not o.round_trips]))
    else:
        t = new_table("host", "model_path", "result", "sent", "rate", "verified", "note", title="models.push")
        for o in outcomes:
            rate_text = f"{o.rate / 2**20:.1f} MiB/s" if o.rate else "-"
            t.add_row(o.host, escape(o.model_path), f"[{_STYLE.get(o.result, '')}]{o.result}[/]", P.gib(o.bytes_sent),
                      rate_text, o.verified_at or "-", escape(o.error or o.reason))
        console.print(t)
    if failed:
        for o in failed:
            err_console.print(f"[red]FAILED[/red] {escape(o.error or '')}")
        raise CheckFailed(f"{len(failed)} of {len(outcomes)} push(es) failed: "
                          + ", ".join(sorted({o.host for o in failed})))


ns = Collection("models", push)
