"""llama.cpp (llama-server): what llmfleet knows about the engine beyond the catalog's per-release facts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from llmfleet.knowledge import compat
from llmfleet.knowledge.compat import EngineRelease, EngineRules, Verdict
from llmfleet.knowledge.engines import loadlog
from llmfleet.knowledge.engines.base import EngineKnowledge, PlanFlags

_FA_OFF = ("off", "0", "false")
_FA_VALUES = ("on", "off", "auto", "1", "0", "true", "false")


class LlamaCppKnowledge(EngineKnowledge):
    name = "llamacpp"
    quant_family = "gguf"
    serves_only_quant_family = True  # it reads GGUF files only
    kv_flag_without_bf16 = "f16"
    small_kv_dtype = "q8_0"
    embedding_on_gpu = False  # llama-model.cpp keeps the input layer on the CPU
    offload_moves_layers = True  # -ngl: layers left off the GPU run on the CPU
    sizes_from_host_file = True
    split_modes = ("layer", "row")  # --split-mode: the first is the default
    split_word = "layer split"
    cross_host_word = "llama.cpp RPC"
    offload_where = "host memory (CPU)"
    # several hosts: the head's llama-server drives rpc-server on each worker (tools/rpc/README.md)
    cluster_kind = "rpc"
    workers_load_model = False  # the head sends each RPC device its tensors
    workers_join_head = False  # the head connects to every worker's rpc-server (--rpc)
    worker_serves_port = True
    worker_runtime = "rpc-server"
    checks_worker_image = True  # engines.yaml rpc_server.ships per image
    label = "llama.cpp"
    model_is_file = True
    default_quant = "gguf"
    quant_unknown_note = " (llama.cpp serves GGUF files only)"
    quant_runs_on_any_card = True
    needs_torch_kernels = False
    health_path = "/health"
    metrics_flag = "--metrics"
    # --api-key guards every route but /health, /v1/health, /models, /v1/models and /api/tags
    # (tools/server/server.cpp, middleware_validate_api_key: public_endpoints), /metrics included
    metrics_need_key = True
    load_log_grep = loadlog.LLAMACPP_GREP
    metrics: ClassVar[dict[str, tuple[str, ...]]] = {
        "requests_running": ("llamacpp:requests_processing",),
        "requests_waiting": ("llamacpp:requests_deferred",),
        "kv_cache_usage": ("llamacpp:kv_cache_usage_ratio",),
        "generation_tokens_total": ("llamacpp:tokens_predicted_total",),
        "prompt_tokens_total": ("llamacpp:prompt_tokens_total",),
    }
    # llama-server adds a request's tokens to tokens_predicted_total / prompt_tokens_total only when it
    # ends; n_decode_total counts every llama_decode() call, so it moves during a long stream
    # (tools/server/server.cpp, server_metrics::on_decoded)
    progress_metrics = ("llamacpp:n_decode_total", "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total")

    def deploy_adds(self, hosts: int, gpus: int) -> list[str]:
        if hosts <= 1:
            return []
        return [
            f"`--rpc HOST:PORT,...` on the head, the {hosts - 1} worker(s) in the inventory's order: the "
            f"--tensor-split shares are {gpus} per worker in that order (RPC devices come first), then the head's {gpus}",
            f"`rpc-server` on each worker exposing its {gpus} GPU(s) as RPC devices, on a port the head can reach "
            "and nothing else can",
        ]

    def cluster_head_args(self, *, endpoints: Sequence[str], size: int, given: Callable[[str], bool]) -> list[str]:
        """``--rpc w1:PORT,w2:PORT``: the workers' rpc-server endpoints, in the inventory's order."""
        return ["--rpc", ",".join(endpoints)]

    def arch_fix(self, rel: EngineRelease, cc: str) -> str:
        return "use a llama.cpp image built with SASS for this card, e.g. llamacpp:b5000-cu122"

    def check_dtype(self, rel: EngineRelease, rules: EngineRules, quant: str | None, args: list[str],
                    cc: str | None, bf16_native: bool | None) -> Verdict:
        if rel.cpu:
            return Verdict("pass", f"{rel.key} is a CPU image: dtype is the engine's CPU choice")
        t = compat.cc_tuple(cc)
        if t is None:
            return Verdict("warn", "compute capability unknown: cannot check bf16 support",
                           "add the card to catalog/gpus.yaml")
        has_bf16 = bf16_native if bf16_native is not None else t >= (8, 0)
        if has_bf16:
            return Verdict("pass", f"compute capability {cc} supports bf16 and fp16")
        if (quant or "").lower() in rules.dtype_needs_bf16:
            return Verdict("fail", f"quant {quant} needs bf16, which compute capability {cc} lacks (needs 8.0)",
                           "use an f16 or quantized GGUF instead of bf16")
        return Verdict("pass", f"dtype f16 on compute capability {cc} (no bf16 needed)")

    def check_attention(self, rel: EngineRelease, args: list[str], env: dict[str, str], cc: str | None) -> Verdict:
        fa = flash_attn_setting(args)
        if fa is None:
            return Verdict("pass", "llama.cpp picks its attention kernels itself (flash attention flag not set)")
        if rel.flash_attn_flag == "value" and fa == "bare":
            return Verdict("fail", f"{rel.key} takes -fa on|off|auto; a bare -fa stops the server at start",
                           "write -fa on (or remove it)")
        if rel.flash_attn_flag == "bare" and fa != "bare":
            return Verdict("fail", f"{rel.key} takes a bare -fa switch; '-fa {fa}' stops the server at start",
                           "write a bare -fa (or remove it)")
        return Verdict("pass", f"llama.cpp flash attention ({fa}) has kernels for every CUDA card (tile/vec)")

    def check_kv_dtype(self, rel: EngineRelease, rules: EngineRules, kv_dtype: str | None, args: list[str],
                       env: dict[str, str], cc: str | None) -> Verdict:
        kv = (compat.arg_value(args, "-ctk", "--cache-type-k") or kv_dtype or "auto").lower()
        kv_v = (compat.arg_value(args, "-ctv", "--cache-type-v") or kv).lower()
        if kv not in rules.kv_dtypes:
            return Verdict("fail", f"KV cache dtype {kv!r} is not one llamacpp knows",
                           f"use one of: {', '.join(rules.kv_dtypes)}")
        if kv_v not in rules.kv_dtypes:
            return Verdict("fail", f"V cache dtype {kv_v!r} is not one llama.cpp knows",
                           f"use one of: {', '.join(rules.kv_dtypes)}")
        v = v_cache_verdict(rel, rules, kv_v, flash_attn_setting(args))
        if v.status != "pass":
            return v
        fa = cuda_fa_pair_verdict(rel, rules, kv, kv_v, flash_attn_setting(args))
        if fa is not None:
            return fa
        return Verdict("pass", f"KV cache {kv}/{kv_v} on llama.cpp" + (f"; {v.message}" if kv_v in
                                                                        rules.kv_needs_flash_attn else ""))

    def check_kv_head(self, rel: EngineRelease, rules: EngineRules, kv_dtype: str | None, args: list[str],
                      head_dim: int) -> Verdict | None:
        kv = (compat.arg_value(args, "-ctk", "--cache-type-k") or kv_dtype or "auto").lower()
        kv_v = (compat.arg_value(args, "-ctv", "--cache-type-v") or kv).lower()
        return cuda_fa_head_verdict(rel, kv, kv_v, flash_attn_setting(args), head_dim)

    def parse_load_log(self, text: str) -> loadlog.LoadReport:
        return loadlog.parse_llamacpp(text)

    def kv_tokens_asked(self, args: list[str]) -> int | None:
        """``-c``: the whole KV context, shared by the slots (0 means the model's own length)."""
        v = compat.arg_value(args, "-c", "--ctx-size")
        return int(v) if v is not None and v.isdigit() and int(v) > 0 else None

    def engine_args(self, flags: PlanFlags) -> list[str]:
        """The llama-server flags for a plan; adds flash attention in the form the build takes when
        the V cache is quantized and the build would otherwise run without it. With several devices:
        ``--split-mode`` and ``--tensor-split`` (one share per device, in llama.cpp's device order: RPC
        devices first, then local GPUs); the head's ``--rpc`` endpoints are the deploy side's."""
        f = flags
        num_layers, resident, gpu_layers, context, concurrency = f.num_layers, f.resident, f.gpu_layers, f.context, \
            f.concurrency
        kv_flag, release, rules, split_mode, tensor_split = f.kv_flag, f.release, f.rules, f.split_mode, f.tensor_split
        ngl = num_layers + 1 if resident else gpu_layers  # -ngl counts the output layer too
        args = [
            "-ngl", str(ngl),
            "-c", str(context * concurrency),  # the KV context is shared by the slots: each gets c / np
            "-np", str(concurrency),
            "-ctk", kv_flag,
            "-ctv", kv_flag,
        ]  # fmt: skip
        if tensor_split and len(tensor_split) > 1:
            # Several devices (local GPUs, and RPC devices first when the head has --rpc workers).
            args += ["--split-mode", split_mode or "layer", "--tensor-split", ",".join(str(s) for s in tensor_split)]
        if release is not None and release.load_log is not None and release.load_log.verbosity:
            # the load lines the residency check reads (offloaded layers, buffers per device, KV cache)
            args += ["-lv", str(release.load_log.verbosity)]
        needs_fa = rules.kv_needs_flash_attn if rules is not None else []
        if kv_flag in needs_fa and release is not None and fa_default(release) == "off":
            args += flash_attn_on_args(release)
        return args


def flash_attn_setting(args: list[str]) -> str | None:
    """llama.cpp's -fa as given: 'on'/'off'/'auto'/..., 'bare' for a bare switch, None when absent."""
    found: str | None = None
    for i, a in enumerate(args):
        if a in ("-fa", "--flash-attn"):
            nxt = args[i + 1] if i + 1 < len(args) else ""
            found = nxt.lower() if nxt.lower() in _FA_VALUES else "bare"
        elif a.startswith("--flash-attn="):
            found = a.split("=", 1)[1].lower()
    return found


def fa_default(rel: EngineRelease) -> str:
    """What no -fa means in this build: the catalog's flash_attn_default; a build with a bare switch
    and no recorded default is off (the switch turns it on)."""
    if rel.flash_attn_default:
        return rel.flash_attn_default
    return "off" if rel.flash_attn_flag == "bare" else "auto"


def flash_attn_on_args(rel: EngineRelease) -> list[str]:
    return ["-fa"] if rel.flash_attn_flag == "bare" else ["-fa", "on"]


def v_cache_verdict(rel: EngineRelease, rules: EngineRules, kv_v: str, fa: str | None) -> Verdict:
    """A quantized V cache needs flash attention. ``fa`` is what the flags say (None: absent); on a
    build where flash attention is off by default an absent -fa counts as off. Pure."""
    if kv_v not in rules.kv_needs_flash_attn:
        return Verdict("pass", f"V cache {kv_v} needs no flash attention")
    effective = fa if fa is not None else fa_default(rel)
    if effective == "bare":
        effective = "on"
    if effective in _FA_OFF:
        said = "is off" if fa is not None else f"is off by default in {rel.key} and -fa is not given"
        return Verdict("fail", f"a quantized V cache ({kv_v}) needs flash attention, which {said} (llama.cpp "
                               "refuses the context: V cache quantization requires flash attention)",
                       f"add {' '.join(flash_attn_on_args(rel))}, or use -ctv f16")
    return Verdict("pass", f"quantized V cache {kv_v} with flash attention {effective}")


def _cache_type(t: str) -> str:
    return "f16" if t in ("auto", "fp16") else t


def _fa_effective(rel: EngineRelease, fa: str | None) -> str:
    effective = fa if fa is not None else fa_default(rel)
    return "on" if effective == "bare" else effective


_NEWER = "llamacpp:server-cuda-12.8"  # the catalog's newest llama.cpp GPU image


def cuda_fa_pair_verdict(rel: EngineRelease, rules: EngineRules, kv_k: str, kv_v: str,
                         fa: str | None) -> Verdict | None:
    """Has ggml-cuda a flash-attention kernel for this K/V cache pair in this build? None when flash
    attention is off or the pair runs; a FAIL when it does not (a WARN when the build flag is not
    known, or the build's table was not read). Pure, from the image's ``cuda_flash_attn_kv`` (read at
    its build) and its ``fa_all_quants``."""
    if rel.cpu:
        return None
    effective = _fa_effective(rel, fa)
    if effective in _FA_OFF:
        return None
    k, v = _cache_type(kv_k), _cache_type(kv_v)
    table = rel.cuda_flash_attn_kv
    if table is None:
        if k == v == "f16":
            return None
        return Verdict("warn", f"{rel.key}: which K/V cache types its ggml-cuda flash attention has kernels for was "
                               f"not read for this build, so K {k} / V {v} is not judged",
                       "record it in engines.yaml cuda_flash_attn_kv (bench/record_llamacpp_rules.py), or use -ctk f16 -ctv f16")
    flag = rel.fa_all_quants
    all_quants = flag is not None and flag.enabled
    cpu = [t for t in (k, v) if t in table.cpu_types]
    if all_quants:
        runs = k in table.all_quants_types and v in table.all_quants_types
    elif table.any_pair:
        runs = k in table.types and v in table.types
    else:
        runs = (k == v and k in table.types) or [k, v] in table.mixed
    if not cpu and (runs or (effective == "auto" and v not in rules.kv_needs_flash_attn)):
        return None  # auto turns flash attention off, which an unquantized V cache does not need
    build = f"build {table.build}" if table.build else "its build"
    fix_types = ", ".join(t for t in table.types if t != "f32" and t not in table.cpu_types)
    fix = (f"use -ctk and -ctv of one type among {fix_types}"
           + "".join(f", or -ctk {a} -ctv {b}" for a, b in table.mixed)
           + ("; or an image built with -DGGML_CUDA_FA_ALL_QUANTS=ON" if not all_quants else "")
           + (f"; or image {_NEWER}" if rel.key != _NEWER else ""))
    if cpu:
        return Verdict("fail", f"{rel.key} ({build}) has no CUDA flash-attention kernel for a {cpu[0]} K/V cache: "
                               f"ggml-cuda's supports_op refuses it, so the attention runs on the CPU at this build "
                               f"({table.source})", fix.replace("use -ctk", "use --kv-dtype f16 (-ctk f16 -ctv f16), or -ctk", 1))
    pairs = ", ".join(table.types) + "".join(f"; K {a} with V {b}" for a, b in table.mixed)
    built = ("built with GGML_CUDA_FA_ALL_QUANTS" if all_quants else
             "built without GGML_CUDA_FA_ALL_QUANTS" if flag is not None else
             "whose GGML_CUDA_FA_ALL_QUANTS setting is not known (the default is OFF)")
    what = (f"{rel.key} ({build}, {built}{f', confidence {flag.confidence}: {flag.source}' if flag is not None else ''}) "
            f"has no CUDA flash-attention kernel for K {k} / V {v}: without that flag ggml-cuda takes K and V of one type "
            f"({pairs}) ({table.source})")
    if table.outside == "abort":
        then = ("where supports_op accepts the pair (b5000: head size 128) ggml-cuda finds no vector kernel for it "
                "and the server aborts ('Unsupported KV type combination'); elsewhere the attention runs on the CPU")
    else:
        then = ("with -fa on the attention runs on the CPU; with -fa auto flash attention is turned off"
                + (", and the quantized V cache then stops the context" if v in rules.kv_needs_flash_attn else ""))
    if flag is None:
        return Verdict("warn", f"{what}; {then}", fix)
    return Verdict("fail", f"{what}; {then}", fix)


def cuda_fa_head_verdict(rel: EngineRelease, kv_k: str, kv_v: str, fa: str | None, head_dim: int) -> Verdict | None:
    """A quantized K/V cache on a build whose ggml-cuda flash attention has quantized kernels only at some
    head sizes (b5000: 128): at another head size supports_op refuses it and the attention runs on the
    CPU. None when flash attention is off, nothing is quantized, or the head size is covered. Pure."""
    table = rel.cuda_flash_attn_kv
    if rel.cpu or table is None or table.quant_head_sizes is None:
        return None
    if _fa_effective(rel, fa) in _FA_OFF:
        return None
    quant = [t for t in (_cache_type(kv_k), _cache_type(kv_v)) if t not in ("f16", "f32", "bf16")]
    if not quant or head_dim in table.quant_head_sizes:
        return None
    sizes = ", ".join(str(d) for d in table.quant_head_sizes)
    return Verdict("fail", f"{rel.key} (build {table.build}) has CUDA flash-attention kernels for a quantized K/V cache "
                           f"({quant[0]}) only at head size {sizes}; this model's is {head_dim}, so supports_op refuses it "
                           f"and the attention runs on the CPU at this build ({table.source})",
                   f"use --kv-dtype f16 (-ctk f16 -ctv f16), or image {_NEWER}")


KNOWLEDGE = LlamaCppKnowledge()
