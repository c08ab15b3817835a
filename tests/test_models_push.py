"""models.push: the decision per host (table), the jobs and their usage errors, the peer address rule, and the
push itself: against a scripted remote (tests/fake_remote.py: a verified host costs one round trip, a full
disk is refused in one line) and end to end against a real sshd on loopback (tests/sshd_fixture.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from datetime import UTC, datetime

import pytest

from llmfleet.errors import UsageError
from llmfleet.host import model_scripts as S
from llmfleet.host.ssh import connect
from llmfleet.inventory.ansible import Host, Inventory
from llmfleet.inventory.services import HostSettings, host_settings
from llmfleet.knowledge import model_manifest as M
from llmfleet.models import local as L
from llmfleet.models import push as P
from tests.fake_remote import Command, FakeRemote
from tests.test_ssh import host_for

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SHA = "ab" * 32
WANT = M.Manifest("/srv/m.gguf", "file", (M.FileEntry("m.gguf", 1000, SHA),))
DIR = M.Manifest("/srv/q", "dir", (M.FileEntry("config.json", 10, SHA), M.FileEntry("w.safetensors", 990, "cd" * 32)))


def probe(*, kind="missing", files=None, manifest=None, parts=None, part_kind="none", want=None, free=10**9,
          tools=None) -> S.PushProbe:
    hm = S.HostModel("/srv/m.gguf", kind=kind, manifest_text=manifest, files=files or {}, read=True)
    return S.PushProbe(hm, part_kind=part_kind, parts=parts or {}, want=want, fs_path="/srv", free_bytes=free,
                       tools=tools or dict.fromkeys(S.PROBE_TOOLS, True), complete=True)


def held(m: M.Manifest, mtime: int = 7) -> str:
    files = tuple(M.FileEntry(f.path, f.size, f.sha256, f.size, mtime) for f in m.files)
    return M.Manifest(m.model_path, m.kind, files, verified_at="2026-11-29T11:00:00+00:00").to_json()


@pytest.mark.parametrize(("name", "pp", "action", "offsets", "reset", "why"), [
    ("verified copy", probe(kind="file", files={"m.gguf": (1000, 7)}, manifest=held(WANT)), "skip", {}, False,
     "verified 2026-11-29T11:00:00+00:00"),
    ("touched since verified", probe(kind="file", files={"m.gguf": (1000, 8)}, manifest=held(WANT)), "adopt", {},
     False, "sha256sum on the host"),
    ("hand copy, right size", probe(kind="file", files={"m.gguf": (1000, 1)}), "adopt", {}, False, ""),
    ("other content", probe(kind="file", files={"m.gguf": (999, 1)}), "send", {"m.gguf": 0}, True, "1,000 B to send"),
    ("resume", probe(part_kind="file", parts={"m.gguf": 400}, want=WANT.content_digest), "send", {"m.gguf": 400},
     False, "600 B to send, 400 B resumed"),
    ("staging for other content", probe(part_kind="file", parts={"m.gguf": 400}, want="0" * 32), "send",
     {"m.gguf": 0}, True, ""),
    ("staging longer than the file", probe(part_kind="file", parts={"m.gguf": 5000}, want=WANT.content_digest),
     "send", {"m.gguf": 0}, False, ""),
    ("disk full", probe(free=999), "refuse", {"m.gguf": 0}, True,
     "host h1: /srv (the filesystem of /srv/m.gguf) has 999 B free; the model needs 1,000 B more"),
    ("a folder where the file goes", probe(kind="dir"), "refuse", {}, False, "/srv/m.gguf is a folder, the model is a file"),
    ("no python3", probe(tools={**dict.fromkeys(S.PROBE_TOOLS, True), "python3": False}), "refuse", {}, False,
     "python3 not found on the host"),
])
def test_decide(name, pp, action, offsets, reset, why):
    d = P.decide(WANT, pp, "h1")
    assert d.action == action, (name, d)
    assert d.offsets == offsets and d.reset == reset
    assert why in d.reason


def test_decide_links_the_files_a_folder_already_holds():
    pp = probe(kind="dir", files={"config.json": (10, 1), "w.safetensors": (990, 1)})
    pp.model.model_path = "/srv/q"
    assert P.decide(DIR, pp, "h1").action == "adopt"
    d = P.decide(DIR, pp, "h1", adopt=False, verified_in_place=["config.json"])
    assert d.action == "send" and d.offsets == {"config.json": 10, "w.safetensors": 0} and d.send_bytes == 990


def inventory(services: list[dict], **hostvars) -> Inventory:
    inv = Inventory(path="inv", groups={}, hosts={})
    for name in ("h1", "h2"):
        inv.hosts[name] = Host(name, vars={"ansible_host": "10.0.0.1" if name == "h1" else "127.0.0.1",
                                           "llmfleet_services": services, **hostvars})
    return inv


SVC = {"name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/srv/m.gguf", "image": "llamacpp:b1"}


def test_jobs_and_their_usage_errors():
    inv = inventory([dict(SVC, model_source="/data/m.gguf"), dict(SVC, name="b", port=8001, model_source="/data/m.gguf")])
    (job,) = P.plan_jobs(inv, [inv.hosts["h1"]])
    assert (job.model_path, job.services, job.origin) == ("/srv/m.gguf", ["chat", "b"], P.Origin("local", "/data/m.gguf"))
    # --from a host: the source itself is not a target
    jobs = P.plan_jobs(inv, list(inv.hosts.values()), from_host="h2")
    assert [j.host.name for j in jobs] == ["h1"] and jobs[0].origin == P.Origin("host", "h2")
    with pytest.raises(UsageError, match=r"host h1: service chat: no model_source"):
        P.plan_jobs(inventory([SVC]), [inventory([SVC]).hosts["h1"]])
    with pytest.raises(UsageError, match="not both"):
        P.plan_jobs(inv, [inv.hosts["h1"]], source="/x", from_host="h2")
    with pytest.raises(UsageError, match="--from nope: no such host"):
        P.plan_jobs(inv, [inv.hosts["h1"]], from_host="nope")
    two = inventory([dict(SVC, model_source="/a"), dict(SVC, name="b", port=8001, model_source="/b")])
    with pytest.raises(UsageError, match="share model_path /srv/m.gguf but name different model_source"):
        P.plan_jobs(two, [two.hosts["h1"]])
    hf = inventory([dict(SVC, model_source={"hf": "Qwen/Q", "revision": "a" * 40, "allow_download": True})])
    with pytest.raises(UsageError, match="a llamacpp image lacks"):
        P.plan_jobs(hf, [hf.hosts["h1"]])


@pytest.mark.parametrize(("hostvars", "target", "want"), [
    ({"llmfleet_transfer_address": "gpu-2"}, "h1", ("gpu-2", 22)),
    ({"llmfleet_transfer_address": "gpu-2:2222"}, "h1", ("gpu-2", 2222)),
    ({"llmfleet_cluster_address": "10.1.0.5"}, "h1", ("10.1.0.5", 22)),
    ({"ansible_port": 2200}, "h1", ("10.0.0.1", 2200)),
])
def test_the_address_a_peer_reaches_a_target_at(hostvars, target, want):
    inv = inventory([SVC], **hostvars)
    h = inv.hosts[target]
    assert P.peer_address(h, host_settings(h.name, h.vars)) == want


def test_a_loopback_target_address_is_a_one_line_usage_error():
    inv = inventory([SVC])
    with pytest.raises(UsageError, match="ansible_host 127.0.0.1 is loopback .* set llmfleet_transfer_address"):
        P.peer_address(inv.hosts["h2"], HostSettings())


@pytest.mark.parametrize(("text", "rate"), [("50M", 50_000_000), ("100Mi", 100 * 2**20), ("1G/s", 10**9),
                                            ("500000", 500_000), ("1.5k", 1500), (None, None), ("", None)])
def test_parse_rate(text, rate):
    assert P.parse_rate(text) == rate


@pytest.mark.parametrize("text", ["fast", "10 parsecs", "-5M", "100"])
def test_a_bad_rate_is_a_usage_error(text):
    with pytest.raises(UsageError, match="--limit-rate"):
        P.parse_rate(text)


def _job(host: Host, mp: str, origin: P.Origin, root: str = "/opt/llmfleet") -> P.Job:
    return P.Job(host, HostSettings(root=root), mp, ["chat"], origin)


def _real_probe(mp: str) -> str:
    return subprocess.run(["sh", "-c", S.probe_script(mp)], capture_output=True, text=True, timeout=30).stdout


def test_a_verified_host_costs_one_round_trip_and_changes_nothing(tmp_path):
    mp = str(tmp_path / "m.gguf")
    data = b"GGUF" + b"v" * 100
    open(mp, "wb").write(data)
    want = M.Manifest(mp, "file", (M.FileEntry("m.gguf", len(data), hashlib.sha256(data).hexdigest()),))
    subprocess.run(["sh", "-c", S.commit_script(mp, "file", move=False)], input=want.verified(at="t0", by="b").to_json(),
                   text=True, check=True)
    remote = FakeRemote([Command(S.probe_script(mp), out=_real_probe(mp))])
    o = P.push_job(_job(Host("h1"), mp, P.Origin("local", "/data/m.gguf")), want, config=None, options=P.Options(),
                   reporter=P.Quiet(), connect=lambda h: remote)
    remote.assert_done()
    assert (o.result, o.round_trips, o.bytes_sent, o.verified_at) == ("verified", 1, 0, "t0")


def test_a_full_disk_is_refused_in_one_line_before_anything_is_sent():
    out = "\n".join(["@@kind missing", "@@manifest none", "@@part-kind none", "@@fs /srv", "@@avail-kib 0",
                     *[f"@@tool {t} yes" for t in S.PROBE_TOOLS], "@@probe-done"])
    remote = FakeRemote([Command(S.probe_script("/srv/m.gguf"), out=out)])
    o = P.push_job(_job(Host("h1"), "/srv/m.gguf", P.Origin("local", "/x")), WANT, config=None, options=P.Options(),
                   reporter=P.Quiet(), connect=lambda h: remote)
    remote.assert_done()
    assert o.result == "failed" and o.round_trips == 1
    assert o.error == ("host h1: /srv (the filesystem of /srv/m.gguf) has 0 B free; the model needs 1,000 B more; "
                       "free space or choose another model_path")


def test_an_unreachable_host_is_one_line():
    from llmfleet.errors import RemoteError

    def refuse(h):
        raise RemoteError("host h1: cannot connect to 10.0.0.1:22: timed out")

    o = P.push_job(_job(Host("h1"), "/srv/m.gguf", P.Origin("local", "/x")), WANT, config=None, options=P.Options(),
                   reporter=P.Quiet(), connect=refuse)
    assert (o.result, o.error) == ("failed", "host h1: cannot connect to 10.0.0.1:22: timed out")


def test_push_end_to_end_over_ssh_resume_adopt_and_skip(sshd, tmp_path):
    src = tmp_path / "local" / "model.gguf"
    src.parent.mkdir()
    data = b"GGUF" + os.urandom(2_000_000)
    src.write_bytes(data)
    mp = str(tmp_path / "host" / "models" / "m.gguf")
    root = str(tmp_path / "host" / "llmfleet")
    host = host_for(sshd)
    kh = tmp_path / "known_hosts"
    origin = P.Origin("local", str(src))
    want = L.build_local(str(src), mp, source=origin.record())
    remotes = []

    def conn(h):
        r = connect(host, config={"known_hosts": str(kh)}, accept_new_host_keys=True)
        remotes.append(r)
        return r

    # a copy cut part-way earlier: its staging file is resumed
    os.makedirs(os.path.dirname(mp))
    subprocess.run(["sh", "-c", S.prepare_script(mp, "file", want.content_digest, reset=True)], check=True)
    open(M.part_path(mp), "wb").write(data[:700_000])
    job = _job(host, mp, origin, root=root)
    o = P.push_job(job, want, config=None, options=P.Options(who="tester", limit_rate=None), reporter=P.Quiet(),
                   connect=conn, now=lambda: NOW)
    assert o.result == "pushed", o.error
    assert (o.bytes_sent, o.bytes_resumed) == (len(data) - 700_000, 700_000)
    assert open(mp, "rb").read() == data and not os.path.exists(M.part_path(mp))
    written = json.loads(open(M.manifest_path(mp)).read())
    assert written["verified_at"] == "2026-11-29T12:00:00+00:00" and written["verified_by"] == "tester"
    assert written["source"]["path"] == str(src)
    audit = [json.loads(line) for line in open(f"{root}/audit.jsonl")]
    assert audit[-1]["action"] == "models.push" and audit[-1]["result"] == "pushed" and audit[-1]["model_path"] == mp
    # again: one round trip, nothing sent
    o2 = P.push_job(job, want, config=None, options=P.Options(), reporter=P.Quiet(), connect=conn)
    assert (o2.result, o2.round_trips, o2.bytes_sent) == ("verified", 1, 0)
    # touched (same bytes, new mtime): sha256sum on the host, only the manifest rewritten
    os.utime(mp, (1, 1))
    o3 = P.push_job(job, want, config=None, options=P.Options(), reporter=P.Quiet(), connect=conn)
    assert (o3.result, o3.bytes_sent) == ("adopted", 0)
    # tampered (a byte changed): sent again in full, verified, put in place
    with open(mp, "r+b") as fh:
        fh.seek(100)
        fh.write(b"X")
    o4 = P.push_job(job, want, config=None, options=P.Options(), reporter=P.Quiet(), connect=conn)
    assert (o4.result, o4.bytes_sent) == ("pushed", len(data))
    assert open(mp, "rb").read() == data
    for r in remotes:
        r.close()


# ---------------------------------------------------------------------------------------------
# Seeding: who copies from whom as hosts finish (pure plan)

C = P.CONTROLLER


def tree(root: str, n: int) -> tuple[list[list[tuple[str, str]]], int]:
    """Every target wants a copy at once; each round, every copy in flight ends and its target becomes
    a holder. Returns the pairs started per round and how many copies this machine sent."""
    plan = P.SeedPlan(root)
    targets = [f"h{i}" for i in range(1, n + 1)]
    for t in targets:
        plan.want(t)
    rounds = []
    while plan.waiting:
        pairs = plan.assign()
        assert pairs, plan  # always progress
        rounds.append(pairs)
        for t, _src in pairs:
            plan.sent(t, ok=True)
            plan.holds(t)
    return rounds, sum(1 for r in rounds for _t, s in r if s == C)


@pytest.mark.parametrize(("root", "n", "per_round", "from_here"), [
    # from this machine: it sends once, then the hosts double the copies each round
    (C, 1, [1], 1),
    (C, 4, [1, 1, 2], 1),
    (C, 8, [1, 1, 2, 4], 1),
    (C, 11, [1, 1, 2, 4, 3], 1),
    # from a host (--from): the source is a holder like the others, so it doubles from the first round
    ("src", 1, [1], 0),
    ("src", 3, [1, 2], 0),
    ("src", 8, [1, 2, 4, 1], 0),
])
def test_seed_plan_is_a_tree(root, n, per_round, from_here):
    rounds, here = tree(root, n)
    assert [len(r) for r in rounds] == per_round
    assert here == from_here
    for r in rounds:  # no source serves two copies at once, no target is served twice
        assert len({s for _t, s in r}) == len(r)
    assert sorted(t for r in rounds for t, _s in r) == sorted(f"h{i}" for i in range(1, n + 1))


def test_seed_plan_pairs_step_by_step():
    plan = P.SeedPlan(C)
    for t in "abcd":
        plan.want(t)
    assert plan.assign() == [("a", C)]
    assert plan.assign() == []  # this machine serves no second copy while one is in flight
    plan.sent("a", ok=True)
    assert plan.assign() == []  # a's copy is across but not verified yet: not a holder
    plan.holds("a")
    assert plan.assign() == [("b", "a")]
    plan.sent("b", ok=True)
    plan.holds("b")
    assert plan.assign() == [("c", "a"), ("d", "b")]


def test_a_host_found_verified_seeds_without_this_machine_sending():
    plan = P.SeedPlan(C)
    plan.start("a")
    plan.start("b")
    plan.holds("a")  # its copy was already verified: no copy needed
    plan.want("b")
    assert plan.assign() == [("b", "a")]


def test_a_failed_holder_serves_no_more_and_its_target_gets_another():
    plan = P.SeedPlan(C, holders=["a", "b"])
    plan.want("c")
    plan.want("d")
    assert plan.assign() == [("c", "a"), ("d", "b")]
    plan.sent("c", ok=False)  # a's copy to c failed
    plan.want("c")
    assert plan.assign() == []  # b is busy, a is out, this machine waits while a copy is in flight
    plan.sent("d", ok=True)
    plan.holds("d")
    assert plan.assign() == [("c", "b")]
    plan.sent("c", ok=False)
    plan.want("c")
    assert plan.assign() == [("c", "d")]
    plan.sent("c", ok=False)  # every holder failed: this machine, the root, sends
    plan.want("c")
    assert plan.assign() == [("c", C)] and plan.bad == {"a", "b", "d"}
    plan.sent("c", ok=False)  # a failure of this machine's own copy does not take it out
    plan.want("c")
    assert plan.assign() == [("c", C)]


def test_from_a_host_with_no_holder_left_the_targets_are_stuck():
    plan = P.SeedPlan("src")
    plan.want("a")
    plan.start("b")  # still probing: it may turn out to hold a copy
    assert plan.assign() == [("a", "src")]
    plan.sent("a", ok=False)
    plan.want("a")
    assert plan.assign() == [] and plan.stuck() == []
    plan.finish("b")  # b failed too: nothing can serve a any more
    assert plan.stuck() == ["a"]
    assert P.SeedPlan(C, waiting=["a"], active={"a"}).stuck() == []  # this machine always can


@pytest.mark.parametrize(("flag", "forks", "targets", "on"), [
    (None, 5, 3, True), (None, 5, 2, False), (None, 1, 8, False), (False, 5, 8, False), (True, 1, 2, True),
])
def test_seeding_on_by_default_only_with_forks_and_more_than_two_targets(flag, forks, targets, on):
    assert P.seeding_on(flag, forks, targets) is on


def test_seed_groups_leave_out_hosts_no_other_host_can_reach():
    inv = Inventory("inv", {}, {})
    jobs = []
    for name, addr in (("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3"), ("lo", "127.0.0.1")):
        h = Host(name, {"ansible_host": addr})
        inv.hosts[name] = h
        jobs.append(P.Job(h, host_settings(name, {}), "/srv/m.gguf", ["chat"], P.Origin("local", "/data/m.gguf")))
    seeders = P.seed_groups(inv, jobs, range(4), P.Options(forks=4))
    assert sorted(seeders) == [0, 1, 2] and seeders[0] is seeders[2]  # lo: loopback, copies from here
    assert P.seed_groups(inv, jobs, range(4), P.Options(forks=4, seed=False)) == {}
    assert P.seed_groups(inv, jobs[:2], range(2), P.Options(forks=4)) == {}  # two targets: no tree


def test_a_target_that_ends_mid_copy_frees_its_source():
    plan = P.SeedPlan(C)
    plan.want("a")
    plan.want("b")
    assert plan.assign() == [("a", C)]
    plan.finish("a")  # its push ended without a word on its copy (the connection broke)
    assert plan.assign() == [("b", C)] and not plan.served


# ---------------------------------------------------------------------------------------------
# One writer per host: a push writes only under the host's deploy lock (release.executor.HostRun.lock)

TOKEN, ORIGIN, PID, ROOT = "0a" * 16, "me@ws", 4242, "/opt/llmfleet"


class Clock:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.t = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def runs(alive: bool = True, clock: Clock | None = None, token: str = TOKEN):
    from llmfleet.release.executor import HostRun

    clock = clock or Clock()

    def make(*args, **kwargs):
        return HostRun(*args, **{**kwargs, "token": lambda: token, "origin": ORIGIN, "pid": PID,
                                 "alive": lambda pid: alive, "clock": clock, "sleep": clock.sleep})
    return make


def holder_of(action: str = "models.push", mp: str = "/srv/m.gguf", token: str = TOKEN) -> dict:
    from llmfleet.release import store

    return store.holder_document(token=token, who=ORIGIN, origin=ORIGIN, action=action,
                                 message=f"{mp} from /x (this machine)", now=NOW, pid=PID)


def chain_answer(*steps: tuple[str, int]) -> str:
    return "".join(f"@@step {i}\n{out}\n@@step-rc {i} {rc}\n" for i, (out, rc) in enumerate(steps))


def locked_probe(mp: str, answer: str, holder: dict | None = None) -> Command:
    """The lock and the probe under it: one round trip."""
    from llmfleet.release import store

    return Command(store.chain_script([store.lock_acquire_script(ROOT, holder or holder_of(mp=mp)),
                                       S.probe_script(mp)]), out=answer)


def held_by(who: dict) -> str:
    from llmfleet.release import store

    return chain_answer(("@@held\n" + json.dumps(who), store.LOCK_HELD_RC))


def probe_out(*, part: int | None = None, want: str | None = None, kind: str = "missing",
              files: dict | None = None) -> str:
    lines = [f"@@kind {kind}", *[f"@@file {s} 1 {r}" for r, s in (files or {}).items()], "@@manifest none"]
    lines += (["@@part-kind file", f"@@part {part} 5 m.gguf"] if part is not None else ["@@part-kind none"])
    lines += [f"@@want {want}"] if want else []
    lines += ["@@fs /srv", "@@avail-kib 100000", *[f"@@tool {t} yes" for t in S.PROBE_TOOLS], "@@probe-done"]
    return "\n".join(lines)


DEPLOYER = {"token": "f" * 32, "who": "bob", "from": "bob@ws2", "pid": 77, "action": "deploy", "message": "canary",
            "time": "2026-11-29T11:50:00+00:00"}


def test_a_push_during_a_deploy_is_refused_in_one_line_naming_the_deploy_and_audited():
    from llmfleet.release import store

    remote = FakeRemote([Command(S.probe_script("/srv/m.gguf"), out=probe_out()),
                         locked_probe("/srv/m.gguf", held_by(DEPLOYER)),
                         Command(None, out="")])  # the host's audit line
    o = P.push_job(_job(Host("h1"), "/srv/m.gguf", P.Origin("local", "/x")), WANT, config=None,
                   options=P.Options(who=ORIGIN, lock_wait=0), reporter=P.Quiet(), connect=lambda h: remote,
                   now=lambda: NOW, make_run=runs())
    remote.assert_done()
    assert (o.result, o.refused, o.round_trips, o.bytes_sent) == ("failed", True, 3, 0)
    assert o.error == ("host h1: /srv/m.gguf: not pushed: deploy lock held by bob from bob@ws2 (pid 77) since "
                       "2026-11-29T11:50:00+00:00 (10 min 0 s ago) for deploy: canary; wait, or inspect with "
                       "`invoke lock.status --host h1` and break a stale one with `invoke lock.release --host h1 --yes`")
    assert P.line(o) == f"FAILED {o.error}"
    audit = remote.sent[2]
    assert store.lock_release_script(ROOT, TOKEN) not in audit  # nothing of the deploy's is released
    assert '"action":"models.push"' in audit and '"result":"refused"' in audit and "held by bob" in audit


def test_a_push_waits_for_another_push_then_finds_the_copy_it_verified(tmp_path):
    mp = str(tmp_path / "m.gguf")
    data = b"GGUF" + b"v" * 100
    open(mp, "wb").write(data)
    want = M.Manifest(mp, "file", (M.FileEntry("m.gguf", len(data), hashlib.sha256(data).hexdigest()),))
    subprocess.run(["sh", "-c", S.commit_script(mp, "file", move=False)], input=want.verified(at="t0", by="b").to_json(),
                   text=True, check=True)
    from llmfleet.release import store

    other = {**DEPLOYER, "action": "models.push", "message": f"{mp} from /y (this machine)"}
    clock = Clock()
    remote = FakeRemote([Command(S.probe_script(mp), out=probe_out(kind="missing")),  # the other push is committing
                         locked_probe(mp, held_by(other)),
                         locked_probe(mp, held_by(other)),
                         locked_probe(mp, chain_answer(("@@acquired", 0), (_real_probe(mp), 0))),
                         Command(store.final_script(ROOT, [], [], TOKEN), out="@@released")])
    o = P.push_job(_job(Host("h1"), mp, P.Origin("local", "/x")), want, config=None,
                   options=P.Options(who=ORIGIN, lock_wait=60), reporter=P.Quiet(), connect=lambda h: remote,
                   now=lambda: NOW, make_run=runs(clock=clock))
    remote.assert_done()
    assert (o.result, o.bytes_sent, o.lock_wait_s) == ("verified", 0, 6.0) and clock.slept == [3.0, 3.0]
    assert P.line(o) == (f"h1: {mp}: already verified t0 (nothing sent); waited 6 s for the deploy lock, held by "
                         f"bob from bob@ws2 (pid 77) since 2026-11-29T11:50:00+00:00 for models.push: {mp} from /y "
                         "(this machine)")


def test_a_push_gives_up_waiting_at_its_bound_naming_the_holder():
    clock = Clock()
    remote = FakeRemote([Command(S.probe_script("/srv/m.gguf"), out=probe_out()),
                         *[locked_probe("/srv/m.gguf", held_by(DEPLOYER)) for _ in range(4)],
                         Command(None, out="")])
    o = P.push_job(_job(Host("h1"), "/srv/m.gguf", P.Origin("local", "/x")), WANT, config=None,
                   options=P.Options(who=ORIGIN, lock_wait=7), reporter=P.Quiet(), connect=lambda h: remote,
                   now=lambda: NOW, make_run=runs(clock=clock))
    remote.assert_done()
    assert clock.slept == [3.0, 3.0, 1.0] and o.refused
    assert "held by bob from bob@ws2 (pid 77)" in o.error and "for deploy: canary; waited 7 s; wait, or" in o.error


def test_a_stale_lock_of_this_machine_is_taken_over_and_audited_with_the_push():
    from llmfleet.release import store

    mine = {**holder_of(), "token": "1" * 32, "pid": 999}
    hand_copy = probe_out(kind="file", files={"m.gguf": 1000})
    remote = FakeRemote([Command(S.probe_script("/srv/m.gguf"), out=hand_copy),
                         locked_probe("/srv/m.gguf", held_by(mine)),
                         Command(store.lock_break_script(ROOT), out="@@held\n@@broken"),
                         locked_probe("/srv/m.gguf", chain_answer(("@@acquired", 0), (hand_copy, 0))),
                         Command(S.verify_script("/srv/m.gguf", WANT, in_place=True), out=f"@@sha OK m.gguf {SHA}"),
                         Command(None, out="@@manifest-written\n@@committed\n@@released")])
    o = P.push_job(_job(Host("h1"), "/srv/m.gguf", P.Origin("local", "/x")), WANT, config=None,
                   options=P.Options(who=ORIGIN), reporter=P.Quiet(), connect=lambda h: remote, now=lambda: NOW,
                   make_run=runs(alive=False))
    remote.assert_done()
    assert o.result == "adopted", o.error
    last = remote.sent[-1]  # the commit, the audit lines and the unlock: one round trip
    assert S.commit_script("/srv/m.gguf", "file", move=False) in last
    assert '"action":"lock-break"' in last and '"result":"stale"' in last and '"result":"adopted"' in last
    assert last.rstrip().endswith(store.lock_release_script(ROOT, TOKEN) + "\n)")


def test_a_push_whose_staging_copy_another_writer_took_says_so_and_touches_nothing_of_it():
    from llmfleet.release import store

    theirs = {**DEPLOYER, "token": "b" * 32, "action": "models.push", "message": "/srv/m.gguf from /y (this machine)"}
    whole = probe_out(part=1000, want=WANT.content_digest)  # the staging copy holds every byte: nothing to send
    remote = FakeRemote([
        Command(S.probe_script("/srv/m.gguf"), out=whole),
        locked_probe("/srv/m.gguf", chain_answer(("@@acquired", 0), (whole, 0))),
        Command(S.prepare_script("/srv/m.gguf", "file", WANT.content_digest, reset=False, owner=TOKEN),
                out="@@prepared"),
        Command(None, out=f"@@staging-taken {'b' * 32}\n@@notours"),  # its lock was broken, its copy taken
        Command(store.lock_status_script(ROOT), out="@@held\n" + json.dumps(theirs)),
        Command(None, out="")])  # the audit line of the failure
    o = P.push_job(_job(Host("h1"), "/srv/m.gguf", P.Origin("local", "/x")), WANT, config=None,
                   options=P.Options(who=ORIGIN), reporter=P.Quiet(), connect=lambda h: remote, now=lambda: NOW,
                   make_run=runs())
    remote.assert_done()
    commit = remote.sent[3]
    check = S.owner_check_script("/srv/m.gguf", TOKEN, f"{ROOT}/locks/deploy/holder.json")
    assert commit.index(check) < commit.index(S.verify_script("/srv/m.gguf", WANT))
    assert o.result == "failed" and "\n" not in o.error and "cut" not in o.error
    assert o.error.startswith("host h1: /srv/m.gguf: this push's staging copy was taken while it was being written, by "
                              "the writer now holding the deploy lock: held by bob from bob@ws2 (pid 77) since ")
    assert o.error.endswith("for models.push: /srv/m.gguf from /y (this machine); nothing of this push was put in place")
    assert '"result":"failed"' in remote.sent[5] and store.lock_release_script(ROOT, TOKEN) not in remote.sent[5]


class Blocking(P.Quiet):
    """A reporter that holds its push in the middle of its copy until ``go`` is set."""

    def __init__(self) -> None:
        import threading

        self.sending, self.go = threading.Event(), threading.Event()
        self.lines: list[str] = []

    def advance(self, key: str, n: int) -> None:
        self.sending.set()
        assert self.go.wait(60), "the test never let the first push go on"

    def log(self, line: str) -> None:
        self.lines.append(line)


def test_two_pushes_of_one_model_path_over_ssh_one_writes_the_other_waits_or_is_refused(sshd, tmp_path):
    """Three pushes of different content to one model path at once: while the first is mid-copy, one that
    will not wait is refused naming it, one that waits gets the lock when the first has committed and
    puts its own copy in place; the file left is whole and its manifest vouches for it."""
    import threading
    import time

    from llmfleet.release import store

    mp = str(tmp_path / "host" / "models" / "m.gguf")
    root = str(tmp_path / "host" / "llmfleet")
    host = host_for(sshd)
    kh = tmp_path / "known_hosts"
    srcs = []
    for name, fill in (("a", b"a"), ("b", b"b")):
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(b"GGUF" + fill * 1_000_000)
        srcs.append(P.Origin("local", str(p)))
    a, b = srcs

    def conn(h):
        return connect(host, config={"known_hosts": str(kh)}, accept_new_host_keys=True)

    def push(origin, wait, reporter=None, who="tester"):
        return P.push_job(_job(host, mp, origin, root=root), L.build_local(origin.value, mp, source=origin.record()),
                          config=None, options=P.Options(who=who, lock_wait=wait),
                          reporter=reporter or P.Quiet(), connect=conn)

    first_rep = Blocking()
    got: dict[str, P.Outcome] = {}
    first = threading.Thread(target=lambda: got.setdefault("first", push(a, 0, first_rep, who="alice")))
    first.start()
    try:
        assert first_rep.sending.wait(60), "the first push never started its copy"
        refused = push(b, 0, who="bob")
        waiter_rep = Blocking()
        waiter_rep.go.set()
        waiter = threading.Thread(target=lambda: got.setdefault("waiter", push(b, 120, waiter_rep, who="carol")))
        waiter.start()
        deadline = time.monotonic() + 60
        while not any("waiting up to 120 s" in ln for ln in waiter_rep.lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        held, holder = store.parse_lock_status(subprocess.run(["sh", "-c", store.lock_status_script(root)],
                                                              capture_output=True, text=True).stdout)
        assert held and holder["action"] == "models.push" and holder["who"] == "alice"
    finally:
        first_rep.go.set()
        first.join(120)
    waiter.join(120)
    assert refused.result == "failed" and refused.refused and "\n" not in refused.error
    assert refused.error.startswith(f"host test-host: {mp}: not pushed: deploy lock held by alice from ")
    assert f"for models.push: {mp} from {a.value} (this machine)" in refused.error
    assert got["first"].result == "pushed", got["first"].error
    w = got["waiter"]
    assert w.result == "pushed" and w.lock_wait_s > 0 and "held by alice" in w.lock_waited_for, w
    assert "waited" in P.line(w)
    assert waiter_rep.lines[0].endswith("for models.push: " + f"{mp} from {a.value} (this machine); waiting up to 120 s")
    # one whole file, the last writer's, and its manifest vouches for it
    assert open(mp, "rb").read() == open(b.value, "rb").read()
    man = json.loads(open(M.manifest_path(mp)).read())
    assert man["files"][0]["sha256"] == hashlib.sha256(open(b.value, "rb").read()).hexdigest()
    assert not os.path.exists(M.part_path(mp)) and not os.path.exists(M.owner_path(mp))
    assert not os.path.exists(store.lock_dir(root))
    results = [(r["who"], r["result"]) for r in map(json.loads, open(f"{root}/audit.jsonl")) if r["action"] == "models.push"]
    assert results == [("bob", "refused"), ("alice", "pushed"), ("carol", "pushed")]


def test_a_push_whose_lock_was_broken_under_it_puts_nothing_in_place():
    whole = probe_out(part=1000, want=WANT.content_digest)
    remote = FakeRemote([
        Command(S.probe_script("/srv/m.gguf"), out=whole),
        locked_probe("/srv/m.gguf", chain_answer(("@@acquired", 0), (whole, 0))),
        Command(None, out="@@prepared"),
        Command(None, out="@@lock-lost\n@@notheld"),  # `lock.release --yes` by someone who thought it dead
        Command(None, out="")])
    o = P.push_job(_job(Host("h1"), "/srv/m.gguf", P.Origin("local", "/x")), WANT, config=None,
                   options=P.Options(who=ORIGIN), reporter=P.Quiet(), connect=lambda h: remote, now=lambda: NOW,
                   make_run=runs())
    remote.assert_done()
    assert o.result == "failed" and o.error == (
        "host h1: /srv/m.gguf: the deploy lock was broken under this push (`invoke lock.release`) before it could "
        "commit; nothing of this push was put in place; run it again: it resumes from its staging copy")


def test_a_lock_an_earlier_push_of_this_process_left_behind_is_taken_over():
    """A push whose connection dropped leaves the lock held (it cannot unlock); the next push from the same
    process (a push of many hosts, a bench) sees its own pid, alive, but a token no run of it holds any
    more: stale, taken over."""
    from llmfleet.errors import RemoteError
    from llmfleet.release import store

    whole = probe_out(part=1000, want=WANT.content_digest)
    first, second = "1" * 32, "2" * 32
    dropped = RemoteError("host h1: the SSH connection closed")
    remote = FakeRemote([
        Command(S.probe_script("/srv/m.gguf"), out=whole),
        locked_probe("/srv/m.gguf", chain_answer(("@@acquired", 0), (whole, 0)), holder_of(token=first)),
        Command(None, out="@@prepared"),
        Command(None, raises=dropped),  # the commit
        Command(None, raises=dropped)])  # the audit line and unlock after the failure
    o = P.push_job(_job(Host("h1"), "/srv/m.gguf", P.Origin("local", "/x")), WANT, config=None,
                   options=P.Options(who=ORIGIN), reporter=P.Quiet(), connect=lambda h: remote, now=lambda: NOW,
                   make_run=runs(token=first))
    remote.assert_done()
    assert o.result == "failed" and "the deploy lock stays held until this machine's next push takes it over" in o.error
    remote = FakeRemote([
        Command(S.probe_script("/srv/m.gguf"), out=whole),
        locked_probe("/srv/m.gguf", held_by(holder_of(token=first)), holder_of(token=second)),
        Command(store.lock_break_script(ROOT), out="@@held\n@@broken"),
        locked_probe("/srv/m.gguf", chain_answer(("@@acquired", 0), (whole, 0)), holder_of(token=second)),
        Command(None, out="@@prepared"),
        Command(None, out=f"@@sha OK m.gguf {SHA}\n@@manifest-written\n@@committed\n@@released")])
    o = P.push_job(_job(Host("h1"), "/srv/m.gguf", P.Origin("local", "/x")), WANT, config=None,
                   options=P.Options(who=ORIGIN), reporter=P.Quiet(), connect=lambda h: remote, now=lambda: NOW,
                   make_run=runs(token=second))
    remote.assert_done()
    assert o.result == "pushed", o.error
    assert '"action":"lock-break"' in remote.sent[-1] and '"result":"pushed"' in remote.sent[-1]


def test_a_download_on_the_host_runs_under_the_lock_and_commits_with_the_unlock():
    """model_source.hf: the download into the staging folder, its hashing and the commit run under the host's
    deploy lock; the commit (no owner stamp to check: the host wrote the copy itself), its audit line and the
    unlock are one round trip."""
    from llmfleet.release import store

    mp = "/srv/q"
    origin = P.Origin("hf", "Qwen/Q", "a" * 40)
    job = P.Job(Host("h1"), HostSettings(root=ROOT), mp, ["chat"], origin, "vllm", "reg/vllm@sha256:" + "ab" * 32)
    nothing = probe_out()
    remote = FakeRemote([
        Command(S.probe_script(mp), out=nothing),
        locked_probe(mp, chain_answer(("@@acquired", 0), (nothing, 0)),
                     {**holder_of(mp=mp), "message": f"{mp} from {origin.describe()}"}),
        Command(S.hf_download_script(job.image, "Qwen/Q", "a" * 40, mp, "dir"), out=""),
        Command(S.hash_script(mp, "dir"), out=f"@@hash 10 {SHA} config.json"),
        Command(None, out="@@manifest-written\n@@committed\n@@released")])
    o = P.push_job(job, None, config=None, options=P.Options(who=ORIGIN), reporter=P.Quiet(),
                   connect=lambda h: remote, now=lambda: NOW, make_run=runs())
    remote.assert_done()
    assert o.result == "downloaded", o.error
    last = remote.sent[-1]
    assert "@@staging-taken" not in last and '"result":"downloaded"' in last
    assert last.rstrip().endswith(store.lock_release_script(ROOT, TOKEN) + "\n)")
