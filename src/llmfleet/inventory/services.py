"""The llmfleet namespace inside an inventory: ``llmfleet_*`` variables, validated by a schema.

Every other variable passes through untouched (as in Ansible). Inside the namespace an unknown key,
a wrong type or a missing field is a one-line error naming the file, the host, the field and what
was expected. Pure: takes resolved host variables, returns typed objects or raises.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Collection, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from llmfleet.errors import InventoryError
from llmfleet.inventory.values import VaultValue

NAMESPACE_PREFIX = "llmfleet_"

_NAME_RE = r"^[a-z0-9][a-z0-9_-]{0,47}$"
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Every string in the namespace (names, paths, arguments, environment values) is at most this long, and
# engine_args / env hold at most MAX_ITEMS entries: a value pasted by mistake (a whole file, a runaway
# template) is refused with its field instead of travelling into compose files and command lines.
MAX_STRING = 4096
DEFAULT_BIND_ADDRESS = "0.0.0.0"  # a service publishes its port here unless told otherwise
MAX_ITEMS = 256
_SHOWN = 60  # characters of a refused value an error message shows
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.\[\]-]{1,64}$")
_HOST_OR_GROUP_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}$"
_IFNAME_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,14}$"
# Services that are not inference engines: Prometheus exporters llmfleet deploys through the same
# pipeline (knowledge/exporters.py has what each needs; docs/monitoring.md "Exporters").
EXPORTER_KINDS = ("node-exporter", "dcgm-exporter")
# The fleet's one OpenAI endpoint (HAProxy) in front of the engine services of the hosts it names
# (docs/gateway.md): a service with no model either.
GATEWAY_KIND = "gateway"
NON_ENGINE_KINDS = (*EXPORTER_KINDS, GATEWAY_KIND)  # no model, no plan, no watchdog
# Their default ports, as upstream sets them: node_exporter's --web.listen-address :9100, dcgm-exporter's
# -a :9400 (https://github.com/prometheus/node_exporter, https://github.com/NVIDIA/dcgm-exporter).
EXPORTER_PORTS = {"node-exporter": 9100, "dcgm-exporter": 9400, GATEWAY_KIND: 8443}
ENGINE_KINDS = ("vllm", "llamacpp")
# What only an inference engine takes: an exporter setting one of these is refused with its name.
_ENGINE_ONLY = ("model", "model_path", "quant", "context", "kv_dtype", "served_name", "gpu_memory_utilization",
                "api_key", "offload", "concurrency", "allow_unauthenticated", "workers", "cluster_port", "worker_image", "model_source")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_max_length=MAX_STRING, defer_build=True)


def _vault_in(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"__ansible_vault"}:
        return VaultValue(str(v["__ansible_vault"]))
    if v is not None and not isinstance(v, VaultValue):
        raise ValueError("must be an ansible-vault encrypted value (!vault)")
    return v


_Vaulted = Annotated[
    Any,
    BeforeValidator(_vault_in),
    PlainSerializer(lambda v: {"__ansible_vault": v.ciphertext} if v is not None else None),
]


def _secret_in(v: Any) -> Any:
    """``api_key: !vault |...`` (or a reference to a vaulted variable) is a vault-held secret."""
    return {"vault": v} if isinstance(v, VaultValue) else v


class SecretRef(_Strict):
    """Where a secret comes from: the operator's machine, or an ansible-vault encrypted value.

    Inventories never hold a plain value."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True, str_max_length=MAX_STRING, defer_build=True)

    from_env: str | None = Field(None, description="environment variable on the machine running llmfleet")
    from_file: str | None = Field(None, description="file on the machine running llmfleet (mode 0600)")
    vault: _Vaulted = Field(None, description="ansible-vault encrypted value, decrypted with the vault password file")

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if sum(x is not None for x in (self.from_env, self.from_file, self.vault)) != 1:
            raise ValueError("give exactly one of from_env or from_file (or an !vault value)")
        if self.from_env is not None and not _ENV_RE.match(self.from_env):
            raise ValueError(f"from_env must be an environment variable name, got {self.from_env!r}")
        return self


class HealthSettings(_Strict):
    """Per-service health-check budget (seconds) and the decode-speed floor."""

    load_timeout_s: Annotated[int, Field(ge=10, le=7200)] = 900
    stage_timeout_s: Annotated[int, Field(ge=1, le=600)] = 60
    # Fail the rollout when measured tok/s < floor_fraction x the planner's realistic figure.
    floor_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.25
    # An absolute floor (tok/s) instead, for hardware the planner's card figure does not describe
    # (the lab's CPU engines stand in for a simulated card); see docs/deploy.md.
    min_tokps: Annotated[float, Field(gt=0.0, le=1_000_000.0)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=4096)] = 64
    # Where the engine must hold the model, checked from its own load report after each start
    # (health/residency.py): gpu (every planned layer and the KV cache on the GPU), cpu (an engine
    # that runs on the CPU by design, as the lab's: devices not checked, the layer count, weights and
    # KV capacity still are), off (not checked; the health report says so). Unset: the host's
    # llmfleet_health_residency, else gpu.
    residency: Literal["gpu", "cpu", "off"] | None = None


_HF_REPO_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
_REVISION_RE = re.compile(r"^[0-9a-f]{40}$")


def _source_in(v: Any) -> Any:
    """``model_source: /data/m.gguf`` is short for ``model_source: {path: /data/m.gguf}``."""
    return {"path": v} if isinstance(v, str) else v


class ModelSource(_Strict):
    """Where ``invoke models.push`` takes a service's model from (docs/models.md): exactly one of a
    path on the machine running llmfleet, an inventory host holding a verified copy at the same
    model_path, or a Hugging Face repository at a pinned commit, downloaded on the host itself (only
    with ``allow_download: true``)."""

    path: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    host: Annotated[str, Field(pattern=_HOST_OR_GROUP_RE)] | None = None
    hf: Annotated[str, Field(pattern=_HF_REPO_RE)] | None = None
    revision: str | None = None
    file: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    allow_download: bool = False

    @model_validator(mode="after")
    def _one(self) -> ModelSource:
        given = [k for k in ("path", "host", "hf") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of path (on this machine), host (an inventory host) or hf "
                             f"(a Hugging Face repository), got {', '.join(given) or 'none'}")
        if self.path is not None and not self.path.startswith(("/", "~/")):
            raise ValueError(f"path must be absolute on the machine running llmfleet (or ~/...), got {self.path!r}")
        if self.hf is None:
            extra = [k for k in ("revision", "file") if getattr(self, k) is not None] + (
                ["allow_download"] if self.allow_download else [])
            if extra:
                raise ValueError(f"{extra[0]} belongs to an hf source only")
            return self
        if self.revision is None or not _REVISION_RE.match(self.revision):
            raise ValueError(f"hf {self.hf}: revision must be the 40-hex commit to download (a branch or tag can "
                             f"move), got {shown_value(self.revision)}")
        if not self.allow_download:
            raise ValueError(f"hf {self.hf}: a download from the Hugging Face Hub runs on the host itself; "
                             "allow it with allow_download: true (the host then needs to reach the Hub)")
        if self.file is not None and (self.file.startswith("/") or ".." in self.file.split("/")):
            raise ValueError(f"file must be a path inside the repository, got {self.file!r}")
        return self


class GatewayKey(_Strict):
    """A client key of the gateway: its name (in access logs and metrics, never the key), the key itself
    as a secret reference, and its rate limit."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    key: Annotated[SecretRef, BeforeValidator(_secret_in)]
    requests_per_minute: Annotated[int, Field(ge=1, le=1_000_000)] | None = None


class GatewayTls(_Strict):
    """The gateway's certificate chain and private key (PEM), each read on the machine running llmfleet."""

    cert: Annotated[SecretRef, BeforeValidator(_secret_in)]
    key: Annotated[SecretRef, BeforeValidator(_secret_in)]


class GatewaySettings(_Strict):
    """What a ``gateway`` service fronts and how (docs/gateway.md)."""

    # hosts or groups: every engine service on them is a replica of its served name
    upstreams: list[Annotated[str, Field(pattern=_HOST_OR_GROUP_RE)]] = Field(min_length=1, max_length=MAX_ITEMS)
    api_keys: list[GatewayKey] = Field(default_factory=list, max_length=MAX_ITEMS)
    tls: GatewayTls | None = None
    max_body_mib: Annotated[int, Field(ge=1, le=64)] = 4
    timeout_s: Annotated[int, Field(ge=5, le=86400)] = 600
    drain_timeout_s: Annotated[int, Field(ge=0, le=3600)] = 120
    admin_port: Annotated[int, Field(ge=1024, le=65534)] = 9901

    @field_validator("api_keys")
    @classmethod
    def _unique_keys(cls, v: list[GatewayKey]) -> list[GatewayKey]:
        names = [k.name for k in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"key name {dup[0]} is listed twice")
        return v


class Service(_Strict):
    """One service a host runs (one systemd unit, one compose project): an inference server, or one of
    the exporters in ``EXPORTER_KINDS`` (no model: ``model``/``model_path`` stay None)."""

    name: Annotated[str, Field(pattern=_NAME_RE)]
    engine: Literal["vllm", "llamacpp", "node-exporter", "dcgm-exporter", "gateway"]
    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    model_path: Annotated[str, Field(min_length=2, max_length=1024)] | None = None
    image: Annotated[str, Field(min_length=3, max_length=256)]
    quant: str | None = None
    gpus: list[Annotated[int, Field(ge=0, le=63)]] | Literal["all"] = "all"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    context: Annotated[int, Field(ge=128, le=10_000_000)] | None = None
    concurrency: Annotated[int, Field(ge=1, le=4096)] = 1
    kv_dtype: str = "auto"
    served_name: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    api_key: Annotated[SecretRef | None, BeforeValidator(_secret_in)] = None
    engine_args: list[str] = Field(default_factory=list, max_length=MAX_ITEMS)
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")], str] = Field(
        default_factory=dict, max_length=MAX_ITEMS)
    offload: bool = False
    health: HealthSettings = Field(default_factory=HealthSettings)
    # Where the published port listens (an IP address of the host); default: the host's
    # llmfleet_bind_address, else 0.0.0.0. See docs/services.md.
    bind_address: str | None = None
    # Publishing on a non-loopback address without api_key is refused unless this says true.
    allow_unauthenticated: bool | None = None
    # Merged into the rendered compose service (a second file, checked by `docker compose config`).
    compose_overrides: dict[str, Any] = Field(default_factory=dict)
    # Multi-host serving (docs/deploy.md "Services over several hosts"): the hosts (or groups) that
    # run the engine's worker side: llama.cpp's rpc-server, or a Ray worker for vLLM. This host is
    # the head. Every host of the service needs llmfleet_cluster_address or llmfleet_cluster_interface.
    workers: list[Annotated[str, Field(pattern=_HOST_OR_GROUP_RE)]] = Field(default_factory=list)
    # The workers' port: rpc-server's --port (default 50052), or the Ray head's GCS port (default 6379).
    cluster_port: Annotated[int, Field(ge=1024, le=65535)] | None = None
    # The image workers run (default: the service's image; it must hold the worker binary).
    worker_image: Annotated[str, Field(min_length=3, max_length=256)] | None = None
    # Where `invoke models.push` takes the model from (a path here, a host, or hf + revision; docs/models.md).
    model_source: Annotated[ModelSource | None, BeforeValidator(_source_in)] = None
    # engine: gateway only: the engine services it fronts, its keys, TLS and limits (docs/gateway.md)
    gateway: GatewaySettings | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _kind_fields(cls, data: Any, handler: Callable[[Any], Service]) -> Service:
        """An engine needs model and model_path (reported with every other error of the service, as
        required fields are); an exporter takes none of what only an engine takes."""
        missing: list[str] = []
        if isinstance(data, Mapping) and data.get("engine") in ENGINE_KINDS:
            missing = [f for f in ("model", "model_path") if data.get(f) is None]
        errors: list[Any] = [{"type": "missing", "loc": (f,), "input": data} for f in missing]
        try:
            svc = handler(data)
        except ValidationError as exc:
            if not errors:
                raise
            errors += [{k: e[k] for k in ("type", "loc", "input", "ctx") if k in e} for e in exc.errors()]
            raise ValidationError.from_exception_data(cls.__name__, errors) from None
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        if svc.engine != GATEWAY_KIND and svc.gateway is not None:
            raise ValidationError.from_exception_data(cls.__name__, [
                {"type": "value_error", "loc": ("gateway",),
                 "input": data.get("gateway") if isinstance(data, Mapping) else None,
                 "ctx": {"error": ValueError(f"only an engine: gateway service takes gateway (this is {svc.engine}); "
                                             "remove it")}}])
        if svc.engine == GATEWAY_KIND and svc.gateway is None:
            raise ValidationError.from_exception_data(cls.__name__, [
                {"type": "missing", "loc": ("gateway",), "input": data}])
        if svc.engine in (*EXPORTER_KINDS, GATEWAY_KIND):
            only = _ENGINE_ONLY + (("gpus", "engine_args") if svc.engine == GATEWAY_KIND else ())
            given = [f for f in only if f in svc.model_fields_set and getattr(svc, f) not in (None, [], False)
                     and not (f == "allow_unauthenticated" and svc.engine == GATEWAY_KIND)]
            if given:
                takes = ("gateway, allow_unauthenticated" if svc.engine == GATEWAY_KIND else "gpus, engine_args")
                why = ValueError(f"a {svc.engine} service has no model; remove it (it takes name, engine, image, "
                                 f"port, bind_address, env, compose_overrides, health, {takes})")
                raise ValidationError.from_exception_data(cls.__name__, [
                    {"type": "value_error", "loc": (f,), "ctx": {"error": why},
                     "input": data.get(f) if isinstance(data, Mapping) else None}
                    for f in given])
            if "port" not in svc.model_fields_set:
                svc = svc.model_copy(update={"port": EXPORTER_PORTS[svc.engine]})
        return svc

    @property
    def is_exporter(self) -> bool:
        """An exporter (``EXPORTER_KINDS``), not an inference engine."""
        return self.engine in EXPORTER_KINDS

    @property
    def is_engine(self) -> bool:
        """An inference engine (``ENGINE_KINDS``): a model, a plan, a watchdog. Exporters and the gateway are not."""
        return self.engine in ENGINE_KINDS

    @field_validator("workers")
    @classmethod
    def _workers(cls, v: list[str]) -> list[str]:
        dup = sorted({w for w in v if v.count(w) > 1})
        if dup:
            raise ValueError(f"{dup[0]} is listed twice")
        return v

    @field_validator("bind_address")
    @classmethod
    def _ip(cls, v: str | None) -> str | None:
        return _check_bind_address(v)

    @field_validator("compose_overrides")
    @classmethod
    def _overrides(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_compose_overrides(v)

    @field_validator("model_path")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("/"):
            raise ValueError(f"must be an absolute path on the host, got {v!r}")
        if "\x00" in v or "\n" in v:
            raise ValueError("must not contain NUL or newline")
        return v

    @field_validator("env")
    @classmethod
    def _no_secret_env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if re.search(r"(KEY|TOKEN|SECRET|PASSWORD)", key.upper()):
                raise ValueError(f"{key} looks like a secret: use api_key: {{from_env: ...}} instead of env")
        return v

    @property
    def public_name(self) -> str:
        return self.served_name or self.name


class WatchdogSettings(_Strict):
    """The host-side watchdog: restart a unit whose engine stopped answering /health or stopped doing
    work (requests running or waiting while its token counters stand still for ``stall_window_s``;
    when idle, a 1-token completion that does not finish within ``probe_timeout_s``)."""

    enabled: bool = True
    interval_s: Annotated[int, Field(ge=5, le=3600)] = 30
    failures: Annotated[int, Field(ge=1, le=100)] = 3
    max_restarts_per_hour: Annotated[int, Field(ge=0, le=60)] = 3
    probe_timeout_s: Annotated[int, Field(ge=1, le=120)] = 10
    # judge by work done (the engine's own counters), not by /health alone
    progress: bool = True
    # busy (requests running or waiting) with no token counted for this long: a failed judgement. Long
    # enough for the longest prefill a service sees (a 128K-token prompt on a slow card takes a minute).
    stall_window_s: Annotated[int, Field(ge=5, le=3600)] = 120
    # idle and nothing counted since the last probe: ask for one token (bounded by probe_timeout_s)
    idle_probe: bool = True


def _check_bind_address(v: str | None) -> str | None:
    if v is None:
        return v
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        raise ValueError(f"must be an IP address of the host (0.0.0.0, 127.0.0.1, 10.0.0.5), got {v!r}") from None


def cluster_address_problem(address: str) -> str | None:
    """Why ``address`` cannot carry a multi-host service's engine traffic (None: it can).

    llama.cpp's rpc-server and Ray accept anyone who reaches their port (no authentication; rpc-server
    warns "Never expose the RPC server to an open network!"): they bind one address of a private
    network, never a wildcard, loopback (other hosts cannot reach it) or a public address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"must be an IP address on the hosts' private network (10.0.0.5), got {address!r}"
    if ip.is_unspecified:
        return (f"{address} binds every interface; rpc-server and Ray have no authentication: give the "
                "host's address on the private network the service's hosts share")
    if ip.is_loopback:
        return f"{address} is loopback: the other hosts of the service cannot reach it"
    if not ip.is_private:
        return (f"{address} is not a private address; rpc-server and Ray have no authentication: use an "
                "address on a private network (10/8, 172.16/12, 192.168/16, fc00::/7) behind a firewall")
    return None


_DNS_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*$")


def split_transfer_address(value: str) -> tuple[str, int | None]:
    """``NAME``, ``IP``, ``NAME:PORT`` or ``[IPv6]:PORT`` -> (address, port or None). Raises ``ValueError``."""
    v = value.strip()
    port: int | None = None
    if v.startswith("["):
        host, _, rest = v[1:].partition("]")
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                raise ValueError("must be NAME, IP, NAME:PORT or [IPv6]:PORT")
            port = int(rest[1:])
    elif v.count(":") == 1:
        host, _, p = v.partition(":")
        if not p.isdigit():
            raise ValueError("its port must be a number")
        port = int(p)
    else:
        host = v
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        if not _DNS_NAME.match(host):
            raise ValueError("must be a host name or IP address (optionally :PORT)") from None
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"port {port} is out of range 1-65535")
    return host, port


def resolve_workers(service: Service, head: str, hosts: Collection[str],
                    group_hosts: Callable[[str], list[str] | None], multihost_engines: Collection[str]) -> list[str]:
    """The worker hosts of ``service`` (declared on host ``head``), groups expanded, in the order given.

    ``hosts``: the inventory's host names; ``group_hosts(name)``: a group's hosts, or None when there
    is no such group; ``multihost_engines``: engines whose role renders workers. Raises ``ValueError``
    with a one-line reason (the caller adds file and host)."""
    if not service.workers:
        return []
    if service.engine not in multihost_engines:
        raise ValueError(f"engine {service.engine} has no multi-host support here (roles with workers: "
                         f"{', '.join(sorted(multihost_engines)) or 'none'}); remove workers")
    out: list[str] = []
    for item in service.workers:
        names = [item] if item in hosts else group_hosts(item)
        if names is None:
            raise ValueError(f"workers: {item!r} is neither a host nor a group of the inventory")
        for n in names:
            if n == head:
                if item == head:
                    raise ValueError(f"workers: {head} is this service's head; list only the other hosts")
                continue  # a group that holds the head: its other hosts are the workers
            if n in out:
                raise ValueError(f"workers: host {n} is listed twice (directly or through a group)")
            out.append(n)
    if not out:
        raise ValueError(f"workers: {', '.join(service.workers)} holds no host but the head {head}")
    return out


# Keys of the compose service llmfleet owns: the image and argv (pinned, judged by the preflight), the
# secrets file, the names and labels other steps find the container by, the published port, restart.
COMPOSE_OWNED_KEYS = frozenset({"image", "command", "entrypoint", "env_file", "container_name", "labels",
                                "ports", "restart", "pull_policy", "build"})
_OVERRIDE_MAX_BYTES = 16_384


def check_compose_overrides(v: dict[str, Any]) -> dict[str, Any]:
    """A plain mapping of compose service keys (strings, numbers, booleans, lists, mappings) that
    leaves llmfleet's own keys alone; small enough to read in a diff."""
    import json

    owned = sorted(set(v) & COMPOSE_OWNED_KEYS)
    if owned:
        raise ValueError(f"{owned[0]} is set by llmfleet; use the service's own field "
                         "(image, engine_args, port, ...) instead of compose_overrides")

    def walk(x: Any, where: str) -> None:
        if isinstance(x, dict):
            for k, val in x.items():
                if not isinstance(k, str) or not re.match(r"^[A-Za-z0-9_.-]{1,128}$", k):
                    raise ValueError(f"{where}: key {str(k)[:40]!r} is not a compose key")
                walk(val, f"{where}.{k}")
        elif isinstance(x, list):
            for i, val in enumerate(x):
                walk(val, f"{where}[{i}]")
        elif isinstance(x, str):
            if "\x00" in x:
                raise ValueError(f"{where}: NUL in a value")
        elif not (x is None or isinstance(x, bool | int | float)):
            raise ValueError(f"{where}: {type(x).__name__} is not a YAML scalar")

    walk(v, "compose_overrides")
    try:
        size = len(json.dumps(v))
    except (TypeError, ValueError):
        raise ValueError("compose_overrides must be plain data") from None
    if size > _OVERRIDE_MAX_BYTES:
        raise ValueError(f"compose_overrides is {size} bytes; keep it under {_OVERRIDE_MAX_BYTES}")
    return v


_APT_URI = r"^(https?://[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]+|file:/[A-Za-z0-9._/-]*)$"


class AptSource(_Strict):
    """A package source provisioning writes on the host (``llmfleet_apt_sources``, docs/provision.md): a
    deb822 ``/etc/apt/sources.list.d/llmfleet-<name>.sources`` with ``Signed-By`` the key it copies to
    ``/etc/apt/keyrings/llmfleet-<name>.asc`` (a site mirror, NVIDIA's CUDA repository, Docker's)."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")]
    uris: Annotated[list[Annotated[str, Field(pattern=_APT_URI, max_length=500)]], Field(min_length=1, max_length=8)]
    suites: Annotated[list[Annotated[str, Field(pattern=r"^[A-Za-z0-9._/-]{1,100}$")]], Field(min_length=1, max_length=8)]
    components: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,100}$")]] = Field(default_factory=list)
    # an ASCII-armored OpenPGP public key, relative to the inventory folder (`gpg --armor --export`)
    key_file: Annotated[str, Field(min_length=1, max_length=1024)]

    @model_validator(mode="after")
    def _flat(self) -> AptSource:
        flat = [s for s in self.suites if s.endswith("/")]
        if flat and self.components:
            raise ValueError(f"source {self.name}: a flat repository's suite ({flat[0]}) takes no components "
                             "(leave components out)")
        if not flat and not self.components:
            raise ValueError(f"source {self.name}: give components (e.g. [main]) or a flat suite ending in /")
        return self


class Firewall(_Strict):
    """``llmfleet_firewall`` (docs/provision.md "Firewall"): the host's service ports (each service's
    ``port``) answer only the addresses and networks in ``allow`` (and the host itself); everything
    else that reaches those ports is dropped. Other ports are left alone."""

    allow: Annotated[list[Annotated[str, Field(max_length=64)]], Field(min_length=1, max_length=256)]

    @model_validator(mode="after")
    def _networks(self) -> Firewall:
        import ipaddress

        for a in self.allow:
            try:
                ipaddress.ip_network(a, strict=False)
            except ValueError:
                raise ValueError(f"allow: {a!r} is not an IP address or network (e.g. 10.0.0.5, 10.0.0.0/24, "
                                 "fd00::/64)") from None
        return self


class HostSettings(_Strict):
    """All ``llmfleet_*`` variables of one host, after Ansible-style merging."""

    def residency_for(self, service: Service) -> Literal["gpu", "cpu", "off"]:
        """Where the service's engine must hold its model (the service's setting, the host's, else gpu)."""
        return service.health.residency or self.health_residency or "gpu"

    def bind_address_for(self, service: Service) -> str:
        """The address the service's port is published on: its ``bind_address``, else the host's
        ``llmfleet_bind_address``, else 0.0.0.0."""
        return service.bind_address or self.bind_address or DEFAULT_BIND_ADDRESS

    def reach_address_for(self, service: Service) -> str:
        """Where the host itself reaches the service's published port (the SSH tunnels of the health
        check, status and bench, the watchdog's probes): loopback for a wildcard bind, else the one
        address it is bound to."""
        address = self.bind_address_for(service)
        return "127.0.0.1" if address in {"0.0.0.0", "::"} else address

    def allow_unauthenticated_for(self, service: Service) -> bool:
        """Whether the service may publish its port without an API key (the service's setting wins)."""
        if service.allow_unauthenticated is not None:
            return service.allow_unauthenticated
        return bool(self.allow_unauthenticated)

    services: list[Service] = Field(default_factory=list)
    gpu: str | None = Field(None, description="card (catalog id or nvidia-smi name) when facts are not gathered")
    # package sources `invoke provision` writes (a site mirror, a vendor repository), each with its key
    apt_sources: Annotated[list[AptSource], Field(max_length=16)] = Field(default_factory=list)
    # `invoke provision`: the service ports answer only these addresses (None: no rule, one removed)
    firewall: Firewall | None = None
    root: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/-]*$")] = "/opt/llmfleet"
    keep_releases: Annotated[int, Field(ge=1, le=100)] = 5
    image_mirrors: dict[str, str] = Field(default_factory=dict)
    # images.lock to resolve image keys with, relative to the inventory folder (the lab pins its own).
    images_lock: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    # Roles / templates that override the packaged ones (folders, relative to the inventory folder).
    roles_path: str | list[str] | None = None
    templates_path: str | list[str] | None = None
    health_floor_fraction: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    health_min_tokps: Annotated[float, Field(gt=0.0, le=1_000_000.0)] | None = None
    health_residency: Literal["gpu", "cpu", "off"] | None = None  # a service's health.residency wins
    bind_address: str | None = None
    allow_unauthenticated: bool = False
    # Host-side supervision of every service (docs/services.md): probe period, failed probes before a
    # restart, restarts the watchdog may do per hour; and how long a deploy may go unconfirmed.
    watchdog: WatchdogSettings = Field(default_factory=lambda: WatchdogSettings())
    confirm_timeout_s: Annotated[int, Field(ge=30, le=86_400)] | None = None
    # Multi-host services (docs/deploy.md): the host's address on the private network its services'
    # hosts talk over (rpc-server and Ray have no authentication), or the interface that holds it
    # (its IPv4 address is read at deploy time; vLLM's NCCL/Gloo traffic is pinned to it).
    cluster_address: str | None = None
    cluster_interface: Annotated[str, Field(pattern=_IFNAME_RE)] | None = None
    # The link between this host and the other hosts of its multi-host services, in Gbit/s (the
    # planner prices pipeline hops with the slowest one; docs/planner.md).
    network_gbps: Annotated[float, Field(gt=0.0, le=100_000.0)] | None = None
    # How the fleet's other hosts reach this host's sshd for host-to-host model copies
    # (`invoke models.push --from`): NAME, IP, NAME:PORT or [IPv6]:PORT (docs/models.md).
    transfer_address: Annotated[str, Field(min_length=1, max_length=300)] | None = None

    @field_validator("bind_address")
    @classmethod
    def _ip(cls, v: str | None) -> str | None:
        return _check_bind_address(v)

    @field_validator("transfer_address")
    @classmethod
    def _transfer_address(cls, v: str | None) -> str | None:
        if v is not None:
            split_transfer_address(v)
        return v

    @field_validator("cluster_address")
    @classmethod
    def _cluster_ip(cls, v: str | None) -> str | None:
        if v is None:
            return v
        reason = cluster_address_problem(v)
        if reason:
            raise ValueError(reason)
        return str(ipaddress.ip_address(v))

    @model_validator(mode="after")
    def _unique(self) -> HostSettings:
        sources = [a.name for a in self.apt_sources]
        if len(set(sources)) != len(sources):
            raise ValueError(f"apt source name {next(n for n in sources if sources.count(n) > 1)!r} appears twice")
        seen_names: set[str] = set()
        seen_ports: dict[int, str] = {}
        for s in self.services:
            if s.name in seen_names:
                raise ValueError(f"service name {s.name!r} appears twice")
            seen_names.add(s.name)
            if s.port in seen_ports:
                raise ValueError(f"services {seen_ports[s.port]!r} and {s.name!r} both use port {s.port}")
            seen_ports[s.port] = s.name
        return self


def _describe(err: Mapping[str, Any]) -> tuple[str, str]:
    loc = err.get("loc", ())
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p in {"list[constrained-int]", "literal['all']", "constrained-int", "constrained-float"}:
            continue
        else:
            name = str(p)
            if not _PLAIN_KEY.match(name):  # a hostile key (a newline, a very long one) stays on one line
                name = f"[{shown_value(name)}]"
            parts.append(("." if parts else "") + name)
    field = "".join(parts)
    msg = err.get("msg", "invalid")
    if err.get("type") == "extra_forbidden":
        msg = "unknown key (check spelling; see docs/inventory.md for the schema)"
    elif err.get("type") == "missing":
        msg = "required field is missing"
    inp = err.get("input")
    if "api_key" in loc and isinstance(inp, str):
        msg = "must be {from_env: VAR} or {from_file: PATH}; never the key itself (value not shown)"
    elif err.get("type") not in {"missing", "extra_forbidden"} and not isinstance(inp, dict | list):
        msg = f"{msg}, got {shown_value(inp)}"
    return field, msg


def shown_value(value: Any) -> str:
    """A refused value for a one-line message: its repr, cut short with its length when long."""
    text = repr(value)
    if len(text) <= _SHOWN:
        return text
    n = f" ({len(value):,} characters)" if isinstance(value, str) else ""
    return text[:_SHOWN] + "..." + n


def _namespace(hostvars: dict[str, Any]) -> dict[str, Any]:
    return {k[len(NAMESPACE_PREFIX):]: v for k, v in hostvars.items() if k.startswith(NAMESPACE_PREFIX)}


def _service_named(err: Mapping[str, Any], data: dict[str, Any]) -> str:
    """`` service NAME:`` when the error is inside a service that has a name, so the line names it."""
    loc = err.get("loc", ())
    raw = data.get("services")
    if len(loc) > 2 and loc[0] == "services" and isinstance(loc[1], int) and isinstance(raw, list) \
            and loc[1] < len(raw) and isinstance(raw[loc[1]], dict) and isinstance(raw[loc[1]].get("name"), str):
        return f" service {shown_value(raw[loc[1]]['name'])[1:-1]}:"
    return ""


def _message(host: str, err: Mapping[str, Any], sources: dict[str, str], data: dict[str, Any] | None = None) -> str:
    field, msg = _describe(err)
    top = str(err["loc"][0]) if err.get("loc") else ""
    var = NAMESPACE_PREFIX + top if top else NAMESPACE_PREFIX + "services"
    where = sources.get(var, "inventory")
    shown = NAMESPACE_PREFIX + field if field else var
    return f"{where}: host {host}:{_service_named(err, data or {})} {shown}: {msg}"


def host_settings_all(
    host: str, hostvars: dict[str, Any], sources: dict[str, str] | None = None
) -> tuple[HostSettings | None, list[Service], list[str]]:
    """Validate like ``host_settings`` but report every error, not the first.

    Returns (settings or None, the services that are valid on their own, one message per error).
    Errors about two services together (a name or port used twice) are left to the caller, which
    sees the valid services.
    """
    sources = sources or {}
    data = _namespace(hostvars)
    try:
        settings = HostSettings.model_validate(data)
        return settings, list(settings.services), []
    except ValidationError as exc:
        errors = [_message(host, e, sources, data) for e in exc.errors() if e.get("loc")]
    services: list[Service] = []
    raw = data.get("services")
    for item in raw if isinstance(raw, list) else []:
        try:
            services.append(Service.model_validate(item))
        except ValidationError:
            pass
    return None, services, errors


def host_settings(host: str, hostvars: dict[str, Any], sources: dict[str, str] | None = None) -> HostSettings:
    """Validate the ``llmfleet_*`` variables of one host.

    ``sources`` maps a variable name to the file (and group/host) that set its winning value, so the
    error names where to fix it.
    """
    sources = sources or {}
    data: dict[str, Any] = {}
    for key, value in hostvars.items():
        if key.startswith(NAMESPACE_PREFIX):
            data[key[len(NAMESPACE_PREFIX):]] = value
    try:
        return HostSettings.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(_message(host, exc.errors()[0], sources, data)) from None
