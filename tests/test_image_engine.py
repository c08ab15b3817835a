"""A service's image must be its engine's: a llama.cpp service given ``vllm:0.19.1`` is an error for
``inventory --check`` (pinned, unpinned or without an images.lock), and render and deploy refuse it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.errors import UsageError
from llmfleet.images.lock import ImageLock, LockedImage
from llmfleet.inventory.ansible import load_inventory
from llmfleet.knowledge.compat import image_engine, image_engine_mismatch
from llmfleet.release.check import check_inventory

REPO = Path(__file__).resolve().parents[1]
LLMFLEET = str(Path(sys.executable).parent / "llmfleet")
UNPINNED = ImageLock(images={"vllm:0.19.1": LockedImage(key="vllm:0.19.1", repository="docker.io/vllm/vllm-openai",
                                                        digest=None)}, path="test.lock")


def test_the_engine_of_an_image_key():
    assert image_engine("vllm:0.19.1") == "vllm"  # from the engine catalog
    assert image_engine("llamacpp:b5000-cu122") == "llamacpp"
    assert image_engine("vllm:9.9.9") == "vllm"  # not in the catalog: the key's engine prefix
    assert image_engine("docker.io/x/y@sha256:" + "a" * 64) is None
    assert image_engine_mismatch("vllm:0.19.1", "vllm") is None
    assert "is a vllm image, but the service's engine is llamacpp" in image_engine_mismatch("vllm:0.19.1", "llamacpp")


@pytest.mark.parametrize("lock", [UNPINNED, None], ids=["unpinned", "no-lock"])
def test_check_refuses_it_as_an_error(tmp_path, lock):
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("gpu:\n  hosts:\n    a:\n")
    (inv / "host_vars" / "a.yml").write_text(
        "llmfleet_services:\n  - {name: s, engine: llamacpp, model: qwen2.5-7b-instruct, quant: q4_k_m,\n"
        "     model_path: /m/x.gguf, image: 'vllm:0.19.1', context: 4096}\n")
    reports = check_inventory(load_inventory(inv), lock_for=lambda h: lock)
    errors = [f.message for r in reports for f in r.findings if f.level == "error"]
    assert any("image 'vllm:0.19.1' is a vllm image, but the service's engine is llamacpp" in m for m in errors), \
        [(f.level, f.message) for r in reports for f in r.findings]


@pytest.fixture
def wrong_image(tmp_path):
    inv = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory/example", inv)
    hv = inv / "host_vars" / "gpu-4090-01.yml"
    hv.write_text(hv.read_text().replace("image: llamacpp:b5000-cu122", "image: vllm:0.19.1"))
    return tmp_path, inv


def test_render_and_check_refuse_it(wrong_image):
    cwd, inv = wrong_image
    for argv in (["render", "--host", "gpu-4090-01"], ["inventory", "--check"]):
        res = subprocess.run([LLMFLEET, *argv, "-i", str(inv)], cwd=cwd, capture_output=True, text=True, timeout=120)
        assert res.returncode != 0, (argv, res.stdout, res.stderr)
        assert "is a vllm image, but the service's engine is llamacpp" in res.stdout + res.stderr, argv


def test_deploy_preparation_refuses_it(wrong_image):
    from llmfleet.release.prepare import DeployOptions, prepare_host
    from llmfleet.settings import Settings

    _cwd, inv = wrong_image
    with pytest.raises(UsageError, match="is a vllm image, but the service's engine is llamacpp"):
        prepare_host(str(inv), "gpu-4090-01", Settings(), DeployOptions(allow_unpinned=True))
