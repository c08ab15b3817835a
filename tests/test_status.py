"""Status, releases and audit: rows from host state (pure), and the shell against a real sshd on
loopback (one host with releases and a live /metrics endpoint, one host that is down)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llmfleet.fleet import status as st
from llmfleet.host.group import run_on_hosts
from llmfleet.inventory.ansible import Host
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.knowledge.release_state import parse_state
from llmfleet.release import audit
from llmfleet.release.store import audit_record
from llmfleet.settings import SshSettings

REPO = Path(__file__).resolve().parents[1]
R1 = "20261101T100000Z-aaaaaaaaaa"
R2 = "20261102T100000Z-bbbbbbbbbb"
R3 = "20261103T100000Z-cccccccccc"
DIGEST = "sha256:" + "ab" * 32


def manifest(rid, engine="llamacpp", who="alice@ws1", digest=DIGEST, message=""):
    return {"release": rid, "engine": engine, "who": who, "message": message,
            "image": {"key": f"{engine}:x", "ref": f"reg:5000/{engine}@{digest}", "digest": digest}}


def state_output(services):
    """What release.state_script prints, built from {svc: (current, unit, {rid: (manifest, health)})}."""
    lines = []
    for name, (current, unit, rels) in services.items():
        lines += [f"@@service {name}", f"@@current {'releases/' + current if current else ''}", f"@@unit {unit}"]
        for rid, (m, h) in rels.items():
            lines.append(f"@@release {rid}")
            if m is not None:
                lines.append("@@manifest " + json.dumps(m))
            if h is not None:
                lines.append("@@health " + json.dumps(h))
    lines.append("@@end")
    return "\n".join(lines) + "\n"


def svc(name, engine="llamacpp", port=8080):
    return Service(name=name, engine=engine, model="tiny", model_path="/srv/models/tiny", image=f"{engine}:x", port=port)


HEALTHY = {"result": "healthy", "decode_tokps": 63.7}


# ---------------------------------------------------------------------------------------------
# pure


@pytest.mark.parametrize(
    ("names", "inv_gpu", "expected"),
    [
        (["Tesla V100-SXM2-32GB"], None, "Tesla V100-SXM2-32GB"),
        (["Tesla V100-SXM2-32GB"] * 2, "v100-16", "2x Tesla V100-SXM2-32GB"),
        (["NVIDIA GeForce RTX 4090", "Tesla T4"], None, "NVIDIA GeForce RTX 4090, Tesla T4"),
        ([], "v100-sxm2-32gb", "v100-sxm2-32gb"),
        ([], None, "-"),
    ],
)
def test_card_label(names, inv_gpu, expected):
    assert st.card_label(names, inv_gpu) == expected


def test_parse_card_names_reads_only_after_the_marker():
    out = state_output({}) + "@@gpu\nTesla T4\nTesla T4\n"
    assert st.parse_card_names(out) == ["Tesla T4", "Tesla T4"]
    assert st.parse_card_names("@@end\n") == []


def test_status_script_reports_cards_on_a_host_with_no_services_yet(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'Tesla T4'\necho 'Tesla T4'\n")
    fake.chmod(0o755)
    out = subprocess.run(["sh", "-c", st.status_script(str(tmp_path / "no-root"))], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=30)
    assert out.returncode == 0
    assert parse_state(out.stdout) == {}
    assert st.parse_card_names(out.stdout) == ["Tesla T4", "Tesla T4"]


def test_rows_for_a_reachable_host():
    states = parse_state(state_output({
        "chat": (R2, "active", {R1: (manifest(R1), HEALTHY), R2: (manifest(R2), {"result": "healthy",
                                                                                "decode_tokps": 4.2})}),
        "old": (R1, "inactive", {R1: (manifest(R1, engine="vllm"), None)}),
    }))
    from llmfleet.fleet.metrics import EngineMetrics

    status = st.HostStatus(host="gpu-1", reachable=True, gpus=["Tesla V100-SXM2-32GB"], states=states,
                           metrics={"chat": EngineMetrics(requests_running=2, requests_waiting=0,
                                                          kv_cache_usage=0.5, generation_tokens_total=1234)})
    settings = HostSettings(services=[svc("chat"), svc("embed", port=8081)])
    rows = {r.service: r for r in st.host_rows(status, settings)}
    assert list(rows) == ["chat", "embed", "old"]  # inventory order, then services found only on the host
    chat = rows["chat"]
    assert (chat.card, chat.release, chat.unit, chat.health, chat.tokps) == (
        "Tesla V100-SXM2-32GB", R2, "active", "healthy", 4.2)
    assert st.short_digest(chat.digest) == "ab" * 6
    assert st.fmt_metrics(chat.metrics) == ("2", "0", "50%", "1234")
    assert rows["embed"].unit == "not deployed" and rows["embed"].release is None
    assert rows["old"].engine == "vllm" and rows["old"].health == "unconfirmed" and rows["old"].confirmed is False
    assert "not in the inventory" in rows["old"].note


def test_rows_for_an_unreachable_host_name_every_service_and_the_reason():
    status = st.HostStatus(host="gpu-2", reachable=False, error="host gpu-2: cannot connect to 10.0.0.2:22: timed out")
    rows = st.host_rows(status, HostSettings(services=[svc("a"), svc("b", port=8081)], gpu="t4"))
    assert [(r.service, r.unit, r.card) for r in rows] == [("a", "unreachable", "t4"), ("b", "unreachable", "t4")]
    assert all("timed out" in r.note for r in rows)
    rows = st.host_rows(status, HostSettings())
    assert [(r.service, r.unit) for r in rows] == [("-", "unreachable")]


def test_metrics_failure_reason_is_kept_as_a_note():
    states = parse_state(state_output({"chat": (R1, "active", {R1: (manifest(R1), HEALTHY)})}))
    status = st.HostStatus(host="h", reachable=True, states=states, metrics={"chat": "/metrics answered 401"})
    (row,) = st.host_rows(status, HostSettings(services=[svc("chat")]))
    assert row.metrics is None and row.note == "/metrics answered 401"
    assert st.fmt_metrics(row.metrics) == ("-", "-", "-", "-")


def test_current_pointing_at_a_missing_release_is_flagged():
    states = parse_state(state_output({"chat": (R3, "failed", {R1: (manifest(R1), HEALTHY)})}))
    (row,) = st.host_rows(st.HostStatus(host="h", reachable=True, states=states), HostSettings(services=[svc("chat")]))
    assert row.release == R3 and row.health == "-" and "missing release" in row.note


def test_release_rows_newest_first_with_current_marked():
    states = parse_state(state_output({"chat": (R2, "active", {
        R1: (manifest(R1, who="bob@ws2"), HEALTHY),
        R2: (manifest(R2, message="canary"), HEALTHY),
        R3: (manifest(R3), {"result": "unhealthy", "decode_tokps": 3.9}),
    })}))
    rows = st.release_rows("gpu-1", states)
    assert [(r.release, r.current, r.health) for r in rows] == [
        (R3, False, "unhealthy"), (R2, True, "healthy"), (R1, False, "healthy")]
    assert rows[2].who == "bob@ws2" and rows[1].message == "canary"
    assert rows[0].time == "2026-11-03T10:00:00+00:00"


def test_an_unconfirmed_release_is_marked_in_releases_and_status_with_where_a_failure_goes():
    """A deploy of R3 killed right after its switch: R3 current, never confirmed; R2's check failed;
    R1 is the last release confirmed healthy, where a failed deploy goes back to."""
    states = parse_state(state_output({"chat": (R3, "active", {
        R1: (manifest(R1), HEALTHY),
        R2: (manifest(R2), {"result": "unhealthy"}),
        R3: (manifest(R3), None),
    })}))
    rows = st.release_rows("gpu-1", states)
    assert [(r.release, r.health, r.confirmed, r.go_back) for r in rows] == [
        (R3, "unconfirmed", False, False), (R2, "unhealthy", False, False), (R1, "healthy", True, True)]
    assert rows[0].to_dict()["confirmed"] is False  # in --json too
    (row,) = st.host_rows(st.HostStatus(host="h", reachable=True, states=states), HostSettings(services=[svc("chat")]))
    assert (row.release, row.health, row.confirmed) == (R3, "unconfirmed", False)
    assert f"release {R3} was never confirmed healthy; a failed deploy goes back to {R1}" in row.note
    # nothing confirmed at all: said so
    states = parse_state(state_output({"chat": (R3, "active", {R3: (manifest(R3), None)})}))
    (row,) = st.host_rows(st.HostStatus(host="h", reachable=True, states=states), HostSettings(services=[svc("chat")]))
    assert "goes back to nothing (no release confirmed healthy: the service is stopped)" in row.note
    assert [r.go_back for r in st.release_rows("h", states)] == [False]


def test_run_on_hosts_keeps_order_and_bounds_time():
    def fn(x):
        if x == "slow":
            time.sleep(3)
        if x == "bad":
            raise ValueError("boom")
        return x.upper()

    t0 = time.monotonic()
    out = run_on_hosts(fn, ["a", "slow", "bad", "b"], forks=4, timeout=0.5)
    assert time.monotonic() - t0 < 2
    assert [(r.host, r.value, r.error) for r in out] == [
        ("a", "A", None), ("slow", None, "no answer within 0s"), ("bad", None, "ValueError: boom"), ("b", "B", None)]
    assert [r.host for r in out.failed] == ["slow", "bad"]
    assert isinstance(out[2].exception, ValueError)


def test_run_on_hosts_in_one_worker_runs_in_the_callers_thread():
    seen = run_on_hosts(lambda h: threading.current_thread() is threading.main_thread(), ["a", "b"], forks=1)
    assert list(seen.values()) == [True, True]


def test_ssh_settings_bounded_caps_timeouts():
    ssh = SshSettings.of({"connect_timeout": 10, "command_timeout": 120, "user": "x"}).bounded(5)
    assert (ssh.connect_timeout, ssh.command_timeout, ssh.user) == (5, 5, "x")
    assert SshSettings.of({}).bounded(60).command_timeout == 60


# ---------------------------------------------------------------------------------------------
# audit (pure + local file)


def test_audit_parse_keeps_unparseable_lines_visible():
    text = json.dumps({"time": "2026-11-01T10:00:00+00:00", "action": "deploy"}) + "\nnot json\n\n@@none\n"
    assert audit.parse_lines(text) == [{"time": "2026-11-01T10:00:00+00:00", "action": "deploy"}, {"raw": "not json"}]


def test_audit_tail_script_quotes_the_root():
    s = audit.tail_script("/opt/llm fleet", 7)
    assert "tail -n 7 '/opt/llm fleet/audit.jsonl'" in s


def test_local_audit_log_append_and_tail(tmp_path):
    log = tmp_path / "state" / "audit.jsonl"
    for i in range(300):
        audit.append_local(log, {"time": f"2026-11-01T10:{i // 60:02d}:{i % 60:02d}+00:00", "n": i, "pad": "x" * 400})
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    recs = audit.read_local(log, 5)
    assert [r["n"] for r in recs] == [295, 296, 297, 298, 299]
    assert len(audit.read_local(log, 1000)) == 300
    assert audit.read_local(tmp_path / "missing.jsonl", 5) == []


def test_audit_merge_orders_hosts_by_time():
    a = [{"time": "2026-11-01T10:00:02+00:00", "host": "a"}, {"time": "2026-11-01T10:00:04+00:00", "host": "a"}]
    b = [{"time": "2026-11-01T10:00:03+00:00", "host": "b"}]
    assert [r["host"] for r in audit.merged(a + b, 2)] == ["b", "a"]


def test_audit_row_shortens_digest():
    rec = audit_record(now=__import__("datetime").datetime(2026, 11, 1, 10, 0, tzinfo=__import__("datetime").UTC),
                       who="alice", host="h", action="deploy", service="chat", release=R1, digest=DIGEST,
                       result="deployed")
    cells = audit.row(rec)
    assert cells[audit.COLUMNS.index("image_digest")] == "ab" * 6
    assert cells[audit.COLUMNS.index("time")] == "2026-11-01T10:00:00+00:00"


@pytest.mark.parametrize("n", [0, -1, 10_001, "x"])
def test_audit_count_out_of_range_is_a_usage_error(n):
    from llmfleet.errors import UsageError

    with pytest.raises(UsageError, match="-n"):
        audit.check_count(n)


# ---------------------------------------------------------------------------------------------
# the shell, against a real sshd on loopback


LLAMACPP_METRICS = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
llamacpp:requests_deferred 3
llamacpp:tokens_predicted_total 4321
llamacpp:prompt_tokens_total 99
"""


@pytest.fixture
def metrics_server():
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(dict(self.headers))
            if self.path != "/metrics":
                self.send_response(404)
                self.end_headers()
                return
            body = LLAMACPP_METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1], seen
    srv.shutdown()
    srv.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_root(root: Path) -> None:
    chat = root / "services" / "chat" / "releases"
    for rid, h in ((R1, HEALTHY), (R2, {"result": "healthy", "decode_tokps": 4100.5})):
        d = chat / rid
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps(manifest(rid)) + "\n")
        (d / "health.json").write_text(json.dumps(h) + "\n")
    (root / "services" / "chat" / "current").symlink_to(f"releases/{R2}")
    (root / "audit.jsonl").write_text(
        "\n".join(json.dumps({"time": f"2026-11-0{i}T10:00:00+00:00", "host": "up", "action": "deploy",
                              "release": rid, "result": "deployed"}) for i, rid in ((1, R1), (2, R2))) + "\n")


@pytest.fixture
def fleet(sshd, tmp_path, metrics_server):
    """Two hosts: 'up' (the loopback sshd, a release tree, /metrics answering) and 'down'."""
    port, seen = metrics_server
    root = tmp_path / "root"
    make_root(root)
    login = {"ansible_host": "127.0.0.1", "ansible_user": "root",
             "ansible_ssh_private_key_file": str(sshd.client_key)}
    services = [{"name": "chat", "engine": "llamacpp", "model": "tiny", "model_path": "/srv/models/tiny",
                 "image": "llamacpp:x", "port": port}]
    up = Host("up", vars={**login, "ansible_port": sshd.port, "llmfleet_root": str(root), "llmfleet_services": services,
                          "llmfleet_gpu": "v100-sxm2-32gb"})
    down = Host("down", vars={**login, "ansible_port": _free_port(), "llmfleet_services": services})
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} " + " ".join(sshd.host_pub.read_text().split()[:2]) + "\n")
    return {"up": up, "down": down, "root": root, "known_hosts": kh, "seen": seen, "metrics_port": port,
            "services": services, "login": login, "sshd": sshd, "tmp": tmp_path}


def test_query_hosts_reads_state_and_live_metrics_and_reports_the_down_host(fleet):
    cfg = {"known_hosts": str(fleet["known_hosts"]), "connect_timeout": 5, "command_timeout": 10}
    results = st.query_hosts([fleet["up"], fleet["down"]], config=cfg, forks=2, timeout=5)
    (up, up_settings), (down, _) = results
    assert up.reachable, up.error
    rows = st.host_rows(up, up_settings)
    assert len(rows) == 1
    row = rows[0]
    assert (row.release, row.health, row.tokps, row.card) == (R2, "healthy", 4100.5, "v100-sxm2-32gb")
    assert row.metrics == {"requests_running": 1.0, "requests_waiting": 3.0, "kv_cache_usage": None,
                           "generation_tokens_total": 4321.0, "prompt_tokens_total": 99.0}
    assert fleet["seen"], "the metrics endpoint was not reached through the tunnel"
    assert not down.reachable and "cannot connect" in down.error
    (drow,) = st.host_rows(down, None)
    assert drow.unit == "unreachable"


def test_metrics_endpoint_down_is_a_note_not_an_error(fleet):
    services = [dict(fleet["services"][0], port=_free_port())]
    host = Host("up", vars={**fleet["up"].vars, "llmfleet_services": services})
    cfg = {"known_hosts": str(fleet["known_hosts"])}
    ((status, settings),) = st.query_hosts([host], config=cfg, timeout=5)
    assert status.reachable
    (row,) = st.host_rows(status, settings)
    assert row.metrics is None and row.note.startswith("/metrics unreachable")
    assert row.health == "healthy"


def test_unknown_host_key_makes_the_host_unreachable_with_the_fix(fleet):
    cfg = {"known_hosts": str(fleet["tmp"] / "empty_known_hosts")}
    ((status, _),) = st.query_hosts([fleet["up"]], config=cfg, timeout=5)
    assert not status.reachable and "--accept-new-host-keys" in status.error


def _inventory(fleet) -> Path:
    import yaml

    inv = fleet["tmp"] / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"fleet": {"hosts": {
        "up": {k: v for k, v in fleet["up"].vars.items()},
        "down": {k: v for k, v in fleet["down"].vars.items()},
    }}}))
    return inv


def _invoke(fleet, *args):
    env = dict(os.environ, INVOKE_LLMFLEET_SSH_KNOWN_HOSTS=str(fleet["known_hosts"]),
               INVOKE_LLMFLEET_AUDIT_LOG=str(fleet["tmp"] / "local-audit.jsonl"), COLUMNS="250")
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=env)


def test_status_task_table_and_json_with_one_host_down(fleet):
    inv = _inventory(fleet)
    res = _invoke(fleet, "status", "-i", str(inv), "--group", "fleet", "--timeout", "5")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert "unreachable" in res.stdout and R2 in res.stdout and "4321" in res.stdout
    assert res.stderr.strip().splitlines()[-1].startswith("error: 1 of 2 host(s) unreachable: down (cannot connect")
    res = _invoke(fleet, "status", "-i", str(inv), "--host", "up", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["unreachable"] == []
    assert doc["rows"][0]["release"] == R2 and doc["rows"][0]["metrics"]["requests_waiting"] == 3.0


def test_releases_and_audit_tasks(fleet):
    inv = _inventory(fleet)
    res = _invoke(fleet, "releases", "-i", str(inv), "--host", "up", "--json")
    assert res.returncode == 0, res.stderr
    rels = json.loads(res.stdout)["releases"]
    assert [(r["release"], r["current"]) for r in rels] == [(R2, True), (R1, False)]
    assert rels[1]["who"] == "alice@ws1"
    res = _invoke(fleet, "releases", "-i", str(inv), "--host", "up")
    assert res.returncode == 0 and "(current)" in res.stdout
    res = _invoke(fleet, "audit", "-i", str(inv), "--host", "up", "-n", "1", "--json")
    assert res.returncode == 0, res.stderr
    assert [r["release"] for r in json.loads(res.stdout)["records"]] == [R2]
    res = _invoke(fleet, "audit", "-i", str(inv), "--host", "down", "--json")
    assert res.returncode == 1 and "down: unreachable" in res.stderr
    # without --host: the local log
    audit.append_local(fleet["tmp"] / "local-audit.jsonl", {"time": "2026-11-05T00:00:00+00:00", "action": "upgrade"})
    res = _invoke(fleet, "audit", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["records"][-1]["action"] == "upgrade"


# ---------------------------------------------------------------------------------------------
# A service over several hosts: each worker's state next to the head's row


def _split_status(host, release, *, unit="active", inputs=None, **kw):
    from llmfleet.knowledge.release_state import Manifest, ReleaseInfo, ServiceState

    s = ServiceState(name="big", current=release, unit=unit)
    s.releases[release] = ReleaseInfo(release, Manifest(release=release, service="big", engine="llamacpp",
                                                        inputs=inputs or {}), HEALTHY)
    return st.HostStatus(host=host, reachable=True, states={"big": s}, **kw)


WORKER_INPUTS = {"role": "worker", "cluster": {"kind": "rpc", "port": 50052}}


@pytest.mark.parametrize(("worker", "ok", "says"), [
    (dict(listening={50052, 22}, containers={"llmfleet-big": "running"}), True, "container running, port 50052 "
                                                                                "listening, release " + R2),
    (dict(listening={22}, containers={"llmfleet-big": "running"}), False, "nothing listens on port 50052"),
    (dict(listening={50052}, containers={"llmfleet-big": "exited"}, unit="failed"), False,
     "unit failed, container exited"),
    (dict(listening=set(), containers={}), False, "container absent"),
])
def test_the_heads_row_carries_each_workers_state(worker, ok, says):
    head = _split_status("h", R1)
    w = _split_status("w", R2, inputs=WORKER_INPUTS, **worker)
    rows = st.host_rows(head, HostSettings(services=[svc("big")])) + st.host_rows(w, HostSettings())
    st.cluster_rows(rows, {"h": head, "w": w}, [("h", "big", ["w"])])
    hrow, wrow = rows
    assert hrow.role == "head" and wrow.role == "worker of h"
    (ws,) = hrow.workers
    assert (ws["host"], ws["release"], ws["port"], ws["ok"]) == ("w", R2, 50052, ok)
    assert says in (wrow.note if ok else hrow.note)
    assert "not in the inventory" not in wrow.note and wrow.note.startswith("worker of h: ")
    assert hrow.to_dict()["workers"][0]["host"] == "w"  # --json carries it


def test_an_unreachable_worker_is_named_on_the_heads_row():
    head = _split_status("h", R1)
    rows = st.host_rows(head, HostSettings(services=[svc("big")]))
    down = st.HostStatus(host="w", reachable=False, error="cannot connect")
    st.cluster_rows(rows, {"h": head, "w": down}, [("h", "big", ["w"])])
    assert rows[0].workers[0]["reachable"] is False and "workers: w: cannot connect" in rows[0].note


def test_status_script_reads_worker_containers_and_listening_ports(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\necho '@@worker-container llmfleet-big running'\n")
    (bin_dir / "ss").write_text("#!/bin/sh\nprintf 'LISTEN 0 4096 10.0.0.2:50052 0.0.0.0:*\\n"
                                "LISTEN 0 128 [::]:22 [::]:*\\nLISTEN 0 128 0.0.0.0:22 0.0.0.0:*\\n'\n")
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    out = subprocess.run(["sh", "-c", st.status_script(str(tmp_path / "no-root"))], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=30)
    assert st.parse_listening(out.stdout) == {22, 50052}
    assert st.parse_worker_containers(out.stdout) == {"llmfleet-big": "running"}
