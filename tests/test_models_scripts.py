"""The push's remote scripts, run in a real ``sh`` on a scratch folder, read back by their parsers: the probe
(model, manifest, staging copy, free space), receive, prepare, verify, commit (a cut-short or corrupt copy
never reaches model_path), cleanup, hash. Their exact text is pinned in tests/golden/scripts/models_*.sh."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from llmfleet.host import model_scripts as S
from llmfleet.knowledge import model_manifest as M


def sh(script: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], input=stdin, capture_output=True, timeout=60)


def out(res: subprocess.CompletedProcess) -> str:
    return res.stdout.decode()


def wanted_file(mp: str, data: bytes) -> M.Manifest:
    return M.Manifest(mp, "file", (M.FileEntry(os.path.basename(mp), len(data), hashlib.sha256(data).hexdigest()),),
                      {"path": "/data/x"})


def test_the_probe_of_an_empty_place(tmp_path):
    mp = str(tmp_path / "models" / "m it's.gguf")  # its folder does not exist yet
    pp = S.parse_probe(out(sh(S.probe_script(mp))), mp)
    assert pp.complete and pp.model.kind == "missing" and pp.model.manifest_text is None
    assert pp.part_kind == "none" and pp.parts == {} and pp.want is None
    assert pp.fs_path == str(tmp_path) and pp.free_bytes and pp.free_bytes > 0
    assert pp.tools == {"sha256sum": True, "python3": True, "stat": True, "truncate": True}


def test_receive_prepare_verify_commit_a_file_model(tmp_path):
    mp = str(tmp_path / "m.gguf")
    data = b"GGUF" + os.urandom(5000)
    want = wanted_file(mp, data)
    assert S.parse_prepared(out(sh(S.prepare_script(mp, "file", want.content_digest, reset=True))))
    part = S.staging_file(mp, "file", "m.gguf")
    res = sh(S.receive_script(part, 0), data[:3000])  # cut short
    assert res.returncode == 0 and S.parse_received(out(res)) == 3000
    pp = S.parse_probe(out(sh(S.probe_script(mp))), mp)
    assert (pp.part_kind, pp.parts, pp.want) == ("file", {"m.gguf": 3000}, want.content_digest)
    assert pp.model.kind == "missing"  # nothing at model_path while it arrives
    res = sh(S.receive_script(part, 3000), data[3000:])
    assert S.parse_received(out(res)) == len(data)
    final = want.verified(at="2026-11-29T12:00:00+00:00", by="t")
    res = sh(S.verify_script(mp, want) + "\n" + S.commit_script(mp, "file"), final.to_json().encode())
    assert res.returncode == 0, res.stderr
    assert S.parse_verify(out(res)) == (["m.gguf"], {}) and S.parse_committed(out(res))
    assert open(mp, "rb").read() == data and not os.path.exists(part) and not os.path.exists(M.want_path(mp))
    assert oct(os.stat(mp).st_mode & 0o777) == "0o644"
    written = json.loads(open(M.manifest_path(mp)).read())
    st = os.stat(mp)
    assert written["files"][0]["observed"] == {"size": len(data), "mtime": int(st.st_mtime)}
    # the probe now reads it back, verified
    pp = S.parse_probe(out(sh(S.probe_script(mp))), mp)
    held, problems = pp.model.manifest()
    assert problems == [] and M.compare(held, pp.model.files, want).intact
    assert M.judge(mp, pp.model.manifest_text, pp.model.files).state == "verified"


def test_a_corrupt_staging_copy_is_removed_and_the_old_model_stays(tmp_path):
    mp = str(tmp_path / "m.gguf")
    old = b"GGUF old model"
    open(mp, "wb").write(old)
    data = b"GGUF" + b"n" * 100
    want = wanted_file(mp, data)
    part = S.staging_file(mp, "file", "m.gguf")
    sh(S.receive_script(part, 0), data[:-1] + b"X")  # one byte wrong
    res = sh(S.verify_script(mp, want) + "\n" + S.commit_script(mp, "file"), b"{}")
    assert res.returncode == S.VERIFY_FAILED_RC
    ok, bad = S.parse_verify(out(res))
    assert ok == [] and list(bad) == ["m.gguf"]
    assert open(mp, "rb").read() == old and not os.path.exists(part)  # model untouched, bad part gone


def test_a_staging_copy_another_writer_took_is_never_written_nor_checked(tmp_path):
    """The owner stamp: a push writes and commits its staging copy only while the stamp holds its token;
    a copy restamped (another push took it) or removed stops it, naming what it found, and the other
    writer's bytes stay as they are."""
    mp = str(tmp_path / "m.gguf")
    data = b"GGUF" + os.urandom(3000)
    want = wanted_file(mp, data)
    mine, theirs = "a" * 32, "b" * 32
    part = S.staging_file(mp, "file", "m.gguf")
    owned = (M.owner_path(mp), mine)
    assert S.parse_prepared(out(sh(S.prepare_script(mp, "file", want.content_digest, reset=True, owner=mine))))
    res = sh(S.receive_script(part, 0, owner=owned), data[:1000])
    assert res.returncode == 0 and S.parse_received(out(res)) == 1000 and S.parse_staging_taken(out(res)) is None
    # another push takes the staging copy (its own stamp, its own bytes)
    sh(S.prepare_script(mp, "file", want.content_digest, reset=True, owner=theirs))
    sh(S.receive_script(part, 0, owner=(M.owner_path(mp), theirs)), b"theirs")
    res = sh(S.receive_script(part, 1000, owner=owned), data[1000:])
    assert res.returncode == S.STAGING_TAKEN_RC and S.parse_staging_taken(out(res)) == theirs
    assert open(part, "rb").read() == b"theirs"
    # the commit's first step refuses before verify could remove the other writer's file
    holder = tmp_path / "holder.json"
    holder.write_text(json.dumps({"token": mine}))
    commit = "\n".join([S.owner_check_script(mp, mine, str(holder)), S.verify_script(mp, want),
                        S.commit_script(mp, "file")])
    res = sh(commit, b"{}")
    assert res.returncode == S.STAGING_TAKEN_RC and S.parse_staging_taken(out(res)) == theirs
    assert open(part, "rb").read() == b"theirs" and not os.path.exists(mp)
    # its own stamp again, but the deploy lock is no longer its own (broken, or someone else's): no commit
    sh(f"printf '%s\\n' {mine} > '{M.owner_path(mp)}'")
    holder.write_text(json.dumps({"token": theirs}))
    res = sh(commit, b"{}")
    assert res.returncode == S.STAGING_TAKEN_RC and S.parse_lock_lost(out(res)) and S.parse_staging_taken(out(res)) is None
    assert open(part, "rb").read() == b"theirs" and not os.path.exists(mp)
    # removed by hand: no stamp at all
    sh(S.cleanup_script(mp))
    res = sh(S.receive_script(part, 0, owner=owned), data)
    assert res.returncode == S.STAGING_TAKEN_RC and S.parse_staging_taken(out(res)) == "none"
    assert not os.path.exists(part)


def test_a_staging_file_replaced_while_it_is_written_is_named(tmp_path):
    """Same stamp, but the file written to was swapped for another mid-copy (rm and a new file): the
    receive says so instead of reporting a size that is not its own."""
    import time

    mp = str(tmp_path / "m.gguf")
    mine = "a" * 32
    part = S.staging_file(mp, "file", "m.gguf")
    sh(S.prepare_script(mp, "file", "0" * 32, reset=True, owner=mine))
    proc = subprocess.Popen(["sh", "-c", S.receive_script(part, 0, owner=(M.owner_path(mp), mine))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write(b"x" * 100)
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    while (not os.path.exists(part) or os.path.getsize(part) < 100) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.remove(part)
    open(part, "wb").write(b"someone else")
    proc.stdin.write(b"y" * 100)
    proc.stdin.close()
    stdout = proc.stdout.read().decode()
    assert proc.wait(timeout=30) == S.STAGING_TAKEN_RC
    assert S.parse_staging_taken(stdout) == "replaced" and open(part, "rb").read() == b"someone else"


def test_a_resume_point_past_the_staging_file_is_refused(tmp_path):
    part = str(tmp_path / "p")
    open(part, "wb").write(b"abc")
    res = sh(S.receive_script(part, 10), b"more")
    assert res.returncode == S.RESUME_LOST_RC and S.parse_resume_lost(out(res)) == 3
    assert open(part, "rb").read() == b"abc"


def test_a_folder_model_replaces_the_old_folder_and_links_what_it_keeps(tmp_path):
    mp = str(tmp_path / "qwen")
    os.makedirs(mp)
    open(f"{mp}/config.json", "w").write("{}")
    open(f"{mp}/stale.bin", "w").write("old weights")
    files = {"config.json": b"{}", "w/model.safetensors": b"weights" * 100}
    want = M.Manifest(mp, "dir", tuple(M.FileEntry(p, len(b), hashlib.sha256(b).hexdigest())
                                       for p, b in sorted(files.items())))
    res = sh(S.verify_script(mp, want, in_place=True))
    ok, bad = S.parse_verify(out(res))
    assert res.returncode == S.VERIFY_FAILED_RC and ok == ["config.json"] and list(bad) == ["w/model.safetensors"]
    sh(S.prepare_script(mp, "dir", want.content_digest, reset=True, link=("config.json",)))
    res = sh(S.receive_script(S.staging_file(mp, "dir", "w/model.safetensors"), 0), files["w/model.safetensors"])
    assert res.returncode == 0
    pp = S.parse_probe(out(sh(S.probe_script(mp))), mp)
    assert pp.part_kind == "dir" and pp.parts == {"config.json": 2, "w/model.safetensors": 700}
    final = want.verified(at="2026-11-29T12:00:00+00:00", by="t")
    res = sh(S.verify_script(mp, want) + "\n" + S.commit_script(mp, "dir"), final.to_json().encode())
    assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(mp)) == ["config.json", "w"]  # the old folder's stale file went with it
    assert oct(os.stat(f"{mp}/w").st_mode & 0o777) == "0o755"
    pp = S.parse_probe(out(sh(S.probe_script(mp))), mp)
    assert M.judge(mp, pp.model.manifest_text, pp.model.files).state == "verified"
    assert not os.path.exists(M.part_path(mp)) and not os.path.exists(mp + ".llmfleet.old")
    # hash_script reads what a copy holds without a manifest
    sh(S.prepare_script(mp, "dir", "x", reset=True))
    sh(S.receive_script(S.staging_file(mp, "dir", "a b.json"), 0), b"hi")
    assert S.parse_hashes(out(sh(S.hash_script(mp, "dir")))) == [("a b.json", 2, hashlib.sha256(b"hi").hexdigest())]
    assert "@@cleaned" in out(sh(S.cleanup_script(mp)))
    assert not os.path.exists(M.part_path(mp))


def test_in_place_commit_writes_only_the_manifest(tmp_path):
    mp = str(tmp_path / "m.gguf")
    data = b"GGUF hand copied"
    open(mp, "wb").write(data)
    want = wanted_file(mp, data)
    res = sh(S.verify_script(mp, want, in_place=True) + "\n" + S.commit_script(mp, "file", move=False),
             want.verified(at="t", by="b").to_json().encode())
    assert res.returncode == 0 and S.parse_committed(out(res))
    assert open(mp, "rb").read() == data and os.path.exists(M.manifest_path(mp))


@pytest.mark.parametrize(("printed", "kind", "files", "manifest"), [
    ("@@kind file\n@@file 10 100 m.gguf\n@@manifest none\n", "file", {"m.gguf": (10, 100)}, None),
    ("@@kind dir\n@@file 5 1 a b/c d.json\n@@manifest begin\n{\"x\": 1}\n\n@@manifest end\n", "dir",
     {"a b/c d.json": (5, 1)}, '{"x": 1}'),
    ("@@kind dir\n@@file garbage\n@@file 5 x y\n@@manifest begin\n{cut", "dir", {}, "{cut"),
    ("nothing at all", "unknown", {}, None),
])
def test_the_reader_parser_never_raises(printed, kind, files, manifest):
    hm = S.parse_reader(printed, "/m")
    assert (hm.kind, hm.files, hm.manifest_text) == (kind, files, manifest)


def test_the_host_probe_reads_the_manifest_and_the_preflight_judges_it(tmp_path):
    """The whole host probe (host/probe), run in sh: its model_manifest section lands in Facts, and the
    preflight's model-verified check passes the verified copy, then fails it naming the changed file."""
    from llmfleet.host import facts as facts_mod
    from llmfleet.host.probe import new_mark, probe_command, probe_sh
    from llmfleet.inventory.services import Service
    from llmfleet.knowledge.preflight import model_verified_check

    mp = str(tmp_path / "m.gguf")
    data = b"GGUF" + b"p" * 500
    open(mp, "wb").write(data)
    want = wanted_file(mp, data)
    sh(S.commit_script(mp, "file", move=False), want.verified(at="2026-11-29T12:00:00+00:00", by="t").to_json().encode())
    svc = Service(name="chat", engine="llamacpp", model="m", model_path=mp, image="llamacpp:b1")

    def check():
        mark = new_mark()
        res = subprocess.run(probe_command(mark, str(tmp_path / "root"), [mp]), input=probe_sh(), capture_output=True,
                             timeout=120)
        facts = facts_mod.parse_probe_document(res.stdout.decode(), mark, "h1")
        model = facts.model(mp)
        assert model is not None and model.manifest_read
        return model_verified_check("h1", svc, model)

    c = check()
    assert (c.status, c.message.split(" (")[0]) == ("pass", f"{mp}: verified 2026-11-29T12:00:00+00:00")
    os.utime(mp, (5, 5))
    c = check()
    assert c.status == "fail" and c.message.startswith(f"model file {mp} changed since it was verified")
    assert "invoke models.push --host h1 --service chat" in c.fix
    os.remove(M.manifest_path(mp))
    c = check()
    assert (c.status, c.message) == ("warn", f"{mp}: no manifest: push it with `invoke models.push`")
