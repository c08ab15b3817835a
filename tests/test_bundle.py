"""Bundles for air-gapped sites: the archive layout, the top manifest and its checks (pure, table
driven), and bundle.create / bundle.verify end to end against a real registry on loopback."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from llmfleet.bundle import check, load
from llmfleet.bundle import contents as bc
from llmfleet.errors import CheckFailed, UsageError
from llmfleet.images import lock as images
from llmfleet.release import store
from tests.registry_fixture import push_loadable_image, registry_fixture  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parents[1]
D = "sha256:" + "ab" * 32
C = "sha256:" + "cd" * 32
E = "sha256:" + "ef" * 32


def inv(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------
# pure


def test_local_tag_names_the_pin_and_an_image_ref_from_a_bundle_uses_it():
    assert bc.local_tag("lab-registry:5000/lab/x", D) == f"lab-registry:5000/lab/x:sha256-{'ab' * 32}"
    with pytest.raises(UsageError, match="not pinned"):
        bc.local_tag("x", "sha256:short")
    ref = images.ImageRef(key="k", repository="r/x", digest=D, tag="t", pinned=True, upstream_repository="r/x")
    assert ref.pull_ref == f"r/x@{D}"
    loaded = images.ImageRef(key="k", repository="r/x", digest=D, tag="t", pinned=True, upstream_repository="r/x",
                             image_id=C)
    assert loaded.pull_ref == bc.local_tag("r/x", D) and loaded.to_dict()["image_id"] == C


def test_archive_layout_carries_both_formats_over_one_set_of_blobs():
    files = bc.image_layout("r/x:sha256-ab", D, "application/vnd.oci.image.manifest.v1+json", 123, C, [E])
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert (entry["digest"], entry["size"], entry["platform"]) == (D, 123, {"architecture": "amd64", "os": "linux"})
    assert entry["annotations"] == {"io.containerd.image.name": "r/x:sha256-ab", "org.opencontainers.image.ref.name":
                                    "sha256-ab"}
    assert json.loads(files["manifest.json"]) == [{"Config": f"blobs/sha256/{'cd' * 32}", "RepoTags": ["r/x:sha256-ab"],
                                                   "Layers": [f"blobs/sha256/{'ef' * 32}"]}]


@pytest.mark.parametrize("key,name", [("llamacpp:lab-cpu", "images/llamacpp_lab-cpu.tar"),
                                      ("vllm:0.10.1.1", "images/vllm_0.10.1.1.tar")])
def test_archive_name(key, name):
    assert bc.archive_name(key) == name


def _top(**over) -> dict:
    doc = bc.Bundle(created="2026-12-01T00:00:00Z", llmfleet_version="0", lock_sha256=D, built_for={"hosts": ["h"]},
                    images=(bc.BundleImage("llamacpp:x", "r/x", D, C, E, "images/llamacpp_x.tar", "r/x:t", 10),),
                    files=(bc.FileEntry("images/llamacpp_x.tar", 10, D), bc.FileEntry("images.lock", 5, C))).to_dict()
    doc.update(over)
    return doc


def test_top_manifest_round_trips():
    b = bc.parse_bundle(json.dumps(_top()))
    assert b.lock_sha256 == D and b.image("llamacpp:x").image_id == E and not bc.structure_problems(b)
    assert bc.parse_bundle(b.render()).to_dict() == b.to_dict()


@pytest.mark.parametrize(
    "over,match",
    [
        ({"format": "other/1"}, "format 'other/1'"),
        ({"files": [{"path": "../etc/passwd", "size": 1, "sha256": D}]}, "must be relative"),
        ({"files": [{"path": "/abs", "size": 1, "sha256": D}]}, "must be relative"),
        ({"files": [{"path": "a", "size": "1", "sha256": D}]}, r"files\[0\]\.size is missing or not a int"),
        ({"files": [{"path": "a", "size": 1, "sha256": "md5:x"}]}, r"files\[0\]\.sha256 must be sha256"),
        ({"lock": {}}, r"lock\.sha256 is missing"),
        ({"images": [{"key": "k", "repository": "r", "digest": D, "manifest": D, "image_id": D,
                      "archive": "images/../../x", "tag": "t"}]}, "must be relative"),
    ],
)
def test_malformed_top_manifest_is_a_usage_error(over, match):
    with pytest.raises(UsageError, match=match):
        bc.parse_bundle(json.dumps(_top(**over)))


def test_an_image_archive_not_in_the_file_list_is_a_problem():
    b = bc.parse_bundle(json.dumps(_top(files=[{"path": "images.lock", "size": 5, "sha256": C}])))
    assert [(p.path, p.what) for p in bc.structure_problems(b)] == [("images/llamacpp_x.tar", "unlisted")]


@pytest.mark.parametrize(
    "size,sha,what",
    [(10, D, None), (None, None, "missing"), (9, None, "size"), (10, C, "sha256")],
)
def test_compare(size, sha, what):
    p = bc.compare(bc.FileEntry("f", 10, D), size, sha)
    assert (p.what if p else None) == what


def test_lock_mismatch_names_both_locks():
    b = bc.parse_bundle(json.dumps(_top()))
    bc.lock_matches(b, D, "images.lock", "/b")
    with pytest.raises(UsageError, match=r"inv/images.lock: this images.lock \(sha256:cdcdcdcdcdcd\) is not the one "
                                         r"the bundle was built from \(sha256:abababababab, /b/images.lock\)"):
        bc.lock_matches(b, C, "inv/images.lock", "/b")


@pytest.mark.parametrize(
    "rc,stdout,problem",
    [
        (0, f"@@id {C}\n", None),
        (0, f"@@id {E}\n", f"has image ID {E} on the host, not {C}"),
        (4, "@@absent\n", "is not on the host; `invoke deploy --bundle DIR` loads it"),
        (0, "", "has image ID ? on the host"),
    ],
)
def test_loaded_image_step_checks_the_image_id(rc, stdout, problem):
    got = store.loaded_problem(rc, stdout, "r/x:sha256-ab", C)
    assert (got is None) if problem is None else (problem in got)


def test_host_side_parsers():
    assert load.parse_present(f"@@have {C}\n@@missing {D}\n") == {C}
    assert load.parse_staged("@@staged 42 /opt/llmfleet/bundle/ab.tar.part\n@@staged x /y\n") == {
        "/opt/llmfleet/bundle/ab.tar.part": 42}
    assert load.staged_path("/opt/llmfleet/", D) == f"/opt/llmfleet/bundle/{'ab' * 32}.tar.part"
    assert load.parse_load(f"@@loaded\n@@id {C}\n") == load.LoadAnswer(True, C)
    assert load.parse_load(f"@@id {C}\n").ok(C) and not load.parse_load("@@id \n").ok(C)


def _locked_run(alive: bool = True):
    from datetime import UTC, datetime

    from llmfleet.release.executor import HostRun

    def make(*args, **kwargs):
        return HostRun(*args, **{**kwargs, "token": lambda: "0a" * 16, "origin": "me@ws", "pid": 4242, "who": "me@ws",
                                 "alive": lambda pid: alive, "now": lambda: datetime(2026, 11, 29, 12, tzinfo=UTC)})
    return make


def _prepared_host():
    from types import SimpleNamespace

    from llmfleet.inventory.ansible import Host
    from llmfleet.inventory.services import HostSettings

    return SimpleNamespace(host=Host("h1"), settings=HostSettings(root="/opt/llmfleet"))


def test_a_bundle_load_runs_under_the_hosts_deploy_lock_and_is_audited_with_the_unlock():
    from datetime import UTC, datetime

    from tests.fake_remote import Command, FakeRemote

    holder = store.holder_document(token="0a" * 16, who="me@ws", origin="me@ws", action="deploy --bundle",
                                   message="images from /b", now=datetime(2026, 11, 29, 12, tzinfo=UTC), pid=4242)
    remote = FakeRemote([Command(store.lock_acquire_script("/opt/llmfleet", holder), out="@@acquired"),
                         Command(None, out="@@released")])
    ran = []
    got = load.locked(remote, _prepared_host(), None, "deploy --bundle", "images from /b",
                      lambda: ran.append(1) or [load.Loaded("llamacpp:b1", C, "r:t", True)], log=print,
                      make_run=_locked_run())
    remote.assert_done()
    assert ran == [1] and [x.key for x in got] == ["llamacpp:b1"]
    last = remote.sent[-1]
    assert '"action":"bundle.load"' in last and '"result":"loaded"' in last and "llamacpp:b1 sent" in last
    assert last.rstrip().endswith(store.lock_release_script("/opt/llmfleet", "0a" * 16) + "\n)")


def test_a_bundle_load_is_refused_at_once_naming_the_writer_that_holds_the_lock():
    from llmfleet.release.decide import Refusal
    from tests.fake_remote import Command, FakeRemote

    pusher = {"token": "b" * 32, "who": "bob", "from": "bob@ws2", "pid": 77, "action": "models.push",
              "message": "/srv/m.gguf from /m.gguf (this machine)", "time": "2026-11-29T11:59:00+00:00"}
    remote = FakeRemote([Command(None, out="@@held\n" + json.dumps(pusher), exit=store.LOCK_HELD_RC),
                         Command(None, out="")])
    with pytest.raises(Refusal) as exc:
        load.locked(remote, _prepared_host(), None, "deploy --bundle", "images from /b",
                    lambda: pytest.fail("loaded without the lock"), log=print, make_run=_locked_run())
    remote.assert_done()
    assert exc.value.reason.startswith("deploy lock held by bob from bob@ws2 (pid 77) since 2026-11-29T11:59:00+00:00 "
                                       "(1 min 0 s ago) for models.push: /srv/m.gguf")
    assert '"result":"refused"' in remote.sent[-1]
    assert store.lock_release_script("/opt/llmfleet", "0a" * 16) not in remote.sent[-1]


@pytest.mark.parametrize("script", [lambda: load.present_script([C, D]), lambda: load.load_script("/o/b/x.tar", C, "r:t"),
                                    lambda: load.load_script(None, C, "r:t"), lambda: store.loaded_image_script("r:t")])
def test_host_scripts_are_posix_sh(script):
    res = subprocess.run(["sh", "-n"], input=script(), capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr


def test_load_script_against_a_stub_docker(tmp_path):
    """The script's flow in a real sh, with a docker stand-in that records its calls: load then tag;
    a tag that names another image is removed again and the script exits 7."""
    log = tmp_path / "calls"
    stub = tmp_path / "docker"
    stub.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\ncase \"$1 $2\" in\n"
                    "  'image inspect') echo \"$ID\";;\nesac\nexit 0\n")
    stub.chmod(0o755)
    archive = tmp_path / "x.tar"
    archive.write_bytes(b"x")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "ID": C}
    res = subprocess.run(["sh", "-c", load.load_script(str(archive), C, "r:t")], env=env, capture_output=True, text=True)
    assert res.returncode == 0 and load.parse_load(res.stdout) == load.LoadAnswer(True, C)
    assert not archive.exists()
    assert log.read_text().splitlines()[:2] == [f"load --input {archive}", f"tag {C} r:t"]
    res = subprocess.run(["sh", "-c", load.load_script(None, C, "r:t")], env={**env, "ID": E}, capture_output=True,
                         text=True)
    assert res.returncode == 7 and log.read_text().splitlines()[-1] == "image rm r:t"
    # an archive whose bytes differ from the bundle's sha256 is removed without being loaded
    archive.write_bytes(b"damaged")
    calls = len(log.read_text().splitlines())
    want = "sha256:" + hashlib.sha256(b"intact").hexdigest()
    res = subprocess.run(["sh", "-c", load.load_script(str(archive), C, "r:t", want)], env=env, capture_output=True,
                         text=True)
    assert res.returncode == 8 and "@@corrupt" in res.stdout and not archive.exists()
    assert len(log.read_text().splitlines()) == calls


# ---------------------------------------------------------------------------------------------
# bundle.create / bundle.verify against a registry on loopback


def _inventory(tmp: Path, registry_host: str, lock_text: str) -> Path:
    d = tmp / "inv"
    (d / "group_vars").mkdir(parents=True)
    (tmp / "images.lock").write_text(lock_text)
    (d / "hosts.yml").write_text("fleet:\n  hosts:\n    gpu-01:\n      ansible_host: 127.0.0.1\n    gpu-02:\n"
                                 "      ansible_host: 127.0.0.1\n")
    (tmp / "local-models").mkdir()
    (tmp / "local-models" / "m.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 64)
    svc = ("llmfleet_images_lock: ../images.lock\nllmfleet_services:\n  - name: chat\n    engine: llamacpp\n"
           "    model: qwen2.5-7b-instruct\n    model_path: /srv/models/m.gguf\n    quant: q4_k_m\n"
           f"    model_source: {tmp / 'local-models' / 'm.gguf'}\n"
           "    image: llamacpp:lab-cpu\n    port: 8080\n")
    (d / "group_vars" / "all.yml").write_text(svc)
    return d


@pytest.fixture(scope="module")
def built(registry, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bundle")
    pushed = push_loadable_image(registry, "lab/llama-server", "lab")
    # the lock also pins an image no service names: the bundle does not carry it
    lock = images.render_lock(images.ImageLock(images={
        "llamacpp:lab-cpu": images.LockedImage(key="llamacpp:lab-cpu", repository="lab-registry:5000/lab/llama-server",
                                               digest=pushed["ref"], tag="lab"),
        "llamacpp:next": images.LockedImage(key="llamacpp:next", repository="lab-registry:5000/lab/llama-server",
                                            digest=D, tag="next")}))
    inventory = _inventory(tmp, registry.host, lock)
    out = tmp / "site bundle"
    res = inv("bundle.create", str(out), "-i", str(inventory), "--group", "fleet", "--mirror", f"lab-registry:5000={registry.host}",
              "--tar", "--json")
    assert res.returncode == 0, res.stderr
    return out, json.loads(res.stdout), pushed, inventory


def test_create_writes_a_complete_bundle_with_no_controller_paths(built):
    out, doc, pushed, inventory = built
    (image,) = doc["images"]
    assert (image["key"], image["digest"], image["manifest"], image["image_id"]) == (
        "llamacpp:lab-cpu", pushed["ref"], pushed["manifest"], pushed["config"])
    assert image["tag"] == f"lab-registry:5000/lab/llama-server:sha256-{pushed['ref'].split(':')[1]}"
    paths = {f["path"] for f in doc["files"]}
    assert {"images/llamacpp_lab-cpu.tar", "images.lock", "catalog/engines.yaml", "catalog/gpus.yaml",
            "models/srv/models/m.gguf", "models/srv/models/m.gguf.llmfleet.json"} <= paths
    # the model beside its manifest, in the format models.push writes on hosts
    from llmfleet.knowledge import model_manifest as M

    assert doc["models"] == [{"name": "chat", "dir": "models/srv/models/m.gguf", "host_path": "/srv/models/m.gguf",
                              "manifest": "models/srv/models/m.gguf.llmfleet.json"}]
    held, problems = M.parse((out / "models/srv/models/m.gguf.llmfleet.json").read_text())
    local = inventory.parent / "local-models" / "m.gguf"
    assert not problems and held.model_path == "/srv/models/m.gguf" and held.source == {"bundle": "models/srv/models/m.gguf"}
    assert held.content == (("m.gguf", local.stat().st_size, hashlib.sha256(local.read_bytes()).hexdigest()),)
    assert (out / "models/srv/models/m.gguf").read_bytes() == local.read_bytes()
    assert doc["lock"]["sha256"] == "sha256:" + hashlib.sha256((inventory.parent / "images.lock").read_bytes()).hexdigest()
    assert doc["built_for"]["hosts"] == ["gpu-01", "gpu-02"] and doc["built_for"]["services"]["gpu-01"] == ["chat"]
    text = (out / "bundle.json").read_text()
    assert str(out.parent) not in text and str(inventory) not in text
    assert str(inventory.parent) not in (out / "models/srv/models/m.gguf.llmfleet.json").read_text()
    assert not (out / ".blobs").exists()
    tarball = out.with_name(out.name + ".tar")
    with tarfile.open(tarball) as tar:
        assert sorted(m.name for m in tar.getmembers()) == sorted(f"{out.name}/{p}" for p in [*paths, "bundle.json"])


def test_image_archive_is_a_consistent_oci_layout_and_docker_save_manifest(built):
    out, doc, pushed, _ = built
    with tarfile.open(out / doc["images"][0]["archive"]) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    for name, data in members.items():  # every blob is named by its own sha256
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    (entry,) = json.loads(members["index.json"])["manifests"]
    manifest = json.loads(members[bc.blob_path(entry["digest"])])
    assert entry["digest"] == pushed["manifest"] and entry["size"] == len(members[bc.blob_path(entry["digest"])])
    (save,) = json.loads(members["manifest.json"])
    assert save["Config"] == bc.blob_path(manifest["config"]["digest"]) == bc.blob_path(pushed["config"])
    assert save["Layers"] == [bc.blob_path(ly["digest"]) for ly in manifest["layers"]]
    assert save["RepoTags"] == [doc["images"][0]["tag"]]
    layer = tarfile.open(fileobj=io.BytesIO(members[save["Layers"][0]]))  # gzip'd tar, as pushed
    assert "hello.txt" in layer.getnames()


def test_verify_passes_then_names_a_flipped_byte_and_a_missing_file(built, tmp_path):
    import shutil

    out, doc, _, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    res = inv("bundle.verify", str(copy))
    assert res.returncode == 0 and "files intact" in res.stdout, res.stderr
    archive = copy / doc["images"][0]["archive"]
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x01
    archive.write_bytes(bytes(data))
    (copy / "catalog" / "gpus.yaml").unlink()
    res = inv("bundle.verify", str(copy))
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert lines == [f"{copy}/catalog/gpus.yaml: missing from the bundle (listed in bundle.json); copy the bundle again",
                     f"{copy}/images/llamacpp_lab-cpu.tar: corrupt (its sha256 differs from bundle.json); copy the "
                     "bundle again"]
    with pytest.raises(CheckFailed, match="llamacpp_lab-cpu.tar: corrupt"):
        check.verify(copy)


def test_verify_of_a_folder_without_bundle_json_is_a_usage_error(tmp_path):
    res = inv("bundle.verify", str(tmp_path))
    assert res.returncode == 2 and "bundle.json: missing" in res.stderr


def test_create_refuses_an_unpinned_image_and_a_foreign_folder(registry, tmp_path):
    lock = images.render_lock(images.ImageLock(images={"llamacpp:lab-cpu": images.LockedImage(
        key="llamacpp:lab-cpu", repository="lab-registry:5000/lab/llama-server", digest=None, tag="lab")}))
    inventory = _inventory(tmp_path, registry.host, lock)
    res = inv("bundle.create", str(tmp_path / "b"), "-i", str(inventory), "--group", "all")
    assert res.returncode == 2 and "without a digest" in res.stderr and not (tmp_path / "b").exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    from llmfleet.bundle.create import _prepare_dir

    with pytest.raises(UsageError, match="not empty and holds no bundle"):
        _prepare_dir(tmp_path / "busy")
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_deploy_refuses_a_bad_bundle_before_contacting_any_host(built, tmp_path):
    """The inventory's hosts have no sshd behind them: each refusal below happens before any connection."""
    import shutil

    out, doc, _, inventory = built
    # a missing archive: exit 1, the file named
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / doc["images"][0]["archive"]).unlink()
    res = inv("deploy", "-i", str(inventory), "--host", "gpu-01", "--bundle", str(copy))
    assert res.returncode == 1 and f"{copy}/images/llamacpp_lab-cpu.tar: missing from the bundle" in res.stderr
    # the inventory on another lock: exit 2, both locks named
    lock = inventory.parent / "images.lock"
    original = lock.read_text()
    try:
        lock.write_text(original + "# edited at the site\n")
        res = inv("deploy", "-i", str(inventory), "--host", "gpu-01", "--bundle", str(out))
        assert res.returncode == 2, res.stderr
        assert f"{inventory}/../images.lock: this images.lock" in res.stderr and f"{out}/images.lock" in res.stderr
    finally:
        lock.write_text(original)


def test_deploy_bundle_refuses_a_service_over_several_hosts():
    res = inv("deploy", "-i", "inventory/lab", "--host", "gpu-p40-11", "--bundle", "/nonexistent")
    assert res.returncode == 2 and "spans hosts" in res.stderr and "single-host services only" in res.stderr


def test_upgrade_refuses_a_bad_bundle_before_touching_any_host(built, tmp_path):
    """upgrade --bundle refuses as deploy --bundle does, before its first batch: a missing archive
    (exit 1), the inventory on another lock, an image the bundle lacks (exit 2); one line each, and no
    host is contacted (nothing listens for them: a contact would say it cannot connect)."""
    import shutil

    out, doc, _, inventory = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / doc["images"][0]["archive"]).unlink()
    res = inv("upgrade", "-i", str(inventory), "--group", "fleet", "--set", "context=4096", "--bundle", str(copy))
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"error: {copy}/images/llamacpp_lab-cpu.tar: missing from the bundle (listed in bundle.json); copy the bundle again"]
    assert "batch" not in res.stdout + res.stderr
    # an image the lock pins but the bundle does not carry
    res = inv("upgrade", "-i", str(inventory), "--group", "fleet", "--image", "llamacpp=next", "--bundle", str(out))
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "image 'llamacpp:next' is not in the bundle" in line and "batch" not in res.stdout
    # the inventory on another lock
    lock = inventory.parent / "images.lock"
    original = lock.read_text()
    try:
        lock.write_text(original + "# edited at the site\n")
        res = inv("upgrade", "-i", str(inventory), "--group", "fleet", "--set", "context=4096", "--bundle", str(out))
        assert res.returncode == 2, res.stderr
        (line,) = res.stderr.strip().splitlines()
        assert f"{inventory}/../images.lock: this images.lock" in line and f"{out}/images.lock" in line
    finally:
        lock.write_text(original)
    assert "cannot connect" not in res.stdout + res.stderr and "Traceback" not in res.stderr


def test_upgrade_bundle_refuses_a_service_over_several_hosts():
    res = inv("upgrade", "-i", "inventory/lab", "--group", "lab_split", "--set", "context=4096", "--bundle",
              "/nonexistent")
    assert res.returncode == 2 and "spans hosts" in res.stderr and "upgrade --bundle deploys single-host" in res.stderr
