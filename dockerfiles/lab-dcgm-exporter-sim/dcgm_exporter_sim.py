#!/usr/bin/python3
"""dcgm-exporter SIMULATOR for the lab (there is no GPU in the lab, so the real dcgm-exporter cannot run).

It stands in for NVIDIA's dcgm-exporter (nvcr.io/nvidia/k8s/dcgm-exporter) as the image
``dcgm-exporter:lab-sim``: it takes the same flags and answers ``GET /metrics`` with Prometheus text shaped
like real dcgm-exporter output, one series per simulated GPU for each field of its counters file.

Shape and values follow recorded real output:
- https://github.com/NVIDIA/dcgm-exporter (README: ``curl localhost:9400/metrics``, HELP/TYPE lines, then
  ``DCGM_FI_DEV_*{gpu="0",UUID="GPU-..."} value``)
- https://github.com/DataDog/integrations-core/blob/master/dcgm/tests/fixtures/metrics.txt (a recorded
  scrape of an idle Tesla T4: the labels gpu, UUID, device, modelName, Hostname in that order, floats
  printed with six decimals, and the idle readings used below)
- https://docs.nvidia.com/datacenter/dcgm/latest/gpu-telemetry/dcgm-exporter.html (pci_bus_id after UUID,
  DCGM_FI_DRIVER_VERSION as a label when the counters file asks for it)
- the counters file: https://github.com/NVIDIA/dcgm-exporter/blob/00d6d344ea4a39112b211b9ff5af3d97e0bb51c2/etc/default-counters.csv
  (``FIELD, prometheus type, help``; ``#`` comments). The image ships the same default set at
  /etc/dcgm-exporter/default-counters.csv: XID errors on, the ECC counters commented out, as upstream.

Flags (as dcgm-exporter's): ``-a ADDR`` / ``--address ADDR`` (default ``:9400``), ``-f FILE`` /
``--collectors FILE`` (default /etc/dcgm-exporter/default-counters.csv). Every other flag is accepted,
noted on stderr and ignored. A field the simulator has no reading for is left out (noted at start).

Environment (set by the role or a test):
- ``DCGM_SIM_GPUS`` (default 1): how many GPUs, 0-16
- ``DCGM_SIM_MODEL`` (default ``Tesla V100-SXM2-32GB``): modelName, as nvidia-smi prints the card
- ``DCGM_SIM_FB_MIB`` (default 32768): the card's memory (DCGM_FI_DEV_FB_FREE of an idle card)
- ``DCGM_SIM_DRIVER`` (default 535.183.01): the DCGM_FI_DRIVER_VERSION label, when asked for
- ``DCGM_SIM_UUID_SEED`` (default the hostname): the UUIDs, as the lab host's nvidia-smi simulator derives
  them (llmfleet.lab.cards.gpu_uuid: give the inventory host name to get the same UUIDs)
- ``DCGM_SIM_HOSTNAME`` (default the container's hostname, as the real exporter labels it)
- ``DCGM_SIM_FAULTS`` (default /var/lib/dcgm-sim/faults.json): injected faults, read at every request:
  ``{"xid": 79, "ecc_dbe": 2}`` for every GPU, or ``{"1": {"xid": 79}}`` for GPU 1 only. ``xid`` sets
  DCGM_FI_DEV_XID_ERRORS (the last Xid; a list, as the host's nvidia-smi simulator takes it, gives its
  last), ``ecc_dbe`` (or ``ecc_volatile_uncorrectable``) DCGM_FI_DEV_ECC_DBE_VOL_TOTAL and the aggregate
  count. Without the file they are 0.

Pure functions (``parse_args``, ``parse_collectors``, ``parse_faults``, ``render``) take values and return
text; only ``main`` reads files, the environment and the clock. Standard library only.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import sys
import time
from collections.abc import Callable

DEFAULT_ADDRESS = ":9400"
DEFAULT_COLLECTORS = "/etc/dcgm-exporter/default-counters.csv"
DEFAULT_FAULTS = "/var/lib/dcgm-sim/faults.json"
VALUE_FLAGS = {"-a": "address", "--address": "address", "-f": "collectors", "--collectors": "collectors"}

# An idle card, as recorded (Tesla T4 scrape above): clocks, temperature, power and an energy counter
# that grows at that power since the simulator started. Memory temperature is not in the recording: the
# GPU temperature stands in for it.
IDLE = {"sm_clock": 300, "mem_clock": 405, "temp": 25, "power_w": 8.969, "energy_mj": 128996013}

Reading = Callable[[dict, dict], float]  # (state of one GPU, its faults) -> value


def _fault(key: str) -> Reading:
    return lambda gpu, faults: faults.get(key, 0)


READINGS: dict[str, Reading] = {
    "DCGM_FI_DEV_SM_CLOCK": lambda g, f: IDLE["sm_clock"],
    "DCGM_FI_DEV_MEM_CLOCK": lambda g, f: IDLE["mem_clock"],
    "DCGM_FI_DEV_MEMORY_TEMP": lambda g, f: IDLE["temp"],
    "DCGM_FI_DEV_GPU_TEMP": lambda g, f: IDLE["temp"],
    "DCGM_FI_DEV_POWER_USAGE": lambda g, f: IDLE["power_w"],
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda g, f: IDLE["energy_mj"] + int(IDLE["power_w"] * g["uptime_s"] * 1000),
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": lambda g, f: 0,
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": lambda g, f: 0,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": lambda g, f: 0,
    "DCGM_FI_DEV_GPU_UTIL": lambda g, f: 0,
    "DCGM_FI_DEV_MEM_COPY_UTIL": lambda g, f: 0,
    "DCGM_FI_DEV_ENC_UTIL": lambda g, f: 0,
    "DCGM_FI_DEV_DEC_UTIL": lambda g, f: 0,
    "DCGM_FI_DEV_XID_ERRORS": _fault("xid"),
    "DCGM_FI_DEV_FB_FREE": lambda g, f: g["fb_mib"],
    "DCGM_FI_DEV_FB_USED": lambda g, f: 0,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": lambda g, f: 0,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _fault("ecc_dbe"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": lambda g, f: 0,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": _fault("ecc_dbe"),
    "DCGM_FI_DEV_RETIRED_SBE": lambda g, f: 0,
    "DCGM_FI_DEV_RETIRED_DBE": lambda g, f: 0,
    "DCGM_FI_DEV_RETIRED_PENDING": lambda g, f: 0,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": lambda g, f: 0,
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": lambda g, f: 0,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": lambda g, f: 0,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": lambda g, f: 0,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": lambda g, f: 0,
}
LABEL_FIELDS = {"DCGM_FI_DRIVER_VERSION": "driver"}


class UsageError(Exception):
    pass


def parse_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """dcgm-exporter's flags: (``{"address": ..., "collectors": ...}``, the flags ignored)."""
    opts = {"address": DEFAULT_ADDRESS, "collectors": DEFAULT_COLLECTORS}
    ignored: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in VALUE_FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"flag needs an argument: {arg}")
                i += 1
                value = argv[i]
            opts[VALUE_FLAGS[name]] = value
        elif arg.startswith("-"):
            # A flag of the real exporter the simulator has no use for; its value, if separate, goes too.
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                i += 1
                arg = f"{arg} {argv[i]}"
            ignored.append(arg)
        else:
            raise UsageError(f"unexpected argument {arg!r} (dcgm-exporter takes flags only)")
        i += 1
    return opts, ignored


def listen_address(address: str) -> tuple[str, int]:
    """``:9400`` -> ("", 9400) (every address), ``127.0.0.1:9400``, ``[::1]:9400``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--address {address!r}: expected [HOST]:PORT such as :9400")
    return host.strip("[]"), int(port)


def parse_collectors(text: str) -> list[tuple[str, str, str]]:
    """Rows of a dcgm-exporter counters file: (field, prometheus type, help), comments skipped."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 2 or not parts[0]:
            raise UsageError(f"line {n}: expected 'DCGM FIELD, prometheus type, help', got {line!r}")
        rows.append((parts[0], parts[1], parts[2] if len(parts) > 2 else ""))
    return rows


def unknown_fields(rows: list[tuple[str, str, str]]) -> list[str]:
    """Fields of the counters file the simulator has no reading for (left out of /metrics)."""
    return [f for f, kind, _ in rows if f not in (LABEL_FIELDS if kind == "label" else READINGS)]


def parse_faults(data: object, gpus: int) -> dict[int, dict]:
    """The faults of each GPU from the faults file's JSON: top-level keys for every GPU, "N" keys for one."""
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object such as {\"xid\": 79, \"ecc_dbe\": 2}")
    shared = {k: v for k, v in data.items() if not str(k).isdigit()}
    out = {}
    for i in range(gpus):
        merged = {**shared, **(data.get(str(i)) or {})}
        xid = merged.get("xid", 0)
        if isinstance(xid, list):
            xid = xid[-1] if xid else 0
        ecc = merged.get("ecc_dbe", merged.get("ecc_volatile_uncorrectable", 0))
        out[i] = {"xid": int(xid), "ecc_dbe": int(ecc)}
    return out


def gpu_uuid(seed: str, index: int) -> str:
    """The same UUIDs as the lab host's nvidia-smi simulator (llmfleet.lab.cards.gpu_uuid)."""
    h = hashlib.sha256(f"{seed}/{index}".encode()).hexdigest()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _value(v: float) -> str:
    return f"{v:f}" if isinstance(v, float) else str(int(v))


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def render(rows: list[tuple[str, str, str]], *, gpus: int, model: str, hostname: str, uuid_seed: str,
           fb_mib: int, driver: str, faults: dict[int, dict], uptime_s: float) -> str:
    """The /metrics answer: for each field of the counters file, its HELP and TYPE, then one series per GPU."""
    extra = [(f, LABEL_FIELDS[f]) for f, kind, _ in rows if kind == "label" and f in LABEL_FIELDS]
    values = {"driver": driver}
    lines = []
    for field, kind, help_ in rows:
        if kind == "label" or field not in READINGS:
            continue
        lines.append(f"# HELP {field} {help_}".rstrip())
        lines.append(f"# TYPE {field} {kind}")
        for i in range(gpus):
            labels = [("gpu", str(i)), ("UUID", gpu_uuid(uuid_seed, i)), ("pci_bus_id", f"00000000:{0x18 + i:02X}:00.0"),
                      ("device", f"nvidia{i}"), ("modelName", model), ("Hostname", hostname),
                      *((name, values[key]) for name, key in extra)]
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            state = {"fb_mib": fb_mib, "uptime_s": uptime_s}
            lines.append(f"{field}{{{text}}} {_value(READINGS[field](state, faults.get(i, {})))}")
    return "".join(line + "\n" for line in lines)


def _env_int(name: str, default: int, lo: int, hi: int) -> int:
    raw = os.environ.get(name, str(default))
    if not raw.strip().isdigit() or not lo <= int(raw) <= hi:
        raise UsageError(f"{name}={raw!r}: expected a whole number {lo}-{hi}")
    return int(raw)


def note(msg: str) -> None:
    sys.stderr.write(f"dcgm-exporter simulator: {msg}\n")


def main(argv: list[str]) -> int:
    try:
        opts, ignored = parse_args(argv)
        host, port = listen_address(opts["address"])
        with open(opts["collectors"], encoding="utf-8") as fh:
            rows = parse_collectors(fh.read())
        gpus = _env_int("DCGM_SIM_GPUS", 1, 0, 16)
        fb_mib = _env_int("DCGM_SIM_FB_MIB", 32768, 1, 1 << 20)
    except (UsageError, OSError) as e:
        note(f"error: {e}")
        return 2
    for flag in ignored:
        note(f"ignoring {flag} (not simulated)")
    for field in unknown_fields(rows):
        note(f"no simulated reading for {field}: left out")
    model = os.environ.get("DCGM_SIM_MODEL", "Tesla V100-SXM2-32GB")
    hostname = os.environ.get("DCGM_SIM_HOSTNAME") or socket.gethostname()
    seed = os.environ.get("DCGM_SIM_UUID_SEED") or hostname
    driver = os.environ.get("DCGM_SIM_DRIVER", "535.183.01")
    faults_path = os.environ.get("DCGM_SIM_FAULTS", DEFAULT_FAULTS)
    started = time.monotonic()

    def faults() -> dict[int, dict]:
        try:
            with open(faults_path, encoding="utf-8") as fh:
                return parse_faults(json.load(fh), gpus)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as e:
            note(f"{faults_path}: {e}; serving without faults")
            return {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            body = render(rows, gpus=gpus, model=model, hostname=hostname, uuid_seed=seed, fb_mib=fb_mib,
                          driver=driver, faults=faults(), uptime_s=time.monotonic() - started).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: object) -> None:
            pass

    server_class = http.server.ThreadingHTTPServer
    if ":" in host:
        server_class = type("V6Server", (server_class,), {"address_family": socket.AF_INET6})
    server = server_class((host, port), Handler)
    note(f"SIMULATED: {gpus} x {model}; listening on {opts['address']}; counters {opts['collectors']}; "
         f"faults from {faults_path}")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
