#!/usr/bin/python3
"""nvidia-smi SIMULATOR for lab hosts (there is no GPU in the lab).

Installed as ``/usr/bin/nvidia-smi`` in the lab host image. It prints output shaped like the real
nvidia-smi for the cards and driver described in ``/etc/llmfleet-sim/gpus.json`` (written at
``lab.up`` from the host's inventory vars ``lab_gpu``, ``lab_driver``, ``lab_gpu_count`` and the GPU
catalog). Layouts follow recorded real output (docs/reference: an H200 on driver 580): the wide
banner of drivers >= 530 and the narrower one of older branches.

Behaviour it reproduces:
- ``nvidia-smi`` banner with ``Driver Version: X  CUDA Version: Y`` (highest CUDA the driver supports)
- ``-L``, ``--version`` (drivers >= 510), ``-i/--id`` selection
- ``topo -m`` / ``topo --matrix``: the GPU link matrix, laid out as recorded on a real H200 (driver 580,
  header underlined with terminal escapes even into a pipe). Links: an NVLink card (the GPU catalog's
  ``interconnect``) gives NV2 between the GPUs of one group of four; a PCIe card PIX between the two
  GPUs of a pair, PHB inside a group of four; SYS across groups (the second CPU)
- ``--query-gpu=FIELDS --format=csv[,noheader][,nounits]``
- ``--query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv[,noheader][,nounits]``:
  the processes running in the host's Docker containers (the lab's engines), each with its real
  resident memory (VmRSS) standing in for GPU memory, on GPU 0; when /proc cannot be read it says
  so and exits 3 instead of inventing figures
- R470 and older have no ``compute_cap`` field: ``Field "compute_cap" is not a valid field to query.``
  and exit code 2, exactly like an unknown field
- "dead driver" mode: when ``/etc/llmfleet-sim/driver-dead`` exists every call fails like a host
  whose kernel module is gone, exit code 9

Pure functions (``render_*``, ``run``) take the config dict and return (stdout, exit code); only
``main`` touches files and the clock. Standard library only: it runs on the host's python3.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

SIM_DIR = "/etc/llmfleet-sim"
CONFIG_PATH = f"{SIM_DIR}/gpus.json"
DEAD_FLAG = f"{SIM_DIR}/driver-dead"

DEAD_DRIVER_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
DEAD_DRIVER_RC = 9
INVALID_ARGS_MESSAGE = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"

# Highest CUDA version each driver branch supports (the banner's "CUDA Version").
CUDA_BY_BRANCH = {
    450: "11.0", 455: "11.1", 460: "11.2", 465: "11.3", 470: "11.4", 495: "11.5", 510: "11.6",
    515: "11.7", 520: "11.8", 525: "12.0", 530: "12.1", 535: "12.2", 545: "12.3", 550: "12.4",
    555: "12.5", 560: "12.6", 565: "12.7", 570: "12.8", 575: "12.9", 580: "13.0",
}
# A full version for a bare branch such as "535" (released builds of each branch).
DEFAULT_BUILD = {
    470: "470.256.02", 525: "525.147.05", 535: "535.247.01", 550: "550.163.01", 560: "560.35.05",
    570: "570.195.03", 575: "575.64.05", 580: "580.95.05",
}
FIRST_BRANCH_WITH_COMPUTE_CAP = 510
FIRST_BRANCH_WITH_VERSION_FLAG = 510
FIRST_BRANCH_WIDE_LAYOUT = 530

# field -> (unit shown in header and value, or None)
QUERY_FIELDS: dict[str, str | None] = {
    "index": None, "name": None, "uuid": None, "pci.bus_id": None, "count": None,
    "memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB", "memory.reserved": "MiB",
    "driver_version": None, "compute_cap": None, "temperature.gpu": None,
    "utilization.gpu": "%", "utilization.memory": "%", "power.limit": "W", "power.draw": "W",
    "persistence_mode": None, "pstate": None, "clocks.max.memory": "MHz", "compute_mode": None,
}
FIELD_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}


def driver_branch(version: str) -> int:
    return int(str(version).split(".")[0])


def full_driver_version(version: str) -> str:
    """'535' -> '535.247.01'; a full version is kept as given."""
    v = str(version).strip()
    if "." in v:
        return v
    return DEFAULT_BUILD.get(int(v), f"{int(v)}.00.01")


def cuda_for_driver(version: str) -> str:
    branch = driver_branch(version)
    known = [b for b in sorted(CUDA_BY_BRANCH) if b <= branch]
    if not known:
        return "11.0"
    return CUDA_BY_BRANCH[known[-1]]


def has_compute_cap(version: str) -> bool:
    return driver_branch(version) >= FIRST_BRANCH_WITH_COMPUTE_CAP


def _gpus(cfg: dict, ids: list[int] | None) -> list[dict]:
    gpus = list(cfg.get("gpus", []))
    if ids is not None:
        gpus = [g for g in gpus if int(g["index"]) in ids]
    return gpus


def _free(g: dict) -> int:
    return int(g["memory_total_mib"]) - int(g.get("memory_used_mib", 0)) - int(g.get("memory_reserved_mib", 0))


def _field_value(field: str, g: dict, cfg: dict, nounits: bool) -> str:
    unit = QUERY_FIELDS[field]
    if field == "index":
        raw = str(g["index"])
    elif field == "name":
        raw = g["name"]
    elif field == "uuid":
        raw = g["uuid"]
    elif field == "pci.bus_id":
        raw = g["pci_bus_id"]
    elif field == "count":
        raw = str(len(cfg.get("gpus", [])))
    elif field == "memory.total":
        raw = str(int(g["memory_total_mib"]))
    elif field == "memory.used":
        raw = str(int(g.get("memory_used_mib", 0)))
    elif field == "memory.reserved":
        raw = str(int(g.get("memory_reserved_mib", 0)))
    elif field == "memory.free":
        raw = str(_free(g))
    elif field == "driver_version":
        raw = cfg["driver_version"]
    elif field == "compute_cap":
        raw = g["compute_cap"]
    elif field == "temperature.gpu":
        raw = str(int(g.get("temperature_c", 34)))
    elif field == "utilization.gpu":
        raw = str(int(g.get("utilization_pct", 0)))
    elif field == "utilization.memory":
        raw = "0"
    elif field == "power.limit":
        raw = f"{float(g['power_limit_w']):.2f}"
    elif field == "power.draw":
        raw = f"{float(g.get('power_draw_w', 25)):.2f}"
    elif field == "persistence_mode":
        raw = "Enabled" if g.get("persistence", True) else "Disabled"
    elif field == "pstate":
        raw = g.get("pstate", "P0")
    elif field == "clocks.max.memory":
        raw = str(int(g.get("clocks_max_memory_mhz", 877)))
    elif field == "compute_mode":
        raw = "Default"
    else:  # pragma: no cover - guarded by the caller
        raise KeyError(field)
    if unit and not nounits:
        return f"{raw} {unit}"
    return raw


def render_query(cfg: dict, fields_arg: str, fmt: str, ids: list[int] | None = None) -> tuple[str, int]:
    """``--query-gpu=FIELDS --format=FMT``: CSV lines separated by ', '."""
    opts = [o.strip() for o in fmt.split(",") if o.strip()]
    if not opts or opts[0] != "csv" or any(o not in ("csv", "noheader", "nounits") for o in opts):
        return f'"{fmt}" is not a valid format.\n', 2  # only csv is simulated
    fields = [FIELD_ALIASES.get(f.strip(), f.strip()) for f in fields_arg.split(",") if f.strip()]
    for f in fields:
        if f not in QUERY_FIELDS or (f == "compute_cap" and not has_compute_cap(cfg["driver_version"])):
            return f'Field "{f}" is not a valid field to query.\n\n', 2
    nounits = "nounits" in opts
    lines = []
    if "noheader" not in opts:
        lines.append(", ".join(f"{f} [{QUERY_FIELDS[f]}]" if QUERY_FIELDS[f] else f for f in fields))
    for g in _gpus(cfg, ids):
        lines.append(", ".join(_field_value(f, g, cfg, nounits) for f in fields))
    return "".join(line + "\n" for line in lines), 0


APP_FIELDS: dict[str, str | None] = {"pid": None, "process_name": None, "name": None, "used_memory": "MiB",
                                     "used_gpu_memory": "MiB", "gpu_uuid": None, "gpu_bus_id": None}
CANNOT_READ_PROCS = "nvidia-smi simulator: cannot read the container processes' memory from /proc\n"


def render_compute_apps(cfg: dict, fields_arg: str, fmt: str, procs: list[dict] | None) -> tuple[str, int]:
    """``--query-compute-apps=FIELDS --format=FMT``; ``procs``: [{pid, name, used_mib}] or None (unreadable)."""
    opts = [o.strip() for o in fmt.split(",") if o.strip()]
    if not opts or opts[0] != "csv" or any(o not in ("csv", "noheader", "nounits") for o in opts):
        return f'"{fmt}" is not a valid format.\n', 2
    fields = [f.strip() for f in fields_arg.split(",") if f.strip()]
    for f in fields:
        if f not in APP_FIELDS:
            return f'Field "{f}" is not a valid field to query.\n\n', 2
    if procs is None:
        return CANNOT_READ_PROCS, 3
    nounits = "nounits" in opts
    gpu = (cfg.get("gpus") or [{}])[0]
    lines = []
    if "noheader" not in opts:
        lines.append(", ".join(f"{f} [{APP_FIELDS[f]}]" if APP_FIELDS[f] else f for f in fields))
    for p in procs:
        vals = []
        for f in fields:
            if f == "pid":
                vals.append(str(p["pid"]))
            elif f in ("process_name", "name"):
                vals.append(str(p.get("name", "")))
            elif f in ("used_memory", "used_gpu_memory"):
                vals.append(f"{int(p['used_mib'])}" + ("" if nounits else " MiB"))
            elif f == "gpu_uuid":
                vals.append(str(gpu.get("uuid", "")))
            else:
                vals.append(str(gpu.get("pci_bus_id", gpu.get("bus_id", ""))))
        lines.append(", ".join(vals))
    return "".join(line + "\n" for line in lines), 0


def container_processes(proc: str = "/proc") -> list[dict] | None:  # pragma: no cover - reads this host
    """Processes inside Docker containers with their resident memory (MiB); None when /proc is unreadable."""
    try:
        pids = [d for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return None
    out = []
    for pid in sorted(pids, key=int):
        try:
            with open(f"{proc}/{pid}/cgroup", encoding="utf-8") as fh:
                cg = fh.read()
            if "docker" not in cg and "containerd" not in cg:
                continue
            with open(f"{proc}/{pid}/status", encoding="utf-8") as fh:
                status = fh.read()
            with open(f"{proc}/{pid}/comm", encoding="utf-8") as fh:
                name = fh.read().strip()
        except OSError:
            continue
        rss = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS:")), None)
        if rss and rss.isdigit() and int(rss) > 0:
            out.append({"pid": int(pid), "name": name, "used_mib": int(rss) // 1024})
    return out


TOPO_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""
FIRST_BRANCH_GPU_NUMA_ID = 535  # the "GPU NUMA ID" column: seen on 535 and 580 output, absent on older


def topo_link(cfg: dict, i: int, j: int) -> str:
    """How GPU i reaches GPU j (i != j) on the simulated board."""
    if i // 4 != j // 4:
        return "SYS"
    if cfg.get("interconnect") == "nvlink":
        return "NV2"
    return "PIX" if i // 2 == j // 2 else "PHB"


def render_topo(cfg: dict, cpus: int = 16) -> str:
    """``nvidia-smi topo -m`` for the configured GPUs."""
    gpus = _gpus(cfg, None)
    numa_id = driver_branch(cfg["driver_version"]) >= FIRST_BRANCH_GPU_NUMA_ID
    cols = [f"GPU{g['index']}" for g in gpus] + ["CPU Affinity", "NUMA Affinity"] + (["GPU NUMA ID"] if numa_id else [])
    lines = ["\t\x1b[4m" + "\t".join(cols) + "\x1b[0m"]
    sockets = 2 if len(gpus) > 4 else 1
    per = max(1, cpus // sockets)
    for g in gpus:
        i = int(g["index"])
        node = min(i // 4, sockets - 1)
        cells = [" X " if int(h["index"]) == i else topo_link(cfg, i, int(h["index"])) for h in gpus]
        cells += [f"{node * per}-{node * per + per - 1}", str(node)]
        if numa_id:
            cells += ["", "N/A"]
        lines.append(f"GPU{i}\t" + "\t".join(cells))
    return "\n".join(lines) + "\n" + TOPO_LEGEND


def render_list(cfg: dict, ids: list[int] | None = None) -> str:
    return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in _gpus(cfg, ids))


def render_version(cfg: dict) -> tuple[str, int]:
    v = cfg["driver_version"]
    if driver_branch(v) < FIRST_BRANCH_WITH_VERSION_FLAG:
        return INVALID_ARGS_MESSAGE, 2
    nvml = ".".join(v.split(".")[:2])
    return (
        f"NVIDIA-SMI version  : {v}\n"
        f"NVML version        : {nvml}\n"
        f"DRIVER version      : {v}\n"
        f"CUDA Version        : {cuda_for_driver(v)}\n"
    ), 0


def render_proc_version(cfg: dict) -> str:
    """Text of /proc/driver/nvidia/version for this driver (simulated)."""
    v = cfg["driver_version"]
    # The open kernel modules (the default from R560) drive only Turing and newer: a host with an older
    # card runs the proprietary modules (NVIDIA blog 'Transitions Fully Towards Open-Source GPU Kernel Modules').
    ccs = [float(g.get("compute_cap") or 0) for g in cfg.get("gpus", [])]
    turing_up = bool(ccs) and min(ccs) >= 7.5
    kind = "Open Kernel Module for x86_64" if driver_branch(v) >= 560 and turing_up else "x86_64 Kernel Module"
    return (
        f"NVRM version: NVIDIA UNIX {kind}  {v}  Release Build  (dvs-builder@U16-I3-B07-4-1)  \n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n"
    )


def _fmt_name(name: str, width: int) -> str:
    if len(name) > width - 1:
        return name[: width - 5] + "..."
    return name


def _row_values(g: dict) -> dict:
    dc = g.get("data_center", True)
    return {
        "idx": str(g["index"]),
        "pm": ("On" if g.get("persistence", True) else "Off"),
        "bus": g["pci_bus_id"],
        "dispa": "Off",
        "ecc": "0" if dc else "Off",
        "fan": "N/A" if dc else "30%",
        "temp": str(int(g.get("temperature_c", 34))),
        "perf": g.get("pstate", "P0"),
        "pwr": str(int(round(float(g.get("power_draw_w", 25))))),
        "cap": str(int(round(float(g["power_limit_w"])))),
        "used": str(int(g.get("memory_used_mib", 0))),
        "total": str(int(g["memory_total_mib"])),
        "util": str(int(g.get("utilization_pct", 0))),
        "mig": "Disabled" if g.get("mig_capable", False) else "N/A",
    }


# Banner layouts by driver branch, after real output (tests/data/nvidia-smi: 470, 535, 550, 580):
# R470 and older: 79 columns; R530-R545: 87 (wider first column); R550 and newer: 89 (wider memory
# column). The line under the header starts with "|" before R570 and with "+" from R570 on (R580
# recorded; the exact branch of that change is not known).
FIRST_BRANCH_MID_LAYOUT = FIRST_BRANCH_WIDE_LAYOUT  # 530
FIRST_BRANCH_89_LAYOUT = 550
FIRST_BRANCH_PLUS_RULE = 570


def banner_layout(version: str) -> str:
    b = driver_branch(version)
    if b >= FIRST_BRANCH_89_LAYOUT:
        return "wide"
    if b >= FIRST_BRANCH_MID_LAYOUT:
        return "mid"
    return "narrow"


def render_banner(cfg: dict, now: str, ids: list[int] | None = None) -> str:
    """Plain ``nvidia-smi``: the device table and an empty process table."""
    v = cfg["driver_version"]
    cuda = cuda_for_driver(v)
    gpus = _gpus(cfg, ids)
    layout = banner_layout(v)
    c1, c2 = (31, 22) if layout == "narrow" else (41, 22 if layout == "mid" else 24)
    w = c1 + c2 + 22 + 2
    rule = "+" + "-" * c1 + "+" + "-" * c2 + "+" + "-" * 22 + "+"
    under = rule if driver_branch(v) >= FIRST_BRANCH_PLUS_RULE else "|" + rule[1:]
    out = [f"{now}       "] if layout != "narrow" else []
    if layout == "narrow":
        head = f"| NVIDIA-SMI {v:<13}Driver Version: {v:<13}CUDA Version: {cuda:<9}|"
        titles = ["| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |",
                  "| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |"]
    else:
        head = f"| NVIDIA-SMI {v:<23}Driver Version: {v:<{15 if layout == 'wide' else 13}}CUDA Version: {cuda:<9}|"
        pad = " " * (c2 - 22)
        titles = [f"| GPU  Name                 Persistence-M | Bus-Id        {pad}Disp.A | Volatile Uncorr. ECC |",
                  f"| Fan  Temp   Perf          Pwr:Usage/Cap |         {pad}Memory-Usage | GPU-Util  Compute M. |"]
    out += ["+" + "-" * w + "+", head, under, *titles,
            "|" + " " * c1 + "|" + " " * c2 + "|               MIG M. |",
            "|" + "=" * c1 + "+" + "=" * c2 + "+" + "=" * 22 + "|"]
    for g in gpus:
        r = _row_values(g)
        if layout == "narrow":
            first = f"|{r['idx']:>4}  {_fmt_name(g['name'], 19):<20}{r['pm']:<3}  |"
            second = f"| {r['fan']:>3}   {r['temp']:>2}C    {r['perf']:<2}{r['pwr']:>6}W / {r['cap']:>3}W |"
        else:
            first = f"|{r['idx']:>4}  {_fmt_name(g['name'], 29):<29}  {r['pm']:<3} |"
            second = f"| {r['fan']:>3}   {r['temp']:>2}C    {r['perf']:<2}{r['pwr']:>{15 if layout == 'wide' else 16}}W / " \
                     f"{r['cap']:>{4 if layout == 'wide' else 3}}W |"
        if layout == "wide":
            bus = f"   {r['bus']:>16} {r['dispa']:<3} |"
            mem = f"{r['used']:>8}MiB / {r['total']:>6}MiB |"
        else:
            bus = f" {r['bus']:>16} {r['dispa']:<3} |"
            mem = f"{r['used']:>7}MiB / {r['total']:>5}MiB |"
        out += [first + bus + f"{r['ecc']:>21} |",
                second + mem + f"{r['util']:>7}%{'Default':>13} |",
                "|" + " " * c1 + "|" + " " * c2 + f"|{r['mig']:>21} |",
                rule]
    if layout == "narrow":
        cols = "|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |"
    elif driver_branch(v) >= FIRST_BRANCH_PLUS_RULE:
        cols = "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |"
    else:
        cols = "|  GPU   GI   CI        PID   Type   Process name" + " " * (w - 59) + "GPU Memory |"
    out.append(" " * w if layout != "narrow" and driver_branch(v) < FIRST_BRANCH_PLUS_RULE else "")
    out += ["+" + "-" * w + "+",
            "| Processes:" + " " * (w - 11) + "|",
            cols,
            "|        ID   ID" + " " * (w - 26) + "Usage      |",
            "|" + "=" * w + "|",
            "|  No running processes found" + " " * (w - 28) + "|",
            "+" + "-" * w + "+"]
    return "".join(line + "\n" for line in out)


def run(argv: list[str], cfg: dict, now: str, driver_dead: bool = False, cpus: int = 16,
        procs: Callable[[], list[dict] | None] = lambda: []) -> tuple[str, int]:
    """Dispatch one command line (without argv[0]); returns (stdout text, exit code). ``procs``
    lists the container processes for ``--query-compute-apps`` (called only for that query)."""
    if driver_dead:
        return DEAD_DRIVER_MESSAGE, DEAD_DRIVER_RC
    if argv[:1] == ["topo"]:
        if argv[1:] in (["-m"], ["--matrix"]):
            return render_topo(cfg, cpus), 0
        return INVALID_ARGS_MESSAGE, 2
    query = fmt = None
    ids: list[int] | None = None
    mode = "banner"
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--query-compute-apps="):
            query, mode = a.split("=", 1)[1], "apps"
        elif a.startswith("--query-gpu="):
            query, mode = a.split("=", 1)[1], "query"
        elif a == "--query-gpu" and i + 1 < len(argv):
            query, mode = argv[i + 1], "query"
            i += 1
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a == "--format" and i + 1 < len(argv):
            fmt = argv[i + 1]
            i += 1
        elif a in ("-L", "--list-gpus"):
            mode = "list"
        elif a == "--version":
            mode = "version"
        elif a.startswith("--id="):
            ids = [int(x) for x in a.split("=", 1)[1].split(",")]
        elif a in ("-i", "--id") and i + 1 < len(argv):
            ids = [int(x) for x in argv[i + 1].split(",")]
            i += 1
        else:
            return INVALID_ARGS_MESSAGE, 2
        i += 1
    if mode == "apps":
        if not fmt:
            return "Option --format must be specified when using --query-compute-apps.\n", 2
        return render_compute_apps(cfg, query or "", fmt, procs())
    if mode == "query":
        if not fmt:
            return "Option --format must be specified when using --query-gpu.\n", 2
        return render_query(cfg, query or "", fmt, ids)
    if mode == "list":
        return render_list(cfg, ids), 0
    if mode == "version":
        return render_version(cfg)
    return render_banner(cfg, now, ids), 0


def main() -> int:  # pragma: no cover - the imperative shell, exercised on lab hosts
    dead = os.path.exists(DEAD_FLAG)
    cfg: dict = {}
    if not dead:
        try:
            with open(CONFIG_PATH, encoding="utf-8") as fh:
                cfg = json.load(fh)
        except (OSError, ValueError):
            dead = True
    out, rc = run(sys.argv[1:], cfg, time.strftime("%a %b %d %H:%M:%S %Y"), dead, os.cpu_count() or 1,
                  container_processes)
    sys.stdout.write(out)
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
