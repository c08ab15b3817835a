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
