"""invoke models.push in the lab: a model pushed to four hosts (two from this machine, two host to host),
verified on each; a copy cut in the middle (its sshd session killed) fails that host in one line, leaves its
model_path as it was, and a re-run resumes; a tampered copy is refused by the preflight naming the file; a
second push is skipped in one round trip per host; status shows each host's model as verified."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
HOSTS = ["lab-node-01", "lab-node-02", "lab-node-03", "lab-node-04"]
MP = "/srv/models/push-test/model.gguf"
BLOCKS = 48  # MiB of model after its 4-byte magic
SIZE = 4 + BLOCKS * 2**20


def invoke(tmp: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(tmp / "known_hosts"),
               INVOKE_LLMFLEET_AUDIT_LOG=str(tmp / "local-audit.jsonl"), COLUMNS="250")
    argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), args[0], "-i", str(tmp / "inventory"),
            *args[1:]]
    return subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=timeout, env=env)


def model_file(path: Path, seed: bytes) -> str:
    """A GGUF-looking file (the magic, then deterministic bytes); its sha256."""
    block = hashlib.sha256(seed).digest() * (2**20 // 32)
    with path.open("wb") as fh:
        fh.write(b"GGUF")
        for i in range(BLOCKS):
            fh.write(bytes([i % 251]) + block[1:])
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    lab.ensure_hosts(*HOSTS)
    shutil.copytree(lab.inventory_path, tmp / "inventory")
    shutil.copy(lab.known_hosts, tmp / "known_hosts")
    src = tmp / "model.gguf"
    sha = model_file(src, b"one")
    (tmp / "inventory" / "group_vars" / "lab_fleet.yml").write_text(yaml.safe_dump({"llmfleet_services": [{
        "name": "pushed", "engine": "llamacpp", "model": "tiny-qwen2", "model_path": MP, "image": "llamacpp:lab-cpu",
        "port": 8000, "context": 512, "model_source": str(src)}]}))
    return tmp, src, sha


def outcomes(res: subprocess.CompletedProcess) -> dict[str, dict]:
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return {o["host"]: o for o in json.loads(res.stdout)["hosts"]}


def host_sha(lab, host: str) -> str:
    return lab.exec(host, ["sha256sum", MP]).stdout.split()[0]


def test_push_to_four_hosts_from_here_then_host_to_host(lab, fleet):
    tmp, _src, sha = fleet
    res = invoke(tmp, "models.push", "--host", "lab-node-01,lab-node-02", "--service", "pushed", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    got = outcomes(res)
    for h in HOSTS[:2]:
        assert (got[h]["result"], got[h]["bytes_sent"]) == ("pushed", SIZE), got[h]
    res = invoke(tmp, "models.push", "--host", "lab-node-03,lab-node-04", "--service", "pushed", "--from",
                 "lab-node-01", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    got = outcomes(res)
    for h in HOSTS[2:]:
        assert (got[h]["result"], got[h]["bytes_sent"], got[h]["source"]) == ("pushed", SIZE, "host lab-node-01")
    for h in HOSTS:
        assert host_sha(lab, h) == sha
        man = json.loads(lab.exec(h, ["cat", MP + ".llmfleet.json"]).stdout)
        assert man["files"][0]["sha256"] == sha and man["verified_at"]
        mode = lab.exec(h, ["stat", "-c", "%a %u", MP]).stdout.split()
        assert mode == ["644", "0"]
        assert not lab.exec(h, ["test", "-e", MP + ".llmfleet.part"], check=False).returncode == 0
    # the one-use key is gone from the targets, its folder from the source
    for h in HOSTS[2:]:
        keys = lab.exec(h, ["cat", "/home/deploy/.ssh/authorized_keys"]).stdout
        assert "llmfleet-transfer" not in keys
    assert "llmfleet-peer" not in lab.exec("lab-node-01", ["sh", "-c", "ls -a /tmp /root"]).stdout
    # the preflight finds every copy verified
    res = invoke(tmp, "preflight", "--host", ",".join(HOSTS), "--service", "pushed", "--json")
    for rep in json.loads(res.stdout)["reports"]:
        check = next(c for c in rep["checks"] if c["id"] == "model-verified")
        assert check["status"] == "pass" and "verified 20" in check["message"], check
    # a second push: one round trip per host, nothing sent
    res = invoke(tmp, "models.push", "--host", ",".join(HOSTS), "--service", "pushed", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    for h, o in outcomes(res).items():
        assert (o["result"], o["round_trips"], o["bytes_sent"]) == ("verified", 1, 0), (h, o)
    # status: the model each host holds, verified
    res = invoke(tmp, "status", "--host", ",".join(HOSTS), "--no-metrics", "--json")
    rows = json.loads(res.stdout)["rows"]
    assert {r["host"]: r["model"]["state"] for r in rows if r["service"] == "pushed"} == dict.fromkeys(HOSTS, "verified")


def test_a_cut_copy_fails_one_host_in_one_line_and_a_rerun_resumes(lab, fleet):
    tmp, _src, old_sha = fleet
    new = tmp / "model-v2.gguf"
    new_sha = model_file(new, b"two")
    victim = "lab-node-03"
    part = MP + ".llmfleet.part"
    stop = threading.Event()

    def cut() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not stop.is_set():
            size = lab.exec(victim, ["sh", "-c", f"stat -c %s {part} 2>/dev/null || echo 0"], check=False).stdout.strip()
            if size.isdigit() and int(size) > 8 * 2**20:
                # the transfer's own sshd session (the deploy user's), as a dropped connection
                lab.exec(victim, ["pkill", "-9", "-f", "sshd: deploy"], check=False)
                return
            time.sleep(0.3)

    killer = threading.Thread(target=cut)
    killer.start()
    try:
        res = invoke(tmp, "models.push", "--host", "lab-node-02,lab-node-03", "--service", "pushed", "--source",
                     str(new), "--limit-rate", "3M", "--json")
    finally:
        stop.set()
        killer.join()
    assert res.returncode == 1
    got = outcomes(res)
    assert got["lab-node-02"]["result"] == "pushed"
    err = got[victim]["error"]
    assert got[victim]["result"] == "failed" and "\n" not in err
    assert err.startswith(f"host {victim}: copy of {new} to {part} cut at ") and "run it again to resume" in err
    assert res.stderr.strip().splitlines()[-1] == f"error: 1 of 2 push(es) failed: {victim}"
    # nothing changed at model_path: the old copy, still verified; only the staging file holds the new bytes
    assert host_sha(lab, victim) == old_sha
    held = int(lab.exec(victim, ["stat", "-c", "%s", part]).stdout)
    assert 0 < held < SIZE
    res = invoke(tmp, "preflight", "--host", victim, "--service", "pushed", "--json")
    check = next(c for c in json.loads(res.stdout)["reports"][0]["checks"] if c["id"] == "model-verified")
    assert check["status"] == "pass"
    # again: it resumes from what the host holds
    res = invoke(tmp, "models.push", "--host", victim, "--service", "pushed", "--source", str(new), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    o = outcomes(res)[victim]
    assert o["result"] == "pushed" and o["bytes_resumed"] == held and o["bytes_sent"] < SIZE
    assert o["bytes_sent"] + o["bytes_resumed"] == SIZE
    assert host_sha(lab, victim) == new_sha


def test_a_tampered_model_is_refused_by_the_preflight_and_a_push_repairs_it(lab, fleet):
    tmp, src, sha = fleet
    victim = "lab-node-04"
    lab.exec(victim, ["sh", "-c", f"printf X | dd of={MP} bs=1 seek=4096 conv=notrunc 2>/dev/null"])
    res = invoke(tmp, "preflight", "--host", victim, "--service", "pushed", "--json")
    assert res.returncode == 1
    check = next(c for c in json.loads(res.stdout)["reports"][0]["checks"] if c["id"] == "model-verified")
    assert check["status"] == "fail"
    assert check["message"].startswith(f"model file {MP} changed since it was verified (size/mtime) or its sha256 "
                                       "does not match its manifest")
    res = invoke(tmp, "status", "--host", victim, "--no-metrics")
    assert "CHANGED" in res.stdout
    res = invoke(tmp, "models.push", "--host", victim, "--service", "pushed", "--json")
    o = outcomes(res)[victim]
    assert res.returncode == 0 and o["result"] == "pushed" and o["bytes_sent"] == SIZE
    assert host_sha(lab, victim) == sha


def test_a_push_to_four_hosts_from_here_sends_the_file_once_and_the_hosts_seed_each_other(lab, fleet):
    """Seeding (on by default: --forks 4, four hosts): this machine sends the file to one host; each host
    that ends with a verified copy sends it on, one copy at a time, until all four hold it."""
    tmp, _src, _sha = fleet
    new = tmp / "model-v3.gguf"
    new_sha = model_file(new, b"three")
    res = invoke(tmp, "models.push", "--host", ",".join(HOSTS), "--service", "pushed", "--source", str(new),
                 "--forks", "4", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    got = outcomes(res)
    here = f"{new} (this machine)"
    sent: dict[str, int] = {}
    for h in HOSTS:
        assert (got[h]["result"], got[h]["bytes_sent"]) == ("pushed", SIZE), got[h]
        for src, n in got[h]["bytes_by_source"].items():
            sent[src] = sent.get(src, 0) + n
        assert host_sha(lab, h) == new_sha
    assert sent.pop(here) == SIZE  # the controller's uplink carried the file once
    assert sum(sent.values()) == 3 * SIZE and set(sent) <= {f"host {h}" for h in HOSTS}
    seeded = [h for h in HOSTS if got[h]["source"] != here]
    for h in seeded:  # the manifest names the host it came from, and where that host's copy came from
        man = json.loads(lab.exec(h, ["cat", MP + ".llmfleet.json"]).stdout)
        assert man["source"]["host"] == got[h]["source"].removeprefix("host ") and man["source"]["origin"]["path"]
    # --no-seed: every host from here again
    newer = tmp / "model-v4.gguf"
    model_file(newer, b"four")
    res = invoke(tmp, "models.push", "--host", ",".join(HOSTS[:3]), "--service", "pushed", "--source", str(newer),
                 "--forks", "4", "--no-seed", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert {o["source"] for o in outcomes(res).values()} == {f"{newer} (this machine)"}
