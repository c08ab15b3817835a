"""Benchmark results of a deployed service: statistics, the result document, comparison and the gate.

Pure. The load generator (``llmfleet.fleet.loadgen``) returns one ``RequestResult`` per request; the
shell (``llmfleet.fleet.bench_run``) adds GPU memory samples from ``nvidia-smi`` and engine metrics
from ``/metrics``; this module turns them into one level per (concurrency, prompt length):

- time to first token p50/p95 (client side: request sent -> first text chunk, prefill and queueing
  included, as ``vllm bench serve`` and GuideLLM measure it);
- decode tok/s per stream, p50: tokens after the first over the time from the first to the last
  chunk, i.e. 1 / TPOT in ``vllm bench serve``'s terms (``llmfleet.health.check.stream_stats``);
- aggregate output tok/s: every output token of the level over the level's wall time (first request
  sent -> last answer ended), ``output_throughput`` in ``vllm bench serve``;
- request errors, GPU memory in use (max of the samples), KV-cache usage and requests waiting (max).

Percentiles interpolate linearly between order statistics (numpy's default, which ``vllm bench
serve`` uses), so figures compare with that tool's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from llmfleet.fleet.bench_defaults import (  # noqa: F401 - re-exported
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_PROMPT_TOKENS,
)

SCHEMA = "llmfleet.bench/1"

# Bounds: a bench is bounded in count and in time, whatever the flags say.
MAX_CONCURRENCY = 256
MAX_REQUESTS = 10_000
MAX_DURATION_S = 3600.0
MAX_PROMPT_TOKENS = 1_000_000
MAX_OUTPUT_TOKENS = 32_768

# ---------------------------------------------------------------------------------------------
# Parameters


@dataclass(frozen=True)
class BenchParams:
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    prompt_tokens: tuple[int, ...] = DEFAULT_PROMPT_TOKENS
    max_tokens: int = DEFAULT_MAX_TOKENS
    requests: int | None = None  # per level; None with no duration: default_requests(c)
    duration_s: float | None = None  # per level: no new request after this
    request_timeout_s: float = 300.0

    def requests_for(self, concurrency: int) -> int | None:
        if self.requests is not None:
            return self.requests
        if self.duration_s is not None:
            return None
        return default_requests(concurrency)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["concurrency"] = list(self.concurrency)
        d["prompt_tokens"] = list(self.prompt_tokens)
        return d


def default_requests(concurrency: int) -> int:
    """Requests per level when neither --requests nor --duration is given: two rounds of the
    concurrency, at least 4 (enough for a p50; say --requests for a steadier p95)."""
    return max(4, 2 * int(concurrency))


def _int_list(flag: str, text: Any, lo: int, hi: int) -> tuple[int, ...]:
    if isinstance(text, int | float) and not isinstance(text, bool):
        items = [str(int(text))]
    else:
        items = [x.strip() for x in str(text or "").split(",") if x.strip()]
    if not items:
        raise ValueError(f"--{flag}: give a comma-separated list of numbers, e.g. --{flag} 1,2,4")
    out: list[int] = []
    for x in items:
        try:
            v = int(x)
        except ValueError:
            raise ValueError(f"--{flag}: {x!r} is not a whole number") from None
        if not lo <= v <= hi:
            raise ValueError(f"--{flag}: {v} is out of range ({lo}-{hi})")
        if v not in out:
            out.append(v)
    return tuple(sorted(out))


def parse_params(
    concurrency: Any = None,
    prompt_tokens: Any = None,
    max_tokens: Any = None,
    duration: Any = None,
    requests: Any = None,
    request_timeout: Any = None,
) -> BenchParams:
    """Flags -> BenchParams; a ``ValueError`` names the flag and the fix (the CLI makes it a usage error)."""
    conc = _int_list("concurrency", concurrency, 1, MAX_CONCURRENCY) if concurrency not in (None, "") \
        else DEFAULT_CONCURRENCY
    prompts = _int_list("prompt-tokens", prompt_tokens, 1, MAX_PROMPT_TOKENS) if prompt_tokens not in (None, "") \
        else DEFAULT_PROMPT_TOKENS
    mt = DEFAULT_MAX_TOKENS
    if max_tokens not in (None, ""):
        try:
            mt = int(max_tokens)
        except (TypeError, ValueError):
            raise ValueError(f"--max-tokens: {max_tokens!r} is not a whole number") from None
        if not 2 <= mt <= MAX_OUTPUT_TOKENS:
            raise ValueError(f"--max-tokens: {mt} is out of range (2-{MAX_OUTPUT_TOKENS}); decode speed needs 2 or more")
    dur: float | None = None
    if duration not in (None, ""):
        try:
            dur = float(duration)
        except (TypeError, ValueError):
            raise ValueError(f"--duration: {duration!r} is not a number of seconds") from None
        if not 0 < dur <= MAX_DURATION_S:
            raise ValueError(f"--duration: {dur:g} is out of range (more than 0, at most {MAX_DURATION_S:g} s)")
    req: int | None = None
    if requests not in (None, ""):
        try:
            req = int(requests)
        except (TypeError, ValueError):
            raise ValueError(f"--requests: {requests!r} is not a whole number") from None
        if not 1 <= req <= MAX_REQUESTS:
            raise ValueError(f"--requests: {req} is out of range (1-{MAX_REQUESTS})")
    timeout = 300.0
    if request_timeout not in (None, ""):
        timeout = float(request_timeout)
        if not 1 <= timeout <= MAX_DURATION_S:
            raise ValueError(f"--request-timeout: {timeout:g} is out of range (1-{MAX_DURATION_S:g} s)")
    return BenchParams(concurrency=conc, prompt_tokens=prompts, max_tokens=mt, requests=req, duration_s=dur,
                       request_timeout_s=timeout)


# ---------------------------------------------------------------------------------------------
# Statistics


def percentile(values: Iterable[float | None], p: float) -> float | None:
    """The p-th percentile (0-100) with linear interpolation between order statistics (numpy's
    default method); ``None`` values are left out; ``None`` when nothing is left."""
    xs = sorted(float(v) for v in values if v is not None and not math.isnan(float(v)))
    if not xs:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is not between 0 and 100")
    k = (len(xs) - 1) * p / 100.0
    lo = math.floor(k)
    hi = math.ceil(k)
    if lo == hi:
        return xs[lo]
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass(frozen=True)
class RequestResult:
    """One request as the load generator saw it (times from the load generator's monotonic clock)."""

    started: float
    ended: float
    ok: bool
    ttft_s: float | None = None
    decode_tokps: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    error: str = ""


@dataclass(frozen=True)
class GpuSample:
    """One ``nvidia-smi`` reading of one card."""

    t: float
    index: int
    memory_used_mib: float
    memory_total_mib: float | None = None
    utilization_pct: float | None = None


@dataclass(frozen=True)
class MetricsSample:
    """One ``/metrics`` reading (``llmfleet.fleet.metrics.EngineMetrics`` fields)."""

    t: float
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None


GPU_QUERY = "index,memory.used,memory.total,utilization.gpu"


def gpu_query_command() -> str:
    """The remote command for one sample of every card (no value from outside: nothing to quote)."""
    return f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits"


def _float_at(parts: list[str], i: int) -> float | None:
    try:
        return float(parts[i])
    except (IndexError, ValueError):
        return None


def parse_gpu_sample(stdout: str, t: float) -> list[GpuSample]:
    """``0, 1234, 32768, 87`` lines -> samples; lines that do not parse (``[N/A]``, errors) are skipped."""
    out: list[GpuSample] = []
    for line in stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2:
            continue
        try:
            index = int(parts[0])
            used = float(parts[1])
        except ValueError:
            continue

        out.append(GpuSample(t=t, index=index, memory_used_mib=used, memory_total_mib=_float_at(parts, 2),
                             utilization_pct=_float_at(parts, 3)))
    return out


@dataclass
class Level:
    """The figures of one (concurrency, prompt length) level."""

    concurrency: int
    prompt_tokens_asked: int
    max_tokens: int
    requests: int = 0
    ok: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    prompt_tokens: float | None = None  # median of what the engine counted (usage.prompt_tokens)
    output_tokens: int = 0
    wall_s: float = 0.0
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    decode_tokps_p50: float | None = None
    decode_tokps_min: float | None = None
    aggregate_tokps: float | None = None
    gpu_memory_used_mib_max: float | None = None
    gpu_memory_total_mib: float | None = None
    gpu_samples: int = 0
    kv_cache_usage_max: float | None = None
    requests_waiting_max: float | None = None
    requests_running_max: float | None = None
    metrics_samples: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _round(v: float | None, n: int = 4) -> float | None:
    return None if v is None else round(float(v), n)


def aggregate_level(
    concurrency: int,
    prompt_tokens_asked: int,
    max_tokens: int,
    results: Sequence[RequestResult],
    gpu: Sequence[GpuSample] = (),
    metrics: Sequence[MetricsSample] = (),
    *,
    window: tuple[float, float] | None = None,
) -> Level:
    """One level's figures. GPU and metrics samples count when they fall in ``window`` (default: the
    level's first request sent -> last answer ended); a level shorter than the sampling period takes
    the last GPU reading before its end. GPU memory is summed over the cards of one
    reading (the service's cards; a host's other users count too: nvidia-smi cannot tell them apart)."""
    lv = Level(concurrency=int(concurrency), prompt_tokens_asked=int(prompt_tokens_asked), max_tokens=int(max_tokens))
    lv.requests = len(results)
    good = [r for r in results if r.ok]
    lv.ok = len(good)
    lv.errors = lv.requests - lv.ok
    seen: list[str] = []
    for r in results:
        if not r.ok and r.error and r.error not in seen and len(seen) < 3:
            seen.append(r.error[:200])
    lv.error_samples = seen
    if results:
        t0 = min(r.started for r in results)
        t1 = max(r.ended for r in results)
        lv.wall_s = round(max(0.0, t1 - t0), 4)
        window = window or (t0, t1)
    lv.output_tokens = sum(r.output_tokens for r in good)
    lv.ttft_p50_s = _round(percentile([r.ttft_s for r in good], 50))
    lv.ttft_p95_s = _round(percentile([r.ttft_s for r in good], 95))
    lv.decode_tokps_p50 = _round(percentile([r.decode_tokps for r in good], 50), 2)
    decs = [r.decode_tokps for r in good if r.decode_tokps is not None]
    lv.decode_tokps_min = _round(min(decs), 2) if decs else None
    lv.prompt_tokens = _round(percentile([r.prompt_tokens for r in good], 50), 1)
    if lv.wall_s > 0 and good:
        lv.aggregate_tokps = round(lv.output_tokens / lv.wall_s, 2)
    if window is not None:
        lo, hi = window
        by_time: dict[float, list[GpuSample]] = {}
        for s in gpu:
            if lo <= s.t <= hi:
                by_time.setdefault(s.t, []).append(s)
        if not by_time:  # a level shorter than the sampling period: the last reading before its end
            before = [s.t for s in gpu if s.t <= hi]
            if before:
                last = max(before)
                by_time[last] = [s for s in gpu if s.t == last]
        if by_time:
            totals = [sum(s.memory_used_mib for s in group) for group in by_time.values()]
            lv.gpu_memory_used_mib_max = max(totals)
            caps = [sum(s.memory_total_mib for s in group if s.memory_total_mib is not None) for group in by_time.values()]
            lv.gpu_memory_total_mib = max(caps) or None
            lv.gpu_samples = len(by_time)
        ms = [m for m in metrics if lo <= m.t <= hi]
        lv.metrics_samples = len(ms)

        def mx(name: str) -> float | None:
            vals = [getattr(m, name) for m in ms if getattr(m, name) is not None]
            return max(vals) if vals else None

        lv.kv_cache_usage_max = mx("kv_cache_usage")
        lv.requests_waiting_max = mx("requests_waiting")
        lv.requests_running_max = mx("requests_running")
    return lv


# ---------------------------------------------------------------------------------------------
# The plan beside the measurement


@dataclass(frozen=True)
class PlanFigures:
    """What the planner promises for this service on this card (batch-1 decode)."""

    ceiling_tokps: float | None
    realistic_tokps: tuple[float, float] | None
    source: str
    card: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ceiling_tokps": self.ceiling_tokps,
                "realistic_tokps": list(self.realistic_tokps) if self.realistic_tokps else None,
                "source": self.source, "card": self.card}


def plan_figures(plan: Any, source: str, card: str | None = None) -> PlanFigures:
    """The ceiling and realistic range from a planner ``Plan`` (or the plan dict a manifest keeps)."""
    if plan is None:
        return PlanFigures(None, None, source, card)

    def get(name: str) -> Any:
        return plan.get(name) if isinstance(plan, dict) else getattr(plan, name, None)

    ceiling = get("decode_tokps_ceiling")
    ceiling = float(ceiling) if isinstance(ceiling, int | float) and ceiling > 0 else None
    rng = get("decode_tokps_realistic")
    realistic: tuple[float, float] | None = None
    if isinstance(rng, list | tuple) and len(rng) == 2 and all(isinstance(x, int | float) for x in rng):
        realistic = (float(min(rng)), float(max(rng)))
    elif isinstance(rng, int | float) and rng > 0:
        realistic = (float(rng), float(rng))
    return PlanFigures(ceiling, realistic, source, card or get("gpu_name") or get("gpu"))


def ratio(measured: float | None, ceiling: float | None) -> float | None:
    if measured is None or not ceiling:
        return None
    return measured / ceiling


def against_range(measured: float | None, realistic: tuple[float, float] | None) -> str:
    """``below`` / ``within`` / ``above`` the planner's realistic range, or ``-``."""
    if measured is None or realistic is None:
        return "-"
    lo, hi = realistic
    if measured < lo:
        return "below"
    if measured > hi:
        return "above"
    return "within"


# ---------------------------------------------------------------------------------------------
# The document


def result_document(
    *,
    host: str,
    service: str,
    engine: str,
    release: str | None,
    model: str | None,
    image: str | None,
    params: BenchParams,
    levels: Sequence[Level],
    plan: PlanFigures,
    time: str,
    who: str,
    lab: bool = False,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "host": host,
        "service": service,
        "engine": engine,
        "release": release,
        "model": model,
        "image": image,
        "time": time,
        "who": who,
        "lab": bool(lab),
        "params": params.to_dict(),
        "plan": plan.to_dict(),
        "levels": [lv.to_dict() for lv in levels],
        "notes": list(notes),
    }


def valid_document(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("schema") == SCHEMA and isinstance(doc.get("levels"), list)


def levels_of(doc: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for lv in doc.get("levels") or []:
        if isinstance(lv, dict) and isinstance(lv.get("concurrency"), int):
            out[(lv["concurrency"], int(lv.get("prompt_tokens_asked") or 0))] = lv
    return out


def table_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per level with the plan beside it: what the terminal table and --json show."""
    plan = doc.get("plan") or {}
    ceiling = plan.get("ceiling_tokps")
    realistic = tuple(plan["realistic_tokps"]) if plan.get("realistic_tokps") else None
    rows = []
    for (c, p), lv in sorted(levels_of(doc).items()):
        dec = lv.get("decode_tokps_p50")
        rows.append({
            "release": doc.get("release"),
            "concurrency": c,
            "prompt_tokens": p,
            "prompt_tokens_counted": lv.get("prompt_tokens"),
            "requests": lv.get("requests"),
            "errors": lv.get("errors"),
            "ttft_p50_s": lv.get("ttft_p50_s"),
            "ttft_p95_s": lv.get("ttft_p95_s"),
            "decode_tokps_p50": dec,
            "aggregate_tokps": lv.get("aggregate_tokps"),
            "gpu_memory_used_mib_max": lv.get("gpu_memory_used_mib_max"),
            "kv_cache_usage_max": lv.get("kv_cache_usage_max"),
            "requests_waiting_max": lv.get("requests_waiting_max"),
            "ceiling_tokps": ceiling,
            "realistic_tokps": list(realistic) if realistic else None,
            "decode_vs_ceiling": _round(ratio(dec, ceiling), 3),
            "decode_vs_realistic": against_range(dec, realistic),
        })
    return rows


# ---------------------------------------------------------------------------------------------
# Comparison of two results (two releases of one service)

#: metric -> True when higher is better
COMPARED = {
    "decode_tokps_p50": True,
    "aggregate_tokps": True,
    "ttft_p50_s": False,
    "ttft_p95_s": False,
    "errors": False,
}


def change_pct(a: float | None, b: float | None) -> float | None:
    """(b - a) / a in percent; ``None`` when either is missing or a is 0."""
    if a is None or b is None or a == 0:
        return None
    return (float(b) - float(a)) / float(a) * 100.0


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per level both results have: each compared metric of A and B and the change in percent, with
    ``better`` True/False/None (None: no change measurable). Levels only one side has are listed with
    the other side ``None``."""
    la, lb = levels_of(a), levels_of(b)
    rows = []
    for key in sorted(set(la) | set(lb)):
        ra, rb = la.get(key), lb.get(key)
        row: dict[str, Any] = {"concurrency": key[0], "prompt_tokens": key[1], "in_both": bool(ra and rb)}
        for metric, higher in COMPARED.items():
            va = ra.get(metric) if ra else None
            vb = rb.get(metric) if rb else None
            ch = change_pct(va, vb)
            better = None if ch is None or ch == 0 else ((ch > 0) == higher)
            row[metric] = {"a": va, "b": vb, "change_pct": None if ch is None else round(ch, 1), "better": better}
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# The upgrade gate


@dataclass(frozen=True)
class GateVerdict:
    ok: bool
    message: str
    baseline_tokps: float | None = None
    candidate_tokps: float | None = None
    slower_pct: float | None = None


def gate_verdict(baseline: dict[str, Any] | None, candidate: dict[str, Any] | None, pct: float) -> GateVerdict:
    """Does the candidate (the canary's new release) decode more than ``pct`` % slower than the
    baseline (the release it replaced)? Compared: per-stream decode p50 at every level both have;
    the worst level decides.

    No baseline (a first deploy, or the old release could not be measured): passes and says so.
    A candidate that could not be measured, or whose requests all failed, fails: a gate that cannot
    see the new release does not let the rollout continue.
    """
    if not 0 <= pct <= 100:
        raise ValueError(f"--bench-gate {pct:g}: must be between 0 and 100 (percent slower allowed)")
    if candidate is None or not valid_document(candidate):
        return GateVerdict(False, "the new release could not be benchmarked")
    lc = levels_of(candidate)
    if not any((lv.get("ok") or 0) > 0 and lv.get("decode_tokps_p50") for lv in lc.values()):
        errs = "; ".join(e for lv in lc.values() for e in (lv.get("error_samples") or []))[:300]
        return GateVerdict(False, "no request to the new release succeeded" + (f": {errs}" if errs else ""))
    if baseline is None or not valid_document(baseline):
        return GateVerdict(True, "no benchmark of the replaced release; gate not applied")
    lb = levels_of(baseline)
    worst: tuple[float, tuple[int, int], float, float] | None = None
    for key in sorted(set(lb) & set(lc)):
        base = lb[key].get("decode_tokps_p50")
        cand = lc[key].get("decode_tokps_p50")
        if not base:
            continue
        if not cand:
            return GateVerdict(False, f"concurrency {key[0]}: the new release gave no decode figure",
                               float(base), None, None)
        slower = (float(base) - float(cand)) / float(base) * 100.0
        if worst is None or slower > worst[0]:
            worst = (slower, key, float(base), float(cand))
    if worst is None:
        return GateVerdict(True, "no level measured on both releases; gate not applied")
    slower, key, base, cand = worst
    where = f"concurrency {key[0]}, prompt {key[1]}"
    if slower > pct:
        return GateVerdict(False, f"decode {cand:.1f} tok/s is {slower:.0f}% slower than {base:.1f} tok/s of the "
                                  f"replaced release ({where}; allowed: {pct:g}%)", base, cand, round(slower, 1))
    change = f"{slower:.0f}% slower" if slower > 0 else f"{-slower:.0f}% faster"
    return GateVerdict(True, f"decode {cand:.1f} tok/s vs {base:.1f} tok/s ({change}; {where}; allowed: {pct:g}% slower)",
                       base, cand, round(slower, 1))
