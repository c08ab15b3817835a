"""Deploy and roll back the services of one host: the imperative shell around the pure modules.

``deploy_host`` runs, for one inventory host:

1. connect with strict host keys (``llmfleet.host.ssh``); gather facts in one round trip and run the
   preflight (``llmfleet.host.facts`` / ``llmfleet.knowledge.preflight``); a FAIL stops here, nothing changed;
2. render each service's release (``llmfleet.release.render``) and compare it with the host's releases
   (``llmfleet.release.store``): same content as the healthy, running release -> nothing to do;
3. ``check``/``diff`` stop here (diffs with secrets masked);
4. take the host's deploy lock (refused with the holder's details when held);
5. pull every new image by digest while the old release still serves, and verify the digest;
6. upload the release into ``releases/<id>/`` and atomically point ``current`` at it; restart the unit;
7. health-check in stages through an SSH-forwarded port (``llmfleet.release.health``);
8. on failure: capture the engine log, point ``current`` back at the previous release, restart and
   health-check it; on success: mark the release healthy and prune old releases and images;
9. append one audit line per service to the host's audit log and to the local one; release the lock.

A release already on the host with the same content is reused (switched to, or only health-checked
and marked when it is current but was never marked healthy: a deploy interrupted after the switch).
``deploy_host`` never raises for a per-host failure: the outcome says ``failed`` / ``refused`` /
``rolled_back`` with a one-line reason. Only usage errors (inventory, secrets, pinning) raise.
"""

from __future__ import annotations

import base64
import dataclasses
import difflib
import getpass
import json
import os
import re
import secrets as secrets_mod
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmfleet import __version__
from llmfleet.errors import LlmfleetError, RemoteError, UsageError
from llmfleet.images import lock as images
from llmfleet.inventory.ansible import Host, Inventory, load_inventory, settings_for
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.release import health as health_mod
from llmfleet.release import store as release
from llmfleet.release.render import COMPOSE_FILE, ENV_FILE, Rendered, render, unit_name
from llmfleet.release.store import Paths, q

RESULTS = ("deployed", "unchanged", "rolled_back", "failed", "refused", "check")
DEFAULT_AUDIT_LOG = "~/.local/state/llmfleet/audit.jsonl"
PULL_TIMEOUT_S = 1800
LOG_LINES = 200

Log = Callable[[str], None]


@dataclass
class DeployOptions:
    check: bool = False
    diff: bool = False
    accept_new_host_keys: bool = False
    allow_unpinned: bool = False
    message: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    who: str | None = None
    services: list[str] | None = None  # only these services of the host (default: all)


@dataclass
class HostOutcome:
    host: str
    result: str
    releases: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    reason: str = ""
    changes: list[str] = field(default_factory=list)
    diffs: dict[str, str] = field(default_factory=dict)
    preflight: list[dict[str, Any]] = field(default_factory=list)
    health: dict[str, Any] = field(default_factory=dict)
    round_trips: int = 0

    @property
    def ok(self) -> bool:
        return self.result in {"deployed", "unchanged", "check"}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Pure helpers


def default_who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name (a container without passwd entry)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def apply_overrides(service: Service, overrides: dict[str, Any], where: str) -> Service:
    """``--set key=value`` / ``--image`` on top of the inventory's service; validated like the inventory."""
    if not overrides:
        return service
    data = service.model_dump(mode="json", exclude_unset=True)
    data.update(overrides)
    try:
        return Service.model_validate(data)
    except Exception as exc:
        first = str(exc).splitlines()
        raise UsageError(f"{where}: overrides {sorted(overrides)} do not fit the service schema: "
                         f"{' '.join(first[1:3]) if len(first) > 2 else first[0]}") from None


def resolve_secret(service: Service, where: str) -> str | None:
    """The API key's value from the operator's machine; never from the inventory."""
    ref = service.api_key
    if ref is None:
        return None
    if ref.vault is not None:  # ansible-vault value: decrypted with the vault password file
        from llmfleet.inventory.vault import Vault

        return Vault().decrypt(ref.vault, f"{where}: api_key").strip()
    if ref.from_env is not None:
        value = os.environ.get(ref.from_env)
        if not value:
            raise UsageError(f"{where}: api_key.from_env {ref.from_env} is not set on this machine; export it")
        return value
    path = Path(os.path.expanduser(str(ref.from_file)))
    try:
        st = path.stat()
    except OSError:
        raise UsageError(f"{where}: api_key.from_file {path} does not exist on this machine") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"{where}: api_key.from_file {path} is readable by others; chmod 600 {path}")
    return path.read_text(encoding="utf-8").strip()


def describe_change(current: release.ReleaseInfo | None, rendered: Rendered) -> list[str]:
    """What differs between the running release and the one rendered now (no secret values)."""
    if current is None or not current.manifest:
        return [f"new service: image {rendered.image.pull_ref}, args {' '.join(rendered.engine_args)}"]
    m = current.manifest
    out: list[str] = []
    old_ref = (m.get("image") or {}).get("ref")
    if old_ref != rendered.image.pull_ref:
        out.append(f"image {old_ref} -> {rendered.image.pull_ref}")
    old_args = [str(a) for a in m.get("engine_args") or []]
    if old_args != list(rendered.engine_args):
        removed = [a for a in old_args if a not in rendered.engine_args]
        added = [a for a in rendered.engine_args if a not in old_args]
        out.append(f"engine args: -[{' '.join(removed)}] +[{' '.join(added)}]")
    old_files = m.get("files") or {}
    import hashlib

    for name, text in sorted(rendered.files.items()):
        if name in rendered.secret_files:
            continue
        if old_files.get(name) != hashlib.sha256(text.encode()).hexdigest() and not out:
            out.append(f"{name} changed")
    if not out:
        out.append(f"{ENV_FILE} changed (secret values; not shown)")
    return out


def unified_diff(old: str | None, new: str, name: str) -> str:
    return "".join(difflib.unified_diff(
        (old or "").splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"current/{name}" if old is not None else "/dev/null", tofile=f"new/{name}",
    ))


def fetch_current_script(root: str, services: list[str]) -> str:
    """The current release's files per service, base64 on one marker line each; the env file masked
    on the host (its values never leave it), plus its hash to tell a changed secret."""
    mask = "/^[[:space:]]*#/!s/^\\([^=]*\\)=.*/\\1='********'/"
    lines = []
    for svc in services:
        cur = f"{root.rstrip('/')}/services/{svc}/current"
        for name in (COMPOSE_FILE, unit_name(svc)):
            lines.append(f"[ -f {q(cur + '/' + name)} ] && echo \"@@file {svc} {name} $(base64 -w0 < {q(cur + '/' + name)})\"")
        env = q(cur + "/" + ENV_FILE)
        lines.append(f"[ -f {env} ] && echo \"@@file {svc} {ENV_FILE} $(sed {q(mask)} {env} | base64 -w0)\"")
        lines.append(f"[ -f {env} ] && echo \"@@envhash {svc} $(sha256sum < {env} | cut -c1-64)\"")
    lines.append("true")
    return "\n".join(lines)


def parse_current_files(stdout: str) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    files: dict[str, dict[str, str]] = {}
    env_hash: dict[str, str] = {}
    for line in stdout.splitlines():
        parts = line.split(" ", 3)
        if line.startswith("@@file ") and len(parts) >= 3:
            data = parts[3] if len(parts) == 4 else ""
            try:
                files.setdefault(parts[1], {})[parts[2]] = base64.b64decode(data).decode("utf-8", "replace")
            except ValueError:
                continue
        elif line.startswith("@@envhash ") and len(parts) >= 3:
            env_hash[parts[1]] = parts[2].strip()
    return files, env_hash


def image_present_script(ref: str) -> str:
    return f"docker image inspect {q(ref)} >/dev/null 2>&1 && echo '@@present' || echo '@@absent'"


def service_for_release(service: Service, manifest: dict[str, Any] | None) -> Service:
    """The inventory's service as an older release ran it: its port, served name and health settings
    come from that release's manifest (going back health-checks what the release serves, against the
    floor it was deployed with, not what the inventory or this run's overrides say now)."""
    inputs = (manifest or {}).get("inputs") or {}
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
    except Exception:  # an old manifest that no longer fits the schema: judge by the inventory
        return service


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def stale_local_holder(holder: dict[str, Any] | None, origin: str) -> bool:
    """A lock left by a deploy from this very machine whose process is gone (Ctrl-C'd, killed, or its
    SSH connection dropped before it could unlock): safe to take over. Anything else is refused."""
    if not holder or holder.get("from") != origin or holder.get("pid") is None:
        return False
    return not _pid_alive(holder["pid"])


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


def _short(text: str, n: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------------------------------
# The shell


class _Refused(Exception):
    def __init__(self, result: str, reason: str):
        super().__init__(reason)
        self.result = result
        self.reason = reason


@dataclass
class _Item:
    """One service being deployed on the host."""

    service: Service
    api_key: str | None
    image: images.ImageRef
    plan: Any
    rendered: Rendered | None = None
    paths: Paths | None = None
    state: release.ServiceState | None = None
    action: str = "new"  # new | switch | verify | restart | unchanged
    release_id: str | None = None
    changes: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    health: dict[str, Any] | None = None


class _HostRun:
    def __init__(self, inventory: Inventory, host: Host, settings: HostSettings, *, config: dict[str, Any],
                 options: DeployOptions, log: Log) -> None:
        self.inv = inventory
        self.host = host
        self.settings = settings
        self.config = config
        self.options = options
        self.log = log
        self.who = options.who or default_who()
        self.origin = default_who()
        self.remote: Any = None
        self.audit: list[dict[str, Any]] = []
        self.deferred: list[str] = []
        self.lock_token: str | None = None

    # -- plumbing ---------------------------------------------------------------------------------

    def run(self, script: str, *, timeout: float | None = None, stdin: bytes | None = None, check: bool = False):
        return self.remote.run(script, timeout=timeout, stdin=stdin, sudo=True, check=check)

    def connect(self) -> None:
        from llmfleet.host import ssh

        try:
            self.remote = ssh.connect(self.host, config=self.config,
                                      accept_new_host_keys=self.options.accept_new_host_keys)
        except ssh.HostKeyError as exc:
            raise _Refused("refused", str(exc)) from None
        except RemoteError as exc:
            raise _Refused("failed", str(exc)) from None

    def close(self) -> None:
        if self.remote is not None:
            try:
                self.remote.close()
            except Exception:  # closing a dead connection must not hide the outcome
                pass

    def read_state(self) -> dict[str, release.ServiceState]:
        res = self.run(release.state_script(self.settings.root), check=True)
        return release.parse_state(res.stdout)

    # -- lock -------------------------------------------------------------------------------------

    def lock(self, action: str) -> None:
        token = secrets_mod.token_hex(16)
        holder = release.holder_document(token=token, who=self.who, origin=self.origin, action=action,
                                         message=self.options.message, now=_now(), pid=os.getpid())
        for attempt in range(2):
            res = self.run(release.lock_acquire_script(self.settings.root, holder))
            got = release.parse_lock_acquire(res.rc, res.stdout)
            if got.acquired:
                self.lock_token = token
                return
            if attempt == 0 and stale_local_holder(got.holder, self.origin):
                self.log(f"taking over a stale lock left by this machine: {release.describe_holder(got.holder, _now())}")
                self.run(release.lock_break_script(self.settings.root))
                self.audit.append(self._record(action="lock-break", service=None, release_id=None, digest=None,
                                               result="stale", detail=release.describe_holder(got.holder)))
                continue
            if res.rc not in (0, release.LOCK_HELD_RC) and got.holder is None:
                raise _Refused("failed", f"cannot take the deploy lock: {_short(res.stderr or res.stdout)}")
            if got.holder is None:  # the answer was cut short: ask who holds it
                _, got_holder = release.parse_lock_status(self.run(release.lock_status_script(self.settings.root)).stdout)
                got = release.LockOutcome(False, got_holder, got.raw)
            raise _Refused("refused", f"deploy lock {release.describe_holder(got.holder, _now())}; wait, or inspect "
                                      f"with `invoke lock.status --host {self.host.name}` and break a stale one with "
                                      f"`invoke lock.release --host {self.host.name} --yes`")

    def defer(self, script: str) -> None:
        """Run ``script`` in the last round trip, before the audit lines and the unlock."""
        self.deferred.append(script)

    def finish(self, *, audit: bool = True) -> None:
        """One round trip at the end: deferred steps (mark healthy, prune), the audit lines, the unlock.

        If it does not arrive (a dropped connection), the release is simply not marked healthy yet and
        the lock is stale: the next deploy from this machine verifies the release and takes the lock over.
        """
        records = self.audit if audit else []
        if records:
            local = Path(os.path.expanduser(str(self.config.get("audit_log") or DEFAULT_AUDIT_LOG)))
            try:
                local.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                with os.fdopen(fd, "a", encoding="utf-8") as fh:
                    for rec in records:
                        fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
            except OSError as exc:
                self.log(f"warning: local audit log {local}: {exc}")
        parts = [f"(\n{sc}\n)" for sc in self.deferred]
        parts += [release.audit_append_script(self.settings.root, r) for r in records]
        token = self.lock_token
        if token is not None:
            parts.append(f"(\n{release.lock_release_script(self.settings.root, token)}\n)")
        self.deferred, self.audit, self.lock_token = [], [], None
        if not parts or self.remote is None:
            return
        try:
            res = self.run("\n".join(parts), timeout=300)
        except LlmfleetError as exc:
            self.log(f"warning: the final step (mark, prune, audit, unlock) did not complete: {exc}"
                     + (f"; the next deploy from this machine takes the lock over, others need "
                        f"`invoke lock.release --host {self.host.name} --yes`" if token else ""))
            return
        if token is not None and "@@released" not in res.stdout and "@@notheld" not in res.stdout:
            self.log(f"warning: the deploy lock was not ours to release: {_short(res.stdout)}")
        removed = [ln.split(" ", 1)[1] for ln in res.stdout.splitlines() if ln.startswith("@@image-removed ")]
        if removed:
            self.log(f"removed {len(removed)} image(s) no kept release uses")

    # -- audit ------------------------------------------------------------------------------------

    def _record(self, *, action: str, service: str | None, release_id: str | None, digest: str | None,
                result: str, detail: str = "", **extra: Any) -> dict[str, Any]:
        return release.audit_record(now=_now(), who=self.who, host=self.host.name, action=action, service=service,
                                    release=release_id, digest=digest, result=result, detail=detail,
                                    message=self.options.message, **extra)

    # -- health -----------------------------------------------------------------------------------

    def health(self, item: _Item, plan: Any, *, what: str) -> health_mod.HealthReport:
        svc = item.service
        paths = item.paths
        assert paths is not None
        floor = health_mod.decode_floor(svc, self.settings, plan)

        def probe() -> health_mod.Probe:
            return health_mod.parse_probe(self.run(health_mod.probe_script(paths), timeout=30).stdout)

        self.log(f"{svc.name}: health check of {what} (port {svc.port} through SSH)")
        with self.remote.forward(svc.port) as local_port:
            checker = health_mod.HealthChecker(
                probe=probe,
                base_url=f"http://127.0.0.1:{local_port}",
                served_name=svc.public_name,
                api_key=item.api_key,
                load_timeout_s=svc.health.load_timeout_s,
                stage_timeout_s=svc.health.stage_timeout_s,
                max_tokens=svc.health.max_tokens,
                floor=floor,
                realistic=health_mod.realistic_tokps(plan),
                progress=lambda line: self.log(f"{svc.name}:{line}"),
            )
            return checker.run()

    def engine_log(self, paths: Paths) -> str:
        try:
            out = self.run(release.logs_script(paths, LOG_LINES), timeout=30).stdout
        except LlmfleetError as exc:
            return f"(engine log unavailable: {exc})"
        return summarize_log(out)

    def mark(self, paths: Paths, release_id: str, report: health_mod.HealthReport, *, now: bool = True) -> None:
        doc = report.to_dict() | {"release": release_id, "time": _now().isoformat(timespec="seconds"),
                                  "who": self.who}
        script = release.mark_healthy_script(paths, release_id, doc)
        if now:
            self.run(script, timeout=30)
        else:
            self.defer(script)


# ---------------------------------------------------------------------------------------------
# deploy


def _load(inventory: Inventory | str | os.PathLike[str], host_name: str) -> tuple[Inventory, Host, HostSettings]:
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    host = inv.hosts.get(host_name)
    if host is None:
        raise UsageError(f"{inv.path}: no host {host_name!r}; hosts: {', '.join(inv.hosts) or '(none)'}")
    return inv, host, settings_for(host)


def _prepare(inv: Inventory, host: Host, settings: HostSettings, config: dict[str, Any],
             options: DeployOptions) -> list[tuple[Service, str | None, images.ImageRef]]:
    """Services (with overrides), their secrets and pinned images: everything decided before SSH."""
    from llmfleet.knowledge.preflight import images_lock_path

    lock = images.load_lock(images_lock_path(host.vars, inv.path, config.get("images_lock")))
    chosen = settings.services
    if options.services:
        names = {s.name for s in chosen}
        unknown = [s for s in options.services if s not in names]
        if unknown:
            raise UsageError(f"{inv.path}: host {host.name} has no service {unknown[0]!r} "
                             f"(services: {', '.join(sorted(names)) or 'none'})")
        chosen = [s for s in chosen if s.name in options.services]
    out = []
    for svc in chosen:
        where = f"host {host.name}: service {svc.name}"
        svc = apply_overrides(svc, options.overrides, where)
        key = resolve_secret(svc, where)
        ref = images.resolve(svc.image, lock, mirrors=dict(settings.image_mirrors),
                             allow_unpinned=options.allow_unpinned, where=where)
        out.append((svc, key, ref))
    return out


def _preflight(run: _HostRun, prepared: list[tuple[Service, str | None, images.ImageRef]]) -> tuple[list[Any], list[dict]]:
    """Facts (one round trip) and the preflight's verdict for each service, with the plan it made.

    The single place deploy calls llmfleet.host.facts / llmfleet.knowledge.preflight.
    """
    from llmfleet.host import facts as facts_mod
    from llmfleet.knowledge import preflight

    found = facts_mod.gather(run.remote, root=run.settings.root, model_paths=[s.model_path for s, _, _ in prepared])
    plans: list[Any] = []
    reports: list[dict] = []
    for svc, _, ref in prepared:
        plan, plan_error = preflight.plan_for(svc, found, run.settings)
        checks = preflight.run_checks(run.host.name, svc, found, plan, ref, plan_error=plan_error)
        plans.append(plan)
        reports.append({"service": svc.name, "ok": preflight.ok(checks), "checks": [c.to_dict() for c in checks]})
    return plans, reports


def deploy_host(
    inventory: Inventory | str,
    host_name: str,
    *,
    config: dict[str, Any],
    options: DeployOptions,
    log: Log,
) -> HostOutcome:
    """Deploy every llmfleet service of one host (see the module docstring)."""
    t0 = time.monotonic()
    inv, host, settings = _load(inventory, host_name)
    prepared = _prepare(inv, host, settings, config, options)
    out = HostOutcome(host=host_name, result="unchanged")
    if not prepared:
        out.reason = "no llmfleet_services on this host"
        out.duration_s = round(time.monotonic() - t0, 3)
        return out
    run = _HostRun(inv, host, settings, config=config, options=options, log=log)
    try:
        run.connect()
        _deploy(run, prepared, out)
    except _Refused as exc:
        out.result, out.reason = exc.result, exc.reason
    except RemoteError as exc:
        out.result, out.reason = "failed", str(exc)
    finally:
        if out.result in {"refused", "failed"} and not run.audit and not options.check:
            run.audit.append(run._record(action="deploy", service=None, release_id=None, digest=None,
                                         result=out.result, detail=out.reason))
        try:
            run.finish(audit=not options.check)
        finally:
            out.round_trips = getattr(run.remote, "round_trips", 0) or 0
            run.close()
            out.duration_s = round(time.monotonic() - t0, 3)
    return out


def _deploy(run: _HostRun, prepared: list[tuple[Service, str | None, images.ImageRef]], out: HostOutcome) -> None:
    opts, log, settings = run.options, run.log, run.settings
    plans, reports = _preflight(run, prepared)
    out.preflight = reports
    bad = [(r["service"], c) for r in reports for c in r["checks"] if c["status"] == "fail"]
    if bad:
        raise _Refused("refused", "preflight failed: " + "; ".join(
            f"{s}: {c['id']}: {c['message']}" + (f" (fix: {c['fix']})" if c.get("fix") else "") for s, c in bad))
    warns = sum(1 for r in reports for c in r["checks"] if c["status"] == "warn")
    log(f"preflight passed ({warns} warning{'s' if warns != 1 else ''})")

    states = run.read_state()
    items: list[_Item] = []
    now = _now()
    for (svc, key, ref), plan in zip(prepared, plans, strict=True):
        item = _Item(service=svc, api_key=key, image=ref, plan=plan)
        item.rendered = render(svc, settings, ref, plan, api_key=key)
        item.paths = Paths(settings.root, svc.name)
        st = states.get(svc.name)
        item.state = st
        existing = release.find_release_with_content(st, item.rendered.content_hash)
        current = st.current_release if st else None
        if existing is not None and st is not None and st.current == existing:
            item.release_id = existing
            if st.releases[existing].healthy and st.unit == "active":
                item.action = "unchanged"
                item.changes = []
            elif st.unit == "active":
                item.action, item.changes = "verify", [f"release {existing} is current but was never marked healthy "
                                                       "(an interrupted deploy): health-check it"]
            else:
                item.action, item.changes = "restart", [f"release {existing} is current but its unit is {st.unit}: "
                                                        "restart and health-check it"]
        elif existing is not None:
            item.release_id, item.action = existing, "switch"
            item.changes = [f"switch to existing release {existing}"] + describe_change(current, item.rendered)
        else:
            item.release_id = release.new_release_id(item.rendered.content_hash, now)
            item.action = "new"
            item.changes = [f"new release {item.release_id}"] + describe_change(current, item.rendered)
        out.releases[svc.name] = item.release_id
        out.changes.extend(f"{svc.name}: {c}" for c in item.changes)
        items.append(item)

    if opts.diff:
        res = run.run(fetch_current_script(settings.root, [i.service.name for i in items]))
        cur_files, env_hash = parse_current_files(res.stdout)
        import hashlib

        for it in items:
            assert it.rendered is not None
            old = cur_files.get(it.service.name, {})
            for name, text in sorted(it.rendered.masked_files().items()):
                d = unified_diff(old.get(name), text, name)
                if name == ENV_FILE and it.service.name in env_hash:
                    new_hash = hashlib.sha256(it.rendered.files[ENV_FILE].encode()).hexdigest()
                    if new_hash != env_hash[it.service.name] and not d:
                        d = f"--- current/{name}\n+++ new/{name}\n# secret values changed (masked)\n"
                if d:
                    out.diffs[f"{it.service.name}/{name}"] = d

    todo = [i for i in items if i.action != "unchanged"]
    if opts.check or opts.diff:
        out.result = "check"
        out.reason = (f"{len(todo)} of {len(items)} service(s) would change" if todo else "no change")
        return
    if not todo:
        out.result = "unchanged"
        out.reason = "nothing to do: every service runs its current, healthy release"
        for it in items:
            log(f"{it.service.name}: unchanged (release {it.release_id}, no restart)")
            run.audit.append(run._record(action="deploy", service=it.service.name, release_id=it.release_id,
                                         digest=it.image.digest, result="unchanged"))
        return

    run.lock("deploy")
    # Pull every image the new releases need while the old ones still serve.
    for it in todo:
        if it.action in {"new", "switch"}:
            _pull(run, it)
    results: list[str] = []
    for it in items:
        if it.action == "unchanged":
            log(f"{it.service.name}: unchanged (release {it.release_id}, no restart)")
            run.audit.append(run._record(action="deploy", service=it.service.name, release_id=it.release_id,
                                         digest=it.image.digest, result="unchanged"))
            continue
        result, reason, report = _switch_and_check(run, it)
        results.append(result)
        if report is not None:
            out.health[it.service.name] = report.to_dict()
        if result != "deployed":
            out.result, out.reason = result, reason
            if result in {"rolled_back", "failed"} and it.state and it.state.current:
                out.releases[it.service.name] = reason_release(reason) or it.state.current
            break
    else:
        out.result = "deployed"
        out.reason = "; ".join(f"{it.service.name} on {it.release_id}" for it in todo)
    if out.result == "deployed":
        for it in todo:
            st = states.setdefault(it.service.name, release.ServiceState(name=it.service.name))
            info = st.releases.setdefault(it.release_id, release.ReleaseInfo(it.release_id))
            info.manifest = it.manifest or info.manifest
            info.health = it.health or {"result": "healthy"}
            st.current = it.release_id
        _prune(run, states)


def reason_release(reason: str) -> str | None:
    marker = "back on release "
    if marker in reason:
        rid = reason.split(marker, 1)[1].split()[0].rstrip(".,;)")
        return rid if release.RELEASE_ID_RE.match(rid) else None
    return None


def _pull(run: _HostRun, it: _Item) -> None:
    ref = it.image.pull_ref
    run.log(f"{it.service.name}: pull {ref}")
    timeout = float(run.config.get("pull_timeout") or PULL_TIMEOUT_S)
    res = run.run(release.pull_script(ref), timeout=timeout)
    if res.rc != 0:
        raise _Refused("failed", f"{it.service.name}: pull of {ref} failed: {_short(res.stderr or res.stdout, 300)}; "
                                 "nothing was changed on the host")
    pulled, digests = release.parse_pull(res.stdout)
    if it.image.pinned and not release.digest_verified(digests, it.image.digest):
        raise _Refused("failed", f"{it.service.name}: {ref} pulled but the engine reports digests {digests}, not "
                                 f"{it.image.digest}; refusing to run it")
    run.log(f"{it.service.name}: image {'pulled' if pulled else 'present'}, digest verified"
            if it.image.pinned else f"{it.service.name}: image {'pulled' if pulled else 'present'} (UNPINNED)")


def _switch_and_check(run: _HostRun, it: _Item) -> tuple[str, str, health_mod.HealthReport | None]:
    svc, paths, rid = it.service, it.paths, it.release_id
    assert paths is not None and rid is not None and it.rendered is not None
    st = it.state
    previous = st.current if st and st.current and st.current != rid else None
    if previous is None and st is not None:
        previous = release.rollback_target(st, exclude=rid)
    if st is not None and previous and previous not in st.releases:
        previous = None
    digest = it.image.digest
    switched = False
    try:
        if it.action == "new":
            m = release.build_manifest(it.rendered, rid, host=run.host.name, who=run.who, when=_now(),
                                       llmfleet_version=__version__)
            it.manifest = m
            files, modes = release.release_files(it.rendered, m)
            res = run.run(release.upload_script(paths, rid), stdin=release.pack_release(files, modes), timeout=120)
            if res.rc != 0:
                raise RemoteError(f"upload of release {rid} failed: {_short(res.stderr or res.stdout, 300)}")
            run.log(f"{svc.name}: uploaded release {rid}")
        if it.action in {"new", "switch", "restart"}:
            res = run.run(release.switch_script(paths, rid), timeout=180)
            switched = True
            if res.rc != 0 or "@@switched" not in res.stdout:
                raise RemoteError(f"switch to {rid} failed: {_short(res.stderr or res.stdout, 300)}")
            run.log(f"{svc.name}: current -> {rid}, unit restarted")
        else:
            switched = True  # verify: the release is current and running; only its health is unknown
        report = run.health(it, it.plan, what=f"release {rid}")
    except KeyboardInterrupt:
        if switched:
            run.log(f"{svc.name}: interrupted; going back to {previous or 'nothing (stopping the unit)'}")
            result, back = _go_back(run, it, previous, "interrupted")
            run.audit.append(run._record(action="deploy", service=svc.name, release_id=rid, digest=digest,
                                         result=result, detail=f"interrupted; {back}"))
        raise
    except RemoteError as exc:
        if not switched:
            run.audit.append(run._record(action="deploy", service=svc.name, release_id=rid, digest=digest,
                                         result="failed", detail=str(exc)))
            return "failed", f"{svc.name}: {exc}; nothing was switched", None
        report = None
        failure = str(exc)
    else:
        failure = "" if report.ok else report.message
    if report is not None and report.ok:
        run.mark(paths, rid, report, now=False)
        it.health = report.to_dict()
        run.log(f"{svc.name}: release {rid} healthy ({report.message})")
        run.audit.append(run._record(action="deploy", service=svc.name, release_id=rid, digest=digest,
                                     result="deployed", decode_tokps=report.decode_tokps, ttft_s=report.ttft_s))
        return "deployed", "", report
    logs = run.engine_log(paths)
    if report is not None:
        try:
            run.mark(paths, rid, report)  # recorded unhealthy: never chosen as a rollback target
        except LlmfleetError:
            pass
    result, back = _go_back(run, it, previous, failure)
    reason = f"{svc.name}: release {rid} failed: {failure}; engine log: {logs or '(empty)'}; {back}"
    run.log(f"{svc.name}: FAILED: {failure}")
    run.log(f"{svc.name}: engine log: {logs or '(empty)'}")
    run.log(f"{svc.name}: {back}")
    run.audit.append(run._record(action="deploy", service=svc.name, release_id=rid, digest=digest, result=result,
                                 detail=f"{failure}; {back}"))
    return result, reason, report


def _go_back(run: _HostRun, it: _Item, previous: str | None, why: str) -> tuple[str, str]:
    """Point ``current`` back at ``previous``, restart and health-check it. Returns (result, sentence)."""
    paths = it.paths
    assert paths is not None
    if previous is None:
        try:
            run.run(release.stop_script(paths, forget_current=True), timeout=120)
        except LlmfleetError as exc:
            return "failed", f"no earlier release to go back to, and stopping the unit failed: {exc}"
        return "failed", "no earlier release to go back to; the service was stopped"
    try:
        res = run.run(release.switch_script(paths, previous), timeout=180)
        if res.rc != 0:
            return "failed", (f"ROLLBACK FAILED: switching back to {previous} failed: "
                              f"{_short(res.stderr or res.stdout, 200)}; check the host now")
        info = it.state.releases.get(previous) if it.state else None
        plan = (info.manifest or {}).get("plan") if info else None
        back = dataclasses.replace(it, release_id=previous,
                                   service=service_for_release(it.service, info.manifest if info else None))
        report = run.health(back, plan, what=f"previous release {previous}")
    except LlmfleetError as exc:
        return "failed", f"ROLLBACK FAILED: {exc}; the host may be serving nothing; check it now"
    if report.ok:
        try:
            run.mark(paths, previous, report)
        except LlmfleetError:
            pass
        return "rolled_back", f"the host is back on release {previous} (healthy)"
    return "failed", (f"ROLLBACK FAILED: previous release {previous} is current again but unhealthy: "
                      f"{report.message}; check the host now")


def _prune(run: _HostRun, states: dict[str, release.ServiceState]) -> None:
    """Keep the newest ``keep_releases`` per service (plus current and its rollback target); remove
    images no kept release uses. Decided from the state already read; runs in the final round trip."""
    deleted: dict[str, list[str]] = {}
    for name, st in states.items():
        protect = {st.current, release.rollback_target(st)} if st.current else set(st.releases)
        gone = release.releases_to_prune(list(st.releases), keep=run.settings.keep_releases, protect=protect)
        if gone:
            deleted[name] = gone
    refs = release.images_to_prune(states, deleted)
    if not deleted and not refs:
        return
    for name, ids in deleted.items():
        run.defer(release.prune_script(Paths(run.settings.root, name), ids, []))
    for ref in refs:
        run.defer(f"docker image rm {q(ref)} >/dev/null 2>&1 && echo {q('@@image-removed ' + ref)} || true")
    n = sum(len(v) for v in deleted.values())
    run.log(f"pruning {n} old release(s) and {len(refs)} unused image(s); keeping {run.settings.keep_releases} "
            "per service")


# ---------------------------------------------------------------------------------------------
# rollback


def rollback_host(
    inventory: Inventory | str,
    host_name: str,
    *,
    service: str | None = None,
    to: str | None = None,
    config: dict[str, Any],
    options: DeployOptions,
    log: Log,
) -> HostOutcome:
    """Point a service back at an earlier release (default: the newest healthy one before current)."""
    t0 = time.monotonic()
    inv, host, settings = _load(inventory, host_name)
    if to is not None and not release.RELEASE_ID_RE.match(to):
        raise UsageError(f"--to {to!r} is not a release id (like 20261129T120000Z-0123456789); "
                         f"see `invoke releases --host {host_name}`")
    names = [s.name for s in settings.services]
    if service is not None and service not in names:
        raise UsageError(f"{inv.path}: host {host_name} has no service {service!r} (services: {', '.join(names) or 'none'})")
    out = HostOutcome(host=host_name, result="failed")
    run = _HostRun(inv, host, settings, config=config, options=options, log=log)
    try:
        run.connect()
        _rollback(run, service, to, out)
    except _Refused as exc:
        out.result, out.reason = exc.result, exc.reason
    except RemoteError as exc:
        out.result, out.reason = "failed", str(exc)
    finally:
        if out.result == "failed" and not run.audit:
            run.audit.append(run._record(action="rollback", service=service, release_id=to, digest=None,
                                         result="failed", detail=out.reason))
        try:
            run.finish()
        finally:
            out.round_trips = getattr(run.remote, "round_trips", 0) or 0
            run.close()
            out.duration_s = round(time.monotonic() - t0, 3)
    return out


def _rollback(run: _HostRun, service: str | None, to: str | None, out: HostOutcome) -> None:
    states = run.read_state()
    inv_services = {s.name: s for s in run.settings.services}
    candidates = [service] if service else [n for n in inv_services if n in states]
    if to is not None and not service:
        candidates = [n for n in candidates if to in states[n].releases]
        if not candidates:
            raise _Refused("failed", f"release {to} does not exist on {run.host.name}; "
                                     f"see `invoke releases --host {run.host.name}`")
    if not candidates:
        raise _Refused("failed", f"{run.host.name} has no deployed llmfleet service to roll back")
    plan_items: list[tuple[_Item, str]] = []
    for name in candidates:
        st = states.get(name)
        if st is None or not st.releases:
            raise _Refused("failed", f"service {name} has no releases on {run.host.name}")
        target = to or release.rollback_target(st)
        if target is None:
            raise _Refused("failed", f"service {name}: no healthy release other than the current one "
                                     f"({st.current}) to roll back to")
        if target not in st.releases:
            raise _Refused("failed", f"service {name}: release {target} does not exist on {run.host.name} "
                                     "(pruned?); see `invoke releases`")
        info = st.releases[target]
        ref = info.image_ref
        if not ref:
            raise _Refused("failed", f"service {name}: release {target} has no readable manifest")
        svc = inv_services[name]
        key = resolve_secret(svc, f"host {run.host.name}: service {name}")
        svc = service_for_release(svc, info.manifest)
        img = images.ImageRef(key=ref, repository=ref.split("@")[0], digest=ref.split("@")[1] if "@" in ref else None,
                              tag=None, pinned="@" in ref, upstream_repository=ref.split("@")[0])
        item = _Item(service=svc, api_key=key, image=img, plan=(info.manifest or {}).get("plan"),
                     paths=Paths(run.settings.root, name), state=st, release_id=target, action="switch")
        plan_items.append((item, target))
    run.lock("rollback")
    for item, target in plan_items:
        assert item.paths is not None and item.state is not None
        name = item.service.name
        ref = item.image.pull_ref
        if "@@present" not in run.run(image_present_script(ref), timeout=30).stdout:
            raise _Refused("failed", f"service {name}: the image of release {target} ({ref}) is no longer on the "
                                     "host; redeploy that version instead")
        if item.state.current == target:
            run.log(f"{name}: release {target} is already current; restarting and checking it")
        previous = item.state.current
        res = run.run(release.switch_script(item.paths, target), timeout=180)
        if res.rc != 0:
            raise _Refused("failed", f"{name}: switch to {target} failed: {_short(res.stderr or res.stdout, 300)}")
        run.log(f"{name}: current -> {target}, unit restarted")
        report = run.health(item, item.plan, what=f"release {target}")
        out.health[name] = report.to_dict()
        if report.ok:
            run.mark(item.paths, target, report, now=False)
            out.releases[name] = target
            out.changes.append(f"{name}: {previous} -> {target}")
            run.audit.append(run._record(action="rollback", service=name, release_id=target,
                                         digest=item.image.digest, result="rolled_back", detail=f"from {previous}"))
            continue
        logs = run.engine_log(item.paths)
        back_item = dataclasses.replace(item, plan=None)
        if previous and previous != target:
            info = item.state.releases.get(previous)
            back_item = dataclasses.replace(item, plan=(info.manifest or {}).get("plan") if info else None)
            result, back = _go_back(run, back_item, previous, report.message)
        else:
            result, back = "failed", "nothing else to go back to"
        if result == "rolled_back":
            back = back.replace("back on release", "still on release")
        out.result = "failed"
        out.reason = (f"ROLLBACK FAILED: {name}: release {target} is unhealthy: {report.message}; engine log: "
                      f"{logs or '(empty)'}; {back}")
        out.releases[name] = previous or ""
        run.log(out.reason)
        run.audit.append(run._record(action="rollback", service=name, release_id=target, digest=item.image.digest,
                                     result="failed", detail=f"{report.message}; {back}"))
        return
    out.result = "rolled_back"
    out.reason = "; ".join(out.changes)


# ---------------------------------------------------------------------------------------------
# lock inspection and breaking (lock.status / lock.release)


def lock_status(host: Host, settings: HostSettings, *, config: dict[str, Any],
                accept_new_host_keys: bool = False) -> dict[str, Any]:
    from llmfleet.host import ssh

    with ssh.connect(host, config=config, accept_new_host_keys=accept_new_host_keys) as remote:
        res = remote.run(release.lock_status_script(settings.root), sudo=True, timeout=30)
    held, holder = release.parse_lock_status(res.stdout)
    return {"host": host.name, "held": held, "holder": holder,
            "description": release.describe_holder(holder, _now()) if held else "free"}


def lock_break(host: Host, settings: HostSettings, *, config: dict[str, Any], who: str | None = None,
               accept_new_host_keys: bool = False) -> dict[str, Any]:
    """Remove the host's deploy lock whoever holds it; audited on the host and locally."""
    from llmfleet.host import ssh

    who = who or default_who()
    with ssh.connect(host, config=config, accept_new_host_keys=accept_new_host_keys) as remote:
        res = remote.run(release.lock_break_script(settings.root), sudo=True, timeout=30)
        held, holder = release.parse_lock_status(res.stdout.replace("@@broken", ""))
        broken = "@@broken" in res.stdout
        if broken:
            rec = release.audit_record(now=_now(), who=who, host=host.name, action="lock-break", service=None,
                                       release=None, digest=None, result="broken",
                                       detail=release.describe_holder(holder))
            remote.run(release.audit_append_script(settings.root, rec), sudo=True, timeout=30)
            local = Path(os.path.expanduser(str(config.get("audit_log") or DEFAULT_AUDIT_LOG)))
            try:
                local.parent.mkdir(parents=True, exist_ok=True)
                with open(local, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
            except OSError:
                pass
    return {"host": host.name, "was_held": held, "broken": broken, "holder": holder,
            "description": release.describe_holder(holder, _now()) if held else "free"}
