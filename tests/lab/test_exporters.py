"""Exporters deployed as services through the same pipeline as the engines, scraped by a real Prometheus.

One lab host (``gpu-p40-01``: two simulated P40s on R535) reached at its lab-network address, as in
test_prometheus.py, gets two services of its own inventory copy: the real node exporter (Debian's
prometheus-node-exporter, lab image ``node-exporter:lab``) and the lab's DCGM exporter simulator
(``dcgm-exporter:lab-sim``: no GPU here). Asserted, in file order:

- `invoke deploy` passes the preflight's `exporter` check, renders, switches and health-checks both (the
  health check waits for each one's own series on /metrics) and confirms them;
- `invoke prometheus.targets` writes them under the `exporters` job with the host's labels, and Prometheus
  scrapes both: `node_boot_time_seconds` and one `DCGM_FI_DEV_XID_ERRORS` series per GPU carry llmfleet's
  host label;
- an Xid on GPU 1 (the simulator's faults file) fires LlmfleetGpuXid for this host;
- a deploy of a node exporter that cannot start (an unknown flag) fails its health check and goes back: the
  previous release is current again and Prometheus scrapes it;
- `invoke remove` takes both away (the host is shared with other lab tests).
"""

from __future__ import annotations

import json
import os

import pytest
import yaml

from tests.lab.test_prometheus import (
    PROMETHEUS,
    _firing,
    _lab_address,
    _query,
    _start_prometheus,
    _stop_prometheus,
    _wait,
    invoke,
)

pytestmark = pytest.mark.lab

HOST = "gpu-p40-01"
SERVICES = [
    {"name": "node-exporter", "engine": "node-exporter", "image": "node-exporter:lab"},
    {"name": "dcgm-exporter", "engine": "dcgm-exporter", "image": "dcgm-exporter:lab-sim", "gpus": "all",
     "env": {"DCGM_SIM_GPUS": "2", "DCGM_SIM_MODEL": "Tesla P40"}},
]
FAULTS = "/var/lib/dcgm-sim/faults.json"


def _write_services(tmp, services) -> None:
    hv = tmp / "inventory" / "host_vars" / f"{HOST}.yml"
    hv.write_text(yaml.safe_dump(yaml.safe_load(hv.read_text()) | {"llmfleet_services": services}))


@pytest.fixture(scope="module")
def exporters(lab, tmp_path_factory):
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"{PROMETHEUS} not installed: scripts/bootstrap.sh installs Debian's prometheus", pytrace=False)
    tmp = tmp_path_factory.mktemp("exporters")
    lab.ensure_hosts(HOST)
    import shutil

    shutil.copytree(lab.inventory_path, tmp / "inventory")
    address = _lab_address(lab, HOST)
    (tmp / "inventory" / "host_vars").mkdir(exist_ok=True)
    # the host's lab-network address: what Prometheus on this machine scrapes (a private address: the
    # preflight's bind check passes it)
    (tmp / "inventory" / "host_vars" / f"{HOST}.yml").write_text(yaml.safe_dump(
        {"ansible_host": address, "ansible_port": 22, "llmfleet_bind_address": address}))
    _write_services(tmp, SERVICES)
    shutil.copyfile(lab.known_hosts, tmp / "known_hosts")
    res = invoke(lab, tmp, "deploy", "-l", HOST, "--accept-new-host-keys", "--json", timeout=600)
    deployed = json.loads(res.stdout) if res.stdout.strip().startswith(("{", "[")) else None
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sd = tmp / "sd"
    res = invoke(lab, tmp, "prometheus.targets", "--out", str(sd), "-l", HOST, "--json")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    doc = json.loads(res.stdout)
    proc, port, log = _start_prometheus(tmp, sd)
    try:
        yield {"tmp": tmp, "sd": sd, "port": port, "targets": doc, "address": address, "deployed": deployed}
    finally:
        _stop_prometheus(proc, log)
        res = invoke(lab, tmp, "remove", "-l", HOST, "--service", "node-exporter", "--yes")
        res2 = invoke(lab, tmp, "remove", "-l", HOST, "--service", "dcgm-exporter", "--yes")
        assert res.returncode == 0 and res2.returncode == 0, res.stderr[-1500:] + res2.stderr[-1500:]


def _preflight(deployed) -> dict[str, dict[str, str]]:
    """service -> check id -> status, from deploy --json."""
    host = deployed["hosts"][0] if isinstance(deployed, dict) and "hosts" in deployed else deployed[0]
    return {p["service"]: {c["id"]: c["status"] for c in p["checks"]} for p in host["preflight"]}


def test_both_exporters_deploy_through_the_pipeline_and_pass_their_checks(exporters):
    checks = _preflight(exporters["deployed"])
    assert checks["node-exporter"]["exporter"] == "pass" and checks["dcgm-exporter"]["exporter"] == "pass"
    assert "plan" not in checks["dcgm-exporter"] and "model-files" not in checks["node-exporter"]
    assert checks["dcgm-exporter"]["gpu-runtime"] == "pass"


def test_prometheus_scrapes_both_exporters_with_the_hosts_labels(exporters):
    doc, port = exporters["targets"], exporters["port"]
    mine = {t["service"]: t for t in doc["targets"] if t["host"] == HOST}
    assert {s: t["job"] for s, t in mine.items()} == {"node-exporter": "exporters", "dcgm-exporter": "exporters"}
    assert mine["node-exporter"]["address"] == f"{exporters['address']}:9100"

    def both_up():
        got = _query(port, f'up{{job="llmfleet-exporters", host="{HOST}"}} == 1')
        return got if {r["metric"]["service"] for r in got} == {"node-exporter", "dcgm-exporter"} else None

    got = _wait("both exporters scraped", both_up)
    for r in got:
        m = r["metric"]
        assert m["card"] and m["driver"] and m["release"] and m["engine"] == m["service"]
        assert "model" not in m
    assert _wait("the host's boot time", lambda: _query(port, f'node_boot_time_seconds{{host="{HOST}"}}'))
    xids = _wait("one Xid series per GPU", lambda: _query(port, f'DCGM_FI_DEV_XID_ERRORS{{host="{HOST}"}}') or None)
    assert sorted(r["metric"]["gpu"] for r in xids) == ["0", "1"]
    assert all(float(r["value"][1]) == 0 for r in xids)


def test_an_xid_on_one_gpu_fires_the_xid_alert_for_the_host(lab, exporters):
    port = exporters["port"]
    assert HOST not in _firing(port, "LlmfleetGpuXid")
    container = "llmfleet-dcgm-exporter"
    lab.exec(HOST, ["docker", "exec", container, "sh", "-c",
                    f"mkdir -p /var/lib/dcgm-sim && printf '%s' '{{\"1\": {{\"xid\": 79}}}}' > {FAULTS}"])
    try:
        _wait("LlmfleetGpuXid to fire", lambda: HOST in _firing(port, "LlmfleetGpuXid") or None)
        got = _query(port, f'DCGM_FI_DEV_XID_ERRORS{{host="{HOST}"}} > 0')
        assert [r["metric"]["gpu"] for r in got] == ["1"]
    finally:
        lab.exec(HOST, ["docker", "exec", container, "rm", "-f", FAULTS], check=False)


def test_a_node_exporter_that_cannot_start_goes_back_to_its_previous_release(lab, exporters):
    tmp, port = exporters["tmp"], exporters["port"]
    before = json.loads((exporters["sd"] / "exporters" / f"{HOST}.json").read_text())
    release = {g["labels"]["service"]: g["labels"]["release"] for g in before}["node-exporter"]
    _write_services(tmp, [dict(SERVICES[0], engine_args=["--no-such-flag"]), SERVICES[1]])
    try:
        res = invoke(lab, tmp, "deploy", "-l", HOST, "--service", "node-exporter", "--json", timeout=600)
        assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
        host = json.loads(res.stdout)["hosts"][0]
        assert host["result"] == "rolled_back", host
    finally:
        _write_services(tmp, SERVICES)
    res = invoke(lab, tmp, "status", "-l", HOST, "--json")
    assert res.returncode in (0, 1), res.stderr[-2000:]
    assert release in res.stdout  # the previous release is current again

    def serving_previous():
        got = _query(port, f'up{{job="llmfleet-exporters", host="{HOST}", service="node-exporter", '
                           f'release="{release}"}} == 1')
        return got or None

    _wait("the previous node exporter scraped again", serving_previous)
