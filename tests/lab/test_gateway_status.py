"""`invoke status` shows each replica's state at a gateway, read from the real HAProxy (lab image ``gateway:lab``).

One lab host (gpu-p40-01, shared with tests/lab/test_exporters.py: other services and ports, removed at the
end) runs a gateway in front of two llama.cpp services of its own inventory that are never deployed, so its
health checks find nothing listening. Asserted:

- ``status --json`` gives one ``gateway_replicas`` row per replica the inventory puts behind the gateway,
  with HAProxy's status and the health check's own words; a replica put in maintenance through the runtime
  API is ``out: maintenance``; the human table shows the same rows;
- a stopped gateway is one line (``gateway_errors``), no traceback, and its rows are gone.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest
import yaml

from llmfleet.release import gateway_config as gc
from tests.lab.test_prometheus import _lab_address, invoke

pytestmark = pytest.mark.lab

HOST = "gpu-p40-01"
GATEWAY = "gw-status"
ADMIN_PORT = 19931
SERVED = "tiny-qwen2"
ENV = {"LAB_GWS_KEY": "gw-status-key-4e1f"}


@pytest.fixture(scope="module")
def gw(lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gateway-status")
    lab.ensure_hosts(HOST)
    dest = tmp / "inventory"
    shutil.copytree(lab.inventory_path, dest)
    tiny = yaml.safe_load((dest / "group_vars" / "all.yml").read_text())["llmfleet_services"][0]
    address = _lab_address(lab, HOST)
    (dest / "host_vars").mkdir(exist_ok=True)
    (dest / "host_vars" / f"{HOST}.yml").write_text(yaml.safe_dump({
        "ansible_host": address, "ansible_port": 22, "llmfleet_bind_address": address,
        "llmfleet_services": [
            dict(tiny, name="gws-a", port=18601, served_name=SERVED),
            dict(tiny, name="gws-b", port=18602, served_name=SERVED),
            {"name": GATEWAY, "engine": "gateway", "image": "gateway:lab", "port": 18543,
             "gateway": {"upstreams": [HOST], "admin_port": ADMIN_PORT,
                         "api_keys": [{"name": "team-a", "key": {"from_env": "LAB_GWS_KEY"}}]}}]}))
    shutil.copyfile(lab.known_hosts, tmp / "known_hosts")
    res = invoke(lab, tmp, "deploy", "-l", HOST, "--service", GATEWAY, "--accept-new-host-keys", "--json", env=ENV,
                 timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    try:
        yield {"tmp": tmp}
    finally:
        res = invoke(lab, tmp, "remove", "-l", HOST, "--service", GATEWAY, "--yes", env=ENV)
        assert res.returncode == 0, res.stdout[-1500:] + res.stderr[-1500:]


def _status(lab, tmp) -> dict:
    res = invoke(lab, tmp, "status", "-l", HOST, "--json", "--no-metrics", env=ENV)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(res.stdout)


def test_status_shows_each_replica_at_the_gateway_and_a_silent_gateway_in_one_line(lab, gw):
    tmp = gw["tmp"]
    backend = gc.backend_name(SERVED)
    maint = gc.admin_script(ADMIN_PORT, gc.maint_command(backend, gc.server_name(HOST, "gws-b")))
    res = lab.exec(HOST, ["bash", "-c", maint])
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr

    rows: dict[str, dict] = {}
    for _ in range(30):  # HAProxy's checks every 2 s take gws-a out after 2 failures
        doc = _status(lab, tmp)
        rows = {r["replica"]: r for r in doc["gateway_replicas"]}
        if rows.get(f"{HOST}/gws-a", {}).get("status") == "DOWN":
            break
        time.sleep(1)
    assert set(rows) == {f"{HOST}/gws-a", f"{HOST}/gws-b"} and doc["gateway_errors"] == []
    a, b = rows[f"{HOST}/gws-a"], rows[f"{HOST}/gws-b"]
    assert (a["backend"], a["status"], a["sessions"], a["state"]) == (backend, "DOWN", 0, "out: down by health checks")
    assert a["check"] == "L4CON" and "Connection refused" in a["why"]
    assert (b["status"], b["state"]) == ("MAINT", "out: maintenance")
    gw_row = next(r for r in doc["rows"] if r["service"] == GATEWAY)
    assert gw_row["note"].startswith("replicas: 2 out")

    res = invoke(lab, tmp, "status", "-l", HOST, "--no-metrics", env=ENV)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    line = next(ln for ln in res.stdout.splitlines() if "gws-b" in ln and "MAINT" in ln)
    assert "out: maintenance" in line and f"{HOST}/{GATEWAY}" in line

    res = invoke(lab, tmp, "stop", "-l", HOST, "--service", GATEWAY, env=ENV)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    doc = _status(lab, tmp)
    assert doc["gateway_replicas"] == []
    assert [(e["gateway"], e["error"]) for e in doc["gateway_errors"]] == [
        (GATEWAY, f"nothing listens on 127.0.0.1:{ADMIN_PORT} (HAProxy's runtime API): is the gateway running?")]
    res = invoke(lab, tmp, "status", "-l", HOST, "--no-metrics", env=ENV)
    assert "Traceback" not in res.stdout + res.stderr
    said = [ln for ln in res.stdout.splitlines() if ln.startswith(f"gateway {HOST}/{GATEWAY}:")]
    assert len(said) == 1 and "nothing listens" in said[0]
