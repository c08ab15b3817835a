"""Reading a vLLM release's rules from its own source text (llmfleet.images.vllm_rules): the
QuantizationMethods Literal, each attention backend's supports_compute_capability floor, each
quantization config's get_min_capability, and the excerpt a fixture keeps."""

from __future__ import annotations

import pytest

from llmfleet.images import vllm_rules as V

INIT = '''
QuantizationMethods = Literal[
    "awq",
    "fp8",
    # a comment with "quoted" words is not a method
    "gguf",
    "modelopt_fp4",
]
QUANTIZATION_METHODS: list[str] = list(get_args(QuantizationMethods))
'''

FLASHINFER_24 = '''
class FlashInferBackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "FLASHINFER"

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        # broken on SM75: raise the floor to SM80
        return capability >= DeviceCapability(8, 0) and capability <= DeviceCapability(
            12, 1
        )

    @classmethod
    def supports_sink(cls) -> bool:
        return capability >= DeviceCapability(10, 0)
'''

TRITON = '''
class TritonAttentionBackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "TRITON_ATTN"

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        return True


class TritonAttentionImpl(AttentionImpl):
    pass
'''

MODELOPT = '''
class ModelOptFp8Config(QuantizationConfig):
    @classmethod
    def get_name(cls) -> QuantizationMethods:
        return "modelopt"

    @classmethod
    def get_min_capability(cls) -> int:
        return 89


class ModelOptNvFp4Config(QuantizationConfig):
    @classmethod
    def get_name(cls) -> QuantizationMethods:
        return "modelopt_fp4"

    @classmethod
    def get_min_capability(cls) -> int:
        # Marlin W4A16 below the FP4 tensor cores
        return 75
'''

FILES = {V.QUANT_INIT: INIT, f"{V.BACKENDS_DIR}flashinfer.py": FLASHINFER_24, f"{V.BACKENDS_DIR}triton_attn.py": TRITON,
         f"{V.QUANT_DIR}modelopt.py": MODELOPT, f"{V.BACKENDS_DIR}mla/x.py": FLASHINFER_24.replace("FLASHINFER", "MLA")}


def test_the_methods_are_the_literal_s_strings_without_comments():
    assert V.quantization_methods(INIT) == ("awq", "fp8", "gguf", "modelopt_fp4")
    assert V.quantization_methods("x = 1\n") == ()


@pytest.mark.parametrize(("text", "want"), [
    (FLASHINFER_24, ("FLASHINFER", "8.0")),
    (FLASHINFER_24.replace("DeviceCapability(8, 0)", "DeviceCapability(7, 5)"), ("FLASHINFER", "7.5")),
    (TRITON, ("TRITON_ATTN", "any")),
    (TRITON.replace("return True", "return capability.major in (8, 9)"), ("TRITON_ATTN", None)),  # not read: no guess
    ("class B:\n    @staticmethod\n    def get_name() -> str:\n        return \"B\"\n", (None, None)),  # states none
])
def test_a_backend_s_floor_is_read_or_left_unknown(text, want):
    assert V.backend_floor(text) == want


def test_the_rules_of_a_release_and_its_excerpt_agree():
    rules = V.read_rules(FILES)
    assert rules.methods == ("awq", "fp8", "gguf", "modelopt_fp4")
    assert rules.floors == {"FLASHINFER": "8.0", "TRITON_ATTN": "any"}  # backends/mla/ is another folder
    assert rules.min_capability == {"modelopt": "8.9", "modelopt_fp4": "7.5"}
    text = V.excerpt(FILES, "0.24.0", "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert text.splitlines()[0].startswith("# vllm 0.24.0: excerpts of vllm-0.24.0-")
    assert "https://github.com/vllm-project/vllm/tree/v0.24.0" in text.splitlines()[0]
    assert "return capability >= DeviceCapability(8, 0)" in text  # the release's own line, kept verbatim
    assert V.parse_excerpt(text) == rules


def test_the_recorded_releases_show_the_removals_and_the_flashinfer_floor():
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures" / "vllm"

    def rules(v: str) -> V.VllmRules:
        return V.parse_excerpt((fixtures / v / "rules.txt").read_text(encoding="utf-8"))

    assert "gguf" in rules("0.23.0").methods and "gguf" not in rules("0.24.0").methods
    assert "bitsandbytes" in rules("0.27.1").methods and "bitsandbytes" not in rules("0.28.0").methods
    assert rules("0.23.0").floors["FLASHINFER"] == "7.5" and rules("0.24.0").floors["FLASHINFER"] == "8.0"
    assert rules("0.34.0").min_capability["modelopt_fp4"] == "7.5"


REGISTRY_TEXT = '''_TEXT_GENERATION_MODELS = {
    # [Decoder-only]
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "DeepseekV32ForCausalLM": (
        "vllm.models.deepseek_v32",
        "DeepseekV32ForCausalLM",
    ),
}

_EMBEDDING_MODELS = {
    "BertModel": ("bert", "BertEmbeddingModel"),
}

_MULTIMODAL_MODELS = {
    "Gemma3ForConditionalGeneration": ("gemma3_mm", "Gemma3ForConditionalGeneration"),
}
'''


def test_the_registry_s_generation_and_multimodal_keys_are_its_architectures():
    assert V.registry_architectures(REGISTRY_TEXT) == (
        "DeepseekV32ForCausalLM", "Gemma3ForConditionalGeneration", "Qwen2ForCausalLM")
    assert V.registry_architectures("no registry here") == ()


def test_the_registry_keys_survive_the_excerpt_one_a_line():
    text = V.excerpt({V.REGISTRY: REGISTRY_TEXT}, "0.0.0", "vllm-0.0.0.whl")
    assert "## keys vllm/model_executor/models/registry.py _MULTIMODAL_MODELS\nGemma3ForConditionalGeneration" in text
    assert V.parse_excerpt(text).architectures == V.registry_architectures(REGISTRY_TEXT)


@pytest.mark.parametrize("version, arch, served", [
    ("0.9.2", "GptOssForCausalLM", False), ("0.10.1.1", "GptOssForCausalLM", True),
    ("0.9.2", "Qwen3MoeForCausalLM", True), ("0.10.1.1", "Qwen3_5ForConditionalGeneration", False),
    ("0.19.1", "Qwen3_5ForConditionalGeneration", True),
])
def test_the_recorded_registries_show_when_an_architecture_arrived(version, arch, served):
    from pathlib import Path

    text = (Path(__file__).parent / "fixtures" / "vllm" / version / "rules.txt").read_text(encoding="utf-8")
    assert (arch in V.parse_excerpt(text).architectures) is served


# --- KV-cache dtypes and the fp8 KV guard of a backend ---------------------------------------------
FA_HELPER = '''
def flash_attn_supports_fp8() -> bool:
    return get_flash_attn_version() == 3 and \\
        current_platform.get_device_capability().major == 9


def flash_attn_supports_kv_cache_dtype(
    kv_cache_dtype: str = "fp8_e4m3",
) -> bool:
    if kv_cache_dtype == "fp8_e5m2":
        return False
    return (fa_version == 3 and current_platform.is_device_capability_family(90)) or (
        fa_version == 4 and current_platform.is_device_capability_family(100)
    )
'''


def _backend(name: str, listed: str | None, method: str | None, extra: str = "") -> str:
    parts = ["class B(AttentionBackend):"]
    if listed is not None:
        parts.append(f"    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = [{listed}]")
    parts.append(f'    @staticmethod\n    def get_name() -> str:\n        return "{name}"')
    if method is not None:
        parts.append("    @classmethod\n    def supports_kv_cache_dtype(cls, kv_cache_dtype: CacheDType | None) -> bool:\n"
                     + "\n".join("        " + ln for ln in method.strip("\n").splitlines()))
    return "\n".join(parts) + "\n" + extra


RAISE_89 = '''
class Impl(AttentionImpl):
    def __init__(self, kv_cache_dtype):
        if kv_cache_dtype.startswith("fp8") and not (
            current_platform.has_device_capability(89)
        ):
            raise ValueError("native FP8 (fp8e4nv) requires SM89+")
'''


@pytest.mark.parametrize("text,dtypes,fp8", [
    # a list and no method: the base class checks membership; fp8 with no capability test runs anywhere
    (_backend("FLASHINFER", '"auto", "fp8", "fp8_e5m2"', None), ("auto", "fp8", "fp8_e5m2"), "any"),
    # no fp8 in the list: no fp8 guard at all
    (_backend("FLEX_ATTENTION", '"auto", "float16"', None), ("auto", "float16"), None),
    # 0.19: startswith("fp8") -> the helper; FA2-era major == 9
    (_backend("FLASH_ATTN", '"auto"', 'if kv_cache_dtype.startswith("fp8"):\n    return flash_attn_supports_fp8()\n'
              'return kv_cache_dtype in ["auto", "float16"]'),
     ("auto", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"), "9.0-9.9"),
    # 0.22-0.26: named fp8 dtypes, the family test inline
    (_backend("FLASH_ATTN", '"auto"', 'if kv_cache_dtype in ("fp8", "fp8_e4m3"):\n    return (\n'
              '        get_flash_attn_version() == 3\n        and current_platform.is_device_capability_family(90)\n'
              '    )\nreturn kv_cache_dtype in ["auto", "bfloat16"]'),
     ("auto", "bfloat16", "fp8", "fp8_e4m3"), "9.0-9.9"),
    # 0.29 on: the list bounds it, the helper adds FA4 on Blackwell
    (_backend("FLASH_ATTN", '"auto", "fp8", "fp8_e4m3"', 'if kv_cache_dtype not in cls.supported_kv_cache_dtypes:\n'
              '    return False\nif is_quantized_kv_cache(kv_cache_dtype):\n'
              '    return flash_attn_supports_kv_cache_dtype(kv_cache_dtype)\nreturn True'),
     ("auto", "fp8", "fp8_e4m3"), "9.0-9.9,10.0-10.9"),
    # a branch for another dtype (nvfp4 on Blackwell) is not the fp8 guard; super() keeps the list
    (_backend("FLASHINFER", '"auto", "fp8"', 'if kv_cache_dtype == "nvfp4":\n'
              '    return current_platform.is_device_capability_family(100)\n'
              'return super().supports_kv_cache_dtype(kv_cache_dtype)'), ("auto", "fp8", "nvfp4"), "any"),
    # Triton from 0.24: the impl refuses fp8 below SM89
    (_backend("TRITON_ATTN", '"auto", "fp8", "fp8_e4m3"', None, RAISE_89), ("auto", "fp8", "fp8_e4m3"), "8.9+"),
    # an fp8 test of no known pattern: not read
    (_backend("X", '"auto"', 'if kv_cache_dtype.startswith("fp8"):\n    return envs.SOMETHING\nreturn True'),
     ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"), None),
])
def test_a_backend_s_kv_dtypes_and_fp8_capabilities_are_read_or_left_unknown(text, dtypes, fp8):
    files = {V.BACKENDS_DIR + "b.py": text, V.BACKENDS_DIR + "fa_utils.py": FA_HELPER}
    rules = V.read_rules(files)
    name = V._NAME.search(text).group(1)
    assert rules.kv_dtypes[name] == dtypes
    assert rules.kv_fp8_cc.get(name) == fp8
    # the excerpt keeps what was read
    assert V.parse_excerpt(V.excerpt(files, "0.0.0", "vllm-0.0.0.whl")) == rules


def test_an_excerpt_without_kv_blocks_still_parses():
    text = ("# vllm 0.0.0: excerpts\n## file vllm/v1/attention/backends/triton_attn.py\n"
            '    def get_name() -> str:\n        return "TRITON_ATTN"\n'
            "    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:\n        return True\n")
    rules = V.parse_excerpt(text)
    assert rules.floors == {"TRITON_ATTN": "any"} and rules.kv_dtypes == {} and rules.kv_fp8_cc == {}
