"""Deploy and roll back the services of one host: the thin executor of ``llmfleet.release.decide``.

``deploy_host`` for one inventory host:

1. prepare (no SSH yet): the services with this run's overrides, their secrets, their pinned images;
   a usage error stops here (``prepare_host``, which ``fleet.upgrade`` calls too);
2. connect with strict host keys; gather facts in one round trip and run the preflight; a FAIL stops
   here, nothing changed;
3. read the releases' state (``store.state_script``), render each service, and ``decide``: unchanged,
   new release, switch to an existing one, health-check one an interrupted deploy left, restart;
4. ``check``/``diff`` stop here (diffs with secrets masked);
5. take the host's deploy lock (a stale one left by this machine is taken over, others refuse);
6. pull every new image by digest while the old release still serves, and verify the digest;
7. per service: upload, point ``current`` at it and restart, health-check through an SSH-forwarded
   port; on failure capture the engine log and go back to the previous release;
8. after success prune (``decide.prune_plan``); last round trip: health marks, prune, audit, unlock.

``deploy_host`` never raises for a per-host failure: the outcome's ``result`` (a ``Result``) says
what happened, per service too (``ServiceOutcome``), with a one-line reason. Only usage errors raise.
"""

from __future__ import annotations

import dataclasses
import difflib
import getpass
import hashlib
import os
import re
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from llmfleet import __version__
from llmfleet.errors import LlmfleetError, RemoteError, UsageError
from llmfleet.host import facts as facts_mod
from llmfleet.host import ssh
from llmfleet.images import lock as images
from llmfleet.images.registry import split_reference
from llmfleet.inventory.ansible import Host, Inventory, load_inventory, settings_for
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.knowledge import preflight
from llmfleet.knowledge.planner import PlanSummary, summarize
from llmfleet.release import audit, decide, health, store
from llmfleet.release.decide import Action, GoBack, Refusal, Result, ServiceStep
from llmfleet.release.manifest import Manifest
from llmfleet.release.render import ENV_FILE, Rendered, render
from llmfleet.release.secret import resolve_secret
from llmfleet.release.store import Paths
from llmfleet.settings import Settings

LOG_LINES = 200

Log = Callable[[str], None]


RESULTS = tuple(r.value for r in Result)
OK_RESULTS = frozenset({Result.DEPLOYED, Result.UNCHANGED, Result.CHECK})


@dataclass
class DeployOptions:
    check: bool = False
    diff: bool = False
    accept_new_host_keys: bool = False
    allow_unpinned: bool = False
    message: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    who: str | None = None
    services: list[str] | None = None  # only these services of the host (default: all)


@dataclass
class ServiceOutcome:
    """What a run did to one service. ``release``: the release it tried; ``current``: the release
    current when the run ended (None: the unit was stopped, or unknown)."""

    service: str
    result: Result
    release: str | None = None
    current: str | None = None
    previous: str | None = None
    reason: str = ""


@dataclass
class HostOutcome:
    host: str
    result: Result
    releases: dict[str, str] = field(default_factory=dict)  # service -> current release after the run
    duration_s: float = 0.0
    reason: str = ""
    changes: list[str] = field(default_factory=list)
    diffs: dict[str, str] = field(default_factory=dict)
    preflight: list[dict[str, Any]] = field(default_factory=list)
    health: dict[str, Any] = field(default_factory=dict)
    services: dict[str, ServiceOutcome] = field(default_factory=dict)
    round_trips: int = 0

    @property
    def ok(self) -> bool:
        return self.result in OK_RESULTS

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Pure helpers


def default_who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name (a container without passwd entry)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def apply_overrides(service: Service, overrides: dict[str, Any], where: str) -> Service:
    """``--set key=value`` / ``--image`` on top of the inventory's service; validated like the inventory."""
    if not overrides:
        return service
    data = service.model_dump(mode="json", exclude_unset=True)
    data.update(overrides)
    try:
        return Service.model_validate(data)
    except Exception as exc:  # noqa: BLE001 - pydantic's error, shortened to one line
        first = str(exc).splitlines()
        raise UsageError(f"{where}: overrides {sorted(overrides)} do not fit the service schema: "
                         f"{' '.join(first[1:3]) if len(first) > 2 else first[0]}") from None


def unified_diff(old: str | None, new: str, name: str) -> str:
    return "".join(difflib.unified_diff(
        (old or "").splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"current/{name}" if old is not None else "/dev/null", tofile=f"new/{name}",
    ))


def service_for_release(service: Service, manifest: Manifest | None) -> Service:
    """The inventory's service as an older release ran it: its port, served name and health settings
    come from that release's manifest (going back health-checks what the release serves, against the
    floor it was deployed with, not what the inventory or this run's overrides say now)."""
    inputs = manifest.inputs if manifest else {}
    if not inputs:
        return service
    data = service.model_dump(mode="json", exclude_unset=True)
    for k in ("port", "served_name"):
        if inputs.get(k) is not None:
            data[k] = inputs[k]
        elif k == "served_name":
            data.pop(k, None)
    if isinstance(inputs.get("health"), dict):
        data["health"] = inputs["health"]
    else:
        data.pop("health", None)
    try:
        return Service.model_validate(data)
    except Exception:  # noqa: BLE001 - an old manifest that no longer fits the schema: judge by the inventory
        return service


def pid_alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_KEY_LINE = re.compile(r"(Error\b|Exception\b|\bERROR\b|error:|FATAL|[Ff]ailed to|Insufficient|out of memory|"
                       r"no kernel image|not supported|No such file)")


def summarize_log(text: str, key_lines: int = 4, tail: int = 3) -> str:
    """The engine's root cause and last words on one line: the last lines that name an error (a
    Python traceback's final ``RuntimeError: ...``, CUDA's "out of memory"), then the last lines."""
    lines = [_ANSI.sub("", ln).strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    keys = [ln for ln in lines if _KEY_LINE.search(ln) and not ln.lstrip().startswith(("File ", "^", "Traceback"))]
    picked: list[str] = []
    for ln in keys[-key_lines:] + lines[-tail:]:
        if ln not in picked:
            picked.append(ln[:300])
    return " | ".join(picked)


def short(text: str, n: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def now_utc() -> datetime:
    return datetime.now(UTC)


def image_of(ref: str) -> images.ImageRef:
    """An older release's image, from the reference its manifest recorded."""
    repo, tag, digest = split_reference(ref)
    return images.ImageRef(key=ref, repository=repo, digest=digest, tag=tag, pinned=digest is not None,
                           upstream_repository=repo)


# ---------------------------------------------------------------------------------------------
# Preparation (before any SSH)


@dataclass(frozen=True)
class Prepared:
    """One service ready to deploy: this run's overrides applied, its secret and pinned image resolved."""

    service: Service
    api_key: str | None
    image: images.ImageRef


@dataclass(frozen=True)
class PreparedHost:
    inventory: Inventory
    host: Host
    settings: HostSettings
    services: tuple[Prepared, ...]


def load_host(inventory: Inventory | str | os.PathLike[str], host_name: str) -> tuple[Inventory, Host, HostSettings]:
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    host = inv.hosts.get(host_name)
    if host is None:
        raise UsageError(f"{inv.path}: no host {host_name!r}; hosts: {', '.join(inv.hosts) or '(none)'}")
    return inv, host, settings_for(host)


def prepare_host(inventory: Inventory | str, host_name: str, settings: Settings, options: DeployOptions,
                 lock_cache: dict[str, images.ImageLock] | None = None) -> PreparedHost:
    """Everything decided before SSH: the services chosen, this run's overrides, secrets, images.
    Raises ``UsageError`` for the first thing that does not fit (nothing contacted)."""
    inv, host, host_settings = load_host(inventory, host_name)
    path = images.lock_path_for(host.vars, inv.path, settings.images_lock)
    cache = lock_cache if lock_cache is not None else {}
    if str(path) not in cache:
        cache[str(path)] = images.load_lock(path)
    lock = cache[str(path)]
    chosen = host_settings.services
    if options.services:
        names = {s.name for s in chosen}
        unknown = [s for s in options.services if s not in names]
        if unknown:
            raise UsageError(f"{inv.path}: host {host.name} has no service {unknown[0]!r} "
                             f"(services: {', '.join(sorted(names)) or 'none'})")
        chosen = [s for s in chosen if s.name in options.services]
    out = []
    for svc in chosen:
        where = f"host {host.name}: service {svc.name}"
        svc = apply_overrides(svc, options.overrides, where)
        key = resolve_secret(svc.api_key, where)
        ref = images.resolve(svc.image, lock, mirrors=dict(host_settings.image_mirrors),
                             allow_unpinned=options.allow_unpinned, where=where)
        out.append(Prepared(svc, key, ref))
    return PreparedHost(inv, host, host_settings, tuple(out))


# ---------------------------------------------------------------------------------------------
# The executor: one host's connection, lock, audit lines and last round trip


@dataclass(frozen=True)
class HealthTarget:
    """What one health check is asked about."""

    service: Service
    api_key: str | None
    paths: Paths
    release_id: str
    plan: PlanSummary | None


HealthFn = Callable[["HostRun", HealthTarget], health.HealthReport]


def http_health(run: HostRun, target: HealthTarget) -> health.HealthReport:
    """The staged health check over HTTP through an SSH-forwarded port (llmfleet.release.health)."""
    svc = target.service

    def probe() -> store.UnitProbe:
        return store.parse_unit_probe(run.run(store.unit_probe_script(target.paths), timeout=30).stdout)

    with run.remote.forward(svc.port) as local_port:
        return health.HealthChecker(
            probe=probe,
            base_url=f"http://127.0.0.1:{local_port}",
            served_name=svc.public_name,
            api_key=target.api_key,
            load_timeout_s=svc.health.load_timeout_s,
            stage_timeout_s=svc.health.stage_timeout_s,
            max_tokens=svc.health.max_tokens,
            floor=health.decode_floor(svc, run.host_settings, target.plan),
            realistic=health.realistic_tokps(target.plan),
            progress=lambda line: run.log(f"{svc.name}:{line}"),
        ).run()


class HostRun:
    """The shell around one host's run. Everything it sends is built by ``llmfleet.release.store``;
    what it decides comes from ``llmfleet.release.decide``. ``health``, ``now``, ``token`` and
    ``alive`` are injected so that the executor runs against a scripted remote in tests."""

    def __init__(self, host_name: str, host_settings: HostSettings, remote: Any, *, settings: Settings,
                 options: DeployOptions, log: Log, health_fn: HealthFn = http_health,
                 now: Callable[[], datetime] = now_utc, token: Callable[[], str] = lambda: secrets.token_hex(16),
                 alive: Callable[[int], bool] = pid_alive, origin: str | None = None, pid: int | None = None) -> None:
        self.host = host_name
        self.host_settings = host_settings
        self.root = host_settings.root
        self.remote = remote
        self.settings = settings
        self.options = options
        self.log = log
        self.health_fn = health_fn
        self.now = now
        self.token = token
        self.alive = alive
        self.origin = origin or default_who()
        self.who = options.who or self.origin
        self.pid = os.getpid() if pid is None else pid
        self.audit: list[dict[str, Any]] = []
        self.deferred: list[str] = []
        self.lock_token: str | None = None

    def run(self, script: str, *, timeout: float | None = None, stdin: bytes | None = None,
            check: bool = False) -> ssh.Result:
        return self.remote.run(script, timeout=timeout, stdin=stdin, sudo=True, check=check)

    def read_state(self) -> dict[str, store.ServiceState]:
        res = self.run(store.state_script(self.root), check=True)
        if not store.state_complete(res.stdout):
            raise RemoteError(f"host {self.host}: the release state came back cut short: {short(res.stdout, 200)}")
        return store.parse_state(res.stdout)

    def record(self, *, action: str, service: str | None, release_id: str | None, digest: str | None,
               result: str, detail: str = "", **extra: Any) -> None:
        self.audit.append(store.audit_record(now=self.now(), who=self.who, host=self.host, action=action,
                                             service=service, release=release_id, digest=digest, result=result,
                                             detail=detail, message=self.options.message, **extra))

    # -- lock -------------------------------------------------------------------------------------

    def lock(self, action: str) -> None:
        token = self.token()
        holder = store.holder_document(token=token, who=self.who, origin=self.origin, action=action,
                                       message=self.options.message, now=self.now(), pid=self.pid)
        for attempt in range(2):
            res = self.run(store.lock_acquire_script(self.root, holder))
            got = store.parse_lock_acquire(res.rc, res.stdout)
            if got.acquired:
                self.lock_token = token
                return
            if attempt == 0 and decide.may_take_over(got.holder, self.origin, self.alive):
                self.log(f"taking over a stale lock left by this machine: {store.describe_holder(got.holder, self.now())}")
                self.run(store.lock_break_script(self.root))
                self.record(action="lock-break", service=None, release_id=None, digest=None, result="stale",
                            detail=store.describe_holder(got.holder))
                continue
            if got.holder is None and res.rc not in (0, store.LOCK_HELD_RC):
                raise Refusal(Result.FAILED, f"cannot take the deploy lock: {short(res.stderr or res.stdout)}")
            holder_now = got.holder
            if holder_now is None:  # the answer was cut short: ask who holds it
                _, holder_now = store.parse_lock_status(self.run(store.lock_status_script(self.root)).stdout)
            raise Refusal(Result.REFUSED, f"deploy lock {store.describe_holder(holder_now, self.now())}; wait, or "
                                          f"inspect with `invoke lock.status --host {self.host}` and break a stale one "
                                          f"with `invoke lock.release --host {self.host} --yes`")

    # -- the last round trip ----------------------------------------------------------------------

    def defer(self, script: str) -> None:
        """Run ``script`` in the last round trip, before the audit lines and the unlock."""
        self.deferred.append(script)

    def finish(self, *, write_audit: bool = True) -> None:
        """One round trip at the end: deferred steps (marks, prune), the audit lines, the unlock.

        If it does not arrive (a dropped connection), the release is simply not marked healthy yet and
        the lock is stale: the next deploy from this machine verifies the release and takes the lock over.
        """
        records = self.audit if write_audit else []
        try:
            audit.append_local(self.settings.audit_log_path, records)
        except OSError as exc:
            self.log(f"warning: local audit log {self.settings.audit_log}: {exc}")
        parts = [f"(\n{sc}\n)" for sc in self.deferred]
        parts += [store.audit_append_script(self.root, r) for r in records]
        token = self.lock_token
        if token is not None:
            parts.append(f"(\n{store.lock_release_script(self.root, token)}\n)")
        self.deferred, self.audit, self.lock_token = [], [], None
        if not parts or self.remote is None:
            return
        try:
            res = self.run("\n".join(parts), timeout=300)
        except LlmfleetError as exc:
            self.log(f"warning: the final step (mark, prune, audit, unlock) did not complete: {exc}"
                     + (f"; the next deploy from this machine takes the lock over, others need "
                        f"`invoke lock.release --host {self.host} --yes`" if token else ""))
            return
        if token is not None and not store.parse_lock_release(res.stdout):
            self.log(f"warning: the deploy lock was not ours to release: {short(res.stdout)}")
        removed = store.parse_removed_images(res.stdout)
        if removed:
            self.log(f"removed {len(removed)} image(s) no kept release uses")

    # -- steps ------------------------------------------------------------------------------------

    def check_health(self, target: HealthTarget, what: str) -> health.HealthReport:
        self.log(f"{target.service.name}: health check of {what} (port {target.service.port} through SSH)")
        return self.health_fn(self, target)

    def engine_log(self, paths: Paths) -> str:
        try:
            out = self.run(store.logs_script(paths, LOG_LINES), timeout=30).stdout
        except LlmfleetError as exc:
            return f"(engine log unavailable: {exc})"
        return summarize_log(out)

    def mark(self, paths: Paths, release_id: str, report: health.HealthReport, *, now: bool = True) -> None:
        doc = report.to_dict() | {"release": release_id, "time": self.now().isoformat(timespec="seconds"),
                                  "who": self.who}
        script = store.mark_healthy_script(paths, release_id, doc)
        if now:
            self.run(script, timeout=30)
        else:
            self.defer(script)

    def switch(self, paths: Paths, release_id: str) -> ssh.Result:
        return self.run(store.switch_script(paths, release_id), timeout=180)

    def go_back(self, paths: Paths, service: Service, api_key: str | None, previous: str | None,
                state: store.ServiceState | None) -> GoBack:
        """Point ``current`` back at ``previous``, restart and health-check it (no previous: stop the unit)."""
        if previous is None:
            try:
                self.run(store.stop_script(paths, forget_current=True), timeout=120)
            except LlmfleetError as exc:
                return GoBack(GoBack.STOP_FAILED, None, str(exc))
            return GoBack(GoBack.STOPPED, None)
        try:
            res = self.switch(paths, previous)
            if not store.parse_switch(res.rc, res.stdout):
                return GoBack(GoBack.SWITCH_FAILED, previous, short(res.stderr or res.stdout, 200))
            info = state.releases.get(previous) if state else None
            manifest = info.manifest if info else None
            target = HealthTarget(service_for_release(service, manifest), api_key, paths, previous,
                                  manifest.plan_summary() if manifest else None)
            report = self.check_health(target, f"previous release {previous}")
        except LlmfleetError as exc:
            return GoBack(GoBack.ERROR, previous, str(exc))
        if not report.ok:
            return GoBack(GoBack.UNHEALTHY, previous, report.message)
        try:
            self.mark(paths, previous, report)
        except LlmfleetError:
            pass
        return GoBack(GoBack.HEALTHY, previous)


def _connect(host: Host, settings: Settings, options: DeployOptions) -> Any:
    try:
        return ssh.connect(host, config=settings.ssh, accept_new_host_keys=options.accept_new_host_keys)
    except ssh.HostKeyError as exc:
        raise Refusal(Result.REFUSED, str(exc)) from None
    except RemoteError as exc:
        raise Refusal(Result.FAILED, str(exc)) from None


def _run_host(host: Host, host_settings: HostSettings, out: HostOutcome, action: str, *, settings: Settings,
              options: DeployOptions, log: Log, body: Callable[[HostRun], None],
              connect: Callable[[], Any] | None = None, health_fn: HealthFn = http_health) -> None:
    """Connect, run ``body``, and always: turn a refusal into the outcome, write the audit, unlock, close."""
    t0 = time.monotonic()
    run = HostRun(host.name, host_settings, None, settings=settings, options=options, log=log, health_fn=health_fn)
    try:
        run.remote = connect() if connect else _connect(host, settings, options)
        body(run)
    except Refusal as exc:
        out.result, out.reason = Result(exc.result), exc.reason
    except RemoteError as exc:
        out.result, out.reason = Result.FAILED, str(exc)
    finally:
        if out.result in {Result.REFUSED, Result.FAILED} and not run.audit and not options.check:
            run.record(action=action, service=None, release_id=None, digest=None, result=out.result,
                       detail=out.reason)
        try:
            run.finish(write_audit=not options.check)
        finally:
            out.round_trips = getattr(run.remote, "round_trips", 0) or 0
            if run.remote is not None:
                try:
                    run.remote.close()
                except Exception:  # noqa: BLE001,S110 - closing a dead connection must not hide the outcome
                    pass
            out.duration_s = round(time.monotonic() - t0, 3)


# ---------------------------------------------------------------------------------------------
# deploy


@dataclass
class _Item:
    """One service of this deploy, as it goes through the steps."""

    prepared: Prepared
    plan: PlanSummary | None
    rendered: Rendered
    paths: Paths
    state: store.ServiceState | None
    step: ServiceStep
    manifest: Manifest | None = None
    health: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.prepared.service.name


def deploy_host(
    inventory: Inventory | str,
    host_name: str,
    *,
    config: Settings | dict[str, Any] | None = None,
    options: DeployOptions,
    log: Log,
    prepared: PreparedHost | None = None,
) -> HostOutcome:
    """Deploy every llmfleet service of one host (see the module docstring)."""
    settings = Settings.of(config)
    ready = prepared or prepare_host(inventory, host_name, settings, options)
    out = HostOutcome(host=host_name, result=Result.UNCHANGED)
    if not ready.services:
        out.reason = "no llmfleet_services on this host"
        return out
    _run_host(ready.host, ready.settings, out, "deploy", settings=settings, options=options, log=log,
              body=lambda run: run_deploy(run, ready, out))
    return out


def _preflight(run: HostRun, ready: PreparedHost, out: HostOutcome) -> list[Any]:
    """Facts (one round trip) and the preflight's verdict for each service; the plans it made."""
    found = facts_mod.gather(run.remote, root=run.root, model_paths=[p.service.model_path for p in ready.services])
    plans: list[Any] = []
    bad: list[str] = []
    warns = 0
    for p in ready.services:
        plan, plan_error = preflight.plan_for(p.service, found, run.host_settings)
        checks = preflight.run_checks(run.host, p.service, found, plan, p.image, plan_error=plan_error)
        plans.append(plan)
        out.preflight.append({"service": p.service.name, "ok": preflight.ok(checks),
                              "checks": [c.to_dict() for c in checks]})
        for c in checks:
            if c.status == "fail":
                bad.append(f"{p.service.name}: {c.id}: {c.message}" + (f" (fix: {c.fix})" if c.fix else ""))
            warns += c.status == "warn"
    if bad:
        raise Refusal(Result.REFUSED, "preflight failed: " + "; ".join(bad))
    run.log(f"preflight passed ({warns} warning{'s' if warns != 1 else ''})")
    return plans


def run_deploy(run: HostRun, ready: PreparedHost, out: HostOutcome, plans: list[Any] | None = None) -> None:
    """The deploy after connecting. ``plans`` (one per service) skips the facts and preflight."""
    if plans is None:
        plans = _preflight(run, ready, out)
    states = run.read_state()
    items: list[_Item] = []
    for p, plan in zip(ready.services, plans, strict=True):
        rendered = render(p.service, ready.settings, p.image, plan, api_key=p.api_key)
        st = states.get(p.service.name)
        items.append(_Item(p, summarize(plan), rendered, Paths(run.root, p.service.name), st,
                           decide.decide_service(st, rendered, run.now())))
    for it in items:
        out.releases[it.name] = it.step.release_id
        out.changes.extend(f"{it.name}: {c}" for c in it.step.changes)

    if run.options.diff:
        _diff(run, items, out)
    todo = [it for it in items if it.step.action != Action.UNCHANGED]
    if run.options.check or run.options.diff:
        out.result = Result.CHECK
        out.reason = f"{len(todo)} of {len(items)} service(s) would change" if todo else "no change"
        return
    if not todo:
        out.result = Result.UNCHANGED
        out.reason = "nothing to do: every service runs its current, healthy release"
        for it in items:
            _unchanged(run, it, out)
        return

    run.lock("deploy")
    for it in todo:  # every image the new releases need, while the old ones still serve
        if it.step.pulls:
            _pull(run, it)
    for it in items:
        if it.step.action == Action.UNCHANGED:
            _unchanged(run, it, out)
            continue
        so = _switch_and_check(run, it)
        out.services[it.name] = so
        if it.health is not None:
            out.health[it.name] = it.health
        if so.result != Result.DEPLOYED:
            out.result, out.reason = so.result, so.reason
            out.releases[it.name] = so.current or (it.state.current if it.state else None) or so.release or ""
            return
    out.result = Result.DEPLOYED
    out.reason = "; ".join(f"{it.name} on {it.step.release_id}" for it in todo)
    after = decide.state_after(states, {it.name: (it.step.release_id, it.manifest, it.health) for it in todo})
    _prune(run, decide.prune_plan(after, run.host_settings.keep_releases))


def _unchanged(run: HostRun, it: _Item, out: HostOutcome) -> None:
    run.log(f"{it.name}: unchanged (release {it.step.release_id}, no restart)")
    out.services[it.name] = ServiceOutcome(it.name, Result.UNCHANGED, it.step.release_id, it.step.release_id)
    run.record(action="deploy", service=it.name, release_id=it.step.release_id, digest=it.prepared.image.digest,
               result=Result.UNCHANGED)


def _diff(run: HostRun, items: list[_Item], out: HostOutcome) -> None:
    res = run.run(store.current_files_script(run.root, [it.name for it in items]))
    cur_files, env_hash = store.parse_current_files(res.stdout)
    for it in items:
        old = cur_files.get(it.name, {})
        for name, text in sorted(it.rendered.masked_files().items()):
            d = unified_diff(old.get(name), text, name)
            if name == ENV_FILE and it.name in env_hash:
                new_hash = hashlib.sha256(it.rendered.files[ENV_FILE].encode()).hexdigest()
                if new_hash != env_hash[it.name] and not d:
                    d = f"--- current/{name}\n+++ new/{name}\n# secret values changed (masked)\n"
            if d:
                out.diffs[f"{it.name}/{name}"] = d


def _pull(run: HostRun, it: _Item) -> None:
    image = it.prepared.image
    ref = image.pull_ref
    run.log(f"{it.name}: pull {ref}")
    res = run.run(store.pull_script(ref), timeout=run.settings.pull_timeout)
    if res.rc != 0:
        raise Refusal(Result.FAILED, f"{it.name}: pull of {ref} failed: {short(res.stderr or res.stdout, 300)}; "
                                     "nothing was changed on the host")
    pulled, digests = store.parse_pull(res.stdout)
    if image.pinned and not store.digest_verified(digests, image.digest):
        raise Refusal(Result.FAILED, f"{it.name}: {ref} pulled but the engine reports digests {digests}, not "
                                     f"{image.digest}; refusing to run it")
    run.log(f"{it.name}: image {'pulled' if pulled else 'present'}, digest verified" if image.pinned
            else f"{it.name}: image {'pulled' if pulled else 'present'} (UNPINNED)")


def _switch_and_check(run: HostRun, it: _Item) -> ServiceOutcome:
    step, paths, svc = it.step, it.paths, it.prepared.service
    rid, previous, digest = step.release_id, step.previous, it.prepared.image.digest
    switched = False
    try:
        if step.action == Action.NEW:
            it.manifest = Manifest.build(it.rendered, rid, host=run.host, who=run.who, when=run.now(),
                                         llmfleet_version=__version__, message=run.options.message)
            files, modes = store.release_files(it.rendered, it.manifest)
            res = run.run(store.upload_script(paths, rid), stdin=store.pack_release(files, modes), timeout=120)
            if not store.parse_upload(res.rc, res.stdout):
                raise RemoteError(f"upload of release {rid} failed: {short(res.stderr or res.stdout, 300)}")
            run.log(f"{svc.name}: uploaded release {rid}")
        if step.switches:
            res = run.switch(paths, rid)
            switched = True
            if not store.parse_switch(res.rc, res.stdout):
                raise RemoteError(f"switch to {rid} failed: {short(res.stderr or res.stdout, 300)}")
            run.log(f"{svc.name}: current -> {rid}, unit restarted")
        else:
            switched = True  # verify: the release is current and running; only its health is unknown
        report = run.check_health(HealthTarget(svc, it.prepared.api_key, paths, rid, it.plan), f"release {rid}")
    except KeyboardInterrupt:
        if switched:
            run.log(f"{svc.name}: interrupted; going back to {previous or 'nothing (stopping the unit)'}")
            back = run.go_back(paths, svc, it.prepared.api_key, previous, it.state)
            run.record(action="deploy", service=svc.name, release_id=rid, digest=digest, result=back.result,
                       detail=f"interrupted; {back.sentence()}")
        raise
    except RemoteError as exc:
        if not switched:
            run.record(action="deploy", service=svc.name, release_id=rid, digest=digest, result=Result.FAILED,
                       detail=str(exc))
            return ServiceOutcome(svc.name, Result.FAILED, rid, it.state.current if it.state else None, previous,
                                  f"{svc.name}: {exc}; nothing was switched")
        report = None
        failure = str(exc)
    else:
        failure = report.message
    if report is not None:
        it.health = report.to_dict()
    if report is not None and report.ok:
        run.mark(paths, rid, report, now=False)
        run.log(f"{svc.name}: release {rid} healthy ({report.message})")
        run.record(action="deploy", service=svc.name, release_id=rid, digest=digest, result=Result.DEPLOYED,
                   decode_tokps=report.decode_tokps, ttft_s=report.ttft_s)
        return ServiceOutcome(svc.name, Result.DEPLOYED, rid, rid, previous)
    logs = run.engine_log(paths)
    if report is not None:
        try:
            run.mark(paths, rid, report)  # recorded unhealthy: never chosen as a rollback target
        except LlmfleetError:
            pass
    back = run.go_back(paths, svc, it.prepared.api_key, previous, it.state)
    reason = f"{svc.name}: release {rid} failed: {failure}; engine log: {logs or '(empty)'}; {back.sentence()}"
    run.log(f"{svc.name}: FAILED: {failure}")
    run.log(f"{svc.name}: engine log: {logs or '(empty)'}")
    run.log(f"{svc.name}: {back.sentence()}")
    run.record(action="deploy", service=svc.name, release_id=rid, digest=digest, result=back.result,
               detail=f"{failure}; {back.sentence()}")
    return ServiceOutcome(svc.name, Result(back.result), rid, back.current, previous, reason)


def _prune(run: HostRun, plan: decide.PrunePlan) -> None:
    """Deletes what ``decide.prune_plan`` chose, in the final round trip."""
    if plan.empty:
        return
    for name, ids in plan.releases.items():
        run.defer(store.prune_script(Paths(run.root, name), ids))
    if plan.images:
        run.defer(store.image_remove_script(plan.images))
    n = sum(len(v) for v in plan.releases.values())
    run.log(f"pruning {n} old release(s) and {len(plan.images)} unused image(s); keeping "
            f"{run.host_settings.keep_releases} per service")


# ---------------------------------------------------------------------------------------------
# rollback


def rollback_host(
    inventory: Inventory | str,
    host_name: str,
    *,
    service: str | None = None,
    to: str | None = None,
    config: Settings | dict[str, Any] | None = None,
    options: DeployOptions,
    log: Log,
) -> HostOutcome:
    """Point a service back at an earlier release (default: the newest healthy one before current)."""
    settings = Settings.of(config)
    inv, host, host_settings = load_host(inventory, host_name)
    if to is not None and not decide.is_release_id(to):
        raise UsageError(f"--to {to!r} is not a release id (like 20261129T120000Z-0123456789); "
                         f"see `invoke releases --host {host_name}`")
    names = [s.name for s in host_settings.services]
    if service is not None and service not in names:
        raise UsageError(f"{inv.path}: host {host_name} has no service {service!r} (services: {', '.join(names) or 'none'})")
    out = HostOutcome(host=host_name, result=Result.FAILED)
    _run_host(host, host_settings, out, "rollback", settings=settings, options=options, log=log,
              body=lambda run: run_rollback(run, service, to, out))
    if out.result == Result.FAILED and not out.reason:
        out.reason = "rollback failed"
    return out


def run_rollback(run: HostRun, service: str | None, to: str | None, out: HostOutcome) -> None:
    """The rollback after connecting: decide each service's target, then switch, check, go back on failure."""
    states = run.read_state()
    inv_services = {s.name: s for s in run.host_settings.services}
    steps = decide.decide_rollback(states, [n for n in inv_services if service in (None, n)], host=run.host,
                                   service=service, to=to)
    keys = {st.service: resolve_secret(inv_services[st.service].api_key, f"host {run.host}: service {st.service}")
            for st in steps}
    run.lock("rollback")
    for step in steps:
        paths, st = Paths(run.root, step.service), states[step.service]
        svc = service_for_release(inv_services[step.service], step.manifest)
        image = image_of(step.image_ref)
        if not store.parse_image_present(run.run(store.image_present_script(step.image_ref), timeout=30).stdout):
            raise Refusal(Result.FAILED, f"service {step.service}: the image of release {step.target} "
                                         f"({step.image_ref}) is no longer on the host; redeploy that version instead")
        if step.previous == step.target:
            run.log(f"{step.service}: release {step.target} is already current; restarting and checking it")
        res = run.switch(paths, step.target)
        if not store.parse_switch(res.rc, res.stdout):
            raise Refusal(Result.FAILED, f"{step.service}: switch to {step.target} failed: "
                                         f"{short(res.stderr or res.stdout, 300)}")
        run.log(f"{step.service}: current -> {step.target}, unit restarted")
        report = run.check_health(HealthTarget(svc, keys.get(step.service), paths, step.target,
                                               step.manifest.plan_summary()), f"release {step.target}")
        out.health[step.service] = report.to_dict()
        if report.ok:
            run.mark(paths, step.target, report, now=False)
            out.releases[step.service] = step.target
            out.services[step.service] = ServiceOutcome(step.service, Result.ROLLED_BACK, step.target, step.target,
                                                        step.previous)
            out.changes.append(f"{step.service}: {step.previous} -> {step.target}")
            run.record(action="rollback", service=step.service, release_id=step.target, digest=image.digest,
                       result=Result.ROLLED_BACK, detail=f"from {step.previous}")
            continue
        logs = run.engine_log(paths)
        if step.previous and step.previous != step.target:
            back = run.go_back(paths, inv_services[step.service], keys.get(step.service), step.previous, st)
        else:
            back = GoBack(GoBack.NOTHING, None)
        out.result = Result.FAILED
        out.reason = (f"ROLLBACK FAILED: {step.service}: release {step.target} is unhealthy: {report.message}; "
                      f"engine log: {logs or '(empty)'}; {back.sentence(still=True)}")
        out.releases[step.service] = back.current or ""
        out.services[step.service] = ServiceOutcome(step.service, Result.FAILED, step.target, back.current,
                                                    step.previous, out.reason)
        run.log(out.reason)
        run.record(action="rollback", service=step.service, release_id=step.target, digest=image.digest,
                   result=Result.FAILED, detail=f"{report.message}; {back.sentence(still=True)}")
        return
    out.result = Result.ROLLED_BACK
    out.reason = "; ".join(out.changes)


# ---------------------------------------------------------------------------------------------
# lock inspection and breaking (lock.status / lock.release)


def lock_status(host: Host, host_settings: HostSettings, *, config: Settings | dict[str, Any] | None = None,
                accept_new_host_keys: bool = False) -> dict[str, Any]:
    with ssh.connect(host, config=Settings.of(config).ssh, accept_new_host_keys=accept_new_host_keys) as remote:
        res = remote.run(store.lock_status_script(host_settings.root), sudo=True, timeout=30)
    held, holder = store.parse_lock_status(res.stdout)
    return {"host": host.name, "held": held, "holder": holder,
            "description": store.describe_holder(holder, now_utc()) if held else "free"}


def lock_break(host: Host, host_settings: HostSettings, *, config: Settings | dict[str, Any] | None = None,
               who: str | None = None, accept_new_host_keys: bool = False) -> dict[str, Any]:
    """Remove the host's deploy lock whoever holds it; audited on the host and locally."""
    settings = Settings.of(config)
    who = who or default_who()
    with ssh.connect(host, config=settings.ssh, accept_new_host_keys=accept_new_host_keys) as remote:
        res = remote.run(store.lock_break_script(host_settings.root), sudo=True, timeout=30)
        held, broken, holder = store.parse_lock_break(res.stdout)
        if broken:
            rec = store.audit_record(now=now_utc(), who=who, host=host.name, action="lock-break", service=None,
                                     release=None, digest=None, result="broken",
                                     detail=store.describe_holder(holder))
            remote.run(store.audit_append_script(host_settings.root, rec), sudo=True, timeout=30)
            try:
                audit.append_local(settings.audit_log_path, rec)
            except OSError:
                pass
    return {"host": host.name, "was_held": held, "broken": broken, "holder": holder,
            "description": store.describe_holder(holder, now_utc()) if held else "free"}

