"""End-to-end: `invoke images.inspect` runs the lab's CPU images once (no GPU, no network), reads what
they carry and records it in a lock with archs_source: inspected, which preflight then prefers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.images.lock import ImageLock, ImageRef, LockedImage, load_lock, write_lock
from llmfleet.knowledge import compat
from llmfleet.knowledge.preflight import release_for

pytestmark = pytest.mark.lab
ROOT = Path(__file__).resolve().parents[2]


def _local_image(ref: str) -> None:
    res = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"{ref} is not built here (`invoke lab.setup` builds it)")


def _inspect(tmp_path: Path, key: str, ref: str, repository: str) -> tuple[dict, LockedImage]:
    lock_path = tmp_path / "images.lock"
    write_lock(ImageLock({key: LockedImage(key, repository, None, "lab", archs_source="catalog")}), lock_path)
    res = subprocess.run([sys.executable, "-m", "invoke", "images.inspect", key, "--ref", ref, "--lock",
                          str(lock_path), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout), load_lock(lock_path).get(key)


def test_inspect_the_lab_llama_server_image(tmp_path):
    _local_image("llmfleet-lab/llamacpp:latest")
    out, entry = _inspect(tmp_path, "llamacpp:lab-cpu", "llmfleet-lab/llamacpp:latest", "lab/llama-server")
    # the lab's llama-server is a CPU build of vendored llama.cpp: its binary was read, no CUDA kernels
    assert any(f.endswith("llama-server") for f in out["files"]), out
    assert out["archs"] == [] and "no CUDA kernels" in " ".join(out["notes"])
    assert out["engine_version"]  # from `llama-server --version`
    assert entry.archs_source == "inspected" and entry.engine_version == out["engine_version"]
    rel, _ = release_for(ImageRef(key=entry.key, repository=entry.repository, digest=None, tag="lab", pinned=False,
                                  upstream_repository=entry.repository, archs_source=entry.archs_source),
                         compat.load_engine_catalog())
    assert rel is not None and rel.cpu


@pytest.mark.vllm
def test_inspect_the_lab_vllm_cpu_image(tmp_path):
    ref = "llmfleet-lab/vllm-cpu:latest"
    _local_image(ref)
    out, entry = _inspect(tmp_path, "vllm:lab-cpu", ref, "lab/vllm-cpu")
    # torch==2.13.0+cpu and vllm-cpu 0.32.0 (dockerfiles/lab-vllm-cpu): a CPU torch has no CUDA
    assert out["torch"].startswith("2.13.0") and out["torch_cuda"] is None and out["torch_archs"] == []
    assert out["engine_version"] == "0.32.0"
    assert entry.torch == out["torch"] and entry.archs_source == "inspected"
