"""One pipeline for every action that changes hosts: a set of hosts (one host, or a head and its
workers) taken through the same stages, whatever the action.

Every deploy, rollback, stop, start and remove (one host or a service over several hosts, and a fleet
upgrade's per-host step, which is a deploy) runs as:

1. connect (``run_hosts``): every host of the set, in the fixed order (``decide.lock_order``), each
   with its ``executor.HostRun``; a host-key problem refuses, any other SSH failure fails;
2. gather + preflight, then render + decide: the action's own (``deploy.run_deploy`` for one host,
   ``multihost`` for a head and its workers, ``service_ops`` for stop/start/remove), giving each host
   its ``Item`` per service;
3. ``deploy`` for a deploy: diff, ``--check`` / unchanged stop here; then lock + pull on every host
   in the fixed order (``lock_and_pull``: one lock path, with ``decide.may_take_over`` for a stale
   lock of this machine, used by every mutating action);
4. arm / switch / check, then commit or go back: the action's own strategy (one service at a time on
   one host; workers first, then the head, over several; the day-2 script of a service op);
5. finish (``run_hosts`` again): a refusal or failure not yet audited gets its audit line, then each
   host's last round trip (health marks, prune, audit lines, unlock), its round trips, timeline and
   duration filled in, its connection closed, whatever happened.

What to do comes from ``llmfleet.release.decide``; what is sent from ``llmfleet.release.store`` (and
read through its parsers); the outcome is ``decide.HostOutcome`` with ``decide.Result``.
"""

from __future__ import annotations

import difflib
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from llmfleet.errors import RemoteError
from llmfleet.host import facts as facts_mod
from llmfleet.inventory.ansible import Host
from llmfleet.inventory.services import HostSettings
from llmfleet.knowledge import preflight, release_state
from llmfleet.knowledge.facts import Facts
from llmfleet.knowledge.planner import Plan, PlanSummary, summarize
from llmfleet.knowledge.release_state import Manifest
from llmfleet.release import decide, store
from llmfleet.release.decide import Action, HostOutcome, Refusal, Result, ServiceOutcome, ServiceStep
from llmfleet.release.executor import HostRun, Log, connect, short
from llmfleet.release.prepare import DeployOptions, Prepared, PreparedHost
from llmfleet.release.render import ENV_FILE, Rendered, render, search_paths
from llmfleet.release.store import Paths
from llmfleet.settings import Settings

if TYPE_CHECKING:
    from llmfleet.health.check import HealthReport
    from llmfleet.health.speed_history import FleetGate
    from llmfleet.host import ssh
    from llmfleet.release import cluster


Connector = Callable[[Host, Settings, bool], "ssh.Link"]  # host.ssh.Remote; a scripted remote in tests


OutcomeT = TypeVar("OutcomeT", bound=decide.Outcome)  # the outcome each host of the run fills in


class Verdict(Protocol):
    """Where a run's result goes: the host's ``HostOutcome``, or a service over several hosts' ``ServiceRun``."""

    result: Result
    reason: str


# ---------------------------------------------------------------------------------------------
# What goes through the stages


@dataclass
class Item:
    """One service on one host, as it goes through the stages (``rendered`` is None for a rollback,
    which renders nothing: the release exists)."""

    prepared: Prepared
    plan: PlanSummary | None
    rendered: Rendered | None
    paths: Paths
    state: release_state.ServiceState | None
    step: ServiceStep
    manifest: Manifest | None = None
    health: HealthReport | None = None
    fleet: FleetGate | None = None  # the floor from the fleet's earlier runs of the same combination

    @property
    def name(self) -> str:
        return self.prepared.service.name

    @property
    def health_doc(self) -> decide.HealthDoc | None:
        return self.health.to_dict() if self.health is not None else None


@dataclass
class Slot(Generic[OutcomeT]):
    """One host of the run: its executor, its outcome, its items; for a service over several hosts,
    its place in the cluster, its revert timer's token and whether it switched."""

    run: HostRun
    out: OutcomeT
    is_head: bool = True
    items: list[Item] = field(default_factory=list)
    member: cluster.Member | None = None
    token: str | None = None
    switched: bool = False
    # every service's state on the host, as read before the switch: a prune decides what is unused
    # across all of them, not only the service being deployed
    host_states: dict[str, release_state.ServiceState] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.run.host

    @property
    def item(self) -> Item:
        """The one item of a host of a service over several hosts."""
        assert len(self.items) == 1, self.items
        return self.items[0]


HostSlot = Slot[HostOutcome]  # a host of a deploy or a rollback


# ---------------------------------------------------------------------------------------------
# 1 and 5: connect every host, run the action, finish every host


def run_hosts(
    targets: Sequence[tuple[Host, HostSettings, OutcomeT]],
    action: str,
    body: Callable[[dict[str, Slot[OutcomeT]]], None],
    *,
    settings: Settings,
    log: Log,
    verdict: Verdict | None = None,
    who: str | None = None,
    message: str = "",
    check: bool = False,
    accept_new_host_keys: bool = False,
    t0: float | None = None,
    service: str | None = None,
    head: str | None = None,
    prefix_log: bool = False,
    connector: Connector = connect,
    make_run: type[HostRun] = HostRun,
) -> dict[str, Slot[OutcomeT]]:
    """Connect every host (``decide.lock_order``), run ``body`` over them, and always: turn a refusal
    or a remote failure into the verdict (the one host's outcome unless ``verdict`` is given), audit it
    (not for ``check``), finish every host in the same order (marks, prune, audit, unlock), fill in
    each outcome's round trips, timeline and duration, close. ``service``: named on a failure's audit
    line; ``head``: the host that is the head of a service over several; ``prefix_log``: each line
    starts with its host's name."""
    t0 = time.monotonic() if t0 is None else t0
    by_name = {h.name: (h, hs, out) for h, hs, out in targets}
    if verdict is None:
        assert len(targets) == 1, "a set of several hosts needs its own verdict"
        verdict = targets[0][2]
    slots: dict[str, Slot[OutcomeT]] = {}
    order = decide.lock_order(list(by_name))
    try:
        for name in order:
            host, hs, out = by_name[name]
            line_log = (lambda line, n=name: log(f"{n}: {line}")) if prefix_log else log
            run = make_run(name, hs, None, settings=settings, log=line_log, who=who, message=message, t0=t0)
            run.timeline = list(out.timeline)
            slots[name] = Slot(run, out, is_head=head is None or name == head)
            with run.stage("connect"):
                run.remote = connector(host, settings, accept_new_host_keys)
        body(slots)
    except Refusal as exc:
        verdict.result, verdict.reason = Result(exc.result), exc.reason
    except RemoteError as exc:
        verdict.result, verdict.reason = Result.FAILED, str(exc)
    finally:
        _finish_all(slots, order, verdict, action, service=service, check=check, t0=t0)
    return slots


def _finish_all(slots: Mapping[str, Slot[OutcomeT]], order: list[str], verdict: Verdict, action: str, *, service: str | None,
                check: bool, t0: float) -> None:
    """Every host's last round trip, in the fixed order (every lock taken is released)."""
    for name in order:
        slot = slots.get(name)
        if slot is None:
            continue
        run, out = slot.run, slot.out
        if verdict.result in decide.NOT_DONE and not run.audit and not check:
            run.record(action=action, service=service, release_id=None, digest=None, result=verdict.result,
                       detail=verdict.reason)
        try:
            with run.stage("final (marks, prune, audit, unlock)"):
                run.finish(write_audit=not check)
        finally:
            out.round_trips = run.remote.round_trips if run.remote is not None else 0
            out.timeline = run.timeline
            if run.remote is not None:
                try:
                    run.remote.close()
                except Exception:  # noqa: BLE001,S110 - closing a dead connection must not hide the outcome
                    pass
            out.duration_s = round(time.monotonic() - t0, 3)


# ---------------------------------------------------------------------------------------------
# 2: gather + preflight, render + decide (one host; a service over several hosts: multihost)


def gather_and_preflight(run: HostRun, ready: PreparedHost, out: HostOutcome) -> tuple[list[Plan | None], Facts]:
    """Facts (one round trip, as the deploy's user: the release state comes with them) and the
    preflight's verdict for each service; the plans it made and the facts. A FAIL refuses."""
    found = facts_mod.gather(run.link, root=run.root, model_paths=[p.service.model_path for p in ready.services
                                                                      if p.service.model_path],
                             sudo=True)
    if found.probe_version is None:  # nothing ran (sudo refused, no shell): no checks to judge
        raise RemoteError(f"host {run.host}: the host probe did not run: {found.errors[0] if found.errors else '?'}")
    plans: list[Plan | None] = []
    bad: list[str] = []
    warns = 0
    for p in ready.services:
        plan, plan_error = preflight.plan_for(p.service, found, run.host_settings)
        checks = preflight.run_checks(run.host, p.service, found, plan, p.image, plan_error=plan_error,
                                      settings=run.host_settings)
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
    return plans, found


def render_and_decide(run: HostRun, ready: PreparedHost, plans: Sequence[Plan | None],
                      states: Mapping[str, release_state.ServiceState]) -> list[Item]:
    """Render each service of one host and decide what to do with it."""
    items: list[Item] = []
    # roles and templates: the inventory's and the configuration's overrides, then the packaged ones
    search = search_paths(ready.host.vars if ready.host else None,
                          ready.inventory.path if ready.inventory else None, run.settings.search_config)
    for p, plan in zip(ready.services, plans, strict=True):
        rendered = render(p.service, ready.settings, p.image, plan, api_key=p.api_key,
                          roles_dir=search["roles_dir"], templates_dir=search["templates_dir"], gateway=p.gateway)
        items.append(item_for(run, p, summarize(plan), rendered, states.get(p.service.name)))
    return items


def item_for(run: HostRun, prepared: Prepared, plan: PlanSummary | None, rendered: Rendered,
             state: release_state.ServiceState | None) -> Item:
    """One rendered service on one host, with ``decide.decide_service``'s step."""
    return Item(prepared, plan, rendered, Paths(run.root, prepared.service.name), state,
                decide.decide_service(state, rendered, run.now()))


# ---------------------------------------------------------------------------------------------
# 3: diff, check, unchanged; lock + pull


def deploy(slots: Sequence[HostSlot], options: DeployOptions, verdict: Verdict, *, what: str,
           switch: Callable[[], None]) -> None:
    """The stages of a deploy once every host's items are decided: the outcomes learn the releases
    and changes; ``--diff`` diffs; ``--check`` / ``--diff`` and a deploy with nothing to do stop here;
    then lock + pull on every host in the fixed order; then ``switch`` (arm, switch, check, commit or
    go back: the action's own strategy, which sets the verdict). ``what``: "service" or "host", what a
    count of items counts."""
    for slot in slots:
        for it in slot.items:
            slot.out.releases[it.name] = it.step.release_id
            slot.out.changes.extend(f"{it.name}: {c}" for c in it.step.changes)
    if options.diff:
        for slot in slots:
            with slot.run.stage("diff"):
                show_diff(slot.run, slot.items, slot.out)
    items = [it for slot in slots for it in slot.items]
    todo = [it for it in items if it.step.action != Action.UNCHANGED]
    if options.check or options.diff:
        verdict.result = Result.CHECK
        verdict.reason = f"{len(todo)} of {len(items)} {what}(s) would change" if todo else "no change"
        for slot in slots:
            slot.out.result = Result.CHECK
        return
    if not todo:
        verdict.result = Result.UNCHANGED
        verdict.reason = f"nothing to do: every {what} runs its current, healthy release"
        for slot in slots:
            slot.out.result = Result.UNCHANGED
            for it in slot.items:
                record_unchanged(slot.run, it, slot.out)
        return
    for name in decide.lock_order([s.name for s in slots]):
        slot = next(s for s in slots if s.name == name)
        lock_and_pull(slot.run, slot.items, "deploy")
    switch()


def show_diff(run: HostRun, items: Sequence[Item], out: HostOutcome) -> None:
    """Unified diffs of the rendered files against the current release's (secrets masked on the host)."""
    res = run.run(store.current_files_script(run.root, [it.name for it in items]))
    cur_files, env_hash = store.parse_current_files(res.stdout)
    for it in items:
        if it.rendered is None:
            continue
        old = cur_files.get(it.name, {})
        for name, text in sorted(it.rendered.masked_files().items()):
            d = unified_diff(old.get(name), text, name)
            if name == ENV_FILE and it.name in env_hash:
                new_hash = hashlib.sha256(it.rendered.files[ENV_FILE].encode()).hexdigest()
                if new_hash != env_hash[it.name] and not d:
                    d = f"--- current/{name}\n+++ new/{name}\n# secret values changed (masked)\n"
            if d:
                out.diffs[f"{it.name}/{name}"] = d


def unified_diff(old: str | None, new: str, name: str) -> str:
    return "".join(difflib.unified_diff(
        (old or "").splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"current/{name}" if old is not None else "/dev/null", tofile=f"new/{name}",
    ))


def record_unchanged(run: HostRun, it: Item, out: HostOutcome) -> None:
    run.log(f"{it.name}: unchanged (release {it.step.release_id}, no restart)")
    out.services[it.name] = ServiceOutcome(it.name, Result.UNCHANGED, it.step.release_id, it.step.release_id)
    run.record(action="deploy", service=it.name, release_id=it.step.release_id, digest=it.prepared.image.digest,
               result=Result.UNCHANGED)


def lock_and_pull(run: HostRun, items: Sequence[Item], action: str) -> None:
    """The host's lock (``HostRun.lock``: a stale lock of this machine is taken over, others refuse),
    then every image the new releases need, while the old ones still serve: one round trip. A failed
    pull refuses; nothing changed."""
    pulling = [it for it in items if it.step.pulls]
    for it in pulling:
        run.log(f"{it.name}: pull {it.prepared.image.pull_ref}")
    answers = run.lock(action, [store.pull_script(it.prepared.image.pull_ref, loaded=bool(it.prepared.image.image_id))
                                for it in pulling],
                       name="lock + pull" if pulling else "lock",
                       timeout=60 + run.settings.pull_timeout * len(pulling) if pulling else None)
    for it, res in zip(pulling, answers, strict=True):
        judge_pull(run, it, res)


def judge_pull(run: HostRun, it: Item, res: ssh.Result | None) -> None:
    """Judge one pull step's answer (``store.pull_script``); a failure refuses, nothing changed."""
    image = it.prepared.image
    ref = image.pull_ref
    if res is None:
        raise Refusal(Result.FAILED, f"{it.name}: the pull of {ref} did not run; nothing was changed on the host")
    if image.image_id:  # loaded from a bundle, never pulled: verified by its image ID, not a repo digest
        problem = store.loaded_problem(res.rc, res.stdout, ref, image.image_id)
        if problem:
            raise Refusal(Result.FAILED, f"{it.name}: {problem}; nothing was changed on the host")
        run.log(f"{it.name}: image loaded from the bundle, image ID verified")
        return
    if res.rc != 0:
        raise Refusal(Result.FAILED, f"{it.name}: pull of {ref} failed: {short(res.stderr or res.stdout, 300)}; "
                                     "nothing was changed on the host")
    pulled, digests = store.parse_pull(res.stdout)
    if image.pinned and not store.digest_verified(digests, image.digest):
        raise Refusal(Result.FAILED, f"{it.name}: {ref} pulled but the engine reports digests {digests}, not "
                                     f"{image.digest}; refusing to run it")
    run.log(f"{it.name}: image {'pulled' if pulled else 'present'}, digest verified" if image.pinned
            else f"{it.name}: image {'pulled' if pulled else 'present'} (UNPINNED)")


# ---------------------------------------------------------------------------------------------
# 4: commit (what a switched, healthy host keeps)


def prune_after(run: HostRun, states: Mapping[str, release_state.ServiceState], done: Sequence[Item]) -> dict[str, release_state.ServiceState]:
    """The host's state once ``done`` are current and healthy (``decide.state_after``); what
    ``decide.prune_plan`` then chooses is deleted in the last round trip. Returns that state."""
    after = decide.state_after(states, {it.name: (it.step.release_id, it.manifest, it.health_doc) for it in done})
    plan = decide.prune_plan(after, run.host_settings.keep_releases)
    if plan.empty:
        return after
    for name, ids in plan.releases.items():
        run.defer(store.prune_script(Paths(run.root, name), ids))
    if plan.images:
        run.defer(store.image_remove_script(plan.images))
    n = sum(len(v) for v in plan.releases.values())
    run.log(f"pruning {n} old release(s) and {len(plan.images)} unused image(s); keeping "
            f"{run.host_settings.keep_releases} per service")
    return after
