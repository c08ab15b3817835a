"""The load generator against a fake OpenAI-compatible server on loopback (streams SSE with known timing).

The fake server sends the first token after ``prefill_s`` and the others every ``token_s``, and can
serve only ``slots`` requests at once (the rest wait, as an engine's queue does): the measured TTFT,
decode speed and aggregate follow from those numbers.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llmfleet.fleet import bench as B
from llmfleet.fleet import loadgen


class Fake:
    def __init__(self, prefill_s=0.05, token_s=0.01, slots=8, status=200, usage=True, key=None):
        self.prefill_s, self.token_s, self.status, self.usage, self.key = prefill_s, token_s, status, usage, key
        self.sem = threading.Semaphore(slots)
        self.bodies: list[dict] = []
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()
        self.metrics_reads = 0

    def handler(self):
        fake = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):  # /metrics in vLLM's names: one request running, KV cache 25 % used
                body = (b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
                        b"vllm:kv_cache_usage_perc 0.25\n") if self.path == "/metrics" else b""
                fake.metrics_reads += self.path == "/metrics"
                self.send_response(200 if body else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                if fake.key and self.headers.get("Authorization") != f"Bearer {fake.key}":
                    self.send_response(401)
                    self.send_header("Content-Length", "12")
                    self.end_headers()
                    self.wfile.write(b"unauthorized")
                    return
                if fake.status != 200:
                    msg = b'{"error":"overloaded"}'
                    self.send_response(fake.status)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def send(obj):
                    data = (f"data: {obj}\n\n" if isinstance(obj, str) else f"data: {json.dumps(obj)}\n\n").encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

                with fake.sem:
                    with fake.lock:
                        fake.active += 1
                        fake.max_active = max(fake.max_active, fake.active)
                    try:
                        time.sleep(fake.prefill_s)
                        n = body["max_tokens"]
                        for i in range(n):
                            if i:
                                time.sleep(fake.token_s)
                            send({"choices": [{"delta": {"content": f"t{i} "}}]})
                        if fake.usage:
                            words = len(body["messages"][0]["content"].split())
                            send({"choices": [], "usage": {"completion_tokens": n, "prompt_tokens": 2 * words}})
                        send("[DONE]")
                    finally:
                        with fake.lock:
                            fake.active -= 1
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return H


class Quiet(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a client that hung up (a timed-out request): not news
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture
def serve():
    servers = []

    def start(fake: Fake) -> str:
        srv = Quiet(("127.0.0.1", 0), fake.handler())
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def level(url, fake_key=None, **kw):
    args = dict(concurrency=1, words=10, max_tokens=11, requests=2, duration_s=None, timeout_s=10)
    args.update(kw)
    return loadgen.run_level(loadgen.Target(url, "m", fake_key), **args)


def test_one_stream_ttft_and_decode_follow_the_servers_timing(serve):
    fake = Fake(prefill_s=0.10, token_s=0.02)
    url = serve(fake)
    res = level(url, requests=3)
    assert len(res) == 3 and all(r.ok for r in res)
    for r in res:
        assert r.output_tokens == 11
        assert r.ttft_s >= 0.09  # the server's prefill, whatever the load
        # the server sleeps 0.10 s, then 0.02 s per token: a request can never take less; how the client
        # sees the tokens spread on a shared machine (bunched after a late first token, or spread out) is
        # not asserted: a speed band would be a timing test
        assert r.ended - r.started >= 0.10 + 10 * 0.02 - 0.005
        assert r.decode_tokps is not None and r.decode_tokps > 0
        assert r.prompt_tokens == 2 * len(loadgen.prompt_text(10, 1).split())
    body = fake.bodies[0]
    assert body["stream"] is True and body["ignore_eos"] is True and body["max_tokens"] == 11
    assert body["stream_options"] == {"include_usage": True} and body["model"] == "m"
    # every request's prompt differs from its first words on (no shared prefix to cache)
    prompts = [b["messages"][0]["content"] for b in fake.bodies]
    assert len({p.split()[1] for p in prompts}) == len(prompts)


def test_concurrent_streams_run_at_once_and_every_token_is_counted(serve):
    fake = Fake(prefill_s=0.02, token_s=0.02, slots=4)
    url = serve(fake)
    one = B.aggregate_level(1, 10, 11, level(url, concurrency=1, requests=4))
    four = B.aggregate_level(4, 10, 11, level(url, concurrency=4, requests=8))
    assert fake.max_active == 4
    assert four.ok == 8 and four.requests == 8 and one.ok == 4
    assert four.output_tokens == 8 * 11 and one.output_tokens == 4 * 11  # counted, not timed against each other


def test_requests_beyond_the_servers_slots_queue_and_show_in_ttft(serve):
    fake = Fake(prefill_s=0.01, token_s=0.01, slots=1)
    url = serve(fake)
    lv = B.aggregate_level(4, 10, 11, level(url, concurrency=4, requests=4))
    assert fake.max_active == 1
    # the last of four queued requests waits for three others (~0.1 s each) before its first token
    assert lv.ttft_p95_s > 0.2
    assert lv.decode_tokps_p50 > 40  # once it runs, a request decodes at the server's speed


def test_a_duration_bounds_the_level_and_no_request_starts_after_it(serve):
    url = serve(Fake(prefill_s=0.0, token_s=0.02))
    t0 = time.monotonic()
    res = level(url, concurrency=2, requests=None, duration_s=0.5, max_tokens=6)
    took = time.monotonic() - t0
    assert took < 0.5 + 1.5
    assert all(r.started <= t0 + 0.5 + 0.05 for r in res)
    assert 2 <= len(res) <= 2 * (0.5 / 0.1) + 2


def test_http_errors_and_refused_keys_are_counted_not_raised(serve):
    url = serve(Fake(status=503))
    res = level(url, requests=3)
    assert [r.ok for r in res] == [False] * 3 and res[0].error.startswith("HTTP 503")
    lv = B.aggregate_level(1, 10, 11, res)
    assert lv.errors == 3 and lv.aggregate_tokps is None and lv.error_samples == [res[0].error]
    url = serve(Fake(key="k1"))
    assert not level(url, requests=1)[0].ok
    assert level(url, fake_key="k1", requests=1)[0].ok


def test_a_slow_request_times_out_and_the_level_still_ends(serve):
    url = serve(Fake(prefill_s=3.0))
    t0 = time.monotonic()
    res = level(url, requests=1, timeout_s=0.5)
    assert time.monotonic() - t0 < 3
    assert not res[0].ok and "within 0.5s" in res[0].error


def test_nothing_listening_is_an_error_per_request():
    res = level("http://127.0.0.1:9", requests=2, timeout_s=2)
    assert len(res) == 2 and not any(r.ok for r in res)
    assert "Connect" in res[0].error


def test_calibration_sizes_prompts_with_the_engines_count(serve):
    url = serve(Fake())  # counts 2 tokens per word
    ratio, note = loadgen.calibrate(loadgen.Target(url, "m"), 200, timeout_s=5)
    n = loadgen.words_for(200, 1.3)
    assert ratio == pytest.approx(2 * len(loadgen.prompt_text(n, 10_000_000).split()) / n)
    assert loadgen.words_for(200, ratio) < n
    url = serve(Fake(usage=False))
    ratio, note = loadgen.calibrate(loadgen.Target(url, "m"), 200, timeout_s=5)
    assert ratio == loadgen.TOKENS_PER_WORD_GUESS and "no prompt token count" in note


def test_a_level_needs_a_bound():
    with pytest.raises(ValueError):
        loadgen.run_level(loadgen.Target("http://127.0.0.1:9", "m"), concurrency=1, words=1, max_tokens=2,
                          requests=None, duration_s=None, timeout_s=1)


def test_a_level_reads_the_engines_metrics_at_its_start_and_end_whatever_its_length(serve):
    """The sampler's own thread is never started here (as if starved on a busy machine, or a level
    shorter than its period): the level still has the two readings it takes itself."""
    from types import SimpleNamespace

    from llmfleet.fleet.bench_run import Samplers, measure

    fake = Fake(prefill_s=0.0, token_s=0.0)
    url = serve(fake)
    samplers = Samplers(remote=None, base_url=url, engine="vllm", every_s=3600)
    params = B.BenchParams(concurrency=(1,), prompt_tokens=(8,), max_tokens=3, requests=1, request_timeout_s=10)
    levels, _ = measure(url, SimpleNamespace(public_name="m"), None, params, samplers=samplers, log=lambda _m: None)
    (lv,) = levels
    assert lv.ok == 1
    assert lv.metrics_samples == 2 and fake.metrics_reads == 2
    assert lv.kv_cache_usage_max == 0.25 and lv.requests_running_max == 1


def test_a_metrics_reading_that_fails_is_kept_as_the_reason_not_raised():
    from llmfleet.fleet.bench_run import Samplers

    samplers = Samplers(remote=None, base_url="http://127.0.0.1:9", engine="vllm")
    assert samplers.read_metrics_now() is False
    assert samplers.metrics == [] and "ConnectError" in samplers.metrics_error
