"""Latency of one tensor-parallel all-reduce at batch-1 decode sizes, over the GPUs of one host.

What it measures: NCCL all-reduce (through torch.distributed, one process per GPU) of a bf16 vector
of hidden_size elements, the message vLLM's RowParallelLinear all-reduces twice per layer at batch 1
(4096: 8B models, 5120: 32B, 8192: 70B), plus larger messages for the bandwidth term. Each size is
timed eagerly (one launch per all-reduce) and, where NCCL capture works, inside a CUDA graph (as vLLM
replays its decode step). Per size and mode: the median over ``--runs`` runs of the mean time of
``--iters`` back-to-back all-reduces, and the spread (min-max) of those runs. The planner's
``parallel.allreduce_us`` ranges (catalog/planner.yaml) are judged against these figures.

It also prints `nvidia-smi topo -m` (how the GPUs are linked) when nvidia-smi is there.

Needs PyTorch with NCCL and 2 or more NVIDIA GPUs. NVLink multicast (NVLS) is left off.
Run: python bench/allreduce_latency_bench.py [--gpus 2] [--runs 7] [--iters 200]
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess

SIZES = (4096, 5120, 8192, 65536, 1048576)  # bf16 elements


def _worker(rank: int, world: int, runs: int, iters: int, port: int, out: dict) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    res: dict[str, dict] = {}
    for n in SIZES:
        x = torch.ones(n, dtype=torch.bfloat16, device="cuda")
        for _ in range(20):
            dist.all_reduce(x)
        torch.cuda.synchronize()

        def timed(fn) -> list[float]:
            vals = []
            for _ in range(runs):
                dist.barrier()
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
                vals.append(s.elapsed_time(e) * 1000.0 / iters)  # us per all-reduce
            return vals

        def eager(x=x) -> None:
            for _ in range(iters):
                dist.all_reduce(x)

        entry = {"bytes": n * 2, "eager_us": timed(eager)}
        try:
            g = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    dist.all_reduce(x)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                for _ in range(iters):
                    dist.all_reduce(x)
            entry["graph_us"] = timed(g.replay)
        except Exception as exc:  # capture unsupported: report why, keep the eager figure
            entry["graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
        res[str(n)] = entry
    if rank == 0:
        out.update(res)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: all)")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--port", type=int, default=29531)
    args = ap.parse_args()
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    import torch
    import torch.multiprocessing as mp

    world = args.gpus or torch.cuda.device_count()
    if world < 2:
        raise SystemExit("needs 2 or more GPUs")
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_worker, args=(world, args.runs, args.iters, args.port, out), nprocs=world, join=True)
    topo = None
    try:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        pass

    def summary(vals: list[float]) -> dict:
        return {"median_us": round(statistics.median(vals), 2), "runs": len(vals),
                "spread_us": [round(min(vals), 2), round(max(vals), 2)]}

    sizes = {}
    for n, e in sorted(out.items(), key=lambda kv: int(kv[0])):
        sizes[n] = {"bytes": e["bytes"], "eager": summary(e["eager_us"])}
        if "graph_us" in e:
            sizes[n]["graph"] = summary(e["graph_us"])
        else:
            sizes[n]["graph_error"] = e.get("graph_error")
    print(json.dumps({"gpus": world, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "nccl": ".".join(map(str, torch.cuda.nccl.version())), "iters": args.iters,
                      "sizes_bf16_elements": sizes, "nvidia_smi_topo": topo}, indent=1))


if __name__ == "__main__":
    main()
