"""Resolve image tags to digests with the Registry HTTP API v2 (Docker Hub, ghcr.io, private mirrors).

``parse_reference`` is pure. ``RegistryClient`` does the HTTP: a HEAD (then GET) of the manifest
with every manifest media type accepted, answering 401 challenges with Bearer tokens or Basic auth,
credentials from the usual Docker config (``~/.docker/config.json`` ``auths``). Credentials never
appear in errors or logs. Every request has a timeout; the redirect and retry count is bounded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmfleet.errors import RemoteError, UsageError

if TYPE_CHECKING:  # httpx (and its command line's rich and click) loads only when a registry is asked
    import httpx

DOCKER_HUB = "registry-1.docker.io"
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port] to talk to
    repository: str  # path inside the registry
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        """The repository as docker writes it (``docker.io/library/x`` stays ``docker.io/...``)."""
        reg = "docker.io" if self.registry == DOCKER_HUB else self.registry
        return f"{reg}/{self.repository}"

    def __str__(self) -> str:
        if self.digest:
            return f"{self.name}@{self.digest}"
        return f"{self.name}:{self.tag or 'latest'}"


def split_reference(ref: str) -> tuple[str, str | None, str | None]:
    """``repo[:tag][@digest]`` -> (repo, tag, digest), by syntax alone (no check, no registry):
    the one place a reference is taken apart; ``parse_reference`` checks and resolves what it gives."""
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
    tag = None
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        ref, tag = ref.rsplit(":", 1)
    return ref, tag, digest


def explicit_registry(repository: str) -> str | None:
    """The registry a repository names in its first component (``host.domain``, ``host:port``,
    ``localhost``), else None (Docker Hub's implicit one)."""
    first, sep, _ = repository.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def parse_reference(ref: str) -> Reference:
    """``vllm/vllm-openai:v0.6.6`` → Docker Hub ``vllm/vllm-openai`` tag ``v0.6.6``; digests kept."""
    text = ref.strip()
    if not text or any(c.isspace() for c in text):
        raise UsageError(f"image reference {ref!r} is empty or has spaces")
    text, tag, digest = split_reference(text)
    if digest is not None and not _DIGEST.match(digest):
        raise UsageError(f"image reference {ref!r}: digest must be sha256:<64 hex>")
    if tag is not None and not _TAG.match(tag):
        raise UsageError(f"image reference {ref!r}: bad tag {tag!r}")
    parts = text.split("/")
    if explicit_registry(text):
        registry, path = parts[0], parts[1:]
    else:
        registry, path = DOCKER_HUB, parts
    if registry in ("docker.io", "index.docker.io"):
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and len(path) == 1:
        path = ["library", *path]
    for comp in path:
        if not _COMPONENT.match(comp):
            raise UsageError(f"image reference {ref!r}: bad repository component {comp!r}")
    return Reference(registry=registry, repository="/".join(path), tag=tag, digest=digest)


def _server_keys(registry: str) -> list[str]:
    """The names the Docker config may use for a registry (``docker login`` writes Hub as the v1 URL)."""
    keys = [registry, f"https://{registry}", f"http://{registry}"]
    if registry == DOCKER_HUB:
        keys = ["https://index.docker.io/v1/", "index.docker.io", "docker.io", *keys]
    return keys


def _from_helper(helper: str, server: str, timeout: float = 10.0) -> tuple[str, str] | None:
    """``docker-credential-HELPER get`` with the server on stdin, as the docker CLI does."""
    if not re.match(r"^[A-Za-z0-9_.-]+$", helper):
        return None
    exe = shutil.which(f"docker-credential-{helper}")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "get"], input=server, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        return None
    user, secret = data.get("Username"), data.get("Secret")
    if not user or not secret or user == "<token>":  # identity tokens (OAuth refresh) are not supported
        return None
    return str(user), str(secret)


def docker_credentials(registry: str, config_path: str | None = None) -> tuple[str, str] | None:
    """User and password for a registry from the Docker config, looked up as the docker CLI does:
    ``credHelpers[registry]``, else an ``auths`` entry with ``auth``, else the ``credsStore`` helper.

    ``config_path`` is a config.json or a folder holding one (default ``$DOCKER_CONFIG`` or ~/.docker).
    """
    path = Path(config_path or os.environ.get("DOCKER_CONFIG", "~/.docker")).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    keys = _server_keys(registry)
    helpers = data.get("credHelpers") or {}
    for key in keys:
        if isinstance(helpers.get(key), str):
            return _from_helper(helpers[key], key)
    auths = data.get("auths") or {}
    for key in keys:
        entry = auths.get(key)
        if isinstance(entry, dict) and entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return user, password
    store = data.get("credsStore")
    if isinstance(store, str) and store:
        return _from_helper(store, keys[0])  # the name docker login stores under
    return None


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return scheme.lower(), params


class NotFound(RemoteError):
    """The registry answered 404: no such repository, tag or digest."""


class RegistryClient:
    """Talks to registries. ``insecure`` lists registries reached over plain HTTP (like dockerd's
    insecure-registries); loopback registries are always plain HTTP."""

    def __init__(self, insecure: list[str] | None = None, timeout: float = 15.0, docker_config: str | None = None):
        self.insecure = set(insecure or [])
        self.timeout = timeout
        self.docker_config = docker_config
        self._tokens: dict[tuple[str, str], str] = {}

    @staticmethod
    def _loopback(registry: str) -> bool:
        host = registry.rsplit(":", 1)[0] if not registry.endswith("]") else registry
        return host in ("localhost", "127.0.0.1", "[::1]")

    def _base(self, registry: str) -> str:
        plain = registry in self.insecure or self._loopback(registry)
        return f"{'http' if plain else 'https'}://{registry}"

    def _auth_header(self, ref: Reference, challenge: str, client: httpx.Client) -> dict[str, str]:
        scheme, params = _parse_challenge(challenge)
        creds = docker_credentials(ref.registry, self.docker_config)
        if scheme == "basic":
            if not creds:
                raise RemoteError(f"{ref.registry}: registry needs a login; run `docker login {ref.registry}`")
            token = base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            return {"Authorization": f"Basic {token}"}
        if scheme != "bearer" or "realm" not in params:
            raise RemoteError(f"{ref.registry}: unsupported auth challenge {scheme!r}")
        scope = params.get("scope") or f"repository:{ref.repository}:pull"
        key = (ref.registry, scope)
        if key not in self._tokens:
            query = {"service": params.get("service", ""), "scope": scope}
            import httpx

            auth = httpx.BasicAuth(*creds) if creds else None
            resp = client.get(params["realm"], params=query, auth=auth, timeout=self.timeout)
            if resp.status_code != 200:
                raise RemoteError(
                    f"{ref.registry}: token request refused (HTTP {resp.status_code}) for {ref.repository}; "
                    f"check `docker login {ref.registry}`"
                )
            body = resp.json()
            token = body.get("token") or body.get("access_token")
            if not token:
                raise RemoteError(f"{ref.registry}: token endpoint returned no token")
            self._tokens[key] = token
        return {"Authorization": f"Bearer {self._tokens[key]}"}

    def _manifest(self, ref: Reference, method: str) -> httpx.Response:
        target = ref.digest or ref.tag or "latest"
        url = f"{self._base(ref.registry)}/v2/{ref.repository}/manifests/{target}"
        headers = {"Accept": MANIFEST_TYPES}
        import httpx

        try:
            # loopback never goes through an HTTP proxy from the environment
            with httpx.Client(follow_redirects=True, max_redirects=5, timeout=self.timeout,
                              trust_env=not self._loopback(ref.registry)) as client:
                resp = client.request(method, url, headers=headers)
                for attempt in range(2):  # a cached token may have expired: fetch a fresh one once
                    if resp.status_code != 401 or "www-authenticate" not in resp.headers:
                        break
                    if attempt == 1:
                        self._tokens.clear()
                    headers.update(self._auth_header(ref, resp.headers["www-authenticate"], client))
                    resp = client.request(method, url, headers=headers)
                    if "Bearer" not in headers["Authorization"]:
                        break  # Basic credentials do not expire; a second try would be refused again
        except httpx.HTTPError as exc:
            raise RemoteError(f"{ref.registry}: cannot reach registry: {type(exc).__name__}: {exc}") from None
        if resp.status_code == 404:
            raise NotFound(f"{ref}: not found in {ref.registry} (no such repository, tag or digest)")
        if resp.status_code in (401, 403):
            raise RemoteError(f"{ref}: access denied by {ref.registry}; check `docker login {ref.registry}`")
        if resp.status_code >= 400:
            raise RemoteError(f"{ref}: registry answered HTTP {resp.status_code}")
        return resp

    def resolve(self, reference: str | Reference) -> str:
        """The digest a tag points at now (``sha256:...``)."""
        ref = parse_reference(reference) if isinstance(reference, str) else reference
        resp = self._manifest(ref, "HEAD")
        digest = resp.headers.get("docker-content-digest")
        if not digest:
            resp = self._manifest(ref, "GET")
            digest = "sha256:" + hashlib.sha256(resp.content).hexdigest()
        if not _DIGEST.match(digest):
            raise RemoteError(f"{ref}: registry returned a malformed digest {digest[:80]!r}")
        if ref.digest and digest != ref.digest:
            raise RemoteError(f"{ref}: registry returned {digest} for a pinned digest")
        return digest

    def exists(self, reference: str | Reference) -> bool:
        """Whether a pinned digest still resolves (for ``images.verify``)."""
        try:
            self.resolve(reference)
        except NotFound:
            return False
        return True


def manifest_digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def describe(ref: Reference) -> dict[str, Any]:
    return {"registry": ref.registry, "repository": ref.repository, "tag": ref.tag, "digest": ref.digest}
