"""Facts and preflight on the lab's simulated GPU hosts (real sshd, real Docker engine per host,
nvidia-smi simulator per card and driver)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmfleet.images import lock as images
from llmfleet.inventory.ansible import settings_for
from llmfleet.release.preflight import preflight_host

pytestmark = pytest.mark.lab
LLMFLEET = str(Path(sys.executable).parent / "llmfleet")


def _preflight(lab, name: str):
    inv = lab.inventory()
    host = inv.hosts[name]
    lock = images.load_lock(images.images_lock_path(host.vars, lab.inventory_path, None))
    return preflight_host(host, settings_for(host), lock=lock, config=lab.config)


def test_preflight_passes_on_gpu_v100_01_for_its_lab_service(lab):
    lab.ensure_hosts("gpu-v100-01")
    found, reports = _preflight(lab, "gpu-v100-01")
    assert [(g.name, g.compute_capability, g.compute_capability_source) for g in found.gpus] == [
        ("Tesla V100-SXM2-32GB", "7.0", "driver")]
    assert found.driver_version.startswith("535.") and found.cuda_driver_version == "12.2"
    assert found.docker.server_version and found.compose.v2
    (r,) = reports
    checks = {c.id: c for c in r.checks}
    assert r.ok, [c for c in r.checks if c.status == "fail"]
    for cid in ("image", "gpu", "docker", "gpu-runtime", "compose", "model-files"):
        assert checks[cid].status == "pass", checks[cid]
    assert "@sha256:" in checks["image"].message  # resolved through the lab's images.lock


def test_r470_host_gets_compute_capability_from_the_catalog(lab):
    lab.ensure_hosts("gpu-t4-01")
    found, _ = _preflight(lab, "gpu-t4-01")
    assert [(g.name, g.compute_capability, g.compute_capability_source) for g in found.gpus] == [
        ("Tesla T4", "7.5", "catalog")]
    assert found.cuda_driver_version == "11.4"
    assert not [e for e in found.errors if "compute" in e]


def test_dead_driver_gives_a_named_failure(lab):
    lab.ensure_hosts("gpu-t4-01")
    lab.set_driver_dead("gpu-t4-01", True)
    try:
        found, reports = _preflight(lab, "gpu-t4-01")
    finally:
        lab.set_driver_dead("gpu-t4-01", False)
    assert found.gpus == [] and found.driver_loaded is False
    (r,) = reports
    gpu = next(c for c in r.checks if c.id == "gpu")
    assert not r.ok
    assert gpu.status == "fail" and "driver not loaded" in gpu.message, gpu


def test_cli_preflight_on_the_lab(lab, tmp_path):
    lab.ensure_hosts("gpu-v100-01")
    (tmp_path / "invoke.yaml").write_text(yaml.safe_dump({"llmfleet": {
        "inventory": lab.inventory_path, "ssh": {"known_hosts": lab.config["known_hosts"]}}}))
    res = subprocess.run([LLMFLEET, "preflight", "--host", "gpu-v100-01", "--json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    assert data["unreachable"] == []
    (report,) = data["reports"]
    assert (report["host"], report["service"], report["ok"]) == ("gpu-v100-01", "tiny", True)
    res = subprocess.run([LLMFLEET, "facts", "--host", "gpu-v100-01"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and "Tesla V100-SXM2-32GB" in res.stdout and "CC 7.0 (driver)" in res.stdout


def test_preflight_from_facts_saved_on_the_lab_host(lab, tmp_path):
    """`facts --out FILE` on a lab host, then `preflight --facts FILE` judges the same with the host
    stopped, with an `offline` WARN naming what was assumed."""
    lab.ensure_hosts("gpu-v100-01")
    (tmp_path / "invoke.yaml").write_text(yaml.safe_dump({"llmfleet": {
        "inventory": lab.inventory_path, "ssh": {"known_hosts": lab.config["known_hosts"]}}}))
    saved = tmp_path / "v100.json"
    res = subprocess.run([LLMFLEET, "facts", "--host", "gpu-v100-01", "--out", str(saved)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    live = subprocess.run([LLMFLEET, "preflight", "--host", "gpu-v100-01", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    live_checks = {c["id"]: c["status"] for c in json.loads(live.stdout)["reports"][0]["checks"]}
    lab.stop_host("gpu-v100-01")  # the offline preflight must not need the host
    try:
        res = subprocess.run([LLMFLEET, "preflight", "--host", "gpu-v100-01", "--facts", str(saved), "--assume",
                              "driver=570.133.07", "--json"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
    finally:
        lab.start_host("gpu-v100-01")
    assert res.returncode == live.returncode, res.stdout + res.stderr
    data = json.loads(res.stdout)["reports"][0]
    checks = {c["id"]: c for c in data["checks"]}
    assert checks["offline"]["status"] == "warn" and "driver 535.183.01 -> 570.133.07" in checks["offline"]["message"]
    # the lab serves a CPU image: the assumed driver changes no verdict, the saved facts give the rest
    assert {k: v["status"] for k, v in checks.items() if k != "offline"} == live_checks
