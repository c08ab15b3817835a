"""Does the build know the model? (llmfleet.knowledge.arch_support): catalog/architectures.yaml
against the recorded fixtures (tests/fixtures/vllm/<v>/rules.txt registry keys,
tests/fixtures/llamacpp/<build>/arch.txt LLM_ARCH_NAMES), the verdicts, and the planner's refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.images import llamacpp_arch, vllm_rules
from llmfleet.knowledge import arch_support as A
from llmfleet.knowledge import compat
from llmfleet.knowledge.catalog import find_model, load_models
from llmfleet.knowledge.planner import PlanRequest, plan

FIX = Path(__file__).parent / "fixtures"
CAT = compat.load_engine_catalog()
IMAGES = A._catalog()[0]


def _read(image: str) -> set[str]:
    b = IMAGES[image]
    if image.startswith("vllm:"):
        return set(vllm_rules.parse_excerpt((FIX / "vllm" / b.build / "rules.txt").read_text(encoding="utf-8")).architectures)
    return set(llamacpp_arch.parse_excerpt((FIX / "llamacpp" / b.build / "arch.txt").read_text(encoding="utf-8")))


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_each_recorded_image_knows_what_its_fixture_names_of_the_catalog_models(image):
    engine = image.split(":", 1)[0]
    names = {A.model_arch(engine, m) for m in load_models()} - {""}
    assert image in CAT.images and IMAGES[image].known == frozenset(names & _read(image))


def test_every_catalog_model_says_its_architecture_names():
    assert all(m.hf_architecture and m.gguf_architecture for m in load_models())


@pytest.mark.parametrize("engine, arch", [(e, a) for e, d in A._catalog()[1].items() for a in d])
def test_a_first_known_build_is_after_every_recorded_build_that_lacks_it(engine, arch):
    first = A._catalog()[1][engine][arch]["build"]
    lacking = [b for k, b in IMAGES.items() if k.startswith(engine + ":") and arch not in b.known]
    knowing = [b for k, b in IMAGES.items() if k.startswith(engine + ":") and arch in b.known]
    assert knowing and all(b.order < min(k.order for k in knowing) for b in lacking), first


@pytest.mark.parametrize("image, model, status, words", [
    ("llamacpp:b5000-cu122", "gpt-oss-20b", "fail", "does not know gpt-oss (gpt-oss-20b): first known in b6096"),
    ("llamacpp:b5000-cu122", "qwen3-30b-a3b", "fail", "does not know qwen3moe (qwen3-30b-a3b): first known in b5092"),
    ("llamacpp:b5000-cu122", "qwen3.5-27b", "fail", "does not know qwen35 (qwen3.5-27b): first known in b7990"),
    ("llamacpp:b5000-cu122", "qwen2.5-7b-instruct", "pass", "knows qwen2"),
    ("llamacpp:b5000-cu122", "gemma-3-27b-it", "pass", "knows gemma3"),
    ("llamacpp:vendored-0.3.36-cu118", "qwen3.5-27b", "pass", "knows qwen35"),
    ("vllm:0.9.2", "gpt-oss-20b", "fail", "does not know GptOssForCausalLM (gpt-oss-20b): first known in 0.10.1"),
    ("vllm:0.10.1.1", "qwen3.5-27b", "fail", "does not know Qwen3_5ForConditionalGeneration (qwen3.5-27b): first known in 0.17.0"),
    ("vllm:0.10.1.1", "gpt-oss-20b", "pass", "knows GptOssForCausalLM"),
    ("vllm:0.34.0", "qwen3.5-27b", "pass", "knows Qwen3_5ForConditionalGeneration"),
    ("vllm:lab-broken", "tiny-qwen2", "warn", "is not recorded"),
])
def test_the_verdict_names_the_first_build_that_knows_it(image, model, status, words):
    v = A.check(CAT.images[image], find_model(model))
    assert v.status == status and words in v.message, v


@pytest.mark.parametrize("image, model, fix", [
    ("llamacpp:b5000-cu122", "qwen3-30b-a3b", "use llamacpp:server-cuda-12.8"),
    ("vllm:0.9.2", "gpt-oss-20b", "use vllm:0.10.1.1"),
    ("vllm:0.10.1.1", "qwen3.5-27b", "use vllm:0.19.1"),
])
def test_a_fail_names_the_first_catalog_image_that_knows_it(image, model, fix):
    assert A.check(CAT.images[image], find_model(model)).fix == fix


def test_a_model_the_catalog_does_not_name_is_a_warn():
    assert A.check(CAT.images["vllm:0.34.0"], None).status == "warn"


@pytest.mark.parametrize("image, model, quant, gpu, fits", [
    ("llamacpp:b5000-cu122", "qwen3-30b-a3b", "q4_k_m", "a100-sxm4-80gb", False),
    ("llamacpp:b5000-cu122", "qwen3.5-27b", "q4_k_m", "a100-sxm4-80gb", False),
    ("llamacpp:b5000-cu122", "gpt-oss-20b", "mxfp4-moe", "a100-sxm4-80gb", False),
    ("llamacpp:b5000-cu122", "qwen2.5-7b-instruct", "q4_k_m", "rtx-3090", True),
    ("vllm:0.9.2", "gpt-oss-20b", "mxfp4", "a100-sxm4-80gb", False),
])
def test_a_plan_with_a_build_that_does_not_know_the_model_does_not_fit(image, model, quant, gpu, fits):
    p = plan(PlanRequest(model=model, quant=quant, gpu=gpu, image=image))
    refused = [x for x in p.notes if "does not know" in x]
    assert p.fits is fits and bool(refused) is not fits
