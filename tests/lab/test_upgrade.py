"""Rolling fleet upgrades in the lab: six llama.cpp hosts (group ``lab_fleet``), the real deploy per host.

Runs ``invoke upgrade`` as an operator would (a subprocess, the runbook's flags) and checks the
hosts themselves: the release each one runs, the canary finishing before the next batch starts, a
batch with a failing host (rolled back by its own deploy) stopping the rollout, resume by re-running.
The tests run in file order on the same hosts.
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

from llmfleet.knowledge import release_state
from llmfleet.release import store as R
from tests.lab.test_status import relaxed_inventory

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
FLEET = [f"lab-node-0{i}" for i in range(1, 7)]
ROOT = "/opt/llmfleet"


class Fleet:
    def __init__(self, lab, tmp: Path) -> None:
        self.lab = lab
        self.tmp = tmp
        self.inventory = relaxed_inventory(lab, tmp / "inventory")
        self.audit_log = tmp / "local-audit.jsonl"

    def invoke(self, *args: str, inventory: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
        env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(self.lab.known_hosts),
                   INVOKE_LLMFLEET_AUDIT_LOG=str(self.audit_log), COLUMNS="200")
        argv = [sys.executable, "-m", "invoke", args[0], "-i", inventory or self.inventory, *args[1:]]
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)

    def upgrade(self, *args: str, inventory: str | None = None) -> tuple[int, dict, str]:
        res = self.invoke("upgrade", "--group", "lab_fleet", "--json", *args, inventory=inventory)
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
        try:
            doc = json.loads(res.stdout)
        except ValueError:
            raise AssertionError(f"rc {res.returncode}; stdout {res.stdout[-1000:]!r}; stderr {res.stderr[-3000:]}") from None
        return res.returncode, doc, res.stderr

    def state(self, host: str) -> release_state.ServiceState:
        out = self.lab.exec(host, ["sh", "-c", R.state_script(ROOT)]).stdout
        return release_state.parse_state(out).get("tiny") or release_state.ServiceState(name="tiny")

    def current(self) -> dict[str, str | None]:
        return {h: self.state(h).current for h in FLEET}


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    lab.ensure_hosts(*FLEET)
    return Fleet(lab, tmp_path_factory.mktemp("upgrade"))


def by_host(doc: dict) -> dict[str, dict]:
    return {h["host"]: h for h in doc["hosts"]}


def test_check_shows_batches_and_changes_and_touches_nothing(fleet):
    before = fleet.current()
    rc, doc, _ = fleet.upgrade("--serial", "1,50%,100%", "--check")
    assert rc == 0, doc
    assert doc["check"] is True
    assert doc["batches"] == [["lab-node-01"], ["lab-node-02", "lab-node-03", "lab-node-04"],
                              ["lab-node-05", "lab-node-06"]]
    assert {h["result"] for h in doc["hosts"]} == {"check"}
    assert fleet.current() == before


def test_first_rollout_with_a_canary_batch(fleet):
    rc, doc, err = fleet.upgrade("--serial", "1,50%,100%", "--forks", "3")
    assert rc == 0, err[-3000:]
    assert doc["ok"] and not doc["aborted"]
    assert doc["batches"][0] == ["lab-node-01"]
    res = by_host(doc)
    assert sorted(res) == FLEET
    # "unchanged": a host that an earlier test already deployed with the same content
    assert {r["result"] for r in res.values()} <= {"deployed", "unchanged"}, res
    lines = err.splitlines()
    canary_done = next(i for i, ln in enumerate(lines) if "lab-node-01: deployed" in ln or "lab-node-01: unchanged" in ln)
    batch2 = next(i for i, ln in enumerate(lines) if "batch 2/3" in ln)
    assert lines[0].split(" ", 1)[1].startswith("batch 1/3 canary (1 host): lab-node-01")
    assert canary_done < batch2, "the second batch started before the canary finished"
    cur = fleet.current()
    for h in FLEET:
        assert cur[h] and fleet.state(h).current_release.healthy


def test_image_upgrade_of_every_host_then_a_rerun_is_unchanged(fleet):
    before = fleet.current()
    rc, doc, err = fleet.upgrade("--image", "llamacpp=lab-cpu-next", "--serial", "1,25%,100%",
                                 "--max-fail-percentage", "20", "--forks", "4")
    assert rc == 0, err[-3000:]
    assert [len(b) for b in doc["batches"]] == [1, 1, 4]  # canary, 25% of 6 rounds down to 1, then the rest
    after = fleet.current()
    for h in FLEET:
        assert by_host(doc)[h]["result"] == "deployed"
        assert after[h] != before[h]
        assert fleet.state(h).current_release.manifest.image["key"] == "llamacpp:lab-cpu-next"
        assert by_host(doc)[h]["releases"] == {"tiny": after[h]}
    # resume / idempotence: the same command again changes nothing and restarts nothing
    rc, doc, err = fleet.upgrade("--image", "llamacpp=lab-cpu-next", "--serial", "1,100%", "--forks", "6")
    assert rc == 0, err[-3000:]
    assert {h["result"] for h in doc["hosts"]} == {"unchanged"}
    assert fleet.current() == after


def _inventory_with_broken_host(fleet, host: str) -> str:
    """A copy of the lab inventory in which ``host``'s service uses the lab's broken image."""
    dest = fleet.tmp / "inv-broken"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(fleet.inventory, dest)
    services = yaml.safe_load((dest / "group_vars" / "all.yml").read_text())["llmfleet_services"]
    # the broken image never answers /health: a short load timeout keeps the wait for it short
    services = [dict(s, image="llamacpp:lab-broken", health={**(s.get("health") or {}), "load_timeout_s": 15})
                for s in services]
    (dest / "host_vars").mkdir(exist_ok=True)
    (dest / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump({"llmfleet_services": services}))
    return str(dest)


def test_a_failing_host_rolls_back_and_the_threshold_stops_the_next_batch(fleet):
    before = fleet.current()
    inv = _inventory_with_broken_host(fleet, "lab-node-03")
    rc, doc, err = fleet.upgrade("--set", "context=768", "--serial", "1,2,100%", "--max-fail-percentage", "40",
                                 "--forks", "2", inventory=inv)
    assert rc == 1
    assert doc["aborted"] and doc["abort_reason"].startswith("batch 2: 1 of 2 host(s) failed (50%")
    res = by_host(doc)
    assert res["lab-node-01"]["result"] == res["lab-node-02"]["result"] == "deployed"
    assert res["lab-node-03"]["result"] == "rolled_back", res["lab-node-03"]
    for h in ("lab-node-04", "lab-node-05", "lab-node-06"):
        assert res[h]["result"] == "skipped"
    after = fleet.current()
    # the failed host is back on its previous release, and it is healthy; later batches untouched
    assert after["lab-node-03"] == before["lab-node-03"]
    assert fleet.state("lab-node-03").unit == "active"
    assert [after[h] for h in ("lab-node-04", "lab-node-05", "lab-node-06")] == \
        [before[h] for h in ("lab-node-04", "lab-node-05", "lab-node-06")]
    # finished hosts stay on the new release without --rollback-on-abort
    assert after["lab-node-01"] != before["lab-node-01"]
    assert "ABORT: batch 2" in err
    # the local audit log has the upgrade's line
    last = json.loads(fleet.audit_log.read_text().splitlines()[-1])
    assert (last["action"], last["result"]) == ("upgrade", "aborted")

    # the same with --rollback-on-abort: the hosts upgraded before the abort go back too
    before = fleet.current()
    rc, doc, err = fleet.upgrade("--set", "context=640", "--serial", "1,2,100%", "--max-fail-percentage", "40",
                                 "--forks", "2", "--rollback-on-abort", inventory=inv)
    assert rc == 1 and doc["aborted"]
    res = by_host(doc)
    for h in ("lab-node-01", "lab-node-02"):
        assert res[h]["result"] == "rolled_back" and res[h]["rollback"] == "rolled_back", res[h]
    assert fleet.current() == before

    # resume with the cause fixed: the normal inventory, the same change; everything ends deployed
    rc, doc, err = fleet.upgrade("--set", "context=768", "--serial", "1,100%", "--forks", "6")
    assert rc == 0, err[-3000:]
    assert {h["result"] for h in doc["hosts"]} <= {"deployed", "unchanged"}
