"""GPU hardware health rules: what the cards' Xid events, ECC counters, pending retirements and remaps,
clocks event reasons, PCIe link and missing cards mean for a service, from the facts the probe read
(``Facts.gpu_health``, ``llmfleet.host.gpu_health``) and the Xid catalog (``catalog/xids.yaml``).

Pure. ``findings`` lists every condition of every card; ``judge`` is the preflight's ``gpu-health``
verdict for the cards one service uses (a fatal condition there FAILs, a degraded one WARNs; a fatal
condition on another card of the host WARNs); ``status_findings`` is what ``invoke status`` shows.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any, Literal

from llmfleet.knowledge.compat import Verdict
from llmfleet.knowledge.facts import CardHealth, GpuHealth

Severity = Literal["fatal", "degraded", "app"]
Used = list[int] | None  # the indexes a service uses; None: every card of the host ("gpus: all")

XID_CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
XID_PAGE = "https://docs.nvidia.com/deploy/xid-errors/"
PAGE_RETIREMENT = "https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html"
MEMORY_ERRORS = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/"
NVML_PCIE = "https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html"
NVML_CLOCKS = "https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksThrottleReasons.html"
# Clocks event reasons that hold the card below its clocks because of heat or power delivery
# (SW Power Cap, the board's own power limit under load, is normal and never reported).
SLOWDOWNS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")
_SHOWN = 3  # findings named in a status note


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    meaning: str
    severity: Severity
    action: str
    sources: tuple[str, ...]
    confidence: str


@functools.cache
def xid_catalog() -> dict[int, XidInfo]:
    """``catalog/xids.yaml`` by code."""
    from llmfleet.knowledge.catalog import _read_yaml

    data = _read_yaml("xids.yaml")
    out: dict[int, XidInfo] = {}
    for e in data.get("xids") or []:
        sev = str(e["severity"])
        if sev not in ("fatal", "degraded", "app"):
            raise ValueError(f"catalog xids.yaml: Xid {e.get('code')}: severity {sev!r} is not fatal/degraded/app")
        out[int(e["code"])] = XidInfo(code=int(e["code"]), name=str(e["name"]), meaning=str(e["meaning"]),
                                      severity=sev,  # type: ignore[arg-type]
                                      action=str(e["action"]), sources=tuple(str(s) for s in e.get("sources") or ()),
                                      confidence=str(e.get("confidence") or "U"))
    return out


def xid_info(code: int) -> XidInfo:
    """The catalog's entry; a code it lacks is judged degraded and points at NVIDIA's catalog."""
    known = xid_catalog().get(code)
    if known is not None:
        return known
    return XidInfo(code=code, name="not in llmfleet's Xid catalog", meaning="an Xid llmfleet does not know",
                   severity="degraded", action=f"look Xid {code} up in NVIDIA's Xid catalog ({XID_CATALOG_URL}) "
                   "and add it to catalog/xids.yaml", sources=(XID_CATALOG_URL,), confidence="U")


@dataclass(frozen=True)
class Finding:
    """One condition of one card."""

    gpu: int | None  # the card's nvidia-smi index; None: not listed by nvidia-smi (see ``slot``)
    severity: Severity
    what: str  # short, for a status note: "Xid 79 (GPU has fallen off the bus)"
    detail: str  # what it means and the evidence
    fix: str
    source: str = ""
    slot: int | None = None  # a missing card: where it sits among the bus's NVIDIA cards (nvidia-smi's order)
    pci: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def where(self) -> str:
        """``GPU 0``; a card nvidia-smi does not list: ``card 0000:3b:00.0 (GPU 1 by bus order)``."""
        if self.gpu is not None:
            return f"GPU {self.gpu}"
        return self.short + (f" (GPU {self.slot} by bus order)" if self.slot is not None else "")

    @property
    def short(self) -> str:
        if self.gpu is not None:
            return f"GPU {self.gpu}"
        return f"card {self.pci}" if self.pci else "a card"

    def used_by(self, used: Used) -> bool:
        if used is None:
            return True
        index = self.gpu if self.gpu is not None else self.slot
        return index is not None and index in used


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _card_findings(c: CardHealth) -> list[Finding]:
    out: list[Finding] = []
    i = c.index

    def add(sev: Severity, what: str, detail: str, fix: str, source: str) -> None:
        out.append(Finding(i, sev, what, detail, fix, source, pci=c.bus_id))

    reset = f"drain the card and reset it (nvidia-smi -r -i {i if i is not None else 'N'}) or reboot the host"
    if c.recovery_action and c.recovery_action.lower() not in ("none", "n/a"):
        add("fatal", f"the driver asks for recovery: {c.recovery_action}",
            f"nvidia-smi -q GPU Recovery Action: {c.recovery_action}", f"do it: {reset}", XID_CATALOG_URL)
    if c.ecc_volatile_uncorrectable:
        add("fatal", f"{_plural(c.ecc_volatile_uncorrectable, 'uncorrectable ECC error')} since the last reset",
            "the card's memory returned data ECC could not correct (nvidia-smi -q ECC Errors, Volatile)",
            f"{reset}; RMA the card if uncorrectable errors come back", XID_PAGE)
    if c.retired_pages_pending:
        add("fatal", "a retired memory page waits for a reset",
            "nvidia-smi -q Retired Pages: Pending Page Blacklist Yes: the bad page stays in use until the card is reset",
            reset, PAGE_RETIREMENT)
    if c.remap_pending:
        add("fatal", "a row remap waits for a reset",
            "nvidia-smi -q Remapped Rows: Pending Yes: the spare row replaces the bad one only after a GPU reset",
            reset, MEMORY_ERRORS)
    if c.remap_failure:
        add("fatal", "a row remap failed",
            "nvidia-smi -q Remapped Rows: Remapping Failure Occurred Yes: the card ran out of spare rows for a bad one",
            "drain the card and RMA it", MEMORY_ERRORS)
    for what in c.repair_pending:
        add("fatal", what, f"nvidia-smi -q ECC Errors: {what} Yes: a memory repair waits for a reset", reset,
            MEMORY_ERRORS)
    if c.unrepairable_memory:
        add("fatal", "unrepairable memory", "nvidia-smi -q ECC Errors: Unrepairable Memory Yes",
            "drain the card and RMA it", MEMORY_ERRORS)
    if c.ecc_aggregate_uncorrectable and not c.ecc_volatile_uncorrectable:
        add("degraded", f"{_plural(c.ecc_aggregate_uncorrectable, 'uncorrectable ECC error')} over the card's life",
            "nvidia-smi -q ECC Errors, Aggregate: none since the last reset",
            "watch the card (nvidia-smi -q -d ECC); RMA it if the count grows", XID_PAGE)
    if c.sram_threshold_exceeded:
        add("degraded", "SRAM error threshold exceeded",
            "nvidia-smi -q ECC Errors: SRAM Threshold Exceeded Yes (uncorrectable SRAM errors past NVIDIA's limit)",
            "plan to RMA the card", MEMORY_ERRORS)
    if c.pcie_width_current and c.pcie_width_max and c.pcie_width_current < c.pcie_width_max:
        add("degraded", f"PCIe link x{c.pcie_width_current} of x{c.pcie_width_max}",
            f"the link trained to {c.pcie_width_current} of the {c.pcie_width_max} lanes the card and slot "
            "allow: host-to-card copies (model load, KV offload) run slower",
            "reseat the card, check the riser and the slot; see the kernel log for PCIe errors", NVML_PCIE)
    top = c.pcie_gen_max
    if top and c.pcie_gen_host_max:
        top = min(top, c.pcie_gen_host_max)
    if c.pcie_gen_current and top and c.pcie_gen_current < top and c.idle is False:
        # An idle card drops its link speed to save power; only a busy one running slow is a finding.
        add("degraded", f"PCIe gen {c.pcie_gen_current} of {top} while busy",
            f"the link runs at generation {c.pcie_gen_current} while the card works (it allows {top})",
            "check the slot's BIOS PCIe setting, the riser and the kernel log for PCIe errors", NVML_PCIE)
    slow = [r for r in c.throttle_active if r in SLOWDOWNS]
    if slow:
        add("degraded", f"clocks held down ({', '.join(slow)})",
            "nvidia-smi -q clocks event reasons: the card runs below its clocks for heat or power delivery",
            "check cooling (fans, airflow, inlet temperature) and the power cables and supply", NVML_CLOCKS)
    return out


def findings(health: GpuHealth | None) -> list[Finding]:
    """Every condition of every card of the host, cards in order, the most severe first within a card."""
    if health is None:
        return []
    out: list[Finding] = []
    for c in health.cards:
        out += _card_findings(c)
    slot_of = {m.pci.rsplit(".", 1)[0]: m.expected_index for m in health.missing}
    for ev in sorted(health.xids, key=lambda e: (e.gpu_index if e.gpu_index is not None else 99, e.code)):
        info = xid_info(ev.code)
        times = f" x{ev.count}" if ev.count > 1 else ""
        fix = info.action if info.severity == "app" else (
            f"{info.action} (the kernel log holds it until the next reboot; after a GPU reset that fixed it, "
            "`dmesg -C` clears it)")
        out.append(Finding(ev.gpu_index, info.severity, f"Xid {ev.code} ({info.name}){times}",
                           f"{info.meaning}; {_plural(ev.count, 'line')} since boot, the last: {ev.last!r}",
                           fix, info.sources[0] if info.sources else XID_CATALOG_URL,
                           slot=slot_of.get(ev.pci) if ev.gpu_index is None else None,
                           pci=ev.pci + ".0"))
    for m in health.missing:
        out.append(Finding(None, "fatal", "missing from nvidia-smi",
                           f"{m.why}" + (f" ({m.device})" if m.device else ""),
                           "drain the host and reboot it; if the card stays missing, reseat it and check its power "
                           "cables; RMA it if it does not come back", XID_PAGE, slot=m.expected_index, pci=m.pci))
    rank = {"fatal": 0, "degraded": 1, "app": 2}
    return sorted(out, key=lambda f: (f.gpu if f.gpu is not None else (f.slot if f.slot is not None else 99),
                                      rank[f.severity]))


def _said(fs: list[Finding]) -> str:
    return "; ".join(f"{f.where}: {f.what}: {f.detail}" for f in fs)


def _fixes(fs: list[Finding]) -> str:
    seen: list[str] = []
    for f in fs:
        line = f"{f.where}: {f.fix} ({f.source})" if f.source else f"{f.where}: {f.fix}"
        if line not in seen:
            seen.append(line)
    return "; ".join(seen)


def judge(health: GpuHealth | None, used: Used, service: str) -> Verdict | None:
    """The preflight's ``gpu-health`` verdict for a service on the cards it uses (``used``: their
    indexes; None: every card). None when the probe read no health at all (an older probe, saved facts)."""
    if health is None:
        return None
    fs = findings(health)
    mine = [f for f in fs if f.used_by(used)]
    others = [f for f in fs if not f.used_by(used)]
    fatal = [f for f in mine if f.severity == "fatal"]
    degraded = [f for f in mine if f.severity == "degraded"]
    elsewhere = [f for f in others if f.severity == "fatal"]
    cards = "every card" if used is None else "GPU " + ", ".join(map(str, used))
    if fatal:
        return Verdict("fail", f"service {service} would run on a failing card: {_said(fatal)}", _fixes(fatal))
    if degraded or elsewhere:
        parts = []
        if degraded:
            parts.append(_said(degraded))
        if elsewhere:
            parts.append(f"not used by {service}, but on this host: {_said(elsewhere)}")
        return Verdict("warn", "; ".join(parts), _fixes(degraded + elsewhere))
    read = [c for c in health.cards if used is None or c.index in used]
    failed = [n for n in health.notes if n.startswith("nvidia-smi -q")]
    if not read and failed:
        return Verdict("warn", f"{cards}: hardware health not judged: {'; '.join(failed)}",
                       "run `nvidia-smi -q` on the host and see what it says")
    return Verdict("pass", _clean(health, used, cards, [f for f in mine if f.severity == "app"]))


def _clean(health: GpuHealth, used: Used, cards: str, app: list[Finding]) -> str:
    mine = [c for c in health.cards if used is None or c.index in used]
    read = []
    if mine:
        read.append("nvidia-smi -q: no uncorrectable ECC error, nothing pending" + _links(mine))
    if health.xid_source:
        read.append(f"kernel log ({health.xid_source}): "
                    + (f"only application-level Xids ({', '.join(f.where + ' ' + f.what for f in app)})" if app
                       else "no Xid since boot"))
    if health.pci_source and not health.missing:
        read.append(f"every NVIDIA card on the PCI bus is listed ({len(health.pci_gpus)})")
    notes = [n for n in health.notes if not n.startswith("nvidia-smi -q printed")]
    return f"{cards}: " + "; ".join(read + notes)


def _links(cards: list[CardHealth]) -> str:
    links = []
    for c in cards:
        if c.pcie_width_current and c.pcie_gen_current:
            idle = " (idle: the link slows down to save power)" if (
                c.idle and c.pcie_gen_max and c.pcie_gen_current < c.pcie_gen_max) else ""
            links.append(f"GPU {c.index}: PCIe gen {c.pcie_gen_current}/{c.pcie_gen_max or '?'} "
                         f"x{c.pcie_width_current}/{c.pcie_width_max or '?'}{idle}")
    return f" ({'; '.join(links)})" if links else ""


def status_findings(health: GpuHealth | None, used: Used) -> list[Finding]:
    """The fatal and degraded conditions of the cards a service uses, for ``invoke status``."""
    return [f for f in findings(health) if f.severity != "app" and f.used_by(used)]


def status_note(fs: list[Finding]) -> str:
    """``hardware: GPU 0 Xid 48 (DBE (Double Bit Error) ECC Error) FATAL; GPU 0 PCIe link x8 of x16`` (at most
    three named)."""
    if not fs:
        return ""
    named = [f"{f.short} {f.what}" + (" FATAL" if f.severity == "fatal" else "") for f in fs[:_SHOWN]]
    more = f"; and {len(fs) - _SHOWN} more" if len(fs) > _SHOWN else ""
    return "hardware: " + "; ".join(named) + more
