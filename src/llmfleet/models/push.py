"""``invoke models.push``: put a service's model at its ``model_path`` on each host, verified.

Per host and model path (services sharing a path share one push), in this order:

1. one probe round trip (``scripts.probe_script``): the model and its manifest, the staging copy
   (resume points), free space where the model goes, the tools;
2. ``decide`` (pure): **skip** when the host's manifest describes the wanted content and every file is
   as it was when verified (size and mtime): that host costs this one round trip; **adopt** when the
   files are there with the wanted sizes but no intact manifest vouches for them (a hand copy, a
   touched file): ``sha256sum`` on the host, and only the manifest is written when it agrees;
   **send** otherwise, resuming each file from what the staging copy holds; **refuse** (one line) when
   the filesystem lacks the room or the host lacks a tool;
3. send: from this machine (``transfer.send_file``) or from a host holding a verified copy
   (``--from``: ``transfer.send_between``), at most ``--limit-rate`` bytes/s; with seeding
   (``SeedPlan``, on by default for more than two hosts at ``--forks`` above 1, ``--no-seed`` off)
   the source is chosen as the copy starts: a host that ended with a verified copy serves the next
   one, so the copies in flight double and this machine sends the file once;
4. one round trip: ``sha256sum`` of every received file against the wanted manifest, the atomic
   rename into place, the manifest, the host's audit line (``scripts.verify_script`` +
   ``commit_script`` + ``store.audit_append_script``).

A host that fails (unreachable, cut mid-copy, refused) is one line and changes nothing at its
``model_path``; the others go on (``host.group.run_on_hosts``, ``--forks`` at once). The model's
wanted manifest comes from the service's ``model_source``: a local path (hashed here, once), a host
(its verified manifest) or a Hugging Face repository at a pinned commit (downloaded on the host by
the service's own vLLM image, then hashed there).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from llmfleet.errors import CheckFailed, LlmfleetError, RemoteError, UsageError
from llmfleet.host import model_scripts as S
from llmfleet.host import transfer
from llmfleet.inventory.ansible import Host, Inventory, settings_for
from llmfleet.inventory.services import HostSettings, ModelSource, Service, split_transfer_address
from llmfleet.knowledge import model_manifest as M
from llmfleet.models import local as L

Action = Literal["skip", "adopt", "send", "refuse"]
Result = Literal["verified", "adopted", "pushed", "downloaded", "failed"]
VERIFY_RATE = 40 * 1024 * 1024  # bytes/s sha256sum is assumed to reach at least, for its time limit
DOWNLOAD_TIMEOUT_S = 6 * 3600
LOCK_WAIT_S = 60.0  # --lock-wait: how long a push waits for another writer's deploy lock (docs/models.md)


def gib(n: int | float | None) -> str:
    if n is None:
        return "?"
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{int(n):,} B"


# ---------------------------------------------------------------------------------------------
# Pure: what to do on one host


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    offsets: dict[str, int] = field(default_factory=dict)  # file -> resume point (send)
    reset: bool = False  # the staging copy is for other content (or absent): start it afresh
    send_bytes: int = 0
    held_bytes: int = 0  # bytes of the staging copy kept (resumed)


def decide(wanted: M.Manifest, probe: S.PushProbe, host: str, *, adopt: bool = True,
           verified_in_place: Sequence[str] = ()) -> Decision:
    """Skip, adopt, send or refuse (module docstring). ``verified_in_place``: files sha256sum just
    found right at ``model_path`` (a failed adopt): linked, not sent."""
    mp = wanted.model_path
    model = probe.model
    if not probe.complete:
        return Decision("refuse", f"host {host}: the probe of {mp} did not finish; run it again")
    missing_tools = [t for t in ("sha256sum", "python3", "stat", "truncate") if probe.tools.get(t) is False]
    if missing_tools:
        return Decision("refuse", f"host {host}: {', '.join(missing_tools)} not found on the host; a push needs "
                                  "sh, coreutils and python3")
    if model.kind in ("file", "dir") and model.kind != wanted.kind:
        return Decision("refuse", f"host {host}: {mp} is a {'folder' if model.kind == 'dir' else 'file'}, the model "
                                  f"is a {'folder' if wanted.kind == 'dir' else 'file'}; move it away or choose "
                                  "another model_path")
    if model.kind == "other":
        return Decision("refuse", f"host {host}: {mp} exists and is neither a file nor a folder; move it away")
    held, _problems = model.manifest()
    if held is not None and model.kind == wanted.kind:
        cmp = M.compare(held, model.files, wanted)
        if cmp.same_content and cmp.intact:
            return Decision("skip", f"verified {held.verified_at or '(no date)'}")
    sizes_match = model.kind == wanted.kind and all(
        model.files.get(f.path, (-1, 0))[0] == f.size for f in wanted.files)
    if adopt and sizes_match:
        return Decision("adopt", f"{mp} holds files of the wanted sizes; sha256sum on the host")
    reset = probe.want != wanted.content_digest or probe.part_kind not in ("none", wanted.kind)
    offsets: dict[str, int] = {}
    held_bytes = 0
    linked = set(verified_in_place) if wanted.kind == "dir" else set()
    for f in wanted.files:
        if f.path in linked:
            offsets[f.path] = f.size
            continue
        have = 0 if reset else probe.parts.get(f.path, 0)
        off = have if 0 <= have <= f.size else 0
        offsets[f.path] = off
        held_bytes += off
    send = sum(f.size - offsets[f.path] for f in wanted.files)
    if probe.free_bytes is not None and send > probe.free_bytes:
        return Decision("refuse", f"host {host}: {probe.fs_path or mp} (the filesystem of {mp}) has {gib(probe.free_bytes)} "
                                  f"free; the model needs {gib(send)} more; free space or choose another model_path",
                        offsets, reset, send, held_bytes)
    return Decision("send", f"{gib(send)} to send" + (f", {gib(held_bytes)} resumed" if held_bytes else ""),
                    offsets, reset, send, held_bytes)


# ---------------------------------------------------------------------------------------------
# Pure: seeding, who copies from whom as hosts finish

CONTROLLER = ""  # the seeding plan's name for this machine as a source


def seeding_on(flag: bool | None, forks: int, targets: int) -> bool:
    """Seeding by default only where it can pay: several copies at once (``forks > 1``) to more than
    two hosts. ``flag``: False (``--no-seed``) or True decides; None: the default."""
    if flag is not None:
        return flag
    return forks > 1 and targets > 2


@dataclass
class SeedPlan:
    """Who sends a model to whom, as the copies finish (pure; the shell asks it under a lock).

    ``root``: the first holder: ``CONTROLLER`` (this machine) or the ``--from`` host. A host that ends
    with a verified copy (pushed, adopted, or already verified) becomes a holder (``holds``) and may
    then serve hosts not served yet. Each holder serves at most one copy at a time, so the copies in
    flight double each round, like a tree. This machine is the scarce source: it serves only when no
    host can (no holder free, no copy in flight or being verified: the first copy, or after the
    copies from hosts failed), so a push from here to N hosts sends its uplink the file once. A
    holder whose send failed (``sent(..., ok=False)``) serves no one else in the run; its target asks
    again (``want``) and gets another holder."""

    root: str
    holders: list[str] = field(default_factory=list)  # hosts holding a verified copy, in the order they got it
    busy: set[str] = field(default_factory=set)
    bad: set[str] = field(default_factory=set)  # sources whose send failed
    waiting: list[str] = field(default_factory=list)  # targets that need a source now, first come first
    flight: dict[str, str] = field(default_factory=dict)  # target -> its source, while the copy runs
    served: set[str] = field(default_factory=set)  # targets whose copy is across, being verified
    active: set[str] = field(default_factory=set)  # targets started and not finished

    def __post_init__(self) -> None:
        if self.root != CONTROLLER and self.root not in self.holders:
            self.holders.insert(0, self.root)

    def start(self, target: str) -> None:
        """A target's push began (it may find its copy verified and never need a source)."""
        self.active.add(target)

    def want(self, target: str) -> None:
        """The target must be sent the model: queue it for a source."""
        self.active.add(target)
        if target not in self.waiting and target not in self.flight:
            self.waiting.append(target)

    def _usable(self, h: str) -> bool:
        return h not in self.busy and h not in self.bad

    def assign(self) -> list[tuple[str, str]]:
        """Pair waiting targets with free sources; the pairs start now (their sources are busy until
        ``sent``)."""
        out: list[tuple[str, str]] = []
        for t in list(self.waiting):
            free = [h for h in self.holders if h != t and self._usable(h)]
            if free:
                src = free[0]
            elif self.root == CONTROLLER and CONTROLLER not in self.busy and not self.flight and not self.served:
                src = CONTROLLER
            else:
                continue
            self.waiting.remove(t)
            self.flight[t] = src
            self.busy.add(src)
            out.append((t, src))
        return out

    def sent(self, target: str, ok: bool) -> None:
        """The target's copy ended (its bytes are across, or the send failed): its source is free again,
        or, failed, is a source no more (this machine stays one)."""
        src = self.flight.pop(target, None)
        if src is None:
            return
        self.busy.discard(src)
        if ok:
            self.served.add(target)
        elif src != CONTROLLER:
            self.bad.add(src)

    def holds(self, host: str) -> None:
        """The host ended with a verified copy: a holder from now on."""
        self.finish(host)
        if host not in self.holders and host not in self.bad:
            self.holders.append(host)

    def finish(self, target: str) -> None:
        """The target's push ended (either way)."""
        self.active.discard(target)
        self.served.discard(target)
        if target in self.waiting:
            self.waiting.remove(target)
        src = self.flight.pop(target, None)
        if src is not None:
            self.busy.discard(src)

    def stuck(self) -> list[str]:
        """Targets still waiting after ``assign`` that no source can ever serve: nothing in flight, no
        target still running that may become a holder, and no free holder (this machine, the root,
        always can)."""
        if self.flight or self.root == CONTROLLER or any(t not in self.waiting for t in self.active):
            return []
        return [t for t in self.waiting if not any(h != t and self._usable(h) for h in self.holders)]


# ---------------------------------------------------------------------------------------------
# Sources and jobs (before any connection: usage errors)


@dataclass(frozen=True)
class Origin:
    """Where one model comes from: a local path, a host, or a Hugging Face repository."""

    kind: Literal["local", "host", "hf"]
    value: str  # the path, the host's name, or the repository
    revision: str | None = None
    file: str | None = None

    @classmethod
    def of(cls, src: ModelSource) -> Origin:
        if src.path is not None:
            return cls("local", os.path.expanduser(src.path))
        if src.host is not None:
            return cls("host", src.host)
        return cls("hf", str(src.hf), src.revision, src.file)

    def describe(self) -> str:
        if self.kind == "local":
            return f"{self.value} (this machine)"
        if self.kind == "host":
            return f"host {self.value}"
        return f"hf {self.value}@{self.revision}" + (f" {self.file}" if self.file else "")

    def record(self) -> dict[str, Any]:
        """The manifest's ``source``."""
        if self.kind == "local":
            return {"path": os.path.abspath(self.value), "controller": socket.gethostname()}
        if self.kind == "host":
            return {"host": self.value}
        return {"hf": self.value, "revision": self.revision, **({"file": self.file} if self.file else {})}


@dataclass
class Job:
    """One model path on one host, and the services that read it."""

    host: Host
    settings: HostSettings
    model_path: str
    services: list[str]
    origin: Origin
    engine: str = ""
    image: str | None = None  # hf: the service's image to download with (pinned reference)


def plan_jobs(inv: Inventory, hosts: Sequence[Host], *, service: str | None = None, source: str | None = None,
              from_host: str | None = None, lock: Callable[[Host, Service], str] | None = None) -> list[Job]:
    """The (host, model path) pairs to push and where each model comes from. Raises ``UsageError``
    (one line naming the host, service and field) before anything is contacted."""
    if source and from_host:
        raise UsageError("give --source PATH or --from HOST, not both")
    if from_host and from_host not in inv.hosts:
        raise UsageError(f"--from {from_host}: no such host in the inventory")
    jobs: dict[tuple[str, str], Job] = {}
    for h in hosts:
        settings = settings_for(h)
        svcs = [s for s in settings.services if service is None or s.name == service]
        if service and not svcs and len(hosts) == 1:
            raise UsageError(f"host {h.name} has no service {service!r} (services: "
                             f"{', '.join(s.name for s in settings.services) or 'none'})")
        for s in svcs:
            if s.model_path is None:  # an exporter has no model
                continue
            origin = _origin_for(h, s, source, from_host)
            if origin.kind == "host" and origin.value == h.name:
                continue  # the source itself: it holds the copy the others get
            key = (h.name, s.model_path.rstrip("/") or "/")
            job = jobs.get(key)
            if job is None:
                image = None
                if origin.kind == "hf":
                    if s.engine != "vllm":
                        raise UsageError(f"host {h.name}: service {s.name}: model_source.hf runs the image's "
                                         f"huggingface_hub, which a {s.engine} image lacks; give a path or a host")
                    image = lock(h, s) if lock is not None else s.image
                jobs[key] = Job(h, settings, key[1], [s.name], origin, s.engine, image)
            elif job.origin != origin:
                raise UsageError(f"host {h.name}: services {job.services[0]} and {s.name} share model_path "
                                 f"{key[1]} but name different model_source values")
            else:
                job.services.append(s.name)
    if service and not jobs and not any(s.name == service for h in hosts for s in settings_for(h).services):
        raise UsageError(f"no selected host has service {service!r}")
    return list(jobs.values())


def _origin_for(h: Host, s: Service, source: str | None, from_host: str | None) -> Origin:
    if source:
        return Origin("local", os.path.expanduser(source))
    if from_host:
        return Origin("host", from_host)
    if s.model_source is None:
        raise UsageError(f"host {h.name}: service {s.name}: no model_source: set llmfleet_services[].model_source "
                         "(a path on this machine, {host: NAME} or {hf: REPO, revision: ...}), or pass "
                         "--source PATH or --from HOST")
    return Origin.of(s.model_source)


def peer_address(target: Host, settings: HostSettings) -> tuple[str, int]:
    """How another host reaches ``target``'s sshd (``--from``): ``llmfleet_transfer_address`` (port 22
    unless it names one), else ``llmfleet_cluster_address`` (port 22), else ``ansible_host`` with
    ``ansible_port`` unless that address is loopback (it would be the source itself). Raises
    ``UsageError`` naming the fix."""
    import ipaddress

    if settings.transfer_address:
        addr, port = split_transfer_address(settings.transfer_address)
        return addr, port or 22
    if settings.cluster_address:
        return settings.cluster_address, 22
    addr = target.address
    loop = addr in ("localhost", "localhost.localdomain")
    try:
        loop = loop or ipaddress.ip_address(addr).is_loopback
    except ValueError:
        pass
    if loop:
        raise UsageError(f"host {target.name}: --from needs the address the other hosts reach its sshd at; "
                         f"ansible_host {addr} is loopback (from another host it names that host itself): "
                         "set llmfleet_transfer_address (NAME, IP or NAME:PORT on the hosts' network)")
    try:
        port = int(target.vars.get("ansible_port") or 22)
    except (TypeError, ValueError):
        port = 22
    return addr, port


# ---------------------------------------------------------------------------------------------
# Outcomes and the reporter


@dataclass
class Outcome:
    host: str
    model_path: str
    services: list[str]
    result: Result
    source: str = ""
    reason: str = ""
    bytes_total: int = 0
    bytes_sent: int = 0
    bytes_resumed: int = 0
    send_seconds: float = 0.0
    seconds: float = 0.0
    round_trips: int = 0
    verified_at: str | None = None
    error: str | None = None
    bytes_by_source: dict[str, int] = field(default_factory=dict)  # source (as ``source``) -> bytes it sent
    refused: bool = False  # the host's deploy lock was held by another writer (``error`` names it)
    lock_wait_s: float = 0.0  # how long it waited for the deploy lock before it got it
    lock_waited_for: str | None = None  # the holder it waited for

    @property
    def ok(self) -> bool:
        return self.result != "failed"

    @property
    def rate(self) -> float | None:
        return self.bytes_sent / self.send_seconds if self.send_seconds > 0 and self.bytes_sent else None

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "model_path": self.model_path, "services": self.services, "result": self.result,
                "source": self.source, "reason": self.reason, "bytes_total": self.bytes_total,
                "bytes_sent": self.bytes_sent, "bytes_resumed": self.bytes_resumed,
                "send_seconds": round(self.send_seconds, 3), "rate_bytes_per_s": round(self.rate) if self.rate else None,
                "seconds": round(self.seconds, 3), "round_trips": self.round_trips, "verified_at": self.verified_at,
                "error": self.error, "bytes_by_source": dict(self.bytes_by_source), "refused": self.refused,
                "lock_wait_s": self.lock_wait_s, "lock_waited_for": self.lock_waited_for}


class Reporter(Protocol):
    """What the push tells the person running it (the CLI draws it with rich)."""

    def begin(self, key: str, description: str, total: int, done: int) -> None: ...
    def advance(self, key: str, n: int) -> None: ...
    def end(self, key: str, outcome: Outcome | None = None) -> None: ...
    def log(self, line: str) -> None: ...


class Quiet:
    def begin(self, key: str, description: str, total: int, done: int) -> None:
        pass

    def advance(self, key: str, n: int) -> None:
        pass

    def end(self, key: str, outcome: Outcome | None = None) -> None:
        pass

    def log(self, line: str) -> None:
        pass


@dataclass
class Options:
    limit_rate: int | None = None
    who: str = ""
    forks: int = 5
    accept_new_host_keys: bool = False
    seed: bool | None = None  # hosts with a verified copy serve the others (None: ``seeding_on``'s default)
    lock_wait: float = LOCK_WAIT_S  # seconds to wait for the host's deploy lock held by another writer
    lock_action: str = "models.push"  # what the lock's holder says this writer is doing


SEED_ATTEMPTS = 3  # copies tried per target when seeding: a failed holder's target gets another one
SEED_WAIT_S = DOWNLOAD_TIMEOUT_S  # the longest a target waits for a free holder


class SeedFailed(RemoteError):
    """A copy from a holder host failed: the target may ask another holder."""


class Seeder:
    """The shell around one model's ``SeedPlan``: the pushes' threads ask it for a source under one
    lock, each wait bounded."""

    def __init__(self, plan: SeedPlan, root: Origin, hosts: dict[str, Host]) -> None:
        import threading

        self.plan, self.root, self.hosts = plan, root, hosts
        self.cv = threading.Condition()

    def start(self, target: str) -> None:
        with self.cv:
            self.plan.start(target)

    def acquire(self, target: str, wait_s: float = SEED_WAIT_S) -> Origin | None:
        """Where ``target`` copies from now (this machine's origin, or a holder host); None when no
        source is left."""
        deadline = time.monotonic() + wait_s
        with self.cv:
            self.plan.want(target)
            while True:
                if self.plan.assign():
                    self.cv.notify_all()
                src = self.plan.flight.get(target)
                if src is not None:
                    return self.root if src == CONTROLLER else Origin("host", src)
                if target in self.plan.stuck() or time.monotonic() > deadline:
                    self.plan.finish(target)
                    self.cv.notify_all()
                    return None
                self.cv.wait(timeout=1.0)

    def sent(self, target: str, ok: bool) -> None:
        with self.cv:
            self.plan.sent(target, ok)
            self.cv.notify_all()

    def end(self, target: str, held: bool) -> None:
        with self.cv:
            if held:
                self.plan.holds(target)
            else:
                self.plan.finish(target)
            self.cv.notify_all()


# ---------------------------------------------------------------------------------------------
# The shell


def _connect(host: Host, config: Any, options: Options) -> Any:
    from llmfleet.host import ssh

    return ssh.connect(host, config=config, accept_new_host_keys=options.accept_new_host_keys)


def _probe(remote: Any, model_path: str) -> S.PushProbe:
    res = remote.run(S.probe_script(model_path), sudo=True, timeout=120)
    pp = S.parse_probe(res.stdout, model_path)
    if not pp.complete:
        detail = (res.stderr.strip() or res.stdout.strip() or f"exit {res.rc}").splitlines()[-1][:200]
        raise RemoteError(f"host {remote.name}: probe of {model_path} failed: {detail}")
    return pp


def source_manifest(remote: Any, model_path: str) -> M.Manifest:
    """The verified manifest a ``--from`` host holds at ``model_path`` (one round trip); raises
    ``CheckFailed`` when it has none or a file changed since it was verified."""
    pp = _probe(remote, model_path)
    held, problems = pp.model.manifest()
    if held is None:
        raise CheckFailed(f"host {remote.name}: no verified copy of {model_path} to send from "
                          f"({'; '.join(problems)}); push it there first")
    cmp = M.compare(held, pp.model.files)
    if not cmp.intact:
        bad = (cmp.changed + cmp.missing + cmp.unobserved)[0]
        raise CheckFailed(f"host {remote.name}: {model_path}: file {bad} changed since it was verified (size/mtime); "
                          "it cannot be a source until it is pushed again")
    return held


def local_manifest(origin: Origin, model_path: str, reporter: Reporter) -> M.Manifest:
    """Hash the local model (progress per byte hashed) and place it at ``model_path``."""
    try:
        kind, entries = L.local_files(origin.value)
    except (OSError, ValueError) as exc:
        raise UsageError(f"model source {origin.value}: {exc}") from None
    total = sum(size for _r, _f, size in entries)
    key = f"hash {origin.value}"
    reporter.begin(key, f"sha256 {origin.value}", total, 0)
    try:
        return L.build_local(origin.value, model_path, source=origin.record(),
                             progress=lambda n: reporter.advance(key, n))
    except OSError as exc:
        raise UsageError(f"model source {origin.value}: {exc}") from None
    finally:
        reporter.end(key)


def _timeout(total: int) -> float:
    return 120 + total / VERIFY_RATE


class Lease:
    """One push's hold on a host's deploy lock (``release.executor.HostRun.lock``, the one lock path every
    writer of a host takes): taken only when the push must write, with the probe in the same round
    trip; released in the round trip that commits (or, after a failure, in one that audits it). The
    token it holds is also the owner stamp of the staging copy it fills."""

    def __init__(self, remote: Any, job: Job, options: Options, reporter: Reporter, now: Callable[[], datetime],
                 config: Any = None, make_run: Callable[..., Any] | None = None) -> None:
        from llmfleet.release.executor import HostRun

        self.remote, self.job, self.options = remote, job, options
        mp = job.model_path
        log = lambda line: reporter.log(f"{job.host.name}: {mp}: {line}")  # noqa: E731
        self.run = (make_run or HostRun)(job.host.name, job.settings, remote, settings=config, log=log,
                                         who=options.who or None, message=f"{mp} from {job.origin.describe()}",
                                         now=now)
        self.taken_ever = False

    @property
    def token(self) -> str | None:
        token: str | None = self.run.lock_token
        return token

    def take(self) -> S.PushProbe:
        """The deploy lock (waiting at most ``options.lock_wait`` for another writer; a stale lock of this
        machine taken over, audited), and the probe under it. Raises ``decide.Refusal`` naming the holder."""
        mp = self.job.model_path
        (res,) = self.run.lock(self.options.lock_action, [S.probe_script(mp)], wait_s=self.options.lock_wait,
                               timeout=120)
        self.taken_ever = True
        pp = S.parse_probe(res.stdout, mp) if res is not None else S.PushProbe(S.HostModel(mp))
        if not pp.complete:
            detail = ((res.stderr.strip() or res.stdout.strip()) if res is not None else "") or "no answer"
            raise RemoteError(f"host {self.job.host.name}: probe of {mp} failed: {detail.splitlines()[-1][:200]}")
        return pp

    def owner(self, path: str) -> tuple[str, str] | None:
        return (path, self.token) if self.token else None

    def last(self, steps: list[str], records: list[dict[str, Any]], *, stdin: bytes | None = None,
             timeout: float = 120) -> Any:
        """One round trip: ``steps`` (one subshell), the takeover lines and ``records`` audited, the
        unlock. The lock is no longer this push's after it, whatever the steps did (when the round trip
        itself fails, the push still holds it: ``finish_failed`` tries the unlock again)."""
        from llmfleet.release import store

        script = store.final_script(self.job.settings.root, steps, [*self.run.audit, *records], self.token)
        self.run.audit = []
        res = self.remote.run(script, sudo=True, stdin=stdin, timeout=timeout)  # raises: the unlock may not have run
        self.run.forget_lock()
        return res

    def finish_failed(self, out: Outcome, now: Callable[[], datetime]) -> None:
        """After a failure: the host's audit line for it and the unlock, in one round trip (when the lock
        was ever taken, or a lock refused the push). A connection that is gone leaves the lock stale:
        this machine's next push takes it over."""
        record = _host_record(self.job, out, self.options, now, result="refused" if out.refused else "failed",
                              detail=out.error or "")
        held = self.token is not None
        try:
            self.last([], [record])
        except LlmfleetError:
            if held:
                out.error = (out.error or "") + ("; the deploy lock stays held until this machine's next push takes "
                                                 f"it over (else `invoke lock.release --host {self.job.host.name} "
                                                 "--yes`)")

    def who_took(self, owner: str) -> str:
        """Who took the staging copy: the deploy lock's holder when its token is the owner stamp's."""
        from llmfleet.release import store

        if owner == "none":
            return "its staging files were removed"
        if owner == "replaced":
            return "its staging file was replaced by another"
        try:
            _held, holder = store.parse_lock_status(self.remote.run(store.lock_status_script(self.job.settings.root),
                                                                    sudo=True, timeout=30).stdout)
        except LlmfleetError:
            holder = None
        if holder and holder.get("token") == owner:
            return f"by the writer now holding the deploy lock: {store.describe_holder(holder, datetime.now(UTC))}"
        return f"by another writer (owner stamp {owner[:12]}, not the deploy lock's holder)"


def _host_record(job: Job, out: Outcome, options: Options, now: Callable[[], datetime], *, result: str,
                 detail: str) -> dict[str, Any]:
    from llmfleet.release import store

    extra: dict[str, Any] = {"model_path": job.model_path}
    if out.lock_wait_s:
        extra["lock_wait_s"] = out.lock_wait_s
    return store.audit_record(now=now(), who=options.who, host=job.host.name, action="models.push",
                              service=",".join(job.services), release=None, digest=None, result=result,
                              detail=detail, **extra)


def push_job(job: Job, wanted: M.Manifest | None, *, config: Any, options: Options, reporter: Reporter,
             now: Callable[[], datetime] = lambda: datetime.now(UTC), connect: Callable[..., Any] | None = None,
             source_remote: Callable[[], Any] | None = None, seeder: Seeder | None = None,
             make_run: Callable[..., Any] | None = None) -> Outcome:
    """Push one model path to one host (module docstring). Never raises for the host's own trouble:
    the outcome says ``failed`` with one line. ``seeder``: the source is chosen when the copy starts
    (this machine or a host holding a verified copy); a copy from a holder that fails is tried again
    from another one, up to ``SEED_ATTEMPTS`` copies. ``make_run``: builds the ``HostRun`` whose lock
    the push takes (tests inject its clock, token and the liveness test of a holder's process)."""
    from llmfleet.release.decide import Refusal

    connect = connect or (lambda h: _connect(h, config, options))
    t0 = time.monotonic()
    mp = job.model_path
    out = Outcome(job.host.name, mp, list(job.services), "failed", source=job.origin.describe())
    remote = None
    lease: Lease | None = None
    if seeder is not None:
        seeder.start(job.host.name)
    try:
        remote = connect(job.host)
        lease = Lease(remote, job, options, reporter, now, config, make_run)
        for attempt in range(SEED_ATTEMPTS if seeder is not None else 1):
            probe = _probe(remote, mp)  # under the lock once it is held (a seeded copy tried again)
            if job.origin.kind == "hf":
                if not _held_download(job, probe, out):
                    probe = lease.take() if lease.token is None else probe
                    _note_wait(out, lease)
                    _download(remote, lease, job, probe, out, options, reporter, now)
                break
            assert wanted is not None
            want = wanted.for_path(mp)
            if lease.token is None:
                d = decide(want, probe, job.host.name)
                if d.action in ("skip", "refuse"):  # read-only answers: the lock is never taken for them
                    _push(remote, lease, job, want, probe, out, options, reporter, now, source_remote, seeder, connect)
                    break
                probe = lease.take()
                _note_wait(out, lease)
            try:
                _push(remote, lease, job, want, probe, out, options, reporter, now, source_remote, seeder, connect)
                break
            except SeedFailed as exc:
                if attempt == SEED_ATTEMPTS - 1:
                    raise
                reporter.log(f"{job.host.name}: {mp}: {exc}; trying another holder")
    except Refusal as exc:  # the lock: held by another writer (refused), or the lock script failed
        out.result, out.refused = "failed", exc.result == "refused"
        out.error = f"host {job.host.name}: {mp}: not pushed: {exc.reason}"
    except transfer.StagingTaken as exc:
        who = lease.who_took(exc.owner) if lease is not None else ""
        out.result, out.error = "failed", (f"host {job.host.name}: {mp}: this push's staging copy was taken while it "
                                           f"was being written, {who}; nothing of this push was put in place")
    except LlmfleetError as exc:
        out.result, out.error = "failed", str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    finally:
        if lease is not None and not out.ok and (lease.token is not None or out.refused or lease.taken_ever):
            lease.finish_failed(out, now)
        if lease is not None:
            lease.run.forget_lock()  # this run is over: a lock it could not release is stale from now on
        if seeder is not None:
            seeder.end(job.host.name, held=out.ok)
        if remote is not None:
            out.round_trips = remote.round_trips
            try:
                remote.close()
            except Exception:  # noqa: BLE001,S110 - closing a broken connection must not hide the outcome
                pass
        out.seconds = time.monotonic() - t0
    return out


def _note_wait(out: Outcome, lease: Lease) -> None:
    from llmfleet.release import store

    if lease.run.lock_waited_s:
        out.lock_wait_s = lease.run.lock_waited_s
        out.lock_waited_for = store.describe_holder(lease.run.lock_holder_seen)


def _held_download(job: Job, probe: S.PushProbe, out: Outcome) -> bool:
    """``model_source.hf``: the host already holds a verified download of that repository and revision."""
    o = job.origin
    held, _ = probe.model.manifest()
    if held is not None and held.source.get("hf") == o.value and held.source.get("revision") == o.revision \
            and M.compare(held, probe.model.files).intact:
        out.result, out.reason, out.verified_at = "verified", f"verified {held.verified_at}", held.verified_at
        out.bytes_total = held.total_size
        return True
    return False


def _push(remote: Any, lease: Lease, job: Job, wanted: M.Manifest, probe: S.PushProbe, out: Outcome,
          options: Options, reporter: Reporter, now: Callable[[], datetime], source_remote: Callable[[], Any] | None,
          seeder: Seeder | None = None, connect: Callable[..., Any] | None = None) -> None:
    host, mp = job.host.name, job.model_path
    out.bytes_total = wanted.total_size
    d = decide(wanted, probe, host)
    if d.action == "skip":
        held, _ = probe.model.manifest()
        out.result, out.reason, out.verified_at = "verified", d.reason, held.verified_at if held else None
        if lease.token is not None:  # found verified under the lock (another push just put it there)
            lease.last([], [])
        return
    if d.action == "refuse":
        raise CheckFailed(d.reason)
    assert lease.token is not None, "a push writes only under the host's deploy lock"
    linked: list[str] = []
    if d.action == "adopt":
        res = remote.run(S.verify_script(mp, wanted, in_place=True), sudo=True, timeout=_timeout(wanted.total_size))
        ok, bad = S.parse_verify(res.stdout)
        if res.rc == 0 and not bad and len(ok) == len(wanted.files):
            _commit(lease, job, wanted, out, options, now, move=False)
            out.result, out.reason = "adopted", "the host's files matched; manifest written"
            return
        linked = ok if wanted.kind == "dir" else []
        d = decide(wanted, probe, host, adopt=False, verified_in_place=linked)
        if d.action == "refuse":
            raise CheckFailed(d.reason)
    out.reason, out.bytes_resumed = d.reason, d.held_bytes
    res = remote.run(S.prepare_script(mp, wanted.kind, wanted.content_digest, reset=d.reset,
                                      link=tuple(f for f in linked if f in d.offsets), owner=lease.token),
                     sudo=True, timeout=120)
    if not S.parse_prepared(res.stdout):
        detail = (res.stderr.strip() or res.stdout.strip() or f"exit {res.rc}").splitlines()[-1][:200]
        raise RemoteError(f"host {host}: cannot prepare the staging copy of {mp}: {detail}")
    if seeder is not None:  # the source is chosen now: this machine, or a host that holds a verified copy
        origin = seeder.acquire(host)
        if origin is None:
            raise CheckFailed(f"host {host}: no holder of a verified copy of {mp} is left to send it (their copies "
                              "to other hosts failed); run it again, or name a source with --from")
        job = dataclasses.replace(job, origin=origin)
        out.source = origin.describe()
        if origin.kind == "host":
            assert connect is not None  # push_job passes its own
            src_host, via = seeder.hosts[origin.value], connect
            source_remote = lambda: via(src_host)  # noqa: E731
        else:
            source_remote = None
    key = f"{host}:{mp}"
    owner = lease.owner(M.owner_path(mp))
    reporter.begin(key, f"{host} {mp.rsplit('/', 1)[-1]}", wanted.total_size, wanted.total_size - d.send_bytes)
    t_send = time.monotonic()
    sent_before = out.bytes_sent
    src = None
    sent_ok = taken = False
    try:
        try:
            src = source_remote() if source_remote is not None else None
        except LlmfleetError as exc:
            if seeder is not None:
                raise SeedFailed(f"cannot reach {job.origin.describe()}: {str(exc).splitlines()[0]}") from None
            raise
        for f in wanted.files:
            off = d.offsets[f.path]
            if off >= f.size and f.size > 0:
                continue
            dest = S.staging_file(mp, wanted.kind, f.path)

            def advance(n: int) -> None:
                out.bytes_sent += n
                reporter.advance(key, n)

            if src is None:
                local = job.origin.value if wanted.kind == "file" else os.path.join(job.origin.value, f.path)
                transfer.send_file(remote, local, dest, offset=off, size=f.size, limit_rate=options.limit_rate,
                                   progress=advance, owner=owner)
            else:
                src_file = mp if wanted.kind == "file" else f"{mp}/{f.path}"
                addr, port = peer_address(job.host, job.settings)
                key_obj = remote.host_key()
                if key_obj is None:
                    raise RemoteError(f"host {host}: SSH connection is closed")
                peer = transfer.Peer(addr, port, remote.user, f"{key_obj.get_name()} {key_obj.get_base64()}")
                try:
                    transfer.send_between(src, remote, src_file, dest, offset=off, size=f.size, peer=peer,
                                          limit_rate=options.limit_rate, progress=advance, owner=owner)
                except transfer.StagingTaken:
                    raise
                except transfer.TransferError as exc:
                    if seeder is None:
                        raise
                    raise SeedFailed(f"the copy from {job.origin.describe()} failed: {str(exc).splitlines()[0]}") \
                        from None
        sent_ok = True
    except transfer.StagingTaken:
        taken = True  # not the source's fault: it may serve others
        raise
    finally:
        out.send_seconds += time.monotonic() - t_send
        by = job.origin.describe()
        out.bytes_by_source[by] = out.bytes_by_source.get(by, 0) + out.bytes_sent - sent_before
        if src is not None:
            src.close()
        reporter.end(key)
        if seeder is not None:
            seeder.sent(host, sent_ok or taken)
    _commit(lease, job, wanted, out, options, now, move=True)
    out.result = "pushed"


def _commit(lease: Lease, job: Job, wanted: M.Manifest, out: Outcome, options: Options,
            now: Callable[[], datetime], *, move: bool, result: str | None = None, verify: bool = True) -> None:
    """Put the staged copy in place (``move``) or adopt what is there, write the manifest, audit, and
    release the deploy lock, in one round trip. A moved copy is first checked to be still this push's
    (its owner stamp), then ``verify``-ed: each staged file's sha256 against ``wanted`` (False where
    ``wanted`` was just hashed from those very files on the host, as after a download)."""
    from llmfleet.release import store

    host, mp = job.host.name, job.model_path
    at = now().astimezone(UTC).isoformat(timespec="seconds")
    source = job.origin.record()
    if job.origin.kind == "host" and wanted.source:
        source["origin"] = dict(wanted.source)  # where the source host's copy came from
    final = wanted.verified(at=at, by=options.who, source=source)
    result = result or ("adopted" if not move else "pushed")
    record = _host_record(job, out, options, now, result=result,
                          detail=f"{mp}: {len(wanted.files)} file(s), {gib(wanted.total_size)}, from "
                                 f"{job.origin.describe()}; {out.bytes_sent:,} bytes sent")
    record["content"] = wanted.content_digest
    holder = store.lock_dir(job.settings.root) + "/holder.json"
    parts = [S.owner_check_script(mp, str(lease.token), holder)] if move and verify else []
    parts += [S.verify_script(mp, wanted)] if move and verify else []
    parts += [S.commit_script(mp, wanted.kind, move=move), store.audit_append_script(job.settings.root, record)]
    res = lease.last(["\n".join(parts)], [], stdin=final.to_json().encode(), timeout=_timeout(wanted.total_size))
    taken = S.parse_staging_taken(res.stdout)
    if taken is not None:
        raise transfer.StagingTaken(f"host {host}: the staging copy of {mp} was taken", owner=taken, host=host, path=mp)
    if S.parse_lock_lost(res.stdout):
        raise CheckFailed(f"host {host}: {mp}: the deploy lock was broken under this push (`invoke lock.release`) "
                          "before it could commit; nothing of this push was put in place; run it again: it resumes "
                          "from its staging copy")
    _ok, bad = S.parse_verify(res.stdout)
    if bad:
        rel, got = next(iter(bad.items()))
        raise CheckFailed(f"host {host}: {mp}: file {rel} arrived with sha256 {got[:16]}..., not {wanted.file(rel).sha256[:16]}... "  # type: ignore[union-attr]
                          "as sent; its staging copy was removed: run it again")
    if not S.parse_committed(res.stdout):
        detail = (res.stderr.strip() or res.stdout.strip() or f"exit {res.rc}").splitlines()[-1][:200]
        raise RemoteError(f"host {host}: cannot put {mp} in place: {detail}")
    out.verified_at = at


def _download(remote: Any, lease: Lease, job: Job, probe: S.PushProbe, out: Outcome, options: Options,
              reporter: Reporter, now: Callable[[], datetime]) -> None:
    """``model_source.hf``: the host downloads with the service's own image, hashes, commits (under the
    host's deploy lock)."""
    o = job.origin
    if _held_download(job, probe, out):  # found verified under the lock (another push just put it there)
        lease.last([], [])
        return
    kind = "file" if o.file else "dir"
    res = remote.run(S.hf_download_script(str(job.image), o.value, str(o.revision), job.model_path, kind, o.file),
                     sudo=True, timeout=DOWNLOAD_TIMEOUT_S)
    if res.rc != 0:
        detail = (res.stderr.strip() or res.stdout.strip() or f"exit {res.rc}").splitlines()[-1][:300]
        raise RemoteError(f"host {job.host.name}: download of {o.value}@{o.revision} failed: {detail}")
    res = remote.run(S.hash_script(job.model_path, kind), sudo=True, timeout=DOWNLOAD_TIMEOUT_S)
    files = S.parse_hashes(res.stdout)
    if res.rc != 0 or not files:
        raise RemoteError(f"host {job.host.name}: cannot hash the download of {o.value} in {M.part_path(job.model_path)}")
    wanted = M.Manifest(job.model_path, kind, tuple(M.FileEntry(r, s, h) for r, s, h in files), o.record())  # type: ignore[arg-type]
    out.bytes_total = wanted.total_size
    _commit(lease, job, wanted, out, options, now, move=True, result="downloaded", verify=False)
    out.result, out.reason = "downloaded", f"{o.value}@{o.revision} downloaded on the host"


def push(inv: Inventory, jobs: list[Job], *, config: Any, options: Options, reporter: Reporter | None = None,
         audit_log: str | None = None) -> list[Outcome]:
    """Push every job, ``options.forks`` hosts at once; one ``Outcome`` per job, in order. Wanted
    manifests first: local sources hashed here once, ``--from`` sources read from their host."""
    from llmfleet.host.group import run_on_hosts

    reporter = reporter or Quiet()
    wanted: dict[tuple[Origin, str], M.Manifest] = {}
    failed_before: dict[int, Outcome] = {}
    by_local: dict[str, M.Manifest] = {}
    for i, job in enumerate(jobs):
        o = job.origin
        if o.kind == "local":
            if o.value not in by_local:
                by_local[o.value] = local_manifest(o, job.model_path, reporter)
            wanted[(o, job.model_path)] = by_local[o.value].for_path(job.model_path)
        elif o.kind == "host" and (o, job.model_path) not in wanted:
            src_host = inv.hosts[o.value]
            try:
                with _connect(src_host, config, options) as r:
                    wanted[(o, job.model_path)] = source_manifest(r, job.model_path)
            except LlmfleetError as exc:
                failed_before[i] = Outcome(job.host.name, job.model_path, job.services, "failed", o.describe(),
                                           error=str(exc))
        if o.kind == "host" and (o, job.model_path) not in wanted:
            failed_before[i] = failed_before.get(i) or Outcome(
                job.host.name, job.model_path, job.services, "failed", o.describe(),
                error=f"host {o.value}: no verified copy of {job.model_path}")

    by_host: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        if i not in failed_before:
            by_host.setdefault(job.host.name, []).append(i)
    seeders = seed_groups(inv, jobs, [i for i in range(len(jobs)) if i not in failed_before], options)

    def one_host(name: str) -> list[tuple[int, Outcome]]:
        done = []
        for i in by_host[name]:
            job = jobs[i]
            src = None
            if job.origin.kind == "host" and i not in seeders:
                src_host = inv.hosts[job.origin.value]

                def src(h: Host = src_host) -> Any:
                    return _connect(h, config, options)
            o = push_job(job, wanted.get((job.origin, job.model_path)), config=config, options=options,
                         reporter=reporter, source_remote=src, seeder=seeders.get(i))
            reporter.log(line(o))
            done.append((i, o))
        return done

    results = run_on_hosts(one_host, list(by_host), forks=options.forks, thread_name="llmfleet-push")
    outcomes: dict[int, Outcome] = dict(failed_before)
    for r in results:
        if r.ok and r.value is not None:
            outcomes.update(dict(r.value))
        else:
            for i in by_host[r.host]:
                outcomes.setdefault(i, Outcome(jobs[i].host.name, jobs[i].model_path, jobs[i].services, "failed",
                                               jobs[i].origin.describe(), error=r.error))
    ordered = [outcomes[i] for i in range(len(jobs))]
    if audit_log:
        from llmfleet.release import audit

        audit.append_local(audit_log, [_local_record(o, options) for o in ordered])
    return ordered


def seed_groups(inv: Inventory, jobs: Sequence[Job], live: Sequence[int], options: Options) -> dict[int, Seeder]:
    """Job index -> the seeder of its model, for the jobs that copy through seeding: the jobs of one
    model (source and model_path) whose host other hosts can reach (``peer_address``: the rule of
    ``--from``), when ``seeding_on`` for their number. The other jobs copy from their own source."""
    groups: dict[tuple[Origin, str], list[int]] = {}
    for i in live:
        job = jobs[i]
        if job.origin.kind not in ("local", "host"):
            continue
        try:
            peer_address(job.host, job.settings)
        except UsageError:
            continue  # no host can reach it: it copies from its own source
        groups.setdefault((job.origin, job.model_path), []).append(i)
    out: dict[int, Seeder] = {}
    for (origin, _mp), idx in groups.items():
        if not seeding_on(options.seed, options.forks, len(idx)):
            continue
        seeder = Seeder(SeedPlan(CONTROLLER if origin.kind == "local" else origin.value), origin, inv.hosts)
        out.update(dict.fromkeys(idx, seeder))
    return out


def _local_record(o: Outcome, options: Options) -> dict[str, Any]:
    from llmfleet.release import store

    extra: dict[str, Any] = {"lock_wait_s": o.lock_wait_s} if o.lock_wait_s else {}
    return store.audit_record(now=datetime.now(UTC), who=options.who, host=o.host, action="models.push",
                              service=",".join(o.services), release=None, digest=None,
                              result="refused" if o.refused else o.result, detail=(o.error or o.reason)[:500],
                              model_path=o.model_path, bytes_sent=o.bytes_sent, **extra)


def line(o: Outcome) -> str:
    """One line per outcome, for people."""
    if o.result == "failed":
        return f"FAILED {o.error}"
    rate = f" at {o.rate / 2**20:.1f} MiB/s" if o.rate else ""
    resumed = f", {gib(o.bytes_resumed)} resumed" if o.bytes_resumed else ""
    waited = (f"; waited {o.lock_wait_s:.0f} s for the deploy lock, {o.lock_waited_for}" if o.lock_wait_s else "")
    if o.result == "verified":
        return f"{o.host}: {o.model_path}: already {o.reason} (nothing sent){waited}"
    return (f"{o.host}: {o.model_path}: {o.result} ({gib(o.bytes_sent)} sent{rate}{resumed}, "
            f"from {o.source}), verified {o.verified_at}{waited}")


_RATE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30}


def parse_rate(text: str | None) -> int | None:
    """``--limit-rate``: bytes per second, with an optional unit (``50M`` = 50 MB/s, ``1Gi``, ``500k``,
    ``/s`` allowed); None or empty: no limit. Raises ``UsageError``."""
    if text is None or str(text).strip() == "":
        return None
    import re

    raw = str(text).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)(?:/s)?", raw)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _RATE_UNITS:
        raise UsageError(f"--limit-rate: {raw!r} is not a rate; give bytes per second, e.g. 50M (50 MB/s), "
                         "100Mi, 1G or 500000")
    value = int(float(m.group(1)) * _RATE_UNITS[unit])
    if value < 1024:
        raise UsageError(f"--limit-rate: {raw!r} is below 1 KiB/s")
    return value
