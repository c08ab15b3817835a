"""Simulated GPU config for a lab host: catalog card facts + inventory vars -> nvidia-smi simulator JSON.

Pure: ``gpu_sim_config`` computes the JSON the simulator reads; card facts come from the GPU catalog
(``llmfleet/knowledge/catalog/gpus.yaml``). Values the catalog does not hold and only the simulator needs
(board power limit, idle draw) are simulation data below.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources

import yaml

from llmfleet.errors import UsageError
from llmfleet.lab.nvidia_smi_sim import cuda_for_driver, full_driver_version

# Board power limits (W) by catalog id, for the simulator's power.limit / banner only.
SIM_POWER_LIMIT_W = {
    "v100-sxm2-32gb": 300, "v100-sxm2-16gb": 300, "v100-pcie-32gb": 250, "v100-pcie-16gb": 250,
    "v100s-pcie-32gb": 250, "p40": 250, "p100-pcie-16gb": 250, "t4": 70, "rtx-3090": 350,
    "rtx-4090": 450, "a10": 150, "l4": 72, "a100-sxm4-40gb": 400, "a100-pcie-40gb": 250,
    "a100-sxm4-80gb": 400, "a100-pcie-80gb": 300, "h100-sxm-80gb": 700, "h100-pcie-80gb": 350,
    "h200-141gb": 700, "h200-nvl-141gb": 600,
}
MIG_CAPABLE_ARCH = {"ampere", "hopper", "blackwell"}
PCI_BUSES = [0x18, 0x3B, 0x5E, 0x86, 0xAF, 0xD8, 0x1A, 0x3D]

# Used only when the catalog file is absent (e.g. a partial checkout).
FALLBACK_CARDS = [
    {"id": "v100-sxm2-32gb", "names": ["Tesla V100-SXM2-32GB"], "memory_mib": 32768,
     "compute_capability": "7.0", "data_center": True, "arch": "volta", "interconnect": "nvlink"},
    {"id": "v100-pcie-16gb", "names": ["Tesla V100-PCIE-16GB"], "memory_mib": 16384,
     "compute_capability": "7.0", "data_center": True, "arch": "volta"},
    {"id": "rtx-4090", "names": ["NVIDIA GeForce RTX 4090"], "memory_mib": 24564,
     "compute_capability": "8.9", "data_center": False, "arch": "ada"},
    {"id": "t4", "names": ["Tesla T4"], "memory_mib": 15360, "compute_capability": "7.5",
     "data_center": True, "arch": "turing"},
    {"id": "p40", "names": ["Tesla P40"], "memory_mib": 24576, "compute_capability": "6.1",
     "data_center": True, "arch": "pascal"},
]


@lru_cache(maxsize=1)
def catalog_cards() -> tuple[dict, ...]:
    try:
        text = resources.files("llmfleet.knowledge.catalog").joinpath("gpus.yaml").read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        return tuple(FALLBACK_CARDS)
    data = yaml.safe_load(text) or {}
    return tuple(data.get("gpus") or FALLBACK_CARDS)


def find_card(name: str, cards: tuple[dict, ...] | list[dict] | None = None) -> dict:
    for card in cards if cards is not None else catalog_cards():
        if name in card.get("names", []):
            return card
    raise UsageError(
        f"lab_gpu {name!r} is not in the GPU catalog (llmfleet/knowledge/catalog/gpus.yaml): "
        "use one of its `names` exactly as nvidia-smi prints it"
    )


def gpu_uuid(seed: str, index: int) -> str:
    h = hashlib.sha256(f"{seed}/{index}".encode()).hexdigest()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_sim_config(host: str, gpu_name: str, driver: str, count: int, cards=None) -> dict:
    """The simulator's /etc/llmfleet-sim/gpus.json for one host (deterministic per host name)."""
    if not isinstance(count, int) or not 0 <= count <= 8:
        raise UsageError(f"host {host}: lab_gpu_count must be an integer 0-8, got {count!r}")
    if not str(driver).split(".")[0].isdigit():
        raise UsageError(f"host {host}: lab_driver must look like 535 or 535.183.01, got {driver!r}")
    card = find_card(gpu_name, cards)
    version = full_driver_version(str(driver))
    total = int(card["memory_mib"])
    dc = bool(card.get("data_center", True))
    gpus = []
    for i in range(count):
        gpus.append({
            "index": i,
            "name": gpu_name,
            "uuid": gpu_uuid(host, i),
            "pci_bus_id": f"00000000:{PCI_BUSES[i]:02X}:00.0",
            "memory_total_mib": total,
            "memory_used_mib": 0,
            "memory_reserved_mib": max(1, round(total * 0.0043)),
            "compute_cap": str(card["compute_capability"]),
            "power_limit_w": SIM_POWER_LIMIT_W.get(card["id"], 250),
            "power_draw_w": 25 if dc else 18,
            "temperature_c": 34 + i,
            "utilization_pct": 0,
            "pstate": "P0" if dc else "P8",
            "persistence": dc,
            "data_center": dc,
            "mig_capable": card.get("arch") in MIG_CAPABLE_ARCH and dc,
            "clocks_max_memory_mhz": 877,
        })
    return {"driver_version": version, "cuda_version": cuda_for_driver(version), "card_id": card["id"],
            "interconnect": card.get("interconnect", "pcie"), "gpus": gpus}
