"""The llmfleet_* namespace: valid services load, bad ones give one-line errors naming file, host, field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmfleet.errors import InventoryError
from llmfleet.inventory.ansible import check_all, load_inventory

REPO = Path(__file__).resolve().parents[1]
GOOD = {"name": "qwen", "engine": "vllm", "model": "qwen2.5-7b-instruct", "model_path": "/srv/models/q", "image": "vllm:0.6.6.post1"}


def inventory_with(tmp_path: Path, services, extra_host_vars=None) -> Path:
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("gpus:\n  hosts:\n    gpu-1:\n    gpu-2:\n")
    (inv / "host_vars" / "gpu-1.yml").write_text(
        yaml.safe_dump({"llmfleet_services": services, **(extra_host_vars or {})})
    )
    return inv


def test_valid_services_load_and_other_variables_pass_through(tmp_path):
    inv = load_inventory(inventory_with(tmp_path, [GOOD, {**GOOD, "name": "b", "port": 8001, "engine": "llamacpp"}],
                                        {"ntp_servers": ["x"]}))
    settings = check_all(inv)
    assert [s.name for s in settings["gpu-1"].services] == ["qwen", "b"]
    assert settings["gpu-2"].services == []
    assert inv.hosts["gpu-1"].vars["ntp_servers"] == ["x"]


@pytest.mark.parametrize(
    ("services", "extra", "message"),
    [
        ([{**GOOD, "prot": 80}], None, r"llmfleet_services\[0\]\.prot: unknown key"),
        ([{**GOOD, "port": "http"}], None, r"llmfleet_services\[0\]\.port: .*integer.*got 'http'"),
        ([{**GOOD, "port": 70000}], None, r"llmfleet_services\[0\]\.port: .*less than or equal to 65535"),
        ([{k: v for k, v in GOOD.items() if k != "engine"}], None, r"llmfleet_services\[0\]\.engine: required field is missing"),
        ([{**GOOD, "engine": "tgi"}], None, r"engine: Input should be 'vllm', 'llamacpp', 'node-exporter', 'dcgm-exporter' or 'gateway', got 'tgi'"),
        ([{**GOOD, "model_path": "models/q"}], None, r"model_path: .*absolute path on the host"),
        ([{**GOOD, "name": "Bad Name;rm"}], None, r"llmfleet_services\[0\]\.name: .*pattern"),
        ([{**GOOD, "gpus": [0, "one"]}], None, r"llmfleet_services\[0\]\.gpus\[1\]"),
        ([GOOD, GOOD], None, r"llmfleet_services: .*service name 'qwen' appears twice"),
        ([GOOD, {**GOOD, "name": "b"}], None, r"both use port 8000"),
        ([{**GOOD, "env": {"HF_TOKEN": "x"}}], None, r"HF_TOKEN looks like a secret"),
        ([{**GOOD, "api_key": {"from_env": "A", "from_file": "/b"}}], None, r"exactly one of from_env or from_file"),
        ([GOOD], {"llmfleet_sevices": []}, r"llmfleet_sevices: unknown key"),
        ("not-a-list", None, r"llmfleet_services: .*valid list"),
        # very long strings and lists: refused with the field, the value cut short with its length
        ([{**GOOD, "served_name": "x" * 100_000}], None,
         r"served_name: String should have at most 256 characters, got 'x{59}\.\.\. \(100,000 characters\)$"),
        ([{**GOOD, "env": {"NOTE": "y" * 1_000_000}}], None, r"env\.NOTE: .*at most 4096 characters.*1,000,000 char"),
        ([{**GOOD, "engine_args": ["z" * 5000]}], None, r"engine_args\[0\]: .*at most 4096 characters"),
        ([{**GOOD, "engine_args": ["--x"] * 1000}], None, r"engine_args: List should have at most 256 items"),
        ([{**GOOD, "quant": "q" * 5000}], None, r"quant: .*at most 4096 characters"),
        ([{**GOOD, "env": {"A\n$(touch /tmp/x)": "1"}}], None, r"env\.\['A\\n\$\(touch /tmp/x\)'\]\.\[key\]: .*pattern"),
        ([GOOD], {"llmfleet_gpu": "g" * 10_000}, r"llmfleet_gpu: .*at most 4096 characters"),
    ],
)
def test_bad_services_are_one_line_errors(tmp_path, services, extra, message):
    inv = load_inventory(inventory_with(tmp_path, services, extra))
    with pytest.raises(InventoryError, match=message) as err:
        check_all(inv)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(str(tmp_path / "inv" / "host_vars" / "gpu-1.yml") + ": host gpu-1: ")


def test_api_key_literal_is_refused_without_echoing_it(tmp_path):
    inv = load_inventory(inventory_with(tmp_path, [{**GOOD, "api_key": "sk-live-SECRET123"}]))
    with pytest.raises(InventoryError) as err:
        check_all(inv)
    assert "SECRET123" not in str(err.value)
    assert "from_env" in str(err.value)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_cli_check_exit_codes_and_one_line_error(tmp_path):
    inv = inventory_with(tmp_path, [{**GOOD, "port": "http"}])
    res = run_cli("inventory", "-i", str(inv), "--check")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0
    assert "host_vars/gpu-1.yml: host gpu-1: service qwen: llmfleet_services[0].port" in res.stderr
    assert "Traceback" not in res.stderr
    # --list validates only structure, as ansible-inventory does
    assert run_cli("inventory", "-i", str(inv), "--list").returncode == 0


def test_cli_example_inventory_is_valid():
    res = run_cli("inventory", "-i", "inventory/example", "--check", "--json")
    assert res.returncode == 0, res.stderr
    assert '"gpu-v100-01"' in res.stdout


def test_bad_values_are_refused_in_one_short_line(tmp_path):
    inv = load_inventory(inventory_with(tmp_path, [{**GOOD, "env": {"NOTE": "y" * 1_000_000}}]))
    with pytest.raises(InventoryError) as err:
        check_all(inv)
    assert len(str(err.value)) < 400
