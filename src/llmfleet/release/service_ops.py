"""Day-2 operations on deployed services (stop, start, remove, logs) and deploy/rollback over many hosts.

The imperative shell around ``llmfleet.release.store``'s scripts: connect, take the host's deploy
lock (a stop, start or remove never races a deploy), run one script, append the audit records on
the host and locally, release the lock; one round trip for the work and one for the end. A host's
trouble becomes its result (``failed`` / ``refused`` with the reason), never an exception; only bad
input (a service name that cannot be one) raises a usage error, before any connection.

``run_hosts`` (over ``host.group.run_on_hosts``) runs ``deploy --forks`` and ``rollback --group``: at most
``forks`` hosts at once, results in the hosts' order.
"""

from __future__ import annotations

import os
import secrets as secrets_mod
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from llmfleet.errors import LlmfleetError, RemoteError, UsageError
from llmfleet.host.group import run_on_hosts
from llmfleet.release import decide, store
from llmfleet.release.store import Paths
from llmfleet.settings import Settings

Log = Callable[[str], None]
ACTIONS = ("stop", "start", "remove")


def run_hosts(fn: Callable[[Any], Any], items: Sequence[Any], forks: int) -> list[Any]:
    """``fn`` over ``items`` through the one many-hosts runner (``host.group.run_on_hosts``), results in
    the items' order; what ``fn`` raised (deploy and rollback turn host trouble into outcomes, so only
    bad input does) is raised again here."""
    results = run_on_hosts(fn, items, forks=forks, thread_name="llmfleet-host")
    for r in results:
        if r.exception is not None:
            raise r.exception
    return list(results.values())


def multihost_services(inv: Any, host_names: list[str]) -> list[tuple[str, str]]:
    """(head, service) of every service with workers whose head is among ``host_names``."""
    from llmfleet.inventory.ansible import settings_for

    return [(n, s.name) for n in host_names for s in settings_for(inv.hosts[n]).services if s.workers]


def deploy_hosts(inventory: Any, names: Sequence[str], *, config: Settings | dict[str, Any], options: Any, forks: int,
                 log: Log, prepared: dict[str, Any] | None = None) -> list[Any]:
    """``deploy_host`` on each host, ``forks`` at a time (each host keeps its own lock and audit).
    ``prepared``: the hosts' ``PreparedHost`` by name, when the caller prepared them already."""
    from llmfleet.inventory.ansible import Inventory, load_inventory
    from llmfleet.release.deploy import deploy_host

    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    ready = prepared or {}
    outcomes = run_hosts(lambda n: deploy_host(inv, n, config=config, options=options, prepared=ready.get(n),
                                               log=lambda line: log(f"{n}: {line}")), names, forks)
    # Services over several hosts (``workers:``), once each hosts' own services are done: one at a time,
    # every host of it locked in a fixed order; one row per host of it.
    multi = [(h, s) for h, s in multihost_services(inv, list(names)) if options.services in (None, [])
             or s in options.services]
    if not multi:
        return outcomes
    from llmfleet.release.multihost import deploy_service  # only with services over several hosts

    more = [o for head, svc in multi
            for o in deploy_service(inv, head, svc, config=config, options=options, log=log).host_outcomes()]
    covered = {o.host for o in more}
    return [o for o in outcomes if not (o.host in covered and o.reason.startswith("no single-host"))] + more


def rollback_hosts(inventory: Any, names: Sequence[str], *, service: str | None, to: str | None,
                   config: Settings | dict[str, Any], options: Any, forks: int, log: Log) -> list[Any]:
    """``rollback_host`` on each host for its own services, ``forks`` at a time; then each service over
    several hosts that a selected host is the head or a worker of, all its hosts together
    (``multihost.rollback_service``), one at a time; one row per host of it."""
    from llmfleet.inventory.ansible import Inventory, load_inventory, settings_for
    from llmfleet.release.deploy import rollback_host
    from llmfleet.release.multihost import rollback_service, services_of_hosts, workers_of

    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    multi = services_of_hosts(inv, list(names), service)
    covered: set[str] = set()
    for head, svc_name in multi:
        svc = next(s for s in settings_for(inv.hosts[head]).services if s.name == svc_name)
        covered |= {head, *workers_of(inv, head, svc)}
    single = []
    for n in names:
        own = [s.name for s in settings_for(inv.hosts[n]).services if not s.workers]
        if n not in covered or (service in own if service is not None else bool(own)):
            single.append(n)
    outcomes = run_hosts(lambda n: rollback_host(inv, n, service=service, to=to, config=config, options=options,
                                                 log=lambda line: log(f"{n}: {line}")), single, forks)
    return outcomes + [o for head, svc_name in multi
                       for o in rollback_service(inv, head, svc_name, to=to, config=config, options=options,
                                                 log=log).host_outcomes()]


@dataclass
class ServiceOpResult:
    """What one stop/start/remove did on one host."""

    host: str
    action: str
    result: str  # stopped | started | removed | absent | failed | refused | unchanged
    services: dict[str, str] = field(default_factory=dict)  # service -> unit state, "removed", "absent"
    images_removed: list[str] = field(default_factory=list)
    health: dict[str, str] = field(default_factory=dict)  # start: the health check's verdict per service
    reason: str = ""
    unreachable: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.result not in {"failed", "refused"}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_service_name(name: str) -> str:
    if not store.SERVICE_NAME_RE.match(name or ""):
        raise UsageError(f"--service {name!r} is not a service name (letters, digits, '.', '_', '-')")
    return name


def _now() -> datetime:
    return datetime.now(UTC)


def _who() -> str:
    from llmfleet.release.executor import default_who

    return default_who()


def orphans(states: dict[str, store.ServiceState], inventory_services: Sequence[str]) -> list[str]:
    """Services found on the host that the inventory no longer lists for it. Pure."""
    known = set(inventory_services)
    return sorted(n for n in states if n not in known)


def service_op(host: Any, settings: Any, action: str, services: Sequence[str] | None, *, config: Settings | dict[str, Any],
               orphans_only: bool = False, message: str = "", who: str | None = None,
               accept_new_host_keys: bool = False, log: Log = lambda line: None) -> ServiceOpResult:
    """Stop, start or remove services of one host under its deploy lock; audited.

    ``services``: the names to act on; with ``orphans_only`` (remove), every service on the host that
    its inventory entry no longer lists.
    """
    from llmfleet.host import ssh

    if action not in ACTIONS:
        raise UsageError(f"unknown action {action!r}")
    names = [check_service_name(s) for s in services or []]
    t0 = time.monotonic()
    out = ServiceOpResult(host=host.name, action=action, result="failed")
    who = who or _who()
    try:
        remote = ssh.connect(host, config=config, accept_new_host_keys=accept_new_host_keys)
    except LlmfleetError as exc:
        out.result = "refused" if isinstance(exc, ssh.HostKeyError) else "failed"
        out.reason, out.unreachable = str(exc), True
        out.duration_s = round(time.monotonic() - t0, 3)
        return out
    records: list[dict[str, Any]] = []
    token: str | None = None
    root = settings.root
    try:
        token = _lock(remote, root, who, action, message)
        states = store.parse_state(remote.run(store.state_script(root), sudo=True, check=True).stdout)
        if orphans_only:
            names = orphans(states, [s.name for s in settings.services])
            if not names:
                out.result, out.reason = "unchanged", "no orphaned service on the host"
        results: list[str] = []
        for name in names:
            paths = Paths(root, name)
            if name not in states:
                out.services[name] = "absent"
                results.append("absent")
                continue
            detail = ""
            if action == "stop":
                res = remote.run(store.service_stop_script(paths), sudo=True, timeout=150)
                state = store.parse_unit_state(res.stdout)
                result = "stopped" if state != "active" else "failed"
                detail = f"unit {state}"
            elif action == "start":
                res = remote.run(store.service_start_script(paths), sudo=True, timeout=150)
                if "@@nocurrent" in res.stdout:
                    state, result = "no current release", "failed"
                    detail = f"{name} has no current release to start; deploy it"
                else:
                    state = store.parse_unit_state(res.stdout)
                    result = "started" if state in ("active", "activating") else "failed"
                    detail = f"unit {state}" + ("" if res.ok else f": {(res.stderr or res.stdout).strip()[-300:]}")
                    svc = next((x for x in settings.services if x.name == name), None)
                    if result == "started" and svc is not None:
                        healthy, why = _health(remote, settings, svc, paths, states[name], log, config)
                        out.health[name] = why
                        if healthy is False:
                            result, detail = "failed", f"unit {state} but the engine is not healthy: {why}"
                        else:
                            detail = f"unit {state}; {why}"
            else:
                deleted = {name: list(states[name].releases)}
                keep = {k: v for k, v in states.items() if k == name or k not in names}
                refs = decide.images_to_prune(keep, deleted)
                res = remote.run(store.service_remove_script(paths, refs), sudo=True, timeout=300)
                out.images_removed += store.parse_removed_images(res.stdout)
                state = "removed" if "@@removed" in res.stdout else "left behind"
                result = "removed" if state == "removed" else "failed"
                detail = (f"unit, containers and {len(deleted[name])} release(s) removed; "
                          f"{len(store.parse_removed_images(res.stdout))} image(s)") if result == "removed" else (
                    f"some of it is left: {(res.stderr or res.stdout).strip()[-300:]}")
            out.services[name] = state
            results.append(result)
            log(f"{name}: {result} ({detail})")
            rel = states[name].current
            records.append(store.audit_record(now=_now(), who=who, host=host.name, action=action, service=name,
                                              release=rel, digest=None, result=result, detail=detail,
                                              message=message))
            if result == "failed":
                out.reason = f"{name}: {detail}"
        if results:
            failed = [r for r in results if r == "failed"]
            done = [r for r in results if r not in ("failed", "absent")]
            out.result = "failed" if failed else (done[0] if done else "absent")
            if not failed and not done:
                from llmfleet.suggest import did_you_mean

                hint = did_you_mean(names[0], sorted(set(states) - set(names))) if len(names) == 1 else ""
                out.reason = f"no service {', '.join(names)} on the host{hint}"
    except _Held as exc:
        out.result, out.reason = "refused", str(exc)
    except LlmfleetError as exc:
        out.result, out.reason = "failed", str(exc)
    finally:
        _finish(remote, root, token, records, config, log)
        out.duration_s = round(time.monotonic() - t0, 3)
    return out


def _health(remote: Any, settings: Any, svc: Any, paths: Paths, state: store.ServiceState,
            log: Log, config: Settings | dict[str, Any]) -> tuple[bool | None, str]:
    """The deploy's staged health check (``executor.http_health``) of the current release after a start:
    (healthy, why); healthy is None when it could not be judged here (the API key is not readable on
    this machine)."""
    from llmfleet.release.executor import HealthTarget, HostRun, http_health, service_for_release
    from llmfleet.release.secret import resolve_secret

    info = state.current_release
    manifest = info.manifest if info else None
    svc = service_for_release(svc, manifest)
    try:
        key = resolve_secret(svc.api_key, f"host {remote.name}: service {svc.name}")
    except UsageError as exc:
        return None, f"health not checked: {exc}"
    run = HostRun(remote.name, settings, remote, settings=Settings.of(config), log=log)
    target = HealthTarget(svc, key, paths, info.id if info else "", manifest.plan_summary() if manifest else None,
                          engine_args=manifest.engine_args if manifest else ())
    report = http_health(run, target)
    return report.ok, report.message


class _Held(Exception):
    pass


def _lock(remote: Any, root: str, who: str, action: str, message: str) -> str:
    token = secrets_mod.token_hex(16)
    holder = store.holder_document(token=token, who=who, origin=_who(), action=action, message=message,
                                   now=_now(), pid=os.getpid())
    res = remote.run(store.lock_acquire_script(root, holder), sudo=True, timeout=30)
    got = store.parse_lock_acquire(res.rc, res.stdout)
    if got.acquired:
        return token
    if got.holder is None:
        raise RemoteError(f"host {remote.name}: cannot take the deploy lock: {(res.stderr or res.stdout).strip()[-200:]}")
    raise _Held(f"deploy lock {store.describe_holder(got.holder, _now())}; wait, or inspect with "
                f"`invoke lock.status --host {remote.name}`")


def _finish(remote: Any, root: str, token: str | None, records: list[dict[str, Any]], config: Settings | dict[str, Any],
            log: Log) -> None:
    """Audit lines (host and local) and the unlock in one round trip; then close."""
    if records:
        from llmfleet.release import audit

        try:
            audit.append_local(Settings.of(config).audit_log_path, records)
        except OSError as exc:
            log(f"warning: local audit log: {exc}")
    try:
        if records or token is not None:
            remote.run(store.final_script(root, [], records, token), sudo=True, timeout=60)
    except LlmfleetError as exc:
        log(f"warning: audit/unlock did not complete: {exc}")
    finally:
        try:
            remote.close()
        except Exception:  # noqa: BLE001,S110 - closing a dead connection must not hide the result
            pass


def logs(host: Any, settings: Any, service: str, *, lines: int, follow: bool, seconds: float,
         config: Settings | dict[str, Any], on_line: Callable[[str], None], accept_new_host_keys: bool = False) -> int | None:
    """Print a service's engine log (journal, else the container log) through SSH; read-only, no lock.

    Without ``follow``: the last ``lines`` lines, one bounded round trip. With it: new lines as they
    come, for at most ``seconds``. Returns the remote exit status (None: the time ran out)."""
    from llmfleet.host import ssh

    paths = Paths(settings.root, check_service_name(service))
    with ssh.connect(host, config=config, accept_new_host_keys=accept_new_host_keys) as remote:
        probe = remote.run(f"[ -d {store.q(paths.service_dir)} ] && echo '@@present' || echo '@@absent'",
                           sudo=True, timeout=30)
        if "@@absent" in probe.stdout:
            from llmfleet.suggest import did_you_mean

            hint = did_you_mean(service, [s.name for s in settings.services if s.name != service])
            raise UsageError(f"host {host.name}: no service {service!r} deployed there{hint} "
                             f"(`invoke status --host {host.name}` lists them)")
        if not follow:
            res = remote.run(store.service_logs_script(paths, lines), sudo=True, timeout=seconds)
            for line in res.stdout.splitlines():
                on_line(line)
            return res.rc
        return remote.stream(store.service_logs_script(paths, lines, follow=True, seconds=seconds), on_line,
                             timeout=seconds + 5, sudo=True)
