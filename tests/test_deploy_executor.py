"""The deploy executor against a scripted remote (tests/fake_remote.py, in the style of
fabric.testing's ``Session``/``Command``): each test lists the round trips a host sees, with the
exact script (built by the same builders) and the host's answer, and checks the outcome, the
health marks, the audit lines and the unlock. No SSH, no Docker: these run in a second.
"""

from __future__ import annotations

import json
import shlex
import tarfile
from io import BytesIO

import pytest

from llmfleet.errors import RemoteError
from llmfleet.health import watchdog
from llmfleet.health.check import HealthReport, StageResult
from llmfleet.images.lock import resolve
from llmfleet.knowledge import release_state
from llmfleet.release import confirm
from llmfleet.release import deploy as D
from llmfleet.release import executor as E
from llmfleet.release import pipeline as P
from llmfleet.release import store as S
from llmfleet.release.render import render
from llmfleet.settings import Settings
from tests.deploy_fixtures import LOCK, NOW, R1, R2, R3, R4, R5, R6, ROOT, host, svc_state
from tests.fake_remote import Command, FakeRemote

TOKEN = "0a" * 16  # lowercase hex: also the commit-confirmed token
ORIGIN = "me@ws"
PID = 4242
PATHS = S.Paths(ROOT, "chat")
REF = resolve("llamacpp:b1", LOCK).pull_ref
HS = host(health={"min_tokps": 1})
SVC = HS.services[0]
NEW = render(SVC, HS, resolve(SVC.image, LOCK), None)
NEW_ID = S.new_release_id(NEW.content_hash, NOW)
OTHER = "f" * 64

HEALTHY = HealthReport(ok=True, stages=[StageResult("completion", True, 0.5, "ok")], decode_tokps=50.0)
UNHEALTHY = HealthReport(ok=False, stages=[StageResult("health", False, 15.0, "/health 200 not reached")])


def state_text(*states: release_state.ServiceState) -> str:
    """What the host's state reader prints for these services."""
    lines = []
    for st in states:
        lines += [f"@@service {st.name}", f"@@current {'releases/' + st.current if st.current else ''}",
                  f"@@unit {st.unit}"]
        for rid, info in sorted(st.releases.items()):
            lines.append(f"@@release {rid}")
            if info.manifest:
                lines.append("@@manifest " + info.manifest.to_text().strip())
            if info.health:
                lines.append('@@health {"result": "healthy"}')
    return "\n".join(lines + ["@@end"])


def holder(action: str = "deploy") -> dict:
    return S.holder_document(token=TOKEN, who=ORIGIN, origin=ORIGIN, action=action, message="", now=NOW, pid=PID)


def acquire(out: str = "@@acquired", exit: int = 0, action: str = "deploy") -> Command:
    return Command(S.lock_acquire_script(ROOT, holder(action)), out=out, exit=exit)


def pull(out: str = f"@@pulled\n@@digests\n{REF}\n", exit: int = 0) -> Command:
    return Command(S.pull_script(REF), out=out, exit=exit)


def switch(rid: str, out: str = "@@switched", exit: int = 0) -> Command:
    return Command(S.switch_script(PATHS, rid), out=out, exit=exit)


def arm(rid: str, previous: str | None, action: str = "deploy") -> Command:
    """Commit confirmed: the host-side revert armed before a switch."""
    timeout = confirm.timeout_s(SVC, HS)
    return Command(confirm.arm_script(PATHS, release_id=rid, previous=previous, token=TOKEN, action=action,
                                      timeout=timeout), out=f"@@compose-valid\n@@armed {timeout}")


def confirmed(out: str = "@@confirmed\n@@watchdog-on") -> Command:
    return Command(confirm.confirm_script(PATHS, token=TOKEN), out=out)


DISARM = Command(confirm.confirm_script(PATHS, token=TOKEN, watchdog_on=False), out="@@confirmed")
WATCHDOG = Command(watchdog.install_snippet(PATHS.service_dir, "chat"), out="@@watchdog-on")
UPLOAD = Command(S.upload_script(PATHS, NEW_ID), out="@@uploaded")
ENGINE_LOG = Command(S.logs_script(PATHS, E.LOG_LINES), out="RuntimeError: CUDA out of memory\nexited")
WAIT = Command(S.unit_wait_script(PATHS), out="@@unit active\n@@container running 0 0")


def chain(*cmds: Command, stdin_step: int | None = None) -> Command:
    """Several steps in one round trip (``store.chain_script``): the host answers each in turn,
    until one fails."""
    answer, rc = [], 0
    for i, c in enumerate(cmds):
        answer.append(f"@@step {i}\n{c.out}\n@@step-rc {i} {c.exit}\n")
        if c.exit:
            rc = c.exit
            break
    return Command(S.chain_script([c.cmd for c in cmds], stdin_step=stdin_step), out="".join(answer), exit=rc)


def lock_pull(got: Command | None = None, pulled: Command | None = None) -> Command:
    """The lock and the pull: one round trip."""
    return chain(got or acquire(), pulled or pull())


def switch_in(rid: str, previous: str | None, *, upload: Command | None = UPLOAD, switched: Command | None = None
              ) -> Command:
    """Upload (a new release), arm the revert, switch and restart, wait for the container: one round trip."""
    steps = ([upload] if upload else []) + [arm(rid, previous), switched or switch(rid), WAIT]
    return chain(*steps, stdin_step=0 if upload else None)


class Run:
    """One executor run: the scripted remote, the health answers, the log lines, the outcome."""

    def __init__(self, commands: list[Command], health: dict[str, list[HealthReport]] | None = None,
                 alive: bool = True, tmp=None) -> None:
        self.remote = FakeRemote(commands)
        self.health = {k: list(v) for k, v in (health or {}).items()}
        self.checked: list[tuple[str, int, float | None]] = []
        self.lines: list[str] = []
        settings = Settings.of({"audit_log": str(tmp / "audit.jsonl")} if tmp else {"audit_log": "/dev/null"})
        self.run = E.HostRun("h1", HS, self.remote, settings=settings, log=self.lines.append,
                             health_fn=self._health, now=lambda: NOW, token=lambda: TOKEN,
                             alive=lambda pid: alive, origin=ORIGIN, pid=PID)
        self.out = D.HostOutcome("h1", D.Result.UNCHANGED)

    def _health(self, run, target) -> HealthReport:
        self.checked.append((target.release_id, target.service.port,
                             target.plan.decode_tokps_ceiling if target.plan else None))
        answer = self.health[target.release_id].pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def deploy(self, plans: list | None = None) -> D.HostOutcome:
        ready = D.PreparedHost(None, None, HS, (D.Prepared(SVC, None, resolve(SVC.image, LOCK)),))  # type: ignore[arg-type]
        try:
            D.run_deploy(self.run, ready, self.out, D.DeployOptions(), plans=plans or [None])
        except D.Refusal as exc:
            self.out.result, self.out.reason = exc.result, exc.reason
        return self.out

    def rollback(self, **kw) -> D.HostOutcome:
        self.out.result = D.Result.FAILED
        try:
            D.run_rollback(self.run, kw.get("service"), kw.get("to"), self.out)
        except D.Refusal as exc:
            self.out.result, self.out.reason = exc.result, exc.reason
        return self.out

    def finish(self, out: str = "@@released") -> str:
        """The last round trip: returns its text."""
        self.remote.expected.append(Command(None, out=out))
        self.run.finish()
        self.remote.assert_done()
        return self.remote.sent[-1]


def state(*states: release_state.ServiceState) -> Command:
    return Command(S.state_script(ROOT), out=state_text(*states))


def audit_results(text: str) -> list[tuple[str, str]]:
    recs = []
    for line in text.splitlines():
        if line.startswith("printf '%s\\n' ") and "audit.jsonl" in line:
            recs.append(json.loads(shlex.split(line)[2]))
    return [(r["action"], r["result"]) for r in recs]


# ---------------------------------------------------------------------------------------------
# deploy


def test_first_deploy_uploads_switches_checks_marks_and_unlocks():
    upload = switch_in(NEW_ID, None)
    r = Run([state(), lock_pull(), upload, confirmed()], {NEW_ID: [HEALTHY]})
    o = r.deploy()
    assert o.result == "deployed" and o.releases == {"chat": NEW_ID}
    assert o.services["chat"] == D.ServiceOutcome("chat", D.Result.DEPLOYED, NEW_ID, NEW_ID, None)
    with tarfile.open(fileobj=BytesIO(upload.sent_stdin)) as tar:
        names = sorted(tar.getnames())
        manifest = tar.extractfile("manifest.json").read().decode()
    assert names == ["compose.yml", "llmfleet-chat-watchdog.service", "llmfleet-chat-watchdog.timer",
                     "llmfleet-chat.service", "manifest.json", "service.env", "watchdog.sh"]
    assert f'"release":"{NEW_ID}"' in manifest and f'"content_hash":"{NEW.content_hash}"' in manifest
    last = r.finish()
    assert f"{PATHS.release(NEW_ID)}/health.json" in last  # marked healthy in the last round trip
    assert audit_results(last) == [("deploy", "deployed")]
    assert S.lock_release_script(ROOT, TOKEN) in last
    # state, lock + pull, upload + arm + switch + container start, confirm, the last round trip
    assert r.remote.round_trips == 5
    # the timeline (`deploy --timeline`) names each stage in order with its round trips
    assert [(st["stage"], st["round_trips"]) for st in r.run.timeline] == [
        ("release state", 1), ("render + decide", 0), ("lock + pull", 1),
        ("chat: upload + arm revert + switch + restart + container start", 1),
        ("chat: health", 0), ("chat: health completion", None), ("chat: confirm + watchdog on", 1)]
    assert all(st["seconds"] >= 0 and st["start_s"] >= 0 for st in r.run.timeline)


def test_no_change_restarts_nothing_and_takes_no_lock():
    st = svc_state({R1: (NEW.content_hash, True)}, R1)
    r = Run([state(st)])
    o = r.deploy()
    assert o.result == "unchanged" and o.releases == {"chat": R1}
    assert any("no restart" in ln for ln in r.lines)
    last = r.finish(out="")
    assert audit_results(last) == [("deploy", "unchanged")] and "locks/deploy" not in last


def test_unhealthy_release_rolls_back_to_the_previous_one_by_field():
    st = svc_state({R1: (OTHER, True)}, R1)
    r = Run([state(st), lock_pull(), switch_in(NEW_ID, R1), ENGINE_LOG,
             Command(None, out="@@marked"), DISARM, switch(R1), Command(None, out="@@marked")],
            {NEW_ID: [UNHEALTHY], R1: [HEALTHY]})
    o = r.deploy()
    assert o.result == "rolled_back"
    assert o.releases == {"chat": R1}
    assert o.services["chat"].current == R1 and o.services["chat"].release == NEW_ID
    assert f"back on release {R1}" in o.reason and "CUDA out of memory" in o.reason
    assert "unhealthy" in r.remote.sent[4] and NEW_ID in r.remote.sent[4]  # marked unhealthy at once
    assert R1 in r.remote.sent[7] and "healthy" in r.remote.sent[7]
    assert audit_results(r.finish()) == [("deploy", "rolled_back")]


def test_after_a_deploy_killed_after_its_switch_a_failure_goes_back_to_the_last_confirmed_release():
    """R2 current but never confirmed (its deploy was killed right after the switch): the next deploy
    arms the host-side revert to R1 and, failing its health check, goes back to R1, not to R2."""
    st = svc_state({R1: (OTHER, True), R2: (OTHER, False)}, R2)
    r = Run([state(st), lock_pull(), switch_in(NEW_ID, R1), ENGINE_LOG, Command(None, out="@@marked"), DISARM,
             switch(R1), Command(None, out="@@marked")], {NEW_ID: [UNHEALTHY], R1: [HEALTHY]})
    o = r.deploy()
    assert o.result == "rolled_back" and o.releases == {"chat": R1}
    assert o.services["chat"].current == R1 and f"back on release {R1}" in o.reason
    assert any(f"host reverts to {R1} in" in ln for ln in r.lines)
    assert [rid for rid, *_ in r.checked] == [NEW_ID, R1]  # R2 is never switched to or checked
    r.remote.assert_done()


def test_a_failure_with_no_confirmed_release_stops_the_unit_even_if_one_is_current():
    st = svc_state({R2: (OTHER, False)}, R2)
    r = Run([state(st), lock_pull(), switch_in(NEW_ID, None), ENGINE_LOG, Command(None), DISARM,
             Command(S.stop_script(PATHS, forget_current=True), out="@@stopped")], {NEW_ID: [UNHEALTHY]})
    o = r.deploy()
    assert o.result == "failed" and "no release confirmed healthy to go back to; the service was stopped" in o.reason
    assert any("host reverts to nothing in" in ln for ln in r.lines)


def test_going_back_checks_the_old_release_as_it_was_deployed():
    old = svc_state({R1: (OTHER, True)}, R1)
    old.releases[R1].manifest = release_state.Manifest.parse({
        **old.releases[R1].manifest.to_dict(), "inputs": {"port": 7000}, "plan": {"decode_tokps_ceiling": 99.0}})
    r = Run([state(old), lock_pull(), switch_in(NEW_ID, R1), ENGINE_LOG, Command(None), DISARM,
             switch(R1), Command(None)], {NEW_ID: [UNHEALTHY], R1: [HEALTHY]})
    r.deploy()
    assert r.checked == [(NEW_ID, 8080, None), (R1, 7000, 99.0)]


def test_previous_release_unhealthy_too_is_a_failed_rollback():
    st = svc_state({R1: (OTHER, True)}, R1)
    r = Run([state(st), lock_pull(), switch_in(NEW_ID, R1), ENGINE_LOG, Command(None), DISARM, switch(R1)],
            {NEW_ID: [UNHEALTHY], R1: [UNHEALTHY]})
    o = r.deploy()
    assert o.result == "failed" and "ROLLBACK FAILED" in o.reason and o.releases == {"chat": R1}


def test_switch_back_failing_is_reported_with_the_release():
    st = svc_state({R1: (OTHER, True)}, R1)
    r = Run([state(st), lock_pull(), switch_in(NEW_ID, R1), ENGINE_LOG, Command(None), DISARM,
             switch(R1, out="install: cannot stat", exit=1)], {NEW_ID: [UNHEALTHY]})
    o = r.deploy()
    assert o.result == "failed" and f"switching back to {R1} failed: install: cannot stat" in o.reason
    assert o.releases == {"chat": R1}  # not known to have moved: the one current before


def test_failed_first_deploy_stops_the_unit():
    r = Run([state(), lock_pull(), switch_in(NEW_ID, None), ENGINE_LOG, Command(None), DISARM,
             Command(S.stop_script(PATHS, forget_current=True), out="@@stopped")], {NEW_ID: [UNHEALTHY]})
    o = r.deploy()
    assert o.result == "failed" and "the service was stopped" in o.reason
    assert audit_results(r.finish()) == [("deploy", "failed")]


def test_a_failed_pull_changes_nothing():
    r = Run([state(svc_state({R1: (OTHER, True)}, R1)), lock_pull(pulled=pull(out="denied", exit=4))])
    o = r.deploy()
    assert o.result == "failed" and "pull of" in o.reason and "nothing was changed" in o.reason
    assert not any("switch" in s or "tar -x" in s for s in r.remote.sent)
    assert S.lock_release_script(ROOT, TOKEN) in r.finish()


def test_a_digest_the_engine_does_not_report_is_refused():
    r = Run([state(), lock_pull(pulled=pull(out="@@digests\nreg.lab:5000/llamacpp@sha256:" + "00" * 32 + "\n"))])
    o = r.deploy()
    assert o.result == "failed" and "refusing to run it" in o.reason


def test_a_failed_upload_switches_nothing():
    r = Run([state(), lock_pull(), switch_in(NEW_ID, None, upload=Command(UPLOAD.cmd, out="tar: short read", exit=2))])
    o = r.deploy()
    assert o.result == "failed" and "nothing was switched" in o.reason and "tar: short read" in o.reason
    assert audit_results(r.finish()) == [("deploy", "failed")]


def test_a_failed_switch_goes_back():
    st = svc_state({R1: (OTHER, True)}, R1)
    r = Run([state(st), lock_pull(), switch_in(NEW_ID, R1, switched=switch(NEW_ID, out="Job failed", exit=1)),
             ENGINE_LOG, DISARM, switch(R1), Command(None)], {R1: [HEALTHY]})
    o = r.deploy()
    assert o.result == "rolled_back" and f"switch to {NEW_ID} failed: Job failed" in o.reason


def test_interrupted_deploy_is_verified_not_redeployed():
    """Current and running but never marked healthy: health-check it, mark it; no pull, no switch. Its
    revert is armed again first (to the release last confirmed, R1): that replaces the timer the killed
    deploy may have left running, and the confirmation stops it."""
    st = svc_state({R1: (OTHER, True), R2: (NEW.content_hash, False)}, R2)
    r = Run([state(st), acquire(), arm(R2, R1), confirmed()], {R2: [HEALTHY]})
    o = r.deploy()
    assert o.result == "deployed" and o.releases == {"chat": R2}
    assert f"{PATHS.release(R2)}/health.json" in r.finish()
    assert any(f"host reverts to {R1}" in ln for ln in r.lines)


def test_current_release_with_a_failed_unit_is_restarted():
    st = svc_state({R2: (NEW.content_hash, True)}, R2, unit="failed")
    r = Run([state(st), acquire(), switch_in(R2, None, upload=None), confirmed()], {R2: [HEALTHY]})
    assert r.deploy().result == "deployed"


def test_an_older_release_with_this_content_is_switched_to_not_uploaded():
    st = svc_state({R1: (NEW.content_hash, True), R2: (OTHER, True)}, R2)
    r = Run([state(st), lock_pull(pulled=pull(out=f"@@digests\n{REF}\n")), switch_in(R1, R2, upload=None), confirmed()],
            {R1: [HEALTHY]})
    o = r.deploy()
    assert o.result == "deployed" and o.releases == {"chat": R1}
    assert any("image present" in ln for ln in r.lines)


def test_ctrl_c_during_the_health_check_goes_back_and_is_audited():
    st = svc_state({R1: (OTHER, True)}, R1)
    r = Run([state(st), lock_pull(), switch_in(NEW_ID, R1), DISARM, switch(R1), Command(None)],
            {NEW_ID: [KeyboardInterrupt()], R1: [HEALTHY]})
    with pytest.raises(KeyboardInterrupt):
        r.deploy()
    assert any("interrupted; going back to" in ln for ln in r.lines)
    last = r.finish()
    assert audit_results(last) == [("deploy", "rolled_back")] and "interrupted" in last


def test_lock_held_by_someone_else_refuses_with_their_details():
    other = {"who": "alice", "from": "alice@ws", "pid": 1, "action": "deploy", "message": "canary",
             "time": "2026-11-29T11:50:00+00:00"}
    r = Run([state(), lock_pull(acquire(out="@@held\n" + json.dumps(other), exit=S.LOCK_HELD_RC))])
    o = r.deploy()
    assert o.result == "refused" and "alice" in o.reason and "canary" in o.reason and "lock.release" in o.reason
    assert "(10 min 0 s ago)" in o.reason


def test_a_stale_lock_from_this_machine_is_taken_over():
    mine = {"who": ORIGIN, "from": ORIGIN, "pid": 999, "action": "deploy", "time": "2026-11-29T11:00:00+00:00"}
    r = Run([state(), lock_pull(acquire(out="@@held\n" + json.dumps(mine), exit=S.LOCK_HELD_RC)),
             Command(S.lock_break_script(ROOT), out="@@held\n@@broken"), lock_pull(), switch_in(NEW_ID, None),
             confirmed()], {NEW_ID: [HEALTHY]}, alive=False)
    assert r.deploy().result == "deployed"
    assert any("stale lock" in ln for ln in r.lines)
    assert audit_results(r.finish()) == [("lock-break", "stale"), ("deploy", "deployed")]


def test_a_stale_lock_of_a_live_process_is_refused():
    mine = {"who": ORIGIN, "from": ORIGIN, "pid": 999, "action": "deploy", "time": "2026-11-29T11:00:00+00:00"}
    r = Run([state(), lock_pull(acquire(out="@@held\n" + json.dumps(mine), exit=S.LOCK_HELD_RC))], alive=True)
    assert r.deploy().result == "refused"


def test_a_lock_answer_cut_short_asks_who_holds_it():
    r = Run([state(), lock_pull(acquire(out="", exit=0)),
             Command(S.lock_status_script(ROOT), out='@@held\n{"who": "bob", "from": "b@x"}\n')])
    o = r.deploy()
    assert o.result == "refused" and "held by bob from b@x" in o.reason
    r.remote.assert_done()


def test_a_lock_script_that_fails_is_a_failure_not_a_refusal():
    r = Run([state(), lock_pull(acquire(out="mkdir: Read-only file system", exit=2))])
    o = r.deploy()
    assert o.result == "failed" and "cannot take the deploy lock: mkdir: Read-only file system" in o.reason


def test_a_round_trip_that_never_reached_its_first_step_is_a_failure_naming_the_answer():
    # e.g. sudo refusing before the script starts: no step marker at all, the host's own message
    r = Run([state(), Command(S.chain_script([acquire().cmd, pull().cmd]), out="",
                              err="sudo: a password is required", exit=1)])
    o = r.deploy()
    assert o.result == "failed" and "cannot take the deploy lock: sudo: a password is required" in o.reason


def test_prune_after_success_in_the_last_round_trip():
    refs = {R1: "img@1", R2: "img@2", R3: "img@3", R4: "img@4", R5: "img@5", R6: REF}
    st = svc_state({r: (OTHER, True) for r in (R1, R2, R3, R4, R5, R6)}, R6, refs=refs)
    r = Run([state(st), lock_pull(), switch_in(NEW_ID, R6), confirmed()], {NEW_ID: [HEALTHY]})
    assert r.deploy().result == "deployed"
    last = r.finish(out="@@image-removed img@1\n@@image-removed img@2\n@@released")
    assert S.prune_script(PATHS, (R1, R2)) in last
    assert S.image_remove_script(("img@1", "img@2")) in last
    assert any("removed 2 image(s)" in ln for ln in r.lines)


def test_a_dropped_connection_at_the_end_is_a_warning_not_a_failure(tmp_path):
    r = Run([state(), lock_pull(), switch_in(NEW_ID, None), confirmed()], {NEW_ID: [HEALTHY]}, tmp=tmp_path)
    assert r.deploy().result == "deployed"
    r.remote.expected.append(Command(None, raises=RemoteError("host h1: SSH connection is closed")))
    r.run.finish()
    assert any("did not complete" in ln and "takes the lock over" in ln for ln in r.lines)
    assert (tmp_path / "audit.jsonl").stat().st_mode & 0o777 == 0o600  # the local line is written first


def test_a_state_cut_short_is_an_error_not_an_empty_host():
    r = Run([Command(S.state_script(ROOT), out="@@service chat\n@@current releases/" + R1)])
    with pytest.raises(RemoteError, match="cut short"):
        r.deploy()


# ---------------------------------------------------------------------------------------------
# rollback


def rollback_state() -> release_state.ServiceState:
    return svc_state({R1: (OTHER, True), R2: (OTHER, True), R3: (OTHER, True)}, R3, refs={R2: REF, R1: REF, R3: REF})


def present(out: str = "@@present") -> Command:
    return Command(S.image_present_script(REF), out=out)


def test_rollback_to_the_previous_healthy_release():
    r = Run([state(rollback_state()), acquire(action="rollback"), present(), arm(R2, R3, "rollback"), switch(R2),
             confirmed()], {R2: [HEALTHY]})
    o = r.rollback()
    assert o.result == "rolled_back" and o.releases == {"chat": R2} and o.changes == [f"chat: {R3} -> {R2}"]
    assert audit_results(r.finish()) == [("rollback", "rolled_back")]


def test_rollback_to_a_named_release():
    r = Run([state(rollback_state()), acquire(action="rollback"), present(), arm(R1, R3, "rollback"), switch(R1),
             confirmed()], {R1: [HEALTHY]})
    assert r.rollback(to=R1).releases == {"chat": R1}


def test_rollback_refuses_when_the_image_is_gone():
    r = Run([state(rollback_state()), acquire(action="rollback"), present(out="@@absent")])
    o = r.rollback()
    assert o.result == "failed" and "no longer on the host" in o.reason


def test_rollback_to_a_release_that_does_not_exist_takes_no_lock():
    r = Run([state(rollback_state())])
    o = r.rollback(to=R5)
    assert o.result == "failed" and "does not exist" in o.reason
    r.remote.assert_done()


def test_unhealthy_rollback_target_goes_back_and_says_still():
    r = Run([state(rollback_state()), acquire(action="rollback"), present(), arm(R2, R3, "rollback"), switch(R2),
             ENGINE_LOG, DISARM, switch(R3), Command(None)], {R2: [UNHEALTHY], R3: [HEALTHY]})
    o = r.rollback()
    assert o.result == "failed" and f"the host is still on release {R3} (healthy)" in o.reason
    assert o.releases == {"chat": R3} and o.services["chat"].current == R3


def test_rollback_from_an_unconfirmed_release_goes_back_to_a_confirmed_one_on_failure():
    st = svc_state({R1: (OTHER, True), R2: (OTHER, True), R3: (OTHER, False)}, R3, refs={R1: REF, R2: REF, R3: REF})
    r = Run([state(st), acquire(action="rollback"), present(), arm(R2, R1, "rollback"), switch(R2),
             ENGINE_LOG, DISARM, switch(R1), Command(None)], {R2: [UNHEALTHY], R1: [HEALTHY]})
    o = r.rollback()
    assert o.result == "failed" and f"the host is back on release {R1} (healthy)" in o.reason
    assert o.releases == {"chat": R1} and o.services["chat"].previous == R3


def test_rollback_of_the_current_release_restarts_it():
    st = svc_state({R4: (OTHER, True)}, R4, refs={R4: REF})
    r = Run([state(st), acquire(action="rollback"), present(), switch(R4), ENGINE_LOG], {R4: [UNHEALTHY]})
    o = r.rollback(to=R4)
    assert o.result == "failed" and "nothing else to go back to" in o.reason
    assert any("already current" in ln for ln in r.lines)


# ---------------------------------------------------------------------------------------------
# commit confirmed (llmfleet.release.confirm)


def test_a_confirmation_the_host_timer_beat_goes_back_and_says_why():
    st = svc_state({R1: (OTHER, True)}, R1)
    r = Run([state(st), lock_pull(), switch_in(NEW_ID, R1), confirmed(out="@@too-late"),
             ENGINE_LOG, DISARM, switch(R1), Command(None)], {NEW_ID: [HEALTHY], R1: [HEALTHY]})
    o = r.deploy()
    assert o.result == "rolled_back" and "host timer reverted it first" in o.reason
    assert "confirm_timeout_s" in o.reason
    assert any("the confirmation came too late" in ln for ln in r.lines)
    r.remote.assert_done()


def test_a_release_docker_compose_rejects_is_never_switched_to():
    st = svc_state({R1: (OTHER, True)}, R1)
    rejected = Command(arm(NEW_ID, R1).cmd, out="@@compose-invalid services.engine.foo: not allowed", exit=5)
    r = Run([state(st), lock_pull(), chain(UPLOAD, rejected, switch(NEW_ID), WAIT, stdin_step=0)])
    o = r.deploy()
    assert o.result == "failed" and "docker compose config rejected the release" in o.reason
    assert "nothing was switched" in o.reason  # the chain stops at the failed step (test_release_shell)
    assert audit_results(r.finish()) == [("deploy", "failed")]


def test_a_rollback_the_host_timer_reverted_is_a_failure():
    r = Run([state(rollback_state()), acquire(action="rollback"), present(), arm(R2, R3, "rollback"), switch(R2),
             confirmed(out="@@too-late")], {R2: [HEALTHY]})
    o = r.rollback()
    assert o.result == "failed" and f"reverted it to {R3} first" in o.reason


# ---------------------------------------------------------------------------------------------
# round trips of a whole deploy: the probe brings the release state


def _probed(monkeypatch, st: release_state.ServiceState, *, cut_short: bool) -> list[bool]:
    """The probe as one round trip whose facts carry the release state (the preflight's checks are
    test_preflight's); returns the ``sudo`` of each probe sent."""
    from llmfleet.knowledge import facts as F

    sent_sudo: list[bool] = []

    def gather(remote, *, root, model_paths, sudo=False, **_):
        sent_sudo.append(sudo)
        remote.run("probe", sudo=sudo)
        return F.Facts(host="h1", probe_version=3, releases=release_state.parse_state(state_text(st)), releases_read=not cut_short)

    monkeypatch.setattr(P.facts_mod, "gather", gather)
    monkeypatch.setattr(P.preflight, "plan_for", lambda *a, **k: (None, None))
    monkeypatch.setattr(P.preflight, "run_checks", lambda *a, **k: [])
    return sent_sudo


@pytest.mark.parametrize("cut_short", [False, True], ids=["state-in-probe", "state-cut-short"])
def test_a_no_change_deploy_is_the_probe_and_the_audit_line(monkeypatch, cut_short):
    st = svc_state({R1: (NEW.content_hash, True)}, R1)
    sudo = _probed(monkeypatch, st, cut_short=cut_short)
    r = Run([Command("probe")] + ([state(st)] if cut_short else []))
    ready = D.PreparedHost(None, None, HS, (D.Prepared(SVC, None, resolve(SVC.image, LOCK)),))  # type: ignore[arg-type]
    D.run_deploy(r.run, ready, r.out, D.DeployOptions())
    assert r.out.result == "unchanged" and r.out.releases == {"chat": R1}
    assert sudo == [True]  # the probe reads the state as the deploy's user, as the state reader would
    last = r.finish(out="")
    assert audit_results(last) == [("deploy", "unchanged")]
    # probe (with the state) + the audit line; a state the probe cut short is read once more
    assert r.remote.round_trips == (3 if cut_short else 2)


# ---------------------------------------------------------------------------------------------
# a head and its workers through the pipeline: connected, locked and finished in one fixed order


class FixedRun(E.HostRun):
    """A host of a set, with this file's clock, token and origin (the pipeline builds one per host)."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k, now=lambda: NOW, token=lambda: TOKEN, alive=lambda pid: True, origin=ORIGIN,
                         pid=PID)


def _set_of_hosts():
    from llmfleet.inventory.ansible import Host

    return [(Host(name=n, vars={}), HS, D.HostOutcome(n, D.Result.FAILED)) for n in ("head", "w2", "w1")]


@pytest.mark.parametrize("held_on", [None, "w1"])
def test_a_head_and_its_workers_are_locked_in_sorted_order_and_every_lock_taken_is_released(held_on, tmp_path):
    """Lock + pull on every host in sorted order (two runs that share hosts cannot each hold half); a
    lock held by someone else on one host refuses the whole set before anything switches, and every
    host's last round trip still runs: the locks taken are released, each host audits the refusal."""
    other = S.holder_document(token="b" * 32, who="bob@ws2", origin="bob@ws2", action="deploy", message="",
                              now=NOW, pid=1)
    held = lock_pull(got=acquire(f"@@held\n{json.dumps(other)}", exit=S.LOCK_HELD_RC))
    remotes = {n: FakeRemote([held if n == held_on else lock_pull()], name=n) for n in ("head", "w1", "w2")}
    for r in remotes.values():
        r.expected.append(Command(None, out="@@released"))  # the last round trip, whatever happened
    if held_on:  # hosts after the refusing one in the order were never locked: their last round trip only
        remotes["w2"].expected.pop(0)
    order: list[str] = []
    res = D.HostOutcome("head", D.Result.FAILED)  # the set's verdict

    def connector(host, settings, accept):
        order.append(host.name)
        return remotes[host.name]

    def body(slots):
        for name in D.decide.lock_order(list(slots)):
            item = P.Item(D.Prepared(SVC, None, resolve(SVC.image, LOCK)), None, NEW, PATHS, None,
                          D.decide.ServiceStep("chat", D.decide.Action.NEW, NEW_ID))
            P.lock_and_pull(slots[name].run, [item], "deploy")
        res.result, res.reason = D.Result.DEPLOYED, "every host locked and pulled"

    slots = P.run_hosts(_set_of_hosts(), "deploy", body, settings=Settings.of({"audit_log": str(tmp_path / "a")}),
                        log=lambda line: None, verdict=res, service="chat", head="head", prefix_log=True,
                        connector=connector, make_run=FixedRun)
    assert order == ["head", "w1", "w2"] and [s.is_head for s in slots.values()] == [True, False, False]
    for r in remotes.values():
        r.assert_done()
        assert r.closed
    unlocked = {n: S.lock_release_script(ROOT, TOKEN) in r.sent[-1] for n, r in remotes.items()}
    if held_on is None:
        assert res.result == "deployed" and unlocked == {"head": True, "w1": True, "w2": True}
        return
    assert res.result == "refused" and "bob@ws2" in res.reason
    assert unlocked == {"head": True, "w1": False, "w2": False}  # only the lock it took
    for r in remotes.values():  # the refusal, audited on every host of the set, naming the service
        assert audit_results(r.sent[-1]) == [("deploy", "refused")] and '"service":"chat"' in r.sent[-1]
    assert all(s.out.round_trips == len(remotes[n].sent) for n, s in slots.items())


def test_a_lock_being_taken_by_another_run_of_this_process_is_not_stale():
    """Two runs in one process (two controllers in threads): the second reads the first's holder while
    the first's answer is still on its way. The first's token is live from the moment it is sent, so
    the second is refused, never takes it over."""
    seen_by_second: list[str] = []

    class Link:
        """The first run's lock round trip: while it is 'on the wire', the second run asks."""

        def __init__(self, on_send):
            self.on_send, self.round_trips = on_send, 0

        def run(self, command, *, timeout=None, stdin=None, sudo=False, check=False):
            from llmfleet.host.ssh import Result

            self.round_trips += 1
            out = self.on_send(command)
            return Result(command=command, rc=0 if "@@acquired" in out else S.LOCK_HELD_RC, stdout=out, stderr="")

    settings_h = host()
    first_holder: dict = {}

    def second_asks(command: str) -> str:
        held = "@@held\n" + json.dumps(first_holder)
        second = E.HostRun("h1", settings_h, Link(lambda _c: held), settings=Settings(), log=seen_by_second.append,
                           origin="me@ws", pid=4242, token=lambda: "second")
        with pytest.raises(E.Refusal) as exc:
            second.lock("deploy")
        seen_by_second.append(str(exc.value))
        return "@@acquired"

    first = E.HostRun("h1", settings_h, Link(second_asks), settings=Settings(), log=lambda _l: None,
                      origin="me@ws", pid=4242, token=lambda: "first")
    first_holder.update(S.holder_document(token="first", who="me", origin="me@ws", action="deploy", message="",
                                          now=NOW, pid=4242))
    first.lock("deploy")
    assert first.lock_token == "first"
    assert not any("taking over" in line for line in seen_by_second), seen_by_second
    assert "deploy lock held by" in seen_by_second[-1]
    first.forget_lock()
    assert "first" not in E._LIVE_TOKENS and "second" not in E._LIVE_TOKENS
