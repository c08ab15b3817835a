"""YAML catalogs (GPUs, quantization formats, models, planner assumptions) as typed, frozen objects.

Every figure lives in a YAML file next to this module with its source; this module only loads,
validates and looks things up. Unknown names raise ``UsageError`` listing what is known.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from llmfleet import yamlload
from llmfleet.errors import UsageError
from llmfleet.suggest import did_you_mean

FULL = "full_attention"
SLIDING = "sliding_attention"
LINEAR = "linear_attention"
LAYER_TYPES = (FULL, SLIDING, LINEAR)


def _read_yaml(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    data = yamlload.safe_load(text, keep=True)
    if not isinstance(data, dict):
        raise UsageError(f"catalog {name}: expected a mapping at the top level")
    return data


def _norm(name: str) -> str:
    return " ".join(str(name).split()).lower()


# --------------------------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class Gpu:
    id: str
    names: tuple[str, ...]
    memory_mib: int
    bandwidth_gbps: float
    compute_capability: str
    arch: str
    bf16: bool
    fp8: bool
    data_center: bool
    sources: tuple[str, ...] = ()
    memory_gb: float | None = None
    memory_mib_recorded: bool = False
    # Memory the driver keeps for itself: the CUDA-visible total (what torch.cuda.mem_get_info and
    # so vLLM's --gpu-memory-utilization see) is memory.total minus this. None: the planner's default.
    memory_reserved_mib: int | None = None
    # gddr / hbm2 / hbm3: the memory class the speed model's efficiency is measured per.
    memory_type: str = ""
    # How the cards of one host talk to each other: "nvlink" or "pcie" ("" unknown), GB/s per
    # direction per GPU; an optional NVLink bridge (PCIe cards that take one) and the sources.
    interconnect: str = ""
    interconnect_gbps: float = 0.0
    nvlink_bridge_gbps: float | None = None
    interconnect_sources: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.names[0] if self.names else self.id

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_mib) * 1024 * 1024

    @property
    def cc(self) -> tuple[int, int]:
        major, _, minor = self.compute_capability.partition(".")
        return int(major), int(minor or 0)


@functools.cache
def load_gpus() -> tuple[Gpu, ...]:
    data = _read_yaml("gpus.yaml")
    out = []
    for entry in data.get("gpus", []):
        out.append(
            Gpu(
                id=str(entry["id"]),
                names=tuple(str(n) for n in entry["names"]),
                memory_mib=int(entry["memory_mib"]),
                bandwidth_gbps=float(entry["bandwidth_gbps"]),
                compute_capability=str(entry["compute_capability"]),
                arch=str(entry["arch"]),
                bf16=bool(entry["bf16"]),
                fp8=bool(entry["fp8"]),
                data_center=bool(entry["data_center"]),
                sources=tuple(entry.get("sources", ())),
                memory_gb=entry.get("memory_gb"),
                memory_mib_recorded=bool(entry.get("memory_mib_recorded", False)),
                memory_reserved_mib=(int(entry["memory_reserved_mib"])
                                     if entry.get("memory_reserved_mib") is not None else None),
                memory_type=str(entry.get("memory_type", "")),
                interconnect=str(entry.get("interconnect", "")),
                interconnect_gbps=float(entry.get("interconnect_gbps", 0.0)),
                nvlink_bridge_gbps=(float(entry["nvlink_bridge_gbps"])
                                    if entry.get("nvlink_bridge_gbps") is not None else None),
                interconnect_sources=tuple(entry.get("interconnect_sources", ())),
            )
        )
    return tuple(out)


def find_gpu(name_or_id: str) -> Gpu:
    """A card by catalog id or by the exact name nvidia-smi prints (case-insensitive)."""
    key = _norm(name_or_id)
    for gpu in load_gpus():
        if key == gpu.id or key in {_norm(n) for n in gpu.names}:
            return gpu
    known = ", ".join(g.id for g in load_gpus())
    family = gpu_family_matches(name_or_id, load_gpus())
    if len(family) == 1:
        hint = f" (did you mean {family[0]!r}?)"
    elif family:
        hint = f" (did you mean one of {', '.join(repr(f) for f in family)}?)"
    else:
        hint = did_you_mean(key, [g.id for g in load_gpus()] + [n for g in load_gpus() for n in g.names])
    raise UsageError(f"unknown GPU {name_or_id!r}{hint}; known (id or nvidia-smi name): {known}")


_VENDOR_WORDS = ("nvidia", "tesla", "geforce")


def _card_key(name: str) -> str:
    """A card name without the vendor words nvidia-smi and people put before it, lower case, its words
    joined by '-' ("NVIDIA Tesla V100-SXM2-32GB" -> "v100-sxm2-32gb")."""
    words = "".join(ch if ch.isalnum() else " " for ch in str(name).lower()).split()
    return "-".join(w for w in words if w not in _VENDOR_WORDS)


def gpu_family_matches(typed: str, gpus: list[Gpu] | tuple[Gpu, ...]) -> list[str]:
    """The catalog ids of the cards whose id or nvidia-smi name starts with what was typed, at a word
    boundary, vendor words and separators aside: 'v100' and 'Tesla V100' -> every V100 variant, 'a100' ->
    the A100s (not the A10), 'h200' -> both H200s, '4090' -> rtx-4090. Empty when nothing starts so."""
    key = _card_key(typed).replace("-", "")
    if len(key) < 2:
        return []
    found = []
    for gpu in gpus:
        for name in (gpu.id, *gpu.names):
            words = _card_key(name).split("-")
            if any("".join(words[i:]).startswith(key) for i in range(len(words))):
                found.append(gpu.id)
                break
    return found


# ------------------------------------------------------------------------------------------ quants


@dataclass(frozen=True)
class Quant:
    name: str
    family: str  # "hf" | "gguf"
    bits: float
    aliases: tuple[str, ...] = ()
    weight_bits: float | None = None
    group_size: int | None = None
    group_bits: float = 0.0
    per_channel_scale: bool = False
    min_compute_capability: str = "0.0"
    vllm: str | None = None
    gguf_file_type: int | None = None
    base: str | None = None
    rules: tuple[tuple[str, str], ...] = ()
    needs_bf16_for_dtype: bool = False
    experts_only: bool = False  # only the routed experts are quantized; the rest stays 16 bit (MXFP4)
    sources: tuple[str, ...] = ()

    @property
    def linear_bits_per_weight(self) -> float:
        """Bits per weight of a quantized linear layer in an HF checkpoint (incl. group scales/zeros)."""
        bits = float(self.weight_bits or self.bits)
        if self.group_size:
            bits += self.group_bits / self.group_size
        return bits

    def rule(self, key: str) -> str | None:
        return dict(self.rules).get(key)

    def with_group_size(self, group_size: int) -> Quant:
        return replace(self, group_size=group_size)

    @property
    def min_cc(self) -> tuple[int, int]:
        major, _, minor = self.min_compute_capability.partition(".")
        return int(major), int(minor or 0)


@functools.cache
def _quants_data() -> dict[str, Any]:
    return _read_yaml("quants.yaml")


def _quant_from_entry(e: dict[str, Any]) -> Quant:
    return Quant(
        name=str(e["name"]),
        family=str(e["family"]),
        bits=float(e["bits"]),
        aliases=tuple(str(a) for a in e.get("aliases", ())),
        weight_bits=e.get("weight_bits"),
        group_size=e.get("group_size"),
        group_bits=float(e.get("group_bits", 0.0)),
        per_channel_scale=bool(e.get("per_channel_scale", False)),
        min_compute_capability=str(e.get("min_compute_capability", "0.0")),
        vllm=e.get("vllm"),
        gguf_file_type=e.get("gguf_file_type"),
        base=e.get("base"),
        rules=tuple(sorted((str(k), str(v)) for k, v in (e.get("rules") or {}).items())),
        needs_bf16_for_dtype=bool(e.get("needs_bf16_for_dtype", False)),
        experts_only=bool(e.get("experts_only", False)),
        sources=tuple(e.get("sources", ())),
    )


@functools.cache
def load_quants() -> tuple[Quant, ...]:
    out = []
    for e in _quants_data().get("quants", []):
        out.append(_quant_from_entry(e))
    return tuple(out)


def ggml_type_bits() -> dict[str, float]:
    """Bits per weight of each ggml tensor type (lowercase names)."""
    return {str(k).lower(): float(v) for k, v in _quants_data().get("ggml_types", {}).items()}


def kv_dtypes(engine: str) -> dict[str, dict[str, Any]]:
    """KV cache dtypes an engine takes: name -> {bytes: per value, flag: engine spelling}."""
    table = _quants_data().get("kv_dtypes", {})
    if engine not in table:
        raise UsageError(f"unknown engine {engine!r}; known: {', '.join(table)}")
    return dict(table[engine])


def find_quant(name: str) -> Quant:
    """A quantization format by name or alias, case-insensitive (``gptq-int4-g32`` sets a group size)."""
    key = _norm(name).replace("_", "-")
    group = None
    base_key = key
    for sep in ("-g", "-gs"):
        head, found, tail = key.rpartition(sep)
        if found and tail.isdigit() and head:
            base_key, group = head, int(tail)
            break
    for q in load_quants():
        names = {q.name.replace("_", "-")} | {a.lower().replace("_", "-") for a in q.aliases}
        if key in names:
            return q
        if group and base_key in names and q.group_size:
            return q.with_group_size(group)
    known = ", ".join(q.name for q in load_quants())
    hint = did_you_mean(_norm(name), [q.name for q in load_quants()] + [a for q in load_quants() for a in q.aliases])
    raise UsageError(f"unknown quantization {name!r}{hint}; known: {known} (GPTQ/AWQ take -gNN for a group size)")


def find_gguf_quant(file_type: int) -> Quant | None:
    for q in load_quants():
        if q.family == "gguf" and q.gguf_file_type == file_type:
            return q
    return None


# ------------------------------------------------------------------------------------------ models


@dataclass(frozen=True)
class ModelSpec:
    """What the planner needs to know about a model: shapes, attention layout and, when read from
    files, the real byte sizes."""

    name: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    max_context: int = 4096
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    attn_output_gate: bool = False
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    vision_params: float = 0.0
    # Mixture of experts (0 experts: dense). Layers i < moe_first_layer keep a dense MLP of
    # ``intermediate``; the others have ``num_experts`` routed experts of ``moe_intermediate`` each
    # (``num_experts_per_tok`` of them read per token) plus shared experts of ``shared_intermediate``
    # in total (read for every token).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    moe_first_layer: int = 0
    moe_bias: bool = False  # experts carry biases (gpt-oss)
    # Multi-head latent attention (DeepSeek-V2/V3): q_lora_rank 0 = a plain q_proj.
    mla_kv_lora_rank: int = 0
    mla_q_lora_rank: int = 0
    mla_qk_nope_head_dim: int = 0
    mla_qk_rope_head_dim: int = 0
    mla_v_head_dim: int = 0
    attention_bias: bool = False  # q/k/v/o biases (gpt-oss; Qwen2's q/k/v biases are ignored, as before)
    mtp_layers: int = 0  # multi-token-prediction layers shipped with the checkpoint (loaded, not read per token)
    linear_state_bytes: float = 2.0  # bytes per value of a linear-attention layer's recurrent state
    fused_qkv: bool = False  # GGUF stores attn_qkv as one tensor (Phi-3)
    fused_gate_up: bool = False  # GGUF stores gate and up as one ffn_up tensor (Phi-3)
    active_params_published: float | None = None
    params_published: float | None = None
    model_type: str = ""
    hf_architecture: str = ""  # config.json architectures[0]: the name vLLM's model registry keys on ("": not known)
    gguf_architecture: str = ""  # GGUF general.architecture: the name llama.cpp's LLM_ARCH_NAMES keys on
    hf_id: str | None = None
    aliases: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    # Set when the model was read from files (HF folder or GGUF): real figures win over formulas.
    origin: str = "catalog"  # "catalog" | "hf" | "gguf"
    path: str | None = None
    file_params: int | None = None
    file_weights_bytes: int | None = None
    file_embed_bytes: int | None = None  # token-embedding table (only one row is read per token)
    file_output_bytes: int | None = None  # lm_head / output.weight (0 when tied)
    file_quant: str | None = None  # quant name detected from the files
    file_group_size: int | None = None
    file_expert_bytes: int | None = None  # routed-expert tensors (GGUF *_exps), all experts
    # The ggml type the routed experts keep in the published GGUF files of every quant (gpt-oss: the
    # checkpoint's MXFP4 experts are not requantized); None: llama-quantize's mix decides.
    gguf_expert_type: str | None = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL,) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise UsageError(
                f"model {self.name}: layer_types lists {len(self.layer_types)} layers, num_layers is {self.num_layers}"
            )
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise UsageError(f"model {self.name}: unknown layer types {bad}; known: {', '.join(LAYER_TYPES)}")

    def count(self, kind: str) -> int:
        return sum(1 for t in self.layer_types if t == kind)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.mla_kv_lora_rank > 0

    def is_moe_layer(self, i: int) -> bool:
        return self.num_experts > 0 and i >= self.moe_first_layer


def layer_types_from_interval(num_layers: int, interval: int | None, other: str | None) -> tuple[str, ...]:
    """Layer i is full attention when (i + 1) % interval == 0, else ``other``."""
    if not interval or interval <= 1 or not other:
        return (FULL,) * num_layers
    return tuple(FULL if (i + 1) % interval == 0 else other for i in range(num_layers))


_MODEL_KEYS = {
    "num_layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "tie_embeddings",
    "max_context", "sliding_window", "attn_output_gate", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "vision_params",
    "params_published", "model_type", "hf_id", "num_experts", "num_experts_per_tok", "moe_intermediate",
    "shared_intermediate", "moe_first_layer", "moe_bias", "mla_kv_lora_rank", "mla_q_lora_rank",
    "mla_qk_nope_head_dim", "mla_qk_rope_head_dim", "mla_v_head_dim", "attention_bias", "mtp_layers",
    "linear_state_bytes", "fused_qkv", "fused_gate_up", "active_params_published", "gguf_expert_type",
}  # fmt: skip


def _model_from_entry(e: dict[str, Any]) -> ModelSpec:
    kwargs = {k: e[k] for k in _MODEL_KEYS if k in e and e[k] is not None}
    layer_types = layer_types_from_interval(
        int(e["num_layers"]), e.get("full_attention_interval"), e.get("other_layer_type")
    )
    return ModelSpec(
        name=str(e["name"]),
        aliases=tuple(str(a) for a in e.get("aliases", ())),
        sources=tuple(e.get("sources", ())),
        layer_types=layer_types,
        hf_architecture=str((e.get("architecture") or {}).get("hf") or ""),
        gguf_architecture=str((e.get("architecture") or {}).get("gguf") or ""),
        **kwargs,
    )


@functools.cache
def load_models() -> tuple[ModelSpec, ...]:
    return tuple(_model_from_entry(e) for e in _read_yaml("models.yaml").get("models", []))


def find_model(name: str) -> ModelSpec:
    """A catalog model by name, alias or Hugging Face id (case-insensitive)."""
    key = _norm(name)
    for m in load_models():
        if key in {m.name, *(a.lower() for a in m.aliases)} or (m.hf_id and key == m.hf_id.lower()):
            return m
    known = ", ".join(m.name for m in load_models())
    hint = did_you_mean(key, [n for m in load_models() for n in (m.name, *m.aliases, m.hf_id or "") if n])
    raise UsageError(f"unknown model {name!r}{hint}; known: {known} (or give a model folder or a .gguf file)")


# ------------------------------------------------------------------------------ planner assumptions


@dataclass(frozen=True)
class EngineAssumptions:
    engine: str
    gpu_memory_utilization: float
    block_size: int
    cuda_context_bytes: int
    activation_bytes: int
    cuda_graph_bytes: int
    kv_fraction: float
    overhead_sources: tuple[str, ...]
    efficiency_low: float
    efficiency_high: float
    efficiency_sources: tuple[str, ...]
    offload_gbps_low: float
    offload_gbps_high: float
    offload_sources: tuple[str, ...]
    # vLLM: the release line's own reserve for the model's kind replaced the figures above (planner.yaml
    # ``reserve``): its confidence, and a note for the plan where it is not measured
    reserve_confidence: str = ""
    reserve_note: str = ""
    # vLLM hybrid (attention + linear-attention) models: attention pages of a multiple of this many
    # tokens, sized to hold one layer's recurrent state (0: the rule is not applied)
    hybrid_page_multiple: int = 0

    @property
    def fixed_overhead_bytes(self) -> int:
        return self.cuda_context_bytes + self.activation_bytes + self.cuda_graph_bytes


@functools.cache
def _planner_data() -> dict[str, Any]:
    return _read_yaml("planner.yaml")


def engine_assumptions(engine: str) -> EngineAssumptions:
    engines = _planner_data().get("engines", {})
    if engine not in engines:
        raise UsageError(f"unknown engine {engine!r}; known: {', '.join(engines)}")
    e = engines[engine]
    ov, off = e["overhead"], e["offload_gbps"]
    eff = e.get("efficiency") or (e.get("speed") or {}).get("efficiency", {}).get("default", {"low": 0, "high": 0})
    return EngineAssumptions(
        engine=engine,
        gpu_memory_utilization=float(e["gpu_memory_utilization"]),
        block_size=int(e.get("block_size", 1)),
        cuda_context_bytes=int(ov.get("cuda_context_bytes", 0)),
        activation_bytes=int(ov.get("activation_bytes", 0)),
        cuda_graph_bytes=int(ov.get("cuda_graph_bytes", 0)),
        kv_fraction=float(ov.get("kv_fraction", 0.0)),
        overhead_sources=tuple(ov.get("sources", ())),
        efficiency_low=float(eff["low"]),
        efficiency_high=float(eff["high"]),
        efficiency_sources=tuple(eff.get("sources", ())),
        offload_gbps_low=float(off["low"]),
        offload_gbps_high=float(off["high"]),
        offload_sources=tuple(e.get("offload_sources", ())),
    )


def model_kind(spec: ModelSpec) -> str:
    """dense, moe or hybrid (any linear-attention layer): the kinds vLLM reserves memory differently for."""
    if spec.count(LINEAR):
        return "hybrid"
    return "moe" if spec.is_moe else "dense"


def _release_line(version: str) -> str:
    parts = version.split(".")
    return ".".join(parts[:2])


def engine_assumptions_for(engine: str, version: str | None, kind: str) -> EngineAssumptions:
    """The engine's assumptions with its release line's own reserve for a model kind (planner.yaml
    ``engines.<engine>.reserve``) in place of the generic overhead, where the catalog has one."""
    a = engine_assumptions(engine)
    if not version:
        return a
    line = _release_line(version)
    for entry in _planner_data()["engines"][engine].get("reserve", ()):
        if str(entry["release_line"]) != line or kind not in entry:
            continue
        k = entry[kind]
        conf = str(k["confidence"])
        gib = 2**30
        note = ""
        total = float(k["non_torch_gib"]) + float(k["activation_gib"]) + float(k["cuda_graph_gib"])
        if conf != "H":
            note = (f"vLLM {line}'s own reserve for {kind} models ({total:.2f} GiB per GPU) is read from its "
                    f"code, not measured ({conf}): "
                    f"the KV capacity and concurrency may be off by a few per cent; check the engine's "
                    f"'Available KV cache memory' line")
        return replace(
            a,
            cuda_context_bytes=int(k["non_torch_gib"] * gib),
            activation_bytes=int(k["activation_gib"] * gib),
            cuda_graph_bytes=int(k["cuda_graph_gib"] * gib),
            overhead_sources=(f"vLLM {line}, {kind} models: {k['source']} ({conf})",),
            reserve_confidence=conf,
            reserve_note=note,
            hybrid_page_multiple=int(entry.get("hybrid_page_multiple", 0)) if kind == "hybrid" else 0,
        )
    return a


@dataclass(frozen=True)
class SpeedAssumptions:
    """The batch-1 decode speed model of one engine (planner.yaml ``speed``):

        time per token = bytes read / (bandwidth x efficiency) + layers x per-layer cost
                         + MoE layers x MoE per-layer cost + per-token cost

    ``efficiency`` is per memory class of the card (gpus.yaml memory_type); ``default`` covers classes
    without measurements. Each pair is (low, high); the low efficiency goes with the high cost. The
    per-layer costs differ with and without CUDA graphs (``cuda_graphs_for``)."""

    engine: str
    efficiency: dict[str, tuple[float, float]]
    efficiency_sources: dict[str, tuple[str, ...]]
    per_layer_us: tuple[float, float]
    per_layer_us_by_class: dict[str, tuple[float, float]]
    per_token_us: tuple[float, float]
    legacy_per_layer_us: tuple[float, float] | None  # per-layer cost without CUDA graphs
    cost_sources: tuple[str, ...]
    floor_share_offloaded: float
    floor_sources: tuple[str, ...]
    moe_layer_us: tuple[float, float] = (0.0, 0.0)
    moe_layer_us_no_graphs: tuple[float, float] | None = None
    graphs_min_cc: str | None = None  # None: the engine's costs do not depend on CUDA graphs
    graphs_min_cc_newer_builds: str | None = None
    graphs_sources: tuple[str, ...] = ()
    no_dp4a_below_cc: str | None = None
    no_dp4a_factor: tuple[float, float] = (1.0, 1.0)
    no_dp4a_sources: tuple[str, ...] = ()
    floor_share_of_low: float = 0.5
    # Extra cost of a linear-attention (Gated DeltaNet) layer over an attention layer: its recurrent
    # state update, convolution and gating kernels (planner.yaml linear_layer_us).
    linear_layer_us: tuple[float, float] = (0.0, 0.0)
    linear_layer_us_no_graphs: tuple[float, float] | None = None
    linear_sources: tuple[str, ...] = ()

    def efficiency_for(self, memory_type: str) -> tuple[str, tuple[float, float]]:
        """(class used, (low, high)) for a card's memory type."""
        key = memory_type if memory_type in self.efficiency else "default"
        return key, self.efficiency[key]

    def per_layer_for(self, efficiency_class: str) -> tuple[float, float]:
        return self.per_layer_us_by_class.get(efficiency_class, self.per_layer_us)

    def cuda_graphs_for(self, compute_capability: str | None) -> bool | None:
        """Whether the engine decodes as a CUDA graph on a card: True, False, or None where it depends
        on the build (the range then spans both)."""
        if self.graphs_min_cc is None:
            return True
        cc = _cc_tuple(compute_capability)
        if cc is None:
            return None
        floor = _cc_tuple(self.graphs_min_cc)
        if floor is not None and cc >= floor:
            return True
        newer = _cc_tuple(self.graphs_min_cc_newer_builds)
        return None if newer is not None and cc >= newer else False

    def efficiency_factor(self, compute_capability: str | None) -> tuple[float, float]:
        """(low, high) factor on the efficiency: below 1 on cards without DP4A."""
        cc, limit = _cc_tuple(compute_capability), _cc_tuple(self.no_dp4a_below_cc)
        if cc is not None and limit is not None and cc < limit:
            return self.no_dp4a_factor
        return (1.0, 1.0)


def _cc_tuple(cc: str | None) -> tuple[int, int] | None:
    if not cc:
        return None
    major, _, minor = str(cc).partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return None


def _pair(d: dict[str, Any], where: str) -> tuple[float, float]:
    try:
        lo, hi = float(d["low"]), float(d["high"])
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"catalog planner.yaml {where}: needs numbers low and high") from None
    if lo > hi:
        raise UsageError(f"catalog planner.yaml {where}: low {lo} is above high {hi}")
    return lo, hi


def speed_assumptions(engine: str) -> SpeedAssumptions:
    engines = _planner_data().get("engines", {})
    if engine not in engines:
        raise UsageError(f"unknown engine {engine!r}; known: {', '.join(engines)}")
    sp = engines[engine].get("speed")
    if not isinstance(sp, dict):
        raise UsageError(f"catalog planner.yaml engines.{engine}: no speed model")
    eff: dict[str, tuple[float, float]] = {}
    eff_src: dict[str, tuple[str, ...]] = {}
    for cls, d in (sp.get("efficiency") or {}).items():
        eff[str(cls)] = _pair(d, f"engines.{engine}.speed.efficiency.{cls}")
        eff_src[str(cls)] = tuple(d.get("sources", ()))
    if "default" not in eff:
        raise UsageError(f"catalog planner.yaml engines.{engine}.speed.efficiency: needs a default class")
    legacy = sp.get("per_layer_us_no_graphs") or sp.get("legacy_per_layer_us")
    moe_ng = sp.get("moe_layer_us_no_graphs")
    graphs = sp.get("cuda_graphs") or {}
    where = f"engines.{engine}.speed"
    return SpeedAssumptions(
        engine=engine,
        efficiency=eff,
        efficiency_sources=eff_src,
        per_layer_us=_pair(sp["per_layer_us"], f"{where}.per_layer_us"),
        per_layer_us_by_class={str(k): _pair(v, f"{where}.per_layer_us_by_class.{k}")
                               for k, v in (sp.get("per_layer_us_by_class") or {}).items()},
        per_token_us=_pair(sp.get("per_token_us") or {"low": 0, "high": 0}, f"{where}.per_token_us"),
        legacy_per_layer_us=_pair(legacy, f"{where}.per_layer_us_no_graphs") if legacy else None,
        cost_sources=tuple(sp.get("cost_sources", ())),
        floor_share_offloaded=float(sp.get("floor_share_offloaded", 0.125)),
        floor_sources=tuple(sp.get("floor_sources", ())),
        moe_layer_us=_pair(sp.get("moe_layer_us") or {"low": 0, "high": 0}, f"{where}.moe_layer_us"),
        moe_layer_us_no_graphs=_pair(moe_ng, f"{where}.moe_layer_us_no_graphs") if moe_ng else None,
        graphs_min_cc=str(graphs["min_cc"]) if graphs.get("min_cc") else None,
        graphs_min_cc_newer_builds=str(graphs["min_cc_newer_builds"]) if graphs.get("min_cc_newer_builds") else None,
        graphs_sources=tuple(graphs.get("sources", ())),
        no_dp4a_below_cc=str(sp["no_dp4a_below_cc"]) if sp.get("no_dp4a_below_cc") else None,
        no_dp4a_factor=_pair(sp.get("no_dp4a_efficiency_factor") or {"low": 1, "high": 1},
                             f"{where}.no_dp4a_efficiency_factor"),
        no_dp4a_sources=tuple(sp.get("no_dp4a_sources", ())),
        floor_share_of_low=float(sp.get("floor_share_of_low", 0.5)),
        linear_layer_us=_pair(sp.get("linear_layer_us") or {"low": 0, "high": 0}, f"{where}.linear_layer_us"),
        linear_layer_us_no_graphs=_pair(sp["linear_layer_us_no_graphs"], f"{where}.linear_layer_us_no_graphs")
        if sp.get("linear_layer_us_no_graphs") else None,
        linear_sources=tuple(sp.get("linear_sources", ())),
    )


@dataclass(frozen=True)
class ParallelAssumptions:
    """How the planner prices splitting a model over cards and hosts (planner.yaml ``parallel``).
    Pairs are (low, high) in microseconds unless named otherwise; each group has its sources."""

    allreduce_us: dict[str, tuple[float, float]]  # per interconnect class: one decode-step all-reduce
    allreduce_sources: tuple[str, ...]
    allreduces_per_layer: int
    allreduces_per_token: int  # outside the layers (vocab-parallel embedding, logits gather)
    tp_overhead_bytes: int  # per GPU with tensor parallel > 1 (NCCL / custom all-reduce buffers)
    tp_overhead_sources: tuple[str, ...]
    layer_split_hop_us: tuple[float, float]  # llama.cpp layer split: per device boundary per token
    row_split_sync_us: tuple[float, float]  # llama.cpp row split: per split matrix per token
    llamacpp_sources: tuple[str, ...]
    network_default_gbps: float  # Gbit/s between hosts when the inventory does not say
    network_latency_us: tuple[float, float]  # one way, per message
    network_efficiency: float  # share of the line rate a transfer reaches
    network_sources: tuple[str, ...]
    pp_step_us: tuple[float, float]  # vLLM over Ray with pipeline parallel: per decode step
    pp_sources: tuple[str, ...]
    rpc_round_trips_per_device: int
    rpc_graph_bytes_per_layer: tuple[float, float]
    rpc_sources: tuple[str, ...]

    def allreduce_for(self, interconnect: str) -> tuple[str, tuple[float, float]]:
        key = interconnect if interconnect in self.allreduce_us else "pcie"
        return key, self.allreduce_us[key]


def parallel_assumptions() -> ParallelAssumptions:
    d = _planner_data().get("parallel")
    if not isinstance(d, dict):
        raise UsageError("catalog planner.yaml: no parallel section (tensor / pipeline parallel assumptions)")
    ar = d["allreduce_us"]
    net, ll, pp, rpc = d["network"], d["llamacpp"], d["pipeline"], d["rpc"]
    return ParallelAssumptions(
        allreduce_us={k: _pair(v, f"parallel.allreduce_us.{k}") for k, v in ar.items() if k != "sources"},
        allreduce_sources=tuple(ar.get("sources", ())),
        allreduces_per_layer=int(d["allreduces_per_layer"]),
        allreduces_per_token=int(d["allreduces_per_token"]),
        tp_overhead_bytes=int(d["tp_overhead"]["bytes"]),
        tp_overhead_sources=tuple(d["tp_overhead"].get("sources", ())),
        layer_split_hop_us=_pair(ll["layer_split_hop_us"], "parallel.llamacpp.layer_split_hop_us"),
        row_split_sync_us=_pair(ll["row_split_sync_us"], "parallel.llamacpp.row_split_sync_us"),
        llamacpp_sources=tuple(ll.get("sources", ())),
        network_default_gbps=float(net["default_gbps"]),
        network_latency_us=_pair(net["latency_us"], "parallel.network.latency_us"),
        network_efficiency=float(net.get("efficiency", 1.0)),
        network_sources=tuple(net.get("sources", ())),
        pp_step_us=_pair(pp["step_us"], "parallel.pipeline.step_us"),
        pp_sources=tuple(pp.get("sources", ())),
        rpc_round_trips_per_device=int(rpc["round_trips_per_device"]),
        rpc_graph_bytes_per_layer=_pair(rpc["graph_bytes_per_layer"], "parallel.rpc.graph_bytes_per_layer"),
        rpc_sources=tuple(rpc.get("sources", ())),
    )


def default_memory_reserved_mib() -> int:
    """Driver-reserved memory for cards without their own figure (planner.yaml)."""
    return int(_planner_data().get("memory_reserved_mib_default", 512))


def min_context() -> int:
    return int(_planner_data().get("min_context", 1024))


def typical_context(model_max: int | None = None) -> int:
    """The tokens in context a plan without --context states its decode at (planner.yaml
    ``typical_context``), capped at the model's ``model_max``."""
    typical = int(_planner_data().get("typical_context", 8192))
    return min(typical, model_max) if model_max else typical


# ------------------------------------------------------------------------- public decode record


@dataclass(frozen=True)
class PublicDecode:
    """One public batch-1 decode figure (decode_public.yaml), its model and quant resolved."""

    id: str
    card: Gpu
    engine: str
    build: str
    cuda_graphs: bool | None
    model: ModelSpec
    quant: Quant
    test: str
    context: int
    tokps: float
    offloaded: bool
    offload: str
    source: str
    date: str
    confidence: str
    notes: str = ""
    reads_output_layer: bool = True


@functools.cache
def load_public_decode() -> tuple[PublicDecode, ...]:
    """The public record of batch-1 decode speed the speed model and the health floor are held to."""
    data = _read_yaml("decode_public.yaml")
    shapes = {str(e["name"]): _model_from_entry(e) for e in data.get("shapes") or []}
    quants = {str(e["name"]): _quant_from_entry(e) for e in data.get("quants") or []}
    out, seen = [], set()
    for e in data.get("figures") or []:
        fid = str(e["id"])
        if fid in seen:
            raise UsageError(f"catalog decode_public.yaml: figure id {fid!r} appears twice")
        seen.add(fid)
        for key in ("card", "engine", "model", "quant", "context", "tokps", "offloaded", "source", "date"):
            if e.get(key) is None:
                raise UsageError(f"catalog decode_public.yaml: figure {fid} lacks {key}")
        model = shapes.get(str(e["model"])) or find_model(str(e["model"]))
        quant = quants.get(str(e["quant"])) or find_quant(str(e["quant"]))
        graphs = e.get("cuda_graphs")
        out.append(PublicDecode(
            id=fid, card=find_gpu(str(e["card"])), engine=str(e["engine"]), build=str(e.get("build") or ""),
            cuda_graphs=None if graphs is None else bool(graphs), model=model, quant=quant,
            test=str(e.get("test") or ""), context=int(e["context"]), tokps=float(e["tokps"]),
            offloaded=bool(e["offloaded"]), offload=str(e.get("offload") or ""), source=str(e["source"]),
            date=str(e["date"]), confidence=str(e.get("confidence") or "U"), notes=str(e.get("notes") or ""),
            reads_output_layer=bool(e.get("reads_output_layer", True)),
        ))
    return tuple(out)


__all__ = [
    "FULL", "LINEAR", "SLIDING", "EngineAssumptions", "Gpu", "ModelSpec", "Quant", "engine_assumptions",
    "find_gguf_quant", "find_gpu", "find_model", "find_quant", "ggml_type_bits", "kv_dtypes",
    "layer_types_from_interval", "load_gpus", "load_models", "load_quants", "min_context", "typical_context",
    "SpeedAssumptions",
    "speed_assumptions", "default_memory_reserved_mib", "ParallelAssumptions", "parallel_assumptions",
    "PublicDecode", "load_public_decode",
]  # fmt: skip
