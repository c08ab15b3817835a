"""vLLM: what llmfleet knows about the engine beyond the catalog's per-release facts."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

from llmfleet.knowledge import compat
from llmfleet.knowledge.compat import EngineCatalog, EngineRelease, EngineRules, Verdict
from llmfleet.knowledge.engines import loadlog
from llmfleet.knowledge.engines.base import EngineKnowledge, KvLayoutInfo, PlanFlags

if TYPE_CHECKING:
    from llmfleet.knowledge.catalog import Quant

_GIB = 1024**3


class VllmKnowledge(EngineKnowledge):
    name = "vllm"
    quant_family = "hf"
    kv_flag_without_bf16 = "auto"
    small_kv_dtype = "fp8"
    embedding_on_gpu = True
    plan_default_quant = "bf16"  # a plan without --quant sizes the model's 16-bit weights
    attention_backend_env = "VLLM_ATTENTION_BACKEND"
    split_modes = ("tensor",)  # --tensor-parallel-size within a host, pipeline stages over hosts
    split_word = "tensor parallel"
    cross_host_word = "pipeline parallel"
    foreign_quant_note = ("vLLM's GGUF support is experimental and under-optimized (https://docs.vllm.ai/en/latest/"
                          "features/quantization/gguf/); llama.cpp serves GGUF natively")
    offload_where = "host memory over PCIe (--cpu-offload-gb)"
    fp16_activations = True  # --dtype float16 on a card without bf16
    # several hosts: a Ray cluster, one pipeline stage per host (docs/serving/parallelism_scaling.md)
    cluster_kind = "ray"
    workers_load_model = True  # each stage loads its layers from the worker's own model path
    workers_join_head = True  # `ray start --address HEAD:PORT` on the workers; the head waits for them
    worker_serves_port = False  # Ray's worker ports are picked at random
    worker_runtime = "Ray worker"
    label = "vLLM"
    model_is_file = False
    default_quant = "fp16"
    needs_torch_kernels = True
    inspect_method = "python"
    health_path = "/health"
    load_log_grep = loadlog.VLLM_GREP
    metrics: ClassVar[dict[str, tuple[str, ...]]] = {
        "requests_running": ("vllm:num_requests_running",),
        "requests_waiting": ("vllm:num_requests_waiting",),
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "generation_tokens_total": ("vllm:generation_tokens_total",),
        "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    }
    # both counted per engine step (the V1 engine's IterationStats, vllm/v1/metrics/stats.py), so a long
    # stream advances them while it runs
    progress_metrics = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")

    # -------------------------------------------------------------------- several hosts
    def deploy_adds(self, hosts: int, gpus: int) -> list[str]:
        if hosts <= 1:
            return []
        return [
            f"a Ray cluster over the {hosts} hosts before `vllm serve` on the head: `ray start --head` there, "
            "`ray start --address HEAD:PORT` on each worker (vLLM places one pipeline stage per host)",
            "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME (and VLLM_HOST_IP) naming each host's interface on the "
            "hosts' network; host networking and enough shared memory for the engine containers",
        ]

    def cluster_head_args(self, *, endpoints: Sequence[str], size: int, given: Callable[[str], bool]) -> list[str]:
        """One pipeline stage per host over Ray, unless the service's flags say otherwise."""
        args: list[str] = []
        if not given("--pipeline-parallel-size"):
            args += ["--pipeline-parallel-size", str(size)]
        if not given("--distributed-executor-backend"):
            args += ["--distributed-executor-backend", "ray"]
        return args

    def cluster_env(self, address: str, interface: str | None) -> dict[str, str]:
        """The member's address for vLLM and Ray; NCCL and Gloo on the cluster network's NIC."""
        env = {"VLLM_HOST_IP": address, "RAY_NODE_IP_ADDRESS": address}
        if interface:
            env |= {"NCCL_SOCKET_IFNAME": interface, "GLOO_SOCKET_IFNAME": interface}
        return env

    # -------------------------------------------------------------------- kernels and driver
    def arch_fix(self, rel: EngineRelease, cc: str) -> str:
        t = compat.cc_tuple(cc) or (0, 0)
        if t < (7, 0):
            return "no official vLLM image supports compute capability below 7.0: serve this card with llama.cpp"
        if t < (7, 5):
            return ("use a vLLM image whose engine and PyTorch both carry sm_70: vllm:0.19.1 (torch 2.10 cu129) or "
                    "vllm:0.19.1-volta (torch cu126); vllm:0.9.2 and 0.10.1.1 ship torch 2.7 cu128 without sm_70; "
                    "or llama.cpp")
        return "pick an image whose kernels and PyTorch build cover this compute capability (catalog/engines.yaml)"

    def minor_version_verdict(self, rel: EngineRelease, cat: EngineCatalog, *, driver: str, native: str,
                              card: str, fwd_reason: str, upgrade: str) -> Verdict | None:
        """vLLM compiles its Triton kernels at start with the ptxas Triton bundles: the driver only
        loads SASS, so minor-version compatibility is a WARN (the catalog's rule and confidence)."""
        rule = cat.compat_rules.get("minor_version_triton")
        status = rule.verdict if rule is not None else "warn"
        conf = rule.confidence if rule is not None else "U"
        return Verdict(
            status if status != "pass" else "warn",
            f"driver {driver} (CUDA {native}) runs CUDA {rel.cuda} only through minor-version compatibility (limited "
            f"feature set); {rel.key} has SASS for {card}, and its Triton kernels are compiled by Triton's own ptxas, "
            f"so no driver PTX JIT is needed (rule confidence {conf}); forward compatibility is out: {fwd_reason}",
            f"{upgrade} for native support",
        )

    # -------------------------------------------------------------------- dtype
    def check_dtype(self, rel: EngineRelease, rules: EngineRules, quant: str | None, args: list[str],
                    cc: str | None, bf16_native: bool | None) -> Verdict:
        if rel.cpu:
            return Verdict("pass", f"{rel.key} is a CPU image: dtype is the engine's CPU choice")
        t = compat.cc_tuple(cc)
        dtype = (compat.arg_value(args, "--dtype") or "auto").lower()
        q = (quant or "").lower()
        wants_bf16 = q in rules.dtype_needs_bf16 or dtype in ("bfloat16", "bf16")
        if t is None:
            return Verdict("warn", "compute capability unknown: cannot check bf16 support",
                           "add the card to catalog/gpus.yaml")
        has_bf16 = bf16_native if bf16_native is not None else t >= (8, 0)
        if has_bf16:
            return Verdict("pass", f"compute capability {cc} supports bf16 and fp16")
        if dtype in ("float16", "half", "fp16") and q in rules.dtype_needs_bf16:
            return Verdict("pass", f"--dtype {dtype}: the {quant} checkpoint is cast to float16 on compute capability "
                                   f"{cc} (no bf16 below 8.0); models trained in bf16 may overflow in fp16")
        if wants_bf16:
            what = f"--dtype {dtype}" if dtype in ("bfloat16", "bf16") else f"quant {quant}"
            return Verdict("fail", f"{what} needs bf16, which compute capability {cc} lacks (needs 8.0)",
                           "pass --dtype float16 (and a float16 or quantized checkpoint)")
        if dtype == "auto":
            return Verdict("warn", f"--dtype auto on compute capability {cc}: a bf16 checkpoint would need bf16 (8.0)",
                           "pass --dtype float16 in engine_args")
        return Verdict("pass", f"dtype {dtype} on compute capability {cc} (no bf16 needed)")

    # -------------------------------------------------------------------- attention and KV cache
    @staticmethod
    def requested_backend(args: list[str], env: dict[str, str]) -> str | None:
        b = compat.arg_value(args, "--attention-backend") or env.get("VLLM_ATTENTION_BACKEND")
        return b.upper() if b else None

    def effective_backend(self, rel: EngineRelease, args: list[str], env: dict[str, str],
                          cc: str | None) -> str | None:
        if rel.attention is None:
            return None
        req = self.requested_backend(args, env)
        if req:
            return req
        t = compat.cc_tuple(cc)
        if t is None:
            return None
        for row in rel.attention.default:
            if compat.cc_ok(t, row.min_cc):
                return row.backend
        return None

    def check_attention(self, rel: EngineRelease, args: list[str], env: dict[str, str], cc: str | None) -> Verdict:
        if rel.cpu or rel.attention is None:
            return Verdict("pass", f"{rel.key}: the engine picks its CPU attention backend")
        t = compat.cc_tuple(cc)
        req = self.requested_backend(args, env)
        if t is None:
            return Verdict("warn", "compute capability unknown: cannot check the attention backend",
                           "add the card to catalog/gpus.yaml")
        how = ("--attention-backend NAME in engine_args" if rel.attention.select == "arg"
               else "env VLLM_ATTENTION_BACKEND=NAME")
        usable = [n for n, b in rel.attention.backends.items() if compat.cc_ok(t, b.min_cc)]
        if req:
            b = rel.attention.backends.get(req)
            if b is None:
                return Verdict("fail", f"attention backend {req} is not in {rel.key} (it has "
                                       f"{', '.join(rel.attention.backends)})", f"set one of {', '.join(usable)} via {how}")
            if not compat.cc_ok(t, b.min_cc):
                return Verdict("fail", f"attention backend {req} needs compute capability {b.min_cc}; the card has {cc}",
                               f"set one of {', '.join(usable)} via {how}")
            if rel.attention.select == "env" and compat.arg_value(args, "--attention-backend"):
                return Verdict("fail", f"{rel.key} has no --attention-backend flag",
                               "use env VLLM_ATTENTION_BACKEND instead")
            return Verdict("pass", f"attention backend {req} runs on compute capability {cc}")
        eff = self.effective_backend(rel, args, env, cc)
        if eff is None:
            return Verdict("fail", f"{rel.key} has no attention backend for compute capability {cc}",
                           "choose another image (catalog/engines.yaml)")
        v0 = ""
        if rel.v1_min_cc and not compat.cc_ok(t, rel.v1_min_cc):
            v0 = f" (the V0 engine: V1 needs {rel.v1_min_cc} in this release)"
        return Verdict("pass", f"{rel.key} picks {eff} on compute capability {cc}{v0}")

    @staticmethod
    def kv_flag(args: list[str], kv_dtype: str | None) -> str:
        return (compat.arg_value(args, "--kv-cache-dtype") or kv_dtype or "auto").lower()

    def check_kv_dtype(self, rel: EngineRelease, rules: EngineRules, kv_dtype: str | None, args: list[str],
                       env: dict[str, str], cc: str | None) -> Verdict:
        kv = self.kv_flag(args, kv_dtype)
        if kv not in rules.kv_dtypes:
            return Verdict("fail", f"KV cache dtype {kv!r} is not one vllm knows",
                           f"use one of: {', '.join(rules.kv_dtypes)}")
        if kv == "auto" or rel.cpu:
            return Verdict("pass", f"KV cache dtype {kv}")
        eff = self.effective_backend(rel, args, env, cc)
        if eff is None or rel.attention is None:
            return Verdict("warn", f"KV cache dtype {kv}: attention backend unknown, cannot check",
                           "set the attention backend explicitly")
        return kv_dtype_verdict(rel, eff, kv, cc)

    # -------------------------------------------------------------------- planning
    def kv_layout(self, rel: EngineRelease | None, cc: str | None) -> KvLayoutInfo | None:
        """V1 keeps only the window (hybrid allocator); the V0 engine, used below ``v1_min_cc`` in
        releases up to 0.10.1, allocates the full context for every layer (vllm RFC #11382)."""
        base = super().kv_layout(rel, cc)
        if rel is None or base is None:
            return base
        t = compat.cc_tuple(cc)
        if rel.v1_min_cc and t is not None and not compat.cc_ok(t, rel.v1_min_cc):
            return KvLayoutInfo("full", "M", f"the V0 engine of {rel.key} (V1 needs {rel.v1_min_cc}) has no hybrid "
                                             "KV allocator: every layer keeps the full context (vllm RFC #11382)")
        return base

    def quantization_flag(self, rel: EngineRelease | None, rules: EngineRules, quant: Quant, cc: str) -> str | None:
        """--quantization: the method the release itself uses for this quant on this card (its Marlin
        floors in engines.yaml are the one source), spelled as the flag takes it."""
        if rel is None:
            return quant.vllm  # no build known: the generic method; vLLM upgrades to Marlin by itself
        method = compat.quant_method_for(rel, rules, quant.name, [], cc)
        if method is None:
            return quant.vllm  # nothing runs on the card: the preflight's rules refuse it
        if method == "none":
            return None
        inverse: dict[str, str] = {}
        for f, ms in rules.quantization_flag.items():
            for m in [ms] if isinstance(ms, str) else ms:
                if m != "from-quant":
                    inverse.setdefault(m, f)
        return inverse.get(method, quant.vllm)

    def parse_load_log(self, text: str) -> loadlog.LoadReport:
        return loadlog.parse_vllm(text)

    def kv_tokens_asked(self, args: list[str]) -> int | None:
        """``--max-model-len`` x ``--max-num-seqs``: every sequence at its full length."""
        length = compat.arg_value(args, "--max-model-len")
        seqs = compat.arg_value(args, "--max-num-seqs")
        if length is None or not length.isdigit():
            return None
        return int(length) * (int(seqs) if seqs is not None and seqs.isdigit() else 1)

    def engine_args(self, flags: PlanFlags) -> list[str]:
        """The vLLM flags for a plan. ``quantization`` is the --quantization value (choose it with
        ``compat.quant_method_for`` / ``marlin_min_cc``: the release's own floors);
        ``attention_backend`` when the plan needs one other than the default (e.g. FLASH_ATTN for
        fp8 KV on Hopper). ``hosts`` > 1: pipeline parallel, one stage per host, over Ray."""
        f = flags
        quantization, float16, context, concurrency = f.quantization, f.float16, f.context, f.concurrency
        gpu_memory_utilization, kv_flag, gpus, hosts = f.gpu_memory_utilization, f.kv_flag, f.gpus, f.hosts
        attention_backend, backend_select, offload_bytes = f.attention_backend, f.backend_select, f.offload_bytes
        args: list[str] = []
        if quantization:
            args += ["--quantization", quantization]
        if float16:
            args += ["--dtype", "float16"]
        args += [
            "--gpu-memory-utilization", f"{gpu_memory_utilization:.2f}",
            "--max-model-len", str(context),
            "--max-num-seqs", str(concurrency),
            "--kv-cache-dtype", kv_flag,
            "--tensor-parallel-size", str(gpus),
        ]  # fmt: skip
        if hosts > 1:
            # One pipeline stage per host over Ray (the deploy side starts the Ray cluster).
            args += ["--pipeline-parallel-size", str(hosts), "--distributed-executor-backend", "ray"]
        if attention_backend and backend_select == "arg":
            args += ["--attention-backend", attention_backend]
        if offload_bytes > 0:
            args += ["--cpu-offload-gb", str(math.ceil(offload_bytes / _GIB))]
        return args


def kv_dtype_verdict(rel: EngineRelease, backend: str, kv: str, cc: str | None) -> Verdict:
    """Can this attention backend hold a ``kv`` KV cache on this card in this release?

    Pure, from the release's ``attention.backends.NAME.kv_dtypes`` and ``kv_cc``: e.g. TRITON_ATTN
    with fp8 needs compute capability 8.9 (Triton has no fp8e4nv below it: vllm#26431, #7714);
    FLASH_ATTN takes fp8 only on Hopper (FA3, vllm PR #15191)."""
    if kv == "auto":
        return Verdict("pass", "KV cache dtype auto")
    if rel.attention is None:
        return Verdict("warn", f"KV cache dtype {kv}: {rel.key} lists no attention backends", "")
    b = rel.attention.backends.get(backend)
    t = compat.cc_tuple(cc)
    good = [n for n, bb in rel.attention.backends.items()
            if t is not None and compat.cc_ok(t, bb.min_cc) and kv in bb.kv_dtypes
            and compat.cc_in_spec(t, bb.kv_cc.get(kv, "any"))[0]]
    alt = (f"select {' or '.join(good)} as attention backend, or" if good else "") + " use --kv-cache-dtype auto"
    if b is None or kv not in b.kv_dtypes:
        return Verdict("fail", f"KV cache dtype {kv} is not supported by attention backend {backend} in {rel.key}",
                       alt.strip())
    if t is None:
        return Verdict("warn", f"KV cache dtype {kv} with {backend}: compute capability unknown",
                       "add the card to catalog/gpus.yaml")
    spec = b.kv_cc.get(kv)
    if spec is None:
        return Verdict("pass", f"KV cache dtype {kv} with attention backend {backend}")
    runs, confirmed = compat.cc_in_spec(t, spec)
    if not runs:
        why = ("Triton has no fp8e4nv cast below compute capability 8.9 ('type fp8e4nv not supported in this "
               "architecture', vllm#26431, #7714)" if backend.startswith("TRITON") and kv.startswith("fp8")
               else f"it runs on compute capability {spec.rstrip('?')}")
        return Verdict("fail", f"KV cache dtype {kv} with attention backend {backend} does not run on compute "
                               f"capability {cc} in {rel.key}: {why}", alt.strip())
    if not confirmed:
        return Verdict("warn", f"KV cache dtype {kv} with attention backend {backend} on compute capability {cc}: no "
                               "source confirms it runs there (catalog: unconfirmed)",
                       "test it on this card, or use --kv-cache-dtype auto")
    return Verdict("pass", f"KV cache dtype {kv} with attention backend {backend} on compute capability {cc}")


def marlin_min_cc(rel: EngineRelease) -> str | None:
    """The lowest compute capability with Marlin kernels in this release (the catalog's
    ``quantizations.gptq_marlin``): the one source the planner and preflight share."""
    return rel.quantizations.get("gptq_marlin")


KNOWLEDGE = VllmKnowledge()
