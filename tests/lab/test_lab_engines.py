"""End-to-end: the real llama.cpp server and real vLLM, pulled by digest and started on a lab host,
answer /health, /v1/models and a streamed chat completion through an SSH forward (as deploy checks)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from llmfleet.images.lock import load_lock

pytestmark = pytest.mark.lab


def pinned_ref(lab, key: str) -> str:
    img = load_lock(lab.lock_path).get(key)
    if not img or not img.digest:
        pytest.fail(f"{key} is not pinned in {lab.lock_path}: run `invoke lab.setup`"
                    + (" --vllm" if key.startswith("vllm") else ""), pytrace=False)
    return f"{img.repository}@{img.digest}"


def wait_health(base: str, timeout: float) -> float:
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < timeout:
        try:
            last = httpx.get(f"{base}/health", timeout=2).status_code
            if last == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"{base}/health not 200 within {timeout}s (last {last})")


def stream_chat(base: str, model: str, max_tokens: int = 16) -> tuple[str, int]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    text, chunks = "", 0
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = chunk["choices"][0].get("delta", {}) if chunk.get("choices") else {}
            if delta.get("content"):
                text += delta["content"]
                chunks += 1
    return text, chunks


def run_engine(lab, host: str, name: str, ref: str, args: list[str], *, extra: list[str] = (),
               timeout: float = 300) -> None:
    lab.exec(host, ["docker", "rm", "-f", name], check=False)
    lab.exec(host, ["docker", "run", "-d", "--name", name, "-p", "127.0.0.1:18000:8000", "--gpus", "all",
                    "-v", "/srv/models:/srv/models:ro", *extra, ref, *args], timeout=timeout)


def test_llama_server_pulled_by_digest_serves_health_models_and_streamed_chat(lab):
    host = "gpu-v100-01"
    ref = pinned_ref(lab, "llamacpp:lab-cpu")
    lab.exec(host, ["docker", "pull", ref], timeout=180)
    name = "t-llama"
    run_engine(lab, host, name, ref, ["-m", lab.gguf_path, "--host", "0.0.0.0", "--port", "8000", "-c", "512",
                                      "-np", "1", "-t", "1", "--alias", "tiny-qwen2"])
    try:
        with lab.connect(host) as r, r.forward(18000) as port:
            base = f"http://127.0.0.1:{port}"
            took = wait_health(base, 30)
            assert took < 30
            models = httpx.get(f"{base}/v1/models", timeout=5).json()
            assert [m["id"] for m in models["data"]] == ["tiny-qwen2"]
            text, chunks = stream_chat(base, "tiny-qwen2")
            assert chunks >= 2 and text.strip() and text.isprintable()
            # deterministic at temperature 0
            assert stream_chat(base, "tiny-qwen2")[0] == text
            metrics = httpx.get(f"{base}/metrics", timeout=5)
            assert metrics.status_code in (200, 501)  # 501 unless started with --metrics
    finally:
        lab.exec(host, ["docker", "rm", "-f", name], check=False)


def test_llama_server_rejects_an_unknown_flag(lab):
    """The lab runs the real binary, so a wrong flag in a role fails here as in production."""
    host = "gpu-v100-01"
    ref = pinned_ref(lab, "llamacpp:lab-cpu")
    lab.exec(host, ["docker", "pull", ref], timeout=180)
    proc = lab.exec(host, ["docker", "run", "--rm", ref, "-m", lab.gguf_path, "--no-such-flag"], check=False,
                    timeout=60)
    assert proc.returncode != 0
    assert "--no-such-flag" in proc.stderr + proc.stdout


def test_broken_image_listens_but_never_healthy(lab):
    host = "gpu-t4-01"
    ref = pinned_ref(lab, "llamacpp:lab-broken")
    lab.exec(host, ["docker", "pull", ref], timeout=180)
    name = "t-broken"
    run_engine(lab, host, name, ref, ["-m", lab.gguf_path, "--port", "8000"])
    try:
        with lab.connect(host) as r, r.forward(18000) as port:
            deadline = time.monotonic() + 20
            code = None
            while time.monotonic() < deadline:
                try:
                    code = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
                    break
                except httpx.HTTPError:
                    time.sleep(0.3)
            assert code == 503
    finally:
        lab.exec(host, ["docker", "rm", "-f", name], check=False)


@pytest.mark.vllm
def test_vllm_serves_health_models_streamed_chat_and_metrics(lab):
    host = "gpu-4090-01"
    ref = pinned_ref(lab, "vllm:lab-cpu")
    lab.exec(host, ["docker", "pull", ref], timeout=600)
    name = "t-vllm"
    run_engine(lab, host, name, ref,
               [lab.hf_path, "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "tiny-qwen2",
                "--dtype", "bfloat16", "--max-model-len", "512", "--enforce-eager"],
               extra=["--shm-size", "1g", "-e", "VLLM_CPU_KVCACHE_SPACE=1"])
    try:
        with lab.connect(host) as r, r.forward(18000) as port:
            base = f"http://127.0.0.1:{port}"
            wait_health(base, 240)
            models = httpx.get(f"{base}/v1/models", timeout=5).json()
            assert [m["id"] for m in models["data"]] == ["tiny-qwen2"]
            text, chunks = stream_chat(base, "tiny-qwen2")
            assert chunks >= 2 and text
            metrics = httpx.get(f"{base}/metrics", timeout=10).text
            assert "vllm:num_requests_running" in metrics
    finally:
        logs = lab.exec(host, ["docker", "logs", "--tail", "20", name], check=False)
        lab.exec(host, ["docker", "rm", "-f", name], check=False)
        print(logs.stdout[-2000:], logs.stderr[-2000:])
