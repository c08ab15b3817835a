"""Compatibility rules, table-driven over the engine-release catalog (catalog/engines.yaml)."""

from __future__ import annotations

import pytest

from llmfleet.errors import UsageError
from llmfleet.knowledge import compat

CAT = compat.load_engine_catalog()

# name, compute capability, data-center part: as the GPU catalog and nvidia-smi give them
V100 = ("Tesla V100-SXM2-32GB", "7.0", True)
T4 = ("Tesla T4", "7.5", True)
P40 = ("Tesla P40", "6.1", True)
RTX4090 = ("NVIDIA GeForce RTX 4090", "8.9", False)
A100 = ("NVIDIA A100-SXM4-80GB", "8.0", True)
H200 = ("NVIDIA H200", "9.0", True)

# driver, highest CUDA (the nvidia-smi banner)
D470 = ("470.57.02", "11.4")
D535 = ("535.183.06", "12.2")
D550 = ("550.54.15", "12.4")
D570 = ("570.133.07", "12.8")
D575 = ("575.57.08", "12.9")
D580 = ("580.159.04", "13.0")
D470_T4 = ("470.256.02", "11.4")  # the lab's T4 host
CU118 = "llamacpp:vendored-0.3.36-cu118"

# Forward compatibility needs a toolkit that loads the image's compat libcuda: 1.17.5-1.17.6 only
# when the nvidia runtime runs the container (nvidia-container-toolkit PR #1055), 1.17.7+ with
# --gpus too (cuda-compat-mode=ldconfig, PR #1082), before 1.17.4 by mounting it (PR #906).
FWD_OK = {"toolkit_version": "1.17.5", "runtimes": ["nvidia", "runc"], "default_runtime": "nvidia"}
NO_FWD = {"toolkit_version": "1.17.5", "runtimes": ["runc"], "default_runtime": "runc"}
# Dates: R535 is an LTS branch until June 2026 (NVIDIA data-center drivers, "Supported Drivers and
# CUDA Toolkit Versions", 615 edition); after that NVIDIA no longer supports forward compat on it.
BEFORE_R535_EOL = "2026-01-15"
AFTER_R535_EOL = "2026-12-01"


def rel(key: str) -> compat.EngineRelease:
    r = CAT.release(key)
    assert r is not None, key
    return r


def cuda_verdict(image, gpu, drv, host=NO_FWD, env=None, today=BEFORE_R535_EOL):
    name, cc, dc = gpu
    host = dict(host)
    env = host.pop("env", env)
    return compat.check_cuda_driver(rel(image), CAT, driver=drv[0], cuda_driver=drv[1], gpu_name=name, cc=cc,
                                    data_center=dc, env=env, today=today, **host)


# The same hosts with the toolkit's NVIDIA_REQUIRE_CUDA check lifted (NVIDIA_DISABLE_REQUIRE=1 in the
# service's env): the rules behind it decide.
LIFTED = {"env": {"NVIDIA_DISABLE_REQUIRE": "1"}}
NO_FWD_LIFTED = {**NO_FWD, **LIFTED}
FWD_OK_LIFTED = {**FWD_OK, **LIFTED}


@pytest.mark.parametrize(
    ("image", "gpu", "drv", "host", "status", "said", "fix"),
    [
        # native
        ("vllm:0.19.1", V100, D575, NO_FWD, "pass", "native", ""),
        ("vllm:0.20.0", H200, D580, NO_FWD, "pass", "native", ""),
        ("llamacpp:b5000-cu122", P40, D535, NO_FWD, "pass", "native", ""),
        # right branch, older point release than the toolkit lists
        ("vllm:0.10.1.1", A100, ("570.26", "12.8"), NO_FWD, "warn", "lists driver >= 570.124.06", "within its branch"),
        # CUDA 12.8 image on a 535 driver: minor-version compatibility only; PTX-only cards cannot JIT
        ("llamacpp:server-cuda-12.8", V100, D535, NO_FWD, "fail", "does not cover PTX JIT",
         "upgrade the driver to >= 570.124.06"),
        # vLLM with SASS for the card: Triton compiles with its bundled ptxas (triton#5385), so the
        # minor-version rule is a WARN, not the FAIL it used to be
        ("vllm:0.10.1.1", A100, D535, NO_FWD, "warn", "Triton's own ptxas", "upgrade the driver to >= 570.124.06"),
        ("llamacpp:server-cuda-12.8", RTX4090, D550, NO_FWD_LIFTED, "warn", "minor-version compatibility",
         ">= 570.124.06"),
        # ... but the 12.8 base's NVIDIA_REQUIRE_CUDA lists no GeForce exception: the toolkit refuses it
        ("llamacpp:server-cuda-12.8", RTX4090, D550, NO_FWD, "fail", "the NVIDIA container toolkit refuses",
         "NVIDIA_DISABLE_REQUIRE=1"),
        # ... unless forward compatibility applies: data-center card, listed branch, compat package, toolkit
        ("llamacpp:server-cuda-12.8", V100, D535, FWD_OK, "warn", "forward compatibility", ">= 570.124.06"),
        ("vllm:0.10.1.1", A100, D535, FWD_OK, "warn", "branch R535 LTSB until 2026-06", ">= 570.124.06"),
        # toolkit 1.17.4 loads no compat library from the container (PR #877)
        ("llamacpp:server-cuda-12.8", V100, D535, {"toolkit_version": "1.17.4", "runtimes": ["nvidia"],
                                                   "default_runtime": "nvidia"}, "fail",
         "does not load a container's compat libraries", "upgrade the driver"),
        # before 1.17.4 libnvidia-container mounted the compat libs itself (PR #906): works with --gpus
        ("llamacpp:server-cuda-12.8", V100, D535, {"toolkit_version": "1.14.3", "runtimes": ["runc"],
                                                   "default_runtime": "runc"}, "warn", "toolkit 1.14.3: mount", ""),
        # 1.17.5: only when the nvidia runtime runs the container (PR #1055)
        ("llamacpp:server-cuda-12.8", V100, D535, {"toolkit_version": "1.17.5", "runtimes": ["nvidia", "runc"],
                                                   "default_runtime": "runc"}, "fail",
         "registered but not Docker's default runtime", "upgrade the driver"),
        # 1.17.7+: cuda-compat-mode=ldconfig, --gpus works again (PR #1082)
        ("llamacpp:server-cuda-12.8", V100, D535, {"toolkit_version": "1.17.8", "runtimes": ["runc"],
                                                   "default_runtime": "runc"}, "warn", "toolkit 1.17.8: ldconfig", ""),
        # forward compatibility never for GeForce cards: error 804
        ("vllm:0.10.1.1", RTX4090, D550, FWD_OK_LIFTED, "warn", "minor-version", "upgrade the driver"),
        ("vllm:0.20.0", RTX4090, D575, FWD_OK_LIFTED, "fail", "cudaErrorCompatNotSupportedOnDevice (804)",
         "upgrade the driver"),
        # T4 on R470: another CUDA major, so only forward compatibility can help
        ("vllm:0.10.1.1", T4, D470, NO_FWD, "fail", "it is not registered in Docker", "CUDA <= 11.4"),
        ("llamacpp:b5000-cu122", P40, ("470.82.00", "11.4"), NO_FWD, "fail", "supports CUDA 11.4", ">= 535.104.05"),
        # new-feature branches are not supported for forward compatibility (only LTSB and PB are listed)
        ("vllm:0.10.1.1", T4, ("545.23.08", "12.3"), FWD_OK_LIFTED, "warn", "minor-version", ">= 570.124.06"),
        ("vllm:0.20.0", T4, ("545.23.08", "12.3"), FWD_OK_LIFTED, "fail",
         "R545 is not a long-term-support or production", ">= 580.95.05"),
        # ... and the bases' NVIDIA_REQUIRE_CUDA lists no R545 exception for any brand
        ("vllm:0.10.1.1", T4, ("545.23.08", "12.3"), FWD_OK, "fail", "brand tesla) on R545", ">= 570.124.06"),
        ("vllm:0.20.0", T4, D535, FWD_OK, "warn", "forward compatibility", ">= 580.95.05"),
        # CUDA 13 image on a 12.x driver: no minor-version compatibility across majors
        ("vllm:0.20.0", RTX4090, D575, NO_FWD_LIFTED, "fail", "built for CUDA 13.0.2", ">= 580.95.05"),
        ("vllm:lab-cpu", V100, D470, NO_FWD, "pass", "CPU image", ""),
        # CUDA 11.8 llama.cpp on old drivers: 11.x minor-version compatibility from 450.80.02, SASS for
        # every card up to sm_86 (no PTX JIT), no NVIDIA_REQUIRE_CUDA in the image to refuse the driver
        (CU118, T4, ("470.256.02", "11.4"), NO_FWD, "warn", "CUDA 11.x from driver 450.80.02", ">= 520.61.05"),
        (CU118, T4, ("470.256.02", "11.4"), NO_FWD, "warn", "SASS for sm_75, no PTX JIT needed", ""),
        (CU118, T4, ("470.256.02", "11.4"), NO_FWD, "warn", "sets no NVIDIA_REQUIRE_CUDA", ""),
        (CU118, P40, ("515.105.01", "11.7"), NO_FWD, "warn", "SASS for sm_61", ">= 520.61.05"),
        (CU118, V100, ("450.80.02", "11.0"), NO_FWD, "warn", "minor-version compatibility", ""),
        (CU118, P40, ("520.61.05", "11.8"), NO_FWD, "pass", "native", ""),
        (CU118, H200, D535, NO_FWD, "pass", "native", ""),
        # below the 11.x floor (R418 speaks CUDA 10.1): nothing of CUDA 11 runs
        (CU118, V100, ("418.226.00", "10.1"), NO_FWD, "fail", "needs the same major and driver >= 450.80.02", ""),
        # ... and why the CUDA 12 images do not run on R470: another major, no minor-version path
        ("llamacpp:b5000-cu122", T4, ("470.256.02", "11.4"), NO_FWD, "fail", "minor-version compatibility needs the "
         "same major and driver >= 525.60.13", ">= 535.104.05"),
        ("llamacpp:server-cuda-12.8", T4, ("470.256.02", "11.4"), NO_FWD, "fail", "built for CUDA 12.8.1", ">= 570.124.06"),
    ],
)
def test_cuda_vs_driver(image, gpu, drv, host, status, said, fix):
    v = cuda_verdict(image, gpu, drv, host)
    assert v.status == status, v
    assert said in v.message, v.message
    assert fix in v.fix, v.fix


@pytest.mark.parametrize(
    ("image", "gpu", "drv", "wanted", "unwanted"),
    [
        # R470 + T4: the CUDA 11.8 llama.cpp image runs today; vLLM needs R525 (CUDA 12 minor-version
        # compatibility) or its native driver; vLLM's CUDA 11.8 builds were wheels, never an image
        ("vllm:0.10.1.1", T4, D470_T4, [f"runs on this driver today: {CU118} (CUDA 11.8.89, through minor-version",
                                        "upgrade: driver >= 525.60.13 runs vllm:",
                                        "published CUDA 11.8 wheels on GitHub releases only (not PyPI, no image)"],
         ["llamacpp:b5000-cu122 (", "server-cuda-12.8 ("]),
        ("llamacpp:b5000-cu122", T4, D470_T4, [f"runs on this driver today: {CU118}",
                                               "upgrade: driver >= 525.60.13 runs llamacpp:b5000-cu122 through CUDA 12.x"],
         ["wheels"]),
        # R515 + V100: the same answer; CUDA 12 needs R525
        ("vllm:0.19.1", V100, ("515.105.01", "11.7"), [f"{CU118} (CUDA 11.8.89, through minor-version",
                                                       "driver >= 525.60.13 runs vllm:0.19.1"], []),
        # R418 + V100: below the 11.x floor, nothing runs; the upgrade is the only answer
        ("vllm:0.19.1", V100, ("418.226.00", "10.1"), ["upgrade: driver >= 525.60.13 runs vllm:0.19.1",
                                                        "or driver >= 450.80.02 runs " + CU118],
         ["runs on this driver today"]),
    ],
)
def test_old_driver_alternatives(image, gpu, drv, wanted, unwanted):
    name, cc, dc = gpu
    host = dict(driver=drv[0], cuda_driver=drv[1], gpu_name=name, cc=cc, data_center=dc, today=BEFORE_R535_EOL,
                **NO_FWD)
    assert compat.check_cuda_driver(rel(image), CAT, **host).status == "fail"
    text = " | ".join(compat.driver_alternatives(rel(image), CAT, **host))
    for w in wanted:
        assert w in text, text
    for u in unwanted:
        assert u not in text, text


def test_vllm_cuda11_wheels_are_sourced_and_never_an_image():
    w = CAT.vllm_cuda11_wheels
    assert w is not None and w.pypi is False and w.image is False
    assert "local version" in w.pypi_source and "CUDA_VERSION=12.1.0" in w.image_source
    assert [r.versions for r in w.releases][:2] == ["0.2.4-0.3.3", "0.4.0-0.6.6.post1"]
    assert all(r.sources and r.confidence in "HMU" for r in w.releases)


def test_forward_compat_ends_with_the_branch():
    """R535 LTSB reached its end of life in June 2026 (NVIDIA data-center drivers, 615 edition):
    the same host that ran a CUDA 13 image through forward compatibility before is refused after."""
    before = cuda_verdict("vllm:0.20.0", T4, D535, FWD_OK, today=BEFORE_R535_EOL)
    after = cuda_verdict("vllm:0.20.0", T4, D535, FWD_OK, today=AFTER_R535_EOL)
    assert before.status == "warn" and "forward compatibility" in before.message
    assert after.status == "fail" and "reached its end of life in 2026-06" in after.message


def test_forward_compat_branch_table_is_sourced():
    fc = CAT.forward_compat
    assert fc.branches[535].designation == "LTSB" and fc.branches[535].eol == "2026-06"
    assert fc.branches[580].eol == "2028-06" and fc.branches[595].designation == "PB"
    assert all(b.source and b.confidence in "HMU" for b in fc.branches.values())
    for rule in ("minor_version_ptx_jit", "minor_version_triton", "forward_compat_gpu", "forward_compat_branch"):
        assert CAT.compat_rules[rule].sources and CAT.compat_rules[rule].confidence in "HMU"


def test_cuda_unknown_card_gets_no_forward_compat():
    v = compat.check_cuda_driver(rel("vllm:0.20.0"), CAT, driver="535.183.06", cuda_driver="12.2",
                                 gpu_name="Mystery GPU", cc="7.5", data_center=None, today=BEFORE_R535_EOL, **FWD_OK)
    assert v.status == "fail" and "not in the GPU catalog" in v.message


@pytest.mark.parametrize(
    ("driver", "cuda", "status", "said"),
    [
        (None, None, "fail", "no NVIDIA driver version seen"),
        ("not-a-driver", None, "fail", "does not parse"),
        ("575.57.08", None, "pass", "CUDA 12.9"),  # no banner: the branch table
    ],
)
def test_cuda_driver_odd_inputs(driver, cuda, status, said):
    v = compat.check_cuda_driver(rel("vllm:0.19.1"), CAT, driver=driver, cuda_driver=cuda, gpu_name="x", cc="7.0",
                                 data_center=True, **NO_FWD)
    assert v.status == status and said in v.message, v


@pytest.mark.parametrize(
    ("image", "gpu", "status", "said", "fix"),
    [
        ("vllm:0.19.1", V100, "pass", "SASS for sm_70", ""),
        ("vllm:0.20.0", V100, "fail", "no kernels for Tesla V100-SXM2-32GB (compute capability 7.0, sm_70)",
         "vllm:0.19.1"),
        # the image's PyTorch build must cover the card too: torch 2.7 cu128 has no sm_70 (pytorch
        # .ci/manywheel/build_cuda.sh; bitsandbytes PR #1715 "add back Volta ... following PyTorch 2.8";
        # vllm#19185 "The minimum cuda capability supported by this library is 7.5" on a V100)
        ("vllm:0.9.2", V100, "fail", "PyTorch build inside it (torch 2.7.0+cu128", "vllm:0.19.1"),
        ("vllm:0.10.1.1", V100, "fail", "has no kernels for Tesla V100-SXM2-32GB (sm_70)", "vllm:0.19.1-volta"),
        ("vllm:0.9.2", T4, "pass", "torch 2.7.0+cu128 has SASS for sm_75", ""),
        # torch 2.10 cu129 keeps sm_70 (build_cuda.sh 12.9 list; sm_70 left cu128 only in 2.11, pytorch#172352)
        ("vllm:0.19.1", V100, "pass", "torch 2.10.0+cu129 has SASS for sm_70", ""),
        ("vllm:0.19.1-volta", V100, "pass", "torch 2.10.0+cu126 has SASS for sm_70", ""),
        # 8.9 runs torch's sm_86 SASS (same major, lower minor) and vLLM's own sm_89
        ("vllm:0.10.1.1", RTX4090, "pass", "SASS for sm_89", ""),
        ("vllm:0.19.1", P40, "fail", "no kernels", "serve this card with llama.cpp"),
        ("llamacpp:server-cuda-12.8", V100, "pass", "only PTX (sm_70)", ""),
        ("llamacpp:server-cuda-12.8", P40, "pass", "only PTX (sm_61)", ""),
        ("llamacpp:server-cuda-12.8", RTX4090, "pass", "SASS for sm_89", ""),
        ("llamacpp:server-cuda-12.8", H200, "pass", "only PTX (sm_90)", ""),
        ("llamacpp:b5000-cu122", P40, "pass", "SASS for sm_61", ""),
        ("llamacpp:b5000-cu122", H200, "pass", "only PTX (sm_89)", ""),
        ("vllm:0.20.0", T4, "pass", "SASS for sm_75", ""),
        ("vllm:0.19.1", A100, "pass", "SASS for sm_80", ""),
        ("vllm:0.19.1", ("NVIDIA GeForce RTX 3090", "8.6", False), "pass", "SASS for sm_80", ""),
    ],
)
def test_architecture(image, gpu, status, said, fix):
    v = compat.check_architecture(rel(image), gpu[0], gpu[1])
    assert v.status == status, v
    assert said in v.message, v.message
    assert fix in v.fix, v.fix


def test_architecture_unknown_cc_is_a_failure_with_the_fix():
    v = compat.check_architecture(rel("vllm:0.19.1"), "Mystery GPU", None)
    assert v.status == "fail" and "unknown" in v.message and "catalog/gpus.yaml" in v.fix


def test_sass_with_a_suffix_runs_only_on_that_cc():
    r = rel("llamacpp:server-cuda-12.8")
    assert compat.kernel_coverage(r, "12.0") == ("sass", "12.0a")
    assert compat.kernel_coverage(r, "12.1") == ("ptx", "9.0")


@pytest.mark.parametrize(
    ("image", "quant", "args", "gpu", "status", "said", "fix"),
    [
        ("vllm:0.19.1", "awq-int4", [], V100, "fail", "does not run on compute capability 7.0", "on Volta use GPTQ"),
        ("vllm:0.10.1.1", "awq-int4", [], V100, "fail", "awq_marlin needs 8.0, awq needs 7.5", "GPTQ"),
        ("vllm:0.19.1", "gptq-int4", ["--quantization", "gptq"], V100, "pass", "gptq runs", ""),
        ("vllm:0.19.1", "gptq-int4", [], V100, "pass", "the engine uses gptq on 7.0", ""),
        ("vllm:0.19.1", "gptq-int4", ["--quantization", "gptq_marlin"], V100, "fail", "needs 7.5", "GPTQ"),
        ("vllm:0.19.1", "awq-int4", [], T4, "pass", "awq_marlin runs", ""),
        ("vllm:0.10.1.1", "awq-int4", [], T4, "pass", "the engine uses awq on 7.5", ""),
        ("vllm:0.19.1", "fp8", [], T4, "warn", "W8A16", "8.9"),
        ("vllm:0.10.1.1", "fp8", [], T4, "fail", "fp8_w8a8 needs 8.9, fp8_marlin needs 8.0", "FP8 W8A8 needs"),
        ("vllm:0.19.1", "fp8", [], RTX4090, "pass", "fp8_w8a8 runs on compute capability 8.9", ""),
        ("vllm:0.19.1", "fp8", [], A100, "warn", "weight-only FP8", ""),
        # --quantization fp8 takes the same path: Fp8LinearMethod uses Marlin below 8.9 (vllm fp8.py use_marlin)
        ("vllm:0.19.1", "fp8", ["--quantization", "fp8"], A100, "warn", "weight-only FP8", ""),
        ("vllm:0.10.1.1", None, ["--quantization", "fp8"], ("NVIDIA A10", "8.6", True), "warn", "W8A16", ""),
        ("vllm:0.19.1", "fp8", ["--quantization", "fp8"], V100, "fail", "fp8_marlin needs 7.5", "GPTQ"),
        # MXFP4 (gpt-oss): Mxfp4Config min capability 80; Hopper native, Ampere through Marlin MXFP4
        ("vllm:0.19.1", "mxfp4", [], H200, "pass", "mxfp4 runs on compute capability 9.0", ""),
        ("vllm:0.20.0", "mxfp4", [], ("NVIDIA H100 80GB HBM3", "9.0", True), "pass", "mxfp4 runs", ""),
        ("vllm:0.19.1", "mxfp4", [], A100, "pass", "mxfp4 runs on compute capability 8.0", ""),
        ("vllm:0.10.1.1", "mxfp4", [], A100, "pass", "mxfp4 runs", ""),
        ("vllm:0.19.1", "mxfp4", ["--quantization", "mxfp4"], H200, "pass", "mxfp4 runs", ""),
        ("vllm:0.19.1", "mxfp4", [], T4, "fail", "mxfp4 needs 8.0", ""),
        ("vllm:0.9.2", "mxfp4", [], H200, "fail", "mxfp4 is not in this release", ""),
        ("vllm:0.19.1", "int8", ["--quantization", "compressed-tensors"], T4, "pass", "int8_w8a8", ""),
        ("vllm:0.19.1", "int8", [], V100, "fail", "int8_w8a8 needs 7.5", "GPTQ"),
        ("vllm:0.19.1", "bogus-q", [], A100, "fail", "does not know quantization 'bogus-q'", "use one of"),
        ("vllm:0.19.1", None, ["--quantization", "awq-but-wrong"], A100, "fail", "'--quantization awq-but-wrong'",
         "awq_marlin"),
        ("llamacpp:b5000-cu122", "q4_k_m", [], P40, "pass", "runs it on any CUDA card", ""),
        ("llamacpp:b5000-cu122", "awq-int4", [], P40, "fail", "llama.cpp serves GGUF files only", "q4_k_m"),
        ("vllm:0.19.1", "gptq-int4", [], (None, None, None), "warn", "compute capability unknown", "gpus.yaml"),
    ],
)
def test_quantization(image, quant, args, gpu, status, said, fix):
    r = rel(image)
    v = compat.check_quantization(r, CAT.engines[r.engine], quant, args, gpu[1])
    assert v.status == status, v
    assert said in v.message, v.message
    assert fix in v.fix, v.fix


@pytest.mark.parametrize(
    ("image", "quant", "args", "gpu", "status", "said", "fix"),
    [
        # V100 + a bf16 checkpoint: refused without --dtype float16, which is the fix
        ("vllm:0.19.1", "bf16", [], V100, "fail", "quant bf16 needs bf16", "--dtype float16"),
        ("vllm:0.19.1", "bf16", ["--dtype", "float16"], V100, "pass", "cast to float16", ""),
        ("vllm:0.19.1", "bf16", ["--dtype=half"], T4, "pass", "cast to float16", ""),
        ("vllm:0.19.1", "fp16", ["--dtype", "bfloat16"], T4, "fail", "--dtype bfloat16 needs bf16", "--dtype float16"),
        ("vllm:0.19.1", "fp16", [], V100, "warn", "--dtype auto on compute capability 7.0", "--dtype float16"),
        ("vllm:0.19.1", "gptq-int4", ["--dtype", "float16"], V100, "pass", "no bf16 needed", ""),
        ("vllm:0.19.1", "bf16", [], A100, "pass", "supports bf16", ""),
        ("llamacpp:b5000-cu122", "bf16", [], P40, "fail", "needs bf16", "f16 or quantized GGUF"),
        ("llamacpp:b5000-cu122", "q4_k_m", [], P40, "pass", "no bf16 needed", ""),
    ],
)
def test_dtype(image, quant, args, gpu, status, said, fix):
    r = rel(image)
    v = compat.check_dtype(r, CAT.engines[r.engine], quant, args, gpu[1])
    assert v.status == status, v
    assert said in v.message, v.message
    assert fix in v.fix, v.fix


@pytest.mark.parametrize(
    ("image", "args", "env", "gpu", "status", "said", "fix"),
    [
        ("vllm:0.19.1", [], {}, V100, "pass", "picks TRITON_ATTN", ""),
        ("vllm:0.19.1", [], {}, A100, "pass", "picks FLASH_ATTN", ""),
        ("vllm:0.19.1", ["--attention-backend", "FLASH_ATTN"], {}, V100, "fail", "needs compute capability 8.0",
         "TRITON_ATTN"),
        ("vllm:0.19.1", ["--attention-backend", "XFORMERS"], {}, V100, "fail", "not in vllm:0.19.1", "TRITON_ATTN"),
        ("vllm:0.10.1.1", [], {}, V100, "pass", "picks XFORMERS on compute capability 7.0 (the V0 engine", ""),
        ("vllm:0.10.1.1", ["--attention-backend", "XFORMERS"], {}, V100, "fail", "no --attention-backend flag",
         "VLLM_ATTENTION_BACKEND"),
        ("vllm:0.10.1.1", [], {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}, T4, "pass", "FLASHINFER runs", ""),
        ("vllm:0.20.0", [], {}, T4, "pass", "picks TRITON_ATTN", ""),
        # FlashInferBackend.supports_compute_capability: 7.5-12.1 (vllm v1/attention/backends/flashinfer.py)
        ("vllm:0.19.1", ["--attention-backend", "FLASHINFER"], {}, V100, "fail", "needs compute capability 7.5",
         "TRITON_ATTN"),
        ("vllm:0.19.1", ["--attention-backend", "FLASHINFER"], {}, T4, "pass", "FLASHINFER runs", ""),
        ("llamacpp:b5000-cu122", ["-fa", "on"], {}, P40, "fail", "takes a bare -fa switch", "bare -fa"),
        ("llamacpp:b5000-cu122", ["-fa"], {}, P40, "pass", "flash attention (bare)", ""),
        ("llamacpp:server-cuda-12.8", ["-fa"], {}, P40, "fail", "takes -fa on|off|auto", "-fa on"),
        ("llamacpp:server-cuda-12.8", ["--flash-attn", "on"], {}, V100, "pass", "tile/vec", ""),
    ],
)
def test_attention(image, args, env, gpu, status, said, fix):
    v = compat.check_attention(rel(image), args, env, gpu[1])
    assert v.status == status, v
    assert said in v.message, v.message
    assert fix in v.fix, v.fix


@pytest.mark.parametrize(
    ("image", "kv", "args", "env", "gpu", "status", "said", "fix"),
    [
        # FA2 (Ampere) takes no fp8 KV (vllm#12543); FA3 on Hopper does (vllm PR #15191)
        ("vllm:0.19.1", "fp8", [], {}, A100, "fail", "FLASH_ATTN does not run on compute capability 8.0",
         "FLASHINFER"),
        ("vllm:0.19.1", "fp8", [], {}, H200, "pass", "fp8 with attention backend FLASH_ATTN on compute capability 9.0",
         ""),
        ("vllm:0.9.2", "fp8", [], {}, H200, "pass", "FLASH_ATTN on compute capability 9.0", ""),
        # Triton has no fp8e4nv below 8.9: vllm#26431 (RTX 3090), #7714 (Ampere), PR #43914
        ("vllm:0.19.1", "fp8", ["--attention-backend", "TRITON_ATTN"], {}, A100, "fail", "fp8e4nv",
         "--kv-cache-dtype auto"),
        ("vllm:0.19.1", "auto", ["--kv-cache-dtype", "fp8"], {}, V100, "fail",
         "TRITON_ATTN does not run on compute capability 7.0", "--kv-cache-dtype auto"),
        ("vllm:0.20.0", "fp8", [], {}, T4, "fail", "type fp8e4nv not supported", "auto"),
        ("vllm:0.19.1", "fp8", ["--attention-backend", "TRITON_ATTN"], {}, RTX4090, "pass", "TRITON_ATTN", ""),
        # claims no source confirms are a WARN, never a silent PASS
        ("vllm:0.10.1.1", "fp8", [], {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}, A100, "warn", "no source confirms",
         "auto"),
        ("vllm:0.19.1", "q8_0", [], {}, V100, "fail", "'q8_0' is not one vllm knows", "fp8"),
        ("llamacpp:server-cuda-12.8", "auto", ["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "off"], {}, P40, "fail",
         "needs flash attention", "-fa on"),
        ("llamacpp:server-cuda-12.8", "auto", ["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"], {}, P40, "pass",
         "q8_0/q8_0", ""),
        ("llamacpp:server-cuda-12.8", "fp8", [], {}, P40, "fail", "'fp8' is not one llamacpp knows", "q8_0"),
        # a quantized V cache needs flash attention; b5000 has it off by default (a bare -fa switch turns
        # it on), so an absent -fa counts as off there (llama-server --help of that era, s3.3)
        ("llamacpp:b5000-cu122", "q8_0", [], {}, P40, "fail", "off by default in llamacpp:b5000-cu122", "add -fa"),
        ("llamacpp:b5000-cu122", "q8_0", ["-fa"], {}, P40, "pass", "q8_0/q8_0", ""),
        ("llamacpp:b5000-cu122", "auto", ["-ctk", "q8_0"], {}, P40, "fail", "needs flash attention", "-ctv f16"),
        ("llamacpp:server-cuda-12.8", "q8_0", [], {}, P40, "pass", "flash attention auto", ""),
        ("llamacpp:b5000-cu122", "auto", ["-ctk", "q8_0", "-ctv", "f16"], {}, P40, "pass", "q8_0/f16", ""),
        # ggml-cuda flash attention without GGML_CUDA_FA_ALL_QUANTS, read per build (engines.yaml
        # cuda_flash_attn_kv; tests/fixtures/llamacpp/<build>/fattn.txt): at b10573 K and V of one type among
        # f32/f16/bf16/q4_0/q8_0 (fattn.cu ggml_cuda_get_best_fattn_kernel: K->type != V->type is NONE)
        ("llamacpp:server-cuda-12.8", "q4_1", ["-fa", "on"], {}, P40, "fail",
         "no CUDA flash-attention kernel for K q4_1 / V q4_1", "q8_0"),
        ("llamacpp:server-cuda-12.8", "q5_0", [], {}, A100, "fail", "built without GGML_CUDA_FA_ALL_QUANTS",
         "GGML_CUDA_FA_ALL_QUANTS=ON"),
        # the llama-cpp-python 0.3.36 tree converts a pair without a compiled vector kernel to f16: it runs
        ("llamacpp:vendored-0.3.36-cu118", "q5_1", [], {}, T4, "pass", "q5_1/q5_1", ""),
        ("llamacpp:vendored-0.3.36-cu118", "iq4_nl", ["-fa", "on"], {}, T4, "fail", "iq4_nl K/V cache", "q4_0"),
        ("llamacpp:b5000-cu122", "q4_1", ["-fa"], {}, P40, "fail", "K q4_1 / V q4_1", "q8_0"),
        ("llamacpp:server-cuda-12.8", "auto", ["-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on"], {}, P40, "fail",
         "K q8_0 / V q4_0", ""),
        ("llamacpp:server-cuda-12.8", "auto", ["-ctk", "q4_0", "-ctv", "q8_0", "-fa", "on"], {}, P40, "fail",
         "K q4_0 / V q8_0", ""),
        ("llamacpp:server-cuda-12.8", "q4_0", ["-fa", "on"], {}, P40, "pass", "q4_0/q4_0", ""),
        ("llamacpp:server-cuda-12.8", "bf16", ["-fa", "on"], {}, A100, "pass", "bf16/bf16", ""),
        # K only quantized: -fa auto turns flash attention off, which an f16 V does not need; -fa on does not
        ("llamacpp:server-cuda-12.8", "auto", ["-ctk", "q4_1", "-ctv", "f16"], {}, P40, "pass", "q4_1/f16", ""),
        ("llamacpp:server-cuda-12.8", "auto", ["-ctk", "q4_1", "-ctv", "f16", "-fa", "on"], {}, P40, "fail",
         "runs on the CPU", ""),
        ("llamacpp:server-cuda-12.8", "auto", ["-ctk", "q4_1", "-ctv", "f16", "-fa", "off"], {}, P40, "pass", "", ""),
        ("llamacpp:lab-cpu", "q4_1", ["-fa", "on"], {}, P40, "pass", "q4_1/q4_1", ""),
    ],
)
def test_kv_dtype(image, kv, args, env, gpu, status, said, fix):
    r = rel(image)
    v = compat.check_kv_dtype(r, CAT.engines[r.engine], kv, args, env, gpu[1])
    assert v.status == status, v
    assert said in v.message, v.message
    assert fix in v.fix, v.fix


def test_no_fix_text_recommends_flashinfer_on_a_v100():
    for key, r in CAT.images.items():
        if r.cpu or r.engine != "vllm":
            continue
        rules = CAT.engines["vllm"]
        for args in ([], ["--attention-backend", "FLASH_ATTN"], ["--attention-backend", "XFORMERS"]):
            v = compat.check_attention(r, args, {}, "7.0")
            assert "FLASHINFER" not in v.fix, (key, v)
        for kv in ("fp8", "fp8_e4m3", "fp8_e5m2"):
            v = compat.check_kv_dtype(r, rules, kv, [], {}, "7.0")
            assert "FLASHINFER" not in v.fix, (key, v)


# ------------------------------------------------------------------------------------------------
# The catalog itself


def test_every_gpu_image_has_cuda_driver_and_kernels_with_sources():
    for key, r in CAT.images.items():
        assert r.sources, key
        if not r.cpu and r.engine in ("vllm", "llamacpp"):  # exporters carry no CUDA kernels (catalog/exporters.yaml)
            img = compat.cuda_major_minor(r.cuda)
            assert img is not None, key
            rows = CAT.cuda_toolkits.get(f"{img[0]}.{img[1]}")
            assert rows and r.min_driver in rows, f"{key}: min_driver {r.min_driver} is not a row of CUDA {r.cuda}"


def test_driver_branch_table_matches_the_toolkit_table():
    for cuda, rows in CAT.cuda_toolkits.items():
        branch = int(rows[0].split(".")[0])
        assert compat.branch_cuda(rows[0], CAT.driver_branches) == cuda, (cuda, branch)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[", "not valid YAML"),
        ("- a", "expected a mapping"),
        ("cuda_toolkits: {}\ndriver_branches: {}\nminor_compat_floor: {}\nforward_compat: {branches: {}, toolkit: []}\nengines: {}\n"
         "images:\n  'vllm:x': {engine: llamacpp, version: x, repository: r, tag: t, cpu: true, confidence: H, "
         "sources: [s]}", "does not match the key"),
        ("cuda_toolkits: {}\ndriver_branches: {}\nminor_compat_floor: {}\nforward_compat: {branches: {}, toolkit: []}\nengines: {}\n"
         "images:\n  'vllm:x': {engine: vllm, version: x, repository: r, tag: t, confidence: H, sources: [s]}",
         "needs cuda, min_driver and kernels"),
    ],
)
def test_bad_catalog_is_a_one_line_usage_error(text, error):
    with pytest.raises(UsageError, match=error):
        compat.parse_engine_catalog(text, "engines.yaml")


@pytest.mark.parametrize(
    ("gpu", "driver", "modules", "fails", "said"),
    [
        # R580 is the last branch for Maxwell, Pascal and Volta (NVIDIA Unix graphics feature deprecation schedule)
        (V100, "595.45.04", "proprietary", True, "R580 is the last branch for Maxwell, Pascal and Volta"),
        (P40, "590.48.01", None, True, "does not drive Tesla P40"),
        (V100, "580.95.05", "proprietary", False, ""),
        (T4, "595.45.04", "open", False, ""),
        # the open kernel modules never drove pre-Turing cards
        (V100, "580.95.05", "open", True, "open kernel modules"),
    ],
)
def test_a_driver_that_does_not_drive_the_card_fails(gpu, driver, modules, fails, said):
    name, cc, dc = gpu
    v = compat.check_cuda_driver(rel("llamacpp:b5000-cu122"), CAT, driver=driver, cuda_driver=None, gpu_name=name,
                                 cc=cc, data_center=dc, today=BEFORE_R535_EOL, kernel_modules=modules, **NO_FWD)
    assert (v.status == "fail" and said in v.message) is fails, v


def test_every_llamacpp_gpu_image_records_its_fa_all_quants_flag_with_a_source():
    for key, r in CAT.images.items():
        if r.engine == "llamacpp" and not r.cpu:
            assert r.fa_all_quants is not None and r.fa_all_quants.source, key
    assert CAT.release("llamacpp:vendored-0.3.36-cu118").fa_all_quants.enabled is False
    # the catalog and the build files this repository builds the images from agree
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "dockerfiles"
    assert "-DGGML_CUDA_FA_ALL_QUANTS=OFF" in (root / "llamacpp-cu118" / "build-llama-server.sh").read_text()
    assert "FA_ALL_QUANTS=ON" not in (root / "llamacpp-cuda" / "Dockerfile").read_text()
    assert CAT.release("llamacpp:b5000-cu122").fa_all_quants.enabled is False


# NVIDIA_REQUIRE_CUDA of the nvidia/cuda 12.8 bases (docker image inspect of nvidia/cuda:12.8.1-*): brand
# exceptions for the 470, 535, 550, 560 and 565 branches, none for GeForce. The 12.4 bases still listed
# geforce. The toolkit ORs the space-separated alternatives and ANDs the comma-separated terms.
_BRANDS_128 = ["unknown", "grid", "tesla", "nvidia", "quadro", "quadrortx", "nvidiartx", "vapps", "vpc", "vcs",
               "vws", "cloudgaming"]
REQUIRE_128 = "cuda>=12.8 " + " ".join(f"brand={b},driver>={d},driver<{d + 1}" for d in (470, 535, 550, 560, 565)
                                       for b in _BRANDS_128)
REQUIRE_124 = "cuda>=12.4 " + " ".join(f"brand={b},driver>={d},driver<{d + 1}" for d in (470, 525, 535)
                                       for b in ["tesla", "nvidia", "geforce", "geforcertx", "titan"])


@pytest.mark.parametrize(
    ("image", "require", "gpu", "drv", "env", "status", "said", "fix"),
    [
        # GeForce on R550 (CUDA 12.4), a CUDA 12.8 image: the toolkit refuses it
        ("llamacpp:server-cuda-12.8", REQUIRE_128, RTX4090, D550, None, "fail",
         "the NVIDIA container toolkit refuses to start", "NVIDIA_DISABLE_REQUIRE=1"),
        ("vllm:0.10.1.1", REQUIRE_128, RTX4090, D550, None, "fail", "brand geforce/geforcertx", "after which: WARN"),
        # lifted: minor-version compatibility decides again
        ("llamacpp:server-cuda-12.8", REQUIRE_128, RTX4090, D550, {"NVIDIA_DISABLE_REQUIRE": "1"}, "warn",
         "minor-version compatibility", ""),
        # a data-center card on a listed branch is admitted by a brand exception
        ("vllm:0.10.1.1", REQUIRE_128, A100, D550, None, "warn", "Triton", ""),
        # the 12.4 bases admitted GeForce on R535
        ("llamacpp:b5000-cu122", REQUIRE_124.replace("cuda>=12.4", "cuda>=12.4"), RTX4090, D535, None, "pass",
         "native", ""),
        # native: the cuda>= term alone admits it
        ("llamacpp:server-cuda-12.8", REQUIRE_128, RTX4090, D570, None, "pass", "native", ""),
    ],
)
def test_the_image_nvidia_require_cuda_is_judged_as_the_toolkit_does(image, require, gpu, drv, env, status, said, fix):
    r = rel(image).model_copy(update={"require_cuda": require})
    name, cc, dc = gpu
    v = compat.check_cuda_driver(r, CAT, driver=drv[0], cuda_driver=drv[1], gpu_name=name, cc=cc, data_center=dc,
                                 env=env, today=BEFORE_R535_EOL, **NO_FWD)
    assert v.status == status, v
    assert said in v.message, v.message
    assert fix in v.fix, v.fix


def test_without_the_image_requirement_string_a_geforce_stays_a_warn():
    v = cuda_verdict("llamacpp:vendored-0.3.36-cu118", RTX4090, D470)
    assert v.status == "warn"
    # a string nobody read (no base in catalog cuda_bases.yaml, not inspected): a WARN that says so
    r = rel("vllm:0.10.1.1").model_copy(update={"require_cuda": None, "require_cuda_source": None})
    v = compat.check_cuda_driver(r, CAT, driver=D550[0], cuda_driver=D550[1], gpu_name=RTX4090[0], cc="8.9",
                                 data_center=False, **NO_FWD)
    assert v.status == "warn", v
    assert "NVIDIA_REQUIRE_CUDA is not known" in v.message and "images.inspect" in v.message, v.message


def test_require_cuda_terms():
    sat = compat.require_cuda_satisfied
    assert sat("cuda>=12.8", driver="550.54.15", cuda="12.4", cc="8.9", brands={"geforce"}) == (False, "")
    assert sat(REQUIRE_124, driver="535.183.06", cuda="12.2", cc="8.9", brands={"geforce"})[0] is True
    assert sat(REQUIRE_128, driver="550.54.15", cuda="12.4", cc="8.0", brands=None)[0] is None
    assert compat.card_brands("NVIDIA GeForce RTX 3090", False) == {"geforce", "geforcertx"}
    assert compat.card_brands("Tesla V100-SXM2-32GB", True) == {"tesla"}
    assert compat.card_brands("NVIDIA H200", True) == {"nvidia", "tesla"}


def test_a_driver_after_the_driver_table_warns_where_the_table_ends_instead_of_judging_by_its_last_row():
    """The driver table ends at branch 595 (CUDA 13.2); NVIDIA has published CUDA 13.3-13.5 since, whose
    driver rows the catalog does not hold. A 610 driver with no CUDA version read from the host and an
    image that needs more than 13.2 is a WARN that names the table's end, not a verdict from the 595 row."""
    last = max(CAT.driver_branches)
    r = rel("vllm:0.20.0").model_copy(update={"cuda": "13.3"})
    host = dict(gpu_name="NVIDIA H200", cc="9.0", data_center=True, today=BEFORE_R535_EOL, **NO_FWD)
    v = compat.check_cuda_driver(r, CAT, driver=f"{last + 15}.43.02", cuda_driver=None, **host)
    assert v.status == "warn", v
    assert f"ends at branch {last}" in v.message and "CUDA Toolkit and Corresponding Driver Versions" in v.fix
    # What nvidia-smi reports decides where it is read; an image the table covers is judged as before.
    assert compat.check_cuda_driver(r, CAT, driver=f"{last + 15}.43.02", cuda_driver="13.3", **host).status == "pass"
    older = rel("vllm:0.20.0")
    assert compat.check_cuda_driver(older, CAT, driver=f"{last + 15}.43.02", cuda_driver=None, **host).status == "pass"
