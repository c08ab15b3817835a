"""The gateway's rendered files and runtime-API commands (llmfleet.release.gateway_config).

The exact text of every file for a two-model, four-replica gateway with keys and TLS is pinned in
tests/golden/gateway/ (after an intended change: ``LLMFLEET_UPDATE_GOLDEN=1 pytest tests/test_gateway_config.py``,
then review ``git diff tests/golden/gateway``). Each rendered configuration is checked by the real HAProxy
(``haproxy -c``, zero warnings; Debian's haproxy package, the lab image's 2.6); what it does with requests
is shown by the lab tests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from llmfleet.release import gateway_config as G

GOLDEN = Path(__file__).parent / "golden" / "gateway"
HAPROXY = "/usr/sbin/haproxy"
CLEAR_KEYS = {"team-a": "sk-team-a-0123456789abcdef", "team-b": "sk-team-b-fedcba9876543210", "ops": "sk-ops-42"}


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _replica(host: str, service: str, port: int, served: str, key_env: str | None = None,
             address: str = "10.0.0.11", maxconn: int = 8) -> G.Replica:
    return G.Replica(host=host, service=service, address=address, port=port, served_name=served, key_env=key_env,
                     maxconn=maxconn)


def _spec(**changes: object) -> G.GatewaySpec:
    spec = G.GatewaySpec(
        name="gw", bind="0.0.0.0", port=8443, admin_port=9901, tls=True, max_body_bytes=4 * 1024 * 1024,
        timeout_s=600,
        replicas=(
            _replica("gpu-a", "chat", 8080, "qwen2.5-7b", address="10.0.0.11"),
            _replica("gpu-b", "chat", 8080, "qwen2.5-7b", address="10.0.0.12"),
            _replica("gpu-a", "coder", 8081, "Qwen/Qwen2.5-Coder-7B", "LLMFLEET_KEY_1", address="10.0.0.11", maxconn=4),
            _replica("gpu-c", "coder", 8000, "Qwen/Qwen2.5-Coder-7B", "LLMFLEET_KEY_1", address="gpu-c.lab", maxconn=4),
        ),
        keys=(G.ClientKey(name="team-a", sha256_hex=_sha(CLEAR_KEYS["team-a"]), requests_per_minute=600),
              G.ClientKey(name="team-b", sha256_hex=_sha(CLEAR_KEYS["team-b"]), requests_per_minute=None),
              G.ClientKey(name="ops", sha256_hex=_sha(CLEAR_KEYS["ops"]), requests_per_minute=30)),
        config_dir="/etc/llmfleet-gateway")
    return dataclasses.replace(spec, **changes)


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _golden_name(path: str) -> str:
    return path.replace("/", "_")


ADMIN_SCRIPTS = {
    "admin_drain.sh": lambda: G.admin_script(9901, G.drain_command("m_qwen2.5-7b", "gpu-a__chat")),
    "admin_show_stat.sh": lambda: G.admin_script(9901, G.show_stat_command(), timeout_s=5),
}


# -- golden files ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(G.render_files(_spec())))
def test_rendered_file_is_exactly_the_golden_file(path):
    text = G.render_files(_spec())[path]
    golden = GOLDEN / _golden_name(path)
    if os.environ.get("LLMFLEET_UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"no golden file for {path}; run with LLMFLEET_UPDATE_GOLDEN=1 and review it"
    assert text == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(ADMIN_SCRIPTS))
def test_admin_script_is_exactly_the_golden_file(name):
    text = ADMIN_SCRIPTS[name]()
    golden = GOLDEN / name
    if os.environ.get("LLMFLEET_UPDATE_GOLDEN"):
        golden.write_text(text + "\n", encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8").rstrip("\n")


def test_every_golden_file_belongs_to_a_rendered_file_or_script():
    names = {_golden_name(p) for p in G.render_files(_spec())} | set(ADMIN_SCRIPTS) | {"show_stat_recorded.csv"}
    assert {p.name for p in GOLDEN.iterdir()} == names


# -- what the files say ------------------------------------------------------------------------


def test_the_files_of_a_gateway():
    assert sorted(G.render_files(_spec())) == [
        "errors/400.json", "errors/401.json", "errors/404.json", "errors/413.json", "errors/429.json",
        "errors/502.json", "errors/503.json", "errors/504.json",
        "haproxy.cfg", "keys.map", "limits.map", "models.json", "models.map"]


def test_no_client_key_is_in_any_file_in_clear_only_its_hash_and_name():
    files = G.render_files(_spec())
    for key in CLEAR_KEYS.values():
        for path, text in files.items():
            assert key not in text, f"{path} holds a client key in clear"
    keys_map = dict(line.split(" ") for line in files["keys.map"].splitlines() if not line.startswith("#"))
    assert keys_map == {_sha(k): name for name, k in CLEAR_KEYS.items()}


def test_limits_map_lists_only_keys_with_a_limit():
    lines = [x for x in G.render_files(_spec())["limits.map"].splitlines() if not x.startswith("#")]
    assert lines == ["ops 30", "team-a 600"]


def test_models_json_is_openais_list_of_the_union_of_served_names_sorted():
    doc = json.loads(G.render_files(_spec())["models.json"])
    assert doc == {"object": "list", "data": [
        {"id": "Qwen/Qwen2.5-Coder-7B", "object": "model", "owned_by": "llmfleet"},
        {"id": "qwen2.5-7b", "object": "model", "owned_by": "llmfleet"}]}


def test_models_map_sends_each_served_name_to_its_backend():
    lines = [x for x in G.render_files(_spec())["models.map"].splitlines() if not x.startswith("#")]
    assert lines == [f"Qwen/Qwen2.5-Coder-7B {G.backend_name('Qwen/Qwen2.5-Coder-7B')}", "qwen2.5-7b m_qwen2.5-7b"]


@pytest.mark.parametrize(("status", "type_", "code", "says"), [
    ("400", "invalid_request_error", "model_required", "Known models: Qwen/Qwen2.5-Coder-7B, qwen2.5-7b."),
    ("401", "invalid_request_error", "invalid_api_key", "Authorization: Bearer <key>"),
    ("404", "invalid_request_error", "model_not_found", "Known models: Qwen/Qwen2.5-Coder-7B, qwen2.5-7b."),
    ("413", "invalid_request_error", "request_too_large", "limit of 4 MiB (4194304 bytes)"),
    ("429", "requests", "rate_limit_exceeded", "last 60 seconds"),
    ("503", "server_error", "service_unavailable", "No replica of this model is up"),
    ("504", "server_error", "timeout", "within the gateway's limit of 600 s"),
])
def test_error_bodies_are_openai_style(status, type_, code, says):
    doc = json.loads(G.render_files(_spec())[f"errors/{status}.json"])
    assert set(doc) == {"error"}
    assert doc["error"]["type"] == type_ and doc["error"]["code"] == code
    assert says in doc["error"]["message"]


def test_the_config_routes_checks_and_limits_as_the_design_says():
    cfg = G.render_files(_spec())["haproxy.cfg"]
    for line in [
        "    stats socket ipv4@127.0.0.1:9901 level admin",
        f"    tune.bufsize {4 * 1024 * 1024 + 64 * 1024}",
        "    bind 0.0.0.0:8443 ssl crt /etc/llmfleet-gateway/tls.pem",
        "    monitor-uri /llmfleet/health",
        "    option http-buffer-request",
        "    http-request set-var(txn.model) req.body,json_query('$.model')",
        "    balance leastconn",
        "    retry-on conn-failure empty-response",
        '    http-request set-header Authorization "Bearer ${LLMFLEET_KEY_1}"',
        "    server gpu-c__coder gpu-c.lab:8000 check inter 2s fall 2 rise 2 maxconn 4",
        "    bind 0.0.0.0:9902",
        "    http-request use-service prometheus-exporter if { path /metrics }",
    ]:
        assert line in cfg.splitlines(), line
    # the key set for the coder replicas only: qwen2.5-7b's backend sends none
    chat = cfg.split("backend m_qwen2.5-7b\n")[1].split("\n\n")[0]
    assert "Authorization" not in chat
    # the access log: the key's name, never the header
    log_format = next(x for x in cfg.splitlines() if "log-format" in x)
    assert "key=%[var(txn.key_name)]" in log_format and "authorization" not in log_format.lower()
    assert "%HPO" in log_format  # the path without its query string


def test_without_tls_the_frontend_is_plain_http():
    cfg = G.render_files(_spec(tls=False))["haproxy.cfg"]
    assert "    bind 0.0.0.0:8443\n" in cfg and "ssl" not in cfg


@pytest.mark.parametrize(("max_body", "bufsize"), [(1, 65537), (1024 * 1024, 1024 * 1024 + 65536),
                                                   (64 * 1024 * 1024, 64 * 1024 * 1024 + 65536)])
def test_buffer_holds_the_largest_body_and_its_headers(max_body, bufsize):
    assert G.buffer_size(max_body) == bufsize


@pytest.mark.parametrize(("served", "backend"), [
    ("qwen2.5-7b", "m_qwen2.5-7b"),
    ("llama:8b", "m_llama:8b"),
    ("Qwen/Qwen2.5-Coder-7B", "m_Qwen_Qwen2.5-Coder-7B_" + hashlib.sha256(b"Qwen/Qwen2.5-Coder-7B").hexdigest()[:8]),
])
def test_backend_names(served, backend):
    assert G.backend_name(served) == backend


def test_two_served_names_that_clean_up_alike_get_different_backends():
    assert G.backend_name("a/b") != G.backend_name("a_b") != G.backend_name("a+b")


@pytest.mark.parametrize(("host", "service", "server"), [
    ("gpu-v100-01", "chat", "gpu-v100-01__chat"),
    ("gpu a", "chat", "gpu_a__chat_" + hashlib.sha256(b"gpu a__chat").hexdigest()[:8]),
])
def test_server_names(host, service, server):
    assert G.server_name(host, service) == server


# -- bad values refused --------------------------------------------------------------------------


def _with_replica(**changes: object) -> G.GatewaySpec:
    base = _spec()
    first = dataclasses.replace(base.replicas[0], **changes)
    return dataclasses.replace(base, replicas=(first, *base.replicas[1:]))


def _with_key(**changes: object) -> G.GatewaySpec:
    base = _spec()
    first = dataclasses.replace(base.keys[0], **changes)
    return dataclasses.replace(base, keys=(first, *base.keys[1:]))


@pytest.mark.parametrize(("spec", "says"), [
    (lambda: _spec(name="gw\n  stats socket 0.0.0.0:1"), "name"),
    (lambda: _spec(name=""), "name"),
    (lambda: _spec(bind="0.0.0.0:80 ssl"), "bind"),
    (lambda: _spec(bind="gw.lab"), "bind"),
    (lambda: _spec(port=0), "port"),
    (lambda: _spec(port=9902), "metrics port 9902"),
    (lambda: _spec(admin_port=65535), "admin_port"),
    (lambda: _spec(max_body_bytes=0), "max_body_bytes"),
    (lambda: _spec(max_body_bytes=65 * 1024 * 1024), "max_body_bytes"),
    (lambda: _spec(timeout_s=-1), "timeout_s"),
    (lambda: _spec(config_dir="etc/gw"), "config_dir"),
    (lambda: _spec(config_dir="/etc/gw dir"), "config_dir"),
    (lambda: _spec(config_dir="/etc/../gw"), "config_dir"),
    (lambda: _with_replica(address="10.0.0.1 backup"), "address"),
    (lambda: _with_replica(address="-x"), "address"),
    (lambda: _with_replica(port=70000), "port"),
    (lambda: _with_replica(served_name="a model"), "served_name"),
    (lambda: _with_replica(served_name="#comment"), "served_name"),
    (lambda: _with_replica(maxconn=0), "maxconn"),
    (lambda: _with_replica(key_env="KEY}\"; x"), "key_env"),
    (lambda: _with_replica(key_env="LLMFLEET_KEY_9"), "share one API key environment variable"),
    (lambda: _with_replica(host="gpu-b"), "listed once"),
    (lambda: _with_replica(service="chat\nserver x"), "host/service"),
    (lambda: _with_key(name="team a"), "api key name"),
    (lambda: _with_key(name="team-b"), "each key's name once"),
    (lambda: _with_key(sha256_hex="A" * 64), "sha256_hex"),
    (lambda: _with_key(sha256_hex=_sha(CLEAR_KEYS["ops"])), "same key as another"),
    (lambda: _with_key(requests_per_minute=0), "requests_per_minute"),
])
def test_a_bad_value_is_refused_naming_the_gateway_and_field(spec, says):
    with pytest.raises(ValueError) as err:
        G.render_files(spec())
    assert str(err.value).startswith("gateway '") and says in str(err.value)


def test_the_refusal_of_a_key_hash_does_not_echo_it():
    with pytest.raises(ValueError) as err:
        G.render_files(_with_key(sha256_hex=CLEAR_KEYS["team-a"]))
    assert CLEAR_KEYS["team-a"] not in str(err.value)


def test_a_mixed_key_env_names_every_replica_of_the_model():
    with pytest.raises(ValueError) as err:
        G.render_files(_with_replica(key_env="LLMFLEET_KEY_2"))
    assert "gpu-a/chat: LLMFLEET_KEY_2" in str(err.value) and "gpu-b/chat: no key" in str(err.value)


# -- runtime API ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "text"), [
    (lambda: G.drain_command("m_x", "h1__chat"), "set server m_x/h1__chat state drain"),
    (lambda: G.ready_command("m_x", "h1__chat"), "set server m_x/h1__chat state ready"),
    (lambda: G.maint_command("m_x", "h1__chat"), "set server m_x/h1__chat state maint"),
    (G.show_stat_command, "show stat"),
])
def test_runtime_commands(command, text):
    assert command() == text


@pytest.mark.parametrize(("backend", "server"), [("m_x", "h1; shutdown sessions"), ("m x", "h1"), ("m_x", "")])
def test_a_runtime_command_takes_only_haproxy_names(backend, server):
    with pytest.raises(ValueError):
        G.drain_command(backend, server)


@pytest.mark.parametrize("command", ["show stat\nshutdown frontend gateway", "show stat; show info", ""])
def test_admin_script_sends_one_command(command):
    with pytest.raises(ValueError):
        G.admin_script(9901, command)


def _one_shot_cli(answer: bytes) -> tuple[int, list[bytes]]:
    """A loopback listener that answers one connection like HAProxy's CLI: reads a line, writes the
    answer, closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                buf += chunk
            got.append(buf)
            conn.sendall(answer)
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1], got


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_admin_script_sends_the_command_and_prints_the_answer():
    port, got = _one_shot_cli(b"No such server.\n\n")
    res = subprocess.run(["sh", "-c", G.admin_script(port, G.ready_command("m_x", "h9__chat"))],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0
    assert got == [b"set server m_x/h9__chat state ready\n"]
    assert G.command_error(res.stdout) == "No such server."


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_admin_script_says_when_nothing_listens():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    res = subprocess.run(["sh", "-c", G.admin_script(port, G.show_stat_command())], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 3
    assert f"no HAProxy runtime API on 127.0.0.1:{port}" in res.stderr


@pytest.mark.parametrize(("answer", "error"), [("\n", None), ("", None), ("No such backend.\n\n", "No such backend.")])
def test_command_error(answer, error):
    assert G.command_error(answer) == error


def test_parse_show_stat_recorded_from_haproxy_2_6():
    # `show stat` from Debian's HAProxy 2.6.12 with a replica drained, one down, one serving a request
    text = (GOLDEN / "show_stat_recorded.csv").read_text(encoding="utf-8")
    assert G.parse_show_stat(text) == {
        ("m_Qwen_coder_f0df8a70", "h1__code"): G.ServerState("DOWN", 0),
        ("m_tiny", "h1__chat"): G.ServerState("DRAIN", 0),
        ("m_tiny", "h2__chat"): G.ServerState("UP", 1),
    }


HEADER = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status\n"


@pytest.mark.parametrize(("text", "want"), [
    ("", {}),
    ("Unknown command.\n", {}),
    ("garbage,,,\n\0\xff\n", {}),
    (HEADER + "m_x,h1__a,0,0,3,5,8,10,0,0,,0,,0,0,0,0,MAINT (via m_y/h1),1\n",
     {("m_x", "h1__a"): G.ServerState("MAINT (via m_y/h1)", 3)}),
    (HEADER + "m_x,h1__a,0,0,,5,8,10,0,0,,0,,0,0,0,0,UP 1/2\n", {("m_x", "h1__a"): G.ServerState("UP 1/2", 0)}),
    (HEADER + "m_x,h1__a,0,0,2,5\n", {}),  # cut short
    # no header: HAProxy's column order
    ("m_x,h1__a,0,0,2,5,8,10,0,0,,0,,0,0,0,0,UP\n", {("m_x", "h1__a"): G.ServerState("UP", 2)}),
    # columns moved: the header says where
    ("# svname,pxname,status,scur\nh1__a,m_x,DRAIN,7\nBACKEND,m_x,UP,7\n", {("m_x", "h1__a"): G.ServerState("DRAIN", 7)}),
])
def test_parse_show_stat_never_raises(text, want):
    assert G.parse_show_stat(text) == want


# -- the real HAProxy takes every rendered configuration -------------------------------------------


def _tls_pem(folder: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (a test certificate for the TLS configuration)")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=gw.test",
                    "-keyout", str(folder / "k.pem"), "-out", str(folder / "c.pem")],
                   check=True, capture_output=True, timeout=60)
    (folder / G.TLS_PEM).write_bytes((folder / "c.pem").read_bytes() + (folder / "k.pem").read_bytes())


@pytest.mark.skipif(not os.access(HAPROXY, os.X_OK),
                    reason=f"{HAPROXY} is missing: install Debian's haproxy package (scripts/bootstrap.sh does)")
@pytest.mark.parametrize("changes", [
    {},
    {"tls": False},
    {"tls": False, "bind": "::", "max_body_bytes": 1, "timeout_s": 30, "body_timeout_s": 120},
    {"tls": False, "keys": (), "max_body_bytes": 64 * 1024 * 1024},
    {"tls": False, "replicas": ()},
    {"tls": False, "replicas": (_replica("h1", "chat", 8080, "m", address="fd00::11"),)},
], ids=["tls-2x2", "plain", "ipv6-tiny-body", "no-keys-64mib", "no-replicas", "ipv6-replica"])
def test_haproxy_accepts_the_rendered_configuration(tmp_path, changes):
    spec = _spec(config_dir=str(tmp_path), **changes)
    # a replica reached by a DNS name needs one the resolver here knows (HAProxy resolves it at start)
    spec = dataclasses.replace(spec, replicas=tuple(
        r if _is_ip(r.address) else dataclasses.replace(r, address="localhost") for r in spec.replicas))
    for path, text in G.render_files(spec).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    if spec.tls:
        _tls_pem(tmp_path)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LLMFLEET_KEY_1": "dummy-replica-key"}
    res = subprocess.run([HAPROXY, "-dW", "-c", "-f", str(tmp_path / G.CONFIG_FILE)], capture_output=True, text=True,
                         env=env, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Configuration file is valid" in res.stdout + res.stderr
