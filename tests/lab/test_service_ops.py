"""Day 2 on the lab, through the installed wheel's `llmfleet` script run from a folder that holds only an
inventory: deploy, --check/--diff write no audit record, -v traces remote commands, logs (-n, -f),
stop/start, and a service dropped from the inventory shown as an orphan by status and removed (unit,
containers, releases), audited.

One host of its own (``gpu-p40-01``), tests in file order.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest
import yaml

from llmfleet.release import store as R

pytestmark = pytest.mark.lab

HOST = "gpu-p40-01"
ROOT = "/opt/llmfleet"
UNIT = "llmfleet-tiny.service"


class Project:
    def __init__(self, lab, wheel, tmp):
        self.lab, self.wheel, self.dir = lab, wheel, tmp
        shutil.copytree(lab.inventory_path, tmp / "inventory")  # absolute key and lock paths inside
        self.audit_log = tmp / "local-audit.jsonl"

    def run(self, *args: str, timeout: float = 600):
        env = {"INVOKE_LLMFLEET_SSH_KNOWN_HOSTS": str(self.lab.known_hosts),
               "INVOKE_LLMFLEET_AUDIT_LOG": str(self.audit_log)}
        res = self.wheel.run(args[0], "-i", "inventory/", *args[1:], cwd=self.dir, env=env, timeout=timeout)
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
        return res

    def json(self, *args: str, ok: bool = True):
        res = self.run(*args, "--json")
        assert (res.returncode == 0) == ok, res.stdout[-2000:] + res.stderr[-3000:]
        return json.loads(res.stdout)

    def host_audit(self) -> list[dict]:
        text = self.lab.exec(HOST, ["sh", "-c", f"cat {R.audit_path(ROOT)} 2>/dev/null || true"]).stdout
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def unit_state(self) -> str:
        return self.lab.exec(HOST, ["systemctl", "is-active", UNIT], check=False).stdout.strip()


@pytest.fixture(scope="module")
def proj(lab, installed_wheel, tmp_path_factory):
    lab.ensure_hosts(HOST)
    return Project(lab, installed_wheel, tmp_path_factory.mktemp("project"))


def test_the_installed_wheel_deploys_from_a_folder_with_only_an_inventory(proj):
    doc = proj.json("deploy", "--host", HOST, "--message", "from the wheel")
    (o,) = doc["hosts"]
    assert (o["host"], o["result"]) == (HOST, "deployed"), o["reason"]
    assert doc["unreachable"] == []
    assert proj.unit_state() == "active"


def test_check_and_diff_write_no_audit_record(proj):
    before = len(proj.host_audit())
    local_before = proj.audit_log.read_text().count("\n")
    for flag in ("--check", "--diff"):
        doc = proj.json("deploy", "--host", HOST, flag)
        assert doc["hosts"][0]["result"] == "check"
    assert len(proj.host_audit()) == before
    assert proj.audit_log.read_text().count("\n") == local_before


def test_verbose_prints_each_remote_command_with_its_duration(proj):
    res = proj.run("status", "--host", HOST, "-v", "--no-metrics")
    assert res.returncode == 0, res.stderr
    traced = [line for line in res.stderr.splitlines() if line.startswith(f"{HOST}: [")]
    assert traced and all("s rc=" in line for line in traced), res.stderr[-2000:]
    assert "@@service" in res.stderr or "services" in res.stderr  # the state script itself is shown


def test_logs_are_bounded_and_follow(proj):
    res = proj.run("logs", "--host", HOST, "--service", "tiny", "-n", "5")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert 1 <= len(lines) <= 5
    t0 = time.monotonic()
    res = proj.run("logs", "--host", HOST, "--service", "tiny", "-n", "3", "-f", "--timeout", "4")
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert 1 <= len(res.stdout.splitlines()) and took < 30
    res = proj.run("logs", "--host", HOST, "--service", "nope")
    assert res.returncode == 2 and "no service 'nope'" in res.stderr


def test_stop_and_start(proj):
    doc = proj.json("stop", "--host", HOST, "--service", "tiny")
    assert doc["hosts"][0]["result"] == "stopped"
    assert proj.unit_state() != "active"
    # the unit's stop is a docker stop: the container stays, stopped, and so does the project's network
    stopped = proj.lab.exec(HOST, ["docker", "inspect", "-f", "{{.Id}} {{.State.Status}}", "llmfleet-tiny"]).stdout.split()
    assert stopped[1] == "exited"
    network = proj.lab.exec(HOST, ["docker", "network", "inspect", "-f", "{{.Id}}", "llmfleet-tiny_default"]).stdout
    row = proj.json("status", "--host", HOST, "--no-metrics")["rows"][0]
    assert row["unit"] != "active"
    doc = proj.json("start", "--host", HOST, "--service", "tiny")
    assert doc["hosts"][0]["result"] == "started", doc
    assert doc["hosts"][0]["health"]["tiny"], doc  # the deploy's staged health check passed
    assert proj.unit_state() == "active"
    # the start removed the stopped container before up made a new one on the same network
    ids = proj.lab.exec(HOST, ["docker", "ps", "-aq", "--no-trunc", "--filter", "name=^llmfleet-tiny$"]).stdout.split()
    assert len(ids) == 1 and ids[0] != stopped[0]
    assert proj.lab.exec(HOST, ["docker", "network", "inspect", "-f", "{{.Id}}", "llmfleet-tiny_default"]).stdout == network
    actions = [(r["action"], r["result"]) for r in proj.host_audit()[-2:]]
    assert actions == [("stop", "stopped"), ("start", "started")]


def test_rollback_of_a_group(proj):
    first = proj.json("releases", "--host", HOST)["releases"]
    (current,) = [r["release"] for r in first if r["current"]]
    services = yaml.safe_load((proj.dir / "inventory" / "group_vars" / "all.yml").read_text())["llmfleet_services"]
    services[0]["engine_args"] = ["--ctx-size", "272"]  # a new release to go back from
    hv = proj.dir / "inventory" / "host_vars"
    hv.mkdir(exist_ok=True)
    (hv / f"{HOST}.yml").write_text(yaml.safe_dump({"llmfleet_services": services}))
    doc = proj.json("deploy", "--group", "p40", "-f", "2")
    assert doc["hosts"][0]["result"] == "deployed", doc["hosts"][0]["reason"]
    doc = proj.json("rollback", "--group", "p40")
    (o,) = doc["hosts"]
    assert (o["host"], o["result"], o["releases"]) == (HOST, "rolled_back", {"tiny": current}), o["reason"]


def test_a_service_dropped_from_the_inventory_is_an_orphan_and_remove_cleans_it(proj):
    hv = proj.dir / "inventory" / "host_vars"
    hv.mkdir(exist_ok=True)
    (hv / f"{HOST}.yml").write_text(yaml.safe_dump({"llmfleet_services": []}))
    doc = proj.json("status", "--host", HOST, "--no-metrics")
    assert [(o["host"], o["service"]) for o in doc["orphans"]] == [(HOST, "tiny")]
    res = proj.run("remove", "--host", HOST, "--orphans")  # no terminal and no --yes: refused, nothing done
    assert res.returncode == 2 and "--yes" in res.stderr
    assert proj.unit_state() in ("active", "activating")
    doc = proj.json("remove", "--host", HOST, "--orphans", "--yes")
    (r,) = doc["hosts"]
    assert (r["result"], r["services"]) == ("removed", {"tiny": "removed"}), r
    gone = proj.lab.exec(HOST, ["sh", "-c", f"ls {ROOT}/services; ls /etc/systemd/system/{UNIT}; "
                                "docker ps -aq --filter label=io.llmfleet.service=tiny"], check=False)
    assert gone.stdout.strip() == "" and "No such file" in gone.stderr
    # and the compose project's network, which the unit's stop keeps
    net = proj.lab.exec(HOST, ["docker", "network", "ls", "-q", "--filter", "name=^llmfleet-tiny_default$"])
    assert net.stdout.strip() == ""
    assert proj.unit_state() != "active"
    last = proj.host_audit()[-1]
    assert (last["action"], last["service"], last["result"]) == ("remove", "tiny", "removed")
    doc = proj.json("status", "--host", HOST, "--no-metrics")
    assert doc["orphans"] == []
