"""The order a multi-host deploy takes across hosts, against simulated hosts: locks in sorted order,
workers before the head, the join check, and a failure anywhere putting every host back (workers
first). What the scripts do on a real host is the lab's part (tests/lab/test_multihost.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmfleet.health import check as health
from llmfleet.host.ssh import Result as SshResult
from llmfleet.images.lock import ImageRef
from llmfleet.inventory.ansible import load_inventory, settings_for
from llmfleet.knowledge import release_state
from llmfleet.release import cluster as C
from llmfleet.release import multihost as M
from llmfleet.release import pipeline as P
from llmfleet.release.deploy import DeployOptions, Prepared, PreparedHost
from llmfleet.release.executor import HostRun
from llmfleet.release.multihost import checks as MC
from llmfleet.release.multihost import run as MR
from tests.deploy_fixtures import manifest

IMAGE = ImageRef(key="llamacpp:x", repository="reg.lab:5000/llama", digest="sha256:" + "ab" * 32, tag="x",
                 pinned=True, upstream_repository="reg.lab:5000/llama")
OLD = "20261129T110000Z-0123456789"
ADDR = {"head": "10.0.0.1", "w1": "10.0.0.2", "w2": "10.0.0.3"}


class Sim:
    """What the simulated hosts hold, and everything done to them in order."""

    def __init__(self, *, existing: bool, bad: set[str] = frozenset(), head_unhealthy: bool = False,
                 unjoined: set[str] = frozenset(), blocked: set[str] = frozenset()) -> None:
        self.events: list[tuple] = []
        self.current = {h: (OLD if existing else None) for h in ADDR}
        self.existing = existing
        self.bad = bad  # hosts whose new release does not come up
        self.head_unhealthy = head_unhealthy
        self.unjoined = unjoined  # workers the head's log has no RPC device of
        self.armed: dict[str, dict] = {}  # host -> the arm's keyword arguments (timeout, restart_unswitched)
        self.too_late: set[str] = set()  # hosts whose timer reverted before the confirmation
        self.deferred: dict[str, list[str]] = {}  # host -> the scripts of its last round trip
        self.blocked = blocked  # workers whose rpc-server port the head cannot reach (refused)

    def up(self, host: str) -> bool:
        return self.current[host] is not None and (self.current[host] == OLD or host not in self.bad)


class Remote:
    def __init__(self, name: str) -> None:
        self.name = name
        self.round_trips = 0

    def close(self) -> None:
        pass


def fake_run_class(sim: Sim):
    def reach(host: str, sc: str) -> SshResult:
        sim.events.append(("reach", host))
        # targets in the script's order (the workers' order)
        order = sorted((sc.index(f"/dev/tcp/{ADDR[h]}/"), h) for h in ADDR if h != "head" and f"/dev/tcp/{ADDR[h]}/" in sc)
        lines = [f"@@reach {i} {'refused' if h in sim.blocked else 'ok'}" for i, (_, h) in enumerate(order)]
        return SshResult(3 if any(h in sim.blocked for _, h in order) else 0, "\n".join(lines) + "\n", "", sc)

    class FakeRun(HostRun):
        def run(self, script, *, timeout=None, stdin=None, check=False):
            if script.startswith("echo \"@@unit"):
                up = sim.up(self.host)
                return SshResult(0, f"@@unit {'active' if up else 'failed'}\n@@port {'open' if up else 'closed'}\n",
                                 "", script)
            if "using device RPC" in script:  # the head's log: newer builds print no device lines
                return SshResult(0, "@@end\n", "", script)
            if script == C.rpc_peers_script(50052):  # the worker sees the head's connection, once joined
                joined = self.host not in sim.unjoined and sim.up("head") and sim.up(self.host)
                return SshResult(0, ("@@peer 10.0.0.1:41234\n" if joined else "") + "@@end\n", "", script)
            if "@@reach" in script:
                return reach(self.host, script)
            if "@@uploaded" in script:
                sim.events.append(("upload", self.host))
                return SshResult(0, "@@uploaded\n", "", script)
            if "journalctl" in script:
                return SshResult(0, "error: the engine said no\n", "", script)
            return SshResult(0, "@@marked\n", "", script)

        def read_state(self):
            if not sim.existing:
                return {}
            st = release_state.ServiceState(name="big", current=OLD, unit="active")
            st.releases[OLD] = release_state.ReleaseInfo(OLD, manifest(OLD, "0" * 64), {"result": "healthy"})
            return {"big": st}

        def lock(self, action, then=None, **kw):
            sim.events.append(("lock", self.host))
            return [None for _ in then or []]

        def switch(self, paths, release_id):
            sim.events.append(("switch", self.host, "old" if release_id == OLD else "new"))
            sim.current[self.host] = release_id
            return SshResult(0, "@@switched\n", "", "switch")

        def arm(self, *a, **k):
            sim.events.append(("arm", self.host))
            sim.armed[self.host] = k
            return "tok"

        def confirm(self, paths, service, token):
            sim.events.append(("confirm", self.host))
            return self.host not in sim.too_late

        def disarm(self, paths, token):
            sim.events.append(("disarm", self.host))

        def go_back(self, paths, service, api_key, previous, state):
            sim.events.append(("go_back", self.host, "old" if previous == OLD else previous))
            return super().go_back(paths, service, api_key, previous, state)

        def finish(self, *, write_audit=True):
            sim.events.append(("finish", self.host, self.lock_token, len(self.audit)))
            sim.deferred[self.host] = list(self.deferred)
            self.audit, self.deferred = [], []

    return FakeRun


def head_health(sim: Sim):
    def check(run, target):
        ok = sim.up("head") and not (sim.head_unhealthy and sim.current["head"] != OLD)
        return health.HealthReport(ok, [health.StageResult("completion", ok, 0.1, "ok" if ok else "503")],
                                   decode_tokps=10.0 if ok else None)

    return check


@pytest.fixture
def prepared(tmp_path: Path) -> M.PreparedService:
    return make_prepared(tmp_path)


def make_prepared(tmp_path: Path, **hostvars: object) -> M.PreparedService:
    svc = {"name": "big", "engine": "llamacpp", "model": "m", "model_path": "/srv/models/m.gguf",
           "image": "llamacpp:x", "workers": ["w2", "w1"], "health": {"stage_timeout_s": 1}}
    hosts = {h: {"ansible_host": "127.0.0.1", "llmfleet_cluster_address": a, **hostvars} for h, a in ADDR.items()}
    hosts["head"]["llmfleet_services"] = [svc]
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    inv = load_inventory(str(tmp_path))
    hs = settings_for(inv.hosts["head"])
    ready = PreparedHost(inv, inv.hosts["head"], hs, (Prepared(hs.services[0], None, IMAGE),))
    workers = tuple(M.WorkerPrep(inv.hosts[w], settings_for(inv.hosts[w]), IMAGE) for w in ("w2", "w1"))
    return M.PreparedService(inv, ready, workers)


def deploy(prepared, sim, monkeypatch, **opts) -> M.ServiceRun:
    monkeypatch.setattr(MR, "HostRun", fake_run_class(sim))
    monkeypatch.setattr(MR, "_cluster_preflight", lambda ready, hosts, run, cluster: [None])
    monkeypatch.setattr(P, "judge_pull", lambda run, it, res: sim.events.append(("pull", run.host)))
    monkeypatch.setattr(MC, "WORKER_POLL_S", 0.01)
    return M.deploy_service(prepared.inventory, "head", "big", prepared=prepared,
                            options=DeployOptions(who="t", **opts), log=lambda line: None,
                            head_health=head_health(sim), connector=lambda h, s, a: Remote(h.name))


def kinds(sim: Sim, *names: str) -> list[tuple]:
    return [e for e in sim.events if e[0] in names]


def test_first_deploy_locks_sorted_switches_workers_first_and_checks_the_join(prepared, monkeypatch):
    sim = Sim(existing=False)
    res = deploy(prepared, sim, monkeypatch)
    assert res.result == "deployed", res.reason
    assert kinds(sim, "lock") == [("lock", "head"), ("lock", "w1"), ("lock", "w2")]
    # every host armed before the first switch (workers in the inventory's order, w2, w1: the --rpc order,
    # then the head); switched in that order; confirmed in the order their timers fire, the head last
    assert kinds(sim, "switch", "arm", "confirm") == [
        ("arm", "w2"), ("arm", "w1"), ("arm", "head"),
        ("switch", "w2", "new"), ("switch", "w1", "new"), ("switch", "head", "new"),
        ("confirm", "w2"), ("confirm", "w1"), ("confirm", "head")]
    assert res.joined["missing"] == [] and res.joined["rpc_peers"] == {"w1": ["10.0.0.1"], "w2": ["10.0.0.1"]}
    assert [e[1] for e in kinds(sim, "finish")] == ["head", "w1", "w2"]
    assert all(o.result == "deployed" for o in res.hosts.values())
    assert {o.host for o in res.host_outcomes()} == {"head", "w1", "w2"}
    # every host records the releases the hosts now run together (what a rollback goes back to)
    lines = {h: [d for d in sim.deferred[h] if "cluster.jsonl" in d] for h in ADDR}
    assert all(len(v) == 1 for v in lines.values()) and len({v[0] for v in lines.values()}) == 1
    assert all(res.hosts[h].releases["big"] in lines["head"][0] for h in ADDR)


def test_check_takes_no_lock_and_switches_nothing(prepared, monkeypatch):
    sim = Sim(existing=True)
    res = deploy(prepared, sim, monkeypatch, check=True)
    assert res.result == "check" and kinds(sim, "lock", "switch", "upload") == []
    assert res.reason == "3 of 3 host(s) would change"


@pytest.mark.parametrize("sim_kw,failing", [
    ({"head_unhealthy": True}, "release"),
    ({"unjoined": {"w1"}}, "not every worker joined: missing RPC devices of w1"),
])
def test_a_head_failure_puts_every_host_back_workers_first(prepared, monkeypatch, sim_kw, failing):
    sim = Sim(existing=True, **sim_kw)
    res = deploy(prepared, sim, monkeypatch)
    assert res.result == "rolled_back", res.reason
    assert failing in res.reason
    # each host's timer stopped just before it goes back, workers first
    assert kinds(sim, "go_back", "disarm") == [("disarm", "w2"), ("go_back", "w2", "old"), ("disarm", "w1"),
                                               ("go_back", "w1", "old"), ("disarm", "head"), ("go_back", "head", "old")]
    assert kinds(sim, "confirm") == []
    assert all(sim.current[h] == OLD for h in ADDR)
    assert all(o.result == "rolled_back" for o in res.hosts.values())


def test_a_worker_that_does_not_come_up_stops_before_the_head_is_touched(prepared, monkeypatch):
    sim = Sim(existing=True, bad={"w1"})
    res = deploy(prepared, sim, monkeypatch)
    assert res.result == "rolled_back", res.reason
    assert "w1: worker release" in res.reason and "closed" in res.reason
    assert ("switch", "head", "new") not in sim.events
    # the workers back first; the head, never switched, restarted on its own release (its RPC
    # connections ended with the workers' old containers), its timer stopped first
    assert kinds(sim, "go_back") == [("go_back", "w2", "old"), ("go_back", "w1", "old"), ("go_back", "head", "old")]
    assert ("disarm", "head") in sim.events
    assert res.hosts["head"].result == "rolled_back"  # its service as a whole went back
    assert all(sim.current[h] == OLD for h in ADDR)


def test_a_failed_first_deploy_stops_every_host(prepared, monkeypatch):
    sim = Sim(existing=False, head_unhealthy=True)
    sim.bad = {"head"}
    res = deploy(prepared, sim, monkeypatch)
    assert res.result == "failed"
    assert "no release confirmed healthy to go back to" in res.reason and res.reason.count("the service was stopped") == 3


def test_worker_addresses_are_read_from_the_interface_and_checked(prepared, monkeypatch):
    data = yaml.safe_load((Path(prepared.inventory.path) / "hosts.yml").read_text())
    data["all"]["hosts"]["w1"] = {"ansible_host": "127.0.0.1", "llmfleet_cluster_interface": "eth0"}
    (Path(prepared.inventory.path) / "hosts.yml").write_text(yaml.safe_dump(data))
    inv = load_inventory(prepared.inventory.path)
    workers = tuple(M.WorkerPrep(inv.hosts[w], settings_for(inv.hosts[w]), IMAGE) for w in ("w2", "w1"))
    ready = M.PreparedService(inv, prepared.head, workers)
    sim = Sim(existing=False)
    cls = fake_run_class(sim)

    class Addr(cls):
        def run(self, script, **kw):
            if script == C.address_script("eth0"):
                return SshResult(0, "@@addr 8.8.8.8\n", "", script)
            return super().run(script, **kw)

    monkeypatch.setattr(MR, "HostRun", Addr)
    res = M.deploy_service(inv, "head", "big", prepared=ready, options=DeployOptions(who="t"), log=lambda line: None,
                           head_health=head_health(sim), connector=lambda h, s, a: Remote(h.name))
    assert res.result == "refused"
    assert "w1: the address of llmfleet_cluster_interface eth0: 8.8.8.8 is not a private address" in res.reason
    assert kinds(sim, "lock", "switch") == []


def test_ctrl_c_during_the_head_check_puts_every_host_back_and_releases_every_lock(prepared, monkeypatch):
    sim = Sim(existing=True)

    def interrupted(run, target):
        if sim.current["head"] != OLD:
            raise KeyboardInterrupt
        return health.HealthReport(True, [health.StageResult("completion", True, 0.1, "ok")])

    monkeypatch.setattr(MR, "HostRun", fake_run_class(sim))
    monkeypatch.setattr(MR, "_cluster_preflight", lambda ready, hosts, run, cluster: [None])
    monkeypatch.setattr(P, "judge_pull", lambda run, it, res: None)
    with pytest.raises(KeyboardInterrupt):
        M.deploy_service(prepared.inventory, "head", "big", prepared=prepared, options=DeployOptions(who="t"),
                         log=lambda line: None, head_health=interrupted, connector=lambda h, s, a: Remote(h.name))
    assert kinds(sim, "go_back") == [("go_back", "w2", "old"), ("go_back", "w1", "old"), ("go_back", "head", "old")]
    assert [e[1] for e in kinds(sim, "finish")] == ["head", "w1", "w2"]
    assert all(sim.current[h] == OLD for h in ADDR)


def test_the_head_timer_fires_after_every_worker_timer_and_restarts_an_unswitched_head(prepared, monkeypatch):
    sim = Sim(existing=True)
    res = deploy(prepared, sim, monkeypatch)
    assert res.result == "deployed", res.reason
    head, w1, w2 = sim.armed["head"], sim.armed["w1"], sim.armed["w2"]
    assert head["restart_unswitched"] is True and not w1["restart_unswitched"] and not w2["restart_unswitched"]
    assert w1["timeout"] == w2["timeout"] and head["timeout"] >= w1["timeout"] + 60


def test_a_worker_reverted_by_its_timer_before_the_confirmation_puts_every_host_back(prepared, monkeypatch):
    sim = Sim(existing=True)
    sim.too_late = {"w1"}
    res = deploy(prepared, sim, monkeypatch)
    assert res.result == "rolled_back", res.reason
    assert "w1: healthy, but the host timer reverted it first" in res.reason
    assert kinds(sim, "confirm") == [("confirm", "w2"), ("confirm", "w1")]  # the head is never confirmed
    assert kinds(sim, "go_back") == [("go_back", "w2", "old"), ("go_back", "w1", "old"), ("go_back", "head", "old")]
    assert all(sim.current[h] == OLD for h in ADDR)


def test_a_head_that_cannot_reach_a_worker_stops_before_it_switches(prepared, monkeypatch):
    sim = Sim(existing=True, blocked={"w1"})
    res = deploy(prepared, sim, monkeypatch)
    assert res.result == "rolled_back", res.reason
    assert res.reason.startswith("head head cannot reach worker w1 at 10.0.0.2:50052 (refused): open TCP port 50052 "
                                 "on w1 to 10.0.0.1 (firewall), or set w1's llmfleet_cluster_address")
    # both workers switched and came up; the head checked them (one round trip of its own) and stopped
    # there: armed with the others, never switched to the new release; its timer stopped before it went back
    assert kinds(sim, "switch", "reach") == [("switch", "w2", "new"), ("switch", "w1", "new"), ("reach", "head"),
                                             ("switch", "w2", "old"), ("switch", "w1", "old"), ("switch", "head", "old")]
    assert ("disarm", "head") in sim.events and kinds(sim, "upload")[-1] == ("upload", "head")
    assert kinds(sim, "go_back") == [("go_back", "w2", "old"), ("go_back", "w1", "old"), ("go_back", "head", "old")]
    assert all(sim.current[h] == OLD for h in ADDR)
    assert [e[1] for e in kinds(sim, "finish")] == ["head", "w1", "w2"]  # every lock released




def test_the_prune_after_a_deploy_keeps_an_image_another_service_on_the_host_still_uses(tmp_path, monkeypatch):
    """The host also runs service "chat" on image X; "big"'s oldest release, pruned by this deploy, used
    X too. The prune decides over every service on the host: X stays (it removed X before)."""
    older = "20261128T110000Z-0123456789"
    shared = "reg.lab:5000/llama@sha256:" + "cd" * 32
    sim = Sim(existing=True)
    base = fake_run_class(sim)

    class Run(base):  # type: ignore[misc,valid-type]
        def read_state(self):
            st = release_state.ServiceState(name="big", current=OLD, unit="active")
            st.releases[older] = release_state.ReleaseInfo(older, manifest(older, "1" * 64, ref=shared),
                                                           {"result": "healthy"})
            st.releases[OLD] = release_state.ReleaseInfo(OLD, manifest(OLD, "0" * 64), {"result": "healthy"})
            chat = release_state.ServiceState(name="chat", current=older, unit="active")
            chat.releases[older] = release_state.ReleaseInfo(older, manifest(older, "2" * 64, ref=shared),
                                                             {"result": "healthy"})
            return {"big": st, "chat": chat}

    monkeypatch.setattr(MR, "HostRun", Run)
    prepared = make_prepared(tmp_path, llmfleet_keep_releases=1)
    monkeypatch.setattr(MR, "_cluster_preflight", lambda ready, hosts, run, cluster: [None])
    monkeypatch.setattr(P, "judge_pull", lambda run, it, res: sim.events.append(("pull", run.host)))
    monkeypatch.setattr(MC, "WORKER_POLL_S", 0.01)
    res = M.deploy_service(prepared.inventory, "head", "big", prepared=prepared, options=DeployOptions(who="t"),
                           log=lambda line: None, head_health=head_health(sim),
                           connector=lambda h, s, a: Remote(h.name))
    assert res.result == "deployed", res.reason
    last = "\n".join(sim.deferred["head"])
    assert older in last  # big's oldest release is pruned ...
    assert shared not in last  # ... but not the image chat's current release runs
