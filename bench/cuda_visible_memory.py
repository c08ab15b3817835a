"""What vLLM's --gpu-memory-utilization multiplies: the CUDA-visible total of a card, against
nvidia-smi's memory.total and its driver-reserved memory.

vLLM takes torch.cuda.mem_get_info()'s total (the CUDA-visible memory); nvidia-smi's memory.total
includes what the driver reserves (nvidia-smi -q: "Reserved"). Needs PyTorch, an NVIDIA GPU and
nvidia-smi. Run: python bench/cuda_visible_memory.py   (prints one JSON object)

Measured on an H200 (driver 580.159.04, torch 2.11.0+cu130, 2026-12-01): memory.total 143771 MiB,
reserved 616 MiB, CUDA-visible total 150109880320 B = 143155.9 MiB = memory.total - reserved.
"""

from __future__ import annotations

import json
import shutil
import subprocess


def main() -> int:
    import torch

    smi = shutil.which("nvidia-smi") or "/usr/local/nvidia/bin/nvidia-smi"
    out = subprocess.run([smi, "--query-gpu=name,memory.total,memory.reserved,driver_version",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout
    name, total, reserved, driver = [x.strip() for x in out.splitlines()[0].split(",")]
    free, cuda_total = torch.cuda.mem_get_info()
    print(json.dumps({
        "name": name, "driver": driver, "torch": torch.__version__,
        "memory_total_mib": int(total), "memory_reserved_mib": int(reserved),
        "cuda_visible_total_bytes": cuda_total, "cuda_visible_total_mib": round(cuda_total / 2**20, 2),
        "total_minus_reserved_mib": int(total) - int(reserved), "cuda_free_bytes": free,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
