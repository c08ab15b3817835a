"""Switching a head and its workers as one: every host's release uploaded and its revert timer armed
before the first switch, the workers switched and checked, then the head (its staged health check
and the join check), every host confirmed, workers first; one outcome (``ServiceRun``). A failure,
or Ctrl-C, puts every host of the service back: workers first, then the head."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from llmfleet import __version__
from llmfleet.errors import LlmfleetError, RemoteError
from llmfleet.health import check as health
from llmfleet.inventory.services import Service
from llmfleet.release import cluster as C
from llmfleet.release import decide, pipeline, store
from llmfleet.release.decide import Action, GoBack, HostOutcome, Result, ServiceOutcome
from llmfleet.release.executor import HealthTarget, short
from llmfleet.release.manifest import build as manifest_build
from llmfleet.release.multihost.checks import join_check, reach_workers
from llmfleet.release.pipeline import HostSlot
from llmfleet.release.store import Paths

# ---------------------------------------------------------------------------------------------
# The outcome


@dataclass
class ServiceRun:
    """What a deploy of one multi-host service did, on every host of it."""

    service: str
    head: str
    result: Result
    reason: str = ""
    hosts: dict[str, HostOutcome] = field(default_factory=dict)  # host -> its outcome (workers and head)
    cluster: dict[str, object] | None = None
    joined: dict[str, object] = field(default_factory=dict)  # the join check's evidence
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.result in decide.OK_RESULTS

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["hosts"] = {k: v.to_dict() for k, v in self.hosts.items()}
        return d

    def host_outcomes(self) -> list[HostOutcome]:
        """One outcome per host, each carrying the service's verdict (for the deploy table)."""
        out = []
        for name in [self.head, *[h for h in self.hosts if h != self.head]]:
            o = self.hosts.get(name) or HostOutcome(host=name, result=self.result)
            o.result = self.result
            role = "head" if name == self.head else f"worker of {self.head}"
            o.reason = f"{self.service} ({role}): {self.reason}"
            out.append(o)
        return out


# ---------------------------------------------------------------------------------------------
# The switch: every host armed, workers first, then the head; every host confirmed


def switch_all(slots: dict[str, HostSlot], workers: list[HostSlot], hh: HostSlot, svc: Service, head_svc: Service,
                cluster: C.Cluster, res: ServiceRun, action: str) -> tuple[str | None, health.HealthReport | None]:
    """Arm every host, switch the workers, reach them from the head, switch and check the head, check the
    join, confirm every host: (the failure's reason or None, the head's health report). Ctrl-C puts
    every host back before it is raised again."""
    try:
        failure = _arm_all(workers, hh, svc, action=action)
        for w in workers:
            if failure:
                break
            failure = _switch(w, svc)
        if failure is None and any(w.item.step.action != Action.UNCHANGED for w in workers):
            failure = reach_workers(hh, cluster)  # from the head, before it switches
        if failure is None:
            return _switch_head(hh, head_svc, cluster, res, slots)
        return failure, None
    except KeyboardInterrupt:  # Ctrl-C mid-switch: every host back before exiting, as a single-host deploy
        roll_back_all(slots, workers, hh, svc, "interrupted", res, action=action)
        raise


def _arm_all(workers: list[HostSlot], hh: HostSlot, svc: Service, action: str = "deploy") -> str | None:
    """Upload each host's new release and arm its host timer, every host before the first switch:
    workers in their order, the head last (``confirm.cluster_timeouts``: its timer fires after every
    worker's, and it restarts the head even when the head's switch was never made, so that a head left
    by a lost controller attaches again to workers that their own timers put back). A failure's reason."""
    from llmfleet.release import confirm

    budgets = confirm.cluster_timeouts(svc, hh.name, {h.name: h.run.host_settings for h in [*workers, hh]})
    for h in [*workers, hh]:
        it, run = h.item, h.run
        step = it.step
        try:
            if step.action == Action.NEW:
                assert it.rendered is not None
                it.manifest = manifest_build(it.rendered, step.release_id, host=run.host, who=run.who,
                                             when=run.now(), llmfleet_version=__version__, message=run.message)
                files, modes = store.release_files(it.rendered, it.manifest)
                up = run.run(store.upload_script(it.paths, step.release_id), stdin=store.pack_release(files, modes),
                             timeout=120)
                if not store.parse_upload(up.rc, up.stdout):
                    return (f"{h.name}: upload of release {step.release_id} failed: "
                            f"{short(up.stderr or up.stdout, 300)}")
                run.log(f"{svc.name}: uploaded release {step.release_id}")
            if step.arms_revert:
                h.token = run.arm(it.paths, svc, step.release_id, step.previous, action, timeout=budgets[h.name],
                                  restart_unswitched=h.is_head)
        except RemoteError as exc:
            return f"{h.name}: {exc}"
    return None


def _switch(h: HostSlot, svc: Service) -> str | None:
    """Switch one host's uploaded, armed release (a worker, or the head before its checks); a failure's reason."""
    it, run = h.item, h.run
    step = it.step
    try:
        if step.switches:
            h.switched = True
            sw = run.switch(it.paths, step.release_id)
            if not store.parse_switch(sw.rc, sw.stdout):
                return f"{h.name}: switch to {step.release_id} failed: {short(sw.stderr or sw.stdout, 300)}"
            run.log(f"{svc.name}: current -> {step.release_id}, unit restarted")
        if not h.is_head:
            rep = run.check_health(HealthTarget(svc, None, it.paths, step.release_id, None), f"worker release "
                                                                                             f"{step.release_id}")
            it.health = rep
            if not rep.ok:
                return f"{h.name}: worker release {step.release_id} is not up: {rep.message}"
            run.log(f"{svc.name}: worker up ({rep.message})")
    except RemoteError as exc:
        return f"{h.name}: {exc}"
    return None


def _switch_head(hh: HostSlot, svc: Service, cluster: C.Cluster, res: ServiceRun,
                 slots: dict[str, HostSlot]) -> tuple[str | None, health.HealthReport | None]:
    it = hh.item
    failure = _switch(hh, svc)
    if failure:
        return failure, None
    try:
        report = hh.run.check_health(HealthTarget(svc, it.prepared.api_key, it.paths, it.step.release_id, it.plan,
                                                  engine_args=tuple(it.rendered.engine_args) if it.rendered else
                                                  (it.manifest.engine_args if it.manifest else ())),
                                     f"release {it.step.release_id}")
    except RemoteError as exc:
        return f"{hh.name}: {exc}", None
    it.health = report
    hh.out.health[svc.name] = report.to_dict()
    if not report.ok:
        return f"{hh.name}: release {it.step.release_id} failed: {report.message}", report
    try:
        ok, shortfall, detail = join_check(cluster)(hh, cluster, slots)
    except RemoteError as exc:
        return f"{hh.name}: join check: {exc}", report
    res.joined = detail
    if not ok:
        return f"{hh.name}: healthy, but not every worker joined: {shortfall}", report
    hh.run.log(f"{svc.name}: every worker joined ({detail})")
    return _confirm_all([slots[w.host] for w in cluster.workers], hh, svc), report


def _confirm_all(workers: list[HostSlot], hh: HostSlot, svc: Service) -> str | None:
    """Confirm every armed host, in the order their timers fire (workers, then the head: the head's
    confirmation is the last one); each confirmation also starts that host's watchdog."""
    for h in [*workers, hh]:
        if h.token is None:
            continue
        try:
            confirmed = h.run.confirm(h.item.paths, svc.name, h.token)
        except RemoteError as exc:
            return f"{h.name}: confirm: {exc}"
        if not confirmed:
            return f"{h.name}: healthy, but the host timer reverted it first"
        h.token = None
    return None


# ---------------------------------------------------------------------------------------------
# Together healthy: committed on every host; else every host back


def commit(slots: dict[str, HostSlot], svc: Service, res: ServiceRun, report: health.HealthReport | None, action: str) -> None:
    """Every host healthy together: the set they now run appended to each host's history
    (``clusterset``), each switched host marked healthy, audited, its outcome; a deploy prunes."""
    from llmfleet.release import clusterset

    any_run = next(iter(slots.values())).run
    entry = clusterset.record(now=any_run.now(), action=action, head=res.head,
                              releases={n: h.item.step.release_id for n, h in slots.items()})
    done = Result.DEPLOYED if action == "deploy" else Result.ROLLED_BACK
    for h in slots.values():
        h.run.defer(clusterset.append_script(Paths(h.run.root, svc.name), entry))
        it = h.item
        rid = it.step.release_id
        rep = report if h.is_head else None
        role = f"{'head' if h.is_head else 'worker'} of a multi-host service"
        if it.step.action != Action.UNCHANGED:
            doc = (rep.to_dict() if rep else (it.health_doc or {})) | {"release": rid, "joined": res.joined}
            h.run.defer(store.mark_healthy_script(it.paths, rid, doc | {"time": h.run.now().isoformat(timespec="seconds"),
                                                                      "who": h.run.who}))
        extra = {"decode_tokps": rep.decode_tokps, "ttft_s": rep.ttft_s} if rep else {}
        result = Result.UNCHANGED if action == "deploy" and it.step.action == Action.UNCHANGED else done
        h.run.record(action=action, service=svc.name, release_id=rid, digest=it.prepared.image.digest, result=result,
                     detail=role if action == "deploy" else f"from {it.step.previous} ({role})", **extra)
        h.out.result = done
        h.out.services[svc.name] = ServiceOutcome(svc.name, done, rid, rid, it.step.previous)
        if action == "deploy" and it.step.action in (Action.NEW, Action.SWITCH) and it.state is not None:
            pipeline.prune_after(h.run, h.host_states or {svc.name: it.state}, [it])


def roll_back_all(slots: dict[str, HostSlot], workers: list[HostSlot], hh: HostSlot, svc: Service, failure: str,
                   res: ServiceRun, action: str = "deploy") -> None:
    """Every host of the service back to its previous release: workers first, then the head. Each
    host's timer is stopped just before it goes back (the ones not reached yet keep their timers);
    a host armed but never switched is only disarmed."""
    logs = hh.run.engine_log(hh.item.paths) if hh.switched else ""
    hh.run.log(f"{svc.name}: FAILED: {failure}")
    if logs:
        hh.run.log(f"{svc.name}: head engine log: {logs}")
    backs: dict[str, GoBack] = {}
    restart_head = decide.restart_head_going_back(hh.switched, [w.switched for w in workers], hh.item.step.previous)
    for h in [slots[n] for n in decide.switch_order(hh.name, [w.name for w in workers])]:
        it = h.item
        h.run.disarm(it.paths, h.token)
        h.token = None
        if not h.switched and not (h is hh and restart_head):
            continue
        if h.is_head and it.health is not None and not it.health.ok:
            try:
                h.run.run(store.mark_healthy_script(it.paths, it.step.release_id, it.health.to_dict()), timeout=30)
            except LlmfleetError:
                pass
        previous = it.step.previous  # the head restarted for its workers' sake: restarted again
        back = h.run.go_back(it.paths, svc, it.prepared.api_key if h.is_head else None, previous, it.state)
        backs[h.name] = back
        h.run.log(f"{svc.name}: {back.sentence()}")
        h.run.record(action=action, service=svc.name, release_id=it.step.release_id,
                     digest=it.prepared.image.digest, result=back.result, detail=f"{failure}; {back.sentence()}")
        h.out.result = Result(back.result)
        h.out.services[svc.name] = ServiceOutcome(svc.name, Result(back.result), it.step.release_id, back.current,
                                                  previous, failure)
        h.out.releases[svc.name] = back.current or ""
    res.result = decide.cluster_result(list(backs.values()))
    where = ", ".join(f"{n}: {b.sentence()}" for n, b in backs.items()) or "nothing was switched"
    res.reason = f"{failure}; engine log: {logs or '(not read)'}; every host of the service went back: {where}"
    for h in slots.values():
        if h.name not in backs:
            h.out.result = Result.UNCHANGED if h.items and h.item.step.action == Action.UNCHANGED else res.result
