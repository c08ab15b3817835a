"""End-to-end: the lab's images go through the same pin and verify path as a fleet's, against the
lab registry; a lab host pulls exactly the pinned digest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.images.lock import load_lock, verify
from llmfleet.images.registry import RegistryClient

pytestmark = pytest.mark.lab
ROOT = Path(__file__).resolve().parents[2]


def test_the_lab_lock_pins_the_lab_images_where_hosts_pull_them(lab):
    lock = load_lock(lab.lock_path)
    e = lock.get("llamacpp:lab-cpu")
    assert e is not None and e.digest, "llamacpp:lab-cpu is not pinned in the lab lock"
    for entry in lock.images.values():
        assert entry.repository.startswith(lab.registry_inner + "/"), entry
        if entry.digest:
            assert entry.verified and entry.verified["by"] == "images.pin"


def test_every_pinned_lab_digest_resolves_in_the_lab_registry(lab):
    """From this machine the lab registry is on loopback: the inner name is mapped like a mirror."""
    results = verify(load_lock(lab.lock_path), RegistryClient(timeout=10), mirrors={lab.registry_inner: lab.registry})
    bad = [r for r in results if r.status not in ("ok", "unpinned")]
    assert not bad, bad
    assert any(r.status == "ok" for r in results)


def test_images_verify_task_on_the_lab_lock_through_an_inventory_mirror(lab, tmp_path):
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("lab:\n  hosts:\n    gpu-v100-01:\n")
    (inv / "group_vars" / "all.yml").write_text(f"llmfleet_image_mirrors:\n  {lab.registry_inner}: {lab.registry}\n")
    res = subprocess.run([sys.executable, "-m", "invoke", "images.verify", "--lock", str(lab.lock_path),
                          "--registry-mirror", "-i", str(inv), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["ok"] is True


def test_a_lab_host_pulls_the_pinned_digest(lab):
    e = load_lock(lab.lock_path).get("llamacpp:lab-cpu")
    host = lab.hosts[0]
    ref = f"{e.repository}@{e.digest}"
    lab.exec(host, ["docker", "pull", ref], timeout=300)
    out = lab.exec(host, ["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", ref]).stdout
    assert ref in json.loads(out)
