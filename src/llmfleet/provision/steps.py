"""Desired state vs facts -> the ordered steps that converge a host (pure).

Order: offline-repo (provision --bundle: the bundle's packages sent to the host, when apt runs and they
are not there yet), dpkg-repair (only when dpkg reports a half-done install), sources, packages-runtime (Docker,
compose), toolkit, driver, hold, files, user, folders, firewall (``llmfleet_firewall``: the rule written and
loaded, or removed when unset), docker-runtime-config, persistence, reboot
(only when the running driver is not the installed one and no step above changes the driver). Each step
carries ``changes`` (what a human reads under --check), ``script`` (the exact shell, every value
quoted), ``reboot`` (whether a reboot must follow) and, for files, a unified ``diff``. A converged host
gives no steps.
"""

from __future__ import annotations

import base64
import difflib
import posixpath
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmfleet.provision.desired import (
    DOCKER_UNIT,
    FIREWALL_FILE,
    FIREWALL_UNIT,
    FIREWALL_UNIT_FILE,
    Desired,
    ManagedFile,
    OfflineTarget,
    Package,
)
from llmfleet.provision.facts import ProvisionFacts, driver_matches, upstream_version
from llmfleet.provision.offline import apt_options

q = shlex.quote
APT_ENV = "export DEBIAN_FRONTEND=noninteractive"
# DPkg::Lock::Timeout: wait (bounded) for an apt or dpkg that still runs (unattended-upgrades, or an
# install whose SSH connection dropped) instead of failing at once, as Ansible's apt module does.
APT_INSTALL = ("apt-get -y -q -o Dpkg::Options::=--force-confold -o DPkg::Lock::Timeout=300 --no-install-recommends "
               "--allow-downgrades --allow-change-held-packages install")
APT_UPDATE = "apt-get -q update"
# After any failed step: the package manager is left consistent (a half-configured package finished or
# its broken dependencies resolved), whatever state the failure left it in.
REPAIR = (f"{APT_ENV}\ndpkg --configure -a\n"
          "apt-get -y -q -o Dpkg::Options::=--force-confold -o DPkg::Lock::Timeout=300 -f install")


def apt_update(options: str = "") -> str:
    """``apt-get update``, with ``options`` (an offline repository's, provision/offline.py) when given."""
    return f"apt-get -q {options} update" if options else APT_UPDATE


def apt_install(options: str = "") -> str:
    return APT_INSTALL.replace("apt-get ", f"apt-get {options} ", 1) if options else APT_INSTALL


def repair(options: str = "") -> str:
    return REPAIR.replace("apt-get -y", f"apt-get {options} -y", 1) if options else REPAIR


CTK_CONFIGURE = "nvidia-ctk runtime configure --runtime=docker"
ORDER = ("offline-repo", "dpkg-repair", "sources", "packages-runtime", "toolkit", "driver", "hold", "files", "user",
         "folders", "firewall",
         "docker-runtime-config", "persistence", "reboot")


@dataclass(frozen=True)
class Step:
    name: str
    changes: tuple[str, ...]
    script: str
    reboot: bool = False
    diff: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "changes": list(self.changes), "reboot": self.reboot,
                **({"diff": self.diff} if self.diff else {})}


@dataclass
class _Plan:
    steps: list[Step] = field(default_factory=list)
    updated: bool = False  # an earlier step's script already ran apt-get update
    sources_changed: bool = False
    touched: set[str] = field(default_factory=set)  # packages a step installs or changes (held again after)
    apt_options: str = ""  # an offline repository's (provision --bundle): the only source apt reads


def _package_change(p: Package, facts: ProvisionFacts) -> str | None:
    have = facts.installed(p.name)
    if have is None:
        return f"install {p.spec}"
    if p.version is not None and have != p.version:
        return f"change {p.name} {have} -> {p.version}"
    return None


def _install_step(plan: _Plan, name: str, pkgs: Sequence[Package], facts: ProvisionFacts, *, reboot: bool = False,
                  note: str = "") -> None:
    todo = [(p, c) for p in pkgs if (c := _package_change(p, facts)) is not None]
    if not todo:
        return
    lines = ["set -e", APT_ENV]
    if not plan.updated:
        lines.append(apt_update(plan.apt_options))
        plan.updated = True
    held = [p.name for p, _ in todo if p.name in facts.holds]
    if held:
        lines.append("apt-mark unhold " + " ".join(q(n) for n in held))
    lines.append(f"{apt_install(plan.apt_options)} " + " ".join(q(p.spec) for p, _ in todo))
    plan.touched.update(p.name for p, _ in todo)
    changes = [c for _, c in todo] + ([note] if note else [])
    plan.steps.append(Step(name, tuple(changes), "\n".join(lines), reboot=reboot))


def _file_script(files: Sequence[ManagedFile]) -> str:
    lines = ["set -e", "umask 077"]
    thens: list[str] = []
    for f in files:
        tmp = f"{f.path}.llmfleet-new"
        b64 = base64.b64encode(f.content.encode()).decode()
        lines += [
            # a folder it creates is 0755 as the distribution's own (the umask above is for the files)
            f"(umask 022 && mkdir -p -- {q(posixpath.dirname(f.path) or '/')})",
            f"printf '%s' {q(b64)} | base64 -d > {q(tmp)}",
            f"chown {q(f.owner + ':' + f.group)} {q(tmp)}",
            f"chmod {f.mode:04o} {q(tmp)}",
            f"mv -f -- {q(tmp)} {q(f.path)}",
        ]
        if f.then and f.then not in thens:
            thens.append(f.then)
    return "\n".join(lines + thens)


def _file_changes(files: Sequence[ManagedFile], facts: ProvisionFacts) -> tuple[list[ManagedFile], list[str], str]:
    todo: list[ManagedFile] = []
    changes: list[str] = []
    diffs: list[str] = []
    for f in files:
        st = facts.files.get(f.path)
        new = f.content.encode()
        mode = f"{f.mode:o}"
        if st is None or not st.present:
            todo.append(f)
            changes.append(f"write {f.path} (new, {f.mode:04o} {f.owner}:{f.group})")
            diffs.append(_diff(f.path, "", f.content))
            continue
        what = []
        if st.content != new:
            what.append("content")
            old = st.content.decode("utf-8", "replace") if st.content is not None else ""
            diffs.append(_diff(f.path, old, f.content))
        if st.mode != mode:
            what.append(f"mode {st.mode} -> {f.mode:04o}")
        if (st.owner, st.group) != (f.owner, f.group):
            what.append(f"owner {st.owner}:{st.group} -> {f.owner}:{f.group}")
        if what:
            todo.append(f)
            changes.append(f"write {f.path} ({', '.join(what)})")
    return todo, changes, "".join(diffs)


def _diff(path: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"{path} (host)" if old else "/dev/null",
                                        tofile=f"{path} (provision)"))


def _files_step(plan: _Plan, name: str, files: Sequence[ManagedFile], facts: ProvisionFacts) -> None:
    todo, changes, diff = _file_changes(files, facts)
    if not todo:
        return
    script = _file_script(todo)
    if name == "sources":
        plan.sources_changed = True
        script += f"\n{APT_ENV}\n{apt_update(plan.apt_options)}"
        plan.updated = True
    plan.steps.append(Step(name, tuple(changes), script, diff=diff))


def _hold_step(plan: _Plan, d: Desired, facts: ProvisionFacts) -> None:
    want = [p.name for p in d.packages if p.hold and (p.name not in facts.holds or p.name in plan.touched)]
    if not want:
        return
    changes = [f"hold {n} (no unattended upgrade moves it)" for n in want]
    plan.steps.append(Step("hold", tuple(changes), "set -e\napt-mark hold " + " ".join(q(n) for n in want)))


def _user_step(plan: _Plan, d: Desired, facts: ProvisionFacts) -> None:
    missing = [g for g in d.groups if g not in facts.groups]
    if not missing:
        return
    plan.steps.append(Step("user", tuple(f"add {d.user} to group {g}" for g in missing),
                           "set -e\nusermod -aG " + q(",".join(missing)) + " -- " + q(d.user)))


def _folders_step(plan: _Plan, d: Desired, facts: ProvisionFacts) -> None:
    lines, changes = ["set -e"], []
    for f in d.folders:
        st = facts.paths.get(f.path)
        mode = f"{f.mode:o}"
        if st is not None and st.kind == "directory" and (st.mode, st.owner, st.group) == (mode, f.owner, f.group):
            continue
        if st is None or st.kind == "absent":
            changes.append(f"create {f.path} ({f.mode:04o} {f.owner}:{f.group})")
        elif st.kind != "directory":
            changes.append(f"{f.path} is a {st.kind}, not a folder: the step fails, move it away")
        else:
            changes.append(f"set {f.path} to {f.mode:04o} {f.owner}:{f.group} (was {st.mode} {st.owner}:{st.group})")
        lines.append(f"install -d -m {f.mode:04o} -o {q(f.owner)} -g {q(f.group)} -- {q(f.path)}")
    if changes:
        plan.steps.append(Step("folders", tuple(changes), "\n".join(lines)))


def _firewall_step(plan: _Plan, d: Desired, facts: ProvisionFacts) -> None:
    """The rule (``llmfleet_firewall``) written, checked by ``nft -c`` before it is put in place, loaded by
    its unit and enabled for the next boot; or, when the inventory no longer sets it, removed."""
    files = [f for f in d.files if f.step == "firewall"]
    enabled, active = facts.units.get(FIREWALL_UNIT, ("absent", "unknown"))
    if not files:
        there = [p for p in (FIREWALL_FILE, FIREWALL_UNIT_FILE) if (st := facts.files.get(p)) is not None and st.present]
        if there:
            plan.steps.append(Step("firewall", ("remove the firewall rule (llmfleet_firewall is not set): stop and "
                                                f"disable {FIREWALL_UNIT}, delete {', '.join(there)}",),
                                   "\n".join([f"systemctl disable --now {FIREWALL_UNIT} >/dev/null 2>&1 || true",
                                              "nft delete table inet llmfleet >/dev/null 2>&1 || true",
                                              f"rm -f -- {q(FIREWALL_FILE)} {q(FIREWALL_UNIT_FILE)}",
                                              "systemctl daemon-reload"])))
        return
    todo, changes, diff = _file_changes(files, facts)
    if not todo and (enabled, active) == ("enabled", "active"):
        return
    if not todo:
        changes.append(f"enable and start {FIREWALL_UNIT} (now {enabled or 'absent'}, {active or 'unknown'})")
    rule = next(f for f in files if f.path == FIREWALL_FILE)
    check = f"{FIREWALL_FILE}.llmfleet-check"
    lines = ["set -e", f"(umask 022 && mkdir -p -- {q(posixpath.dirname(FIREWALL_FILE))})",
             f"printf '%s' {q(base64.b64encode(rule.content.encode()).decode())} | base64 -d > {q(check)}",
             f"nft -c -f {q(check)} || {{ rm -f -- {q(check)}; echo 'the rule does not load (nft -c)' >&2; exit 3; }}",
             f"rm -f -- {q(check)}"]
    if todo:
        lines.append(_file_script(todo))
    lines += ["systemctl daemon-reload", f"systemctl enable {FIREWALL_UNIT}", f"systemctl restart {FIREWALL_UNIT}"]
    plan.steps.append(Step("firewall", tuple(changes), "\n".join(lines), diff=diff))


def _runtime_config_step(plan: _Plan, facts: ProvisionFacts) -> None:
    lines, changes = ["set -e"], []
    enabled, active = facts.units.get(DOCKER_UNIT, ("absent", "unknown"))
    if enabled != "enabled" or active != "active":
        changes.append(f"enable and start {DOCKER_UNIT} (now {enabled or 'absent'}, {active or 'unknown'})")
        lines.append(f"systemctl enable --now {DOCKER_UNIT}")
    if not facts.nvidia_runtime:
        changes.append("register the nvidia runtime in /etc/docker/daemon.json (nvidia-ctk) and restart Docker")
        lines += [CTK_CONFIGURE, f"systemctl restart {DOCKER_UNIT}"]
    if changes:
        plan.steps.append(Step("docker-runtime-config", tuple(changes), "\n".join(lines)))


def _persistence_step(plan: _Plan, d: Desired, facts: ProvisionFacts, reboot_follows: bool) -> None:
    unit = d.persistence_unit
    if unit is None:
        return
    enabled, active = facts.units.get(unit, ("absent", "unknown"))
    start = not reboot_follows and active != "active"
    if enabled == "enabled" and not start:
        return
    changes = [f"enable {unit}" + (" and start it" if start else " (it starts with the driver at the reboot)")]
    script = f"set -e\nsystemctl enable {'--now ' if start else ''}{q(unit)}"
    plan.steps.append(Step("persistence", tuple(changes), script))


def pending_reboot(d: Desired, facts: ProvisionFacts) -> str | None:
    """Why the host must reboot although no package changes: the installed driver is not the one
    running (an earlier run installed it and did not get to reboot), else None."""
    have = facts.installed(d.driver_package)
    if have is None or driver_matches(have, facts.driver_running):
        return None
    running = facts.driver_running or ("none (nvidia-smi absent)" if facts.smi == "absent" else "none")
    return f"reboot: the installed driver {upstream_version(have)} is not the running one ({running})"


def plan_steps(d: Desired, facts: ProvisionFacts) -> list[Step]:
    """The steps that take a host with ``facts`` to ``d``, in order; [] when it is converged."""
    opts = apt_options_for(d.offline)
    plan = _Plan(apt_options=opts)
    if facts.dpkg_audit:
        plan.steps.append(Step("dpkg-repair", (f"finish what dpkg left half-done: {facts.dpkg_audit.splitlines()[0]}",),
                               repair(opts)))
    _files_step(plan, "sources", [f for f in d.files if f.step == "sources"], facts)
    by_role = {r: [p for p in d.packages if p.role == r] for r in ("runtime", "toolkit", "driver")}
    _install_step(plan, "packages-runtime", by_role["runtime"], facts)
    _install_step(plan, "toolkit", by_role["toolkit"], facts)
    _install_step(plan, "driver", by_role["driver"], facts, reboot=True, note=f"then reboot ({d.driver.why})")
    _hold_step(plan, d, facts)
    _files_step(plan, "files", [f for f in d.files if f.step == "files"], facts)
    _user_step(plan, d, facts)
    _folders_step(plan, d, facts)
    _firewall_step(plan, d, facts)
    _runtime_config_step(plan, facts)
    driver_changes = any(s.reboot for s in plan.steps)
    pending = None if driver_changes else pending_reboot(d, facts)
    _persistence_step(plan, d, facts, reboot_follows=driver_changes or pending is not None)
    if pending:
        plan.steps.append(Step("reboot", (pending,), "", reboot=True))
    _offline_step(plan, d.offline, facts)
    return plan.steps


OFFLINE_STEP = "offline-repo"
APT_USING = {"dpkg-repair", "sources", "packages-runtime", "toolkit", "driver"}


def apt_options_for(offline: OfflineTarget | None) -> str:
    return apt_options(offline.directory) if offline is not None else ""


def _offline_step(plan: _Plan, offline: OfflineTarget | None, facts: ProvisionFacts) -> None:
    """First, when apt runs and the bundle's repository is not on the host yet: send and unpack it (the
    run does it; no script here)."""
    if offline is None or not any(s.name in APT_USING for s in plan.steps):
        return
    st = facts.files.get(offline.marker)
    if st is not None and st.content is not None and st.content.decode(errors="replace").strip() == offline.sha256:
        return
    plan.steps.insert(0, Step(OFFLINE_STEP, (f"send the bundle's packages ({offline.count} .deb, "
                                             f"{offline.size / 1e6:.1f} MB) to {offline.directory}: apt reads only "
                                             "them (no mirror, no other source)",), ""))
