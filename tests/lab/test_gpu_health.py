"""GPU hardware health on the lab: each condition injected into one host's simulated cards (its nvidia-smi,
dmesg and lspci simulators read /etc/llmfleet-sim/faults.json at every call) gives the right facts, the
right preflight verdict (FAIL on the service's card, WARN when degraded or on another card) and the right
note in `invoke status`. One host (``gpu-p40-01``, two P40s), one deploy, the faults cleared between cases.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmfleet.fleet import status as status_mod
from llmfleet.images import lock as images
from llmfleet.inventory.ansible import load_inventory, settings_for
from llmfleet.release.deploy import DeployOptions, deploy_host
from llmfleet.release.preflight import preflight_host

pytestmark = pytest.mark.lab

HOST = "gpu-p40-01"
REPO = Path(__file__).resolve().parents[2]
P40_0, P40_1 = "0000:18:00", "0000:3b:00"  # where the simulator puts the host's two cards


@pytest.fixture(scope="module")
def deployed(lab, tmp_path_factory):
    """The lab's inventory with the host's service on GPU 0 only (so GPU 1 is a card it does not use),
    deployed once, healthy."""
    tmp = tmp_path_factory.mktemp("gpu-health")
    lab.ensure_hosts(HOST)
    lab.set_gpu_faults(HOST, None)
    inv = tmp / "inventory"
    shutil.copytree(lab.inventory_path, inv)
    services = yaml.safe_load((inv / "group_vars" / "all.yml").read_text())["llmfleet_services"]
    # the health check's decode floor is not what these tests are about (the lab's two shared cores)
    mine = [dict(s, gpus=[0], health=dict(s.get("health") or {}, min_tokps=0.5)) for s in services]
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / f"{HOST}.yml").write_text(yaml.safe_dump({"llmfleet_services": mine}, sort_keys=False))
    config = dict(lab.config, audit_log=str(tmp / "local-audit.jsonl"))
    o = deploy_host(str(inv), HOST, config=config, options=DeployOptions(who="tester"), log=lambda line: None)
    assert o.result in ("deployed", "unchanged"), (o.result, o.reason)
    yield lab, str(inv), config, tmp
    lab.set_gpu_faults(HOST, None)


def preflight(lab, inv: str):
    host = load_inventory(inv).hosts[HOST]
    lock = images.load_lock(images.images_lock_path(host.vars, inv, None))
    facts, (report,) = preflight_host(host, settings_for(host), lock=lock, config=lab.config)
    assert facts is not None
    return facts, {c.id: c for c in report.checks}


def status_row(lab, inv: str):
    host = load_inventory(inv).hosts[HOST]
    (st, settings), = status_mod.query_hosts([host], config=lab.config, metrics=False)
    assert st.reachable, st.error
    (row,) = [r for r in status_mod.host_rows(st, settings) if r.service == "tiny"]
    return row


CASES = [
    # (name, faults per GPU, what the facts say, gpu-health verdict, words in its message, the status note)
    ("xid-79", {0: {"xid": [79]}},
     lambda f: [(e.code, e.pci, e.gpu_index) for e in f.gpu_health.xids] == [(79, P40_0, 0)],
     "fail", ["GPU 0: Xid 79 (GPU has fallen off the bus)", "PCI Express link"],
     "hardware: GPU 0 Xid 79 (GPU has fallen off the bus) FATAL"),
    ("xid-63-degraded", {0: {"xid": [63]}},
     lambda f: [e.code for e in f.gpu_health.xids] == [63],
     "warn", ["Xid 63 (ECC page retirement or row remapping recording event)"],
     "hardware: GPU 0 Xid 63 (ECC page retirement or row remapping recording event)"),
    ("xid-48-and-64", {0: {"xid": [48, 64]}},
     lambda f: [e.code for e in f.gpu_health.xids] == [48, 64],
     "fail", ["Xid 48 (DBE (Double Bit Error) ECC Error)", "Xid 64 (ECC page retirement or row remapper "
                                                          "recording failure)"],
     "hardware: GPU 0 Xid 48 (DBE (Double Bit Error) ECC Error) FATAL; GPU 0 Xid 64 (ECC page retirement or "
     "row remapper recording failure) FATAL"),
    ("uncorrectable-ecc", {0: {"ecc_volatile_uncorrectable": 2}},
     lambda f: [(c.ecc_volatile_uncorrectable, c.ecc_aggregate_uncorrectable) for c in f.gpu_health.cards]
     == [(2, 2), (0, 0)],
     "fail", ["2 uncorrectable ECC errors since the last reset"],
     "hardware: GPU 0 2 uncorrectable ECC errors since the last reset FATAL"),
    ("pending-remap", {0: {"remap_pending": True}},
     lambda f: [c.remap_pending for c in f.gpu_health.cards] == [True, None],
     "fail", ["a row remap waits for a reset"], "hardware: GPU 0 a row remap waits for a reset FATAL"),
    ("card-missing", {0: {"missing": True}},
     lambda f: [g.index for g in f.gpus] == [0] and f.gpus[0].pci_bus_id == "00000000:3B:00.0"
     and [(m.pci, m.expected_index) for m in f.gpu_health.missing] == [(P40_0 + ".0", 0)],
     "fail", ["card 0000:18:00.0 (GPU 0 by bus order): missing from nvidia-smi", "reads 0xff"],
     "hardware: card 0000:18:00.0 missing from nvidia-smi FATAL"),
    ("missing-card-the-service-does-not-use", {1: {"missing": True, "xid": [79]}},
     lambda f: [g.index for g in f.gpus] == [0] and [m.expected_index for m in f.gpu_health.missing] == [1]
     and [(e.code, e.gpu_index) for e in f.gpu_health.xids] == [(79, None)],
     "warn", ["not used by tiny, but on this host", "card 0000:3b:00.0 (GPU 1 by bus order)"], ""),
    ("pcie-link-degraded", {0: {"pcie_width": 8}},
     lambda f: [(c.pcie_width_current, c.pcie_width_max) for c in f.gpu_health.cards] == [(8, 16), (16, 16)],
     "warn", ["PCIe link x8 of x16"], "hardware: GPU 0 PCIe link x8 of x16"),
    ("clean", None,
     lambda f: (f.gpu_health.xids, f.gpu_health.missing, f.gpu_health.xid_source, f.gpu_health.pci_source)
     == ([], [], "dmesg", "lspci"),
     "pass", ["no Xid since boot", "every NVIDIA card on the PCI bus is listed (2)"], ""),
]


@pytest.mark.parametrize("faults,facts_say,verdict,said,note", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_injected_condition(deployed, faults, facts_say, verdict, said, note):
    lab, inv, _config, _tmp = deployed
    lab.set_gpu_faults(HOST, faults)
    try:
        facts, checks = preflight(lab, inv)
        assert facts_say(facts), facts.gpu_health
        check = checks["gpu-health"]
        assert check.status == verdict, check
        for words in said:
            assert words in check.message, check.message
        if verdict == "fail":
            assert check.fix and ("reboot" in check.fix or "RMA" in check.fix), check.fix
        row = status_row(lab, inv)
        if note:
            assert row.note.endswith(note), row.note
        else:
            assert "hardware:" not in row.note and row.hardware is None, row.note
    finally:
        lab.set_gpu_faults(HOST, None)


def test_a_deploy_onto_a_failing_card_is_refused_and_status_json_says_why(deployed):
    lab, inv, config, tmp = deployed
    lab.set_gpu_faults(HOST, {0: {"xid": [79]}})
    try:
        o = deploy_host(inv, HOST, config=config, options=DeployOptions(who="tester"), log=lambda line: None)
        assert o.result == "refused", (o.result, o.reason)
        assert "tiny: gpu-health: service tiny would run on a failing card: GPU 0: Xid 79" in o.reason
        env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(lab.known_hosts),
                   INVOKE_LLMFLEET_AUDIT_LOG=str(tmp / "local-audit.jsonl"))
        res = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), "status", "-i", inv,
                              "--host", HOST, "--json", "--no-metrics"], cwd=tmp, capture_output=True, text=True,
                             timeout=300, env=env)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        (row,) = [r for r in json.loads(res.stdout)["rows"] if r["service"] == "tiny"]
        assert row["health"] == "healthy"  # the engine still answers: the note says what the card did
        assert row["note"].endswith("hardware: GPU 0 Xid 79 (GPU has fallen off the bus) FATAL")
        (finding,) = row["hardware"]
        assert (finding["gpu"], finding["severity"], finding["pci"]) == (0, "fatal", P40_0 + ".0")
        assert finding["source"].startswith("https://docs.nvidia.com/deploy/xid-errors/")
    finally:
        lab.set_gpu_faults(HOST, None)
