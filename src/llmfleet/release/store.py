"""Releases on a host: their layout, the state model, and every remote script that reads or changes
them, each beside the parser of its output (a "fact" in pyinfra's sense: command + parse).

Layout on the host (``root`` defaults to /opt/llmfleet)::

    <root>/services/<svc>/releases/<id>/{compose.yml, llmfleet-<svc>.service, service.env, manifest.json}
    <root>/services/<svc>/releases/<id>/health.json      written when the release passed its health check
    <root>/services/<svc>/current -> releases/<id>       switched atomically (ln -s, then mv -T)
    <root>/locks/deploy/holder.json                      the host's deploy lock (atomic mkdir)
    <root>/audit.jsonl                                   one JSON line per deploy, rollback, lock break

Pure: every builder returns a POSIX sh script in which each value is ``shlex.quote``-d; the shell
that runs them (``llmfleet.release.deploy``) does the I/O. Scripts print ``@@`` markers that only the
``parse_*`` function next to the builder reads. tests/golden/scripts/ holds the exact text of each.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shlex
import tarfile
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llmfleet.host.probe.state_reader import MANIFEST_FILE, MAX_HEALTH, MAX_MANIFEST, STATE_READER  # noqa: F401 - re-exported
from llmfleet.knowledge.release_state import RELEASE_ID_RE, Manifest, UnitProbe, loads_object
from llmfleet.release.gateway_config import CONFIG_FILE as GATEWAY_CONFIG
from llmfleet.release.render import (
    COMPOSE_FILE,
    ENV_FILE,
    UNIT_DIR,
    Rendered,
    project_name,
    unit_name,
)

DEFAULT_KEEP = 5
LOCK_HELD_RC = 3
DOCKER = "docker"
MAX_HOLDER = 4096  # bytes of the lock's holder.json
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
# State of a host's releases: the reader, also run inside the host probe (its model and parser:
# llmfleet.knowledge.release_state)


def state_script(root: str) -> str:
    """Every service's current release, unit state and kept releases with manifest and health."""
    return f"{STATE_READER}\nllmfleet_release_state {q(root.rstrip('/') or '/')}"




# ---------------------------------------------------------------------------------------------
# Several steps in one round trip


def chain_script(steps: list[str], *, stdin_step: int | None = None) -> str:
    """The steps one after the other in one script, each in its own subshell, framed by
    ``@@step N`` and ``@@step-rc N RC`` lines; the first step whose exit status is not 0 stops the
    rest (the script exits with it). Only step ``stdin_step`` reads the caller's stdin (an upload's
    tar); the others read /dev/null. ``split_chain`` gives each step's exit status and output back,
    for the step's own parser."""
    lines: list[str] = []
    for i, sc in enumerate(steps):
        lines += [
            f"echo '@@step {i}'",
            f"(\n{sc}\n)" + ("" if i == stdin_step else " </dev/null"),
            "rc=$?",
            f"printf '\\n@@step-rc {i} %s\\n' \"$rc\"",
            'if [ "$rc" != 0 ]; then exit "$rc"; fi',
        ]
    return "\n".join(lines)


def split_chain(stdout: str, n: int) -> list[tuple[int | None, str] | None]:
    """``chain_script``'s output -> per step (exit status, output), or None for a step that did not
    run; a step that started but has no exit status line (the connection or the time ran out) has
    status None."""
    out: list[tuple[int | None, str] | None] = [None] * n
    pos = 0
    for i in range(n):
        begin = f"@@step {i}\n"
        # the first step's line may follow stray output (a login script's); each next one follows
        # the step before's status line at once
        start = (stdout.find(begin) if i == 0 else pos if stdout.startswith(begin, pos) else -1)
        if start < 0 or (start > 0 and stdout[start - 1] != "\n"):
            break
        body_start = start + len(begin)
        m = re.compile(rf"\n@@step-rc {i} (\d+)\n").search(stdout, body_start)
        if m is None:
            out[i] = (None, stdout[body_start:])
            break
        out[i] = (int(m.group(1)), stdout[body_start:m.start()])
        pos = m.end()
    return out


# ---------------------------------------------------------------------------------------------
# Upload


def release_files(rendered: Rendered, manifest: Manifest) -> tuple[dict[str, str], dict[str, int]]:
    """The rendered files plus the manifest, with their modes: what goes into ``releases/<id>/``."""
    files = dict(rendered.files)
    modes = dict(rendered.modes)
    files[MANIFEST_FILE] = manifest.to_text()
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
    release is never visible under its id). An existing release with this id is kept as it is.

    Runs under the deploy lock: leftovers of uploads cut short (a dropped connection) are removed
    first, and a failed extraction (a full disk) removes its own half-written folder."""
    final = paths.release(release_id)
    tmp = f"{paths.releases}/.tmp-{release_id}"
    return "\n".join([
        "set -e",
        "umask 022",
        f"mkdir -p {q(paths.releases)}",
        f"if [ -d {q(final)} ]; then cat >/dev/null; echo '@@exists'; exit 0; fi",
        f"rm -rf -- {q(paths.releases)}/.tmp-*",
        f"trap {q('rm -rf -- ' + q(tmp))} EXIT",
        f"mkdir -m 0750 {q(tmp)}",
        f"tar -x --no-same-owner -f - -C {q(tmp)}",
        f"chmod 0600 {q(tmp)}/{ENV_FILE}",
        f"mv -T {q(tmp)} {q(final)}",
        "echo '@@uploaded'",
    ])


def parse_upload(rc: int, stdout: str) -> bool:
    """The release is in place (uploaded now, or there already)."""
    return rc == 0 and any(ln in ("@@uploaded", "@@exists") for ln in stdout.splitlines())


# ---------------------------------------------------------------------------------------------
# Image pull and verification


def pull_script(ref: str, *, loaded: bool = False) -> str:
    """Pull unless present, then print the repo digests the engine knows for it. ``loaded``: an image
    from a bundle (deploy --bundle): never pulled; ``loaded_image_script`` instead."""
    if loaded:
        return loaded_image_script(ref)
    fmt = "{{range .RepoDigests}}{{println .}}{{end}}"
    return "\n".join([  # one `docker image inspect` when the image is there (the usual case)
        f"if ! digests=$({DOCKER} image inspect --format {q(fmt)} {q(ref)} 2>/dev/null); then",
        f"  {DOCKER} pull --quiet {q(ref)} >/dev/null || exit 4",
        "  echo '@@pulled'",
        f"  digests=$({DOCKER} image inspect --format {q(fmt)} {q(ref)})",
        "fi",
        "echo '@@digests'",
        "printf '%s\\n' \"$digests\"",
    ])


def parse_pull(stdout: str) -> tuple[bool, list[str]]:
    """(pulled now?, repo digests) from ``pull_script`` output."""
    lines = stdout.splitlines()
    pulled = "@@pulled" in lines
    digests: list[str] = []
    if "@@digests" in lines:
        tail = lines[lines.index("@@digests") + 1:]
        digests = [ln.strip() for ln in tail if "@sha256:" in ln]
    return pulled, digests


def digest_verified(repo_digests: list[str], digest: str | None) -> bool:
    if digest is None:
        return False
    return any(d.rsplit("@", 1)[-1] == digest for d in repo_digests)


def loaded_image_script(ref: str) -> str:
    """A bundle's image, named by its local tag: never pulled (a classic image store records no repo
    digest for a loaded image): print the image ID the engine has under ``ref``, exit 4 if none."""
    fmt = "{{.Id}}"
    return "\n".join([
        f"if ! id=$({DOCKER} image inspect --format {q(fmt)} {q(ref)} 2>/dev/null); then",
        "  echo '@@absent'",
        "  exit 4",
        "fi",
        'echo "@@id $id"',
    ])


def loaded_problem(rc: int, stdout: str, ref: str, image_id: str) -> str | None:
    """Why a bundle's image may not run (``loaded_image_script``'s answer), or None when the engine
    holds ``ref`` with exactly ``image_id``."""
    lines = stdout.splitlines()
    if rc != 0 or "@@absent" in lines:
        return f"{ref} is not on the host; `invoke deploy --bundle DIR` loads it from the bundle"
    got = next((ln.split(" ", 1)[1].strip() for ln in lines if ln.startswith("@@id ")), None)
    if got != image_id:
        return f"{ref} has image ID {got or '?'} on the host, not {image_id} from the bundle; refusing to run it"
    return None


def image_present_script(ref: str) -> str:
    return f"docker image inspect {q(ref)} >/dev/null 2>&1 && echo '@@present' || echo '@@absent'"


def parse_image_present(stdout: str) -> bool:
    return "@@present" in stdout.splitlines()


# ---------------------------------------------------------------------------------------------
# Switch, stop, engine log, health mark


def switch_script(paths: Paths, release_id: str) -> str:
    """Point ``current`` at the release atomically, install its unit, reload systemd, restart.

    ``systemctl restart`` stops the old container (freeing its GPU memory) before the new one starts.
    Most releases of a service share one unit file (the flags are in the compose file): systemd is
    reloaded (a second or more on a busy host) only when the installed file differs or systemd says it
    needs it; ``enable --no-reload`` adds no reload of its own.
    """
    rel = f"releases/{_check_id(release_id)}"
    return "\n".join([
        "set -e",
        f"cd {q(paths.service_dir)}",
        f"test -f {q(rel + '/' + COMPOSE_FILE)}",
        f"ln -sfn {q(rel)} .current.tmp",
        "mv -T .current.tmp current",
        f"if ! cmp -s {q(rel + '/' + paths.unit)} {q(paths.unit_path)} || "
        f"[ -n \"$(systemctl show -p NeedDaemonReload --value {q(paths.unit)} 2>/dev/null | grep -vx no)\" ]; then",
        f"  install -m 0644 {q(rel + '/' + paths.unit)} {q(paths.unit_path)}",
        "  systemctl daemon-reload",
        "fi",
        f"systemctl reset-failed {q(paths.unit)} >/dev/null 2>&1 || true",
        f"systemctl enable --no-reload {q(paths.unit)} >/dev/null 2>&1 || true",
        f"systemctl restart {q(paths.unit)}",
        "echo '@@switched'",
    ])


def gateway_switch_script(paths: Paths, release_id: str, container: str) -> str:
    """The gateway's switch: where its container and unit stay the same (compose file, env file, unit
    file: the same image, arguments and replica keys) and it runs, a graceful reload instead of a
    restart: the new configuration checked by the running HAProxy first (``haproxy -c``; a bad one
    puts ``current`` back and fails the switch), then SIGUSR2 to its master, whose new workers take new
    connections while the old ones finish their streams. Otherwise (first release, a new image, keys
    or unit, a stopped gateway) the usual switch and restart (``switch_script``). Prints ``@@reloaded``
    or ``@@restarted`` before ``@@switched``.

    A restart of a running gateway hands over: first a HAProxy of the running image and release (its
    container's image, flags, capabilities and environment) starts beside it in the host's network, on the same
    ports (HAProxy binds them with SO_REUSEPORT); the unit's restart then soft-stops the old container
    (its open streams finish within its stop grace) while the handover takes new connections; once the
    new container has loaded, the handover soft-stops too and goes away when its own streams end.
    ``@@handover`` says it took part; a handover that does not load in 10 s is removed and the restart
    goes on without it."""
    rel = f"releases/{_check_id(release_id)}"
    same = " && ".join(f"cmp -s \"$old/{name}\" {q(rel + '/' + name)}" for name in (COMPOSE_FILE, ENV_FILE, paths.unit))
    restart = switch_script(paths, release_id).splitlines()[2:-1]  # after `set -e` and `cd`, before the marker
    return "\n".join([
        "set -e",
        f"cd {q(paths.service_dir)}",
        f"test -f {q(rel + '/' + COMPOSE_FILE)}",
        "old=$(readlink current 2>/dev/null || true)",
        f"if [ -n \"$old\" ] && [ -d \"$old\" ] && {same} && cmp -s {q(rel + '/' + paths.unit)} {q(paths.unit_path)} "
        f"&& systemctl is-active --quiet {q(paths.unit)} "
        f"&& [ \"$(docker inspect -f '{{{{.State.Running}}}}' {q(container)} 2>/dev/null)\" = true ]; then",
        f"  ln -sfn {q(rel)} .current.tmp",
        "  mv -T .current.tmp current",
        f"  if ! docker exec {q(container)} haproxy -c -q -f {q(paths.service_dir + '/current/' + GATEWAY_CONFIG)} >&2; then",
        "    ln -sfn \"$old\" .current.tmp && mv -T .current.tmp current",
        "    echo 'the new configuration does not load (haproxy -c above); current is back where it was' >&2",
        "    exit 1",
        "  fi",
        f"  docker kill -s USR2 {q(container)} >/dev/null",
        "  echo '@@reloaded'",
        "else",
        *(f"  {line}" for line in _handover_start_lines(paths, container)),
        *(f"  {line}" for line in restart),
        *(f"  {line}" for line in _handover_end_lines(container)),
        "  echo '@@restarted'",
        "fi",
        "echo '@@switched'",
    ])


HANDOVER_LOAD_POLLS = 50  # x 0.2 s: how long a handover (or the new gateway) may take to load
GATEWAY_LOADED = "Loading success"  # what HAProxy's master logs once its workers run


def _handover_start_lines(paths: Paths, container: str) -> list[str]:
    """Before a running gateway restarts: a HAProxy of its image and release beside it (gateway_switch_script)."""
    hand = q(container + "-handover")
    c = q(container)
    cfg = q(paths.service_dir + "/current/" + GATEWAY_CONFIG)
    sdir = q(paths.service_dir)
    return [
        "handover=",
        f"if [ -n \"$old\" ] && [ \"$(docker inspect -f '{{{{.State.Running}}}}' {c} 2>/dev/null)\" = true ]; then",
        f"  docker rm -f {hand} >/dev/null 2>&1 || true",
        f"  img=$(docker inspect -f '{{{{.Image}}}}' {c})",
        f"  caps=$(docker inspect -f '{{{{range .HostConfig.CapAdd}}}} --cap-add={{{{.}}}}{{{{end}}}}' {c})",
        # its environment (the replicas' keys) from the running container, through a pipe: never in argv or a file
        f"  if docker inspect -f '{{{{range .Config.Env}}}}{{{{println .}}}}{{{{end}}}}' {c} | "
        f"docker run -d --rm --name {hand} --network host --user 0:0 --cap-drop ALL $caps "
        f"--security-opt no-new-privileges:true --label io.llmfleet.handover={q(paths.unit)} "
        f"--mount type=bind,source={sdir},target={sdir},readonly --env-file /dev/stdin "
        f"--log-driver json-file --log-opt max-size=10m \"$img\" -W -db -f {cfg} >/dev/null; then",
        f"    for _ in $(seq 1 {HANDOVER_LOAD_POLLS}); do",
        f"      if docker logs {hand} 2>&1 | grep -q {q(GATEWAY_LOADED)}; then handover=1; break; fi",
        "      sleep 0.2",
        "    done",
        "  fi",
        "  if [ -n \"$handover\" ]; then",
        "    echo '@@handover'",
        f"    trap \"docker kill -s USR1 {hand} >/dev/null 2>&1 || true\" EXIT  # not left serving if the restart fails",
        "  else",
        f"    docker rm -f {hand} >/dev/null 2>&1 || true",
        "    echo 'the handover HAProxy did not load; restarting without it' >&2",
        "  fi",
        "fi",
    ]


def _handover_end_lines(container: str) -> list[str]:
    """After the restart: once the new gateway has loaded, the handover soft-stops (SIGUSR1)."""
    hand = q(container + "-handover")
    return [
        "if [ -n \"$handover\" ]; then",
        f"  for _ in $(seq 1 {HANDOVER_LOAD_POLLS}); do",
        f"    if docker logs {q(container)} 2>&1 | grep -q {q(GATEWAY_LOADED)}; then break; fi",
        "    sleep 0.2",
        "  done",
        f"  docker kill -s USR1 {hand} >/dev/null 2>&1 || true",
        "fi",
    ]


def parse_switch(rc: int, stdout: str) -> bool:
    """``current`` points at the release and its unit was restarted."""
    return rc == 0 and "@@switched" in stdout.splitlines()


def stop_script(paths: Paths, *, forget_current: bool = False) -> str:
    """Stop the unit (a failed first deploy with nothing to go back to)."""
    lines = [f"systemctl stop {q(paths.unit)} || true", f"systemctl disable {q(paths.unit)} >/dev/null 2>&1 || true"]
    if forget_current:
        lines.append(f"rm -f -- {q(paths.current)}")
    lines.append("echo '@@stopped'")
    return "\n".join(lines)


def logs_script(paths: Paths, lines: int = 40) -> str:
    """The engine's last lines: the unit's journal, else the container's own log. Whatever bytes the
    log holds are passed through as they are (the controller decodes them, invalid ones replaced);
    every script that greps an engine log does so with ``grep -a`` (``evidence_script``,
    ``service_logs_script``, ``cluster.rpc_log_script``), else a log with one binary byte would give
    grep's "binary file matches" instead of its lines."""
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
# The residency check's evidence (llmfleet.health.residency)

EVIDENCE_LOG_LINES = 400
MAX_EVIDENCE_PIDS = 4096


@dataclass(frozen=True)
class Evidence:
    """What the evidence round trip answered: the engine's load lines, the container's processes
    (host PIDs) and nvidia-smi's GPU memory per process (its text and exit code)."""

    log: str = ""
    pids: frozenset[int] = frozenset()
    smi_text: str = ""
    smi_rc: int | None = None
    complete: bool = False  # every marker arrived


def evidence_script(paths: Paths, grep: str, lines: int = EVIDENCE_LOG_LINES) -> str:
    """One round trip: the lines of the current container's log that ``grep`` (an extended regular
    expression, the engine's ``load_log_grep``) selects, at most ``lines`` of them and read as text
    whatever bytes the log holds; the container's processes; ``nvidia-smi --query-compute-apps``."""
    c = q(paths.container)
    return "\n".join([
        "echo @@log",
        f"{DOCKER} logs {c} 2>&1 | grep -a -E -e {q(grep)} | head -n {max(1, int(lines))}",
        f"echo \"@@pids $({DOCKER} top {c} -eo pid 2>/dev/null | tr -s ' \\n' '  ')\"",
        "echo @@smi",
        "out=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>&1); rc=$?",
        "printf '%s\\n' \"$out\" | head -n 64",
        "echo \"@@smi-rc $rc\"",
    ])


def parse_evidence(stdout: str) -> Evidence:
    """Never raises: missing parts stay empty and ``complete`` says whether every marker came."""
    log: list[str] = []
    smi: list[str] = []
    pids: set[int] = set()
    rc: int | None = None
    where = None
    seen = set()
    for line in (stdout or "").splitlines():
        if line == "@@log":
            where = "log"
            seen.add(where)
        elif line.startswith("@@pids"):
            where = None
            seen.add("pids")
            pids = {int(p) for p in line[6:].split() if p.isdigit()}
            if len(pids) > MAX_EVIDENCE_PIDS:
                pids = set(sorted(pids)[:MAX_EVIDENCE_PIDS])
        elif line == "@@smi":
            where = "smi"
            seen.add(where)
        elif line.startswith("@@smi-rc"):
            where = None
            seen.add("rc")
            v = line[8:].strip()
            rc = int(v) if v.lstrip("-").isdigit() else None
        elif where == "log":
            log.append(line)
        elif where == "smi":
            smi.append(line)
    return Evidence("\n".join(log), frozenset(pids), "\n".join(smi), rc, seen == {"log", "pids", "smi", "rc"})


def unit_probe_script(paths: Paths) -> str:
    """Unit state and container state in one round trip."""
    fmt = "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}"
    return "\n".join([
        f"echo \"@@unit $(systemctl is-active {q(paths.unit)} 2>/dev/null)\"",
        f"echo \"@@container $(docker inspect --format {q(fmt)} {q(paths.container)} 2>/dev/null)\"",
    ])


def unit_wait_script(paths: Paths, seconds: float = 20) -> str:
    """After a restart: wait on the host (a check every 0.1 s, at most ``seconds``) until the
    container runs or has stopped, or the unit failed; then answer as ``unit_probe_script``."""
    fmt = "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}"
    return "\n".join([
        "i=0",
        "while :; do",
        f"  u=$(systemctl is-active {q(paths.unit)} 2>/dev/null)",
        f"  c=$(docker inspect --format {q(fmt)} {q(paths.container)} 2>/dev/null)",
        '  case "$u $c" in failed*|*" running "*|*" exited "*|*" dead "*) break ;; esac',
        f"  [ \"$i\" -ge {max(0, int(seconds * 10))} ] && break",
        "  i=$((i + 1))",
        "  sleep 0.1 2>/dev/null || sleep 1",
        "done",
        'echo "@@unit $u"',
        'echo "@@container $c"',
    ])


def parse_unit_probe(stdout: str) -> UnitProbe:
    unit, container, code = "unknown", None, None
    for line in stdout.splitlines():
        if line.startswith("@@unit"):
            unit = line[6:].strip() or "unknown"
        elif line.startswith("@@container"):
            parts = line[11:].split()
            if parts:
                container = parts[0]
                if len(parts) > 1 and parts[1].lstrip("-").isdigit():
                    code = int(parts[1])
    return UnitProbe(unit, container, code)


# ---------------------------------------------------------------------------------------------
# The current release's files (deploy --diff)

_MASK_SED = "/^[[:space:]]*#/!s/^\\([^=]*\\)=.*/\\1='********'/"


def current_files_script(root: str, services: list[str]) -> str:
    """The current release's files per service, base64 on one marker line each; the env file masked
    on the host (its values never leave it), plus its hash to tell a changed secret."""
    lines = []
    for svc in services:
        cur = f"{root.rstrip('/')}/services/{svc}/current"
        for name in (COMPOSE_FILE, unit_name(svc)):
            lines.append(f"[ -f {q(cur + '/' + name)} ] && echo \"@@file {svc} {name} $(base64 -w0 < {q(cur + '/' + name)})\"")
        env = q(cur + "/" + ENV_FILE)
        lines.append(f"[ -f {env} ] && echo \"@@file {svc} {ENV_FILE} $(sed {q(_MASK_SED)} {env} | base64 -w0)\"")
        lines.append(f"[ -f {env} ] && echo \"@@envhash {svc} $(sha256sum < {env} | cut -c1-64)\"")
    lines.append("true")
    return "\n".join(lines)


def parse_current_files(stdout: str) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """(service -> file name -> text, service -> sha256 of its env file)."""
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


# ---------------------------------------------------------------------------------------------
# Pruning


def prune_script(paths: Paths, release_ids: list[str] | tuple[str, ...]) -> str:
    """Delete these releases of one service and any upload left half-way."""
    lines = [f"cd {q(paths.releases)} || exit 0", "rm -rf -- .tmp-*"]
    lines += [f"rm -rf -- {q(_check_id(rid))}" for rid in release_ids]
    lines.append("echo '@@pruned'")
    return "\n".join(lines)


def image_remove_script(refs: list[str] | tuple[str, ...]) -> str:
    """Remove images no kept release uses; one ``@@image-removed REF`` line for each removed."""
    lines = [f"{DOCKER} image rm {q(ref)} >/dev/null 2>&1 && echo {q('@@image-removed ' + ref)} || true" for ref in refs]
    return "\n".join(lines or ["true"])


def parse_removed_images(stdout: str) -> list[str]:
    return [ln.split(" ", 1)[1] for ln in stdout.splitlines() if ln.startswith("@@image-removed ")]


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
        f"  head -c {MAX_HOLDER} {q(d + '/holder.json')} 2>/dev/null",
        f"  exit {LOCK_HELD_RC}",
        "fi",
    ])


def _holder_after(marker: str, stdout: str) -> dict[str, Any] | None:
    lines = stdout.splitlines()
    if marker not in lines:
        return None
    tail = [ln for ln in lines[lines.index(marker) + 1:] if ln.strip() and not ln.startswith("@@")]
    holder = loads_object(tail[0]) if tail else None
    return holder or {"note": "lock directory exists without a readable holder (a deploy died while taking it)"}


def parse_lock_acquire(rc: int, stdout: str) -> LockOutcome:
    if rc == 0 and "@@acquired" in stdout.splitlines():
        return LockOutcome(True, None, stdout)
    return LockOutcome(False, _holder_after("@@held", stdout), stdout)


def lock_release_script(root: str, token: str) -> str:
    d = lock_dir(root)
    holder = q(d + "/holder.json")
    return "\n".join([
        f"if [ ! -d {q(d)} ]; then echo '@@notheld'; exit 0; fi",
        f"if grep -qF {q(token)} {holder} 2>/dev/null; then",
        f"  rm -f -- {holder} && rmdir -- {q(d)} && echo '@@released'",
        "else",
        f"  echo '@@notours'; head -c {MAX_HOLDER} {holder} 2>/dev/null; exit {LOCK_HELD_RC}",
        "fi",
    ])


def parse_lock_release(stdout: str) -> bool:
    """The lock is no longer ours to hold: released now, or not held at all."""
    lines = stdout.splitlines()
    return "@@released" in lines or "@@notheld" in lines


def lock_status_script(root: str) -> str:
    d = lock_dir(root)
    return "\n".join([
        f"if [ -d {q(d)} ]; then echo '@@held'; head -c {MAX_HOLDER} {q(d + '/holder.json')} 2>/dev/null; echo;",
        "else echo '@@free'; fi",
    ])


def parse_lock_status(stdout: str) -> tuple[bool, dict[str, Any] | None]:
    """(held?, holder) from ``lock_status_script`` or ``lock_break_script`` output."""
    holder = _holder_after("@@held", stdout)
    return holder is not None, holder


def lock_break_script(root: str) -> str:
    d = lock_dir(root)
    return "\n".join([
        f"if [ -d {q(d)} ]; then echo '@@held'; head -c {MAX_HOLDER} {q(d + '/holder.json')} 2>/dev/null; echo;",
        f"  rm -rf -- {q(d)} && echo '@@broken'; else echo '@@free'; fi",
    ])


def parse_lock_break(stdout: str) -> tuple[bool, bool, dict[str, Any] | None]:
    """(was held?, broken now?, holder)."""
    held, holder = parse_lock_status(stdout)
    return held, "@@broken" in stdout.splitlines(), holder


def describe_holder(holder: dict[str, Any] | None, now: datetime | None = None) -> str:
    if not holder:
        return "unknown holder"
    if "note" in holder and "who" not in holder:
        return str(holder["note"])
    age = ""
    if now is not None and holder.get("time"):
        try:
            t = datetime.fromisoformat(str(holder["time"]))
            secs = int((now - t).total_seconds())
            age = f" ({secs // 60} min {secs % 60} s ago)" if secs >= 0 else ""
        except ValueError:
            age = ""
    msg = holder.get("message") or ""
    pid = f" (pid {holder['pid']})" if holder.get("pid") is not None else ""
    return (
        f"held by {holder.get('who', '?')} from {holder.get('from', '?')}{pid} since {holder.get('time', '?')}{age}"
        f" for {holder.get('action', '?')}" + (f": {msg}" if msg else "")
    )


def lock_refusal(host: str, holder: dict[str, Any] | None, now: datetime | None = None, waited_s: float = 0) -> str:
    """The one line every writer refused by a host's deploy lock says: the holder (who, from which
    controller and process, since when, for what), how long it waited, and the way out."""
    waited = f"; waited {waited_s:.0f} s" if waited_s > 0 else ""
    return (f"deploy lock {describe_holder(holder, now)}{waited}; wait, or inspect with `invoke lock.status --host "
            f"{host}` and break a stale one with `invoke lock.release --host {host} --yes`")


# ---------------------------------------------------------------------------------------------
# Audit lines on the host (llmfleet.release.audit reads them back and keeps the local log)


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
        "result": str(result),
    }
    if detail:
        rec["detail"] = detail[:500]
    rec.update(extra)
    return rec


def audit_append_script(root: str, record: dict[str, Any]) -> str:
    line = json.dumps(record, sort_keys=False, separators=(",", ":"), default=str)
    return "\n".join([
        f"mkdir -p {q(root)}",
        f"printf '%s\\n' {q(line)} >> {q(audit_path(root))}",
        f"chmod 0640 {q(audit_path(root))} 2>/dev/null || true",
    ])


# ---------------------------------------------------------------------------------------------
# The last round trip of a run


def final_script(root: str, steps: list[str], records: list[dict[str, Any]], token: str | None) -> str:
    """Deferred steps (health marks, prune; each in its own subshell, so one that fails or exits
    does not stop the rest), then the audit lines, then the unlock when the run holds the lock."""
    parts = [f"(\n{sc}\n)" for sc in steps]
    parts += [audit_append_script(root, r) for r in records]
    if token is not None:
        parts.append(f"(\n{lock_release_script(root, token)}\n)")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Day-2 operations on one service: stop, start, remove, logs (release.service_ops runs them)

SERVICE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
SERVICE_LABEL = "io.llmfleet.service"  # set on every engine container by the compose templates
MAX_LOG_LINES = 10_000


def _unit_state_line(paths: Paths) -> str:
    return f'echo "@@unit $(systemctl is-active {q(paths.unit)} 2>/dev/null)"'


def parse_unit_state(stdout: str) -> str:
    """The ``@@unit`` answer of a day-2 script (``active``, ``inactive``, ``failed``, ...)."""
    for line in stdout.splitlines():
        if line.startswith("@@unit"):
            return line[6:].strip() or "unknown"
    return "unknown"


def service_stop_script(paths: Paths) -> str:
    """Stop the unit and keep it from starting at boot; the releases and ``current`` stay."""
    return "\n".join([
        f"[ -d {q(paths.service_dir)} ] || {{ echo '@@absent'; exit 0; }}",
        f"systemctl stop {q(paths.unit)} >/dev/null 2>&1 || true",
        f"systemctl disable {q(paths.unit)} >/dev/null 2>&1 || true",
        _unit_state_line(paths),
        "echo '@@stopped'",
    ])


def service_start_script(paths: Paths) -> str:
    """Start the current release's unit again (after ``stop``) and enable it at boot."""
    return "\n".join([
        f"[ -f {q(paths.current + '/compose.yml')} ] || {{ echo '@@nocurrent'; exit 0; }}",
        f"[ -f {q(paths.unit_path)} ] || install -m 0644 {q(paths.current + '/' + paths.unit)} {q(paths.unit_path)}",
        "systemctl daemon-reload",
        f"systemctl reset-failed {q(paths.unit)} >/dev/null 2>&1 || true",
        f"systemctl enable {q(paths.unit)} >/dev/null 2>&1 || true",
        f"systemctl start {q(paths.unit)}",
        _unit_state_line(paths),
        "echo '@@started'",
    ])


def service_remove_script(paths: Paths, image_refs: list[str]) -> str:
    """Remove a service from the host: unit (stopped, disabled, file deleted), its containers and its
    compose project's network, its releases folder, and the images ``image_refs`` (those no other
    service's release uses)."""
    sdir, unit = q(paths.service_dir), q(paths.unit)
    label = q(f"label={SERVICE_LABEL}={paths.service}")
    lines = [
        f"systemctl stop {unit} >/dev/null 2>&1 || true",
        f"systemctl disable {unit} >/dev/null 2>&1 || true",
        f"if [ -f {q(paths.current + '/compose.yml')} ]; then",
        f"  (cd {q(paths.current)} && {DOCKER} compose -p {q(paths.container)} -f compose.yml down --remove-orphans"
        " --timeout 30) >/dev/null 2>&1 || true",
        "fi",
        f"ids=$({DOCKER} ps -aq --filter {label} 2>/dev/null)",
        f'[ -z "$ids" ] || {DOCKER} rm -f $ids >/dev/null 2>&1 || true',
        f"{DOCKER} rm -f {q(paths.container)} >/dev/null 2>&1 || true",
        # the unit's stop keeps the project's network for its next start; compose's down above
        # removes it when the current release's compose file is there
        f"{DOCKER} network rm {q(paths.container + '_default')} >/dev/null 2>&1 || true",
        f"rm -f -- {q(paths.unit_path)}",
        "systemctl daemon-reload",
        f"systemctl reset-failed {unit} >/dev/null 2>&1 || true",
        f"rm -rf -- {sdir}",
    ]
    if image_refs:
        lines.append(image_remove_script(image_refs))
    lines += [
        f"left=$({DOCKER} ps -aq --filter {label} 2>/dev/null)",
        f'if [ -e {sdir} ] || [ -e {q(paths.unit_path)} ] || [ -n "$left" ]; then echo \'@@left\'; exit 1; fi',
        "echo '@@removed'",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class ServiceOpAnswer:
    """What a stop, start or remove script printed: ``done`` its last marker (``@@stopped``,
    ``@@started``, ``@@removed``) was reached; ``absent``: the service is not on the host; ``no_current``
    (start): it has no current release; ``unit``: the unit's state after; ``images_removed``: remove's."""

    done: bool
    unit: str = "unknown"
    absent: bool = False
    no_current: bool = False
    images_removed: tuple[str, ...] = ()


def parse_service_op(stdout: str, done_marker: str) -> ServiceOpAnswer:
    """The answer of ``service_stop_script`` (``@@stopped``), ``service_start_script`` (``@@started``)
    or ``service_remove_script`` (``@@removed``)."""
    lines = {ln.strip() for ln in stdout.splitlines()}
    return ServiceOpAnswer(done=done_marker in lines, unit=parse_unit_state(stdout), absent="@@absent" in lines,
                           no_current="@@nocurrent" in lines, images_removed=tuple(parse_removed_images(stdout)))


def service_present_script(paths: Paths) -> str:
    """Whether the service has a folder on the host (``logs`` asks before reading its log)."""
    return f"[ -d {q(paths.service_dir)} ] && echo '@@present' || echo '@@absent'"


def parse_service_present(stdout: str) -> bool:
    return "@@present" in stdout.splitlines()


def service_logs_script(paths: Paths, lines: int, *, follow: bool = False, seconds: float | None = None) -> str:
    """The engine's log: the unit's journal, else the container's own log (a service started outside
    systemd); ``follow`` keeps printing new lines, for at most ``seconds`` (``timeout`` on the host)."""
    n = int(lines)
    if not 1 <= n <= MAX_LOG_LINES:
        raise ValueError(f"lines must be 1 to {MAX_LOG_LINES}, got {n}")
    unit, container = q(paths.unit), q(paths.container)
    if not follow:
        return logs_script(paths, n)
    bound = f"timeout {max(1, int(seconds))} " if seconds else ""
    return "\n".join([
        f"if journalctl -u {unit} -n 1 --no-pager -o cat 2>/dev/null | grep -a -q .; then",
        f"  exec {bound}journalctl -u {unit} -n {n} -f --no-pager -o cat",
        "else",
        f"  exec {bound}{DOCKER} logs -f --tail {n} {container} 2>&1",
        "fi",
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


def parse_bench_write(stdout: str) -> bool:
    """True when ``bench_write_script`` kept the result (False: the release is gone, or the write failed)."""
    return "@@benchsaved" in stdout.splitlines()


def parse_bench(stdout: str) -> dict[str, dict[str, Any]]:
    """``bench_read_script`` output -> {release id: document}; unreadable lines are skipped."""
    out: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        if not line.startswith("@@bench "):
            continue
        rid, _, text = line[8:].partition(" ")
        doc = loads_object(text)
        if RELEASE_ID_RE.match(rid) and doc is not None:
            out[rid] = doc
    return out
