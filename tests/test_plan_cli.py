"""`invoke plan` prints the short answer first and the rest only with --explain; --json keeps every key
it had and adds the deploy's floor; a service's floor is the one the deploy gates on, with its source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SEED = ("--gpu", "Tesla V100-SXM2-32GB", "--model", "qwen3-32b")
# every key `invoke plan --json` printed before the short answer existed
JSON_KEYS = {
    "alternatives", "assumptions", "budget_bytes", "comm", "concurrency", "context", "decode_tokps_ceiling",
    "decode_tokps_offload_eighth", "decode_tokps_realistic", "deploy_adds", "efficiency", "efficiency_assumption",
    "engine", "engine_args", "engine_env", "fits", "fleet_measured", "gpu", "gpu_layers", "gpu_memory_utilization",
    "gpu_name", "gpus", "health_floor_tokps", "hosts", "image", "kv_bytes_per_sequence", "kv_bytes_per_token",
    "kv_cache_bytes", "kv_cache_tokens", "kv_dtype", "kv_sliding_bytes_per_token", "kv_sliding_window",
    "kv_state_bytes_per_sequence", "layers_per_device", "layers_per_host", "max_concurrency", "max_context_tokens",
    "memory_bytes", "model", "model_origin", "notes", "offload_assumption", "overhead_assumption", "overhead_bytes",
    "params", "per_gpu", "pipeline_parallel_size", "preflight", "quant", "resident", "split_mode",
    "tensor_parallel_size", "tensor_split", "total_layers", "weights_bytes", "weights_gpu_bytes", "weights_source",
}


def _invoke(*args: str, home: Path, columns: int = 120) -> subprocess.CompletedProcess[str]:
    # an empty speed cache (HOME, XDG dirs) and a fixed width, so the line counts are the same everywhere
    env = dict(os.environ, COLUMNS=str(columns), HOME=str(home), XDG_STATE_HOME=str(home / "state"),
               XDG_CACHE_HOME=str(home / "cache"))
    return subprocess.run([sys.executable, "-m", "invoke", "plan", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("home")


def test_a_fitting_plan_is_a_short_answer(home):
    r = _invoke(*SEED, "--quant", "gptq-int4", home=home)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) <= 15 and len(r.stdout.split()) <= 150, r.stdout
    text = " ".join(r.stdout.split())
    assert lines[0].startswith("FITS") and "qwen3-32b (gptq-int4) on 1 x Tesla V100-SXM2-32GB, vllm" in text
    assert "engine flags --quantization gptq" in text and "--max-model-len" in text
    assert "decode about " in text and "tok/s at batch 1 (predicted " in text
    assert "health floor " in text and "the planner's sanity bound" in text
    assert "`invoke deploy --host HOST`" in text and "--explain" in text
    for detail in ("assumptions:", "efficiency:", "bench/", "per layer", "KV at the plan", "overhead"):
        assert detail not in text, detail


def test_a_plan_that_does_not_fit_says_why_and_what_would(home):
    r = _invoke(*SEED, home=home)
    assert r.returncode == 1 and "does not fit" in r.stderr and r.stderr.count("\n") == 1
    lines = r.stdout.strip().splitlines()
    assert len(lines) <= 12, r.stdout
    text = " ".join(r.stdout.split())
    assert lines[0].startswith("DOES NOT FIT") and "do not fit 1 x Tesla V100-SXM2-32GB" in text
    assert "what would fit --quant gptq-int4: up to" in text and "assumptions:" not in text


def test_explain_adds_everything_after_the_short_answer(home):
    short = _invoke(*SEED, "--quant", "gptq-int4", home=home)
    r = _invoke(*SEED, "--quant", "gptq-int4", "--explain", home=home)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(short.stdout)  # the same answer first
    rest = " ".join(r.stdout[len(short.stdout):].split())
    for detail in ("assumptions:", "efficiency:", "KV at the plan", "decode ceiling", "health floor",
                   "with the health probe's 512 tokens in context", "gptq-int4: group size 128 assumed"):
        assert detail in rest, detail
    assert len(r.stdout.splitlines()) > 2 * len(short.stdout.splitlines())


def test_json_keeps_its_keys_and_adds_the_deploys_floor(home):
    r = _invoke(*SEED, "--quant", "gptq-int4", "--json", home=home)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert JSON_KEYS <= set(d), JSON_KEYS - set(d)
    lo, hi = d["decode_tokps_realistic"]
    assert d["decode_tokps_expected"] == pytest.approx((lo + hi) / 2, abs=0.01)
    assert d["deploy_floor"]["tokps"] == d["health_floor_tokps"] and d["deploy_floor"]["where"] is None
    assert "planner's floor" in d["deploy_floor"]["source"]
    assert json.loads(_invoke(*SEED, "--quant", "gptq-int4", "--json", "--explain", home=home).stdout) == d


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    """A host whose group_vars give its service an absolute floor, as the lab's inventory does."""
    inv = tmp_path_factory.mktemp("inv")
    (inv / "group_vars").mkdir()
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    gpu-a:\n      ansible_host: 127.0.0.1\n"
                                   "      llmfleet_gpu: Tesla V100-SXM2-32GB\n")
    (inv / "group_vars" / "all.yml").write_text(
        "llmfleet_services:\n"
        "  - {name: chat, engine: vllm, model: qwen3-32b, model_path: /srv/m, image: 'vllm:x', quant: gptq-int4,"
        " context: 8192, health: {min_tokps: 2}}\n")
    return inv


def test_a_services_floor_is_the_deploys_and_says_where_it_is_set(inventory, home):
    r = _invoke("--inventory", str(inventory), "--host", "gpu-a", home=home)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) <= 15, r.stdout
    text = " ".join(r.stdout.split())
    j = json.loads(_invoke("--inventory", str(inventory), "--host", "gpu-a", "--json", home=home).stdout)
    chat = j["services"]["chat"]
    planner = chat["health_floor_tokps"]
    assert chat["deploy_floor"] == {"tokps": 2.0, "source": "the service's health.min_tokps 2 tok/s",
                                    "where": str(inventory / "group_vars" / "all.yml")}
    assert text.startswith("gpu-a / chat FITS")
    assert (f"health floor 2.0 tok/s with 512 tokens in context from the service's health.min_tokps "
            f"({inventory / 'group_vars' / 'all.yml'}), not the planner's {planner:,.1f} tok/s") in text
    assert "`invoke deploy --host gpu-a`" in text


def test_the_docs_show_what_plan_prints(home):
    """docs/planner.md's first example is the output of its command, as printed 110 columns wide."""
    import re
    import shlex

    doc = (REPO / "docs" / "planner.md").read_text()
    block = re.search(r"```text\n\$ invoke plan (.+?)\n(.*?)```", doc, re.S)
    assert block is not None
    r = _invoke(*shlex.split(block.group(1)), home=home, columns=110)
    assert r.returncode == 0, r.stderr
    assert [line.rstrip() for line in r.stdout.splitlines()] == block.group(2).rstrip("\n").splitlines()
    readme = (REPO / "README.md").read_text()
    assert "\n".join("  " + line for line in block.group(0).splitlines()) in readme  # the README shows the same
