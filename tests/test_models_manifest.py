"""knowledge.model_manifest: where it lives, building it here, reading it back from whatever a host printed, comparing,
and the verdict preflight and status give."""

from __future__ import annotations

import hashlib
import json

import pytest

from llmfleet.knowledge import model_manifest as M
from llmfleet.models import local as L

SHA = "ab" * 32


def doc(**over) -> dict:
    d = {"llmfleet_model_manifest": 1, "model_path": "/srv/m.gguf", "kind": "file",
         "files": [{"path": "m.gguf", "size": 10, "sha256": SHA, "observed": {"size": 10, "mtime": 100}}],
         "total_size": 10, "source": {"path": "/data/m.gguf"}, "verified_at": "2026-11-29T12:00:00+00:00",
         "verified_by": "alice@ops"}
    d.update(over)
    return d


@pytest.mark.parametrize(("model_path", "manifest", "part"), [
    ("/srv/m.gguf", "/srv/m.gguf.llmfleet.json", "/srv/m.gguf.llmfleet.part"),
    ("/srv/qwen/", "/srv/qwen.llmfleet.json", "/srv/qwen.llmfleet.part"),
    ("/srv/qwen", "/srv/qwen.llmfleet.json", "/srv/qwen.llmfleet.part"),
])
def test_the_manifest_sits_beside_the_model(model_path, manifest, part):
    assert M.manifest_path(model_path) == manifest
    assert M.part_path(model_path) == part


def test_a_written_manifest_reads_back_equal():
    m, problems = M.parse(json.dumps(doc()))
    assert problems == []
    assert m.kind == "file" and m.files[0] == M.FileEntry("m.gguf", 10, SHA, 10, 100)
    again, _ = M.parse(m.to_json())
    assert again == m and again.total_size == 10


@pytest.mark.parametrize(("text", "problem"), [
    (None, "no manifest"),
    ("{not json", "manifest is not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps(doc(llmfleet_model_manifest=2)), "format 2 is not 1"),
    (json.dumps(doc(files=[])), "files is missing or empty"),
    (json.dumps(doc(files=[{"path": "../etc/passwd", "size": 1, "sha256": SHA}])), "'..' component"),
    (json.dumps(doc(files=[{"path": "/abs", "size": 1, "sha256": SHA}])), "not a relative path"),
    (json.dumps(doc(files=[{"path": "a\nb", "size": 1, "sha256": SHA}])), "newline"),
    (json.dumps(doc(files=[{"path": "m.gguf", "size": -1, "sha256": SHA}])), "size is not a non-negative integer"),
    (json.dumps(doc(files=[{"path": "m.gguf", "size": 10, "sha256": "XYZ"}])), "64 lowercase hex"),
    (json.dumps(doc(total_size=11)), "total_size 11 is not the sum"),
    (json.dumps(doc(kind="dir", files=[{"path": "a", "size": 5, "sha256": SHA}, {"path": "a", "size": 5, "sha256": SHA}],
                    total_size=10)), "a is listed twice"),
    ("x" * (M.MAX_MANIFEST_BYTES + 1), "over"),
])
def test_a_bad_manifest_is_no_manifest_with_the_reason(text, problem):
    m, problems = M.parse(text)
    assert m is None
    assert problem in "; ".join(problems)


def test_build_local_hashes_a_file_and_a_folder(tmp_path):
    f = tmp_path / "local-name.gguf"
    f.write_bytes(b"GGUF" + b"x" * 1000)
    seen: list[int] = []
    m = L.build_local(str(f), "/srv/models/m.gguf", progress=seen.append)
    assert m.kind == "file" and m.model_path == "/srv/models/m.gguf"
    assert m.files == (M.FileEntry("m.gguf", 1004, hashlib.sha256(f.read_bytes()).hexdigest()),)  # the host's name
    assert sum(seen) == 1004
    d = tmp_path / "hf"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "sub" / "w.safetensors").write_bytes(b"w" * 10)
    md = L.build_local(str(d), "/srv/models/qwen")
    assert [(x.path, x.size) for x in md.files] == [("config.json", 2), ("sub/w.safetensors", 10)]
    assert md.content_digest != m.content_digest and len(md.content_digest) == 32


def test_build_local_refuses_what_a_host_script_cannot_carry(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "bad\\name").write_text("x")
    with pytest.raises(ValueError, match="backslash"):
        L.build_local(str(d), "/srv/q")
    with pytest.raises(ValueError, match="neither a file nor a folder"):
        L.local_files(str(tmp_path / "absent"))


def test_the_content_ignores_path_source_and_verification():
    m, _ = M.parse(json.dumps(doc()))
    other = M.Manifest("/other/x.gguf", "file", (M.FileEntry("x.gguf", 10, SHA),), {"host": "h"})
    assert m.for_path("/other/x.gguf").content == other.content
    assert m.content != other.content  # the file's name is part of it


@pytest.mark.parametrize(("observed", "state", "status", "file"), [
    ({"m.gguf": (10, 100)}, "verified", "pass", None),
    ({"m.gguf": (10, 101)}, "changed", "fail", "/srv/m.gguf"),
    ({"m.gguf": (11, 100)}, "changed", "fail", "/srv/m.gguf"),
    ({}, "missing", "fail", "/srv/m.gguf"),
])
def test_the_verdict_by_size_and_mtime(observed, state, status, file):
    v = M.judge("/srv/m.gguf", json.dumps(doc()), observed)
    assert (v.state, v.status, v.file) == (state, status, file)
    if state == "changed":
        assert v.message.startswith("model file /srv/m.gguf changed since it was verified (size/mtime) or its "
                                    "sha256 does not match its manifest")
    if state == "verified":
        assert "verified 2026-11-29T12:00:00+00:00" in v.message


def test_a_folder_names_the_changed_file_and_a_hand_copy_is_a_warning():
    d = doc(model_path="/srv/q", kind="dir", total_size=15, files=[
        {"path": "config.json", "size": 5, "sha256": SHA, "observed": {"size": 5, "mtime": 1}},
        {"path": "w/model.safetensors", "size": 10, "sha256": SHA, "observed": {"size": 10, "mtime": 1}}])
    v = M.judge("/srv/q", json.dumps(d), {"config.json": (5, 1), "w/model.safetensors": (10, 2), "extra.md": (1, 1)})
    assert v.status == "fail" and v.file == "/srv/q/w/model.safetensors"
    hand = M.judge("/srv/q", None, {"config.json": (5, 1)})
    assert (hand.status, hand.state) == ("warn", "no-manifest")
    assert "no manifest: push it with `invoke models.push`" in hand.message
    bad = M.judge("/srv/q", "{", {})
    assert (bad.status, bad.state) == ("warn", "unreadable")


def test_compare_with_a_wanted_manifest():
    held, _ = M.parse(json.dumps(doc()))
    same = M.compare(held, {"m.gguf": (10, 100)}, held.for_path("/srv/m.gguf"))
    assert same.same_content and same.intact
    other = M.Manifest("/srv/m.gguf", "file", (M.FileEntry("m.gguf", 10, "cd" * 32),))
    assert not M.compare(held, {"m.gguf": (10, 100)}, other).same_content
