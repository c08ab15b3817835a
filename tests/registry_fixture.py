"""A real Docker registry (Debian's docker-registry, distribution 2.8) on 127.0.0.1 for tests.

Three flavours, each a child process with its own port, storage folder and config:
- ``registry``: no auth;
- ``registry_basic``: htpasswd (HTTP Basic), the way a small private mirror is often run;
- ``registry_token``: Bearer tokens from a token server (a small HTTP server in the test process
  that checks Basic credentials and signs RS256 JWTs with a self-signed certificate the registry
  trusts), the way Docker Hub and ghcr.io answer.

``push_image`` uploads a config blob, a layer and an image manifest through the Registry HTTP API
(no Docker engine needed) and returns the manifest digest the registry reports. Loopback only;
every wait is bounded.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

REGISTRY_BIN = shutil.which("docker-registry") or "/usr/bin/docker-registry"
USER, PASSWORD = "fleet", "s3cret-Pw!"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT, as an image reference names it
    url: str
    auth: str  # none | basic | token
    proc: subprocess.Popen
    dir: Path
    extra: dict = field(default_factory=dict)

    def client_auth(self) -> httpx.Auth | None:
        if self.auth == "basic":
            return httpx.BasicAuth(USER, PASSWORD)
        if self.auth == "token":
            return _TokenAuth(self.extra["token_url"])
        return None


class _TokenAuth(httpx.Auth):
    """Test-side pusher auth for the token registry: asks the token server for push+pull."""

    def __init__(self, token_url: str):
        self.token_url = token_url

    def auth_flow(self, request):
        path = request.url.path
        repo = path.split("/v2/", 1)[1].rsplit("/blobs/", 1)[0].rsplit("/manifests/", 1)[0]
        tok = httpx.get(
            self.token_url, params={"service": "llmfleet-test", "scope": f"repository:{repo}:push,pull"},
            auth=(USER, PASSWORD), timeout=10,
        ).json()["token"]
        request.headers["Authorization"] = f"Bearer {tok}"
        yield request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _make_cert(tmp: Path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmfleet-test-token-issuer")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    (tmp / "token.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert.public_bytes(serialization.Encoding.DER)


def _token_server(key, cert_der: bytes, issued: list):
    """A token endpoint: Basic creds in, an RS256 JWT granting the requested scope out."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            q = parse_qs(urlparse(self.path).query)
            hdr = self.headers.get("Authorization", "")
            access = []
            ok_user = hdr == "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            issued.append({"scope": q.get("scope", [""])[0], "basic": bool(hdr), "ok": ok_user})
            if hdr and not ok_user:
                self.send_response(401)
                self.end_headers()
                return
            for scope in q.get("scope", []):
                typ, name, actions = scope.split(":")
                if ok_user:  # anonymous callers get nothing (a private registry)
                    access.append({"type": typ, "name": name, "actions": actions.split(",")})
            now = int(time.time())
            header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(cert_der).decode()]}
            claims = {"iss": "llmfleet-test-issuer", "sub": USER if ok_user else "", "aud": "llmfleet-test",
                      "exp": now + 300, "nbf": now - 30, "iat": now, "jti": uuid.uuid4().hex, "access": access}
            signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
            sig = key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
            body = json.dumps({"token": f"{signing}.{_b64url(sig)}"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def start_registry(tmp: Path, auth: str = "none") -> Registry:
    if not Path(REGISTRY_BIN).exists():
        pytest.fail("these tests need Debian's docker-registry (apt-get install docker-registry; "
                    "scripts/bootstrap.sh installs it)", pytrace=False)
    tmp.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    extra: dict = {}
    cfg = [
        "version: 0.1",
        "log:\n  level: error\n  accesslog:\n    disabled: true",
        f"storage:\n  filesystem:\n    rootdirectory: {tmp / 'data'}\n  delete:\n    enabled: true",
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: llmfleet-test-secret",
    ]
    if auth == "basic":
        import bcrypt

        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=5)).decode()
        (tmp / "htpasswd").write_text(f"{USER}:{hashed}\n")
        cfg.append(f"auth:\n  htpasswd:\n    realm: llmfleet-test\n    path: {tmp / 'htpasswd'}")
    elif auth == "token":
        key, der = _make_cert(tmp)
        issued: list = []
        srv = _token_server(key, der, issued)
        token_url = f"http://127.0.0.1:{srv.server_address[1]}/token"
        extra.update(token_url=token_url, token_server=srv, issued=issued)
        cfg.append(
            "auth:\n  token:\n"
            f"    realm: {token_url}\n    service: llmfleet-test\n    issuer: llmfleet-test-issuer\n"
            f"    rootcertbundle: {tmp / 'token.crt'}"
        )
    (tmp / "config.yml").write_text("\n".join(cfg) + "\n")
    log = open(tmp / "registry.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([REGISTRY_BIN, "serve", str(tmp / "config.yml")], stdout=log, stderr=log,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {(tmp / 'registry.log').read_text()[-2000:]}")
        try:
            httpx.get(f"{url}/v2/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    else:
        proc.kill()
        raise RuntimeError("docker-registry did not answer on /v2/ within 20 s")
    return Registry(host=f"127.0.0.1:{port}", url=url, auth=auth, proc=proc, dir=tmp, extra=extra)


def stop_registry(reg: Registry) -> None:
    reg.proc.terminate()
    try:
        reg.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        reg.proc.kill()
    srv = reg.extra.get("token_server")
    if srv is not None:
        srv.shutdown()


def _put_blob(client: httpx.Client, reg: Registry, repo: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = client.post(f"{reg.url}/v2/{repo}/blobs/uploads/")
    assert r.status_code == 202, r.text
    loc = r.headers["location"]
    loc = loc if loc.startswith("http") else reg.url + loc
    sep = "&" if "?" in loc else "?"
    r = client.put(f"{loc}{sep}digest={digest.replace(':', '%3A')}", content=data,
                   headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    return digest


def push_image(reg: Registry, repo: str, tag: str, payload: str = "hello") -> str:
    """Push a tiny one-layer image under ``repo:tag``; returns the manifest digest the registry reports."""
    with httpx.Client(auth=reg.client_auth(), timeout=10) as client:
        layer = payload.encode()  # content is never unpacked by the registry
        layer_digest = _put_blob(client, reg, repo, layer)
        config = json.dumps({"architecture": "amd64", "os": "linux",
                             "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}).encode()
        config_digest = _put_blob(client, reg, repo, config)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST_V2,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
                       "digest": config_digest},
            "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(layer),
                        "digest": layer_digest}],
        }).encode()
        r = client.put(f"{reg.url}/v2/{repo}/manifests/{tag}", content=manifest,
                       headers={"Content-Type": MANIFEST_V2})
        assert r.status_code == 201, r.text
        digest = r.headers["docker-content-digest"]
        assert digest == "sha256:" + hashlib.sha256(manifest).hexdigest()
        return digest


OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def _layer(files: dict[str, bytes]) -> tuple[bytes, str]:
    """A gzip-compressed tar layer holding ``files``; (compressed bytes, diff_id of the tar)."""
    import gzip
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    return gzip.compress(tar_bytes, mtime=0), "sha256:" + hashlib.sha256(tar_bytes).hexdigest()


def push_loadable_image(reg: Registry, repo: str, tag: str, files: dict[str, bytes] | None = None,
                        *, index: bool = True) -> dict[str, str]:
    """Push an image ``docker load`` can run: a real gzip tar layer and a config whose diff_ids match,
    under an OCI index with linux/amd64 and linux/arm64 entries (``index=False``: the manifest alone).
    Returns the digests: ``ref`` (what the tag points at), ``manifest`` (linux/amd64), ``config``
    (the image ID a classic store gives it), ``layer``."""
    files = files or {"hello.txt": b"hello from a bundle\n"}
    out: dict[str, str] = {}
    entries = []
    with httpx.Client(auth=reg.client_auth(), timeout=10) as client:
        for arch in (("amd64", "arm64") if index else ("amd64",)):
            layer, diff_id = _layer({**files, "arch": arch.encode()})
            layer_digest = _put_blob(client, reg, repo, layer)
            config = json.dumps({"architecture": arch, "os": "linux", "config": {"Cmd": ["/bin/true"]},
                                 "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
            config_digest = _put_blob(client, reg, repo, config)
            manifest = json.dumps({
                "schemaVersion": 2, "mediaType": MANIFEST_V2,
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
                           "digest": config_digest},
                "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(layer),
                            "digest": layer_digest}],
            }).encode()
            digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
            r = client.put(f"{reg.url}/v2/{repo}/manifests/{digest if index else tag}", content=manifest,
                           headers={"Content-Type": MANIFEST_V2})
            assert r.status_code == 201, r.text
            entries.append({"mediaType": MANIFEST_V2, "digest": digest, "size": len(manifest),
                            "platform": {"architecture": arch, "os": "linux"}})
            if arch == "amd64":
                out.update(manifest=digest, config=config_digest, layer=layer_digest, ref=digest)
        if index:
            body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
            r = client.put(f"{reg.url}/v2/{repo}/manifests/{tag}", content=body, headers={"Content-Type": OCI_INDEX})
            assert r.status_code == 201, r.text
            out["ref"] = r.headers["docker-content-digest"]
    return out


def blob_path(reg: Registry, digest: str) -> Path:
    """Where the registry's filesystem storage keeps a blob (to damage it in a test)."""
    hexd = digest.split(":", 1)[1]
    return reg.dir / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"


def delete_manifest(reg: Registry, repo: str, digest: str) -> None:
    with httpx.Client(auth=reg.client_auth(), timeout=10) as client:
        r = client.delete(f"{reg.url}/v2/{repo}/manifests/{digest}")
        assert r.status_code == 202, r.text


@pytest.fixture(scope="session", name="registry")
def registry_fixture(tmp_path_factory):
    reg = start_registry(tmp_path_factory.mktemp("registry"), "none")
    yield reg
    stop_registry(reg)


@pytest.fixture(scope="session", name="registry_basic")
def registry_basic_fixture(tmp_path_factory):
    reg = start_registry(tmp_path_factory.mktemp("registry-basic"), "basic")
    yield reg
    stop_registry(reg)


@pytest.fixture(scope="session", name="registry_token")
def registry_token_fixture(tmp_path_factory):
    reg = start_registry(tmp_path_factory.mktemp("registry-token"), "token")
    yield reg
    stop_registry(reg)


def docker_config(tmp: Path, host: str, user: str = USER, password: str = PASSWORD) -> Path:
    """A ~/.docker/config.json with an ``auths`` entry for ``host`` (as ``docker login`` writes it)."""
    tmp.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (tmp / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return tmp
