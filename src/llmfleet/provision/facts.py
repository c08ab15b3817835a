"""What provisioning needs to know of a host, in one round trip: the facts script and its parser.

``facts_script`` is one POSIX sh script (run as root through ``sudo -n``) that prints sections framed
by ``==MARK== NAME`` lines, MARK random per run (``new_mark``) so that nothing the host prints can pose
as a section: os-release, the running kernel, dpkg's view of every package of interest (by pattern:
NVIDIA's, Docker's, compose, kernel headers), ``apt-mark showhold``, whether dpkg is consistent
(``dpkg --audit``), nvidia-smi's driver and cards (or absent), Docker, compose and nvidia-ctk versions,
/etc/docker/daemon.json, the deploy user's groups, the folders and files provisioning manages (mode,
owner, group; a file's content as base64, capped), the units it manages and the reboot-required marker.

``parse_facts`` never raises on host output: anything unexpected becomes a line in ``errors``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

q = shlex.quote

# dpkg-query patterns: everything provisioning installs, holds or must notice (a distribution's or
# NVIDIA's driver, the container toolkit, Docker from the distribution or Docker's repository, compose,
# kernel headers, nftables for llmfleet_firewall). A pattern no package matches prints nothing on stdout.
PACKAGE_PATTERNS = (
    "nvidia-*", "libnvidia-*", "firmware-nvidia-*", "cuda-drivers*", "docker*", "containerd*", "runc",
    "linux-headers-*", "nftables",
)
FILE_CAP = 65536  # bytes of a managed file's content read back (provisioning writes small files)
_SMI_QUERY = "driver_version,name"
DONE = "done"


def new_mark() -> str:
    return "llmfleet-prov-" + secrets.token_hex(8)


@dataclass(frozen=True)
class FactsQuery:
    """What the facts script asks about beyond its fixed sections (all from the desired state)."""

    user: str
    folders: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    units: tuple[str, ...] = ()


def facts_script(mark: str, query: FactsQuery) -> str:
    """The exact script; every value from the inventory is quoted.

    The slow probes (nvidia-smi, the Docker engine and compose CLIs, systemd's unit states: each starts
    a process of its own that takes tens of milliseconds) run in the background from the start, each
    into a file of a private temporary folder, while the quick sections are read; their sections then
    print those files in the usual order. The answer is the same as run one after another."""
    pats = " ".join(q(p) for p in PACKAGE_PATTERNS)
    units = [f"printf '%s\\t%s\\t%s\\n' {q(u)} \"$(systemctl is-enabled -- {q(u)} 2>/dev/null)\" "
             f"\"$(systemctl is-active -- {q(u)} 2>/dev/null)\"" for u in query.units]
    lines = [
        f"M={q(mark)}",
        'sec() { printf \'\\n==%s== %s\\n\' "$M" "$1"; }',
        "export LC_ALL=C",
        'T=$(mktemp -d 2>/dev/null) || T=""',
        # without a temporary folder the probes run in place (below), one after another
        'bg() { if [ -n "$T" ]; then ( "$@" ) > "$T/$1" 2>&1 & fi; }',
        'shown() { if [ -n "$T" ]; then wait; cat "$T/$1"; else ( "$@" ) 2>&1; fi; }',
        "p_smi() {",
        "  if command -v nvidia-smi >/dev/null 2>&1; then",
        f"    out=$(nvidia-smi --query-gpu={_SMI_QUERY} --format=csv,noheader 2>&1); rc=$?",
        "    printf '%s\\n' \"$out\" | head -c 8192; echo \"rc=$rc\"",
        "  else echo absent; fi",
        "}",
        "p_docker() { command -v docker >/dev/null 2>&1 && docker version --format '{{.Server.Version}}' 2>&1 | head -c 512; }",
        "p_compose() { command -v docker >/dev/null 2>&1 && docker compose version --short 2>/dev/null | head -c 512; }",
        "p_units() {",
        *(f"  {u}" for u in units),
        "  true",
        "}",
        "bg p_smi; bg p_docker; bg p_compose; bg p_units",
        "sec os-release; cat /etc/os-release 2>/dev/null",
        "sec kernel; uname -r",
        "sec arch; dpkg --print-architecture 2>/dev/null",
        f"sec dpkg; dpkg-query -W -f='${{binary:Package}}\\t${{Version}}\\t${{db:Status-Abbrev}}\\n' {pats} 2>/dev/null",
        "sec holds; apt-mark showhold 2>/dev/null",
        "sec dpkg-audit; dpkg --audit 2>&1 | head -c 4096",
        "sec nvidia-smi; shown p_smi",
        "sec docker; shown p_docker",
        "sec compose; shown p_compose",
        "sec ctk; command -v nvidia-ctk >/dev/null 2>&1 && nvidia-ctk --version 2>/dev/null | head -c 512",
        "sec daemon-json; head -c 65536 /etc/docker/daemon.json 2>/dev/null",
        f"sec user; id -nG -- {q(query.user)} 2>/dev/null || echo '@@nouser'",
        "sec paths",
    ]
    for p in query.folders:
        lines.append(f"stat -c '%F\t%a\t%U\t%G\t%n' -- {q(p)} 2>/dev/null || printf 'absent\\t\\t\\t\\t%s\\n' {q(p)}")
    lines.append("sec files")
    for p in query.files:
        lines += [
            f"if [ -f {q(p)} ]; then stat -c '%a\t%U\t%G\t%n' -- {q(p)}; "
            f"head -c {FILE_CAP} -- {q(p)} | base64 -w0; echo; else printf 'absent\\t\\t\\t%s\\n\\n' {q(p)}; fi",
        ]
    lines += [
        "sec units; shown p_units",
        "sec reboot-required; [ -e /var/run/reboot-required ] && echo yes || echo no",
        '[ -z "$T" ] || rm -rf -- "$T"',
        f"sec {DONE}",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The parsed facts


@dataclass(frozen=True)
class PkgState:
    version: str
    status: str  # dpkg's abbreviation: wanted then state ("ii " installed, "hi " held and installed, "rc " gone)

    @property
    def installed(self) -> bool:
        return len(self.status) >= 2 and self.status[1] == "i"


@dataclass(frozen=True)
class PathState:
    kind: str  # "directory", "regular file", ..., "absent"
    mode: str = ""  # octal as stat prints it ("755")
    owner: str = ""
    group: str = ""


@dataclass(frozen=True)
class FileState:
    present: bool
    mode: str = ""
    owner: str = ""
    group: str = ""
    content: bytes | None = None  # None: absent, or unreadable from the answer

    @property
    def sha256(self) -> str | None:
        return hashlib.sha256(self.content).hexdigest() if self.content is not None else None


@dataclass
class ProvisionFacts:
    complete: bool = False
    errors: list[str] = field(default_factory=list)
    os: dict[str, str] = field(default_factory=dict)
    kernel: str = ""
    arch: str = ""
    packages: dict[str, PkgState] = field(default_factory=dict)
    holds: set[str] = field(default_factory=set)
    dpkg_audit: str = ""  # dpkg --audit's complaint: packages left half-installed
    smi: str = "absent"  # absent | ok | error
    smi_error: str = ""
    driver_running: str | None = None
    gpus: list[str] = field(default_factory=list)
    docker_version: str | None = None
    compose_version: str | None = None
    ctk_version: str | None = None
    daemon_json: dict[str, Any] | None = None
    daemon_json_raw: str = ""
    user_exists: bool = False
    groups: set[str] = field(default_factory=set)
    paths: dict[str, PathState] = field(default_factory=dict)
    files: dict[str, FileState] = field(default_factory=dict)
    units: dict[str, tuple[str, str]] = field(default_factory=dict)  # unit -> (is-enabled, is-active)
    reboot_required: bool = False

    @property
    def distro(self) -> tuple[str, str]:
        return self.os.get("ID", ""), self.os.get("VERSION_ID", "")

    def installed(self, name: str) -> str | None:
        """The installed version of ``name`` (dpkg's state "i"), else None."""
        st = self.packages.get(name)
        return st.version if st is not None and st.installed else None

    @property
    def nvidia_runtime(self) -> bool:
        runtimes = (self.daemon_json or {}).get("runtimes")
        return isinstance(runtimes, dict) and "nvidia" in runtimes

    def to_dict(self) -> dict[str, Any]:
        return {
            "complete": self.complete, "errors": list(self.errors), "os": dict(self.os), "kernel": self.kernel,
            "arch": self.arch,
            "packages": {k: {"version": v.version, "status": v.status.strip()} for k, v in sorted(self.packages.items())},
            "holds": sorted(self.holds), "dpkg_audit": self.dpkg_audit, "nvidia_smi": self.smi,
            "driver_running": self.driver_running, "gpus": list(self.gpus), "docker": self.docker_version,
            "compose": self.compose_version, "nvidia_ctk": self.ctk_version, "nvidia_runtime": self.nvidia_runtime,
            "user_groups": sorted(self.groups) if self.user_exists else None,
            "paths": {k: vars(v) for k, v in self.paths.items()},
            "files": {k: {"present": v.present, "mode": v.mode, "owner": v.owner, "group": v.group,
                          "sha256": v.sha256} for k, v in self.files.items()},
            "units": {k: {"enabled": e, "active": a} for k, (e, a) in self.units.items()},
            "reboot_required": self.reboot_required,
        }


def _shown(text: str, n: int = 120) -> str:
    one = " ".join(text.split())
    return repr(one if len(one) <= n else one[: n - 3] + "...")


def split_sections(text: str, mark: str) -> tuple[dict[str, str], bool]:
    """Sections by name (a name seen twice keeps the first), and whether the final marker came."""
    head = f"=={mark}== "
    out: dict[str, list[str]] = {}
    cur: list[str] | None = None
    done = False
    for line in text.split("\n"):
        if line.startswith(head):
            name = line[len(head):].strip()
            if name == DONE:
                done = True
                cur = None
                continue
            cur = out.setdefault(name, []) if name not in out else []
            continue
        if cur is not None:
            cur.append(line)
    return {k: "\n".join(v).strip("\n") for k, v in out.items()}, done


_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)*)")


def _version(text: str) -> str | None:
    m = _VERSION.search(text)
    return m.group(1)[:64] if m else None


def _os_release(body: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in body.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[A-Z_]{1,40}", key):
            try:
                parts = shlex.split(value)
            except ValueError:
                parts = [value.strip("\"'")]
            out[key] = (parts[0] if parts else "")[:200]
    return out


def _packages(body: str, errors: list[str]) -> dict[str, PkgState]:
    out: dict[str, PkgState] = {}
    for line in body.splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or not re.fullmatch(r"[a-z0-9][a-z0-9+.:-]{0,120}", parts[0]):
            if line.strip():
                errors.append(f"dpkg: unreadable line {_shown(line)}")
            continue
        name = parts[0].split(":", 1)[0]  # binary:Package carries the architecture of multi-arch packages
        out[name] = PkgState(version=parts[1][:128], status=parts[2][:3])
    return out


def _smi(body: str, facts: ProvisionFacts) -> None:
    if body.strip() == "absent":
        facts.smi = "absent"
        return
    lines = body.splitlines()
    rc_line = lines[-1] if lines and lines[-1].startswith("rc=") else ""
    rows = lines[:-1] if rc_line else lines
    rc = rc_line[3:].strip() if rc_line else ""
    drivers: list[str] = []
    for row in rows:
        parts = [p.strip() for p in row.split(",", 1)]
        if len(parts) == 2 and re.fullmatch(r"\d{3}\.\d{1,3}(?:\.\d{1,3})?", parts[0]):
            drivers.append(parts[0])
            facts.gpus.append(parts[1][:120])
    if drivers and rc in ("0", ""):
        facts.smi = "ok"
        facts.driver_running = drivers[0]
        return
    facts.smi = "error"
    facts.smi_error = " ".join(" ".join(rows).split())[:300] or f"nvidia-smi exited {rc or '?'} without output"


def _paths(body: str, errors: list[str]) -> dict[str, PathState]:
    out: dict[str, PathState] = {}
    for line in body.splitlines():
        parts = line.split("\t", 4)
        if len(parts) != 5:
            if line.strip():
                errors.append(f"paths: unreadable line {_shown(line)}")
            continue
        kind, mode, owner, group, path = parts
        out[path] = PathState(kind=kind, mode=mode, owner=owner, group=group)
    return out


def _files(body: str, errors: list[str]) -> dict[str, FileState]:
    out: dict[str, FileState] = {}
    lines = body.split("\n")
    i = 0
    while i < len(lines):
        parts = lines[i].split("\t", 3)
        if len(parts) != 4:
            if lines[i].strip():
                errors.append(f"files: unreadable line {_shown(lines[i])}")
            i += 1
            continue
        mode, owner, group, path = parts
        data = lines[i + 1] if i + 1 < len(lines) else None
        i += 2
        if mode == "absent":
            out[path] = FileState(present=False)
            continue
        content: bytes | None = None
        try:
            content = base64.b64decode(data or "", validate=True) if data is not None else None
        except (binascii.Error, ValueError):
            errors.append(f"files: {path}: content not readable")
        if data is None:
            errors.append(f"files: {path}: content cut short")
        out[path] = FileState(present=True, mode=mode, owner=owner, group=group, content=content)
    return out


def _units(body: str) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for line in body.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0]:
            out[parts[0]] = (parts[1].strip() or "absent", parts[2].strip() or "unknown")
    return out


def _daemon_json(body: str, facts: ProvisionFacts) -> None:
    facts.daemon_json_raw = body
    if not body.strip():
        return
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as exc:
        facts.errors.append(f"/etc/docker/daemon.json is not JSON ({exc.msg} at line {exc.lineno})")
        return
    if isinstance(doc, dict):
        facts.daemon_json = doc
    else:
        facts.errors.append("/etc/docker/daemon.json is not a JSON object")


def parse_facts(stdout: str, mark: str, *, rc: int = 0, stderr: str = "") -> ProvisionFacts:
    """The facts script's answer -> ``ProvisionFacts``. Never raises."""
    facts = ProvisionFacts()
    try:
        _parse_into(facts, stdout, mark)
    except Exception as exc:  # noqa: BLE001 - host output must never crash the parser
        facts.errors.append(f"facts unreadable: {type(exc).__name__}: {exc}")
    if not facts.complete:
        why = f" (exit {rc}: {_shown(stderr or stdout[-300:])})" if rc else ""
        facts.errors.append(f"the facts script's answer was cut short{why}")
    return facts


def _parse_into(facts: ProvisionFacts, stdout: str, mark: str) -> None:
    sec, facts.complete = split_sections(stdout, mark)
    facts.os = _os_release(sec.get("os-release", ""))
    facts.kernel = sec.get("kernel", "").strip()[:200]
    facts.arch = sec.get("arch", "").strip()[:40]
    facts.packages = _packages(sec.get("dpkg", ""), facts.errors)
    facts.holds = {ln.strip().split(":", 1)[0] for ln in sec.get("holds", "").splitlines() if ln.strip()}
    facts.dpkg_audit = sec.get("dpkg-audit", "").strip()[:2000]
    _smi(sec.get("nvidia-smi", "absent"), facts)
    facts.docker_version = _version(sec.get("docker", ""))
    facts.compose_version = _version(sec.get("compose", ""))
    facts.ctk_version = _version(sec.get("ctk", ""))
    _daemon_json(sec.get("daemon-json", ""), facts)
    user = sec.get("user", "@@nouser").strip()
    facts.user_exists = user != "@@nouser" and "user" in sec
    facts.groups = set(user.split()) if facts.user_exists else set()
    facts.paths = _paths(sec.get("paths", ""), facts.errors)
    facts.files = _files(sec.get("files", ""), facts.errors)
    facts.units = _units(sec.get("units", ""))
    facts.reboot_required = sec.get("reboot-required", "").strip() == "yes"


def upstream_version(debian_version: str) -> str:
    """A package's upstream version: ``1:535.247.01-1~deb12u1`` -> ``535.247.01``."""
    v = debian_version.split(":", 1)[-1]
    return v.rsplit("-", 1)[0] if "-" in v else v


def driver_matches(package_version: str | None, running: str | None) -> bool:
    """Whether nvidia-smi's driver is the installed driver package's version."""
    if not package_version or not running:
        return False
    return upstream_version(package_version) == running


def short_list(items: Sequence[str], n: int = 6) -> str:
    items = list(items)
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")
