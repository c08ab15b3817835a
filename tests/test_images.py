"""images.lock: parsing, resolving service images (pinned, unpinned, mirrored), writing, and the
pin / verify path against a real registry on loopback."""

from __future__ import annotations

import pytest

from llmfleet.errors import UsageError
from llmfleet.images.lock import (
    ImageLock,
    LockedImage,
    PinSpec,
    apply_mirror,
    load_lock,
    mark_verified,
    parse_lock,
    parse_pin_args,
    pin,
    render_lock,
    resolve,
    verify,
)
from llmfleet.images.registry import RegistryClient
from tests.registry_fixture import delete_manifest, push_image, registry_fixture  # noqa: F401 - fixture

D = "sha256:" + "ab" * 32
D2 = "sha256:" + "cd" * 32

LOCK_TEXT = f"""
version: 1
images:
  "vllm:0.10.1.1":
    repository: docker.io/vllm/vllm-openai
    tag: v0.10.1.1
    digest: {D}
    cuda: "12.8.1"
    archs: ["7.0", "8.0"]
    source: catalog
    verified: null
  "llamacpp:b5000-cu122":
    repository: llmfleet/llama.cpp
    tag: server-b5000-cu122
    digest: null
    verified: null
"""


def test_parse_lock_reads_pinned_and_unpinned_entries():
    lock = parse_lock(LOCK_TEXT)
    v = lock.get("vllm:0.10.1.1")
    assert (v.repository, v.digest, v.tag, v.cuda, v.archs) == ("docker.io/vllm/vllm-openai", D, "v0.10.1.1", "12.8.1", ("7.0", "8.0"))
    assert lock.get("llamacpp:b5000-cu122").digest is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("images: {'vllm:1': {repository: a/b}}", "digest is missing"),
        ("images: {'vllm:1': {repository: a/b, digest: sha256:abc}}", "digest must be sha256"),
        (f"images: {{'vllm:1': {{repository: a/b, digest: '{D.upper()}'}}}}", "digest must be sha256"),
        (f"images: {{'tgi:1': {{repository: a/b, digest: '{D}'}}}}", "ENGINE:VERSION"),
        (f"images: {{'vllm:1': {{repository: 'A B', digest: '{D}'}}}}", "not a valid image repository"),
        (f"images: {{'vllm:1': {{repository: a/b, digest: '{D}', archs: '7.0'}}}}", "archs must be a list"),
        (f"images: {{'vllm:1': {{repository: a/b, digest: '{D}', verified: yes}}}}", "verified must be null"),
        ("images: [1, 2]", "top level"),
        ("images: {'vllm:1': [x]}", "must be a mapping"),
        (":\n  - [", "not valid YAML"),
    ],
)
def test_parse_lock_errors_name_the_entry_and_the_fix(text, message):
    with pytest.raises(UsageError, match=message):
        parse_lock(text, path="images.lock")


def test_missing_lock_file_is_empty(tmp_path):
    assert load_lock(tmp_path / "none.lock").images == {}


def test_render_then_parse_is_identity_and_stable():
    lock = parse_lock(LOCK_TEXT)
    text = render_lock(lock)
    again = parse_lock(text)
    assert again.images == lock.images
    assert render_lock(again) == text
    assert text.index("llamacpp:b5000-cu122") < text.index("vllm:0.10.1.1")  # sorted


# ---------------------------------------------------------------- resolve


def test_locked_key_resolves_to_repo_at_digest():
    ref = resolve("vllm:0.10.1.1", parse_lock(LOCK_TEXT))
    assert ref.pull_ref == f"docker.io/vllm/vllm-openai@{D}"
    assert ref.pinned and ref.cuda == "12.8.1" and ref.archs == ("7.0", "8.0")


def test_unpinned_lock_entry_is_refused_unless_allowed():
    lock = parse_lock(LOCK_TEXT)
    with pytest.raises(UsageError, match=r"without a digest.*images.pin llamacpp=b5000-cu122"):
        resolve("llamacpp:b5000-cu122", lock)
    ref = resolve("llamacpp:b5000-cu122", lock, allow_unpinned=True)
    assert (ref.pinned, ref.pull_ref) == (False, "llmfleet/llama.cpp:server-b5000-cu122")


def test_unknown_key_and_floating_tag_are_refused():
    lock = parse_lock(LOCK_TEXT)
    with pytest.raises(UsageError, match="not in images.lock"):
        resolve("vllm:0.9.9", lock)
    with pytest.raises(UsageError, match="floating tag"):
        resolve("vllm/vllm-openai:latest", lock)
    assert resolve("vllm/vllm-openai:latest", lock, allow_unpinned=True).pull_ref == "vllm/vllm-openai:latest"


def test_full_reference_with_digest_is_pinned_by_itself():
    ref = resolve(f"ghcr.io/ggml-org/llama.cpp@{D2}", ImageLock())
    assert ref.pinned and ref.pull_ref == f"ghcr.io/ggml-org/llama.cpp@{D2}"


@pytest.mark.parametrize(
    ("repo", "mirrors", "expected"),
    [
        # exact repository, either spelling of Docker Hub
        ("docker.io/vllm/vllm-openai", {"docker.io/vllm/vllm-openai": "reg.lan:5000/vllm/vllm-openai"},
         "reg.lan:5000/vllm/vllm-openai"),
        ("vllm/vllm-openai", {"docker.io/vllm/vllm-openai": "reg.lan:5000/mirror/vllm"}, "reg.lan:5000/mirror/vllm"),
        ("docker.io/vllm/vllm-openai", {"vllm/vllm-openai": "reg.lan/v"}, "reg.lan/v"),
        # a prefix mirrors everything under it; the longest prefix wins
        ("ghcr.io/ggml-org/llama.cpp", {"ghcr.io": "reg.lan/ghcr"}, "reg.lan/ghcr/ggml-org/llama.cpp"),
        ("ghcr.io/ggml-org/llama.cpp", {"ghcr.io": "reg.lan/ghcr", "ghcr.io/ggml-org": "reg.lan/ggml"},
         "reg.lan/ggml/llama.cpp"),
        ("docker.io/library/ubuntu", {"docker.io": "reg.lan/hub"}, "reg.lan/hub/library/ubuntu"),
        # a prefix matches on path boundaries only
        ("ghcr.io/ggml-org-fork/llama.cpp", {"ghcr.io/ggml-org": "reg.lan/ggml"}, "ghcr.io/ggml-org-fork/llama.cpp"),
        ("quay.io/x/y", {"ghcr.io": "reg.lan/ghcr"}, "quay.io/x/y"),
    ],
)
def test_mirrors_swap_the_repository(repo, mirrors, expected):
    assert apply_mirror(repo, mirrors) == expected


def test_mirror_keeps_the_digest_and_the_upstream_name():
    ref = resolve("vllm:0.10.1.1", parse_lock(LOCK_TEXT), mirrors={"docker.io/vllm": "reg.lan:5000/hub/vllm"})
    assert ref.pull_ref == f"reg.lan:5000/hub/vllm/vllm-openai@{D}"
    assert ref.upstream_repository == "docker.io/vllm/vllm-openai"
    assert ref.digest == D


def test_mirror_to_an_invalid_name_is_a_usage_error():
    with pytest.raises(UsageError, match="llmfleet_image_mirrors"):
        apply_mirror("docker.io/vllm/vllm-openai", {"docker.io/vllm": "Bad Mirror"})


# ---------------------------------------------------------------- pin arguments

CATALOG = {
    "vllm:0.10.1.1": {"repository": "docker.io/vllm/vllm-openai", "tag": "v0.10.1.1", "cuda": "12.8.1",
                      "kernels": {"sass": ["7.0", "8.0"], "ptx": []}},
    "llamacpp:server-cuda-12.8": {"repository": "ghcr.io/ggml-org/llama.cpp", "tag": "server-cuda", "cuda": "12.8.1",
                                  "kernels": {"sass": ["8.6"], "ptx": ["7.0", "8.6"]}},
}


def test_pin_args_take_repository_tag_cuda_and_archs_from_the_catalog():
    [a, b] = parse_pin_args(["vllm=0.10.1.1", "llamacpp=server-cuda-12.8"], CATALOG)
    assert (a.key, a.ref, a.repository, a.cuda, a.archs) == (
        "vllm:0.10.1.1", "docker.io/vllm/vllm-openai:v0.10.1.1", None, "12.8.1", ("7.0", "8.0"))
    assert b.archs == ("8.6+PTX", "7.0-virtual")


def test_pin_args_explicit_source_reference_keeps_the_catalog_repository():
    [a] = parse_pin_args(["vllm=0.10.1.1=127.0.0.1:5000/hub/vllm-openai:v0.10.1.1"], CATALOG)
    assert a.ref == "127.0.0.1:5000/hub/vllm-openai:v0.10.1.1"
    assert a.repository == "docker.io/vllm/vllm-openai"


@pytest.mark.parametrize(
    ("args", "message"),
    [([], "at least one"), (["vllm"], "ENGINE=VERSION"), (["=1"], "ENGINE=VERSION"),
     (["tgi=1"], "vllm, llamacpp, node-exporter, dcgm-exporter or gateway"), (["vllm=0.0.1"], "not in the engine-release catalog")],
)
def test_pin_args_errors(args, message):
    with pytest.raises(UsageError, match=message):
        parse_pin_args(args, CATALOG)


# ---------------------------------------------------------------- pin and verify against a real registry


def test_pin_writes_digests_keeps_other_entries_and_verify_sees_them(registry, tmp_path):
    lock_path = tmp_path / "images.lock"
    lock_path.write_text(LOCK_TEXT)
    d1 = push_image(registry, "lab/llama-server", "lab", payload="llama")
    d2 = push_image(registry, "lab/vllm-cpu", "lab", payload="vllm")
    client = RegistryClient()
    entries = pin({"llamacpp:lab-cpu": f"{registry.host}/lab/llama-server:lab",
                   "vllm:lab-cpu": f"{registry.host}/lab/vllm-cpu:lab"}, client, lock_path)
    assert [e.digest for e in entries] == [d1, d2]
    lock = load_lock(lock_path)
    assert set(lock.images) == {"vllm:0.10.1.1", "llamacpp:b5000-cu122", "llamacpp:lab-cpu", "vllm:lab-cpu"}
    e = lock.get("llamacpp:lab-cpu")
    assert (e.repository, e.tag, e.digest) == (f"{registry.host}/lab/llama-server", "lab", d1)
    assert e.verified["registry"] == registry.host and e.verified["by"] == "images.pin"
    assert resolve("llamacpp:lab-cpu", lock).pull_ref == f"{registry.host}/lab/llama-server@{d1}"

    only_lab = ImageLock({k: v for k, v in lock.images.items() if k.endswith("lab-cpu")}, str(lock_path))
    results = verify(only_lab, client)
    assert [(r.key, r.status) for r in results] == [("llamacpp:lab-cpu", "ok"), ("vllm:lab-cpu", "ok")]

    # the tag moves on: the pinned digest still resolves (the lock names bytes, not a tag)
    push_image(registry, "lab/vllm-cpu", "lab", payload="vllm-2")
    assert verify(only_lab, client)[1].status == "ok"
    # the pinned manifest is deleted: verify says missing
    delete_manifest(registry, "lab/vllm-cpu", d2)
    assert [r.status for r in verify(only_lab, client)] == ["ok", "missing"]


def test_pin_records_a_different_repository_than_it_resolved(registry, tmp_path):
    digest = push_image(registry, "lab/broken", "lab", payload="broken")
    spec = PinSpec(key="llamacpp:lab-broken", ref=f"{registry.host}/lab/broken:lab",
                   repository="10.199.0.1:5000/lab/broken", source="lab")
    [e] = pin([spec], RegistryClient(), tmp_path / "lab.lock")
    assert (e.repository, e.digest, e.source) == ("10.199.0.1:5000/lab/broken", digest, "lab")
    assert load_lock(tmp_path / "lab.lock").get("llamacpp:lab-broken").repository == "10.199.0.1:5000/lab/broken"


def test_pin_writes_nothing_when_one_reference_fails(registry, tmp_path):
    push_image(registry, "lab/ok", "v1")
    lock_path = tmp_path / "images.lock"
    lock_path.write_text(LOCK_TEXT)
    before = lock_path.read_text()
    with pytest.raises(Exception, match="not found"):
        pin({"vllm:a": f"{registry.host}/lab/ok:v1", "vllm:b": f"{registry.host}/lab/ok:missing"},
            RegistryClient(), lock_path)
    assert lock_path.read_text() == before
    assert not list(tmp_path.glob(".images.lock.*"))


def test_verify_goes_through_the_mirror_with_the_same_digest(registry, tmp_path):
    """An air-gapped fleet: the lock names the public repository; the mirror holds the same digest."""
    digest = push_image(registry, "hub/vllm/vllm-openai", "v0.10.1.1", payload="mirrored")
    lock = ImageLock({"vllm:0.10.1.1": LockedImage("vllm:0.10.1.1", "docker.io/vllm/vllm-openai", digest, "v0.10.1.1")})
    mirrors = {"docker.io": f"{registry.host}/hub"}
    [r] = verify(lock, RegistryClient(), mirrors=mirrors)
    assert (r.status, r.ref) == ("ok", f"{registry.host}/hub/vllm/vllm-openai@{digest}")
    marked = mark_verified(lock, [r], at="2026-01-01T00:00:00Z")
    assert marked.get("vllm:0.10.1.1").verified == {"at": "2026-01-01T00:00:00Z", "registry": registry.host,
                                                   "by": "images.verify"}
    # a digest the mirror does not hold is missing, not silently replaced by the tag's digest
    other = ImageLock({"vllm:0.10.1.1": LockedImage("vllm:0.10.1.1", "docker.io/vllm/vllm-openai", D2, "v0.10.1.1")})
    assert verify(other, RegistryClient(), mirrors=mirrors)[0].status == "missing"


def test_verify_reports_unpinned_and_unreachable_entries():
    lock = parse_lock(LOCK_TEXT)
    results = verify(lock, RegistryClient(timeout=2), mirrors={"docker.io": "127.0.0.1:9/none"})
    by_key = {r.key: r for r in results}
    assert by_key["llamacpp:b5000-cu122"].status == "unpinned"
    assert by_key["vllm:0.10.1.1"].status == "error" and "cannot reach" in by_key["vllm:0.10.1.1"].message


def test_re_pinning_keeps_the_recorded_source_and_drops_a_stale_digest_source(registry, tmp_path):
    from llmfleet.images.lock import through_mirror

    lock_path = tmp_path / "images.lock"
    lock_path.write_text(LOCK_TEXT.replace("    source: catalog\n", "    source: catalog\n    digest_source: quoted\n"))
    assert load_lock(lock_path).get("vllm:0.10.1.1").digest_source == "quoted"
    digest = push_image(registry, "hub/vllm/vllm-openai", "v0.10.1.1", payload="re-pin")
    [spec] = parse_pin_args(["vllm=0.10.1.1"], CATALOG)
    spec = through_mirror(spec, {"docker.io": f"{registry.host}/hub"})
    assert spec.ref == f"{registry.host}/hub/vllm/vllm-openai:v0.10.1.1"
    assert spec.repository == "docker.io/vllm/vllm-openai"
    [e] = pin([spec], RegistryClient(), lock_path)
    again = load_lock(lock_path).get("vllm:0.10.1.1")
    assert again == e
    assert (e.repository, e.digest, e.source, e.digest_source) == ("docker.io/vllm/vllm-openai", digest, "catalog", None)
