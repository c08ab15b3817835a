"""Drain instead of drop (llmfleet.release.drain), no Docker, no SSH: a scripted gateway link answers the
runtime-API commands with ``show stat`` CSV in HAProxy 2.6's own layout (the recording in
tests/golden/gateway/show_stat_recorded.csv, its rows renamed); the clock and sleep are injected, so no
test waits."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from llmfleet.errors import LlmfleetError, RemoteError
from llmfleet.host.ssh import Result
from llmfleet.release import drain
from llmfleet.release import gateway_config as gc
from llmfleet.release.gateway_plan import fronting
from tests.test_gateway_plan import engine, fleet, gateway

RECORDED = (Path(__file__).parent / "golden" / "gateway" / "show_stat_recorded.csv").read_text(encoding="utf-8")
DRAIN = "set server m_chat/gpu-b__chat state drain"
READY = "set server m_chat/gpu-b__chat state ready"


def show_stat(scur: dict[tuple[str, str], int]) -> str:
    """The recorded ``show stat`` with one server row per (backend, server), its current sessions set."""
    lines = RECORDED.splitlines()
    header = lines[0]
    template = next(line for line in lines if line.startswith("m_tiny,h2__chat,")).split(",")
    rows = []
    for (backend, server), n in scur.items():
        row = list(template)
        row[0], row[1], row[4] = backend, server, str(n)
        rows.append(",".join(row))
    return "\n".join([header, *rows, next(line for line in lines if line.startswith("gateway,FRONTEND,"))]) + "\n\n"


class FakeGateway:
    """A gateway host's SSH link: each runtime-API script is recorded; ``show stat`` answers the next of
    ``sessions`` (the last one again once they run out); ``rc`` answers every command with that exit."""

    def __init__(self, sessions=(0,), rc=0, fail_on: str | None = None, server=("m_chat", "gpu-b__chat")):
        self.sessions = list(sessions)
        self.rc = rc
        self.fail_on = fail_on
        self.server = server
        self.scripts: list[str] = []
        self.sudo: list[bool] = []
        self.closed = False

    @property
    def commands(self) -> list[str]:
        return [shlex.split(s)[-1] for s in self.scripts]

    def run(self, script, *, sudo=False, timeout=None, **_):
        self.scripts.append(script)
        self.sudo.append(sudo)
        command = shlex.split(script)[-1]
        if self.rc:
            return Result(self.rc, "", "llmfleet: no HAProxy runtime API on 127.0.0.1:9901\n")
        if self.fail_on and command.startswith(self.fail_on):
            return Result(124, "", "")
        if command == "show stat":
            n = self.sessions.pop(0) if len(self.sessions) > 1 else self.sessions[0]
            return Result(0, show_stat({self.server: n}), "")
        return Result(0, "\n", "")

    def close(self):
        self.closed = True


class Clock:
    def __init__(self):
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def front(tmp_path, **settings):
    (f,) = fronting(fleet(tmp_path, gateway(**settings)), "gpu-b", "chat")
    return f


# ------------------------------------------------------------------------------------------------
# drain_one: one gateway


def test_show_stat_helper_is_read_back_by_the_parser():
    text = show_stat({("m_chat", "gpu-b__chat"): 3})
    assert gc.parse_show_stat(text) == {("m_chat", "gpu-b__chat"): gc.ServerState("UP", 3)}


def test_drain_then_wait_until_the_servers_sessions_reach_zero(tmp_path):
    link, clock = FakeGateway(sessions=[3, 2, 0]), Clock()
    d = drain.drain_one(link, front(tmp_path), clock=clock, sleep=clock.sleep)
    assert link.commands == [DRAIN, "show stat", "show stat", "show stat"]
    assert clock.slept == [drain.POLL_S, drain.POLL_S]
    assert (d.gateway, d.server, d.drained, d.in_flight_left, d.error) == ("edge/gw", "gpu-b__chat", True, 0, "")
    assert d.seconds == 2 * drain.POLL_S
    assert d.sentence() == f"drained at gateway edge/gw in {2 * drain.POLL_S:.1f}s"


def test_the_exact_scripts_sent_to_the_gateway_host(tmp_path):
    link = FakeGateway()
    drain.drain_one(link, front(tmp_path, admin_port=9950), clock=Clock(), sleep=Clock().sleep)
    assert link.scripts == [gc.admin_script(9950, DRAIN), gc.admin_script(9950, "show stat")]
    assert DRAIN in link.scripts[0] and "llmfleet-gateway-admin 9950" in link.scripts[0]
    assert link.sudo == [True, True]


@pytest.mark.parametrize("timeout_s", [0, 3, 7])
def test_the_wait_is_bounded_by_the_gateways_drain_timeout(tmp_path, timeout_s):
    link, clock = FakeGateway(sessions=[5]), Clock()
    d = drain.drain_one(link, front(tmp_path, drain_timeout_s=timeout_s), clock=clock, sleep=clock.sleep)
    assert sum(clock.slept) == timeout_s  # polls until the deadline, not a poll past it
    assert link.commands.count("show stat") == len(clock.slept) + 1
    assert d.drained and d.in_flight_left == 5 and d.seconds == timeout_s
    assert d.sentence() == (f"drained at gateway edge/gw in {timeout_s:.1f}s, "
                            "5 request(s) still in flight at the timeout")


def test_a_clock_that_never_moves_still_ends_after_max_polls(tmp_path, monkeypatch):
    monkeypatch.setattr(drain, "MAX_POLLS", 5)
    link = FakeGateway(sessions=[1])
    d = drain.drain_one(link, front(tmp_path), clock=lambda: 0.0, sleep=lambda s: None)
    assert link.commands.count("show stat") == 5 and d.in_flight_left == 1


def test_a_runtime_api_that_exits_non_zero_raises_naming_the_host_and_exit(tmp_path):
    with pytest.raises(LlmfleetError, match=r"runtime API on edge: exit 3: llmfleet: no HAProxy runtime API"):
        drain.drain_one(FakeGateway(rc=3), front(tmp_path), clock=Clock(), sleep=Clock().sleep)


# ------------------------------------------------------------------------------------------------
# Drainer.drained: every gateway in front of one service, around a block


class Connector:
    def __init__(self, links: dict[str, FakeGateway], refuse=()):
        self.links, self.refuse, self.asked = links, set(refuse), []

    def __call__(self, host):
        self.asked.append(host.name)
        if host.name in self.refuse:
            raise RemoteError(f"host {host.name}: cannot connect to 10.0.0.3:22 (timed out)")
        return self.links[host.name]


def two_gateways(tmp_path):
    second = {"ansible_host": "10.0.0.3", "llmfleet_services": [gateway(["gpu-b"], name="gw2")]}
    return fleet(tmp_path, edge2=second)


def drainer(inv, connect, host="gpu-b"):
    lines: list[str] = []
    return drain.Drainer(inv, host, connect, log=lines.append), lines


def test_drained_takes_the_replica_out_while_the_block_runs_and_puts_it_back_after(tmp_path):
    links = {"edge": FakeGateway(), "edge2": FakeGateway()}
    d, lines = drainer(two_gateways(tmp_path), Connector(links))
    with d.drained("chat") as done:
        assert [x.gateway for x in done] == ["edge/gw", "edge2/gw2"] and all(x.drained for x in done)
        for link in links.values():
            assert link.commands == [DRAIN, "show stat"]  # drained before the block
    for link in links.values():
        assert link.commands == [DRAIN, "show stat", READY]
    assert lines[0].startswith("chat: drained at gateway edge/gw in ")
    assert lines[-1] == ("chat: back in rotation at gateway edge2/gw2 "
                         "(its health checks let traffic in once it answers)")
    assert [x.gateway for x in d.done] == ["edge/gw", "edge2/gw2"]
    d.close()
    assert all(link.closed for link in links.values()) and d.links == {}


def test_drained_puts_the_replica_back_even_when_the_block_raises(tmp_path):
    link = FakeGateway()
    d, _ = drainer(fleet(tmp_path), Connector({"edge": link}))
    with pytest.raises(RuntimeError, match="switch failed"), d.drained("chat"):
        raise RuntimeError("switch failed")
    assert link.commands == [DRAIN, "show stat", READY]


def test_a_gateway_that_cannot_be_reached_is_logged_not_drained_and_does_not_stop_the_block(tmp_path):
    link = FakeGateway()
    connect = Connector({"edge": link}, refuse={"edge2"})
    d, lines = drainer(two_gateways(tmp_path), connect)
    ran = []
    with d.drained("chat") as done:
        ran.append(True)
    assert ran == [True]
    assert [(x.gateway, x.drained) for x in done] == [("edge/gw", True), ("edge2/gw2", False)]
    assert ("chat: not drained at gateway edge2/gw2: host edge2: cannot connect to 10.0.0.3:22 (timed out)"
            in lines)
    assert link.commands == [DRAIN, "show stat", READY]  # the one reached is put back; nothing sent to the other
    assert not any("edge2" in line and "back in rotation" in line for line in lines)


def test_a_runtime_api_that_exits_non_zero_is_logged_not_drained_and_does_not_stop_the_block(tmp_path):
    link = FakeGateway(rc=3)
    d, lines = drainer(fleet(tmp_path), Connector({"edge": link}))
    ran = []
    with d.drained("chat") as done:
        ran.append(True)
    assert ran == [True] and [x.drained for x in done] == [False]
    assert lines == ["chat: not drained at gateway edge/gw: runtime API on edge: exit 3: "
                     "llmfleet: no HAProxy runtime API on 127.0.0.1:9901"]
    assert link.commands == [DRAIN]  # never drained: no ready sent


def test_a_failed_ready_is_logged_with_the_command_to_put_it_back_by_hand(tmp_path):
    link = FakeGateway(fail_on="set server m_chat/gpu-b__chat state ready")
    d, lines = drainer(fleet(tmp_path), Connector({"edge": link}))
    with d.drained("chat"):
        pass
    assert lines[-1].startswith("chat: NOT put back in rotation at gateway edge: runtime API on edge: exit 124")
    assert lines[-1].endswith("by its runtime API: set server m_chat/gpu-b__chat state ready")


def test_one_link_per_gateway_host_reused_across_services(tmp_path):
    inv = fleet(tmp_path, **{"gpu-b": {"ansible_host": "10.0.0.12", "llmfleet_services": [
        engine(), engine("coder", 8081, served_name="coder")]}})
    link = FakeGateway()
    connect = Connector({"edge": link})
    d, _ = drainer(inv, connect)
    with d.drained("chat"):
        pass
    link.server = ("m_coder", "gpu-b__coder")
    with d.drained("coder"):
        pass
    assert connect.asked == ["edge"]
    assert link.commands == [DRAIN, "show stat", READY, "set server m_coder/gpu-b__coder state drain",
                             "show stat", "set server m_coder/gpu-b__coder state ready"]


def test_a_service_no_gateway_fronts_connects_to_nothing(tmp_path):
    connect = Connector({})
    d, lines = drainer(fleet(tmp_path), connect, host="gpu-a")
    with d.drained("node") as done:
        pass
    assert done == [] and connect.asked == [] and lines == []


def test_drain_alone_leaves_the_replica_out_and_ready_puts_it_back(tmp_path):
    """A stop or remove drains and leaves it so; a start puts it back after its health check."""
    link = FakeGateway()
    d, lines = drainer(fleet(tmp_path), Connector({"edge": link}))
    (done,) = d.drain("chat")
    assert done.drained and link.commands == [DRAIN, "show stat"]
    d.ready("chat")
    assert link.commands == [DRAIN, "show stat", READY]
    assert lines[-1] == "chat: back in rotation at gateway edge/gw"


# ------------------------------------------------------------------------------------------------
# What went wrong at a gateway


def test_a_replica_whose_wait_failed_after_the_drain_is_still_put_back(tmp_path):
    link = FakeGateway(fail_on="show stat")
    d, _ = drainer(fleet(tmp_path), Connector({"edge": link}))
    with d.drained("chat"):
        pass
    assert link.commands[-1] == READY


def test_a_server_the_gateway_does_not_know_is_not_reported_drained(tmp_path):
    class Unknown(FakeGateway):
        def run(self, script, **kw):
            res = super().run(script, **kw)
            return Result(0, "No such server.\n\n", "") if "set server" in script else res

    link = Unknown(server=("m_other", "x__y"))
    d = drain.drain_one(link, front(tmp_path), clock=Clock(), sleep=Clock().sleep)
    assert not d.drained


# ------------------------------------------------------------------------------------------------
# The engine's own requests in flight, after the gateways drained it


def test_settle_runs_once_after_the_drains_with_the_longest_drain_timeout(tmp_path):
    links = {"edge": FakeGateway(), "edge2": FakeGateway()}
    d, lines = drainer(two_gateways(tmp_path), Connector(links))
    asked: list[float] = []

    def settle(seconds: float) -> str:
        asked.append(seconds)
        assert all(link.commands == [DRAIN, "show stat"] for link in links.values())  # after every drain
        return "the engine's own metrics show nothing in flight (0.4s)"

    with d.drained("chat", settle=settle):
        pass
    assert asked == [120]
    assert "chat: the engine's own metrics show nothing in flight (0.4s)" in lines


def test_settle_is_not_run_when_no_gateway_took_the_drain(tmp_path):
    d, _ = drainer(two_gateways(tmp_path), Connector({}, refuse={"edge", "edge2"}))
    asked: list[float] = []
    with d.drained("chat", settle=asked.append):
        pass
    assert asked == []


def test_a_settle_that_fails_is_logged_and_the_replica_still_goes_back(tmp_path):
    link = FakeGateway()
    d, lines = drainer(fleet(tmp_path), Connector({"edge": link}))

    def settle(seconds: float) -> str:
        raise RemoteError("host gpu-b: connection lost")

    with d.drained("chat", settle=settle):
        pass
    assert link.commands[-1] == READY
    assert "chat: the engine's own requests in flight were not read: host gpu-b: connection lost" in lines


def test_a_stop_or_remove_drains_then_settles_and_leaves_the_replica_out(tmp_path):
    links = {"edge": FakeGateway(), "edge2": FakeGateway()}
    d, lines = drainer(two_gateways(tmp_path), Connector(links))
    asked: list[float] = []

    def settle(seconds: float) -> str:
        asked.append(seconds)
        return "the engine's own metrics show nothing in flight (0.1s)"

    d.drain("chat", settle=settle)
    assert asked == [120] and "chat: the engine's own metrics show nothing in flight (0.1s)" in lines
    assert all(link.commands == [DRAIN, "show stat"] for link in links.values())  # not put back
    d2, _ = drainer(two_gateways(tmp_path / "again"), Connector({}, refuse={"edge", "edge2"}))
    d2.drain("chat", settle=asked.append)
    assert asked == [120]  # no gateway took it: nothing to settle
