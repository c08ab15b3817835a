"""``invoke bench`` on the lab, as an operator runs it (a subprocess), checked on the hosts themselves.

Two lab hosts of this module's own (``bench-01``, ``bench-02``, group ``bench_lab``) serve llama.cpp at
4 slots and one thread: on this shared 2-core machine one thread is the setting whose speed holds
still (with two or more, ggml's threads spin at barriers while other work holds the cores, and
decode swings between 1 and 500 tok/s; docs/bench.md has the figures). The bench itself runs on a
larger generated GGUF (~12 M parameters, ~100 tok/s on one thread): the tiny model decodes thousands
of tokens a second, faster than the SSH tunnel's jitter lets a client time.

- a bench at 1 and 4 streams gives plausible non-zero figures, and 4 streams out-produce one;
  bench.json lands in the release's folder on the host and a copy locally; --plot draws it;
- --compare reads two releases' results back and shows the change;
- upgrade --bench-gate stops a rollout whose canary is slowed on purpose: the upgrade points the
  service at a model file with ~40x the arithmetic per token (the CPU counterpart of weights left in
  slow memory); the canary is rolled back, the next batch never starts;
- a bench of real vLLM (CPU) at 1 and 4 streams (marked vllm).

The tests run in file order on the same hosts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmfleet.knowledge import release_state
from llmfleet.lab import hosts as lab_hosts
from llmfleet.lab import models
from llmfleet.release import store as R

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
HOSTS = ["bench-01", "bench-02"]
ROOT = "/opt/llmfleet"
SMALL_DIR = "/srv/models/bench-small"
SMALL = f"{SMALL_DIR}/small.gguf"
# ~12 M parameters (f32): about 40x the tiny model's arithmetic per token
SMALL_SHAPE = models.Shape(hidden=512, heads=8, kv_heads=2, layers=4, ffn=1536, ctx=4096)


def service(**extra) -> dict:
    svc = {
        "name": "tiny", "engine": "llamacpp", "model": "tiny-qwen2",
        "model_path": "/srv/models/tiny-qwen2-gguf/tiny-qwen2.gguf", "image": "llamacpp:lab-cpu", "port": 8000,
        "context": 512, "concurrency": 4, "served_name": "tiny-qwen2", "engine_args": ["-t", "1"],
        "health": {"load_timeout_s": 60, "stage_timeout_s": 15, "min_tokps": 0.5, "max_tokens": 16},
    }
    svc.update(extra)
    return svc


class Bench:
    def __init__(self, lab, tmp: Path) -> None:
        self.lab = lab
        self.tmp = tmp
        self.inventory = tmp / "inventory"
        shutil.copytree(lab.inventory_path, self.inventory)
        ports = lab_hosts.free_ports(len(HOSTS))
        hosts = {h: {"ansible_port": p, "lab_gpu": "Tesla V100-SXM2-32GB", "lab_driver": "535.183.01",
                     "llmfleet_gpu": "Tesla V100-SXM2-32GB", "llmfleet_services": [service()]}
                 for h, p in zip(HOSTS, ports, strict=True)}
        (self.inventory / "zz-bench.yml").write_text(yaml.safe_dump(
            {"all": {"children": {"lab": {"children": {"bench_lab": {"hosts": hosts}}}}}}))
        self.audit_log = tmp / "audit.jsonl"
        self.bench_dir = tmp / "bench-results"

    def up(self) -> None:
        lab_hosts.up(str(self.inventory), lab=self.lab.name, names=HOSTS, known_hosts=self.lab.known_hosts,
                     key_path=self.lab.key_path)
        small = models.write_gguf(self.tmp / "small.gguf", shape=SMALL_SHAPE)
        for h in HOSTS:
            self.lab.exec(h, ["mkdir", "-p", SMALL_DIR])
            subprocess.run(["docker", "cp", str(small), f"{self.lab.container(h)}:{SMALL}"], check=True,
                           capture_output=True, timeout=120)

    def invoke(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(self.lab.known_hosts),
                   INVOKE_LLMFLEET_AUDIT_LOG=str(self.audit_log), INVOKE_LLMFLEET_BENCH_DIR=str(self.bench_dir),
                   COLUMNS="200")
        argv = [sys.executable, "-m", "invoke", args[0], "-i", str(self.inventory), *args[1:]]
        res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
        return res

    def json(self, *args: str) -> tuple[int, dict, str]:
        res = self.invoke(*args, "--json")
        try:
            return res.returncode, json.loads(res.stdout), res.stderr
        except ValueError:
            raise AssertionError(f"rc {res.returncode}: {res.stdout[-1000:]!r} {res.stderr[-3000:]}") from None

    def state(self, host: str) -> release_state.ServiceState:
        out = self.lab.exec(host, ["sh", "-c", R.state_script(ROOT)]).stdout
        return release_state.parse_state(out)["tiny"]

    def host_bench(self, host: str, release: str) -> dict:
        out = self.lab.exec(host, ["cat", f"{ROOT}/services/tiny/releases/{release}/bench.json"]).stdout
        return json.loads(out)

    def set_service(self, host: str, **extra) -> None:
        path = self.inventory / "host_vars" / f"{host}.yml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump({"llmfleet_services": [service(**extra)]}))


@pytest.fixture(scope="module")
def bench(lab, tmp_path_factory):
    b = Bench(lab, tmp_path_factory.mktemp("bench"))
    b.up()
    yield b
    lab_hosts.down(lab.name, names=HOSTS, known_hosts=lab.known_hosts)


def levels(doc: dict) -> dict[int, dict]:
    return {lv["concurrency"]: lv for lv in doc["levels"]}


def test_bench_llamacpp_one_and_four_streams(bench):
    # the larger model: its decode (~100 tok/s on one thread) is what is timed, not the tunnel's jitter
    bench.set_service("bench-01", model_path=SMALL)
    rc, doc, err = bench.json("deploy", "--host", "bench-01")
    assert rc == 0, err[-3000:]
    release = bench.state("bench-01").current
    plot = bench.tmp / "one.html"
    rc, out, err = bench.json("bench", "--host", "bench-01", "--concurrency", "1,4", "--prompt-tokens", "32",
                              "--max-tokens", "32", "--requests", "8", "--plot", str(plot))
    assert rc == 0, err[-3000:]
    res = out["result"]
    assert res["release"] == release and res["engine"] == "llamacpp" and res["lab"] is True
    one, four = levels(res)[1], levels(res)[4]
    for lv in (one, four):
        assert lv["requests"] == 8 and lv["ok"] == 8 and lv["errors"] == 0, lv
        assert lv["output_tokens"] == 8 * 32  # ignore_eos: every answer is exactly max_tokens long
        assert 0 < lv["ttft_p50_s"] <= lv["ttft_p95_s"] < 30
        assert 1 < lv["decode_tokps_p50"] < 100_000 and 1 < lv["aggregate_tokps"] < 100_000
        assert 10 <= lv["prompt_tokens"] <= 80  # sized with the engine's own count (asked: 32)
        assert lv["gpu_samples"] >= 1  # nvidia-smi (the simulator) was read during the run
    # What the run reports, not how two noisy timings compare on shared cores (the ratio of the levels is
    # bench's own output: `bench --concurrency 1,4` prints it)
    assert sorted(levels(res)) == [1, 4] and (one["concurrency"], four["concurrency"]) == (1, 4)
    # the engine's /metrics read at each level's start and end at least (whether a reading falls while
    # requests run is a matter of timing on shared cores)
    assert one["metrics_samples"] >= 2 and four["metrics_samples"] >= 2
    assert four["requests_running_max"] is not None and four["requests_running_max"] >= 0
    # the plan beside it: the planner's figures for the (simulated) card, from the kept manifest or the planner
    assert res["plan"]["card"] and res["plan"]["ceiling_tokps"] > 0
    assert any("lab host" in n for n in res["notes"])
    # kept with the release on the host, and locally
    assert bench.host_bench("bench-01", release) == res
    local = list((bench.bench_dir / "bench-01" / "tiny" / release).glob("*.json"))
    assert len(local) == 1 and json.loads(local[0].read_text()) == res
    assert "<svg" in plot.read_text() and release in plot.read_text()


def test_a_failing_health_check_refuses_the_bench(bench):
    bench.lab.exec("bench-01", ["systemctl", "stop", "llmfleet-tiny.service"], timeout=120)
    try:
        res = bench.invoke("bench", "--host", "bench-01", "--concurrency", "1", "--requests", "2")
        assert res.returncode == 1
        assert "health check failed" in res.stderr and "not benchmarking" in res.stderr
        assert "level:" not in res.stderr  # no load was sent
    finally:
        bench.lab.exec("bench-01", ["systemctl", "start", "llmfleet-tiny.service"], timeout=120)
    rc, doc, err = bench.json("deploy", "--host", "bench-01")  # back to healthy (restart, health check)
    assert rc == 0, err[-2000:]


def test_compare_two_releases(bench):
    first = bench.state("bench-01").current
    bench.set_service("bench-01", model_path=SMALL, context=384)  # a second release: a changed context
    rc, doc, err = bench.json("deploy", "--host", "bench-01")
    assert rc == 0, err[-3000:]
    second = bench.state("bench-01").current
    assert second != first
    rc, out, err = bench.json("bench", "--host", "bench-01", "--concurrency", "1,4", "--prompt-tokens", "32",
                              "--max-tokens", "32", "--requests", "4")
    assert rc == 0, err[-3000:]
    png = bench.tmp / "compare.png"
    rc, cmp, err = bench.json("bench", "--host", "bench-01", "--compare", f"{first},{second}", "--plot", str(png))
    assert rc == 0, err[-3000:]
    assert cmp["a"]["release"] == first and cmp["b"]["release"] == second
    rows = {r["concurrency"]: r for r in cmp["comparison"]}
    assert sorted(rows) == [1, 4] and all(r["in_both"] for r in rows.values())
    d = rows[1]["decode_tokps_p50"]
    assert d["a"] == levels(cmp["a"])[1]["decode_tokps_p50"] and d["b"] == levels(out["result"])[1]["decode_tokps_p50"]
    assert d["change_pct"] == pytest.approx((d["b"] - d["a"]) / d["a"] * 100, abs=0.1)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the table for people
    res = bench.invoke("bench", "--host", "bench-01", "--compare", first, "--compare", second)
    assert res.returncode == 0 and first in res.stdout and second in res.stdout and "decode p50" in res.stdout
    # a release with no result anywhere: exit 1, says where it looked
    rc = bench.invoke("bench", "--host", "bench-01", "--compare", f"{first},20200101T000000Z-0000000000")
    assert rc.returncode == 1 and "no bench result for release 20200101T000000Z-0000000000" in rc.stderr


def test_bench_gate_stops_an_upgrade_whose_canary_is_slowed(bench):
    for h in HOSTS:
        bench.set_service(h)
        rc, doc, err = bench.json("deploy", "--host", h)
        assert rc == 0, err[-3000:]
    before = {h: bench.state(h).current for h in HOSTS}
    rc, doc, err = bench.json("upgrade", "--group", "bench_lab", "--set", f"model_path={SMALL}", "--serial", "1,100%",
                              "--bench-gate", "50")
    assert rc == 1, err[-3000:]
    hosts = {h["host"]: h for h in doc["hosts"]}
    canary = hosts["bench-01"]
    assert doc["aborted"] and canary["result"] == "rolled_back", canary
    assert "bench gate" in canary["reason"] and "slower than" in canary["reason"], canary["reason"]
    assert hosts["bench-02"]["result"] == "skipped"
    # the canary is back on the release it ran, healthy; the next batch was never touched
    st = bench.state("bench-01")
    assert st.current == before["bench-01"] and st.unit == "active"
    assert bench.state("bench-02").current == before["bench-02"]
    # both measurements are kept: the baseline with the old release, the slow one with the new
    slow = re.search(r"release (\S+): decode", canary["reason"]).group(1)
    assert slow in st.releases and slow != before["bench-01"]
    fast_doc, slow_doc = bench.host_bench("bench-01", before["bench-01"]), bench.host_bench("bench-01", slow)
    # what the gate reported (its verdict and figures), and that those figures are the ones kept with
    # each release: the test compares no two timings itself
    m = re.search(r"decode ([\d.]+) tok/s is (\d+)% slower than ([\d.]+) tok/s of the replaced release "
                  r"\(concurrency 1, prompt 64; allowed: 50%\)", canary["reason"])
    assert m and int(m.group(2)) >= 50, canary["reason"]
    assert m.group(1) == f"{levels(slow_doc)[1]['decode_tokps_p50']:.1f}", (m.group(0), slow_doc["levels"])
    assert m.group(3) == f"{levels(fast_doc)[1]['decode_tokps_p50']:.1f}", (m.group(0), fast_doc["levels"])
    assert "bench gate: tiny: pass" not in err


@pytest.mark.vllm
def test_bench_vllm_one_and_four_streams(bench, lab):
    lab.ensure_hosts("gpu-4090-01")
    # the lab's vLLM service, with room to start on a busy machine (its engine start is CPU-bound)
    vllm = yaml.safe_load((bench.inventory / "group_vars" / "lab_vllm.yml").read_text())["llmfleet_services"][0]
    vllm["health"] = {**vllm.get("health", {}), "load_timeout_s": 900}
    path = bench.inventory / "host_vars" / "gpu-4090-01.yml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({"llmfleet_services": [vllm]}))
    rc, doc, err = bench.json("deploy", "--host", "gpu-4090-01")
    assert rc == 0, err[-3000:]
    rc, out, err = bench.json("bench", "--host", "gpu-4090-01", "--concurrency", "1,4", "--prompt-tokens", "32",
                              "--max-tokens", "32", "--requests", "8")
    assert rc == 0, err[-3000:]
    res = out["result"]
    assert res["engine"] == "vllm"
    one, four = levels(res)[1], levels(res)[4]
    for lv in (one, four):
        assert lv["ok"] == 8 and lv["output_tokens"] == 8 * 32
        assert lv["decode_tokps_p50"] > 0 and lv["aggregate_tokps"] > 0 and lv["ttft_p50_s"] > 0
        assert lv["metrics_samples"] >= 2  # vLLM's /metrics was read at the level's start and end at least
    # what the run reports (levels, counts, metrics read); the 1-vs-4 ratio is bench's output, not a test's
    assert sorted(levels(res)) == [1, 4] and (one["concurrency"], four["concurrency"]) == (1, 4)
    assert four["kv_cache_usage_max"] is not None  # vLLM reports its KV-cache usage
