"""Deploy and roll back the services of one host: the single-host strategy of ``pipeline``.

``deploy_host`` for one inventory host:

1. prepare (no SSH yet): the services with this run's overrides, their secrets, their pinned images;
   a usage error stops here (``prepare_host``, which ``fleet.upgrade`` calls too);
2. connect with strict host keys; gather facts and the releases' state (``store.STATE_READER``, run
   inside the probe) in one round trip and run the preflight; a FAIL stops here, nothing changed;
3. render each service, and ``decide``: unchanged, new release, switch to an existing one,
   health-check one an interrupted deploy left, restart;
4. ``check``/``diff`` stop here (diffs with secrets masked);
5. take the host's deploy lock (a stale one left by this machine is taken over, others refuse);
6. pull every new image by digest while the old release still serves, and verify the digest;
7. per service: upload, point ``current`` at it and restart, health-check through an SSH-forwarded
   port; on failure capture the engine log and go back to the previous release;
8. after success prune (``decide.prune_plan``); last round trip: health marks, prune, audit, unlock.

Steps 2 and 4-6 and 8's last round trip are ``pipeline``'s stages (shared with a service over several
hosts and with stop/start/remove); this module is step 7, one service after the other.

``deploy_host`` never raises for a per-host failure: the outcome's ``result`` (a ``Result``) says
what happened, per service too (``ServiceOutcome``), with a one-line reason. Only usage errors raise.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmfleet import __version__
from llmfleet.errors import LlmfleetError, RemoteError, UsageError
from llmfleet.host import ssh
from llmfleet.inventory.ansible import Inventory
from llmfleet.knowledge import release_state
from llmfleet.knowledge.planner import Plan
from llmfleet.release import decide, drain, pipeline, store
from llmfleet.release.decide import Action, GoBack, HostOutcome, Refusal, Result, ServiceOutcome
from llmfleet.release.executor import (
    HOST_TIMER,
    HealthTarget,
    HostRun,
    Log,
    service_for_release,
    short,
)
from llmfleet.release.manifest import build as manifest_build
from llmfleet.release.pipeline import Item
from llmfleet.release.prepare import (  # noqa: F401 - re-exported: the deploy API
    DeployOptions,
    Prepared,
    PreparedHost,
    apply_overrides,
    load_host,
    prepare_host,
)
from llmfleet.release.render import project_name, stop_grace_s
from llmfleet.release.secret import resolve_secret
from llmfleet.release.store import Paths
from llmfleet.settings import Settings

if TYPE_CHECKING:
    from llmfleet.health.check import HealthReport, UnitProbe

# ---------------------------------------------------------------------------------------------
# deploy


def deploy_host(
    inventory: Inventory | str,
    host_name: str,
    *,
    config: Settings | dict[str, object] | None = None,
    options: DeployOptions,
    log: Log,
    prepared: PreparedHost | None = None,
) -> HostOutcome:
    """Deploy every llmfleet service of one host (see the module docstring)."""
    t0 = time.monotonic()
    settings = Settings.of(config)
    ready = prepared or prepare_host(inventory, host_name, settings, options)
    out = HostOutcome(host=host_name, result=Result.UNCHANGED)
    if not ready.services:
        out.reason = "no single-host llmfleet_services on this host"
        return out
    if prepared is None:
        out.timeline.append({"stage": "prepare (inventory, images.lock, secrets)", "start_s": 0.0,
                             "seconds": round(time.monotonic() - t0, 3), "round_trips": 0})
    pipeline.run_hosts([(ready.host, ready.settings, out)], "deploy",
                       lambda slots: run_deploy(slots[host_name].run, ready, out, options),
                       settings=settings, log=log, who=options.who, message=options.message, check=options.check,
                       accept_new_host_keys=options.accept_new_host_keys, t0=t0)
    return out


def run_deploy(run: HostRun, ready: PreparedHost, out: HostOutcome, options: DeployOptions,
               plans: Sequence[Plan | None] | None = None) -> None:
    """The deploy after connecting. ``plans`` (one per service) skips the facts and preflight."""
    found = None
    if plans is None:
        with run.stage("probe + preflight"):
            plans, found = pipeline.gather_and_preflight(run, ready, out)
    # the probe read the release state in its round trip; a separate read only when it was cut short
    if found is not None and found.releases_read:
        states = found.releases
    else:
        with run.stage("release state"):
            states = run.read_state()
    with run.stage("render + decide"):
        items = pipeline.render_and_decide(run, ready, plans, states)
    slot = pipeline.Slot(run, out, items=items)
    drainer = drain.for_run(run, ready.inventory)

    def switch() -> None:
        todo = [it for it in items if it.step.action != Action.UNCHANGED]
        _fleet_gates(run, ready, todo, states)
        for it in items:
            if it.step.action == Action.UNCHANGED:
                pipeline.record_unchanged(run, it, out)
                continue
            # out of rotation at the gateways in front of it while it restarts (release/drain.py)
            with (drainer.drained(it.name, settle=drain.engine_settle(run, it.prepared.service, it.prepared.api_key is not None))
                  if drainer is not None and it.step.switches else nullcontext()):
                so = _switch_and_check(run, it)
            out.services[it.name] = so
            if it.health is not None:
                out.health[it.name] = it.health.to_dict()
            if so.result != Result.DEPLOYED:
                out.result, out.reason = so.result, so.reason
                out.releases[it.name] = so.current or (it.state.current if it.state else None) or so.release or ""
                return
        out.result = Result.DEPLOYED
        out.reason = "; ".join(f"{it.name} on {it.step.release_id}" for it in todo)
        _remember_speeds(run, ready, pipeline.prune_after(run, states, todo))

    try:
        pipeline.deploy([slot], options, out, what="service", switch=switch)
    finally:
        if drainer is not None:
            drainer.close()




def _fleet_gates(run: HostRun, ready: PreparedHost, todo: list[Item], states: dict[str, release_state.ServiceState]) -> None:
    """The fleet's own floor for each release to check: earlier healthy runs of the same card,
    engine, image, model, quant and context class, on this host (the state just read) and on the
    hosts this machine read before (``speed_cache``). Best effort: no history, no gate."""
    from llmfleet.health import speed_cache, speed_history

    try:
        cached = speed_cache.load(exclude=[run.host])
        for it in todo:
            it.fleet = speed_history.gate_for(it.plan, it.prepared.image, host=run.host, states=states,
                                              cached=cached, lab=speed_cache.is_lab(ready.host))
            if it.fleet is not None:
                run.log(f"{it.name}: decode floor from the fleet: {it.fleet.source}")
    except (OSError, ValueError) as exc:
        run.log(f"warning: the fleet's speed history could not be read ({exc}); the planner's floor applies")


def _remember_speeds(run: HostRun, ready: PreparedHost, after: dict[str, release_state.ServiceState]) -> None:
    """Keep this host's health records (the new release's too) for later gates and ``invoke plan``."""
    from llmfleet.health import speed_cache

    speed_cache.remember_hosts({run.host: after}, [run.host] if speed_cache.is_lab(ready.host) else [])


@dataclass
class _Switching:
    """How far one service's switch got: what going back, on a failure or Ctrl-C, needs to know."""

    switched: bool = False
    token: str | None = None  # commit confirmed: the host reverts unless this is confirmed
    started: UnitProbe | None = None  # the state the switch's round trip saw after the restart


def _switch_and_check(run: HostRun, it: Item) -> ServiceOutcome:
    """Arm, switch and check one service of one host; commit (marked healthy in the last round trip)
    or go back to its previous release."""
    step, paths, svc, rendered = it.step, it.paths, it.prepared.service, it.rendered
    assert rendered is not None  # a deploy renders every service
    rid, previous, digest = step.release_id, step.previous, it.prepared.image.digest
    sw = _Switching()
    try:
        _switch(run, it, sw)
        report = run.check_health(HealthTarget(svc, it.prepared.api_key, paths, rid, it.plan, sw.started, it.fleet,
                                               engine_args=tuple(rendered.engine_args)),
                                  f"release {rid}")
    except KeyboardInterrupt:
        if sw.switched:
            run.log(f"{svc.name}: interrupted; going back to {previous or 'nothing (stopping the unit)'}")
            run.disarm(paths, sw.token)
            back = run.go_back(paths, svc, it.prepared.api_key, previous, it.state)
            run.record(action="deploy", service=svc.name, release_id=rid, digest=digest, result=back.result,
                       detail=f"interrupted; {back.sentence()}")
        raise
    except RemoteError as exc:
        if not sw.switched:
            run.record(action="deploy", service=svc.name, release_id=rid, digest=digest, result=Result.FAILED,
                       detail=str(exc))
            return ServiceOutcome(svc.name, Result.FAILED, rid, it.state.current if it.state else None, previous,
                                  f"{svc.name}: {exc}; nothing was switched")
        report = None
        failure = str(exc)
    else:
        failure = report.message if report is not None else ""
    return _commit_or_go_back(run, it, report, failure, sw.token)


def _switch_steps(run: HostRun, it: Item) -> tuple[dict[str, str], bytes | None, str | None]:
    """The switch's one round trip: (its scripts by step, the release's files on stdin, the revert's token)."""
    step, paths, svc, rendered = it.step, it.paths, it.prepared.service, it.rendered
    assert rendered is not None
    rid = step.release_id
    steps: dict[str, str] = {}
    stdin: bytes | None = None
    armed_token: str | None = None
    if step.action == Action.NEW:
        it.manifest = manifest_build(rendered, rid, host=run.host, who=run.who, when=run.now(),
                                     llmfleet_version=__version__, message=run.message)
        files, modes = store.release_files(rendered, it.manifest)
        steps["upload"], stdin = store.upload_script(paths, rid), store.pack_release(files, modes)
    if step.arms_revert:
        armed_token, steps["arm revert"] = run.arm_script(paths, svc, rid, step.previous, "deploy")
    if step.switches:
        steps["switch + restart"] = (store.gateway_switch_script(paths, rid, project_name(svc)) if svc.engine == "gateway"
                                     else store.switch_script(paths, rid))
        steps["container start"] = store.unit_wait_script(paths)
    return steps, stdin, armed_token


def _switch(run: HostRun, it: Item, sw: _Switching) -> None:
    """Upload, arm the host's revert, switch and restart, wait for the container: one round trip;
    ``sw`` says how far it got. A step that failed raises ``RemoteError``."""
    step, svc = it.step, it.prepared.service
    rid, previous = step.release_id, step.previous
    steps, stdin, armed_token = _switch_steps(run, it)
    results: dict[str, ssh.Result | None] = {}
    if steps:
        # the health check's HTTP client loads while this round trip waits on the host: without it
        # the health stage imports httpx itself, 0.11-0.15 s more in a changed deploy's health stage
        # and +0.12 s whole-process median (docs/bench.md "Start-up tricks")
        threading.Thread(target=importlib.import_module, args=("httpx",), daemon=True).start()
        with run.stage(f"{svc.name}: {' + '.join(steps)}"):
            # a gateway's restart waits for its old container's streams (its stop grace)
            answers = run.run_chain(list(steps.values()), stdin=stdin, stdin_step=0 if stdin else None,
                                    timeout=max(450, stop_grace_s(svc) + 120))
        results = dict(zip(steps, answers, strict=True))
    if "upload" in results:
        res = results["upload"]
        if res is None or not store.parse_upload(res.rc, res.stdout):
            raise RemoteError(f"upload of release {rid} failed: "
                              f"{short(res.stderr or res.stdout, 300) if res else 'it did not run'}")
        run.log(f"{svc.name}: uploaded release {rid}")
    if step.arms_revert:
        if results["arm revert"] is None:
            raise RemoteError(f"{svc.name}: the host-side revert was not armed (the step did not run)")
        run.armed(svc, previous, results["arm revert"])
        sw.token = armed_token
    if step.switches:
        res = results["switch + restart"]
        sw.switched = True
        if res is None or not store.parse_switch(res.rc, res.stdout):
            raise RemoteError(f"switch to {rid} failed: "
                              f"{short(res.stderr or res.stdout, 300) if res else 'it did not run'}")
        marks = res.stdout.splitlines()
        run.log(f"{svc.name}: current -> {rid}, " + (
            "configuration reloaded (open streams kept)" if "@@reloaded" in marks
            else "unit restarted; a handover HAProxy took new connections meanwhile (open streams kept)"
            if "@@handover" in marks else "unit restarted"))
        started = results["container start"]
        if started is not None:
            sw.started = store.parse_unit_probe(started.stdout)
    else:
        sw.switched = True  # verify: the release is current and running; only its health is unknown


def _commit_or_go_back(run: HostRun, it: Item, report: HealthReport | None, failure: str,
                       token: str | None) -> ServiceOutcome:
    """After the check: confirmed and marked healthy, or (unhealthy, reverted by the host timer, or a
    failure after the switch) marked, disarmed and back on the previous release."""
    step, paths, svc = it.step, it.paths, it.prepared.service
    rid, previous, digest = step.release_id, step.previous, it.prepared.image.digest
    if report is not None and report.ok and not run.confirm(paths, svc.name, token):
        failure, report = f"healthy, but the host timer reverted it first ({HOST_TIMER})", None
    if report is not None:
        it.health = report
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
    run.disarm(paths, token)
    back = run.go_back(paths, svc, it.prepared.api_key, previous, it.state)
    reason = f"{svc.name}: release {rid} failed: {failure}; engine log: {logs or '(empty)'}; {back.sentence()}"
    run.log(f"{svc.name}: FAILED: {failure}")
    run.log(f"{svc.name}: engine log: {logs or '(empty)'}")
    run.log(f"{svc.name}: {back.sentence()}")
    run.record(action="deploy", service=svc.name, release_id=rid, digest=digest, result=back.result,
               detail=f"{failure}; {back.sentence()}")
    return ServiceOutcome(svc.name, Result(back.result), rid, back.current, previous, reason)


# ---------------------------------------------------------------------------------------------
# rollback


def rollback_host(
    inventory: Inventory | str,
    host_name: str,
    *,
    service: str | None = None,
    to: str | None = None,
    config: Settings | dict[str, object] | None = None,
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
        from llmfleet.suggest import did_you_mean

        raise UsageError(f"{inv.path}: host {host_name} has no service {service!r}{did_you_mean(service, names)} "
                         f"(services: {', '.join(names) or 'none'})")
    if service is not None and any(s.name == service and s.workers for s in host_settings.services):
        raise UsageError(f"host {host_name}: service {service} spans hosts: roll back all of them together "
                         "(`invoke rollback --host` its head or a worker)")
    out = HostOutcome(host=host_name, result=Result.FAILED)
    pipeline.run_hosts([(host, host_settings, out)], "rollback",
                       lambda slots: run_rollback(slots[host_name].run, service, to, out, inventory=inv),
                       settings=settings, log=log, who=options.who, message=options.message,
                       accept_new_host_keys=options.accept_new_host_keys)
    if out.result == Result.FAILED and not out.reason:
        out.reason = "rollback failed"
    return out


def run_rollback(run: HostRun, service: str | None, to: str | None, out: HostOutcome, *,
                 inventory: Inventory | None = None) -> None:
    """The rollback after connecting: decide each service's target, then switch, check, go back on failure
    (each service out of rotation at the gateways in front of it meanwhile)."""
    drainer = drain.for_run(run, inventory)
    try:
        _rollback_steps(run, service, to, out, drainer)
    finally:
        if drainer is not None:
            drainer.close()


def _rollback_steps(run: HostRun, service: str | None, to: str | None, out: HostOutcome,
                    drainer: drain.Drainer | None) -> None:
    states = run.read_state()
    # a service over several hosts goes back on all of them together (multihost.rollback_service)
    inv_services = {s.name: s for s in run.host_settings.services if not s.workers}
    steps = decide.decide_rollback(states, [n for n in inv_services if service in (None, n)], host=run.host,
                                   service=service, to=to)
    keys = {st.service: resolve_secret(inv_services[st.service].api_key, f"host {run.host}: service {st.service}")
            for st in steps}
    run.lock("rollback")
    for step in steps:
        settle = drain.engine_settle(run, inv_services[step.service], keys.get(step.service) is not None)
        with drainer.drained(step.service, settle=settle) if drainer is not None else nullcontext():
            paths, st = Paths(run.root, step.service), states[step.service]
            svc = service_for_release(inv_services[step.service], step.manifest)
            if not store.parse_image_present(run.run(store.image_present_script(step.image_ref), timeout=30).stdout):
                raise Refusal(Result.FAILED, f"service {step.service}: the image of release {step.target} "
                                             f"({step.image_ref}) is no longer on the host; redeploy that version instead")
            if step.previous == step.target:
                run.log(f"{step.service}: release {step.target} is already current; restarting and checking it")
            try:
                token = run.arm(paths, svc, step.target, step.back, "rollback") if step.arms_revert else None
            except RemoteError as exc:
                raise Refusal(Result.FAILED, f"{step.service}: {exc}") from None
            res = run.switch(paths, step.target)
            if not store.parse_switch(res.rc, res.stdout):
                raise Refusal(Result.FAILED, f"{step.service}: switch to {step.target} failed: "
                                             f"{short(res.stderr or res.stdout, 300)}")
            run.log(f"{step.service}: current -> {step.target}, unit restarted")
            report = run.check_health(HealthTarget(svc, keys.get(step.service), paths, step.target,
                                                   step.manifest.plan_summary(), engine_args=step.manifest.engine_args),
                                      f"release {step.target}")
            if report.ok and not run.confirm(paths, step.service, token):
                raise Refusal(Result.FAILED, f"{step.service}: release {step.target} was healthy, but the host timer "
                                             f"reverted it to {step.back or 'nothing'} first ({HOST_TIMER})")
            out.health[step.service] = report.to_dict()
            if report.ok:
                run.mark(paths, step.target, report, now=False)
                out.releases[step.service] = step.target
                out.services[step.service] = ServiceOutcome(step.service, Result.ROLLED_BACK, step.target, step.target,
                                                            step.previous)
                out.changes.append(f"{step.service}: {step.previous} -> {step.target}")
                run.record(action="rollback", service=step.service, release_id=step.target, digest=step.manifest.digest,
                           result=Result.ROLLED_BACK, detail=f"from {step.previous}")
                continue
            logs = run.engine_log(paths)
            run.disarm(paths, token)
            if step.previous != step.target:  # to the release last confirmed healthy (decide.go_back_target)
                back = run.go_back(paths, inv_services[step.service], keys.get(step.service), step.back, st)
            else:
                back = GoBack(GoBack.NOTHING, None)
            still = back.release == step.previous
            out.result = Result.FAILED
            out.reason = (f"ROLLBACK FAILED: {step.service}: release {step.target} is unhealthy: {report.message}; "
                          f"engine log: {logs or '(empty)'}; {back.sentence(still=still)}")
            out.releases[step.service] = back.current or ""
            out.services[step.service] = ServiceOutcome(step.service, Result.FAILED, step.target, back.current,
                                                        step.previous, out.reason)
            run.log(out.reason)
            run.record(action="rollback", service=step.service, release_id=step.target, digest=step.manifest.digest,
                       result=Result.FAILED, detail=f"{report.message}; {back.sentence(still=still)}")
            return
    out.result = Result.ROLLED_BACK
    out.reason = "; ".join(out.changes)


