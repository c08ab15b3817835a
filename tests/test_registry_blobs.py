"""Registry v2 client, manifests and blobs (what bundle.create fetches), against a real registry on
loopback: an index's linux/amd64 entry, blobs streamed and verified while written, a damaged blob
refused by name, a partial download resumed."""

from __future__ import annotations

import hashlib
import json

import pytest

from llmfleet.errors import RemoteError
from llmfleet.images.registry import (
    RegistryClient,
    file_sha256,
    parse_image_manifest,
    pick_platform,
)
from tests.registry_fixture import (  # noqa: F401 - fixtures
    blob_path,
    docker_config,
    push_loadable_image,
    registry_fixture,
    registry_token_fixture,
)

D = "sha256:" + "ab" * 32
E = "sha256:" + "cd" * 32


@pytest.mark.parametrize(
    ("platforms", "want", "picked"),
    [
        ([("linux", "arm64", None), ("linux", "amd64", None)], "linux/amd64", 1),
        ([("unknown", "unknown", None), ("linux", "amd64", None)], "linux/amd64", 1),
        ([("linux", "arm", "v7"), ("linux", "arm", "v6")], "linux/arm/v6", 1),
        ([("linux", "amd64", "v3")], "linux/amd64", 0),
    ],
)
def test_pick_platform(platforms, want, picked):
    index = {"manifests": [{"digest": [D, E][i], "platform": {"os": o, "architecture": a, **({"variant": v} if v else {})}}
                           for i, (o, a, v) in enumerate(platforms)]}
    assert pick_platform(index, want)["digest"] == [D, E][picked]


def test_pick_platform_names_what_the_index_has():
    index = {"manifests": [{"digest": D, "platform": {"os": "linux", "architecture": "arm64"}}]}
    with pytest.raises(RemoteError, match="no linux/amd64 image .*it has: linux/arm64"):
        pick_platform(index, where="repo@x")


def test_image_manifest_needs_digests_and_sizes():
    body = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"digest": D, "size": 2}, "layers": [{"digest": "sha256:short", "size": 1}]}).encode()
    with pytest.raises(RemoteError, match="descriptor without a sha256 digest"):
        parse_image_manifest(body, "", "sha256:x")
    with pytest.raises(RemoteError, match="not an image manifest"):
        parse_image_manifest(json.dumps({"schemaVersion": 1}).encode(), "", "sha256:x")


@pytest.mark.parametrize("fixture", ["registry", "registry_token"])
def test_index_gives_the_amd64_manifest_and_its_blobs(fixture, request, tmp_path):
    reg = request.getfixturevalue(fixture)
    pushed = push_loadable_image(reg, "bundle/idx", "v1")
    client = RegistryClient(docker_config=str(docker_config(tmp_path / "cfg", reg.host)))  # the token registry's login
    m = client.image_manifest(f"{reg.host}/bundle/idx@{pushed['ref']}")
    assert (m.index_digest, m.digest, m.image_id) == (pushed["ref"], pushed["manifest"], pushed["config"])
    assert [ly["digest"] for ly in m.layers] == [pushed["layer"]]
    dest = tmp_path / "blobs" / pushed["layer"].split(":")[1]
    size = client.fetch_blob(f"{reg.host}/bundle/idx", pushed["layer"], dest, size=m.layers[0]["size"])
    assert size == m.layers[0]["size"] == dest.stat().st_size
    assert file_sha256(dest) == pushed["layer"]
    assert not dest.with_name(dest.name + ".part").exists()


def test_a_plain_manifest_is_its_own_image(registry, tmp_path):
    pushed = push_loadable_image(registry, "bundle/plain", "v1", index=False)
    m = RegistryClient().image_manifest(f"{registry.host}/bundle/plain:v1")
    assert m.index_digest is None and m.digest == pushed["manifest"] == pushed["ref"]


def test_pinned_digest_must_match_the_body(registry):
    pushed = push_loadable_image(registry, "bundle/pin", "v1")
    other = "sha256:" + hashlib.sha256(b"other").hexdigest()
    with pytest.raises(RemoteError):
        RegistryClient().manifest(f"{registry.host}/bundle/pin@{other}")
    assert RegistryClient().manifest(f"{registry.host}/bundle/pin@{pushed['ref']}")[0] == pushed["ref"]


def test_damaged_blob_is_refused_and_never_written(registry, tmp_path):
    pushed = push_loadable_image(registry, "bundle/bad", "v1", {"x": b"content to damage"})
    stored = blob_path(registry, pushed["layer"])
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    dest = tmp_path / "layer"
    with pytest.raises(RemoteError, match=f"blob {pushed['layer']} could not be fetched intact after 2 attempts"):
        RegistryClient().fetch_blob(f"{registry.host}/bundle/bad", pushed["layer"], dest, attempts=2)
    assert not dest.exists() and not (tmp_path / "layer.part").exists()


def test_partial_download_resumes_and_a_wrong_part_starts_over(registry, tmp_path):
    pushed = push_loadable_image(registry, "bundle/resume", "v1", {"big": bytes(range(256)) * 4000})
    full = blob_path(registry, pushed["layer"]).read_bytes()
    client = RegistryClient()
    dest = tmp_path / "good"
    (tmp_path / "good.part").write_bytes(full[: len(full) // 3])
    assert client.fetch_blob(f"{registry.host}/bundle/resume", pushed["layer"], dest) == len(full)
    assert dest.read_bytes() == full
    dest2 = tmp_path / "wrong"
    (tmp_path / "wrong.part").write_bytes(b"garbage that is not the blob's start")
    assert client.fetch_blob(f"{registry.host}/bundle/resume", pushed["layer"], dest2) == len(full)
    assert dest2.read_bytes() == full


def test_missing_blob_names_it(registry, tmp_path):
    push_loadable_image(registry, "bundle/miss", "v1")
    with pytest.raises(RemoteError, match="not found"):
        RegistryClient().fetch_blob(f"{registry.host}/bundle/miss", D, tmp_path / "x")
