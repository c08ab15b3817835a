"""Releases on a host: ids, manifests, the remote scripts run by a real sh in a scratch root.

The scripts are what deploy sends over SSH; here they run locally under ``sh`` against a temporary
root, so their behaviour (atomic upload, lock refusal, state read-back, pruning, quoting of hostile
values) is tested without a host. systemctl and docker are absent here: the scripts must cope.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from llmfleet.images.lock import ImageLock, LockedImage, resolve
from llmfleet.inventory.services import host_settings
from llmfleet.knowledge import release_state
from llmfleet.knowledge.planner import PlanSummary
from llmfleet.knowledge.release_state import Manifest
from llmfleet.release import decide as Dc
from llmfleet.release import store as R
from llmfleet.release.manifest import build as manifest_build
from llmfleet.release.render import render

DIGEST = "sha256:" + "cd" * 32
LOCK = ImageLock(images={"llamacpp:b1": LockedImage("llamacpp:b1", "reg.lab:5000/llamacpp", DIGEST, "b1")})
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def sh(script: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], input=stdin, capture_output=True, timeout=30)


def rendered(**svc):
    base = {"name": "chat", "engine": "llamacpp", "model": "tiny", "model_path": "/srv/models/t.gguf",
            "image": "llamacpp:b1", "port": 8080}
    base.update(svc)
    hs = host_settings("h1", {"llmfleet_services": [base]})
    s = hs.services[0]
    return render(s, hs, resolve(s.image, LOCK), PlanSummary(engine_args=("-ngl", "99")),
                  api_key="sk-secret-123" if s.api_key else None)


def upload(root: Path, r, rid: str) -> subprocess.CompletedProcess:
    m = manifest_build(r, rid, host="h1", who="ops", when=NOW, llmfleet_version="0")
    files, modes = R.release_files(r, m)
    return sh(R.upload_script(R.Paths(str(root), r.service), rid), R.pack_release(files, modes))


# ---------------------------------------------------------------------------------------------
# ids


@pytest.mark.parametrize(
    ("when", "h", "expected"),
    [
        (NOW, "0123456789abcdef", "20261129T120000Z-0123456789"),
        (datetime(2026, 1, 2, 3, 4, 5), "ffffffffff00", "20260102T030405Z-ffffffffff"),
        (datetime(2026, 1, 2, 4, 4, 5, tzinfo=UTC).astimezone(), "aaaaaaaaaa", "20260102T040405Z-aaaaaaaaaa"),
    ],
)
def test_release_ids_are_utc_and_sortable(when, h, expected):
    rid = R.new_release_id(h, when)
    assert rid == expected
    assert release_state.RELEASE_ID_RE.match(rid)
    assert release_state.release_time(rid).tzinfo is not None


@pytest.mark.parametrize("bad", ["../etc", "20261129T120000Z-zz", "x; rm -rf /", "", "20261129T120000Z-0123456789/.."])
def test_paths_refuse_anything_but_a_release_id(bad):
    with pytest.raises(ValueError):
        R.Paths("/opt/llmfleet", "chat").release(bad)


# ---------------------------------------------------------------------------------------------
# manifest and upload


def test_manifest_never_holds_the_secret():
    r = rendered(api_key={"from_env": "CHAT_KEY"})
    m = manifest_build(r, "20261129T120000Z-0123456789", host="h1", who="ops", when=NOW, llmfleet_version="0")
    text = m.to_text()
    assert "sk-secret-123" not in text
    assert "service.env" not in m.files  # not even its hash
    assert m.digest == DIGEST and m.content_hash == r.content_hash
    assert Manifest.parse(text) == m  # one writer, one reader
    assert text.count("\n") == 1 and json.loads(text)["inputs"]["api_key"] == {"from_env": "CHAT_KEY"}


def test_upload_is_atomic_with_modes_and_idempotent(tmp_path):
    r = rendered(api_key={"from_env": "CHAT_KEY"})
    rid = "20261129T120000Z-0123456789"
    p = upload(tmp_path, r, rid)
    assert p.returncode == 0, p.stderr
    assert b"@@uploaded" in p.stdout
    d = tmp_path / "services/chat/releases" / rid
    assert (d / "compose.yml").read_text() == r.files["compose.yml"]
    assert oct((d / "service.env").stat().st_mode & 0o777) == "0o600"
    assert oct(d.stat().st_mode & 0o777) == "0o750"
    assert not list((tmp_path / "services/chat/releases").glob(".tmp-*"))
    # the same id again leaves the release as it is
    (d / "marker").write_text("x")
    p2 = upload(tmp_path, r, rid)
    assert b"@@exists" in p2.stdout and (d / "marker").exists()


def test_interrupted_upload_is_never_visible_under_its_id(tmp_path):
    r = rendered()
    rid = "20261129T120000Z-0123456789"
    # a truncated tar (the connection dropped mid-upload)
    m = manifest_build(r, rid, host="h1", who="ops", when=NOW, llmfleet_version="0")
    data = R.pack_release(*R.release_files(r, m))
    p = sh(R.upload_script(R.Paths(str(tmp_path), "chat"), rid), data[: len(data) // 3])
    assert p.returncode != 0
    assert not (tmp_path / "services/chat/releases" / rid).exists()
    # a failed extraction removes its half-written folder (it would hold space on a full disk)
    assert not list((tmp_path / "services/chat/releases").glob(".tmp-*"))
    # a leftover of a connection cut before the shell noticed (another id) goes with the next upload
    (tmp_path / "services/chat/releases/.tmp-20261129T100000Z-9999999999").mkdir()
    # the next upload completes it
    assert upload(tmp_path, r, rid).returncode == 0
    assert (tmp_path / "services/chat/releases" / rid / "manifest.json").exists()
    assert not list((tmp_path / "services/chat/releases").glob(".tmp-*"))


# ---------------------------------------------------------------------------------------------
# state read-back


def test_state_script_reads_back_releases_current_and_health(tmp_path):
    r = rendered()
    ids = ["20261129T110000Z-aaaaaaaaaa", "20261129T120000Z-bbbbbbbbbb"]
    for rid in ids:
        assert upload(tmp_path, r, rid).returncode == 0
    sdir = tmp_path / "services/chat"
    os.symlink(f"releases/{ids[1]}", sdir / "current")
    assert sh(R.mark_healthy_script(R.Paths(str(tmp_path), "chat"), ids[0], {"result": "healthy", "tokps": 9.5})).returncode == 0
    p = sh(R.state_script(str(tmp_path)))
    st = release_state.parse_state(p.stdout.decode())
    assert set(st) == {"chat"}
    s = st["chat"]
    assert s.current == ids[1]
    assert sorted(s.releases) == ids
    assert s.releases[ids[0]].healthy and not s.releases[ids[1]].healthy
    assert s.releases[ids[1]].manifest.content_hash == r.content_hash
    assert s.releases[ids[1]].image_ref == f"reg.lab:5000/llamacpp@{DIGEST}"
    assert Dc.find_release_with_content(s, r.content_hash) == ids[1]
    assert Dc.find_release_with_content(s, "0" * 64) is None
    # no systemctl here: unit state is reported, not a crash
    assert s.unit in {"unknown", "inactive"}


def test_state_of_an_empty_host(tmp_path):
    assert release_state.parse_state(sh(R.state_script(str(tmp_path / "nothing"))).stdout.decode()) == {}


def _state(releases: dict[str, bool], current: str | None) -> release_state.ServiceState:
    s = release_state.ServiceState(name="chat", current=current)
    for rid, healthy in releases.items():
        s.releases[rid] = release_state.ReleaseInfo(rid, None, {"result": "healthy"} if healthy else None)
    return s


A, B, C, D = (f"20261129T1{i}0000Z-aaaaaaaaaa" for i in range(4))


@pytest.mark.parametrize(
    ("releases", "current", "exclude", "expected"),
    [
        ({A: True, B: True, C: True}, C, None, B),       # the one before current
        ({A: True, B: False, C: True}, C, None, A),      # skip an unhealthy one
        ({A: True, B: True, C: False}, C, None, B),      # current failed: newest healthy before it
        ({A: False, B: False}, B, None, None),           # nothing healthy to go back to
        ({A: True, B: True, C: True}, A, None, C),       # current is the oldest: newest healthy other
        ({A: True, B: True, C: True}, C, B, A),          # before an explicit pivot
    ],
)
def test_rollback_target(releases, current, exclude, expected):
    assert Dc.rollback_target(_state(releases, current), exclude=exclude) == expected


# ---------------------------------------------------------------------------------------------
# pruning


@pytest.mark.parametrize(
    ("ids", "keep", "protect", "expected"),
    [
        ([A, B, C, D], 5, set(), []),
        ([A, B, C, D], 2, set(), [A, B]),
        ([A, B, C, D], 2, {A}, [B]),             # the rollback target (or current) is never pruned
        ([A, B, C, D], 1, {B, None}, [A, C]),
    ],
)
def test_releases_to_prune(ids, keep, protect, expected):
    assert Dc.releases_to_prune(ids, keep=keep, protect=protect) == expected


def test_images_to_prune_keeps_images_any_kept_release_uses():
    def info(rid, ref):
        return release_state.ReleaseInfo(rid, Manifest(release=rid, service="a", image={"ref": ref}))

    st = {
        "a": release_state.ServiceState("a", A, releases={A: info(A, "img@1"), B: info(B, "img@2"), C: info(C, "img@3")}),
        "b": release_state.ServiceState("b", D, releases={D: info(D, "img@2")}),
    }
    assert Dc.images_to_prune(st, {"a": [B, C]}) == ["img@3"]


def test_prune_script_removes_releases_and_leftovers(tmp_path):
    r = rendered()
    for rid in (A, B):
        upload(tmp_path, r, rid)
    (tmp_path / "services/chat/releases/.tmp-x").mkdir()
    p = sh(R.prune_script(R.Paths(str(tmp_path), "chat"), [A]))
    assert p.returncode == 0 and b"@@pruned" in p.stdout
    assert sorted(os.listdir(tmp_path / "services/chat/releases")) == [B]


# ---------------------------------------------------------------------------------------------
# the lock


def _holder(token: str, msg: str = "rolling out") -> dict:
    return R.holder_document(token=token, who="alice", origin="alice@ws1", action="deploy", message=msg,
                             now=NOW, pid=4242)


def test_lock_is_exclusive_and_names_its_holder(tmp_path):
    root = str(tmp_path)
    p1 = sh(R.lock_acquire_script(root, _holder("tok-1")))
    o1 = R.parse_lock_acquire(p1.returncode, p1.stdout.decode())
    assert o1.acquired
    p2 = sh(R.lock_acquire_script(root, _holder("tok-2")))
    o2 = R.parse_lock_acquire(p2.returncode, p2.stdout.decode())
    assert not o2.acquired and p2.returncode == R.LOCK_HELD_RC
    assert o2.holder["who"] == "alice" and o2.holder["message"] == "rolling out"
    text = R.describe_holder(o2.holder, NOW + timedelta(minutes=3, seconds=4))
    assert text == ("held by alice from alice@ws1 (pid 4242) since 2026-11-29T12:00:00+00:00 (3 min 4 s ago) for "
                    "deploy: rolling out")
    # someone else's token cannot release it
    p3 = sh(R.lock_release_script(root, "tok-2"))
    assert p3.returncode == R.LOCK_HELD_RC and b"@@notours" in p3.stdout
    # the holder can
    assert b"@@released" in sh(R.lock_release_script(root, "tok-1")).stdout
    assert R.parse_lock_status(sh(R.lock_status_script(root)).stdout.decode()) == (False, None)


def test_lock_break_and_status(tmp_path):
    root = str(tmp_path)
    sh(R.lock_acquire_script(root, _holder("tok-1", "x'; rm -rf / #")))
    held, holder = R.parse_lock_status(sh(R.lock_status_script(root)).stdout.decode())
    assert held and holder["message"] == "x'; rm -rf / #"
    p = sh(R.lock_break_script(root))
    assert b"@@broken" in p.stdout
    assert sh(R.lock_status_script(root)).stdout.startswith(b"@@free")


def test_a_lock_directory_without_holder_is_still_held(tmp_path):
    (tmp_path / "locks/deploy").mkdir(parents=True)
    p = sh(R.lock_acquire_script(str(tmp_path), _holder("t")))
    o = R.parse_lock_acquire(p.returncode, p.stdout.decode())
    assert not o.acquired and "died while taking it" in R.describe_holder(o.holder)


# ---------------------------------------------------------------------------------------------
# audit, pull parsing, hostile values


def test_audit_lines_append_and_keep_mode(tmp_path):
    root = str(tmp_path)
    for res in ("deployed", "rolled_back"):
        rec = R.audit_record(now=NOW, who="ops", host="h1", action="deploy", service="chat", release=A,
                             digest=DIGEST, result=res, detail="x" * 900)
        assert sh(R.audit_append_script(root, rec)).returncode == 0
    lines = Path(R.audit_path(root)).read_text().splitlines()
    assert [json.loads(ln)["result"] for ln in lines] == ["deployed", "rolled_back"]
    assert len(json.loads(lines[0])["detail"]) == 500
    assert oct(Path(R.audit_path(root)).stat().st_mode & 0o777) == "0o640"


@pytest.mark.parametrize(
    ("stdout", "pulled", "digests"),
    [
        ("@@pulled\n@@digests\nreg/x@sha256:aa\n", True, ["reg/x@sha256:aa"]),
        ("@@digests\nreg/x@sha256:aa\nother/y@sha256:bb\n", False, ["reg/x@sha256:aa", "other/y@sha256:bb"]),
        ("", False, []),
    ],
)
def test_parse_pull(stdout, pulled, digests):
    assert R.parse_pull(stdout) == (pulled, digests)


@pytest.mark.parametrize(
    ("repo_digests", "digest", "ok"),
    [
        ([f"reg/x@{DIGEST}"], DIGEST, True),
        (["reg/x@sha256:" + "00" * 32], DIGEST, False),
        ([], DIGEST, False),
        ([f"reg/x@{DIGEST}"], None, False),
    ],
)
def test_digest_verified(repo_digests, digest, ok):
    assert R.digest_verified(repo_digests, digest) is ok


def test_hostile_values_in_scripts_are_never_executed(tmp_path):
    canary = tmp_path / "pwned"
    hostile = f"$(touch {canary}); `touch {canary}`; ' \" \\ ; touch {canary}"
    rec = R.audit_record(now=NOW, who=hostile, host="h1", action="deploy", service="chat", release=None,
                         digest=None, result="failed", detail=hostile)
    sh(R.audit_append_script(str(tmp_path), rec))
    sh(R.lock_acquire_script(str(tmp_path), _holder(hostile, hostile)))
    sh(R.mark_healthy_script(R.Paths(str(tmp_path), "chat"), A, {"note": hostile}))
    sh(R.pull_script(f"reg/x@{DIGEST}; touch {canary}"))
    sh(R.image_present_script(f"x'; touch {canary}; '"))
    sh(R.image_remove_script([f"$(touch {canary})"]))
    sh(R.state_script(f"{tmp_path}/$(touch {canary})"))
    sh(R.lock_release_script(str(tmp_path), hostile))
    assert not canary.exists()
    assert json.loads(Path(R.audit_path(str(tmp_path))).read_text())["who"] == hostile


def test_the_state_reader_skips_hostile_names_on_the_host(tmp_path):
    canary = tmp_path / "pwned"
    evil = tmp_path / "services" / f"$(touch {canary})" / "releases"
    evil.mkdir(parents=True)
    good = tmp_path / "services/chat/releases"
    (good / A).mkdir(parents=True)
    (good / A / "manifest.json").write_text('{"release": "x"}\n@@service fake\n')
    (good / "20261129T100000Z-aaaaaaaaaa\n@@release x").mkdir()
    out = sh(R.state_script(str(tmp_path))).stdout.decode()
    assert not canary.exists()
    st = release_state.parse_state(out)
    assert set(st) == {"chat"} and set(st["chat"].releases) == {A}
    assert st["chat"].releases[A].manifest is None  # two lines of text are not a JSON object
    assert release_state.state_complete(out)


@pytest.mark.parametrize(
    ("stdout", "unit", "container", "code"),
    [
        ("@@unit active\n@@container running 0 0\n", "active", "running", 0),
        ("@@unit failed\n@@container exited 137 2\n", "failed", "exited", 137),
        ("@@unit \n@@container \n", "unknown", None, None),
        ("", "unknown", None, None),
    ],
)
def test_parse_unit_probe(stdout, unit, container, code):
    assert R.parse_unit_probe(stdout) == R.UnitProbe(unit, container, code)


def test_unit_probe_without_systemd_or_docker_answers_unknown():
    out = sh(R.unit_probe_script(R.Paths("/opt/llmfleet", "chat"))).stdout.decode()
    p = R.parse_unit_probe(out)
    assert p.container is None and p.unit in {"unknown", "inactive"}


def test_lock_release_only_releases_our_own_lock(tmp_path):
    root = str(tmp_path)
    assert R.parse_lock_release(sh(R.lock_release_script(root, "t1")).stdout.decode())  # not held: nothing to do
    sh(R.lock_acquire_script(root, _holder("t1")))
    theirs = sh(R.lock_release_script(root, "t2"))
    assert theirs.returncode == R.LOCK_HELD_RC and not R.parse_lock_release(theirs.stdout.decode())
    assert R.parse_lock_release(sh(R.lock_release_script(root, "t1")).stdout.decode())
    assert not Path(R.lock_dir(root)).exists()


def test_a_chain_runs_its_steps_in_one_shell_and_stops_at_the_first_failure(tmp_path):
    """Several steps in one round trip: the upload's tar goes to its step only; a failed step stops
    the rest (a compose file the engine rejects is never switched to); each step's answer is its own."""
    rid = "20261129T120000Z-0123456789"
    r = rendered()
    files, modes = R.release_files(r, manifest_build(r, rid, host="h1", who="ops", when=NOW, llmfleet_version="0"))
    tar = R.pack_release(files, modes)
    paths = R.Paths(str(tmp_path), "chat")
    marker = tmp_path / "switched"
    steps = [R.upload_script(paths, rid), "wc -c; echo '@@armed 60'", "echo nope; exit 5", f"touch {marker}"]
    res = subprocess.run(["sh", "-c", R.chain_script(steps, stdin_step=0)], input=tar, capture_output=True, timeout=30)
    assert res.returncode == 5
    parts = R.split_chain(res.stdout.decode(), len(steps))
    assert parts[0] == (0, "@@uploaded\n") and R.parse_upload(0, parts[0][1])
    assert parts[1] == (0, "0\n@@armed 60\n")  # read /dev/null, not the rest of the tar
    assert parts[2] == (5, "nope\n") and parts[3] is None and not marker.exists()
    assert (tmp_path / "services" / "chat" / "releases" / rid / "manifest.json").exists()


@pytest.mark.parametrize(("installed", "need_reload", "reloads"), [
    (None, "no", True),                 # first switch: no unit file yet
    ("[Service]\nOld=1\n", "no", True),  # a release with another unit file
    ("[Service]\n", "no", False),        # the same unit file, loaded: no reload (a second or more on a busy host)
    ("[Service]\n", "yes", True),        # the same file, but systemd has not loaded it
])
def test_switch_reloads_systemd_only_for_a_new_unit_file(tmp_path, installed, need_reload, reloads):
    paths = R.Paths(str(tmp_path / "root"), "chat")
    rid = "20261129T120000Z-0123456789"
    rel = Path(paths.release(rid))
    rel.mkdir(parents=True)
    (rel / "compose.yml").write_text("services: {}\n")
    (rel / "llmfleet-chat.service").write_text("[Service]\n")
    unit = tmp_path / "etc" / "llmfleet-chat.service"
    unit.parent.mkdir()
    if installed is not None:
        unit.write_text(installed)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "systemctl $*" >> {tmp_path}/calls\n'
                                       f'case "$1" in show) echo {need_reload};; esac\n')
    (bin_dir / "systemctl").chmod(0o755)
    script = R.switch_script(paths, rid).replace(paths.unit_path, str(unit))
    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert R.parse_switch(res.returncode, res.stdout), res.stderr
    called = (tmp_path / "calls").read_text().splitlines()
    assert ("systemctl daemon-reload" in called) is reloads
    assert unit.read_text() == "[Service]\n"
    assert "systemctl enable --no-reload llmfleet-chat.service" in called and called[-1] == \
        "systemctl restart llmfleet-chat.service"


@pytest.mark.parametrize(("same", "reloads"), [(False, True), (True, False)])
def test_the_watchdog_is_started_with_a_reload_only_for_new_unit_files(tmp_path, same, reloads):
    from llmfleet.health import watchdog

    sdir = tmp_path / "services" / "chat"
    cur = sdir / "current"
    cur.mkdir(parents=True)
    units = tmp_path / "etc"
    units.mkdir()
    for name in ("llmfleet-chat-watchdog.service", "llmfleet-chat-watchdog.timer"):
        (cur / name).write_text(f"[Unit]\n# {name}\n")
        (units / name).write_text(f"[Unit]\n# {name}\n" if same else "[Unit]\n# older\n")
    (cur / "watchdog.sh").write_text("#!/bin/sh\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "systemctl $*" >> {tmp_path}/calls\n'
                                       'case "$1" in show) echo no; echo no;; esac\n')
    (bin_dir / "systemctl").chmod(0o755)
    res = subprocess.run(["sh", "-c", watchdog.install_snippet(str(sdir), "chat", unit_dir=str(units))],
                         capture_output=True, text=True, timeout=30, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert "@@watchdog-on" in res.stdout, res.stderr
    called = (tmp_path / "calls").read_text().splitlines()
    assert ("systemctl daemon-reload" in called) is reloads
    assert (units / "llmfleet-chat-watchdog.timer").read_text() == "[Unit]\n# llmfleet-chat-watchdog.timer\n"
    assert "systemctl enable --no-reload llmfleet-chat-watchdog.timer" in called


def test_the_state_parse_ends_at_the_readers_end_mark():
    """``invoke status`` prints each model's manifest after the release state, with ``@@manifest``
    lines of its own: they must not overwrite the last release's manifest."""

    rid = "20261102T100000Z-bbbbbbbbbb"
    text = (f"@@service chat\n@@current releases/{rid}\n@@unit active\n@@release {rid}\n"
            '@@manifest {"release": "%s", "service": "chat"}\n@@health {"result": "unhealthy"}\n@@end\n'
            "@@model-of 0\n@@kind missing\n@@manifest none\n@@health {}\n" % rid)
    info = release_state.parse_state(text)["chat"].releases[rid]
    assert info.manifest is not None and info.manifest.release == rid
    assert info.health == {"result": "unhealthy"}
