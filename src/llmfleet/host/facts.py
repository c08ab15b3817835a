"""Host facts: parse the probe document into a typed ``Facts`` object (the model is
``llmfleet.knowledge.facts``).

Pure parsers (``parse_probe_document`` and the per-section helpers) plus ``gather``, the thin I/O part that
runs the probe over one SSH round trip. Anything unexpected in the document (garbage from
nvidia-smi, a driver string that does not parse, a section cut short) becomes a line in
``Facts.errors`` naming what was seen; parsing never raises on host output.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from llmfleet.host.gpu_health import health_from_sections
from llmfleet.host.probe import MAX_DOCUMENT, new_mark, probe_command, probe_sh
from llmfleet.knowledge.catalog import find_gpu
from llmfleet.knowledge.compat import branch_cuda, driver_branches
from llmfleet.knowledge.facts import Container, Disk, Docker, Facts, GpuFact, GpuHealth, ModelFile
from llmfleet.knowledge.release_state import parse_state, state_complete

if TYPE_CHECKING:  # paramiko and fabric load only when a connection is opened
    from llmfleet.host.ssh import Runner

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "memory.free",
    "driver_version",
    "compute_cap",
)
SECTION_CAP = 65536
# Sections the probe lets grow past 4 x SECTION_CAP (its STATECAP): every kept release's manifest, and
# nvidia-smi -q (about 14 KiB a card).
SECTION_CAPS = {"release_state": 1024 * 1024, "model_manifest": 1024 * 1024, "nvidia_q": 1024 * 1024}
_SHOWN = 120  # characters of a bad value quoted back in an error
_MAX_GPUS = 64
_MAX_ENTRIES = 2000


# ------------------------------------------------------------------------------------------------
# Document framing


class Section(BaseModel):
    name: str
    arg: str
    body: str
    rc: int | None
    complete: bool
    seconds: float | None = None  # the section's wall time on the host (t= of its end line)


def shown(value: str, n: int = _SHOWN) -> str:
    """A bad value quoted back safely: one line, bounded, control characters escaped."""
    one = value.replace("\r", "\\r").replace("\n", "\\n")
    one = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in one[: n * 2])
    return repr(one if len(one) <= n else one[: n - 3] + "...")


def split_sections(text: str, mark: str) -> tuple[list[Section], bool]:
    """Cut the probe document into sections. Returns (sections, saw_the_final_marker)."""
    begin = f"=={mark}== begin "
    end = f"=={mark}== end "
    done = f"=={mark}== done"
    sections: list[Section] = []
    lines = text.split("\n")
    cur: dict[str, Any] | None = None
    finished = False
    for line in lines:
        if line.startswith(begin):
            if cur is not None:
                sections.append(_close(cur, None, False))
            name, _, arg = line[len(begin):].partition(" ")
            cur = {"name": name, "arg": arg.strip(), "lines": []}
        elif line.startswith(end) and cur is not None:
            rest = line[len(end):]
            m = re.search(r"rc=(\d+)", rest)
            t = re.search(r"\bt=(\d{1,6}\.\d{1,3})\b", rest)
            sections.append(_close(cur, int(m.group(1)) if m else None, True, float(t.group(1)) if t else None))
            cur = None
        elif line == done:
            finished = True
        elif cur is not None:
            cur["lines"].append(line)
    if cur is not None:
        sections.append(_close(cur, None, False))
    return sections, finished


def _close(cur: dict[str, Any], rc: int | None, complete: bool, seconds: float | None = None) -> Section:
    lines = cur["lines"]
    if complete and lines and lines[-1] == "":
        lines = lines[:-1]  # the newline the probe always prints before the end marker
    return Section(name=cur["name"], arg=cur["arg"], body="\n".join(lines), rc=rc, complete=complete,
                   seconds=seconds)


# ------------------------------------------------------------------------------------------------
# Section parsers (each pure, each tolerant)


def _kv_lines(body: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in body.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and key.replace("-", "").replace("_", "").isalnum():
            out.setdefault(key, value.strip())
    return out


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    m = re.fullmatch(r"(\d{1,12})(?:\.\d+)?(?:\s*MiB)?", text)
    return int(m.group(1)) if m else None


_CC_RE = re.compile(r"^\d{1,2}\.\d{1,2}$")
_DRIVER_RE = re.compile(r"^\d{2,4}\.\d{1,4}(?:\.\d{1,4})?$")


def parse_driver_version(text: str) -> tuple[int, ...] | None:
    """``"570.133.07"`` -> ``(570, 133, 7)``; None when it does not parse."""
    text = text.strip()
    if not _DRIVER_RE.match(text):
        return None
    return tuple(int(p) for p in text.split("."))


def parse_gpu_query(
    body: str, errors: list[str], fields: tuple[str, ...] = QUERY_FIELDS
) -> tuple[list[GpuFact], list[str]]:
    """``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`` -> (GPUs, driver versions).

    A header line (``index, name, ...``) maps columns by name; without one the probe's field order
    is assumed. Units (``143771 MiB``) are accepted.
    """
    gpus: list[GpuFact] = []
    drivers: list[str] = []
    lines = [ln for ln in body.splitlines() if ln.strip()]
    cols = list(fields)
    if lines and lines[0].lower().startswith("index"):
        cols = [re.sub(r"\s*\[.*\]$", "", c.strip()).lower() for c in lines[0].split(",")]
        lines = lines[1:]
    for line in lines[: _MAX_GPUS + 1]:
        if len(gpus) >= _MAX_GPUS:
            errors.append(f"nvidia-smi: more than {_MAX_GPUS} GPU lines; ignored the rest")
            break
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < len(cols):
            errors.append(f"nvidia-smi: unexpected query line {shown(line)}")
            continue
        row = dict(zip(cols, parts, strict=False))
        idx = _int_or_none(row.get("index", ""))
        name = row.get("name", "")
        if idx is None or not name or not name.isprintable() or len(name) > 96:
            errors.append(f"nvidia-smi: unexpected query line {shown(line)}")
            continue
        cc = row.get("compute_cap")
        if cc is not None and not _CC_RE.match(cc):
            if cc not in ("[N/A]", "N/A", ""):
                errors.append(f"nvidia-smi: GPU {idx}: compute_cap {shown(cc)} does not parse")
            cc = None
        gpus.append(
            GpuFact(
                index=idx,
                name=name,
                uuid=row.get("uuid") or None,
                pci_bus_id=row.get("pci.bus_id") or None,
                memory_total_mib=_int_or_none(row.get("memory.total", "")),
                memory_used_mib=_int_or_none(row.get("memory.used", "")),
                memory_free_mib=_int_or_none(row.get("memory.free", "")),
                compute_capability=cc,
                compute_capability_source="driver" if cc else None,
            )
        )
        dv = row.get("driver_version")
        if dv:
            drivers.append(dv)
    return gpus, drivers


def parse_banner(body: str) -> dict[str, str]:
    """The plain ``nvidia-smi`` banner: driver version and the highest CUDA the driver supports."""
    out: dict[str, str] = {}
    m = re.search(r"Driver Version:\s*(\S+)", body)
    if m:
        out["driver"] = m.group(1)
    m = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", body)
    if m:
        out["cuda"] = m.group(1)
    return out


def parse_proc_driver(body: str) -> str | None:
    """``/proc/driver/nvidia/version``: ``NVRM version: NVIDIA UNIX ... Kernel Module ...  580.159.04  ...``."""
    m = re.search(r"NVRM version:.*?\s(\d{2,4}\.\d{1,4}(?:\.\d{1,4})?)\s", body + " ")
    return m.group(1) if m else None


def nvidia_smi_failure(body: str, rc: int | None) -> str:
    """Name why nvidia-smi failed, from its text."""
    text = body.strip()
    low = text.lower()
    if "couldn't communicate with the nvidia driver" in low or "nvidia-smi has failed" in low:
        return f"driver not loaded (nvidia-smi exit {rc}: {shown(text.splitlines()[0])})"
    if "no devices were found" in low:
        return "nvidia-smi found no devices"
    if "is not a valid field" in low:
        return f"nvidia-smi refused a field: {shown(text.splitlines()[0])}"
    if rc == 124 or rc == 137:
        return f"nvidia-smi timed out (exit {rc})"
    first = text.splitlines()[0] if text else "(no output)"
    return f"nvidia-smi exit {rc}: {shown(first)}"


_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TOPOLOGY_CAP = 16384
_TOPO_ROW_RE = re.compile(r"^\s*GPU\d+\s")


def parse_topology_section(body: str, rc: int | None, complete: bool, errors: list[str]) -> str | None:
    """``nvidia-smi topo -m`` -> the matrix text (legend included), or None with the reason in ``errors``.

    nvidia-smi underlines the header row with terminal escapes even when its output is a pipe
    (``\\x1b[4mGPU0\\tCPU Affinity...\\x1b[0m``, recorded on driver 580): they are removed, so the
    header's first cell reads ``GPU0``. The text must hold a ``GPU0`` row; anything else (a refusal,
    "No devices were found", a cut section) is an error line, never a crash."""
    text = _ANSI_RE.sub("", body).replace("\r", "")
    if rc != 0 or not complete:
        errors.append("nvidia-smi topo -m " + (f"failed: {nvidia_smi_failure(text, rc)}" if complete
                                                else "was cut short") + "; GPU links unknown")
        return None
    if not any(_TOPO_ROW_RE.match(ln) and "X" in ln.split()[1:] for ln in text.splitlines()):
        errors.append(f"nvidia-smi topo -m printed no GPU matrix: {shown(text.strip() or '(empty)')}")
        return None
    if len(text) > TOPOLOGY_CAP:
        errors.append(f"nvidia-smi topo -m: {len(text)} bytes; kept the first {TOPOLOGY_CAP}")
        text = text[:TOPOLOGY_CAP]
    return text.strip("\n")


def _versionish(text: str) -> str | None:
    m = re.search(r"v?(\d+\.\d+(?:\.\d+)?(?:[-+.~][0-9A-Za-z.+~-]*)?)", text)
    return m.group(1)[:64] if m else None


def parse_docker_info(body: str, rc: int | None, errors: list[str]) -> Docker:
    doc = Docker()
    data: dict[str, Any] | None = None
    other: list[str] = []
    for line in body.splitlines():
        s = line.strip()
        if s.startswith("{") and data is None:
            try:
                loaded = json.loads(s)
                if isinstance(loaded, dict):
                    data = loaded
                    continue
            except ValueError:
                pass
        if s:
            other.append(s)
    if data is not None:
        client = data.get("ClientInfo")
        if isinstance(client, dict) and isinstance(client.get("Version"), str):
            doc.client_version = client["Version"][:64]
        sv = data.get("ServerVersion")
        doc.server_version = sv[:64] if isinstance(sv, str) and sv else None
        rts = data.get("Runtimes")
        if isinstance(rts, dict):
            doc.runtimes = sorted(str(k)[:64] for k in list(rts)[:50])
        dr = data.get("DefaultRuntime")
        doc.default_runtime = dr[:64] if isinstance(dr, str) and dr else None
        root = data.get("DockerRootDir")
        doc.root_dir = root[:1024] if isinstance(root, str) and root else None
        cdi = data.get("CDISpecDirs")
        if isinstance(cdi, list):
            doc.cdi_spec_dirs = [str(x)[:256] for x in cdi[:20]]
        plugins = client.get("Plugins") if isinstance(client, dict) else None
        for plugin in plugins[:50] if isinstance(plugins, list) else []:
            if isinstance(plugin, dict) and plugin.get("Name") == "compose" and isinstance(plugin.get("Version"), str):
                doc.compose_plugin = _versionish(plugin["Version"])
                break
        server_errors = data.get("ServerErrors")
        if isinstance(server_errors, list) and server_errors:
            other = [str(e) for e in server_errors] + other
    if rc != 0 or doc.server_version is None:
        detail = next((o for o in other if "docker" in o.lower() or "permission" in o.lower()), None)
        detail = detail or (other[0] if other else f"exit {rc}, no output")
        low = detail.lower()
        if "permission denied" in low:
            kind = "docker socket permission denied"
        elif "cannot connect" in low or "connection refused" in low or "is the docker daemon running" in low:
            kind = "docker socket refused (daemon not running?)"
        elif rc in (124, 137):
            kind = "docker info timed out"
        else:
            kind = "docker info failed"
        doc.error = f"{kind}: {shown(detail)}"
        errors.append(doc.error)
    return doc


def _ports_from_docker(text: str) -> list[int]:
    # "0.0.0.0:8000->8000/tcp, :::8000->8000/tcp"
    return sorted({int(p) for p in re.findall(r":(\d{1,5})->", text) if 0 < int(p) < 65536})


def _labels(text: Any) -> dict[str, str]:
    if isinstance(text, dict):
        return {str(k)[:256]: str(v)[:256] for k, v in list(text.items())[:100]}
    out: dict[str, str] = {}
    if isinstance(text, str):
        for part in text.split(",")[:100]:
            k, sep, v = part.partition("=")
            if sep:
                out[k.strip()[:256]] = v.strip()[:256]
    return out


def parse_docker_ps(body: str, errors: list[str]) -> list[Container]:
    out: list[Container] = []
    for line in body.splitlines()[:500]:
        s = line.strip()
        if not s:
            continue
        try:
            row = json.loads(s)
        except ValueError:
            errors.append(f"docker ps: unexpected line {shown(s)}")
            continue
        if not isinstance(row, dict):
            continue
        out.append(
            Container(
                name=str(row.get("Names", ""))[:256],
                image=str(row.get("Image", ""))[:512],
                state=str(row.get("State", ""))[:64],
                ports=_ports_from_docker(str(row.get("Ports", ""))),
                labels=_labels(row.get("Labels", "")),
            )
        )
    return out


def parse_docker_images(body: str) -> list[str]:
    out: list[str] = []
    for line in body.splitlines()[:2000]:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        repo, tag, digest = str(row.get("Repository", "")), str(row.get("Tag", "")), str(row.get("Digest", ""))
        if repo and repo != "<none>":
            if tag and tag != "<none>":
                out.append(f"{repo}:{tag}"[:512])
            if digest.startswith("sha256:"):
                out.append(f"{repo}@{digest}"[:512])
    return out


def parse_df(label: str, body: str, errors: list[str]) -> Disk | None:
    kv = _kv_lines(body)
    path = kv.get("path", "")
    for line in body.splitlines():
        parts = line.split()
        # Filesystem 1024-blocks Used Available Capacity Mounted-on
        if len(parts) >= 6 and parts[1].isdigit() and parts[3].isdigit():
            return Disk(
                label=label,
                path=path,
                mount=" ".join(parts[5:])[:1024],
                total_mib=int(parts[1]) // 1024,
                free_mib=int(parts[3]) // 1024,
            )
    errors.append(f"df {label}: no usable output {shown(body.strip() or '(empty)')}")
    return None


def parse_meminfo(body: str) -> tuple[int | None, int | None]:
    vals: dict[str, int] = {}
    for line in body.splitlines():
        m = re.match(r"^(MemTotal|MemAvailable):\s+(\d+)\s*kB", line)
        if m:
            vals[m.group(1)] = int(m.group(2)) // 1024
    return vals.get("MemTotal"), vals.get("MemAvailable")


def parse_ss(body: str) -> list[int]:
    """``ss -ltnH``: ``LISTEN 0 128 0.0.0.0:22 0.0.0.0:*``."""
    ports: set[int] = set()
    for line in body.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            m = re.search(r":(\d{1,5})$", parts[3])
            if m and 0 < int(m.group(1)) < 65536:
                ports.add(int(m.group(1)))
    return sorted(ports)


def parse_proc_net_tcp(body: str) -> list[int]:
    """/proc/net/tcp{,6}: local address ``0100007F:1F90``, state ``0A`` = LISTEN."""
    ports: set[int] = set()
    for line in body.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[3] == "0A":
            _, _, port = parts[1].rpartition(":")
            try:
                p = int(port, 16)
            except ValueError:
                continue
            if 0 < p < 65536:
                ports.add(p)
    return sorted(ports)


def parse_model(body: str) -> ModelFile:
    lines = body.splitlines()
    head = lines[: lines.index("entries:")] if "entries:" in lines else lines
    kv = _kv_lines("\n".join(head))
    kind = kv.get("type", "unknown")
    if kind not in ("dir", "file", "other", "missing"):
        kind = "unknown"
    mf = ModelFile(path=kv.get("path", ""), kind=kind)
    if "readable" in kv:
        mf.readable = kv["readable"] == "yes"
    if kind == "dir":
        total = 0
        after = False
        for ln in lines:
            if ln == "entries:":
                after = True
                continue
            if not after:
                continue
            parts = ln.split(None, 8)
            if len(parts) == 9 and parts[4].isdigit():
                if len(mf.entries) < _MAX_ENTRIES:
                    mf.entries.append(parts[8][:512])
                if ln.startswith("-"):
                    total += int(parts[4])
        mf.size_bytes = total
    elif kind == "file":
        parts = kv.get("ls", "").split(None, 8)
        if len(parts) >= 5 and parts[4].isdigit():
            mf.size_bytes = int(parts[4])
        mf.magic = kv.get("magic", "")[:8] or None
    return mf


def parse_toolkit_version(body: str) -> str | None:
    # "NVIDIA Container Toolkit CLI version 1.17.5" / "cli-version: 1.17.5" / "version: 1.14.3"
    for line in body.splitlines():
        m = re.search(r"version[:\s]+v?(\d+\.\d+\.\d+(?:[-~.][0-9A-Za-z.]+)?)", line, re.I)
        if m:
            return m.group(1)[:64]
    return None


# ------------------------------------------------------------------------------------------------
# Whole document


def parse_probe_document(
    text: str,
    mark: str,
    host: str,
    *,
    rc: int | None = 0,
    stderr: str = "",
    gpu_lookup: Any = None,
    driver_branches: dict[int, str] | None = None,
) -> Facts:
    """Probe document -> Facts. ``gpu_lookup(name)`` returns a GPU catalog entry or None (for the
    compute-capability fallback); ``driver_branches`` maps a driver branch to its highest CUDA."""
    facts = Facts(host=host)
    by = _sections_by_name(facts, text, mark, rc, stderr)
    if by is None:
        return facts

    def one(name: str) -> Section | None:
        got = by.get(name)
        return got[0] if got else None

    _parse_meta_part(facts, one)
    _parse_gpu_part(facts, one, gpu_lookup, driver_branches or {})
    facts.gpu_health = _parse_health(facts, one)

    cc = one("cuda_compat")
    if cc:
        facts.host_cuda_compat = [ln.strip()[:256] for ln in cc.body.splitlines() if ln.startswith("/")][:20]

    _parse_docker_part(facts, one)
    _parse_toolkit_part(facts, one)
    _parse_disk_part(facts, one, by)
    _parse_ports_part(facts, one)
    _parse_state_part(facts, one, by)
    return facts


def _sections_by_name(facts: Facts, text: str, mark: str, rc: int | None, stderr: str) -> dict[str, list[Section]] | None:
    """The document's sections by name, each cut to its cap (what was cut is an error in ``facts``);
    None when it has none."""
    errors = facts.errors
    if len(text) > MAX_DOCUMENT:
        errors.append(f"probe output is {len(text)} bytes; only the first {MAX_DOCUMENT} were read")
        text = text[:MAX_DOCUMENT]
    sections, finished = split_sections(text, mark)
    if not sections:
        first = (stderr.strip() or text.strip() or "(no output)").splitlines()[0]
        errors.append(f"probe produced no sections (exit {rc}): {shown(first)}")
        return None
    if not finished:
        last = sections[-1]
        errors.append(f"probe ended early (exit {rc}) in section {last.name}; facts are partial")
    by: dict[str, list[Section]] = {}
    for s in sections:
        by.setdefault(s.name, []).append(s)
        if s.seconds is not None and len(facts.probe_seconds) < 200:
            facts.probe_seconds[f"{s.name} {s.arg}".strip()[:128]] = s.seconds
        cap = SECTION_CAPS.get(s.name, SECTION_CAP * 4)
        if s.complete and len(s.body) > cap + 16:
            errors.append(f"section {s.name}: {len(s.body)} bytes, over the cap; cut")
            s.body = s.body[:cap]
    return by


def _parse_meta_part(facts: Facts, one: Any) -> None:
    meta = one("meta")
    if meta:
        kv = _kv_lines(meta.body)
        pv = kv.get("probe_version", "")
        facts.probe_version = int(pv) if pv.isdigit() else None
        facts.kernel = kv.get("kernel") or None
        facts.machine = kv.get("machine") or None
        facts.systemd = {"yes": True, "no": False}.get(kv.get("systemd", ""))
        facts.root = kv.get("root") or None
    tools_section = one("tools")
    tools = _kv_lines(tools_section.body) if tools_section else {}
    facts.nvidia_smi = tools.get("nvidia-smi") or None
    facts.toolkit.runtime_path = tools.get("nvidia-container-runtime") or None
    facts.toolkit.hook_path = tools.get("nvidia-container-runtime-hook") or None


def _parse_docker_part(facts: Facts, one: Any) -> None:
    errors = facts.errors
    di = one("docker_info")
    if di is None:
        facts.docker.error = "docker CLI not found on PATH"
        errors.append(facts.docker.error)
    else:
        facts.docker = parse_docker_info(di.body, di.rc if di.complete else None, errors)
    # probe v3 asks `docker ps` and `docker image ls` beside `docker info`: read only when the engine answered
    ps = one("docker_ps")
    if ps and facts.docker.error is None:
        facts.containers = parse_docker_ps(ps.body, errors)
    im = one("docker_images")
    if im and facts.docker.error is None:
        facts.images = parse_docker_images(im.body)

    v2 = one("compose_v2")
    if v2 and v2.rc == 0:
        facts.compose.v2 = _versionish(v2.body)
    else:  # probe v3 asks compose only when docker info does not list it
        facts.compose.v2 = facts.docker.compose_plugin
    v1 = one("compose_v1")
    if v1 and v1.rc == 0:
        facts.compose.v1 = _versionish(v1.body)


def _parse_toolkit_part(facts: Facts, one: Any) -> None:
    ctk = one("nvidia_ctk")
    if ctk and ctk.rc == 0:
        facts.toolkit.version = parse_toolkit_version(ctk.body)
    ncli = one("nvidia_container_cli")
    if ncli and ncli.rc == 0:
        facts.toolkit.cli_version = parse_toolkit_version(ncli.body)
    cdi = one("cdi")
    if cdi:
        for ln in cdi.body.splitlines()[:200]:
            if ln.startswith("file="):
                facts.toolkit.cdi_specs.append(ln[5:][:256])
            else:
                m = re.search(r"kind\"?\s*:\s*\"?([A-Za-z0-9./_-]+)", ln)
                if m and m.group(1) not in facts.toolkit.cdi_kinds:
                    facts.toolkit.cdi_kinds.append(m.group(1)[:128])


def _parse_disk_part(facts: Facts, one: Any, by: dict[str, list[Section]]) -> None:
    """Memory, and each disk (a model's labelled by its path)."""
    mem = one("meminfo")
    if mem:
        facts.ram_total_mib, facts.ram_available_mib = parse_meminfo(mem.body)
    model_path_by_index = {s.arg: _kv_lines(s.body.split("\nentries:", 1)[0]).get("path", "")
                           for s in by.get("model", [])}
    for s in by.get("df", [])[:110]:
        label = s.arg or "disk"
        if label.startswith("model") and model_path_by_index.get(label[5:]):
            label = "model:" + model_path_by_index[label[5:]]
        d = parse_df(label, s.body, facts.errors)
        if d:
            facts.disks.append(d)


def _parse_ports_part(facts: Facts, one: Any) -> None:
    ss = one("ss")
    if ss and ss.rc == 0:
        facts.ports = parse_ss(ss.body)
    elif one("proc_net_tcp"):
        facts.ports = parse_proc_net_tcp(one("proc_net_tcp").body)
    elif ss:
        facts.errors.append(f"ss failed (exit {ss.rc}): {shown(ss.body.strip() or '(no output)')}")


def _parse_state_part(facts: Facts, one: Any, by: dict[str, list[Section]]) -> None:
    """The release state, and each model with its manifest."""
    rs = one("release_state")
    if rs is not None:
        facts.releases = parse_state(rs.body)
        facts.releases_read = rs.complete and state_complete(rs.body)
        if not state_complete(rs.body):
            facts.errors.append("release state cut short; releases are partial")
    manifests = {s.arg: s for s in by.get("model_manifest", [])}
    for s in by.get("model", [])[:100]:
        mf = parse_model(s.body)
        if mf.path:
            _read_manifest(mf, manifests.get(s.arg))
            facts.models.append(mf)


def _read_manifest(mf: ModelFile, section: Section | None) -> None:
    """The model's manifest and its files' size and mtime (llmfleet.host.model_scripts.MANIFEST_READER)."""
    from llmfleet.host.model_scripts import parse_reader

    if section is None or not section.complete:
        return
    hm = parse_reader(section.body, mf.path)
    mf.manifest_read = hm.read
    mf.manifest = hm.manifest_text
    mf.observed = {rel: [size, mtime] for rel, (size, mtime) in hm.files.items()}


def _parse_gpu_part(facts: Facts, one: Any, gpu_lookup: Any, branches: dict[int, str]) -> None:
    errors = facts.errors
    q = one("nvidia_query")
    q_nocc = one("nvidia_query_nocc")
    banner = one("nvidia_smi")
    proc = one("proc_driver")
    if proc is not None and proc.rc == 0:
        facts.driver_loaded = True
        if "Kernel Module" in proc.body:
            facts.driver_kernel_modules = "open" if "Open Kernel Module" in proc.body else "proprietary"
    if facts.nvidia_smi is None and q is None:
        if proc is not None and proc.rc == 0:
            errors.append("nvidia-smi not found on PATH (the NVIDIA driver module is loaded)")
        else:
            errors.append("nvidia-smi not found on PATH and no NVIDIA driver loaded")
            facts.driver_loaded = False
    gpus: list[GpuFact] = []
    drivers: list[str] = []
    source = None
    if q is not None and q.rc == 0:
        source = q
    elif q_nocc is not None and q_nocc.rc == 0:
        source = q_nocc
        if q is not None and "compute_cap" in q.body:
            pass  # R470 and older: no compute_cap field; fall back to the catalog below
        elif q is not None:
            errors.append(nvidia_smi_failure(q.body, q.rc))
    elif q is not None:
        failure = q_nocc if q_nocc is not None else q
        msg = nvidia_smi_failure(failure.body, failure.rc)
        errors.append(msg)
        if msg.startswith("driver not loaded"):
            facts.driver_loaded = False
    if source is not None:
        fields = QUERY_FIELDS if source is q else QUERY_FIELDS[:-1]
        gpus, drivers = parse_gpu_query(source.body, errors, fields)
        if not gpus and not any(e.startswith("nvidia-smi") for e in errors):
            errors.append(f"nvidia-smi listed no GPUs: {shown(source.body.strip() or '(empty)')}")
        if gpus:
            facts.driver_loaded = True
    banner_info = parse_banner(banner.body) if banner is not None and banner.rc == 0 else {}
    driver = next(iter(drivers), None) or banner_info.get("driver")
    if driver is None and proc is not None:
        driver = parse_proc_driver(proc.body)
    if driver is not None:
        if parse_driver_version(driver) is None:
            errors.append(f"driver version {shown(driver)} does not parse")
        facts.driver_version = driver[:64]
    if banner_info.get("cuda"):
        facts.cuda_driver_version = banner_info["cuda"]
        facts.cuda_driver_source = "banner"
    elif facts.driver_version:
        cuda = branch_cuda(facts.driver_version, branches)
        if cuda:
            facts.cuda_driver_version = cuda
            facts.cuda_driver_source = "driver-branch"
        elif parse_driver_version(facts.driver_version):
            errors.append(f"driver {facts.driver_version}: branch not in the engine catalog's driver table")
    for g in gpus:
        entry = _lookup(gpu_lookup, g.name)
        if entry is not None:
            g.catalog_id = _field(entry, "id")
            dc = _field(entry, "data_center")
            g.data_center = bool(dc) if dc is not None else None
            if g.compute_capability is None:
                cat_cc = _field(entry, "compute_capability")
                if isinstance(cat_cc, str | float) and _CC_RE.match(str(cat_cc)):
                    g.compute_capability = str(cat_cc)
                    g.compute_capability_source = "catalog"
        if g.compute_capability is None:
            errors.append(f"GPU {g.index} {shown(g.name)}: compute capability unknown (driver has no "
                          "compute_cap field and the card is not in the GPU catalog)")
    facts.gpus = gpus
    topo = one("nvidia_topo")
    if topo is not None and (gpus or topo.rc == 0):  # no GPUs: the failure above already says why
        facts.gpu_topology = parse_topology_section(topo.body, topo.rc, topo.complete, errors)


def _parse_health(facts: Facts, one: Any) -> GpuHealth | None:
    """The cards' hardware health (``llmfleet.host.gpu_health``): None when the probe read none of it."""
    q, xid, pci = one("nvidia_q"), one("kernel_xid"), one("pci_gpus")
    if q is None and xid is None and pci is None:
        return None
    failed = ""
    if q is not None and not q.complete:
        failed = "cut short"
    elif q is not None and q.rc != 0:
        failed = nvidia_smi_failure(q.body, q.rc)
    others = [s.body for s in (one("nvidia_query"), one("nvidia_query_nocc"), one("nvidia_smi")) if s is not None]
    return health_from_sections(q.body if q is not None else None, xid.body if xid is not None else None,
                                pci.body if pci is not None else None, facts.gpus, q_failed=failed, lost_from=others)


def _lookup(gpu_lookup: Any, name: str) -> Any:
    if gpu_lookup is None:
        return None
    try:
        return gpu_lookup(name)
    except Exception:  # an unknown card is an answer, not a crash
        return None


def _field(entry: Any, key: str) -> Any:
    if isinstance(entry, dict):
        return entry.get(key)
    return getattr(entry, key, None)


# ------------------------------------------------------------------------------------------------
# I/O


def default_gpu_lookup(name: str) -> Any:
    return find_gpu(name)


def gather(remote: Runner, *, root: str = "/opt/llmfleet", model_paths: list[str] | tuple[str, ...] = (),
           timeout: float = 180, sudo: bool = False) -> Facts:
    """Run the probe on the host in one round trip and parse what it printed.

    ``sudo``: run it as the deploy's user (``sudo -n``, as every deploy step), so that its release
    state section reads what the deploy's own state reader would (a deploy needs no second read).
    Raises ``RemoteError`` only when SSH itself fails; a probe that fails part-way returns the facts
    it found with the failures in ``errors``.
    """
    # a probe sent ahead (llmfleet.host.early) is taken by ``run`` when this is the very same command
    mark = getattr(remote, "probe_mark", None) or new_mark()  # ssh.Remote has one; a scripted remote need not
    result = remote.run(probe_command(mark, root, list(model_paths)), stdin=probe_sh(), timeout=timeout,
                        sudo=sudo)
    stdout = result.stdout if isinstance(result.stdout, str) else result.stdout.decode("utf-8", "replace")
    stderr = result.stderr if isinstance(result.stderr, str) else result.stderr.decode("utf-8", "replace")
    host = remote.name or ""
    return parse_probe_document(stdout, mark, host, rc=result.rc, stderr=stderr,
                       gpu_lookup=default_gpu_lookup, driver_branches=driver_branches())
