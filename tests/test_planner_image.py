"""The image step (``knowledge/planner/image.py``): the catalog image a plan's flags and KV layout are
judged against when none is given, what a host's driver changes, and the refusal where no image of the
engine runs on the card."""

from __future__ import annotations

import pytest

from llmfleet.knowledge import compat
from llmfleet.knowledge.catalog import find_gpu
from llmfleet.knowledge.planner.image import _default_release, _judged_release, _no_image_refusal
from llmfleet.knowledge.planner.request import PlanRequest


@pytest.fixture(scope="module")
def cat():
    return compat.load_engine_catalog()


@pytest.mark.parametrize(
    ("engine", "gpu", "driver", "image"),
    [
        ("vllm", "h100-sxm-80gb", None, "vllm:0.34.0"),
        ("vllm", "t4", None, "vllm:0.34.0"),
        ("vllm", "v100-sxm2-32gb", None, "vllm:0.19.1"),  # the last vLLM with Volta kernels
        ("vllm", "t4", "535.104.05", "vllm:0.19.1"),  # the newest that runs on an R535 driver
        ("vllm", "p40", None, None),  # no vLLM build has Pascal kernels
        ("llamacpp", "p40", None, "llamacpp:server-cuda-12.8"),
        ("llamacpp", "p40", "470.82.01", "llamacpp:vendored-0.3.36-cu118"),  # a CUDA 11.8 build for an R470 host
    ],
)
def test_the_default_image(cat, engine, gpu, driver, image):
    rel = _default_release(cat, engine, find_gpu(gpu), driver)
    assert (rel.key if rel is not None else None) == image


@pytest.mark.parametrize(
    ("kw", "image", "note"),
    [
        (dict(gpu="h100-sxm-80gb"), "vllm:0.34.0", "judged against image vllm:0.34.0 (no image given"),
        (dict(gpu="v100-sxm2-32gb"), "vllm:0.19.1", "newer releases (vllm:0.20.0 to vllm:0.34.0) have no kernels"),
        (dict(gpu="t4", driver="470.82.01"), "vllm:0.34.0", "does not run on this host"),
        (dict(gpu="t4", image="vllm:0.20.0"), "vllm:0.20.0", ""),  # asked for, runs: nothing to say
        (dict(gpu="p40"), None, "no catalog vllm image has kernels for compute capability 6.1"),
    ],
)
def test_the_judged_image_and_its_note(cat, kw, image, note):
    req = PlanRequest(model="qwen2.5-7b-instruct", quant="bf16", **kw)
    gpu = find_gpu(kw["gpu"])
    asked = cat.release(kw["image"]) if "image" in kw else None
    rel, said = _judged_release(req, cat, "vllm", gpu, asked)
    assert (rel.key if rel is not None else None) == image
    assert note in said if note else said == ""


@pytest.mark.parametrize(
    ("engine", "gpu", "refusal"),
    [
        ("vllm", "p40", "vLLM needs compute capability 7.0 or higher"),
        ("vllm", "p100-pcie-16gb", "serve this card with llama.cpp (--engine llamacpp and a GGUF --quant or file)"),
    ],
)
def test_no_image_for_the_card_is_refused_with_the_engine_that_runs(cat, engine, gpu, refusal):
    said = _no_image_refusal(cat, engine, find_gpu(gpu))
    assert said.startswith("REFUSED: no vLLM image in the catalog runs on ")
    assert refusal in said
