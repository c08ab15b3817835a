"""`render` connects nowhere, so it needs no pin: an image without a digest is rendered with its floating tag
and marked unpinned (first line of each service and a note; ``"pinned": false`` and the note in --json).
`deploy` still refuses such an image without --allow-unpinned."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.errors import UsageError
from llmfleet.images.lock import ImageLock, LockedImage, resolve, unpinned_note

REPO = Path(__file__).resolve().parents[1]
LLMFLEET = str(Path(sys.executable).parent / "llmfleet")
DIGEST = "sha256:" + "ab" * 32
LOCK = ImageLock(images={
    "vllm:0.19.1": LockedImage(key="vllm:0.19.1", repository="docker.io/vllm/vllm-openai", tag="v0.19.1", digest=None),
    "vllm:0.10.1.1": LockedImage(key="vllm:0.10.1.1", repository="docker.io/vllm/vllm-openai", tag="v0.10.1.1",
                                 digest=DIGEST),
}, path="test.lock")


@pytest.mark.parametrize("image, says", [
    ("vllm:0.10.1.1", None),  # pinned in the lock
    (f"docker.io/vllm/vllm-openai@{DIGEST}", None),  # pinned by itself
    ("vllm:0.19.1", ["'vllm:0.19.1' is UNPINNED", "floating tag docker.io/vllm/vllm-openai:v0.19.1",
                     "`invoke images.pin vllm=0.19.1`", "--allow-unpinned"]),
    ("ghcr.io/ggml-org/llama.cpp:server-cuda", ["UNPINNED", "floating tag ghcr.io/ggml-org/llama.cpp:server-cuda",
                                                "pinned in test.lock", "--allow-unpinned"]),
    ("ghcr.io/ggml-org/llama.cpp", ["floating tag ghcr.io/ggml-org/llama.cpp:latest"]),
])
def test_the_unpinned_note(image, says):
    note = unpinned_note(resolve(image, LOCK, allow_unpinned=True), LOCK)
    if says is None:
        assert note is None
    else:
        assert note is not None
        for part in says:
            assert part in note, (part, note)


@pytest.fixture
def fleet(tmp_path):
    """A folder holding only a copy of the example inventory (no images.lock: the packaged one applies, where
    the example's images have no digest)."""
    shutil.copytree(REPO / "inventory/example", tmp_path / "inventory")
    return tmp_path


def _render(folder: Path, *more: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "COLUMNS": "200"}
    return subprocess.run([LLMFLEET, "render", "--host", "gpu-v100-01", *more], cwd=folder, capture_output=True,
                          text=True, timeout=120, env=env)


def test_render_renders_an_unpinned_image_and_marks_it(fleet):
    res = _render(fleet)
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith("# gpu-v100-01/qwen32b: UNPINNED image llmfleet/vllm-openai:v0.19.1-volta-cu126"), first
    assert 'image: "llmfleet/vllm-openai:v0.19.1-volta-cu126"' in res.stdout
    assert "# note: image 'vllm:0.19.1-volta' is UNPINNED" in res.stdout
    assert "`llmfleet images.pin vllm=0.19.1-volta`" in res.stdout  # in the words of the command typed

    doc = json.loads(_render(fleet, "--json").stdout)
    (svc,) = doc["hosts"][0]["services"]
    assert svc["pinned"] is False and svc["image"] == "llmfleet/vllm-openai:v0.19.1-volta-cu126"
    assert any("is UNPINNED" in n for n in svc["notes"]), svc["notes"]

    out = _render(fleet, "--out", "files")
    assert out.returncode == 0, out.stderr
    assert "UNPINNED image llmfleet/vllm-openai:v0.19.1-volta-cu126" in out.stdout
    assert (fleet / "files/gpu-v100-01/qwen32b/compose.yml").exists()

    old = _render(fleet, "--allow-unpinned", "--json")  # the flag of older scripts is still accepted
    assert old.returncode == 0 and json.loads(old.stdout) == doc


def test_a_pinned_image_is_not_marked(fleet):
    text = (REPO / "src/llmfleet/images/images.lock").read_text()
    head, sep, tail = text.partition("\n  vllm:0.19.1-volta:\n")
    (fleet / "images.lock").write_text(head + sep + tail.replace("    digest: null\n", f"    digest: {DIGEST}\n", 1))
    res = _render(fleet)
    assert res.returncode == 0, res.stderr
    assert "UNPINNED" not in res.stdout and f'"llmfleet/vllm-openai@{DIGEST}"' in res.stdout
    (svc,) = json.loads(_render(fleet, "--json").stdout)["hosts"][0]["services"]
    assert svc["pinned"] is True and not any("UNPINNED" in n for n in svc["notes"])


def test_deploy_still_refuses_an_unpinned_image(fleet, monkeypatch):
    from llmfleet.release.prepare import DeployOptions, prepare_host
    from llmfleet.settings import Settings

    monkeypatch.setenv("QWEN32B_API_KEY", "k")
    monkeypatch.chdir(fleet)
    with pytest.raises(UsageError, match=r"without a digest.*images.pin vllm=0.19.1-volta.*--allow-unpinned"):
        prepare_host(str(fleet / "inventory"), "gpu-v100-01", Settings(), DeployOptions())
