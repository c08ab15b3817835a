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
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmfleet import cache
from llmfleet.errors import UsageError
from llmfleet.knowledge.yaml_model import load_model, parse_yaml, read_catalog, validated

if TYPE_CHECKING:
    from llmfleet.knowledge.engines.base import EngineKnowledge

ENGINES_PATH = Path(__file__).resolve().parent / "catalog" / "engines.yaml"
CUDA_BASES_PATH = Path(__file__).resolve().parent / "catalog" / "cuda_bases.yaml"
Status = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class Verdict:
    status: Status
    message: str
    fix: str = ""


# ------------------------------------------------------------------------------------------------
# Catalog


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Kernels(_Model):
    sass: list[str] = Field(default_factory=list)
    ptx: list[str] = Field(default_factory=list)


class DefaultBackend(_Model):
    min_cc: str
    backend: str


class Backend(_Model):
    min_cc: str
    kv_dtypes: list[str] = Field(default_factory=lambda: ["auto"])
    # KV dtype -> compute capabilities it runs on with this backend: "any", "8.9+", "9.0-9.9"; a
    # trailing "?" marks an unconfirmed claim (a WARN, never a silent PASS).
    kv_cc: dict[str, str] = Field(default_factory=dict)


class Attention(_Model):
    select: Literal["env", "arg"]
    default: list[DefaultBackend]
    backends: dict[str, Backend]


class TorchBuild(_Model):
    """The PyTorch build inside an image: its kernels must cover the card as well as the engine's."""

    version: str
    cuda: str | None = None
    archs: list[str]
    confidence: Literal["H", "M", "U"]
    sources: list[str] = Field(default_factory=list)

    @property
    def kernels(self) -> Kernels:
        return parse_archs(self.archs) or Kernels()


def torch_label(tb: TorchBuild) -> str:
    """``torch 2.7.1+cu128`` (the version as inspected already carries the variant)."""
    if "+" in tb.version or not tb.cuda:
        return f"torch {tb.version}"
    return f"torch {tb.version}+cu{tb.cuda.replace('.', '')}"


class KvLayout(_Model):
    """What a build keeps for sliding-window layers: only the window, or the full context."""

    sliding_window: Literal["window", "full"]
    confidence: Literal["H", "M", "U"]
    source: str


class RpcWorker(_Model):
    """llama.cpp: whether the image ships the RPC worker (``rpc-server`` where the role runs it) and a
    llama-server built with the RPC backend (``--rpc``), which a service split over hosts needs."""

    ships: bool
    confidence: Literal["H", "M", "U"]
    source: str


class BuildFlag(_Model):
    """A build option of the image (llama.cpp: GGML_CUDA_FA_ALL_QUANTS), with where it was read."""

    enabled: bool
    confidence: Literal["H", "M", "U"]
    source: str


class CudaFlashAttnKv(_Model):
    """llama.cpp: the K/V cache types ggml-cuda's flash attention has kernels for in one build, read from
    that build's fattn.cu and ggml-cuda.cu (``llmfleet.images.llamacpp_rules``; fixture
    tests/fixtures/llamacpp/<build>/fattn.txt)."""

    build: str | None = None  # the fixture it was read from
    types: list[str]
    mixed: list[list[str]] = Field(default_factory=list)
    all_quants_types: list[str]
    any_pair: bool = False  # any K, V pair of `types` runs (the build converts pairs without a vector kernel)
    # quantized K/V have kernels only at these head sizes (None: not bounded by head size)
    quant_head_sizes: list[int] | None = None
    cpu_types: list[str] = Field(default_factory=list)  # K or V of these: supports_op refuses: attention on the CPU
    outside: Literal["cpu", "abort"] = "cpu"  # a pair outside the table: CPU attention, or the server aborts
    confidence: Literal["H", "M", "U"]
    source: str


class KnownIssue(_Model):
    """An engine bug tied to cards (``cc``: "7.0-7.5", "8.9+", ...), and whether this release carries
    its fix. Unfixed: the preflight WARNs (for multimodal models only when ``multimodal_only``)."""

    id: str  # "vllm#36357"
    url: str
    summary: str
    cc: str
    multimodal_only: bool = False
    fixed: bool
    confidence: Literal["H", "M", "U"]
    source: str


class LoadLog(_Model):
    """llama.cpp: the ``-lv`` at which the build prints its load lines (layers offloaded, buffers per
    device, KV cache), which the residency check reads; None: printed at the default verbosity."""

    verbosity: int | None
    confidence: Literal["H", "M", "U"]
    source: str


class EngineRelease(_Model):
    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        from llmfleet.inventory.services import NON_ENGINE_KINDS
        from llmfleet.knowledge import engines

        known = [*engines.names(), *NON_ENGINE_KINDS]
        if value not in known:
            raise ValueError(f"engine {value!r} is not one llmfleet knows ({', '.join(known)})")
        return value

    key: str
    engine: str  # one of engines.names(), or an exporter kind (_known_engine)
    version: str
    repository: str
    tag: str
    cpu: bool = False
    cuda: str | None = None
    min_driver: str | None = None
    cuda_compat_in_image: bool = False
    # The image sets NVIDIA_REQUIRE_CUDA or CUDA_VERSION (the nvidia/cuda bases): the NVIDIA runtime then
    # refuses a driver below that CUDA unless NVIDIA_DISABLE_REQUIRE=1.
    nvidia_require_cuda: bool = True
    # The NVIDIA_REQUIRE_CUDA string itself: the container toolkit's check is judged from it; None: not
    # known (the check can only WARN). Where it came from (require_cuda_source): read from the image
    # (images.inspect), images.lock, or the catalog (catalog/cuda_bases.yaml: the string of the image's
    # nvidia/cuda base, base_image); set by load_engine_catalog and preflight.release_for, never in
    # engines.yaml.
    require_cuda: str | None = None
    require_cuda_source: Literal["catalog", "lock", "inspected"] | None = None
    require_cuda_confidence: Literal["H", "M", "U"] | None = None
    base_image: str | None = None
    kernels: Kernels = Field(default_factory=Kernels)
    v1_min_cc: str | None = None
    quantizations: dict[str, str] = Field(default_factory=dict)
    # method -> where its floor was read (a method absent from ``quantizations`` is not in the release)
    quantization_sources: dict[str, str] = Field(default_factory=dict)
    attention: Attention | None = None
    flash_attn_flag: Literal["value", "bare"] | None = None
    flash_attn_default: Literal["off", "auto", "on"] | None = None
    torch: TorchBuild | None = None
    kv_layout: KvLayout | None = None
    rpc_server: RpcWorker | None = None  # llama.cpp only; None: not known
    load_log: LoadLog | None = None  # llama.cpp only; None: not known (the lines may be missing: a WARN)
    fa_all_quants: BuildFlag | None = None  # llama.cpp GPU builds: GGML_CUDA_FA_ALL_QUANTS; None: not known
    cuda_flash_attn_kv: CudaFlashAttnKv | None = None  # llama.cpp GPU builds: the FA K/V table read at the build
    known_issues: list[KnownIssue] = Field(default_factory=list)
    image_size_mib: int = 0
    confidence: Literal["H", "M", "U"]
    sources: list[str]
    # Where kernels/torch were taken from: the catalog, the images.lock entry, or the image itself
    # (`invoke images.inspect`). Set by preflight.release_for, never in the YAML.
    facts_source: Literal["catalog", "lock", "inspected"] = "catalog"


class QuantRemoved(_Model):
    """A quantization method a release line dropped: the first release without it, the last catalog
    release that still has it, and where that was read."""

    removed_in: str
    last: str  # catalog key of the newest release that still has the method
    ref: str  # short reference for messages (e.g. "vllm#39583")
    confidence: Literal["H", "M", "U"]
    source: str


class EngineRules(_Model):
    quant_methods: dict[str, list[str]]
    # method -> when the engine dropped it (the fix text of a release without it names the last one with it)
    quant_removed: dict[str, QuantRemoved] = Field(default_factory=dict)
    # flag value -> method, or methods best first (the engine picks the first the card runs)
    quantization_flag: dict[str, str | list[str]] = Field(default_factory=dict)
    dtype_needs_bf16: list[str] = Field(default_factory=list)
    kv_dtypes: list[str]
    kv_needs_flash_attn: list[str] = Field(default_factory=list)
    cuda_flash_attn_kv: CudaFlashAttnKv | None = None
    # the lowest compute capability the engine supports at all (its own docs), with confidence and source:
    # what a plan names when no catalog image of the engine runs on a card
    min_cc: str | None = None
    min_cc_confidence: Literal["H", "M", "U"] | None = None
    min_cc_source: str | None = None


class CompatRule(_Model):
    verdict: Literal["pass", "warn", "fail"]
    confidence: Literal["H", "M", "U"]
    sources: list[str]


class BranchSupport(_Model):
    designation: Literal["LTSB", "PB", "NFB"]
    eol: str  # YYYY-MM
    confidence: Literal["H", "M", "U"]
    source: str


class ToolkitRow(_Model):
    below: str | None  # this row covers versions below it (None: every later version)
    how: Literal["mount", "none", "runtime", "ldconfig"]
    confidence: Literal["H", "M", "U"]
    source: str


class ForwardCompat(_Model):
    branches: dict[int, BranchSupport]
    toolkit: list[ToolkitRow]


class Cuda11Wheels(_Model):
    """vLLM releases that shipped CUDA 11.8 wheels (on GitHub releases, never on PyPI, never as an image)."""

    versions: str
    torch: str
    torch_archs: list[str]
    vllm_archs: list[str]
    confidence: Literal["H", "M", "U"]
    sources: list[str]


class VllmCuda11(_Model):
    pypi: bool
    pypi_source: str
    image: bool
    image_source: str
    releases: list[Cuda11Wheels]


class DriverCardSupport(_Model):
    """Cards below ``below_cc`` are driven by no branch after ``last_branch``, and never by the open
    kernel modules (below ``open_modules_min_cc``)."""

    below_cc: str
    architectures: str
    last_branch: int
    confidence: Literal["H", "M", "U"]
    source: str
    open_modules_min_cc: str
    open_modules_confidence: Literal["H", "M", "U"]
    open_modules_source: str


class EngineCatalog(_Model):
    cuda_toolkits: dict[str, list[str]]
    driver_branches: dict[int, str]
    minor_compat_floor: dict[str, str]
    compat_rules: dict[str, CompatRule] = Field(default_factory=dict)
    forward_compat: ForwardCompat
    engines: dict[str, EngineRules]
    images: dict[str, EngineRelease]
    vllm_cuda11_wheels: VllmCuda11 | None = None
    driver_card_support: DriverCardSupport | None = None

    def release(self, key: str) -> EngineRelease | None:
        return self.images.get(key)


def parse_engine_catalog(text: str, path: str = "engines.yaml", *, keep: bool = False) -> EngineCatalog:
    """The engine catalog from its text (pure unless ``keep``: the loader's parse through the cache)."""
    data = parse_yaml(text, path, keep=keep)
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping at the top")
    images = data.get("images")
    if isinstance(images, dict):
        data = dict(data)
        data["images"] = {k: {**v, "key": k} if isinstance(v, dict) else v for k, v in images.items()}
    cat = validated(EngineCatalog, data, path)
    from llmfleet.inventory.services import NON_ENGINE_KINDS

    for key, rel in cat.images.items():
        if key.split(":", 1)[0] != rel.engine:
            raise UsageError(f"{path}: images.{key}: engine {rel.engine!r} does not match the key")
        if rel.engine in NON_ENGINE_KINDS:  # no CUDA kernels of its own (exporters: catalog/exporters.yaml)
            continue
        if not rel.cpu and (rel.cuda is None or rel.min_driver is None or not (rel.kernels.sass or rel.kernels.ptx)):
            raise UsageError(f"{path}: images.{key}: a GPU image needs cuda, min_driver and kernels")
    return cat


@functools.lru_cache(maxsize=4)
def load_engine_catalog(path: str | None = None) -> EngineCatalog:
    """The engine catalog, each GPU image's NVIDIA_REQUIRE_CUDA filled from catalog/cuda_bases.yaml."""
    p = Path(path) if path else ENGINES_PATH
    text = read_catalog(p, "the engine catalog")
    cat: EngineCatalog = cache.kept_object(CATALOG_CACHE, _catalog_key(text),
                                           lambda: parse_engine_catalog(text, str(p), keep=True), EngineCatalog)
    return with_cuda_bases(cat, load_cuda_bases())


class CudaBase(_Model):
    """The NVIDIA_REQUIRE_CUDA one nvidia/cuda base version sets."""

    require_cuda: str
    confidence: Literal["H", "M", "U"]
    source: str


class ImageBase(_Model):
    """The image a catalog image's final stage is built FROM (None: not an nvidia/cuda base)."""

    base_image: str | None
    confidence: Literal["H", "M", "U"]
    source: str


class CudaBases(_Model):
    bases: dict[str, CudaBase]
    images: dict[str, ImageBase]


def parse_cuda_bases(text: str, path: str = "cuda_bases.yaml") -> CudaBases:
    """catalog/cuda_bases.yaml from its text (pure)."""
    return load_model(CudaBases, text, path)


@functools.lru_cache(maxsize=2)
def load_cuda_bases(path: str | None = None) -> CudaBases:
    p = Path(path) if path else CUDA_BASES_PATH
    text = read_catalog(p, "the CUDA base catalog")
    return parse_cuda_bases(text, str(p))


_CUDA_BASE_RE = re.compile(r"^(?:[\w.-]+/)*nvidia/cuda:(\d+\.\d+\.\d+)-")


def base_cuda_version(base_image: str | None) -> str | None:
    """"12.8.1" for nvidia/cuda:12.8.1-base-ubuntu22.04 (any registry prefix); None for another image."""
    m = _CUDA_BASE_RE.match(base_image or "")
    return m.group(1) if m else None


def with_cuda_bases(cat: EngineCatalog, bases: CudaBases) -> EngineCatalog:
    """The catalog with each GPU image's base and, where the base's string is known, its
    NVIDIA_REQUIRE_CUDA (require_cuda_source "catalog"; confidence the lower of the base's and the
    image-to-base row's). Pure."""
    order = {"H": 0, "M": 1, "U": 2}
    images = dict(cat.images)
    for key, rel in cat.images.items():
        row = bases.images.get(key)
        if row is None or rel.cpu or rel.require_cuda:
            continue
        update: dict[str, Any] = {"base_image": row.base_image}
        base = bases.bases.get(base_cuda_version(row.base_image) or "")
        if base is not None and rel.nvidia_require_cuda:
            update.update(require_cuda=base.require_cuda, require_cuda_source="catalog",
                          require_cuda_confidence=max(base.confidence, row.confidence, key=order.__getitem__))
        images[key] = rel.model_copy(update=update)
    return cat.model_copy(update={"images": images})


CATALOG_CACHE = "catalog"


def _catalog_key(text: str) -> str:
    """What the validated catalog depends on: its text and the code that validates it (llmfleet's and
    pydantic's versions, this module's own source)."""
    import hashlib
    import sys

    import pydantic

    from llmfleet import __version__

    code = Path(__file__).read_bytes()
    return hashlib.sha256(b"\0".join([text.encode(), code, __version__.encode(), pydantic.VERSION.encode(),
                                      sys.version.encode()])).hexdigest()


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


_ARCH_RE = re.compile(r"^(?:sm_|compute_)?(\d{1,2})\.?(\d)(a?)(?:[-+](real|virtual|ptx|sass))?$", re.I)


def parse_archs(archs: list[str] | tuple[str, ...]) -> Kernels | None:
    """Arch list -> kernels. ``"7.0"``/``"sm_70"``/``"70-real"`` are SASS, ``"compute_90"``/
    ``"90-virtual"`` PTX, ``"12.0+PTX"`` both; ``"12.0a"`` SASS for exactly that CC. Accepts the
    notations of images.lock, TORCH_CUDA_ARCH_LIST, CMAKE_CUDA_ARCHITECTURES and
    ``torch.cuda.get_arch_list()``. None if any entry does not parse."""
    sass: list[str] = []
    ptx: list[str] = []
    for raw in archs:
        text = str(raw).strip()
        m = _ARCH_RE.match(text)
        if not m:
            return None
        cc = f"{int(m.group(1))}.{m.group(2)}" + m.group(3).lower()
        kind = (m.group(4) or "").lower()
        if text.lower().startswith("compute_") or kind == "virtual":
            if cc not in ptx:
                ptx.append(cc)
        elif kind == "ptx":
            if cc not in sass:
                sass.append(cc)
            if cc.rstrip("a") not in ptx:
                ptx.append(cc.rstrip("a"))
        elif cc not in sass:
            sass.append(cc)
    return Kernels(sass=sass, ptx=ptx)


def kernels_cover(kernels: Kernels, cc: str) -> tuple[Literal["sass", "ptx"], str] | None:
    """Which of these kernels run on a card: exact or same-major SASS first, then PTX <= CC."""
    want = cc_tuple(cc)
    if want is None:
        return None
    best: tuple[int, int] | None = None
    best_s = ""
    for s in kernels.sass:
        have = cc_tuple(s)
        if have is None:
            continue
        exact_only = s.strip().endswith("a")
        ok = have == want if exact_only else (have[0] == want[0] and have[1] <= want[1])
        if ok and (best is None or have > best):
            best, best_s = have, s
    if best is not None:
        return ("sass", best_s)
    for p in kernels.ptx:
        have = cc_tuple(p)
        if have is not None and have <= want and (best is None or have > best):
            best, best_s = have, p
    return ("ptx", best_s) if best is not None else None


def kernel_coverage(rel: EngineRelease, cc: str) -> tuple[Literal["sass", "ptx"], str] | None:
    """What runs the card: the engine's kernels, and for an engine on PyTorch the torch build's too.
    The weaker of the two decides (PTX when either has only PTX); None when either has nothing."""
    own = kernels_cover(rel.kernels, cc)
    if own is None or rel.torch is None:
        return own
    torch_cov = kernels_cover(rel.torch.kernels, cc)
    if torch_cov is None:
        return None
    return torch_cov if torch_cov[0] == "ptx" and own[0] == "sass" else own


def cc_in_spec(cc: tuple[int, int], spec: str) -> tuple[bool, bool]:
    """(runs, confirmed) for a compute capability against a kv_cc spec: ``any``, ``8.9+``,
    ``9.0-9.9``; a trailing ``?`` = unconfirmed."""
    text = spec.strip()
    confirmed = not text.endswith("?")
    text = text.rstrip("?").strip()
    if text == "any":
        return True, confirmed
    if text.endswith("+"):
        lo = cc_tuple(text[:-1])
        return (lo is not None and cc >= lo), confirmed
    if "-" in text:
        a, b = text.split("-", 1)
        lo, hi = cc_tuple(a), cc_tuple(b)
        return (lo is not None and hi is not None and lo <= cc <= hi), confirmed
    exact = cc_tuple(text)
    return (exact == cc), confirmed


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


def arg_value(args: list[str], *names: str) -> str | None:
    return _arg_value(args, *names)


def _cc_ok(cc: tuple[int, int], floor: str | None) -> bool:
    f = cc_tuple(floor)
    return f is not None and cc >= f


def cc_ok(cc: tuple[int, int], floor: str | None) -> bool:
    return _cc_ok(cc, floor)


def _sm(cc: str) -> str:
    return "sm_" + cc.replace(".", "").rstrip("a")


def sm(cc: str) -> str:
    return _sm(cc)


def _engine(rel: EngineRelease) -> EngineKnowledge:
    from llmfleet.knowledge import engines

    return engines.for_engine(rel.engine)


def _kernels_text(k: Kernels) -> str:
    return "SASS " + ", ".join(k.sass or ["none"]) + "; PTX " + ", ".join(k.ptx or ["none"])


def _require_note(rel: EngineRelease) -> str:
    """Where the NVIDIA_REQUIRE_CUDA judged was read."""
    if rel.require_cuda_source == "catalog":
        return (f"catalog cuda_bases.yaml: the string of its base {rel.base_image}, confidence "
                f"{rel.require_cuda_confidence or 'U'}; `invoke images.inspect` reads the image's own")
    if rel.require_cuda_source == "lock":
        return "images.lock"
    return "inspected from the image" if rel.require_cuda_source == "inspected" else _facts_note(rel)


def _facts_note(rel: EngineRelease) -> str:
    return {"catalog": "catalog/engines.yaml", "lock": "images.lock", "inspected": "inspected from the image"}[
        rel.facts_source]


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
    eng = _engine(rel)
    src = _facts_note(rel)
    own = kernels_cover(rel.kernels, str(cc))
    if own is None:
        return Verdict(
            "fail",
            f"{rel.key} has no kernels for {label} (compute capability {cc}, {_sm(str(cc))}); it carries "
            f"{_kernels_text(rel.kernels)} ({src})",
            eng.arch_fix(rel, str(cc)),
        )
    torch_note = ""
    cov = own
    if eng.needs_torch_kernels:
        tb = rel.torch
        if tb is None:
            return Verdict(
                "warn",
                f"{rel.key}'s own kernels cover {label} ({_sm(own[1])}), but no source confirms the arch list of "
                f"the PyTorch build inside it, which must cover {_sm(str(cc))} too ({src})",
                f"run `invoke images.inspect {rel.key}` to read torch's compiled arch list from the image",
            )
        tcov = kernels_cover(tb.kernels, str(cc))
        tname = torch_label(tb)
        if tcov is None:
            return Verdict(
                "fail",
                f"{rel.key}: the PyTorch build inside it ({tname}, {_kernels_text(tb.kernels)}) has no kernels for "
                f"{label} ({_sm(str(cc))}), though the engine's own kernels do; the first tensor op fails ('no "
                f"kernel image is available', vllm#19185) ({src}, confidence {tb.confidence})",
                eng.arch_fix(rel, str(cc)),
            )
        if tb.confidence == "U":
            return Verdict(
                "warn",
                f"{rel.key}: its kernels cover {label}; the arch list of its PyTorch build ({tname}) is unconfirmed "
                f"(confidence U), so {_sm(str(cc))} in torch is a claim no source confirms",
                f"run `invoke images.inspect {rel.key}` to read torch's compiled arch list from the image",
            )
        torch_note = (f"; its {tname} has {'SASS' if tcov[0] == 'sass' else 'only PTX'} for {_sm(tcov[1])}"
                      + (f" (torch arch list confidence {tb.confidence}: run `invoke images.inspect {rel.key}` "
                         "to read it from the image)" if tb.confidence != "H" else ""))
        if tcov[0] == "ptx" and own[0] == "sass":
            cov = tcov
    kind, arch = cov
    if kind == "sass":
        return Verdict("pass", f"{rel.key} carries SASS for {_sm(arch)}, which runs on {label} ({cc}){torch_note} "
                               f"({src})")
    return Verdict(
        "pass",
        f"{rel.key} has only PTX ({_sm(arch)}) for {label} ({cc}){torch_note}: the driver JIT-compiles it at first "
        "start (minutes; the release keeps the JIT cache on a volume, CUDA_CACHE_PATH, so later starts reuse it), and needs native driver support for CUDA "
        f"{rel.cuda} ({src})",
    )


def check_driver_drives_card(cat: EngineCatalog, driver: str | None, gpu_name: str | None, cc: str | None,
                             kernel_modules: str | None = None) -> Verdict | None:
    """A FAIL when the driver does not drive this card at all (a branch after the last one for its
    architecture, or the open kernel modules on a card they never supported); None otherwise. Pure."""
    support = cat.driver_card_support
    t, dv = cc_tuple(cc), version_tuple(driver)
    if support is None or t is None or dv is None:
        return None
    card = f"{gpu_name or 'the card'} (compute capability {cc})"
    if t < (cc_tuple(support.below_cc) or (0, 0)) and dv[0] > support.last_branch:
        return Verdict(
            "fail",
            f"driver {driver} (branch R{dv[0]}) does not drive {card}: R{support.last_branch} is the last branch for "
            f"{support.architectures} GPUs (confidence {support.confidence}: {support.source}); after this upgrade "
            "nvidia-smi lists no such GPU",
            f"keep this host on an R{support.last_branch} (or older) driver; R{support.last_branch} is a long-term "
            "support branch",
        )
    if kernel_modules == "open" and t < (cc_tuple(support.open_modules_min_cc) or (0, 0)):
        return Verdict(
            "fail",
            f"driver {driver} runs NVIDIA's open kernel modules, which do not drive {card} (confidence "
            f"{support.open_modules_confidence}: {support.open_modules_source})",
            "install the proprietary kernel modules of the same driver (e.g. the .run installer with "
            "-m=kernel, or the distribution's non-open driver package)",
        )
    return None


# NVIDIA Container Toolkit, "Specialized Configurations with Docker" (docs.nvidia.com/datacenter/
# cloud-native/container-toolkit/latest/docker-specialized.html): in NVIDIA_REQUIRE_*, "space-separated
# constraints are ORed, comma-separated constraints are ANDed"; NVIDIA_REQUIRE_CUDA: "If the version of the
# NVIDIA driver is insufficient to run this version of CUDA, the container will not be started";
# NVIDIA_DISABLE_REQUIRE: "Single switch to disable all the constraints of the form NVIDIA_REQUIRE_*".
TOOLKIT_REFUSES = "the NVIDIA container toolkit refuses to start"
REQUIRE_SOURCE = ("NVIDIA Container Toolkit docs, Specialized Configurations with Docker: space-separated "
                  "constraints are ORed, comma-separated ANDed; the container is not started otherwise")
_REQ_RE = re.compile(r"^(cuda|driver|arch|brand)(>=|<=|==|=|>|<)(.+)$")


def card_brands(gpu_name: str | None, data_center: bool | None) -> set[str] | None:
    """The NVML brand names a card may report, from its nvidia-smi name (lowercase, as the toolkit's
    ``brand=`` constraint spells them); None when the name does not tell."""
    name = (gpu_name or "").lower()
    if "geforce" in name:
        return {"geforce", "geforcertx"}
    if "titan" in name:
        return {"titan", "titanrtx"}
    if "quadro" in name:
        return {"quadro", "quadrortx"}
    if "tesla" in name:
        return {"tesla"}
    if re.search(r"\brtx\b", name):
        return {"nvidiartx", "nvidia"}
    if data_center:
        return {"nvidia", "tesla"}
    return None


def _req_term(term: str, *, driver: str, cuda: str | None, cc: str | None,
              brands: set[str] | None) -> bool | None:
    m = _REQ_RE.match(term.strip())
    if not m:
        return None
    what, op, value = m.groups()
    if what == "brand":
        if brands is None:
            return None
        return (value.lower() in brands) == (op in ("=", "=="))
    have = {"cuda": version_tuple(cuda), "driver": version_tuple(driver),
            "arch": cc_tuple(cc)}[what]
    want = version_tuple(value) if what != "arch" else cc_tuple(value)
    if have is None or want is None:
        return None
    n = max(len(have), len(want))
    a, b = tuple(have) + (0,) * (n - len(have)), tuple(want) + (0,) * (n - len(want))
    return {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "=": a == b, "==": a == b}[op]


def require_cuda_satisfied(text: str, *, driver: str, cuda: str | None, cc: str | None,
                           brands: set[str] | None) -> tuple[bool | None, str]:
    """How the container toolkit judges an NVIDIA_REQUIRE_CUDA string on this host: (True: it starts,
    False: it refuses, None: cannot tell), and the alternative that admits it. Pure."""
    unknown = False
    for alt in text.split():
        results = [_req_term(t, driver=driver, cuda=cuda, cc=cc, brands=brands) for t in alt.split(",")]
        if all(r is True for r in results):
            return True, alt
        if not any(r is False for r in results):
            unknown = True
    return (None if unknown else False), ""


def check_known_issues(rel: EngineRelease, cc: str | None, multimodal: bool) -> Verdict | None:
    """A WARN naming each known engine bug this release has on this card (and model kind) without its
    fix; None when there is none. Pure."""
    t = cc_tuple(cc)
    if t is None or rel.cpu:
        return None
    hits = [i for i in rel.known_issues
            if not i.fixed and cc_in_spec(t, i.cc)[0] and (multimodal or not i.multimodal_only)]
    if not hits:
        return None
    said = "; ".join(f"{i.id} ({i.url}): {i.summary} (confidence {i.confidence}: {i.source})" for i in hits)
    return Verdict("warn", f"{rel.key} on compute capability {cc} has a known issue without its fix: {said}",
                   "use a release that carries the fix (catalog/engines.yaml known_issues), or the workaround the "
                   "issue names")


class DriverHost(TypedDict, total=False):
    """What ``check_cuda_driver`` and ``driver_alternatives`` are told about the host."""

    driver: str | None
    cuda_driver: str | None
    gpu_name: str | None
    cc: str | None
    data_center: bool | None
    toolkit_version: str | None
    runtimes: list[str]
    env: dict[str, str] | None
    default_runtime: str | None
    today: str | None
    kernel_modules: str | None


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
    default_runtime: str | None = None,
    today: str | None = None,
    kernel_modules: str | None = None,
) -> Verdict:
    """Image CUDA vs host driver: native, forward compatibility (data-center card, a listed driver
    branch before its end of life, cuda-compat in the image, a toolkit that loads it), or
    minor-version compatibility (and its PTX-JIT catch). ``today`` is ``YYYY-MM-DD`` (end-of-life
    dates are judged against it; None: not judged)."""
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
    card_gone = check_driver_drives_card(cat, driver, gpu_name, cc, kernel_modules)
    if card_gone is not None:
        return card_gone
    img = cuda_major_minor(rel.cuda)
    min_dv = version_tuple(rel.min_driver) or ()
    native = cuda_major_minor(cuda_driver) or cuda_major_minor(branch_cuda(driver, cat.driver_branches))
    native_s = f"{native[0]}.{native[1]}" if native else "unknown"
    if img is None:
        return Verdict("fail", f"{rel.key}: catalog CUDA version {rel.cuda!r} does not parse", "fix catalog/engines.yaml")
    beyond = _beyond_driver_table(rel, cat, driver=driver, dv=dv, cuda_driver=cuda_driver, native=native, img=img)
    if beyond is not None:
        return beyond
    if native is not None and native >= img:
        if dv >= min_dv:
            return Verdict("pass", f"driver {driver} supports CUDA {native_s}; {rel.key} needs CUDA {rel.cuda} "
                                   f"(driver >= {need}): native")
        return Verdict("warn", f"driver {driver} knows CUDA {native_s} but CUDA {rel.cuda} lists driver >= {need}",
                       f"update the driver within its branch to >= {need}")
    cov = kernel_coverage(rel, str(cc)) if cc_tuple(cc) else None
    card = gpu_name or "the card"
    upgrade = f"upgrade the driver to >= {need} (CUDA {rel.cuda})"
    # 0. The container toolkit's own check of the image's NVIDIA_REQUIRE_CUDA (when read from the image).
    disabled = str((env or {}).get("NVIDIA_DISABLE_REQUIRE", "")).lower() in ("1", "true", "yes")
    refused, admitted = (None, "") if disabled else _require_cuda_verdict(
        rel, cat, driver=driver, cuda_driver=cuda_driver, gpu_name=gpu_name, cc=cc, data_center=data_center,
        toolkit_version=toolkit_version, runtimes=runtimes, env=env, default_runtime=default_runtime, today=today,
        native=native, dv=dv, upgrade=upgrade)
    if refused is not None:
        return refused
    # 1. Forward compatibility: the image's own newer libcuda (full feature set, PTX JIT included).
    fwd_reason, fwd_note = forward_compat_gap(rel, cat, card, data_center, toolkit_version, runtimes, driver,
                                              default_runtime=default_runtime, today=today)
    if fwd_reason is None:
        return Verdict(
            "warn",
            f"driver {driver} supports CUDA {native_s} < {rel.cuda}; {rel.key} runs through forward compatibility "
            f"(its cuda-compat libcuda on data-center {card}; {fwd_note}){admitted}",
            f"{upgrade} for native support",
        )
    # 2. Minor-version compatibility: same major, driver above the floor, a limited feature set.
    floor = cat.minor_compat_floor.get(str(img[0]))
    minor = _minor_compat_verdict(rel, cat, driver=driver, dv=dv, native=native, img=img, cc=cc, card=card,
                                  cov=cov, fwd_reason=fwd_reason, upgrade=upgrade, disabled=disabled,
                                  admitted=admitted)
    if minor is not None:
        return minor
    return Verdict(
        "fail",
        f"driver {driver} supports CUDA {native_s}, but {rel.key} is built for CUDA {rel.cuda} (needs driver >= "
        f"{need}); minor-version compatibility needs the same major and driver >= {floor or '?'}, and forward "
        f"compatibility is out: {fwd_reason}",
        f"{upgrade}, or choose an image built for CUDA <= {native_s}",
    )


def _require_cuda_verdict(
    rel: EngineRelease,
    cat: EngineCatalog,
    *,
    driver: str,
    cuda_driver: str | None,
    gpu_name: str | None,
    cc: str | None,
    data_center: bool | None,
    toolkit_version: str | None,
    runtimes: list[str],
    env: dict[str, str] | None,
    default_runtime: str | None,
    today: str | None,
    native: tuple[int, int] | None,
    dv: tuple[int, ...],
    upgrade: str,
) -> tuple[Verdict | None, str]:
    """The container toolkit's own check of the image's NVIDIA_REQUIRE_CUDA (when known: read from the
    image, images.lock, or the catalog's base): (the FAIL where it refuses the driver, else None; the
    note where an exception admits it, or where an unconfirmed string would refuse it)."""
    if not (rel.require_cuda and rel.nvidia_require_cuda):
        return None, ""
    native_s = f"{native[0]}.{native[1]}" if native else "unknown"
    card = gpu_name or "the card"
    brands = card_brands(gpu_name, data_center)
    ok, alt = require_cuda_satisfied(rel.require_cuda, driver=driver, cuda=native_s if native else None,
                                     cc=cc, brands=brands)
    if ok is False and rel.require_cuda_confidence == "U":
        return None, (f"; the image's NVIDIA_REQUIRE_CUDA ({_require_note(rel)}: unconfirmed) would not admit "
                      f"{card} on driver {driver}: the container may not start (NVIDIA_DISABLE_REQUIRE=1 lifts it)")
    if ok is False:
        first = rel.require_cuda.split()[0]
        listed = sorted({m.group(1) for m in re.finditer(r"brand=([a-z]+)", rel.require_cuda)})
        branches = sorted({int(m.group(1)) for m in re.finditer(r"driver>=(\d+)", rel.require_cuda)})
        brand_s = "/".join(sorted(brands)) if brands else "unknown"
        after = check_cuda_driver(rel, cat, driver=driver, cuda_driver=cuda_driver, gpu_name=gpu_name, cc=cc,
                                  data_center=data_center, toolkit_version=toolkit_version, runtimes=runtimes,
                                  env={**(env or {}), "NVIDIA_DISABLE_REQUIRE": "1"},
                                  default_runtime=default_runtime, today=today)
        return Verdict(
            "fail",
            f"{TOOLKIT_REFUSES} {rel.key} on driver {driver} (CUDA {native_s}): its "
            f"NVIDIA_REQUIRE_CUDA ({_require_note(rel)}) asks {first}, and its exceptions (brand "
            f"{', '.join(listed) or 'none'} on driver branches {', '.join(f'R{b}' for b in branches) or 'none'}) "
            f"do not cover {card} (brand {brand_s}) on R{dv[0]} ({REQUIRE_SOURCE})",
            f"{upgrade}; or set NVIDIA_DISABLE_REQUIRE=1 in the service's env, after which: {after.status.upper()} "
            f"({after.message[:160]})",
        ), ""
    if ok is True and not alt.startswith("cuda"):
        return None, f"; the image's NVIDIA_REQUIRE_CUDA admits it through '{alt}'"
    return None, ""


def _beyond_driver_table(rel: EngineRelease, cat: EngineCatalog, *, driver: str, dv: tuple[int, ...],
                         cuda_driver: str | None, native: tuple[int, int] | None,
                         img: tuple[int, int]) -> Verdict | None:
    """A driver of a branch after the catalog's driver table (engines.yaml driver_branches) with no CUDA
    version read from the host: the table cannot say whether it runs the image natively when the image
    needs more than the table's newest CUDA. A WARN naming where the table ends, never a silent verdict."""
    if cuda_driver or not cat.driver_branches:
        return None
    last = max(cat.driver_branches)
    if dv[0] <= last or (native is not None and native >= img):
        return None
    return Verdict("warn", f"driver {driver} is of a branch after the catalog's driver table, which ends at branch "
                           f"{last} (CUDA {cat.driver_branches[last]}): whether it runs CUDA {rel.cuda} natively is "
                           "not in the table",
                   "read `nvidia-smi` (its CUDA Version) on the host, or add the branch to engines.yaml "
                   "driver_branches from NVIDIA's 'CUDA Toolkit and Corresponding Driver Versions' table "
                   "(https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html)")


def _minor_compat_verdict(
    rel: EngineRelease,
    cat: EngineCatalog,
    *,
    driver: str,
    dv: tuple[int, ...],
    native: tuple[int, int] | None,
    img: tuple[int, int],
    cc: str | None,
    card: str,
    cov: tuple[Literal["sass", "ptx"], str] | None,
    fwd_reason: str,
    upgrade: str,
    disabled: bool,
    admitted: str,
) -> Verdict | None:
    """Minor-version compatibility (same major, driver above the floor, a limited feature set) and its
    PTX-JIT catch; None where it does not apply."""
    native_s = f"{native[0]}.{native[1]}" if native else "unknown"
    floor = cat.minor_compat_floor.get(str(img[0]))
    floor_v = version_tuple(floor) or ()
    same_major = native is not None and native[0] == img[0]
    if not (floor and same_major and dv >= floor_v):
        return None
    if cov is not None and cov[0] == "ptx":
        rule = cat.compat_rules.get("minor_version_ptx_jit")
        return Verdict(
            "fail",
            f"driver {driver} (CUDA {native_s}) runs CUDA {rel.cuda} apps only through minor-version "
            f"compatibility, which does not cover PTX JIT; {rel.key} has only PTX for {card} ({cc}): expect "
            f"cudaErrorUnsupportedPtxVersion at the first kernel{_conf(rule)}; forward compatibility is out: "
            f"{fwd_reason}",
            f"{upgrade}, or use an image with SASS for {_sm(str(cc))} built for CUDA <= {native_s} "
            "(e.g. llamacpp:b5000-cu122)",
        )
    special = _engine(rel).minor_version_verdict(rel, cat, driver=driver, native=native_s, card=card,
                                                 fwd_reason=fwd_reason, upgrade=upgrade)
    require = _require_text(rel, disabled, admitted)
    if special is not None:
        return Verdict(special.status, special.message + require, special.fix) if special.status == "warn" else special
    kernel = f"SASS for {_sm(cov[1])}, no PTX JIT needed" if cov is not None else "SASS"
    return Verdict(
        "warn",
        f"driver {driver} (CUDA {native_s}) runs CUDA {rel.cuda} only through minor-version compatibility "
        f"(CUDA {img[0]}.x from driver {floor}; limited feature set; {rel.key} has {kernel} on {card}){require}",
        f"{upgrade} for native support",
    )


def _require_text(rel: EngineRelease, disabled: bool, admitted: str) -> str:
    """What a minor-version WARN says of the image's NVIDIA_REQUIRE_CUDA."""
    if not rel.nvidia_require_cuda:
        require = "; the image sets no NVIDIA_REQUIRE_CUDA or CUDA_VERSION, so the NVIDIA runtime does not refuse the driver"
    elif disabled:
        require = ""
    elif admitted:
        require = admitted
    elif rel.require_cuda:
        require = (f"; the image's NVIDIA_REQUIRE_CUDA ({_require_note(rel)}) could not be judged here (the card's "
                   "brand or the driver's CUDA is not known) and may stop the container (NVIDIA_DISABLE_REQUIRE=1 "
                   "lifts it)")
    else:
        require = ("; the image's NVIDIA_REQUIRE_CUDA is not known (no base string in catalog cuda_bases.yaml; "
                   "`invoke images.inspect` reads it) and may stop the container (NVIDIA_DISABLE_REQUIRE=1 lifts it)")
    return require


def driver_alternatives(rel: EngineRelease, cat: EngineCatalog, **host: Unpack[DriverHost]) -> list[str]:
    """What a host whose driver cannot run ``rel`` can do instead (pure; ``host`` takes the keyword
    arguments of ``check_cuda_driver``): the catalog images that do run on this driver and card today
    (the same engine first), the driver that runs the nearest image of the same engine (through
    minor-version compatibility, and natively), and for vLLM what exists for CUDA 11.8 (wheels only)."""
    cc = host.get("cc")
    out: list[str] = []
    runs: list[tuple[bool, str]] = []
    running: set[str] = set()
    from llmfleet.inventory.services import NON_ENGINE_KINDS

    for key, other in cat.images.items():
        if other.cpu or key == rel.key or other.engine in NON_ENGINE_KINDS:
            continue
        if check_architecture(other, host.get("gpu_name"), cc).status == "fail":
            continue
        v = check_cuda_driver(other, cat, **host)
        if v.status != "fail":
            how = "natively" if v.status == "pass" else (
                "through forward compatibility" if "forward compatibility (" in v.message
                else "through minor-version compatibility")
            runs.append((other.engine != rel.engine, f"{key} (CUDA {other.cuda}, {how})"))
            running.add(key)
    if runs:
        out.append("runs on this driver today: " + ", ".join(text for _, text in sorted(runs)))
    dv = version_tuple(host.get("driver"))
    floors: dict[bool, list[tuple[tuple[int, ...], str]]] = {True: [], False: []}
    for key, other in cat.images.items():
        if other.cpu or key in running or other.engine in NON_ENGINE_KINDS or check_architecture(other, host.get("gpu_name"), cc).status == "fail":
            continue
        img = cuda_major_minor(other.cuda)
        floor = cat.minor_compat_floor.get(str(img[0])) if img else None
        cov = kernel_coverage(other, str(cc)) if cc_tuple(cc) else None
        native = version_tuple(other.min_driver) or ()
        same = other.engine == rel.engine
        if floor and img and cov is not None and cov[0] == "sass" and (dv is None or (version_tuple(floor) or ()) > dv):
            floors[same].append((version_tuple(floor) or (), f"driver >= {floor} runs {key} through CUDA {img[0]}.x "
                                                            f"minor-version compatibility, >= {other.min_driver} natively"))
        elif dv is None or native > dv:
            floors[same].append((native, f"driver >= {other.min_driver} runs {key} natively"))
    upgrades = [min(floors[True])] if floors[True] else []
    if floors[False] and (not upgrades or min(floors[False])[0] < upgrades[0][0]):
        upgrades.append(min(floors[False]))
    if upgrades:
        out.append("upgrade: " + "; or ".join(text for _, text in upgrades))
    wheels = cat.vllm_cuda11_wheels
    if rel.engine == "vllm" and wheels is not None:
        known = [r.versions for r in wheels.releases if r.confidence != "U"]
        out.append(f"vLLM {', '.join(known)} published CUDA 11.8 wheels on GitHub releases only (not PyPI, no image); "
                   "deploying one means building an image of your own")
    return out


def _conf(rule: CompatRule | None) -> str:
    return f" (rule confidence {rule.confidence})" if rule is not None else ""


def toolkit_row(cat: EngineCatalog, toolkit_version: str | None) -> ToolkitRow | None:
    """The forward-compat toolkit row for an nvidia-container-toolkit version (None: unknown version)."""
    tk = version_tuple(re.sub(r"[-~+].*$", "", toolkit_version or ""))
    if tk is None:
        return None
    for row in cat.forward_compat.toolkit:
        if row.below is None or tk < (version_tuple(row.below) or ()):
            return row
    return None


def forward_compat_gap(rel: EngineRelease, cat: EngineCatalog, card: str, data_center: bool | None,
                       toolkit_version: str | None, runtimes: list[str], driver: str | None = None, *,
                       default_runtime: str | None = None, today: str | None = None) -> tuple[str | None, str]:
    """(why forward compatibility does not apply here or None, what it rests on)."""
    if data_center is None:
        return f"{card} is not in the GPU catalog, so it cannot be assumed a data-center part", ""
    if not data_center:
        return (f"{card} is not a data-center GPU: forward compatibility covers only those, elsewhere CUDA "
                f"returns cudaErrorCompatNotSupportedOnDevice (804){_conf(cat.compat_rules.get('forward_compat_gpu'))}"), ""
    if not rel.cuda_compat_in_image:
        return f"{rel.key} ships no cuda-compat package", ""
    notes: list[str] = []
    dv = version_tuple(driver) if driver else None
    if dv is not None:
        branch = cat.forward_compat.branches.get(dv[0])
        if branch is None or branch.designation == "NFB":
            listed = ", ".join(f"R{b}" for b, s in sorted(cat.forward_compat.branches.items())
                               if s.designation != "NFB")
            return (f"driver branch R{dv[0]} is not a long-term-support or production branch, and NVIDIA supports "
                    f"forward compatibility only on those ({listed}){_conf(cat.compat_rules.get('forward_compat_branch'))}"), ""
        past = bool(today) and branch.eol < str(today)[:7]
        if past and branch.confidence != "U":
            return (f"driver branch R{dv[0]} ({branch.designation}) reached its end of life in {branch.eol} "
                    f"(confidence {branch.confidence}: {branch.source}); NVIDIA no longer supports forward "
                    "compatibility on it"), ""
        if past:  # an end of life no source confirms cannot refuse: it is said, and the verdict stays a WARN
            notes.append(f"branch R{dv[0]} {branch.designation}, end of life {branch.eol} unconfirmed ({branch.source})")
        else:
            notes.append(f"branch R{dv[0]} {branch.designation} until {branch.eol}"
                         + ("" if branch.confidence != "U" else " (end of life unconfirmed)"))
    row = toolkit_row(cat, toolkit_version)
    if row is None:
        return f"nvidia-container-toolkit version unknown (seen {toolkit_version or 'none'})", ""
    if row.how == "none":
        return (f"nvidia-container-toolkit {toolkit_version} does not load a container's compat libraries "
                f"({row.source})"), ""
    if row.how == "runtime" and default_runtime != "nvidia":
        how = "registered but not Docker's default runtime" if "nvidia" in runtimes else "not registered in Docker"
        return (f"nvidia-container-toolkit {toolkit_version} loads the compat libcuda only when the `nvidia` runtime "
                f"runs the container, and it is {how} (the release uses Docker's default runtime) ({row.source})"), ""
    notes.append(f"toolkit {toolkit_version}: {row.how} (confidence {row.confidence})")
    return None, "; ".join(notes)


def quant_methods(rules: EngineRules, rel: EngineRelease, quant: str | None, args: list[str]) -> tuple[str, list[str]]:
    """(what was asked, candidate methods) for the service's quant and any --quantization flag."""
    flag = _arg_value(args, "--quantization", "-q")
    if flag and rules.quantization_flag.get(flag.lower()) != "from-quant":
        method = rules.quantization_flag.get(flag.lower())
        return f"--quantization {flag}", ([method] if isinstance(method, str) else list(method)) if method else []
    q = (quant or _engine(rel).default_quant).lower()
    return q, list(rules.quant_methods.get(q, []))


def quant_method_for(rel: EngineRelease, rules: EngineRules, quant: str | None, args: list[str],
                     cc: str | None) -> str | None:
    """The method the engine will use for this quant on this card (the first usable one), or None.
    The one source for which kernel runs (e.g. GPTQ -> gptq_marlin from the release's Marlin floor)."""
    _, methods = quant_methods(rules, rel, quant, args)
    t = cc_tuple(cc)
    if t is None or not methods:
        return None
    if _engine(rel).quant_runs_on_any_card or rel.cpu:
        return methods[0]
    usable = [m for m in methods if _cc_ok(t, rel.quantizations.get(m))]
    return usable[0] if usable else None


def check_quantization(rel: EngineRelease, rules: EngineRules, quant: str | None, args: list[str],
                       cc: str | None) -> Verdict:
    eng = _engine(rel)
    asked, methods = quant_methods(rules, rel, quant, args)
    if not methods:
        known = ", ".join(sorted(rules.quantization_flag if asked.startswith("--") else rules.quant_methods))
        return Verdict("fail", f"{rel.engine} does not know quantization {asked!r}{eng.quant_unknown_note}",
                       f"use one of: {known}")
    if rel.cpu or eng.quant_runs_on_any_card:
        return Verdict("pass", f"{asked}: {rel.engine} runs it" + (" (CPU image)" if rel.cpu else " on any CUDA card"))
    t = cc_tuple(cc)
    if t is None:
        return Verdict("warn", f"{asked}: compute capability unknown, cannot check the kernels",
                       "add the card to catalog/gpus.yaml")
    usable = [m for m in methods if _cc_ok(t, rel.quantizations.get(m))]
    if not usable:
        need = ", ".join(f"{m} needs {rel.quantizations[m]}" if m in rel.quantizations
                         else _not_in_release(rules, m) for m in methods)
        gone = [rules.quant_removed[m] for m in methods if m not in rel.quantizations and m in rules.quant_removed]
        return Verdict(
            "fail",
            f"{asked} does not run on compute capability {cc} in {rel.key} ({need})",
            _removed_fix(rel, gone[0]) if gone else _quant_fix(t),
        )
    if usable[0] != methods[0]:
        note = f"{asked}: {methods[0]} needs {rel.quantizations.get(methods[0])}; the engine uses {usable[0]} on {cc}"
        if usable[0] == "fp8_marlin":
            return Verdict("warn", note + " (weight-only FP8, W8A16: no FP8 compute on this card)",
                           "fine to run; for FP8 compute use a card with compute capability >= 8.9")
        return Verdict("pass", note)
    return Verdict("pass", f"{asked}: {usable[0]} runs on compute capability {cc}")


def _not_in_release(rules: EngineRules, method: str) -> str:
    gone = rules.quant_removed.get(method)
    if gone is None:
        return f"{method} is not in this release"
    return f"{method} is not in this release: removed in {gone.removed_in}, {gone.ref}"


def _removed_fix(rel: EngineRelease, gone: QuantRemoved) -> str:
    other = " or GGUF with llama.cpp" if rel.engine != "llamacpp" else ""
    return f"use {gone.last}, the last {rel.engine} release with it (--image {gone.last}){other}, or another quantization"


def _quant_fix(cc: tuple[int, int]) -> str:
    if cc < (7, 5):
        return "on Volta use GPTQ (e.g. gptq-int4 with --quantization gptq), bitsandbytes, or GGUF with llama.cpp"
    if cc < (8, 9):
        return "FP8 W8A8 needs compute capability 8.9: use int8, gptq-int4 or awq-int4"
    return "choose a quantization listed for this card in catalog/engines.yaml"


def check_dtype(rel: EngineRelease, rules: EngineRules, quant: str | None, args: list[str],
                cc: str | None, bf16_native: bool | None = None) -> Verdict:
    """No bf16 below compute capability 8.0 (the engine module says how its flags ask for bf16)."""
    return _engine(rel).check_dtype(rel, rules, quant, args, cc, bf16_native)


def effective_backend(rel: EngineRelease, args: list[str], env: dict[str, str], cc: str | None) -> str | None:
    return _engine(rel).effective_backend(rel, args, env, cc)


def check_attention(rel: EngineRelease, args: list[str], env: dict[str, str], cc: str | None) -> Verdict:
    return _engine(rel).check_attention(rel, args, env, cc)


def check_kv_dtype(rel: EngineRelease, rules: EngineRules, kv_dtype: str | None, args: list[str],
                   env: dict[str, str], cc: str | None, head_dim: int | None = None) -> Verdict:
    """The KV dtype verdict; with ``head_dim`` (the model's) also whether the build has kernels for that
    cache at that head size (``EngineKnowledge.check_kv_head``)."""
    v = _engine(rel).check_kv_dtype(rel, rules, kv_dtype, args, env, cc)
    if v.status == "fail" or head_dim is None:
        return v
    head = _engine(rel).check_kv_head(rel, rules, kv_dtype, args, head_dim)
    return head if head is not None and (head.status == "fail" or v.status == "pass") else v


def flag_checks(rel: EngineRelease, rules: EngineRules, *, quant: str | None, kv_dtype: str | None,
                args: list[str], env: dict[str, str] | None, cc: str | None,
                bf16_native: bool | None = None, head_dim: int | None = None) -> dict[str, Verdict]:
    """The preflight's flag rules for one set of engine flags on one card (quant, dtype, attention,
    kv-dtype), keyed by check id. Pure: the planner runs every alternative it ranks through it."""
    env = dict(env or {})
    return {
        "quant": check_quantization(rel, rules, quant, args, cc),
        "dtype": check_dtype(rel, rules, quant, args, cc, bf16_native),
        "attention": check_attention(rel, args, env, cc),
        "kv-dtype": check_kv_dtype(rel, rules, kv_dtype, args, env, cc, head_dim),
    }


# ---------------------------------------------------------------------------------------------
# Which engine an image serves


class LockLookup(Protocol):
    """What the image/engine check needs of images.lock (``images.lock.ImageLock``): an entry by key,
    whose ``engine`` (when it has one) names the engine the image serves."""

    def get(self, key: str) -> object | None: ...


def image_engine(image: str, lock: LockLookup | None = None) -> str | None:
    """The engine an image key serves: its images.lock entry's engine, else the engine catalog's
    (engines.yaml), else the key's ENGINE: prefix when it names a known engine; None for a full
    reference (``repo@sha256:...``) nothing describes."""
    from llmfleet.knowledge import engines

    locked = lock.get(image) if lock is not None else None
    locked_engine = getattr(locked, "engine", None)  # an entry pinned before engines were recorded has none
    if locked_engine:
        return str(locked_engine)
    release = load_engine_catalog().release(image)
    if release is not None:
        return release.engine
    head, sep, _ = image.partition(":")
    return head if sep and "/" not in head and head in engines.names() else None


def image_engine_mismatch(image: str, engine: str, lock: LockLookup | None = None) -> str | None:
    """One line when ``image`` is another engine's image than the service's ``engine`` (a llama.cpp
    service given ``vllm:0.19.1`` would start vLLM with llama-server's flags); None when it fits."""
    found = image_engine(image, lock)
    if found is None or found == engine:
        return None
    return (f"image {image!r} is a {found} image, but the service's engine is {engine}; give a {engine} image "
            f"(`invoke images.list` shows them) or set engine: {found}")
