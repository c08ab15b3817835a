"""`invoke preflight --host H --facts FILE [--assume ...]`: the same checks on facts saved with
`invoke facts --host H --json`, without connecting (for a host behind a bastion, or the question
"would these images still run after the planned driver change?")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.errors import UsageError
from llmfleet.images import lock as images
from llmfleet.knowledge import compat
from llmfleet.knowledge.preflight import apply_assumptions, facts_from_saved, parse_assumptions
from tests.test_preflight import DIGEST, facts_for

REPO = Path(__file__).resolve().parents[1]
CAT = compat.load_engine_catalog()


def test_saved_facts_round_trip_through_json():
    f = facts_for("v100-535")
    saved = json.loads(json.dumps(f.model_dump(mode="json")))
    back = facts_from_saved([{"host": "other", "error": "unreachable"}, saved], f.host, "f.json")
    assert back == f
    # what `invoke facts --json` prints now: one document whatever the number of hosts
    doc = {"hosts": [saved], "unreachable": [{"host": "other", "error": "cannot connect"}]}
    assert facts_from_saved(doc, f.host, "f.json") == f


@pytest.mark.parametrize(
    ("data", "host", "said"),
    [
        ({"host": "a", "gpus": []}, "b", "no facts for host b (hosts in the file: a)"),
        ({"host": "b", "error": "ssh: connection refused"}, "b", "are an error"),
        ({"hosts": [], "unreachable": [{"host": "b", "error": "cannot connect"}]}, "b", "are an error"),
        ([1, 2], "b", "expected the JSON"),
        ({"host": "b", "gpus": "many"}, "b", "do not parse"),
    ],
)
def test_bad_saved_facts_are_a_one_line_usage_error(data, host, said):
    with pytest.raises(UsageError, match="f.json: ") as exc:
        facts_from_saved(data, host, "f.json")
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_an_assumed_driver_brings_the_cuda_of_its_branch():
    f = facts_for("v100-535")
    g, notes = apply_assumptions(f, parse_assumptions(["driver=570.133.07"]), CAT)
    assert (g.driver_version, g.cuda_driver_version) == ("570.133.07", "12.8")
    assert f.driver_version == "535.183.06"  # the saved facts are not changed
    assert notes == ["driver 535.183.06 -> 570.133.07 (CUDA 12.8 from its branch)"]
    g, _ = apply_assumptions(f, parse_assumptions(["toolkit=1.17.8", "default-runtime=nvidia"]), CAT)
    assert (g.toolkit.version, g.docker.default_runtime) == ("1.17.8", "nvidia")


@pytest.mark.parametrize(("items", "said"), [
    (["gpu=H100"], "unknown key 'gpu'"),
    (["driver"], "write KEY=VALUE"),
    (["driver=latest"], "not a version like 550.127.05"),
])
def test_bad_assumptions_are_usage_errors(items, said):
    with pytest.raises(UsageError, match=said):
        parse_assumptions(items)


def _setup(tmp_path: Path, image: str = "llamacpp:server-cuda-12.8") -> tuple[Path, Path]:
    f = facts_for("v100-535")
    f.host = "gpu-v100-07"
    (tmp_path / "facts.json").write_text(json.dumps([f.model_dump(mode="json")]))
    lock = images.ImageLock(images={image: images.LockedImage(
        key=image, repository="ghcr.io/ggml-org/llama.cpp", digest=DIGEST, tag="server-cuda", cuda="12.8.1")})
    images.write_lock(lock, tmp_path / "images.lock")
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    gpu-v100-07:\n      ansible_host: 192.0.2.7\n"
        "      llmfleet_images_lock: images.lock\n"
        "      llmfleet_services:\n"
        "        - {name: chat, engine: llamacpp, model: qwen2.5-7b-instruct, quant: q4_k_m, port: 8080,\n"
        f"           model_path: /srv/models/qwen2.5-7b-instruct-q4_k_m.gguf, image: '{image}', context: 8192}}\n")
    return tmp_path / "hosts.yml", tmp_path / "facts.json"


def inv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_preflight_from_saved_facts_and_an_assumed_driver_upgrade(tmp_path):
    """A V100 on R535 cannot JIT the PTX of a CUDA 12.8 llama.cpp image (minor-version compatibility
    does not cover PTX JIT); the same saved facts with an assumed R570 driver pass the check. The
    192.0.2.7 address (TEST-NET-1) is never contacted."""
    hosts, facts = _setup(tmp_path)
    res = inv("preflight", "-i", str(hosts), "--host", "gpu-v100-07", "--facts", str(facts), "--json")
    assert res.returncode == 1, res.stderr
    (report,) = json.loads(res.stdout)["reports"]
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["offline"]["status"] == "warn" and str(facts) in checks["offline"]["message"]
    assert checks["cuda-driver"]["status"] == "fail" and "PTX JIT" in checks["cuda-driver"]["message"]

    res = inv("preflight", "-i", str(hosts), "--host", "gpu-v100-07", "--facts", str(facts),
              "--assume", "driver=570.133.07", "--json")
    (report,) = json.loads(res.stdout)["reports"]
    checks = {c["id"]: c for c in report["checks"]}
    assert "driver 535.183.06 -> 570.133.07" in checks["offline"]["message"]
    assert checks["cuda-driver"]["status"] == "pass", checks["cuda-driver"]
    assert res.returncode == (0 if all(c["status"] != "fail" for c in checks.values()) else 1)


def test_an_assumed_driver_after_r580_fails_on_a_v100(tmp_path):
    """R580 is the last branch for Maxwell, Pascal and Volta (NVIDIA's Unix graphics feature
    deprecation schedule): the driver-upgrade pre-check on a V100 must refuse R595."""
    hosts, facts = _setup(tmp_path)
    res = inv("preflight", "-i", str(hosts), "--host", "gpu-v100-07", "--facts", str(facts),
              "--assume", "driver=595.45.04", "--json")
    assert res.returncode == 1, res.stderr
    (report,) = json.loads(res.stdout)["reports"]
    check = {c["id"]: c for c in report["checks"]}["cuda-driver"]
    assert check["status"] == "fail" and "R580 is the last branch" in check["message"], check
    assert "R580" in check["fix"]


@pytest.mark.parametrize(("args", "said"), [
    (["--assume", "driver=570.133.07"], "--assume needs --facts"),
    (["--facts", "FACTS", "--assume", "colour=blue"], "unknown key 'colour'"),
    (["--facts", "/nonexistent/facts.json"], "cannot read the saved facts"),
])
def test_offline_usage_errors_exit_2_and_contact_nothing(tmp_path, args, said):
    hosts, facts = _setup(tmp_path)
    args = [str(facts) if a == "FACTS" else a for a in args]
    res = inv("preflight", "-i", str(hosts), "--host", "gpu-v100-07", *args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert said in res.stderr + res.stdout and "Traceback" not in res.stderr
