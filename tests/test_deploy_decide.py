"""The deploy's decisions, table-driven: a host's release state in, the steps out (in the manner of
pyinfra's operation tests, pyinfra-dev/pyinfra tests/operations/*/*.json: facts in, commands out).

These are the cases that the lab covers only end to end: interrupted deploys, rollback targets,
pruning and lock takeover. Release ids R1 < R2 < ... are ordered by time, like real ones.
"""

from __future__ import annotations

import pytest

from llmfleet.release import decide as D
from llmfleet.release.decide import Action
from tests.deploy_fixtures import NOW, R1, R2, R3, R4, R5, R6, R7, rendered, svc_state

NEW = rendered()
H = NEW.content_hash
OTHER = "f" * 64
NEW_ID = f"20261129T120000Z-{H[:10]}"


def marked(st, rid: str, result: str, time: str | None = None):
    """``st`` with release ``rid``'s health mark replaced (a check that failed, a later confirmation)."""
    st.releases[rid].health = {"result": result} | ({"time": time} if time else {})
    return st


def killed_after_switch():
    """A deploy of R2 killed right after its switch (R2 current, never confirmed); the next deploy's R3
    failed and could not be switched away from (marked unhealthy, still current); R1 was confirmed."""
    return marked(svc_state({R1: (OTHER, True), R2: (OTHER, False), R3: (OTHER, False)}, R3), R3, "unhealthy")


# ---------------------------------------------------------------------------------------------
# decide_service: what to do with one service


@pytest.mark.parametrize(
    ("case", "state", "action", "release", "previous"),
    [
        ("first deploy", None, Action.NEW, NEW_ID, None),
        ("same content, current, healthy, running", svc_state({R1: (OTHER, True), R2: (H, True)}, R2),
         Action.UNCHANGED, R2, R1),
        ("new content on a healthy host goes back to the current release",
         svc_state({R1: (OTHER, True), R2: (OTHER, True)}, R2), Action.NEW, NEW_ID, R2),
        ("interrupted after the switch: current, running, never marked healthy",
         svc_state({R1: (OTHER, True), R2: (H, False)}, R2), Action.VERIFY, R2, R1),
        ("current but the unit failed: restart it", svc_state({R1: (OTHER, True), R2: (H, True)}, R2, "failed"),
         Action.RESTART, R2, R1),
        ("current, unmarked and the unit is down: restart it", svc_state({R2: (H, False)}, R2, "inactive"),
         Action.RESTART, R2, None),
        ("an older release holds this content: switch to it", svc_state({R1: (H, True), R2: (OTHER, True)}, R2),
         Action.SWITCH, R1, R2),
        ("the newest of two releases with this content is reused",
         svc_state({R1: (H, True), R2: (H, True), R3: (OTHER, True)}, R3), Action.SWITCH, R2, R3),
        ("interrupted before the switch: the uploaded release is reused",
         svc_state({R1: (OTHER, True), R2: (H, False)}, R1), Action.SWITCH, R2, R1),
        ("current points at a release that is gone: back to the newest healthy one",
         svc_state({R1: (OTHER, True), R2: (OTHER, False)}, R5), Action.NEW, NEW_ID, R1),
        ("no current and no healthy release: nothing to go back to",
         svc_state({R1: (OTHER, False)}, None), Action.NEW, NEW_ID, None),
        ("an unreadable manifest never matches", svc_state({R1: (None, True)}, R1), Action.NEW, NEW_ID, R1),
        ("killed after its switch: the current release was never confirmed, back to the confirmed one",
         svc_state({R1: (OTHER, True), R2: (OTHER, False)}, R2), Action.NEW, NEW_ID, R1),
        ("current failed, the one before never confirmed: back past both to the last confirmed",
         killed_after_switch(), Action.NEW, NEW_ID, R1),
        ("an unconfirmed current release and nothing confirmed: nothing to go back to (stop)",
         svc_state({R1: (OTHER, False), R2: (OTHER, False)}, R2), Action.NEW, NEW_ID, None),
        ("the same content as the unconfirmed release: verify it, back to the confirmed one",
         svc_state({R1: (OTHER, True), R2: (OTHER, False), R3: (H, False)}, R3), Action.VERIFY, R3, R1),
    ],
)
def test_decide_service(case, state, action, release, previous):
    step = D.decide_service(state, NEW, NOW)
    assert (step.action, step.release_id, step.previous) == (action, release, previous), case


def test_steps_say_what_changes_without_secret_values():
    st = svc_state({R1: (OTHER, True)}, R1)
    step = D.decide_service(st, rendered(api_key={"from_env": "K"}), NOW)
    assert step.changes[0].startswith("new release ")
    assert any("image reg.lab:5000/llamacpp@sha256:abab" in c and "@sha256:cdcd" in c for c in step.changes)
    assert not any("sk-secret" in c for c in step.changes)
    assert D.decide_service(None, NEW, NOW).changes[1].startswith("new service: image reg.lab:5000/llamacpp@")


@pytest.mark.parametrize(
    ("action", "pulls", "switches"),
    [(Action.NEW, True, True), (Action.SWITCH, True, True), (Action.RESTART, False, True),
     (Action.VERIFY, False, False), (Action.UNCHANGED, False, False)],
)
def test_which_steps_pull_and_switch(action, pulls, switches):
    step = D.ServiceStep("chat", action, R1)
    assert (step.pulls, step.switches) == (pulls, switches)
    # commit confirmed: every switch is armed, and a verify too (its arm replaces the revert timer an
    # earlier, killed deploy may have left running on that release)
    assert step.arms_revert == (switches or action == Action.VERIFY)


@pytest.mark.parametrize(("previous", "target", "arms"), [(R2, R1, True), (None, R1, True), (R1, R1, False)])
def test_a_rollback_arms_a_revert_unless_it_restarts_the_current_release(previous, target, arms):
    st = svc_state({R1: (OTHER, True)}, R1)
    step = D.RollbackStep("chat", target, previous, st.releases[R1].manifest)
    assert step.arms_revert is arms


def test_decide_keeps_the_services_order_and_lists_what_to_do():
    other = rendered(name="other", port=9090)
    plan = D.decide({"chat": svc_state({R1: (H, True)}, R1)}, [NEW, other], NOW)
    assert [s.service for s in plan.steps] == ["chat", "other"]
    assert [s.service for s in plan.todo] == ["other"]


# ---------------------------------------------------------------------------------------------
# rollback targets


@pytest.mark.parametrize(
    ("releases", "current", "exclude", "expected"),
    [
        ({R1: True, R2: True, R3: True}, R3, None, R2),
        ({R1: True, R2: False, R3: True}, R3, None, R1),  # an unhealthy release is never a target
        ({R1: True, R2: True, R3: True}, R1, None, R3),  # after a rollback: the newest healthy other one
        ({R1: True, R2: True}, R2, R2, R1),
        ({R1: True, R2: True, R3: False}, R2, R3, R2),  # a failed new release goes back past itself
        ({R1: False}, R1, None, None),
        ({}, None, None, None),
    ],
)
def test_rollback_target(releases, current, exclude, expected):
    st = svc_state({r: (OTHER, h) for r, h in releases.items()}, current)
    assert D.rollback_target(st, exclude=exclude) == expected


@pytest.mark.parametrize(
    ("case", "state", "release", "expected"),
    [
        ("the confirmed current release", svc_state({R1: (OTHER, True), R2: (OTHER, True)}, R2), NEW_ID, R2),
        ("killed after its switch (table of the brief): C failed, B never confirmed, A confirmed",
         killed_after_switch(), NEW_ID, R1),
        ("the release being verified is never its own way back",
         svc_state({R1: (OTHER, True), R2: (OTHER, True)}, R2), R2, R1),
        ("the last confirmation wins over the newest id: rolled back from R3 to R1, then R4 killed",
         marked(marked(svc_state({R1: (OTHER, True), R3: (OTHER, True), R4: (OTHER, False)}, R4),
                       R3, "healthy", "2026-11-03T10:00:00+00:00"), R1, "healthy", "2026-11-03T11:00:00+00:00"),
         NEW_ID, R1),
        ("a mark without a time counts from the release's creation",
         marked(svc_state({R1: (OTHER, True), R2: (OTHER, True), R3: (OTHER, False)}, R3),
                R1, "healthy", "2026-11-01T00:00:01+00:00"), NEW_ID, R2),
        ("nothing confirmed", svc_state({R1: (OTHER, False)}, R1), NEW_ID, None),
        ("no state", None, NEW_ID, None),
    ],
)
def test_go_back_target_is_the_last_release_confirmed_healthy(case, state, release, expected):
    assert D.go_back_target(state, release) == expected, case


STATES = {
    "chat": svc_state({R1: (OTHER, True), R2: (OTHER, True), R3: (OTHER, True)}, R3),
    "embed": svc_state({R1: (OTHER, True), R4: (OTHER, True)}, R4, name="embed"),
}


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, [("chat", R2, R3), ("embed", R1, R4)]),
        ({"service": "chat"}, [("chat", R2, R3)]),
        ({"service": "chat", "to": R1}, [("chat", R1, R3)]),
        ({"to": R1}, [("chat", R1, R3), ("embed", R1, R4)]),
        ({"to": R2}, [("chat", R2, R3)]),  # only the services that have it
        ({"service": "chat", "to": R3}, [("chat", R3, R3)]),  # the current one: restart and check it
    ],
)
def test_decide_rollback(kw, expected):
    steps = D.decide_rollback(STATES, ["chat", "embed"], host="h1", **kw)
    assert [(s.service, s.target, s.previous) for s in steps] == expected
    assert all(s.image_ref for s in steps)
    # a failure (and the host-side revert) goes back to the confirmed release current before
    assert all(s.back == s.previous for s in steps if s.previous != s.target)


@pytest.mark.parametrize(
    ("case", "state", "kw", "target", "back"),
    [
        ("killed after its switch: rollback skips the unconfirmed releases; nothing else confirmed to go back to",
         killed_after_switch(), {}, R1, None),
        ("from an unconfirmed current release: a failure goes back to the other confirmed one",
         svc_state({R1: (OTHER, True), R2: (OTHER, True), R3: (OTHER, False)}, R3), {}, R2, R1),
        ("to a named older release: a failure goes back to the confirmed current one",
         svc_state({R1: (OTHER, True), R2: (OTHER, True), R3: (OTHER, True)}, R3), {"to": R1}, R1, R3),
    ],
)
def test_rollback_targets_and_goes_back_to_confirmed_releases_only(case, state, kw, target, back):
    (step,) = D.decide_rollback({"chat": state}, ["chat"], host="h1", **kw)
    assert (step.target, step.back) == (target, back), case
    assert step.arms_revert


@pytest.mark.parametrize(
    ("states", "kw", "says"),
    [
        (STATES, {"to": R7}, f"release {R7} does not exist on h1"),
        (STATES, {"service": "chat", "to": R7}, f"release {R7} does not exist on h1 (pruned?)"),
        ({}, {}, "h1 has no deployed llmfleet service"),
        ({}, {"service": "chat"}, "service chat has no releases on h1"),
        ({"chat": svc_state({R1: (OTHER, False), R2: (OTHER, True)}, R2)}, {}, "no release confirmed healthy other than"),
        ({"chat": svc_state({R1: (None, True), R2: (OTHER, True)}, R2)}, {}, f"release {R1} has no readable manifest"),
    ],
)
def test_rollback_refusals(states, kw, says):
    with pytest.raises(D.Refusal) as err:
        D.decide_rollback(states, ["chat", "embed"], host="h1", **kw)
    assert err.value.result == "failed" and says in err.value.reason


# ---------------------------------------------------------------------------------------------
# pruning


@pytest.mark.parametrize(
    ("ids", "keep", "protect", "expected"),
    [
        ([R1, R2, R3, R4, R5, R6], 5, set(), [R1]),
        ([R1, R2, R3], 5, set(), []),
        ([R1, R2, R3, R4], 2, {R1}, [R2]),
        ([R3, R1, R2], 1, {None}, [R1, R2]),
    ],
)
def test_releases_to_prune(ids, keep, protect, expected):
    assert D.releases_to_prune(ids, keep=keep, protect=protect) == expected


def test_prune_keeps_current_and_its_rollback_target_and_shared_images():
    img = {R1: "img@1", R2: "img@2", R3: "img@3", R4: "img@4", R5: "img@2"}
    chat = svc_state({R1: (OTHER, True), R2: (OTHER, False), R3: (OTHER, False), R4: (OTHER, False),
                      R5: (OTHER, False)}, R5, refs=img)
    plan = D.prune_plan({"chat": chat}, keep=2)
    # keep R5 (current), R4 (newest two) and R1 (the only healthy release: the rollback target)
    assert plan.releases == {"chat": (R2, R3)}
    assert plan.images == ("img@3",)  # img@2 is still used by R5


def test_prune_keeps_the_release_a_failure_goes_back_to():
    # R2 is current but never confirmed (a killed deploy); R1, the last confirmed, was rolled back to
    # after R3 and R4, so it is neither among the newest nor the rollback target older than current
    st = marked(svc_state({R1: (OTHER, True), R2: (OTHER, False), R3: (OTHER, True), R4: (OTHER, True),
                           R5: (OTHER, False)}, R5), R1, "healthy", "2026-11-09T00:00:00+00:00")
    assert D.go_back_target(st, None) == R1 and D.rollback_target(st) == R4
    assert D.prune_plan({"chat": st}, keep=1).releases == {"chat": (R2, R3)}


def test_prune_leaves_a_service_without_current_alone():
    st = svc_state({r: (OTHER, True) for r in (R1, R2, R3, R4)}, None)
    assert D.prune_plan({"chat": st}, keep=1).empty


def test_prune_after_a_deploy_counts_the_new_release():
    st = svc_state({r: (OTHER, True) for r in (R1, R2, R3)}, R3)
    after = D.state_after({"chat": st}, {"chat": (R4, None, {"result": "healthy"})})
    assert st.current == R3 and R4 not in st.releases  # the state read from the host is untouched
    assert after["chat"].current == R4
    assert D.prune_plan(after, keep=2).releases == {"chat": (R1, R2)}


# ---------------------------------------------------------------------------------------------
# lock takeover


@pytest.mark.parametrize(
    ("holder", "alive", "take"),
    [
        ({"from": "me@ws", "pid": 42}, False, True),
        ({"from": "me@ws", "pid": 42}, True, False),  # that deploy still runs
        ({"from": "bob@elsewhere", "pid": 42}, False, False),  # another machine: never
        ({"from": "me@ws"}, False, False),  # no pid to check
        ({"from": "me@ws", "pid": "x"}, False, False),
        ({"note": "lock directory exists without a readable holder"}, False, False),
        (None, False, False),
    ],
)
def test_lock_takeover(holder, alive, take):
    assert D.may_take_over(holder, "me@ws", lambda pid: alive) is take


@pytest.mark.parametrize(
    ("holder", "live", "take"),
    [
        ({"from": "me@ws", "pid": 7, "token": "t1"}, {"t2"}, True),  # an earlier run of this process, gone
        ({"from": "me@ws", "pid": 7, "token": "t1"}, {"t1"}, False),  # a run of this process holds it now
        ({"from": "me@ws", "pid": 7}, set(), False),  # no token to tell
        ({"from": "bob@elsewhere", "pid": 7, "token": "t1"}, set(), False),
    ],
)
def test_lock_takeover_within_this_process(holder, live, take):
    """This process (pid 7) is alive, so the pid alone cannot tell: the tokens its runs hold now do."""
    assert D.may_take_over(holder, "me@ws", lambda pid: True, own_pid=7, live=live) is take


OTHER = {"who": "bob", "from": "bob@ws2", "pid": 7, "action": "models.push"}
MINE_DEAD = {"who": "me", "from": "me@ws", "pid": 7, "action": "deploy"}


@pytest.mark.parametrize(
    ("name", "acquired", "holder", "rc", "took_over", "waited", "wait", "step"),
    [
        ("free", True, None, 0, False, 0, 0, "acquired"),
        ("free after waiting", True, None, 0, False, 12, 60, "acquired"),
        ("another writer, no wait (deploys)", False, OTHER, 3, False, 0, 0, "refuse"),
        ("another writer, time left", False, OTHER, 3, False, 10, 60, "wait"),
        ("another writer, bound reached", False, OTHER, 3, False, 60.2, 60, "refuse"),
        ("this machine's dead run", False, MINE_DEAD, 3, False, 0, 0, "take_over"),
        ("this machine's dead run, taken over once already", False, MINE_DEAD, 3, True, 0, 0, "refuse"),
        ("the script failed (read-only disk)", False, None, 2, False, 0, 60, "fail"),
        ("the answer was cut short, time left", False, None, 0, False, 0, 60, "wait"),
        ("the answer was cut short, no wait", False, None, 3, False, 0, 0, "refuse"),
    ],
)
def test_lock_step(name, acquired, holder, rc, took_over, waited, wait, step):
    got = D.lock_step(acquired=acquired, holder=holder, rc=rc, held_rc=3, origin="me@ws", alive=lambda pid: False,
                      took_over=took_over, waited_s=waited, wait_s=wait)
    assert got == step, name


# ---------------------------------------------------------------------------------------------
# going back


@pytest.mark.parametrize(
    ("kind", "result", "current", "says"),
    [
        (D.GoBack.HEALTHY, "rolled_back", R1, f"the host is back on release {R1} (healthy)"),
        (D.GoBack.UNHEALTHY, "failed", R1, f"previous release {R1} is current again but unhealthy: why"),
        (D.GoBack.SWITCH_FAILED, "failed", None, f"switching back to {R1} failed: why"),
        (D.GoBack.ERROR, "failed", None, "ROLLBACK FAILED: why; the host may be serving nothing"),
    ],
)
def test_go_back_outcomes_carry_the_release_as_a_field(kind, result, current, says):
    back = D.GoBack(kind, R1, "why")
    assert (back.result, back.current) == (result, current)
    assert says in back.sentence()


def test_go_back_sentence_for_a_rollback_says_still():
    assert D.GoBack(D.GoBack.HEALTHY, R1).sentence(still=True) == f"the host is still on release {R1} (healthy)"
    assert D.GoBack(D.GoBack.STOPPED, None).current is None


# ---------------------------------------------------------------------------------------------
# A service over several hosts: the decisions across hosts


def step(action: Action, rid: str = R2, previous: str | None = R1) -> D.ServiceStep:
    return D.ServiceStep("big", action, rid, previous, ("a change",) if action != Action.UNCHANGED else ())


@pytest.mark.parametrize(
    ("case", "head", "workers", "action", "changes"),
    [
        ("nothing changes anywhere", Action.UNCHANGED, [Action.UNCHANGED, Action.UNCHANGED], Action.UNCHANGED, ()),
        ("a worker changes: the head restarts", Action.UNCHANGED, [Action.UNCHANGED, Action.NEW], Action.RESTART,
         ("restart: its workers change",)),
        ("a worker is only verified: still a restart", Action.UNCHANGED, [Action.VERIFY], Action.RESTART,
         ("restart: its workers change",)),
        ("the head changes itself: its own step", Action.NEW, [Action.NEW], Action.NEW, ("a change",)),
        ("the head alone changes", Action.SWITCH, [Action.UNCHANGED], Action.SWITCH, ("a change",)),
        ("no workers", Action.UNCHANGED, [], Action.UNCHANGED, ()),
    ],
)
def test_what_a_worker_change_means_for_the_head(case, head, workers, action, changes):
    got = D.head_step(step(head), [step(w) for w in workers])
    assert (got.action, got.changes) == (action, changes), case
    if action == Action.RESTART:  # restarted on its own release, and going back restarts it there again
        assert (got.release_id, got.previous) == (R2, R2)


@pytest.mark.parametrize(
    ("head_switched", "workers_switched", "previous", "restart"),
    [
        (False, [True, False], R1, True),  # its workers' old containers are gone: restart it
        (False, [False, False], R1, False),  # nothing switched: leave it alone
        (True, [True], R1, False),  # it switched: it goes back as every switched host does
        (False, [True], None, False),  # nothing of its own to restart on
    ],
)
def test_a_head_that_never_switched_is_restarted_going_back(head_switched, workers_switched, previous, restart):
    assert D.restart_head_going_back(head_switched, workers_switched, previous) is restart


def test_hosts_are_locked_in_sorted_order_and_switched_workers_first():
    assert D.lock_order(["w2", "head", "w1"]) == ["head", "w1", "w2"]
    assert D.switch_order("head", ["w2", "w1"]) == ["w2", "w1", "head"]  # the inventory's worker order


@pytest.mark.parametrize(
    ("target", "current", "unit", "action"),
    [(R1, R1, "active", Action.UNCHANGED), (R1, R1, "failed", Action.RESTART), (R1, R2, "active", Action.SWITCH),
     (R1, None, "inactive", Action.SWITCH)],
)
def test_rollback_action_of_one_host_of_a_set(target, current, unit, action):
    st = svc_state({R1: (OTHER, True), R2: (OTHER, True)}, current)
    st.unit = unit
    assert D.rollback_action(target, st) == action


@pytest.mark.parametrize(
    ("kinds", "result"),
    [([D.GoBack.HEALTHY, D.GoBack.HEALTHY], "rolled_back"), ([D.GoBack.HEALTHY, D.GoBack.UNHEALTHY], "failed"),
     ([D.GoBack.STOPPED], "failed"), ([], "failed")],
)
def test_the_result_of_a_set_that_went_back(kinds, result):
    assert D.cluster_result([D.GoBack(k, R1) for k in kinds]) == result


@pytest.mark.parametrize(
    ("results", "result"),
    [(["stopped", "absent"], "stopped"), (["absent", "absent"], "absent"), (["removed", "failed"], "failed"),
     (["started"], "started"), ([], "failed")],
)
def test_a_service_op_over_several_services_of_a_host(results, result):
    assert D.service_op_result([D.Result(r) for r in results]) == result
    assert (D.Result(result) in D.OK_RESULTS) is (result not in ("failed", "refused"))
