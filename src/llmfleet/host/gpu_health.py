"""GPU hardware health from the host: ``nvidia-smi -q``, the kernel log's NVRM Xid lines and the NVIDIA
devices on the PCI bus, read in the same round trip as the other facts (the probe's ``gpu_health``
group) and by ``invoke status``.

``HEALTH_READER`` is the shell both send ahead of their own script: two functions, one per source that
is not nvidia-smi. The parsers (``parse_smi_q``, ``parse_xid_section``, ``parse_pci_section``,
``health_from_sections``) are pure and tolerant: a value nvidia-smi prints as ``N/A``, a layout of an
older driver, a cut or hostile output becomes ``None`` or a note, never an exception. The model is
``llmfleet.knowledge.facts.GpuHealth``; what it means for a deploy is ``llmfleet.knowledge.gpu_health``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from llmfleet.knowledge.facts import CardHealth, GpuFact, GpuHealth, MissingCard, XidEvent

# The shell functions the probe (sections ``kernel_xid`` and ``pci_gpus``) and the status script run.
# POSIX sh, grep and awk (without awk: the last 200 lines as they are). Xid lines are folded per card
# and code on the host: a card that logs thousands of Xid 13s still sends one line per code.
HEALTH_READER = r"""# llmfleet GPU health reader: the kernel log's NVRM Xid lines since boot, and the NVIDIA display and 3D
# devices on the PCI bus (llmfleet.host.gpu_health parses both).
llmfleet_gpu_xids() {
    if dmesg >/dev/null 2>&1; then
        echo "source=dmesg"
        dmesg 2>/dev/null | llmfleet_xid_lines
    elif [ -n "$(journalctl -k -b -n 1 -q --no-pager 2>/dev/null)" ]; then
        echo "source=journalctl"
        journalctl -k -b -q --no-pager -o short-monotonic 2>/dev/null | llmfleet_xid_lines
    else
        echo "source=none"
        dmesg 2>&1 | head -n 1
    fi
    return 0
}
llmfleet_xid_lines() {
    if command -v awk >/dev/null 2>&1; then
        grep -e 'NVRM: Xid' -e 'fallen off the bus' | awk '
            { n++; k = "?"
              if (match($0, /Xid \((PCI:)?[0-9A-Fa-f:.]+\): *[0-9]+/)) k = substr($0, RSTART, RLENGTH)
              else if (match($0, /GPU (at )?(PCI:)?[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f.]+/)) k = substr($0, RSTART, RLENGTH)
              if (!(k in c)) { if (m >= 256) { skipped++; next }; o[++m] = k }
              c[k]++; l[k] = substr($0, 1, 400) }
            END { for (i = 1; i <= m; i++) printf "count=%d %s\n", c[o[i]], l[o[i]]
                  printf "lines=%d\n", n
                  if (skipped) printf "skipped=%d\n", skipped }'
    else
        grep -e 'NVRM: Xid' -e 'fallen off the bus' | tail -n 200
    fi
}
llmfleet_gpu_pci() {
    if command -v lspci >/dev/null 2>&1; then
        echo "source=lspci"
        lspci -D -n -d 10de: 2>&1 | head -n 256
    elif [ -d /sys/bus/pci/devices ]; then
        echo "source=sysfs"
        for d in /sys/bus/pci/devices/*; do
            [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
            c=$(cat "$d/class" 2>/dev/null)
            v=$(cat "$d/device" 2>/dev/null)
            r=$(cat "$d/revision" 2>/dev/null)
            c=${c#0x}
            echo "${d##*/} $(printf '%.4s' "$c"): 10de:${v#0x} (rev ${r#0x})"
        done | head -n 256
    else
        echo "source=none"
    fi
    return 0
}
"""

MAX_CARDS = 64
MAX_EVENTS = 256
MAX_LINE = 400
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_PCI_RE = re.compile(r"(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.([0-7]))?")
_LOST_RE = re.compile(r"Unable to determine the device handle for (?:GPU|gpu)\s*([0-9A-Fa-f:.]+):\s*(.{0,200})")
_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\):\s*(\d{1,4})")
_OFF_BUS_RE = re.compile(r"GPU (?:at )?(?:PCI:)?([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f.]+):? .*fallen off the bus")
_LSPCI_RE = re.compile(r"^([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s+([0-9A-Fa-f]{4}):\s+"
                       r"([0-9A-Fa-f]{4}:[0-9A-Fa-f]{4})(?:\s+\(rev ([0-9A-Fa-f]{2})\))?")
# Clocks event (R535 and newer) / throttle (older) reasons that are not a degradation.
_BENIGN_REASONS = {"idle", "applications clocks setting", "sync boost", "display clock setting",
                   "display clocks setting", "sw power cap"}


def pci_key(text: str, function: bool = False) -> str | None:
    """A PCI address as the kernel, lspci and nvidia-smi write it -> ``dddd:bb:dd`` (lowercase, the
    domain as four hex digits; ``.f`` added with ``function``); None when it is none."""
    m = _PCI_RE.search(text or "")
    if not m:
        return None
    dom, bus, dev, fn = m.groups()
    key = f"{int(dom or '0', 16):04x}:{bus.lower()}:{dev.lower()}"
    return f"{key}.{fn or '0'}" if function else key


def _shown(text: str, n: int = 160) -> str:
    one = "".join(ch if ch.isprintable() else "?" for ch in text.strip())
    return one if len(one) <= n else one[: n - 3] + "..."


# ------------------------------------------------------------------------------------------------
# nvidia-smi -q


def _q_blocks(text: str) -> list[tuple[str, list[str]]]:
    """``nvidia-smi -q`` text -> [(bus id, the block's lines)], one per ``GPU 00000000:3B:00.0`` header."""
    blocks: list[tuple[str, list[str]]] = []
    for raw in text.replace("\r", "").split("\n"):
        line = raw.expandtabs(4).rstrip()
        m = _GPU_HEADER.match(line)
        if m:
            if len(blocks) >= MAX_CARDS:
                break
            blocks.append((m.group(1), []))
        elif blocks:
            blocks[-1][1].append(line)
    return blocks


def _tree(lines: list[str]) -> dict[tuple[str, ...], str]:
    """A card's block -> {path of lowercase keys: value}; groups (a key without a value, or one
    followed by deeper lines) become path prefixes. Indentation is four spaces a level."""
    out: dict[tuple[str, ...], str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key)
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, sep, value = line.strip().partition(":")
        key = key.strip().lower()
        if not key:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = tuple(k for _, k in stack) + (key,)
        if sep:
            out.setdefault(path, value.strip())
        stack.append((indent, key))
    return out


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    m = re.fullmatch(r"\s*(\d{1,12})\s*(?:x|MiB|%|bank\(s\))?\s*", value)
    return int(m.group(1)) if m else None


def _yes(value: str | None) -> bool | None:
    v = (value or "").strip().lower()
    return True if v == "yes" else False if v == "no" else None


def _sum_uncorrectable(tree: dict[tuple[str, ...], str], scope: str) -> int | None:
    """Uncorrectable ECC errors under ``ECC Errors/<scope>``: the ``... Uncorrectable ...`` counters
    (R470 and newer: SRAM/DRAM, SRAM parity and SEC-DED), or ``Double Bit/Total`` (older drivers)."""
    base = ("ecc errors", scope)
    found: list[int] = []
    total_dbe = tree.get(base + ("double bit", "total"))
    if total_dbe is not None:
        n = _int(total_dbe)
        return n
    for path, value in tree.items():
        if path[:2] != base or len(path) < 3:
            continue
        if "uncorrectable" in path[2] or (len(path) == 4 and path[2] == "double bit"):
            n = _int(value)
            if n is not None:
                found.append(n)
    return sum(found) if found else None


def _reasons(tree: dict[tuple[str, ...], str]) -> tuple[bool | None, list[str], bool]:
    """(idle, active reasons other than the benign ones, any reason read) from the clocks event
    reasons (R535 on) or the clocks throttle reasons (older drivers)."""
    idle: bool | None = None
    active: list[str] = []
    seen = False
    for path, value in tree.items():
        if path[0] not in ("clocks event reasons", "clocks throttle reasons") or len(path) < 2:
            continue
        state = value.strip().lower()
        if state not in ("active", "not active"):
            continue
        seen = True
        reason = path[-1]
        if reason == "idle":
            idle = state == "active"
        elif state == "active" and reason not in _BENIGN_REASONS:
            active.append(" ".join(w.upper() if w in ("hw", "sw") else w.capitalize() for w in reason.split())[:64])
    return idle, active, seen


def parse_smi_q(text: str) -> list[CardHealth]:
    """``nvidia-smi -q`` (any driver from R418 on) -> one ``CardHealth`` per card, in its order."""
    cards: list[CardHealth] = []
    for bus, lines in _q_blocks(text):
        t = _tree(lines)
        card = CardHealth(bus_id=bus[:32])
        name = t.get(("product name",))
        card.name = _shown(name, 96) if name else None
        mode = t.get(("ecc mode", "current"))
        card.ecc_mode = mode if mode in ("Enabled", "Disabled") else None
        card.ecc_volatile_uncorrectable = _sum_uncorrectable(t, "volatile")
        card.ecc_aggregate_uncorrectable = _sum_uncorrectable(t, "aggregate")
        card.sram_threshold_exceeded = _yes(t.get(("ecc errors", "aggregate", "sram threshold exceeded")))
        card.repair_pending = [k.title() for k in ("channel repair pending", "tpc repair pending")
                               if _yes(t.get(("ecc errors", k)))]
        card.unrepairable_memory = _yes(t.get(("ecc errors", "unrepairable memory")))
        card.retired_pages_sbe = _int(t.get(("retired pages", "single bit ecc")))
        card.retired_pages_dbe = _int(t.get(("retired pages", "double bit ecc")))
        pend = [_yes(v) for p, v in t.items() if p[0] == "retired pages" and len(p) == 2 and p[1].startswith("pending")]
        card.retired_pages_pending = True if True in pend else False if False in pend else None
        card.remapped_rows_uncorrectable = _int(t.get(("remapped rows", "uncorrectable error")))
        card.remap_pending = _yes(t.get(("remapped rows", "pending")))
        card.remap_failure = _yes(t.get(("remapped rows", "remapping failure occurred")))
        action = t.get(("gpu recovery action",))
        card.recovery_action = _shown(action, 64) if action and action != "N/A" else None
        card.idle, card.throttle_active, _ = _reasons(t)
        link = ("pci", "gpu link info")
        card.pcie_gen_current = _int(t.get(link + ("pcie generation", "current")))
        card.pcie_gen_max = _int(t.get(link + ("pcie generation", "max")))
        card.pcie_gen_host_max = _int(t.get(link + ("pcie generation", "host max")))
        card.pcie_width_current = _int(t.get(link + ("link width", "current")))
        card.pcie_width_max = _int(t.get(link + ("link width", "max")))
        cards.append(card)
    return cards


def lost_cards(text: str) -> list[MissingCard]:
    """nvidia-smi's ``Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost ...``
    lines: cards it knows of but cannot reach."""
    out: list[MissingCard] = []
    for m in _LOST_RE.finditer(text or ""):
        key = pci_key(m.group(1), function=True)
        if key and all(c.pci != key for c in out) and len(out) < MAX_CARDS:
            out.append(MissingCard(pci=key, why="nvidia-smi: " + _shown(m.group(2), 120)))
    return out


# ------------------------------------------------------------------------------------------------
# Kernel log and PCI bus


def parse_xid_section(body: str) -> tuple[str | None, int, list[XidEvent], list[str]]:
    """The reader's ``llmfleet_gpu_xids`` output -> (source, Xid lines seen, events, notes)."""
    source: str | None = None
    seen = 0
    notes: list[str] = []
    events: dict[tuple[str, int], XidEvent] = {}
    off_bus: list[tuple[str, int, str]] = []
    first_other = ""
    lines = (body or "").splitlines()
    for line in lines[: MAX_EVENTS * 2 + 16]:
        if line.startswith("source="):
            source = line[7:].strip()
            continue
        if line.startswith("lines=") and line[6:].strip().isdigit():
            seen = int(line[6:].strip())
            continue
        if line.startswith("skipped=") and line[8:].strip().isdigit():
            notes.append(f"kernel log: {line[8:].strip()} more Xid kinds not kept")
            continue
        count = 1
        m = re.match(r"count=(\d{1,9}) (.*)$", line)
        if m:
            count, line = int(m.group(1)), m.group(2)
        x = _XID_RE.search(line)
        if x:
            key = pci_key(x.group(1))
            if key is None:
                continue
            code = int(x.group(2))
            ev = events.get((key, code))
            if ev is None:
                if len(events) >= MAX_EVENTS:
                    continue
                events[(key, code)] = XidEvent(code=code, pci=key, count=count, last=_shown(line, MAX_LINE))
            else:
                ev.count += count
                ev.last = _shown(line, MAX_LINE)
            continue
        o = _OFF_BUS_RE.search(line)
        if o and pci_key(o.group(1)):
            off_bus.append((str(pci_key(o.group(1))), count, _shown(line, MAX_LINE)))
        elif line.strip() and not first_other:
            first_other = line.strip()
    # "GPU 0000:3b:00.0: GPU has fallen off the bus." without its Xid 79 line (older drivers print only it)
    for key, count, line in off_bus:
        if (key, 79) not in events and len(events) < MAX_EVENTS:
            events[(key, 79)] = XidEvent(code=79, pci=key, count=count, last=line)
    if source not in ("dmesg", "journalctl"):
        why = f" ({_shown(first_other, 120)})" if first_other else ""
        notes.append(f"kernel log not readable by this user{why}: Xid events unknown")
        return None, 0, [], notes
    if not seen:
        seen = sum(e.count for e in events.values())
    return source, seen, list(events.values()), notes


def parse_pci_section(body: str) -> tuple[str | None, list[tuple[str, str, str, str | None]]]:
    """The reader's ``llmfleet_gpu_pci`` output -> (source, [(address, class, vendor:device, revision)])
    for NVIDIA display and 3D controllers (class 03xx; the cards' audio functions and bridges are not cards)."""
    source: str | None = None
    devices: list[tuple[str, str, str, str | None]] = []
    for line in (body or "").splitlines()[:300]:
        if line.startswith("source="):
            source = line[7:].strip()
            continue
        m = _LSPCI_RE.match(line.strip())
        if not m or not m.group(2).startswith("03") or not m.group(3).lower().startswith("10de:"):
            continue
        addr = pci_key(m.group(1), function=True)
        if addr and len(devices) < MAX_CARDS:
            devices.append((addr, m.group(2).lower(), m.group(3).lower(), (m.group(4) or "").lower() or None))
    return (source if source in ("lspci", "sysfs") else None), devices


def health_from_sections(
    q_text: str | None,
    xid_text: str | None,
    pci_text: str | None,
    gpus: Sequence[GpuFact] = (),
    *,
    q_failed: str = "",
    lost_from: Iterable[str] = (),
) -> GpuHealth:
    """The three readings (None: not read) -> ``GpuHealth``. ``gpus``: the cards nvidia-smi's query
    listed (their index and bus id); empty: the -q order gives the index. ``q_failed``: why nvidia-smi -q
    failed or was cut (what it printed is still read: a lost card fails it while the others print).
    ``lost_from``: other nvidia-smi output that may name a card it cannot reach."""
    h = GpuHealth()
    if q_text is not None:
        h.cards = parse_smi_q(q_text)
        if q_failed:
            h.notes.append(f"nvidia-smi -q: {q_failed}")
        elif not h.cards:
            first = next((ln.strip() for ln in q_text.splitlines() if ln.strip()), "(no output)")
            h.notes.append(f"nvidia-smi -q printed no card: {_shown(first)}")
    by_bus = {pci_key(g.pci_bus_id or "", function=True): g.index for g in gpus if g.pci_bus_id}
    for i, card in enumerate(h.cards):
        key = pci_key(card.bus_id, function=True)
        if key in by_bus:
            card.index = by_bus[key]
        elif not gpus:
            card.index = i
    lost: list[MissingCard] = []
    for text in [q_text or "", *lost_from]:
        for c in lost_cards(text):
            if all(x.pci != c.pci for x in lost):
                lost.append(c)
    if xid_text is not None:
        h.xid_source, h.xid_lines, h.xids, notes = parse_xid_section(xid_text)  # type: ignore[assignment]
        h.notes += notes
    listed = {pci_key(c.bus_id, function=True) for c in h.cards} | {k for k in by_bus if k}
    index_of = {pci_key(c.bus_id): c.index for c in h.cards} | {
        pci_key(g.pci_bus_id or ""): g.index for g in gpus if g.pci_bus_id}
    for ev in h.xids:
        ev.gpu_index = index_of.get(ev.pci)
    if pci_text is not None:
        source, devices = parse_pci_section(pci_text)
        h.pci_source = source  # type: ignore[assignment]
        if source is None:
            h.notes.append("PCI bus not read (no lspci, no /sys/bus/pci): a card missing from nvidia-smi is not seen")
        h.pci_gpus = [d[0] for d in devices]
        ordered = sorted(h.pci_gpus)
        for addr, _cls, dev, rev in devices:
            if addr in listed:
                continue
            if not listed:
                continue  # nvidia-smi lists no card at all: the gpu check says why; nothing to compare
            why = "on the PCI bus, not listed by nvidia-smi"
            if rev == "ff":
                why += "; its PCI config space reads 0xff (the card does not answer)"
            known = next((c for c in lost if c.pci == addr), None)
            if known is not None:
                why = f"{known.why}; {why}"
            h.missing.append(MissingCard(pci=addr, device=dev, expected_index=ordered.index(addr), why=why))
    for c in lost:
        if all(m.pci != c.pci for m in h.missing):
            if h.pci_gpus and c.pci in h.pci_gpus:
                c.expected_index = sorted(h.pci_gpus).index(c.pci)
            h.missing.append(c)
    return h
