"""What the gateway adds: latency and requests/s through the gateway (HAProxy) against straight to a replica.

Brings up its own uniquely named lab (``llmfleet-gw<hex>``) from a generated copy of ``inventory/lab/``
(so it never disturbs a running lab): two replica hosts with two llama-server services each (ports 8000
and 8001, the tiny model, one served name, one thread and one slot each, a replica key) and a gateway
host, each reached at its lab-network address, as tests/lab/test_gateway.py builds them. The gateway
host runs two gateway services in front of the same four replicas: ``gateway`` with TLS on 8443 (a
certificate made here) and ``gateway-plain`` without TLS on 8080, both with one client key, so the
plain one measures HAProxy's path (key check, body buffered and read for ``model``, routing, the hop
to a replica) without the TLS record layer, and the TLS one what a client of the inventory's TLS
gateway sees. Everything is deployed with ``invoke deploy`` (not measured), then:

1. added latency: ``--requests`` sequential ``POST /v1/completions`` (``max_tokens`` 1, temperature 0,
   the same body each time: the engine answers in a few milliseconds) straight to one replica
   (gpu-v100-01:8000, with its key), through the plain gateway and through the TLS gateway, the three
   interleaved request by request so the machine's load drifts over all three alike; p50/p90/p99/max of
   each and the gateway's percentiles minus the direct ones;
2. throughput: N concurrent clients (``--clients``, default 1,4,8), each sending the same request back
   to back for ``--duration`` seconds (at most ``--max-per-client`` requests), straight to the one
   replica and through the plain gateway to the four: requests/s, p50/p99 and failures per level.

Every client holds one persistent HTTP connection (one ``httpx.Client``, keep-alive), as a real client
does; the TLS handshake happens once per client, before the first timed request (a warm-up request on
each path). Every loop is bounded in count and time; every request has a time-out.

Needs the lab set up once (``invoke lab.setup``). Run from the project root:

    .venv/bin/python bench/gateway_bench.py [--requests 1000] [--clients 1,4,8] [--duration 10] [--json] [--keep]

On the lab the replicas, the gateway, the host containers and this client share this machine's cores
(the load average and core count are printed): the gateway's cost is read against the engine's own
time on the same cores, not against a GPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_load import load  # noqa: E402

from llmfleet.fleet.bench import percentile  # noqa: E402

KEY = ROOT / ".lab" / "id_ed25519"
LOCK = ROOT / ".lab" / "images.lock"
REPLICA_HOSTS = ["gpu-v100-01", "gpu-v100-02"]
GATEWAY_HOST = "gpu-t4-01"
SERVED = "tiny-qwen2"
TLS_PORT = 8443
PLAIN_PORT = 8080
CLIENT_KEY = "gw-bench-key-3e1f"
REPLICA_KEY = "gw-bench-replica-9a4c"
ENV = {"GW_BENCH_KEY": CLIENT_KEY, "GW_BENCH_REPLICA_KEY": REPLICA_KEY}
BODY = {"model": SERVED, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
REQUEST_TIMEOUT_S = 30
MAX_REQUESTS = 100_000
MAX_PHASE_S = 900

# ---------------------------------------------------------------------------------------------
# Pure helpers


def summarize(latencies_s: Iterable[float]) -> dict[str, Any]:
    """Count and p50/p90/p99/max of request latencies (seconds in, milliseconds out, 3 decimals);
    percentiles interpolate linearly between order statistics (numpy's default)."""
    xs = [float(x) for x in latencies_s]
    out: dict[str, Any] = {"n": len(xs)}
    for name, p in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99), ("max_ms", 100)):
        v = percentile(xs, p)
        out[name] = None if v is None else round(v * 1000, 3)
    return out


def added(direct: dict[str, Any], through: dict[str, Any]) -> dict[str, float | None]:
    """The gateway's percentiles minus the direct ones (ms): what the gateway adds at each percentile
    (a difference of percentiles, not the percentile of per-request differences)."""
    out: dict[str, float | None] = {}
    for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms"):
        a, b = direct.get(k), through.get(k)
        out[k] = None if a is None or b is None else round(b - a, 3)
    return out


def frontend_counts(metrics_text: str, frontend: str = "gateway") -> dict[str, int]:
    """Connections and HTTP requests a gateway's frontend has taken so far, from HAProxy's Prometheus
    text (``haproxy_frontend_connections_total`` and ``haproxy_frontend_http_requests_total`` of the
    proxy named ``frontend``); a figure not found is left out. Requests much above connections: the
    clients' connections were kept alive."""
    names = {"haproxy_frontend_connections_total": "connections", "haproxy_frontend_http_requests_total": "requests"}
    out: dict[str, int] = {}
    for line in metrics_text.splitlines():
        metric, _, rest = line.partition("{")
        if metric not in names or f'proxy="{frontend}"' not in rest.partition("}")[0]:
            continue
        try:
            out[names[metric]] = int(float(rest.rpartition("}")[2].split()[0]))
        except (ValueError, IndexError):
            continue
    return out


def log_timers(log_text: str) -> dict[str, Any]:
    """HAProxy's own account of the completions in its access log (the gateway's log-format:
    ``%TR/%Tw/%Tc/%Tr/%Ta`` in ms): ``before_server`` (TR + Tw + Tc: request read, queue, connect),
    ``server`` (Tr: request sent -> the replica's response headers) and ``after`` (Ta - TR - Tw - Tc - Tr),
    each as ``summarize`` gives it; lines of other requests, or with a timer of -1, are left out."""
    before: list[float] = []
    server: list[float] = []
    after: list[float] = []
    for line in log_text.splitlines():
        if "POST /v1/completions" not in line:
            continue
        words = line.split()
        for i, word in enumerate(words[:-1]):
            parts = word.split("/")
            if len(parts) == 5 and all(p.lstrip("-").isdigit() for p in parts):
                if words[i + 1] != "200":
                    break
                t_req, t_wait, t_conn, t_resp, t_all = (int(p) for p in parts)
                if min(t_req, t_wait, t_conn, t_resp, t_all) < 0:
                    break
                before.append((t_req + t_wait + t_conn) / 1000)
                server.append(t_resp / 1000)
                after.append((t_all - t_req - t_wait - t_conn - t_resp) / 1000)
                break
    return {"before_server": summarize(before), "server": summarize(server), "after": summarize(after)}


def rate(ok: int, wall_s: float) -> float:
    """Requests per second of a level (0.0 for an empty level)."""
    return round(ok / wall_s, 2) if wall_s > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# The lab


def lab_address(container: str) -> str:
    out = subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                          container], capture_output=True, text=True, timeout=30, check=True).stdout
    return out.split()[0]


def make_cert(tmp: Path, address: str) -> tuple[Path, Path]:
    cert, key = tmp / "gw.crt", tmp / "gw.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=bench-gateway", "-addext", f"subjectAltName=IP:{address}", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    return cert, key


def write_inventory(inv: Path, addresses: dict[str, str], cert: Path, key: Path) -> None:
    """Host variables of the three hosts: reached at their lab-network address on port 22 (as a fleet's
    hosts at their private address), four replicas, two gateways (TLS and plain) in front of them."""
    tiny = yaml.safe_load((inv / "group_vars" / "all.yml").read_text())["llmfleet_services"][0]

    def replica(name: str, port: int) -> dict[str, Any]:
        return dict(tiny, name=name, port=port, served_name=SERVED, concurrency=1, engine_args=["-t", "1"],
                    api_key={"from_env": "GW_BENCH_REPLICA_KEY"},
                    health=dict(tiny.get("health") or {}, load_timeout_s=180, stage_timeout_s=120, min_tokps=0.5))

    def gateway(name: str, port: int, admin_port: int, tls: bool) -> dict[str, Any]:
        gw: dict[str, Any] = {"upstreams": REPLICA_HOSTS, "drain_timeout_s": 30, "admin_port": admin_port,
                              "api_keys": [{"name": "bench", "key": {"from_env": "GW_BENCH_KEY"}}]}
        if tls:
            gw["tls"] = {"cert": {"from_file": str(cert)}, "key": {"from_file": str(key)}}
        return {"name": name, "engine": "gateway", "image": "gateway:lab", "port": port, "gateway": gw}

    hv = inv / "host_vars"
    hv.mkdir(exist_ok=True)
    for h in REPLICA_HOSTS:
        (hv / f"{h}.yml").write_text(yaml.safe_dump({
            "ansible_host": addresses[h], "ansible_port": 22, "llmfleet_bind_address": addresses[h],
            "llmfleet_services": [replica("tiny", 8000), replica("tiny2", 8001)]}))
    (hv / f"{GATEWAY_HOST}.yml").write_text(yaml.safe_dump({
        "ansible_host": addresses[GATEWAY_HOST], "ansible_port": 22,
        "llmfleet_bind_address": addresses[GATEWAY_HOST],
        "llmfleet_services": [gateway("gateway", TLS_PORT, 9901, True),
                              gateway("gateway-plain", PLAIN_PORT, 9911, False)]}))


def deploy(inv: Path, tmp: Path) -> float:
    env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(tmp / "known_hosts"),
               INVOKE_LLMFLEET_AUDIT_LOG=str(tmp / "audit.jsonl"), COLUMNS="250", **ENV)
    argv = [sys.executable, "-m", "invoke", "--search-root", str(ROOT), "deploy", "-i", str(inv),
            "-l", ",".join([*REPLICA_HOSTS, GATEWAY_HOST]), "--accept-new-host-keys", "--json"]
    t0 = time.monotonic()
    res = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=1200, env=env)
    if res.returncode != 0:
        raise SystemExit(f"deploy failed (exit {res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return time.monotonic() - t0


# ---------------------------------------------------------------------------------------------
# Measuring


class Route:
    """One way to the engine: a URL, the key it wants, how its TLS is verified."""

    def __init__(self, name: str, url: str, key: str, verify: Any = True) -> None:
        self.name, self.url, self.headers, self.verify = name, url, {"Authorization": f"Bearer {key}"}, verify

    def client(self) -> httpx.Client:
        """A persistent connection (keep-alive), no proxy from the environment."""
        return httpx.Client(base_url=self.url, headers=self.headers, verify=self.verify, timeout=REQUEST_TIMEOUT_S,
                            trust_env=False, limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))


class Rotating:
    """Straight to the replicas in turn, one kept-alive connection each: what the gateway does with
    sequential requests (leastconn among idle replicas takes them in turn), without the gateway. The
    fair baseline: one replica asked back to back stays hot in the CPU's caches, four in turn do not."""

    def __init__(self, name: str, routes: list[Route]) -> None:
        self.name, self.routes = name, routes

    def client(self) -> _RotatingClient:
        return _RotatingClient([r.client() for r in self.routes])


class _RotatingClient:
    def __init__(self, clients: list[httpx.Client]) -> None:
        self.clients, self.i = clients, 0

    def post(self, path: str, **kw: Any) -> httpx.Response:
        c = self.clients[self.i % len(self.clients)]
        self.i += 1
        return c.post(path, **kw)

    def close(self) -> None:
        for c in self.clients:
            c.close()


def scrape(url: str) -> dict[str, int]:
    """The gateway frontend's connection and request counts, from its metrics port."""
    try:
        return frontend_counts(httpx.get(url, timeout=10, trust_env=False).text)
    except httpx.HTTPError:
        return {}


def gateway_log(lab: str, service: str, since: int) -> dict[str, Any]:
    """The timers of the gateway's access log since ``since`` (Unix seconds), read on its host."""
    res = subprocess.run(["docker", "exec", f"{lab}-{GATEWAY_HOST}", "docker", "logs", "--since", str(since),
                          f"llmfleet-{service}"], capture_output=True, text=True, timeout=120)
    return log_timers(res.stdout + res.stderr)


def timed(client: httpx.Client) -> tuple[float, str | None]:
    """One completion: (seconds, None) or (seconds, why it failed)."""
    t0 = time.perf_counter()
    try:
        r = client.post("/v1/completions", json=BODY)
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            return dt, f"{r.status_code} {r.text[:120]}"
        return dt, None
    except httpx.HTTPError as exc:
        return time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"


def warm(client: httpx.Client, name: str, n: int = 20) -> None:
    """Connect (the TLS handshake), then a few requests; a path that fails here stops the bench."""
    for _ in range(n):
        _, why = timed(client)
        if why:
            raise SystemExit(f"{name}: the warm-up request failed: {why}")


def latency(paths: list[Any], requests: int, max_s: float) -> dict[str, Any]:
    """``requests`` rounds, each one request on every path in turn (sequential), until ``max_s``."""
    clients = {p.name: p.client() for p in paths}
    lat: dict[str, list[float]] = {p.name: [] for p in paths}
    errors: dict[str, list[str]] = {p.name: [] for p in paths}
    try:
        for p in paths:
            warm(clients[p.name], p.name)
        deadline = time.monotonic() + max_s
        for _ in range(min(requests, MAX_REQUESTS)):
            if time.monotonic() > deadline:
                break
            for p in paths:
                dt, why = timed(clients[p.name])
                (errors[p.name].append(why) if why else lat[p.name].append(dt))
    finally:
        for c in clients.values():
            c.close()
    out: dict[str, Any] = {name: dict(summarize(xs), failed=len(errors[name]), errors=errors[name][:3])
                           for name, xs in lat.items()}
    direct = out[paths[0].name]
    out["added"] = {p.name: added(direct, out[p.name]) for p in paths[1:]}
    return out


def level(path: Route, clients: int, duration_s: float, max_per_client: int) -> dict[str, Any]:
    """``clients`` threads, each its own connection, sending back to back until ``duration_s`` has
    passed (no new request after it) or ``max_per_client`` requests."""
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    conns = [path.client() for _ in range(clients)]
    try:
        for c in conns:
            warm(c, path.name, n=2)
        start = threading.Barrier(clients + 1)

        def run(c: httpx.Client) -> None:
            start.wait(timeout=60)
            deadline = time.monotonic() + duration_s
            for _ in range(min(max_per_client, MAX_REQUESTS)):
                if time.monotonic() >= deadline:
                    return
                dt, why = timed(c)
                with lock:
                    (errors.append(why) if why else lat.append(dt))

        threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in conns]
        for t in threads:
            t.start()
        start.wait(timeout=60)
        t0 = time.monotonic()
        for t in threads:
            t.join(timeout=duration_s + REQUEST_TIMEOUT_S + 30)
        wall = time.monotonic() - t0
    finally:
        for c in conns:
            c.close()
    return dict(summarize(lat), clients=clients, wall_s=round(wall, 2), requests_per_s=rate(len(lat), wall),
                failed=len(errors), errors=errors[:3])


def throughput(paths: list[Route], clients: list[int], duration_s: float, max_per_client: int) -> dict[str, Any]:
    return {p.name: [level(p, n, duration_s, max_per_client) for n in clients] for p in paths}


# ---------------------------------------------------------------------------------------------
# Printing


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def print_tables(res: dict[str, Any], out: Callable[[str], None] = print) -> None:
    lat = res["latency"]
    out(f"\ngateway bench, {res['date']}, {res['load_start']} at start, {res['load_end']} at the end")
    out(f"\n1. latency of one POST /v1/completions (max_tokens 1), sequential, one kept-alive connection per path, "
        f"{res['requests']} rounds interleaved (ms)")
    out(f"{'path':<34} {'n':>5} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8} {'failed':>6}")
    for name in res["paths"]:
        s = lat[name]
        out(f"{name:<34} {s['n']:>5} {_f(s['p50_ms']):>8} {_f(s['p90_ms']):>8} {_f(s['p99_ms']):>8} "
            f"{_f(s['max_ms']):>8} {s['failed']:>6}")
    name_of = {"before_server": "HAProxy: read+queue+connect", "server": "HAProxy: sent -> replica headers",
               "after": "HAProxy: headers -> last byte"}
    for name, a in lat["added"].items():
        out(f"{'added by ' + name:<34} {'':>5} {_f(a['p50_ms']):>8} {_f(a['p90_ms']):>8} {_f(a['p99_ms']):>8} "
            f"{_f(a['max_ms']):>8}")
    if lat.get("haproxy_log"):
        out("gateway http, HAProxy's access-log timers (1 ms resolution):")
    for what, s in lat.get("haproxy_log", {}).items():
        out(f"{'  ' + name_of[what]:<34} {s['n']:>5} {_f(s['p50_ms']):>8} {_f(s['p90_ms']):>8} {_f(s['p99_ms']):>8} "
            f"{_f(s['max_ms']):>8}")
    for name, c in lat.get("frontend", {}).items():
        out(f"{name}: {c.get('requests', '?')} requests on {c.get('connections', '?')} connection(s) "
            "(HAProxy's frontend counters over the phase)")
    out(f"\n2. throughput: N clients, each one kept-alive connection sending back to back for {res['duration_s']} s")
    out(f"{'path':<34} {'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'n':>6} {'failed':>6}")
    for name, levels in res["throughput"].items():
        for lv in levels:
            out(f"{name:<34} {lv['clients']:>7} {lv['requests_per_s']:>8.1f} {_f(lv['p50_ms']):>8} "
                f"{_f(lv['p99_ms']):>8} {lv['n']:>6} {lv['failed']:>6}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000, help="latency rounds (one request per path each)")
    ap.add_argument("--latency-max-s", type=float, default=300, help="time bound of the latency phase")
    ap.add_argument("--clients", default="1,4,8", help="concurrent clients of each throughput level")
    ap.add_argument("--duration", type=float, default=10, help="seconds of each throughput level")
    ap.add_argument("--max-per-client", type=int, default=20000, help="requests bound of one client in a level")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--keep", action="store_true", help="leave the bench's lab running afterwards")
    args = ap.parse_args()
    try:
        clients = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        ap.error(f"--clients {args.clients!r}: a comma list of whole numbers, e.g. 1,4,8")
    if not clients or not all(1 <= c <= 64 for c in clients):
        ap.error(f"--clients {args.clients!r}: each between 1 and 64")
    if not 1 <= args.requests <= MAX_REQUESTS or not 0 < args.duration <= MAX_PHASE_S:
        ap.error(f"--requests between 1 and {MAX_REQUESTS}, --duration between 0 and {MAX_PHASE_S} s")
    from llmfleet.lab import hosts

    if not LOCK.exists():
        print("the lab is not set up: run `invoke lab.setup` first", file=sys.stderr)
        return 2
    print(f"machine: {load()} at start", file=sys.stderr)
    lab = f"llmfleet-gw{secrets.token_hex(3)}"
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": load(),
                           "cores": os.cpu_count(), "requests": args.requests, "duration_s": args.duration,
                           "body": BODY, "lab": lab}
    tmp = Path(tempfile.mkdtemp(prefix="llmfleet-gwbench-"))
    known = tmp / "known_hosts"
    try:
        gen = hosts.generate_inventory(ROOT / "inventory" / "lab", tmp / "generated", key_path=KEY, lock_path=LOCK)
        t0 = time.monotonic()
        hosts.up(str(gen), lab=lab, names=[*REPLICA_HOSTS, GATEWAY_HOST], known_hosts=known,
                 key_path=KEY, log=lambda m: print(m, file=sys.stderr))
        print(f"lab {lab} up: {time.monotonic() - t0:.1f}s", file=sys.stderr)
        addresses = {h: lab_address(f"{lab}-{h}") for h in [*REPLICA_HOSTS, GATEWAY_HOST]}
        inv = tmp / "inventory"
        shutil.copytree(gen, inv)
        cert, key = make_cert(tmp, addresses[GATEWAY_HOST])
        write_inventory(inv, addresses, cert, key)
        print(f"deployed 4 replicas and 2 gateways: {deploy(inv, tmp):.1f}s", file=sys.stderr)
        gw = addresses[GATEWAY_HOST]
        direct = Route(f"direct {REPLICA_HOSTS[0]}:8000", f"http://{addresses[REPLICA_HOSTS[0]]}:8000", REPLICA_KEY)
        rotating = Rotating("direct, 4 replicas in turn", [
            Route(f"{h}:{port}", f"http://{addresses[h]}:{port}", REPLICA_KEY)
            for port in (8000, 8001) for h in REPLICA_HOSTS])
        plain = Route(f"gateway http :{PLAIN_PORT} (4 replicas)", f"http://{gw}:{PLAIN_PORT}", CLIENT_KEY)
        tls = Route(f"gateway https :{TLS_PORT} (4 replicas)", f"https://{gw}:{TLS_PORT}", CLIENT_KEY,
                    ssl.create_default_context(cafile=str(cert)))
        # the first path is the baseline of "added": the replicas in turn, as the gateway sends them
        res["paths"] = [rotating.name, direct.name, plain.name, tls.name]
        metrics = {plain.name: f"http://{gw}:9912/metrics", tls.name: f"http://{gw}:9902/metrics"}
        before = {n: scrape(u) for n, u in metrics.items()}
        since = int(time.time())
        print(f"latency: {args.requests} rounds", file=sys.stderr)
        res["latency"] = latency([rotating, direct, plain, tls], args.requests, args.latency_max_s)
        after = {n: scrape(u) for n, u in metrics.items()}
        res["latency"]["haproxy_log"] = gateway_log(lab, "gateway-plain", since)
        res["latency"]["frontend"] = {n: {k: after[n].get(k, 0) - before[n].get(k, 0) for k in after[n]}
                                      for n in metrics}
        print(f"throughput: clients {clients}, {args.duration}s each", file=sys.stderr)
        res["throughput"] = throughput([direct, plain], clients, args.duration, args.max_per_client)
        res["load_end"] = load()
    finally:
        if args.keep:
            print(f"kept: lab {lab} (`invoke lab.down --name {lab}`), files in {tmp}", file=sys.stderr)
        else:
            hosts.down(lab, known_hosts=known)
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_tables(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
