"""Compatibility rules: can this engine image run on this card with this driver and these flags?

Pure functions over the engine-release catalog (``catalog/engines.yaml``) and plain values taken
from host facts. Each rule returns a ``Verdict`` (pass / warn / fail, a message that says what was
seen, and the fix); ``llmfleet.knowledge.preflight`` turns them into named checks.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmfleet.errors import UsageError

ENGINES_PATH = Path(__file__).resolve().parent / "catalog" / "engines.yaml"
Status = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class Verdict:
    status: Status
    message: str
    fix: str = ""


# ------------------------------------------------------------------------------------------------
# Catalog


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Kernels(_Model):
    sass: list[str] = Field(default_factory=list)
    ptx: list[str] = Field(default_factory=list)


class DefaultBackend(_Model):
    min_cc: str
    backend: str


class Backend(_Model):
    min_cc: str
    kv_dtypes: list[str] = Field(default_factory=lambda: ["auto"])


class Attention(_Model):
    select: Literal["env", "arg"]
    default: list[DefaultBackend]
    backends: dict[str, Backend]


class EngineRelease(_Model):
    key: str
    engine: Literal["vllm", "llamacpp"]
    version: str
    repository: str
    tag: str
    cpu: bool = False
    cuda: str | None = None
    min_driver: str | None = None
    cuda_compat_in_image: bool = False
    kernels: Kernels = Field(default_factory=Kernels)
    v1_min_cc: str | None = None
    quantizations: dict[str, str] = Field(default_factory=dict)
    attention: Attention | None = None
    flash_attn_flag: Literal["value", "bare"] | None = None
    image_size_mib: int = 0
    confidence: Literal["H", "M", "U"]
    sources: list[str]


class EngineRules(_Model):
    quant_methods: dict[str, list[str]]
    quantization_flag: dict[str, str] = Field(default_factory=dict)
    dtype_needs_bf16: list[str] = Field(default_factory=list)
    kv_dtypes: list[str]
    kv_needs_flash_attn: list[str] = Field(default_factory=list)


class EngineCatalog(_Model):
    cuda_toolkits: dict[str, list[str]]
    driver_branches: dict[int, str]
    minor_compat_floor: dict[str, str]
    forward_compat: dict[str, str]
    engines: dict[str, EngineRules]
    images: dict[str, EngineRelease]

    def release(self, key: str) -> EngineRelease | None:
        return self.images.get(key)


def parse_engine_catalog(text: str, path: str = "engines.yaml") -> EngineCatalog:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping at the top")
    images = data.get("images")
    if isinstance(images, dict):
        data = dict(data)
        data["images"] = {k: {**v, "key": k} if isinstance(v, dict) else v for k, v in images.items()}
    try:
        cat = EngineCatalog.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise UsageError(f"{path}: {where}: {err.get('msg')}") from None
    for key, rel in cat.images.items():
        if key.split(":", 1)[0] != rel.engine:
            raise UsageError(f"{path}: images.{key}: engine {rel.engine!r} does not match the key")
        if not rel.cpu and (rel.cuda is None or rel.min_driver is None or not (rel.kernels.sass or rel.kernels.ptx)):
            raise UsageError(f"{path}: images.{key}: a GPU image needs cuda, min_driver and kernels")
    return cat


@functools.lru_cache(maxsize=4)
def load_engine_catalog(path: str | None = None) -> EngineCatalog:
    p = Path(path) if path else ENGINES_PATH
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{p}: cannot read the engine catalog: {exc.strerror}") from None
    return parse_engine_catalog(text, str(p))


def driver_branches() -> dict[int, str]:
    return dict(load_engine_catalog().driver_branches)


# ------------------------------------------------------------------------------------------------
# Versions


def cc_tuple(cc: str | None) -> tuple[int, int] | None:
    if cc is None:
        return None
    m = re.fullmatch(r"(\d{1,2})\.(\d{1,2})a?", str(cc).strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    m = re.fullmatch(r"v?(\d{1,4}(?:\.\d{1,6}){0,3})", str(text).strip())
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def cuda_major_minor(cuda: str | None) -> tuple[int, int] | None:
    v = version_tuple(cuda)
    return (v[0], v[1]) if v and len(v) >= 2 else None


def branch_cuda(driver: str, branches: dict[int, str]) -> str | None:
    """Highest CUDA a driver branch supports; a branch between rows takes the lower row."""
    v = version_tuple(driver)
    if not v or len(v) < 2:
        return None
    known = [b for b in sorted(branches) if b <= v[0]]
    return branches[known[-1]] if known else None


def kernel_coverage(rel: EngineRelease, cc: str) -> tuple[Literal["sass", "ptx"], str] | None:
    """Which kernels of the image run on a card: exact or same-major SASS first, then PTX <= CC."""
    want = cc_tuple(cc)
    if want is None:
        return None
    best: tuple[int, int] | None = None
    best_s = ""
    for s in rel.kernels.sass:
        have = cc_tuple(s)
        if have is None:
            continue
        exact_only = s.strip().endswith("a")
        ok = have == want if exact_only else (have[0] == want[0] and have[1] <= want[1])
        if ok and (best is None or have > best):
            best, best_s = have, s
    if best is not None:
        return ("sass", best_s)
    for p in rel.kernels.ptx:
        have = cc_tuple(p)
        if have is not None and have <= want and (best is None or have > best):
            best, best_s = have, p
    return ("ptx", best_s) if best is not None else None


def _arg_value(args: list[str], *names: str) -> str | None:
    """Value of the last ``--name V`` / ``--name=V`` among args (later flags win, as in argparse)."""
    found: str | None = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                found = args[i + 1]
            elif a.startswith(n + "="):
                found = a[len(n) + 1:]
    return found


def _cc_ok(cc: tuple[int, int], floor: str | None) -> bool:
    f = cc_tuple(floor)
    return f is not None and cc >= f


def _sm(cc: str) -> str:
    return "sm_" + cc.replace(".", "").rstrip("a")


# ------------------------------------------------------------------------------------------------
# Rules


def check_architecture(rel: EngineRelease, gpu_name: str | None, cc: str | None) -> Verdict:
    if rel.cpu:
        return Verdict("pass", f"{rel.key} is a CPU image: no GPU kernels needed")
    label = gpu_name or "the GPU"
    if cc_tuple(cc) is None:
        return Verdict(
            "fail",
            f"compute capability of {label} is unknown (saw {cc!r}); cannot tell whether {rel.key} has kernels for it",
            "add the card to catalog/gpus.yaml with its compute_capability, or upgrade the driver so "
            "nvidia-smi reports compute_cap",
        )
    cov = kernel_coverage(rel, str(cc))
    kernels = "SASS " + ", ".join(rel.kernels.sass or ["none"]) + "; PTX " + ", ".join(rel.kernels.ptx or ["none"])
    if cov is None:
        return Verdict(
            "fail",
            f"{rel.key} has no kernels for {label} (compute capability {cc}, {_sm(str(cc))}); it carries {kernels}",
            _arch_fix(rel, str(cc)),
        )
    kind, arch = cov
    if kind == "sass":
        return Verdict("pass", f"{rel.key} carries SASS for {_sm(arch)}, which runs on {label} ({cc})")
    return Verdict(
        "pass",
        f"{rel.key} has only PTX ({_sm(arch)}) for {label} ({cc}): the driver JIT-compiles it at first start "
        "(minutes; keep ~/.nv/ComputeCache in a volume), and needs native driver support for CUDA "
        f"{rel.cuda}",
    )


def _arch_fix(rel: EngineRelease, cc: str) -> str:
    t = cc_tuple(cc) or (0, 0)
    if rel.engine == "vllm" and t < (7, 0):
        return "no official vLLM image supports compute capability below 7.0: serve this card with llama.cpp"
    if rel.engine == "vllm" and t < (7, 5):
        return ("use a vLLM release with sm_70 kernels (vllm:0.19.1 or older, CUDA 12.x; vllm:0.19.1-volta is built "
                "for CUDA 12.6), or llama.cpp")
    if rel.engine == "llamacpp":
        return "use a llama.cpp image built with SASS for this card, e.g. llamacpp:b5000-cu122"
    return "pick an image whose kernels cover this compute capability (catalog/engines.yaml)"


def check_cuda_driver(
    rel: EngineRelease,
    cat: EngineCatalog,
    *,
    driver: str | None,
    cuda_driver: str | None,
    gpu_name: str | None,
    cc: str | None,
    data_center: bool | None,
    toolkit_version: str | None,
    runtimes: list[str],
    env: dict[str, str] | None = None,
) -> Verdict:
    """Image CUDA vs host driver: native, minor-version compatibility (and its PTX-JIT catch), or
    forward compatibility (data-center cards, cuda-compat in the image, the nvidia runtime)."""
    if rel.cpu:
        return Verdict("pass", f"{rel.key} is a CPU image: the NVIDIA driver is not used")
    need = rel.min_driver or "?"
    if not driver:
        return Verdict("fail", "no NVIDIA driver version seen on the host",
                       f"install an NVIDIA driver >= {need} (CUDA {rel.cuda}) and check `nvidia-smi`")
    dv = version_tuple(driver)
    if dv is None or len(dv) < 2:
        return Verdict("fail", f"driver version {driver[:80]!r} does not parse",
                       "check `nvidia-smi` on the host; expected something like 570.133.07")
    img = cuda_major_minor(rel.cuda)
    min_dv = version_tuple(rel.min_driver) or ()
    native = cuda_major_minor(cuda_driver) or cuda_major_minor(branch_cuda(driver, cat.driver_branches))
    native_s = f"{native[0]}.{native[1]}" if native else "unknown"
    if img is None:
        return Verdict("fail", f"{rel.key}: catalog CUDA version {rel.cuda!r} does not parse", "fix catalog/engines.yaml")
    if native is not None and native >= img:
        if dv >= min_dv:
            return Verdict("pass", f"driver {driver} supports CUDA {native_s}; {rel.key} needs CUDA {rel.cuda} "
                                   f"(driver >= {need}): native")
        return Verdict("warn", f"driver {driver} knows CUDA {native_s} but CUDA {rel.cuda} lists driver >= {need}",
                       f"update the driver within its branch to >= {need}")
    cov = kernel_coverage(rel, str(cc)) if cc_tuple(cc) else None
    card = gpu_name or "the card"
    # 1. Forward compatibility: the image's own newer libcuda (full feature set, PTX JIT included).
    fwd_reason = _forward_compat_gap(rel, cat, card, data_center, toolkit_version, runtimes)
    if fwd_reason is None:
        return Verdict(
            "warn",
            f"driver {driver} supports CUDA {native_s} < {rel.cuda}; {rel.key} runs through forward compatibility "
            f"(its cuda-compat libcuda, data-center {card}, nvidia runtime, toolkit {toolkit_version}); NVIDIA "
            "supports that only on long-term-support driver branches",
            f"upgrade the driver to >= {need} for native support",
        )
    upgrade = f"upgrade the driver to >= {need} (CUDA {rel.cuda})"
    # 2. Minor-version compatibility: same major, driver above the floor, a limited feature set.
    floor = cat.minor_compat_floor.get(str(img[0]))
    floor_v = version_tuple(floor) or ()
    same_major = native is not None and native[0] == img[0]
    if floor and same_major and dv >= floor_v:
        if cov is not None and cov[0] == "ptx":
            return Verdict(
                "fail",
                f"driver {driver} (CUDA {native_s}) runs CUDA {rel.cuda} apps only through minor-version "
                f"compatibility, which does not cover PTX JIT; {rel.key} has only PTX for {card} ({cc}): expect "
                f"cudaErrorUnsupportedPtxVersion at the first kernel; forward compatibility is out: {fwd_reason}",
                f"{upgrade}, or use an image with SASS for {_sm(str(cc))} built for CUDA <= {native_s} "
                "(e.g. llamacpp:b5000-cu122)",
            )
        if rel.engine == "vllm":
            return Verdict(
                "fail",
                f"driver {driver} (CUDA {native_s}) runs CUDA {rel.cuda} only through minor-version compatibility, "
                f"and vLLM JIT-compiles Triton kernels at start, which that does not cover; forward compatibility is "
                f"out: {fwd_reason}",
                f"{upgrade}, or choose an image built for CUDA <= {native_s}",
            )
        require = "" if (env or {}).get("NVIDIA_DISABLE_REQUIRE") == "1" else (
            "; the image's NVIDIA_REQUIRE_CUDA may stop the container (NVIDIA_DISABLE_REQUIRE=1 lifts it)")
        return Verdict(
            "warn",
            f"driver {driver} (CUDA {native_s}) runs CUDA {rel.cuda} only through minor-version compatibility "
            f"(limited feature set; {rel.key} has SASS for {card}){require}",
            f"{upgrade} for native support",
        )
    return Verdict(
        "fail",
        f"driver {driver} supports CUDA {native_s}, but {rel.key} is built for CUDA {rel.cuda} (needs driver >= "
        f"{need}); minor-version compatibility needs the same major and driver >= {floor or '?'}, and forward "
        f"compatibility is out: {fwd_reason}",
        f"{upgrade}, or choose an image built for CUDA <= {native_s}",
    )


def _forward_compat_gap(rel: EngineRelease, cat: EngineCatalog, card: str, data_center: bool | None,
                        toolkit_version: str | None, runtimes: list[str]) -> str | None:
    """Why forward compatibility does not apply here, or None when it does."""
    if data_center is None:
        return f"{card} is not in the GPU catalog, so it cannot be assumed a data-center part"
    if not data_center:
        return f"{card} is not a data-center GPU, and forward compatibility covers only those"
    if not rel.cuda_compat_in_image:
        return f"{rel.key} ships no cuda-compat package"
    if "nvidia" not in runtimes:
        return "it needs the `nvidia` runtime registered in Docker (plain --gpus does not load the compat libcuda)"
    min_tk = cat.forward_compat.get("min_toolkit", "1.17.5")
    tk = version_tuple(re.sub(r"[-~].*$", "", toolkit_version or ""))
    if tk is None or tk < (version_tuple(min_tk) or ()):
        return f"it needs nvidia-container-toolkit >= {min_tk} (seen {toolkit_version or 'none'})"
    return None


def quant_methods(rules: EngineRules, rel: EngineRelease, quant: str | None, args: list[str]) -> tuple[str, list[str]]:
    """(what was asked, candidate methods) for the service's quant and any --quantization flag."""
    flag = _arg_value(args, "--quantization", "-q")
    if flag and rules.quantization_flag.get(flag.lower()) != "from-quant":
        method = rules.quantization_flag.get(flag.lower())
        return f"--quantization {flag}", [method] if method else []
    q = (quant or ("gguf" if rel.engine == "llamacpp" else "fp16")).lower()
    return q, list(rules.quant_methods.get(q, []))


def check_quantization(rel: EngineRelease, rules: EngineRules, quant: str | None, args: list[str],
                       cc: str | None) -> Verdict:
    asked, methods = quant_methods(rules, rel, quant, args)
    if not methods:
        known = ", ".join(sorted(rules.quantization_flag if asked.startswith("--") else rules.quant_methods))
        extra = " (llama.cpp serves GGUF files only)" if rel.engine == "llamacpp" else ""
        return Verdict("fail", f"{rel.engine} does not know quantization {asked!r}{extra}", f"use one of: {known}")
    if rel.cpu or rel.engine == "llamacpp":
        return Verdict("pass", f"{asked}: {rel.engine} runs it" + (" (CPU image)" if rel.cpu else " on any CUDA card"))
    t = cc_tuple(cc)
    if t is None:
        return Verdict("warn", f"{asked}: compute capability unknown, cannot check the kernels",
                       "add the card to catalog/gpus.yaml")
    usable = [m for m in methods if _cc_ok(t, rel.quantizations.get(m))]
    if not usable:
        need = ", ".join(f"{m} needs {rel.quantizations.get(m, '?')}" for m in methods)
        return Verdict(
            "fail",
            f"{asked} does not run on compute capability {cc} in {rel.key} ({need})",
            _quant_fix(t),
        )
    if usable[0] != methods[0]:
        note = f"{asked}: {methods[0]} needs {rel.quantizations.get(methods[0])}; the engine uses {usable[0]} on {cc}"
        if usable[0] == "fp8_marlin":
            return Verdict("warn", note + " (weight-only FP8, W8A16: no FP8 compute on this card)",
                           "fine to run; for FP8 compute use a card with compute capability >= 8.9")
        return Verdict("pass", note)
    return Verdict("pass", f"{asked}: {usable[0]} runs on compute capability {cc}")


def _quant_fix(cc: tuple[int, int]) -> str:
    if cc < (7, 5):
        return "on Volta use GPTQ (e.g. gptq-int4 with --quantization gptq), bitsandbytes, or GGUF with llama.cpp"
    if cc < (8, 9):
        return "FP8 W8A8 needs compute capability 8.9: use int8, gptq-int4 or awq-int4"
    return "choose a quantization listed for this card in catalog/engines.yaml"


def check_dtype(rel: EngineRelease, rules: EngineRules, quant: str | None, args: list[str],
                cc: str | None, bf16_native: bool | None = None) -> Verdict:
    """No bf16 below compute capability 8.0: float16 (vLLM needs --dtype float16 there)."""
    if rel.cpu:
        return Verdict("pass", f"{rel.key} is a CPU image: dtype is the engine's CPU choice")
    t = cc_tuple(cc)
    dtype = (_arg_value(args, "--dtype") or "auto").lower() if rel.engine == "vllm" else None
    q = (quant or "").lower()
    wants_bf16 = q in rules.dtype_needs_bf16 or dtype in ("bfloat16", "bf16")
    if t is None:
        return Verdict("warn", "compute capability unknown: cannot check bf16 support", "add the card to catalog/gpus.yaml")
    has_bf16 = bf16_native if bf16_native is not None else t >= (8, 0)
    if has_bf16:
        return Verdict("pass", f"compute capability {cc} supports bf16 and fp16")
    if rel.engine == "vllm" and dtype in ("float16", "half", "fp16") and q in rules.dtype_needs_bf16:
        return Verdict("pass", f"--dtype {dtype}: the {quant} checkpoint is cast to float16 on compute capability "
                               f"{cc} (no bf16 below 8.0); models trained in bf16 may overflow in fp16")
    if wants_bf16:
        what = f"--dtype {dtype}" if dtype in ("bfloat16", "bf16") else f"quant {quant}"
        fix = ("pass --dtype float16 (and a float16 or quantized checkpoint)" if rel.engine == "vllm"
               else "use an f16 or quantized GGUF instead of bf16")
        return Verdict("fail", f"{what} needs bf16, which compute capability {cc} lacks (needs 8.0)", fix)
    if rel.engine == "vllm" and dtype in ("auto", None):
        return Verdict("warn", f"--dtype auto on compute capability {cc}: a bf16 checkpoint would need bf16 (8.0)",
                       "pass --dtype float16 in engine_args")
    return Verdict("pass", f"dtype {dtype or 'f16'} on compute capability {cc} (no bf16 needed)")


def _requested_backend(rel: EngineRelease, args: list[str], env: dict[str, str]) -> str | None:
    b = _arg_value(args, "--attention-backend") or env.get("VLLM_ATTENTION_BACKEND")
    return b.upper() if b else None


def effective_backend(rel: EngineRelease, args: list[str], env: dict[str, str], cc: str | None) -> str | None:
    if rel.attention is None:
        return None
    req = _requested_backend(rel, args, env)
    if req:
        return req
    t = cc_tuple(cc)
    if t is None:
        return None
    for row in rel.attention.default:
        if _cc_ok(t, row.min_cc):
            return row.backend
    return None


def _flash_attn_setting(args: list[str]) -> str | None:
    """llama.cpp: 'on'/'off'/'auto', 'bare' for a bare -fa switch, None when absent."""
    for i, a in enumerate(args):
        if a in ("-fa", "--flash-attn"):
            nxt = args[i + 1] if i + 1 < len(args) else ""
            return nxt.lower() if nxt.lower() in ("on", "off", "auto", "1", "0", "true", "false") else "bare"
        if a.startswith("--flash-attn="):
            return a.split("=", 1)[1].lower()
    return None


def check_attention(rel: EngineRelease, args: list[str], env: dict[str, str], cc: str | None) -> Verdict:
    if rel.engine == "llamacpp":
        fa = _flash_attn_setting(args)
        if fa is None:
            return Verdict("pass", "llama.cpp picks its attention kernels itself (flash attention flag not set)")
        if rel.flash_attn_flag == "value" and fa == "bare":
            return Verdict("fail", f"{rel.key} takes -fa on|off|auto; a bare -fa stops the server at start",
                           "write -fa on (or remove it)")
        if rel.flash_attn_flag == "bare" and fa != "bare":
            return Verdict("fail", f"{rel.key} takes a bare -fa switch; '-fa {fa}' stops the server at start",
                           "write a bare -fa (or remove it)")
        return Verdict("pass", f"llama.cpp flash attention ({fa}) has kernels for every CUDA card (tile/vec)")
    if rel.cpu or rel.attention is None:
        return Verdict("pass", f"{rel.key}: the engine picks its CPU attention backend")
    t = cc_tuple(cc)
    req = _requested_backend(rel, args, env)
    if t is None:
        return Verdict("warn", "compute capability unknown: cannot check the attention backend",
                       "add the card to catalog/gpus.yaml")
    how = ("--attention-backend NAME in engine_args" if rel.attention.select == "arg"
           else "env VLLM_ATTENTION_BACKEND=NAME")
    usable = [n for n, b in rel.attention.backends.items() if _cc_ok(t, b.min_cc)]
    if req:
        b = rel.attention.backends.get(req)
        if b is None:
            return Verdict("fail", f"attention backend {req} is not in {rel.key} (it has {', '.join(rel.attention.backends)})",
                           f"set one of {', '.join(usable)} via {how}")
        if not _cc_ok(t, b.min_cc):
            return Verdict("fail", f"attention backend {req} needs compute capability {b.min_cc}; the card has {cc}",
                           f"set one of {', '.join(usable)} via {how}")
        if rel.attention.select == "env" and _arg_value(args, "--attention-backend"):
            return Verdict("fail", f"{rel.key} has no --attention-backend flag",
                           "use env VLLM_ATTENTION_BACKEND instead")
        return Verdict("pass", f"attention backend {req} runs on compute capability {cc}")
    eff = effective_backend(rel, args, env, cc)
    if eff is None:
        return Verdict("fail", f"{rel.key} has no attention backend for compute capability {cc}",
                       "choose another image (catalog/engines.yaml)")
    v0 = ""
    if rel.v1_min_cc and not _cc_ok(t, rel.v1_min_cc):
        v0 = f" (the V0 engine: V1 needs {rel.v1_min_cc} in this release)"
    return Verdict("pass", f"{rel.key} picks {eff} on compute capability {cc}{v0}")


def check_kv_dtype(rel: EngineRelease, rules: EngineRules, kv_dtype: str | None, args: list[str],
                   env: dict[str, str], cc: str | None) -> Verdict:
    if rel.engine == "vllm":
        kv = (_arg_value(args, "--kv-cache-dtype") or kv_dtype or "auto").lower()
    else:
        kv = (_arg_value(args, "-ctk", "--cache-type-k") or kv_dtype or "auto").lower()
        kv_v = (_arg_value(args, "-ctv", "--cache-type-v") or kv).lower()
    if kv not in rules.kv_dtypes:
        return Verdict("fail", f"KV cache dtype {kv!r} is not one {rel.engine} knows",
                       f"use one of: {', '.join(rules.kv_dtypes)}")
    if rel.engine == "llamacpp":
        if kv_v not in rules.kv_dtypes:
            return Verdict("fail", f"V cache dtype {kv_v!r} is not one llama.cpp knows",
                           f"use one of: {', '.join(rules.kv_dtypes)}")
        fa = _flash_attn_setting(args)
        if kv_v in rules.kv_needs_flash_attn and fa in ("off", "0", "false"):
            return Verdict("fail", f"a quantized V cache ({kv_v}) needs flash attention, which is off",
                           "use -fa on, or -ctv f16")
        return Verdict("pass", f"KV cache {kv}/{kv_v} on llama.cpp")
    if kv == "auto" or rel.cpu:
        return Verdict("pass", f"KV cache dtype {kv}")
    eff = effective_backend(rel, args, env, cc)
    if eff is None or rel.attention is None:
        return Verdict("warn", f"KV cache dtype {kv}: attention backend unknown, cannot check",
                       "set the attention backend explicitly")
    b = rel.attention.backends.get(eff)
    if b is None or kv not in b.kv_dtypes:
        good = [n for n, bb in rel.attention.backends.items() if kv in bb.kv_dtypes
                and cc_tuple(cc) and _cc_ok(cc_tuple(cc), bb.min_cc)]  # type: ignore[arg-type]
        return Verdict("fail", f"KV cache dtype {kv} is not supported by attention backend {eff} in {rel.key}",
                       (f"select {' or '.join(good)} as attention backend, or" if good else "") + " use --kv-cache-dtype auto")
    return Verdict("pass", f"KV cache dtype {kv} with attention backend {eff}")


def summarize_catalog(cat: EngineCatalog) -> list[dict[str, Any]]:
    """Rows for a table of the images the catalog knows."""
    return [
        {"image": k, "cuda": r.cuda or "cpu", "min_driver": r.min_driver or "-",
         "sass": r.kernels.sass, "ptx": r.kernels.ptx, "confidence": r.confidence}
        for k, r in cat.images.items()
    ]
