"""The simulated fleet answers llmfleet's SSH commands as the recorded lab host did (loopback only)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from llmfleet.errors import RemoteError
from llmfleet.host import ssh
from llmfleet.inventory.ansible import Host
from llmfleet.lab import simfleet
from llmfleet.lab.simfleet import Recording, SimFleet, fleet_inventory, mask

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "bench" / "data" / "simfleet-lab-node.json"


@pytest.mark.parametrize(
    ("text", "masked", "tokens"),
    [
        ("sh -s -- llmfleet-0123456789abcdef /opt/llmfleet", "sh -s -- llmfleet-\x000\x00 /opt/llmfleet",
         ["0123456789abcdef"]),
        ('{"time": "2026-12-01T05:00:01+00:00", "pid": 4242}', '{"time": "\x000\x00", \x001\x00}',
         ["2026-12-01T05:00:01+00:00", '"pid": 4242']),
        ("systemctl is-active llmfleet-tiny", "systemctl is-active llmfleet-tiny", []),
    ],
)
def test_mask_hides_random_tokens_times_and_pids(text, masked, tokens):
    assert mask(text) == (masked, tokens)


def _recording() -> Recording:
    rec = Recording(host="lab-node-01", host_vars={})
    rec.add("sh -s -- llmfleet-00112233aabbccdd /opt/llmfleet", b"#!/bin/sh\necho probe\n", 0,
            "==llmfleet-00112233aabbccdd== begin meta\nx\n==llmfleet-00112233aabbccdd== end meta rc=0\n", "", 0.01)
    rec.add("echo hi", None, 0, "hi\n", "", 0.0)
    rec.add("false", None, 1, "", "nope\n", 0.0)
    return rec


def test_answer_puts_the_callers_mark_back_into_the_recorded_document():
    got = _recording().answer("sh -s -- llmfleet-ffeeddccbbaa9988 /opt/llmfleet", b"#!/bin/sh\necho probe\n")
    assert got is not None
    assert "==llmfleet-ffeeddccbbaa9988== begin meta" in got.stdout
    assert "00112233aabbccdd" not in got.stdout


def test_a_changed_script_or_command_has_no_answer():
    rec = _recording()
    assert rec.answer("sh -s -- llmfleet-ffeeddccbbaa9988 /opt/llmfleet", b"#!/bin/sh\necho probe v2\n") is None
    assert rec.answer("echo hello", None) is None


def test_recording_survives_json_round_trip():
    rec = _recording()
    back = Recording.from_json(rec.to_json())
    assert back.answer("echo hi", None).stdout == "hi\n"
    with pytest.raises(ValueError, match="not a version 1"):
        Recording.from_json('{"version": 99}')


def test_fleet_inventory_puts_every_host_on_its_own_loopback_port():
    doc = fleet_inventory([4001, 4002], {"ansible_user": "deploy", "ansible_port": 22, "ansible_host": "x"})
    grp = doc["all"]["children"]["simfleet"]
    assert grp["hosts"] == {"sim-0001": {"ansible_port": 4001}, "sim-0002": {"ansible_port": 4002}}
    assert grp["vars"] == {"ansible_user": "deploy", "ansible_host": "127.0.0.1"}


@pytest.fixture(scope="module")
def client_key(tmp_path_factory):
    d = tmp_path_factory.mktemp("simkey")
    key = d / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def _host(name: str, port: int, key: Path) -> Host:
    return Host(name=name, vars={"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "root",
                                 "ansible_ssh_private_key_file": str(key)})


def _known(tmp_path: Path, fleet: SimFleet) -> dict:
    kh = tmp_path / "known_hosts"
    kh.write_text(simfleet.known_hosts_text(fleet.ports, fleet.host_key.get_name(), fleet.host_key.get_base64()))
    return {"known_hosts": str(kh), "connect_timeout": 10, "command_timeout": 20}


def test_each_simulated_host_answers_over_real_ssh_and_counts_unknown_commands(tmp_path, client_key):
    with SimFleet(_recording(), hosts=3, authorized_key=simfleet.public_key(f"{client_key}.pub"),
                  latency=0) as fleet:
        assert len(set(fleet.ports)) == 3
        config = _known(tmp_path, fleet)
        for i, port in enumerate(fleet.ports):
            with ssh.connect(_host(f"sim-{i}", port, client_key), config=config) as remote:
                assert remote.run("echo hi").stdout == "hi\n"
                bad = remote.run("false")
                assert (bad.rc, bad.stderr) == (1, "nope\n")
        with ssh.connect(_host("sim-0", fleet.ports[0], client_key), config=config) as remote:
            got = remote.run("rm -rf /opt/llmfleet")
        assert got.rc == 127 and "no recording" in got.stderr
        counters = fleet.counters.snapshot()
        assert counters["connections"] == 4 and counters["unmatched"] == 1


def test_a_key_the_fleet_does_not_know_is_refused(tmp_path, client_key):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    with SimFleet(_recording(), hosts=1, authorized_key=simfleet.public_key(f"{client_key}.pub"),
                  latency=0) as fleet:
        with pytest.raises(RemoteError, match="authentication failed"):
            ssh.connect(_host("sim-0", fleet.ports[0], other), config=_known(tmp_path, fleet))


def test_the_recorded_lab_host_probe_parses_as_the_lab_host(tmp_path, client_key):
    """The committed recording is a real lab host's answer to the current probe (re-record when it changes)."""
    from llmfleet.host import facts
    from llmfleet.host.probe import probe_sh

    rec = Recording.load(RECORDING)
    probe_sha = hashlib.sha256(probe_sh()).hexdigest()
    if not any(e.stdin_sha256 == probe_sha for e in rec.entries.values()):
        pytest.skip(f"{RECORDING.name} predates the current probe script: "
                    "run `python bench/fleet_scale_bench.py record`")
    with SimFleet(rec, hosts=1, authorized_key=simfleet.public_key(f"{client_key}.pub"), latency=0) as fleet:
        host = _host("sim-0001", fleet.ports[0], client_key)
        host.vars["ansible_user"] = rec.host_vars.get("ansible_user", "root")
        host.vars["ansible_become"] = rec.host_vars.get("ansible_become", False)
        with ssh.connect(host, config=_known(tmp_path, fleet)) as remote:
            services = rec.host_vars.get("llmfleet_services") or []
            found = facts.gather(remote, root=rec.host_vars.get("llmfleet_root", "/opt/llmfleet"),
                                 model_paths=[s["model_path"] for s in services])
        assert fleet.counters.snapshot()["unmatched"] == 0
    assert [g.name for g in found.gpus] == ["NVIDIA A10"]
    assert found.docker.server_version and not found.errors
