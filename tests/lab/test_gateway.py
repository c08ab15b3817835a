"""The gateway: one OpenAI endpoint (HAProxy, lab image ``gateway:lab`` built from Debian's haproxy) in front
of four llama.cpp replicas, deployed through the same pipeline as the engines.

Hosts reached at their lab-network address (as a fleet's hosts at their private address): two replica hosts
with two llama-server services each (ports 8000 and 8001, one served name, each holding the replicas' key),
and a gateway host whose gateway fronts both hosts with TLS (a certificate made here), two client keys (one
limited to two requests a minute) and a 4 MiB body limit. Asserted, in file order:

- `/v1/models` answers the fleet's served names; a missing or wrong key, an unknown model, a rate-limited
  key and a body over the limit each get an OpenAI-style error with the right status; TLS verifies
  against the certificate; a 1 MiB body whose `model` comes last is routed by it and answered;
- a rolling `invoke upgrade` of both replica hosts (one host at a time) under a constant load through the
  gateway ends with zero failed requests, while the same load sent straight to one replica in the same
  window fails while that replica restarts: the gateway drained each replica before its restart;
- a replica killed (SIGKILL) costs only what it held: later requests through the gateway succeed;
- a change of the gateway's configuration is a graceful reload, and a change of its image a restart with a
  handover: under load neither fails a request, and a request held open across the restart is answered.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.lab.test_prometheus import _lab_address, invoke, invoke_background

pytestmark = pytest.mark.lab

REPLICA_HOSTS = ["gpu-v100-01", "gpu-v100-02"]
GATEWAY_HOST = "gpu-t4-01"
SERVED = "tiny-qwen2"
PORT = 8443
KEY = "gw-key-team-a-5d1c"
SLOW_KEY = "gw-key-slow-77b2"
REPLICA_KEY = "replica-key-0c9e"
ENV = {"LAB_GW_KEY": KEY, "LAB_GW_SLOW_KEY": SLOW_KEY, "LAB_REPLICA_KEY": REPLICA_KEY}
BODY = {"model": SERVED, "prompt": "Hello", "max_tokens": 8, "temperature": 0}


def _tls(tmp: Path, address: str) -> tuple[Path, Path]:
    cert, key = tmp / "gw.crt", tmp / "gw.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=lab-gateway",
                    "-addext", f"subjectAltName=IP:{address}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    return cert, key


def _service(name: str, port: int, tiny: dict[str, Any]) -> dict[str, Any]:
    return dict(tiny, name=name, port=port, served_name=SERVED, api_key={"from_env": "LAB_REPLICA_KEY"},
                health=dict(tiny.get("health") or {}, load_timeout_s=180, stage_timeout_s=120, min_tokps=0.5))


@pytest.fixture(scope="module")
def gw(lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gateway")
    lab.ensure_hosts(*REPLICA_HOSTS, GATEWAY_HOST)
    dest = tmp / "inventory"
    shutil.copytree(lab.inventory_path, dest)
    tiny = yaml.safe_load((dest / "group_vars" / "all.yml").read_text())["llmfleet_services"][0]
    (dest / "host_vars").mkdir(exist_ok=True)
    addresses = {h: _lab_address(lab, h) for h in [*REPLICA_HOSTS, GATEWAY_HOST]}
    for h in REPLICA_HOSTS:
        (dest / "host_vars" / f"{h}.yml").write_text(yaml.safe_dump({
            "ansible_host": addresses[h], "ansible_port": 22, "llmfleet_bind_address": addresses[h],
            "llmfleet_services": [_service("tiny", 8000, tiny), _service("tiny2", 8001, tiny)]}))
    cert, key = _tls(tmp, addresses[GATEWAY_HOST])
    (dest / "host_vars" / f"{GATEWAY_HOST}.yml").write_text(yaml.safe_dump({
        "ansible_host": addresses[GATEWAY_HOST], "ansible_port": 22, "llmfleet_bind_address": addresses[GATEWAY_HOST],
        "llmfleet_services": [{
            "name": "gateway", "engine": "gateway", "image": "gateway:lab", "port": PORT,
            "gateway": {"upstreams": REPLICA_HOSTS, "max_body_mib": 4, "drain_timeout_s": 15,
                        "api_keys": [{"name": "team-a", "key": {"from_env": "LAB_GW_KEY"}},
                                     {"name": "slow", "key": {"from_env": "LAB_GW_SLOW_KEY"},
                                      "requests_per_minute": 2}],
                        "tls": {"cert": {"from_file": str(cert)}, "key": {"from_file": str(key)}}}}]}))
    shutil.copyfile(lab.known_hosts, tmp / "known_hosts")
    res = invoke(lab, tmp, "deploy", "-l", ",".join([*REPLICA_HOSTS, GATEWAY_HOST]), "--accept-new-host-keys",
                 "--json", env=ENV, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    url = f"https://{addresses[GATEWAY_HOST]}:{PORT}"
    client = httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=str(cert)), timeout=60, trust_env=False)
    try:
        yield {"tmp": tmp, "url": url, "cert": cert, "client": client, "addresses": addresses}
    finally:
        client.close()


def _auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_models_keys_limits_and_errors_are_the_openai_ones(gw):
    c = gw["client"]
    r = c.get("/v1/models", headers=_auth())
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == [SERVED]
    for headers in ({}, _auth("wrong-key")):
        r = c.post("/v1/completions", json=BODY, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"], r.text
    r = c.post("/v1/completions", json=dict(BODY, model="no-such-model"), headers=_auth())
    assert r.status_code == 404 and SERVED in r.json()["error"]["message"]
    r = c.post("/v1/completions", content=b'{"model": "tiny-qwen2", "prompt": "' + b"x" * (5 << 20) + b'"}',
               headers=_auth() | {"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]
    codes = [c.post("/v1/completions", json=BODY, headers=_auth(SLOW_KEY)).status_code for _ in range(4)]
    assert codes[:2] == [200, 200] and codes[-1] == 429, codes
    assert c.post("/v1/completions", json=BODY, headers=_auth()).status_code == 200  # the other key is not limited
    # TLS: the certificate the inventory named, verified by the client (httpx verify=cert)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{gw['url']}/v1/models", headers=_auth(), verify=True, timeout=10, trust_env=False)


def test_a_one_mib_body_is_routed_by_a_model_named_last(gw):
    pad = "y" * (1 << 20)
    body = json.dumps({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "padding": pad, "model": SERVED})
    assert len(body) > (1 << 20)
    r = gw["client"].post("/v1/completions", content=body.encode(), headers=_auth() | {"Content-Type": "application/json"})
    assert r.status_code == 200, r.text[:500]
    assert r.json()["choices"][0]["text"] is not None


class Load:
    """Completions sent back to back from ``threads`` threads to one URL until ``stop()``, each loop bounded in
    count and time; successes and failures counted (a failure: any status but 200, or no answer)."""

    def __init__(self, url: str, headers: dict[str, str], verify: Any, *, threads: int = 2, max_requests: int = 2000,
                 max_s: float = 600) -> None:
        self.ok = 0
        self.failed = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.deadline = time.monotonic() + max_s
        self.threads = [threading.Thread(target=self._run, args=(url, headers, verify, max_requests), daemon=True)
                        for _ in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self, url: str, headers: dict[str, str], verify: Any, max_requests: int) -> None:
        with httpx.Client(timeout=60, verify=verify, trust_env=False) as client:
            for _ in range(max_requests):
                if self.stop_event.is_set() or time.monotonic() > self.deadline:
                    return
                try:
                    r = client.post(url, json=BODY, headers=headers)
                    good, why = r.status_code == 200, f"{r.status_code} {r.text[:120]}"
                except httpx.HTTPError as exc:
                    good, why = False, f"{type(exc).__name__}: {exc}"
                with self.lock:
                    if good:
                        self.ok += 1
                    else:
                        self.failed += 1
                        self.errors.append(why)
                if not good:
                    time.sleep(0.2)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=90)


def test_a_rolling_upgrade_behind_the_gateway_drops_no_request(lab, gw):
    direct_host = REPLICA_HOSTS[0]
    through = Load(f"{gw['url']}/v1/completions", _auth(), ssl.create_default_context(cafile=str(gw["cert"])), threads=2)
    direct = Load(f"http://{gw['addresses'][direct_host]}:8000/v1/completions", _auth(REPLICA_KEY), True, threads=1)
    try:
        time.sleep(3)
        res = invoke(lab, gw["tmp"], "upgrade", "--group", "lab", "--host", ",".join(REPLICA_HOSTS), "--image",
                     "llamacpp=lab-cpu-next", "--serial", "1", "--json", env=ENV, timeout=1200)
        time.sleep(3)
    finally:
        through.stop()
        direct.stop()
    print(f"rolling upgrade: through the gateway {through.ok} ok, {through.failed} failed; "
          f"straight to {direct_host}:8000 {direct.ok} ok, {direct.failed} failed")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "drained at gateway" in res.stderr, res.stderr[-3000:]
    # then the engine's own metrics: the replicas the gateway alone sent to have nothing left in flight
    assert "the engine's own metrics show nothing in flight" in res.stderr, res.stderr[-3000:]
    assert through.ok > 0 and through.failed == 0, (through.ok, through.failed, through.errors[:5])
    # the same window straight to one replica: its restart cost requests the gateway did not lose
    assert direct.failed > 0, (direct.ok, direct.failed)


def test_a_replica_killed_costs_only_what_it_held(lab, gw):
    lab.exec(REPLICA_HOSTS[1], ["docker", "kill", "llmfleet-tiny"])
    try:
        time.sleep(1)
        codes = [gw["client"].post("/v1/completions", json=BODY, headers=_auth()).status_code for _ in range(8)]
        assert codes == [200] * 8, codes  # retried elsewhere before anything was sent, then checked out
    finally:
        invoke(lab, gw["tmp"], "start", "-l", REPLICA_HOSTS[1], "--service", "tiny", env=ENV, timeout=300)


def test_a_gateway_change_is_a_reload_that_drops_no_request(lab, gw):
    """A new client key: the gateway's configuration changes, its image, keys of the replicas and unit do not:
    a graceful reload (the running HAProxy checks the new file, then its master starts new workers while
    the old ones finish their streams), under load, with no failed request and the new key working."""
    hv = gw["tmp"] / "inventory" / "host_vars" / f"{GATEWAY_HOST}.yml"
    doc = yaml.safe_load(hv.read_text())
    doc["llmfleet_services"][0]["gateway"]["api_keys"].append({"name": "team-b", "key": {"from_env": "LAB_GW_KEY_B"}})
    hv.write_text(yaml.safe_dump(doc))
    env = ENV | {"LAB_GW_KEY_B": "gw-key-team-b-91aa"}
    through = Load(f"{gw['url']}/v1/completions", _auth(), ssl.create_default_context(cafile=str(gw["cert"])), threads=2)
    try:
        time.sleep(2)
        res = invoke(lab, gw["tmp"], "deploy", "-l", GATEWAY_HOST, "--json", env=env, timeout=600)
        time.sleep(2)
    finally:
        through.stop()
    print(f"gateway reload: {through.ok} ok, {through.failed} failed")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "configuration reloaded" in res.stderr, res.stderr[-2000:]
    assert through.ok > 0 and through.failed == 0, (through.ok, through.failed, through.errors[:5])
    r = gw["client"].post("/v1/completions", json=BODY, headers=_auth("gw-key-team-b-91aa"))
    assert r.status_code == 200, r.text[:300]


class HalfSent:
    """A request whose body is half sent: a connection the gateway holds open until the rest comes."""

    def __init__(self, host: str, port: int, cafile: Path) -> None:
        body = json.dumps(BODY).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        ctx = ssl.create_default_context(cafile=str(cafile))
        self.sock = ctx.wrap_socket(socket.create_connection((host, port), timeout=60), server_hostname=host)
        self.rest = body[len(body) // 2:]
        self.sock.sendall(head + body[:len(body) // 2])

    def finish(self) -> tuple[int, str]:
        self.sock.sendall(self.rest)
        data = b""
        for _ in range(10_000):
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            data += chunk
        self.sock.close()
        text = data.decode(errors="replace")
        return int(text.split(" ", 2)[1]) if text.startswith("HTTP/") else 0, text


def _gateway_containers(lab) -> list[str]:
    out = lab.exec(GATEWAY_HOST, ["docker", "ps", "--format", "{{.Names}}"]).stdout
    return [n for n in out.split() if n.startswith("llmfleet-gateway")]


def test_the_gateways_own_upgrade_hands_over_and_drops_no_request(lab, gw):
    """A new gateway image restarts the container: a handover HAProxy of the old image takes new connections
    while the old container's soft stop lets its open requests finish. A request half sent before the
    upgrade (so held by the old container) is answered after the restart began; the load sees no failure."""
    hv = gw["tmp"] / "inventory" / "host_vars" / f"{GATEWAY_HOST}.yml"
    doc = yaml.safe_load(hv.read_text())
    doc["llmfleet_services"][0]["image"] = "gateway:lab-next"
    hv.write_text(yaml.safe_dump(doc))
    env = ENV | {"LAB_GW_KEY_B": "gw-key-team-b-91aa"}
    through = Load(f"{gw['url']}/v1/completions", _auth(), ssl.create_default_context(cafile=str(gw["cert"])), threads=2)
    held = HalfSent(gw["addresses"][GATEWAY_HOST], PORT, gw["cert"])
    proc = None
    try:
        time.sleep(2)
        proc = invoke_background(lab, gw["tmp"], "deploy", "-l", GATEWAY_HOST, "--json", env=env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and "llmfleet-gateway-handover" not in _gateway_containers(lab):
            time.sleep(0.3)
        assert "llmfleet-gateway-handover" in _gateway_containers(lab), "no handover started"
        time.sleep(3)  # the unit's restart has begun: the old container soft-stops, holding the half-sent request
        status, text = held.finish()
        out, err = proc.communicate(timeout=900)
        time.sleep(2)
    finally:
        through.stop()
        if proc is not None and proc.poll() is None:
            proc.kill()
    print(f"gateway image upgrade: {through.ok} ok, {through.failed} failed; the half-sent request: {status}")
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "handover" in err, err[-2000:]
    assert status == 200 and '"choices"' in text, text[:500]
    assert through.ok > 0 and through.failed == 0, (through.ok, through.failed, through.errors[:5])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "llmfleet-gateway-handover" in _gateway_containers(lab):
        time.sleep(0.5)
    assert _gateway_containers(lab) == ["llmfleet-gateway"]
