"""Rolling upgrades: batches, canary, abort on max_fail_percentage, rollback on abort, forks, pause.

The orchestration takes the per-host deploy as a function; these tests give it fakes that succeed,
fail or raise on chosen hosts, and record when each ran. The real deploy is exercised in
tests/lab/test_upgrade.py.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from llmfleet.errors import UsageError
from llmfleet.fleet.upgrade import HostChange, host_overrides, parse_image, parse_sets, run_upgrade
from llmfleet.inventory.services import Service


@dataclass
class Outcome:
    host: str
    result: str
    releases: dict = field(default_factory=dict)
    duration_s: float = 0.01
    reason: str = ""
    changes: object = None


class FakeFleet:
    """deploy/rollback fakes: ``fail`` hosts roll back, ``refuse`` hosts are refused, ``boom`` raise."""

    def __init__(self, fail=(), refuse=(), boom=(), delay=0.0, rollback_fails=()):
        self.fail, self.refuse, self.boom = set(fail), set(refuse), set(boom)
        self.rollback_fails = set(rollback_fails)
        self.delay = delay
        self.calls: list[str] = []
        self.rollbacks: list[str] = []
        self.lock = threading.Lock()
        self.running = 0
        self.max_running = 0

    def deploy(self, host: str) -> Outcome:
        with self.lock:
            self.calls.append(host)
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            if self.delay:
                time.sleep(self.delay)
            if host in self.boom:
                raise RuntimeError("unexpected")
            if host in self.fail:
                return Outcome(host, "rolled_back", {"svc": "OLD"}, reason="health: stage completion failed")
            if host in self.refuse:
                return Outcome(host, "refused", reason="preflight: driver too old")
            return Outcome(host, "deployed", {"svc": "NEW"})
        finally:
            with self.lock:
                self.running -= 1

    def rollback(self, host: str) -> Outcome:
        with self.lock:
            self.rollbacks.append(host)
        if host in self.rollback_fails:
            return Outcome(host, "failed", reason="previous release is gone")
        return Outcome(host, "rolled_back", {"svc": "OLD"})


HOSTS = [f"h{i}" for i in range(1, 9)]


def results(report):
    return {h.host: h.result for h in report.hosts}


@pytest.mark.parametrize(
    ("serial", "mfp", "fail", "expect_batches", "expect_called", "aborted"),
    [
        # canary, then quarter fleet, then the rest; all succeed
        ([1, "25%", "100%"], None, [], [["h1"], ["h2", "h3"], ["h4", "h5", "h6", "h7", "h8"]], HOSTS, False),
        # the canary fails: nothing else is touched (without a percentage, a whole failed batch aborts)
        ([1, "25%", "100%"], None, ["h1"], None, ["h1"], True),
        # the canary fails with max_fail_percentage 100: 100% is not *more* than 100, so it goes on
        ([1, "25%", "100%"], 100, ["h1"], None, HOSTS, False),
        # one of two fails in batch 2 with 49%: 50% > 49% aborts; batch 3 never starts
        ([1, "25%", "100%"], 49, ["h3"], None, ["h1", "h2", "h3"], True),
        # exactly at the threshold is not over it (Ansible: must be exceeded)
        ([1, "25%", "100%"], 50, ["h3"], None, HOSTS, False),
        # without a percentage, one failure in a batch of two does not abort
        ([1, "25%", "100%"], None, ["h3"], None, HOSTS, False),
        # max_fail_percentage 0: any failure aborts
        ([2], 0, ["h4"], None, ["h1", "h2", "h3", "h4"], True),
        # no serial: one batch of everything, which runs whole even when hosts fail
        ([], 0, ["h2"], [HOSTS], HOSTS, True),
    ],
)
def test_batches_and_abort(serial, mfp, fail, expect_batches, expect_called, aborted):
    fleet = FakeFleet(fail=fail)
    report = run_upgrade(HOSTS, deploy=fleet.deploy, serial=serial, max_fail_percentage=mfp, forks=1)
    if expect_batches is not None:
        assert report.batches == expect_batches
    assert fleet.calls == expect_called
    assert report.aborted is aborted
    assert report.ok is (not aborted and not fail)
    res = results(report)
    for h in HOSTS:
        if h not in expect_called:
            assert res[h] == "skipped"
            assert "aborted" in next(x.reason for x in report.hosts if x.host == h)
        elif h in fail:
            assert res[h] == "rolled_back"
        else:
            assert res[h] == "deployed"


def test_abort_reason_names_the_batch_and_the_share():
    fleet = FakeFleet(fail=["h2", "h3"])
    report = run_upgrade(HOSTS, deploy=fleet.deploy, serial=[1, 2, "100%"], max_fail_percentage=25)
    assert report.aborted
    assert report.abort_reason.startswith("batch 2: 2 of 2 host(s) failed (100%, over --max-fail-percentage 25)")


def test_refused_and_raising_hosts_count_as_failed():
    fleet = FakeFleet(refuse=["h1"], boom=["h2"])
    report = run_upgrade(["h1", "h2", "h3", "h4"], deploy=fleet.deploy, serial=[4], max_fail_percentage=40)
    res = {h.host: h for h in report.hosts}
    assert res["h1"].result == "refused" and "driver" in res["h1"].reason
    assert res["h2"].result == "error" and res["h2"].reason == "RuntimeError: unexpected"
    assert res["h3"].result == res["h4"].result == "deployed"
    assert report.aborted  # 2 of 4 = 50% > 40%


def test_ctrl_c_stops_after_the_running_deploys_and_still_reports():
    def deploy(host):
        if host == "h3":
            raise KeyboardInterrupt
        return Outcome(host, "deployed")

    report = run_upgrade(HOSTS, deploy=deploy, serial=[1, 2, "100%"], forks=1)
    res = results(report)
    assert report.aborted and report.abort_reason.startswith("interrupted during batch 2")
    assert (res["h1"], res["h2"], res["h3"], res["h4"]) == ("deployed", "deployed", "interrupted", "skipped")


def test_finished_hosts_stay_upgraded_on_abort_without_rollback_flag():
    fleet = FakeFleet(fail=["h4", "h5"])
    report = run_upgrade(HOSTS, deploy=fleet.deploy, serial=[1, 2, 3], max_fail_percentage=10)
    assert report.aborted
    res = results(report)
    assert [res[h] for h in ("h1", "h2", "h3")] == ["deployed"] * 3
    assert fleet.rollbacks == []


def test_rollback_on_abort_rolls_back_every_upgraded_host():
    fleet = FakeFleet(fail=["h4"], rollback_fails=["h2"])
    report = run_upgrade(HOSTS, deploy=fleet.deploy, serial=[1, 2, 3], max_fail_percentage=10,
                         rollback_on_abort=True, rollback=fleet.rollback, forks=1)
    assert report.aborted
    # h1..h3 upgraded, then batch 3 (h4 fails, h5 and h6 succeed) aborts: all five upgraded go back
    assert sorted(fleet.rollbacks) == ["h1", "h2", "h3", "h5", "h6"]
    res = {h.host: h for h in report.hosts}
    assert res["h1"].result == "rolled_back" and res["h1"].rollback == "rolled_back"
    assert res["h1"].releases == {"svc": "OLD"}
    assert res["h2"].result == "deployed" and "rollback on abort failed" in res["h2"].reason
    assert res["h4"].result == "rolled_back" and res["h4"].rollback is None  # its own deploy rolled it back
    assert res["h7"].result == res["h8"].result == "skipped"


def test_no_rollback_when_the_rollout_completes():
    fleet = FakeFleet(fail=["h3"])
    report = run_upgrade(HOSTS, deploy=fleet.deploy, serial=[4], max_fail_percentage=30,
                         rollback_on_abort=True, rollback=fleet.rollback)
    assert not report.aborted and not report.ok  # 25% failed in batch 1: under the threshold
    assert fleet.rollbacks == []


@pytest.mark.parametrize(("forks", "expected_max"), [(1, 1), (3, 3), (12, 6)])
def test_forks_bound_the_hosts_deploying_at_once(forks, expected_max):
    fleet = FakeFleet(delay=0.05)
    run_upgrade(HOSTS[:6], deploy=fleet.deploy, serial=[6], forks=forks)
    assert fleet.max_running == expected_max


def test_a_batch_starts_only_after_the_previous_one_finished():
    events: list[tuple[str, str]] = []
    lock = threading.Lock()

    def deploy(host):
        with lock:
            events.append(("start", host))
        time.sleep(0.02 if host != "h2" else 0.1)
        with lock:
            events.append(("end", host))
        return Outcome(host, "deployed")

    run_upgrade(HOSTS[:5], deploy=deploy, serial=[1, 2, 2], forks=5)
    order = [e for e in events]
    assert order.index(("end", "h1")) < order.index(("start", "h2"))
    assert order.index(("end", "h2")) < order.index(("start", "h4"))  # h2 is the slow one in batch 2
    assert order.index(("end", "h3")) < order.index(("start", "h4"))


def test_pause_between_batches_but_not_after_the_last_or_an_abort():
    slept: list[float] = []
    fleet = FakeFleet()
    run_upgrade(HOSTS[:4], deploy=fleet.deploy, serial=[1, 1, 2], pause=7, sleep=slept.append)
    assert slept == [7, 7]
    slept.clear()
    fleet = FakeFleet(fail=["h2"])
    run_upgrade(HOSTS[:4], deploy=fleet.deploy, serial=[1, 1, 2], pause=7, sleep=slept.append)
    assert slept == [7]  # after batch 1 only; batch 2 aborted


def test_check_mode_asks_every_host_and_never_aborts():
    fleet = FakeFleet(refuse=["h1"])
    report = run_upgrade(HOSTS[:4], deploy=fleet.deploy, serial=[1, "100%"], check=True)
    assert fleet.calls == ["h1", "h2", "h3", "h4"]
    assert not report.aborted
    assert report.check and report.to_dict()["check"] is True


def test_progress_lines_name_batches_hosts_and_the_abort():
    lines: list[str] = []
    fleet = FakeFleet(fail=["h1"])
    run_upgrade(HOSTS[:3], deploy=fleet.deploy, serial=[1, "100%"], log=lines.append)
    assert lines[0] == "batch 1/2 canary (1 host): h1"
    assert lines[1].startswith("h1: rolled_back svc=OLD in ") and "(health: stage completion failed)" in lines[1]
    assert lines[2].startswith("ABORT: batch 1: 1 of 1 host(s) failed")


def test_report_json_shape():
    fleet = FakeFleet(fail=["h2"])
    d = run_upgrade(HOSTS[:3], deploy=fleet.deploy, serial=[1, 2], max_fail_percentage=0).to_dict()
    assert d["ok"] is False and d["aborted"] is True
    assert d["batches"] == [["h1"], ["h2", "h3"]]
    assert d["counts"] == {"deployed": 2, "rolled_back": 1}
    assert {h["host"]: h["result"] for h in d["hosts"]} == {"h1": "deployed", "h2": "rolled_back", "h3": "deployed"}
    assert set(d["hosts"][0]) >= {"host", "batch", "result", "releases", "duration_s", "reason"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"forks": 0}, "--forks 0"),
        ({"max_fail_percentage": 120}, "between 0 and 100"),
        ({"pause": -1}, "must not be negative"),
        ({"rollback_on_abort": True}, "needs a rollback function"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        run_upgrade(["h1"], deploy=FakeFleet().deploy, **kwargs)


# ---------------------------------------------------------------------------------------------
# overrides


def svc(name, engine, port=8000):
    return Service(name=name, engine=engine, model="m", model_path="/srv/models/m", image=f"{engine}:old", port=port)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["llamacpp=b6123"], {"llamacpp": "llamacpp:b6123"}),
        (["vllm=0.9.2", "llamacpp=lab-cpu"], {"vllm": "vllm:0.9.2", "llamacpp": "llamacpp:lab-cpu"}),
        (["llamacpp=llamacpp-cuda12:b6123"], {"llamacpp": "llamacpp-cuda12:b6123"}),
        ([], {}),
    ],
)
def test_parse_image(values, expected):
    assert parse_image(values) == expected


@pytest.mark.parametrize(
    ("values", "message"),
    [(["llamacpp"], "expected ENGINE=VERSION"), (["tgi=1"], "must be vllm or llamacpp"),
     (["vllm=1", "vllm=2"], "given twice"), (["vllm="], "expected ENGINE=VERSION")],
)
def test_parse_image_errors(values, message):
    with pytest.raises(UsageError, match=message):
        parse_image(values)


def test_parse_sets_types_values_and_refuses_unknown_keys_and_secrets():
    assert parse_sets(["context=8192", "offload=false", "engine_args=[--enforce-eager]", "kv_dtype=q8_0"]) == {
        "context": 8192, "offload": False, "engine_args": ["--enforce-eager"], "kv_dtype": "q8_0"}
    with pytest.raises(UsageError, match="--set contxt: not a service setting"):
        parse_sets(["contxt=1"])
    with pytest.raises(UsageError, match="secrets are not set on the command line"):
        parse_sets(["api_key=sk-123"])
    with pytest.raises(UsageError, match="expected key=value"):
        parse_sets(["context"])


@pytest.mark.parametrize(
    ("services", "images", "sets", "expected"),
    [
        ([svc("a", "llamacpp")], {"llamacpp": "llamacpp:new"}, {}, HostChange({"image": "llamacpp:new"})),
        ([svc("a", "llamacpp"), svc("b", "llamacpp", 8001)], {"llamacpp": "llamacpp:new"}, {"context": 4096},
         HostChange({"image": "llamacpp:new", "context": 4096})),
        ([svc("a", "vllm")], {"llamacpp": "llamacpp:new"}, {}, "runs no llamacpp service"),
        # a host running both engines: only the upgraded engine's services are deployed
        ([svc("a", "vllm"), svc("b", "llamacpp", 8001)], {"llamacpp": "llamacpp:new"}, {},
         HostChange({"image": "llamacpp:new"}, ["b"])),
        ([svc("a", "vllm"), svc("b", "llamacpp", 8001)], {"llamacpp": "llamacpp:new", "vllm": "vllm:new"}, {},
         "runs both llamacpp and vllm"),
        ([], {"llamacpp": "llamacpp:new"}, {}, "no services in the inventory"),
        ([svc("a", "vllm")], {}, {"context": 2048}, HostChange({"context": 2048})),
        ([svc("a", "vllm")], {}, {}, HostChange({})),  # a plain rolling redeploy (e.g. after rotating an API key)
    ],
)
def test_host_overrides(services, images, sets, expected):
    got = host_overrides(services, images, sets)
    if isinstance(expected, str):
        assert isinstance(got, str) and got.startswith(expected)
    else:
        assert got == expected


# ---------------------------------------------------------------------------------------------
# the task: usage errors stop before any host is contacted


def _fleet_inventory(tmp_path):
    import socket

    import yaml

    def closed_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    digest = "sha256:" + "0" * 64
    lock = tmp_path / "images.lock"
    lock.write_text(yaml.safe_dump({"images": {"llamacpp:old": {"repository": "reg.example/llamacpp", "tag": "old",
                                                                "digest": digest}}}))
    svc = {"name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/srv/models/m.gguf",
           "image": "llamacpp:old", "port": 8000}
    inv = tmp_path / "inv"
    inv.mkdir()
    hosts = {f"n{i}": {"ansible_host": "127.0.0.1", "ansible_port": closed_port()} for i in (1, 2)}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"fleet": {"hosts": hosts, "vars": {
        "llmfleet_services": [svc], "llmfleet_images_lock": str(lock)}}}))
    return inv


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "choose the hosts with --group"),
        (["--group", "fleet", "--image", "llamacpp=new"], "image 'llamacpp:new' is not in"),
        (["--group", "fleet", "--image", "vllm=new"], "no selected host runs the engine to upgrade"),
        (["--group", "fleet", "--set", "contxt=1"], "--set contxt: not a service setting"),
        (["--group", "fleet", "--set", "port=99999"], "do not fit the service schema"),
        (["--group", "fleet", "--serial", "0"], "--serial"),
        (["--group", "fleet", "--max-fail-percentage", "-5"], "--max-fail-percentage"),
        (["--group", "nope"], "matches no host"),
    ],
)
def test_upgrade_task_usage_errors_exit_2_before_contacting_hosts(tmp_path, args, message):
    import subprocess
    import sys
    from pathlib import Path

    inv = _fleet_inventory(tmp_path)
    res = subprocess.run([sys.executable, "-m", "invoke", "upgrade", "-i", str(inv), *args],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in res.stderr
    assert "cannot connect" not in res.stderr  # nothing was contacted
    assert "Traceback" not in res.stderr


def test_json_lines_prints_one_line_per_host_as_it_ends_then_the_summary(tmp_path):
    """`upgrade --json-lines` on two hosts nothing listens for: one JSON line per host on stdout (each
    parseable alone, as a stream reader takes it), then the summary line; a progress line per batch on
    stderr instead of every host's steps; exit 1 (failed hosts)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    inv = _fleet_inventory(tmp_path)
    res = subprocess.run([sys.executable, "-m", "invoke", "upgrade", "-i", str(inv), "--group", "fleet",
                          "--set", "context=4096", "--forks", "2", "--json-lines"],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert res.returncode == 1, (res.stdout, res.stderr)
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    hosts, summary = lines[:-1], lines[-1]
    assert sorted(h["host"] for h in hosts) == ["n1", "n2"]
    assert all(h["result"] == "failed" and "cannot connect" in h["reason"] for h in hosts)
    assert summary["summary"] is True and summary["counts"]["failed"] == 2
    assert sorted(u["host"] for u in summary["unreachable"]) == ["n1", "n2"]
    assert "batch 1/1" in res.stderr and "2 failed" in res.stderr  # the live line, not the hosts' steps
    assert "cannot connect" not in res.stderr and "Traceback" not in res.stderr


# ---------------------------------------------------------------------------------------------
# Services over several hosts: one rollout unit with their workers

from llmfleet.fleet import upgrade as U  # noqa: E402


@pytest.mark.parametrize(("selected", "own", "multi", "expected"), [
    # a head and its (unselected) worker: one unit under the head's name
    (["h"], {"h": False}, [("h", "big", ["w"])], [U.Unit("h", ("h", "w"), (), (("h", "big"),))]),
    # the worker selected too, and with a service of its own: still one unit, its own services first
    (["w", "h", "n"], {"w": True, "h": True, "n": True}, [("h", "big", ["w"])],
     [U.Unit("w", ("h", "w"), ("w", "h"), (("h", "big"),)), U.Unit("n", ("n",), ("n",))]),
    # two services sharing a worker: their heads are one unit (a deploy locks every host of its service)
    (["a", "b"], {}, [("a", "s1", ["w"]), ("b", "s2", ["w"])],
     [U.Unit("a", ("a", "b", "w"), (), (("a", "s1"), ("b", "s2")))]),
    # a selected host with nothing to deploy is no unit
    (["x", "n"], {"n": True}, [], [U.Unit("n", ("n",), ("n",))]),
])
def test_rollout_units(selected, own, multi, expected):
    assert U.rollout_units(selected, own, multi) == expected


def test_a_unit_of_several_hosts_counts_once_against_the_failure_budget():
    units = U.rollout_units(["h", "n1", "n2"], {"n1": True, "n2": True}, [("h", "big", ["w"])])
    fleet = FakeFleet(fail={"h"})
    # per host, 2 of 4 failed (50%) would stop the rollout; per unit it is 1 of 3 (33%)
    report = run_upgrade([u.key for u in units], deploy=fleet.deploy, serial=[3, 1], max_fail_percentage=34,
                         members={u.key: list(u.hosts) for u in units if len(u.hosts) > 1})
    assert not report.aborted
    assert [(h.host, h.hosts, h.result) for h in report.hosts] == [
        ("h", ["h", "w"], "rolled_back"), ("n1", [], "deployed"), ("n2", [], "deployed")]
    assert report.to_dict()["hosts"][0]["hosts"] == ["h", "w"]


def test_a_unit_deploys_its_hosts_own_services_then_the_service_over_them_and_stops_at_a_failure(monkeypatch):
    from llmfleet.release import multihost
    from llmfleet.release.decide import HostOutcome

    calls: list[str] = []

    def deploy_service(inv, head, svc, **kw):
        calls.append(f"service {svc}")
        run = multihost.ServiceRun(svc, head, "deployed", "ok")
        run.hosts = {head: HostOutcome(head, "deployed", {svc: "R-head"}), "w": HostOutcome("w", "deployed", {svc: "R-w"})}
        return run

    monkeypatch.setattr(multihost, "deploy_service", deploy_service)
    unit = U.Unit("w", ("h", "w"), ("w", "h"), (("h", "big"),))

    def host_deploy(h):
        calls.append(f"host {h}")
        return Outcome(h, "deployed" if h != "bad" else "failed", {"chat": f"R-{h}"})

    run = U.unit_deploy_fn(None, [unit], host_deploy=host_deploy, config=None, options=U.DeployOptions(),
                           changes={}, log=lambda line: None)
    out = run("w")
    assert calls == ["host w", "host h", "service big"]
    assert out.result == "deployed" and out.host == "w"
    assert out.releases == {"chat@w": "R-w", "chat@h": "R-h", "big@h": "R-head", "big@w": "R-w"}
    calls.clear()
    bad = U.Unit("bad", ("bad", "w"), ("bad",), (("bad", "big"),))
    out = U.unit_deploy_fn(None, [bad], host_deploy=host_deploy, config=None, options=U.DeployOptions(), changes={},
                           log=lambda line: None)("bad")
    assert calls == ["host bad"] and out.result == "failed"  # the service over several hosts is not started


def test_upgrade_task_runs_a_service_over_two_hosts_as_one_unit(tmp_path):
    """`upgrade --json-lines` on a head with a worker (nothing listens): one line for the unit, naming both
    hosts, its failure counted once; the worker is not reported as left out."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    inv = _fleet_inventory(tmp_path)
    data = yaml.safe_load((inv / "hosts.yml").read_text())
    n1 = data["fleet"]["hosts"]["n1"]
    big = {"name": "big", "engine": "llamacpp", "model": "m", "model_path": "/srv/models/m.gguf",
           "image": "llamacpp:old", "port": 8001, "workers": ["n2"]}
    n1["llmfleet_services"] = [big]
    n1["llmfleet_cluster_address"] = "10.0.0.1"
    data["fleet"]["hosts"]["n2"] |= {"llmfleet_services": [], "llmfleet_cluster_address": "10.0.0.2"}
    (inv / "hosts.yml").write_text(yaml.safe_dump(data))
    res = subprocess.run([sys.executable, "-m", "invoke", "upgrade", "-i", str(inv), "--group", "fleet",
                          "--set", "context=4096", "--json-lines"],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                              "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
    assert res.returncode == 1, (res.stdout, res.stderr)
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    (unit,), summary = lines[:-1], lines[-1]
    assert unit["host"] == "n1" and unit["hosts"] == ["n1", "n2"] and unit["result"] == "failed"
    assert "big over" in unit["reason"] and "cannot connect" in unit["reason"]
    assert summary["counts"] == {"failed": 1} and summary["excluded"] == {}
    assert "Traceback" not in res.stderr


# ---------------------------------------------------------------------------------------------
# Per-batch preparation (upgrade --bundle: each batch's hosts get the bundle's images and models first)


def test_each_batch_is_prepared_just_before_it_deploys_and_unprepared_hosts_count_as_failed():
    """The preparation of a batch runs after the previous batch's deploys and before its own; a host it
    could not prepare is not deployed, is reported failed with its reason, and counts against the
    batch's failure budget."""
    fleet = FakeFleet()
    events: list[str] = []
    deploy = fleet.deploy

    def tracked_deploy(h):
        events.append(f"deploy {h}")
        return deploy(h)

    def before_batch(batch):
        events.append(f"prepare {','.join(batch)}")
        return {h: Outcome(h, "failed", reason="llamacpp:lab-cpu: the archive arrived damaged")
                for h in batch if h in ("h3", "h6")}

    report = run_upgrade(HOSTS[:6], deploy=tracked_deploy, serial=[1, 2], max_fail_percentage=50,
                         before_batch=before_batch)
    # batch 1 = h1; batch 2 = h2,h3 (1 of 2 failed: 50%, not over); batch 3 = h4,h5; batch 4 = h6
    assert report.batches == [["h1"], ["h2", "h3"], ["h4", "h5"], ["h6"]]
    prepares = [i for i, e in enumerate(events) if e.startswith("prepare")]
    assert [events[i] for i in prepares] == ["prepare h1", "prepare h2,h3", "prepare h4,h5", "prepare h6"]
    for i, at in enumerate(prepares):  # every deploy of a batch lies between its preparation and the next
        end = prepares[i + 1] if i + 1 < len(prepares) else len(events)
        assert {e for e in events[at + 1:end]} == {f"deploy {h}" for h in report.batches[i] if h not in ("h3", "h6")}
    assert "h3" not in fleet.calls and "h6" not in fleet.calls
    got = {h.host: (h.result, h.reason) for h in report.hosts}
    assert got["h3"] == ("failed", "llamacpp:lab-cpu: the archive arrived damaged")
    assert got["h2"][0] == "deployed"
    # h6's batch: 1 of 1 failed, over 50%: the rollout is aborted after it
    assert report.aborted and "batch 4" in report.abort_reason


def test_a_batch_whose_preparation_fails_entirely_aborts_before_the_next_batch():
    fleet = FakeFleet()

    def before_batch(batch):
        if "h2" in batch:
            raise OSError("bundle folder went away")
        return {}

    report = run_upgrade(HOSTS[:4], deploy=fleet.deploy, serial=[1, 1], before_batch=before_batch)
    assert fleet.calls == ["h1"]
    assert results(report) == {"h1": "deployed", "h2": "failed", "h3": "skipped", "h4": "skipped"}
    assert "preparing the batch failed: OSError: bundle folder went away" in report.hosts[1].reason
    assert report.aborted


def test_check_mode_prepares_nothing():
    fleet = FakeFleet()
    calls: list[list[str]] = []
    report = run_upgrade(HOSTS[:3], deploy=fleet.deploy, check=True, before_batch=lambda b: calls.append(b) or {})
    assert calls == [] and sorted(fleet.calls) == HOSTS[:3] and not report.aborted
