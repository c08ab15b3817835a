"""An air-gapped site in the lab: a bundle built from the lab registry deploys with the registry cut off.

``invoke bundle.create`` fetches the lab host's image from the lab registry (reached from this
machine on loopback, ``--mirror lab-registry:5000=127.0.0.1:PORT``); then the registry container is
disconnected from this lab's network (the hosts' only route to ``lab-registry``) and:

- ``deploy --bundle`` of a service the host never ran (neither its image nor its model is there)
  sends the image archive, ``docker load``-s it on the host's own engine (Docker 20.10, classic image
  store), checks its image ID, pushes the model from the bundle (``models.push``: sha256-verified,
  its manifest written beside it), and deploys and health-checks the service; the host's engine records no pull (``docker events``), the registry is
  unreachable from the host throughout, and a second deploy sends nothing (the image ID is there);
- ``upgrade --group v100 --bundle`` (the rolling upgrade) with the registry cut off: the batch's host
  gets its model pushed from the bundle again (removed from the host beforehand) and its image checked
  by ID before it deploys the new setting; no pull;
- a copy of the bundle with one byte flipped in the image archive is refused before any host is
  contacted, naming the file (exit 1), and the host is as it was;
- a bundle built from another images.lock is refused, naming the lock (exit 2).

The registry is connected again in a ``finally``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmfleet.lab import docker as lab_docker
from llmfleet.lab import hosts as lab_hosts
from llmfleet.release import store as R

pytestmark = pytest.mark.lab

HOST = "gpu-v100-01"
ROOT = Path(__file__).resolve().parents[2]
IMAGE = "llamacpp:lab-cpu"


def _cli(lab, tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).parent / "llmfleet")
    env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(lab.known_hosts),
               INVOKE_LLMFLEET_AUDIT_LOG=str(tmp / "audit.jsonl"))
    return subprocess.run([exe, *argv], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


def _host_view(lab) -> tuple[str, str]:
    """What a refused deploy must leave as it was: the releases and the engine's images."""
    state = lab.exec(HOST, ["sh", "-c", R.state_script("/opt/llmfleet")]).stdout
    images = lab.exec(HOST, ["docker", "image", "ls", "-a", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}"])
    staged = lab.exec(HOST, ["sh", "-c", "ls -la /opt/llmfleet/bundle 2>/dev/null || true"]).stdout
    # docker lists images of equal creation time in no fixed order: compare them as a set
    return state, "\n".join(sorted(images.stdout.splitlines())) + "\n" + staged


def _registry_reachable(lab) -> bool:
    res = lab.exec(HOST, ["sh", "-c", f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' http://{lab.registry_inner}/v2/"],
                   check=False)
    return res.returncode == 0 and res.stdout.strip() == "200"


def _as_new(lab) -> None:
    """The host as if freshly installed: no llmfleet unit, container, release or image left from
    earlier tests of this lab session."""
    lab.exec(HOST, ["sh", "-c",
                    "systemctl stop 'llmfleet-*' >/dev/null 2>&1; systemctl reset-failed 'llmfleet-*' >/dev/null 2>&1; "
                    "rm -f /etc/systemd/system/llmfleet-*; systemctl daemon-reload; "
                    "docker ps -aq | xargs -r docker rm -f >/dev/null; rm -rf /opt/llmfleet/services; true"])


@pytest.fixture(scope="module")
def bundle(lab, tmp_path_factory):
    """The bundle, and an inventory whose ``tiny`` service takes its model from this machine
    (``model_source``), so the bundle carries the model too."""
    import yaml

    lab.ensure_hosts(HOST)
    tmp = tmp_path_factory.mktemp("bundle")
    inv = tmp / "inventory"
    shutil.copytree(lab.inventory_path, inv)
    all_yml = inv / "group_vars" / "all.yml"
    data = yaml.safe_load(all_yml.read_text())
    (tiny,) = [svc for svc in data["llmfleet_services"] if svc["name"] == "tiny"]
    assert tiny["model_path"] == lab.gguf_path
    tiny["model_source"] = str(lab_hosts.lab_models()["tiny-qwen2-gguf"] / Path(lab.gguf_path).name)
    all_yml.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp / "site"
    r = _cli(lab, tmp, "bundle.create", str(out), "-i", str(inv), "--host", HOST,
             "--mirror", f"{lab.registry_inner}={lab.registry}", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    return out, json.loads(r.stdout), tmp, inv


def test_deploy_from_the_bundle_with_the_registry_cut_off(lab, bundle):
    out, doc, tmp, inv = bundle
    (image,) = [i for i in doc["images"] if i["key"] == IMAGE]
    # a host that never ran the service, whose engine does not hold the image (the lab's host may have
    # run other test files' services: those go first, as on a freshly installed host)
    _as_new(lab)
    lab.exec(HOST, ["sh", "-c", f"docker image rm -f {image['image_id']} >/dev/null 2>&1 || true"])
    lab.exec(HOST, ["sh", "-c", f"rm -f {lab.gguf_path} {lab.gguf_path}.llmfleet.json"])  # nor the model
    assert _registry_reachable(lab)
    since = lab.exec(HOST, ["date", "+%s"]).stdout.strip()
    lab_docker.run(["network", "disconnect", lab.name, lab_hosts.REGISTRY_CONTAINER])
    try:
        assert not _registry_reachable(lab)
        r = _cli(lab, tmp, "deploy", "-i", str(inv), "--host", HOST, "--bundle", str(out), "--json")
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        (host,) = json.loads(r.stdout)["hosts"]
        assert host["result"] == "deployed" and host["services"]["tiny"]["result"] == "deployed"
        assert f"{HOST}: {IMAGE}: sending images/llamacpp_lab-cpu.tar" in r.stderr
        assert f"{HOST}: {IMAGE}: loaded from the bundle, image ID {image['image_id'][:19]} verified" in r.stderr
        assert "tiny: image loaded from the bundle, image ID verified" in r.stderr
        assert f"{HOST}: {lab.gguf_path}: pushed" in r.stderr  # the model, from the bundle, by models.push
        held = json.loads(lab.exec(HOST, ["cat", f"{lab.gguf_path}.llmfleet.json"]).stdout)
        (entry,) = [m for m in doc["files"] if m["path"] == "models" + lab.gguf_path]
        assert [(f["size"], "sha256:" + f["sha256"]) for f in held["files"]] == [(entry["size"], entry["sha256"])]
        # the engine loaded and tagged, and pulled nothing; the registry stayed out of reach
        until = lab.exec(HOST, ["date", "+%s"]).stdout.strip()
        events = lab.exec(HOST, ["docker", "events", "--since", since, "--until", until, "--filter", "type=image",
                                 "--format", "{{.Action}} {{.Actor.ID}}"]).stdout.splitlines()
        actions = {e.split(" ", 1)[0] for e in events}
        assert "load" in actions and "tag" in actions and "pull" not in actions, events
        assert not _registry_reachable(lab)
        running = lab.exec(HOST, ["docker", "inspect", "-f", "{{.Config.Image}} {{.Image}}", "llmfleet-tiny"]).stdout
        assert running.split() == [image["tag"], image["image_id"]]
        assert lab.exec(HOST, ["sh", "-c", "ls /opt/llmfleet/bundle"], check=False).stdout.strip() == ""

        # again: the engine has the image ID, nothing is sent, nothing changes
        r = _cli(lab, tmp, "deploy", "-i", str(inv), "--host", HOST, "--bundle", str(out), "--json")
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        assert json.loads(r.stdout)["hosts"][0]["result"] == "unchanged"
        assert f"{lab.gguf_path}: already" in r.stderr  # the model's manifest vouches for it: nothing sent
        assert f"{IMAGE}: already on the host" in r.stderr and "sending" not in r.stderr
    finally:
        lab_hosts.connect_registry(lab.name)
    deadline = time.monotonic() + 30
    while not _registry_reachable(lab) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _registry_reachable(lab)


def test_upgrade_from_the_bundle_with_the_registry_cut_off(lab, bundle):
    """The rolling upgrade from the bundle: the batch is prepared (image checked by ID or loaded, the
    model pushed from the bundle: the host's copy was removed) before its host deploys, and nothing is
    pulled."""
    out, doc, tmp, inv = bundle
    (image,) = [i for i in doc["images"] if i["key"] == IMAGE]
    lab.exec(HOST, ["sh", "-c", f"rm -f {lab.gguf_path} {lab.gguf_path}.llmfleet.json"])
    since = lab.exec(HOST, ["date", "+%s"]).stdout.strip()
    lab_docker.run(["network", "disconnect", lab.name, lab_hosts.REGISTRY_CONTAINER])
    try:
        assert not _registry_reachable(lab)
        r = _cli(lab, tmp, "upgrade", "-i", str(inv), "--group", "v100", "--bundle", str(out),
                 "--set", "context=384", "--json")
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        report = json.loads(r.stdout)
        assert report["ok"] and report["batches"] == [[HOST]]
        assert [(h["host"], h["result"]) for h in report["hosts"]] == [(HOST, "deployed")]
        err = r.stderr
        assert f"{HOST}: {IMAGE}: " in err and f"image ID {image['image_id'][:19]} verified" in err
        pushed = err.index(f"{HOST}: {lab.gguf_path}: pushed")  # the batch's preparation, from the bundle ...
        assert err.index("batch 1/1") < pushed < err.index("tiny: image loaded from the bundle, image ID verified")
        held = json.loads(lab.exec(HOST, ["cat", f"{lab.gguf_path}.llmfleet.json"]).stdout)
        (entry,) = [m for m in doc["files"] if m["path"] == "models" + lab.gguf_path]
        assert [(f["size"], "sha256:" + f["sha256"]) for f in held["files"]] == [(entry["size"], entry["sha256"])]
        until = lab.exec(HOST, ["date", "+%s"]).stdout.strip()
        events = lab.exec(HOST, ["docker", "events", "--since", since, "--until", until, "--filter", "type=image",
                                 "--format", "{{.Action}} {{.Actor.ID}}"]).stdout.splitlines()
        assert "pull" not in {e.split(" ", 1)[0] for e in events}, events
        running = lab.exec(HOST, ["docker", "inspect", "-f", "{{.Config.Image}} {{.Image}}", "llmfleet-tiny"]).stdout
        assert running.split() == [image["tag"], image["image_id"]]
        assert " -c 384 " in lab.exec(HOST, ["docker", "inspect", "-f", "{{join .Args \" \"}}",
                                                   "llmfleet-tiny"]).stdout
        assert not _registry_reachable(lab)
    finally:
        lab_hosts.connect_registry(lab.name)
    deadline = time.monotonic() + 30
    while not _registry_reachable(lab) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _registry_reachable(lab)


def test_a_flipped_byte_is_refused_before_any_host_changes(lab, bundle):
    out, _doc, tmp, _inv = bundle
    bad = tmp / "flipped"
    shutil.copytree(out, bad)
    archive = bad / "images" / "llamacpp_lab-cpu.tar"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x01
    archive.write_bytes(bytes(data))
    before = _host_view(lab)
    r = _cli(lab, tmp, "deploy", "-i", lab.inventory_path, "--host", HOST, "--bundle", str(bad))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{archive}: corrupt (its sha256 differs from bundle.json)" in r.stderr
    assert _host_view(lab) == before
    r = _cli(lab, tmp, "bundle.verify", str(bad))
    assert r.returncode == 1 and r.stderr.strip().endswith("copy the bundle again")


def test_a_bundle_built_from_another_lock_is_refused(lab, bundle):
    _out, _doc, tmp, _inv = bundle
    other_lock = tmp / "other.lock"
    other_lock.write_text(lab.lock_path.read_text() + "# the site's copy, edited\n")
    other_inv = tmp / "other-inventory"
    shutil.copytree(lab.inventory_path, other_inv)
    all_yml = other_inv / "group_vars" / "all.yml"
    text = all_yml.read_text()
    assert str(lab.lock_path) in text
    all_yml.write_text(text.replace(str(lab.lock_path), str(other_lock)))
    other = tmp / "other-bundle"
    r = _cli(lab, tmp, "bundle.create", str(other), "-i", str(other_inv), "--host", HOST,
             "--mirror", f"{lab.registry_inner}={lab.registry}")
    assert r.returncode == 0, r.stderr[-2000:]
    before = _host_view(lab)
    r = _cli(lab, tmp, "deploy", "-i", lab.inventory_path, "--host", HOST, "--bundle", str(other))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{lab.lock_path}: this images.lock" in r.stderr and f"{other}/images.lock" in r.stderr
    assert _host_view(lab) == before
