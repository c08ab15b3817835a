"""Capacity planner: will a model fit a card, with which engine flags, and how fast can it decode.

Pure: a ``PlanRequest`` in, a ``Plan`` out. Figures come from the catalogs (GPUs, quantization
formats, models, planner assumptions) or, for a model folder / .gguf file, from ``modelinfo``.

The arithmetic, per GPU for vLLM tensor parallel (everything shards) and over all cards for
llama.cpp (layers split across cards):

    budget      = memory.total x gpu_memory_utilization
    KV pool     = budget - weights on the GPU - overhead (CUDA context, activations, CUDA graphs)
    KV/sequence = context x bytes/token of full-attention layers
                  + min(context, window) x bytes/token of sliding-window layers
                  + a fixed recurrent state for linear-attention layers
    ceiling     = memory bandwidth / (weights read per token + KV read at that context)

A plan that leaves weights off the GPU is refused unless offload is asked for explicitly; then
the predicted speed is bound by host memory (llama.cpp) or PCIe (vLLM).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.knowledge.catalog import (
    FULL,
    LINEAR,
    SLIDING,
    EngineAssumptions,
    Gpu,
    ModelSpec,
    Quant,
    engine_assumptions,
    find_gpu,
    find_model,
    find_quant,
    ggml_type_bits,
    kv_dtypes,
    load_quants,
    min_context,
)

ENGINES = ("vllm", "llamacpp")
GB = 1e9
GIB = 1024**3


# ------------------------------------------------------------------------------------------ request


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    model: str | ModelSpec
    quant: str | None = None
    gpu: Gpu | str
    gpus: int = 1
    context: int | None = None
    concurrency: int = 1
    engine: str | None = None  # None: llamacpp for GGUF, vllm otherwise
    kv_dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    offload: bool = False


# ------------------------------------------------------------------------------------------ weights


@dataclass(frozen=True)
class Weights:
    params: int
    total_bytes: int
    embed_bytes: int  # token-embedding table
    output_bytes: int  # lm_head / output.weight; 0 when tied to the embeddings
    layer_bytes: int  # all transformer blocks together
    other_bytes: int  # final norm, vision tower
    source: str
    vision_bytes: int = 0  # part of other_bytes: a vision tower, not read while decoding text

    @property
    def tied(self) -> bool:
        return self.output_bytes == 0

    @property
    def read_per_token(self) -> int:
        """Bytes a batch-1 decode step reads: everything except an untied embedding table, of which
        only one row per token is gathered, and a vision tower, idle while decoding text."""
        return self.total_bytes - (0 if self.tied else self.embed_bytes) - self.vision_bytes


def _use_more_bits(i: int, n: int) -> bool:
    # llama.cpp src/llama-quant.cpp: first and last eighth of the layers, and every third between.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


_K_FALLBACK = {"q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}


def _layer_matrices(spec: ModelSpec, i: int) -> list[tuple[str, int, int]]:
    """(role, rows_in, cols_out) of each matrix in layer i; rows_in is the row length in ggml."""
    h = spec.hidden
    kind = spec.layer_types[i]
    mats: list[tuple[str, int, int]] = []
    if kind in (FULL, SLIDING):
        q_out = spec.heads * spec.head_dim * (2 if spec.attn_output_gate else 1)
        kv_out = spec.kv_heads * spec.head_dim
        mats += [
            ("attn_q", h, q_out),
            ("attn_k", h, kv_out),
            ("attn_v", h, kv_out),
            ("attn_output", spec.heads * spec.head_dim, h),
        ]
    else:  # Gated DeltaNet linear attention
        kdim = spec.linear_num_key_heads * spec.linear_key_head_dim
        vdim = spec.linear_num_value_heads * spec.linear_value_head_dim
        mats += [
            ("ssm_in", h, 2 * kdim + 2 * vdim),
            ("ssm_ba", h, 2 * spec.linear_num_value_heads),
            ("ssm_out", vdim, h),
        ]
    mats += [("ffn_gate", h, spec.intermediate), ("ffn_up", h, spec.intermediate), ("ffn_down", spec.intermediate, h)]
    return mats


def _layer_small_params(spec: ModelSpec, i: int) -> int:
    """Norms, conv kernels and other 1-D tensors of layer i (kept 16/32 bit)."""
    n = 2 * spec.hidden
    if spec.layer_types[i] == LINEAR:
        kdim = spec.linear_num_key_heads * spec.linear_key_head_dim
        vdim = spec.linear_num_value_heads * spec.linear_value_head_dim
        n += (2 * kdim + vdim) * spec.linear_conv_kernel_dim + 2 * spec.linear_num_value_heads + spec.linear_value_head_dim
    return n


def _gguf_bits(quant: Quant, role: str, i_attn: int, n_attn: int, i_layer: int, n_layer: int, row: int) -> float:
    bits = ggml_type_bits()
    t = quant.base or "f16"
    if role == "attn_v" and quant.rule("attn_v_more_bits") and _use_more_bits(i_attn, n_attn):
        t = quant.rule("attn_v_more_bits") or t
    if role == "ffn_down" and quant.rule("ffn_down_more_bits") and _use_more_bits(i_layer, n_layer):
        t = quant.rule("ffn_down_more_bits") or t
    if t in _K_FALLBACK and row % 256:
        t = _K_FALLBACK[t]  # k-quants need rows that are a multiple of 256
    return bits[t]


def compute_weights(spec: ModelSpec, quant: Quant) -> Weights:
    """Weight bytes of a model in a quantization format, from its shapes."""
    embed_params = spec.vocab * spec.hidden
    bits16 = 16.0
    layer_bits = 0.0
    params = 0
    n_attn = sum(1 for t in spec.layer_types if t != LINEAR)
    i_attn = 0
    gguf = quant.family == "gguf"
    small_bits = 32.0 if gguf else bits16
    for i in range(spec.num_layers):
        for role, rows, cols in _layer_matrices(spec, i):
            n = rows * cols
            params += n
            if gguf:
                b = _gguf_bits(quant, role, i_attn, n_attn, i, spec.num_layers, rows)
            else:
                b = quant.linear_bits_per_weight
                if quant.per_channel_scale:
                    b += 32.0 / rows  # one fp32 scale per output channel
            layer_bits += n * b
        small = _layer_small_params(spec, i)
        params += small
        layer_bits += small * small_bits
        if spec.layer_types[i] != LINEAR:
            i_attn += 1
    if gguf:
        bits = ggml_type_bits()
        out_type = quant.rule("output") or quant.base or "f16"
        if spec.tie_embeddings:
            embed_bits, output_bits = bits[out_type], 0.0  # token_embd doubles as output: output rule
        else:
            embed_bits = bits[quant.rule("token_embd") or quant.base or "f16"]
            output_bits = bits[out_type]
        vision_bytes = 0  # llama.cpp keeps a vision tower in a separate mmproj file
    else:
        embed_bits = bits16
        output_bits = 0.0 if spec.tie_embeddings else bits16
        vision_bytes = int(spec.vision_params * 2)
    embed_bytes = int(embed_params * embed_bits / 8)
    output_bytes = int(embed_params * output_bits / 8)
    final_norm_bytes = int(spec.hidden * small_bits / 8)
    layer_bytes = int(layer_bits / 8)
    params += embed_params * (1 if spec.tie_embeddings else 2) + spec.hidden + int(0 if gguf else spec.vision_params)
    total = embed_bytes + output_bytes + layer_bytes + final_norm_bytes + vision_bytes
    return Weights(
        params=params,
        total_bytes=total,
        embed_bytes=embed_bytes,
        output_bytes=output_bytes,
        layer_bytes=layer_bytes,
        other_bytes=final_norm_bytes + vision_bytes,
        source=f"computed from the model's shapes and {quant.name} bits per weight",
        vision_bytes=vision_bytes,
    )


def _file_weights(spec: ModelSpec, computed: Weights) -> Weights:
    total = int(spec.file_weights_bytes or 0)
    embed = int(spec.file_embed_bytes if spec.file_embed_bytes is not None else computed.embed_bytes)
    output = int(spec.file_output_bytes if spec.file_output_bytes is not None else computed.output_bytes)
    other = computed.other_bytes if spec.origin == "hf" else 0
    layers = max(0, total - embed - output - other)
    if spec.origin == "hf":
        src = "safetensors headers"
    elif spec.file_embed_bytes is None:
        src = "GGUF file's size (per-tensor sizes computed)"
    else:
        src = "GGUF tensor table"
    return Weights(
        params=int(spec.file_params or computed.params),
        total_bytes=total,
        embed_bytes=embed,
        output_bytes=output,
        layer_bytes=layers,
        other_bytes=other,
        source=f"real byte sizes from the {src} of {spec.path}",
        vision_bytes=computed.vision_bytes if spec.origin == "hf" else 0,
    )


# ------------------------------------------------------------------------------------------ KV cache


@dataclass(frozen=True)
class KvLayout:
    """KV cache of one sequence, on one basis (per GPU for tensor parallel, or all cards)."""

    full_bytes_per_token: float
    sliding_bytes_per_token: float
    window: int | None
    state_bytes_per_sequence: float
    block_size: int = 1

    def per_sequence(self, context: int) -> float:
        ctx = context
        if self.block_size > 1:
            ctx = math.ceil(context / self.block_size) * self.block_size
        swa = min(ctx, self.window) if self.window else ctx
        return ctx * self.full_bytes_per_token + swa * self.sliding_bytes_per_token + self.state_bytes_per_sequence


def kv_layout(spec: ModelSpec, kv_bytes: float, tp: int = 1, block_size: int = 1) -> KvLayout:
    """KV bytes per token: 2 (K and V) x layers x KV heads x head_dim x bytes per value.

    With tensor parallel each GPU holds max(1, kv_heads // tp) heads (vLLM replicates heads when
    tp > kv_heads). Linear-attention layers keep a recurrent state (stored in 16 bit) instead.
    """
    heads = max(1, spec.kv_heads // tp) if tp > 1 else spec.kv_heads
    per_layer = 2 * heads * spec.head_dim * kv_bytes
    full = spec.count(FULL) * per_layer
    sliding = spec.count(SLIDING) * per_layer
    window = spec.sliding_window if spec.count(SLIDING) else None
    if window is None and sliding:
        full, sliding = full + sliding, 0.0
    state = 0.0
    n_linear = spec.count(LINEAR)
    if n_linear:
        v_heads = max(1, spec.linear_num_value_heads // tp)
        k_heads = max(1, spec.linear_num_key_heads // tp)
        recurrent = v_heads * spec.linear_key_head_dim * spec.linear_value_head_dim
        conv = (2 * k_heads * spec.linear_key_head_dim + v_heads * spec.linear_value_head_dim) * max(
            0, spec.linear_conv_kernel_dim - 1
        )
        state = n_linear * (recurrent + conv) * 2.0
    return KvLayout(full, sliding, window, state, block_size)


# ------------------------------------------------------------------------------------------ plan


@dataclass
class Plan:
    model: str
    model_origin: str
    quant: str
    gpu: str
    gpu_name: str
    gpus: int
    engine: str
    context: int
    concurrency: int
    kv_dtype: str
    gpu_memory_utilization: float
    params: int
    weights_bytes: int
    weights_gpu_bytes: int
    weights_source: str
    kv_bytes_per_token: int
    kv_sliding_bytes_per_token: int
    kv_sliding_window: int | None
    kv_state_bytes_per_sequence: int
    kv_bytes_per_sequence: int
    kv_cache_bytes: int
    overhead_bytes: int
    overhead_assumption: str
    memory_bytes: int
    budget_bytes: int
    fits: bool
    resident: bool
    gpu_layers: int
    total_layers: int
    max_context_tokens: int
    max_concurrency: int
    kv_cache_tokens: int | None
    decode_tokps_ceiling: float
    decode_tokps_realistic: tuple[float, float]
    efficiency: tuple[float, float]
    efficiency_assumption: str
    engine_args: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    alternatives: list[dict[str, Any]] = field(default_factory=list)

    offload_assumption: str = ""

    # The names other modules use (llmfleet.knowledge.preflight, llmfleet.release.deploy, llmfleet.release.health).
    @property
    def weight_bytes(self) -> int:
        return self.weights_bytes

    @property
    def max_context_at_concurrency(self) -> int:
        return self.max_context_tokens

    @property
    def max_concurrency_at_context(self) -> int:
        return self.max_concurrency

    @property
    def decode_ceiling_tokps(self) -> float:
        return self.decode_tokps_ceiling

    @property
    def realistic_tokps(self) -> tuple[float, float]:
        return self.decode_tokps_realistic

    @property
    def assumptions(self) -> dict[str, str]:
        """Each assumption the figures rest on, by name, with where it comes from."""
        out = {
            "weights": self.weights_source,
            "overhead": self.overhead_assumption,
            "efficiency": self.efficiency_assumption,
            "kv_cache": (
                "2 (K and V) x attention layers x KV heads x head_dim x "
                f"{self.kv_dtype} bytes per value; sliding-window layers stop at their window, "
                "linear-attention layers keep a fixed state"
            ),
        }
        if self.offload_assumption:
            out["offload"] = self.offload_assumption
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["decode_tokps_realistic"] = list(self.decode_tokps_realistic)
        d["efficiency"] = list(self.efficiency)
        d["assumptions"] = self.assumptions
        return d


@dataclass(frozen=True)
class _Resolved:
    spec: ModelSpec
    quant: Quant
    gpu: Gpu
    engine: str
    kv_name: str
    kv_bytes: float
    kv_flag: str
    weights: Weights
    notes: tuple[str, ...]


def _resolve_model(model: str | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    text = str(model)
    looks_like_path = text.lower().endswith((".gguf", "config.json")) or text.startswith((".", "~", os.sep))
    if looks_like_path or os.path.exists(os.path.expanduser(text)):
        from llmfleet.knowledge import modelinfo  # files are read only when a path is given

        return modelinfo.read_model(text)
    return find_model(text)  # a catalog name, alias or Hugging Face id ("Qwen/Qwen2.5-7B-Instruct")


def _quant_named(name: str) -> Quant:
    """A catalog quant, or for a GGUF file of a type the catalog lacks, a stand-in named after it."""
    try:
        return find_quant(name)
    except UsageError:
        if not name.startswith("gguf"):
            raise
        bits = ggml_type_bits()
        base = name.removeprefix("gguf-") if name.startswith("gguf-") else "f16"
        base = base if base in bits else "f16"
        return Quant(name=name, family="gguf", bits=bits[base], base=base, sources=("the file's own tensor types",))


def _resolve(req: PlanRequest) -> _Resolved:
    if req.gpus < 1:
        raise UsageError(f"--gpus must be 1 or more, got {req.gpus}")
    if req.concurrency < 1:
        raise UsageError(f"--concurrency must be 1 or more, got {req.concurrency}")
    if req.context is not None and req.context < 1:
        raise UsageError(f"--context must be 1 or more tokens, got {req.context}")
    gmu = req.gpu_memory_utilization
    if gmu is not None and not 0.0 < gmu <= 1.0:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {gmu}")
    gpu = req.gpu if isinstance(req.gpu, Gpu) else find_gpu(str(req.gpu))
    spec = _resolve_model(req.model)
    quant = find_quant(req.quant) if req.quant else None
    if req.engine:
        engine = str(req.engine).lower().replace(".", "").replace("-", "").replace("_", "")
        if engine not in ENGINES:
            raise UsageError(f"unknown engine {req.engine!r}; known: {', '.join(ENGINES)}")
    else:  # GGUF goes to llama.cpp, everything else to vLLM
        gguf_quant = quant.family == "gguf" if quant else spec.origin == "gguf"
        engine = "llamacpp" if gguf_quant else "vllm"
    notes: list[str] = []

    if quant is not None:
        pass
    elif spec.file_quant:
        quant = _quant_named(spec.file_quant)
    elif engine == "vllm":
        quant = find_quant("bf16")
        notes.append("no --quant given: planning the model's 16-bit weights (bf16)")
    else:
        gguf = ", ".join(q.name for q in load_quants() if q.family == "gguf")
        raise UsageError(f"llama.cpp serves GGUF files: give --quant ({gguf}) or a .gguf file as --model")
    explicit_group = bool(req.quant and "-g" in str(req.quant).lower().replace("_", "-").split("int")[-1])
    if spec.file_group_size and quant.group_size and quant.name == spec.file_quant and not explicit_group:
        quant = quant.with_group_size(spec.file_group_size)

    if engine == "llamacpp" and quant.family != "gguf":
        gguf = ", ".join(q.name for q in load_quants() if q.family == "gguf")
        raise UsageError(f"llama.cpp serves GGUF files, not {quant.name}; pick one of: {gguf}")
    if engine == "vllm" and quant.family == "gguf":
        notes.append("vLLM's GGUF support is experimental and slower than llama.cpp (engines-gpus-drivers.md s2.4)")

    computed = compute_weights(spec, quant)
    use_files = spec.file_weights_bytes is not None and (
        not req.quant or not spec.file_quant or _quant_named(spec.file_quant).name == quant.name
    )
    if spec.file_weights_bytes is not None and not use_files:
        notes.append(
            f"the files hold {spec.file_quant}; sizes computed from shapes for {quant.name} instead of read from files"
        )
    weights = _file_weights(spec, computed) if use_files else computed

    kv_table = kv_dtypes(engine)
    kv_key = str(req.kv_dtype or "auto").lower()
    if kv_key not in kv_table:
        raise UsageError(f"unknown KV cache dtype {req.kv_dtype!r} for {engine}; known: {', '.join(kv_table)}")
    kv = kv_table[kv_key]
    kv_flag = str(kv["flag"])
    if kv_key == "bf16" and not gpu.bf16:
        kv_flag = "f16" if engine == "llamacpp" else "auto"
        notes.append(f"{gpu.name} has no bf16 (CC {gpu.compute_capability}): KV cache in fp16 instead")
    return _Resolved(spec, quant, gpu, engine, kv_key, float(kv["bytes"]), kv_flag, weights, tuple(notes))


def _round_down(n: int, step: int) -> int:
    return n - n % step if n >= step else n


def _largest(lo: int, hi: int, ok) -> int:
    """Largest x in [lo, hi] with ok(x), assuming ok is monotone (True then False); lo - 1 if none."""
    if hi < lo or not ok(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _plan(req: PlanRequest, with_suggestions: bool) -> Plan:
    r = _resolve(req)
    spec, quant, gpu, engine, weights = r.spec, r.quant, r.gpu, r.engine, r.weights
    a: EngineAssumptions = engine_assumptions(engine)
    notes = list(r.notes)
    problems: list[str] = []  # why it does not fit: shown first
    n = req.gpus
    tp = engine == "vllm"
    gmu = req.gpu_memory_utilization or a.gpu_memory_utilization
    budget_gpu = gpu.memory_bytes * gmu

    # Basis: per GPU for vLLM tensor parallel, all cards together for llama.cpp's layer split.
    basis_budget = budget_gpu if tp else budget_gpu * n
    fixed = a.fixed_overhead_bytes if tp else a.fixed_overhead_bytes * n
    # llama.cpp keeps the token-embedding table in host memory; vLLM loads everything to the GPU.
    gpu_weights_total = weights.total_bytes if tp else weights.read_per_token
    basis_weights = gpu_weights_total / n if tp else gpu_weights_total
    layout = kv_layout(spec, r.kv_bytes, tp=n if tp else 1, block_size=a.block_size if tp else 1)
    grow = 1.0 + a.kv_fraction

    def kv_need(ctx: int, k: int) -> float:
        return k * layout.per_sequence(ctx) * grow

    pool = basis_budget - basis_weights - fixed
    resident = pool > 0
    max_ctx_model = spec.max_context
    k = req.concurrency

    def fits_ctx(ctx: int, seqs: int = k) -> bool:
        return kv_need(ctx, seqs) <= pool

    max_context = max(0, _largest(1, max_ctx_model, fits_ctx)) if resident else 0
    if req.context is not None:
        context = req.context
        if context > max_ctx_model:
            notes.append(
                f"context {context} is beyond the model's {max_ctx_model} positions (needs rope scaling to work)"
            )
    else:
        if max_context:
            context = min(max_ctx_model, _round_down(max_context, 256))
            why = f"the most that fits, up to the model's {max_ctx_model}"
        else:
            context = min(max_ctx_model, 4096)
            why = "nothing fits at any context; 4096 shown"
        notes.append(f"no --context given: planned at {context} tokens ({why})")

    per_seq = layout.per_sequence(context)
    max_conc = int(pool // (per_seq * grow)) if resident and per_seq > 0 else 0
    kv_cache_tokens = None
    if resident and layout.sliding_bytes_per_token == 0 and layout.state_bytes_per_sequence == 0:
        tokens = int(pool // (layout.full_bytes_per_token * grow))
        kv_cache_tokens = tokens - tokens % a.block_size if tp else tokens
    # A context asked for explicitly is the operator's call; one the planner picks must be useful.
    useful = req.context is not None or context >= min(min_context(), max_ctx_model)
    context_fits = resident and fits_ctx(context) and useful

    # Decode ceiling at batch 1: weights + the KV of one full-context sequence, read once per token.
    bw = gpu.bandwidth_gbps * GB
    kv_read = per_seq
    read_bytes = (weights.read_per_token / n + kv_read) if tp else (weights.read_per_token + kv_read)
    ceiling = bw / read_bytes
    eff_lo, eff_hi = a.efficiency_low, a.efficiency_high
    expected = (ceiling * eff_lo, ceiling * eff_hi)
    eff_text = f"{eff_lo:.0%}-{eff_hi:.0%} of the bandwidth ceiling ({engine}): " + "; ".join(a.efficiency_sources)

    gpu_layers = spec.num_layers
    offload_bytes = 0.0
    fits = context_fits
    if not resident:
        # How much would stay on the GPU with the KV cache for the asked context on it.
        kv_total = kv_need(context, k)
        room = basis_budget - fixed - kv_total
        per_layer = weights.layer_bytes / max(1, spec.num_layers) / (n if tp else 1)
        head = (weights.total_bytes - weights.layer_bytes) / (n if tp else 1)
        if not tp:
            head = weights.read_per_token - weights.layer_bytes  # output + final norm on the GPU
        if room <= 0:
            gpu_layers = 0
            offload_bytes = basis_weights
        else:
            gpu_layers = max(0, min(spec.num_layers, int(max(0.0, room - head) // per_layer)))
            offload_bytes = max(0.0, basis_weights - room)
        on_gpu = max(0.0, basis_weights - offload_bytes)
        t_hi = on_gpu / (bw * eff_hi) + offload_bytes / (a.offload_gbps_high * GB) + kv_read / (bw * eff_hi)
        t_lo = on_gpu / (bw * eff_lo) + offload_bytes / (a.offload_gbps_low * GB) + kv_read / (bw * eff_lo)
        t_min = on_gpu / bw + offload_bytes / (a.offload_gbps_high * GB) + kv_read / bw
        resident_ceiling = ceiling
        ceiling = 1.0 / t_min
        expected = (1.0 / t_lo, 1.0 / t_hi)
        share = offload_bytes / basis_weights if basis_weights else 1.0
        where = "host memory (CPU)" if not tp else "host memory over PCIe (--cpu-offload-gb)"
        speed = f"{expected[0]:.1f}-{expected[1]:.1f} tok/s"
        if room <= 0:
            problems.append(
                f"the KV cache for {k} x {context} tokens plus overhead alone exceed the {gmu:.0%} budget of "
                f"{n} x {gpu.name}: nothing fits"
            )
            fits = False
        elif req.offload:
            fits = context >= 1
            notes.append(
                f"OFFLOAD: {share:.0%} of the weights ({offload_bytes / GB:.1f} GB) run from {where}; "
                f"expect {speed} instead of ~{resident_ceiling * eff_lo:.0f}-{resident_ceiling * eff_hi:.0f} tok/s "
                f"resident (bound by {a.offload_gbps_low:.0f}-{a.offload_gbps_high:.0f} GB/s: "
                + "; ".join(a.offload_sources)
                + ")"
            )
        else:
            fits = False
            problems.append(
                f"REFUSED: the weights ({gpu_weights_total / GB:.1f} GB on the GPU) do not fit {n} x {gpu.name} "
                f"({gpu.memory_bytes / GIB:.1f} GiB, {gmu:.0%} usable) with overhead; only {gpu_layers} of "
                f"{spec.num_layers} layers would be resident and decode would fall to ~{speed} "
                f"(measured: 1/8 of the layers off the GPU is 4.5x slower, half is 13x). "
                f"Use a smaller quant, a shorter context or more GPUs, or pass --offload to accept it"
            )
        if req.offload and fits:
            # The layer split is made for the asked context and sequences: more of either moves more
            # layers off the GPU, so the plan holds exactly what was asked.
            max_context, max_conc = context, k
    elif not context_fits:
        if not useful:
            problems.append(
                f"only {max_context} tokens of context fit; below {min_context()} tokens is not a useful service"
            )
        else:
            problems.append(
                f"the weights fit but the KV cache for {k} x {context} tokens "
                f"({kv_need(context, k) / GB:.1f} GB) exceeds the {max(0.0, pool) / GB:.1f} GB left; "
                f"fits: {max_context} tokens at {k} sequences or {max_conc} sequences at {context} tokens"
            )

    total_overhead = a.fixed_overhead_bytes * n + a.kv_fraction * kv_need(context, k) / grow * (n if tp else 1)
    overhead_text = (
        f"{a.fixed_overhead_bytes / GIB:.2f} GiB per GPU (CUDA context {a.cuda_context_bytes / GIB:.2f}, "
        f"activations {a.activation_bytes / GIB:.2f}, CUDA graphs {a.cuda_graph_bytes / GIB:.2f} GiB)"
        + (f" + {a.kv_fraction:.0%} of the KV cache for compute buffers" if a.kv_fraction else "")
        + ": "
        + "; ".join(a.overhead_sources)
    )

    # Notes on the figures.
    if spec.count(SLIDING):
        notes.append(
            f"{spec.count(SLIDING)} of {spec.num_layers} layers use a {spec.sliding_window}-token sliding window: "
            f"their KV stops growing there (assumes the engine's sliding-window-aware cache)"
        )
    if spec.count(LINEAR):
        notes.append(
            f"{spec.count(LINEAR)} of {spec.num_layers} layers are linear attention: no KV cache, a fixed "
            f"{layout.state_bytes_per_sequence / 2**20:.0f} MiB state per sequence; only the {spec.count(FULL)} "
            f"full-attention layers keep KV"
        )
    if not gpu.bf16 and quant.name in ("bf16", "fp16"):
        notes.append(f"{gpu.name} has no bf16 (CC {gpu.compute_capability}): weights run as float16")
    if tp and (not gpu.bf16 or quant.name == "fp16") and spec.model_type.startswith("gemma"):
        notes.append("Gemma models are trained in bf16: float16 activations may overflow (U); test the output")
    if not tp and not weights.tied:
        notes.append(
            f"llama.cpp keeps the token-embedding table ({weights.embed_bytes / GB:.2f} GB) in host memory"
        )
    if tp and n > 1 and (spec.heads % n or (spec.kv_heads % n and n % spec.kv_heads)):
        fits = False
        problems.append(
            f"REFUSED: vLLM needs the {spec.heads} attention heads and {spec.kv_heads} KV heads to split evenly "
            f"over {n} GPUs (tensor parallel)"
        )
    if not tp and r.kv_flag not in ("f16", "bf16", "f32"):
        notes.append(
            f"a {r.kv_flag} V cache needs flash attention: llama-server builds that take -fa on|off|auto turn it "
            "on by themselves (auto); on older builds (a bare -fa switch, e.g. b5000) add -fa to engine_args"
        )
    if not tp and n > 1:
        notes.append(f"llama.cpp splits layers over {n} GPUs: memory adds up, decode speed does not")
    if tp and n > 1:
        notes.append(f"tensor parallel over {n} GPUs: ceiling assumes ideal scaling of bandwidth")
    if weights.source.startswith("computed") and spec.origin == "catalog" and quant.family == "hf" and quant.group_size:
        notes.append(f"{quant.name}: group size {quant.group_size} assumed (scales and zeros add {quant.group_bits / quant.group_size:.2f} bits/weight)")

    args = _engine_args(req, r, context, k, gmu, gpu_layers, resident, offload_bytes)
    model_kv = kv_layout(spec, r.kv_bytes)  # the whole model, all cards: the figure people compare
    plan = Plan(
        model=spec.name,
        model_origin=spec.origin,
        quant=quant.name + (f"-g{quant.group_size}" if quant.group_size and quant.group_size != 128 else ""),
        gpu=gpu.id,
        gpu_name=gpu.name,
        gpus=n,
        engine=engine,
        context=context,
        concurrency=k,
        kv_dtype=r.kv_name,
        gpu_memory_utilization=gmu,
        params=int(weights.params),
        weights_bytes=int(weights.total_bytes),
        weights_gpu_bytes=int(gpu_weights_total - offload_bytes * (n if tp else 1)),
        weights_source=weights.source,
        kv_bytes_per_token=int(model_kv.full_bytes_per_token),
        kv_sliding_bytes_per_token=int(model_kv.sliding_bytes_per_token),
        kv_sliding_window=model_kv.window,
        kv_state_bytes_per_sequence=int(model_kv.state_bytes_per_sequence),
        kv_bytes_per_sequence=int(model_kv.per_sequence(context)),
        kv_cache_bytes=int(model_kv.per_sequence(context) * k),
        overhead_bytes=int(total_overhead),
        overhead_assumption=overhead_text,
        memory_bytes=gpu.memory_bytes * n,
        budget_bytes=int(budget_gpu * n),
        fits=bool(fits),
        resident=bool(resident),
        gpu_layers=gpu_layers,
        total_layers=spec.num_layers,
        max_context_tokens=int(max_context),
        max_concurrency=int(max_conc),
        kv_cache_tokens=kv_cache_tokens,
        decode_tokps_ceiling=round(ceiling, 2),
        decode_tokps_realistic=(round(expected[0], 2), round(expected[1], 2)),
        efficiency=(eff_lo, eff_hi),
        efficiency_assumption=eff_text,
        offload_assumption=(
            f"weights off the GPU stream at {a.offload_gbps_low:.0f}-{a.offload_gbps_high:.0f} GB/s: "
            + "; ".join(a.offload_sources)
        ) if not resident else "",
        engine_args=args,
        notes=problems + notes,
    )
    if with_suggestions and not plan.fits:
        plan.alternatives = _suggest(req, plan, r)
    return plan


def _engine_args(
    req: PlanRequest, r: _Resolved, context: int, k: int, gmu: float, gpu_layers: int, resident: bool, offload: float
) -> list[str]:
    gpu, quant, spec = r.gpu, r.quant, r.spec
    if r.engine == "vllm":
        args: list[str] = []
        method = quant.vllm_cc80 if (quant.vllm_cc80 and gpu.cc >= (8, 0)) else quant.vllm
        if method:
            args += ["--quantization", method]
        if not gpu.bf16 or quant.name == "fp16":
            args += ["--dtype", "float16"]
        args += [
            "--gpu-memory-utilization", f"{gmu:.2f}",
            "--max-model-len", str(context),
            "--max-num-seqs", str(k),
            "--kv-cache-dtype", r.kv_flag,
            "--tensor-parallel-size", str(req.gpus),
        ]  # fmt: skip
        if not resident and req.offload and offload > 0:
            args += ["--cpu-offload-gb", str(math.ceil(offload / GIB))]
        return args
    # -ngl counts the output layer too: num_layers + 1 puts every layer on the GPU.
    ngl = spec.num_layers + 1 if resident else gpu_layers
    args = [
        "-ngl", str(ngl),
        "-c", str(context * k),  # the KV context is shared by the slots: each gets c / np
        "-np", str(k),
        "-ctk", r.kv_flag,
        "-ctv", r.kv_flag,
    ]  # fmt: skip
    return args


def _suggest(req: PlanRequest, plan: Plan, r: _Resolved) -> list[dict[str, Any]]:
    """Changes that would make the request fit, best first: keep quality and capacity where possible."""
    out: list[dict[str, Any]] = []

    def attempt(change: dict[str, Any], why: str, flags: str) -> bool:
        try:
            alt = _plan(replace(req, **change), with_suggestions=False)
        except UsageError:
            return False
        if not alt.fits:
            return False
        out.append(
            {
                "rank": len(out) + 1,
                "change": change,
                "flags": flags,
                "why": why,
                "max_context_tokens": alt.max_context_tokens,
                "max_concurrency": alt.max_concurrency,
                "decode_tokps_realistic": list(alt.decode_tokps_realistic),
                "weights_bytes": alt.weights_bytes,
            }
        )
        return True

    # 1. A smaller quantization of the same family (catalog models; files are what they are).
    if r.spec.origin == "catalog":
        family = "gguf" if r.engine == "llamacpp" else "hf"
        smaller = sorted(
            (q for q in load_quants() if q.family == family and q.bits < r.quant.bits and r.gpu.cc >= q.min_cc),
            key=lambda q: -q.bits,
        )
        for q in smaller:
            if attempt({"quant": q.name}, f"{q.name} weights fit with the asked context", f"--quant {q.name}"):
                break
    # 2. A smaller KV cache dtype.
    small_kv = "fp8" if r.engine == "vllm" else "q8_0"
    if r.kv_bytes > 1.5 and plan.resident:
        attempt({"kv_dtype": small_kv}, f"{small_kv} KV cache halves KV memory", f"--kv-dtype {small_kv}")
    # 3. A shorter context, 4. fewer sequences.
    if plan.resident and plan.max_context_tokens >= min_context():
        ctx = _round_down(plan.max_context_tokens, 256)
        attempt({"context": ctx}, f"the most context that fits {plan.concurrency} sequences", f"--context {ctx}")
    if plan.resident and req.concurrency > 1 and plan.max_concurrency >= 1:
        attempt(
            {"concurrency": plan.max_concurrency},
            f"the most sequences that fit at {plan.context} tokens",
            f"--concurrency {plan.max_concurrency}",
        )
    # 5. More GPUs.
    for n in (2, 4, 8):
        if n > req.gpus and attempt({"gpus": n}, f"{n} x {plan.gpu_name}", f"--gpus {n}"):
            break
    # 6. Offload, last: it works but is slow.
    if not plan.resident and not req.offload:
        attempt({"offload": True}, "accept CPU offload (slow, see notes)", "--offload")
    return out


def plan(req: PlanRequest) -> Plan:
    """Plan one deployment. Raises UsageError for unknown models, quants, GPUs or bad values."""
    return _plan(req, with_suggestions=True)


def plan_for_service(
    service: Any,
    gpu: Gpu | str | None,
    gpu_count: int = 1,
    facts: Any = None,
    model: ModelSpec | None = None,
) -> Plan:
    """Plan an inventory Service (llmfleet.inventory.services.Service) on a card.

    ``gpu`` is the card (catalog entry, id or nvidia-smi name); ``gpu_count`` the host's card count,
    used when the service takes ``gpus: all``. With ``facts`` (llmfleet.host.facts.Facts) the cards the
    service uses are read from the host: their real memory.total replaces the catalog figure, the
    card is taken from them when ``gpu`` is None, and a GGUF file's real size is compared with the
    plan. ``model`` overrides the catalog lookup of ``service.model`` (e.g. a spec read from files).
    """
    chosen = list(getattr(facts, "gpus", None) or []) if facts is not None else []
    if chosen and isinstance(service.gpus, list):
        chosen = [g for g in chosen if g.index in service.gpus]
    if gpu is None:
        if not chosen:
            raise UsageError(f"service {service.name}: no GPU known (set llmfleet_gpu or gather facts)")
        gpu = chosen[0].catalog_id or chosen[0].name
    card = gpu if isinstance(gpu, Gpu) else find_gpu(str(gpu))
    facts_note = None
    mib = [g.memory_total_mib for g in chosen if g.memory_total_mib]
    if mib and min(mib) != card.memory_mib:
        facts_note = f"GPU memory from the host's facts: {min(mib)} MiB (catalog: {card.memory_mib} MiB)"
        card = replace(card, memory_mib=int(min(mib)))
    if isinstance(service.gpus, list):
        n = len(service.gpus)
    elif chosen:
        n = len(chosen)
    else:
        n = int(gpu_count)
    mf = facts.model(service.model_path) if facts is not None and hasattr(facts, "model") else None
    size = getattr(mf, "size_bytes", None) if mf is not None and getattr(mf, "kind", "") == "file" else None
    spec: str | ModelSpec = model if model is not None else service.model
    if service.engine == "llamacpp" and not service.quant and size and getattr(mf, "magic", "GGUF") == "GGUF":
        # No quant named: the GGUF file on the host is what it is; take its real size.
        base = spec if isinstance(spec, ModelSpec) else _resolve_model(spec)
        spec = replace(base, origin="gguf", path=f"{service.model_path} (size from the host's facts)",
                       file_weights_bytes=int(size), file_quant="gguf", file_embed_bytes=None,
                       file_output_bytes=None, file_params=None)
        size = None  # nothing to compare: the plan uses it
    elif (
        service.engine == "llamacpp"
        and not service.quant
        and not (isinstance(spec, ModelSpec) and spec.file_quant)
        and not (isinstance(spec, str) and spec.lower().endswith(".gguf"))
    ):
        gguf = ", ".join(q.name for q in load_quants() if q.family == "gguf")
        raise UsageError(
            f"service {service.name}: llama.cpp with no quant and the GGUF file's size unknown; set quant ({gguf}) "
            f"on the service, or gather the host's facts (invoke plan --host HOST --gather)"
        )
    req = PlanRequest(
        model=spec,
        quant=service.quant,
        gpu=card,
        gpus=max(1, n),
        context=service.context,
        concurrency=service.concurrency,
        engine=service.engine,
        kv_dtype=service.kv_dtype,
        gpu_memory_utilization=service.gpu_memory_utilization,
        offload=service.offload,
    )
    result = plan(req)
    if facts_note:
        result.notes.append(facts_note)
    if size and result.model_origin == "catalog" and abs(size - result.weights_bytes) > 0.1 * result.weights_bytes:
        result.notes.append(
            f"{service.model_path} on the host holds {size / GB:.1f} GB; the plan assumes {result.weights_bytes / GB:.1f} GB "
            f"of {result.quant} weights: check the quant"
        )
    return result


def decode_ceiling(bandwidth_gbps: float, bytes_per_token: float) -> float:
    """Batch-1 decode ceiling in tokens/s: memory bandwidth over the bytes read per token."""
    return bandwidth_gbps * GB / bytes_per_token


# ------------------------------------------------------------------------------------------ summary


@dataclass(frozen=True)
class PlanSummary:
    """What a deploy, its health check and status need from a plan: the engine flags, the shape of
    the deployment and the decode figures the health check's floor is measured against.

    Built from a ``Plan`` (``summarize``) or read back from a release's manifest (``from_dict``,
    which holds the whole plan as ``Plan.to_dict`` wrote it; unknown or mistyped keys are left empty).
    """

    engine: str = ""
    model: str = ""
    quant: str = ""
    gpu: str = ""
    gpus: int = 1
    context: int | None = None
    concurrency: int | None = None
    fits: bool | None = None
    resident: bool | None = None
    engine_args: tuple[str, ...] = ()
    decode_tokps_ceiling: float | None = None
    decode_tokps_realistic: tuple[float, float] | None = None  # (low, high), batch 1

    @classmethod
    def from_dict(cls, data: Any) -> PlanSummary | None:
        if not isinstance(data, dict):
            return None

        def num(key: str) -> float | None:
            v = data.get(key)
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        def whole(key: str) -> int | None:
            v = data.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        def text(key: str) -> str:
            v = data.get(key)
            return v if isinstance(v, str) else ""

        def flag(key: str) -> bool | None:
            v = data.get(key)
            return v if isinstance(v, bool) else None

        rng = data.get("decode_tokps_realistic")
        realistic = None
        if isinstance(rng, list | tuple) and len(rng) == 2 and all(isinstance(x, int | float) for x in rng):
            realistic = (float(rng[0]), float(rng[1]))
        args = data.get("engine_args")
        return cls(
            engine=text("engine"), model=text("model"), quant=text("quant"), gpu=text("gpu"),
            gpus=whole("gpus") or 1, context=whole("context"), concurrency=whole("concurrency"),
            fits=flag("fits"), resident=flag("resident"),
            engine_args=tuple(str(a) for a in args) if isinstance(args, list | tuple) else (),
            decode_tokps_ceiling=num("decode_tokps_ceiling"), decode_tokps_realistic=realistic,
        )


def summarize(plan: Plan | PlanSummary | None) -> PlanSummary | None:
    """The summary of a plan (a summary is returned as it is; no plan, no summary)."""
    if plan is None or isinstance(plan, PlanSummary):
        return plan
    return PlanSummary(
        engine=plan.engine, model=plan.model, quant=plan.quant, gpu=plan.gpu, gpus=plan.gpus,
        context=plan.context, concurrency=plan.concurrency, fits=plan.fits, resident=plan.resident,
        engine_args=tuple(plan.engine_args), decode_tokps_ceiling=plan.decode_tokps_ceiling,
        decode_tokps_realistic=tuple(plan.decode_tokps_realistic),  # type: ignore[arg-type]
    )
