"""Is the model where the plan put it? Judged from the engine's own load report and nvidia-smi's
GPU memory per process, not from decode speed.

Pure: ``judge`` takes what the engine said (``knowledge.engines.loadlog.LoadReport``), what
``nvidia-smi --query-compute-apps`` answered for the container's processes, and the release's plan
(``PlanSummary``), and returns a ``Residency`` verdict whose failures quote the engine's line. The
health check (``health.check``, stage ``residency``) fails a release on a ``fail`` whatever its
decode speed; something the log does not say is a ``warn`` naming it, never a silent pass.

What fails (``health.residency: gpu``, the default):

- llama.cpp put fewer layers on the GPU than the plan (``offloaded N/M layers to GPU``; the count
  includes the output layer, as ``-ngl`` does);
- weights in host memory beyond what the plan keeps there (llama.cpp keeps an untied token-embedding
  table on the CPU; ``--n-cpu-moe`` or ``-ot ...=CPU`` move experts there while the layer count still
  says every layer is offloaded: only the per-device model buffers show it);
- no model buffer on any GPU (the container did not get the GPU: the engine fell back to the CPU);
- the KV cache in host memory, or smaller than the command line asks (llama.cpp ``-c``; vLLM
  ``--max-model-len`` x ``--max-num-seqs``; the plan's context x concurrency when they do not say);
- weights far from the plan (another file, another quantization than planned);
- the container's processes hold less GPU memory than the plan's weights (nvidia-smi, the second
  witness).

``health.residency: cpu`` is for engines that run on the CPU by design (the lab's CPU builds stand
in for a simulated card): the layer count, the weights' size and the KV capacity are still checked,
the devices are not. ``off`` skips the check and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from llmfleet.knowledge.engines.loadlog import MIB, ComputeApps, LoadReport, is_host_buffer

if TYPE_CHECKING:
    from llmfleet.knowledge.planner import PlanSummary

Status = Literal["pass", "warn", "fail"]
Mode = Literal["gpu", "cpu", "off"]

# Weights are "far from the plan" beyond this share and this many MiB (a plan sized from the catalog
# rather than the host's file can be a few per cent off; another quantization is 30 % or more).
WEIGHTS_FAIL_SHARE = 0.35
WEIGHTS_WARN_SHARE = 0.12
WEIGHTS_SLACK_MIB = 512.0
# Host-memory weights allowed beyond what the plan keeps there (llama.cpp's mapped range can span a
# little more than the tensors it holds).
HOST_SLACK_SHARE = 0.25
HOST_SLACK_MIB = 256.0
# nvidia-smi's figure for the engine's processes must cover this share of the plan's GPU weights.
SMI_WEIGHTS_SHARE = 0.9


@dataclass(frozen=True)
class Finding:
    status: Status
    what: str  # layers, host weights, gpu, kv, weights, gpu memory, log
    message: str
    line: str = ""  # the engine's own line (or nvidia-smi's), quoted

    def sentence(self) -> str:
        return self.message + (f": «{self.line}»" if self.line else "")


@dataclass(frozen=True)
class Residency:
    status: Status
    findings: tuple[Finding, ...] = ()
    report: LoadReport | None = None
    gpu_memory_mib: float | None = None  # nvidia-smi: the container's processes together
    mode: Mode = "gpu"

    @property
    def message(self) -> str:
        bad = [f for f in self.findings if f.status == "fail"]
        if bad:
            return "the engine's own report contradicts the plan: " + "; ".join(f.sentence() for f in bad)
        warn = [f for f in self.findings if f.status == "warn"]
        ok = [f.message for f in self.findings if f.status == "pass"]
        text = "; ".join(ok) if ok else "nothing to compare"
        if warn:
            text += "; WARN: " + "; ".join(f.sentence() for f in warn)
        return text

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "mode": self.mode,
                               "findings": [{"status": f.status, "what": f.what, "message": f.message,
                                             **({"line": f.line} if f.line else {})} for f in self.findings]}
        if self.report is not None:
            out["engine_report"] = self.report.to_dict()
        if self.gpu_memory_mib is not None:
            out["gpu_memory_mib"] = round(self.gpu_memory_mib, 1)
        return out


def _worst(findings: list[Finding]) -> Status:
    if any(f.status == "fail" for f in findings):
        return "fail"
    if any(f.status == "warn" for f in findings):
        return "warn"
    return "pass"


def _mib(n: int | float | None) -> float | None:
    return None if n is None else float(n) / MIB


def _weights_size(found_mib: float, plan_mib: float | None, line: str, what: str) -> Finding | None:
    if plan_mib is None or plan_mib <= 0 or found_mib <= 0:
        return None
    off = abs(found_mib - plan_mib)
    share = off / plan_mib
    said = f"{what} {found_mib:,.0f} MiB, the plan {plan_mib:,.0f} MiB"
    if share > WEIGHTS_FAIL_SHARE and off > WEIGHTS_SLACK_MIB:
        return Finding("fail", "weights", f"{said} ({share:.0%} off: another file or quantization than planned; "
                                          "plan it again with `invoke plan --host`)", line)
    if share > WEIGHTS_WARN_SHARE and off > WEIGHTS_SLACK_MIB:
        return Finding("warn", "weights", f"{said} ({share:.0%} off)", line)
    return Finding("pass", "weights", said)


def _kv_capacity(have: int | None, asked: int | None, asked_how: str, line: str, unit: str) -> Finding | None:
    if have is None or not asked:
        return None
    if have < asked:
        return Finding("fail", "kv", f"the KV cache holds {have:,} {unit}, {asked_how} asks {asked:,} (lower the "
                                     "context or the concurrency, or free GPU memory)", line)
    return Finding("pass", "kv", f"KV cache {have:,} {unit} >= {asked:,}")


def kv_asked(plan: PlanSummary | None, args_asked: int | None) -> tuple[int | None, str]:
    """The KV tokens the release asks for, and who asks: the command line's own flags (an operator's
    engine_args override the plan's), else the plan's context x concurrency."""
    if args_asked:
        return args_asked, "the command line"
    if plan is not None and plan.context:
        return plan.context * (plan.concurrency or 1), (f"the plan (context {plan.context:,} x concurrency "
                                                         f"{plan.concurrency or 1})")
    return None, ""


def _llamacpp(rep: LoadReport, plan: PlanSummary | None, mode: Mode, asked: tuple[int | None, str]) -> list[Finding]:
    out: list[Finding] = []
    line = rep.lines.get("offloaded", "")
    if rep.layers_offloaded is not None and rep.layers_total is not None:
        n, m = rep.layers_offloaded, rep.layers_total
        if plan is not None and plan.total_layers:
            want = plan.total_layers + 1 if plan.resident or plan.gpu_layers is None else plan.gpu_layers
            want = min(want, m)
            if m != plan.total_layers + 1:
                out.append(Finding("warn", "layers", f"the engine counts {m} layers, the plan's model "
                                                     f"{plan.total_layers} + the output layer", line))
            if n < want:
                out.append(Finding("fail", "layers", f"the engine put {n} of {m} layers on the GPU, the plan {want}: "
                                                     "the rest run from host memory and decode collapses "
                                                     "(check -ngl in engine_args and the card's free memory)", line))
            else:
                out.append(Finding("pass", "layers", f"{n}/{m} layers offloaded as planned"))
        elif n < m:
            out.append(Finding("warn", "layers", f"the engine put {n} of {m} layers on the GPU (no plan to compare)",
                               line))
    gpu_mib, host_mib = rep.gpu_weights_mib, rep.host_weights_mib
    host_lines = " | ".join(v for k, v in rep.lines.items()
                            if k.startswith("model buffer ") and is_host_buffer(k.removeprefix("model buffer ")))
    if mode == "gpu" and rep.model_buffers_mib:
        if gpu_mib <= 0 and host_mib > 0:
            out.append(Finding("fail", "gpu", "no model buffer on any GPU: every weight is in host memory (is the "
                                              "GPU visible in the container? `invoke facts` shows the runtime)",
                               host_lines))
        elif plan is not None and plan.weights_bytes and plan.weights_gpu_bytes is not None:
            keep = max(0.0, (plan.weights_bytes - plan.weights_gpu_bytes) / MIB)
            allowed = keep * (1 + HOST_SLACK_SHARE) + HOST_SLACK_MIB
            if host_mib > allowed:
                out.append(Finding("fail", "host weights",
                                   f"{host_mib:,.0f} MiB of weights in host memory, the plan keeps {keep:,.0f} MiB "
                                   "there (the token-embedding table): part of the model runs from host memory "
                                   "(--n-cpu-moe, -ot ...=CPU or --no-mmap settings in engine_args?)", host_lines))
            else:
                out.append(Finding("pass", "host weights", f"{gpu_mib:,.0f} MiB of weights on the GPU, "
                                                           f"{host_mib:,.0f} MiB in host memory as planned"))
    if rep.model_buffers_mib and plan is not None:
        f = _weights_size(gpu_mib + host_mib, _mib(plan.weights_bytes), host_lines or next(
            (v for k, v in rep.lines.items() if k.startswith("model buffer ")), ""), "model buffers")
        if f:
            out.append(f)
    if mode == "gpu" and rep.kv_buffers_mib and all(is_host_buffer(k) for k in rep.kv_buffers_mib) \
            and (plan is None or plan.resident is not False):
        out.append(Finding("fail", "kv", "the KV cache is in host memory (--no-kv-offload?)",
                           " | ".join(v for k, v in rep.lines.items() if k.startswith("kv buffer "))))
    kv = _kv_capacity(rep.kv_cells, asked[0], asked[1], rep.lines.get("kv", ""), "cells")
    if kv:
        out.append(kv)
    return out


def _vllm(rep: LoadReport, plan: PlanSummary | None, asked: tuple[int | None, str]) -> list[Finding]:
    out: list[Finding] = []
    if rep.weights_gib is not None and plan is not None:
        per_gpu = plan.weights_per_gpu_bytes
        if per_gpu is None and plan.weights_gpu_bytes:
            per_gpu = plan.weights_gpu_bytes // max(1, plan.tensor_parallel_size * plan.pipeline_parallel_size)
        f = _weights_size(rep.weights_gib * 1024, _mib(per_gpu), rep.lines.get("weights", ""), "weights per GPU")
        if f:
            out.append(f)
    kv = _kv_capacity(rep.kv_tokens, asked[0], asked[1], rep.lines.get("kv", ""), "tokens")
    if kv:
        out.append(kv)
    return out


def _gpu_memory(apps: ComputeApps | None, pids: set[int], plan: PlanSummary | None,
                mode: Mode) -> tuple[Finding | None, float | None]:
    if apps is None:
        return None, None
    if mode == "cpu":  # recorded, not compared: the engine holds the model in host memory by design
        used = None if apps.error else apps.total_for(pids)
        if used is None:
            return None, None
        return Finding("pass", "gpu memory", f"nvidia-smi: {used:,.0f} MiB held by the engine's processes "
                                             "(not compared: CPU by design)"), used
    if apps.error:
        return Finding("warn", "gpu memory", f"no second witness: {apps.error}"), None
    used = apps.total_for(pids)
    if used is None:
        if not apps.used_mib:
            return Finding("warn", "gpu memory", "nvidia-smi lists no process with GPU memory (a host that hides "
                                                 "processes, or the engine is not on the GPU)"), None
        return Finding("warn", "gpu memory", "none of the container's processes is among nvidia-smi's compute "
                                             "apps (another PID namespace?)", apps.line), None
    want = None
    if plan is not None and plan.weights_gpu_bytes:
        share = plan.weights_per_gpu_bytes or plan.weights_gpu_bytes
        # this host's cards: all of the plan's (tensor parallel over local cards) or its own stage
        want = (plan.weights_gpu_bytes if plan.hosts <= 1 else share) / MIB
    if want is not None and used < want * SMI_WEIGHTS_SHARE:
        return Finding("fail", "gpu memory", f"the engine's processes hold {used:,.0f} MiB of GPU memory, less than "
                                             f"the {want:,.0f} MiB of weights the plan puts there", apps.line), used
    return Finding("pass", "gpu memory", f"nvidia-smi: {used:,.0f} MiB of GPU memory held by the engine"), used


def judge(report: LoadReport | None, apps: ComputeApps | None, pids: set[int], plan: PlanSummary | None,
          mode: Mode = "gpu", *, args_kv_tokens: int | None = None) -> Residency:
    """The verdict on one started release (see the module's docstring for the rules).
    ``args_kv_tokens``: the KV tokens the release's command line asks for (the engine's
    ``kv_tokens_asked``), which an operator's engine_args may have set below the plan."""
    asked = kv_asked(plan, args_kv_tokens)
    if mode == "off":
        return Residency("pass", (Finding("pass", "log", "residency check off (health.residency: off)"),), report,
                         mode=mode)
    findings: list[Finding] = []
    if report is None or (not report.lines and report.unread):
        findings.append(Finding("warn", "log", "the engine's load lines could not be read (log rotated away, or a "
                                               "build that prints other words): residency is unproven"))
    else:
        if report.engine == "llamacpp":
            findings += _llamacpp(report, plan, mode, asked)
        elif report.engine == "vllm":
            findings += _vllm(report, plan, asked)
        if report.unread:
            findings.append(Finding("warn", "log", "could not read " + ", ".join(report.unread)))
    smi, used = _gpu_memory(apps, pids, plan, mode)
    if smi:
        findings.append(smi)
    if mode == "cpu":
        findings.append(Finding("pass", "gpu", "the engine runs on the CPU by design (health.residency: cpu): "
                                               "devices not checked"))
    return Residency(_worst(findings), tuple(findings), report, used, mode)

