"""Every engine release in the catalog says what it runs on, and where that was read: the engine's
own kernel architectures, and for vLLM the torch pin and the torch build's architecture list, each
with a source (issue 26). The vLLM releases from 0.20 on are in the catalog, drafted from their
wheels by `catalog.release`; the plan on a V100 names the newest one that still runs there."""

from __future__ import annotations

import re

import pytest

from llmfleet.knowledge import compat, engines
from llmfleet.knowledge.planner import PlanRequest, plan

CAT = compat.load_engine_catalog()
GPU = {k: r for k, r in CAT.images.items() if not r.cpu and r.engine in engines.names()}  # exporters carry no kernels
VLLM = {k: r for k, r in GPU.items() if r.engine == "vllm"}
ARCH_WORDS = re.compile(r"kernel|arch|ARCH|sm_\d+|\d\.\d;\d\.\d|fatbin", re.I)


@pytest.mark.parametrize("key", sorted(GPU))
def test_every_gpu_release_has_its_kernel_archs_with_a_source(key):
    rel = GPU[key]
    assert rel.kernels.sass or rel.kernels.ptx, key
    assert compat.parse_archs([*rel.kernels.sass, *(f"{p}-virtual" for p in rel.kernels.ptx)]) is not None
    assert any(ARCH_WORDS.search(s) for s in rel.sources), f"{key}: no source names where its kernels were read"
    assert rel.confidence in ("H", "M", "U")


@pytest.mark.parametrize("key", sorted(VLLM))
def test_every_vllm_release_has_its_torch_pin_and_arch_list_with_a_source(key):
    tb = VLLM[key].torch
    assert tb is not None, f"{key}: no torch build"
    assert re.fullmatch(r"\d+\.\d+\.\d+", tb.version), f"{key}: torch pin {tb.version!r}"
    assert tb.archs and compat.parse_archs(tb.archs) is not None, f"{key}: torch arch list {tb.archs!r}"
    assert tb.sources and any(ARCH_WORDS.search(s) for s in tb.sources), f"{key}: no source for the torch arch list"
    assert tb.confidence in ("H", "M", "U")


def _v(key: str) -> tuple[int, ...]:
    return tuple(int(x) for x in key.split(":")[1].split("."))


def test_every_published_vllm_release_from_0_20_is_in_the_catalog():
    # published vLLM releases from 0.20.0: 0.20.0 ... 0.34.0 (`pip index versions vllm`)
    published = ["0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1",
                 "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
                 "0.34.0"]
    missing = [v for v in published if f"vllm:{v}" not in CAT.images]
    assert not missing, f"vLLM releases not in engines.yaml: {missing}; draft them with `catalog.release vllm==X`"


def test_no_vllm_release_after_0_19_runs_on_volta():
    for key, rel in VLLM.items():
        if re.fullmatch(r"vllm:\d+(\.\d+)+", key) and _v(key) >= (0, 20):
            assert compat.kernel_coverage(rel, "7.0") is None, key


def test_the_plan_on_a_v100_names_the_newest_vllm_that_runs_there():
    p = plan(PlanRequest(model="qwen2.5-7b-instruct", gpu="v100-sxm2-32gb", engine="vllm"))
    assert p.image == "vllm:0.19.1"
    note = next(n for n in p.notes if n.startswith("judged against image vllm:0.19.1"))
    newest = max((k for k in VLLM if re.fullmatch(r"vllm:\d+(\.\d+)+", k)), key=_v)
    assert "vllm:0.19.1 is the newest vllm release in the catalog that runs on compute capability 7.0" in note
    assert f"vllm:0.20.0 to {newest}" in note and "torch build has none either" in note
    # a card the newest releases run on gets no such note
    t4 = plan(PlanRequest(model="qwen2.5-7b-instruct", gpu="t4", engine="vllm"))
    assert t4.image == newest and not any("is the newest vllm release" in n for n in t4.notes)
