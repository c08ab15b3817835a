"""`pip install llmfleet` deploys: the wheel carries the roles, templates and a default images.lock, and an
installed llmfleet renders from a folder that holds only an inventory (no checkout anywhere near it).

The lab half (deploying with the installed wheel) is tests/lab/test_service_ops.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.wheel_fixture import clean_env

INVENTORY = """\
all:
  children:
    gpu:
      hosts:
        gpu-a10-01:
          ansible_host: 192.0.2.10
          llmfleet_gpu: NVIDIA A10
          llmfleet_services:
            - name: chat
              engine: vllm
              model: qwen2.5-7b-instruct
              quant: gptq-int4
              model_path: /srv/models/qwen2.5-7b-gptq
              image: vllm:0.10.1.1
              port: 8000
              context: 8192
              api_key: {from_env: LLMFLEET_TEST_UNSET_KEY}
"""
# vllm:0.10.1.1 is pinned with a digest in the images.lock shipped with llmfleet
SHIPPED_DIGEST = "sha256:d731ee65c044ae0977421eed3d93f931d4b7d79614394184c939db35b8f28fc2"


@pytest.fixture
def project(tmp_path):
    """A folder that holds only an inventory."""
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "hosts.yml").write_text(INVENTORY)
    return tmp_path


def test_the_wheel_carries_what_a_deploy_reads(installed_wheel):
    names = set(installed_wheel.names())
    for path in ("llmfleet/release/roles/vllm/defaults.yml", "llmfleet/release/roles/vllm/templates/compose.yml.j2",
                 "llmfleet/release/roles/llamacpp/defaults.yml",
                 "llmfleet/release/roles/llamacpp/templates/compose.yml.j2",
                 "llmfleet/release/templates/llmfleet-service.unit.j2", "llmfleet/release/templates/service.env.j2",
                 "llmfleet/images/images.lock", "llmfleet/knowledge/catalog/engines.yaml",
                 "llmfleet/host/probe/probe.sh", "llmfleet/lab/__init__.py"):
        assert path in names, f"{path} is not in the wheel"


def test_each_declared_dependency_earns_its_place(installed_wheel):
    meta = installed_wheel.metadata()
    core = [line.split(":", 1)[1].strip() for line in meta.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]
    names = {re.split(r"[<>=!~; \[]", r, maxsplit=1)[0].lower() for r in core}
    assert "docker" not in names  # the lab talks to Docker through its CLI (docs/lab.md says why)
    assert "numpy" not in names and 'numpy<3,>=1.26; extra == "lab"' in meta
    modules = {"pyyaml": "yaml", "prometheus-client": "prometheus_client"}
    src = "\n".join(p.read_text() for p in (Path(__file__).resolve().parents[1] / "src").rglob("*.py"))
    for name in sorted(names):
        mod = modules.get(name, name.replace("-", "_"))
        assert re.search(rf"^\s*(from|import) {mod}\b", src, re.M), f"{name} is declared but never imported"


def test_the_installed_script_renders_from_a_folder_with_only_an_inventory(installed_wheel, project):
    res = installed_wheel.run("render", "--host", "gpu-a10-01", "-i", "inventory/", "--json", cwd=project)
    assert res.returncode == 0, res.stderr
    (host,) = json.loads(res.stdout)["hosts"]
    (svc,) = host["services"]
    assert svc["image"] == f"docker.io/vllm/vllm-openai@{SHIPPED_DIGEST}"
    compose = svc["files"]["compose.yml"]
    assert f'"docker.io/vllm/vllm-openai@{SHIPPED_DIGEST}"' in compose and '"--max-model-len"' in compose
    assert "ExecStart=/usr/bin/docker compose -p llmfleet-chat" in svc["files"]["llmfleet-chat.service"]
    assert svc["files"]["service.env"].splitlines()[-1] == "VLLM_API_KEY='********'"
    # the package it ran is the installed wheel, not the checkout
    where = subprocess.run([installed_wheel.python, "-c", "import llmfleet; print(llmfleet.__file__)"],
                           cwd=project, capture_output=True, text=True, timeout=60, env=clean_env())
    assert where.stdout.strip().startswith(str(installed_wheel.venv)), where.stdout


def test_an_inventory_role_overrides_the_packaged_one(installed_wheel, project):
    roles = project / "inventory-roles" / "vllm"
    (roles / "templates").mkdir(parents=True)
    ref = installed_wheel.run("render", "--host", "gpu-a10-01", "-i", "inventory/", "--json", cwd=project)
    assert ref.returncode == 0, ref.stderr
    with zipfile.ZipFile(installed_wheel.wheel) as z:
        (roles / "defaults.yml").write_bytes(z.read("llmfleet/release/roles/vllm/defaults.yml"))
        tpl = z.read("llmfleet/release/roles/vllm/templates/compose.yml.j2").decode()
    (roles / "templates" / "compose.yml.j2").write_text("# site role\n" + tpl)
    inv = project / "inventory" / "hosts.yml"
    inv.write_text(inv.read_text().replace("          llmfleet_gpu: NVIDIA A10\n",
                                           "          llmfleet_gpu: NVIDIA A10\n"
                                           "          llmfleet_roles_path: ../inventory-roles\n"))
    res = installed_wheel.run("render", "--host", "gpu-a10-01", "-i", "inventory/", "--json", cwd=project)
    assert res.returncode == 0, res.stderr
    compose = json.loads(res.stdout)["hosts"][0]["services"][0]["files"]["compose.yml"]
    assert compose.startswith("# site role\n")
    # a role folder without this engine's role: the packaged role is used
    (roles / "defaults.yml").unlink()
    res = installed_wheel.run("render", "--host", "gpu-a10-01", "-i", "inventory/", "--json", cwd=project)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["hosts"][0]["services"][0]["files"]["compose.yml"] == \
        json.loads(ref.stdout)["hosts"][0]["services"][0]["files"]["compose.yml"]


def test_a_usage_error_from_the_installed_script_is_one_line(installed_wheel, project):
    res = installed_wheel.run("status", "--forks", "abc", "-i", "inventory/", cwd=project)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["error: --forks: 'abc' is not a whole number, 1 or more"]
