"""An SSH connection cut in the middle of `invoke provision`'s driver install, and a re-run that converges.

The stand-in DKMS package (SIMULATOR) takes as long to "build the module" as
/etc/llmfleet-sim/dkms-build-seconds says; while it builds, the deploy user's SSH session on the host is
killed and the install with it (dpkg is left with a half-configured package, as when a connection drops
and apt is killed). The run reports the step that did not finish and leaves the deploy lock released (a
new connection writes the audit lines and unlocks). The next run finishes what dpkg left half-done first,
then installs, reboots and verifies; a third is converged in one round trip."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.lab.test_provision import REPO, _json

pytestmark = pytest.mark.lab

HOST = "gpu-bare-05"
SLOW = "/etc/llmfleet-sim/dkms-build-seconds"


def _popen(lab, tmp, *args: str) -> subprocess.Popen:
    import os

    env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(lab.known_hosts),
               INVOKE_LLMFLEET_AUDIT_LOG=str(tmp / "local-audit.jsonl"), COLUMNS="250")
    argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), args[0], "-i", lab.inventory_path, *args[1:]]
    return subprocess.Popen(argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _building(lab) -> bool:
    ps = lab.exec(HOST, ["ps", "-eo", "args"], check=False).stdout
    return "sleep 120" in ps


def test_a_connection_cut_mid_install_and_a_rerun_that_converges(lab, tmp_path):
    from tests.lab.test_provision import invoke

    lab.ensure_hosts(HOST)
    lab.exec(HOST, ["sh", "-c", f"echo 120 > {SLOW}"])
    proc = _popen(lab, tmp_path, "provision", "--host", HOST, "--yes", "--json")
    t0 = time.monotonic()
    while not _building(lab):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < 300, "the driver's install never reached its module build"
        time.sleep(0.2)
    # the connection drops, and the install with it
    lab.exec(HOST, ["sh", "-c", "pkill -KILL -f '[s]shd: deploy'; pkill -KILL -x dpkg; pkill -KILL -x apt-get; "
                                "pkill -KILL -f '[s]leep 120'; true"])
    out, err = proc.communicate(timeout=120)
    o = json.loads(out)["hosts"][0]
    assert proc.returncode == 1, (out[-2000:], err[-2000:])
    cut = next(s for s in o["steps"] if s["status"] == "failed")
    assert cut["name"] == "driver" and o["message"].startswith("step driver did not finish"), o["message"]
    assert "run provision again" in cut["fix"]
    assert lab.exec(HOST, ["test", "-d", "/opt/llmfleet/locks/deploy"], check=False).returncode != 0  # unlocked
    assert lab.exec(HOST, ["sh", "-c", "dpkg --audit"]).stdout.strip(), "dpkg was not left half-done"

    lab.exec(HOST, ["rm", "-f", SLOW])
    again = invoke(lab, tmp_path, "provision", "--host", HOST, "--yes", "--json")
    a = _json(again)["hosts"][0]
    assert again.returncode == 0, json.dumps(a, indent=1)[-3000:]
    assert a["steps"][0]["name"] == "dpkg-repair" and a["result"] == "changed" and a["rebooted"]
    assert {c["id"]: c["status"] for c in a["checks"]}["driver"] == "pass"
    assert lab.exec(HOST, ["sh", "-c", "dpkg --audit"]).stdout.strip() == ""
    print(f"{HOST}: cut after {time.monotonic() - t0:.1f} s; the re-run converged in {a['seconds']:.1f} s "
          f"({a['round_trips']} round trips)")

    third = _json(invoke(lab, tmp_path, "provision", "--host", HOST, "--json"))["hosts"][0]
    assert (third["result"], third["round_trips"]) == ("converged", 1)
