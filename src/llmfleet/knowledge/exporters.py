"""Exporters llmfleet deploys as services (node exporter, NVIDIA's DCGM exporter): what each needs from
a host, judged from the host's facts, and the series its health check waits for.

The facts live in ``catalog/exporters.yaml`` with their sources; this module reads them and gives the
preflight its ``exporter`` verdict: where DCGM supports the host's cards and driver, where it does so
only in part (non-data-center cards, no profiling metrics before data-center Volta), and where no
source confirms it (a WARN that says so). Pure: no I/O beyond reading the packaged catalog.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfleet import yamlload
from llmfleet.errors import UsageError
from llmfleet.inventory.services import EXPORTER_KINDS
from llmfleet.knowledge.compat import Status, Verdict, cc_tuple, version_tuple
from llmfleet.knowledge.facts import GpuFact

EXPORTERS_PATH = Path(__file__).resolve().parent / "catalog" / "exporters.yaml"


@dataclass(frozen=True)
class Exporter:
    kind: str
    what: str
    health_series: str  # the health check waits for /metrics to carry a series starting with this
    gpus: bool  # it reads the GPUs: they are reserved for its container like an engine's
    support: dict[str, Any]
    profiling: dict[str, Any]
    dcgm4: dict[str, Any]
    sources: tuple[str, ...]


@functools.lru_cache(maxsize=2)
def load(path: str | None = None) -> dict[str, Exporter]:
    p = Path(path) if path else EXPORTERS_PATH
    try:
        doc = yamlload.safe_load(p.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise UsageError(f"{p}: cannot read the exporter catalog: {exc.strerror}") from None
    out: dict[str, Exporter] = {}
    for kind, d in (doc.get("exporters") or {}).items():
        if kind not in EXPORTER_KINDS:
            raise UsageError(f"{p}: exporters.{kind}: not a kind llmfleet deploys ({', '.join(EXPORTER_KINDS)})")
        out[kind] = Exporter(kind=kind, what=str(d["what"]),
                             health_series=str(d["health_series"]), gpus=bool(d.get("gpus")),
                             support=dict(d.get("support") or {}), profiling=dict(d.get("profiling") or {}),
                             dcgm4=dict(d.get("dcgm4") or {}), sources=tuple(d.get("sources") or ()))
    return out


def names() -> list[str]:
    return list(EXPORTER_KINDS)


def for_kind(kind: str) -> Exporter:
    found = load()
    if kind not in found:
        raise UsageError(f"no exporter {kind!r} in catalog/exporters.yaml; known: {', '.join(sorted(found))}")
    return found[kind]


def _branch(driver: str | None) -> int | None:
    v = version_tuple(driver.split("-")[0] if driver else None)
    return v[0] if v else None


def _at_least(cc: str | None, floor: str) -> bool | None:
    have, need = cc_tuple(cc), cc_tuple(floor)
    return None if have is None or need is None else have >= need


def support(kind: str, gpus: list[GpuFact], driver: str | None) -> Verdict:
    """Whether the exporter works on this host's cards and driver (the preflight's ``exporter`` check).

    node exporter needs nothing of the GPU. DCGM: a driver below its minimum branch or a card below
    its generation FAILs (the exporter would start and export nothing); a non-data-center card, a card
    without profiling metrics, or a driver branch no source confirms for DCGM 4 WARNs, saying so."""
    ex = for_kind(kind)
    if not ex.gpus:
        return Verdict("pass", f"{kind}: {ex.what}; needs no GPU")
    sup, src = ex.support, ex.support.get("source", "catalog/exporters.yaml")
    if not gpus:
        return Verdict("fail", f"{kind} reads the GPUs through DCGM, and the host reports none",
                       "deploy it only on GPU hosts (fix the gpu check first)")
    branch = _branch(driver)
    need = int(sup.get("min_driver_branch", 0))
    if branch is None:
        return Verdict("warn", f"{kind}: the driver version is unknown, so DCGM's R{need}+ cannot be judged ({src})",
                       "see `invoke facts` for what nvidia-smi printed")
    if branch < need:
        return Verdict("fail", f"{kind}: DCGM needs driver R{need} or newer; this host runs {driver} ({src})",
                       f"upgrade the driver to R{need}+ (docs/runbooks/driver-upgrade.md), or deploy node-exporter only")
    notes: list[str] = []
    warn = False  # something no source settles: a WARN that says what, never a silent PASS
    for g in gpus:
        if g.data_center is None:  # not in the catalog: judged by the data-center floor, and said so
            floor = str(sup.get("data_center_min_cc", "0.0"))
        else:
            floor = str(sup.get("data_center_min_cc" if g.data_center else "other_min_cc", "0.0"))
        ok = _at_least(g.compute_capability, floor)
        if ok is False:
            what = "data-center" if g.data_center is not False else "non-data-center"
            return Verdict("fail", f"{kind}: GPU {g.index} {g.name} ({g.compute_capability}) is older than DCGM "
                           f"supports for {what} cards ({floor}+; {src})",
                           "deploy node-exporter only on this host; nvidia-smi -q (invoke facts) still reads its health")
        if ok is None:
            warn = True
            notes.append(f"GPU {g.index} {g.name}: compute capability unknown, DCGM support not judged")
            continue
        if g.data_center is None:
            warn = True
            notes.append(f"GPU {g.index} {g.name} is not in the GPU catalog: whether it is a data-center card "
                         f"(DCGM {sup.get('data_center_min_cc')}+) or another ({sup.get('other_min_cc')}+, part of "
                         f"DCGM's functionality missing) is unknown ({src})")
        elif not g.data_center:
            notes.append(f"GPU {g.index} {g.name} is not a data-center card: part of DCGM's functionality is "
                         f"missing on it ({src})")
        prof = ex.profiling.get("data_center_min_cc")
        if prof and not (g.data_center and _at_least(g.compute_capability, str(prof))):
            notes.append(f"GPU {g.index} {g.name}: no profiling (DCP) metrics (they need a data-center card "
                         f"{prof}+), the default counters only")
    confirmed = ex.dcgm4.get("confirmed_from_branch")
    if confirmed and branch < int(confirmed):
        warn = True
        notes.append(f"driver {driver} (R{branch}): no source read here confirms DCGM 4 (dcgm-exporter 4.x "
                     f"images) below R{confirmed} ({', '.join(ex.dcgm4.get('sources') or ())})")
    status: Status = "warn" if warn else "pass"
    judged = sum(1 for g in gpus if _at_least(g.compute_capability, "0.0"))
    count = f"{judged} of {len(gpus)}" if judged != len(gpus) else str(len(gpus))
    head = f"{kind}: DCGM supports {count} GPU{'s' if len(gpus) != 1 else ''} on driver {driver}"
    return Verdict(status, head + (f"; {'; '.join(notes)}" if notes else ""),
                   "check the exporter's /metrics after the deploy (its health check does)" if status == "warn" else "")
