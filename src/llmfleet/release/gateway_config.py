"""The gateway's files and its runtime-API commands (HAProxy 2.6): a typed spec in, exact text out.

One OpenAI endpoint in front of the replicas (issue #36). ``render_files`` turns a ``GatewaySpec`` into
the files of the gateway's configuration folder (``config_dir`` inside the container):

- ``haproxy.cfg``: a frontend on ``bind:port`` (TLS with ``tls.pem`` when ``tls``) that answers
  ``/llmfleet/health`` itself (``monitor-uri``), checks the client's key (the bearer token's sha256
  looked up in ``keys.map``: no key is written anywhere in clear), counts each key's requests over
  60 s in a stick table against its own limit (``limits.map``), answers ``GET /v1/models`` from
  ``models.json``, refuses a body over ``max_body_bytes``, reads ``model`` from the JSON body
  (``option http-buffer-request``: the body must fit in ``tune.bufsize``, sized from the limit) and sends
  the request to that served name's backend (``models.map``); one backend per served name
  (``balance leastconn``, health checks on ``GET /health``, a retry on another replica only when
  the connection failed or nothing came back). A replica's own API key comes from an environment
  variable (``"${KEY_ENV}"``, expanded by HAProxy), never from this file. Responses are not buffered
  (streams pass through). The access log carries the key's name, never the Authorization header or
  the body. A second frontend on ``<bind>:<admin_port + 1>`` serves HAProxy's own ``/metrics``
  (its built-in Prometheus exporter); the runtime API listens on ``127.0.0.1:<admin_port>``.
- ``keys.map`` (sha256 hex -> key name), ``limits.map`` (key name -> requests per minute),
  ``models.map`` (served name -> backend), ``models.json`` (the union of served names, OpenAI's list),
  ``errors/*.json`` (OpenAI-style error bodies for 400, 401, 404, 413, 429 and HAProxy's own 502, 503, 504).

Every value of the spec is checked (names to HAProxy's name characters, paths, ports, hex, environment
variable names) before it reaches the text: an inventory value never breaks a line or a word of the
configuration (``ValueError`` naming the gateway, the field and what is allowed).

The runtime API (``admin_script`` + ``drain_command`` / ``ready_command`` / ``maint_command`` /
``show_stat_command``; ``parse_show_stat``, ``command_error``) drains a replica without a reload.
Pure: no I/O. Golden files in tests/golden/gateway/ pin the text.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass

CONFIG_FILE = "haproxy.cfg"
KEYS_MAP = "keys.map"
LIMITS_MAP = "limits.map"
MODELS_MAP = "models.map"
MODELS_JSON = "models.json"
TLS_PEM = "tls.pem"  # certificate + key, a secret file written beside the others (not rendered here)
ERRORS_DIR = "errors"
HEALTH_PATH = "/llmfleet/health"
MODELS_PATH = "/v1/models"
METRICS_PATH = "/metrics"
REPLICA_HEALTH_PATH = "/health"
RATE_WINDOW_S = 60
BUFFER_HEADROOM = 64 * 1024  # request line and headers, beside the largest body routed by model
MAX_BODY_LIMIT = 64 * 1024 * 1024  # one stream may hold two buffers of tune.bufsize
ADMIN_TIMEOUT_S = 10

_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]+")
_NAME_CHARS_RE = re.compile(r"[^A-Za-z0-9_.:-]")
_SERVED_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]*")
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEX64_RE = re.compile(r"[0-9a-f]{64}")
_DNS_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*")
_PATH_RE = re.compile(r"/[A-Za-z0-9_./-]*")
_MAX_NAME = 64
_MAX_SERVED = 128


@dataclass(frozen=True, kw_only=True)
class Replica:
    host: str  # inventory host name
    service: str  # inventory service name
    address: str  # where the gateway reaches it: an IP address or a DNS name
    port: int
    served_name: str  # the ``model`` clients name
    key_env: str | None  # environment variable holding the replica's own API key (None: it needs none)
    maxconn: int  # requests sent to it at once; more wait in the backend's queue


@dataclass(frozen=True, kw_only=True)
class ClientKey:
    name: str  # shown in logs and metrics, never the key
    sha256_hex: str  # sha256 of the key, lowercase hex
    requests_per_minute: int | None  # None: no limit


@dataclass(frozen=True, kw_only=True)
class GatewaySpec:
    name: str
    bind: str  # address the clients' frontend listens on ("0.0.0.0", "::", or one of the host's)
    port: int
    admin_port: int  # runtime API on 127.0.0.1:<admin_port>, metrics on <bind>:<admin_port + 1>
    tls: bool  # terminate TLS with <config_dir>/tls.pem
    max_body_bytes: int  # larger request bodies: 413
    timeout_s: int  # a whole request (long generations), also how long a reload lets old streams run
    connect_timeout_s: int = 5
    body_timeout_s: int = 60  # a client's request line, headers and body must arrive within this
    replicas: tuple[Replica, ...]
    keys: tuple[ClientKey, ...]
    config_dir: str  # where these files are inside the container


@dataclass(frozen=True)
class ServerState:
    status: str  # as HAProxy says it: UP, DOWN, DRAIN, MAINT, "UP 1/2", "no check", ...
    current_sessions: int  # requests on that replica now (show stat's scur)


# ---------------------------------------------------------------------------------------------
# Names


def _sanitise(value: str) -> str:
    """``value`` in HAProxy's name characters; a changed value gets a short hash of the original so two
    different values never share a name."""
    clean = _NAME_CHARS_RE.sub("_", value)
    if clean != value or not clean:
        clean = f"{clean}_{hashlib.sha256(value.encode()).hexdigest()[:8]}"
    return clean


def backend_name(served_name: str) -> str:
    """The backend of one served name (``m_`` + the name in HAProxy's name characters)."""
    return "m_" + _sanitise(served_name)


def server_name(host: str, service: str) -> str:
    """A replica's server name in its backend: ``<host>__<service>``, in HAProxy's name characters."""
    return _sanitise(f"{host}__{service}")


# ---------------------------------------------------------------------------------------------
# Checks


def _fail(spec_name: str, field: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"gateway {spec_name!r}: {field} {value!r} is not allowed: {allowed}")


def _check_name(gw: str, field: str, value: str) -> None:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or len(value) > _MAX_NAME:
        raise _fail(gw, field, value, f"use 1 to {_MAX_NAME} of A-Z a-z 0-9 _ . : -")


def _check_port(gw: str, field: str, value: int, top: int = 65535) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise _fail(gw, field, value, f"a port is a whole number from 1 to {top}")


def _check_positive(gw: str, field: str, value: int, top: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (top is not None and value > top):
        bound = f" up to {top}" if top is not None else ""
        raise _fail(gw, field, value, f"a whole number from 1{bound}")


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _check_address(gw: str, field: str, value: str, *, dns: bool) -> None:
    if not isinstance(value, str) or (not _is_ip(value) and not (dns and len(value) <= 253 and _DNS_RE.fullmatch(value))):
        raise _fail(gw, field, value, "an IP address" + (" or a DNS name" if dns else ""))


def _check_served(gw: str, field: str, value: str) -> None:
    if not isinstance(value, str) or not _SERVED_RE.fullmatch(value) or len(value) > _MAX_SERVED:
        raise _fail(gw, field, value,
                    f"a served name is 1 to {_MAX_SERVED} of A-Z a-z 0-9 _ . : / @ + -, starting with a letter or digit")


def check_spec(spec: GatewaySpec) -> None:
    """Every value of the spec, checked before it reaches a file (``ValueError`` naming the field)."""
    gw = spec.name
    _check_name(gw, "name", spec.name)
    _check_address(gw, "bind", spec.bind, dns=False)
    _check_port(gw, "port", spec.port)
    _check_port(gw, "admin_port", spec.admin_port, 65534)
    if spec.port in (spec.admin_port, spec.admin_port + 1):
        raise _fail(gw, "port", spec.port, f"the admin port {spec.admin_port} and the metrics port "
                    f"{spec.admin_port + 1} are the gateway's own: pick another port or admin_port")
    _check_positive(gw, "max_body_bytes", spec.max_body_bytes, MAX_BODY_LIMIT)
    _check_positive(gw, "timeout_s", spec.timeout_s)
    _check_positive(gw, "connect_timeout_s", spec.connect_timeout_s)
    _check_positive(gw, "body_timeout_s", spec.body_timeout_s)
    if not isinstance(spec.tls, bool):
        raise _fail(gw, "tls", spec.tls, "true or false")
    if (not isinstance(spec.config_dir, str) or not _PATH_RE.fullmatch(spec.config_dir) or ".." in spec.config_dir
            or len(spec.config_dir) > 200):
        raise _fail(gw, "config_dir", spec.config_dir, "an absolute path of A-Z a-z 0-9 _ . / - without '..'")
    seen_servers: set[tuple[str, str]] = set()
    for r in spec.replicas:
        where = f"replica {r.host!r}/{r.service!r}"
        if not isinstance(r.host, str) or not r.host or not isinstance(r.service, str) or not r.service \
                or any(c in r.host + r.service for c in "\r\n\0"):
            raise _fail(gw, "replica host/service", f"{r.host}/{r.service}", "non-empty names on one line")
        _check_address(gw, f"{where} address", r.address, dns=True)
        _check_port(gw, f"{where} port", r.port)
        _check_served(gw, f"{where} served_name", r.served_name)
        _check_positive(gw, f"{where} maxconn", r.maxconn)
        if r.key_env is not None and (not isinstance(r.key_env, str) or not _ENV_RE.fullmatch(r.key_env)):
            raise _fail(gw, f"{where} key_env", r.key_env, "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        server = (backend_name(r.served_name), server_name(r.host, r.service))
        if server in seen_servers:
            raise _fail(gw, "replicas", f"{r.host}/{r.service}", "each host's service is one replica, listed once")
        seen_servers.add(server)
    for served, group in _by_served(spec.replicas).items():
        envs = sorted({r.key_env or "" for r in group})
        if len(envs) > 1:
            holders = ", ".join(f"{r.host}/{r.service}: {r.key_env or 'no key'}" for r in group)
            raise ValueError(f"gateway {gw!r}: the replicas of {served!r} must share one API key environment "
                             f"variable (or all need none), got {holders}")
    names: set[str] = set()
    hashes: set[str] = set()
    for k in spec.keys:
        _check_name(gw, "api key name", k.name)
        if not isinstance(k.sha256_hex, str) or not _HEX64_RE.fullmatch(k.sha256_hex):
            raise _fail(gw, f"api key {k.name!r} sha256_hex", "(hidden)", "64 lowercase hex digits")
        if k.requests_per_minute is not None:
            _check_positive(gw, f"api key {k.name!r} requests_per_minute", k.requests_per_minute)
        if k.name in names:
            raise _fail(gw, "api key name", k.name, "each key's name once")
        if k.sha256_hex in hashes:
            raise ValueError(f"gateway {gw!r}: api key {k.name!r} is the same key as another one: give each its own")
        names.add(k.name)
        hashes.add(k.sha256_hex)


def _by_served(replicas: Iterable[Replica]) -> dict[str, list[Replica]]:
    out: dict[str, list[Replica]] = {}
    for r in replicas:
        out.setdefault(r.served_name, []).append(r)
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------------------------------
# Files


def buffer_size(max_body_bytes: int) -> int:
    """``tune.bufsize``: the largest body routed by model plus room for the request line and headers."""
    return max_body_bytes + BUFFER_HEADROOM


# glibc's malloc serves an allocation at or above its mmap threshold (128 KiB by default) with a fresh
# mmap and gives it back with munmap when freed: HAProxy's buffers of tune.bufsize (megabytes here, so
# that a long prompt can be routed by its model) then cost page faults on every request. Measured on the
# lab (HAProxy 2.6.12, tune.bufsize 4 MiB, sequential 1-token completions from the gateway host): 3.5 ms
# through the gateway against 0.6 ms straight to the replica; 1.2 ms with the thresholds below, 1.0 ms with
# a 64 KiB tune.bufsize. mallopt(3): the thresholds can be set by these environment variables; the mmap
# threshold's upper limit is 32 MiB on 64-bit systems (https://man7.org/linux/man-pages/man3/mallopt.3.html).
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
TRIM_THRESHOLD_MIN = 64 * 1024 * 1024


def allocator_env(bufsize: int) -> dict[str, str]:
    """The gateway container's glibc malloc settings for buffers of ``bufsize`` (see above): every
    allocation up to 32 MiB from the heap, and freed memory kept for the next request (at least four
    buffers' worth). A buffer above 32 MiB is still mapped per request: glibc allows no higher threshold."""
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_MAX),
            "MALLOC_TRIM_THRESHOLD_": str(max(TRIM_THRESHOLD_MIN, 4 * bufsize))}


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


def _error(message: str, type_: str, code: str) -> str:
    return json.dumps({"error": {"message": message, "type": type_, "code": code}}, ensure_ascii=True) + "\n"


def error_bodies(spec: GatewaySpec) -> dict[str, str]:
    """``errors/<name>.json``: OpenAI-style error bodies (``{"error": {message, type, code}}``)."""
    known = ", ".join(sorted(_by_served(spec.replicas))) or "none"
    return {
        f"{ERRORS_DIR}/400.json": _error(
            f"The request names no model: the gateway routes by the \"model\" field of the JSON body. "
            f"Known models: {known}.", "invalid_request_error", "model_required"),
        f"{ERRORS_DIR}/401.json": _error(
            "Missing or invalid API key: send it as 'Authorization: Bearer <key>'.",
            "invalid_request_error", "invalid_api_key"),
        f"{ERRORS_DIR}/404.json": _error(
            f"The model named in the request is not served here. Known models: {known}.",
            "invalid_request_error", "model_not_found"),
        f"{ERRORS_DIR}/413.json": _error(
            f"The request body is larger than this gateway's limit of {_mib(spec.max_body_bytes)} "
            f"({spec.max_body_bytes} bytes): send a smaller request, or raise the gateway's max_body_mib.",
            "invalid_request_error", "request_too_large"),
        f"{ERRORS_DIR}/429.json": _error(
            f"Rate limit reached for this API key: too many requests in the last {RATE_WINDOW_S} seconds. "
            "Retry later.", "requests", "rate_limit_exceeded"),
        f"{ERRORS_DIR}/502.json": _error(
            "The replica serving this model gave no valid answer. Retry.", "server_error", "bad_gateway"),
        f"{ERRORS_DIR}/503.json": _error(
            "No replica of this model is up now, or all are busy past the gateway's wait. Retry later.",
            "server_error", "service_unavailable"),
        f"{ERRORS_DIR}/504.json": _error(
            f"The replica did not answer within the gateway's limit of {spec.timeout_s} s.",
            "server_error", "timeout"),
    }


def models_json(spec: GatewaySpec) -> str:
    """``GET /v1/models``: the union of the served names, sorted, as OpenAI lists models."""
    data = [{"id": name, "object": "model", "owned_by": "llmfleet"} for name in sorted(_by_served(spec.replicas))]
    return json.dumps({"object": "list", "data": data}, ensure_ascii=True) + "\n"


def keys_map(spec: GatewaySpec) -> str:
    lines = [f"{k.sha256_hex} {k.name}" for k in sorted(spec.keys, key=lambda k: k.name)]
    return "# sha256 of a client's key (lowercase hex) -> the key's name\n" + "".join(f"{x}\n" for x in lines)


def limits_map(spec: GatewaySpec) -> str:
    lines = [f"{k.name} {k.requests_per_minute}" for k in sorted(spec.keys, key=lambda k: k.name)
             if k.requests_per_minute is not None]
    return (f"# key name -> requests allowed in any {RATE_WINDOW_S} s (a key not listed has no limit)\n"
            + "".join(f"{x}\n" for x in lines))


def models_map(spec: GatewaySpec) -> str:
    lines = [f"{served} {backend_name(served)}" for served in _by_served(spec.replicas)]
    return "# served name (the request's \"model\") -> backend\n" + "".join(f"{x}\n" for x in lines)


def _bind_address(address: str, port: int) -> str:
    if ipaddress.ip_address(address).version == 6:
        return f"ipv6@{address}:{port}"
    return f"{address}:{port}"


def _server_address(address: str, port: int) -> str:
    if _is_ip(address) and ipaddress.ip_address(address).version == 6:
        return f"ipv6@{address}:{port}"
    return f"{address}:{port}"


def _key_lines(path: str, ret: Callable[..., str]) -> list[str]:
    """The client key check and each key's rate limit (the gateway has keys)."""
    return [
        "    # the client's key: the bearer token's sha256 looked up in keys.map gives its name",
        "    http-request set-var(txn.key_name) req.fhdr(authorization),bytes(7),sha2(256),hex,lower,"
        f"map({path}{KEYS_MAP}) if {{ req.fhdr(authorization) -m beg -i \"bearer \" }}",
        "    " + ret(401, "401", ' hdr WWW-Authenticate "Bearer"') + " unless { var(txn.key_name) -m found }",
        "    http-request del-header authorization",
        f"    # each key's own limit (limits.map) on its requests in the last {RATE_WINDOW_S} s",
        "    http-request track-sc0 var(txn.key_name)",
        f"    http-request set-var(txn.rpm) var(txn.key_name),map_str_int({path}{LIMITS_MAP})",
        "    " + ret(429, "429", f' hdr Retry-After "{RATE_WINDOW_S}"')
        + " if { var(txn.rpm) -m found } { sc_http_req_rate(0),sub(txn.rpm) gt 0 }",
    ]


def haproxy_cfg(spec: GatewaySpec) -> str:
    """The configuration text (the spec is assumed checked: ``render_files`` checks it)."""
    d = spec.config_dir.rstrip("/") or "/"
    path = f"{d}/" if d != "/" else "/"
    out = _global_section(spec, path) + _defaults_section(spec, path) + _frontend_section(spec, path)
    out += _backend_sections(spec) + _metrics_section(spec)
    return "\n".join(out) + "\n"


def _returner(path: str) -> Callable[..., str]:
    """``http-request return`` of one of the gateway's JSON error bodies."""
    def ret(status: int, name: str, extra: str = "") -> str:
        return f"http-request return status {status} content-type application/json file {path}{ERRORS_DIR}/{name}.json{extra}"

    return ret


def _global_section(spec: GatewaySpec, path: str) -> list[str]:
    bufsize = buffer_size(spec.max_body_bytes)
    limit = spec.max_body_bytes
    out = [
        f"# The gateway {spec.name}, rendered by llmfleet (llmfleet.release.gateway_config): a deploy writes it again.",
        "# No secret is in this file: client keys are sha256 hashes in keys.map, a replica's own key comes",
        "# from its environment variable.",
        "global",
        "    log stdout format raw local0 info",
        "    maxconn 4096",
        "    # a reload (SIGUSR2 to the master) lets the old worker's streams run up to the request timeout",
        f"    hard-stop-after {spec.timeout_s}s",
        "    # the runtime API (drain / ready a replica, show stat) on loopback only, for llmfleet on this host",
        f"    stats socket ipv4@127.0.0.1:{spec.admin_port} level admin",
        f"    # tune.bufsize {bufsize}: the largest body routed by its model ({limit} bytes, {_mib(limit)}) plus",
        f"    # {BUFFER_HEADROOM // 1024} KiB for the request line and headers. Each request in flight may hold up to two",
        f"    # buffers of this size (request and response): about {_mib(2 * bufsize)} per stream; idle connections",
        "    # hold none.",
        f"    tune.bufsize {bufsize}",
    ]
    if spec.tls:
        out.append("    ssl-default-bind-options ssl-min-ver TLSv1.2")
    return out


def _defaults_section(spec: GatewaySpec, path: str) -> list[str]:
    return [
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option dontlognull",
        "    # each chunk of a streamed answer goes out as it comes (no response buffering, no Nagle delay)",
        "    option http-no-delay",
        "    option forwardfor",
        f"    timeout connect {spec.connect_timeout_s}s",
        f"    timeout client {spec.timeout_s}s",
        f"    timeout server {spec.timeout_s}s",
        f"    timeout tunnel {spec.timeout_s}s",
        f"    timeout queue {spec.timeout_s}s",
        f"    timeout http-request {min(spec.body_timeout_s, spec.timeout_s)}s",
        "    timeout http-keep-alive 10s",
        "    timeout check 5s",
        f"    http-error status 502 content-type application/json file {path}{ERRORS_DIR}/502.json",
        f"    http-error status 503 content-type application/json file {path}{ERRORS_DIR}/503.json",
        f"    http-error status 504 content-type application/json file {path}{ERRORS_DIR}/504.json",
    ]


def _frontend_section(spec: GatewaySpec, path: str) -> list[str]:
    limit = spec.max_body_bytes
    ret = _returner(path)
    tls = f" ssl crt {path}{TLS_PEM}" if spec.tls else ""
    return [
        "",
        "frontend gateway",
        f"    bind {_bind_address(spec.bind, spec.port)}{tls}",
        f"    monitor-uri {HEALTH_PATH}",
        "    # no secret and no body in the access log: the key's name, the model, backend/server, status, times",
        '    log-format "%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %tsc %ac/%fc/%bc/%sc/%rc %sq/%bq '
        'key=%[var(txn.key_name)] model=%[var(txn.served)] %HM %HPO"',
        "    option http-buffer-request",
        f"    stick-table type string len {_MAX_NAME} size 10k expire {2 * RATE_WINDOW_S}s "
        f"store http_req_rate({RATE_WINDOW_S}s)",
        *(_key_lines(path, ret) if spec.keys else [
            "    # no client keys (allow_unauthenticated: true): every request is let in, as key '-'",
            "    http-request set-var(txn.key_name) str(-)",
            "    http-request del-header authorization"]),
        f"    http-request return status 200 content-type application/json file {path}{MODELS_JSON} "
        f"if {{ path {MODELS_PATH} }} {{ method GET HEAD }}",
        f"    # bodies over {limit} bytes: refused (a body must fit in the buffer to be routed by its model)",
        "    " + ret(413, "413") + f" if {{ req.body_size gt {limit} }} || {{ req.body_len gt {limit} }}",
        "    http-request set-var(txn.model) req.body,json_query('$.model')",
        "    " + ret(400, "400") + " unless { var(txn.model) -m found }",
        f"    http-request set-var(txn.backend) var(txn.model),map({path}{MODELS_MAP})",
        "    " + ret(404, "404") + " unless { var(txn.backend) -m found }",
        "    http-request set-var(txn.served) var(txn.model)",
        "    use_backend %[var(txn.backend)]",
    ]


def _backend_sections(spec: GatewaySpec) -> list[str]:
    out: list[str] = []
    for served, group in _by_served(spec.replicas).items():
        key_env = group[0].key_env
        out += [
            "",
            f"backend {backend_name(served)}",
            "    balance leastconn",
            f"    option httpchk GET {REPLICA_HEALTH_PATH}",
            "    http-check expect status 200",
            "    # another replica only when nothing was sent yet or nothing came back",
            "    retry-on conn-failure empty-response",
            "    retries 2",
            "    option redispatch 1",
        ]
        if key_env is not None:
            out.append(f'    http-request set-header Authorization "Bearer ${{{key_env}}}"')
        for r in sorted(group, key=lambda r: server_name(r.host, r.service)):
            out.append(f"    server {server_name(r.host, r.service)} {_server_address(r.address, r.port)} "
                       f"check inter 2s fall 2 rise 2 maxconn {r.maxconn}")
    return out


def _metrics_section(spec: GatewaySpec) -> list[str]:
    return [
        "",
        "# HAProxy's own metrics (its Prometheus exporter) on the gateway's address, for Prometheus to scrape",
        "# (invoke prometheus.targets); counts and times only, no key and no body",
        "frontend metrics",
        f"    bind {_bind_address(spec.bind, metrics_port(spec.admin_port))}",
        "    no log",
        f"    http-request use-service prometheus-exporter if {{ path {METRICS_PATH} }}",
        "    http-request return status 404",
    ]


def metrics_port(admin_port: int) -> int:
    """Where HAProxy's Prometheus exporter listens (on the gateway's bind address): beside the runtime API."""
    return admin_port + 1


def render_files(spec: GatewaySpec) -> dict[str, str]:
    """Every file of the gateway's configuration folder, by its path relative to it (``tls.pem`` aside,
    a secret written on its own). Raises ``ValueError`` on a value that cannot go into them."""
    check_spec(spec)
    files = {
        CONFIG_FILE: haproxy_cfg(spec),
        KEYS_MAP: keys_map(spec),
        LIMITS_MAP: limits_map(spec),
        MODELS_MAP: models_map(spec),
        MODELS_JSON: models_json(spec),
    }
    files.update(error_bodies(spec))
    return files


# ---------------------------------------------------------------------------------------------
# Runtime API


def _check_server_ref(backend: str, server: str) -> str:
    for what, value in (("backend", backend), ("server", server)):
        if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
            raise ValueError(f"{what} {value!r} is not an HAProxy name (A-Z a-z 0-9 _ . : -)")
    return f"{backend}/{server}"


def drain_command(backend: str, server: str) -> str:
    """Take a replica out of rotation: no new request, its requests in flight finish (health checks go on)."""
    return f"set server {_check_server_ref(backend, server)} state drain"


def ready_command(backend: str, server: str) -> str:
    """Put a replica back in rotation (it takes requests once its health check passes)."""
    return f"set server {_check_server_ref(backend, server)} state ready"


def maint_command(backend: str, server: str) -> str:
    """Take a replica out entirely (no request, no health check): the replica is gone or being replaced."""
    return f"set server {_check_server_ref(backend, server)} state maint"


def show_stat_command() -> str:
    """Every proxy's and server's statistics as CSV (``parse_show_stat``)."""
    return "show stat"


def admin_script(admin_port: int, command: str, timeout_s: int = ADMIN_TIMEOUT_S) -> str:
    """Shell text run on the gateway host: send one runtime-API command to 127.0.0.1:<admin_port>
    (bash's /dev/tcp) and print HAProxy's answer; exit 3 when nothing listens there, 124 when no answer
    came within ``timeout_s``."""
    if isinstance(admin_port, bool) or not isinstance(admin_port, int) or not 1 <= admin_port <= 65535:
        raise ValueError(f"admin port {admin_port!r} is not a port (1 to 65535)")
    if not command or any(c in command for c in "\r\n\0;"):
        raise ValueError(f"{command!r} is not one runtime-API command (no newline or ';')")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
        raise ValueError(f"timeout {timeout_s!r} is not a whole number of seconds")
    body = ('exec 3<>"/dev/tcp/127.0.0.1/$1" || { echo "llmfleet: no HAProxy runtime API on 127.0.0.1:$1" >&2; exit 3; }; '
            'printf "%s\\n" "$2" >&3; cat <&3')
    return f"timeout {timeout_s} bash -c {shlex.quote(body)} llmfleet-gateway-admin {admin_port} {shlex.quote(command)}"


def command_error(answer: str) -> str | None:
    """HAProxy's complaint about a ``set server`` command (e.g. "No such server."), None when it took it
    (it answers an empty line)."""
    text = answer.strip()
    return text or None


def parse_show_stat(text: str) -> dict[tuple[str, str], ServerState]:
    """``show stat`` CSV -> each server's state, keyed by (backend, server); FRONTEND / BACKEND rows and
    lines that are not a server's are left out. Never raises."""
    columns = {"pxname": 0, "svname": 1, "scur": 4, "status": 17}
    out: dict[tuple[str, str], ServerState] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            header = [h.strip() for h in line.lstrip("#").split(",")]
            if all(c in header for c in columns):
                columns = {c: header.index(c) for c in columns}
            continue
        fields = line.split(",")
        if len(fields) <= max(columns.values()):
            continue
        backend, server = fields[columns["pxname"]], fields[columns["svname"]]
        if not backend or not server or server in ("FRONTEND", "BACKEND"):
            continue
        scur = fields[columns["scur"]]
        out[(backend, server)] = ServerState(status=fields[columns["status"]],
                                             current_sessions=int(scur) if scur.isdigit() else 0)
    return out
