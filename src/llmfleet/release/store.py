"""Releases on a host and the exact remote commands that create, switch, prune and lock them.

Layout on the host (``root`` defaults to /opt/llmfleet)::

    <root>/services/<svc>/releases/<id>/{compose.yml, llmfleet-<svc>.service, service.env, manifest.json}
    <root>/services/<svc>/releases/<id>/health.json      written when the release passed its health check
    <root>/services/<svc>/current -> releases/<id>       switched atomically (ln -s, then mv -T)
    <root>/locks/deploy/holder.json                      the host's deploy lock (atomic mkdir)
    <root>/audit.jsonl                                   one JSON line per deploy, rollback, lock break

Pure: every function returns data or a POSIX sh script in which each value is ``shlex.quote``-d.
The shell that runs them (llmfleet.release.deploy) does the I/O. Scripts print ``@@`` markers that the
``parse_*`` functions read back, so one round trip answers one question.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import tarfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from llmfleet.release.render import MANIFEST_FILE, UNIT_DIR, Rendered, project_name, unit_name

RELEASE_ID_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{10}$")
DEFAULT_KEEP = 5
LOCK_HELD_RC = 3
DOCKER = "docker"
q = shlex.quote


def _check_id(release_id: str) -> str:
    if not RELEASE_ID_RE.match(release_id):
        raise ValueError(f"not a release id: {release_id!r}")
    return release_id


def new_release_id(content_hash: str, now: datetime) -> str:
    """Sortable by time; the hash part tells identical content apart at a glance."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return f"{now.astimezone(UTC):%Y%m%dT%H%M%SZ}-{content_hash[:10]}"


def release_time(release_id: str) -> datetime:
    return datetime.strptime(release_id.split("-", 1)[0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


@dataclass(frozen=True)
class Paths:
    root: str
    service: str

    @property
    def service_dir(self) -> str:
        return f"{self.root.rstrip('/')}/services/{self.service}"

    @property
    def releases(self) -> str:
        return f"{self.service_dir}/releases"

    def release(self, release_id: str) -> str:
        return f"{self.releases}/{_check_id(release_id)}"

    @property
    def current(self) -> str:
        return f"{self.service_dir}/current"

    @property
    def unit(self) -> str:
        return unit_name(self.service)

    @property
    def unit_path(self) -> str:
        return f"{UNIT_DIR}/{self.unit}"

    @property
    def container(self) -> str:
        return project_name(self.service)


def lock_dir(root: str) -> str:
    return f"{root.rstrip('/')}/locks/deploy"


def audit_path(root: str) -> str:
    return f"{root.rstrip('/')}/audit.jsonl"


# ---------------------------------------------------------------------------------------------
# Manifest and upload


def build_manifest(
    rendered: Rendered,
    release_id: str,
    *,
    host: str,
    who: str,
    when: datetime,
    llmfleet_version: str,
) -> dict[str, Any]:
    """What the release is and where it came from. Secret values never appear; the env file's
    hash is left out too (a short key could be guessed from it)."""
    import hashlib

    file_hashes = {
        name: hashlib.sha256(text.encode()).hexdigest()
        for name, text in sorted(rendered.files.items())
        if name not in rendered.secret_files
    }
    return {
        "release": release_id,
        "service": rendered.service,
        "engine": rendered.engine,
        "host": host,
        "who": who,
        "time": when.astimezone(UTC).isoformat(timespec="seconds"),
        "content_hash": rendered.content_hash,
        "image": rendered.image.to_dict(),
        "engine_args": list(rendered.engine_args),
        "inputs": rendered.inputs,
        "plan": rendered.plan,
        "files": file_hashes,
        "llmfleet": llmfleet_version,
    }


def manifest_text(manifest: dict[str, Any]) -> str:
    """One line of JSON, so that the state probe can return many manifests line by line."""
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")) + "\n"


def release_files(rendered: Rendered, manifest: dict[str, Any]) -> tuple[dict[str, str], dict[str, int]]:
    """The rendered files plus the manifest, with their modes: what goes into ``releases/<id>/``."""
    files = dict(rendered.files)
    modes = dict(rendered.modes)
    files[MANIFEST_FILE] = manifest_text(manifest)
    modes[MANIFEST_FILE] = 0o644
    return files, modes


def pack_release(files: dict[str, str], modes: dict[str, int]) -> bytes:
    """A tar of the release's files (root-owned, given modes, fixed mtime): bytes for one upload."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            data = files[name].encode()
            info = tarfile.TarInfo(name=name)
            info.size = len(data)
            info.mode = modes.get(name, 0o644)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def upload_script(paths: Paths, release_id: str) -> str:
    """Read a tar on stdin into ``releases/.tmp-<id>``, then rename it into place (a half-written
    release is never visible under its id). An existing release with this id is kept as it is."""
    final = paths.release(release_id)
    tmp = f"{paths.releases}/.tmp-{release_id}"
    return "\n".join([
        "set -e",
        "umask 022",
        f"mkdir -p {q(paths.releases)}",
        f"if [ -d {q(final)} ]; then cat >/dev/null; echo '@@exists'; exit 0; fi",
        f"rm -rf -- {q(tmp)}",
        f"mkdir -m 0750 {q(tmp)}",
        f"tar -x --no-same-owner -f - -C {q(tmp)}",
        f"chmod 0600 {q(tmp)}/service.env",
        f"mv -T {q(tmp)} {q(final)}",
        "echo '@@uploaded'",
    ])


# ---------------------------------------------------------------------------------------------
# Image pull and verification


def pull_script(ref: str) -> str:
    """Pull unless present, then print the repo digests the engine knows for it."""
    fmt = "{{range .RepoDigests}}{{println .}}{{end}}"
    return "\n".join([
        f"if ! {DOCKER} image inspect {q(ref)} >/dev/null 2>&1; then",
        f"  {DOCKER} pull --quiet {q(ref)} >/dev/null || exit 4",
        "  echo '@@pulled'",
        "fi",
        "echo '@@digests'",
        f"{DOCKER} image inspect --format {q(fmt)} {q(ref)}",
    ])


def parse_pull(stdout: str) -> tuple[bool, list[str]]:
    """(pulled now?, repo digests) from ``pull_script`` output."""
    pulled = "@@pulled" in stdout
    digests: list[str] = []
    if "@@digests" in stdout:
        tail = stdout.split("@@digests", 1)[1]
        digests = [ln.strip() for ln in tail.splitlines() if "@sha256:" in ln]
    return pulled, digests


def digest_verified(repo_digests: list[str], digest: str | None) -> bool:
    if digest is None:
        return False
    return any(d.rsplit("@", 1)[-1] == digest for d in repo_digests)


# ---------------------------------------------------------------------------------------------
# Switch, restart, stop, rollback


def switch_script(paths: Paths, release_id: str, *, restart: bool = True) -> str:
    """Point ``current`` at the release atomically, install its unit, reload systemd, restart.

    ``systemctl restart`` stops the old container (freeing its GPU memory) before the new one starts.
    """
    rel = f"releases/{_check_id(release_id)}"
    lines = [
        "set -e",
        f"cd {q(paths.service_dir)}",
        f"test -f {q(rel + '/compose.yml')}",
        f"ln -sfn {q(rel)} .current.tmp",
        "mv -T .current.tmp current",
        f"install -m 0644 {q(rel + '/' + paths.unit)} {q(paths.unit_path)}",
        "systemctl daemon-reload",
        f"systemctl reset-failed {q(paths.unit)} >/dev/null 2>&1 || true",
        f"systemctl enable {q(paths.unit)} >/dev/null 2>&1 || true",
    ]
    if restart:
        lines.append(f"systemctl restart {q(paths.unit)}")
    lines.append("echo '@@switched'")
    return "\n".join(lines)


def stop_script(paths: Paths, *, forget_current: bool = False) -> str:
    """Stop the unit (a failed first deploy with nothing to go back to)."""
    lines = [f"systemctl stop {q(paths.unit)} || true", f"systemctl disable {q(paths.unit)} >/dev/null 2>&1 || true"]
    if forget_current:
        lines.append(f"rm -f -- {q(paths.current)}")
    lines.append("echo '@@stopped'")
    return "\n".join(lines)


def restart_script(paths: Paths) -> str:
    return "\n".join([
        f"systemctl reset-failed {q(paths.unit)} >/dev/null 2>&1 || true",
        f"systemctl restart {q(paths.unit)}",
        "echo '@@restarted'",
    ])


def logs_script(paths: Paths, lines: int = 40) -> str:
    """The engine's last lines: the unit's journal, else the container's own log."""
    n = int(lines)
    return "\n".join([
        f"out=$(journalctl -u {q(paths.unit)} -n {n} --no-pager -o cat 2>/dev/null || true)",
        'if [ -n "$out" ]; then printf \'%s\\n\' "$out";',
        f"else {DOCKER} logs --tail {n} {q(paths.container)} 2>&1 || true; fi",
    ])


def mark_healthy_script(paths: Paths, release_id: str, health: dict[str, Any]) -> str:
    text = json.dumps(health, sort_keys=True, separators=(",", ":"))
    return f"printf '%s\\n' {q(text)} > {q(paths.release(release_id) + '/health.json')} && echo '@@marked'"


# ---------------------------------------------------------------------------------------------
# State of a host's releases (one round trip for every service)


@dataclass
class ReleaseInfo:
    id: str
    manifest: dict[str, Any] | None = None
    health: dict[str, Any] | None = None

    @property
    def healthy(self) -> bool:
        return bool(self.health and self.health.get("result") == "healthy")

    @property
    def image_ref(self) -> str | None:
        if not self.manifest:
            return None
        return (self.manifest.get("image") or {}).get("ref")


@dataclass
class ServiceState:
    name: str
    current: str | None = None
    unit: str = "unknown"
    releases: dict[str, ReleaseInfo] = field(default_factory=dict)

    @property
    def current_release(self) -> ReleaseInfo | None:
        return self.releases.get(self.current) if self.current else None


def state_script(root: str) -> str:
    base = f"{root.rstrip('/')}/services"
    return "\n".join([
        f"[ -d {q(base)} ] || {{ echo '@@none'; exit 0; }}",
        f"for s in {q(base)}/*/; do",
        '  [ -d "$s" ] || continue',
        '  name=$(basename "$s")',
        '  echo "@@service $name"',
        '  echo "@@current $(readlink "$s/current" 2>/dev/null)"',
        '  echo "@@unit $(systemctl is-active "llmfleet-$name.service" 2>/dev/null)"',
        '  for d in "$s"releases/*/; do',
        '    [ -d "$d" ] || continue',
        '    echo "@@release $(basename "$d")"',
        '    if [ -f "$d/manifest.json" ]; then echo "@@manifest $(head -c 200000 "$d/manifest.json" | tr -d "\\n")"; fi',
        '    if [ -f "$d/health.json" ]; then echo "@@health $(head -c 20000 "$d/health.json" | tr -d "\\n")"; fi',
        "  done",
        "done",
        "echo '@@end'",
    ])


def _loads(text: str) -> dict[str, Any] | None:
    try:
        v = json.loads(text)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def parse_state(stdout: str) -> dict[str, ServiceState]:
    services: dict[str, ServiceState] = {}
    cur: ServiceState | None = None
    rel: ReleaseInfo | None = None
    for line in stdout.splitlines():
        if line.startswith("@@service "):
            cur = services.setdefault(line[10:].strip(), ServiceState(name=line[10:].strip()))
            rel = None
        elif cur is None:
            continue
        elif line.startswith("@@current"):
            target = line[9:].strip()
            cur.current = target.rstrip("/").rsplit("/", 1)[-1] if target else None
        elif line.startswith("@@unit"):
            cur.unit = line[6:].strip() or "unknown"
        elif line.startswith("@@release "):
            rid = line[10:].strip()
            if RELEASE_ID_RE.match(rid):
                rel = cur.releases.setdefault(rid, ReleaseInfo(id=rid))
            else:
                rel = None
        elif line.startswith("@@manifest ") and rel is not None:
            rel.manifest = _loads(line[11:])
        elif line.startswith("@@health ") and rel is not None:
            rel.health = _loads(line[9:])
    return services


def find_release_with_content(state: ServiceState | None, content_hash: str) -> str | None:
    """An existing release holding exactly this content (the newest, if several)."""
    if state is None:
        return None
    for rid in sorted(state.releases, reverse=True):
        m = state.releases[rid].manifest
        if m and m.get("content_hash") == content_hash:
            return rid
    return None


def rollback_target(state: ServiceState, *, exclude: str | None = None) -> str | None:
    """The newest healthy release older than the current one (or than ``exclude``)."""
    pivot = exclude or state.current
    candidates = [
        rid for rid, r in state.releases.items()
        if r.healthy and rid != pivot and (pivot is None or rid < pivot)
    ]
    if not candidates:
        candidates = [rid for rid, r in state.releases.items() if r.healthy and rid != pivot]
    return max(candidates) if candidates else None


# ---------------------------------------------------------------------------------------------
# Pruning


def releases_to_prune(
    release_ids: list[str], *, keep: int = DEFAULT_KEEP, protect: set[str] | None = None
) -> list[str]:
    """Everything but the newest ``keep`` releases and the protected ones (current, rollback target)."""
    protect = {p for p in (protect or set()) if p}
    ordered = sorted(release_ids, reverse=True)
    kept = set(ordered[:keep]) | protect
    return sorted(r for r in ordered if r not in kept)


def images_to_prune(states: dict[str, ServiceState], deleted: dict[str, list[str]]) -> list[str]:
    """Image refs used only by releases being deleted, across every service on the host."""
    doomed: set[str] = set()
    in_use: set[str] = set()
    for name, st in states.items():
        gone = set(deleted.get(name, []))
        for rid, info in st.releases.items():
            ref = info.image_ref
            if not ref:
                continue
            (doomed if rid in gone else in_use).add(ref)
    return sorted(doomed - in_use)


def prune_script(paths: Paths, release_ids: list[str], image_refs: list[str]) -> str:
    lines = [f"cd {q(paths.releases)} || exit 0", "rm -rf -- .tmp-*"]
    for rid in release_ids:
        lines.append(f"rm -rf -- {q(_check_id(rid))}")
    for ref in image_refs:
        lines.append(f"{DOCKER} image rm {q(ref)} >/dev/null 2>&1 && echo {q('@@image-removed ' + ref)} || true")
    lines.append("echo '@@pruned'")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The deploy lock: atomic mkdir plus a holder document


@dataclass(frozen=True)
class LockOutcome:
    acquired: bool
    holder: dict[str, Any] | None
    raw: str = ""


def holder_document(*, token: str, who: str, origin: str, action: str, message: str, now: datetime,
                    pid: int | None = None) -> dict[str, Any]:
    return {
        "token": token,
        "who": who,
        "from": origin,
        "pid": pid,
        "action": action,
        "message": message,
        "time": now.astimezone(UTC).isoformat(timespec="seconds"),
    }


def lock_acquire_script(root: str, holder: dict[str, Any]) -> str:
    d = lock_dir(root)
    text = json.dumps(holder, sort_keys=True, separators=(",", ":"))
    return "\n".join([
        f"mkdir -p {q(root.rstrip('/') + '/locks')} || exit 2",
        f"if mkdir {q(d)} 2>/dev/null; then",
        f"  printf '%s\\n' {q(text)} > {q(d + '/holder.json')} && echo '@@acquired'",
        "else",
        "  echo '@@held'",
        f"  head -c 4096 {q(d + '/holder.json')} 2>/dev/null",
        f"  exit {LOCK_HELD_RC}",
        "fi",
    ])


def parse_lock_acquire(rc: int, stdout: str) -> LockOutcome:
    if rc == 0 and "@@acquired" in stdout:
        return LockOutcome(True, None, stdout)
    holder = None
    if "@@held" in stdout:
        tail = stdout.split("@@held", 1)[1].strip()
        holder = _loads(tail.splitlines()[0]) if tail else None
        if holder is None:
            holder = {"note": "lock directory exists without a readable holder (a deploy died while taking it)"}
    return LockOutcome(False, holder, stdout)


def lock_release_script(root: str, token: str) -> str:
    d = lock_dir(root)
    holder = q(d + "/holder.json")
    return "\n".join([
        f"if [ ! -d {q(d)} ]; then echo '@@notheld'; exit 0; fi",
        f"if grep -qF {q(token)} {holder} 2>/dev/null; then",
        f"  rm -f -- {holder} && rmdir -- {q(d)} && echo '@@released'",
        "else",
        f"  echo '@@notours'; head -c 4096 {holder} 2>/dev/null; exit {LOCK_HELD_RC}",
        "fi",
    ])


def lock_status_script(root: str) -> str:
    d = lock_dir(root)
    return "\n".join([
        f"if [ -d {q(d)} ]; then echo '@@held'; head -c 4096 {q(d + '/holder.json')} 2>/dev/null; echo;",
        "else echo '@@free'; fi",
    ])


def parse_lock_status(stdout: str) -> tuple[bool, dict[str, Any] | None]:
    if "@@held" not in stdout:
        return False, None
    return True, parse_lock_acquire(LOCK_HELD_RC, stdout).holder


def lock_break_script(root: str) -> str:
    d = lock_dir(root)
    return "\n".join([
        f"if [ -d {q(d)} ]; then echo '@@held'; head -c 4096 {q(d + '/holder.json')} 2>/dev/null; echo;",
        f"  rm -rf -- {q(d)} && echo '@@broken'; else echo '@@free'; fi",
    ])


def describe_holder(holder: dict[str, Any] | None, now: datetime | None = None) -> str:
    if not holder:
        return "unknown holder"
    if "note" in holder and "who" not in holder:
        return holder["note"]
    age = ""
    if now is not None and holder.get("time"):
        try:
            t = datetime.fromisoformat(str(holder["time"]))
            secs = int((now - t).total_seconds())
            age = f" ({secs // 60} min {secs % 60} s ago)" if secs >= 0 else ""
        except ValueError:
            age = ""
    msg = holder.get("message") or ""
    return (
        f"held by {holder.get('who', '?')} from {holder.get('from', '?')} since {holder.get('time', '?')}{age}"
        f" for {holder.get('action', '?')}" + (f": {msg}" if msg else "")
    )


# ---------------------------------------------------------------------------------------------
# Audit


def audit_record(*, now: datetime, who: str, host: str, action: str, service: str | None, release: str | None,
                 digest: str | None, result: str, detail: str = "", **extra: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "time": now.astimezone(UTC).isoformat(timespec="seconds"),
        "who": who,
        "host": host,
        "action": action,
        "service": service,
        "release": release,
        "image_digest": digest,
        "result": result,
    }
    if detail:
        rec["detail"] = detail[:500]
    rec.update(extra)
    return rec


def audit_append_script(root: str, record: dict[str, Any]) -> str:
    line = json.dumps(record, sort_keys=False, separators=(",", ":"))
    return "\n".join([
        f"mkdir -p {q(root)}",
        f"printf '%s\\n' {q(line)} >> {q(audit_path(root))}",
        f"chmod 0640 {q(audit_path(root))} 2>/dev/null || true",
    ])


# ---------------------------------------------------------------------------------------------
# Benchmark results kept with a release (``invoke bench``)

BENCH_FILE = "bench.json"


def bench_write_script(paths: Paths, release_id: str, doc: dict[str, Any]) -> str:
    """Write ``releases/<id>/bench.json`` (one line of JSON; the latest bench of that release)."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    target = paths.release(release_id) + "/" + BENCH_FILE
    return "\n".join([
        f"test -d {q(paths.release(release_id))} || {{ echo '@@norelease'; exit 3; }}",
        f"printf '%s\\n' {q(text)} > {q(target + '.tmp')} && mv -f {q(target + '.tmp')} {q(target)}"
        " && echo '@@benchsaved'",
    ])


def bench_read_script(paths: Paths, release_ids: list[str] | None = None) -> str:
    """Print ``@@bench <id> <json>`` for each release (all kept releases when none are named)."""
    if release_ids is None:
        loop = f"for d in {q(paths.releases)}/*/; do"
    else:
        loop = "for d in " + " ".join(q(paths.release(r) + "/") for r in release_ids) + "; do"
    return "\n".join([
        loop,
        '  [ -f "$d/bench.json" ] || continue',
        '  echo "@@bench $(basename "$d") $(head -c 2000000 "$d/bench.json" | tr -d "\\n")"',
        "done",
        "echo '@@end'",
    ])


def parse_bench(stdout: str) -> dict[str, dict[str, Any]]:
    """``bench_read_script`` output -> {release id: document}; unreadable lines are skipped."""
    out: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        if not line.startswith("@@bench "):
            continue
        rid, _, text = line[8:].partition(" ")
        doc = _loads(text)
        if RELEASE_ID_RE.match(rid) and doc is not None:
            out[rid] = doc
    return out
