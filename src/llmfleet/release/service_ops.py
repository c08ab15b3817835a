"""Day-2 operations on deployed services (stop, start, remove, logs) and deploy/rollback over many hosts.

Stop, start and remove go through ``llmfleet.release.pipeline`` as a deploy does: connect, the host's
deploy lock (a stop, start or remove never races a deploy; a stale lock of this machine is taken over,
``decide.may_take_over``) with the release state read in its round trip, one script per service
(``store.service_*_script``, read by ``store.parse_service_op``), then the last round trip: the audit
records on the host (and locally) and the unlock. A host's trouble becomes its result (``failed`` /
``refused`` with the reason, ``decide.Result``), never an exception; only bad input (a service name
that cannot be one) raises a usage error, before any connection.

``run_hosts`` (over ``host.group.run_on_hosts``) runs ``deploy --forks`` and ``rollback --group``: at most
``forks`` hosts at once, results in the hosts' order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, TypeVar, cast

from llmfleet.errors import RemoteError, UsageError
from llmfleet.host import ssh
from llmfleet.host.group import run_on_hosts
from llmfleet.inventory.ansible import Host, Inventory
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.knowledge import release_state
from llmfleet.release import decide, drain, pipeline, store
from llmfleet.release.decide import HostOutcome, Result
from llmfleet.release.executor import (
    HealthFn,
    HealthTarget,
    HostRun,
    connect,
    http_health,
    service_for_release,
    short,
)
from llmfleet.release.pipeline import Connector
from llmfleet.release.secret import resolve_secret
from llmfleet.release.store import Paths
from llmfleet.settings import Settings

if TYPE_CHECKING:
    from llmfleet.release.prepare import DeployOptions, PreparedHost

T = TypeVar("T")
R = TypeVar("R")
Log = Callable[[str], None]
ACTIONS = ("stop", "start", "remove")
ACTIVE_UNIT = ("active", "activating", "reloading")


def run_hosts(fn: Callable[[T], R], items: Sequence[T], forks: int) -> list[R]:
    """``fn`` over ``items`` through the one many-hosts runner (``host.group.run_on_hosts``), results in
    the items' order; what ``fn`` raised (deploy and rollback turn host trouble into outcomes, so only
    bad input does) is raised again here."""
    results = run_on_hosts(fn, items, forks=forks, thread_name="llmfleet-host")
    out: list[R] = []
    for r in results:
        if r.exception is not None:
            raise r.exception
        out.append(cast(R, r.value))  # no exception: the value fn returned
    return out


def multihost_services(inv: Inventory, host_names: list[str]) -> list[tuple[str, str]]:
    """(head, service) of every service with workers whose head is among ``host_names``."""
    from llmfleet.inventory.ansible import settings_for

    return [(n, s.name) for n in host_names for s in settings_for(inv.hosts[n]).services if s.workers]


def deploy_hosts(inventory: Inventory | str, names: Sequence[str], *, config: Settings | dict[str, object],
                 options: DeployOptions, forks: int, log: Log,
                 prepared: Mapping[str, PreparedHost] | None = None) -> list[HostOutcome]:
    """``deploy_host`` on each host, ``forks`` at a time (each host keeps its own lock and audit).
    ``prepared``: the hosts' ``PreparedHost`` by name, when the caller prepared them already."""
    from llmfleet.inventory.ansible import load_inventory
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


def rollback_hosts(inventory: Inventory | str, names: Sequence[str], *, service: str | None, to: str | None,
                   config: Settings | dict[str, object], options: DeployOptions, forks: int,
                   log: Log) -> list[HostOutcome]:
    """``rollback_host`` on each host for its own services, ``forks`` at a time; then each service over
    several hosts that a selected host is the head or a worker of, all its hosts together
    (``multihost.rollback_service``), one at a time; one row per host of it."""
    from llmfleet.inventory.ansible import load_inventory, settings_for
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
    """What one stop/start/remove did on one host (``decide.Result``: stopped, started, removed, absent,
    unchanged, failed, refused)."""

    host: str
    action: str
    result: Result
    services: dict[str, str] = field(default_factory=dict)  # service -> unit state, "removed", "absent"
    images_removed: list[str] = field(default_factory=list)
    health: dict[str, str] = field(default_factory=dict)  # start: the health check's verdict per service
    acted: list[str] = field(default_factory=list)  # the services the action was carried out on
    reason: str = ""
    unreachable: bool = False
    duration_s: float = 0.0
    round_trips: int = 0
    timeline: list[decide.StageTime] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.result not in decide.NOT_DONE

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d.pop("timeline")
        return d


def check_service_name(name: str) -> str:
    if not store.SERVICE_NAME_RE.match(name or ""):
        raise UsageError(f"--service {name!r} is not a service name (letters, digits, '.', '_', '-')")
    return name


def orphans(states: Mapping[str, release_state.ServiceState], inventory_services: Sequence[str]) -> list[str]:
    """Services found on the host that the inventory no longer lists for it. Pure."""
    known = set(inventory_services)
    return sorted(n for n in states if n not in known)


def service_op(host: Host, settings: HostSettings, action: str, services: Sequence[str] | None, *,
               config: Settings | dict[str, object], orphans_only: bool = False, message: str = "",
               who: str | None = None, accept_new_host_keys: bool = False, log: Log = lambda line: None,
               health_fn: HealthFn = http_health, connector: Connector = connect,
               inventory: Inventory | None = None, only_active: bool = False) -> ServiceOpResult:
    """Stop, start or remove services of one host through ``pipeline``: connect, the deploy lock (a
    stale one of this machine taken over) with the state read in its round trip, one script per
    service, the audit lines and the unlock in the last round trip.

    ``services``: the names to act on; with ``orphans_only`` (remove), every service on the host that
    its inventory entry no longer lists. ``inventory``: where gateways in front of these services are
    found: a stop or remove takes the service out of their rotation first, a start puts it back after
    its health check (release/drain.py). ``only_active``: act only on services whose unit runs (a
    driver change stops what serves and starts that again afterwards, nothing an operator stopped).
    """
    if action not in ACTIONS:
        raise UsageError(f"unknown action {action!r}")
    names = [check_service_name(s) for s in services or []]
    out = ServiceOpResult(host=host.name, action=action, result=Result.FAILED)

    def body(slots: dict[str, pipeline.Slot[ServiceOpResult]]) -> None:
        run = slots[host.name].run
        run.health_fn = health_fn
        drainer = drain.for_run(run, inventory)
        try:
            run_service_op(run, action, names, out, orphans_only=orphans_only, drainer=drainer,
                           only_active=only_active)
        finally:
            if drainer is not None:
                drainer.close()

    pipeline.run_hosts([(host, settings, out)], action, body, settings=Settings.of(config), log=log, who=who,
                       message=message, accept_new_host_keys=accept_new_host_keys, connector=connector)
    out.unreachable = out.result in decide.NOT_DONE and out.round_trips == 0
    return out


def run_service_op(run: HostRun, action: str, names: Sequence[str], out: ServiceOpResult, *,
                   orphans_only: bool = False, drainer: drain.Drainer | None = None,
                   only_active: bool = False) -> None:
    """The service op after connecting: lock + state (one round trip), then each service's script."""
    (answer,) = run.lock(action, [store.state_script(run.root)], name="lock + state")
    if answer is None or not release_state.state_complete(answer.stdout):
        raise RemoteError(f"host {run.host}: the release state came back cut short: "
                          f"{short(answer.stdout if answer else '', 200)}")
    states = release_state.parse_state(answer.stdout)
    if orphans_only:
        names = orphans(states, [s.name for s in run.host_settings.services])
        if not names:
            out.result, out.reason = Result.UNCHANGED, "no orphaned service on the host"
            return
    results: list[Result] = []
    for name in names:
        if name not in states:
            out.services[name] = "absent"
            results.append(Result.ABSENT)
            continue
        if only_active and states[name].unit not in ACTIVE_UNIT:
            out.services[name] = states[name].unit
            results.append(Result.ABSENT)  # nothing to do here: not running
            continue
        out.acted.append(name)
        if drainer is not None and action in ("stop", "remove"):
            # out of the gateways' rotation before its unit stops (left so), then what its engine still runs
            svc = next((x for x in run.host_settings.services if x.name == name), None)
            drainer.drain(name, settle=drain.engine_settle(run, svc, svc.api_key is not None) if svc else None)
        with run.stage(f"{name}: {action}"):
            result, state, detail = _ACTIONS[action](run, name, states, names, out)
        if drainer is not None and action == "start" and result == Result.STARTED:
            drainer.ready(name)
        out.services[name] = state
        results.append(result)
        run.log(f"{name}: {result} ({detail})")
        run.record(action=action, service=name, release_id=states[name].current, digest=None, result=result,
                   detail=detail)
        if result == Result.FAILED:
            out.reason = f"{name}: {detail}"
    out.result = decide.service_op_result(results)
    if out.result == Result.ABSENT:
        from llmfleet.suggest import did_you_mean

        hint = did_you_mean(names[0], sorted(set(states) - set(names))) if len(names) == 1 else ""
        out.reason = f"no service {', '.join(names)} on the host{hint}"


Step = tuple[Result, str, str]  # (result, the unit's state or "removed", the detail for people and the audit)


def _stop(run: HostRun, name: str, states: Mapping[str, release_state.ServiceState], names: Sequence[str],
          out: ServiceOpResult) -> Step:
    res = run.run(store.service_stop_script(Paths(run.root, name)), timeout=150)
    got = store.parse_service_op(res.stdout, "@@stopped")
    ok = got.done and got.unit != "active"
    return (Result.STOPPED if ok else Result.FAILED), got.unit, f"unit {got.unit}"


def _start(run: HostRun, name: str, states: Mapping[str, release_state.ServiceState], names: Sequence[str],
           out: ServiceOpResult) -> Step:
    paths = Paths(run.root, name)
    res = run.run(store.service_start_script(paths), timeout=150)
    got = store.parse_service_op(res.stdout, "@@started")
    if got.no_current:
        return Result.FAILED, "no current release", f"{name} has no current release to start; deploy it"
    if got.unit not in ("active", "activating"):
        return Result.FAILED, got.unit, f"unit {got.unit}" + ("" if res.ok else f": {(res.stderr or res.stdout).strip()[-300:]}")
    svc = next((x for x in run.host_settings.services if x.name == name), None)
    if svc is None:
        return Result.STARTED, got.unit, f"unit {got.unit}"
    healthy, why = _health(run, svc, paths, states[name])
    out.health[name] = why
    if healthy is False:
        return Result.FAILED, got.unit, f"unit {got.unit} but the engine is not healthy: {why}"
    return Result.STARTED, got.unit, f"unit {got.unit}; {why}"


def _remove(run: HostRun, name: str, states: Mapping[str, release_state.ServiceState], names: Sequence[str],
            out: ServiceOpResult) -> Step:
    deleted = {name: list(states[name].releases)}
    keep = {k: v for k, v in states.items() if k == name or k not in names}
    refs = decide.images_to_prune(keep, deleted)
    res = run.run(store.service_remove_script(Paths(run.root, name), refs), timeout=300)
    got = store.parse_service_op(res.stdout, "@@removed")
    out.images_removed += list(got.images_removed)
    if not got.done:
        return Result.FAILED, "left behind", f"some of it is left: {(res.stderr or res.stdout).strip()[-300:]}"
    return (Result.REMOVED, "removed", f"unit, containers and {len(deleted[name])} release(s) removed; "
                                       f"{len(got.images_removed)} image(s)")


_ACTIONS: dict[str, Callable[[HostRun, str, Mapping[str, release_state.ServiceState], Sequence[str], ServiceOpResult], Step]] = {
    "stop": _stop, "start": _start, "remove": _remove}


def _health(run: HostRun, svc: Service, paths: Paths, state: release_state.ServiceState) -> tuple[bool | None, str]:
    """The deploy's staged health check (``HostRun.check_health``) of the current release after a start:
    (healthy, why); healthy is None when it could not be judged here (the API key is not readable on
    this machine)."""
    info = state.current_release
    manifest = info.manifest if info else None
    svc = service_for_release(svc, manifest)
    try:
        key = resolve_secret(svc.api_key, f"host {run.host}: service {svc.name}")
    except UsageError as exc:
        return None, f"health not checked: {exc}"
    target = HealthTarget(svc, key, paths, info.id if info else "", manifest.plan_summary() if manifest else None,
                          engine_args=manifest.engine_args if manifest else ())
    report = run.check_health(target, f"release {target.release_id}")
    return report.ok, report.message


def logs(host: Host, settings: HostSettings, service: str, *, lines: int, follow: bool, seconds: float,
         config: Settings | dict[str, object], on_line: Callable[[str], None],
         accept_new_host_keys: bool = False) -> int | None:
    """Print a service's engine log (journal, else the container log) through SSH; read-only, no lock.

    Without ``follow``: the last ``lines`` lines, one bounded round trip. With it: new lines as they
    come, for at most ``seconds``. Returns the remote exit status (None: the time ran out)."""
    paths = Paths(settings.root, check_service_name(service))
    with ssh.connect(host, config=Settings.of(config).ssh, accept_new_host_keys=accept_new_host_keys) as remote:
        if not store.parse_service_present(remote.run(store.service_present_script(paths), sudo=True,
                                                      timeout=30).stdout):
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
