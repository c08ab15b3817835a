"""The shell around one host's provisioning: facts, steps under the deploy lock, audit, reboot, checks.

One round trip for the facts; a converged host ends there. Otherwise (not --check) the host's deploy
lock is taken and each step runs in its own round trip (``llmfleet.provision.steps`` builds every
script); the first that fails stops the run with the step, the command's own error and the fix, after
the package manager is left consistent (``dpkg --configure -a``, ``apt-get -f install``). When the
driver changed, the host reboots through SSH (``systemctl reboot``) and the run waits, bounded in time
and attempts, until SSH answers from a new boot; then nvidia-smi must report the target driver, a
container must see the GPU (``docker run --gpus all`` of a service image already on the host), the
facts must show nothing left to do, and the host's preflight runs. The audit lines and the unlock go
in the last round trip. Connecting, the clock and sleeping are injected for tests.
"""

from __future__ import annotations

import secrets
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from llmfleet.errors import LlmfleetError, RemoteError, UsageError
from llmfleet.host import ssh
from llmfleet.inventory.services import HostSettings
from llmfleet.provision import desired as D
from llmfleet.provision import driver_change as DC
from llmfleet.provision import facts as F
from llmfleet.provision import offline as OFF
from llmfleet.provision import steps as S

q = shlex.quote
Log = Callable[[str], None]
STEP_TIMEOUT_S = 1800.0  # one step (an apt install that builds a kernel module) may take this long
REBOOT_WAIT_S = 600.0  # how long a reboot may take before the run gives up waiting
REBOOT_POLL_S = 2.0
BOOT_MARK = "cat /proc/sys/kernel/random/boot_id; cut -d' ' -f22 /proc/1/stat"  # new after any restart of PID 1
BOOT_SETTLE_S = 300
# the boot's own jobs done (running, or degraded when a unit failed), bounded; then the state
BOOT_SETTLE = f"timeout {BOOT_SETTLE_S} systemctl is-system-running --wait >/dev/null 2>&1; systemctl is-system-running"
APT_STEPS = {"dpkg-repair", "sources", "packages-runtime", "toolkit", "driver", "hold"}
# preflight checks provisioning answers for (the others: a deploy's image and model, its port)
HOST_CHECKS = {"gpu", "gpu-health", "cuda-driver", "arch", "docker", "gpu-runtime", "compose"}
FIX = {
    "apt": "the package manager was left consistent (dpkg --configure -a, apt-get -f install); check that the host's "
           "apt sources carry the package at that version (`apt-cache policy NAME` on the host), then run provision "
           "again",
    "files": "make the path writable by root on the host (a read-only or full file system?), then run provision again",
    "user": "check the deploy user and the group exist on the host (`getent group docker`), then run provision again",
    "folders": "move away what is in the way on the host, then run provision again",
    "docker-runtime-config": "read `journalctl -u docker` and /etc/docker/daemon.json on the host, then run provision "
                             "again",
    "persistence": "read `journalctl -u nvidia-persistenced` on the host, then run provision again",
    "cut": "run provision again once the host answers: its facts see what dpkg left half-done and finish it first "
           "(dpkg --configure -a, apt-get -f install), then the rest",
}


@dataclass
class StepReport:
    name: str
    changes: list[str]
    status: str  # would change | changed | failed | not run
    reboot: bool = False
    diff: str = ""
    error: str = ""
    fix: str = ""
    seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "changes": self.changes, "reboot": self.reboot,
                **({"diff": self.diff} if self.diff else {}), "error": self.error, "fix": self.fix,
                "seconds": self.seconds}


@dataclass
class Outcome:
    host: str
    result: str = "failed"  # converged | would change | changed | failed | refused
    message: str = ""
    round_trips: int = 0
    seconds: float = 0.0
    steps: list[StepReport] = field(default_factory=list)
    driver: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    checks: list[dict[str, str]] = field(default_factory=list)  # {id, status, message}: after the run
    rebooted: bool = False
    reboot_seconds: float | None = None
    previous: DC.Previous | None = None  # the driver installed before the run (what a go-back restores)
    gate: dict[str, Any] = field(default_factory=dict)  # a gated driver change: services, go-back (provision/gated.py)
    usage: bool = False  # refused for bad input (an unsupported distribution, a branch that drops a card)

    @property
    def ok(self) -> bool:
        return self.result in ("converged", "would change", "changed") and not any(
            c["status"] == "fail" for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "result": self.result, "ok": self.ok, "message": self.message,
                "round_trips": self.round_trips, "seconds": round(self.seconds, 3), "driver": self.driver,
                "warnings": self.warnings, "steps": [s.to_dict() for s in self.steps], "checks": self.checks,
                "rebooted": self.rebooted, "reboot_seconds": self.reboot_seconds,
                "previous_driver": self.previous.to_dict() if self.previous else None,
                **({"gate": self.gate} if self.gate else {})}


def _tail(res: ssh.Result, n: int = 600) -> str:
    text = "\n".join(ln for ln in (res.stderr + "\n" + res.stdout).splitlines() if ln.strip())
    lines = [ln for ln in text.splitlines() if not ln.startswith(("Reading ", "Building ", "Get:", "Hit:", "Ign:"))]
    one = " | ".join(lines[-6:])
    return (one if len(one) <= n else "..." + one[-n:]) or f"exit status {res.rc}, no output"


def container_check_script(refs: Sequence[str]) -> str:
    """The first of ``refs`` present on the host runs nvidia-smi -L with every GPU handed in."""
    lines = []
    for ref in refs:
        lines += [f"if docker image inspect {q(ref)} >/dev/null 2>&1; then",
                  f"  echo '@@image '{q(ref)}",
                  f"  docker run --rm --gpus all --entrypoint nvidia-smi {q(ref)} -L 2>&1 | head -c 4096; exit 0",
                  "fi"]
    return "\n".join(lines + ["echo '@@noimage'"])


class Provisioner:
    """One host's provisioning run. ``connect`` opens (and re-opens after the reboot) its connection."""

    def __init__(self, host: str, settings: HostSettings, connect: Callable[[], ssh.Link], *, log: Log,
                 who: str, origin: str, pid: int, check: bool = False, pinned_branch: int | None = None,
                 image_refs: Sequence[str] = (), extra_files: Sequence[D.ManagedFile] = (),
                 preflight: Callable[[ssh.Link], list[dict[str, str]]] | None = None,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 token: Callable[[], str] = lambda: secrets.token_hex(16), reboot_wait_s: float = REBOOT_WAIT_S,
                 mark: Callable[[], str] = F.new_mark,
                 confirm: Callable[[list[S.Step]], bool] | None = None,
                 offline: Sequence[OFF.OfflineRepo] | None = None, bundle: str = "",
                 send: Callable[..., Any] | None = None) -> None:
        self.host, self.settings, self.connect, self.log = host, settings, connect, log
        self.who, self.origin, self.pid = who, origin, pid
        self.check, self.pinned_branch = check, pinned_branch
        self.image_refs, self.extra_files, self.preflight = tuple(image_refs), tuple(extra_files), preflight
        self.now, self.clock, self.sleep, self.token, self.mark = now, clock, sleep, token, mark
        self.reboot_wait_s = reboot_wait_s
        self.confirm = confirm  # asked before a run that reboots the host; False refuses it
        # provision --bundle: the bundle's offline repositories (apt reads only the host's one); ``send``
        # puts a file on the host (llmfleet.host.transfer.send_file's signature; injected for tests)
        self.offline, self.bundle, self.send = (tuple(offline) if offline is not None else None), bundle, send
        self.repo: OFF.OfflineRepo | None = None
        self.target: D.OfflineTarget | None = None
        self.remote: ssh.Link | None = None
        self.trips_before = 0  # round trips of connections closed before the current one
        self.audit: list[dict[str, Any]] = []

    # -- plumbing ---------------------------------------------------------------------------------

    @property
    def link(self) -> ssh.Link:
        if self.remote is None:
            self.remote = self.connect()
        return self.remote

    def trips(self) -> int:
        return self.trips_before + (self.remote.round_trips if self.remote is not None else 0)

    def run(self, script: str, timeout: float = 120) -> ssh.Result:
        return self.link.run(script, sudo=True, timeout=timeout)

    def close(self) -> None:
        if self.remote is not None:
            self.trips_before += self.remote.round_trips
            try:
                self.remote.close()
            finally:
                self.remote = None

    def record(self, step: str, result: str, detail: str) -> None:
        from llmfleet.release import store  # a converged host's run never needs the store: imported late

        self.audit.append(store.audit_record(now=self.now(), who=self.who, host=self.host, action="provision",
                                             service=None, release=None, digest=None, result=result,
                                             detail=detail, step=step))

    def gather(self, user: str) -> F.ProvisionFacts:
        mark = self.mark()
        markers = [f"{OFF.repo_dir(self.settings.root, r.sha256)}/Packages.ok" for r in self.offline or ()]
        res = self.run(F.facts_script(mark, D.facts_query(self.settings, user, markers)), timeout=120)
        return F.parse_facts(res.stdout, mark, rc=res.rc, stderr=res.stderr)

    # -- the run ----------------------------------------------------------------------------------

    def provision(self) -> Outcome:
        return self._outcome(self._provision)

    def _outcome(self, body: Callable[[Outcome], None]) -> Outcome:
        """``body`` on a new outcome: bad input refused, host trouble failed, never raised; the round
        trips and seconds counted and the connection closed, whatever happened."""
        out = Outcome(self.host)
        t0 = self.clock()
        try:
            body(out)
        except UsageError as exc:
            out.result, out.message, out.usage = "refused", str(exc), True
        except LlmfleetError as exc:
            out.result, out.message = "failed", str(exc)
        finally:
            out.round_trips = self.trips()
            out.seconds = self.clock() - t0
            self.close()
        return out

    def _provision(self, out: Outcome) -> None:
        user = str(getattr(self.link, "user", None) or "root")
        facts = self.gather(user)
        if not facts.complete:
            raise RemoteError(f"host {self.host}: the facts came back cut short: {'; '.join(facts.errors)[:300]}")
        want = D.desired_state(self.host, self.settings, facts, user=user, pinned_branch=self.pinned_branch,
                               extra_files=self.extra_files, offline=self._offline_target(facts))
        out.driver = {"branch": want.driver.branch, "version": want.driver.version, "why": want.driver.why,
                      "packages": list(want.driver.packages), "running": facts.driver_running}
        out.warnings = list(want.warnings) + [f"facts: {e}" for e in facts.errors]
        out.previous = DC.previous_driver(facts, want.driver_package)
        plan = S.plan_steps(want, facts)
        if not plan:
            out.result, out.message = "converged", "nothing to change"
            return
        if self.check:
            out.steps = [StepReport(s.name, list(s.changes), "would change", s.reboot, s.diff) for s in plan]
            out.result = "would change"
            out.message = f"{len(plan)} step(s) would change" + ("; then a reboot" if any(s.reboot for s in plan) else "")
            return
        if any(s.reboot for s in plan) and self.confirm is not None and not self.confirm(plan):
            out.steps = [StepReport(s.name, list(s.changes), "not run", s.reboot, s.diff) for s in plan]
            out.result = "refused"
            out.message = "the run reboots the host: not confirmed (pass --yes)"
            return
        lock = self._lock(out)
        if lock is None:
            return
        try:
            self._apply(out, want, plan, user)
        finally:
            self._finish(lock)

    def _offline_target(self, facts: F.ProvisionFacts) -> D.OfflineTarget | None:
        if self.offline is None:
            return None
        self.repo = OFF.pick(self.offline, self.host, facts.distro, facts.arch, self.bundle)
        self.target = D.OfflineTarget(OFF.repo_dir(self.settings.root, self.repo.sha256), self.repo.sha256,
                                      self.repo.size, len(self.repo.packages))
        return self.target

    def _put_repo(self) -> str | None:
        """The bundle's repository unpacked on the host (sent when it is not there; a copy cut short is
        resumed); None, else what went wrong."""
        from llmfleet.host.transfer import TransferError
        from llmfleet.host.transfer import send_file as transfer_send

        repo = self.repo
        assert repo is not None
        directory = OFF.repo_dir(self.settings.root, repo.sha256)
        staged = OFF.staged_archive(self.settings.root, repo.sha256)
        send = self.send or transfer_send
        for attempt in range(3):
            have, offset = OFF.parse_present(self.run(OFF.present_script(directory, staged), timeout=30).stdout)
            if have:
                return None
            self.log(f"{OFF.OFFLINE_WHAT}: sending {repo.archive.name} ({repo.size / 1e6:.1f} MB"
                     + (f", resuming at {offset / 1e6:.1f} MB" if offset else "") + ")")
            self.run(f"mkdir -p -- {q(staged.rsplit('/', 1)[0])}", timeout=30)
            try:
                send(self.link, str(repo.archive), staged, offset=offset if offset <= repo.size else 0,
                     size=repo.size, sudo=True)
            except TransferError as exc:
                if attempt == 2:
                    return str(exc)
                continue
            res = self.run(OFF.unpack_script(staged, repo.sha256, directory), timeout=STEP_TIMEOUT_S)
            n = OFF.parse_unpacked(res.stdout)
            if n == -1:
                continue  # damaged on the way: removed on the host, sent again
            if res.rc != 0 or n is None:
                return f"unpacking {repo.archive.name} on the host failed: {_tail(res)}"
            self.log(f"{OFF.OFFLINE_WHAT}: {n} package(s) unpacked in {directory}, sha256 verified")
            return None
        return f"{repo.archive.name} arrived damaged three times (its sha256 differs on the host)"

    def _lock(self, out: Outcome) -> str | None:
        from llmfleet.release import store

        token = self.token()
        holder = store.holder_document(token=token, who=self.who, origin=self.origin, action="provision",
                                       message="", now=self.now(), pid=self.pid)
        res = self.run(store.lock_acquire_script(self.settings.root, holder), timeout=30)
        got = store.parse_lock_acquire(res.rc, res.stdout)
        if got.acquired:
            return token
        out.result = "refused"
        out.message = (store.lock_refusal(self.host, got.holder, self.now()) if res.rc == store.LOCK_HELD_RC
                       else f"cannot take the deploy lock: {_tail(res)}")
        return None

    def _apply(self, out: Outcome, want: D.Desired, plan: list[S.Step], user: str) -> None:
        reports = [StepReport(s.name, list(s.changes), "not run", s.reboot, s.diff) for s in plan]
        out.steps = reports
        for step, rep in zip(plan, reports, strict=True):
            if step.name == S.OFFLINE_STEP:
                t = self.clock()
                self.log(f"{step.name}: " + "; ".join(step.changes))
                failure = self._put_repo()
                rep.seconds = round(self.clock() - t, 3)
                if failure is None:
                    rep.status = "changed"
                    self.record(step.name, "changed", "; ".join(step.changes))
                    continue
                rep.status, rep.error = "failed", failure[:600]
                rep.fix = ("run provision again: a copy cut short resumes; check the bundle with `invoke bundle.check` "
                           "and the host's free space under the llmfleet root")
                self.record(step.name, "failed", f"{'; '.join(step.changes)}: {rep.error}")
                out.result, out.message = "failed", f"step {step.name} failed: {rep.error}"
                return
            if not step.script:  # the reboot step: done below
                rep.status = "changed"
                continue
            t = self.clock()
            self.log(f"{step.name}: " + "; ".join(step.changes))
            try:
                res = self.run(step.script, timeout=STEP_TIMEOUT_S)
            except LlmfleetError as exc:  # the connection dropped (or timed out) in the middle of the step
                rep.seconds = round(self.clock() - t, 3)
                rep.status, rep.error, rep.fix = "failed", str(exc)[:600], FIX["cut"]
                self.record(step.name, "failed", f"{'; '.join(step.changes)}: {rep.error}")
                self.close()  # the audit lines and the unlock go through a new connection
                out.result, out.message = "failed", f"step {step.name} did not finish: {rep.error}"
                return
            rep.seconds = round(self.clock() - t, 3)
            if res.rc == 0:
                rep.status = "changed"
                self.record(step.name, "changed", "; ".join(step.changes))
                continue
            rep.status, rep.error = "failed", _tail(res)
            rep.fix = self._repair(step.name)
            self.record(step.name, "failed", f"{'; '.join(step.changes)}: {rep.error}")
            out.result = "failed"
            out.message = f"step {step.name} failed: {rep.error}"
            return
        out.result, out.message = "changed", f"{len(plan)} step(s) changed"
        if any(s.reboot for s in plan):
            self._reboot(out)
        self._verify(out, want, user)

    def _repair(self, name: str) -> str:
        if name not in APT_STEPS:
            return FIX.get(name, "fix it on the host, then run provision again")
        try:
            res = self.run(S.repair(S.apt_options_for(self.target)), timeout=STEP_TIMEOUT_S)
        except LlmfleetError as exc:
            return f"repairing the package manager failed too ({exc}); run `dpkg --configure -a` on the host"
        if res.rc != 0:
            return (f"repairing the package manager failed too ({_tail(res, 300)}); run `dpkg --configure -a` and "
                    "`apt-get -f install` on the host")
        return FIX["apt"]

    # -- reboot -----------------------------------------------------------------------------------

    def _reboot(self, out: Outcome) -> None:
        before = self.run(BOOT_MARK, timeout=30).stdout.strip()
        self.log("rebooting (the driver changed)")
        t0 = self.clock()
        try:
            self.run("systemctl reboot", timeout=30)
        except LlmfleetError:
            pass  # the connection may drop before the answer
        self.close()
        attempts = 0
        while self.clock() - t0 < self.reboot_wait_s and attempts < int(self.reboot_wait_s / REBOOT_POLL_S) + 1:
            attempts += 1
            self.sleep(REBOOT_POLL_S)
            try:
                mark = self.run(BOOT_MARK, timeout=30).stdout.strip()
            except LlmfleetError:
                self.close()
                continue
            if mark and mark != before:
                out.rebooted = True
                out.reboot_seconds = round(self.clock() - t0, 1)
                # sshd answers before the boot has finished (Docker may still be starting): wait for it
                state = self.run(BOOT_SETTLE, timeout=BOOT_SETTLE_S + 30).stdout.strip() or "unknown"
                self.log(f"back after {out.reboot_seconds:.0f} s (system {state})")
                return
            self.close()  # still the old boot: not down yet
        raise RemoteError(f"host {self.host}: not back from the reboot after {self.reboot_wait_s:.0f} s "
                          f"({attempts} attempts); the deploy lock stays held: release it with "
                          f"`invoke lock.release --host {self.host} --yes` once the host is up")

    # -- after ------------------------------------------------------------------------------------

    def _verify(self, out: Outcome, want: D.Desired, user: str) -> None:
        facts = self.gather(user)
        checks = out.checks
        if want.driver.version is not None:
            ok = facts.driver_running == want.driver.version
            checks.append({"id": "driver", "status": "pass" if ok else "fail",
                           "message": f"nvidia-smi reports {facts.driver_running or facts.smi_error or facts.smi}"
                                      + ("" if ok else f", not the target {want.driver.version}")})
        left = S.plan_steps(want, facts)
        checks.append({"id": "converged", "status": "fail" if left else "pass",
                       "message": ("still to change: " + "; ".join(c for s in left for c in s.changes))[:600]
                       if left else "the facts show nothing left to change"})
        checks.append(self._container_check())
        if self.preflight is not None:
            checks.extend(self.preflight(self.link))
        out.driver["running"] = facts.driver_running

    def _container_check(self) -> dict[str, str]:
        if not self.image_refs:
            return {"id": "gpu-container", "status": "warn", "message": "not run: no service of the host runs a CUDA image"}
        res = self.run(container_check_script(self.image_refs), timeout=300)
        lines = res.stdout.splitlines()
        if "@@noimage" in lines:
            return {"id": "gpu-container", "status": "warn",
                    "message": "not run: no service image on the host yet (the deploy pulls it; its preflight and "
                               "health check then see the GPU)"}
        shown = " ".join(ln for ln in lines if not ln.startswith("@@"))[:300]
        if res.rc == 0 and "GPU " in shown:
            return {"id": "gpu-container", "status": "pass", "message": f"a container sees: {shown}"}
        return {"id": "gpu-container", "status": "fail", "message": f"a container with --gpus all does not see the GPU: "
                                                                    f"{shown or _tail(res)}"}

    # -- a gated driver change: keep the previous driver, go back to it ------------------------------

    def keep_previous(self, prev: DC.Previous) -> tuple[dict[str, str], list[str]]:
        """The previous driver's .deb files kept on the host (``driver_change.keep_script``):
        ({package: file}, [packages that could not be kept]). One round trip; changes no package."""
        try:
            res = self.run(DC.keep_script(self.settings.root, prev), timeout=STEP_TIMEOUT_S)
            return DC.parse_kept(res.stdout)
        finally:
            self.close()

    def go_back(self, prev: DC.Previous, files: dict[str, str], target: str | None = None) -> Outcome:
        """Back to ``prev`` after a driver change its services did not survive: under the deploy lock,
        the kept files installed again (the new branch's own packages removed), held, a reboot, then
        nvidia-smi must report ``prev.version``. Audited as ``provision`` step ``go-back``. ``target``: the
        driver version the change installed (its packages the old driver lacks are removed)."""
        return self._outcome(lambda out: self._go_back(out, prev, files, target))

    def _go_back(self, out: Outcome, prev: DC.Previous, files: dict[str, str], target: str | None) -> None:
        user = str(getattr(self.link, "user", None) or "root")
        after = self.gather(user)
        lock = self._lock(out)
        if lock is None:
            return
        try:
            removals = DC.go_back_removals(prev, after, target)
            script = DC.go_back_script(self.settings.root, prev, files, removals, sorted(after.holds))
            what = f"install the kept driver {prev.version} again" + (
                f", remove {', '.join(removals)}" if removals else "")
            self.log(f"go-back: {what}")
            rep = StepReport("go-back", [what], "not run", reboot=True)
            out.steps = [rep]
            t = self.clock()
            res = self.run(script, timeout=STEP_TIMEOUT_S)
            rep.seconds = round(self.clock() - t, 3)
            if res.rc != 0:
                rep.status, rep.error, rep.fix = "failed", _tail(res), self._repair("driver")
                self.record("go-back", "failed", f"{what}: {rep.error}")
                out.result, out.message = "failed", f"go-back failed: {rep.error}"
                return
            rep.status = "changed"
            self.record("go-back", "changed", what)
            self._reboot(out)
            facts = self.gather(user)
            ok = facts.driver_running == prev.version
            out.checks.append({"id": "driver", "status": "pass" if ok else "fail",
                               "message": f"nvidia-smi reports {facts.driver_running or facts.smi_error or facts.smi}"
                                          + ("" if ok else f", not the previous {prev.version}")})
            out.driver = {"version": prev.version, "running": facts.driver_running}
            out.result = "changed" if ok else "failed"
            out.message = f"back on driver {prev.version}" if ok else out.checks[-1]["message"]
        finally:
            self._finish(lock)

    def _finish(self, token: str) -> None:
        from llmfleet.release import store

        script = store.final_script(self.settings.root, [], self.audit, token)
        try:
            try:
                self.run(script, timeout=60)
            except LlmfleetError:  # a connection that dropped: once more through a new one
                self.close()
                self.run(script, timeout=60)
        except LlmfleetError as exc:
            self.log(f"warning: the audit lines and the unlock did not complete: {exc}; release the lock with "
                     f"`invoke lock.release --host {self.host} --yes`")
        self.audit = []


def host_checks(reports: list[Any]) -> list[dict[str, str]]:
    """The preflight checks provisioning answers for, from ``check_host``'s reports (deduplicated:
    each service repeats the host's own checks)."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for r in reports:
        for c in r.checks:
            if c.id in HOST_CHECKS:
                out.setdefault((c.id, c.message), {"id": f"preflight {c.id}", "status": c.status, "message": c.message})
    return list(out.values())


def preflight_checks(host: str, settings: HostSettings, lock: Any) -> Callable[[ssh.Link], list[dict[str, str]]]:
    """The host's preflight after the run (its facts gathered again, one round trip), reduced to the
    checks provisioning answers for."""

    def run(link: ssh.Link) -> list[dict[str, str]]:
        from llmfleet.host import facts as host_facts
        from llmfleet.release.preflight import check_host

        found = host_facts.gather(link, root=settings.root, model_paths=[s.model_path for s in settings.services
                                                                        if s.model_path], sudo=True)
        return host_checks(check_host(host, settings, found, lock=lock))

    return run
