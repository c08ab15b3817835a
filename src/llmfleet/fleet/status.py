"""Fleet status: what each host runs, whether it is healthy, and what its engines are doing now.

One SSH round trip per host reads every service's releases, ``current`` link, unit state and the
last health check (``store.state_script``), plus the card names from ``nvidia-smi``. Live engine
metrics come from each service's ``/metrics`` through an SSH-forwarded port (no firewall opening),
normalised across vLLM and llama.cpp by ``llmfleet.fleet.metrics``.

Hosts are queried in parallel (a bounded thread pool); every step has a time limit, and a host that
cannot be reached becomes an ``unreachable`` row with the reason, never a traceback.

The pure part (``host_rows``, ``release_rows``, ``card_label``) turns what was read into rows; the
shell (``query_host``, ``query_hosts``) does the SSH and HTTP.

A host that runs a gateway (``engine: gateway``) also answers, in the same round trip, its HAProxy's
``show stat`` through the runtime API on 127.0.0.1:<admin_port> (``gateway_config.admin_script``);
``gateway_rows`` turns it into one row per replica: HAProxy's status, current sessions, a plain-words
state (in rotation, draining, out) and why, where HAProxy says.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from llmfleet.errors import LlmfleetError, UsageError
from llmfleet.fleet.metrics import EngineMetrics, engine_metrics
from llmfleet.health import watchdog
from llmfleet.host import ssh
from llmfleet.host.group import run_on_hosts
from llmfleet.inventory.ansible import Host, settings_for
from llmfleet.inventory.services import GATEWAY_KIND, HostSettings, Service
from llmfleet.knowledge import engines, gpu_health, release_state
from llmfleet.knowledge.facts import GpuHealth
from llmfleet.release import audit as audit_mod
from llmfleet.release import decide
from llmfleet.release import gateway_config as gc
from llmfleet.release import store as rel
from llmfleet.release.secret import secret_if_readable
from llmfleet.settings import Settings, SshSettings

GPU_MARK = "@@gpu"
LISTEN_MARK = "@@listen"
CONTAINER_MARK = "@@worker-container"
METRICS_TIMEOUT_S = 3.0
MAX_METRICS_BYTES = 4 * 1024 * 1024


# ---------------------------------------------------------------------------------------------
# Pure


def status_script(root: str, model_paths: Sequence[str] = (), gateway_ports: Sequence[int] = ()) -> str:
    """Release state of every service (the release store's reader), then each model path's manifest and
    files (``host.model_scripts.MANIFEST_READER``), the cards' hardware health (``host.gpu_health``), the
    card names, and each gateway's ``show stat`` (by its runtime API port): one round trip."""
    return "\n".join([
        rel.state_script(root),
        *_model_lines(model_paths),
        *_health_lines(),
        f"echo '{GPU_MARK}'",
        "nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 64 || true",
        "(", watchdog.status_script(root), ") 2>/dev/null || true",
        # workers of services over several hosts: their containers, and the TCP ports the host listens on
        f"docker ps -a --filter label=io.llmfleet.role=worker --format '{CONTAINER_MARK} {{{{.Names}}}} {{{{.State}}}}' "
        "2>/dev/null | head -n 64 || true",
        f"ss -Hltn 2>/dev/null | awk '{{n = split($4, a, \":\"); print \"{LISTEN_MARK} \" a[n]}}' | sort -u "
        "| head -n 512 || true",
        *_gateway_lines(gateway_ports),
    ])


MODEL_MARK = "@@model-of"
MODEL_END = "@@model-end"
HEALTH_MARKS = ("@@gpu-health-q", "@@gpu-health-xid", "@@gpu-health-pci", "@@gpu-health-end")


def _health_lines() -> list[str]:
    """nvidia-smi -q (bounded in time and size), the kernel log's Xid lines and the PCI bus's NVIDIA cards,
    each after its mark (the same reader as the host probe's: ``host.gpu_health.HEALTH_READER``)."""
    from llmfleet.host.gpu_health import HEALTH_READER

    q, xid, pci, end = HEALTH_MARKS
    return [HEALTH_READER.rstrip("\n"),
            f"echo '{q}'",
            "(if command -v timeout >/dev/null 2>&1; then timeout 20 nvidia-smi -q; else nvidia-smi -q; fi) 2>&1 "
            "| head -c 1048576",
            "echo",
            f"echo '{xid}'",
            "llmfleet_gpu_xids 2>/dev/null | head -c 262144",
            f"echo '{pci}'",
            "llmfleet_gpu_pci 2>/dev/null",
            f"echo '{end}'"]


def parse_gpu_health(stdout: str) -> GpuHealth | None:
    """The cards' hardware health ``status_script`` read (cards indexed in nvidia-smi -q order); None
    when its marks are not there."""
    from llmfleet.host.gpu_health import health_from_sections

    parts: dict[str, list[str]] = {}
    cur: str | None = None
    for line in stdout.split("\n"):
        if line in HEALTH_MARKS:
            cur = None if line == HEALTH_MARKS[3] else line
            if cur is not None:
                parts[cur] = []
        elif cur is not None:
            parts[cur].append(line)
    if HEALTH_MARKS[0] not in parts:
        return None
    q, xid, pci = ("\n".join(parts.get(m, [])) for m in HEALTH_MARKS[:3])
    return health_from_sections(q, xid if HEALTH_MARKS[1] in parts else None, pci if HEALTH_MARKS[2] in parts else None)


def hardware_note(row: ServiceRow, health: GpuHealth | None, service: Service | None) -> None:
    """The fatal and degraded conditions of the cards the service uses: in the row's JSON (``hardware``)
    and a short note (``hardware: GPU 0 Xid 79 (GPU has fallen off the bus) FATAL``)."""
    if health is None or service is None:
        return
    found = gpu_health.status_findings(health, None if service.gpus == "all" else list(service.gpus))
    if found:
        row.hardware = [f.to_dict() for f in found]
        row.note = "; ".join(x for x in (row.note, gpu_health.status_note(found)) if x)


def _model_lines(model_paths: Sequence[str]) -> list[str]:
    from llmfleet.host.model_scripts import MANIFEST_READER, reader_call

    if not model_paths:
        return []
    out = [MANIFEST_READER.rstrip("\n")]
    for i, p in enumerate(dict.fromkeys(model_paths)):
        out += [f"echo '{MODEL_MARK} {i}'", f"({reader_call(p)}) 2>/dev/null | head -c 1048576", "echo",
                f"echo '{MODEL_END}'"]
    return out


def parse_models(stdout: str, model_paths: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per model path: which model the host holds there and whether it is verified (``model_state``)."""
    from llmfleet.host.model_scripts import parse_reader

    paths = list(dict.fromkeys(model_paths))
    chunks: dict[int, list[str]] = {}
    cur: int | None = None
    for line in stdout.split("\n"):
        if line.startswith(MODEL_MARK + " ") and line[len(MODEL_MARK) + 1:].isdigit():
            cur = int(line[len(MODEL_MARK) + 1:])
            chunks[cur] = []
        elif line == MODEL_END:
            cur = None
        elif cur is not None:
            chunks[cur].append(line)
    out = {}
    for i, lines in chunks.items():
        if i < len(paths):
            hm = parse_reader("\n".join(lines), paths[i])
            if hm.read:
                out[paths[i]] = model_state(hm)
    return out


def model_state(hm: Any) -> dict[str, Any]:
    """``{"path", "state", "verified_at", "file", "source"}``: state ``verified``, ``changed``, ``missing``
    (a file of the manifest, or the model itself), ``no-manifest``, ``unreadable``, ``unchecked``."""
    from llmfleet.knowledge.model_manifest import judge

    if hm.kind not in ("file", "dir"):
        return {"path": hm.model_path, "state": "missing", "verified_at": None, "file": hm.model_path, "source": None}
    v = judge(hm.model_path, hm.manifest_text, hm.files, cut=hm.cut)
    held, _ = hm.manifest()
    return {"path": hm.model_path, "state": v.state, "verified_at": v.verified_at, "file": v.file,
            "source": held.source if held is not None else None}


def model_label(model: dict[str, Any] | None) -> str:
    """The status table's model cell: ``verified 2026-11-29``, ``CHANGED``, ``no manifest``, ..."""
    if not model:
        return "-"
    state = model["state"]
    if state == "verified":
        return f"verified {str(model.get('verified_at') or '')[:10]}".strip()
    return {"no-manifest": "no manifest", "changed": "CHANGED", "missing": "MISSING"}.get(state, state)


def parse_listening(stdout: str) -> set[int]:
    """The TCP ports the host listens on (``status_script``)."""
    out = set()
    for line in stdout.splitlines():
        if line.startswith(LISTEN_MARK + " ") and line[len(LISTEN_MARK) + 1:].strip().isdigit():
            out.add(int(line[len(LISTEN_MARK) + 1:].strip()))
    return out


def parse_worker_containers(stdout: str) -> dict[str, str]:
    """Worker containers (``llmfleet-<svc>``) and their state (running, exited, restarting, ...)."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == CONTAINER_MARK:
            out[parts[1]] = parts[2]
    return out


# -- gateways: each replica's state at the gateway (HAProxy's ``show stat``) ---------------------------

GATEWAY_MARK = "@@gateway"
GATEWAY_END = "@@gateway-end"
GATEWAY_TIMEOUT_S = 5
MAX_STAT_BYTES = 1024 * 1024
# HAProxy 2.6's ``show stat`` columns by position, for an answer without its header line
_STAT_COLUMNS = {"pxname": 0, "svname": 1, "scur": 4, "status": 17, "lastchg": 23, "check_status": 36,
                 "check_code": 37, "last_chk": 56, "check_desc": 65}
IN_ROTATION = "in rotation"
DRAINING = "draining"
OUT_DOWN = "out: down by health checks"
OUT_MAINT = "out: maintenance"
OUT_ABSENT = "out: not in the gateway's configuration"
UNKNOWN = "unknown"


def _gateway_lines(gateway_ports: Sequence[int]) -> list[str]:
    """Per gateway (by its position): a mark, the runtime API's answer to ``show stat`` (bounded in time
    and size; stderr too), then an end mark with the exit status (3: nothing listens; 124: no answer)."""
    out = []
    for i, port in enumerate(gateway_ports):
        ask = gc.admin_script(port, gc.show_stat_command(), timeout_s=GATEWAY_TIMEOUT_S)
        out += [f"echo '{GATEWAY_MARK} {i}'",
                f"llmfleet_gw=$({ask} 2>&1); llmfleet_gw_rc=$?",
                f"printf '%s\\n' \"$llmfleet_gw\" | head -c {MAX_STAT_BYTES}",
                f"echo; echo \"{GATEWAY_END} $llmfleet_gw_rc\""]
    return out


@dataclass(frozen=True)
class GatewayAnswer:
    """What one gateway's runtime API answered ``status_script`` (its exit status and text)."""

    rc: int
    text: str


def parse_gateway_answers(stdout: str) -> dict[int, GatewayAnswer]:
    """Each gateway's answer by its position in ``status_script``'s ``gateway_ports``; a gateway whose
    end mark is missing (the output was cut) is left out."""
    out: dict[int, GatewayAnswer] = {}
    cur: int | None = None
    lines: list[str] = []
    for line in stdout.split("\n"):
        if line.startswith(GATEWAY_MARK + " ") and line[len(GATEWAY_MARK) + 1:].isdigit():
            cur, lines = int(line[len(GATEWAY_MARK) + 1:]), []
        elif line.startswith(GATEWAY_END + " ") and cur is not None:
            rc = line[len(GATEWAY_END) + 1:].strip()
            out[cur] = GatewayAnswer(int(rc) if rc.isdigit() else -1, "\n".join(lines).strip("\n"))
            cur = None
        elif cur is not None:
            lines.append(line)
    return out


@dataclass(frozen=True)
class StatServer:
    """One server (a replica) of ``show stat``: HAProxy's own words."""

    backend: str
    server: str
    status: str  # UP, DOWN, DRAIN, MAINT, NOLB, "UP 1/2", "DOWN 1/2", "MAINT (via b/s)", "no check", ...
    sessions: int  # requests on it now (scur)
    check_status: str = ""  # L7OK, L7STS, L4CON, L4TOUT, ... ("" when checks are stopped)
    check_code: str = ""  # the HTTP status the check got
    check_desc: str = ""  # "Layer7 wrong status", ...
    last_check: str = ""  # the last check's own words: "Service Unavailable", "Connection refused"
    last_change_s: int | None = None  # seconds since its status last changed (lastchg)


def parse_stat_servers(text: str) -> list[StatServer] | None:
    """``show stat`` CSV -> its servers (FRONTEND and BACKEND rows left out), columns found by the
    header line (HAProxy 2.6's positions without one); None when the text holds no statistics at all
    (an error message). Never raises."""
    columns = dict(_STAT_COLUMNS)
    servers: list[StatServer] = []
    seen = False
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            header = [h.strip() for h in line.lstrip("#").split(",")]
            if "pxname" in header and "svname" in header:
                columns = {c: header.index(c) if c in header else -1 for c in _STAT_COLUMNS}
                seen = True
            continue
        fields = line.split(",")
        if len(fields) <= max(columns["pxname"], columns["svname"], columns["status"], columns["scur"]):
            continue

        def col(name: str, fields: list[str] = fields, columns: dict[str, int] = columns) -> str:
            i = columns[name]
            return fields[i].strip() if 0 <= i < len(fields) else ""

        seen = True
        backend, server = col("pxname"), col("svname")
        if not backend or not server or server in ("FRONTEND", "BACKEND"):
            continue
        scur, lastchg = col("scur"), col("lastchg")
        servers.append(StatServer(backend=backend[:128], server=server[:128], status=col("status")[:64],
                                  sessions=int(scur) if scur.isdigit() else 0, check_status=col("check_status")[:32],
                                  check_code=col("check_code")[:8], check_desc=col("check_desc")[:128],
                                  last_check=col("last_chk")[:200],
                                  last_change_s=int(lastchg) if lastchg.isdigit() else None))
    return servers if seen else None


def gateway_read(answer: GatewayAnswer | None, admin_port: int) -> list[StatServer] | str:
    """A gateway's servers, or one line saying why it gave none."""
    where = f"HAProxy's runtime API on 127.0.0.1:{admin_port}"
    if answer is None:
        return f"no answer read from {where} (the status output was cut)"
    first = next((ln.strip() for ln in answer.text.splitlines() if ln.strip()), "")
    if answer.rc == 3:
        return f"nothing listens on 127.0.0.1:{admin_port} (HAProxy's runtime API): is the gateway running?"
    if answer.rc in (124, 137):
        return f"{where} did not answer within {GATEWAY_TIMEOUT_S} s"
    if answer.rc != 0:
        return f"{where}: exit {answer.rc}" + (f": {first[:200]}" if first else "")
    servers = parse_stat_servers(answer.text)
    if servers is None:
        return f"{where} answered no statistics" + (f": {first[:200]}" if first else "")
    return servers


def replica_state(status: str) -> str:
    """HAProxy's status of a server in plain words: in rotation, draining, out (down by health checks,
    maintenance); ``unknown`` for a status this version does not know."""
    word = status.split(" ", 1)[0]
    if word == "UP" or status == "no check":
        return IN_ROTATION
    if word in ("DRAIN", "NOLB"):
        return DRAINING
    if word == "DOWN":
        return OUT_DOWN
    if word == "MAINT":
        return OUT_MAINT
    return UNKNOWN


def _check_words(s: StatServer) -> str:
    """``Layer7 wrong status (503 Service Unavailable)``, ``Layer4 connection problem (Connection refused)``."""
    what = s.check_desc or s.check_status
    detail = " ".join(x for x in (s.check_code, s.last_check) if x)
    if what and detail:
        return f"{what} ({detail})"
    return what or detail


def _fraction(status: str) -> tuple[int, int] | None:
    """``UP 1/2`` -> (1, 2): HAProxy's count of checks while a server is going down or coming back."""
    import re

    m = re.fullmatch(r"\S+ (\d+)/(\d+)", status)
    return (int(m.group(1)), int(m.group(2))) if m else None


def replica_why(s: StatServer) -> str:
    """Why a replica is where it is, as far as HAProxy says (health check, runtime API, tracking)."""
    status, check = s.status, _check_words(s)
    check_ok = s.check_status.endswith("OK") or not s.check_status
    word = status.split(" ", 1)[0]
    frac = _fraction(status)
    flight = f"; {s.sessions} request(s) in flight finish" if s.sessions else ""
    if word == "UP":
        if frac:
            return f"health check failing, out after {frac[0]} more failure(s): {check}".rstrip(": ")
        return "" if check_ok else f"last health check: {check}"
    if status == "no check":
        return "no health check"
    if word == "DOWN":
        if status == "DOWN (agent)":
            return "its agent check says down"
        if frac:
            return f"health check passing again, back after {frac[1] - frac[0]} more pass(es)"
        return f"health check: {check}" if check else "health check failed"
    if word == "DRAIN":
        why = ("its agent check asked to drain" if "(agent)" in status
               else "drained through the runtime API (a deploy, stop or remove, or by hand)")
        return why + flight + ("" if check_ok else f"; health check: {check}")
    if word == "NOLB":
        return "its health check asks not to send it new requests (NOLB)" + flight
    if word == "MAINT":
        if "(via " in status:
            return f"tracks {status.split('(via ', 1)[1].rstrip(')')}, which is out"
        if "(resolution)" in status:
            return "its address does not resolve"
        return "put in maintenance through the runtime API: no request, no health check"
    return f"HAProxy says {status!r}"


@dataclass(frozen=True)
class Expected:
    """A replica the inventory puts behind a gateway: where ``show stat`` names it."""

    backend: str
    server: str
    replica: str  # host/service
    served_name: str


@dataclass
class GatewayRow:
    """One replica at one gateway (``status --json``'s ``gateway_replicas``)."""

    host: str  # the gateway's host
    gateway: str  # the gateway service
    backend: str  # m_<served name>
    server: str  # <host>__<service>
    replica: str | None  # host/service, from the inventory (None: the inventory does not put it there)
    served_name: str | None
    status: str  # HAProxy's own, "-" when its configuration has no such server
    sessions: int | None  # requests on it now
    state: str  # in rotation, draining, out: down by health checks, out: maintenance, out: not in ..., unknown
    why: str
    check: str | None = None  # the health check's code (L7OK, L7STS, L4CON, ...)
    last_change_s: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GatewayProblem:
    """A gateway whose runtime API gave no statistics (``status --json``'s ``gateway_errors``)."""

    host: str
    gateway: str
    admin_port: int
    error: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gateway_services(settings: HostSettings | None) -> list[Service]:
    """The host's gateway services, in the inventory's order (their runtime API ports go to ``status_script``)."""
    if settings is None:
        return []
    return [s for s in settings.services if s.engine == GATEWAY_KIND and s.gateway is not None]


def gateway_rows(status: HostStatus, settings: HostSettings | None,
                 expected: dict[str, list[Expected] | None] | None = None) -> tuple[list[GatewayRow], list[GatewayProblem]]:
    """Per deployed gateway of the host: one row per replica (those the inventory puts behind it first, in
    its order, then any other server its configuration holds), or a problem when its runtime API gave
    nothing. ``expected``: gateway service -> its replicas from the inventory (None: not known)."""
    rows: list[GatewayRow] = []
    problems: list[GatewayProblem] = []
    if not status.reachable:
        return rows, problems
    for svc in gateway_services(settings):
        assert svc.gateway is not None
        st = status.states.get(svc.name)
        if st is None or not st.current:
            continue  # not deployed: its service row says so
        read = status.gateways.get(svc.name)
        if read is None or isinstance(read, str):
            problems.append(GatewayProblem(status.host, svc.name, svc.gateway.admin_port,
                                           read or "not read (status_script was not asked for it)"))
            continue
        want = (expected or {}).get(svc.name)
        by_ref = {(s.backend, s.server): s for s in read}
        for e in want or []:
            s = by_ref.pop((e.backend, e.server), None)
            if s is None:
                rows.append(GatewayRow(status.host, svc.name, e.backend, e.server, e.replica, e.served_name, "-", None,
                                       OUT_ABSENT, "added after the gateway's last deploy: deploy the gateway "
                                       f"(invoke deploy --host {status.host} --service {svc.name})"))
            else:
                rows.append(_row(status.host, svc.name, s, e.replica, e.served_name))
        for s in by_ref.values():
            row = _row(status.host, svc.name, s, None, None)
            if want is not None:
                row.why = "; ".join(x for x in ("not behind this gateway in the inventory (deploy the gateway to "
                                                "drop it)", row.why) if x)
            rows.append(row)
    return rows, problems


def _row(host: str, gateway: str, s: StatServer, replica: str | None, served: str | None) -> GatewayRow:
    return GatewayRow(host, gateway, s.backend, s.server, replica, served, s.status, s.sessions,
                      replica_state(s.status), replica_why(s), s.check_status or None, s.last_change_s)


def gateway_notes(rows: list[ServiceRow], gw_rows: Sequence[GatewayRow], problems: Sequence[GatewayProblem]) -> None:
    """The gateway's own service row: how many replicas are in rotation, draining and out, or that its
    runtime API did not answer."""
    for r in rows:
        mine = [g for g in gw_rows if g.host == r.host and g.gateway == r.service]
        bad = [p for p in problems if p.host == r.host and p.gateway == r.service]
        said = ""
        if bad:
            said = "runtime API: no statistics"
        elif mine:
            counts = {IN_ROTATION: 0, DRAINING: 0, "out": 0, UNKNOWN: 0}
            for g in mine:
                key = "out" if g.state.startswith("out") else g.state
                counts[key] = counts.get(key, 0) + 1
            said = "replicas: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        if said:
            r.note = "; ".join(x for x in (said, r.note) if x)


def expected_replicas(inv: Any, host: Host, settings: HostSettings | None) -> dict[str, list[Expected] | None]:
    """Per gateway service of the host: the replicas the inventory puts behind it (``gateway_plan.replicas``);
    None for a gateway whose upstreams do not resolve (its rows then come from ``show stat`` alone)."""
    from llmfleet.release import gateway_plan

    out: dict[str, list[Expected] | None] = {}
    for svc in gateway_services(settings):
        try:
            found = gateway_plan.replicas(inv, host, svc)
        except LlmfleetError:  # an upstream that is not in the inventory, a host whose variables do not load
            out[svc.name] = None
            continue
        out[svc.name] = [Expected(gc.backend_name(s.public_name), gc.server_name(h.name, s.name), f"{h.name}/{s.name}",
                                  s.public_name) for h, s, _address in found]
    return out


def parse_driver(stdout: str) -> str | None:
    """The driver version nvidia-smi -q printed (``Driver Version : 535.183.01``); None when it did not."""
    import re

    m = re.search(r"^Driver Version\s*:\s*(\S+)\s*$", stdout, re.M)
    return m.group(1)[:64] if m else None


def parse_card_names(stdout: str) -> list[str]:
    """The card names ``status_script`` printed after its marker."""
    lines = stdout.splitlines()
    if GPU_MARK not in lines:
        return []
    tail = lines[lines.index(GPU_MARK) + 1:]
    cut = next((i for i, ln in enumerate(tail) if ln.startswith(GATEWAY_MARK + " ")), len(tail))  # the gateways' answers
    return [ln.strip() for ln in tail[:cut] if ln.strip() and not ln.startswith("@@")]


def card_label(gpu_names: Sequence[str], inventory_gpu: str | None = None) -> str:
    """``["Tesla V100-SXM2-32GB"] * 2`` -> ``2x Tesla V100-SXM2-32GB``; the inventory's
    ``llmfleet_gpu`` when the host reports none."""
    if not gpu_names:
        return inventory_gpu or "-"
    counts: dict[str, int] = {}
    for n in gpu_names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{c}x {n}" if c > 1 else n for n, c in counts.items())


def short_digest(digest: str | None) -> str:
    return audit_mod.short(digest)


def _digest(info: release_state.ReleaseInfo | None) -> str | None:
    return info.manifest.digest if info is not None and info.manifest else None


def health_label(info: release_state.ReleaseInfo | None) -> str:
    """``healthy`` (confirmed healthy), ``unhealthy`` (its check failed), ``unconfirmed`` (no health
    mark: a deploy switched to it and never confirmed it, e.g. killed after the switch); a failure
    never goes back to a release that is not ``healthy`` (``decide.go_back_target``)."""
    if info is None:
        return "-"
    if info.health is None:
        return "unconfirmed"
    return str(info.health.get("result") or "unknown")


def go_back_note(st: release_state.ServiceState) -> str:
    """Said of a service whose current release is not confirmed healthy: where a failure goes back to."""
    info = st.current_release
    if info is None or info.healthy:
        return ""
    back = decide.go_back_target(st, None)
    return (f"release {st.current} was never confirmed healthy; a failed deploy goes back to "
            + (f"{back}, the last confirmed" if back else "nothing (no release confirmed healthy: the service is stopped)"))


def health_tokps(info: release_state.ReleaseInfo | None) -> float | None:
    if info is None or not info.health:
        return None
    v = info.health.get("decode_tokps")
    return float(v) if isinstance(v, int | float) else None


@dataclass
class ServiceRow:
    host: str
    service: str
    engine: str | None = None
    card: str = "-"
    release: str | None = None
    digest: str | None = None
    unit: str = "-"
    health: str = "-"
    confirmed: bool | None = None  # the current release was confirmed healthy (None: no current release)
    tokps: float | None = None
    metrics: dict[str, float | None] | None = None
    note: str = ""
    supervision: dict[str, Any] | None = None  # restarts since the deploy, the last watchdog action
    role: str = ""  # a service over several hosts: "head" or "worker of HEAD"
    workers: list[dict[str, Any]] | None = None  # on the head's row: each worker's state (``worker_state``)
    model: dict[str, Any] | None = None  # the model at its model_path and whether it is verified (``model_state``)
    hardware: list[dict[str, Any]] | None = None  # conditions of the service's cards (``gpu_health.Finding``)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HostStatus:
    """What was read from one host (the shell's output, the pure part's input)."""

    host: str
    reachable: bool
    error: str = ""
    gpus: list[str] = field(default_factory=list)
    states: dict[str, release_state.ServiceState] = field(default_factory=dict)
    metrics: dict[str, EngineMetrics | str] = field(default_factory=dict)  # service -> metrics or why not
    seconds: float = 0.0
    supervision: dict[str, watchdog.Supervision] = field(default_factory=dict)
    listening: set[int] = field(default_factory=set)  # TCP ports the host listens on
    containers: dict[str, str] = field(default_factory=dict)  # worker container -> its state
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # model path -> ``model_state``
    gpu_health: GpuHealth | None = None  # the cards' hardware health (``parse_gpu_health``)
    driver: str | None = None  # the NVIDIA driver version (``parse_driver``)
    gateways: dict[str, list[StatServer] | str] = field(default_factory=dict)  # gateway service -> servers or why not


def worker_state(status: HostStatus | None, host: str, service: str) -> dict[str, Any]:
    """One worker of a service over several hosts, as read by its status probe: its release, unit,
    container state, cluster port and whether the host listens on it (a Ray worker listens on no
    port of its own: ``listening`` None), and ``ok``."""
    d: dict[str, Any] = {"host": host, "reachable": bool(status and status.reachable), "release": None,
                         "unit": "-", "container": None, "port": None, "listening": None, "ok": False}
    if status is None or not status.reachable:
        d["problem"] = (status.error if status else "") or "unreachable"
        return d
    st = status.states.get(service)
    if st is None:
        d["problem"] = "not deployed"
        return d
    info = st.current_release
    cl = (info.manifest.inputs.get("cluster") if info and info.manifest else None) or {}
    d["release"], d["unit"] = st.current, st.unit
    d["container"] = status.containers.get(f"llmfleet-{service}", "absent")
    if isinstance(cl.get("port"), int):
        d["port"] = cl["port"]
        if _worker_serves_port(cl.get("kind")):
            d["listening"] = cl["port"] in status.listening
    problems = [f"unit {st.unit}"] if st.unit != "active" else []
    if d["container"] != "running":
        problems.append(f"container {d['container']}")
    if d["listening"] is False:
        problems.append(f"nothing listens on port {d['port']}")
    d["ok"] = not problems
    if problems:
        d["problem"] = ", ".join(problems)
    return d


def _worker_serves_port(kind: Any) -> bool:
    """Whether a worker of this cluster kind listens on the cluster port (llama.cpp's rpc-server does; a
    Ray worker does not); False for a kind no engine has (a manifest from another version)."""
    try:
        return isinstance(kind, str) and engines.for_cluster_kind(kind).worker_serves_port
    except UsageError:
        return False


def worker_label(w: dict[str, Any]) -> str:
    if w["ok"]:
        port = f", port {w['port']} listening" if w.get("listening") else ""
        return f"{w['host']}: container running{port}, release {w['release']}"
    return f"{w['host']}: {w.get('problem', 'not ok')}" + (f", release {w['release']}" if w.get("release") else "")


def cluster_rows(rows: list[ServiceRow], statuses: dict[str, HostStatus],
                 services: Sequence[tuple[str, str, Sequence[str]]]) -> None:
    """Services over several hosts ((head, service, workers) from the inventory): the head's row gets
    each worker's state (``workers``, and a note naming those not ok) and the role ``head``; each
    worker's row the role ``worker of HEAD`` and its state in the note, in place of "not in the
    inventory"."""
    for head, svc, workers in services:
        states = [worker_state(statuses.get(w), w, svc) for w in workers]
        for r in rows:
            if r.host == head and r.service == svc:
                r.role, r.workers = "head", states
                bad = [worker_label(w) for w in states if not w["ok"]]
                said = ("workers: " + "; ".join(bad)) if bad else f"{len(states)} worker(s) up"
                r.note = "; ".join(x for x in (said, r.note) if x)
            elif r.host in workers and r.service == svc:
                w = next(x for x in states if x["host"] == r.host)
                r.role = f"worker of {head}"
                rest = r.note.replace("not in the inventory", "").strip("; ")
                r.note = "; ".join(x for x in (f"worker of {head}: {worker_label(w).split(': ', 1)[1]}", rest) if x)


def host_rows(status: HostStatus, settings: HostSettings | None) -> list[ServiceRow]:
    """One row per service: the inventory's services first, then any found only on the host."""
    inv_gpu = settings.gpu if settings else None
    services: list[Service] = list(settings.services) if settings else []
    names = [s.name for s in services]
    engines = {s.name: s.engine for s in services}
    model_paths = {s.name: s.model_path for s in services}
    by_name = {s.name: s for s in services}
    if not status.reachable:
        reason = status.error or "no answer"
        if not names:
            return [ServiceRow(host=status.host, service="-", card=inv_gpu or "-", unit="unreachable", note=reason)]
        return [
            ServiceRow(host=status.host, service=n, engine=engines[n], card=inv_gpu or "-", unit="unreachable",
                       note=reason)
            for n in names
        ]
    card = card_label(status.gpus, inv_gpu)
    extra = sorted(n for n in status.states if n not in engines)
    rows: list[ServiceRow] = []
    for name in names + extra:
        st = status.states.get(name)
        info = st.current_release if st else None
        engine = engines.get(name) or (info.manifest.engine if info and info.manifest else None) or None
        row = ServiceRow(host=status.host, service=name, engine=engine, card=card,
                         model=status.models.get(model_paths.get(name) or ""))
        if st is None:
            row.unit = "not deployed"
            hardware_note(row, status.gpu_health, by_name.get(name))
            rows.append(row)
            continue
        row.release = st.current
        row.digest = _digest(info)
        row.unit = st.unit
        row.health = health_label(info)
        row.confirmed = info.healthy if info is not None else None
        row.tokps = health_tokps(info)
        m = status.metrics.get(name)
        if isinstance(m, EngineMetrics):
            row.metrics = m.to_dict()
        elif isinstance(m, str):
            row.note = m
        _supervision(row, status.supervision.get(name), settings.watchdog.interval_s if settings else 30)
        if name not in engines:
            row.note = "; ".join(x for x in ("not in the inventory", row.note) if x)
        if st.current and info is None:
            row.note = "; ".join(x for x in (f"current points at missing release {st.current}", row.note) if x)
        row.note = "; ".join(x for x in (go_back_note(st), row.note) if x)
        hardware_note(row, status.gpu_health, by_name.get(name))
        rows.append(row)
    if not rows:
        rows.append(ServiceRow(host=status.host, service="-", card=card, unit="-", note="no services"))
    return rows


def _supervision(row: ServiceRow, sup: watchdog.Supervision | None, interval_s: int) -> None:
    """Restarts since the deploy (the watchdog's and systemd's own) and the watchdog's last action,
    in the row's JSON and, when there is anything to say, its note. A fresh judgement of the watchdog
    that the engine does no work (hung: requests stand still, or idle and a 1-token completion does not
    finish; down: /health fails) is the row's health, whatever the release's health mark says."""
    if sup is None:
        return
    row.supervision = sup.to_dict()
    stuck = sup.stuck(interval_s)
    if stuck is not None:
        row.health = stuck.verdict
        row.note = "; ".join(x for x in (row.note, f"watchdog: {stuck.detail} ({stuck.age_s} s ago)") if x)
    total = sup.watchdog_restarts + sup.unit_restarts
    if total or sup.last:
        said = f"restarts since deploy: {total} (watchdog {sup.watchdog_restarts})"
        if sup.last:
            said += f"; last watchdog action: {sup.last_action}"
        row.note = "; ".join(x for x in (row.note, said) if x)


@dataclass
class ReleaseRow:
    host: str
    service: str
    release: str
    time: str
    current: bool
    digest: str | None
    health: str
    tokps: float | None
    who: str | None
    message: str | None = None
    confirmed: bool = False  # its health mark says healthy: only such a release is ever gone back to
    go_back: bool = False  # where a failed deploy of this service would go back to now (decide.go_back_target)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def release_rows(host: str, states: dict[str, release_state.ServiceState]) -> list[ReleaseRow]:
    """Every kept release of every service, newest first per service."""
    out: list[ReleaseRow] = []
    for name in sorted(states):
        st = states[name]
        back = decide.go_back_target(st, None)
        for rid in sorted(st.releases, reverse=True):
            info = st.releases[rid]
            m = info.manifest
            out.append(ReleaseRow(
                host=host, service=name, release=rid,
                time=release_state.release_time(rid).isoformat(timespec="seconds"),
                current=(rid == st.current), digest=_digest(info), health=health_label(info),
                tokps=health_tokps(info), who=(m.who or None) if m else None, message=(m.message or None) if m else None,
                confirmed=info.healthy, go_back=(rid == back),
            ))
    return out


def fmt_tokps(v: float | None) -> str:
    return "-" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")


def fmt_metrics(m: dict[str, float | None] | None) -> tuple[str, str, str, str]:
    """(running/waiting, KV cache %, generated tokens) as table cells."""
    if not m:
        return "-", "-", "-", "-"

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    kv = m.get("kv_cache_usage")
    return (
        num(m.get("requests_running")),
        num(m.get("requests_waiting")),
        "-" if kv is None else f"{kv * 100:.0f}%",
        num(m.get("generation_tokens_total")),
    )


# ---------------------------------------------------------------------------------------------
# Shell


def fetch_metrics(remote: Any, service: Service, timeout: float = METRICS_TIMEOUT_S,
                  address: str = "127.0.0.1") -> EngineMetrics | str:
    """``GET /metrics`` of one service through a port forwarded to ``address:port`` as the host sees
    it (``HostSettings.reach_address_for``); a reason string when it fails."""
    headers = {}
    key = secret_if_readable(service.api_key)  # a key not readable here only means no live metrics
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        with remote.forward(service.port, address) as local_port, httpx.Client(
            timeout=httpx.Timeout(timeout), trust_env=False, verify=False  # plain HTTP into the tunnel: no TLS
        ) as client:
            with client.stream("GET", f"http://127.0.0.1:{local_port}/metrics", headers=headers) as resp:
                if resp.status_code != 200:
                    return f"/metrics answered {resp.status_code}"
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > MAX_METRICS_BYTES:
                        break
    except (httpx.HTTPError, OSError, LlmfleetError) as exc:
        return f"/metrics unreachable ({type(exc).__name__})"
    except Exception as exc:  # noqa: BLE001 - paramiko forwarding errors vary by version
        return f"/metrics unreachable ({type(exc).__name__})"
    return engine_metrics(service.engine, body.decode("utf-8", "replace"))


def query_host(
    host: Host,
    *,
    config: SshSettings | Settings | dict[str, Any] | None = None,
    settings: HostSettings | None = None,
    metrics: bool = True,
    connect: Callable[..., Any] | None = None,
) -> HostStatus:
    """Read one host. Never raises for the host's own trouble: returns ``reachable=False`` and why."""
    t0 = time.monotonic()
    connect = connect or ssh.connect
    root = settings.root if settings else "/opt/llmfleet"
    try:
        remote = connect(host, config=SshSettings.of(config))
    except LlmfleetError as exc:
        return HostStatus(host=host.name, reachable=False, error=str(exc), seconds=time.monotonic() - t0)
    try:
        paths = [s.model_path for s in settings.services if s.model_path] if settings else []
        gateways = gateway_services(settings)
        ports = [g.gateway.admin_port for g in gateways if g.gateway is not None]
        res = remote.run(status_script(root, paths, ports), sudo=True)
        if not release_state.state_complete(res.stdout):
            detail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [f"exit {res.rc}"]
            return HostStatus(host=host.name, reachable=False, error=f"state probe failed: {detail[0][:200]}",
                              seconds=time.monotonic() - t0)
        status = HostStatus(host=host.name, reachable=True, gpus=parse_card_names(res.stdout),
                            states=release_state.parse_state(res.stdout), supervision=watchdog.parse_status(res.stdout),
                            listening=parse_listening(res.stdout), containers=parse_worker_containers(res.stdout),
                            models=parse_models(res.stdout, paths), gpu_health=parse_gpu_health(res.stdout),
                            driver=parse_driver(res.stdout))
        answers = parse_gateway_answers(res.stdout)
        status.gateways = {g.name: gateway_read(answers.get(i), port)
                           for i, (g, port) in enumerate(zip(gateways, ports, strict=True))}
        if metrics and settings:
            for svc in settings.services:
                st = status.states.get(svc.name)
                if st is None or not st.current or not svc.is_engine:  # an exporter's or the gateway's series are not an engine's
                    continue
                status.metrics[svc.name] = fetch_metrics(remote, svc, address=settings.reach_address_for(svc))
    except LlmfleetError as exc:
        return HostStatus(host=host.name, reachable=False, error=str(exc), seconds=time.monotonic() - t0)
    finally:
        try:
            remote.close()
        except Exception:  # noqa: BLE001,S110 - closing a broken connection must not hide the result
            pass
    status.seconds = time.monotonic() - t0
    return status


def query_hosts(
    hosts: Sequence[Host],
    *,
    config: SshSettings | Settings | dict[str, Any] | None = None,
    forks: int = 10,
    timeout: float = 20.0,
    metrics: bool = True,
    connect: Callable[..., Any] | None = None,
) -> list[tuple[HostStatus, HostSettings | None]]:
    """Query hosts in parallel, each bounded by ``timeout`` seconds; results in the given order."""
    ssh_settings = SshSettings.of(config).bounded(timeout)
    settings = {h.name: settings_for(h) for h in hosts}  # schema errors are usage errors: before any SSH

    def one(h: Host) -> HostStatus:
        return query_host(h, config=ssh_settings, settings=settings[h.name], metrics=metrics, connect=connect)

    # the pool's own bound: connect + probe + metrics reads, plus slack
    results = run_on_hosts(one, list(hosts), forks=forks, timeout=timeout * 2 + 5)
    statuses = [r.value if r.ok and r.value is not None else HostStatus(host=r.host.name, reachable=False, error=r.error or "")
                for r in results]
    from llmfleet.fleet.speed import remember_status  # the fleet's decode history (docs/deploy.md)

    remember_status(statuses, hosts)
    return [(s, settings[s.host]) for s in statuses]
