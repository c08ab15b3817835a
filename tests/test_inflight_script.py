"""The engine's own requests in flight (``watchdog.inflight_script``), run with sh and curl against a
local HTTP server standing in for the engine's /metrics: what it reports, that it waits (bounded), and
that the API key goes in a header read from the release's env file, never on curl's command line."""

from __future__ import annotations

import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llmfleet.health import watchdog
from llmfleet.inventory.services import host_settings

KEY = "sk-engine-key-1234"


class Engine:
    """/metrics answering ``bodies`` in turn (the last one repeated); 401 without the key when ``key``."""

    def __init__(self, bodies: list[str], key: str | None = None, status: int = 200) -> None:
        self.bodies, self.key, self.status, self.seen = bodies, key, status, []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.seen.append(self.headers.get("Authorization"))
                if outer.key and self.headers.get("Authorization") != f"Bearer {outer.key}":
                    self.send_response(401)
                    self.end_headers()
                    return
                body = outer.bodies[min(len(outer.seen) - 1, len(outer.bodies) - 1)].encode()
                self.send_response(outer.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def metrics(running: int, waiting: int = 0) -> str:
    return ("# HELP llamacpp:requests_processing Number of requests processing.\n"
            "# TYPE llamacpp:requests_processing gauge\n"
            f"llamacpp:requests_processing {running}\nllamacpp:requests_deferred {waiting}\n")


def run(tmp_path, engine: Engine, *, key_env=None, timeout_s=3.0, env_file: str | None = None):
    root = tmp_path / "root"
    hs = host_settings("h1", {"llmfleet_root": str(root), "llmfleet_bind_address": "127.0.0.1", "llmfleet_services": [
        {"name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/srv/m.gguf", "image": "llamacpp:b1",
         "port": engine.port}]})
    if env_file is not None:
        cur = root / "services" / "chat" / "current"
        cur.mkdir(parents=True)
        (cur / "service.env").write_text(env_file)
    script = watchdog.inflight_script(hs.services[0], hs, key_env=key_env, timeout_s=timeout_s)
    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
    return res, watchdog.parse_inflight(res.stdout)


@pytest.fixture
def engines():
    made: list[Engine] = []
    yield lambda *a, **kw: made.append(Engine(*a, **kw)) or made[-1]
    for e in made:
        e.close()


def test_nothing_in_flight_is_zero_after_one_read(tmp_path, engines):
    e = engines([metrics(0)])
    _, left = run(tmp_path, e)
    assert left == 0 and len(e.seen) == 1


def test_it_waits_until_the_running_and_waiting_requests_end(tmp_path, engines):
    e = engines([metrics(2, 1), metrics(1), metrics(0)])
    _, left = run(tmp_path, e)
    assert left == 0 and len(e.seen) == 3


def test_the_wait_ends_at_its_timeout_with_what_is_left(tmp_path, engines):
    e = engines([metrics(3)])
    _, left = run(tmp_path, e, timeout_s=1.0)
    assert left == 3 and len(e.seen) == 2  # 1.0 s at 0.5 s a poll


def test_metrics_that_do_not_answer_or_name_no_counter_are_unknown(tmp_path, engines):
    assert run(tmp_path, engines([metrics(1)], status=404))[1] is None
    assert run(tmp_path, engines(["other_metric 4\n"]))[1] is None


def test_the_key_comes_from_the_env_file_in_a_header_not_argv(tmp_path, engines):
    e = engines([metrics(0)], key=KEY)
    res, left = run(tmp_path, e, key_env="LLAMA_API_KEY", env_file=f"# secrets\nLLAMA_API_KEY='{KEY}'\n")
    assert left == 0 and e.seen == [f"Bearer {KEY}"]
    assert KEY not in res.args[2]  # the script holds the variable's name only
