"""``invoke inventory --check`` reports every offline error, not the first: schema, catalogs (GPU,
quant), images.lock keys, GPU indexes and host ports, and the plan on the declared card."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from llmfleet.images.lock import ImageLock, LockedImage
from llmfleet.inventory.ansible import load_inventory
from llmfleet.release.check import check_inventory

REPO = Path(__file__).resolve().parents[1]

LOCK = ImageLock(images={
    "vllm:0.9.2": LockedImage(key="vllm:0.9.2", repository="docker.io/vllm/vllm-openai", digest="sha256:" + "a" * 64),
    "llamacpp:b1": LockedImage(key="llamacpp:b1", repository="ghcr.io/ggml-org/llama.cpp", digest="sha256:" + "b" * 64),
    "vllm:unpinned": LockedImage(key="vllm:unpinned", repository="docker.io/vllm/vllm-openai", digest=None),
}, path="test.lock")

SVC = {"engine": "vllm", "model": "qwen2.5-7b-instruct", "quant": "awq-int4", "model_path": "/m/q",
       "image": "vllm:0.9.2", "context": 4096}


def inventory(tmp_path: Path, hostvars: dict[str, dict]) -> Path:
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("gpu:\n  hosts:\n" + "".join(f"    {h}:\n" for h in hostvars))
    for h, v in hostvars.items():
        (inv / "host_vars" / f"{h}.yml").write_text(json.dumps(v))
    return inv


def findings(inv_path: Path) -> list[tuple[str, str, str]]:
    inv = load_inventory(inv_path)
    reports = check_inventory(inv, lock_for=lambda h: LOCK)
    return [(f.host, f.level, f.message) for r in reports for f in r.findings]


def test_a_good_host_has_no_findings(tmp_path: Path) -> None:
    inv = inventory(tmp_path, {"a": {"llmfleet_gpu": "rtx-4090", "llmfleet_services": [{**SVC, "name": "s", "gpus": [0]}]}})
    assert findings(inv) == []


def test_every_error_is_reported(tmp_path: Path) -> None:
    inv = inventory(tmp_path, {
        "a": {"llmfleet_gpu": "GeForce RTX 9999", "llmfleet_services": [
            {**SVC, "name": "one", "gpus": [0, 1], "port": 8000},
            {**SVC, "name": "two", "gpus": [1], "port": 8000, "quant": "q4_k_m"},
            {**SVC, "name": "three", "quant": "int3-magic", "image": "vllm:9.9.9", "port": 8002, "gpus": [2]},
            {**SVC, "name": "four", "engine": "llamacpp", "image": "vllm:0.9.2", "quant": "q4_k_m", "port": 8003, "gpus": [3]},
            {**SVC, "name": "Bad Name", "port": "http"},
        ]},
        "b": {"llmfleet_gpu": "t4", "llmfleet_services": [
            {**SVC, "name": "huge", "model": "qwen2.5-32b-instruct", "quant": "fp16", "gpus": [0], "context": 32768},
            {**SVC, "name": "later", "image": "vllm:unpinned", "port": 8001, "gpus": [1]},
        ]},
    })
    got = findings(inv)
    errors = [m for h, lvl, m in got if lvl == "error"]
    text = "\n".join(errors)
    assert "llmfleet_gpu: unknown GPU 'GeForce RTX 9999'" in text
    assert "llmfleet_services[4].name" in text and "llmfleet_services[4].port" in text  # both schema errors
    assert "services one and two both use host port 8000" in text
    assert "GPU 1 is given to services one and two" in text
    assert "service two: quant 'q4_k_m' is a gguf format; engine vllm takes" in text
    assert "service three: quant: unknown" in text
    assert "service three" in text and "'vllm:9.9.9' is not in test.lock" in text
    assert "service four: image 'vllm:0.9.2' is a vllm image, but the service's engine is llamacpp" in text
    assert any(m.startswith(str(inv / "host_vars" / "b.yml")) and "service huge: the plan does not fit 1 x" in m
               for m in errors)
    assert all(("host a" in m) or ("host b" in m) for m in errors)
    warnings = [m for h, lvl, m in got if lvl == "warning"]
    assert any("'vllm:unpinned' is in test.lock but not pinned" in m for m in warnings)


def test_unresolvable_jinja_is_an_error_naming_the_variable(tmp_path: Path) -> None:
    inv = inventory(tmp_path, {"a": {"llmfleet_services": [{**SVC, "name": "s", "model_path": "{{ models_dir }}/q"}]}})
    [(host, level, msg)] = findings(inv)
    assert level == "error" and "llmfleet_services: 'models_dir' is undefined" in msg


def test_jinja_resolves_before_validation(tmp_path: Path) -> None:
    inv = inventory(tmp_path, {"a": {"models_dir": "/srv/models", "p": 9000, "llmfleet_gpu": "rtx-4090",
                                     "llmfleet_services": [{**SVC, "name": "s", "gpus": [0],
                                                            "model_path": "{{ models_dir }}/q", "port": "{{ p }}"}]}})
    assert findings(inv) == []
    svc = load_inventory(inv).settings_for(load_inventory(inv).hosts["a"]).services[0]
    assert (svc.model_path, svc.port) == ("/srv/models/q", 9000)


def test_cli_prints_one_line_per_error_and_exits_2(tmp_path: Path) -> None:
    inv = tmp_path / "hosts"
    inv.write_text(textwrap.dedent("""
        [gpu]
        a llmfleet_gpu=no-such-card ansible_become_password=x
        b llmfleet_services="[{'name': 'x', 'engine': 'vllm'}]"
        """))
    res = subprocess.run([sys.executable, "-m", "invoke", "inventory", "-i", str(inv), "--check"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 4, res.stderr  # unknown card; model, model_path, image missing
    assert "ansible_become_password is ignored" in res.stderr
    assert "Traceback" not in res.stderr


def test_connection_settings_are_checked_and_the_address_is_rendered(tmp_path: Path) -> None:
    inv = inventory(tmp_path, {"a": {"ansible_host": "{{ net }}.5", "net": "10.0.0", "ansible_port": 2222},
                               "b": {"ansible_host": "{{ nope }}"}, "c": {"ansible_connection": "winrm"}})
    reports = {r.host: r for r in check_inventory(load_inventory(inv))}
    assert reports["a"].address == "10.0.0.5:2222" and reports["a"].ok
    assert not reports["b"].ok and "ansible_host: 'nope' is undefined" in reports["b"].findings[0].message
    assert reports["b"].address is None
    assert "ansible_connection=winrm" in reports["c"].findings[0].message


def test_unsafe_values_keep_literal_jinja(tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("gpu:\n  hosts:\n    a:\n")
    (inv / "host_vars" / "a.yml").write_text(
        "llmfleet_services:\n  - name: s\n    engine: vllm\n    model: m\n    model_path: /m\n    image: vllm:0.9.2\n"
        "    engine_args: ['--chat-template', !unsafe '{% for m in messages %}{{ m.content }}{% endfor %}']\n")
    loaded = load_inventory(inv)
    svc = loaded.settings_for(loaded.hosts["a"]).services[0]
    assert svc.engine_args[1] == "{% for m in messages %}{{ m.content }}{% endfor %}"
