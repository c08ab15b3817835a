"""The interface every engine's knowledge implements (one module per engine in this package).

What a new engine (SGLang, TGI, ...) must provide, and nothing else:

1. ``src/llmfleet/knowledge/catalog/engines.yaml``
   - ``engines.<name>``: ``quant_methods`` (service quant -> the engine's methods, best first),
     ``quantization_flag`` (flag value -> method), ``dtype_needs_bf16``, ``kv_dtypes`` (and
     ``kv_needs_flash_attn`` if a KV dtype depends on a flag);
   - ``images."<name>:<version>"``: one entry per release: ``repository``, ``tag``, ``cuda``,
     ``min_driver``, ``kernels`` (SASS/PTX), ``torch`` when it runs on PyTorch, ``kv_layout``,
     ``quantizations`` (method -> lowest compute capability), ``attention`` (backends, their KV
     dtypes by compute capability, how one is selected), ``sources`` and ``confidence``.
2. ``roles/<name>/defaults.yml`` and ``roles/<name>/templates/compose.yml.j2``: the base argv
   (model, port, served name), the flags llmfleet owns, the API-key environment variable, the flag
   table the renderer merges overrides with, the loading signal.
3. A module here with a subclass of ``EngineKnowledge`` registered in ``engines.ENGINES``, giving:
   - ``name`` (the catalog/inventory engine name), ``label`` (for people);
   - ``model_is_file`` (a GGUF file, or a model folder), ``default_quant``, ``quant_unknown_note``,
     ``quant_runs_on_any_card`` (True when every quant has a kernel on every CUDA card);
   - ``needs_torch_kernels`` (True when the image's PyTorch build must cover the card too) and
     ``inspect_method`` (how ``images.inspect`` reads an image: its Python, or its binaries);
   - ``health_path``, ``ready_status`` and ``metrics`` (Prometheus names per llmfleet metric, newest
     first), ``metrics_flag`` (the flag that turns /metrics on, if any);
   - ``arch_fix(release, cc)``: what to use instead when the image has no kernels for a card;
   - ``check_dtype``, ``check_attention``, ``check_kv_dtype``, ``effective_backend``: the flag
     rules on a card (pure, ``compat.Verdict``);
   - ``minor_version_verdict``: an engine-specific judgement under CUDA minor-version
     compatibility, or None for the generic rule;
   - ``kv_layout(release, cc)``: what the build keeps for sliding-window layers;
   - ``engine_args(...)``: the flags for a plan (the planner calls it instead of branching);
   - ``load_log_grep`` and ``parse_load_log(text)``: which lines of its log tell where the weights
     went and how large the KV cache is, and their parser (``loadlog.LoadReport``), for the
     residency check after a start (``health.residency``); ``kv_tokens_asked(args)``: the KV
     tokens a command line asks for, which the engine's report is compared with;
   - for the planner: ``quant_family`` (``hf`` or ``gguf``: the family of the
     smaller quantizations it ranks), ``serves_only_quant_family`` (refuse other families),
     ``kv_flag_without_bf16`` (the KV dtype flag on a card without bf16), ``small_kv_dtype`` (the
     8-bit KV cache it suggests), ``embedding_on_gpu`` (False: an untied token-embedding table stays
     in host memory), ``offload_moves_layers`` (True: offloaded layers run off the GPU, so the
     per-layer cost counts the resident layers only), ``sizes_from_host_file`` (True: a service that
     names no quant is planned with the size of its model file on the host), ``plan_default_quant``
     (what a plan without --quant sizes; None: the plan needs a quant or a model file),
     ``attention_backend_env`` (the variable that picks an attention backend, if the engine has
     several: the planner then tries the release's other backends when the KV dtype fails on the
     default one), ``quantization_flag(release, rules, quant, cc)`` (the quantization flag value
     the release uses for a quant on the card, None for no flag); ``split_modes`` (how a split over
     cards works, the default first: ``tensor`` shards every layer over the cards, ``layer`` gives
     each card whole layers, ``row`` splits every matrix by rows), ``split_word`` / ``cross_host_word``
     (the split over one host's cards and over hosts, for people), ``foreign_quant_note`` (a note when
     a quant of another family is planned), ``offload_where`` (where offloaded weights run, for
     people), ``fp16_activations`` (True: a card without bf16, or an fp16 quant, runs the model's
     activations in float16), ``deploy_adds(hosts, gpus)`` (what the deploy adds for a split over
     hosts, in words);
   - for a service over several hosts (``release.cluster``, ``health.watchdog``, ``fleet.status``):
     ``cluster_kind`` (the engine's distributed runtime: ``rpc``, ``ray``; None: one host only; the
     role's ``cluster.kind`` says the same), ``workers_load_model`` (True: every worker reads the model
     from its own ``model_path``; False: the head sends the tensors), ``workers_join_head`` (True: the
     workers connect to the runtime the head starts, and the head waits for them; False: the head
     connects to each worker), ``worker_serves_port`` (True: a worker listens on the cluster port, so
     its watchdog, status and the head's reach check test that port), ``worker_runtime`` (what a
     worker runs, for people), ``checks_worker_image`` (True: the engine catalog says per image
     whether it ships the worker, and an image known to lack it is refused before any SSH),
     ``cluster_head_args(endpoints, size, given)`` (the head's flags for its workers) and
     ``cluster_env(address, interface)`` (the environment every member's container needs).
4. The engine name in the few closed lists that validate input: ``inventory.services.Service.engine``,
   the ``images.lock`` key pattern (``images.lock._KEY_RE``). Everything else asks ``engines.names()``
   (``compat.EngineRelease.engine``, ``inventory.check``, ``fleet.upgrade``, the planner).
5. A lab image (``dockerfiles/lab-<name>``, ``lab/images.py``) so the end-to-end tests run it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from llmfleet.knowledge.catalog import Quant
    from llmfleet.knowledge.compat import EngineCatalog, EngineRelease, EngineRules, Verdict
    from llmfleet.knowledge.engines.loadlog import LoadReport


@dataclass(frozen=True, kw_only=True)
class PlanFlags:
    """What a plan asks of the engine's flags (``EngineKnowledge.engine_args``); every engine reads the
    fields it needs: vLLM the quantization, dtype, memory share, tensor/pipeline sizes, offload and
    attention backend; llama.cpp the layers on the GPU, the split and the release's flag forms."""

    context: int  # tokens per sequence
    concurrency: int  # sequences at once
    kv_flag: str  # the KV cache dtype as the engine's flag takes it
    quantization: str | None = None  # the quantization flag's value (None: no flag)
    float16: bool = False  # run in float16 (no bf16 on the card, or an fp16 quant)
    gpu_memory_utilization: float = 0.9
    gpus: int = 1  # per host
    hosts: int = 1
    split_mode: str | None = None  # tensor | layer | row
    tensor_split: tuple[int, ...] | None = None  # one share per device, in the engine's device order
    offload_bytes: float = 0.0  # weights the engine is to keep off the GPU
    attention_backend: str | None = None  # another backend than the release's default
    backend_select: str = "arg"  # how the release selects a backend: arg (a flag) or env
    num_layers: int = 0  # the model's repeating layers
    resident: bool = True  # every layer on the GPU
    gpu_layers: int = 0  # repeating layers on the GPU when not resident
    release: EngineRelease | None = None  # the image's catalog entry (None: no build known)
    rules: EngineRules | None = None  # the engine's catalog rules


@dataclass(frozen=True)
class KvLayoutInfo:
    """What a build keeps for sliding-window layers on a card: ``window`` or ``full``."""

    sliding_window: str
    confidence: str
    source: str


class EngineKnowledge:
    name: ClassVar[str]
    label: ClassVar[str]
    model_is_file: ClassVar[bool] = False
    default_quant: ClassVar[str] = "fp16"
    quant_unknown_note: ClassVar[str] = ""
    quant_runs_on_any_card: ClassVar[bool] = False
    needs_torch_kernels: ClassVar[bool] = False
    # how images.inspect reads an image: "python" (run the image's Python: torch and the engine's
    # extension modules) or "binary" (copy the server binary and its libraries out of the image)
    inspect_method: ClassVar[str] = "binary"
    health_path: ClassVar[str] = "/health"
    ready_status: ClassVar[int] = 200
    metrics_flag: ClassVar[str | None] = None
    metrics_need_key: ClassVar[bool] = False  # /metrics answers only with the service's API key
    load_log_grep: ClassVar[str] = ""  # grep -E pattern selecting the load lines of its log
    # llmfleet metric (fleet.metrics.EngineMetrics field) -> the engine's Prometheus names, newest first
    metrics: ClassVar[dict[str, tuple[str, ...]]] = {}
    # counters that move with every step of work the engine does (prefill or decode), however long its
    # requests: the watchdog's evidence of progress (health.watchdog); their sum is compared
    progress_metrics: ClassVar[tuple[str, ...]] = ()
    # planner facts (see the module docstring)
    quant_family: ClassVar[str] = "hf"
    serves_only_quant_family: ClassVar[bool] = False
    kv_flag_without_bf16: ClassVar[str] = "auto"
    small_kv_dtype: ClassVar[str] = "fp8"
    embedding_on_gpu: ClassVar[bool] = True
    offload_moves_layers: ClassVar[bool] = False
    sizes_from_host_file: ClassVar[bool] = False
    plan_default_quant: ClassVar[str | None] = None
    attention_backend_env: ClassVar[str | None] = None
    split_modes: ClassVar[tuple[str, ...]] = ("layer",)
    split_word: ClassVar[str] = "layer split"
    cross_host_word: ClassVar[str] = "RPC"
    foreign_quant_note: ClassVar[str] = ""
    offload_where: ClassVar[str] = "host memory (CPU)"
    fp16_activations: ClassVar[bool] = False
    # multi-host facts (see the module docstring)
    cluster_kind: ClassVar[str | None] = None
    workers_load_model: ClassVar[bool] = False
    workers_join_head: ClassVar[bool] = False
    worker_serves_port: ClassVar[bool] = False
    worker_runtime: ClassVar[str] = ""
    checks_worker_image: ClassVar[bool] = False

    # -------------------------------------------------------------------- kernels and driver
    def arch_fix(self, rel: EngineRelease, cc: str) -> str:
        return "pick an image whose kernels cover this compute capability (catalog/engines.yaml)"

    def minor_version_verdict(self, rel: EngineRelease, cat: EngineCatalog, *, driver: str, native: str,
                              card: str, fwd_reason: str, upgrade: str) -> Verdict | None:
        return None

    # -------------------------------------------------------------------- flags on a card
    def check_dtype(self, rel: EngineRelease, rules: EngineRules, quant: str | None, args: list[str],
                    cc: str | None, bf16_native: bool | None) -> Verdict:
        raise NotImplementedError

    def effective_backend(self, rel: EngineRelease, args: list[str], env: dict[str, str],
                          cc: str | None) -> str | None:
        return None

    def check_attention(self, rel: EngineRelease, args: list[str], env: dict[str, str], cc: str | None) -> Verdict:
        raise NotImplementedError

    def check_kv_dtype(self, rel: EngineRelease, rules: EngineRules, kv_dtype: str | None, args: list[str],
                       env: dict[str, str], cc: str | None) -> Verdict:
        raise NotImplementedError

    def check_kv_head(self, rel: EngineRelease, rules: EngineRules, kv_dtype: str | None, args: list[str],
                      head_dim: int) -> Verdict | None:
        """Whether the build has attention kernels for this KV cache at the model's head size (None: no
        rule of the engine depends on it)."""
        return None

    # -------------------------------------------------------------------- planning
    def kv_layout(self, rel: EngineRelease | None, cc: str | None) -> KvLayoutInfo | None:
        """What the release keeps for sliding-window layers on this card; None when the catalog
        does not say (the planner then assumes the full context: the safe side)."""
        if rel is None or rel.kv_layout is None:
            return None
        kl = rel.kv_layout
        return KvLayoutInfo(kl.sliding_window, kl.confidence, kl.source)

    def quantization_flag(self, rel: EngineRelease | None, rules: EngineRules, quant: Quant, cc: str) -> str | None:
        """The value of the engine's quantization flag for ``quant`` (a catalog ``Quant``) on the card;
        None when the engine takes no such flag."""
        return None

    def engine_args(self, flags: PlanFlags) -> list[str]:
        """The engine's flags for a plan (the planner calls it instead of branching)."""
        raise NotImplementedError

    def parse_load_log(self, text: str) -> LoadReport | None:
        """What the engine reported while loading; None when the engine has no parser."""
        return None

    def kv_tokens_asked(self, args: list[str]) -> int | None:
        """The KV tokens the command line asks for (the last value of each flag wins, as the engine
        reads them); None when the flags do not say."""
        return None

    # -------------------------------------------------------------------- several hosts
    def deploy_adds(self, hosts: int, gpus: int) -> list[str]:
        """What the deploy side adds for a plan split over ``hosts`` hosts of ``gpus`` cards, in words."""
        return []

    def cluster_head_args(self, *, endpoints: Sequence[str], size: int, given: Callable[[str], bool]) -> list[str]:
        """The head's flags for its workers: ``endpoints`` are the workers' ``ADDR:PORT`` in the
        inventory's order, ``size`` the hosts in all, ``given(flag)`` whether the service's own flags
        (or the plan's) already set a flag."""
        return []

    def cluster_env(self, address: str, interface: str | None) -> dict[str, str]:
        """The environment a member's container needs on the cluster network (its address, its NIC)."""
        return {}
