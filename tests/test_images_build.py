"""`invoke images.build` end to end with the local Docker engine and a registry on loopback: the base
is looked up by digest (--resolve-base), the image is built FROM base@digest, pushed, and pinned.
A tiny imported base stands in for the CUDA bases, which cannot be pulled here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from llmfleet.images.lock import load_lock
from llmfleet.images.registry import RegistryClient
from tests.registry_fixture import registry_fixture  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parents[1]
DOCKER = shutil.which("docker")


def _docker_ok() -> bool:
    if not DOCKER:
        return False
    try:
        return subprocess.run([DOCKER, "info"], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


pytestmark = pytest.mark.skipif(not _docker_ok(), reason="needs a running Docker engine")


def _docker(*args: str, timeout: int = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=True, **kw)


def test_build_resolves_the_base_builds_pushes_and_pins(registry, tmp_path):
    run = uuid.uuid4().hex[:8]
    base_repo = f"{registry.host}/e2e/base"
    local_refs = [f"{base_repo}:tiny-{run}", f"{registry.host}/e2e/tiny:t-{run}"]
    try:
        # a tiny base image, imported and pushed to the registry (a CUDA base's stand-in)
        (tmp_path / "hello").write_text(f"base {run}\n")
        with tarfile.open(tmp_path / "base.tar", "w") as tar:
            tar.add(tmp_path / "hello", arcname="hello")
        _docker("import", str(tmp_path / "base.tar"), local_refs[0])
        _docker("push", local_refs[0])
        base_digest = RegistryClient().resolve(local_refs[0])

        root = tmp_path / "dockerfiles"
        (root / "tiny").mkdir(parents=True)
        (root / "tiny" / "Dockerfile").write_text(
            "ARG BASE_DIGEST\n"
            f"FROM {base_repo}@${{BASE_DIGEST}}\n"
            "ARG SRC_COMMIT\n"
            'LABEL org.opencontainers.image.revision="${SRC_COMMIT}"\n'
            'ENTRYPOINT ["/hello"]\n'
        )
        (root / "tiny" / "image.yaml").write_text(
            'catalog_key: "llamacpp:lab-cpu"\n'
            f"repository: {registry.host}/e2e/tiny\n"
            f"tag: t-{run}\n"
            f"bases:\n  BASE_DIGEST:\n    image: {base_repo}:tiny-{run}\n    digest: null\n"
            "required_args: [SRC_COMMIT]\n"
        )
        env = {**os.environ, "INVOKE_LLMFLEET_DOCKERFILES": str(root)}
        cmd = [sys.executable, "-m", "invoke", "images.build", "tiny"]

        # the required arg is enforced before anything is looked up or built
        res = subprocess.run([*cmd, "--resolve-base"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and "SRC_COMMIT" in res.stderr

        res = subprocess.run([*cmd, "--resolve-base", "--push", "--build-arg", "SRC_COMMIT=" + "e" * 40],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert base_digest in res.stderr  # the looked-up digest is shown, to be recorded in image.yaml

        labels = _docker("image", "inspect", "--format", "{{json .Config.Labels}}", local_refs[1]).stdout
        assert f"{base_repo}:tiny-{run}@{base_digest}" in labels
        assert "llamacpp:lab-cpu" in labels and "e" * 40 in labels

        pushed = RegistryClient().resolve(local_refs[1])
        lock = tmp_path / "images.lock"
        res = subprocess.run([sys.executable, "-m", "invoke", "images.pin", f"llamacpp=lab-cpu={local_refs[1]}",
                              "--lock", str(lock)], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert load_lock(lock).get("llamacpp:lab-cpu").digest == pushed
    finally:
        subprocess.run([DOCKER, "rmi", "-f", *local_refs], capture_output=True, timeout=60)
