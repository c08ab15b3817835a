"""A driver change over a group, gated by serving: two bare lab hosts provisioned on R535 and serving,
then `invoke provision --group bare_fleet --serial 1` moves them to the catalog's R580. On gpu-bare-04
the lab's container runtime fails with the new driver (the stand-in hook, SIMULATOR: libnvidia-container
cannot initialise NVML), so its service does not come back: it goes back to 535 from the .deb files kept
on the host, reboots, and serves again; gpu-bare-03 ends on 580 and serving. apt, dpkg, holds and the
reboots are real."""

from __future__ import annotations

import json

import pytest

from tests.lab.test_provision import _json, invoke

pytestmark = pytest.mark.lab

GOOD, BAD = "gpu-bare-03", "gpu-bare-04"
OLD, NEW = "535.247.01", "580.95.05"
FAIL_FILE = "/etc/llmfleet-sim/containers-fail-on"


def _smi(lab, host: str) -> str:
    return lab.exec(host, ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    check=False).stdout.strip()


def _answers(lab, host: str) -> bool:
    res = lab.exec(host, ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5",
                          "http://127.0.0.1:8000/health"], check=False)
    return res.stdout.strip() == "200"


def test_a_driver_change_over_a_group_goes_back_where_the_services_do_not_come_back(lab, tmp_path):
    lab.ensure_hosts(GOOD, BAD)
    first = invoke(lab, tmp_path, "provision", "--group", "bare_fleet", "--driver-branch", "535", "--yes", "--json")
    assert first.returncode == 0, json.dumps(_json(first), indent=1)[-3000:]
    for h in (GOOD, BAD):
        assert _smi(lab, h) == OLD
        lab.stage_models(h)
    dep = invoke(lab, tmp_path, "deploy", "--group", "bare_fleet", "--json")
    assert dep.returncode == 0, json.dumps(_json(dep), indent=1)[-3000:]
    assert all(_answers(lab, h) for h in (GOOD, BAD))

    # --check: the driver change, per host, and nothing changed
    chk = _json(invoke(lab, tmp_path, "provision", "--group", "bare_fleet", "--check", "--json"))
    for o in chk["hosts"]:
        assert o["result"] == "would change" and o["driver"]["version"] == NEW, o
        assert o["previous_driver"]["version"] == OLD
    assert _smi(lab, GOOD) == OLD

    lab.exec(BAD, ["sh", "-c", f"printf '%s\\n' {NEW} > {FAIL_FILE}"])
    run = invoke(lab, tmp_path, "provision", "--group", "bare_fleet", "--serial", "1", "--yes", "--json")
    doc = _json(run)
    by = {o["host"]: o for o in doc["hosts"]}
    assert run.returncode == 1, json.dumps(doc, indent=1)[-4000:]

    good = by[GOOD]
    print(f"{GOOD}: {good['result']}: {good['message']} ({good['seconds']:.1f} s)")
    assert good["result"] == "changed" and good["ok"], good["message"]
    assert good["gate"]["services"] == ["tiny"] and f"{OLD} -> {NEW}" in good["message"]
    assert _smi(lab, GOOD) == NEW and _answers(lab, GOOD)
    kept = lab.exec(GOOD, ["sh", "-c", f"ls /opt/llmfleet/driver-previous/{OLD}/"]).stdout
    assert "nvidia-driver_" in kept and "packages" in kept

    bad = by[BAD]
    print(f"{BAD}: {bad['result']}: {bad['message']} ({bad['seconds']:.1f} s)")
    assert bad["result"] == "went back" and not bad["ok"], json.dumps(bad, indent=1)[-3000:]
    assert "not healthy on" in bad["message"] and f"back on {OLD}, its services serve again" in bad["message"]
    assert bad["gate"]["go_back"]["checks"][0]["status"] == "pass"
    assert _smi(lab, BAD) == OLD and _answers(lab, BAD)
    holds = lab.exec(BAD, ["apt-mark", "showhold"]).stdout.split()
    assert "nvidia-driver" in holds
    assert lab.exec(BAD, ["dpkg-query", "-W", "-f", "${Version}", "nvidia-driver"]).stdout.startswith(OLD)
    audit = lab.exec(BAD, ["cat", "/opt/llmfleet/audit.jsonl"]).stdout
    assert '"step":"go-back"' in audit and '"action":"stop"' in audit and '"action":"start"' in audit
