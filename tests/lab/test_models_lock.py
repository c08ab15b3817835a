"""One writer per host, in the lab: models.push takes the host's deploy lock as deploys do.

Three pushes of different files to one host and one model path at once: the first writes, one that will
not wait is refused in one line naming it, one that waits pushes after it; a deploy meanwhile is refused
naming the push; the file left is whole and verified. A push during a deploy (the deploy lock held by a
deploy of another controller) is refused naming it, or waits and then pushes. A push whose staging copy
another writer took after its lock was broken says so, not "cut ... run it again to resume"."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from llmfleet.release import store

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
HOST = "lab-node-01"
ROOT = "/opt/llmfleet"
MP = "/srv/models/lock-test/model.gguf"
MIB = 24  # MiB of model after its magic: at --limit-rate 1M, a copy that holds the lock for about 24 s


def invoke(tmp: Path, *args: str, timeout: float = 600, popen: bool = False):
    env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(tmp / "known_hosts"),
               INVOKE_LLMFLEET_AUDIT_LOG=str(tmp / "local-audit.jsonl"), COLUMNS="250")
    argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), args[0], "-i", str(tmp / "inventory"),
            *args[1:]]
    if popen:
        return subprocess.Popen(argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=timeout, env=env)


def model_file(path: Path, seed: bytes) -> str:
    block = hashlib.sha256(seed).digest() * (2**20 // 32)
    with path.open("wb") as fh:
        fh.write(b"GGUF")
        for i in range(MIB):
            fh.write(bytes([i % 251]) + block[1:])
    return hashlib.sha256(path.read_bytes()).hexdigest()


def outcome(stdout: str) -> dict:
    (o,) = json.loads(stdout)["hosts"]
    return o


def finished(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert "Traceback" not in err, err[-3000:]
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models-lock")
    lab.ensure_hosts(HOST)
    shutil.copytree(lab.inventory_path, tmp / "inventory")
    shutil.copy(lab.known_hosts, tmp / "known_hosts")
    served = yaml.safe_load((REPO / "inventory/lab/group_vars/all.yml").read_text())["llmfleet_services"][0]
    (tmp / "inventory" / "group_vars" / "lab_fleet.yml").write_text(yaml.safe_dump({"llmfleet_services": [
        {"name": "locked", "engine": "llamacpp", "model": "tiny-qwen2", "model_path": MP, "image": "llamacpp:lab-cpu",
         "port": 8001, "context": 512},
        # a service of its own, never deployed by other tests: its deploy here always has work to do
        {**served, "name": "lockdeploy", "port": 8010}]}))
    files = {}
    for name in ("a", "b", "c", "d", "e"):
        files[name] = (tmp / f"{name}.gguf", model_file(tmp / f"{name}.gguf", name.encode()))
    return tmp, files


def host_sha(lab) -> str:
    """The sha256 of the model on the host ("" while there is none)."""
    return (lab.exec(HOST, ["sh", "-c", f"sha256sum {MP} 2>/dev/null"], check=False).stdout.split() or [""])[0]


def holder_now(lab) -> dict | None:
    _held, holder = store.parse_lock_status(lab.exec(HOST, ["sh", "-c", store.lock_status_script(ROOT)]).stdout)
    return holder


def wait_for_holder(lab, action: str, proc: subprocess.Popen) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        h = holder_now(lab)
        if h and h.get("action") == action:
            return h
        time.sleep(0.2)
    raise AssertionError(f"no {action} ever held the lock of {HOST} (exit {proc.poll()})")


def push_argv(src: Path, *more: str) -> list[str]:
    return ["models.push", "--host", HOST, "--service", "locked", "--source", str(src), "--json", *more]


def test_concurrent_pushes_and_a_deploy_one_writes_the_others_wait_or_are_refused_naming_it(lab, fleet):
    tmp, files = fleet
    (a, _sha_a), (b, sha_b), (c, _sha_c) = files["a"], files["b"], files["c"]
    first = invoke(tmp, *push_argv(a, "--limit-rate", "1M"), popen=True)
    try:
        holder = wait_for_holder(lab, "models.push", first)
        assert holder["message"] == f"{MP} from {a} (this machine)"
        waiter = invoke(tmp, *push_argv(b, "--lock-wait", "300"), popen=True)
        refused = invoke(tmp, *push_argv(c, "--lock-wait", "0"))
        deploy = invoke(tmp, "deploy", "--host", HOST, "--service", "lockdeploy", "--json")
        status = invoke(tmp, "lock.status", "--host", HOST, "--json")
    finally:
        rc1, out1, _ = finished(first)
    rc2, out2, err2 = finished(waiter)
    # the first writes its copy whole
    assert rc1 == 0 and outcome(out1)["result"] == "pushed", out1
    # one that will not wait: one line naming the writer that holds the host
    assert refused.returncode == 1
    o = outcome(refused.stdout)
    assert o["result"] == "failed" and o["refused"] and "\n" not in o["error"], o
    assert o["error"].startswith(f"host {HOST}: {MP}: not pushed: deploy lock held by ")
    assert f"(pid {holder['pid']}) since {holder['time']}" in o["error"]
    assert f"for models.push: {MP} from {a} (this machine); wait, or inspect with `invoke lock.status" in o["error"]
    assert f"FAILED {o['error']}" in refused.stderr
    # a deploy meanwhile: refused naming the push, nothing switched
    assert deploy.returncode == 1
    (d,) = json.loads(deploy.stdout)["hosts"]
    assert d["result"] == "refused" and f"for models.push: {MP}" in d["reason"], d
    assert "models.push" in status.stdout
    # one that waits: it pushes once the first has committed and unlocked
    assert rc2 == 0, err2[-2000:]
    w = outcome(out2)
    assert w["result"] == "pushed" and w["lock_wait_s"] > 0 and f"for models.push: {MP} from {a}" in w["lock_waited_for"]
    assert "waiting up to 300 s" in err2
    # one whole, verified file: the last writer's; no staging left, the lock free
    assert host_sha(lab) == sha_b
    man = json.loads(lab.exec(HOST, ["cat", MP + ".llmfleet.json"]).stdout)
    assert man["files"][0]["sha256"] == sha_b
    left = lab.exec(HOST, ["sh", "-c", f"ls {MP}.llmfleet.part* 2>/dev/null; true"]).stdout.strip()
    assert left == "" and holder_now(lab) is None
    res = invoke(tmp, "preflight", "--host", HOST, "--service", "locked", "--json")
    check = next(c for c in json.loads(res.stdout)["reports"][0]["checks"] if c["id"] == "model-verified")
    assert check["status"] == "pass", check
    # the host's audit trail: the refusal, both pushes, the refused deploy
    audit = [json.loads(ln) for ln in lab.exec(HOST, ["cat", f"{ROOT}/audit.jsonl"]).stdout.splitlines()]
    pushes = [r["result"] for r in audit if r["action"] == "models.push" and r.get("model_path") == MP]
    assert pushes[-3:] == ["refused", "pushed", "pushed"]
    last = next(r for r in reversed(audit) if r["action"] == "models.push" and r.get("model_path") == MP)
    assert last["lock_wait_s"] > 0


def test_a_push_during_a_deploy_is_refused_naming_it_or_waits_and_pushes(lab, fleet):
    tmp, files = fleet
    (d, sha_d) = files["d"]
    before = host_sha(lab)
    # a deploy from another controller holds the host (the lock exactly as deploys take it)
    token = "de" * 16
    deployer = store.holder_document(token=token, who="ops@ctl2", origin="ops@ctl2", action="deploy",
                                     message="canary", now=datetime.now(UTC), pid=31337)
    got = lab.exec(HOST, ["sh", "-c", store.lock_acquire_script(ROOT, deployer)])
    assert store.parse_lock_acquire(got.returncode, got.stdout).acquired
    try:
        res = invoke(tmp, *push_argv(d, "--lock-wait", "0"))
        assert res.returncode == 1
        o = outcome(res.stdout)
        assert o["refused"] and o["error"].startswith(
            f"host {HOST}: {MP}: not pushed: deploy lock held by ops@ctl2 from ops@ctl2 (pid 31337) since ")
        assert "for deploy: canary; wait, or inspect" in o["error"] and o["bytes_sent"] == 0
        assert host_sha(lab) == before  # nothing written
        # a push that waits: the deploy ends (its lock released) while it waits, then it pushes
        waiter = invoke(tmp, *push_argv(d, "--lock-wait", "300"), popen=True)
        seen: list[str] = []
        waiting = threading.Event()

        def read() -> None:
            for line in waiter.stderr:
                seen.append(line)
                if "waiting up to 300 s" in line:
                    waiting.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert waiting.wait(120), "".join(seen)[-2000:]
    finally:
        released = lab.exec(HOST, ["sh", "-c", store.lock_release_script(ROOT, token)], check=False)
    assert store.parse_lock_release(released.stdout)
    out = waiter.stdout.read()
    assert waiter.wait(300) == 0, "".join(seen)[-2000:]
    reader.join(30)
    w = outcome(out)
    assert w["result"] == "pushed" and w["lock_wait_s"] > 0 and "for deploy: canary" in w["lock_waited_for"]
    assert host_sha(lab) == sha_d and holder_now(lab) is None


def test_a_push_whose_staging_copy_another_writer_took_says_so(lab, fleet):
    """The lock of a slow push is broken under it (`lock.release --yes`) and another push takes the host:
    the slow one, finding its staging copy taken, says so in one line instead of "cut ... resume"; the
    other's copy is whole and verified."""
    tmp, files = fleet
    (a, _), (e, sha_e) = files["a"], files["e"]
    slow = invoke(tmp, *push_argv(a, "--limit-rate", "1M"), popen=True)
    try:
        wait_for_holder(lab, "models.push", slow)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # its copy has begun
            size = lab.exec(HOST, ["sh", "-c", f"stat -c %s {MP}.llmfleet.part 2>/dev/null || echo 0"]).stdout.strip()
            if size.isdigit() and int(size) > 2**20:
                break
            time.sleep(0.2)
        broke = invoke(tmp, "lock.release", "--host", HOST, "--yes")
        assert broke.returncode == 0, broke.stderr
        other = invoke(tmp, *push_argv(e, "--lock-wait", "0"))
    finally:
        rc, out, _err = finished(slow)
    assert other.returncode == 0 and outcome(other.stdout)["result"] == "pushed", other.stdout
    assert rc == 1
    o = outcome(out)
    assert o["result"] == "failed" and "\n" not in o["error"] and "cut at" not in o["error"], o
    assert o["error"].startswith(f"host {HOST}: {MP}: this push's staging copy was taken while it was being written, ")
    assert o["error"].endswith("; nothing of this push was put in place")
    assert host_sha(lab) == sha_e
    man = json.loads(lab.exec(HOST, ["cat", MP + ".llmfleet.json"]).stdout)
    assert man["files"][0]["sha256"] == sha_e and holder_now(lab) is None
