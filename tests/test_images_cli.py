"""`invoke images.*` end to end against a real registry on loopback: pin, verify (exit codes, JSON),
mirrors taken from an inventory, list, and build's refusals. Nothing here leaves 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from llmfleet.images.lock import load_lock
from tests.registry_fixture import delete_manifest, push_image, registry_fixture  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parents[1]


def inv(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_pin_verify_list_and_a_deleted_digest(registry, tmp_path):
    lock = tmp_path / "lab.lock"
    d1 = push_image(registry, "cli/llama-server", "lab", payload="cli-llama")
    d2 = push_image(registry, "cli/llama-server-broken", "lab", payload="cli-broken")
    res = inv("images.pin", f"llamacpp=lab-cpu={registry.host}/cli/llama-server:lab,"
              f"llamacpp=lab-broken={registry.host}/cli/llama-server-broken:lab", "--lock", str(lock), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["pinned"]["llamacpp:lab-cpu"]["digest"] == d1
    locked = load_lock(lock)
    # resolved at the given reference, recorded under the catalog's repository
    assert locked.get("llamacpp:lab-cpu").repository == "lab/llama-server"
    assert locked.get("llamacpp:lab-broken").digest == d2

    res = inv("images.list", "--lock", str(lock), "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["key"]: r for r in json.loads(res.stdout)["images"]}
    assert rows["llamacpp:lab-cpu"]["digest"] == d1 and rows["llamacpp:lab-cpu"]["in_catalog"]
    # the catalog's GPU images show up as missing from this lock
    assert rows["vllm:0.19.1-volta"]["in_lock"] is False
    assert rows["llamacpp:b5000-cu122"]["dockerfile"] == "llamacpp-cuda"

    # verify resolves each digest where the lock says the image lives: here, through a mirror mapping
    # the recorded repository back to the registry on loopback
    inventory = tmp_path / "inv"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("fleet:\n  hosts:\n    gpu-01:\n")
    (inventory / "group_vars" / "all.yml").write_text(f"llmfleet_image_mirrors:\n  lab: {registry.host}/cli\n")
    res = inv("images.verify", "--lock", str(lock), "--registry-mirror", "-i", str(inventory), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert {r["status"] for r in json.loads(res.stdout)["results"]} == {"ok"}

    delete_manifest(registry, "cli/llama-server-broken", d2)
    res = inv("images.verify", "--lock", str(lock), "--registry-mirror", "-i", str(inventory), "--json")
    assert res.returncode == 1
    results = {r["key"]: r["status"] for r in json.loads(res.stdout)["results"]}
    assert results == {"llamacpp:lab-cpu": "ok", "llamacpp:lab-broken": "missing"}
    assert "do not resolve" in res.stderr and "llamacpp:lab-broken" in res.stderr


def test_pin_through_the_inventory_mirror_keeps_the_public_repository(registry, tmp_path):
    """Air-gapped: the tag is resolved at the mirror; the lock names docker.io and the same digest."""
    digest = push_image(registry, "hub/vllm/vllm-openai", "v0.10.1.1", payload="air-gapped")
    inventory = tmp_path / "inv"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("fleet:\n  hosts:\n    gpu-01:\n    gpu-02:\n")
    (inventory / "group_vars" / "all.yml").write_text(
        f"llmfleet_image_mirrors:\n  docker.io/vllm: {registry.host}/hub/vllm\n")
    lock = tmp_path / "images.lock"
    res = inv("images.pin", "vllm=0.10.1.1", "--registry-mirror", "-i", str(inventory), "--lock", str(lock))
    assert res.returncode == 0, res.stdout + res.stderr
    e = load_lock(lock).get("vllm:0.10.1.1")
    assert (e.repository, e.tag, e.digest) == ("docker.io/vllm/vllm-openai", "v0.10.1.1", digest)
    assert e.cuda == "12.8.1" and "7.0" in e.archs
    assert e.verified["registry"] == registry.host
    res = inv("images.verify", "--lock", str(lock), "--registry-mirror", "-i", str(inventory), "--record")
    assert res.returncode == 0, res.stdout + res.stderr
    assert load_lock(lock).get("vllm:0.10.1.1").verified["by"] == "images.verify"


def test_conflicting_mirrors_between_hosts_are_a_usage_error(tmp_path):
    inventory = tmp_path / "inv"
    (inventory / "host_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("fleet:\n  hosts:\n    a:\n    b:\n")
    (inventory / "host_vars" / "a.yml").write_text("llmfleet_image_mirrors: {docker.io/vllm: m1.lan/vllm}\n")
    (inventory / "host_vars" / "b.yml").write_text("llmfleet_image_mirrors: {docker.io/vllm: m2.lan/vllm}\n")
    res = inv("images.pin", "vllm=0.10.1.1", "--registry-mirror", "-i", str(inventory), "--lock", str(tmp_path / "l"))
    assert res.returncode == 2
    assert "--host/--group" in res.stderr and not (tmp_path / "l").exists()


def test_pin_usage_errors_exit_2_and_write_nothing(tmp_path):
    lock = tmp_path / "images.lock"
    for args in (["images.pin", "vllm=9.9.9"], ["images.pin", "tgi=1"], ["images.pin", "vllm"]):
        res = inv(*args, "--lock", str(lock))
        assert res.returncode == 2, (args, res.stderr)
        assert res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1
    assert not lock.exists()


def test_pin_of_a_missing_tag_exits_1(registry, tmp_path):
    res = inv("images.pin", f"llamacpp=lab-cpu={registry.host}/cli/none:nope", "--lock", str(tmp_path / "l"))
    assert res.returncode == 1 and "not found" in res.stderr


def test_verify_without_a_lock_file_is_a_usage_error(tmp_path):
    res = inv("images.verify", "--lock", str(tmp_path / "none.lock"))
    assert res.returncode == 2 and "images.pin" in res.stderr


def test_build_refuses_unpinned_bases_and_dry_run_prints_the_command():
    res = inv("images.build", "llamacpp-cuda", "--dry-run")
    assert res.returncode == 2 and "BASE_DIGEST" in res.stderr
    d = "sha256:" + "ab" * 32
    res = inv("images.build", "vllm-volta", "--dry-run", "--build-arg", f"BASE_DIGEST={d}",
              "--build-arg", f"RUNTIME_DIGEST={d}", "--build-arg", "VLLM_COMMIT=" + "c" * 40)
    assert res.returncode == 0, res.stderr
    assert "docker build -t llmfleet/vllm-openai:v0.19.1-volta-cu126" in res.stdout
    res = inv("images.build", "no-such-image", "--dry-run")
    assert res.returncode == 2 and "llamacpp-cuda" in res.stderr
