"""A service over several hosts rolls back as one: which set of releases the hosts go back to (pure,
``clusterset``), and the order the rollback takes across simulated hosts (locks sorted, every host
armed, workers first, the head's health and join check, every host confirmed; a failure puts every
host back on what it ran before). The lab runs it for real (tests/lab/test_multihost.py)."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from llmfleet.errors import UsageError
from llmfleet.health import check as health
from llmfleet.host.ssh import Result as SshResult
from llmfleet.inventory.ansible import load_inventory
from llmfleet.knowledge.release_state import Manifest, ReleaseInfo, ServiceState
from llmfleet.release import clusterset as CS
from llmfleet.release import multihost as M
from llmfleet.release import service_ops, store
from llmfleet.release.decide import Refusal
from llmfleet.release.deploy import DeployOptions
from llmfleet.release.executor import HostRun
from llmfleet.release.multihost import checks as MC
from llmfleet.release.multihost import run as MR

ADDR = {"head": "10.0.0.1", "w1": "10.0.0.2", "w2": "10.0.0.3"}
REF = "reg.lab:5000/llama@sha256:" + "ab" * 32
# release ids per host and version: the hosts' ids differ (each host renders its own release)
A = {"head": "20261201T100000Z-a000000000", "w1": "20261201T100001Z-a111111111", "w2": "20261201T100001Z-a222222222"}
B = {"head": "20261201T110000Z-b000000000", "w1": "20261201T110001Z-b111111111", "w2": "20261201T110002Z-b222222222"}
C_ = {"head": "20261201T120000Z-c000000000", "w1": B["w1"], "w2": B["w2"]}  # only the head changed


def cset(t: str, rel: dict[str, str], action: str = "deploy") -> CS.ClusterSet:
    return CS.ClusterSet(f"2026-12-01T{t}+00:00", action, "head", dict(sorted(rel.items())))


def cluster_inputs() -> dict:
    return {"cluster": {"kind": "rpc", "port": 50052, "head": {"host": "head", "address": ADDR["head"], "interface": None},
                        "workers": [{"host": w, "address": ADDR[w], "interface": None} for w in ("w2", "w1")]}}


def state(host: str, releases: list[str], current: str | None, unhealthy: set[str] = frozenset()) -> ServiceState:
    st = ServiceState(name="big", current=current, unit="active")
    for rid in releases:
        m = Manifest(release=rid, service="big", engine="llamacpp", image={"ref": REF, "digest": REF.split("@")[1]},
                     inputs=cluster_inputs() if host != "head" else {})
        st.releases[rid] = ReleaseInfo(rid, m, None if rid in unhealthy else {"result": "healthy"})
    return st


def states(current: dict[str, str], *versions: dict[str, str], unhealthy: set[str] = frozenset()) -> dict:
    return {h: state(h, sorted({v[h] for v in versions} | {current[h]}), current[h], unhealthy) for h in ADDR}


HOSTS = sorted(ADDR)


# ---------------------------------------------------------------------------------------------
# which set


@pytest.mark.parametrize(("name", "current", "history", "to", "want"), [
    ("the set before the current one", B, [cset("10:00", A), cset("11:00", B)], None, A),
    ("a head-only change goes back to the pair it had", C_, [cset("10:00", A), cset("11:00", B), cset("12:00", C_)],
     None, B),
    ("after a rollback, the next one goes further back", A,
     [cset("09:00", {**A, "head": "20261201T090000Z-0000000000"}), cset("10:00", A), cset("11:00", B),
      cset("11:30", A, "rollback")], None, {**A, "head": "20261201T090000Z-0000000000"}),
    ("nothing older: the newest other set", A, [cset("10:00", A), cset("11:00", B), cset("11:30", A, "rollback")],
     None, B),
    ("--to names any host's release", C_, [cset("10:00", A), cset("11:00", B), cset("12:00", C_)], A["w1"], A),
])
def test_shared_target(name, current, history, to, want):
    extra = [{**A, "head": "20261201T090000Z-0000000000"}]
    got = CS.shared_target("big", HOSTS, states(current, A, B, C_, *extra), history, to=to)
    assert got.releases == want, name


@pytest.mark.parametrize(("name", "history", "sts", "says"), [
    ("no history (deployed by an older llmfleet)", [], lambda: states(B, A),
     "no common previous release to roll back to (no deploy of it recorded in services/big/cluster.jsonl"),
    ("the previous set's worker release was pruned", [cset("10:00", A), cset("11:00", B)],
     lambda: {**states(B, A), "w1": state("w1", [B["w1"]], B["w1"])},
     f"release {A['w1']} is no longer on w1 (pruned?)"),
    ("the previous set was never healthy", [cset("10:00", A), cset("11:00", B)],
     lambda: states(B, A, unhealthy={A["w2"]}), f"release {A['w2']} on w2 was never marked healthy"),
    ("the previous set had other hosts", [cset("10:00", {"head": A["head"], "w1": A["w1"]}), cset("11:00", B)],
     lambda: states(B, A), "it was deployed over head, w1"),
])
def test_no_common_previous_release_is_one_clear_error(name, history, sts, says):
    with pytest.raises(Refusal) as exc:
        CS.shared_target("big", HOSTS, sts(), history)
    assert says in exc.value.reason, name
    assert exc.value.reason.startswith("service big over head, w1, w2: ")


def test_to_a_release_no_deploy_recorded():
    with pytest.raises(Refusal, match="no deploy of the service recorded release 20261201T130000Z-ffffffffff"):
        CS.shared_target("big", HOSTS, states(B, A), [cset("10:00", A), cset("11:00", B)],
                         to="20261201T130000Z-ffffffffff")


def test_history_lines_round_trip_through_the_host_scripts(tmp_path):
    paths = store.Paths(str(tmp_path), "big")
    Path(paths.service_dir).mkdir(parents=True)
    now = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    entries = [CS.record(now=now.replace(minute=i), action="deploy", head="head it's",
                         releases={"head": A["head"], "w1": A["w1"]}) for i in range(CS.KEEP + 3)]
    for entry in entries:
        subprocess.run(["sh", "-c", CS.append_script(paths, entry)], check=True, timeout=10)
    out = subprocess.run(["sh", "-c", CS.read_script(paths)], capture_output=True, text=True, check=True, timeout=10)
    got = CS.parse(out.stdout)
    assert got == entries[3:]  # the last KEEP lines; the quote in a value stays literal
    assert CS.parse("@@cluster-set {not json\n@@cluster-set {\"releases\": [1]}\n@@end\n") == []
    assert CS.merge([got[3:], got[:5]]) == got  # every host's lines, each once, oldest first


# ---------------------------------------------------------------------------------------------
# the rollback across simulated hosts


class Sim:
    def __init__(self, current: dict[str, str], history: list[CS.ClusterSet], *, bad: set[str] = frozenset()):
        self.current = dict(current)
        self.before = dict(current)
        self.history = history
        self.bad = bad  # hosts whose rollback target does not come up
        self.events: list[tuple] = []
        self.deferred: dict[str, list[str]] = {}

    def up(self, host: str) -> bool:
        return host not in self.bad or self.current[host] == self.before[host]


class Remote:
    round_trips = 0

    def close(self) -> None:
        pass


def fake_run_class(sim: Sim):
    class FakeRun(HostRun):
        def run(self, script, *, timeout=None, stdin=None, check=False):
            if "cluster.jsonl" in script and "tail" in script and "printf" not in script:
                lines = "".join(f"{CS.MARK} " + json.dumps(e.to_dict()) + "\n" for e in sim.history)
                return SshResult(0, lines + "@@end\n", "", script)
            if "docker image inspect" in script:
                return SshResult(0, "@@present\n", "", script)
            if "@@reach" in script:  # the head reaches every worker (targets in the script's order)
                sim.events.append(("reach", self.host))
                n = sum(f"/dev/tcp/{a}/" in script for h, a in ADDR.items() if h != "head")
                return SshResult(0, "".join(f"@@reach {i} ok\n" for i in range(n)), "", script)
            if script.startswith("echo \"@@unit"):
                up = sim.up(self.host)
                return SshResult(0, f"@@unit {'active' if up else 'failed'}\n@@port {'open' if up else 'closed'}\n",
                                 "", script)
            if "using device RPC" in script:
                return SshResult(0, "@@end\n", "", script)
            if "ss -Htn" in script:
                ok = sim.up("head") and sim.up(self.host)
                return SshResult(0, ("@@peer 10.0.0.1:41234\n" if ok else "") + "@@end\n", "", script)
            return SshResult(0, "", "", script)

        def read_state(self):
            return {"big": states(sim.current, A, B, C_)[self.host]}

        def lock(self, action, then=None, **kw):
            sim.events.append(("lock", self.host, action))
            return []

        def switch(self, paths, release_id):
            sim.events.append(("switch", self.host, release_id))
            sim.current[self.host] = release_id
            return SshResult(0, "@@switched\n", "", "switch")

        def arm(self, paths, service, release_id, previous, action, **k):
            sim.events.append(("arm", self.host, action))
            return "tok"

        def confirm(self, paths, service, token):
            sim.events.append(("confirm", self.host))
            return True

        def disarm(self, paths, token):
            sim.events.append(("disarm", self.host))

        def go_back(self, paths, service, api_key, previous, state):
            sim.events.append(("go_back", self.host, previous))
            sim.current[self.host] = previous
            return super().go_back(paths, service, api_key, previous, state)

        def finish(self, *, write_audit=True):
            sim.events.append(("finish", self.host, [a["action"] for a in self.audit]))
            sim.deferred[self.host] = list(self.deferred)
            self.audit, self.deferred = [], []

    return FakeRun


def head_health(sim: Sim):
    def check(run, target):
        ok = sim.up("head")
        return health.HealthReport(ok, [health.StageResult("completion", ok, 0.1, "ok" if ok else "503")])

    return check


@pytest.fixture
def inv(tmp_path: Path):
    svc = {"name": "big", "engine": "llamacpp", "model": "m", "model_path": "/srv/models/m.gguf",
           "image": "llamacpp:x", "workers": ["w2", "w1"], "health": {"stage_timeout_s": 1}}
    hosts = {h: {"ansible_host": "127.0.0.1", "llmfleet_cluster_address": a} for h, a in ADDR.items()}
    hosts["head"]["llmfleet_services"] = [svc]
    hosts["solo"] = {"ansible_host": "127.0.0.1"}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return load_inventory(str(tmp_path))


def rollback(inv, sim, monkeypatch, head="head", **kw) -> M.ServiceRun:
    monkeypatch.setattr(MR, "HostRun", fake_run_class(sim))
    monkeypatch.setattr(MC, "WORKER_POLL_S", 0.01)
    return M.rollback_service(inv, head, "big", options=DeployOptions(who="t"), log=lambda line: None,
                              head_health=head_health(sim), connector=lambda h, s, a: Remote(), **kw)


def kinds(sim, *names):
    return [e for e in sim.events if e[0] in names]


def test_rollback_puts_every_host_on_the_set_they_shared(inv, monkeypatch):
    sim = Sim(B, [cset("10:00", A), cset("11:00", B)])
    res = rollback(inv, sim, monkeypatch)
    assert res.result == "rolled_back", res.reason
    assert sim.current == A
    assert kinds(sim, "lock") == [("lock", "head", "rollback"), ("lock", "w1", "rollback"), ("lock", "w2", "rollback")]
    assert kinds(sim, "arm", "switch", "reach", "confirm") == [
        ("arm", "w2", "rollback"), ("arm", "w1", "rollback"), ("arm", "head", "rollback"),
        ("switch", "w2", A["w2"]), ("switch", "w1", A["w1"]), ("reach", "head"), ("switch", "head", A["head"]),
        ("confirm", "w2"), ("confirm", "w1"), ("confirm", "head")]
    # each host records the set it now runs with the others, and its audit line
    for h in ADDR:
        (line,) = [d for d in sim.deferred[h] if "cluster.jsonl" in d]
        assert f'"releases":{{"head":"{A["head"]}","w1":"{A["w1"]}","w2":"{A["w2"]}"}}' in line
        assert '"action":"rollback"' in line
    assert all(e[2] == ["rollback"] for e in kinds(sim, "finish"))
    assert [o.result for o in res.host_outcomes()] == ["rolled_back"] * 3


def test_a_head_only_rollback_restarts_the_head_and_leaves_the_workers(inv, monkeypatch):
    sim = Sim(C_, [cset("10:00", A), cset("11:00", B), cset("12:00", C_)])
    res = rollback(inv, sim, monkeypatch)
    assert res.result == "rolled_back", res.reason
    assert sim.current == B
    assert kinds(sim, "switch") == [("switch", "head", B["head"])]  # the workers already run B's releases


def test_a_failed_rollback_puts_every_host_back_on_what_it_ran_before(inv, monkeypatch):
    sim = Sim(B, [cset("10:00", A), cset("11:00", B)], bad={"head"})
    res = rollback(inv, sim, monkeypatch)
    assert res.result == "failed"
    assert res.reason.startswith("ROLLBACK FAILED: head: release") and "every host of the service went back" in res.reason
    assert kinds(sim, "go_back") == [("go_back", "w2", B["w2"]), ("go_back", "w1", B["w1"]),
                                     ("go_back", "head", B["head"])]
    assert sim.current == B and kinds(sim, "confirm") == []
    assert not any("cluster.jsonl" in d for d in sum(sim.deferred.values(), []))


def test_no_common_release_refuses_before_any_lock(inv, monkeypatch):
    sim = Sim(B, [])
    res = rollback(inv, sim, monkeypatch)
    assert res.result == "failed" and "no common previous release" in res.reason
    assert kinds(sim, "lock", "switch", "arm") == []
    assert [o.result for o in res.host_outcomes()] == ["failed"] * 3


def test_rollback_hosts_routes_a_worker_or_the_head_to_the_whole_service(inv, monkeypatch):
    calls = []
    monkeypatch.setattr(M, "rollback_service", lambda inv_, head, svc, **kw: calls.append((head, svc)) or
                        M.ServiceRun(svc, head, "rolled_back"))
    singles = []
    import llmfleet.release.deploy as D

    monkeypatch.setattr(D, "rollback_host", lambda inv_, n, **kw: singles.append(n))
    for selected in (["w1"], ["head"], ["head", "w2"]):
        calls.clear()
        service_ops.rollback_hosts(inv, selected, service=None, to=None, config={}, options=DeployOptions(),
                                   forks=1, log=lambda line: None)
        assert calls == [("head", "big")], selected
    assert singles == []  # no host here has a service of its own
    service_ops.rollback_hosts(inv, ["solo"], service=None, to=None, config={}, options=DeployOptions(), forks=1,
                               log=lambda line: None)
    assert singles == ["solo"]


def test_the_head_alone_is_not_rolled_back_by_the_single_host_path(inv):
    from llmfleet.release.deploy import rollback_host

    with pytest.raises(UsageError, match="service big spans hosts: roll back all of them together"):
        rollback_host(inv, "head", service="big", options=DeployOptions(), log=lambda line: None)
