"""Each replica's state at the gateway in ``invoke status`` (llmfleet.fleet.status): the gateway's ``show stat``
read in status's own round trip, its servers in plain words (in rotation, draining, out) and why, one row per
replica the inventory puts behind it, and one line for a gateway that does not answer.

Recorded: tests/data/gateway_status/status_output.txt is the gateway part of a real ``status_script`` run
(``status_script(root, (), [19901, 19977])`` under ``sh``) against the lab image ``llmfleet-lab/gateway``
(Debian's HAProxy 2.6.12) with a rendered configuration of five replicas: one serving, one drained through the
runtime API, one whose health check got 503, one with nothing listening, one in maintenance; nothing listened
on 19977. show_stat_coming_back.csv is its ``show stat`` a moment after the first replica's listener came back
(``DOWN 1/2``) while the drained one held a request.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from llmfleet.fleet import status as st
from llmfleet.inventory.ansible import load_inventory
from llmfleet.inventory.services import host_settings
from llmfleet.knowledge.release_state import parse_state

DATA = Path(__file__).parent / "data" / "gateway_status"
RECORDED = (DATA / "status_output.txt").read_text(encoding="utf-8")
COMING_BACK = (DATA / "show_stat_coming_back.csv").read_text(encoding="utf-8")
CODER = "m_Qwen_Qwen2.5-Coder-7B_44a34fed"
R1 = "20261101T100000Z-aaaaaaaaaa"


# ---------------------------------------------------------------------------------------------
# the recorded answers


def test_the_recorded_status_output_gives_each_gateways_answer():
    answers = st.parse_gateway_answers(RECORDED)
    assert sorted(answers) == [0, 1]
    assert answers[0].rc == 0 and answers[0].text.startswith("# pxname,svname,")
    assert answers[1].rc == 3


def test_the_recorded_servers_in_haproxys_words():
    servers = st.gateway_read(st.parse_gateway_answers(RECORDED)[0], 19901)
    assert isinstance(servers, list)
    got = {(s.backend, s.server): (s.status, s.sessions, s.check_status, s.check_code, s.last_check) for s in servers}
    assert got == {
        (CODER, "gpu-t4-01__coder"): ("DOWN", 0, "L4CON", "", "Connection refused"),
        (CODER, "gpu-t4-02__coder"): ("MAINT", 0, "", "", ""),
        ("m_tiny-qwen2", "gpu-v100-01__chat"): ("UP", 0, "L7OK", "200", ""),
        ("m_tiny-qwen2", "gpu-v100-02__chat"): ("DRAIN", 0, "L7OK", "200", ""),
        ("m_tiny-qwen2", "gpu-v100-03__chat"): ("DOWN", 0, "L7STS", "503", "Service Unavailable"),
    }
    assert all(isinstance(s.last_change_s, int) for s in servers)


def _server(text: str, server: str) -> st.StatServer:
    servers = st.parse_stat_servers(text)
    assert servers is not None
    return next(s for s in servers if s.server == server)


RECORDED_STAT = st.parse_gateway_answers(RECORDED)[0].text


@pytest.mark.parametrize(("text", "server", "state", "why"), [
    (RECORDED_STAT, "gpu-v100-01__chat", "in rotation", ""),
    (RECORDED_STAT, "gpu-v100-02__chat", "draining",
     "drained through the runtime API (a deploy, stop or remove, or by hand)"),
    (RECORDED_STAT, "gpu-v100-03__chat", "out: down by health checks",
     "health check: Layer7 wrong status (503 Service Unavailable)"),
    (RECORDED_STAT, "gpu-t4-01__coder", "out: down by health checks",
     "health check: Layer4 connection problem (Connection refused)"),
    (RECORDED_STAT, "gpu-t4-02__coder", "out: maintenance",
     "put in maintenance through the runtime API: no request, no health check"),
    (COMING_BACK, "gpu-v100-01__chat", "out: down by health checks",
     "health check passing again, back after 1 more pass(es)"),
    (COMING_BACK, "gpu-v100-02__chat", "draining",
     "drained through the runtime API (a deploy, stop or remove, or by hand); 1 request(s) in flight finish"),
])
def test_recorded_servers_in_plain_words(text, server, state, why):
    s = _server(text, server)
    assert (st.replica_state(s.status), st.replica_why(s)) == (state, why)


# ---------------------------------------------------------------------------------------------
# every status HAProxy 2.6 prints for a server (src/stats.c srv_hlt_st, and MAINT's own forms)


def _stat(status: str, **kw) -> st.StatServer:
    return st.StatServer(backend="m_chat", server="gpu-a__chat", status=status, sessions=kw.pop("sessions", 0), **kw)


@pytest.mark.parametrize(("status", "kw", "state", "why"), [
    ("UP", {"check_status": "L7OK", "check_code": "200"}, "in rotation", ""),
    ("UP 1/2", {"check_status": "L7STS", "check_code": "500", "check_desc": "Layer7 wrong status",
                "last_check": "Internal Server Error"}, "in rotation",
     "health check failing, out after 1 more failure(s): Layer7 wrong status (500 Internal Server Error)"),
    ("no check", {}, "in rotation", "no health check"),
    ("DOWN", {"check_status": "L4TOUT", "check_desc": "Layer4 timeout"}, "out: down by health checks",
     "health check: Layer4 timeout"),
    ("DOWN", {}, "out: down by health checks", "health check failed"),
    ("DOWN (agent)", {}, "out: down by health checks", "its agent check says down"),
    ("DOWN 1/3", {"check_status": "L7OK"}, "out: down by health checks",
     "health check passing again, back after 2 more pass(es)"),
    ("DRAIN", {"sessions": 3}, "draining",
     "drained through the runtime API (a deploy, stop or remove, or by hand); 3 request(s) in flight finish"),
    ("DRAIN", {"check_status": "L4CON", "check_desc": "Layer4 connection problem", "last_check": "Connection refused"},
     "draining", "drained through the runtime API (a deploy, stop or remove, or by hand); "
                 "health check: Layer4 connection problem (Connection refused)"),
    ("DRAIN 1/2", {}, "draining", "drained through the runtime API (a deploy, stop or remove, or by hand)"),
    ("DRAIN (agent)", {}, "draining", "its agent check asked to drain"),
    ("NOLB", {"sessions": 1}, "draining",
     "its health check asks not to send it new requests (NOLB); 1 request(s) in flight finish"),
    ("MAINT", {}, "out: maintenance", "put in maintenance through the runtime API: no request, no health check"),
    ("MAINT (via m_x/gpu-b__chat)", {}, "out: maintenance", "tracks m_x/gpu-b__chat, which is out"),
    ("MAINT (resolution)", {}, "out: maintenance", "its address does not resolve"),
    ("SOMETHING NEW", {}, "unknown", "HAProxy says 'SOMETHING NEW'"),
])
def test_every_server_status_in_plain_words(status, kw, state, why):
    s = _stat(status, **kw)
    assert (st.replica_state(s.status), st.replica_why(s)) == (state, why)


# ---------------------------------------------------------------------------------------------
# a gateway that gives no statistics: one line


@pytest.mark.parametrize(("answer", "said"), [
    (None, "no answer read from HAProxy's runtime API on 127.0.0.1:9901 (the status output was cut)"),
    (st.GatewayAnswer(3, "llmfleet: no HAProxy runtime API on 127.0.0.1:9901"),
     "nothing listens on 127.0.0.1:9901 (HAProxy's runtime API): is the gateway running?"),
    (st.GatewayAnswer(124, ""), "HAProxy's runtime API on 127.0.0.1:9901 did not answer within 5 s"),
    (st.GatewayAnswer(127, "sh: 1: timeout: not found\n"),
     "HAProxy's runtime API on 127.0.0.1:9901: exit 127: sh: 1: timeout: not found"),
    (st.GatewayAnswer(0, "Unknown command. Please enter one of the following commands only :\n  help : this"),
     "HAProxy's runtime API on 127.0.0.1:9901 answered no statistics: Unknown command. Please enter one of the "
     "following commands only :"),
    (st.GatewayAnswer(0, ""), "HAProxy's runtime API on 127.0.0.1:9901 answered no statistics"),
])
def test_a_gateway_that_gives_no_statistics_is_one_line(answer, said):
    assert st.gateway_read(answer, 9901) == said


@pytest.mark.parametrize("text", ["", "garbage", ",,,,", "\x00\x01", "# pxname,svname\n" + "a," * 5, "#\n#,\n"])
def test_parse_stat_servers_never_raises(text):
    servers = st.parse_stat_servers(text)
    assert servers is None or all(s.server not in ("FRONTEND", "BACKEND") for s in servers)


def test_without_its_header_line_the_columns_are_haproxy_2_6s():
    body = "\n".join(ln for ln in RECORDED_STAT.splitlines() if not ln.startswith("#"))
    assert st.parse_stat_servers(body) == st.parse_stat_servers(RECORDED_STAT)


def test_the_answers_of_a_cut_output_leave_the_cut_gateway_out():
    cut = RECORDED[:RECORDED.index("@@gateway-end 3")]
    assert sorted(st.parse_gateway_answers(cut)) == [0]


# ---------------------------------------------------------------------------------------------
# rows: the inventory's replicas at each gateway


GW = {"name": "gw", "engine": "gateway", "image": "gateway:lab", "port": 8443,
      "gateway": {"upstreams": ["replicas"], "admin_port": 19901}}


def _settings(*services):
    return host_settings("edge", {"llmfleet_services": list(services)})


def _status(gateways, deployed=("gw",), unit="active"):
    lines = []
    for name in deployed:
        lines += [f"@@service {name}", f"@@current releases/{R1}", f"@@unit {unit}", f"@@release {R1}"]
    text = "\n".join([*lines, "@@end"]) + "\n"
    return st.HostStatus(host="edge", reachable=True, states=parse_state(text), gateways=gateways)


def _expected(*pairs):
    return [st.Expected(backend, server, server.replace("__", "/"), backend[2:]) for backend, server in pairs]


def _recorded_servers():
    servers = st.gateway_read(st.parse_gateway_answers(RECORDED)[0], 19901)
    assert isinstance(servers, list)
    return servers


def test_rows_follow_the_inventory_and_name_what_it_does_not_know():
    expected = {"gw": _expected(("m_tiny-qwen2", "gpu-v100-01__chat"), ("m_tiny-qwen2", "gpu-v100-02__chat"),
                                ("m_tiny-qwen2", "gpu-v100-04__chat"))}
    rows, problems = st.gateway_rows(_status({"gw": _recorded_servers()}), _settings(GW), expected)
    assert problems == []
    got = [(r.server, r.replica, r.status, r.state) for r in rows]
    assert got[:3] == [
        ("gpu-v100-01__chat", "gpu-v100-01/chat", "UP", "in rotation"),
        ("gpu-v100-02__chat", "gpu-v100-02/chat", "DRAIN", "draining"),
        ("gpu-v100-04__chat", "gpu-v100-04/chat", "-", "out: not in the gateway's configuration"),
    ]
    assert "invoke deploy --host edge --service gw" in rows[2].why and rows[2].sessions is None
    rest = {r.server: r for r in rows[3:]}
    assert set(rest) == {"gpu-v100-03__chat", "gpu-t4-01__coder", "gpu-t4-02__coder"}
    assert all(r.replica is None and r.why.startswith("not behind this gateway in the inventory") for r in rest.values())


def test_without_the_inventorys_view_every_server_is_a_row_as_haproxy_names_it():
    rows, _ = st.gateway_rows(_status({"gw": _recorded_servers()}), _settings(GW), {"gw": None})
    assert len(rows) == 5 and all(r.replica is None and not r.why.startswith("not behind") for r in rows)
    row = next(r for r in rows if r.server == "gpu-v100-03__chat")
    assert row.to_dict() == {
        "host": "edge", "gateway": "gw", "backend": "m_tiny-qwen2", "server": "gpu-v100-03__chat", "replica": None,
        "served_name": None, "status": "DOWN", "sessions": 0, "state": "out: down by health checks",
        "why": "health check: Layer7 wrong status (503 Service Unavailable)", "check": "L7STS",
        "last_change_s": row.last_change_s}
    json.dumps([r.to_dict() for r in rows])


@pytest.mark.parametrize(("status", "rows", "problems"), [
    (_status({"gw": "nothing listens on 127.0.0.1:19901 (HAProxy's runtime API): is the gateway running?"}), 0,
     ["nothing listens on 127.0.0.1:19901 (HAProxy's runtime API): is the gateway running?"]),
    (_status({}), 0, ["not read (status_script was not asked for it)"]),
    (_status({"gw": "whatever"}, deployed=()), 0, []),  # not deployed: its service row says so
    (st.HostStatus(host="edge", reachable=False, error="ssh: timed out"), 0, []),  # unreachable: its rows say so
])
def test_a_gateway_without_statistics_is_a_problem_not_rows(status, rows, problems):
    got_rows, got = st.gateway_rows(status, _settings(GW), None)
    assert (len(got_rows), [p.error for p in got]) == (rows, problems)
    assert all(p.to_dict()["admin_port"] == 19901 for p in got)


def test_the_gateways_service_row_counts_its_replicas():
    status = _status({"gw": _recorded_servers()})
    rows = st.host_rows(status, _settings(GW))
    gw_rows, problems = st.gateway_rows(status, _settings(GW), {"gw": None})
    st.gateway_notes(rows, gw_rows, problems)
    assert rows[0].note.startswith("replicas: 1 in rotation, 1 draining, 3 out")


def test_status_script_asks_each_gateway_of_the_host_by_its_admin_port():
    other = dict(GW, name="gw2", port=8444, gateway=dict(GW["gateway"], admin_port=19911))
    settings = _settings(GW, other)
    assert [s.gateway.admin_port for s in st.gateway_services(settings)] == [19901, 19911]
    script = st.status_script("/opt/llmfleet", (), [19901, 19911])
    assert "llmfleet-gateway-admin 19901 'show stat'" in script and "llmfleet-gateway-admin 19911 'show stat'" in script
    assert "@@gateway" not in st.status_script("/opt/llmfleet")


def test_expected_replicas_from_the_inventory(tmp_path):
    inv_dir = tmp_path / "inv"
    (inv_dir / "host_vars").mkdir(parents=True)
    (inv_dir / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"edge": None}, "children": {
        "replicas": {"hosts": {"gpu-a": None, "gpu-b": None}}}}}))
    engine = {"name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/models/m.gguf", "image": "llamacpp:b1",
              "port": 8080, "served_name": "tiny-qwen2"}
    for h, addr in (("gpu-a", "10.0.0.11"), ("gpu-b", "10.0.0.12")):
        (inv_dir / "host_vars" / f"{h}.yml").write_text(yaml.safe_dump({"ansible_host": addr,
                                                                       "llmfleet_services": [engine]}))
    bad = dict(GW, name="gw-bad", port=8444, gateway=dict(GW["gateway"], upstreams=["nowhere"], admin_port=19911))
    (inv_dir / "host_vars" / "edge.yml").write_text(yaml.safe_dump({"ansible_host": "10.0.0.2",
                                                                   "llmfleet_services": [GW, bad]}))
    inv = load_inventory(inv_dir)
    from llmfleet.inventory.ansible import settings_for

    got = st.expected_replicas(inv, inv.hosts["edge"], settings_for(inv.hosts["edge"]))
    assert got == {"gw": [st.Expected("m_tiny-qwen2", "gpu-a__chat", "gpu-a/chat", "tiny-qwen2"),
                          st.Expected("m_tiny-qwen2", "gpu-b__chat", "gpu-b/chat", "tiny-qwen2")],
                   "gw-bad": None}


# ---------------------------------------------------------------------------------------------
# the script itself, in a real sh, against a listener that answers like HAProxy's runtime API


def _one_shot(answer: bytes) -> int:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                buf += chunk
            if buf == b"show stat\n":
                conn.sendall(answer)
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_status_script_reads_the_runtime_api_and_says_when_nothing_listens(tmp_path):
    port, dead = _one_shot(RECORDED_STAT.encode() + b"\n"), _free_port()
    res = subprocess.run(["sh", "-c", st.status_script(str(tmp_path / "no-root"), (), [port, dead])],
                         capture_output=True, text=True, timeout=120)
    answers = st.parse_gateway_answers(res.stdout)
    servers = st.gateway_read(answers.get(0), port)
    assert isinstance(servers, list) and servers == _recorded_servers()
    assert st.gateway_read(answers.get(1), dead) == (f"nothing listens on 127.0.0.1:{dead} (HAProxy's runtime API): "
                                                     "is the gateway running?")
    assert not any("," in name or "llmfleet" in name for name in st.parse_card_names(res.stdout))


def test_the_gateways_answers_are_not_card_names():
    out = "@@end\n@@gpu\nTesla T4\n@@listen 22\n" + RECORDED
    assert st.parse_card_names(out) == ["Tesla T4"]


# ---------------------------------------------------------------------------------------------
# what `status` prints


def test_status_prints_a_row_per_replica_and_one_line_per_silent_gateway(capsys, monkeypatch):
    from llmfleet.cli import ops_tasks

    ops_tasks.console.file  # noqa: B018 - the console is made on first use
    monkeypatch.setattr(ops_tasks.console._console, "width", 250)  # one line per row, whatever the terminal
    rows, _ = st.gateway_rows(_status({"gw": _recorded_servers()}), _settings(GW), {"gw": None})
    problem = st.GatewayProblem("edge", "gw2", 19911, "HAProxy's runtime API on 127.0.0.1:19911 did not answer within 5 s")
    ops_tasks._print_gateways(rows, [problem])
    out = capsys.readouterr().out
    assert "Traceback" not in out
    lines = out.splitlines()
    down = next(ln for ln in lines if "gpu-v100-03__chat" in ln)
    for cell in ("edge/gw", "m_tiny-qwen2", "DOWN", "out: down by health checks", "Layer7 wrong status"):
        assert cell in down
    assert any("gpu-v100-02__chat" in ln and "DRAIN" in ln and "draining" in ln for ln in lines)
    assert [ln for ln in lines if "gw2" in ln] == [
        "gateway edge/gw2: HAProxy's runtime API on 127.0.0.1:19911 did not answer within 5 s"]
