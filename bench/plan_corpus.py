"""Write the planner's answer to a large table of requests, one JSON line each, to compare the planner
before and after a change that must not move a figure (a refactoring): the two files are then
byte-identical (``cmp``).

The table: every catalog card x every model x every quant (each engine's default) x 3 contexts; each
model and quant under both engines on a set of cards; splits over cards and hosts (tensor, layer and
row, NVLink / PCIe, networks); offload; every KV dtype of each engine; driver branches; every engine
image; concurrency, memory utilization, measured efficiency, extra flags; refusals (bad values); the
example inventory's services through ``plan_for_service``. Each line holds the request and either the
plan's full serialized form with its summary (as tests/test_planner_golden.py pins them) or the error.

Pure arithmetic from the catalogs (no GPU, no network). Run:
    python bench/plan_corpus.py /tmp/plans.jsonl    # prints the number of requests and the file's sha256
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from llmfleet.knowledge import compat  # noqa: E402
from llmfleet.knowledge.catalog import kv_dtypes, load_gpus, load_models, load_quants  # noqa: E402

CONTEXTS = (None, 8192, 131072)
SOME_CARDS = ("p40", "t4", "v100-sxm2-32gb", "rtx-3090", "rtx-4090", "l4", "a100-sxm4-80gb", "h100-sxm-80gb")
BIG_MODELS = ("llama-3.1-70b-instruct", "qwen2.5-32b-instruct", "qwen3-30b-a3b", "mixtral-8x7b-instruct",
              "deepseek-v3", "gpt-oss-20b", "qwen3.5-27b", "gemma-3-27b-it")
SPLIT_QUANTS = ("gptq-int4", "awq-int4", "bf16", "fp8", "q4_k_m", "q8_0")
SPLIT_CARDS = ("p40", "v100-sxm2-32gb", "v100-pcie-32gb", "rtx-3090", "rtx-4090", "a100-sxm4-40gb", "h100-sxm-80gb")
PAIRS = (("qwen2.5-7b-instruct", "bf16"), ("qwen2.5-7b-instruct", "q4_k_m"), ("gemma-2-27b-it", "gptq-int4"),
         ("gemma-3-27b-it", "q4_k_m"), ("qwen3-30b-a3b", "awq-int4"), ("gpt-oss-20b", "mxfp4"),
         ("llama-3.1-8b-instruct", "fp8"), ("qwen3.5-27b", "q4_k_m"))


def _grid() -> Iterator[dict[str, Any]]:
    """Every card x every model x every quant x 3 contexts, engine from the quant."""
    for g in load_gpus():
        for m in load_models():
            for q in load_quants():
                for c in CONTEXTS:
                    yield dict(model=m.name, quant=q.name, gpu=g.id, context=c)


def _engines() -> Iterator[dict[str, Any]]:
    for m in load_models():
        for q in load_quants():
            for engine in ("vllm", "llamacpp"):
                for g in SOME_CARDS:
                    yield dict(model=m.name, quant=q.name, gpu=g, engine=engine, context=8192)


def _splits() -> Iterator[dict[str, Any]]:
    for m in BIG_MODELS:
        for q in SPLIT_QUANTS:
            for g in SPLIT_CARDS:
                for gpus in (2, 4, 8):
                    yield dict(model=m, quant=q, gpu=g, gpus=gpus, context=16384)
                    yield dict(model=m, quant=q, gpu=g, gpus=gpus, hosts=2, context=16384)
                yield dict(model=m, quant=q, gpu=g, gpus=2, interconnect="nvlink", context=8192)
                yield dict(model=m, quant=q, gpu=g, gpus=4, interconnect="pcie", context=8192, gpus_available=4)
                yield dict(model=m, quant=q, gpu=g, gpus=4, split_mode="row", context=8192)
                yield dict(model=m, quant=q, gpu=g, gpus=1, hosts=3, network_gbps=25.0, network_latency_us=40.0,
                           context=8192)
                yield dict(model=m, quant=q, gpu=g, gpus=2, hosts=2, network_gbps=100.0, context=8192)


def _offload() -> Iterator[dict[str, Any]]:
    for m in load_models():
        for q in ("bf16", "fp8", "gptq-int4", "gptq-int8", "q8_0", "q4_k_m", "mxfp4-moe"):
            for g in SOME_CARDS:
                yield dict(model=m.name, quant=q, gpu=g, context=8192, offload=True)
            yield dict(model=m.name, quant=q, gpu="rtx-4090", gpus=2, context=32768, offload=True)


def _kv_dtypes() -> Iterator[dict[str, Any]]:
    for engine, quant in (("vllm", "bf16"), ("vllm", "gptq-int4"), ("llamacpp", "q4_k_m"), ("llamacpp", "q8_0")):
        for kv in [*kv_dtypes(engine), "nonsense"]:
            for m in ("qwen2.5-7b-instruct", "gemma-3-27b-it", "qwen3.5-27b", "deepseek-v2-lite-chat", "gpt-oss-20b"):
                for g in SOME_CARDS:
                    yield dict(model=m, quant=quant, engine=engine, gpu=g, kv_dtype=kv, context=32768)


def _drivers() -> Iterator[dict[str, Any]]:
    cat = compat.load_engine_catalog()
    drivers = [f"{b}.{minor}" for b in sorted(cat.driver_branches) for minor in ("00.01", "86.10")]
    for d in [*drivers, "470.82.01", "535.104.05", "550.54.15", "not-a-driver"]:
        for m, q in PAIRS[:4]:
            for g in ("p40", "t4", "v100-sxm2-32gb", "rtx-4090", "h100-sxm-80gb"):
                yield dict(model=m, quant=q, gpu=g, driver=d, context=8192)


def _images() -> Iterator[dict[str, Any]]:
    cat = compat.load_engine_catalog()
    for image in sorted(cat.images):
        if not image.startswith(("vllm:", "llamacpp:")):
            continue
        for m, q in PAIRS:
            for g in ("p40", "t4", "v100-sxm2-32gb", "rtx-3090", "h100-sxm-80gb"):
                yield dict(model=m, quant=q, gpu=g, image=image, context=8192)
        yield dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4", image=image, driver="470.82.01")
    for m, q in PAIRS[:2]:
        yield dict(model=m, quant=q, gpu="t4", image="vllm:9.9.9", context=8192)


def _knobs() -> Iterator[dict[str, Any]]:
    for m, q in PAIRS:
        for g in ("t4", "rtx-4090", "a100-sxm4-80gb"):
            for n in (1, 4, 16, 64):
                yield dict(model=m, quant=q, gpu=g, concurrency=n, context=8192)
            for u in (0.5, 0.8, 0.95):
                yield dict(model=m, quant=q, gpu=g, gpu_memory_utilization=u, context=8192)
            yield dict(model=m, quant=q, gpu=g, measured_efficiency=[0.55, "measured on gpu-a"], context=8192)
            yield dict(model=m, quant=q, gpu=g, extra_args=["--enforce-eager"], context=8192)
            yield dict(model=m, quant=q, gpu=g, extra_args=["--max-model-len", "4096"], context=8192)
            yield dict(model=m, quant=q, gpu=g, extra_args=["-c", "2048", "--no-mmap"], context=8192)
            yield dict(model=m, quant=q, gpu=g, extra_env=[["VLLM_ATTENTION_BACKEND", "XFORMERS"]], context=8192)
    for name in ("Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4", "Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"):
        for g in ("t4", "rtx-4090"):
            yield dict(model=name, gpu=g, context=8192)


def _errors() -> Iterator[dict[str, Any]]:
    base = dict(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="t4", context=8192)
    bad: list[dict[str, Any]] = [
        dict(model="no-such-model"), dict(quant="q3_nonsense"), dict(gpu="no-such-card"), dict(gpus=0),
        dict(gpus=-1), dict(context=0), dict(context=-5), dict(context=10**8), dict(concurrency=0),
        dict(engine="tgi"), dict(engine="vllm", split_mode="row"), dict(split_mode="diagonal"),
        dict(gpu_memory_utilization=1.5), dict(gpu_memory_utilization=0.0), dict(hosts=0),
        dict(network_gbps=-1.0), dict(network_latency_us=-2.0), dict(interconnect="carrier-pigeon"),
        dict(gpus_available=0), dict(quant="bf16", engine="llamacpp"), dict(kv_dtype="int3"),
        dict(measured_efficiency=[1.7, "impossible"]), dict(measured_efficiency=[0.0, "zero"]),
        dict(image="llamacpp:lab-cpu", engine="vllm"), dict(image="node-exporter:1.9.1"),
        dict(model="model.gguf"), dict(model="/no/such/folder"), dict(gpu="rtx"), dict(gpu="V100"),
    ]
    for b in bad:
        yield {**base, **b}


def _requests() -> Iterator[dict[str, Any]]:
    for part in (_grid, _engines, _splits, _offload, _kv_dtypes, _drivers, _images, _knobs, _errors):
        yield from part()


def _serialize(p: Any) -> dict[str, Any]:
    from llmfleet.knowledge.planner import summarize

    d: dict[str, Any] = p.to_dict()
    summary = summarize(p)
    d["summary"] = None if summary is None else {
        k: list(v) if isinstance(v, tuple) else v for k, v in summary.__dict__.items()
    }
    return d


def _answer(case: dict[str, Any]) -> dict[str, Any]:
    from llmfleet.knowledge.planner import PlanRequest, plan

    kw = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
          for k, v in case.items()}
    try:
        return _serialize(plan(PlanRequest(**kw)))
    except Exception as exc:  # every refusal and every crash is part of the answer
        return {"error": f"{type(exc).__name__}: {exc}"}


def _service_answers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    from llmfleet.inventory.ansible import load_inventory
    from llmfleet.knowledge.planner import plan_for_service

    inv = load_inventory(str(REPO / "inventory" / "example"))
    for name in sorted(inv.hosts):
        settings = inv.settings_for(inv.hosts[name])
        for svc in settings.services:
            for gpu, count, hosts in ((settings.gpu, 1, 1), (settings.gpu, 4, 1), ("t4", 1, 1), ("rtx-4090", 2, 2)):
                case = dict(service=f"{name}/{svc.name}", gpu=str(gpu), gpu_count=count, hosts=hosts)
                try:
                    got = _serialize(plan_for_service(svc, gpu, count, hosts=hosts, driver="535.104.05"))
                except Exception as exc:
                    got = {"error": f"{type(exc).__name__}: {exc}"}
                yield case, got


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out = Path(argv[0])
    n = 0
    with out.open("w", encoding="utf-8") as f:
        for case in _requests():
            f.write(json.dumps({"case": case, "plan": _answer(case)}, sort_keys=True) + "\n")
            n += 1
        for case, got in _service_answers():
            f.write(json.dumps({"case": case, "plan": got}, sort_keys=True) + "\n")
            n += 1
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    print(f"{n} requests -> {out}  sha256 {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
