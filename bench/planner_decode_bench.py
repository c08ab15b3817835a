"""Batch-1 decode of a dense 16-bit transformer, as vLLM runs it, against the bandwidth ceiling.

What it measures: one decode step (every layer's fused QKV, attention over a KV cache, output
projection, fused gate/up, down projection, RMSNorms, then lm_head) for the real shapes of
Qwen2.5-7B and Qwen2.5-32B in bf16 with random weights, captured in a CUDA graph and replayed (as
vLLM does without --enforce-eager), and once eagerly. Speed depends on the bytes read per token, not
on the values. Reports tok/s, bytes read per token, and the share of the nominal bandwidth reached:
the planner's "efficiency". This is the engine's model-execution part only (no scheduler, sampling
or HTTP), so it bounds vLLM's figure from above.

Needs PyTorch and an NVIDIA GPU. Run: python bench/planner_decode_bench.py [--nominal-gbps 4800]
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

SHAPES = {
    # layers, hidden, heads, kv_heads, head_dim, ffn, vocab: the models' config.json on Hugging Face
    # (https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json, .../Qwen2.5-32B-Instruct/...)
    "qwen2.5-7b": (28, 3584, 28, 4, 128, 18944, 152064),
    "qwen2.5-32b": (64, 5120, 40, 8, 128, 27648, 152064),
}


def copy_bandwidth(torch, nbytes: int = 4 * 2**30) -> float:
    """Device-to-device copy, bytes read + written per second."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * nbytes * 10 / (start.elapsed_time(end) / 1e3)


def decode_bench(torch, name: str, context: int, graph: bool, steps: int = 50) -> dict:
    import torch.nn.functional as F

    layers, h, nh, nkv, hd, ffn, vocab = SHAPES[name]
    dev, dt = "cuda", torch.bfloat16

    def w(*shape):
        return (torch.randn(*shape, device=dev, dtype=dt) * 0.02).contiguous()

    blocks = []
    for _ in range(layers):
        blocks.append({
            "ln1": torch.ones(h, device=dev, dtype=dt), "ln2": torch.ones(h, device=dev, dtype=dt),
            "qkv": w((nh + 2 * nkv) * hd, h), "qkv_b": torch.zeros((nh + 2 * nkv) * hd, device=dev, dtype=dt),
            "o": w(h, nh * hd), "gu": w(2 * ffn, h), "down": w(h, ffn),
            "k": w(1, nkv, max(1, context), hd), "v": w(1, nkv, max(1, context), hd),
        })
    final_ln = torch.ones(h, device=dev, dtype=dt)
    lm_head = w(vocab, h)
    x0 = w(1, h)

    def rms(x, g):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * g

    def step(x):
        for b in blocks:
            y = rms(x, b["ln1"])
            qkv = F.linear(y, b["qkv"], b["qkv_b"])
            q = qkv[:, : nh * hd].view(1, nh, 1, hd)
            a = F.scaled_dot_product_attention(q, b["k"], b["v"], enable_gqa=True)
            x = x + F.linear(a.reshape(1, nh * hd), b["o"])
            y = rms(x, b["ln2"])
            g, u = F.linear(y, b["gu"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, b["down"])
        return F.linear(rms(x, final_ln), lm_head)

    weight_bytes = sum(b[k].numel() * 2 for b in blocks for k in ("ln1", "ln2", "qkv", "qkv_b", "o", "gu", "down"))
    weight_bytes += lm_head.numel() * 2 + final_ln.numel() * 2
    kv_bytes = sum(b["k"].numel() * 2 + b["v"].numel() * 2 for b in blocks) if context else 0

    with torch.no_grad():
        for _ in range(3):
            step(x0)
        torch.cuda.synchronize()
        if graph:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    step(x0)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step(x0)
            run = g.replay
        else:
            def run():
                step(x0)
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            run()
        end.record()
        torch.cuda.synchronize()
    sec = start.elapsed_time(end) / 1e3 / steps
    return {"model": name, "context": context, "cuda_graph": graph, "ms_per_token": round(sec * 1e3, 3),
            "tok_s": round(1 / sec, 1), "weight_bytes_read": weight_bytes, "kv_bytes_read": kv_bytes,
            "achieved_gbps": round((weight_bytes + kv_bytes) / sec / 1e9, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nominal-gbps", type=float, default=4800.0, help="datasheet bandwidth of the card, GB/s")
    ap.add_argument("--models", default="qwen2.5-7b,qwen2.5-32b")
    args = ap.parse_args()
    import torch

    t0 = time.time()
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "nominal_gbps": args.nominal_gbps}
    out["copy_gbps_read_plus_write"] = round(copy_bandwidth(torch) / 1e9, 1)
    runs = []
    for name in args.models.split(","):
        for context in (0, 4096):
            for graph in (True, False):
                r = decode_bench(torch, name, context, graph)
                torch.cuda.empty_cache()
                r["efficiency_vs_nominal"] = round(r["achieved_gbps"] / args.nominal_gbps, 3)
                runs.append(r)
                print(json.dumps(r), flush=True)
    out["runs"] = runs
    out["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
