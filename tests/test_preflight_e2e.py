"""Facts and preflight end to end against a real OpenSSH server on loopback (this machine as the host).

This machine has no NVIDIA driver, so it is the "nvidia-smi missing" partial probe: the facts must
still come back in one round trip, and the preflight must name the failure and exit 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmfleet.host import facts as facts_mod
from llmfleet.host.ssh import connect
from llmfleet.images import lock as images
from llmfleet.inventory.ansible import Host, load_inventory, settings_for
from llmfleet.release.preflight import preflight_host

LLMFLEET = str(Path(sys.executable).parent / "llmfleet")


@pytest.fixture
def model_file(tmp_path):
    p = tmp_path / "models" / "tiny.gguf"
    p.parent.mkdir()
    p.write_bytes(b"GGUF" + b"\0" * 4092)
    return p


@pytest.fixture
def inventory(sshd, tmp_path, model_file):
    inv = tmp_path / "inv"
    inv.mkdir()
    service = {"name": "tiny", "engine": "llamacpp", "model": "qwen2.5-7b-instruct", "model_path": str(model_file),
               "image": "llamacpp:b5000-cu122", "quant": "q4_k_m", "port": 18777, "context": 4096}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"test-host": {
        "ansible_host": "127.0.0.1", "ansible_port": sshd.port, "ansible_user": "root",
        "ansible_ssh_private_key_file": str(sshd.client_key),
        "llmfleet_gpu": "Tesla V100-SXM2-32GB",
        "llmfleet_root": str(tmp_path / "root"),
        "llmfleet_services": [service]}}}}))
    return inv


def test_gather_is_one_round_trip_and_names_what_is_missing(sshd, tmp_path, model_file):
    host = Host(name="test-host", vars={"ansible_host": "127.0.0.1", "ansible_port": sshd.port,
                                        "ansible_user": "root", "ansible_ssh_private_key_file": str(sshd.client_key)})
    with connect(host, config={"known_hosts": str(tmp_path / "kh")}, accept_new_host_keys=True) as remote:
        f = facts_mod.gather(remote, root=str(tmp_path / "root"), model_paths=[str(model_file), "/nonexistent/m"])
        assert remote.round_trips == 1
    assert f.host == "test-host" and f.probe_version == 4 and f.kernel
    assert f.releases == {} and f.releases_read and not any("release state" in e for e in f.errors)  # none yet
    # each section says how long it took on the host (the slowest is what a probe waits for)
    assert {"docker_info", "meminfo", "release_state", "model 0", "df docker_root"} <= set(f.probe_seconds)
    assert all(0 <= t < 60 for t in f.probe_seconds.values())
    assert f.gpus == [] and "nvidia-smi not found on PATH and no NVIDIA driver loaded" in f.errors
    models = {m.path: m for m in f.models}
    assert models[str(model_file)].magic == "GGUF" and models[str(model_file)].size_bytes == 4096
    assert models["/nonexistent/m"].kind == "missing"
    assert f.ram_total_mib and f.ram_total_mib > 0
    assert sshd.port in f.ports  # the SSH server we came in through is listening
    assert f.disk("docker_root") is not None


def test_preflight_host_reports_the_missing_driver(inventory, tmp_path):
    inv = load_inventory(str(inventory))
    host = inv.hosts["test-host"]
    found, reports = preflight_host(host, settings_for(host), lock=images.ImageLock(),
                                    config={"known_hosts": str(tmp_path / "kh")}, accept_new_host_keys=True)
    assert found is not None
    (r,) = reports
    checks = {c.id: c for c in r.checks}
    assert not r.ok
    assert checks["gpu"].status == "fail" and "nvidia-smi not found" in checks["gpu"].message
    assert checks["image"].status == "fail" and "images.pin" in checks["image"].fix
    assert checks["model-files"].status == "pass" and "GGUF" in checks["model-files"].message
    assert checks["port"].status == "pass"
    assert checks["plan"].status == "pass"  # planned on the inventory's llmfleet_gpu


def test_unreachable_host_is_a_failed_ssh_check(tmp_path):
    host = Host(name="gone", vars={"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_user": "root"})
    from llmfleet.inventory.services import HostSettings

    found, reports = preflight_host(host, HostSettings(), lock=images.ImageLock(),
                                    config={"known_hosts": str(tmp_path / "kh"), "connect_timeout": 3})
    assert found is None
    (r,) = reports
    assert [(c.id, c.status) for c in r.checks] == [("ssh", "fail")] and "cannot connect" in r.checks[0].message


def _cli(inventory: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "invoke.yaml").write_text(yaml.safe_dump({"llmfleet": {
        "inventory": str(inventory), "ssh": {"known_hosts": str(tmp_path / "kh")}}}))
    return subprocess.run([LLMFLEET, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_cli_preflight_json_and_exit_code(inventory, tmp_path):
    res = _cli(inventory, tmp_path, "preflight", "--host", "test-host", "--json", "--accept-new-host-keys")
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    assert doc["unreachable"] == []
    (data,) = doc["reports"]  # one shape whatever the number of hosts
    assert (data["host"], data["service"], data["ok"]) == ("test-host", "tiny", False)
    statuses = {c["id"]: c["status"] for c in data["checks"]}
    assert statuses["gpu"] == "fail" and statuses["model-files"] == "pass"
    assert all(set(c) == {"id", "status", "message", "fix"} for c in data["checks"])


def test_cli_preflight_table_and_unknown_service(inventory, tmp_path):
    res = _cli(inventory, tmp_path, "preflight", "--host", "test-host", "--accept-new-host-keys")
    assert res.returncode == 1
    assert "FAIL" in res.stdout and "preflight failed: test-host/tiny" in res.stdout
    res = _cli(inventory, tmp_path, "preflight", "--host", "test-host", "--service", "nope")
    assert res.returncode == 2 and "has no service 'nope' (services: tiny)" in res.stderr


def test_cli_facts_json(inventory, tmp_path):
    res = _cli(inventory, tmp_path, "facts", "--host", "test-host", "--json", "--accept-new-host-keys")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["unreachable"] == []
    (data,) = doc["hosts"]
    assert data["host"] == "test-host" and data["gpus"] == []
    assert any("nvidia-smi not found" in e for e in data["errors"])
    res = _cli(inventory, tmp_path, "facts", "--host", "test-host")
    assert res.returncode == 0 and "facts test-host" in res.stdout and "nvidia-smi not found" in res.stdout


def test_cli_preflight_group_checks_hosts_in_parallel_and_keeps_order(inventory, tmp_path):
    data = yaml.safe_load((inventory / "hosts.yml").read_text())
    one = data["all"]["hosts"].pop("test-host")
    data["all"]["children"] = {"fleet": {"hosts": {"b-host": one, "a-host": dict(one),
                                                   "gone-host": dict(one, ansible_port=1)}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    res = _cli(inventory, tmp_path, "preflight", "--group", "fleet", "--json", "--accept-new-host-keys")
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    got = doc["reports"]
    assert [r["host"] for r in got] == ["b-host", "a-host", "gone-host"]
    assert [u["host"] for u in doc["unreachable"]] == ["gone-host"] and doc["unreachable"][0]["error"]
    assert [c["id"] for c in got[2]["checks"]] == ["ssh"] and got[2]["checks"][0]["status"] == "fail"
    assert {c["id"] for c in got[0]["checks"]} >= {"gpu", "plan", "port"}
