"""`pip install llmfleet-ops` deploys: the wheel carries the roles, templates and a default images.lock, and an
installed llmfleet renders from a folder that holds only an inventory (no checkout anywhere near it).

The lab half (deploying with the installed wheel) is tests/lab/test_service_ops.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.wheel_fixture import REPO, clean_env

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
    assert "gguf" not in names and 'gguf<1,>=0.10; extra == "lab"' in meta  # the lab writes GGUF; reading needs none
    assert "cryptography" in names  # inventory/vault.py imports it: declared, not borrowed from paramiko
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


def test_the_distribution_has_its_own_name_and_a_license(installed_wheel):
    meta = installed_wheel.metadata()
    assert re.search(r"^Name: llmfleet-ops$", meta, re.M), meta[:300]
    assert "License: Apache-2.0" in meta or "License-Expression: Apache-2.0" in meta
    assert any(n.endswith("LICENSE") and ".dist-info/" in n for n in installed_wheel.names())
    show = subprocess.run([installed_wheel.python, "-m", "pip", "show", "llmfleet-ops"], capture_output=True,
                          text=True, timeout=120, env=clean_env())
    assert show.returncode == 0 and "Name: llmfleet-ops" in show.stdout
    assert Path(installed_wheel.llmfleet).exists()  # the command keeps its name


def readme_pip_block() -> list[str]:
    """The commands of README's "Install with pip" block, comments dropped."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Install with pip", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def fixture_lock(images_used: list[str]) -> str:
    """The packaged images.lock with the images the inventory names pinned, as `images.pin` would leave it
    (no registry is reachable from a test)."""
    text = (REPO / "src/llmfleet/images/images.lock").read_text()
    for n, key in enumerate(images_used, 1):
        head, sep, tail = text.partition(f"\n  {key}:\n")
        assert sep, f"{key} is not in the packaged lock"
        tail = tail.replace("    digest: null\n", f"    digest: sha256:{str(n) * 64}\n", 1)
        text = head + sep + tail
    return text


def test_the_readme_pip_commands_work_as_written(installed_wheel, tmp_path):
    """The README's commands, as written, from a folder holding only an inventory: a copy of inventory/example/
    whose V100 service names the image the README pins."""
    lines = readme_pip_block()
    text = (REPO / "README.md").read_text()
    # llmfleet-ops is not on any index: the README builds the wheel from the checkout and installs that file
    assert "**not published**" in text and "pip install llmfleet-ops" not in "\n".join(lines)
    assert lines[0] == "python3 -m pip wheel --no-deps -w dist ."
    assert lines[1] == "pipx install ./dist/llmfleet_ops-*.whl"
    assert "python3 -m pip install ./dist/llmfleet_ops-*.whl" in text
    # the glob finds the wheel such a build writes (the fixture built and installed it, offline)
    assert Path("dist", installed_wheel.wheel.name).match("dist/llmfleet_ops-*.whl"), installed_wheel.wheel.name
    assert lines[2] == "mkdir ~/fleet && cd ~/fleet"
    env = {**clean_env(), "PATH": f"{installed_wheel.venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
           "COLUMNS": "200", "QWEN32B_API_KEY": "k", "ANSIBLE_CONFIG": str(tmp_path / "none.cfg")}
    env.pop("ANSIBLE_INVENTORY", None)
    sh = shutil.which("bash") or "/bin/bash"
    subprocess.run([sh, "-c", lines[2]], cwd=tmp_path, check=True, env=env, timeout=60)
    fleet = tmp_path / "fleet"
    (pin,) = [ln for ln in lines if ln.startswith("llmfleet images.pin ")]
    key = pin.split()[2].replace("=", ":", 1)
    shutil.copytree(REPO / "inventory/example", fleet / "inventory")
    hv = fleet / "inventory/host_vars/gpu-v100-01.yml"
    hv.write_text(hv.read_text().replace("image: vllm:0.19.1-volta ", f"image: {key} ", 1))
    assert f"image: {key} " in hv.read_text()
    ran = []
    pinned = False
    for line in lines[3:]:
        if line.startswith("llmfleet images.pin"):
            # no registry is reachable from a test: the lock it would write, the README's key pinned
            (fleet / "images.lock").write_text(fixture_lock([key]))
            ran.append(line)
            pinned = True
            continue
        res = subprocess.run([sh, "-c", line], cwd=fleet, capture_output=True, text=True, timeout=180, env=env)
        assert "Traceback" not in res.stderr, (line, res.stderr[-2000:])
        if line.startswith("llmfleet deploy"):
            assert pinned  # the README pins before it deploys
            # everything up to the connection works; this machine has no key for the example's hosts
            assert res.returncode == 1, (line, res.stdout[-2000:], res.stderr[-2000:])
            assert "ansible_ssh_private_key_file" in res.stdout + res.stderr
        else:
            assert res.returncode == 0, (line, res.stdout[-2000:], res.stderr[-2000:])
        if line.startswith("llmfleet render"):  # before the pin: rendered, and marked unpinned
            assert "UNPINNED image docker.io/vllm/vllm-openai:v0.19.1" in res.stdout, res.stdout[:2000]
        ran.append(line)
    assert any(x.startswith("llmfleet render") for x in ran) and any(x.startswith("llmfleet deploy") for x in ran)
    assert sorted(p.name for p in fleet.iterdir()) == ["images.lock", "inventory"]  # nothing else left behind
