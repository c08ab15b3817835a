"""Resolve image tags to digests, and fetch manifests and blobs, with the Registry HTTP API v2 (Docker Hub,
ghcr.io, private mirrors).

``parse_reference`` is pure. ``RegistryClient`` does the HTTP: a HEAD (then GET) of the manifest
with every manifest media type accepted, answering 401 challenges with Bearer tokens or Basic auth,
credentials from the usual Docker config (``~/.docker/config.json`` ``auths``). Credentials never
appear in errors or logs. Every request has a timeout; the redirect and retry count is bounded.

For image archives (``llmfleet.bundle``): ``image_manifest`` takes an index's linux/amd64 entry,
``fetch_blob`` streams a blob to disk hashing it while writing (a partial file is resumed with a
Range request; a bounded number of attempts; the file appears only with the right sha256).
"""

from __future__ import annotations

import base64
import functools
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
INDEX_TYPES = frozenset({"application/vnd.oci.image.index.v1+json",
                         "application/vnd.docker.distribution.manifest.list.v2+json"})
IMAGE_TYPES = frozenset({"application/vnd.oci.image.manifest.v1+json",
                         "application/vnd.docker.distribution.manifest.v2+json"})
MAX_MANIFEST = 4 * 1024 * 1024
CHUNK = 1024 * 1024
PLATFORM = "linux/amd64"  # what the fleet's hosts run
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

    def _client(self, ref: Reference) -> httpx.Client:
        import httpx

        # loopback never goes through an HTTP proxy from the environment
        return httpx.Client(follow_redirects=True, max_redirects=5, timeout=self.timeout,
                            trust_env=not self._loopback(ref.registry))

    def _send(self, ref: Reference, client: httpx.Client, method: str, url: str, headers: dict[str, str],
              *, stream: bool = False) -> httpx.Response:
        """One request, answering the registry's 401 challenge (a cached token may have expired: a
        fresh one is fetched once). ``stream``: the body is not read (the caller closes the response)."""
        resp = client.send(client.build_request(method, url, headers=headers), stream=stream)
        for attempt in range(2):
            if resp.status_code != 401 or "www-authenticate" not in resp.headers:
                break
            resp.close()
            if attempt == 1:
                self._tokens.clear()
            headers.update(self._auth_header(ref, resp.headers["www-authenticate"], client))
            resp = client.send(client.build_request(method, url, headers=headers), stream=stream)
            if "Bearer" not in headers["Authorization"]:
                break  # Basic credentials do not expire; a second try would be refused again
        return resp

    @staticmethod
    def _check(ref: Reference, resp: httpx.Response, what: str) -> None:
        if resp.status_code == 404:
            raise NotFound(f"{ref}: {what} not found in {ref.registry} (no such repository, tag or digest)")
        if resp.status_code in (401, 403):
            raise RemoteError(f"{ref}: access denied by {ref.registry}; check `docker login {ref.registry}`")
        if resp.status_code >= 400:
            raise RemoteError(f"{ref}: registry answered HTTP {resp.status_code} for {what}")

    def _manifest(self, ref: Reference, method: str) -> httpx.Response:
        target = ref.digest or ref.tag or "latest"
        url = f"{self._base(ref.registry)}/v2/{ref.repository}/manifests/{target}"
        import httpx

        try:
            with self._client(ref) as client:
                resp = self._send(ref, client, method, url, {"Accept": MANIFEST_TYPES})
        except httpx.HTTPError as exc:
            raise RemoteError(f"{ref.registry}: cannot reach registry: {type(exc).__name__}: {exc}") from None
        self._check(ref, resp, "manifest")
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


    # -- manifests and blobs: what an image archive needs (bundle.create) -------------------------

    def manifest(self, reference: str | Reference) -> tuple[str, str, bytes]:
        """(digest, media type, body) of the manifest or index a reference names; a pinned digest
        is checked against the body's sha256."""
        ref = parse_reference(reference) if isinstance(reference, str) else reference
        resp = self._manifest(ref, "GET")
        body = resp.content
        if len(body) > MAX_MANIFEST:
            raise RemoteError(f"{ref}: manifest of {len(body)} bytes is larger than {MAX_MANIFEST}")
        digest = manifest_digest(body)
        if ref.digest and digest != ref.digest:
            raise RemoteError(f"{ref}: registry returned a manifest whose sha256 is {digest}, not the pinned digest")
        media_type = resp.headers.get("content-type", "").split(";", 1)[0].strip()
        return digest, media_type or _media_type_of(body), body

    def image_manifest(self, reference: str | Reference, platform: str = PLATFORM) -> ImageManifest:
        """The image manifest to run on ``platform`` (``os/arch``): the reference's own manifest, or
        the entry of its index (manifest list) for that platform, fetched by digest."""
        ref = parse_reference(reference) if isinstance(reference, str) else reference
        digest, media_type, body = self.manifest(ref)
        index_digest = None
        if media_type in INDEX_TYPES or (not media_type and _media_type_of(body) in INDEX_TYPES):
            entry = pick_platform(_json(ref, body), platform, where=str(ref))
            index_digest = digest
            sub = Reference(ref.registry, ref.repository, None, entry["digest"])
            digest, media_type, body = self.manifest(sub)
        return parse_image_manifest(body, media_type, digest, where=str(ref), index_digest=index_digest)

    def fetch_blob(self, reference: str | Reference, digest: str, dest: Path, *, size: int | None = None,
                   attempts: int = 3) -> int:
        """Stream one blob to ``dest``, hashing while writing; the file appears only when its sha256 is
        ``digest`` (a ``.part`` file is resumed with a Range request on the next attempt). A file
        already at ``dest`` with that sha256 is kept. Returns its size. Bounded: ``attempts`` tries,
        each request with the client's timeout between bytes."""
        ref = parse_reference(reference) if isinstance(reference, str) else reference
        if not _DIGEST.match(digest):
            raise RemoteError(f"{ref}: blob digest {digest[:80]!r} is not sha256:<64 hex>")
        if dest.is_file() and file_sha256(dest) == digest:
            return dest.stat().st_size
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".part")
        url = f"{self._base(ref.registry)}/v2/{ref.repository}/blobs/{digest}"
        import httpx

        last = ""
        for _ in range(max(1, attempts)):
            have = part.stat().st_size if part.is_file() else 0
            h = hashlib.sha256()
            if have:
                with part.open("rb") as fh:
                    for chunk in iter(functools.partial(fh.read, CHUNK), b""):
                        h.update(chunk)
            headers = {"Range": f"bytes={have}-"} if have else {}
            try:
                with self._client(ref) as client:
                    resp = self._send(ref, client, "GET", url, headers, stream=True)
                    try:
                        if have and resp.status_code == 416 and size is not None and have >= size:
                            pass  # the part holds every byte already
                        else:
                            if resp.status_code not in (200, 206):
                                resp.read()
                                self._check(ref, resp, f"blob {digest}")
                                raise RemoteError(f"{ref}: registry answered HTTP {resp.status_code} for blob {digest}")
                            if resp.status_code == 200 and have:  # no range support: start over
                                have, h = 0, hashlib.sha256()
                            with part.open("ab" if have else "wb") as out:
                                for chunk in resp.iter_bytes(CHUNK):
                                    h.update(chunk)
                                    out.write(chunk)
                                    have += len(chunk)
                                    if size is not None and have > size:
                                        break
                    finally:
                        resp.close()
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            got = "sha256:" + h.hexdigest()
            if got == digest and (size is None or have == size):
                part.replace(dest)
                return have
            part.unlink(missing_ok=True)  # wrong bytes are never resumed
            last = f"received {have} bytes with sha256 {got}" + (f", expected {size} bytes" if size is not None else "")
        raise RemoteError(f"{ref}: blob {digest} could not be fetched intact after {max(1, attempts)} attempts ({last})")


def manifest_digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def describe(ref: Reference) -> dict[str, Any]:
    return {"registry": ref.registry, "repository": ref.repository, "tag": ref.tag, "digest": ref.digest}


# ------------------------------------------------------------------------------------------------
# Image manifests (pure)



@dataclass(frozen=True)
class ImageManifest:
    """One platform's image manifest: its digest and bytes, its config and layer descriptors, and
    the index it was picked from (None when the reference named the image manifest itself)."""

    digest: str
    media_type: str
    body: bytes
    config: dict[str, Any]
    layers: tuple[dict[str, Any], ...]
    index_digest: str | None = None

    @property
    def image_id(self) -> str:
        """What a classic Docker image store calls the image once loaded: its config's digest."""
        return str(self.config["digest"])


def _json(ref: Any, body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        raise RemoteError(f"{ref}: the registry's manifest is not JSON") from None
    if not isinstance(data, dict):
        raise RemoteError(f"{ref}: the registry's manifest is not a JSON object")
    return data


def _media_type_of(body: bytes) -> str:
    """A manifest's media type from its own ``mediaType`` (OCI makes it optional: an index has
    ``manifests``, an image ``config``)."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(data, dict):
        return ""
    if isinstance(data.get("mediaType"), str):
        return data["mediaType"]
    if "manifests" in data:
        return "application/vnd.oci.image.index.v1+json"
    return "application/vnd.oci.image.manifest.v1+json" if "config" in data else ""


def pick_platform(index: dict[str, Any], platform: str = PLATFORM, *, where: str = "image") -> dict[str, Any]:
    """The entry of an index for ``os/arch[/variant]`` (attestation entries, whose platform is
    unknown/unknown, never match)."""
    want = platform.split("/")
    seen = []
    for entry in index.get("manifests") or []:
        if not isinstance(entry, dict) or not _DIGEST.match(str(entry.get("digest", ""))):
            continue
        p = entry.get("platform") or {}
        have = [str(p.get("os", "")), str(p.get("architecture", ""))] + ([str(p["variant"])] if p.get("variant") else [])
        seen.append("/".join(have))
        if have[:2] == want[:2] and (len(want) < 3 or have[2:3] == want[2:3]):
            return entry
    raise RemoteError(f"{where}: the index has no {platform} image (it has: {', '.join(seen) or 'none'})")


def parse_image_manifest(body: bytes, media_type: str, digest: str, *, where: str = "image",
                         index_digest: str | None = None) -> ImageManifest:
    """An image manifest's config and layers, each descriptor with a sha256 digest and a size."""
    data = _json(where, body)
    media_type = media_type or _media_type_of(body)
    if data.get("schemaVersion") != 2 or media_type not in IMAGE_TYPES:
        raise RemoteError(f"{where}: manifest type {media_type or 'unknown'!r} is not an image manifest "
                          "(schema 2 or OCI); re-push the image with a current client")
    descs = [data.get("config"), *(data.get("layers") or [])]
    for d in descs:
        if not isinstance(d, dict) or not _DIGEST.match(str(d.get("digest", ""))) or not isinstance(d.get("size"), int):
            raise RemoteError(f"{where}: manifest {digest} has a descriptor without a sha256 digest and size")
    return ImageManifest(digest=digest, media_type=media_type, body=body, config=descs[0], layers=tuple(descs[1:]),
                         index_digest=index_digest)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()
