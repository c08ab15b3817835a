"""The provisioning run against a scripted remote (tests/fake_remote.py): a converged host is one round
trip; --check changes nothing; a bare host's run takes the lock, runs each step, reboots once and waits
for a new boot, verifies, audits and unlocks; a failed step stops with its error and the fix after the
package manager is repaired; a held lock refuses; a host that does not come back is bounded."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

from llmfleet.errors import RemoteError
from llmfleet.provision import desired as D
from llmfleet.provision import facts as F
from llmfleet.provision import run as R
from llmfleet.provision import steps as S
from llmfleet.release import store
from tests.fake_remote import Command, FakeRemote
from tests.test_provision_steps import SETTINGS, bare, converged, desired

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
TOKEN = "t0ken"


def doc(f: F.ProvisionFacts) -> str:
    """What the facts script prints on a host with facts ``f`` (mark M)."""
    def sec(name: str, body: str) -> list[str]:
        return [f"==M== {name}", body]
    out = [""]
    out += sec("os-release", "\n".join(f"{k}={v}" for k, v in f.os.items()))
    out += sec("kernel", f.kernel) + sec("arch", f.arch)
    out += sec("dpkg", "\n".join(f"{n}\t{p.version}\t{p.status}" for n, p in f.packages.items()))
    out += sec("holds", "\n".join(sorted(f.holds)))
    smi = "absent" if f.smi == "absent" else "\n".join(f"{f.driver_running}, {g}" for g in f.gpus) + "\nrc=0"
    out += sec("nvidia-smi", smi)
    out += sec("daemon-json", json.dumps(f.daemon_json) if f.daemon_json else "")
    out += sec("user", " ".join(sorted(f.groups)) if f.user_exists else "@@nouser")
    out += sec("paths", "\n".join(f"{p.kind}\t{p.mode}\t{p.owner}\t{p.group}\t{k}" for k, p in f.paths.items()))
    files = []
    for k, st in f.files.items():
        files += [f"{st.mode}\t{st.owner}\t{st.group}\t{k}", base64.b64encode(st.content or b"").decode()]
    out += sec("files", "\n".join(files))
    out += sec("units", "\n".join(f"{u}\t{e}\t{a}" for u, (e, a) in f.units.items()))
    out += sec("reboot-required", "no")
    return "\n".join(out + ["==M== done", ""])


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def make(remotes: list, *, check: bool = False, image_refs=(), reboot_wait_s: float = 60, confirm=None):
    clock = Clock()
    queue = list(remotes)

    def connect():
        r = queue.pop(0)
        if isinstance(r, BaseException):
            raise r
        r.user = "deploy"
        return r

    p = R.Provisioner("gpu-bare-01", SETTINGS, connect, log=lambda _line: None, who="ops@ctl", origin="ops@ctl",
                      pid=42, check=check, image_refs=image_refs, now=lambda: NOW, clock=clock, sleep=clock.sleep,
                      token=lambda: TOKEN, reboot_wait_s=reboot_wait_s, mark=lambda: "M", confirm=confirm)
    return p, clock


def facts_cmd() -> str:
    return F.facts_script("M", D.facts_query(SETTINGS, "deploy"))


def lock_cmd() -> str:
    holder = store.holder_document(token=TOKEN, who="ops@ctl", origin="ops@ctl", action="provision", message="",
                                   now=NOW, pid=42)
    return store.lock_acquire_script("/opt/llmfleet", holder)


def test_a_converged_host_is_one_round_trip_and_takes_no_lock():
    d = desired()
    remote = FakeRemote([Command(facts_cmd(), doc(converged(d)))])
    p, _ = make([remote])
    o = p.provision()
    assert (o.result, o.round_trips, o.steps) == ("converged", 1, [])
    assert o.ok and remote.closed
    remote.assert_done()


def test_check_on_a_bare_host_lists_every_step_and_sends_nothing_else():
    remote = FakeRemote([Command(facts_cmd(), doc(bare()))])
    p, _ = make([remote], check=True)
    o = p.provision()
    assert o.result == "would change" and o.round_trips == 1
    assert [s.name for s in o.steps] == [s.name for s in S.plan_steps(desired(), bare())]
    assert all(s.status == "would change" for s in o.steps)
    assert [s.name for s in o.steps if s.reboot] == ["driver"] and "then a reboot" in o.message
    remote.assert_done()


def test_a_bare_host_is_provisioned_rebooted_once_verified_and_audited():
    d = desired()
    plan = S.plan_steps(d, bare())
    done = converged(d)
    first = FakeRemote([Command(facts_cmd(), doc(bare())), Command(lock_cmd(), "@@acquired\n"),
                        *[Command(s.script) for s in plan],
                        Command(R.BOOT_MARK, "boot-a\n1\n"), Command("systemctl reboot", raises=RemoteError("gone"))])
    still_old = FakeRemote([Command(R.BOOT_MARK, "boot-a\n1\n")])
    back = FakeRemote([Command(R.BOOT_MARK, "boot-b\n1\n"), Command(R.BOOT_SETTLE, "running\n"), Command(facts_cmd(), doc(done)),
                       Command(R.container_check_script(["reg/llama@sha256:1"]), "@@noimage\n"),
                       Command(None, "@@released\n")])
    p, clock = make([first, still_old, RemoteError("refused"), back], image_refs=["reg/llama@sha256:1"])
    o = p.provision()
    assert o.result == "changed", o.message
    assert [s.status for s in o.steps] == ["changed"] * len(plan)
    assert o.rebooted and o.reboot_seconds == 6.0  # three polls of 2 s
    assert {c["id"]: c["status"] for c in o.checks} == {"driver": "pass", "converged": "pass", "gpu-container": "warn"}
    final = back.sent[-1]
    assert final.count('"action":"provision"') == len(plan) and TOKEN in final  # audit lines, then the unlock
    assert o.round_trips == len(first.sent) + 1 + 5  # the boot mark, settled, facts, container check, last
    for r in (first, still_old, back):
        r.assert_done()


def test_a_failed_step_stops_repairs_apt_and_reports_error_and_fix():
    d = desired()
    plan = S.plan_steps(d, bare())
    err = "E: Version '1.19.1-1' for 'nvidia-container-toolkit' was not found"
    remote = FakeRemote([Command(facts_cmd(), doc(bare())), Command(lock_cmd(), "@@acquired\n"),
                         Command(plan[0].script), Command(plan[1].script), Command(plan[2].script, exit=100, err=err),
                         Command(S.REPAIR), Command(None, "@@released\n")])
    p, _ = make([remote])
    o = p.provision()
    assert o.result == "failed" and not o.ok
    assert [s.status for s in o.steps[:4]] == ["changed", "changed", "failed", "not run"]
    failed = o.steps[2]
    assert failed.name == "toolkit" and err in failed.error and err in o.message
    assert "package manager was left consistent" in failed.fix and "apt-cache policy" in failed.fix
    final = remote.sent[-1]
    assert '"result":"failed"' in final and '"step":"toolkit"' in final and TOKEN in final
    remote.assert_done()


def test_a_held_lock_refuses_naming_its_holder():
    holder = json.dumps({"who": "alice@ctl", "from": "alice@ctl", "action": "deploy", "time": "2026-05-01T11:00:00+00:00"})
    remote = FakeRemote([Command(facts_cmd(), doc(bare())), Command(lock_cmd(), f"@@held\n{holder}\n", exit=3)])
    p, _ = make([remote])
    o = p.provision()
    assert o.result == "refused" and "held by alice@ctl" in o.message and "lock.release" in o.message
    assert o.steps == []
    remote.assert_done()


def test_a_reboot_not_confirmed_changes_nothing():
    remote = FakeRemote([Command(facts_cmd(), doc(bare()))])
    p, _ = make([remote], confirm=lambda plan: False)
    o = p.provision()
    assert o.result == "refused" and "--yes" in o.message
    remote.assert_done()


def test_a_host_that_does_not_come_back_is_bounded():
    d = desired()
    plan = S.plan_steps(d, bare())
    first = FakeRemote([Command(facts_cmd(), doc(bare())), Command(lock_cmd(), "@@acquired\n"),
                        *[Command(s.script) for s in plan], Command(R.BOOT_MARK, "boot-a\n1\n"),
                        Command("systemctl reboot")])
    down = [RemoteError("connection refused")] * 40
    p, clock = make([first, *down], reboot_wait_s=20)
    o = p.provision()
    assert o.result == "failed" and "not back from the reboot after 20 s" in o.message
    assert clock.t <= 22


def test_pending_reboot_after_a_cut_run_reboots_without_reinstalling():
    d = desired()
    f = converged(d)
    f.smi, f.driver_running, f.gpus = "absent", None, []
    first = FakeRemote([Command(facts_cmd(), doc(f)), Command(lock_cmd(), "@@acquired\n"),
                        Command(R.BOOT_MARK, "a\n1\n"), Command("systemctl reboot")])
    back = FakeRemote([Command(R.BOOT_MARK, "b\n1\n"), Command(R.BOOT_SETTLE, "degraded\n"), Command(facts_cmd(), doc(converged(d))),
                       Command(None, "@@released\n")])
    p, _ = make([first, back])
    o = p.provision()
    assert o.result == "changed" and o.rebooted and [s.name for s in o.steps] == ["reboot"]
    assert [c["id"] for c in o.checks] == ["driver", "converged", "gpu-container"]


def test_a_connection_cut_mid_step_reports_the_step_and_unlocks_through_a_new_connection():
    d = desired()
    plan = S.plan_steps(d, bare())
    first = FakeRemote([Command(facts_cmd(), doc(bare())), Command(lock_cmd(), "@@acquired\n"),
                        Command(plan[0].script), Command(plan[1].script, raises=RemoteError("connection lost"))])
    again = FakeRemote([Command(None, "@@released\n")])
    p, _ = make([first, again])
    o = p.provision()
    assert o.result == "failed" and not o.ok
    assert [s.status for s in o.steps[:3]] == ["changed", "failed", "not run"]
    cut = o.steps[1]
    assert "connection lost" in cut.error and "run provision again" in cut.fix and "dpkg --configure -a" in cut.fix
    assert o.message.startswith(f"step {cut.name} did not finish: ")
    final = again.sent[-1]  # the audit lines (the cut step's failure among them) and the unlock
    assert f'"step":"{cut.name}"' in final and '"result":"failed"' in final and TOKEN in final
    first.assert_done()
    again.assert_done()


def test_the_go_back_installs_the_kept_driver_reboots_and_checks_nvidia_smi():
    from llmfleet.provision import driver_change as DC

    old = converged(desired(pinned_branch=535))
    prev = DC.previous_driver(old, "nvidia-driver")
    assert prev is not None and prev.version == "535.247.01" and "nvidia-kernel-dkms" in prev.names
    files = {n: f"{n}_{v}_amd64.deb" for n, v in prev.packages}
    after = converged(desired(pinned_branch=580))  # the new driver, installed and running
    after.packages["nvidia-driver-580-server"] = F.PkgState("580.95.05-0ubuntu1", "ii ")  # another branch's name
    assert DC.go_back_removals(prev, after, "580.95.05") == ("nvidia-driver-580-server",)
    script = DC.go_back_script(SETTINGS.root, prev, files, ["nvidia-driver-580-server"], sorted(after.holds))
    first = FakeRemote([Command(facts_cmd(), doc(after)), Command(lock_cmd(), "@@acquired\n"), Command(script),
                        Command(R.BOOT_MARK, "boot-a\n1\n"), Command("systemctl reboot", raises=RemoteError("gone"))])
    back = FakeRemote([Command(R.BOOT_MARK, "boot-b\n1\n"), Command(R.BOOT_SETTLE, "running\n"), Command(facts_cmd(), doc(old)),
                       Command(None, "@@released\n")])
    p, _ = make([first, RemoteError("refused"), back])
    o = p.go_back(prev, files, "580.95.05")
    assert (o.result, o.message, o.rebooted) == ("changed", "back on driver 535.247.01", True)
    assert o.checks == [{"id": "driver", "status": "pass", "message": "nvidia-smi reports 535.247.01"}]
    assert [(s.name, s.status) for s in o.steps] == [("go-back", "changed")]
    assert "remove nvidia-driver-580-server" in o.steps[0].changes[0]
    final = back.sent[-1]
    assert '"step":"go-back"' in final and '"result":"changed"' in final and TOKEN in final
    for r in (first, back):
        r.assert_done()


def test_a_go_back_that_apt_refuses_repairs_apt_and_says_so():
    from llmfleet.provision import driver_change as DC

    prev = DC.Previous("535.247.01", (("nvidia-driver", "535.247.01-1~deb12u1"),), ())
    files = {"nvidia-driver": "nvidia-driver_535.247.01-1~deb12u1_amd64.deb"}
    after = converged(desired(pinned_branch=580))
    script = DC.go_back_script(SETTINGS.root, prev, files, [], sorted(after.holds))
    remote = FakeRemote([Command(facts_cmd(), doc(after)), Command(lock_cmd(), "@@acquired\n"),
                         Command(script, exit=100, err="E: Unable to correct problems"), Command(S.REPAIR),
                         Command(None, "@@released\n")])
    p, _ = make([remote])
    o = p.go_back(prev, files)
    assert o.result == "failed" and o.message == "go-back failed: E: Unable to correct problems"
    assert "package manager was left consistent" in o.steps[0].fix and not o.rebooted
    remote.assert_done()
