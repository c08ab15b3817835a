"""The fleet's own decode measurements, and the health floor they give.

The planner's decode prediction is a model fitted on the cards it was measured on; on a card nobody
measured it for (V100, P40, T4) it can be wrong either way. Every healthy release on a host keeps
what its health check measured (``releases/<id>/health.json``) and ``invoke bench`` keeps its
figures beside it (``bench.json``): this module turns those into records of one shape, keyed by what
decides the speed, and builds a floor from them:

    records_from_state(host, states)          every record a host's release state holds
    key_for(plan_summary, image)              the key a new release's measurements fall under
    fleet_gate(records, key)                  fraction x the median of the key's healthy runs
    gate_for(plan, image, host=, states=, cached=)   the three above in one call (the deploy's)

Pure: nothing here touches a host or the disk (``llmfleet.health.speed_cache`` keeps records seen
from hosts on this machine). Nothing here raises on what a host returned: a figure that is not a
positive number is no record, a manifest without a plan is no key.

One run counts once: a release with both a health report and a bench result is one run, measured by
its health check (the same short prompt and answer the gate then judges a new release by; the
bench's batch-1 figure stands in where the health report has no decode figure).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmfleet.knowledge.release_state import Manifest

SOURCES = ("health", "bench")
DEFAULT_FRACTION = 0.6
DEFAULT_MIN_RUNS = 1
MAX_NAMED_RUNS = 5  # runs named in a gate's source sentence; the rest are counted

# Upper bounds (tokens) of the context classes, and their labels; above the last: ">64k".
CONTEXT_CLASSES: tuple[tuple[int, str], ...] = ((4096, "<=4k"), (16384, "<=16k"), (65536, "<=64k"))
CONTEXT_ABOVE = ">64k"
CONTEXT_UNKNOWN = "?"


def context_class(context: Any) -> str:
    """The class of a planned context (tokens per sequence): ``<=4k``, ``<=16k``, ``<=64k``, ``>64k``,
    or ``?`` when the plan has none.

    Why classes and not the number: the planned context changes a release's decode speed even for a
    short health-check prompt (the engine sizes its KV cache and attention buffers for it, and vLLM's
    CUDA graphs and llama.cpp's flash-attention kernels are picked for it), but by steps, not by each
    token: 8000 and 8192 run alike, 4k and 128k do not. Exact figures would split the fleet's history
    into keys of one release each; classes a factor of 4 apart keep like with like and still keep a
    long-context release from setting the floor of a short one.
    """
    if isinstance(context, bool) or not isinstance(context, int) or context <= 0:
        return CONTEXT_UNKNOWN
    for bound, label in CONTEXT_CLASSES:
        if context <= bound:
            return label
    return CONTEXT_ABOVE


def _text(v: Any) -> str:
    return v.strip() if isinstance(v, str) else ""


def _count(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else 1


def _tokps(v: Any) -> float | None:
    """A decode figure: a finite positive number, else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) and f > 0 else None


@dataclass(frozen=True, order=True)
class SpeedKey:
    """What decides a release's batch-1 decode speed, as far as the fleet can tell runs apart:

    - ``card``: the catalog GPU id of the plan (``v100-sxm2-32gb``);
    - ``engine`` and ``image``: the engine and the image it ran (the image catalog key, e.g.
      ``llamacpp:b5000-cu122``, else the digest): a new engine build is a new speed;
    - ``model``, ``quant``: what is read per token;
    - ``context``: the planned context's class (``context_class``);
    - ``gpus``, ``hosts``: cards per host and hosts, when the plan splits the model.
    """

    card: str
    engine: str
    image: str
    model: str
    quant: str
    context: str
    gpus: int = 1
    hosts: int = 1

    @property
    def card_class(self) -> tuple[str, str, str, str, str, int, int]:
        """The key without its image: what ``invoke speed`` puts in one row."""
        return (self.card, self.engine, self.model, self.quant, self.context, self.gpus, self.hosts)

    @property
    def split(self) -> str:
        """``""`` on one card, else ``2 GPUs`` / ``2 GPUs x 2 hosts``."""
        if self.gpus == 1 and self.hosts == 1:
            return ""
        return f"{self.gpus} GPU(s)" + (f" x {self.hosts} hosts" if self.hosts > 1 else "")

    def label(self) -> str:
        parts = [self.card, self.engine, self.image, self.model, self.quant, f"context {self.context}"]
        return ", ".join([*parts, self.split] if self.split else parts)

    def to_dict(self) -> dict[str, Any]:
        return {"card": self.card, "engine": self.engine, "image": self.image, "model": self.model,
                "quant": self.quant, "context": self.context, "gpus": self.gpus, "hosts": self.hosts}

    @classmethod
    def from_dict(cls, data: Any) -> SpeedKey | None:
        if not isinstance(data, dict):
            return None
        card, engine, model = _text(data.get("card")), _text(data.get("engine")), _text(data.get("model"))
        if not (card and engine and model):
            return None
        return cls(card=card, engine=engine, image=_text(data.get("image")), model=model,
                   quant=_text(data.get("quant")), context=_text(data.get("context")) or CONTEXT_UNKNOWN,
                   gpus=_count(data.get("gpus")), hosts=_count(data.get("hosts")))


def image_id(image: Any) -> str:
    """The image part of a key from what a caller holds: an ``ImageRef`` or a manifest's image dict
    (its catalog ``key``, else its ``digest``), or a string (a key, a digest, or a reference whose
    ``@sha256:`` digest is taken). ``""`` when there is none."""
    if image is None:
        return ""
    if isinstance(image, str):
        s = image.strip()
        return s.rsplit("@", 1)[1] if "@sha256:" in s else s
    def get(name: str) -> object:
        return image.get(name) if isinstance(image, dict) else getattr(image, name, None)

    for name in ("key", "digest"):
        v = get(name)
        if isinstance(v, str) and v.strip():
            return v.strip()
    ref = get("ref") or get("pull_ref")
    return image_id(ref) if isinstance(ref, str) and "@sha256:" in ref else ""


def _summary(plan: Any) -> Any:
    """A ``PlanSummary`` from a summary, a planner ``Plan`` or a plan dict (a manifest's)."""
    from llmfleet.knowledge.planner import PlanSummary, summarize

    if plan is None:
        return None
    if isinstance(plan, dict):
        return PlanSummary.from_dict(plan)
    if isinstance(plan, PlanSummary):
        return plan
    try:
        return summarize(plan)
    except (AttributeError, TypeError):
        return None


def key_for(plan_summary: Any, image: Any) -> SpeedKey | None:
    """The key of a release planned by ``plan_summary`` (a ``PlanSummary``, a ``Plan`` or a plan dict)
    running ``image`` (see ``image_id``). None when the plan does not name its card, engine and model."""
    s = _summary(plan_summary)
    if s is None:
        return None
    card, engine, model = _text(s.gpu), _text(s.engine), _text(s.model)
    if not (card and engine and model):
        return None
    return SpeedKey(card=card, engine=engine, image=image_id(image), model=model, quant=_text(s.quant),
                    context=context_class(s.context), gpus=_count(s.gpus), hosts=_count(s.hosts))


def key_of_manifest(manifest: Manifest | None) -> SpeedKey | None:
    """The key a release's manifest describes (its plan and its image)."""
    if manifest is None or not manifest.plan:
        return None
    return key_for(manifest.plan, manifest.image)


@dataclass(frozen=True)
class SpeedRecord:
    """One decode measurement of one release on one host.

    ``source``: ``health`` (the deploy's health check, ``health.json``) or ``bench`` (``invoke bench``'s
    batch-1 level, ``bench.json``). ``healthy``: the release passed its health check; a record of a
    release that failed it, or that has no health report yet (unconfirmed), is kept but never counted.
    ``lab``: measured on a lab host (a CPU engine standing in for a simulated card). ``ceiling`` and
    ``predicted``: the planner's batch-1 figures in the release's manifest, for ``invoke speed``."""

    key: SpeedKey
    host: str
    service: str
    release: str
    time: str
    tokps: float
    source: str
    healthy: bool
    lab: bool = False
    ceiling: float | None = None
    predicted: tuple[float, float] | None = None

    @property
    def run(self) -> tuple[str, str, str]:
        return (self.host, self.service, self.release)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key.to_dict(), "host": self.host, "service": self.service, "release": self.release,
                "time": self.time, "tokps": self.tokps, "source": self.source, "healthy": self.healthy,
                "lab": self.lab, "ceiling": self.ceiling,
                "predicted": list(self.predicted) if self.predicted else None}

    @classmethod
    def from_dict(cls, data: Any) -> SpeedRecord | None:
        """A record read back (the cache's JSON); None for anything that is not one."""
        if not isinstance(data, dict):
            return None
        key = SpeedKey.from_dict(data.get("key"))
        tokps = _tokps(data.get("tokps"))
        host, release = _text(data.get("host")), _text(data.get("release"))
        source = data.get("source")
        if key is None or tokps is None or not host or not release or source not in SOURCES:
            return None
        return cls(key=key, host=host, service=_text(data.get("service")), release=release,
                   time=_text(data.get("time")), tokps=tokps, source=source, healthy=data.get("healthy") is True,
                   lab=data.get("lab") is True, ceiling=_tokps(data.get("ceiling")),
                   predicted=_pair(data.get("predicted")))


def _pair(v: Any) -> tuple[float, float] | None:
    if isinstance(v, list | tuple) and len(v) == 2:
        lo, hi = _tokps(v[0]), _tokps(v[1])
        if lo is not None and hi is not None:
            return (min(lo, hi), max(lo, hi))
    return None


# ---------------------------------------------------------------------------------------------
# Records from a host's release state


def bench_batch1_tokps(doc: Any) -> float | None:
    """The batch-1 decode figure of a bench result: the p50 of its one-stream level with the shortest
    prompt that answered at all. None for a document that is not a bench result or has no such level."""
    if not isinstance(doc, dict) or not isinstance(doc.get("levels"), list):
        return None
    best: tuple[int, float] | None = None
    for lv in doc["levels"]:
        if not isinstance(lv, dict) or lv.get("concurrency") != 1 or isinstance(lv.get("concurrency"), bool):
            continue
        ok = lv.get("ok")
        if not isinstance(ok, int) or isinstance(ok, bool) or ok < 1:
            continue
        tokps = _tokps(lv.get("decode_tokps_p50"))
        prompt = lv.get("prompt_tokens_asked")
        prompt = prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else 0
        if tokps is not None and (best is None or prompt < best[0]):
            best = (prompt, tokps)
    return best[1] if best else None


def _plan_figures(manifest: Manifest) -> tuple[float | None, tuple[float, float] | None]:
    plan = manifest.plan or {}
    return _tokps(plan.get("decode_tokps_ceiling")), _pair(plan.get("decode_tokps_realistic"))


def _release_time(rid: str, *docs: Any) -> str:
    for d in docs:
        t = d.get("time") if isinstance(d, dict) else getattr(d, "time", None)
        if isinstance(t, str) and t.strip():
            return t.strip()
    try:
        from llmfleet.knowledge.release_state import release_time

        return release_time(rid).isoformat(timespec="seconds")
    except ValueError:
        return ""


def _states(state: Any) -> list[Any]:
    """``{name: ServiceState}``, one ``ServiceState`` or a list of them -> a list of them."""
    if state is None:
        return []
    if isinstance(state, Mapping):
        return list(state.values())
    if isinstance(state, list | tuple):
        return list(state)
    return [state]


def records_from_state(host: str, state: Any, *, bench: Mapping[str, Mapping[str, Any]] | None = None,
                       lab: bool = False) -> list[SpeedRecord]:
    """Every decode measurement a host's release state holds: per kept release with a plan in its
    manifest, one ``health`` record (its ``health.json`` measured a decode speed) and one ``bench``
    record (``bench``: {service: {release id: bench.json document}}, as ``store.parse_bench`` reads them
    per service; a ``bench`` attribute on a release, when the state carries one, counts too).

    ``state``: what ``store.parse_state`` returns (``{service: ServiceState}``), or one ``ServiceState``.
    ``healthy`` is whether the release's own health report says ``healthy``: a release that failed its
    check, or that has none (never checked, or not yet confirmed), gives records marked unhealthy.
    ``lab``: the host is a lab host (its engines run on the CPU). Never raises on odd host output.
    """
    out: list[SpeedRecord] = []
    bench = bench if isinstance(bench, Mapping) else {}
    for st in _states(state):
        name = getattr(st, "name", "")
        releases = getattr(st, "releases", None)
        if not isinstance(name, str) or not isinstance(releases, Mapping):
            continue
        benches = bench.get(name)
        benches = benches if isinstance(benches, Mapping) else {}
        for rid in sorted(r for r in releases if isinstance(r, str)):
            info = releases[rid]
            doc = benches.get(rid, getattr(info, "bench", None))
            out += _release_records(str(host), name, rid, info, doc, lab)
    return out


def _release_records(host: str, service: str, rid: str, info: Any, bench_doc: Any, lab: bool) -> list[SpeedRecord]:
    manifest = getattr(info, "manifest", None)
    if isinstance(manifest, dict):
        manifest = Manifest.parse(manifest)
    key = key_of_manifest(manifest) if isinstance(manifest, Manifest) else None
    if key is None or manifest is None:
        return []
    health = getattr(info, "health", None)
    health = health if isinstance(health, dict) else None
    healthy = bool(health and health.get("result") == "healthy")
    ceiling, predicted = _plan_figures(manifest)
    found = [(_tokps(health.get("decode_tokps")) if health else None, "health", health),
             (bench_batch1_tokps(bench_doc), "bench", bench_doc)]
    return [SpeedRecord(key=key, host=host, service=service, release=rid, time=_release_time(rid, doc, manifest),
                        tokps=round(tokps, 2), source=source, healthy=healthy,
                        lab=lab or (isinstance(doc, dict) and doc.get("lab") is True),
                        ceiling=ceiling, predicted=predicted)
            for tokps, source, doc in found if tokps is not None]


# ---------------------------------------------------------------------------------------------
# Records from several places


def merge(fresh: Iterable[SpeedRecord], cached: Iterable[SpeedRecord] = (),
          contacted: Iterable[str] = ()) -> list[SpeedRecord]:
    """The records read from hosts now (``fresh``) plus the cached ones of hosts not contacted now: a
    host read now is the record of itself (its pruned releases drop out of the history), ``contacted``
    names hosts read now that gave no record. One record per (host, service, release, source), fresh
    first."""
    fresh = list(fresh)
    now = {r.host for r in fresh} | set(contacted)
    out: list[SpeedRecord] = []
    seen: set[tuple[str, str, str, str]] = set()
    for r in [*fresh, *(c for c in cached if c.host not in now)]:
        ident = (*r.run, r.source)
        if ident not in seen:
            seen.add(ident)
            out.append(r)
    return out


def runs(records: Iterable[SpeedRecord], key: SpeedKey | None = None, *, lab: bool = False,
         same_class: bool = False) -> list[SpeedRecord]:
    """The healthy runs of ``key`` (every key when None; with ``same_class`` the key's card class, any
    image), one per release: its health record, else its bench record. Lab records count only when
    ``lab`` (a lab host's gate), and then only lab records."""
    best: dict[tuple[str, str, str], SpeedRecord] = {}
    for r in records:
        if not isinstance(r, SpeedRecord) or not r.healthy or r.lab != lab:
            continue
        if key is not None and (r.key.card_class != key.card_class if same_class else r.key != key):
            continue
        have = best.get(r.run)
        if have is None or (have.source != "health" and r.source == "health"):
            best[r.run] = r
    return sorted(best.values(), key=lambda r: (r.host, r.service, r.release))


# ---------------------------------------------------------------------------------------------
# The floor


@dataclass(frozen=True)
class FleetGate:
    """A decode floor from the fleet's own healthy runs of one key: ``tokps`` = ``fraction`` x
    ``median``. ``source`` says so in one sentence naming the runs (for the health check's message)."""

    tokps: float
    median: float
    fraction: float
    key: SpeedKey
    runs: tuple[SpeedRecord, ...] = field(default_factory=tuple)
    source: str = ""

    @property
    def low(self) -> float:
        return min(r.tokps for r in self.runs)

    @property
    def high(self) -> float:
        return max(r.tokps for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {"tokps": self.tokps, "median": self.median, "fraction": self.fraction, "key": self.key.to_dict(),
                "runs": [r.to_dict() for r in self.runs], "source": self.source}


def _fmt(v: float) -> str:
    return f"{v:.1f}"


def _run_label(r: SpeedRecord) -> str:
    return f"{r.host} ({r.service} {r.release}: {_fmt(r.tokps)} tok/s)"


def fleet_gate(records: Iterable[SpeedRecord], key: SpeedKey | None, fraction: float = DEFAULT_FRACTION,
               min_runs: int = DEFAULT_MIN_RUNS, *, lab: bool = False) -> FleetGate | None:
    """The floor the fleet's own measurements give ``key``: ``fraction`` x the median decode of its
    healthy runs (one per release, ``runs``), when there are at least ``min_runs`` of them; None
    otherwise (no key, too few runs, a fraction that is not in (0, 1])."""
    if key is None or isinstance(fraction, bool) or not isinstance(fraction, int | float) \
            or not 0 < fraction <= 1 or isinstance(min_runs, bool) or not isinstance(min_runs, int):
        return None
    good = runs(records, key, lab=lab)
    if not good or len(good) < max(1, min_runs):
        return None
    median = statistics.median(r.tokps for r in good)
    floor = round(fraction * median, 2)
    named = ", ".join(_run_label(r) for r in good[:MAX_NAMED_RUNS])
    more = f" and {len(good) - MAX_NAMED_RUNS} more" if len(good) > MAX_NAMED_RUNS else ""
    what = "lab run" if lab else "healthy run"
    source = (f"{fraction:g} x the median {_fmt(median)} tok/s of {len(good)} {what}{'s' if len(good) != 1 else ''} "
              f"of this card/engine/image/model/quant/context ({key.label()}) on {named}{more}")
    return FleetGate(tokps=floor, median=round(median, 2), fraction=float(fraction), key=key, runs=tuple(good),
                     source=source)


def gate_for(plan: Any, image: Any, *, host: str = "", states: Any = None, cached: Iterable[SpeedRecord] = (),
             bench: Mapping[str, Mapping[str, Any]] | None = None, fraction: float = DEFAULT_FRACTION,
             min_runs: int = DEFAULT_MIN_RUNS, lab: bool = False) -> FleetGate | None:
    """The deploy's one call: the floor for a release planned by ``plan`` running ``image`` on
    ``host``, from the host's release state the deploy already read (``states``: ``store.parse_state``'s
    answer) and the records cached from other hosts (``cached``: ``speed_cache.load()``). The host's
    own records replace its cached ones. None when the fleet has too few healthy runs of the key."""
    fresh = records_from_state(host, states, bench=bench, lab=lab) if host else []
    return fleet_gate(merge(fresh, cached, [host] if host else []), key_for(plan, image), fraction, min_runs, lab=lab)


# ---------------------------------------------------------------------------------------------
# Per card class: measured against predicted (``invoke speed``)


def fitted_efficiency(measured: float | None, ceiling: float | None, predicted: tuple[float, float] | None,
                      efficiency: tuple[float, float] | None) -> float | None:
    """The bandwidth efficiency that makes the planner's speed model give ``measured``.

    The model (``planner.decode_speed``): time per token = 1 / (ceiling x e) + fixed costs (layers x
    per-layer cost + per-token cost + the split's communication), where ``ceiling`` = bandwidth /
    bytes read per token. Its predicted low end pairs the low efficiency with the high costs, its high
    end the high efficiency with the low costs, so each end gives its fixed cost back:
    fixed = 1 / predicted - 1 / (ceiling x e). With the mean of the two, the measured time per token
    gives e = 1 / (ceiling x (1 / measured - fixed)). None when a figure is missing or the measured
    speed is beyond what the fixed costs allow (then the costs, not the efficiency, are off).
    """
    if not measured or not ceiling or predicted is None or efficiency is None:
        return None
    (p_lo, p_hi), (e_lo, e_hi) = predicted, efficiency
    if min(p_lo, p_hi, e_lo, e_hi, measured, ceiling) <= 0:
        return None
    fixed = ((1 / p_lo - 1 / (ceiling * e_lo)) + (1 / p_hi - 1 / (ceiling * e_hi))) / 2
    left = 1 / measured - max(fixed, 0.0)
    if left <= 0:
        return None
    e = 1 / (ceiling * left)
    return round(e, 3) if 0 < e <= 1.5 else None


@dataclass(frozen=True)
class ClassSummary:
    """One card class (card, engine, model, quant, context class, split): its healthy runs measured
    against the planner's prediction. ``efficiency`` (the planner's bandwidth efficiency for the card,
    low-high) and ``fitted`` (``fitted_efficiency`` of the median) are filled in by the caller, which
    reads the catalog."""

    card: str
    engine: str
    model: str
    quant: str
    context: str
    gpus: int
    hosts: int
    runs: tuple[SpeedRecord, ...]
    images: tuple[str, ...]
    predicted: tuple[float, float] | None
    ceiling: float | None
    efficiency: tuple[float, float] | None = None
    fitted: float | None = None

    @property
    def count(self) -> int:
        return len(self.runs)

    @property
    def low(self) -> float:
        return min(r.tokps for r in self.runs)

    @property
    def high(self) -> float:
        return max(r.tokps for r in self.runs)

    @property
    def median(self) -> float:
        return round(statistics.median(r.tokps for r in self.runs), 2)

    @property
    def hosts_measured(self) -> tuple[str, ...]:
        return tuple(sorted({r.host for r in self.runs}))

    @property
    def verdict(self) -> str:
        """``below`` / ``within`` / ``above`` the predicted range (the median), or ``-``."""
        if self.predicted is None:
            return "-"
        lo, hi = self.predicted
        return "below" if self.median < lo else "above" if self.median > hi else "within"

    @property
    def source(self) -> str:
        """``measured on HOST at DATE, ...`` (each host's newest run)."""
        newest: dict[str, str] = {}
        for r in self.runs:
            newest[r.host] = max(newest.get(r.host, ""), r.time)
        return "measured on " + ", ".join(f"{h} at {t or 'an unknown time'}" for h, t in sorted(newest.items()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "card": self.card, "engine": self.engine, "model": self.model, "quant": self.quant,
            "context": self.context, "gpus": self.gpus, "hosts": self.hosts, "images": list(self.images),
            "measured": {"count": self.count, "min": self.low, "max": self.high, "median": self.median,
                         "hosts": list(self.hosts_measured)},
            "predicted": list(self.predicted) if self.predicted else None, "ceiling": self.ceiling,
            "verdict": self.verdict,
            "median_vs_ceiling": round(self.median / self.ceiling, 3) if self.ceiling else None,
            "efficiency": {"planner": list(self.efficiency) if self.efficiency else None, "fitted": self.fitted},
            "source": self.source, "runs": [r.to_dict() for r in self.runs],
        }


def _newest(values: list[tuple[str, Any]]) -> Any:
    present = [(t, v) for t, v in values if v is not None]
    return max(present, key=lambda tv: tv[0])[1] if present else None


def class_summaries(records: Iterable[SpeedRecord], *, lab: bool = False) -> list[ClassSummary]:
    """One summary per card class with healthy runs (``runs``, one per release; any image), sorted by
    card, engine, model, quant, context. The prediction shown is the newest run's manifest's."""
    groups: dict[tuple[str, str, str, str, str, int, int], list[SpeedRecord]] = {}
    for r in runs(records, lab=lab):
        groups.setdefault(r.key.card_class, []).append(r)
    out = []
    for cls in sorted(groups):
        rs = groups[cls]
        card, engine, model, quant, context, gpus, hosts = cls
        out.append(ClassSummary(
            card=card, engine=engine, model=model, quant=quant, context=context, gpus=gpus, hosts=hosts,
            runs=tuple(rs), images=tuple(sorted({r.key.image for r in rs if r.key.image})),
            predicted=_newest([(r.time, r.predicted) for r in rs]),
            ceiling=_newest([(r.time, r.ceiling) for r in rs]),
        ))
    return out


def measured_line(records: Iterable[SpeedRecord], key: SpeedKey | None, *, same_class: bool = False) -> str | None:
    """``measured on 3 hosts: 117-121 tok/s (median 119)`` for the healthy runs of ``key`` (with
    ``same_class``: of its card class, any image), or None when there are none."""
    rs = runs(records, key, same_class=same_class) if key is not None else []
    if not rs:
        return None
    hosts = {r.host for r in rs}
    vals = [r.tokps for r in rs]
    lo, hi, med = min(vals), max(vals), statistics.median(vals)

    def n(v: float) -> str:
        return f"{v:.0f}" if v >= 100 else f"{v:.1f}"

    spread = n(lo) if n(lo) == n(hi) else f"{n(lo)}-{n(hi)}"
    where = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}"
    runs_said = f", {len(rs)} runs" if len(rs) != len(hosts) else ""
    return f"measured on {where}{runs_said}: {spread} tok/s (median {n(med)})"
