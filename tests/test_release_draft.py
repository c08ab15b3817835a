"""catalog.release: a catalog entry drafted from a vLLM release's published wheels.

The drafting is tested from recorded METADATA files (vllm 0.33.0 and torch 2.14.0 as published on
PyPI, headers only) and tiny synthetic wheels whose .so files carry a fatbin section; the CLI's bad
input (no such release, no network, a wheel without CUDA kernels, the packaged catalog as --write
target) without any network: pip is pointed at an empty local index or a closed local port."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from llmfleet.errors import UsageError
from llmfleet.images import published
from llmfleet.images import release_draft as rd
from llmfleet.knowledge import compat
from tests.test_images_inspect import _container, make_elf

DATA = Path(__file__).parent / "data" / "release"
VLLM_META = (DATA / "METADATA-vllm-0.33.0").read_text()
TORCH_META = (DATA / "METADATA-torch-2.14.0").read_text()
LLMFLEET = str(Path(sys.executable).parent / "llmfleet")
TOOLKITS = compat.load_engine_catalog().cuda_toolkits


def _so(sass: list[int], ptx: list[int]) -> bytes:
    return make_elf({b".text": b"\x90" * 16,
                     b".nv_fatbin": _container([(2, s) for s in sass] + [(1, p) for p in ptx])})


def _wheel(path: Path, metadata: str, dist: str, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", metadata)
        for name, data in files.items():
            z.writestr(name, data)
    return path


@pytest.fixture
def wheels(tmp_path):
    vllm = _wheel(tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", VLLM_META, "vllm-0.33.0", {
        # the core library as 0.33.0 publishes it (SASS 7.5-12.0, some PTX), and one backend library
        "vllm/_C_stable_libtorch.abi3.so": _so([75, 80, 86, 89, 90, 100, 120], [80, 89, 90]),
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": _so([80], [80]),
        "vllm/cumem_allocator.abi3.so": make_elf({b".text": b"\x90" * 16}),
        "vllm/__init__.py": b"",
        # two attention backends: FA's fp8 KV through the fa_utils helper, Triton's refused below SM89
        "vllm/v1/attention/backends/fa_utils.py": (
            b"def flash_attn_supports_fp8() -> bool:\n    return (\n        get_flash_attn_version() == 3\n"
            b"        and current_platform.is_device_capability_family(90)\n    )\n"),
        "vllm/v1/attention/backends/flash_attn.py": (
            b"class FlashAttentionBackend(AttentionBackend):\n"
            b"    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = [\n        \"auto\",\n        \"bfloat16\",\n    ]\n\n"
            b"    @staticmethod\n    def get_name() -> str:\n        return \"FLASH_ATTN\"\n\n"
            b"    @classmethod\n    def supports_kv_cache_dtype(cls, kv_cache_dtype: CacheDType | None) -> bool:\n"
            b"        if kv_cache_dtype in (\"fp8\", \"fp8_e4m3\"):\n            return flash_attn_supports_fp8()\n"
            b"        return kv_cache_dtype in [\"auto\", \"bfloat16\"]\n\n"
            b"    @classmethod\n    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:\n"
            b"        return capability >= DeviceCapability(8, 0)\n"),
        "vllm/v1/attention/backends/triton_attn.py": (
            b"class TritonAttentionBackend(AttentionBackend):\n"
            b"    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = [\"auto\", \"fp8\", \"fp8_e5m2\"]\n\n"
            b"    @staticmethod\n    def get_name() -> str:\n        return \"TRITON_ATTN\"\n\n"
            b"    @classmethod\n    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:\n"
            b"        return True\n\n\nclass TritonAttentionImpl(AttentionImpl):\n"
            b"    def __init__(self, kv_cache_dtype: str) -> None:\n"
            b"        if kv_cache_dtype.startswith(\"fp8\") and not (\n"
            b"            current_platform.has_device_capability(89)\n        ):\n"
            b"            raise ValueError(\"native FP8 (fp8e4nv) requires SM89+\")\n"),
        "vllm/model_executor/models/registry.py": (
            b'_TEXT_GENERATION_MODELS = {\n    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),\n'
            b'    "GptOssForCausalLM": ("gpt_oss", "GptOssForCausalLM"),\n}\n\n'
            b'_MULTIMODAL_MODELS = {\n    "Qwen3_5ForConditionalGeneration": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),\n}\n'),
    })
    torch = _wheel(tmp_path / "torch-2.14.0-cp312-cp312-manylinux_2_28_x86_64.whl", TORCH_META, "torch-2.14.0", {
        # two object files built for TORCH_CUDA_ARCH_LIST (12.0 also as PTX), one of them with an
        # arch-specific extra (sm_103a CUTLASS kernels): the extra is not the build's list
        "torch/lib/libtorch_cuda.so": make_elf({b".nv_fatbin": _container(
            [(2, s) for s in (75, 80, 86, 90, 100, 120)] + [(1, 120)]) + _container(
            [(2, s) for s in (75, 80, 86, 90, 100, 103, 120)] + [(1, 120)])}),
    })
    cpu = _wheel(tmp_path / "vllm-0.33.0-cp38-abi3-linux_x86_64.whl", VLLM_META, "vllm-0.33.0", {
        "vllm/_C.abi3.so": make_elf({b".text": b"\x90" * 16}),
    })
    return vllm, torch, cpu


def test_the_torch_pin_is_read_from_the_recorded_metadata():
    assert rd.requires(VLLM_META, "torch") == "2.14.0"
    assert rd.requires(VLLM_META, "zentorch") is None  # only under an extra
    assert rd.metadata_field(VLLM_META, "Version") == "0.33.0"


@pytest.mark.parametrize(("line", "cuda"), [
    ("Requires-Dist: nvidia-cuda-runtime-cu12==12.8.90; platform_system == \"Linux\"", "12.8"),
    ("Requires-Dist: nvidia-cuda-runtime==13.0.96; platform_system == \"Linux\"", "13.0"),
    ("Requires-Dist: cuda-toolkit[cublas,cudart]==13.0.3; platform_system == \"Linux\"", "13.0"),
    ("Requires-Dist: filelock", None),
])
def test_the_torch_builds_cuda_is_read_from_its_nvidia_pins(line, cuda):
    assert rd.torch_cuda(f"Name: torch\n{line}\n") == cuda


def test_recorded_torch_metadata_says_cuda_13_0():
    assert rd.torch_cuda(TORCH_META) == "13.0"


@pytest.mark.parametrize("bad", ["vllm", "vllm=0.33", "llamacpp==b5000", "", "vllm==", "torch==2.14.0"])
def test_a_bad_spec_is_a_usage_error(bad):
    with pytest.raises(UsageError):
        rd.parse_spec(bad)


def test_the_draft_from_the_wheels_names_a_source_and_confidence_for_every_field(wheels):
    vllm, torch, _ = wheels
    d = published.draft_release("vllm==0.33.0", TOOLKITS, wheel=vllm, torch_wheel=torch)
    e = d["entry"]
    assert d["key"] == "vllm:0.33.0" and e["tag"] == "v0.33.0"
    assert e["kernels"] == {"sass": ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"], "ptx": ["8.0", "8.9", "9.0"]}
    assert e["torch"]["version"] == "2.14.0" and e["torch"]["cuda"] == "13.0"
    assert e["torch"]["archs"] == ["7.5", "8.0", "8.6", "9.0", "10.0", "12.0+PTX"]
    assert "SASS 10.3 in 1 of 2" in d["provenance"]["torch.archs"]["source"]
    assert e["cuda"] == "13.0" and e["min_driver"] == TOOLKITS["13.0"][0]
    assert e["torch"]["confidence"] == "H" and e["confidence"] == "H"
    for name in ("kernels", "torch.version", "torch.archs", "torch.cuda", "cuda", "min_driver"):
        p = d["provenance"][name]
        assert p["source"] and p["confidence"] in ("H", "M", "U"), name
    assert "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl" in d["provenance"]["kernels"]["source"]
    assert d["libraries"]["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"] == {"sass": ["8.0"], "ptx": ["8.0"], "containers": 1}
    assert "attention" in d["not_drafted"] and "quantizations" in d["not_drafted"]
    # the architectures its model registry serves, for catalog/architectures.yaml
    assert d["rules"]["architectures"] == ["GptOssForCausalLM", "LlamaForCausalLM", "Qwen3_5ForConditionalGeneration"]
    assert "registry.py" in d["provenance"]["architectures"]["source"]
    # each backend's KV dtypes and the capabilities of its fp8 KV cache, read from the backends
    assert d["rules"]["kv_dtypes"] == {"FLASH_ATTN": ["auto", "bfloat16", "fp8", "fp8_e4m3"],
                                       "TRITON_ATTN": ["auto", "fp8", "fp8_e5m2"]}
    assert d["rules"]["fp8_kv_cc"] == {"FLASH_ATTN": "9.0-9.9", "TRITON_ATTN": "8.9+"}
    assert d["rules"]["attention_floors"] == {"FLASH_ATTN": "8.0", "TRITON_ATTN": "any"}
    for name in ("kv_dtypes", "fp8_kv_cc"):
        assert "supports_kv_cache_dtype" in d["provenance"][name]["source"] and d["provenance"][name]["confidence"] == "H"
    # the draft is a valid catalog entry as it stands
    rel = compat.EngineRelease.model_validate({**e, "key": d["key"]})
    assert compat.kernel_coverage(rel, "7.0") is None and compat.kernel_coverage(rel, "8.6") == ("sass", "8.6")


def test_without_the_torch_wheel_the_arch_list_is_left_out_and_said_so(wheels):
    vllm, _, _ = wheels
    d = published.draft_release("vllm==0.33.0", TOOLKITS, wheel=vllm, with_torch=False)
    assert "archs" not in d["entry"]["torch"] and "torch.archs" in d["not_drafted"]
    assert d["entry"]["torch"]["confidence"] == "M" and d["entry"]["confidence"] == "M"


def test_a_wheel_without_cuda_kernels_is_refused(wheels):
    _, _, cpu = wheels
    with pytest.raises(UsageError, match="no CUDA kernels"):
        published.draft_release("vllm==0.33.0", TOOLKITS, wheel=cpu, with_torch=False)


def test_a_wheel_of_another_version_is_refused(wheels):
    vllm, torch, _ = wheels
    with pytest.raises(UsageError, match="version 0.33.0, not 0.32.0"):
        published.draft_release("vllm==0.32.0", TOOLKITS, wheel=vllm, with_torch=False)
    with pytest.raises(UsageError, match="not the torch 2.14.0 wheel"):
        published.draft_release("vllm==0.33.0", TOOLKITS, wheel=vllm, torch_wheel=vllm)


def test_an_arch_few_object_files_carry_is_partial_not_the_librarys():
    lib = rd.LibArchs(116, {"7.5": 60, "8.0": 71, "12.0": 83}, {"8.0": 19, "9.0": 8})
    assert lib.archs(rd.VLLM_SHARE) == (["7.5", "8.0", "12.0"], [])
    assert lib.partial(rd.VLLM_SHARE) == ["PTX 8.0 in 19 of 116", "PTX 9.0 in 8 of 116"]
    assert lib.archs() == (["7.5", "8.0", "12.0"], ["8.0", "9.0"])


def test_the_draft_file_keeps_earlier_drafts_and_never_is_the_packaged_catalog(wheels, tmp_path):
    vllm, torch, _ = wheels
    d = published.draft_release("vllm==0.33.0", TOOLKITS, wheel=vllm, torch_wheel=torch)
    out = tmp_path / "drafts.yaml"
    other = {**d, "key": "vllm:0.32.0", "entry": {**d["entry"], "version": "0.32.0"}}
    published.write_draft(out, other, compat.ENGINES_PATH)
    published.write_draft(out, d, compat.ENGINES_PATH)
    published.write_draft(out, d, compat.ENGINES_PATH)  # the same key again: replaced, not repeated
    doc = yaml.safe_load(out.read_text())
    assert list(doc["images"]) == ["vllm:0.32.0", "vllm:0.33.0"]
    assert doc["provenance"]["vllm:0.33.0"]["kernels"]["confidence"] == "H"
    with pytest.raises(UsageError, match="packaged catalog"):
        published.write_draft(compat.ENGINES_PATH, d, compat.ENGINES_PATH)


# --------------------------------------------------------------------------- the CLI's bad input


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([LLMFLEET, "catalog.release", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def _one_line_exit_2(res: subprocess.CompletedProcess, text: str) -> None:
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and text in lines[0], res.stderr
    assert res.stdout == ""


def _offline_pip(tmp_path: Path, index: str) -> dict[str, str]:
    cfg = tmp_path / "pip.conf"
    cfg.write_text("[global]\n")
    return {"PIP_CONFIG_FILE": str(cfg), "PIP_INDEX_URL": index, "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
            "PIP_RETRIES": "1", "PIP_TIMEOUT": "2"}


def test_cli_a_release_that_does_not_exist(tmp_path):
    index = tmp_path / "index"
    (index / "vllm").mkdir(parents=True)
    (index / "vllm" / "index.html").write_text("<html><body></body></html>")
    res = _run(["vllm==0.99.0", "--write", "d.yaml"], tmp_path, **_offline_pip(tmp_path, index.as_uri()))
    _one_line_exit_2(res, "no such release")
    assert not (tmp_path / "d.yaml").exists()


def test_cli_no_network(tmp_path):
    res = _run(["vllm==0.33.0", "--write", "d.yaml"], tmp_path, **_offline_pip(tmp_path, "http://127.0.0.1:9/simple/"))
    _one_line_exit_2(res, "cannot be reached")
    assert not (tmp_path / "d.yaml").exists()


def test_cli_a_wheel_without_cuda_libraries(wheels, tmp_path):
    _, _, cpu = wheels
    res = _run(["vllm==0.33.0", "--wheel", str(cpu), "--no-torch", "--write", "d.yaml"], tmp_path)
    _one_line_exit_2(res, "no CUDA kernels")
    assert not (tmp_path / "d.yaml").exists()


def test_cli_refuses_to_write_the_packaged_catalog(wheels, tmp_path):
    vllm, _, _ = wheels
    before = compat.ENGINES_PATH.read_bytes()
    res = _run(["vllm==0.33.0", "--wheel", str(vllm), "--no-torch", "--write", str(compat.ENGINES_PATH)], tmp_path)
    _one_line_exit_2(res, "packaged catalog")
    assert compat.ENGINES_PATH.read_bytes() == before


def test_cli_json_and_yaml_drafts_from_local_wheels(wheels, tmp_path):
    import json

    vllm, torch, _ = wheels
    res = _run(["vllm==0.33.0", "--wheel", str(vllm), "--torch-wheel", str(torch), "--json"], tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["entry"]["torch"]["archs"][-1] == "12.0+PTX"
    res = _run(["vllm==0.33.0", "--wheel", str(vllm), "--torch-wheel", str(torch)], tmp_path)
    assert res.returncode == 0 and yaml.safe_load(res.stdout)["images"]["vllm:0.33.0"]["torch"]["version"] == "2.14.0"


# --------------------------------------------------------------------------- llama.cpp tags

LLAMACPP = DATA / "llamacpp"  # stand-ins for the tag's Dockerfile and CMake files (see their headers)


@pytest.mark.parametrize(("cuda", "archs"), [
    ("11.8.0", ["50-virtual", "61-virtual", "70-virtual", "75-virtual", "80-virtual", "86-real", "89-real", "90-virtual"]),
    ("12.8.1", ["50-virtual", "61-virtual", "70-virtual", "75-virtual", "80-virtual", "86-real", "89-real", "90-virtual",
                "120a-real"]),
    ("13.0.2", ["75-virtual", "80-virtual", "86-real", "89-real", "90-virtual", "120a-real", "121a-real"]),
])
def test_cmake_default_architectures_follow_the_cuda_version(cuda, archs):
    text = (LLAMACPP / rd.CUDA_CMAKE).read_text()
    assert rd.cmake_default_archs(text, cuda) == archs
    assert rd.cmake_default_archs("project(x)\n", cuda) is None


def test_a_llamacpp_draft_equals_the_hand_written_server_cuda_entry():
    d = rd.draft_llamacpp("b7000", published.read_llamacpp_checkout(LLAMACPP), TOOLKITS)
    e, hand = d["entry"], compat.load_engine_catalog().images["llamacpp:server-cuda-12.8"]
    assert (e["cuda"], e["min_driver"]) == (hand.cuda, hand.min_driver)
    assert e["kernels"] == {"sass": hand.kernels.sass, "ptx": hand.kernels.ptx}
    assert e["rpc_server"]["ships"] is False and e["fa_all_quants"]["enabled"] is False
    assert "CUDA_DOCKER_ARCH=default" in d["provenance"]["kernels"]["source"]
    compat.EngineRelease.model_validate({**e, "key": d["key"]})


def test_a_cmake_list_in_one_string_is_split_into_its_architectures():
    """Builds of b5000's era set ``CMAKE_CUDA_ARCHITECTURES "50;61;70;75;80"``: one string, five items."""
    text = ('if (NOT DEFINED CMAKE_CUDA_ARCHITECTURES)\n    if (GGML_NATIVE)\n'
            '        set(CMAKE_CUDA_ARCHITECTURES "native")\n    else()\n'
            '        set(CMAKE_CUDA_ARCHITECTURES "50;61;70;75;80")\n    endif()\nendif()\n')
    assert rd.cmake_default_archs(text, "12.4.0") == ["50", "61", "70", "75", "80"]


FIX = Path(__file__).parent / "fixtures" / "llamacpp"


def test_a_llamacpp_draft_reads_the_build_s_flash_attention_table_architectures_and_tensor_types():
    """From a checkout with fattn.cu, ggml-cuda.cu, ggml.h and llama-arch.cpp (here the b5000 fixtures, the
    verbatim parts of those files at that tag), the draft writes the same K/V table as the catalog's
    llamacpp:b5000-cu122 entry, and the build's architectures and tensor types for architectures.yaml."""
    files = published.read_llamacpp_checkout(LLAMACPP)
    fattn = (FIX / "b5000" / "fattn.txt").read_text()
    files |= {rd.FATTN: fattn, rd.GGML_CUDA: fattn, rd.GGML_H: (FIX / "b5000" / "ggml_types.txt").read_text(),
              rd.LLAMA_ARCH: (FIX / "b5000" / "arch.txt").read_text()}
    d = rd.draft_llamacpp("b5000", files, TOOLKITS)
    kv, hand = d["entry"]["cuda_flash_attn_kv"], compat.load_engine_catalog().images["llamacpp:b5000-cu122"].cuda_flash_attn_kv
    assert hand is not None
    assert (kv["types"], kv["mixed"], kv["all_quants_types"]) == (sorted(hand.types), hand.mixed, sorted(hand.all_quants_types))
    assert (kv["quant_head_sizes"], kv["cpu_types"], kv["outside"]) == (hand.quant_head_sizes, hand.cpu_types, hand.outside)
    assert "MXFP4" not in d["rules"]["ggml_types"] and "Q4_K" in d["rules"]["ggml_types"]
    assert "qwen2" in d["rules"]["architectures"] and "qwen3moe" not in d["rules"]["architectures"]
    compat.EngineRelease.model_validate({**d["entry"], "key": d["key"]})
    # without those files the table is left for the hand, and says so
    bare = rd.draft_llamacpp("b7000", published.read_llamacpp_checkout(LLAMACPP), TOOLKITS)
    assert "cuda_flash_attn_kv" in bare["not_drafted"] and not bare["rules"]


def test_a_dockerfile_arch_list_wins_and_flags_it_sets_are_read(tmp_path):
    files = published.read_llamacpp_checkout(LLAMACPP)
    files[rd.CUDA_DOCKERFILE] = files[rd.CUDA_DOCKERFILE].replace(
        "ARG CUDA_DOCKER_ARCH=default", "ARG CUDA_DOCKER_ARCH=61-real;70-real;86").replace(
        "-DGGML_CUDA=ON", "-DGGML_CUDA=ON -DGGML_RPC=ON -DGGML_CUDA_FA_ALL_QUANTS=ON").replace(
        "COPY --from=build /app/full/llama-server /app", "COPY --from=build /app/full/llama-server /app/full/rpc-server /app")
    e = rd.draft_llamacpp("b7001", files, TOOLKITS)["entry"]
    assert e["kernels"] == {"sass": ["6.1", "7.0", "8.6"], "ptx": ["8.6"]}
    assert e["rpc_server"]["ships"] is True and e["fa_all_quants"]["enabled"] is True


def test_cli_llamacpp_needs_a_checkout(tmp_path):
    res = _run(["llamacpp@b7000", "--write", "d.yaml"], tmp_path)
    _one_line_exit_2(res, "--source DIR")
    res = _run(["llamacpp@b7000", "--source", str(tmp_path), "--write", "d.yaml"], tmp_path)
    _one_line_exit_2(res, "not in the checkout")
    assert not (tmp_path / "d.yaml").exists()
    res = _run(["llamacpp@b7000", "--source", str(LLAMACPP), "--write", "d.yaml"], tmp_path)
    assert res.returncode == 0 and "llamacpp:b7000" in yaml.safe_load((tmp_path / "d.yaml").read_text())["images"]


def test_downloads_say_what_they_fetch_and_how_large_it_was(wheels, tmp_path):
    """A download takes minutes for a CUDA wheel: each one is announced and then reported (size, time).
    The 'index' here is a stand-in pip that copies the recorded wheels into the download folder."""
    fake_pip = tmp_path / "pip.sh"
    src = wheels[0].parent
    fake_pip.write_text('#!/bin/sh\nd=""; while [ $# -gt 0 ]; do [ "$1" = -d ] && d=$2; last=$1; shift; done\n'
                        f'case "$last" in vllm==*) cp {src}/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl "$d"/;;\n'
                        f'  torch==*) cp {src}/torch-2.14.0-*.whl "$d"/;; esac\n')
    fake_pip.chmod(0o755)
    steps: list[tuple[str, bool]] = []
    d = published.draft_release("vllm==0.33.0", TOOLKITS, pip=[str(fake_pip)],
                                progress=lambda line, done: steps.append((line, done)))
    assert d["key"] == "vllm:0.33.0"
    lines = [ln for ln, _ in steps]
    assert [ln.split(":")[0] for ln in lines] == ["vllm==0.33.0"] * 2 + ["torch==2.14.0"] * 2
    assert [done for _, done in steps] == [False, True, False, True]
    assert "pip download" in lines[0] and " MB in " in lines[1] and "torch-2.14.0" in lines[3]


def test_the_downloaded_wheel_is_the_one_asked_for_not_another_release_s_in_the_folder(tmp_path):
    """A download folder that already holds other releases' wheels (a cache) gives back the wheel of the
    requirement, by its file name's distribution and version."""
    names = ["vllm-0.10.1-cp38-abi3-manylinux1_x86_64.whl", "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl",
             "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"]
    wheels = [tmp_path / n for n in names]
    assert published.wheel_of("vllm==0.26.0", wheels) == wheels[1]
    assert published.wheel_of("vllm==0.10.1", wheels) == wheels[0]
    assert published.wheel_of("torch==2.11.0", wheels) == wheels[2]
    assert published.wheel_of("vllm==0.34.0", wheels) is None
    assert published.wheel_of("vllm", wheels[:1]) == wheels[0]
