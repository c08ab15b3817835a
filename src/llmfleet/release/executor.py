"""The shell around one host's run: its connection, the steps' remote calls, the lock, the audit
lines and the last round trip. ``llmfleet.release.pipeline`` drives a set of them through the stages.

``HostRun`` sends only what ``llmfleet.release.store`` builds and reads answers only through its
parsers; what to do comes from ``llmfleet.release.decide``. The health check, the clock, the lock
token and the liveness test of a lock holder's process are injected, so that the deploy runs against
a scripted remote in tests (tests/test_deploy_executor.py). ``lock_status`` / ``lock_break`` are the
``lock.*`` tasks' remote side.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from llmfleet.errors import LlmfleetError, RemoteError
from llmfleet.host import early, ssh
from llmfleet.inventory.ansible import Host
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.knowledge import release_state
from llmfleet.knowledge.planner import PlanSummary
from llmfleet.knowledge.release_state import Manifest
from llmfleet.release import audit, decide, store
from llmfleet.release.decide import GoBack, Refusal, Result
from llmfleet.release.store import Paths
from llmfleet.release.who import default_who
from llmfleet.settings import Settings

if TYPE_CHECKING:
    from llmfleet.health import check as health
    from llmfleet.health import residency
    from llmfleet.health.speed_history import FleetGate

LOG_LINES = 200
HOST_TIMER = "confirm_timeout_s too short for this service's load?"
LOCK_POLL_S = 3.0  # a writer waiting for the deploy lock asks again this often
_LIVE_TOKENS: set[str] = set()  # the lock tokens the runs of this process hold now (decide.may_take_over)
_LIVE_GUARD = threading.Lock()

Log = Callable[[str], None]


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




# ---------------------------------------------------------------------------------------------
# The executor


@dataclass(frozen=True)
class HealthTarget:
    """What one health check is asked about."""

    service: Service
    api_key: str | None
    paths: Paths
    release_id: str
    plan: PlanSummary | None
    started: health.UnitProbe | None = None  # the state the switch's round trip saw after the restart
    fleet: FleetGate | None = None  # the floor from the fleet's own earlier runs (health.speed_history)
    residency: bool = True  # compare the engine's load report with the plan (a worker's check does not)
    # the release's own engine flags (the rendered command line, or the manifest's): what the engine was
    # asked for; empty: the plan's flags, then the service's
    engine_args: tuple[str, ...] = ()


HealthFn = Callable[["HostRun", HealthTarget], "health.HealthReport"]


def http_health(run: HostRun, target: HealthTarget) -> health.HealthReport:
    """The staged health check over HTTP through an SSH-forwarded port (llmfleet.health.check)."""
    from llmfleet.health import check as health  # the HTTP client: only when a release is checked

    svc = target.service

    def probe() -> health.UnitProbe:
        return store.parse_unit_probe(run.run(store.unit_probe_script(target.paths), timeout=30).stdout)

    series, path = None, "/metrics"
    if svc.is_exporter:
        from llmfleet.knowledge import exporters

        series = exporters.for_kind(svc.engine).health_series
    elif not svc.is_engine:  # the gateway: its monitor-uri answers 200 while it accepts requests
        from llmfleet.release import gateway_config

        series, path = "", gateway_config.HEALTH_PATH
    with run.link.forward(svc.port, run.host_settings.reach_address_for(svc)) as local_port:
        return health.HealthChecker(
            metrics_series=series,
            metrics_path=path,
            residency=(lambda: residency_check(run, target)) if target.residency else None,
            probe=probe,
            # a gateway with TLS answers only TLS: its own certificate (deployed by this run; its name is
            # not 127.0.0.1) is not verified here, clients verify it
            base_url=f"{'https' if svc.gateway is not None and svc.gateway.tls else 'http'}://127.0.0.1:{local_port}",
            served_name=svc.public_name,
            api_key=target.api_key,
            load_timeout_s=svc.health.load_timeout_s,
            stage_timeout_s=svc.health.stage_timeout_s,
            max_tokens=svc.health.max_tokens,
            floor=floor_for(run, target),
            realistic=health.realistic_tokps(target.plan),
            progress=lambda line: run.log(f"{svc.name}:{line}"),
            initial=target.started,
        ).run()


def floor_for(run: HostRun, target: HealthTarget) -> health.Floor:
    """The decode floor the health check applies to ``target`` (``health.decode_floor``: the
    service's, the host's, the fleet's, the planner's, in that order)."""
    from llmfleet.health import check as health

    return health.decode_floor(target.service, run.host_settings, target.plan, target.fleet)


def residency_check(run: HostRun, target: HealthTarget) -> residency.Residency:
    """One round trip for the engine's load lines, the container's processes and nvidia-smi's GPU
    memory per process, judged against the release's plan (``llmfleet.health.residency``)."""
    from llmfleet.health import residency
    from llmfleet.knowledge.engines import for_engine, loadlog

    svc = target.service
    know = for_engine(svc.engine)
    res = run.run(store.evidence_script(target.paths, know.load_log_grep), timeout=30)
    ev = store.parse_evidence(res.stdout)
    report = know.parse_load_log(ev.log)
    apps = (loadlog.parse_compute_apps(ev.smi_text, ev.smi_rc) if ev.complete else
            loadlog.ComputeApps(error="the evidence round trip ended before nvidia-smi answered"))
    args = list(target.engine_args) or [*(target.plan.engine_args if target.plan else ()), *svc.engine_args]
    return residency.judge(report, apps, set(ev.pids), target.plan, run.host_settings.residency_for(svc),
                           args_kv_tokens=know.kv_tokens_asked(args))


class HostRun:
    """The shell around one host's run. Everything it sends is built by ``llmfleet.release.store``;
    what it decides comes from ``llmfleet.release.decide``. ``health``, ``now``, ``token`` and
    ``alive`` are injected so that the executor runs against a scripted remote in tests."""

    def __init__(self, host_name: str, host_settings: HostSettings, remote: ssh.Link | None, *, settings: Settings, log: Log,
                 who: str | None = None, message: str = "", health_fn: HealthFn = http_health,
                 now: Callable[[], datetime] = now_utc, token: Callable[[], str] = lambda: secrets.token_hex(16),
                 alive: Callable[[int], bool] = pid_alive, origin: str | None = None, pid: int | None = None,
                 clock: Callable[[], float] = time.monotonic, t0: float | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.host = host_name
        self.host_settings = host_settings
        self.root = host_settings.root
        self.remote = remote
        self.settings = settings
        self.message = message
        self.log = log
        self.health_fn = health_fn
        self.now = now
        self.token = token
        self.alive = alive
        self.origin = origin or default_who()
        self.who = who or self.origin
        self.pid = os.getpid() if pid is None else pid
        self.audit: list[dict[str, Any]] = []
        self.deferred: list[str] = []
        self.lock_token: str | None = None
        self.lock_waited_s = 0.0  # how long ``lock`` waited for another writer before it got the lock
        self.lock_holder_seen: dict[str, Any] | None = None  # the holder it waited for
        self.clock = clock
        self.sleep = sleep
        self.t0 = clock() if t0 is None else t0
        self.timeline: list[decide.StageTime] = []

    # -- timeline (``deploy --timeline``) ---------------------------------------------------------

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time one stage of the run: its start (seconds since the run began), duration, round trips."""
        t, rt = self.clock(), self._round_trips()
        try:
            yield
        finally:
            self.timeline.append({"stage": name, "start_s": round(t - self.t0, 3),
                                  "seconds": round(self.clock() - t, 3), "round_trips": self._round_trips() - rt})

    def _round_trips(self) -> int:
        return self.remote.round_trips if self.remote is not None else 0

    def run(self, script: str, *, timeout: float | None = None, stdin: bytes | None = None,
            check: bool = False) -> ssh.Result:
        return self.link.run(script, timeout=timeout, stdin=stdin, sudo=True, check=check)

    @property
    def link(self) -> ssh.Link:
        """The host's connection; a step run before the pipeline connected is a programming error."""
        if self.remote is None:
            raise RemoteError(f"{self.host}: not connected")
        return self.remote

    def run_chain(self, scripts: list[str], *, timeout: float | None = None, stdin: bytes | None = None,
                  stdin_step: int | None = None) -> list[ssh.Result | None]:
        """Several steps in one round trip (``store.chain_script``): each step's own result, None for
        a step that did not run because one before it failed. One step is sent as it is."""
        if len(scripts) == 1:
            return [self.run(scripts[0], timeout=timeout, stdin=stdin)]
        res = self.run(store.chain_script(scripts, stdin_step=stdin_step), timeout=timeout, stdin=stdin)
        parts = store.split_chain(res.stdout, len(scripts))
        if parts[0] is None:  # the script never reached its first step (sudo refused, no shell): its answer
            parts[0] = (res.rc or -1, res.stdout)
        out: list[ssh.Result | None] = []
        for script, part in zip(scripts, parts, strict=True):
            if part is None:
                out.append(None)
                continue
            rc = part[0] if part[0] is not None else (res.rc or -1)
            out.append(ssh.Result(rc=rc, stdout=part[1], stderr=res.stderr if rc != 0 else "", command=script))
        return out

    def read_state(self) -> dict[str, release_state.ServiceState]:
        res = self.run(store.state_script(self.root), check=True)
        if not release_state.state_complete(res.stdout):
            raise RemoteError(f"host {self.host}: the release state came back cut short: {short(res.stdout, 200)}")
        return release_state.parse_state(res.stdout)

    def record(self, *, action: str, service: str | None, release_id: str | None, digest: str | None,
               result: str, detail: str = "", **extra: Any) -> None:
        self.audit.append(store.audit_record(now=self.now(), who=self.who, host=self.host, action=action,
                                             service=service, release=release_id, digest=digest, result=result,
                                             detail=detail, message=self.message, **extra))

    # -- lock -------------------------------------------------------------------------------------

    def lock(self, action: str, then: list[str] | None = None, *, name: str = "lock",
             timeout: float | None = None, wait_s: float = 0.0) -> list[ssh.Result | None]:
        """Take the host's deploy lock; ``then``: steps that run in the same round trip once it is
        taken (the pulls of a deploy). Returns their results (None: not run). A stale lock of this
        machine is taken over (audited); one held by another writer is asked for again every few
        seconds for at most ``wait_s`` (0: deploys, refused at once), then refused naming its holder."""
        with self.stage(name):
            return self._lock(action, list(then or []), timeout, wait_s)

    def _lock(self, action: str, then: list[str], timeout: float | None, wait_s: float) -> list[ssh.Result | None]:
        token = self.token()
        holder = store.holder_document(token=token, who=self.who, origin=self.origin, action=action,
                                       message=self.message, now=self.now(), pid=self.pid)
        t0 = self.clock()
        # live before it is sent: another run of this process that reads this holder while the answer is
        # on its way must see a run that holds it, not a stale lock to take over
        with _LIVE_GUARD:
            _LIVE_TOKENS.add(token)
        try:
            return self._lock_loop(action, then, timeout, wait_s, token, holder, t0)
        except BaseException:
            with _LIVE_GUARD:
                _LIVE_TOKENS.discard(token)
            raise

    def _lock_loop(self, action: str, then: list[str], timeout: float | None, wait_s: float, token: str,
                   holder: dict[str, Any], t0: float) -> list[ssh.Result | None]:
        took_over, told = False, False
        while True:
            res, *after = self.run_chain([store.lock_acquire_script(self.root, holder), *then], timeout=timeout)
            assert res is not None  # the first step always runs
            got = store.parse_lock_acquire(res.rc, res.stdout)
            waited = self.clock() - t0
            with _LIVE_GUARD:
                live = frozenset(_LIVE_TOKENS)
            step = decide.lock_step(acquired=got.acquired, holder=got.holder, rc=res.rc, held_rc=store.LOCK_HELD_RC,
                                    origin=self.origin, alive=self.alive, took_over=took_over, waited_s=waited,
                                    wait_s=wait_s, own_pid=self.pid, live=live)
            if step == "acquired":
                self.lock_token = token
                self.lock_waited_s = round(waited, 1) if told else 0.0
                return after
            if step == "take_over":
                self.log(f"taking over a stale lock left by this machine: {store.describe_holder(got.holder, self.now())}")
                self.run(store.lock_break_script(self.root))
                self.record(action="lock-break", service=None, release_id=None, digest=None, result="stale",
                            detail=store.describe_holder(got.holder))
                took_over = True
                continue
            if step == "fail":
                raise Refusal(Result.FAILED, f"cannot take the deploy lock: {short(res.stderr or res.stdout)}")
            if step == "wait":
                if not told:
                    self.log(f"deploy lock {store.describe_holder(got.holder, self.now())}; waiting up to "
                             f"{wait_s:.0f} s")
                    told = True
                    self.lock_holder_seen = got.holder
                self.sleep(max(0.0, min(LOCK_POLL_S, wait_s - waited)))
                continue
            holder_now = got.holder
            if holder_now is None:  # the answer was cut short: ask who holds it
                _, holder_now = store.parse_lock_status(self.run(store.lock_status_script(self.root)).stdout)
            raise Refusal(Result.REFUSED, store.lock_refusal(self.host, holder_now, self.now(), waited if told else 0))

    def forget_lock(self) -> None:
        """The run is over with the lock: released, or left behind by a dropped connection (then stale:
        a later run of this process or machine takes it over)."""
        with _LIVE_GUARD:
            _LIVE_TOKENS.discard(self.lock_token or "")
        self.lock_token = None

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
        token = self.lock_token
        script = store.final_script(self.root, self.deferred, records, token)
        self.forget_lock()
        self.deferred, self.audit = [], []
        if not script or self.remote is None:
            return
        try:
            res = self.run(script, timeout=300)
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
        with self.stage(f"{target.service.name}: health"):
            report = self.health_fn(self, target)
        start = self.timeline[-1]["start_s"]
        for st in report.stages:  # its stages, one after the other within it
            self.timeline.append({"stage": f"{target.service.name}: health {st.name}", "start_s": round(start, 3),
                                  "seconds": st.seconds, "round_trips": None})
            start += st.seconds
        return report

    def engine_log(self, paths: Paths) -> str:
        try:
            with self.stage(f"{paths.service}: engine log"):
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
        with self.stage(f"{paths.service}: switch + restart"):
            return self.run(store.switch_script(paths, release_id), timeout=180)

    # -- commit confirmed (llmfleet.release.confirm) ----------------------------------------------
    # Arm a host-side revert before a switch, confirm it after a passed health check (which also
    # starts the host-side watchdog), disarm it before going back ourselves. A controller that
    # vanishes in between leaves the host timer to revert.

    def arm(self, paths: Paths, service: Service, release_id: str, previous: str | None, action: str, *,
            timeout: int | None = None, restart_unswitched: bool = False) -> str:
        """Arm the host's revert of the switch to ``release_id``; the token that confirms it.
        ``timeout``: instead of the host's budget (a service over several hosts sets one per host,
        ``confirm.cluster_timeouts``); ``restart_unswitched``: see ``confirm.revert_script``."""
        token, script = self.arm_script(paths, service, release_id, previous, action, timeout=timeout,
                                        restart_unswitched=restart_unswitched)
        with self.stage(f"{service.name}: arm revert"):
            res = self.run(script, timeout=120)
        self.armed(service, previous, res, timeout=timeout)
        return token

    def arm_script(self, paths: Paths, service: Service, release_id: str, previous: str | None,
                   action: str, *, timeout: int | None = None, restart_unswitched: bool = False) -> tuple[str, str]:
        """(token, script) of ``arm``, for a round trip that carries more steps."""
        from llmfleet.release import confirm  # only a deploy that switches arms

        token = self.token()
        seconds = confirm.timeout_s(service, self.host_settings) if timeout is None else int(timeout)
        return token, confirm.arm_script(paths, release_id=release_id, previous=previous, token=token, action=action,
                                         timeout=seconds, restart_unswitched=restart_unswitched)

    def armed(self, service: Service, previous: str | None, res: ssh.Result, *, timeout: int | None = None) -> None:
        """Judge the arm step's answer: raises ``RemoteError`` when the revert is not armed."""
        from llmfleet.release import confirm

        armed = confirm.parse_arm(res.rc, res.stdout)
        if not armed.armed:
            raise RemoteError(f"{service.name}: {armed.reason}")
        seconds = confirm.timeout_s(service, self.host_settings) if timeout is None else int(timeout)
        self.log(f"{service.name}: host reverts to {previous or 'nothing'} in {seconds} s unless confirmed")

    def confirm(self, paths: Paths, service: str, token: str | None) -> bool:
        """Confirm the switch and start the watchdog; False when the host timer had already reverted."""
        from llmfleet.health import watchdog
        from llmfleet.release import confirm

        if token is None:  # nothing was armed (a verify of the current release): start its watchdog
            with self.stage(f"{service}: watchdog on"):
                self.run(watchdog.install_snippet(paths.service_dir, service), timeout=60)
            return True
        with self.stage(f"{service}: confirm + watchdog on"):
            res = self.run(confirm.confirm_script(paths, token=token), timeout=60)
        if confirm.parse_confirm(res.stdout):
            return True
        self.log(f"{service}: the confirmation came too late: the host timer reverted the switch")
        return False

    def disarm(self, paths: Paths, token: str | None) -> None:
        """Stop the host timer before going back ourselves; if this fails the timer still reverts."""
        from llmfleet.release import confirm

        if token is None:
            return
        try:
            self.run(confirm.confirm_script(paths, token=token, watchdog_on=False), timeout=60)
        except LlmfleetError:
            pass

    def go_back(self, paths: Paths, service: Service, api_key: str | None, previous: str | None,
                state: release_state.ServiceState | None) -> GoBack:
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
                                  manifest.plan_summary() if manifest else None,
                                  engine_args=manifest.engine_args if manifest else ())
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


def connect(host: Host, settings: Settings, accept_new_host_keys: bool) -> Any:
    """The host's connection (the one ``early`` opened, when it did); a host-key problem refuses, any
    other SSH failure fails."""
    try:
        return (early.take(host, settings, accept_new_host_keys)
                or ssh.connect(host, config=settings.ssh, accept_new_host_keys=accept_new_host_keys))
    except ssh.HostKeyError as exc:
        raise Refusal(Result.REFUSED, str(exc)) from None
    except RemoteError as exc:
        raise Refusal(Result.FAILED, str(exc)) from None


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

