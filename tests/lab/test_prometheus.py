"""A real Prometheus (Debian's /usr/bin/prometheus, on a free loopback port of this machine) scraping the lab's
engines through the targets `invoke prometheus.targets` writes, with llmfleet's rules loaded.

The lab publishes its engines on loopback by default (reached through SSH tunnels); here the lab hosts are
reached at their lab-network address, as a real fleet's hosts at their private address (host_vars:
ansible_host, port 22), and publish their engines on 0.0.0.0: this machine reaches them there.

The rules are the shipped ones (src/llmfleet/monitoring/rules.yml, every expression as shipped) with their
time windows scaled down by ``SCALE`` (``lab_rules``: each `for:` and each range selector, so 5m becomes
15 s, 10m 30 s, 15m 45 s): the lab cannot wait a quarter of an hour per alert. Scrapes and evaluations
every second.

Asserted, on two llama.cpp hosts: every lab service is in Prometheus with llmfleet's labels (one
llama-server holds an API key: scraped by its own job, the key read from the credentials_file the operator
writes, never from the task); a deploy that changes a release re-writes the targets
(llmfleet.prometheus_targets) and Prometheus shows the new release; LlmfleetEngineDown fires for a stopped
engine and not for the running one; LlmfleetDecodeBelowFloor fires, under the same load of completions on
both engines, for the one whose release's health mark carries the floor of a faster card (re-read by
`prometheus.targets` and a reload of Prometheus) and not for the one above its own floor, and
LlmfleetRestartStorm stays quiet after the single stop and start of the engine-down test.

Asserted on vLLM (marker ``vllm``, one deploy): LlmfleetEngineHung fires when the engine core stops
(SIGSTOP) while requests run, its API process still answering /metrics (so not LlmfleetEngineDown), and is
not raised while the same engine serves that load. A llama-server whose main loop is frozen cannot show
this: its /metrics is answered by that loop, so the scrape fails and the engine is down
(LlmfleetEngineDown). Every alert is also covered by promtool's rule unit tests (tests/test_monitoring.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llmfleet.monitoring import packaged

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
HOSTS = ["gpu-v100-01", "gpu-t4-01"]
PROMETHEUS = "/usr/bin/prometheus"
WAIT_S = 90
KEY_ENV = "LLMFLEET_LAB_PROM_KEY"  # gpu-t4-01's llama-server holds an API key: its /metrics needs it
KEY = "lab-prom-key-7f3a9c"
KEYED = HOSTS[1]
SCALE = 1 / 20  # the rules' windows in the lab: 5m -> 15 s
SCRAPE = "3s"  # the lab's scrape interval and timeout: five samples in the shortest scaled window
VLLM_HOST = "gpu-4090-01"
DURATION = re.compile(r"^(\d+)([smhd])$")
RANGE = re.compile(r"\[(\d+)([smhd])\]")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _scaled(n: str, unit: str, factor: float) -> str:
    return f"{max(1, round(int(n) * UNIT_S[unit] * factor))}s"


def lab_rules(rules: dict[str, Any], factor: float) -> dict[str, Any]:
    """The rules file with every `for:` and every range selector (``[5m]``) multiplied by ``factor`` (in
    seconds, at least 1 s); expressions, labels and annotations otherwise as given."""
    out = json.loads(json.dumps(rules))
    for group in out["groups"]:
        for rule in group["rules"]:
            rule["expr"] = RANGE.sub(lambda m: f"[{_scaled(m[1], m[2], factor)}]", rule["expr"])
            if "for" in rule:
                m = DURATION.match(str(rule["for"]))
                assert m, f"unexpected duration {rule['for']!r} in {rule.get('alert')}"
                rule["for"] = _scaled(m[1], m[2], factor)
    return out


def _rules_doc() -> dict[str, Any]:
    return lab_rules(yaml.safe_load(packaged("rules.yml").read_text()), SCALE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lab_address(lab, host: str) -> str:
    out = subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                          lab.container(host)], capture_output=True, text=True, timeout=30, check=True).stdout
    return out.split()[0]


def invoke(lab, tmp: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300):
    full = dict(os.environ, **{KEY_ENV: KEY}, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(tmp / "known_hosts"),
                INVOKE_LLMFLEET_AUDIT_LOG=str(tmp / "local-audit.jsonl"), COLUMNS="250", **(env or {}))
    argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), args[0], "-i", str(tmp / "inventory"),
            *args[1:]]
    return subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=timeout, env=full)


def invoke_background(lab, tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``invoke`` started and not waited for (its output: ``communicate()``)."""
    full = dict(os.environ, **{KEY_ENV: KEY}, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(tmp / "known_hosts"),
                INVOKE_LLMFLEET_AUDIT_LOG=str(tmp / "local-audit.jsonl"), COLUMNS="250", **(env or {}))
    argv = [sys.executable, "-m", "invoke", "--search-root", str(REPO), args[0], "-i", str(tmp / "inventory"),
            *args[1:]]
    return subprocess.Popen(argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full)


def _inventory(lab, tmp: Path, hosts: list[str] = HOSTS, group_vars: str = "all.yml",
               extra: dict[str, Any] | None = None) -> dict[str, str]:
    """The lab's inventory with ``hosts`` reached at their lab-network address (as a fleet's hosts at
    their private address: SSH on port 22, the engines published on 0.0.0.0), a low decode floor and
    longer health stages (two cores shared with other runs; the services of ``group_vars``); the KEYED
    host's service holds an API key (its llama-server's /metrics then needs it). ``extra``: more host
    variables for every host."""
    dest = tmp / "inventory"
    shutil.copytree(lab.inventory_path, dest)
    gv = dest / "group_vars" / group_vars
    data = yaml.safe_load(gv.read_text())
    data["llmfleet_services"] = [dict(s, health=dict(s.get("health") or {}, min_tokps=0.5, stage_timeout_s=120,
                                                  load_timeout_s=max(180, (s.get("health") or {}).get(
                                                      "load_timeout_s", 0))))
                                 for s in data["llmfleet_services"]]
    gv.write_text(yaml.safe_dump(data, sort_keys=False))
    addresses = {}
    for h in hosts:
        addresses[h] = _lab_address(lab, h)
        (dest / "host_vars").mkdir(exist_ok=True)
        hv = {"ansible_host": addresses[h], "ansible_port": 22, "llmfleet_bind_address": "0.0.0.0",
              "llmfleet_allow_unauthenticated": True, **(extra or {})}
        if h == KEYED:
            hv["llmfleet_services"] = [dict(s, api_key={"from_env": KEY_ENV}) for s in data["llmfleet_services"]]
        (dest / "host_vars" / f"{h}.yml").write_text(yaml.safe_dump(hv))
    shutil.copyfile(lab.known_hosts, tmp / "known_hosts")  # the hosts' keys at their lab address: a new entry
    return addresses


def _query(port: int, q: str) -> list[dict[str, Any]]:
    r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": q}, timeout=5, trust_env=False)
    r.raise_for_status()
    return r.json()["data"]["result"]


def _wait(what: str, fn, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except httpx.HTTPError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(1)
    raise AssertionError(f"waited {timeout:.0f} s for {what}; last: {last!r}")


def _config(tmp: Path, sd: Path) -> Path:
    """prometheus.yml: the scrape jobs `prometheus.targets` wrote (every 3 s, each scrape given 3 s: a CPU
    engine on a busy machine can take over a second to answer /metrics, and a timed-out scrape is a gap
    or a false down), the packaged rules with their windows scaled (``lab_rules``) and the hosts' floor
    rules `prometheus.targets` wrote."""
    jobs = yaml.safe_load((sd / "scrape-jobs.yml").read_text())["scrape_configs"]
    for j in jobs:
        j["scrape_interval"] = SCRAPE
        j["scrape_timeout"] = SCRAPE
    (tmp / "rules.yml").write_text(yaml.safe_dump(_rules_doc(), sort_keys=False))
    cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
           "rule_files": [str(tmp / "rules.yml"), str(sd / "rules" / "*.yml")], "scrape_configs": jobs}
    p = tmp / "prometheus.yml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _start_prometheus(tmp: Path, sd: Path) -> tuple[subprocess.Popen, int, Any]:
    port = _free_port()
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={_config(tmp, sd)}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    return proc, port, log


def _stop_prometheus(proc: subprocess.Popen, log: Any) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    log.close()


def _firing(port: int, alert: str) -> set[str]:
    return {r["metric"]["host"] for r in _query(port, f'ALERTS{{alertname="{alert}", alertstate="firing"}}')}


class Load:
    """Completions sent back to back to each engine (a lab address, port 8000) from one thread per engine,
    each bounded: at most ``max_requests`` requests, none past ``max_s`` seconds, until ``stop()``. What
    came back is counted (``done``, ``failed``) per address."""

    def __init__(self, engines: dict[str, str | None], body: dict[str, Any], *, threads_per_engine: int = 1,
                 max_requests: int = 400, max_s: float = 300, request_timeout_s: float = 60) -> None:
        self.stop_event = threading.Event()
        self.done: dict[str, int] = {a: 0 for a in engines}
        self.failed: dict[str, int] = {a: 0 for a in engines}
        self.deadline = time.monotonic() + max_s
        self.threads = [threading.Thread(target=self._run, args=(a, k, body, max_requests, request_timeout_s),
                                         daemon=True)
                        for a, k in engines.items() for _ in range(threads_per_engine)]
        for t in self.threads:
            t.start()

    def _run(self, address: str, key: str | None, body: dict[str, Any], max_requests: int, timeout: float) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            for _ in range(max_requests):
                if self.stop_event.is_set() or time.monotonic() > self.deadline:
                    return
                try:
                    r = client.post(f"http://{address}:8000/v1/completions", json=body, headers=headers)
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.done[address] += 1
                else:
                    self.failed[address] += 1
                    time.sleep(1)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=90)


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"{PROMETHEUS} not installed: scripts/bootstrap.sh installs Debian's prometheus", pytrace=False)
    tmp = tmp_path_factory.mktemp("prometheus")
    lab.ensure_hosts(*HOSTS)
    addresses = _inventory(lab, tmp)
    res = invoke(lab, tmp, "deploy", "-l", ",".join(HOSTS), "--accept-new-host-keys", "--json", timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    sd = tmp / "sd"
    keys = tmp / "keys"
    res = invoke(lab, tmp, "prometheus.targets", "--out", str(sd), "-l", ",".join(HOSTS), "--keys-dir", str(keys),
                 "--json")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    doc = json.loads(res.stdout)
    keys.mkdir()
    (keys / "env-llmfleet_lab_prom_key").write_text(KEY)  # what the operator writes, mode 0600
    os.chmod(keys / "env-llmfleet_lab_prom_key", 0o600)
    proc, port, log = _start_prometheus(tmp, sd)
    try:
        yield {"tmp": tmp, "sd": sd, "keys": keys, "port": port, "proc": proc, "targets": doc,
               "addresses": addresses}
    finally:
        _stop_prometheus(proc, log)


def test_prometheus_scrapes_every_lab_service_with_its_labels(fleet):
    doc = fleet["targets"]
    assert doc["unreachable"] == [] and doc["hosts_not_read"] == []
    assert {(t["host"], t["service"]) for t in doc["targets"]} == {(h, "tiny") for h in HOSTS}
    for t in doc["targets"]:
        assert t["address"] == f"{fleet['addresses'][t['host']]}:8000"

    def all_up():
        got = _query(fleet["port"], 'up{job=~"llmfleet-.*"} == 1')
        return got if {r["metric"]["host"] for r in got} == set(HOSTS) else None

    got = _wait("both lab engines scraped", all_up)
    for r in got:
        m = r["metric"]
        assert m["service"] == "tiny" and m["engine"] == "llamacpp" and m["model"] == "tiny-qwen2"
        assert m["served_model_name"] == "tiny-qwen2" and m["release"] and m["driver"] and m["card"]
        assert m["group"] in ("v100", "t4")
    # the key-holding llama-server is scraped by its own job, with the key from its credentials_file
    assert {r["metric"]["host"]: r["metric"]["job"] for r in got} == {
        HOSTS[0]: "llmfleet-engines", KEYED: "llmfleet-auth-env-llmfleet_lab_prom_key"}
    written = "".join(p.read_text() for p in fleet["sd"].rglob("*") if p.is_file())
    assert KEY not in written and "credentials_file:" in written
    # the engine's own series carry the same labels
    series = _wait("llama-server's metrics", lambda: _query(fleet["port"], "llamacpp:n_decode_total"))
    assert {r["metric"]["host"] for r in series} == set(HOSTS)


def test_a_deploy_that_changes_a_release_rewrites_the_targets(lab, fleet):
    tmp, sd, port = fleet["tmp"], fleet["sd"], fleet["port"]
    host = HOSTS[0]
    before = json.loads((sd / "engines" / f"{host}.json").read_text())[0]["labels"]["release"]
    hv = tmp / "inventory" / "host_vars" / f"{host}.yml"
    services = yaml.safe_load((tmp / "inventory" / "group_vars" / "all.yml").read_text())["llmfleet_services"]
    hv.write_text(yaml.safe_dump(yaml.safe_load(hv.read_text()) | {
        "llmfleet_services": [dict(s, env={"LLMFLEET_LAB_MARK": "2"}) for s in services]}))
    res = invoke(lab, tmp, "deploy", "-l", host, env={"INVOKE_LLMFLEET_PROMETHEUS_TARGETS": str(sd)}, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "prometheus targets in" in res.stderr
    after = json.loads((sd / "engines" / f"{host}.json").read_text())[0]["labels"]["release"]
    assert after != before

    def shows_new():
        got = _query(port, f'up{{job=~"llmfleet-.*", host="{host}", release="{after}"}} == 1')
        return got or None

    _wait(f"Prometheus to scrape {host} with release {after}", shows_new)


def test_the_engine_down_alert_fires_for_a_stopped_engine_only(lab, fleet):
    tmp, port = fleet["tmp"], fleet["port"]
    stopped, running = HOSTS[1], HOSTS[0]
    res = invoke(lab, tmp, "stop", "-l", stopped, "--service", "tiny")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    try:
        def firing():
            got = _query(port, 'ALERTS{alertname="LlmfleetEngineDown", alertstate="firing"}')
            return got or None

        got = _wait("LlmfleetEngineDown to fire", firing)
        assert {r["metric"]["host"] for r in got} == {stopped}
        assert _query(port, f'up{{job=~"llmfleet-.*", host="{running}"}} == 1')
    finally:
        invoke(lab, tmp, "start", "-l", stopped, "--service", "tiny")


HEALTH_MARK = "/opt/llmfleet/services/tiny/current/health.json"  # the lab's root; release.store's layout
FASTER_FLOOR = 1e6  # tok/s: above any speed llama-server reaches on the lab's tiny model (about 10,000)


def _refresh_floors(lab, fleet) -> dict[str, Any]:
    """`invoke prometheus.targets` re-run (as from cron after a change) and Prometheus told to re-read its
    rule files (SIGHUP: the test's Prometheus has no --web.enable-lifecycle)."""
    res = invoke(lab, fleet["tmp"], "prometheus.targets", "--out", str(fleet["sd"]), "-l", ",".join(HOSTS),
                 "--keys-dir", str(fleet["keys"]), "--json")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    fleet["proc"].send_signal(signal.SIGHUP)
    return json.loads(res.stdout)


def _floors(port: int) -> dict[str, float]:
    return {r["metric"]["host"]: float(r["value"][1]) for r in _query(port, "llmfleet:decode_floor_tokps")}


def test_the_below_floor_alert_fires_for_a_service_below_its_releases_floor_only(lab, fleet):
    """The slow host's current release carries the floor of a faster card (its health mark re-written, as
    a floor recorded elsewhere would be); under the same load of completions on both engines the alert
    fires for it and not for the other, whose own floor its engine beats. Run right after the engine-down
    test: its single stop and start of one engine is no restart storm."""
    port = fleet["port"]
    slow, healthy = HOSTS
    storm_window = _scaled("1", "h", SCALE)
    original = lab.exec(slow, ["cat", HEALTH_MARK]).stdout
    mark = json.loads(original)
    assert mark.get("floor_tokps") is not None, f"{slow}'s health mark has no floor: {original[:300]}"
    lab.exec(slow, ["sh", "-c", 'cat > "$1"', "sh", HEALTH_MARK],
             input=json.dumps(dict(mark, floor_tokps=FASTER_FLOOR)) + "\n")
    load = None
    storms: list[Any] = []
    try:
        doc = _refresh_floors(lab, fleet)
        assert {t["host"]: float(t["labels"]["floor_tokps"]) for t in doc["targets"]}[slow] == FASTER_FLOOR
        floors = _wait("the new floor in Prometheus",
                       lambda: (f := _floors(port)).get(slow) == FASTER_FLOOR and healthy in f and f)
        load = Load({fleet["addresses"][slow]: None, fleet["addresses"][healthy]: KEY},
                    {"model": "tiny-qwen2", "prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": True,
                     "temperature": 0}, max_requests=20000, max_s=300, request_timeout_s=60)

        def below_floor():
            storm = _query(port, 'ALERTS{alertname="LlmfleetRestartStorm"}')
            if storm:
                storms.append({"alerts": storm, "changes_up": _query(
                    port, f'changes(up{{job=~"llmfleet-.*"}}[{storm_window}])'),
                    "resets_n_decode": _query(port, f"resets(llamacpp:n_decode_total[{storm_window}])")})
            return _query(port, 'ALERTS{alertname="LlmfleetDecodeBelowFloor", alertstate="firing"}') or None

        got = _wait("LlmfleetDecodeBelowFloor to fire", below_floor, timeout=300)
        assert {r["metric"]["host"] for r in got} == {slow}
        assert {r["metric"]["service"] for r in got} == {"tiny"}
        speeds = {r["metric"]["host"]: float(r["value"][1]) for r in _query(port, "llmfleet:decode_tokps")}
        # the healthy engine is measured, with a floor of its own, and beats it: nothing pending for it
        assert speeds.get(healthy, 0) > floors[healthy], (speeds, floors)
        assert 0 < speeds[slow] < FASTER_FLOOR
        assert not _query(port, f'ALERTS{{alertname="LlmfleetDecodeBelowFloor", host="{healthy}"}}')
        assert load.done[fleet["addresses"][slow]] > 0 and load.done[fleet["addresses"][healthy]] > 0
        below_floor()
        assert not storms, f"LlmfleetRestartStorm after one stop and start: {json.dumps(storms)[:3000]}"
    finally:
        if load is not None:
            load.stop()
        lab.exec(slow, ["sh", "-c", 'cat > "$1"', "sh", HEALTH_MARK], input=original, check=False)
        _refresh_floors(lab, fleet)


@pytest.fixture(scope="module")
def vllm_fleet(lab, tmp_path_factory):
    """The lab's vLLM host deployed once, reached at its lab address, with a Prometheus of its own. Its
    watchdog is off: it would restart the hung engine (tests/lab/test_liveness.py) before the alert's
    window, and here the alert is under test."""
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"{PROMETHEUS} not installed: scripts/bootstrap.sh installs Debian's prometheus", pytrace=False)
    tmp = tmp_path_factory.mktemp("prometheus-vllm")
    lab.ensure_hosts(VLLM_HOST)
    addresses = _inventory(lab, tmp, [VLLM_HOST], "lab_vllm.yml", {"llmfleet_watchdog": {"enabled": False}})
    res = invoke(lab, tmp, "deploy", "-l", VLLM_HOST, "--accept-new-host-keys", "--json", timeout=1200)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    sd = tmp / "sd"
    res = invoke(lab, tmp, "prometheus.targets", "--out", str(sd), "-l", VLLM_HOST, "--json")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    proc, port, log = _start_prometheus(tmp, sd)
    try:
        yield {"tmp": tmp, "sd": sd, "port": port, "address": addresses[VLLM_HOST]}
    finally:
        _stop_prometheus(proc, log)
        lab.exec(VLLM_HOST, ["systemctl", "stop", "llmfleet-tiny-vllm.service"], check=False, timeout=180)


def _running_on_host(lab, host: str, address: str) -> float:
    """vllm:num_requests_running as the engine's own /metrics (``address``:8000) says it now, read on the host."""
    out = lab.exec(host, ["sh", "-c", f"curl -s -m 5 http://{address}:8000/metrics | grep '^vllm:num_requests_running'"],
                   check=False).stdout
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in out.splitlines() if ln.strip())


@pytest.mark.vllm
def test_the_hung_alert_fires_for_a_vllm_engine_core_stopped_under_load(lab, vllm_fleet):
    port, host = vllm_fleet["port"], VLLM_HOST
    load = Load({vllm_fleet["address"]: None},
                {"model": "tiny-qwen2", "prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True,
                 "temperature": 0}, threads_per_engine=2, max_requests=300, max_s=900, request_timeout_s=120)
    stopped = None
    try:
        # healthy and busy: requests seen running and tokens counted over the last minute (each asked of
        # its own series: on a busy machine both need not show in one and the same evaluation)
        _wait("vLLM serving the load in Prometheus", lambda: _query(
            port, f'max_over_time(vllm:num_requests_running{{host="{host}"}}[1m]) > 0') and _query(
            port, f'increase(vllm:generation_tokens_total{{host="{host}"}}[1m]) > 0'), timeout=600)
        _wait("a request running now", lambda: _query(port, f'vllm:num_requests_running{{host="{host}"}} > 0'),
              timeout=300)
        assert not _query(port, 'ALERTS{alertname="LlmfleetEngineHung"}'), "a busy engine is not hung"
        found = lab.exec(host, ["sh", "-c", "pgrep -f '[E]ngineCore'"], check=False).stdout.split()
        assert len(found) == 1, f"expected one EngineCore process on the host, found {found}"
        # the API process publishes the engine core's last stats: stopped between two requests, its
        # gauge says 0 running for good and nothing looks stuck. Stop it again until the engine's own
        # /metrics shows a request running at the stop (bounded).
        for _attempt in range(8):
            lab.exec(host, ["kill", "-STOP", found[0]])
            stopped = int(found[0])
            time.sleep(2)
            if _running_on_host(lab, host, vllm_fleet["address"]) > 0:
                break
            lab.exec(host, ["kill", "-CONT", found[0]])
            stopped = None
            time.sleep(3)
        assert stopped is not None, "the engine core never stopped with a request running"
        try:
            got = _wait("LlmfleetEngineHung to fire", lambda: _firing(port, "LlmfleetEngineHung") or None,
                        timeout=240)
        except AssertionError as exc:  # say what Prometheus saw: the alert pending, the scrape, the series
            seen = {q: _query(port, q) for q in ('ALERTS{alertname=~"LlmfleetEngine.*"}',
                                                 f'up{{host="{host}"}}', f'vllm:num_requests_running{{host="{host}"}}',
                                                 f'increase(vllm:generation_tokens_total{{host="{host}"}}[1m])')}
            raise AssertionError(f"{exc}; Prometheus saw: {seen}") from None
        assert got == {host}
        # the API process still answers /metrics: hung, not down
        assert _query(port, f'up{{job=~"llmfleet-.*", host="{host}"}} == 1')
        assert not _firing(port, "LlmfleetEngineDown")
        assert load.done[vllm_fleet["address"]] > 0
    finally:
        if stopped is not None:
            lab.exec(host, ["kill", "-CONT", str(stopped)], check=False)
        load.stop()
