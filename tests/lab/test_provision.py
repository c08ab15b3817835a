"""`invoke provision` on a bare lab host (no Docker, no NVIDIA bits; apt only from the lab's package
repository with its NVIDIA stand-ins, SIMULATOR): --check lists every step and changes nothing; the run
installs, holds, configures, reboots once and verifies; `invoke deploy` then serves; a second run is
converged in one SSH round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

HOST = "gpu-bare-01"
REPO = Path(__file__).resolve().parents[2]


def invoke(lab, tmp: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(lab.known_hosts),
               INVOKE_LLMFLEET_AUDIT_LOG=str(tmp / "local-audit.jsonl"), COLUMNS="250")
    argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), args[0], "-i", lab.inventory_path, *args[1:]]
    return subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=timeout, env=env)


def _json(proc: subprocess.CompletedProcess) -> dict:
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"exit {proc.returncode}\nstdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}") from None


def _state(lab) -> str:
    return lab.exec(HOST, ["sh", "-c", "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' 'nvidia-*' "
                                       "'docker*' 2>/dev/null; apt-mark showhold; id -nG deploy; ls /opt 2>&1"]).stdout


def test_bare_host_check_provision_deploy_and_converged_rerun(lab, tmp_path):
    lab.ensure_hosts(HOST)
    before = _state(lab)

    # --check on the bare host: every step, nothing changed
    check = invoke(lab, tmp_path, "provision", "--host", HOST, "--check", "--json")
    doc = _json(check)
    (o,) = doc["hosts"]
    assert check.returncode == 0, check.stderr
    assert o["result"] == "would change" and o["round_trips"] == 1
    assert [s["name"] for s in o["steps"]] == ["sources", "packages-runtime", "toolkit", "driver", "hold", "files",
                                               "user", "folders", "docker-runtime-config", "persistence"]
    assert [s["name"] for s in o["steps"] if s["reboot"]] == ["driver"]
    assert _state(lab) == before

    # the run: installs, reboots once, verifies
    run = invoke(lab, tmp_path, "provision", "--host", HOST, "--yes", "--json")
    o = _json(run)["hosts"][0]
    assert run.returncode == 0, json.dumps(o, indent=1)[-4000:]
    assert o["result"] == "changed" and o["rebooted"], o["message"]
    print(f"{HOST}: provisioned in {o['seconds']:.1f} s, {o['round_trips']} round trips, "
          f"reboot {o['reboot_seconds']} s")
    checks = {c["id"]: c for c in o["checks"]}
    assert checks["driver"]["status"] == "pass" and o["driver"]["version"] in checks["driver"]["message"]
    assert checks["converged"]["status"] == "pass"
    assert checks["preflight gpu-runtime"]["status"] == "pass"
    holds = lab.exec(HOST, ["apt-mark", "showhold"]).stdout.split()
    assert "nvidia-driver" in holds and "nvidia-container-toolkit" in holds
    assert "docker" in lab.exec(HOST, ["id", "-nG", "deploy"]).stdout.split()
    audit = lab.exec(HOST, ["cat", "/opt/llmfleet/audit.jsonl"]).stdout
    assert audit.count('"action":"provision"') == len(o["steps"])
    assert not lab.exec(HOST, ["test", "-d", "/opt/llmfleet/locks/deploy"], check=False).returncode == 0

    # a second run: converged in one round trip; --check too
    again = _json(invoke(lab, tmp_path, "provision", "--host", HOST, "--json"))["hosts"][0]
    assert (again["result"], again["round_trips"], again["steps"]) == ("converged", 1, [])
    print(f"{HOST}: converged run {again['seconds']:.3f} s")

    # deploy serves on it
    lab.stage_models(HOST)
    dep = invoke(lab, tmp_path, "deploy", "--host", HOST, "--json")
    out = _json(dep)
    assert dep.returncode == 0, json.dumps(out, indent=1)[-3000:]
    assert out["hosts"][0]["result"] == "deployed"
