"""The lab's dcgm-exporter simulator (dockerfiles/lab-dcgm-exporter-sim): its /metrics text for several
simulated GPUs, with and without injected faults, read back with a Prometheus text parser; and the
dcgm-exporter flags it must take so the dcgm-exporter role's args work unchanged."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmfleet.lab import images, setup
from llmfleet.lab.cards import gpu_uuid

ROOT = Path(__file__).resolve().parents[1]
SIM_DIR = ROOT / "dockerfiles" / "lab-dcgm-exporter-sim"
_spec = importlib.util.spec_from_file_location("dcgm_exporter_sim", SIM_DIR / "dcgm_exporter_sim.py")
assert _spec and _spec.loader
sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim)

DEFAULT_ROWS = sim.parse_collectors((SIM_DIR / "default-counters.csv").read_text())
# A counters file of a fleet that wants the ECC counters (upstream's default leaves them commented out).
ECC_ROWS = sim.parse_collectors(
    "# custom\nDCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.\n"
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.\n"
    "DCGM_FI_DRIVER_VERSION, label, Driver Version\n")


def scrape(rows, faults=None, gpus=2, model="Tesla V100-SXM2-32GB") -> dict[str, list]:
    text = sim.render(rows, gpus=gpus, model=model, hostname="gpu-v100-01", uuid_seed="gpu-v100-01",
                      fb_mib=32768, driver="535.183.01", faults=sim.parse_faults(faults or {}, gpus),
                      uptime_s=10.0)
    fams = {}
    for fam in text_string_to_metric_families(text):
        fams[fam.name] = fam.samples
    return fams


def by_gpu(samples) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for s in samples}


def test_one_series_set_per_gpu_with_dcgm_exporter_labels():
    fams = scrape(DEFAULT_ROWS)
    assert "DCGM_FI_DEV_SM_CLOCK" in fams and "DCGM_FI_DEV_XID_ERRORS" in fams
    for samples in fams.values():
        assert sorted(s.labels["gpu"] for s in samples) == ["0", "1"]
    s0 = next(s for s in fams["DCGM_FI_DEV_GPU_TEMP"] if s.labels["gpu"] == "0")
    assert s0.labels == {"gpu": "0", "UUID": gpu_uuid("gpu-v100-01", 0), "pci_bus_id": "00000000:18:00.0",
                         "device": "nvidia0", "modelName": "Tesla V100-SXM2-32GB", "Hostname": "gpu-v100-01"}
    # an idle card: its whole memory free
    assert by_gpu(fams["DCGM_FI_DEV_FB_FREE"]) == {"0": 32768, "1": 32768}


def test_default_counters_are_upstreams_without_ecc():
    fams = scrape(DEFAULT_ROWS)
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" not in fams
    assert sim.unknown_fields(DEFAULT_ROWS) == []


def test_no_faults_file_reads_zero():
    fams = scrape(ECC_ROWS)
    assert by_gpu(fams["DCGM_FI_DEV_XID_ERRORS"]) == {"0": 0, "1": 0}
    assert by_gpu(fams["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]) == {"0": 0, "1": 0}
    assert fams["DCGM_FI_DEV_XID_ERRORS"][0].labels["DCGM_FI_DRIVER_VERSION"] == "535.183.01"


@pytest.mark.parametrize("faults, xid, ecc", [
    ({"xid": 79, "ecc_dbe": 2}, {"0": 79, "1": 79}, {"0": 2, "1": 2}),      # every GPU
    ({"1": {"xid": 48, "ecc_dbe": 1}}, {"0": 0, "1": 48}, {"0": 0, "1": 1}),  # GPU 1 only
    # the host's nvidia-smi simulator format: the last Xid of a list, its ECC key
    ({"0": {"xid": [13, 79], "ecc_volatile_uncorrectable": 3}}, {"0": 79, "1": 0}, {"0": 3, "1": 0}),
])
def test_faults_set_xid_and_ecc(faults, xid, ecc):
    fams = scrape(ECC_ROWS, faults)
    assert by_gpu(fams["DCGM_FI_DEV_XID_ERRORS"]) == xid
    assert by_gpu(fams["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]) == ecc


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (scripts/bootstrap.sh)")
def test_promtool_parses_the_output():
    text = sim.render(DEFAULT_ROWS, gpus=2, model="Tesla T4", hostname="h", uuid_seed="h", fb_mib=15360,
                      driver="535.183.01", faults=sim.parse_faults({"xid": 79}, 2), uptime_s=1.0)
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    # 0: clean, 3: lint remarks only (camelCase labels, counters without _total: dcgm-exporter's own names);
    # a text-format error is exit 1 "error while linting"
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    remarks = (proc.stdout + proc.stderr).splitlines()
    assert not [r for r in remarks if not any(k in r for k in ("camelCase", '"_total" suffix', "include type"))]


@pytest.mark.parametrize("argv, address, collectors, ignored", [
    ([], ":9400", sim.DEFAULT_COLLECTORS, []),
    (["-a", ":9400", "-f", "/etc/x.csv"], ":9400", "/etc/x.csv", []),
    (["--address=127.0.0.1:9500", "--collectors", "/c.csv", "-c", "30000", "--kubernetes"],
     "127.0.0.1:9500", "/c.csv", ["-c 30000", "--kubernetes"]),
])
def test_dcgm_exporter_flags(argv, address, collectors, ignored):
    opts, skipped = sim.parse_args(argv)
    assert (opts["address"], opts["collectors"], skipped) == (address, collectors, ignored)


def test_bad_address_and_stray_argument_are_usage_errors():
    with pytest.raises(sim.UsageError):
        sim.listen_address("9400")
    with pytest.raises(sim.UsageError):
        sim.parse_args(["serve"])
    assert sim.listen_address(":9400") == ("", 9400)
    assert sim.listen_address("[::1]:9400") == ("::1", 9400)


def test_lab_builds_and_pins_both_exporter_images():
    assert {"node-exporter", "dcgm-exporter-sim"} <= set(images.DEFAULT_IMAGES)
    pins = {p.key: p for p in setup.PINS}
    assert pins["node-exporter:lab"].image == "node-exporter"
    assert pins["dcgm-exporter:lab-sim"].image == "dcgm-exporter-sim"
    assert "SIMULATOR" in pins["dcgm-exporter:lab-sim"].note
