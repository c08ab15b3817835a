"""Deploy and rollback decisions: pure functions over the host's release state.

State in (``store.ServiceState`` per service, as one round trip read it), decisions out: what to do
with each service (a new release, a switch to an older one with the same content, a health check of
a release a deploy left unverified, a restart), where to go back on failure, which release a rollback
goes to, what to prune, whether a lock may be taken over. ``llmfleet.release.deploy`` carries them
out; nothing here touches a host, and every decision is tested from fixtures (tests/test_deploy_decide.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, Protocol, TypedDict

from llmfleet.knowledge.release_state import RELEASE_ID_RE, Manifest, ReleaseInfo, ServiceState
from llmfleet.release.manifest import file_hashes
from llmfleet.release.render import ENV_FILE, Rendered
from llmfleet.release.store import DEFAULT_KEEP, new_release_id


class Action(StrEnum):
    NEW = "new"  # upload a new release, switch to it, health-check it
    SWITCH = "switch"  # an existing release holds this content: switch to it, health-check it
    VERIFY = "verify"  # current and running, never marked healthy (an interrupted deploy): health-check it
    RESTART = "restart"  # current but its unit is not active: restart it, health-check it
    UNCHANGED = "unchanged"  # current, healthy and running: nothing to do


class Result(StrEnum):
    """How a run ended, for a host or one of its services: every action's one vocabulary (deploy,
    rollback, a service over several hosts, stop/start/remove, a fleet upgrade's host)."""

    DEPLOYED = "deployed"
    UNCHANGED = "unchanged"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"
    REFUSED = "refused"
    CHECK = "check"
    STOPPED = "stopped"  # stop: the unit is down, its releases stay
    STARTED = "started"  # start: the unit runs its current release again (and answered its health check)
    REMOVED = "removed"  # remove: unit, containers, releases and the images only it used are gone
    ABSENT = "absent"  # stop/start/remove of a service the host does not have: nothing to do


OK_RESULTS = frozenset({Result.DEPLOYED, Result.UNCHANGED, Result.CHECK, Result.STOPPED, Result.STARTED,
                        Result.REMOVED, Result.ABSENT})
NOT_DONE = frozenset({Result.FAILED, Result.REFUSED})


class StageTime(TypedDict):
    """One stage of a run (``deploy --timeline``): seconds since the run began, duration, SSH round
    trips (None: a part of the stage before it, such as a health check's own stages)."""

    stage: str
    start_s: float
    seconds: float
    round_trips: int | None


class PreflightDoc(TypedDict, total=False):
    """The preflight's verdict on one service (``hosts``: every host of a service over several)."""

    service: str
    hosts: list[str]
    ok: bool
    checks: list[dict[str, str]]  # preflight.Check.to_dict()


HealthDoc = dict[str, object]  # health.HealthReport.to_dict(): what a health mark on the host holds


class Outcome(Protocol):
    """What every action's result offers its callers (the CLI, ``--json``, ``fleet.upgrade``)."""

    host: str
    result: Result
    reason: str
    duration_s: float
    round_trips: int
    timeline: list[StageTime]


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
    preflight: list[PreflightDoc] = field(default_factory=list)
    health: dict[str, HealthDoc] = field(default_factory=dict)  # service -> its last health check
    services: dict[str, ServiceOutcome] = field(default_factory=dict)
    round_trips: int = 0
    timeline: list[StageTime] = field(default_factory=list)  # where the seconds went, in order

    @property
    def ok(self) -> bool:
        return self.result in OK_RESULTS

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


class Refusal(Exception):
    """A decision that stops the run before anything changes: ``result`` is ``refused`` or ``failed``."""

    def __init__(self, result: Result | str, reason: str) -> None:
        super().__init__(reason)
        self.result = Result(result)
        self.reason = reason


@dataclass(frozen=True)
class ServiceStep:
    """What the deploy does with one service."""

    service: str
    action: Action
    release_id: str
    previous: str | None = None  # where to go back when this step fails (None: stop the unit)
    changes: tuple[str, ...] = ()

    @property
    def pulls(self) -> bool:
        """The image must be on the host before anything switches."""
        return self.action in (Action.NEW, Action.SWITCH)

    @property
    def switches(self) -> bool:
        return self.action in (Action.NEW, Action.SWITCH, Action.RESTART)

    @property
    def arms_revert(self) -> bool:
        """Commit confirmed: a host-side revert is armed before every switch, and before a verify's health
        check too: a verify finds a release some earlier deploy switched to and never confirmed (killed,
        its connection lost), whose revert timer may still be running; arming again replaces that timer
        with this deploy's, which its confirmation then stops (else the old timer would later put a
        release this deploy just confirmed back to an older one)."""
        return self.switches or self.action == Action.VERIFY


@dataclass(frozen=True)
class DeployPlan:
    steps: tuple[ServiceStep, ...]

    @property
    def todo(self) -> tuple[ServiceStep, ...]:
        return tuple(s for s in self.steps if s.action != Action.UNCHANGED)

    def step(self, service: str) -> ServiceStep:
        return next(s for s in self.steps if s.service == service)


# ---------------------------------------------------------------------------------------------
# Releases


def find_release_with_content(state: ServiceState | None, content_hash: str) -> str | None:
    """An existing release holding exactly this content (the newest, if several)."""
    if state is None:
        return None
    for rid in sorted(state.releases, reverse=True):
        m = state.releases[rid].manifest
        if m is not None and m.content_hash == content_hash:
            return rid
    return None


def rollback_target(state: ServiceState, *, exclude: str | None = None) -> str | None:
    """``invoke rollback``'s default: the newest release confirmed healthy (``ReleaseInfo.healthy``)
    older than the current one (or than ``exclude``); failing that, the newest confirmed one other
    than it. A release never confirmed (a deploy killed after its switch) is never a target."""
    pivot = exclude or state.current
    healthy = [rid for rid, r in state.releases.items() if r.healthy and rid != pivot]
    older = [rid for rid in healthy if pivot is None or rid < pivot]
    candidates = older or healthy
    return max(candidates) if candidates else None


def last_confirmed(state: ServiceState, *, exclude: str | None = None) -> str | None:
    """The release last confirmed healthy other than ``exclude``: the latest health mark (a release
    gone back to is marked again), then the newest id; None when no other release was ever confirmed."""
    marked = [(t, rid) for rid, r in state.releases.items()
              if rid != exclude and (t := r.confirmed_at) is not None]
    return max(marked)[1] if marked else None


def go_back_target(state: ServiceState | None, release_id: str | None) -> str | None:
    """Where a failed step on ``release_id`` (None: a release not on the host yet) goes back to, and
    what the host-side revert armed before its switch points at: the current release when it is
    another one and was confirmed healthy, else the release last confirmed healthy
    (``last_confirmed``). Never a release that was not confirmed: a deploy killed right after its
    switch leaves its release current but unconfirmed, and the next failure goes back past it.
    None (nothing confirmed to go back to): the unit is stopped, as after a failed first deploy."""
    if state is None:
        return None
    cur = state.current_release
    if cur is not None and cur.id != release_id and cur.healthy:
        return cur.id
    return last_confirmed(state, exclude=release_id)


def describe_change(current: Manifest | None, rendered: Rendered) -> list[str]:
    """What differs between the running release and the one rendered now (no secret values)."""
    if current is None:
        return [f"new service: image {rendered.image.pull_ref}, args {' '.join(rendered.engine_args)}"]
    out: list[str] = []
    if current.image_ref != rendered.image.pull_ref:
        out.append(f"image {current.image_ref} -> {rendered.image.pull_ref}")
    old_args = list(current.engine_args)
    if old_args != list(rendered.engine_args):
        removed = [a for a in old_args if a not in rendered.engine_args]
        added = [a for a in rendered.engine_args if a not in old_args]
        out.append(f"engine args: -[{' '.join(removed)}] +[{' '.join(added)}]")
    if not out:
        changed = [n for n, h in file_hashes(rendered).items() if current.files.get(n) != h]
        if changed:
            out.append(f"{changed[0]} changed")
    if not out:
        out.append(f"{ENV_FILE} changed (secret values; not shown)")
    return out


def decide_service(state: ServiceState | None, rendered: Rendered, now: datetime) -> ServiceStep:
    """One service: reuse a release with the same content when there is one, else a new release."""
    name = rendered.service
    existing = find_release_with_content(state, rendered.content_hash)
    current = state.current_release if state else None
    current_manifest = current.manifest if current else None
    if existing is not None and state is not None and state.current == existing:
        back = go_back_target(state, existing)
        if state.releases[existing].healthy and state.unit == "active":
            return ServiceStep(name, Action.UNCHANGED, existing, back)
        if state.unit == "active":
            return ServiceStep(name, Action.VERIFY, existing, back, (
                f"release {existing} is current but was never marked healthy (an interrupted deploy): "
                "health-check it",))
        return ServiceStep(name, Action.RESTART, existing, back, (
            f"release {existing} is current but its unit is {state.unit}: restart and health-check it",))
    if existing is not None:
        return ServiceStep(name, Action.SWITCH, existing, go_back_target(state, existing), (
            f"switch to existing release {existing}", *describe_change(current_manifest, rendered)))
    rid = new_release_id(rendered.content_hash, now)
    return ServiceStep(name, Action.NEW, rid, go_back_target(state, rid), (
        f"new release {rid}", *describe_change(current_manifest, rendered)))


def decide(states: Mapping[str, ServiceState], rendered: list[Rendered], now: datetime) -> DeployPlan:
    """Every service of the deploy, in the given order."""
    return DeployPlan(tuple(decide_service(states.get(r.service), r, now) for r in rendered))


# ---------------------------------------------------------------------------------------------
# After a deploy: the state it leaves, and what to prune


@dataclass(frozen=True)
class PrunePlan:
    releases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # service -> release ids to delete
    images: tuple[str, ...] = ()  # image refs no kept release uses

    @property
    def empty(self) -> bool:
        return not self.releases and not self.images


def releases_to_prune(release_ids: list[str], *, keep: int = DEFAULT_KEEP, protect: set[str] | None = None) -> list[str]:
    """Everything but the newest ``keep`` releases and the protected ones (current, rollback target)."""
    protect = {p for p in (protect or set()) if p}
    ordered = sorted(release_ids, reverse=True)
    kept = set(ordered[:keep]) | protect
    return sorted(r for r in ordered if r not in kept)


def images_to_prune(states: Mapping[str, ServiceState], deleted: Mapping[str, tuple[str, ...] | list[str]]) -> list[str]:
    """Image refs used only by releases being deleted, across every service on the host."""
    doomed: set[str] = set()
    in_use: set[str] = set()
    for name, st in states.items():
        gone = set(deleted.get(name, ()))
        for rid, info in st.releases.items():
            ref = info.image_ref
            if ref:
                (doomed if rid in gone else in_use).add(ref)
    return sorted(doomed - in_use)


def prune_plan(states: Mapping[str, ServiceState], keep: int) -> PrunePlan:
    """Keep the newest ``keep`` releases per service plus current, its rollback target and the
    release a failure goes back to (``go_back_target``); a service with no current release keeps
    everything. Images go when only deleted releases used them."""
    deleted: dict[str, tuple[str, ...]] = {}
    for name, st in states.items():
        protect = ({st.current, rollback_target(st), go_back_target(st, None)} if st.current
                   else set(st.releases))
        gone = releases_to_prune(list(st.releases), keep=keep, protect={p for p in protect if p})
        if gone:
            deleted[name] = tuple(gone)
    return PrunePlan(deleted, tuple(images_to_prune(states, deleted)))


def state_after(states: Mapping[str, ServiceState], deployed: Mapping[str, tuple[str, Manifest | None, dict[str, Any] | None]]) -> dict[str, ServiceState]:
    """The host's state once the deployed releases (service -> (release, manifest, health)) are
    current and healthy. A copy: the state read from the host is left as it was."""
    out = {n: ServiceState(st.name, st.current, st.unit, dict(st.releases)) for n, st in states.items()}
    for name, (rid, manifest, health) in deployed.items():
        st = out.setdefault(name, ServiceState(name=name))
        old = st.releases.get(rid)
        st.releases[rid] = ReleaseInfo(rid, manifest or (old.manifest if old else None), health or {"result": "healthy"})
        st.current = rid
        st.unit = "active"
    return out


# ---------------------------------------------------------------------------------------------
# Going back after a failure, and rollback


@dataclass(frozen=True)
class GoBack:
    """How going back to the previous release ended: a kind, the release it concerns, the error.
    ``sentence`` says it for people; nothing reads a release id back out of that sentence."""

    HEALTHY = "healthy"  # the previous release is current again and healthy
    UNHEALTHY = "unhealthy"  # current again, but its health check failed
    SWITCH_FAILED = "switch-failed"  # pointing current back failed
    ERROR = "error"  # the connection or a command failed on the way
    STOPPED = "stopped"  # nothing to go back to: the unit was stopped
    STOP_FAILED = "stop-failed"  # nothing to go back to, and stopping the unit failed
    NOTHING = "nothing"  # nothing to go back to (a rollback whose target was current already)

    kind: str
    release: str | None
    detail: str = ""

    @property
    def result(self) -> Result:
        return Result.ROLLED_BACK if self.kind == self.HEALTHY else Result.FAILED

    @property
    def current(self) -> str | None:
        """The release current now, when it is known."""
        return self.release if self.kind in (self.HEALTHY, self.UNHEALTHY) else None

    def sentence(self, *, still: bool = False) -> str:
        r, d = self.release, self.detail
        return {
            self.HEALTHY: f"the host is {'still' if still else 'back'} on release {r} (healthy)",
            self.UNHEALTHY: f"ROLLBACK FAILED: previous release {r} is current again but unhealthy: {d}; "
                            "check the host now",
            self.SWITCH_FAILED: f"ROLLBACK FAILED: switching back to {r} failed: {d}; check the host now",
            self.ERROR: f"ROLLBACK FAILED: {d}; the host may be serving nothing; check it now",
            self.STOPPED: "no release confirmed healthy to go back to; the service was stopped",
            self.STOP_FAILED: f"no release confirmed healthy to go back to, and stopping the unit failed: {d}",
            self.NOTHING: "nothing else to go back to",
        }[self.kind]


@dataclass(frozen=True)
class RollbackStep:
    service: str
    target: str
    previous: str | None  # the release current before the rollback
    manifest: Manifest
    # where a failure goes back to, and what the host-side revert armed before the switch points at:
    # ``go_back_target`` (the previous release only when it was confirmed healthy; None: stop the unit)
    back: str | None = None

    @property
    def image_ref(self) -> str:
        return self.manifest.image_ref or ""

    @property
    def arms_revert(self) -> bool:
        """Commit confirmed: armed unless the rollback restarts the current release (nothing to revert to)."""
        return self.previous != self.target


def decide_rollback(states: Mapping[str, ServiceState], services: list[str], *, host: str,
                    service: str | None = None, to: str | None = None) -> list[RollbackStep]:
    """Which release each service goes back to. ``services``: the inventory's services of the host.
    Raises ``Refusal`` (result ``failed``) with the reason when a rollback cannot be done."""
    candidates = [service] if service else [n for n in services if n in states]
    if to is not None and not service:
        candidates = [n for n in candidates if to in states[n].releases]
        if not candidates:
            raise Refusal("failed", f"release {to} does not exist on {host}; see `invoke releases --host {host}`")
    if not candidates:
        raise Refusal("failed", f"{host} has no deployed llmfleet service to roll back")
    steps: list[RollbackStep] = []
    for name in candidates:
        st = states.get(name)
        if st is None or not st.releases:
            raise Refusal("failed", f"service {name} has no releases on {host}")
        target = to or rollback_target(st)
        if target is None:
            raise Refusal("failed", f"service {name}: no release confirmed healthy other than the current one "
                                    f"({st.current}) to roll back to; see `invoke releases --host {host}`")
        if target not in st.releases:
            raise Refusal("failed", f"service {name}: release {target} does not exist on {host} (pruned?); "
                                    "see `invoke releases`")
        manifest = st.releases[target].manifest
        if manifest is None or not manifest.image_ref:
            raise Refusal("failed", f"service {name}: release {target} has no readable manifest")
        steps.append(RollbackStep(name, target, st.current, manifest, go_back_target(st, target)))
    return steps


# ---------------------------------------------------------------------------------------------
# A service over several hosts (a head and its workers)


def lock_order(hosts: Sequence[str]) -> list[str]:
    """The order every host of a run is locked, pulled and finished in: sorted names, so that two runs
    that share hosts cannot each hold half of them."""
    return sorted(hosts)


def switch_order(head: str, workers: Sequence[str]) -> list[str]:
    """Workers first, the head last: the head needs its workers up to start. Arming, switching,
    confirming and going back all take this order (the head's timer fires last)."""
    return [*workers, head]


def head_step(head: ServiceStep, workers: Sequence[ServiceStep]) -> ServiceStep:
    """What a worker change means for the head: its RPC connections / Ray membership end with the
    workers' old containers, so an unchanged head is restarted on its release."""
    if head.action == Action.UNCHANGED and any(w.action != Action.UNCHANGED for w in workers):
        return ServiceStep(head.service, Action.RESTART, head.release_id, head.release_id,
                           ("restart: its workers change",))
    return head


def restart_head_going_back(head_switched: bool, workers_switched: Sequence[bool], head_previous: str | None) -> bool:
    """Going back after a failure: a head that never switched still lost its workers' old containers,
    so once they are back it is restarted on its own release (when it has one)."""
    return not head_switched and any(workers_switched) and head_previous is not None


def rollback_action(target: str, state: ServiceState) -> Action:
    """One host of a service over several going back to ``target``: nothing to do when it is current
    and running, a restart when it is current but down, else a switch."""
    if target == state.current:
        return Action.UNCHANGED if state.unit == "active" else Action.RESTART
    return Action.SWITCH


def cluster_result(went_back: Sequence[GoBack]) -> Result:
    """A failed run of a service over several hosts: rolled back when every host that went back is
    healthy again, failed otherwise (or when none went back: nothing was switched)."""
    return Result.ROLLED_BACK if went_back and all(b.kind == GoBack.HEALTHY for b in went_back) else Result.FAILED


def service_op_result(results: Sequence[Result]) -> Result:
    """One host's stop/start/remove over its services: failed when one failed (or there was none),
    else what was done (stopped/started/removed), else absent (none of them is on the host)."""
    if not results or Result.FAILED in results:
        return Result.FAILED
    done = [r for r in results if r != Result.ABSENT]
    return done[0] if done else Result.ABSENT


# ---------------------------------------------------------------------------------------------
# The deploy lock


def may_take_over(holder: Mapping[str, Any] | None, origin: str, alive: Callable[[int], bool], *,
                  own_pid: int | None = None, live: Collection[str] = ()) -> bool:
    """A lock left by a deploy from this very machine whose process is gone (Ctrl-C'd, killed, or its
    SSH connection dropped before it could unlock): safe to take over. So is one left by this very
    process (``own_pid``) under a token no run of it holds any more (``live``: the tokens its runs
    hold now): an earlier run in the same process whose connection dropped before it could unlock
    (a push of many hosts, a bench). Anything else is refused."""
    if not holder or holder.get("from") != origin:
        return False
    try:
        pid = int(holder.get("pid"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    if own_pid is not None and pid == own_pid:
        return bool(holder.get("token")) and holder.get("token") not in live
    return not alive(pid)


LockStep = Literal["acquired", "take_over", "wait", "refuse", "fail"]


def lock_step(*, acquired: bool, holder: Mapping[str, Any] | None, rc: int, held_rc: int, origin: str,
              alive: Callable[[int], bool], took_over: bool, waited_s: float, wait_s: float,
              own_pid: int | None = None, live: Collection[str] = ()) -> LockStep:
    """One answer of the lock script, and what the writer does next: ``acquired``; ``take_over`` a
    stale lock of this machine (``may_take_over``; once per run: a second stale holder is refused);
    ``fail`` when the script itself failed (no holder, an exit other than held); ``wait`` and ask
    again while ``waited_s`` is below the writer's bound ``wait_s`` (0: never waits, as deploys);
    else ``refuse`` naming the holder."""
    if acquired:
        return "acquired"
    if not took_over and may_take_over(holder, origin, alive, own_pid=own_pid, live=live):
        return "take_over"
    if holder is None and rc not in (0, held_rc):
        return "fail"
    if waited_s < wait_s:
        return "wait"
    return "refuse"


def is_release_id(text: str) -> bool:
    return bool(RELEASE_ID_RE.match(text))
