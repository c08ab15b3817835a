"""Registry v2 client: references, Docker credentials, and tag -> digest against a real registry
(Debian's docker-registry on loopback) with no auth, HTTP Basic (htpasswd) and Bearer tokens."""

from __future__ import annotations

import json
import os
import stat

import pytest

from llmfleet.errors import RemoteError, UsageError
from llmfleet.images.registry import DOCKER_HUB, NotFound, RegistryClient, docker_credentials, parse_reference
from tests.registry_fixture import (  # noqa: F401 - fixtures
    PASSWORD,
    USER,
    delete_manifest,
    docker_config,
    push_image,
    registry_basic_fixture,
    registry_fixture,
    registry_token_fixture,
)

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("ref", "registry_", "repo", "tag", "digest"),
    [
        ("vllm/vllm-openai:v0.10.1.1", DOCKER_HUB, "vllm/vllm-openai", "v0.10.1.1", None),
        ("ubuntu", DOCKER_HUB, "library/ubuntu", None, None),
        ("docker.io/library/ubuntu:22.04", DOCKER_HUB, "library/ubuntu", "22.04", None),
        ("index.docker.io/vllm/vllm-openai:latest", DOCKER_HUB, "vllm/vllm-openai", "latest", None),
        ("ghcr.io/ggml-org/llama.cpp:server-cuda", "ghcr.io", "ggml-org/llama.cpp", "server-cuda", None),
        ("127.0.0.1:5000/lab/llama-server:lab", "127.0.0.1:5000", "lab/llama-server", "lab", None),
        ("localhost/x/y", "localhost", "x/y", None, None),
        (f"registry.internal:5000/vllm/vllm-openai@{D}", "registry.internal:5000", "vllm/vllm-openai", None, D),
        (f"repo/name:tag@{D}", DOCKER_HUB, "repo/name", "tag", D),
    ],
)
def test_parse_reference(ref, registry_, repo, tag, digest):
    r = parse_reference(ref)
    assert (r.registry, r.repository, r.tag, r.digest) == (registry_, repo, tag, digest)


@pytest.mark.parametrize("ref", ["", "has space:tag", "Upper/Case:x", "repo@sha256:short", "repo:bad tag", "repo:-x"])
def test_parse_reference_rejects(ref):
    with pytest.raises(UsageError):
        parse_reference(ref)


def test_hub_reference_prints_as_docker_io():
    assert str(parse_reference("vllm/vllm-openai:v1")) == "docker.io/vllm/vllm-openai:v1"


def _write(path, data):
    path.write_text(json.dumps(data))
    return str(path)


def test_credentials_from_auths(tmp_path):
    cfg = docker_config(tmp_path, "registry.internal:5000")
    assert docker_credentials("registry.internal:5000", str(cfg)) == (USER, PASSWORD)
    assert docker_credentials("other:5000", str(cfg)) is None


def test_hub_credentials_under_the_v1_url(tmp_path):
    import base64

    auth = base64.b64encode(b"u:p:with:colons").decode()
    path = _write(tmp_path / "config.json", {"auths": {"https://index.docker.io/v1/": {"auth": auth}}})
    assert docker_credentials(DOCKER_HUB, path) == ("u", "p:with:colons")


def test_missing_or_broken_config_means_no_credentials(tmp_path):
    assert docker_credentials("x", str(tmp_path / "nope.json")) is None
    (tmp_path / "config.json").write_text("{not json")
    assert docker_credentials("x", str(tmp_path)) is None


def _helper(tmp_path, name, answer: dict | None, log):
    """A docker-credential-NAME script that records the server asked for and prints ``answer``."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / f"docker-credential-{name}"
    body = f"cat > {log}\n" + (f"echo '{json.dumps(answer)}'\n" if answer else "echo 'credentials not found' >&2; exit 1\n")
    script.write_text("#!/bin/sh\n[ \"$1\" = get ] || exit 2\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bindir


def test_cred_helpers_win_over_auths(tmp_path, monkeypatch):
    import base64

    log = tmp_path / "asked"
    bindir = _helper(tmp_path, "fake", {"ServerURL": "r.example:5000", "Username": "helper-user", "Secret": "hs"}, log)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    auth = base64.b64encode(b"auths-user:x").decode()
    path = _write(tmp_path / "config.json", {"credHelpers": {"r.example:5000": "fake"},
                                             "auths": {"r.example:5000": {"auth": auth}}})
    assert docker_credentials("r.example:5000", path) == ("helper-user", "hs")
    assert log.read_text() == "r.example:5000"


def test_creds_store_used_when_no_auth_entry(tmp_path, monkeypatch):
    log = tmp_path / "asked"
    bindir = _helper(tmp_path, "store", {"Username": "s", "Secret": "t"}, log)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    path = _write(tmp_path / "config.json", {"credsStore": "store", "auths": {DOCKER_HUB: {}}})
    assert docker_credentials(DOCKER_HUB, path) == ("s", "t")
    assert log.read_text() == "https://index.docker.io/v1/"


def test_helper_failure_or_identity_token_or_absent_helper_is_no_credentials(tmp_path, monkeypatch):
    log = tmp_path / "asked"
    bindir = _helper(tmp_path, "fails", None, log)
    _helper(tmp_path, "idtoken", {"Username": "<token>", "Secret": "refresh"}, log)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    for helper in ("fails", "idtoken", "not-installed", "../../bin/sh"):
        path = _write(tmp_path / "config.json", {"credHelpers": {"r:1": helper}})
        assert docker_credentials("r:1", path) is None, helper


def test_loopback_is_plain_http_and_others_https_unless_insecure():
    c = RegistryClient(insecure=["mirror.lan:5000"])
    assert c._base("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert c._base("localhost:5000") == "http://localhost:5000"
    assert c._base("mirror.lan:5000") == "http://mirror.lan:5000"
    assert c._base("ghcr.io") == "https://ghcr.io"
    assert c._base(DOCKER_HUB) == "https://registry-1.docker.io"


# ---------------------------------------------------------------- against a real registry


def test_resolve_tag_to_the_pushed_digest_without_auth(registry):
    digest = push_image(registry, "lab/llama-server", "t1", payload="one")
    c = RegistryClient()
    assert c.resolve(f"{registry.host}/lab/llama-server:t1") == digest
    assert c.exists(f"{registry.host}/lab/llama-server@{digest}")


def test_a_moved_tag_resolves_to_the_new_digest_and_the_old_digest_still_exists(registry):
    old = push_image(registry, "lab/moving", "v1", payload="old")
    new = push_image(registry, "lab/moving", "v1", payload="new")
    assert old != new
    c = RegistryClient()
    assert c.resolve(f"{registry.host}/lab/moving:v1") == new
    assert c.exists(f"{registry.host}/lab/moving@{old}")


def test_unknown_tag_is_not_found_and_unknown_digest_does_not_exist(registry):
    push_image(registry, "lab/known", "v1")
    c = RegistryClient()
    with pytest.raises(NotFound, match="not found"):
        c.resolve(f"{registry.host}/lab/known:nope")
    assert c.exists(f"{registry.host}/lab/known@sha256:{'0' * 64}") is False
    assert c.exists(f"{registry.host}/lab/never-pushed@sha256:{'0' * 64}") is False


def test_deleted_manifest_no_longer_exists(registry):
    digest = push_image(registry, "lab/deleted", "v1", payload="bye")
    c = RegistryClient()
    assert c.exists(f"{registry.host}/lab/deleted@{digest}")
    delete_manifest(registry, "lab/deleted", digest)
    assert c.exists(f"{registry.host}/lab/deleted@{digest}") is False


def test_basic_auth_with_docker_login_credentials(registry_basic, tmp_path):
    digest = push_image(registry_basic, "mirror/vllm-openai", "v0.10.1.1")
    cfg = docker_config(tmp_path, registry_basic.host)
    assert RegistryClient(docker_config=str(cfg)).resolve(f"{registry_basic.host}/mirror/vllm-openai:v0.10.1.1") == digest


def test_basic_auth_without_or_with_wrong_credentials_says_login_and_never_echoes_the_password(
    registry_basic, tmp_path
):
    push_image(registry_basic, "mirror/x", "v1")
    ref = f"{registry_basic.host}/mirror/x:v1"
    with pytest.raises(RemoteError, match="docker login") as exc:
        RegistryClient(docker_config=str(tmp_path / "none")).resolve(ref)
    cfg = docker_config(tmp_path / "wrong", registry_basic.host, password="wrong-Pw-123")
    with pytest.raises(RemoteError, match="docker login") as exc2:
        RegistryClient(docker_config=str(cfg)).resolve(ref)
    for e in (exc, exc2):
        assert "wrong-Pw-123" not in str(e.value) and PASSWORD not in str(e.value)


def test_bearer_token_flow(registry_token, tmp_path):
    digest = push_image(registry_token, "private/llama.cpp", "server-b5000-cu122")
    cfg = docker_config(tmp_path, registry_token.host)
    issued = registry_token.extra["issued"]
    before = len(issued)
    c = RegistryClient(docker_config=str(cfg))
    assert c.resolve(f"{registry_token.host}/private/llama.cpp:server-b5000-cu122") == digest
    assert c.exists(f"{registry_token.host}/private/llama.cpp@{digest}")
    asked = issued[before:]
    assert asked and all(a["scope"] == "repository:private/llama.cpp:pull" and a["ok"] for a in asked)
    assert len(asked) == 1, "the pull token is reused for the same repository"


def test_bearer_token_anonymous_is_denied_with_a_login_hint(registry_token, tmp_path):
    push_image(registry_token, "private/denied", "v1")
    with pytest.raises(RemoteError, match="docker login"):
        RegistryClient(docker_config=str(tmp_path / "none")).resolve(f"{registry_token.host}/private/denied:v1")


def test_unreachable_registry_is_one_line_remote_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RemoteError, match="cannot reach registry") as exc:
        RegistryClient(timeout=2).resolve(f"127.0.0.1:{port}/x/y:z")
    assert "\n" not in str(exc.value)


def test_an_expired_cached_token_is_replaced_once(registry_token, tmp_path):
    digest = push_image(registry_token, "private/expiring", "v1")
    cfg = docker_config(tmp_path, registry_token.host)
    c = RegistryClient(docker_config=str(cfg))
    c._tokens[(registry_token.host, "repository:private/expiring:pull")] = "expired.token.value"
    assert c.resolve(f"{registry_token.host}/private/expiring:v1") == digest
