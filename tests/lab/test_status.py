"""status / releases / audit in the lab, with one host down; and the runbooks' read-only commands run
verbatim against the lab (they must parse, run and never end in a traceback or a usage error).

The runbook commands are the complete ones, from fenced blocks; inline mentions in the prose are
checked for existence only (tests/test_runbooks.py)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from llmfleet.release.deploy import DeployOptions, deploy_host
from tests.test_runbooks import RUNBOOKS, commands

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
HOSTS = ["lab-node-04", "lab-node-05", "lab-node-06"]
DOWN = "lab-node-06"
READ_ONLY = {"status", "releases", "audit", "lock.status", "plan", "preflight", "facts"}


def relaxed_inventory(lab, dest: Path) -> str:
    """A copy of the test lab's inventory with a decode floor of 0.5 tok/s.

    Every lab host shares this machine's two cores with other test runs; under that load the tiny
    model's decode speed varies far more than on a real card. The floor itself is tested by
    tests/lab/test_deploy.py; these tests are about the fleet around it.
    """
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(lab.inventory_path, dest)
    path = dest / "group_vars" / "all.yml"
    data = yaml.safe_load(path.read_text())
    data["llmfleet_services"] = [
        dict(s, health=dict(s.get("health") or {}, min_tokps=0.5)) for s in data["llmfleet_services"]]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(dest)


def invoke(lab, tmp: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(lab.known_hosts),
               INVOKE_LLMFLEET_AUDIT_LOG=str(tmp / "local-audit.jsonl"), COLUMNS="250")
    # run from the test's folder (a runbook's `facts --out FILE` writes there, not into the checkout);
    # --search-root finds the project's tasks.py
    argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), args[0], "-i", str(tmp / "inventory"),
            *args[1:]]
    return subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def deployed(lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("status")
    lab.ensure_hosts(*HOSTS)
    config = dict(lab.config, audit_log=str(tmp / "local-audit.jsonl"))
    inventory = relaxed_inventory(lab, tmp / "inventory")
    for h in HOSTS:
        o = deploy_host(inventory, h, config=config, options=DeployOptions(who="tester"),
                        log=lambda line: None)
        assert o.result in ("deployed", "unchanged"), (h, o.result, o.reason)
    return tmp


def test_status_with_one_host_down(lab, deployed):
    lab.stop_host(DOWN)
    try:
        t0 = time.monotonic()
        res = invoke(lab, deployed, "status", "--host", ",".join(HOSTS), "--json", "--timeout", "10")
        took = time.monotonic() - t0
        assert "Traceback" not in res.stderr
        assert res.returncode == 1
        assert res.stderr.strip().splitlines()[-1].startswith(f"error: 1 of 3 host(s) unreachable: {DOWN} (cannot connect")
        doc = json.loads(res.stdout)
        rows = {r["host"]: r for r in doc["rows"]}
        assert [u["host"] for u in doc["unreachable"]] == [DOWN] and "cannot connect" in doc["unreachable"][0]["error"]
        assert rows[DOWN]["unit"] == "unreachable" and "cannot connect" in rows[DOWN]["note"]
        for h in HOSTS[:2]:
            r = rows[h]
            assert (r["service"], r["engine"], r["unit"], r["health"]) == ("tiny", "llamacpp", "active", "healthy")
            assert r["card"] == "NVIDIA A10"  # from the host's nvidia-smi (the lab's simulator)
            assert r["release"] and r["digest"].startswith("sha256:")
            assert r["tokps"] and r["tokps"] > 0
            m = r["metrics"]
            assert m is not None, r["note"]
            assert m["requests_running"] == 0 and m["generation_tokens_total"] > 0
        assert took < 60
        # the table for people says the same
        res = invoke(lab, deployed, "status", "--host", ",".join(HOSTS), "--timeout", "10")
        assert res.returncode == 1 and "unreachable" in res.stdout and "NVIDIA A10" in res.stdout
    finally:
        lab.start_host(DOWN)
    res = invoke(lab, deployed, "status", "--host", DOWN, "--json")
    assert res.returncode == 0, res.stderr
    (row,) = json.loads(res.stdout)["rows"]
    assert row["unit"] == "active"  # the enabled unit came back with the host


def test_releases_and_audit_from_the_host(lab, deployed):
    host = HOSTS[0]
    res = invoke(lab, deployed, "releases", "--host", host, "--json")
    assert res.returncode == 0, res.stderr
    rels = json.loads(res.stdout)["releases"]
    assert rels and sum(r["current"] for r in rels) == 1
    cur = next(r for r in rels if r["current"])
    assert cur["health"] == "healthy" and cur["who"] and cur["digest"].startswith("sha256:")
    res = invoke(lab, deployed, "audit", "--host", host, "-n", "3", "--json")
    assert res.returncode == 0, res.stderr
    recs = json.loads(res.stdout)["records"]
    assert 1 <= len(recs) <= 3
    assert recs[-1]["host"] == host and recs[-1]["action"] in ("deploy", "rollback")


STAGING = "gpu-bare-08"


def runbook_commands() -> list[tuple[str, str]]:
    out = []
    for p in sorted(RUNBOOKS.glob("*.md")):
        for cmd in commands(p.read_text(), fenced_only=True):
            argv = shlex.split(cmd)
            if argv[1] in READ_ONLY or "--check" in argv:
                out.append((p.name, cmd))
    return out


@pytest.mark.parametrize(("doc", "cmd"), runbook_commands(), ids=[f"{d}:{c}" for d, c in runbook_commands()])
def test_runbook_read_only_command_runs_in_the_lab(lab, deployed, doc, cmd):
    argv = shlex.split(cmd)[1:]
    if "--bundle" in argv:  # the runbook made this bundle in an earlier step: make it here, once
        name = argv[argv.index("--bundle") + 1]
        if not (deployed / name / "bundle.json").is_file():
            group = argv[argv.index("--group") + 1] if "--group" in argv else None
            # with the packages provisioning installs, as the runbook's bare hosts need (a bare lab host,
            # not provisioned, downloads them: tests/lab/test_provision_offline.py)
            lab.ensure_hosts(STAGING)
            made = invoke(lab, deployed, "bundle.create", name, *(["--group", group] if group else []),
                          "--mirror", f"{lab.registry_inner}={lab.registry}", "--packages-from", STAGING,
                          timeout=300)
            assert made.returncode == 0, made.stderr[-2000:]
    res = invoke(lab, deployed, *argv, timeout=300)
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-3000:]
    assert res.returncode in (0, 1), f"{doc}: `{cmd}` exited {res.returncode}: {out[-2000:]}"
