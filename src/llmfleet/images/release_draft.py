"""Draft an engine-catalog entry (catalog/engines.yaml ``images:``) from what a vLLM release publishes.

``invoke catalog.release vllm==X`` fetches the release's wheel from the package index pip is
configured for (``pip download --no-deps``), reads

- its ``METADATA``: the exact torch pin (``Requires-Dist: torch==...``);
- the GPU architectures of its CUDA libraries (``vllm/*.so``) with llmfleet's fatbin reader: the
  core ``_C`` library is the kernel list a card needs (every model calls it); the others (flash
  attention, MLA, MoE, ...) are listed per library;

then fetches the torch wheel of that pin the same way and reads

- its ``METADATA``: the CUDA runtime it was built against (``nvidia-cuda-runtime*==X.Y.Z``);
- the architectures of ``torch/lib/libtorch_cuda.so``: the torch build's arch list, in
  TORCH_CUDA_ARCH_LIST notation (``"12.0+PTX"`` where it also carries PTX).

Every field of the draft names its source (the wheel file) and a confidence. What a wheel does not
publish (attention backends, quantization floors, the image's exact toolkit update) is left out and
listed under ``not_drafted``. Pure: this module takes the files' contents; fetching and reading the
files (``pip download``, the wheel's zip, a llama.cpp checkout, the draft file) is
``llmfleet.images.published``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.images import fatbin, vllm_rules
from llmfleet.knowledge.compat import parse_archs

REPOSITORY = {"vllm": "docker.io/vllm/vllm-openai"}
CORE_LIBRARY = re.compile(r"^vllm/_C(?:_stable_libtorch)?(?:\.abi3|\.cpython[^/]*)?\.so$")
TORCH_LIBRARY = "torch/lib/libtorch_cuda.so"


@dataclass
class Wheel:
    """What llmfleet reads from one wheel: its file name, METADATA text and the archs of its .so files."""

    filename: str
    metadata: str
    libraries: dict[str, LibArchs] = field(default_factory=dict)  # path -> its archs
    texts: dict[str, str] = field(default_factory=dict)  # path -> source text of the files rules are read from


@dataclass
class LibArchs:
    """The fatbin of one shared library: containers (one per object file nvcc linked in) and, per
    arch, how many of them carry SASS / PTX for it."""

    containers: int = 0
    sass: dict[str, int] = field(default_factory=dict)
    ptx: dict[str, int] = field(default_factory=dict)

    def archs(self, share: float = 0.0) -> tuple[list[str], list[str]]:
        """(SASS, PTX) archs carried by more than ``share`` of the containers (0: by any), sorted."""
        def pick(counts: dict[str, int]) -> list[str]:
            return sorted((a for a, n in counts.items() if n > share * self.containers or (share >= 1 and
                                                                                          n == self.containers)),
                          key=_cc_key)
        return pick(self.sass), pick(self.ptx)

    def partial(self, share: float) -> list[str]:
        """The archs carried by ``share`` of the containers or fewer: "SASS 8.9 in 1 of 444"."""
        out = []
        for kind, counts in (("SASS", self.sass), ("PTX", self.ptx)):
            for a in sorted(counts, key=_cc_key):
                n = counts[a]
                if not (n > share * self.containers or (share >= 1 and n == self.containers)):
                    out.append(f"{kind} {a} in {n} of {self.containers}")
        return out


def parse_spec(text: str) -> tuple[str, str]:
    """``vllm==0.33.0`` -> ("vllm", "0.33.0"). Only vLLM releases are drafted from wheels."""
    m = re.fullmatch(r"\s*(vllm)\s*==\s*([0-9][0-9A-Za-z.+-]*)\s*", text or "")
    if not m:
        raise UsageError(f"expected vllm==VERSION (vllm==0.33.0) or llamacpp@TAG (llamacpp@b7000), got {text!r}")
    return m.group(1), m.group(2)


def requires(metadata: str, name: str) -> str | None:
    """The exact pin (``==X``) of ``name`` in a METADATA's unconditional Requires-Dist lines."""
    want = name.lower().replace("_", "-")
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec = line.split(":", 1)[1].strip()
        if ";" in spec and "extra ==" in spec.split(";", 1)[1]:
            continue
        m = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*\(?\s*==\s*([^\s,;)]+)", spec)
        if m and m.group(1).lower().replace("_", "-") == want:
            return m.group(2)
    return None


def metadata_field(metadata: str, key: str) -> str | None:
    for line in metadata.splitlines():
        if line.startswith(f"{key}:"):
            return line.split(":", 1)[1].strip()
        if not line.strip():
            break  # headers end at the first blank line
    return None


def torch_cuda(metadata: str) -> str | None:
    """The CUDA runtime a torch wheel was built against, "major.minor", from its nvidia-* pins
    (``nvidia-cuda-runtime-cu12==12.8.90``, ``nvidia-cuda-runtime==13.0.96``)."""
    for line in metadata.splitlines():
        m = re.match(r"Requires-Dist:\s*nvidia-cuda-runtime(?:-cu\d+)?\s*\(?==\s*(\d+)\.(\d+)", line)
        if m:
            return f"{m.group(1)}.{m.group(2)}"
    for line in metadata.splitlines():
        m = re.match(r"Requires-Dist:\s*cuda-toolkit(?:\[[^\]]*\])?\s*\(?==\s*(\d+)\.(\d+)", line)
        if m:
            return f"{m.group(1)}.{m.group(2)}"
    return None


def library_archs(data: bytes) -> LibArchs:
    """The fatbin archs of one shared library (nothing for a file that is not ELF)."""
    try:
        return LibArchs(*fatbin.arch_shares(data))
    except fatbin.NotElf:
        return LibArchs()


def min_driver_for(cuda: str | None, toolkits: dict[str, list[str]]) -> str | None:
    """The GA row of the CUDA toolkit table for "major.minor" (a later update of the toolkit may need more)."""
    rows = toolkits.get(cuda or "")
    return rows[0] if rows else None


def _file_source(w: Wheel) -> str:
    name = re.match(r"([^-]+)-([^-]+)-", w.filename)
    project, version = (name.group(1), name.group(2)) if name else ("", "")
    return f"PyPI {project} {version}: {w.filename}"


# vLLM's core library is built for its arch list, but many of its object files only for some of it
# (Marlin from 8.0, CUTLASS sm90a/sm100a kernels): an arch is the library's when at least a quarter
# of its object files carry it; rarer ones (a PTX fallback of a few kernels) are listed as partial.
VLLM_SHARE = 0.25
# torch builds every object file of libtorch_cuda for TORCH_CUDA_ARCH_LIST; arch-specific extras
# (sm_103a, sm_121a kernels) are in a few files only: the build's list is what every file carries.
TORCH_SHARE = 1.0


def core_libraries(vllm: Wheel) -> dict[str, LibArchs]:
    """The wheel's core ``_C`` library (its archs); UsageError when it carries no CUDA kernels."""
    core = {p: a for p, a in vllm.libraries.items() if CORE_LIBRARY.match(p)}
    if not any(a.containers for a in core.values()):
        raise UsageError(f"{vllm.filename}: no CUDA kernels in vllm/_C (a CPU or non-CUDA wheel); nothing written")
    return core


def draft_vllm(vllm: Wheel, torch: Wheel | None, toolkits: dict[str, list[str]]) -> dict[str, Any]:
    """The draft of a vLLM release entry from its wheel and its torch wheel (None: not read).

    Returns {"key", "entry" (the engines.yaml fields drafted), "provenance" (field -> {source,
    confidence}), "libraries" (every .so -> sass/ptx), "not_drafted" (fields to write by hand)}.
    Raises UsageError when the vLLM wheel has no CUDA kernels."""
    version = metadata_field(vllm.metadata, "Version") or ""
    src = _file_source(vllm)
    core = core_libraries(vllm)
    sass = sorted({a for lib in core.values() for a in lib.archs(VLLM_SHARE)[0]}, key=_cc_key)
    ptx = sorted({a for lib in core.values() for a in lib.archs(VLLM_SHARE)[1]}, key=_cc_key)
    partial = [p for lib in core.values() for p in lib.partial(VLLM_SHARE)]
    containers = sum(lib.containers for lib in core.values())
    core_names = ", ".join(sorted(core))
    torch_pin = requires(vllm.metadata, "torch")
    prov: dict[str, dict[str, str]] = {
        "version": {"source": f"{src}, METADATA Version", "confidence": "H"},
        "kernels": {"source": f"{src}, {core_names}: .nv_fatbin read by llmfleet.images.fatbin, {containers} "
                              f"object files (SASS {' '.join(sass) or '-'}; PTX {' '.join(ptx) or '-'}; an arch counts "
                              f"when over {VLLM_SHARE:.0%} of them carry it"
                              + (f"; partial: {', '.join(partial)}" if partial else "") + ")",
                    "confidence": "H"},
        "tag": {"source": "vLLM's image tags are v<version> (docker.io/vllm/vllm-openai)", "confidence": "M"},
    }
    entry: dict[str, Any] = {
        "engine": "vllm", "version": version, "repository": REPOSITORY["vllm"], "tag": f"v{version}", "cpu": False,
    }
    torch_entry: dict[str, Any] = {"version": torch_pin}
    # quantizations: the methods and their configs' floors are read (``rules``), llmfleet's own floors per
    # method (Marlin below the native kernels...) are written by hand; attention: the floors, the KV dtypes
    # per backend and the capabilities of their fp8 KV are read (``rules``), the catalog block is written
    # from them by hand
    not_drafted = ["quantizations", "attention", "v1_min_cc", "kv_layout", "image_size_mib"]
    rules = vllm_rules.read_rules(vllm.texts)
    if rules.architectures:
        prov["architectures"] = {"source": f"{src}, {vllm_rules.REGISTRY}: _TEXT_GENERATION_MODELS and "
                                           f"_MULTIMODAL_MODELS keys ({len(rules.architectures)})", "confidence": "H"}
    if rules.methods:
        prov["quantization_methods"] = {"source": f"{src}, {vllm_rules.QUANT_INIT}: QuantizationMethods "
                                                  f"({len(rules.methods)} methods)", "confidence": "H"}
    read_floors = {k: v for k, v in rules.floors.items() if v is not None}
    if read_floors:
        prov["attention_floors"] = {"source": f"{src}, {vllm_rules.BACKENDS_DIR}*.py: each backend's "
                                              "supports_compute_capability", "confidence": "H"}
    kv_dtypes = {k: list(v) if v is not None else None for k, v in rules.kv_dtypes.items()}
    if kv_dtypes:
        prov["kv_dtypes"] = {"source": f"{src}, {vllm_rules.BACKENDS_DIR}*.py: each backend's "
                                       "supported_kv_cache_dtypes and supports_kv_cache_dtype (null: no list, "
                                       "every dtype)", "confidence": "H"}
    fp8_kv = {k: v for k, v in rules.kv_fp8_cc.items() if v is not None}
    if rules.kv_fp8_cc:
        unread = sorted(k for k, v in rules.kv_fp8_cc.items() if v is None)
        prov["fp8_kv_cc"] = {"source": f"{src}, {vllm_rules.BACKENDS_DIR}*.py: each backend's fp8 branch of "
                                       "supports_kv_cache_dtype, the fa_utils helper it calls and an fp8 "
                                       "`if ... raise` (a capability test of a known pattern; 'any': none)"
                                       + (f"; not read: {', '.join(unread)}" if unread else ""),
                             "confidence": "H"}
    if torch_pin:
        prov["torch.version"] = {"source": f"{src}, METADATA 'Requires-Dist: torch=={torch_pin}'", "confidence": "H"}
    else:
        prov["torch.version"] = {"source": f"{src}: METADATA pins no torch version", "confidence": "U"}
    cuda = None
    if torch is not None:
        tsrc = _file_source(torch)
        cuda = torch_cuda(torch.metadata)
        lib = torch.libraries.get(TORCH_LIBRARY)
        if lib is not None and lib.containers:
            tpartial = lib.partial(TORCH_SHARE)
            torch_entry["archs"] = fatbin.lock_archs(*lib.archs(TORCH_SHARE))
            prov["torch.archs"] = {"source": f"{tsrc}, {TORCH_LIBRARY}: .nv_fatbin read by llmfleet.images.fatbin: "
                                             f"the archs all {lib.containers} object files carry"
                                             + (f" (arch-specific extras: {', '.join(tpartial)})" if tpartial else ""),
                                   "confidence": "H"}
        else:
            prov["torch.archs"] = {"source": f"{tsrc}: no {TORCH_LIBRARY} with CUDA kernels", "confidence": "U"}
            not_drafted.append("torch.archs")
        if cuda:
            torch_entry["cuda"] = cuda
            prov["torch.cuda"] = {"source": f"{tsrc}, METADATA nvidia-cuda-runtime pin", "confidence": "H"}
    else:
        not_drafted.append("torch.archs")
    if cuda:
        entry["cuda"] = cuda
        prov["cuda"] = {"source": "the CUDA of the torch wheel vLLM pins (its published image builds on the same "
                                  "CUDA; the exact toolkit update is in vLLM's docker/versions.json, not read)",
                        "confidence": "M"}
        driver = min_driver_for(cuda, toolkits)
        if driver:
            entry["min_driver"] = driver
            prov["min_driver"] = {"source": f"CUDA {cuda} GA row of engines.yaml cuda_toolkits (a later toolkit "
                                            "update in the image may need a later driver)", "confidence": "M"}
    else:
        not_drafted += ["cuda", "min_driver"]
    entry["cuda_compat_in_image"] = True
    prov["cuda_compat_in_image"] = {"source": "vLLM's images build on nvidia/cuda bases, which carry cuda-compat",
                                    "confidence": "M"}
    entry["kernels"] = {"sass": sass, "ptx": ptx}
    torch_conf = "H" if torch_pin and "archs" in torch_entry else ("M" if torch_pin else "U")
    entry["torch"] = {**torch_entry, "confidence": torch_conf,
                      "sources": [f"{k}: {v['source']} ({v['confidence']})" for k, v in prov.items()
                                  if k.startswith("torch.")]}
    entry["confidence"] = "H" if torch_conf == "H" else "M"
    entry["sources"] = [f"kernels: {prov['kernels']['source']} (H)",
                        *([f"cuda {cuda}, min_driver: {prov['cuda']['source']}; {prov['min_driver']['source']} (M)"]
                          if cuda and "min_driver" in prov else [])]
    libs = {p: {"sass": lib.archs()[0], "ptx": lib.archs()[1], "containers": lib.containers}
            for p, lib in sorted(vllm.libraries.items())}
    return {"key": f"vllm:{version}", "entry": entry, "provenance": prov, "libraries": libs,
            "not_drafted": not_drafted,
            "rules": {"quantization_methods": list(rules.methods), "attention_floors": read_floors,
                      "quantization_min_capability": dict(rules.min_capability),
                      "architectures": list(rules.architectures), "kv_dtypes": kv_dtypes, "fp8_kv_cc": fp8_kv}}


def _cc_key(cc: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", cc))


DRAFT_HEADER = ("# Drafts of catalog/engines.yaml `images:` entries, written by `catalog.release`. llmfleet does not\n"
                "# read this file: copy an entry into the catalog after adding what a wheel does not publish\n"
                "# (not_drafted), and keep its provenance as the entry's sources.\n")


def render_drafts(drafts: list[dict[str, Any]]) -> str:
    """YAML: images (key -> entry), provenance, libraries and not_drafted per key."""
    import yaml

    doc = {
        "images": {d["key"]: d["entry"] for d in drafts},
        "provenance": {d["key"]: d["provenance"] for d in drafts},
        "not_drafted": {d["key"]: d["not_drafted"] for d in drafts},
        "rules": {d["key"]: d["rules"] for d in drafts if d.get("rules")},
        "libraries": {d["key"]: {p: f"sass {' '.join(a['sass']) or '-'}; ptx {' '.join(a['ptx']) or '-'}"
                                 for p, a in d["libraries"].items() if a.get("containers", 1)} for d in drafts},
    }
    return yaml.safe_dump(doc, sort_keys=False, width=120, allow_unicode=True)


def parse_library_line(text: str) -> dict[str, list[str]]:
    m = re.fullmatch(r"sass (.*); ptx (.*)", str(text))
    if not m:
        return {"sass": [], "ptx": []}
    return {k: [] if v == "-" else v.split() for k, v in zip(("sass", "ptx"), m.groups(), strict=True)}


# ------------------------------------------------------------------------------------------------
# llama.cpp: a tag publishes no wheel; its image is built by .devops/cuda.Dockerfile with the CMake
# defaults of ggml/src/ggml-cuda/CMakeLists.txt. Both are read from a checkout of the tag.

LLAMACPP_REPOSITORY = "ghcr.io/ggml-org/llama.cpp"
CUDA_CMAKE = "ggml/src/ggml-cuda/CMakeLists.txt"
GGML_CMAKE = "ggml/CMakeLists.txt"
CUDA_DOCKERFILE = ".devops/cuda.Dockerfile"
FATTN = "ggml/src/ggml-cuda/fattn.cu"
FATTN_COMMON = "ggml/src/ggml-cuda/fattn-common.cuh"  # on_no_fattn_vec_case (the abort) lives here
GGML_CUDA = "ggml/src/ggml-cuda/ggml-cuda.cu"
GGML_H = "ggml/include/ggml.h"
LLAMA_ARCH = "src/llama-arch.cpp"
LLAMACPP_FILES = (CUDA_DOCKERFILE, CUDA_CMAKE, GGML_CMAKE, FATTN, FATTN_COMMON, GGML_CUDA, GGML_H, LLAMA_ARCH)


def parse_llamacpp_spec(text: str) -> str | None:
    """``llamacpp@b7000`` (or ``llama.cpp@b7000``) -> "b7000"; None for another spec."""
    m = re.fullmatch(r"\s*llama(?:\.)?cpp\s*@\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*", text or "")
    return m.group(1) if m else None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _cmake_condition(cond: str, cuda: str, options: dict[str, bool]) -> bool:
    """A CMake if() condition of the arch block: AND/OR/NOT of options and VERSION_* comparisons of
    CUDAToolkit_VERSION (CMAKE_VERSION comparisons: a recent CMake, true)."""
    def atom(text: str) -> bool:
        text = text.strip().strip("()").strip()
        if text.startswith("NOT "):
            return not atom(text[4:])
        m = re.fullmatch(r'(\w+)\s+(VERSION_LESS|VERSION_LESS_EQUAL|VERSION_GREATER|VERSION_GREATER_EQUAL|'
                         r'VERSION_EQUAL)\s+"?([\d.]+)"?', text)
        if m:
            if m.group(1) != "CUDAToolkit_VERSION":
                return True
            a, b = _version(cuda), _version(m.group(3))
            n = max(len(a), len(b))
            a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
            return {"VERSION_LESS": a < b, "VERSION_LESS_EQUAL": a <= b, "VERSION_GREATER": a > b,
                    "VERSION_GREATER_EQUAL": a >= b, "VERSION_EQUAL": a == b}[m.group(2)]
        return options.get(text, False)

    return any(all(atom(a) for a in re.split(r"\s+AND\s+", part)) for part in re.split(r"\s+OR\s+", cond))


def cmake_default_archs(text: str, cuda: str, options: dict[str, bool] | None = None) -> list[str] | None:
    """CMAKE_CUDA_ARCHITECTURES as ggml-cuda's CMakeLists.txt sets it when none is given, for a
    CUDA toolkit version (GGML_NATIVE off, as the Dockerfile builds); None when the file has no such
    block. 12X archs are rewritten to 12Xa where the file does so."""
    opts = {"GGML_NATIVE": False, **(options or {})}
    start = re.search(r"if\s*\(\s*NOT\s+DEFINED\s+CMAKE_CUDA_ARCHITECTURES\s*\)", text)
    if not start:
        return None
    archs: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this branch active, some branch of this if taken)
    depth_active = True
    for raw in text[start.end():].splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"(if|elseif)\s*\((.*)\)\s*$", line)
        if m and m.group(1) == "if":
            ok = depth_active and _cmake_condition(m.group(2), cuda, opts)
            stack.append((ok, ok))
            depth_active = ok
            continue
        if m:  # elseif
            if not stack:
                break
            _, taken = stack.pop()
            parent = all(a for a, _ in stack)
            ok = parent and not taken and _cmake_condition(m.group(2), cuda, opts)
            stack.append((ok, taken or ok))
            depth_active = ok
            continue
        if re.match(r"else\s*\(", line):
            if not stack:
                break
            _, taken = stack.pop()
            ok = all(a for a, _ in stack) and not taken
            stack.append((ok, True))
            depth_active = ok
            continue
        if re.match(r"endif\s*\(", line):
            if not stack:
                break  # the end of the NOT DEFINED block
            stack.pop()
            depth_active = all(a for a, _ in stack)
            continue
        if not depth_active:
            continue
        m = re.match(r"(list\s*\(\s*APPEND|set\s*\()\s*CMAKE_CUDA_ARCHITECTURES\s+(.*)\)\s*$", line)
        if m:
            # a CMake list is one string of ;-separated items: "50;61;70;75;80"
            values = [x for v in m.group(2).split() for x in v.strip('"').split(";") if x]
            archs = archs + values if m.group(1).startswith("list") else values
    if re.search(r"12\[0-9\].*a", text) and re.search(r"REGEX REPLACE", text):
        archs = [re.sub(r"^(12\d)((?:-real|-virtual)?)$", r"\1a\2", a) for a in archs]
    return archs


def _cmake_option(text: str, name: str) -> bool | None:
    m = re.search(rf'option\s*\(\s*{name}\s+"[^"]*"\s+(ON|OFF)\s*\)', text)
    return None if m is None else m.group(1) == "ON"


def _docker_arg(text: str, name: str) -> str | None:
    m = re.search(rf"^\s*ARG\s+{name}=(\S+)", text, re.M)
    return m.group(1).strip('"') if m else None


def _docker_define(text: str, name: str) -> bool | None:
    m = re.search(rf"-D{name}=(ON|OFF|1|0|TRUE|FALSE)", text, re.I)
    return None if m is None else m.group(1).upper() in ("ON", "1", "TRUE")


def draft_llamacpp(tag: str, files: dict[str, str], toolkits: dict[str, list[str]],
                   where: str = "") -> dict[str, Any]:
    """The draft of a llama.cpp CUDA image entry from a tag's files (path -> text): the Dockerfile's
    CUDA version and CMake flags, the CMake default architectures at that CUDA, the RPC worker and
    GGML_CUDA_FA_ALL_QUANTS. ``where`` names the checkout in the sources."""
    at = f"ggml-org/llama.cpp at {tag}" + (f" ({where})" if where else "")
    docker = files.get(CUDA_DOCKERFILE)
    cuda_cmake = files.get(CUDA_CMAKE)
    if docker is None or cuda_cmake is None:
        missing = [p for p in (CUDA_DOCKERFILE, CUDA_CMAKE) if p not in files]
        raise UsageError(f"llama.cpp {tag}: {', '.join(missing)} not in the checkout; nothing written")
    cuda = _docker_arg(docker, "CUDA_VERSION")
    if not cuda:
        raise UsageError(f"llama.cpp {tag}: {CUDA_DOCKERFILE} sets no CUDA_VERSION; nothing written")
    prov: dict[str, dict[str, str]] = {
        "cuda": {"source": f"{at}: {CUDA_DOCKERFILE} ARG CUDA_VERSION={cuda}", "confidence": "H"}}
    docker_arch = _docker_arg(docker, "CUDA_DOCKER_ARCH") or "default"
    if docker_arch != "default":
        archs = [a for a in re.split(r"[;,\s]+", docker_arch) if a]
        prov["kernels"] = {"source": f"{at}: {CUDA_DOCKERFILE} CUDA_DOCKER_ARCH={docker_arch}", "confidence": "H"}
    else:
        found = cmake_default_archs(cuda_cmake, cuda)
        if not found:
            raise UsageError(f"llama.cpp {tag}: no default CMAKE_CUDA_ARCHITECTURES in {CUDA_CMAKE}; nothing written")
        archs = found
        prov["kernels"] = {"source": f"{at}: {CUDA_DOCKERFILE} builds with CUDA_DOCKER_ARCH=default and "
                                     f"GGML_NATIVE=OFF, so {CUDA_CMAKE}'s defaults for CUDA {cuda}: "
                                     f"{' '.join(archs)}", "confidence": "H"}
    # CMake: a bare "86" is SASS and PTX for 8.6 (compat.parse_archs reads a bare number as SASS only)
    kernels = parse_archs([x for a in archs for x in ((a,) if re.search(r"-(real|virtual)$", a) or not a[:1].isdigit()
                                                       else (f"{a}-real", f"{a}-virtual"))])
    if kernels is None or not (kernels.sass or kernels.ptx):
        raise UsageError(f"llama.cpp {tag}: architectures {archs} do not parse; nothing written")
    mm = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", cuda)
    rows = toolkits.get(f"{mm.group(1)}.{mm.group(2)}", []) if mm else []
    update = int(mm.group(3) or 0) if mm else 0
    entry: dict[str, Any] = {"engine": "llamacpp", "version": tag, "repository": LLAMACPP_REPOSITORY,
                             "tag": f"server-cuda-{tag}", "cpu": False, "cuda": cuda}
    prov["tag"] = {"source": "llama.cpp's release workflow tags images server-cuda-<build>", "confidence": "M"}
    if rows:
        entry["min_driver"] = rows[min(update, len(rows) - 1)]
        prov["min_driver"] = {"source": f"CUDA {cuda} row of engines.yaml cuda_toolkits", "confidence": "H"}
    entry["cuda_compat_in_image"] = True
    prov["cuda_compat_in_image"] = {"source": f"{CUDA_DOCKERFILE}: nvidia/cuda runtime base", "confidence": "M"}
    entry["kernels"] = {"sass": list(kernels.sass), "ptx": list(kernels.ptx)}
    rpc = _docker_define(docker, "GGML_RPC")
    server_stage = docker[docker.rfind("AS server"):] if "AS server" in docker else ""
    ships = bool(rpc) and "rpc-server" in server_stage
    entry["rpc_server"] = {"ships": ships, "confidence": "H",
                           "source": f"{at}: {CUDA_DOCKERFILE}: GGML_RPC {'ON' if rpc else 'not set'}, the server "
                                     f"stage {'copies' if 'rpc-server' in server_stage else 'does not copy'} rpc-server"}
    fa = _docker_define(docker, "GGML_CUDA_FA_ALL_QUANTS")
    fa_src = f"{CUDA_DOCKERFILE} sets it {'ON' if fa else 'OFF'}"
    if fa is None:
        fa = _cmake_option(files.get(GGML_CMAKE, ""), "GGML_CUDA_FA_ALL_QUANTS")
        fa_src = (f"{CUDA_DOCKERFILE} does not set it; {GGML_CMAKE} option default "
                  f"{'ON' if fa else 'OFF'}" if fa is not None else "")
    if fa is not None:
        entry["fa_all_quants"] = {"enabled": bool(fa), "confidence": "H", "source": f"{at}: {fa_src}"}
    not_drafted = ["flash_attn_flag", "flash_attn_default", "kv_layout", "load_log", "image_size_mib"]
    kv = _llamacpp_fa_table(tag, files, at)
    if kv is not None:
        entry["cuda_flash_attn_kv"] = kv
        prov["cuda_flash_attn_kv"] = {"source": kv["source"], "confidence": "H"}
    else:
        not_drafted.append("cuda_flash_attn_kv")
    rules = _llamacpp_rules(files, at, prov)
    entry["confidence"] = "H"
    entry["sources"] = [f"kernels: {prov['kernels']['source']} (H)", f"cuda: {prov['cuda']['source']} (H)"]
    return {"key": f"llamacpp:{tag}", "entry": entry, "provenance": prov, "libraries": {},
            "not_drafted": not_drafted, "rules": rules}


def _llamacpp_fa_table(tag: str, files: dict[str, str], at: str) -> dict[str, Any] | None:
    """The build's CUDA flash-attention K/V table (catalog ``cuda_flash_attn_kv``), read from its fattn.cu,
    fattn-common.cuh and ggml-cuda.cu as bench/record_llamacpp_rules.py reads them; None without them."""
    from llmfleet.images import llamacpp_rules

    if FATTN not in files or GGML_CUDA not in files:
        return None
    url = f"https://github.com/ggml-org/llama.cpp/blob/{tag}/"
    try:
        excerpt = llamacpp_rules.fattn_excerpt(files[FATTN] + "\n" + files.get(FATTN_COMMON, ""), files[GGML_CUDA],
                                               tag, url + FATTN, url + GGML_CUDA)
        t = llamacpp_rules.parse_fattn_excerpt(excerpt)
    except ValueError as exc:
        raise UsageError(f"llama.cpp {tag}: {exc}; nothing written") from None
    kv: dict[str, Any] = {"build": tag, "types": list(t.types), "mixed": [list(p) for p in t.mixed],
                          "all_quants_types": list(t.all_quants_types)}
    if t.any_pair:
        kv["any_pair"] = True
    if t.quant_head_sizes is not None:
        kv["quant_head_sizes"] = list(t.quant_head_sizes)
    kv["cpu_types"] = list(t.cpu_types)
    kv["outside"] = llamacpp_rules.outside(excerpt)
    kv["confidence"] = "H"
    kv["source"] = (f"{url}{FATTN} and {GGML_CUDA} ggml_backend_cuda_device_supports_op, read in {at}; record "
                    f"tests/fixtures/llamacpp/{tag}/fattn.txt with bench/record_llamacpp_rules.py before the entry "
                    "goes into the catalog")
    return kv


def _llamacpp_rules(files: dict[str, str], at: str, prov: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """What catalog/architectures.yaml keeps of the build: the GGUF architectures of src/llama-arch.cpp and
    the tensor types of ggml.h's ``enum ggml_type`` (those read; their provenance added to ``prov``)."""
    from llmfleet.images import llamacpp_arch, llamacpp_rules

    rules: dict[str, list[str]] = {}
    archs = llamacpp_arch.arch_names(files.get(LLAMA_ARCH, ""))
    if archs:
        rules["architectures"] = list(archs)
        prov["architectures"] = {"source": f"{at}: {LLAMA_ARCH} LLM_ARCH_NAMES ({len(archs)})", "confidence": "H"}
    types = llamacpp_rules.ggml_types(files.get(GGML_H, ""))
    if types:
        rules["ggml_types"] = list(types)
        prov["ggml_types"] = {"source": f"{at}: {GGML_H} enum ggml_type ({len(types)})", "confidence": "H"}
    return rules
