"""GPU hardware health: the nvidia-smi -q, kernel log and PCI parsers (recorded H200 and transcribed V100
output, and variants derived from them), the rules that judge them (preflight's gpu-health check and
the status note), and the probe script run with the lab's simulators as stand-in tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from llmfleet.fleet import status as status_mod
from llmfleet.host.facts import default_gpu_lookup, parse_probe_document
from llmfleet.host.gpu_health import (
    health_from_sections,
    lost_cards,
    parse_pci_section,
    parse_smi_q,
    parse_xid_section,
    pci_key,
)
from llmfleet.host.probe import probe_sh
from llmfleet.inventory.services import host_settings
from llmfleet.knowledge import gpu_health as rules
from llmfleet.knowledge.facts import CardHealth, GpuFact, GpuHealth, MissingCard, XidEvent
from llmfleet.lab import nvidia_smi_sim as sim
from llmfleet.lab.cards import gpu_sim_config

DATA = Path(__file__).parent / "data" / "nvidia-smi"
H200_Q = (DATA / "h200-580" / "q.txt").read_text()  # recorded on a real H200, driver 580
V100_Q = (DATA / "v100-418" / "q.txt").read_text()  # transcribed: a V100-SXM2-32GB on driver 418


def one_card(text: str) -> CardHealth:
    (card,) = parse_smi_q(text)
    return card


def swap(text: str, old: str, new: str, count: int = 1) -> str:
    assert old in text, old
    return text.replace(old, new, count)


def line(key: str, value: str, indent: int) -> str:
    """A line of the recorded H200 layout (colon at column 55)."""
    return f"{' ' * indent}{key}".ljust(55) + f": {value}"


# ------------------------------------------------------------------------------------------------
# nvidia-smi -q


def test_recorded_h200_reads_a_healthy_card():
    c = one_card(H200_Q)
    assert (c.bus_id, c.name, c.ecc_mode) == ("00000000:00:06.0", "NVIDIA H200", "Enabled")
    assert (c.ecc_volatile_uncorrectable, c.ecc_aggregate_uncorrectable, c.sram_threshold_exceeded) == (0, 0, False)
    assert (c.remap_pending, c.remap_failure, c.remapped_rows_uncorrectable) == (False, False, 0)
    assert c.retired_pages_pending is None and c.retired_pages_sbe is None  # N/A on Hopper
    assert (c.repair_pending, c.unrepairable_memory, c.recovery_action) == ([], False, "None")
    assert (c.idle, c.throttle_active) == (True, [])
    assert (c.pcie_gen_current, c.pcie_gen_max, c.pcie_gen_host_max) == (5, 5, None)
    assert (c.pcie_width_current, c.pcie_width_max) == (16, 16)


def test_text_parser_reads_what_the_recorded_xml_says():
    # the same card, the same moment: nvidia-smi -q -x; the text parser must agree with its values
    gpu = ET.parse(DATA / "h200-580" / "q.xml").getroot().find("gpu")
    assert gpu is not None
    c = one_card(H200_Q)

    def x(path: str) -> str:
        node = gpu.find(path)
        assert node is not None and node.text is not None, path
        return node.text

    link = "pci/pci_gpu_link_info"
    assert c.pcie_gen_max == int(x(f"{link}/pcie_gen/max_link_gen"))
    assert c.pcie_gen_current == int(x(f"{link}/pcie_gen/current_link_gen"))
    assert f"{c.pcie_width_max}x" == x(f"{link}/link_widths/max_link_width")
    assert f"{c.pcie_width_current}x" == x(f"{link}/link_widths/current_link_width")
    assert c.remap_pending is (x("remapped_rows/remapped_row_pending") == "Yes")
    assert c.ecc_volatile_uncorrectable == sum(int(x(f"ecc_errors/volatile/{k}")) for k in (
        "sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable"))
    assert c.idle is (x("clocks_event_reasons/clocks_event_reason_gpu_idle") == "Active")
    assert c.recovery_action == x("gpu_recovery_action")


def test_transcribed_r418_v100_layout():
    # R418: "Clocks Throttle Reasons", "Ecc Mode", ECC counters per location under Single/Double Bit,
    # "Retired Pages / Pending", no Remapped Rows; this board's PCIe link runs x2 of x16
    c = one_card(V100_Q)
    assert (c.name, c.ecc_mode, c.bus_id) == ("Tesla V100-SXM2-32GB", "Enabled", "00000004:04:00.0")
    assert (c.ecc_volatile_uncorrectable, c.ecc_aggregate_uncorrectable) == (0, 0)
    assert (c.retired_pages_sbe, c.retired_pages_dbe, c.retired_pages_pending) == (0, 0, False)
    assert (c.remap_pending, c.remap_failure) == (None, None)
    assert (c.idle, c.throttle_active) == (True, [])
    assert (c.pcie_gen_current, c.pcie_gen_max, c.pcie_width_current, c.pcie_width_max) == (3, 3, 2, 16)


ECC_VOLATILE = line("DRAM Uncorrectable", "0", 12)
# Derived from the recorded H200 text: one field changed each (the layout stays the recorded one).
H200_VARIANTS = [
    ("dram-uncorrectable-volatile", [(ECC_VOLATILE, line("DRAM Uncorrectable", "3", 12))],
     {"ecc_volatile_uncorrectable": 3, "ecc_aggregate_uncorrectable": 0}),
    ("sram-parity-and-secded-add-up", [(line("SRAM Uncorrectable Parity", "0", 12),
                                        line("SRAM Uncorrectable Parity", "1", 12)),
                                       (line("SRAM Uncorrectable SEC-DED", "0", 12),
                                        line("SRAM Uncorrectable SEC-DED", "2", 12))],
     {"ecc_volatile_uncorrectable": 3}),
    ("aggregate-only", [(line("DRAM Uncorrectable", "0", 12) + "\n" + line("SRAM Threshold Exceeded", "No", 12),
                         line("DRAM Uncorrectable", "4", 12) + "\n" + line("SRAM Threshold Exceeded", "Yes", 12))],
     {"ecc_volatile_uncorrectable": 0, "ecc_aggregate_uncorrectable": 4, "sram_threshold_exceeded": True}),
    ("r510-sram-layout", [(line("SRAM Uncorrectable Parity", "0", 12) + "\n"
                           + line("SRAM Uncorrectable SEC-DED", "0", 12), line("SRAM Uncorrectable", "1", 12))],
     {"ecc_volatile_uncorrectable": 1}),
    ("remap-pending", [(line("Pending", "No", 8) + "\n" + line("Remapping Failure Occurred", "No", 8),
                        line("Pending", "Yes", 8) + "\n" + line("Remapping Failure Occurred", "No", 8)),
                       (line("Uncorrectable Error", "0", 8), line("Uncorrectable Error", "1", 8))],
     {"remap_pending": True, "remap_failure": False, "remapped_rows_uncorrectable": 1}),
    ("remap-failure", [(line("Remapping Failure Occurred", "No", 8), line("Remapping Failure Occurred", "Yes", 8))],
     {"remap_failure": True, "remap_pending": False}),
    ("pending-page-blacklist", [(line("Pending Page Blacklist", "N/A", 8), line("Pending Page Blacklist", "Yes", 8))],
     {"retired_pages_pending": True}),
    ("repairs-pending", [(line("Channel Repair Pending", "No", 8), line("Channel Repair Pending", "Yes", 8)),
                         (line("Unrepairable Memory", "No", 8), line("Unrepairable Memory", "Yes", 8))],
     {"repair_pending": ["Channel Repair Pending"], "unrepairable_memory": True}),
    ("recovery-action", [(line("GPU Recovery Action", "None", 4), line("GPU Recovery Action", "Reset", 4))],
     {"recovery_action": "Reset"}),
    ("link-x8", [(line("Current", "16x", 16), line("Current", "8x", 16))], {"pcie_width_current": 8}),
    ("older-throttle-name-and-thermal", [("    Clocks Event Reasons\n", "    Clocks Throttle Reasons\n"),
                                         (line("Idle", "Active", 8), line("Idle", "Not Active", 8)),
                                         (line("HW Thermal Slowdown", "Not Active", 12),
                                          line("HW Thermal Slowdown", "Active", 12)),
                                         (line("SW Power Cap", "Not Active", 8), line("SW Power Cap", "Active", 8))],
     {"idle": False, "throttle_active": ["HW Thermal Slowdown"]}),  # a power cap under load is normal
    ("ecc-n/a", [(ECC_VOLATILE, line("DRAM Uncorrectable", "N/A", 12)),
                 (line("SRAM Uncorrectable Parity", "0", 12), line("SRAM Uncorrectable Parity", "N/A", 12)),
                 (line("SRAM Uncorrectable SEC-DED", "0", 12), line("SRAM Uncorrectable SEC-DED", "N/A", 12)),
                 (line("Current", "Enabled", 8), line("Current", "N/A", 8))],
     {"ecc_volatile_uncorrectable": None, "ecc_mode": None}),
    ("windows-line-ends", [("\n", "\r\n", -1)], {"ecc_volatile_uncorrectable": 0, "pcie_width_max": 16}),
]


@pytest.mark.parametrize("edits,expected", [v[1:] for v in H200_VARIANTS], ids=[v[0] for v in H200_VARIANTS])
def test_derived_h200_variants(edits, expected):
    text = H200_Q
    for edit in edits:
        text = swap(text, *edit)
    c = one_card(text)
    assert {k: getattr(c, k) for k in expected} == expected


def test_remapped_rows_na_on_cards_without_remapping():
    # as cards before Ampere print it (public R535 output): the group is one line, "N/A"
    head, _, rest = H200_Q.partition("    Remapped Rows\n")
    text = head + line("Remapped Rows", "N/A", 4) + "\n    Temperature\n" + rest.partition("    Temperature\n")[2]
    c = one_card(text)
    assert (c.remap_pending, c.remap_failure) == (None, None)


def test_r418_sbe_dbe_layout_counts_the_double_bit_total():
    text = V100_Q.replace("Double Bit            \n                Device Memory       : 0",
                          "Double Bit            \n                Device Memory       : 2", 1)
    text = text.replace("                CBU                 : 0\n                Total               : 0",
                        "                CBU                 : 0\n                Total               : 2", 1)
    c = one_card(text)
    assert (c.ecc_volatile_uncorrectable, c.ecc_aggregate_uncorrectable) == (2, 0)


@pytest.mark.parametrize("text", [
    "", "garbage\x00\x1b[31m", "GPU 00000000:00:06.0\n    PCI\n        GPU Link Info : : :\n",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    "GPU 00000000:00:06.0\n" + "    Remapped Rows : Yes : No\n" * 5,
])
def test_odd_output_never_raises(text):
    cards = parse_smi_q(text)
    assert all(isinstance(c, CardHealth) for c in cards)


def test_many_cards_are_bounded():
    text = "".join(f"GPU 00000000:{i % 256:02X}:00.0\n    Product Name : X\n" for i in range(100))
    assert len(parse_smi_q(text)) == 64


@pytest.mark.parametrize("text,pci,why", [
    # public reports (JosephKJ/OWOD#81, pdbear/syno_nvidia_gpu_driver#22): the message nvidia-smi prints
    ("Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover "
     "this GPU", "0000:02:00.0", "GPU is lost"),
    ("Unable to determine the device handle for GPU0000:07:00.0: Unknown Error", "0000:07:00.0", "Unknown Error"),
])
def test_lost_card_lines(text, pci, why):
    (c,) = lost_cards(text)
    assert c.pci == pci and why in c.why


@pytest.mark.parametrize("text,key", [("00000000:3B:00.0", "0000:3b:00"), ("PCI:0000:3b:00", "0000:3b:00"),
                                      ("0004:04:00.1", "0004:04:00"), ("3b:00.0", "0000:3b:00"), ("none", None)])
def test_pci_key(text, key):
    assert pci_key(text) == key


# ------------------------------------------------------------------------------------------------
# Kernel log and PCI bus


XID_CASES = [
    ("awk-folded", "source=dmesg\ncount=2 [ 12.5] NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, "
                   "An uncorrectable double bit error\nlines=2", "dmesg", [("0000:3b:00", 48, 2)]),
    ("raw-lines-without-awk",
     "source=journalctl\n[ 1.0] h kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception\n"
     "[ 2.0] h kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception", "journalctl",
     [("0000:3b:00", 13, 2)]),
    # transcribed from public logs: the older form without "PCI:" (pastebin gn6mYmM4) and the fallen-off
    # line some drivers print without an Xid line (pastebin xJaypMZt)
    ("old-form", "source=dmesg\n[ 4909.922970] NVRM: Xid (0000:01:00): 13, 0005 00000000 0000502d 00000104",
     "dmesg", [("0000:01:00", 13, 1)]),
    ("fallen-off-without-xid", "source=dmesg\n[  269.516977] NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
     "dmesg", [("0000:01:00", 79, 1)]),
    ("xid79-and-its-fallen-off-line-are-one-event",
     "source=dmesg\ncount=1 [ 9.1] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
     "count=1 [ 9.1] NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.\nlines=2", "dmesg", [("0000:2b:00", 79, 1)]),
    ("clean", "source=dmesg\nlines=0", "dmesg", []),
]


@pytest.mark.parametrize("body,source,events", [c[1:] for c in XID_CASES], ids=[c[0] for c in XID_CASES])
def test_xid_section(body, source, events):
    got_source, _lines, got, notes = parse_xid_section(body)
    assert got_source == source and not notes
    assert [(e.pci, e.code, e.count) for e in got] == events


def test_unreadable_kernel_log_is_a_note():
    src, lines, events, notes = parse_xid_section("source=none\ndmesg: read kernel buffer failed: Operation not permitted")
    assert (src, lines, events) == (None, 0, [])
    assert notes == ["kernel log not readable by this user (dmesg: read kernel buffer failed: Operation not "
                     "permitted): Xid events unknown"]


def test_pci_section_keeps_display_controllers_only():
    body = ("source=lspci\n0000:3b:00.0 0302: 10de:2335 (rev a1)\n0000:3b:00.1 0403: 10de:22e8 (rev a1)\n"
            "0000:5e:00.0 0300: 10de:2684 (rev ff)\n0000:60:00.0 0680: 10de:22a3 (rev a1)\n"
            "0000:61:00.0 0302: 8086:0001 (rev 01)\nnot a line")
    assert parse_pci_section(body) == ("lspci", [("0000:3b:00.0", "0302", "10de:2335", "a1"),
                                                 ("0000:5e:00.0", "0300", "10de:2684", "ff")])
    assert parse_pci_section("source=none") == (None, [])


def _gpus(*buses: str) -> list[GpuFact]:
    return [GpuFact(index=i, name="NVIDIA A10", pci_bus_id=b) for i, b in enumerate(buses)]


def test_a_card_on_the_bus_that_nvidia_smi_lacks_is_missing_with_its_bus_order():
    pci = "source=lspci\n0000:18:00.0 0302: 10de:2236 (rev a1)\n0000:3b:00.0 0302: 10de:2236 (rev ff)\n"
    xid = "source=dmesg\ncount=1 [ 5.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\nlines=1"
    h = health_from_sections(None, xid, pci, _gpus("00000000:18:00.0"))
    (m,) = h.missing
    assert (m.pci, m.expected_index, m.device) == ("0000:3b:00.0", 1, "10de:2236")
    assert "not listed by nvidia-smi" in m.why and "reads 0xff" in m.why
    (ev,) = h.xids
    assert (ev.code, ev.gpu_index) == (79, None)
    # nvidia-smi listing no card at all is the gpu check's to explain: nothing is "missing" then
    assert health_from_sections(None, None, pci, []).missing == []


def test_cards_are_indexed_by_bus_id_from_the_query():
    q = H200_Q.replace("GPU 00000000:00:06.0", "GPU 00000000:3B:00.0")
    h = health_from_sections(q, None, None, _gpus("00000000:18:00.0", "00000000:3B:00.0"))
    assert [c.index for c in h.cards] == [1]
    assert health_from_sections(q, None, None, []).cards[0].index == 0  # status: -q order


def test_pci_bus_not_readable_is_a_note():
    h = health_from_sections(H200_Q, None, "source=none\n", _gpus("00000000:00:06.0"))
    assert h.pci_source is None and any("PCI bus not read" in n for n in h.notes)


# ------------------------------------------------------------------------------------------------
# The rules (preflight's gpu-health, status)


def healthy(index: int = 0, **kw) -> CardHealth:
    base = dict(bus_id=f"00000000:{0x18 + index:02X}:00.0", index=index, ecc_mode="Enabled",
                ecc_volatile_uncorrectable=0, ecc_aggregate_uncorrectable=0, remap_pending=False,
                remap_failure=False, idle=True, pcie_gen_current=4, pcie_gen_max=4, pcie_width_current=16,
                pcie_width_max=16)
    return CardHealth(**{**base, **kw})


def host(*cards: CardHealth, xids: tuple[XidEvent, ...] = (), missing: tuple[MissingCard, ...] = ()) -> GpuHealth:
    return GpuHealth(cards=list(cards) or [healthy(0), healthy(1)], xids=list(xids), xid_source="dmesg",
                     pci_source="lspci", missing=list(missing))


def xid(code: int, gpu: int = 0, count: int = 1) -> XidEvent:
    return XidEvent(code=code, pci=f"0000:{0x18 + gpu:02x}:00", count=count, gpu_index=gpu,
                    last=f"[ 5.0] NVRM: Xid (PCI:0000:{0x18 + gpu:02x}:00): {code}, ...")


RULES = [
    # (name, health, the service's gpus (None: all), verdict, words in the message, words in the fix)
    ("clean", host(), [0], "pass", ["no Xid since boot", "PCIe gen 4/4 x16/16"], []),
    ("xid-79", host(xids=(xid(79),)), [0], "fail", ["GPU 0", "Xid 79 (GPU has fallen off the bus)"],
     ["reboot", "RMA", "https://docs.nvidia.com/deploy/xid-errors/"]),
    ("xid-48", host(xids=(xid(48, count=3),)), [0], "fail", ["Xid 48 (DBE (Double Bit Error) ECC Error) x3",
                                                             "3 lines since boot"], ["nvidia-smi -r -i N"]),
    ("xid-64", host(xids=(xid(64),)), [0], "fail", ["Xid 64", "recording failure"], ["RMA"]),
    ("xid-95", host(xids=(xid(95),)), [0], "fail", ["Uncontained ECC error"], ["reset"]),
    ("xid-119", host(xids=(xid(119),)), [0], "fail", ["GSP RPC Timeout"], ["reset"]),
    ("xid-63", host(xids=(xid(63),)), [0], "warn", ["Xid 63", "row remapping"], ["reset the card"]),
    ("xid-94", host(xids=(xid(94),)), [0], "warn", ["Contained ECC error"], ["restart the engine"]),
    ("xid-13-is-told-only", host(xids=(xid(13, count=5),)), [0], "pass",
     ["only application-level Xids", "Xid 13 (Graphics Engine Exception) x5"], []),
    ("unknown-xid", host(xids=(xid(999),)), [0], "warn", ["Xid 999 (not in llmfleet's Xid catalog)"],
     ["analyzing-xid-catalog.html"]),
    ("ecc-volatile", host(healthy(0, ecc_volatile_uncorrectable=2, ecc_aggregate_uncorrectable=2)), [0], "fail",
     ["2 uncorrectable ECC errors since the last reset"], ["nvidia-smi -r -i 0"]),
    ("ecc-aggregate-history", host(healthy(0, ecc_aggregate_uncorrectable=3)), [0], "warn",
     ["3 uncorrectable ECC errors over the card's life"], ["RMA it if the count grows"]),
    ("remap-pending", host(healthy(0, remap_pending=True)), [0], "fail", ["a row remap waits for a reset"],
     ["reset"]),
    ("remap-failure", host(healthy(0, remap_failure=True)), [0], "fail", ["a row remap failed"], ["RMA"]),
    ("retired-page-pending", host(healthy(0, retired_pages_pending=True)), [0], "fail",
     ["a retired memory page waits for a reset"], ["reset"]),
    ("recovery-action", host(healthy(0, recovery_action="Reset")), [0], "fail",
     ["the driver asks for recovery: Reset"], ["reset"]),
    ("unrepairable", host(healthy(0, unrepairable_memory=True)), [0], "fail", ["unrepairable memory"], ["RMA"]),
    ("pcie-width", host(healthy(0, pcie_width_current=8)), [0], "warn", ["PCIe link x8 of x16"], ["reseat"]),
    ("pcie-gen-low-while-idle-is-fine", host(healthy(0, pcie_gen_current=1)), [0], "pass",
     ["gen 1/4", "idle: the link slows down to save power"], []),
    ("pcie-gen-low-while-busy", host(healthy(0, pcie_gen_current=1, idle=False)), [0], "warn",
     ["PCIe gen 1 of 4 while busy"], ["BIOS"]),
    ("thermal-slowdown", host(healthy(0, throttle_active=["HW Thermal Slowdown"])), [0], "warn",
     ["clocks held down (HW Thermal Slowdown)"], ["cooling"]),
    ("power-cap-is-normal", host(healthy(0, throttle_active=["SW Power Cap"])), [0], "pass", [], []),
    ("fatal-on-a-card-the-service-does-not-use", host(healthy(0), healthy(1, remap_pending=True)), [0], "warn",
     ["not used by chat, but on this host: GPU 1: a row remap waits"], []),
    ("degraded-on-another-card-is-not-said", host(healthy(0), healthy(1, pcie_width_current=4)), [0], "pass", [], []),
    ("all-cards", host(healthy(0), healthy(1, remap_pending=True)), None, "fail", ["GPU 1"], []),
    ("missing-card-in-the-services-slot", host(healthy(0), missing=(MissingCard(
        pci="0000:3b:00.0", expected_index=1, why="on the PCI bus, not listed by nvidia-smi"),)), [1], "fail",
     ["card 0000:3b:00.0 (GPU 1 by bus order): missing from nvidia-smi"], ["reboot", "reseat"]),
    ("missing-card-elsewhere", host(healthy(0), missing=(MissingCard(pci="0000:3b:00.0", expected_index=1),)),
     [0], "warn", ["not used by chat", "missing from nvidia-smi"], []),
]


@pytest.mark.parametrize("health,used,verdict,said,fix", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_rules(health, used, verdict, said, fix):
    v = rules.judge(health, used, "chat")
    assert v is not None and v.status == verdict, v
    for words in said:
        assert words in v.message, v.message
    for words in fix:
        assert words in v.fix, v.fix


def test_no_health_read_means_no_check():
    assert rules.judge(None, [0], "chat") is None


def test_a_failed_nvidia_smi_q_is_a_warning_not_a_pass():
    h = health_from_sections("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                             "source=dmesg\nlines=0", None, q_failed="driver not loaded (nvidia-smi exit 9)")
    v = rules.judge(h, [0], "chat")
    assert v is not None and v.status == "warn"
    assert v.message == "GPU 0: hardware health not judged: nvidia-smi -q: driver not loaded (nvidia-smi exit 9)"


def test_status_note_names_the_services_cards_only():
    h = host(healthy(0, pcie_width_current=8), healthy(1, remap_pending=True), xids=(xid(79, gpu=1),))
    assert rules.status_note(rules.status_findings(h, [0])) == "hardware: GPU 0 PCIe link x8 of x16"
    note = rules.status_note(rules.status_findings(h, [1]))
    assert note == ("hardware: GPU 1 a row remap waits for a reset FATAL; "
                    "GPU 1 Xid 79 (GPU has fallen off the bus) FATAL")
    assert rules.status_findings(host(xids=(xid(13),)), None) == []  # application-level: not a condition


REQUIRED_XIDS = (79, 48, 63, 64, 92, 94, 95, 13, 31, 43, 45, 61, 62, 74, 119, 120)


def test_xid_catalog_entries():
    cat = rules.xid_catalog()
    assert set(REQUIRED_XIDS) <= set(cat)
    for code, e in cat.items():
        assert e.name and e.meaning and e.action, code
        assert e.severity in ("fatal", "degraded", "app") and e.confidence in ("H", "M", "U"), code
        assert e.sources and all(s.startswith("https://docs.nvidia.com/deploy/") for s in e.sources), code
    assert [c for c in REQUIRED_XIDS if cat[c].severity == "fatal"] == [79, 48, 64, 95, 61, 62, 74, 119, 120]
    assert {cat[c].severity for c in (13, 31, 43, 45)} == {"app"}
    assert {cat[c].severity for c in (63, 92, 94)} == {"degraded"}


# ------------------------------------------------------------------------------------------------
# Preflight and status, end to end on parsed facts


def test_preflight_check_sits_after_the_gpu_check_and_fails_the_report():
    from llmfleet.inventory.services import Service
    from llmfleet.knowledge.facts import Facts
    from llmfleet.knowledge.preflight import run_checks

    facts = Facts(host="h1", gpus=[GpuFact(index=0, name="NVIDIA A10", compute_capability="8.6")],
                  gpu_health=host(healthy(0, remap_pending=True)))
    svc = Service(name="chat", engine="llamacpp", model="m", model_path="/m.gguf", image="llamacpp:b1", gpus=[0])
    ids = [c.id for c in run_checks("h1", svc, facts, None)]
    assert ids[ids.index("gpu") + 1] == "gpu-health"
    check = next(c for c in run_checks("h1", svc, facts, None) if c.id == "gpu-health")
    assert check.status == "fail" and "row remap waits for a reset" in check.message


def test_status_reads_the_health_block_and_notes_each_row():
    q = swap(H200_Q, line("Pending", "No", 8) + "\n" + line("Remapping Failure Occurred", "No", 8),
             line("Pending", "Yes", 8) + "\n" + line("Remapping Failure Occurred", "No", 8))
    out = "\n".join(["@@end", "@@gpu-health-q", q,
        "@@gpu-health-xid", "source=dmesg", "lines=0", "@@gpu-health-pci", "source=lspci",
        "0000:00:06.0 0302: 10de:2335 (rev a1)", "@@gpu-health-end", "@@gpu", "NVIDIA H200"])
    h = status_mod.parse_gpu_health(out)
    assert h is not None and h.cards[0].remap_pending is True and h.cards[0].index == 0
    assert status_mod.parse_card_names(out) == ["NVIDIA H200"]
    settings = host_settings("h1", {"llmfleet_services": [
        {"name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf", "image": "llamacpp:b1",
         "gpus": [0]},
        {"name": "other", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf", "image": "llamacpp:b1",
         "gpus": [1], "port": 8001}]})
    st = status_mod.HostStatus(host="h1", reachable=True, gpus=["NVIDIA H200"], gpu_health=h)
    rows = {r.service: r for r in status_mod.host_rows(st, settings)}
    assert rows["chat"].note == "hardware: GPU 0 a row remap waits for a reset FATAL"
    assert rows["chat"].to_dict()["hardware"][0]["severity"] == "fatal"
    assert rows["other"].note == "" and rows["other"].hardware is None
    assert status_mod.parse_gpu_health("@@end\n@@gpu\nNVIDIA H200") is None


# ------------------------------------------------------------------------------------------------
# The probe script and the status script, with the lab's simulators standing in for the tools


@pytest.fixture
def sim_host(tmp_path):
    """A PATH whose nvidia-smi, dmesg and lspci are the lab's simulators (two P40s, driver 535), reading
    their config and faults from a folder of this test."""
    b = tmp_path / "bin"
    b.mkdir()
    src = Path(sim.__file__).read_text()
    body = src.split("\n", 1)[1]
    for name in ("nvidia-smi", "dmesg", "lspci"):
        p = b / name
        p.write_text(f"#!{sys.executable}\n{body}")
        p.chmod(0o755)
    d = tmp_path / "sim"
    d.mkdir()
    (d / "gpus.json").write_text(json.dumps(gpu_sim_config("h1", "Tesla P40", "535.183.01", 2)))
    env = {"PATH": f"{b}:/usr/bin:/bin", "HOME": str(tmp_path), "LLMFLEET_SIM_DIR": str(d)}
    return env, d


def _probe(env: dict, tmp_path: Path):
    res = subprocess.run(["sh", "-s", "--", "MK", str(tmp_path / "root")], input=probe_sh(), capture_output=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    return parse_probe_document(res.stdout.decode(), "MK", "h1", gpu_lookup=default_gpu_lookup)


def test_probe_reads_health_in_its_round_trip(sim_host, tmp_path):
    env, d = sim_host
    f = _probe(env, tmp_path)
    h = f.gpu_health
    assert h is not None and [c.index for c in h.cards] == [0, 1]
    assert (h.xid_source, h.xids, h.pci_source, h.missing) == ("dmesg", [], "lspci", [])
    assert {"nvidia_q", "kernel_xid", "pci_gpus"} <= set(f.probe_seconds)
    assert rules.judge(h, [0], "chat").status == "pass"  # type: ignore[union-attr]
    # GPU 1 falls off the bus: its Xid 79 in the kernel log, gone from nvidia-smi, still on the PCI bus
    (d / "faults.json").write_text(json.dumps({"1": {"xid": [79], "missing": True}, "0": {"pcie_width": 8}}))
    f = _probe(env, tmp_path)
    h = f.gpu_health
    assert [g.index for g in f.gpus] == [0] and h is not None
    assert [(m.pci, m.expected_index) for m in h.missing] == [("0000:3b:00.0", 1)]
    assert [(e.code, e.pci, e.gpu_index) for e in h.xids] == [(79, "0000:3b:00", None)]
    assert rules.judge(h, [1], "chat").status == "fail"  # type: ignore[union-attr]
    v = rules.judge(h, [0], "chat")
    assert v is not None and v.status == "warn" and "PCIe link x8 of x16" in v.message


def test_status_script_reads_the_same_health(sim_host, tmp_path):
    env, d = sim_host
    (d / "faults.json").write_text(json.dumps({"0": {"xid": [48], "ecc_volatile_uncorrectable": 1}}))
    script = status_mod.status_script(str(tmp_path / "root"))
    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    h = status_mod.parse_gpu_health(res.stdout)
    assert h is not None and [c.ecc_volatile_uncorrectable for c in h.cards] == [1, 0]
    assert [f.what for f in rules.status_findings(h, [0])] == [
        "1 uncorrectable ECC error since the last reset", "Xid 48 (DBE (Double Bit Error) ECC Error)"]
    assert status_mod.parse_card_names(res.stdout) == ["Tesla P40", "Tesla P40"]


def test_kernel_log_fallback_to_the_journal(tmp_path):
    # dmesg refused (dmesg_restrict), journalctl readable: the journal's kernel log of this boot
    b = tmp_path / "bin"
    b.mkdir()
    (b / "dmesg").write_text("#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\nexit 1\n")
    (b / "journalctl").write_text("#!/bin/sh\necho '[  7.1] h kernel: NVRM: Xid (PCI:0000:18:00): 63, Row Remapper: "
                                  "New row marked for remapping, reset gpu to activate.'\n")
    for p in b.iterdir():
        p.chmod(0o755)
    from llmfleet.host.gpu_health import HEALTH_READER

    res = subprocess.run(["sh", "-c", HEALTH_READER + "\nllmfleet_gpu_xids"], capture_output=True, text=True,
                         env={"PATH": f"{b}:/usr/bin:/bin"}, timeout=30)
    src, _n, events, _notes = parse_xid_section(res.stdout)
    assert src == "journalctl" and [(e.code, e.pci) for e in events] == [(63, "0000:18:00")]
    (b / "journalctl").write_text("#!/bin/sh\nexit 0\n")
    res = subprocess.run(["sh", "-c", HEALTH_READER + "\nllmfleet_gpu_xids"], capture_output=True, text=True,
                         env={"PATH": f"{b}:/usr/bin:/bin"}, timeout=30)
    assert parse_xid_section(res.stdout)[0] is None
    assert "Operation not permitted" in res.stdout


def test_xid_lines_are_folded_per_card_and_code_on_the_host(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    lines = "".join(f"[ {i}.0] NVRM: Xid (PCI:0000:18:00): 13, pid={i}, Graphics Exception\\n" for i in range(5000))
    (b / "dmesg").write_text(f"#!/bin/sh\nprintf '{lines}'\nprintf '[ 9.9] NVRM: Xid (PCI:0000:3b:00): 79, GPU has "
                             "fallen off the bus.\\n'\n")
    (b / "dmesg").chmod(0o755)
    from llmfleet.host.gpu_health import HEALTH_READER

    res = subprocess.run(["sh", "-c", HEALTH_READER + "\nllmfleet_gpu_xids"], capture_output=True, text=True,
                         env={"PATH": f"{b}:/usr/bin:/bin"}, timeout=60)
    assert len(res.stdout.splitlines()) == 4  # source, two folded lines, the count
    src, seen, events, _ = parse_xid_section(res.stdout)
    assert (src, seen) == ("dmesg", 5001)
    assert [(e.code, e.count) for e in events] == [(13, 5000), (79, 1)]
    assert events[0].last.endswith("pid=4999, Graphics Exception")


def test_sysfs_fallback_prints_the_lspci_format(tmp_path):
    # no lspci: the reader walks /sys/bus/pci/devices (here whatever this machine has; every line it prints
    # must parse, and NVIDIA display devices only are kept)
    from llmfleet.host.gpu_health import HEALTH_READER

    b = tmp_path / "bin"
    b.mkdir()
    for tool in ("cat", "head", "printf", "sh"):
        path = next((Path(d) / tool for d in ("/usr/bin", "/bin") if (Path(d) / tool).exists()), None)
        if path:
            os.symlink(path, b / tool)
    res = subprocess.run(["sh", "-c", HEALTH_READER + "\nllmfleet_gpu_pci"], capture_output=True, text=True,
                         env={"PATH": str(b)}, timeout=30)
    src, devices = parse_pci_section(res.stdout)
    assert src == ("sysfs" if Path("/sys/bus/pci/devices").is_dir() else None)
    assert all(d[2].startswith("10de:") and d[1].startswith("03") for d in devices)


def test_facts_table_rows():
    from llmfleet.cli.facts_tasks import gpu_health_rows
    from llmfleet.knowledge.facts import Facts

    assert gpu_health_rows(Facts(host="h1")) == []  # an older probe: no row
    clean = Facts(host="h1", gpu_health=host(xids=(xid(13, count=2),)))
    assert gpu_health_rows(clean) == [
        ("GPU health", "GPU 0: Xid 13 (Graphics Engine Exception) x2 (application-level)"),
        ("GPU health", "nvidia-smi -q: 2 card(s), no condition; kernel log (dmesg): 0 Xid line(s) since boot; "
                       "PCI bus (lspci): 0 NVIDIA card(s)")]
    bad = Facts(host="h1", gpu_health=host(healthy(0), healthy(1, remap_pending=True)))
    assert gpu_health_rows(bad) == [("GPU health", "GPU 1: a row remap waits for a reset (fatal)")]
