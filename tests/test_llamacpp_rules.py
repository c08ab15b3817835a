"""llama.cpp rules read from each build's own source (llmfleet.images.llamacpp_rules): the CUDA
flash-attention K/V table of fattn.cu / ggml-cuda.cu and the GGUF tensor types of ggml.h, the catalog
entries that carry them (engines.yaml cuda_flash_attn_kv per image, architectures.yaml ggml_types),
and the plan / preflight verdicts that use them."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.images import llamacpp_rules as R
from llmfleet.knowledge import arch_support as A
from llmfleet.knowledge import compat
from llmfleet.knowledge.catalog import _read_yaml
from llmfleet.knowledge.planner import PlanRequest, plan

FIX = Path(__file__).parent / "fixtures" / "llamacpp"
CAT = compat.load_engine_catalog()
GPU_IMAGES = [k for k, r in CAT.images.items() if r.engine == "llamacpp" and not r.cpu]


def table(build: str) -> R.FaTable:
    return R.parse_fattn_excerpt((FIX / build / "fattn.txt").read_text(encoding="utf-8"))


def types(build: str) -> tuple[str, ...]:
    return R.parse_types_excerpt((FIX / build / "ggml_types.txt").read_text(encoding="utf-8"))


# ------------------------------------------------------------------ the reader, on the recorded source
@pytest.mark.parametrize("build, same, mixed, heads, cpu, any_pair", [
    # b5000: vector kernels for quantized K/V only at head size 128, no K q8_0 / V q4_0 kernel, BF16 refused
    ("b5000", ("f16", "q4_0", "q8_0"), (), (128,), ("bf16",), False),
    ("b6096", ("f16", "q4_0", "q8_0"), (), (128,), ("bf16",), False),
    # b10573: ggml_cuda_get_best_fattn_kernel: one type of f32/f16/bf16/q4_0/q8_0, any head size it takes
    ("b10573", ("bf16", "f16", "f32", "q4_0", "q8_0"), (), None, ("iq4_nl",), False),
    # the llama-cpp-python 0.3.36 tree: no same-type rule, pairs without a vector kernel converted to f16
    ("vendored-0.3.36", ("bf16", "f16", "f32", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"), (), None, ("iq4_nl",), True),
])
def test_fa_table_read_from_each_build(build, same, mixed, heads, cpu, any_pair):
    t = table(build)
    assert (t.types, t.mixed, t.quant_head_sizes, t.cpu_types, t.any_pair) == (same, mixed, heads, cpu, any_pair)


def test_fa_reader_sees_a_mixed_pair_and_the_all_quants_block():
    text = """void ggml_cuda_flash_attn_ext_vec_f16(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
#ifdef GGML_CUDA_FA_ALL_QUANTS
    FATTN_VEC_F16_CASE(128, GGML_TYPE_Q5_0, GGML_TYPE_Q5_0)
#else
    FATTN_VEC_F16_CASE(128, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0)
    FATTN_VEC_F16_CASE( 64, GGML_TYPE_F16, GGML_TYPE_F16)
#endif // GGML_CUDA_FA_ALL_QUANTS
}
"""
    t = R.fa_table(text)
    assert t.mixed == (("q8_0", "q4_0"),) and t.types == ("f16",) and "q5_0" in t.all_quants_types
    with pytest.raises(ValueError):
        R.fa_table("int main() {}")


def test_ggml_types_read_from_each_build():
    assert "MXFP4" not in types("b5000") and "MXFP4" not in types("b6095")
    assert "MXFP4" in types("b6096") and "MXFP4" in types("b10573") and "MXFP4" in types("vendored-0.3.36")
    assert "Q4_2" not in types("b5000")  # commented out in the enum: support removed
    assert {"Q4_K", "Q6_K", "BF16", "IQ4_XS"} <= set(types("b5000"))


# ------------------------------------------------------------------ the catalog against the fixtures
@pytest.mark.parametrize("image", GPU_IMAGES)
def test_each_gpu_image_carries_the_table_read_at_its_build(image):
    kv = CAT.images[image].cuda_flash_attn_kv
    assert kv is not None and kv.build, f"{image}: no cuda_flash_attn_kv read at a build"
    t = table(kv.build)
    assert sorted(kv.types) == list(t.types)
    assert [tuple(p) for p in kv.mixed] == list(t.mixed)
    assert sorted(kv.all_quants_types) == list(t.all_quants_types)
    assert kv.quant_head_sizes == (list(t.quant_head_sizes) if t.quant_head_sizes is not None else None)
    assert sorted(kv.cpu_types) == list(t.cpu_types)
    assert kv.any_pair is t.any_pair
    assert f"tests/fixtures/llamacpp/{kv.build}/fattn.txt" in kv.source


def test_an_abort_claim_is_in_its_excerpt():
    """``outside: abort`` is read from the excerpt: supports_op accepts every non-BF16 pair at head size 128
    and on_no_fattn_vec_case aborts when the vector kernel for the pair is missing."""
    for image in GPU_IMAGES:
        kv = CAT.images[image].cuda_flash_attn_kv
        assert kv is not None
        text = (FIX / str(kv.build) / "fattn.txt").read_text(encoding="utf-8")
        assert kv.outside == R.outside(text), image


def test_the_engine_level_table_is_gone():
    assert CAT.engines["llamacpp"].cuda_flash_attn_kv is None


def test_ggml_types_of_each_image_match_its_fixture():
    data = _read_yaml("architectures.yaml")
    seen = 0
    for key, e in data["images"].items():
        if "ggml_types" not in e:
            continue
        seen += 1
        build = str(e["build"])
        assert sorted(e["ggml_types"]) == list(types(build)), key
    assert seen >= 3
    first = data["first_ggml_type"]["llamacpp"]["MXFP4"]["build"]
    assert first == "b6096" and "MXFP4" not in types("b6095") and "MXFP4" in types(first)


# ------------------------------------------------------------------ verdicts
def kv_check(image, kv, args, head_dim=None):
    r = CAT.images[image]
    return compat.check_kv_dtype(r, CAT.engines["llamacpp"], kv, args, {}, "8.6", head_dim)


@pytest.mark.parametrize("image, kv, args, head_dim, status, said", [
    # b5000: K q8_0 / V q4_0 has no vector kernel: the server aborts
    ("llamacpp:b5000-cu122", "auto", ["-ctk", "q8_0", "-ctv", "q4_0", "-fa"], 128, "fail", "the server aborts"),
    # b5000: supports_op refuses a BF16 cache: the attention runs on the CPU
    ("llamacpp:b5000-cu122", "bf16", ["-fa"], 128, "fail", "runs on the CPU at this build"),
    # b5000: a quantized cache at head size 256 (gemma-2) or 64: CPU attention
    ("llamacpp:b5000-cu122", "q8_0", ["-fa"], 256, "fail", "only at head size 128"),
    ("llamacpp:b5000-cu122", "q4_0", ["-fa"], 64, "fail", "only at head size 128"),
    ("llamacpp:b5000-cu122", "q8_0", ["-fa"], 128, "pass", "q8_0/q8_0"),
    ("llamacpp:b5000-cu122", "f16", ["-fa"], 256, "pass", ""),
    # the floating tag's build (b10573) takes bf16 and a quantized cache at head size 256
    ("llamacpp:server-cuda-12.8", "bf16", ["-fa", "on"], 128, "pass", ""),
    ("llamacpp:server-cuda-12.8", "q8_0", ["-fa", "on"], 256, "pass", ""),
    ("llamacpp:server-cuda-12.8", "auto", ["-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on"], 128, "fail", "K q8_0 / V q4_0"),
    # the 0.3.36 tree runs any pair of its types (converted to f16 where no vector kernel was compiled)
    ("llamacpp:vendored-0.3.36-cu118", "auto", ["-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on"], 128, "pass", ""),
])
def test_kv_cache_judged_by_the_image_build(image, kv, args, head_dim, status, said):
    v = kv_check(image, kv, args, head_dim)
    assert v.status == status, v
    assert said in v.message, v.message
    if status == "fail":
        assert v.fix, v


def test_a_build_whose_table_was_not_read_warns():
    r = CAT.images["llamacpp:b5000-cu122"].model_copy(update={"cuda_flash_attn_kv": None, "key": "llamacpp:mine"})
    v = compat.check_kv_dtype(r, CAT.engines["llamacpp"], "q8_0", ["-fa"], {}, "8.6")
    assert v.status == "warn" and "not read for this build" in v.message
    assert compat.check_kv_dtype(r, CAT.engines["llamacpp"], "f16", ["-fa"], {}, "8.6").status == "pass"


@pytest.mark.parametrize("model, image, fits", [
    ("gemma-2-9b-it", "llamacpp:b5000-cu122", False),     # head size 256: q8_0 FA on the CPU at b5000
    ("gemma-2-9b-it", "llamacpp:server-cuda-12.8", True),
    ("qwen2.5-7b-instruct", "llamacpp:b5000-cu122", True),  # head size 128
])
def test_plan_refuses_a_quantized_cache_the_build_has_no_kernel_for(model, image, fits):
    p = plan(PlanRequest(model=model, quant="q4_k_m", gpu="rtx-3090", image=image, kv_dtype="q8_0", context=4096))
    refused = [x for x in p.notes if "only at head size" in x]
    assert p.fits is fits and bool(refused) is not fits


@pytest.mark.parametrize("image, refused", [
    ("llamacpp:b5000-cu122", True), ("llamacpp:server-cuda-12.8", False), ("llamacpp:vendored-0.3.36-cu118", False),
])
def test_an_mxfp4_gguf_on_a_build_without_the_type_is_refused(image, refused):
    # qwen2.5 is known to b5000, so only the tensor type refuses it there
    p = plan(PlanRequest(model="qwen2.5-7b-instruct", quant="mxfp4-moe", gpu="a100-sxm4-80gb", image=image))
    said = [x for x in p.notes if "no ggml type MXFP4" in x]
    assert bool(said) is refused
    if refused:
        assert "b6096" in said[0] and "use llamacpp:server-cuda-12.8" in said[0]
    v = A.check_ggml_types(CAT.images[image], "mxfp4-moe")
    assert v is not None and (v.status == "fail") is refused
