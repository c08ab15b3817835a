"""Rolling fleet upgrades: a full deploy per host, in ``serial`` batches, stopped by ``max_fail_percentage``.

Semantics are Ansible's (``llmfleet.fleet.rollout``): ``--serial 1,25%,100%`` gives a canary host, then
quarter-fleet batches, then the rest; a batch whose failed share is strictly greater than
``--max-fail-percentage`` stops the rollout (without it, only a batch where every host failed does).
Inside a batch, hosts deploy in parallel, at most ``--forks`` at a time; each runs the whole deploy
(preflight, pull, switch, health check, automatic rollback of that host on failure).

A service over several hosts (``workers:``) is upgraded as one unit: its head, its workers and the
selected hosts' own services among them are one step of one batch (``rollout_units``), deployed in
order (each host's own services, then the service over its hosts, ``multihost.deploy_service``), and
counted once against the batch's failure budget. Its result row carries the unit's hosts.

An abort starts no new batch. Hosts that already finished stay on the new release unless
``rollback_on_abort``, in which case each of them is rolled back to its previous release. Hosts of
later batches are reported as ``skipped``.

``run_upgrade`` is the orchestration and takes the per-host deploy and rollback as functions, so the
batch and abort logic is tested without hosts (and, for ``upgrade --bundle``, a ``before_batch`` function
that puts each batch's images and models in place just before that batch deploys); ``deploy_fn`` / ``rollback_fn`` build the real ones on
``llmfleet.release.deploy``. Overrides (``--image ENGINE=VERSION``, ``--set key=value``) are computed here,
per host, and handed to the deploy as service-level sets.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from llmfleet.errors import UsageError
from llmfleet.fleet.rollout import batch_aborts, batches
from llmfleet.host.group import run_on_hosts
from llmfleet.inventory.ansible import Inventory
from llmfleet.inventory.services import Service
from llmfleet.knowledge import engines
from llmfleet.release.decide import HostOutcome, Result
from llmfleet.release.deploy import deploy_host, rollback_host
from llmfleet.release.prepare import DeployOptions, PreparedHost, prepare_host
from llmfleet.settings import Settings

#: results that count as a failed host in a batch
FAILED = frozenset({"failed", "rolled_back", "refused", "error", "interrupted"})
#: results that leave the host on the new release
UPGRADED = frozenset({"deployed"})
#: keys --set may change (service fields; name/engine/port identity stays with the inventory)
SETTABLE = frozenset(Service.model_fields) - {"name", "engine"}


# ---------------------------------------------------------------------------------------------
# Overrides (pure)


def parse_image(values: Sequence[str] | str | None) -> dict[str, str]:
    """``["llamacpp=b6123", "vllm=0.9.2"]`` -> ``{"llamacpp": "llamacpp:b6123", "vllm": "vllm:0.9.2"}``.

    The value is the image key the lock file pins (``ENGINE:VERSION``); a value that already holds a
    ``:`` is taken whole (``--image llamacpp=llamacpp-cuda12:b6123``).
    """
    if values is None:
        return {}
    if isinstance(values, str):
        values = [values]
    out: dict[str, str] = {}
    for raw in values:
        engine, sep, version = str(raw).partition("=")
        engine, version = engine.strip(), version.strip()
        if not sep or not engine or not version:
            raise UsageError(f"--image {raw!r}: expected ENGINE=VERSION, e.g. --image llamacpp=b6123")
        if engine not in engines.names():
            raise UsageError(f"--image {raw!r}: engine must be {' or '.join(engines.names())}")
        if engine in out:
            raise UsageError(f"--image: engine {engine} given twice")
        out[engine] = version if ":" in version else f"{engine}:{version}"
    return out


def parse_sets(values: Sequence[str] | str | None) -> dict[str, Any]:
    """``["context=8192", "engine_args=[--enforce-eager]"]`` -> typed values (YAML scalars/lists)."""
    if values is None:
        return {}
    if isinstance(values, str):
        values = [values]
    out: dict[str, Any] = {}
    for raw in values:
        key, sep, text = str(raw).partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set {raw!r}: expected key=value, e.g. --set context=8192")
        if key not in SETTABLE:
            raise UsageError(f"--set {key}: not a service setting; settable: {', '.join(sorted(SETTABLE))}")
        if key == "api_key":
            raise UsageError("--set api_key: secrets are not set on the command line; change the key's "
                             "source (from_env/from_file) and run the upgrade without --set")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        out[key] = value
    return out


@dataclass(frozen=True)
class HostChange:
    """What one host's deploy is given: service-level overrides, and the services to deploy
    (``None``: all of the host's services)."""

    overrides: dict[str, Any]
    services: list[str] | None = None


def host_overrides(services: Sequence[Service], images: dict[str, str], sets: dict[str, Any]) -> HostChange | str:
    """The change for one host's deploy, or the reason this host is not part of the upgrade.

    ``--image`` applies to the services of that engine: on a host that also runs another engine,
    only that engine's services are deployed. ``--set`` applies to every service deployed.
    """
    out = dict(sets)
    if not images:
        return HostChange(out)
    if not services:
        return "no services in the inventory"
    engines = {s.engine for s in services}
    hit = engines & set(images)
    if not hit:
        return f"runs no {' or '.join(sorted(images))} service"
    if len(hit) > 1:
        return (f"runs both {' and '.join(sorted(hit))}; upgrade one engine at a time "
                "(the deploy applies one set of overrides to the services it deploys)")
    engine = hit.pop()
    out["image"] = images[engine]
    if len(engines) > 1:
        return HostChange(out, [s.name for s in services if s.engine == engine])
    return HostChange(out)


# ---------------------------------------------------------------------------------------------
# Orchestration (pure given its functions)


# ---------------------------------------------------------------------------------------------
# Rollout units: a host, or the hosts of services over several hosts together (pure)


@dataclass(frozen=True)
class Unit:
    """One step of a batch. ``key``: the name it is reported under (a host: the first selected host of
    it); ``hosts``: every host it touches; ``singles``: hosts whose own services it deploys;
    ``services``: (head, service) of the services over several hosts it deploys."""

    key: str
    hosts: tuple[str, ...]
    singles: tuple[str, ...] = ()
    services: tuple[tuple[str, str], ...] = ()


def rollout_units(selected: Sequence[str], own: dict[str, bool],
                  multi: Sequence[tuple[str, str, Sequence[str]]]) -> list[Unit]:
    """Group the selected hosts into rollout units. ``own``: whether a selected host has services of
    its own to deploy; ``multi``: (head, service, workers) of the services over several hosts being
    upgraded (their heads selected). Hosts that share such a service are one unit (a deploy takes the
    lock of every host of it: two units holding one host would refuse each other), in the order of
    the selection; a worker need not be selected."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for h in selected:
        find(h)
    for head, _svc, workers in multi:
        for w in workers:
            parent[find(w)] = find(head)
    order = list(selected) + [w for _h, _s, ws in multi for w in ws if w not in selected]
    groups: dict[str, list[str]] = {}
    for h in order:
        groups.setdefault(find(h), [])
        if h not in groups[find(h)]:
            groups[find(h)].append(h)
    out = []
    for members in groups.values():
        sel = [h for h in members if h in selected]
        services = tuple((h, s) for h, s, _w in multi if h in members)
        singles = tuple(h for h in sel if own.get(h))
        if not singles and not services:
            continue
        out.append(Unit(sel[0] if sel else members[0], tuple(sorted(members)), singles, services))
    return out


_WORST = ("error", "failed", "refused", "rolled_back", "interrupted")


@dataclass
class UnitOutcome:
    """The outcome of one unit, shaped as a host's (``result``, ``releases``, ``reason``, ...)."""

    host: str
    result: str
    releases: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    reason: str = ""
    changes: Any = None


def combine(unit: Unit, parts: Sequence[tuple[str, Any]]) -> UnitOutcome:
    """One result for the unit's parts ((label, outcome) in the order they ran): the worst failure,
    else ``deployed`` if any part deployed, else ``check``, else ``unchanged``. Releases are keyed
    ``service@host``."""
    results = [str(getattr(o, "result", "error")) for _l, o in parts]
    worst = next((w for w in _WORST if w in results), None)
    result = worst or ("deployed" if "deployed" in results else "check" if "check" in results else "unchanged")
    releases: dict[str, str] = {}
    reasons, changes = [], []
    for label, o in parts:
        for host, hout in (getattr(o, "hosts", None) or {}).items():  # a service over several hosts
            releases |= {f"{k}@{host}": v for k, v in (getattr(hout, "releases", None) or {}).items() if v}
        releases |= {f"{k}@{getattr(o, 'host', label)}": v for k, v in (getattr(o, "releases", None) or {}).items()
                     if v and not getattr(o, "hosts", None)}
        why = str(getattr(o, "reason", "") or "")
        if why:
            reasons.append(f"{label}: {why}")
        if getattr(o, "changes", None):
            changes.append({label: o.changes})
    return UnitOutcome(unit.key, result, releases, sum(float(getattr(o, "duration_s", 0) or 0) for _l, o in parts),
                       "; ".join(reasons), changes or None)


@dataclass
class HostResult:
    host: str
    batch: int
    result: str = "skipped"
    releases: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    reason: str = ""
    changes: Any = None
    rollback: str | None = None  # result of the rollback on abort, when one ran
    hosts: list[str] = field(default_factory=list)  # a unit of several hosts: every host of it

    @property
    def failed(self) -> bool:
        return self.result in FAILED

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class UpgradeReport:
    batches: list[list[str]]
    hosts: list[HostResult]
    aborted: bool = False
    abort_reason: str = ""
    check: bool = False
    duration_s: float = 0.0
    excluded: dict[str, str] = field(default_factory=dict)  # host -> why it is not in the upgrade

    @property
    def ok(self) -> bool:
        return not self.aborted and not any(h.failed for h in self.hosts)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for h in self.hosts:
            out[h.result] = out.get(h.result, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "check": self.check,
            "aborted": self.aborted,
            "abort_reason": self.abort_reason,
            "duration_s": round(self.duration_s, 3),
            "batches": self.batches,
            "counts": self.counts(),
            "hosts": [h.to_dict() for h in self.hosts],
            "excluded": self.excluded,
        }


def _outcome_into(res: HostResult, outcome: Any, started: float, clock: Callable[[], float]) -> None:
    res.result = str(getattr(outcome, "result", "error"))
    res.releases = dict(getattr(outcome, "releases", None) or {})
    d = getattr(outcome, "duration_s", None)
    res.duration_s = float(d) if isinstance(d, int | float) else clock() - started
    res.reason = str(getattr(outcome, "reason", "") or "")
    res.changes = getattr(outcome, "changes", None)


def _run_batch(
    hosts: Sequence[str],
    fn: Callable[[str], Any],
    forks: int,
    results: dict[str, HostResult],
    log: Callable[[str], None],
    clock: Callable[[], float],
    apply: Callable[[HostResult, Any, float], None],
    progress: Any = None,
    on_host: Callable[[HostResult], None] | None = None,
) -> None:
    def one(h: str) -> None:
        t0 = clock()
        if progress is not None:
            progress.host_started()
        try:
            try:
                outcome = fn(h)
            except Exception as exc:  # noqa: BLE001 - a bug on one host must not lose the batch
                results[h].result = "error"
                results[h].reason = f"{type(exc).__name__}: {exc}"[:500]
                results[h].duration_s = clock() - t0
                log(f"{h}: error: {results[h].reason}")
                return
            apply(results[h], outcome, t0)  # as each host ends: a Ctrl-C later keeps what finished
        finally:
            if progress is not None:
                progress.host_done(results[h].result, results[h].failed)
            if on_host is not None:
                on_host(results[h])

    run_on_hosts(one, hosts, forks=forks, thread_name="llmfleet-upgrade")


def _prepare_batch(
    batch: Sequence[str],
    before_batch: Callable[[list[str]], dict[str, Any]],
    results: dict[str, HostResult],
    log: Callable[[str], None],
    clock: Callable[[], float],
    apply: Callable[[HostResult, Any, float], None],
    progress: Any = None,
    on_host: Callable[[HostResult], None] | None = None,
) -> list[str]:
    """``before_batch`` on the batch; each host it could not prepare gets its outcome (as a deploy's)
    and is reported; returns the hosts left to deploy, in batch order."""
    t0 = clock()
    try:
        not_ready = dict(before_batch(list(batch)))
    except Exception as exc:  # noqa: BLE001 - the batch fails; the report still comes out
        why = f"preparing the batch failed: {type(exc).__name__}: {exc}"[:500]
        not_ready = {h: HostOutcome(host=h, result=Result.FAILED, reason=why) for h in batch}
    for h in batch:
        if h in not_ready:
            if progress is not None:
                progress.host_started()
            outcome = not_ready[h]
            if isinstance(outcome, HostOutcome) and not outcome.duration_s:
                outcome.duration_s = clock() - t0  # the time its batch's preparation took
            apply(results[h], outcome, t0)
            if progress is not None:
                progress.host_done(results[h].result, results[h].failed)
            if on_host is not None:
                on_host(results[h])
    return [h for h in batch if h not in not_ready]


def run_upgrade(
    hosts: Sequence[str],
    *,
    deploy: Callable[[str], Any],
    serial: Sequence[int | str] = (),
    max_fail_percentage: float | None = None,
    forks: int = 5,
    pause: float = 0.0,
    rollback_on_abort: bool = False,
    rollback: Callable[[str], Any] | None = None,
    check: bool = False,
    log: Callable[[str], None] = lambda line: None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    stop: threading.Event | None = None,
    progress: Any = None,
    on_host: Callable[[HostResult], None] | None = None,
    members: dict[str, Sequence[str]] | None = None,
    before_batch: Callable[[list[str]], dict[str, Any]] | None = None,
) -> UpgradeReport:
    """Deploy ``hosts`` batch by batch. ``deploy(host)`` returns a HostOutcome-like object (``result``,
    ``releases``, ``duration_s``, ``reason``, ``changes``) and should not raise; if it does, the
    host counts as failed with the exception as its reason.

    ``check``: every host is asked for its changes (``deploy`` is expected to be a check-mode deploy),
    all batches run and nothing aborts. ``stop`` (an Event) ends the rollout after the current batch.
    ``progress`` (a :class:`llmfleet.fleet.progress.LiveLine`) gets each batch's start and end and each
    host's start and result; ``on_host`` is called with each host's result as it finishes.
    ``members``: for a name that stands for a unit of several hosts, those hosts (its result's ``hosts``).
    ``before_batch(batch)``: called once per batch before any of its hosts deploys (not in ``check``
    mode), to put in place what its deploys need (``upgrade --bundle``: the bundle's images and
    models, ``llmfleet.bundle.apply.put_in_place``); it returns name -> outcome for the hosts that
    could not be prepared: they are not deployed and count as failed in their batch. If it raises,
    every host of the batch fails with the exception as its reason.
    """
    if rollback_on_abort and rollback is None and not check:
        raise UsageError("rollback_on_abort needs a rollback function")
    if forks < 1:
        raise UsageError(f"--forks {forks}: must be at least 1")
    if max_fail_percentage is not None and not 0 <= max_fail_percentage <= 100:
        raise UsageError(f"--max-fail-percentage {max_fail_percentage}: must be between 0 and 100")
    if pause < 0:
        raise UsageError(f"--pause {pause}: must not be negative")
    t_start = clock()
    plan = batches(list(hosts), list(serial))
    results = {h: HostResult(host=h, batch=i + 1, hosts=list((members or {}).get(h) or []))
               for i, b in enumerate(plan) for h in b}
    report = UpgradeReport(batches=plan, hosts=[results[h] for b in plan for h in b], check=check)

    def apply_deploy(res: HostResult, outcome: Any, t0: float) -> None:
        _outcome_into(res, outcome, t0, clock)
        rels = ", ".join(f"{k}={v}" for k, v in sorted(res.releases.items()))
        tail = f" ({res.reason})" if res.reason else ""
        log(f"{res.host}: {res.result}{' ' + rels if rels else ''} in {res.duration_s:.1f}s{tail}")

    for i, batch in enumerate(plan):
        label = "canary " if i == 0 and len(serial) > 1 and len(plan) > 1 else ""
        log(f"batch {i + 1}/{len(plan)} {label}({len(batch)} host{'s' if len(batch) != 1 else ''}): {', '.join(batch)}")
        if progress is not None:
            progress.begin(i + 1, len(plan), len(batch))
        try:
            ready = _prepare_batch(batch, before_batch, results, log, clock, apply_deploy, progress, on_host) \
                if before_batch is not None and not check else list(batch)
            _run_batch(ready, deploy, forks, results, log, clock, apply_deploy, progress, on_host)
        except KeyboardInterrupt:
            # Ctrl-C: the hosts already deploying have finished (their locks released); stop here
            for h in batch:
                if results[h].result == "skipped":
                    results[h].result = "interrupted"
                    results[h].reason = "interrupted during its deploy; see `invoke status` and `invoke releases`"
            report.aborted = True
            report.abort_reason = f"interrupted during batch {i + 1}; no further batch started"
            log(f"STOP: {report.abort_reason}")
            break
        finally:
            if progress is not None:
                progress.end()
        failed = sum(1 for h in batch if results[h].failed)
        if check:
            continue
        if batch_aborts(failed, len(batch), max_fail_percentage):
            limit = ("every host failed" if max_fail_percentage is None
                     else f"over --max-fail-percentage {max_fail_percentage:g}")
            report.aborted = True
            report.abort_reason = (
                f"batch {i + 1}: {failed} of {len(batch)} host(s) failed "
                f"({100.0 * failed / len(batch):.0f}%, {limit}); no further batch started"
            )
            log(f"ABORT: {report.abort_reason}")
            break
        if stop is not None and stop.is_set() and i + 1 < len(plan):
            report.aborted = True
            report.abort_reason = f"stopped after batch {i + 1} on request"
            log(f"STOP: {report.abort_reason}")
            break
        if pause > 0 and i + 1 < len(plan):
            log(f"pausing {pause:g}s before batch {i + 2}")
            sleep(pause)

    for res in report.hosts:
        if res.result == "skipped" and report.aborted:
            res.reason = "not started: the rollout was aborted"

    if report.aborted and rollback_on_abort and rollback is not None:
        done = [r.host for r in report.hosts if r.result in UPGRADED]
        if done:
            log(f"rolling back {len(done)} upgraded host(s): {', '.join(done)}")

            def apply_rollback(res: HostResult, outcome: Any, t0: float) -> None:
                rb = str(getattr(outcome, "result", "error"))
                res.rollback = rb
                why = str(getattr(outcome, "reason", "") or "")
                if rb in ("deployed", "rolled_back", "unchanged"):
                    res.result = "rolled_back"
                    res.releases = dict(getattr(outcome, "releases", None) or {}) or res.releases
                    res.reason = "rolled back: the rollout was aborted"
                else:
                    res.reason = f"rollback on abort failed: {why or rb}; host is on the new release"
                log(f"{res.host}: rollback {rb}{' (' + why + ')' if why else ''}")

            _run_batch(done, rollback, forks, results, log, clock, apply_rollback)
    report.duration_s = clock() - t_start
    return report


# ---------------------------------------------------------------------------------------------
# The real deploy and rollback (shell: llmfleet.release.deploy)


def prepare(inventory: Inventory, hosts: Sequence[str], changes: dict[str, HostChange], *, config: Settings,
            options: DeployOptions) -> dict[str, PreparedHost]:
    """Every host's deploy prepared before any host is touched, by the deploy's own preparation: the
    overrides fit each service's schema, secrets resolve, every image is pinned. The first that does
    not is a usage error naming its host and service; the deploys then take what was prepared here."""
    locks: dict[str, Any] = {}
    out: dict[str, PreparedHost] = {}
    for host in hosts:
        ch = changes.get(host) or HostChange({})
        out[host] = prepare_host(inventory, host, config, _host_options(options, ch), lock_cache=locks)
    return out


def _host_options(options: DeployOptions, change: HostChange) -> DeployOptions:
    return dataclasses.replace(options, overrides=dict(change.overrides),
                               services=list(change.services) if change.services else None)


def deploy_fn(inventory: Inventory, *, config: Settings, options: DeployOptions, changes: dict[str, HostChange],
              log: Callable[[str], None], prepared: dict[str, PreparedHost] | None = None,
              bench_gate: float | None = None, bench_dir: str | None = None) -> Callable[[str], HostOutcome]:
    """``host -> HostOutcome`` running ``llmfleet.release.deploy.deploy_host`` (``release.pipeline``'s
    stages, as ``invoke deploy``) with this host's change.

    ``bench_gate``: wrapped by ``llmfleet.fleet.bench_gate`` (a host whose new release decodes more than
    that percentage slower than the replaced one is rolled back and counts as failed)."""

    def run(host: str) -> HostOutcome:
        opts = _host_options(options, changes.get(host) or HostChange({}))
        return deploy_host(inventory, host, config=config, options=opts, log=lambda line: log(f"{host}: {line}"),
                           prepared=(prepared or {}).get(host))

    if bench_gate is not None and not options.check:
        from llmfleet.fleet import bench_gate as gate_mod

        return gate_mod.gated(run, inventory, pct=bench_gate, config=config, options=options, log=log,
                              services={h: ch.services for h, ch in changes.items()}, bench_dir=bench_dir)
    return run


def rollback_fn(inventory: Inventory, *, config: Settings, options: DeployOptions,
                log: Callable[[str], None]) -> Callable[[str], HostOutcome]:
    def run(host: str) -> HostOutcome:
        return rollback_host(inventory, host, config=config, options=options, log=lambda line: log(f"{host}: {line}"))

    return run


# ---------------------------------------------------------------------------------------------
# Units: a host's own services, then the services over several hosts (shell: llmfleet.release.multihost)


def unit_deploy_fn(inventory: Inventory, units: Sequence[Unit], *, host_deploy: Callable[[str], Any],
                   config: Settings, options: DeployOptions, changes: dict[str, HostChange],
                   log: Callable[[str], None], prepared_services: dict[tuple[str, str], Any] | None = None
                   ) -> Callable[[str], Any]:
    """``key -> outcome`` for a rollout unit: ``host_deploy`` for each host's own services, then
    ``multihost.deploy_service`` for each service over several hosts, one after the other; the
    first failure ends the unit. A unit of one host with no such service is ``host_deploy`` itself."""
    by_key = {u.key: u for u in units}

    def run(key: str) -> Any:
        from llmfleet.release.multihost import deploy_service

        u = by_key[key]
        if not u.services and u.singles == (key,):
            return host_deploy(key)
        parts: list[tuple[str, Any]] = []
        for h in u.singles:
            parts.append((h, host_deploy(h)))
            if str(getattr(parts[-1][1], "result", "error")) in FAILED:
                return combine(u, parts)
        for head, svc in u.services:
            opts = _host_options(options, changes.get(head) or HostChange({}))
            res = deploy_service(inventory, head, svc, config=config, options=opts, log=log,
                                 prepared=(prepared_services or {}).get((head, svc)))
            parts.append((f"{svc} over {', '.join(sorted(res.hosts) or [head])}", res))
            if res.result in FAILED:
                break
        return combine(u, parts)

    return run


def unit_rollback_fn(inventory: Inventory, units: Sequence[Unit], *, config: Settings, options: DeployOptions,
                     log: Callable[[str], None]) -> Callable[[str], Any]:
    """``key -> outcome`` rolling a unit back: each host's own services, then each service over several
    hosts on all its hosts together (``multihost.rollback_service``)."""
    by_key = {u.key: u for u in units}
    one = rollback_fn(inventory, config=config, options=options, log=log)

    def run(key: str) -> Any:
        from llmfleet.release.multihost import rollback_service

        u = by_key[key]
        if not u.services and u.singles == (key,):
            return one(key)
        parts: list[tuple[str, Any]] = [(h, one(h)) for h in u.singles]
        for head, svc in u.services:
            parts.append((svc, rollback_service(inventory, head, svc, config=config, options=options, log=log)))
        out = combine(u, parts)
        if all(str(getattr(o, "result", "")) == "rolled_back" for _l, o in parts):
            out.result = "rolled_back"
        return out

    return run
