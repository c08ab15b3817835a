"""What an engine says about itself while it loads: the lines of its own log that tell where the
weights went, how large the KV cache is and which kernels it chose.

Pure parsers, one per engine, from the text of the container's log (only the lines the engine's
``load_log_grep`` selects are fetched from the host). They never raise on odd input: a line they do
not know is skipped, and what they could not find is left ``None`` and named in ``unread`` so the
residency check can say what it could not read.

Where the formats come from (printf formats of the engines' own code):

- llama.cpp, ``src/llama-model.cpp`` ``load_tensors``: ``offloaded %d/%d layers to GPU`` (the count
  includes the output layer) and ``%12s model buffer size = %8.2f MiB`` per buffer type;
  ``src/llama-kv-cache.cpp``: ``%10s KV buffer size = %8.2f MiB`` and ``size = %7.2f MiB (%6u cells,
  %3d layers, %2u/%u seqs), K (%s): ..., V (%s): ...``; ``src/llama-context.cpp``: ``n_ctx = %u``,
  ``flash_attn = %s``. Older builds (before 2025) print ``llm_load_tensors: ... buffer size``,
  ``llama_kv_cache_init: ... KV buffer size``, ``KV self size`` and ``type_k = 'f16'``: read too.
  Builds whose common logging maps llama's INFO level to TRACE (the llama-cpp-python 0.3.36 tree,
  ``common/log.cpp``) print these lines only at ``-lv 4``; the engine catalog records which images
  need it (``load_log_verbosity``) and the planner adds the flag.
- vLLM: ``Model loading took X GiB`` (``gpu_model_runner.py``; older ``Loading model weights took X
  GB``), ``Available KV cache memory: X GiB`` (``gpu_worker.py``), ``GPU KV cache size: N tokens`` and
  ``Maximum concurrency for L tokens per request: X.XXx`` (``v1/core/kv_cache_utils.py``), the
  attention backend and the linear / MoE kernels it picked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MIB = 1024 * 1024
GIB = 1024 * MIB

# Buffer types that live in host memory (llama.cpp names them after the backend that owns them).
# (CPU, CPU_Mapped, CPU_REPACK, CPU_AARCH64, CUDA_Host, ROCm_Host, ...): a name starting with CPU or
# ending in _Host.
_HOST_BUFFERS = re.compile(r"^CPU|_Host$")


def is_host_buffer(name: str) -> bool:
    """True for a llama.cpp buffer in host memory (CPU, CPU_Mapped, CPU_REPACK, CUDA_Host, ...)."""
    return bool(_HOST_BUFFERS.search(name))


@dataclass(frozen=True)
class LoadReport:
    """What the engine reported while loading. ``lines`` maps each figure to the engine's own line
    (quoted in verdicts); ``unread`` names what the log did not say."""

    engine: str
    layers_offloaded: int | None = None  # llama.cpp: N of "offloaded N/M layers to GPU"
    layers_total: int | None = None  # llama.cpp: M (the repeating layers plus the output layer)
    model_buffers_mib: dict[str, float] = field(default_factory=dict)  # llama.cpp: buffer type -> MiB
    kv_buffers_mib: dict[str, float] = field(default_factory=dict)  # llama.cpp: buffer type -> MiB
    kv_cells: int | None = None  # llama.cpp: KV cells of the full-attention cache, all streams (= n_ctx)
    kv_types: tuple[str, str] | None = None  # llama.cpp: (K, V) cache types
    n_ctx: int | None = None  # llama.cpp: the context the server was given
    flash_attn: str | None = None  # llama.cpp: on/off/auto as printed
    build: str | None = None
    weights_gib: float | None = None  # vLLM: "Model loading took X GiB" (per rank)
    kv_memory_gib: float | None = None  # vLLM: "Available KV cache memory"
    kv_tokens: int | None = None  # vLLM: "GPU KV cache size: N tokens"
    max_concurrency: tuple[int, float] | None = None  # vLLM: (tokens per request, x)
    attention_backend: str | None = None  # vLLM
    kernels: tuple[str, ...] = ()  # vLLM: linear and MoE kernels chosen
    lines: dict[str, str] = field(default_factory=dict)
    unread: tuple[str, ...] = ()

    @property
    def gpu_weights_mib(self) -> float:
        return sum(v for k, v in self.model_buffers_mib.items() if not is_host_buffer(k))

    @property
    def host_weights_mib(self) -> float:
        return sum(v for k, v in self.model_buffers_mib.items() if is_host_buffer(k))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine}
        for name in ("layers_offloaded", "layers_total", "kv_cells", "n_ctx", "flash_attn", "build", "weights_gib",
                     "kv_memory_gib", "kv_tokens", "attention_backend"):
            v = getattr(self, name)
            if v is not None:
                out[name] = v
        if self.model_buffers_mib:
            out["model_buffers_mib"] = dict(self.model_buffers_mib)
        if self.kv_buffers_mib:
            out["kv_buffers_mib"] = dict(self.kv_buffers_mib)
        if self.kv_types:
            out["kv_types"] = list(self.kv_types)
        if self.max_concurrency:
            out["max_concurrency"] = list(self.max_concurrency)
        if self.kernels:
            out["kernels"] = list(self.kernels)
        if self.unread:
            out["unread"] = list(self.unread)
        return out


def _num(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _int(text: str) -> int | None:
    v = _num(text)
    return int(v) if v is not None else None


def _clean(line: str) -> str:
    """The line without terminal colour codes, carriage returns or surrounding space, at most 300
    characters (it is quoted to people)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", line).replace("\r", "").strip()[:300]


# --------------------------------------------------------------------------------------------
# llama.cpp

# What the host's grep keeps of a llama.cpp log (extended regular expression, grep -E).
LLAMACPP_GREP = (r"offloaded [0-9]+/[0-9]+ layers|model buffer size|[^A-Za-z]buffer size =|KV buffer size|"
                 r"KV self size|llama_kv_cache[a-z_]*: (size|kv_size)|kv_size =|n_ctx +=|flash_attn +=|"
                 r"Flash Attention|build:? [0-9]+ \([0-9a-f]+\)")

_RE_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_RE_MODEL_BUF = re.compile(r"(\S+) model buffer size\s*=\s*([\d.]+) MiB")
_RE_OLD_BUF = re.compile(r"llm_load_tensors:\s+(\S+) buffer size\s*=\s*([\d.]+) MiB")
_RE_KV_BUF = re.compile(r":\s*(\S+) KV buffer size\s*=\s*([\d.]+) MiB")
_RE_KV_SIZE = re.compile(r"size\s*=\s*[\d.]+ MiB \(\s*(\d+) cells,\s*\d+ layers,(?:\s*\d+/(\d+) seqs)?.*?"
                        r"K \((\w+)\):.*?V \((\w+)\)")
_RE_KV_OLD = re.compile(r"kv_size = (\d+),.*?type_k = '(\w+)', type_v = '(\w+)'")
_RE_N_CTX = re.compile(r":\s*n_ctx\s*=\s*(\d+)\s*$")
_RE_FA = re.compile(r":\s*flash_attn\s*=\s*(\S+)")
_RE_FA_AUTO = re.compile(r"Flash Attention (?:was auto, set to )?(enabled|disabled)")
_RE_BUILD = re.compile(r"\bbuild:? (\d+) \(([0-9a-f]+)\)")


def parse_llamacpp(text: str) -> LoadReport:
    """llama-server's load lines -> ``LoadReport``. The last start in the text wins (a log holding
    several starts is read from its last ``build:`` line on)."""
    raw = [_clean(ln) for ln in (text or "").splitlines()]
    builds = [i for i, ln in enumerate(raw) if _RE_BUILD.search(ln)]
    if builds and any(_RE_OFFLOADED.search(ln) or "buffer size" in ln for ln in raw[builds[-1]:]):
        raw = raw[builds[-1]:]  # the last start (a container restarted in place logs each start)
    d: dict[str, Any] = {"model_buffers_mib": {}, "kv_buffers_mib": {}}
    lines: dict[str, str] = {}
    cells: list[tuple[int, str, str, str]] = []
    for ln in raw:
        if not ln:
            continue
        m = _RE_OFFLOADED.search(ln)
        if m:
            d["layers_offloaded"], d["layers_total"] = int(m.group(1)), int(m.group(2))
            lines["offloaded"] = ln
            continue
        m = _RE_MODEL_BUF.search(ln) or _RE_OLD_BUF.search(ln)
        if m and "KV" not in ln and "compute" not in ln:
            v = _num(m.group(2))
            if v is not None:
                name = m.group(1)
                d["model_buffers_mib"][name] = d["model_buffers_mib"].get(name, 0.0) + v
                lines[f"model buffer {name}"] = ln
            continue
        m = _RE_KV_BUF.search(ln)
        if m:
            v = _num(m.group(2))
            if v is not None:
                name = m.group(1)
                d["kv_buffers_mib"][name] = d["kv_buffers_mib"].get(name, 0.0) + v
                lines[f"kv buffer {name}"] = ln
            continue
        m = _RE_KV_SIZE.search(ln)
        if m:
            # "N cells ... S/T seqs": N cells in each of T streams (one per sequence unless unified)
            cells.append((int(m.group(1)) * int(m.group(2) or 1), m.group(3), m.group(4), ln))
            continue
        m = _RE_KV_OLD.search(ln)
        if m:
            cells.append((int(m.group(1)), m.group(2), m.group(3), ln))
            continue
        m = _RE_N_CTX.search(ln)
        if m and "n_ctx_" not in ln:
            d["n_ctx"] = int(m.group(1))
            lines["n_ctx"] = ln
            continue
        m = _RE_FA_AUTO.search(ln)
        if m:
            d["flash_attn"] = "on" if m.group(1).lower() in {"enabled", "on", "true"} else "off"
            lines["flash_attn"] = ln
            continue
        m = _RE_FA.search(ln)
        if m and "flash_attn" not in lines:
            word = m.group(1).lower()
            d["flash_attn"] = {"1": "on", "0": "off", "enabled": "on", "disabled": "off"}.get(word, word)
            lines["flash_attn"] = ln
            continue
        m = _RE_BUILD.search(ln)
        if m:
            d["build"] = f"b{m.group(1)} ({m.group(2)})"
            lines["build"] = ln
    if cells:
        best = max(cells, key=lambda c: c[0])  # the full-attention cache holds the most cells
        d["kv_cells"], d["kv_types"] = best[0], (best[1], best[2])
        lines["kv"] = best[3]
    unread = []
    if "layers_offloaded" not in d:
        unread.append("the 'offloaded N/M layers to GPU' line")
    if not d["model_buffers_mib"]:
        unread.append("the model buffer sizes")
    if not cells:
        unread.append("the KV cache size")
    return LoadReport(engine="llamacpp", lines=lines, unread=tuple(unread), **d)


# --------------------------------------------------------------------------------------------
# vLLM

VLLM_GREP = (r"Model loading took|Loading model weights took|KV cache memory|KV cache size|Maximum concurrency|"
             r"backend|Kernel for|MoE config|configuration from .* for MoE|vLLM API server version|"
             r"LLM engine \(v|GPU blocks|CPU blocks")

_RE_V_WEIGHTS = re.compile(r"(?:Model loading took|Loading model weights took) ([\d.]+) ?(GiB|GB|MiB)")
_RE_V_KVMEM = re.compile(r"Available KV cache memory: ([\d.]+) ?(GiB|GB|MiB)")
_RE_V_KVTOK = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")
_RE_V_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.,]+)x")
_RE_V_BLOCKS = re.compile(r"# GPU blocks: (\d+)")
_RE_V_BACKEND = re.compile(r"Using ([A-Za-z0-9_.]+?|[A-Za-z0-9_ ]+?) (?:attention )?backend")
_RE_V_KERNEL = re.compile(r"Using (\w+Kernel) for (\w+)")
_RE_V_MOE = re.compile(r"Using (default MoE config)|Using configuration from (\S+) for MoE layer")
_RE_V_VERSION = re.compile(r"vLLM API server version:? ?v?([\w.+-]+)|LLM engine \(v([\w.+-]+)\)")


def _gib(value: str, unit: str) -> float | None:
    v = _num(value)
    if v is None:
        return None
    return {"GiB": v, "GB": v * 1e9 / GIB, "MiB": v / 1024}[unit]


def parse_vllm(text: str) -> LoadReport:
    """vLLM's load lines -> ``LoadReport`` (the last value of each wins: a restarted engine's)."""
    d: dict[str, Any] = {}
    lines: dict[str, str] = {}
    kernels: list[str] = []
    for raw in (text or "").splitlines():
        ln = _clean(raw)
        if not ln:
            continue
        m = _RE_V_WEIGHTS.search(ln)
        if m:
            d["weights_gib"] = _gib(m.group(1), m.group(2))
            lines["weights"] = ln
            continue
        m = _RE_V_KVMEM.search(ln)
        if m:
            d["kv_memory_gib"] = _gib(m.group(1), m.group(2))
            lines["kv_memory"] = ln
            continue
        m = _RE_V_KVTOK.search(ln)
        if m:  # newer releases print the concurrency on the same line
            d["kv_tokens"] = _int(m.group(1))
            lines["kv"] = ln
        m = _RE_V_CONC.search(ln)
        if m:
            tokens, x = _int(m.group(1)), _num(m.group(2))
            if tokens is not None and x is not None:
                d["max_concurrency"] = (tokens, x)
                lines["max_concurrency"] = ln
            continue
        m = _RE_V_KERNEL.search(ln)
        if m:
            k = f"{m.group(1)} for {m.group(2)}"
            if k not in kernels:
                kernels.append(k)
            lines["kernel"] = ln
            continue
        m = _RE_V_MOE.search(ln)
        if m:
            k = "MoE: default config" if m.group(1) else f"MoE: tuned config {m.group(2).rsplit('/', 1)[-1]}"
            if k not in kernels:
                kernels.append(k)
            lines["moe"] = ln
            continue
        m = _RE_V_VERSION.search(ln)
        if m:
            d["build"] = m.group(1) or m.group(2)
            lines["build"] = ln
            continue
        m = _RE_V_BLOCKS.search(ln)
        if m and "kv" not in lines:
            lines["kv_blocks"] = ln
            continue
        m = _RE_V_BACKEND.search(ln)
        if m and ("attention" in ln.lower() or "attn" in ln.lower() or "AttentionBackend" in ln) \
                and "sampler" not in ln.lower() and "MoE" not in ln:
            name = m.group(1).strip().removeprefix("AttentionBackendEnum.")
            d["attention_backend"] = name
            lines["attention"] = ln
    unread = []
    if "weights_gib" not in d:
        unread.append("the 'Model loading took X GiB' line")
    if "kv_tokens" not in d:
        unread.append("the 'KV cache size: N tokens' line")
    return LoadReport(engine="vllm", kernels=tuple(kernels), lines=lines, unread=tuple(unread), **d)


# --------------------------------------------------------------------------------------------
# nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits


@dataclass(frozen=True)
class ComputeApps:
    """GPU memory per process, as ``nvidia-smi --query-compute-apps`` answered (MiB), or why not."""

    used_mib: dict[int, float] = field(default_factory=dict)
    error: str | None = None
    line: str = ""

    def total_for(self, pids: set[int]) -> float | None:
        """MiB held by the given processes; None when none of them holds GPU memory."""
        found = [v for p, v in self.used_mib.items() if p in pids]
        return sum(found) if found else None


def parse_compute_apps(text: str, rc: int | None = 0) -> ComputeApps:
    """``pid, used_memory`` lines (units or not, header or not) -> ``ComputeApps``; a failed or
    unsupported query gives ``error`` with nvidia-smi's own words, never an exception."""
    rows: dict[int, float] = {}
    other: list[str] = []
    for raw in (text or "").splitlines():
        ln = _clean(raw)
        if not ln or ln.lower().startswith("pid"):
            continue
        parts = [p.strip() for p in ln.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            v = _num(parts[1].replace("MiB", "").strip())
            if v is not None:
                rows[int(parts[0])] = rows.get(int(parts[0]), 0.0) + v
                continue
        other.append(ln)
    if rc not in (0, None) or (other and not rows):
        why = "; ".join(other)[:200] or f"exit code {rc}"
        return ComputeApps(error=f"nvidia-smi --query-compute-apps did not answer: {why}")
    return ComputeApps(used_mib=rows, line="; ".join(f"{p}, {v:.0f} MiB" for p, v in rows.items())[:300])
