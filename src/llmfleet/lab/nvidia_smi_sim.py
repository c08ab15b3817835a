#!/usr/bin/python3
"""nvidia-smi SIMULATOR for lab hosts (there is no GPU in the lab), with its dmesg and lspci simulators.

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
- ``-q``: the sections the GPU health checks read (PCI link, clocks event reasons, ECC counters, retired
  pages, remapped rows), laid out as recorded on the H200 (driver 580) and, for older branches, as public
  R418 and R510 output
- injected hardware faults: ``/etc/llmfleet-sim/faults.json`` (``FAULT_KEYS``, per GPU), read at every
  call: Xid lines, a card missing from nvidia-smi, uncorrectable ECC errors, a pending retirement or row
  remap, a remap failure, a narrow or slow PCIe link, clocks held down

The same file is the lab host's **dmesg SIMULATOR** (``render_dmesg``: the injected Xid lines, as the
NVIDIA driver writes them) and **lspci SIMULATOR** (``render_lspci``: the simulated cards on the bus, a
missing one reading ``rev ff``), installed as ``/usr/bin/dmesg`` and ``/usr/bin/lspci``; it tells which
it is by the name it runs as.

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
# Bare lab hosts get nvidia-smi from the lab repository's stand-in driver packages (llmfleet.lab.standin_debs):
# the stand-in nvidia-kernel-dkms ships the "module" (MODULE_PATH, its version) and the host's boot "loads"
# it (LOADED_PATH). There the driver nvidia-smi reports is the loaded one, as with a real kernel module.
MODULE_PATH = "/usr/lib/llmfleet-sim/nvidia-kernel-module"
LOADED_PATH = "/run/llmfleet-sim/driver-loaded"
MISMATCH_MESSAGE = "Failed to initialize NVML: Driver/library version mismatch\n"
MISMATCH_RC = 18

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


# -- injected hardware faults (lab tests of the GPU health checks) -----------------------------------

FAULTS_PATH = f"{SIM_DIR}/faults.json"
# What /etc/llmfleet-sim/faults.json may say per GPU (keyed by the card's index in gpus.json, its place on
# the simulated bus): read at every call, so a test changes a card's health without restarting anything.
FAULT_KEYS = {
    "xid": "Xid codes the kernel log (the dmesg simulator) shows for the card since boot, e.g. [79]",
    "missing": "the card is gone from nvidia-smi (the cards after it move up an index); lspci still lists "
               "it, its config space reading 0xff (rev ff)",
    "ecc_volatile_uncorrectable": "uncorrectable ECC errors since the last reset (DRAM Uncorrectable, Volatile)",
    "ecc_aggregate_uncorrectable": "uncorrectable ECC errors over the card's life (Aggregate)",
    "retired_pages_pending": "a retired page waits for a reset (Pending Page Blacklist: Yes)",
    "remap_pending": "a row remap waits for a reset (Remapped Rows, Pending: Yes)",
    "remap_failure": "a row remap failed (Remapping Failure Occurred: Yes)",
    "recovery_action": "GPU Recovery Action (R570 and newer): Reset, Reboot, ...",
    "pcie_width": "the link's current width in lanes (the card's maximum stays 16)",
    "pcie_gen": "the link's current PCIe generation",
    "throttle": "active clocks event reasons, e.g. [\"HW Thermal Slowdown\"]",
    "busy": "the card works (the Idle reason is not active, utilization 100 %)",
}
# PCI device ids of the catalog's cards (pci.ids), for the lspci simulator only.
PCI_DEVICE_IDS = {
    "v100-sxm2-32gb": "1db5", "v100-sxm2-16gb": "1db1", "v100-pcie-32gb": "1db6", "v100-pcie-16gb": "1db4",
    "v100s-pcie-32gb": "1df6", "p40": "1b38", "p100-pcie-16gb": "15f8", "t4": "1eb8", "rtx-3090": "2204",
    "rtx-4090": "2684", "a10": "2236", "l4": "27b8", "a100-sxm4-40gb": "20b0", "a100-pcie-40gb": "20f1",
    "a100-sxm4-80gb": "20b2", "a100-pcie-80gb": "20b5", "h100-sxm-80gb": "2330", "h100-pcie-80gb": "2331",
    "h200-141gb": "2335", "a40": "2235", "l40s": "26b9",
}
# The kernel's text after "NVRM: Xid (PCI:...): CODE, " for the codes tests inject (shaped like public
# reports; a code not listed gets a generic text).
XID_TEXT = {
    13: "pid=2412, name=llama-server, Graphics Exception: ESR 0x50e730=0x1000e 0x50e734=0x0",
    31: "pid=2412, name=llama-server, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 "
        "faulted @ 0x7f1c_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "pid=2412, name=llama-server, Ch 00000008",
    45: "pid=2412, name=llama-server, Ch 00000008",
    48: "pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the "
        "framebuffer at partition 0, subpartition 0.",
    63: "pid='<unknown>', name=<unknown>, Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "pid='<unknown>', name=<unknown>, Row Remapper: Failed to remap row",
    74: "pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 0(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    92: "pid='<unknown>', name=<unknown>, High single-bit ECC error rate",
    94: "pid=2412, name=llama-server, Contained: SM (0x1). RST: No, D-RST: No",
    95: "pid=2412, name=llama-server, Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
    119: "pid=2412, name=llama-server, Timeout after 6s of waiting for RPC response from GPU0 GSP!",
}


def gpu_faults(faults: dict, g: dict) -> dict:
    """The faults injected for one card (by its place on the simulated bus)."""
    got = faults.get(str(g.get("slot", g["index"]))) if isinstance(faults, dict) else None
    return got if isinstance(got, dict) else {}


def visible(cfg: dict, faults: dict) -> dict:
    """The config as nvidia-smi sees it: missing cards left out, the others indexed in bus order
    (``slot`` keeps each card's place on the bus, which the faults file names)."""
    shown: list[dict] = []
    for g in cfg.get("gpus", []):
        if gpu_faults(faults, g).get("missing"):
            continue
        shown.append(dict(g, slot=g.get("slot", g["index"]), index=len(shown)))
    return dict(cfg, gpus=shown)


def _arch(cc: str) -> str:
    major, _, minor = str(cc).partition(".")
    m = int(major or 0)
    return {6: "Pascal", 7: "Turing" if minor == "5" else "Volta", 8: "Ada Lovelace" if minor == "9" else "Ampere",
            9: "Hopper"}.get(m, "Blackwell" if m >= 10 else "Unknown")


def _pcie_max_gen(cc: str) -> int:
    m = int(str(cc).split(".")[0] or 0)
    return 3 if m < 8 else 4 if m < 9 else 5


def _q_width(driver: str) -> int:
    """Where nvidia-smi -q puts its colons: column 55 on the R580 recording, 42 on R510 (A100) and R535-era
    output, 36 on R418 (V100) public output."""
    b = driver_branch(driver)
    return 55 if b >= 560 else 42 if b >= 450 else 36


def render_q(cfg: dict, now: str, faults: dict | None = None, ids: list[int] | None = None) -> str:
    """``nvidia-smi -q`` for the configured (visible) cards, with the injected faults: the sections the GPU
    health checks read (PCI link, clocks event reasons, ECC, retired pages, remapped rows), laid out like the
    recorded H200 output (driver 580) and, for older branches, like public R418/R510 output."""
    faults = faults or {}
    v = cfg["driver_version"]
    b = driver_branch(v)
    w = _q_width(v)
    out: list[str] = []

    def kv(level: int, key: str, value: object) -> None:
        out.append(f"{'    ' * level}{key}".ljust(w) + f": {value}")

    def grp(level: int, key: str) -> None:
        out.append(f"{'    ' * level}{key}")

    gpus = _gpus(cfg, ids)
    out += ["", "==============NVSMI LOG==============", ""]
    kv(0, "Timestamp", now)
    kv(0, "Driver Version", v)
    kv(0, "CUDA Version", cuda_for_driver(v))
    out.append("")
    kv(0, "Attached GPUs", len(cfg.get("gpus", [])))
    for g in gpus:
        f = gpu_faults(faults, g)
        dc = g.get("data_center", True)
        cc = str(g.get("compute_cap") or "0.0")
        ampere_up = float(cc) >= 8.0
        name = g["name"]
        out.append(f"GPU {g['pci_bus_id']}")
        kv(1, "Product Name", name)
        kv(1, "Product Brand", "Tesla" if name.startswith("Tesla") else "GeForce" if "GeForce" in name else "NVIDIA")
        if b >= 510:
            kv(1, "Product Architecture", _arch(cc))
        kv(1, "Persistence Mode", "Enabled" if g.get("persistence", True) else "Disabled")
        kv(1, "GPU UUID", g["uuid"])
        kv(1, "Minor Number", g.get("slot", g["index"]))
        if b >= 570:
            kv(1, "GPU Recovery Action", f.get("recovery_action") or "None")
        dom, bus, dev_fn = g["pci_bus_id"].split(":")
        dev = dev_fn.split(".")[0]
        grp(1, "PCI")
        kv(2, "Bus", f"0x{bus}")
        kv(2, "Device", f"0x{dev}")
        kv(2, "Domain", f"0x{dom[-4:]}")
        kv(2, "Device Id", f"0x{PCI_DEVICE_IDS.get(str(cfg.get('card_id')), '0000').upper()}10DE")
        kv(2, "Bus Id", g["pci_bus_id"])
        busy = bool(f.get("busy"))
        top = _pcie_max_gen(cc)
        # an idle consumer card drops its link to generation 1 to save power; data-center cards held in
        # persistence mode keep it (the recorded H200 shows gen 5 at idle)
        gen = int(f.get("pcie_gen") or (top if busy or dc else 1))
        grp(2, "GPU Link Info")
        grp(3, "PCIe Generation")
        kv(4, "Max", top)
        kv(4, "Current", gen)
        if b >= 560:
            kv(4, "Device Current", gen)
            kv(4, "Device Max", top)
            kv(4, "Host Max", "N/A")
        grp(3, "Link Width")
        kv(4, "Max", "16x")
        kv(4, "Current", f"{int(f.get('pcie_width') or 16)}x")
        kv(1, "Performance State", g.get("pstate", "P0"))
        grp(1, "Clocks Event Reasons" if b >= 535 else "Clocks Throttle Reasons")
        active = set(f.get("throttle") or [])
        if not busy:
            active.add("Idle")
        for level, reason in ((2, "Idle"), (2, "Applications Clocks Setting"), (2, "SW Power Cap"),
                              (2, "HW Slowdown"), (3, "HW Thermal Slowdown"), (3, "HW Power Brake Slowdown"),
                              (2, "Sync Boost"), (2, "SW Thermal Slowdown"), (2, "Display Clock Setting")):
            kv(level, reason, "Active" if reason in active else "Not Active")
        grp(1, "FB Memory Usage")
        kv(2, "Total", f"{int(g['memory_total_mib'])} MiB")
        kv(2, "Reserved", f"{int(g.get('memory_reserved_mib', 0))} MiB")
        kv(2, "Used", f"{int(g.get('memory_used_mib', 0))} MiB")
        kv(2, "Free", f"{_free(g)} MiB")
        kv(1, "Compute Mode", "Default")
        grp(1, "Utilization")
        kv(2, "GPU", f"{100 if busy else int(g.get('utilization_pct', 0))} %")
        kv(2, "Memory", "0 %")
        ecc = dc or f.get("ecc_volatile_uncorrectable") or f.get("ecc_aggregate_uncorrectable")
        grp(1, "ECC Mode")
        kv(2, "Current", "Enabled" if ecc else "Disabled")
        kv(2, "Pending", "Enabled" if ecc else "Disabled")
        vol = int(f.get("ecc_volatile_uncorrectable") or 0)
        agg = max(int(f.get("ecc_aggregate_uncorrectable") or 0), vol)
        grp(1, "ECC Errors")
        for scope, dram in (("Volatile", vol), ("Aggregate", agg)):
            grp(2, scope)
            val = (lambda n: n) if ecc else (lambda n: "N/A")
            if b < 450:  # R418: per-location single and double bit counters
                for kind, total in (("Single Bit", 0), ("Double Bit", dram)):
                    grp(3, kind)
                    kv(4, "Device Memory", val(total))
                    kv(4, "Total", val(total))
                continue
            kv(3, "SRAM Correctable", val(0))
            if b >= 560:
                kv(3, "SRAM Uncorrectable Parity", val(0))
                kv(3, "SRAM Uncorrectable SEC-DED", val(0))
            else:
                kv(3, "SRAM Uncorrectable", val(0))
            kv(3, "DRAM Correctable", val(0))
            kv(3, "DRAM Uncorrectable", val(dram))
            if scope == "Aggregate" and b >= 560:
                kv(3, "SRAM Threshold Exceeded", "No" if ecc else "N/A")
        if b >= 560:
            kv(2, "Channel Repair Pending", "No" if ecc else "N/A")
            kv(2, "TPC Repair Pending", "No" if ecc else "N/A")
            kv(2, "Unrepairable Memory", "No" if ecc else "N/A")
        grp(1, "Retired Pages")
        pages = dc and not ampere_up
        pending = bool(f.get("retired_pages_pending"))
        kv(2, "Single Bit ECC", 0 if pages else "N/A")
        kv(2, "Double Bit ECC", (1 if pending else 0) if pages or pending else "N/A")
        kv(2, "Pending Page Blacklist" if b >= 450 else "Pending",
           "Yes" if pending else "No" if pages else "N/A")
        remap = f.get("remap_pending") or f.get("remap_failure")
        if (ampere_up and ecc) or remap:
            grp(1, "Remapped Rows")
            kv(2, "Correctable Error", 0)
            kv(2, "Uncorrectable Error", 1 if remap else 0)
            kv(2, "Pending", "Yes" if f.get("remap_pending") else "No")
            kv(2, "Remapping Failure Occurred", "Yes" if f.get("remap_failure") else "No")
        elif b >= 450:
            kv(1, "Remapped Rows", "N/A")
        grp(1, "Temperature")
        kv(2, "GPU Current Temp", f"{int(g.get('temperature_c', 34))} C")
        kv(1, "Processes", "None")
    return "".join(line + "\n" for line in out)


def _kernel_pci(bus_id: str) -> str:
    """``00000000:3B:00.0`` -> ``0000:3b:00`` (how NVRM names a card in the kernel log)."""
    dom, bus, dev_fn = bus_id.split(":")
    return f"{dom[-4:]}:{bus}:{dev_fn.split('.')[0]}".lower()


def render_dmesg(cfg: dict, faults: dict, uptime: float = 3600.0) -> str:
    """dmesg SIMULATOR: a few boot lines of the NVIDIA driver, then the injected Xid lines of each card
    (an Xid 79 also with the "GPU has fallen off the bus" line the driver prints after it)."""
    v = cfg.get("driver_version", "")
    lines = [(4.2, "nvidia: module license 'NVIDIA' taints kernel."),
             (4.9, f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {v}  Release Build")]
    t = max(60.0, uptime - 60.0)
    for g in cfg.get("gpus", []):
        codes = gpu_faults(faults, g).get("xid") or []
        for code in codes if isinstance(codes, list) else []:
            pci = _kernel_pci(g["pci_bus_id"])
            text = XID_TEXT.get(int(code), "pid='<unknown>', name=<unknown>, simulated Xid event")
            lines.append((t, f"NVRM: Xid (PCI:{pci}): {int(code)}, {text}"))
            if int(code) == 79:
                lines.append((t, f"NVRM: GPU {pci}.0: GPU has fallen off the bus."))
            t += 0.5
    return "".join(f"[{ts:12.6f}] {text}\n" for ts, text in lines)


def render_lspci(cfg: dict, faults: dict, argv: list[str]) -> tuple[str, int]:
    """lspci SIMULATOR: the simulated cards on the bus (``-D`` full addresses, ``-n`` numeric ids and class,
    ``-d 10de:`` NVIDIA only: nothing else is simulated), a missing card with its config space reading
    0xff (``rev ff``); GeForce cards with their HDMI audio function."""
    numeric = "-n" in argv or "-nn" in argv
    full = "-D" in argv
    out = []
    for g in cfg.get("gpus", []):
        dom, bus, dev_fn = g["pci_bus_id"].split(":")
        addr = f"{dom[-4:].lower() + ':' if full else ''}{bus.lower()}:{dev_fn.lower()}"
        dev = PCI_DEVICE_IDS.get(str(cfg.get("card_id")), "0000")
        rev = "ff" if gpu_faults(faults, g).get("missing") else "a1"
        geforce = "GeForce" in g["name"]
        cls, label = ("0300", "VGA compatible controller") if geforce else ("0302", "3D controller")
        if numeric:
            out.append(f"{addr} {cls}: 10de:{dev} (rev {rev})")
        else:
            out.append(f"{addr} {label}: NVIDIA Corporation Device {dev} (rev {rev})")
        if geforce:
            audio = addr[:-1] + "1"
            out.append(f"{audio} 0403: 10de:22ba (rev a1)" if numeric
                       else f"{audio} Audio device: NVIDIA Corporation Device 22ba (rev a1)")
    return "".join(line + "\n" for line in out), 0


def run(argv: list[str], cfg: dict, now: str, driver_dead: bool = False, cpus: int = 16,
        procs: Callable[[], list[dict] | None] = lambda: [], faults: dict | None = None) -> tuple[str, int]:
    """Dispatch one command line (without argv[0]); returns (stdout text, exit code). ``procs``
    lists the container processes for ``--query-compute-apps`` (called only for that query); ``faults``
    the injected hardware faults (``FAULT_KEYS``)."""
    if driver_dead:
        return DEAD_DRIVER_MESSAGE, DEAD_DRIVER_RC
    faults = faults or {}
    cfg = visible(cfg, faults)
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
        elif a in ("-q", "--query"):
            mode = "q"
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
    if mode == "q":
        return render_q(cfg, now, faults, ids), 0
    if mode == "version":
        return render_version(cfg)
    return render_banner(cfg, now, ids), 0


def standin_driver(cfg: dict, installed: str | None, loaded: str | None) -> tuple[dict | None, str, int]:
    """The config as the stand-in driver packages make it (bare lab hosts): ``installed`` the version of
    the module on disk (None: no stand-in driver package, ``cfg`` unchanged), ``loaded`` the one the last
    boot loaded. Installed but not loaded since: the real "couldn't communicate" failure; another version
    loaded than installed (an upgrade or downgrade before its reboot): NVML's version mismatch.
    Returns (config or None, message, exit code)."""
    if not installed:
        return cfg, "", 0
    if not loaded:
        return None, DEAD_DRIVER_MESSAGE, DEAD_DRIVER_RC
    if loaded != installed:
        return None, MISMATCH_MESSAGE, MISMATCH_RC
    return {**cfg, "driver_version": loaded, "cuda_version": cuda_for_driver(loaded)}, "", 0


def _read_text(path: str) -> str | None:  # pragma: no cover - reads this host
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _read_json(path: str) -> dict | None:  # pragma: no cover - reads this host
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _uptime() -> float:  # pragma: no cover - reads this host
    try:
        with open("/proc/uptime", encoding="utf-8") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 3600.0


def main() -> int:  # pragma: no cover - the imperative shell, exercised on lab hosts
    # One file, three simulators: installed as nvidia-smi, dmesg and lspci, told apart by the name it runs as.
    # LLMFLEET_SIM_DIR: another folder than /etc/llmfleet-sim (the simulators run as stand-ins in unit tests).
    prog = os.path.basename(sys.argv[0])
    sim_dir = os.environ.get("LLMFLEET_SIM_DIR") or SIM_DIR
    faults = _read_json(f"{sim_dir}/faults.json") or {}
    config = f"{sim_dir}/gpus.json"
    if prog == "dmesg":
        if any(a in ("-C", "--clear") for a in sys.argv[1:]):
            return 0  # the simulated log is the faults file: the lab's set_gpu_faults clears it
        sys.stdout.write(render_dmesg(_read_json(config) or {}, faults, _uptime()))
        return 0
    if prog == "lspci":
        out, rc = render_lspci(_read_json(config) or {}, faults, sys.argv[1:])
        sys.stdout.write(out)
        return rc
    dead = os.path.exists(f"{sim_dir}/driver-dead")
    cfg = {} if dead else _read_json(config)
    if cfg is None:
        dead, cfg = True, {}
    if not dead:
        standin, message, rc = standin_driver(cfg, _read_text(MODULE_PATH), _read_text(LOADED_PATH))
        if standin is None:
            sys.stdout.write(message)
            return rc
        cfg = standin
    out, rc = run(sys.argv[1:], cfg, time.strftime("%a %b %d %H:%M:%S %Y"), dead, os.cpu_count() or 1,
                  container_processes, faults)
    sys.stdout.write(out)
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
