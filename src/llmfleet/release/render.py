"""Render one service's release: compose file, systemd unit and secrets env file.

Pure: a ``Service``, the host's ``HostSettings``, the resolved image, the planner's plan and the
resolved secret values go in; a ``Rendered`` (file name -> content, modes, the engine argv, the
content hash and the manifest's inputs) comes out. Nothing here touches a host or the disk except
reading the role and template files shipped with llmfleet.

Engine flags: the plan's recommended flags, then ``service.engine_args`` on top (the same flag,
under any of its names, is replaced; new flags are appended). Flags llmfleet owns (model, port,
served name, API key) cannot be overridden. The preflight judges the result, not this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import jinja2
import yaml

from llmfleet import yamlload
from llmfleet.errors import UsageError
from llmfleet.host.probe.state_reader import MANIFEST_FILE  # noqa: F401 - re-exported: one name for writer and reader
from llmfleet.images.lock import ImageRef
from llmfleet.inventory.services import HostSettings, Service

if TYPE_CHECKING:
    from llmfleet.knowledge.planner import Plan, PlanSummary

# The roles and templates shipped inside the package (read with importlib.resources, so an installed
# wheel renders exactly what a checkout renders). Overrides are searched first: see search_paths().
PACKAGE_ROLES = resources.files("llmfleet.release") / "roles"
PACKAGE_TEMPLATES = resources.files("llmfleet.release") / "templates"

DOCKER = "/usr/bin/docker"
UNIT_DIR = "/etc/systemd/system"
COMPOSE_FILE = "compose.yml"
COMPOSE_OVERRIDE_FILE = "compose.override.yml"
LOG_MAX_SIZE = "20m"
LOG_MAX_FILE = 5
ENV_FILE = "service.env"
SECRET_MASK = "********"
STOP_GRACE_S = 30  # the roles' compose templates: stop_grace_period: 30s
UNIT_STOP_TIMEOUT_S = 90  # the unit's TimeoutStopSec: the 30 s grace period and a margin
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_DURATION_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_SECRET_FORBIDDEN = re.compile(r"['\n\r\x00]")


# ---------------------------------------------------------------------------------------------
# Roles and their flag sets


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    value: bool
    doc: str = ""

    @property
    def canonical(self) -> str:
        longs = [n for n in self.names if n.startswith("--")]
        return longs[0] if longs else self.names[0]


@dataclass(frozen=True)
class Role:
    engine: str
    model_target: str
    model_is_file: bool
    base_args: tuple[tuple[str, ...], ...]
    managed_flags: frozenset[str]
    api_key_env: str
    ipc: str | None
    shm_size: str | None
    loading_signal: str
    flags: tuple[Flag, ...]
    template: str
    container: dict[str, Any] = field(default_factory=dict)
    cluster: dict[str, Any] = field(default_factory=dict)  # multi-host serving; empty: none
    worker_template: str | None = None  # templates/worker.yml.j2: what a worker host runs
    # The engine prints a fragment of a single API key at this log verbosity or above; the key is then
    # listed twice (the engine reads a comma-separated list) so it prints only the count. None: never.
    api_key_listed_from_verbosity: int | None = None
    verbosity_flags: tuple[str, ...] = ()

    def flag(self, name: str) -> Flag | None:
        for f in self.flags:
            if name in f.names:
                return f
        return None


Dirs = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None


def _dirs(dirs: Dirs) -> tuple[str, ...]:
    if dirs is None:
        return ()
    if isinstance(dirs, str | os.PathLike):
        return (os.fspath(dirs),)
    return tuple(os.fspath(d) for d in dirs)


def _role_roots(dirs: tuple[str, ...]) -> list[Traversable]:
    return [*(Path(d).expanduser() for d in dirs), PACKAGE_ROLES]


def known_roles(dirs: Dirs = None) -> list[str]:
    """Engines with a role (``<engine>/defaults.yml``) in the override folders or the package."""
    names: set[str] = set()
    for root in _role_roots(_dirs(dirs)):
        if root.is_dir():
            names.update(d.name for d in root.iterdir() if d.joinpath("defaults.yml").is_file())
    return sorted(names)


def load_role(engine: str, roles_dir: Dirs = None) -> Role:
    """The role for ``engine``: from the first override folder that has ``<engine>/defaults.yml``,
    else the one shipped with llmfleet. A role is taken whole (its compose template beside it)."""
    return _load_role(engine, _dirs(roles_dir))


@lru_cache(maxsize=16)
def _load_role(engine: str, dirs: tuple[str, ...]) -> Role:
    base = next((r / engine for r in _role_roots(dirs) if (r / engine / "defaults.yml").is_file()), None)
    if base is None:
        found = known_roles(dirs)
        where = ", ".join(dirs + ("the roles shipped with llmfleet",))
        if not found:
            raise UsageError(f"no role for engine {engine!r}: no role at all in {where} (a broken install? "
                             "reinstall llmfleet)")
        raise UsageError(f"no role for engine {engine!r} in {where}; roles there: {', '.join(found)}")
    d = yamlload.safe_load(base.joinpath("defaults.yml").read_text(encoding="utf-8"), keep=True) or {}
    tpl = base / "templates" / "compose.yml.j2"
    if not tpl.is_file():
        raise UsageError(f"{base}: role {engine!r} has no templates/compose.yml.j2")
    template = tpl.read_text(encoding="utf-8")
    wtpl = base / "templates" / "worker.yml.j2"
    return Role(
        engine=d["engine"],
        model_target=str(d.get("model_target") or ""),  # an exporter's role has none
        model_is_file=bool(d.get("model_is_file")),
        base_args=tuple(tuple(str(x) for x in a) for a in d.get("base_args", [])),
        managed_flags=frozenset(d.get("managed_flags", [])),
        api_key_env=str(d.get("api_key_env") or ""),
        ipc=d.get("ipc"),
        shm_size=d.get("shm_size"),
        loading_signal=str(d.get("loading_signal", "refused")),
        flags=tuple(Flag(tuple(f["names"]), bool(f["value"]), f.get("doc", "")) for f in d.get("flags", [])),
        template=template,
        container=dict(d.get("container") or {}),
        cluster=dict(d.get("cluster") or {}),
        api_key_listed_from_verbosity=(int(d["api_key_listed_from_verbosity"])
                                       if d.get("api_key_listed_from_verbosity") is not None else None),
        verbosity_flags=tuple(str(x) for x in d.get("verbosity_flags", [])),
        worker_template=wtpl.read_text(encoding="utf-8") if wtpl.is_file() else None,
    )


def template_text(name: str, templates_dir: Dirs = None) -> str:
    """A unit/env template: from the first override folder that has it, else the packaged one."""
    for root in [*(Path(d).expanduser() for d in _dirs(templates_dir)), PACKAGE_TEMPLATES]:
        if (root / name).is_file():
            return (root / name).read_text(encoding="utf-8")
    raise UsageError(f"template {name} not found in {', '.join(_dirs(templates_dir) + ('the package',))}")


def _resolve(var: Any, inventory_path: str | None) -> list[str]:
    if not var:
        return []
    items = [var] if isinstance(var, str) else list(var)
    out = []
    for item in items:
        p = Path(str(item)).expanduser()
        if not p.is_absolute() and inventory_path:
            base = Path(inventory_path)
            p = (base if base.is_dir() else base.parent) / p
        out.append(str(p))
    return out


class SearchPaths(TypedDict):
    """``render()``'s ``roles_dir`` / ``templates_dir`` keyword arguments (``search_paths``)."""

    roles_dir: list[str]
    templates_dir: list[str]


def search_paths(hostvars: dict[str, Any] | None, inventory_path: str | None,
                 config: dict[str, Any] | None) -> SearchPaths:
    """Where a host's roles and templates come from, first hit wins:

    1. the inventory variables ``llmfleet_roles_path`` / ``llmfleet_templates_path`` (a folder or a
       list, relative to the inventory folder);
    2. the configuration ``llmfleet.roles_path`` / ``llmfleet.templates_path`` (invoke.yaml; relative
       to the working directory);
    3. the roles and templates shipped with llmfleet.

    Returns ``render()``'s ``roles_dir`` / ``templates_dir`` keyword arguments.
    """
    hv = hostvars or {}
    conf = config or {}
    return {
        "roles_dir": _resolve(hv.get("llmfleet_roles_path"), inventory_path) + _resolve(conf.get("roles_path"), None),
        "templates_dir": (_resolve(hv.get("llmfleet_templates_path"), inventory_path)
                          + _resolve(conf.get("templates_path"), None)),
    }


# ---------------------------------------------------------------------------------------------
# Engine argument merging

_NEG_NUMBER = re.compile(r"^-\d")


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not _NEG_NUMBER.match(token) and token not in {"-", "--"}


def split_flags(argv: list[str], role: Role) -> list[tuple[str, list[str]]]:
    """``["--a", "1", "--b", "-c=2"]`` -> ``[("--a", ["1"]), ("--b", []), ("-c", ["2"])]``.

    Known flags take exactly the values the role's flag set says; unknown flags take the tokens up
    to the next flag. A value before any flag is an error (it would be a positional argument).
    """
    groups: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(argv):
        tok = str(argv[i])
        if not _is_flag(tok):
            raise UsageError(f"engine_args: {tok!r} is not a flag and follows no flag that takes a value")
        name, inline = tok, None
        if tok.startswith("--") and "=" in tok:
            name, inline = tok.split("=", 1)
        known = role.flag(name)
        values: list[str] = []
        i += 1
        if inline is not None:
            values.append(inline)
        elif known is not None:
            if known.value and i < len(argv) and not _is_flag(str(argv[i])):
                values.append(str(argv[i]))
                i += 1
        else:
            while i < len(argv) and not _is_flag(str(argv[i])):
                values.append(str(argv[i]))
                i += 1
        groups.append((name, values))
    return groups


def merge_engine_args(plan_args: list[str], overrides: list[str], role: Role) -> list[str]:
    """Plan flags with operator overrides applied; order: plan order, then new override flags."""

    def key(name: str) -> str:
        f = role.flag(name)
        return f.canonical if f else name

    for name, _ in split_flags(overrides, role):
        f = role.flag(name)
        names = set(f.names) if f else {name}
        if names & role.managed_flags:
            raise UsageError(
                f"engine_args: {name} is set by llmfleet from the service fields "
                f"(model_path, port, served_name, api_key); remove it from engine_args"
            )
    merged: dict[str, tuple[str, list[str]]] = {}
    for name, values in split_flags(plan_args, role):
        merged[key(name)] = (name, values)
    for name, values in split_flags(overrides, role):
        merged[key(name)] = (name, values)
    out: list[str] = []
    for name, values in merged.values():
        out.append(name)
        out.extend(values)
    return out


# ---------------------------------------------------------------------------------------------
# Plan access: the planner's ``Plan`` (a deploy), its ``PlanSummary`` (a release read back), or None


def plan_engine_args(plan: Plan | PlanSummary | None) -> list[str]:
    return [str(a) for a in plan.engine_args] if plan is not None else []


def plan_summary(plan: Plan | PlanSummary | None) -> dict[str, Any] | None:
    """The plan as plain data for the manifest: the whole ``Plan`` (``Plan.to_dict``), or a summary's
    fields; ``PlanSummary.from_dict`` reads either back."""
    if plan is None:
        return None
    from llmfleet.knowledge.planner import Plan  # loaded already: ``plan`` came from it

    data = plan.to_dict() if isinstance(plan, Plan) else dataclasses.asdict(plan)
    plain: dict[str, Any] = json.loads(json.dumps(data, default=str))
    return plain


def api_key_value(role: Role, api_key: str, args: list[str]) -> str:
    """The API key as the env file gives it to the engine: listed twice where the engine would log a
    fragment of a single key at the verbosity the command line sets (llama-server at -lv 4 logs
    ``api_keys: ****`` and the last four characters, tools/server/server-http.cpp; with two keys it
    logs only their count). Both entries are the same key: no other key is accepted."""
    level = role.api_key_listed_from_verbosity
    if level is None or "," in api_key:
        return api_key
    from llmfleet.knowledge.compat import arg_value

    value = arg_value(args, *role.verbosity_flags)
    if value is not None and value.lstrip("-").isdigit() and int(value) >= level:
        return f"{api_key},{api_key}"
    return api_key


# ---------------------------------------------------------------------------------------------
# Rendering


def yaml_str(value: Any) -> str:
    """A YAML double-quoted scalar (JSON string syntax) with ``$`` doubled against compose interpolation."""
    return json.dumps(str(value).replace("$", "$$"))


def _env() -> jinja2.Environment:
    """The environment llmfleet renders with (StrictUndefined, the ``q`` filter for YAML strings)."""
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - YAML and INI, not HTML; values go through the q filter
    )
    env.filters["q"] = yaml_str
    return env


@lru_cache(maxsize=32)
def _template(text: str) -> jinja2.Template:
    """A template (a role's compose file, the unit, the env file), compiled once per process and keyed
    by its text: a compile costs more than the whole render, and a fleet run renders once per host.
    Across runs the compiled code is kept (``llmfleet.release.template_cache``)."""
    from llmfleet.release import template_cache

    env = _env()
    return env.template_class.from_code(env, template_cache.code_for(env, text), env.make_globals(None))


@dataclass(frozen=True)
class HeadOverlay:
    """What a multi-host service's head adds to its render (built by ``llmfleet.release.cluster``):
    engine flags naming the workers, an entrypoint, environment, and the host's network instead of a
    published port (the engine then listens on the bind address and the service's port itself)."""

    args: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] | None = None
    environment: tuple[tuple[str, str], ...] = ()
    host_network: bool = False


@dataclass(frozen=True)
class Rendered:
    """One release's files, before a release id is given to it."""

    service: str
    engine: str
    files: dict[str, str]
    modes: dict[str, int]
    secret_files: frozenset[str]
    engine_args: list[str]
    image: ImageRef
    content_hash: str
    inputs: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] | None = None

    def masked_files(self) -> dict[str, str]:
        """The files with every secret value replaced, fit for diffs and logs."""
        return {name: (text if name not in self.secret_files else mask_env(text) if name == ENV_FILE
                       else mask_whole(text)) for name, text in self.files.items()}


def mask_whole(text: str) -> str:
    """A secret file that is not KEY=value lines (the gateway's TLS PEM): its content never shown, only
    a digest prefix, so a diff still says whether it changed."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{SECRET_MASK} ({len(text.encode())} bytes, sha256 {digest}...)\n"


def mask_env(text: str) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        if "=" in line and not line.lstrip().startswith("#"):
            k = line.split("=", 1)[0]
            out.append(f"{k}='{SECRET_MASK}'\n")
        else:
            out.append(line)
    return "".join(out)


def gpu_count(service: Service) -> int | None:
    """GPUs the service asks for; None for ``all`` (unknown until the host is asked)."""
    return None if service.gpus == "all" else len(service.gpus)


def jit_cache_for(image: Any, plan: Any) -> str | None:
    """Why the release needs a CUDA JIT cache volume, or None: the planned card has only PTX in the
    image (its kernels are JIT-compiled at every start unless the cache survives). Judged from the
    image's kernels (catalog, or images.lock / images.inspect) and the plan's card."""
    gpu_id = getattr(plan, "gpu", None) if plan is not None else None
    gpu_id = getattr(gpu_id, "id", gpu_id)
    if not gpu_id:
        return None
    from llmfleet.errors import UsageError as _Usage
    from llmfleet.knowledge import compat
    from llmfleet.knowledge.catalog import find_gpu
    from llmfleet.knowledge.preflight import release_for

    try:
        gpu = find_gpu(str(gpu_id))
        rel, _ = release_for(image, compat.load_engine_catalog())
    except _Usage:
        return None
    if rel is None or rel.cpu or not gpu.compute_capability:
        return None
    cov = compat.kernel_coverage(rel, gpu.compute_capability)
    if cov is None or cov[0] != "ptx":
        return None
    return f"{rel.key} has only PTX ({compat.sm(cov[1])}) for {gpu.name} ({gpu.compute_capability})"


def container_settings(role: Role, service: Service, jit_cache: bool = False) -> dict[str, Any]:
    """The container around the engine, from the role's ``container:`` section and the service:
    the engine's own port, the healthcheck (its start period is the service's load budget), the
    user, ulimits, the compile-cache volume, and shared memory (a private /dev/shm for one GPU,
    the host's IPC namespace for several)."""
    c = role.container
    port = int(c.get("port") or service.port)
    hc = c.get("healthcheck")
    healthcheck = None
    if hc:
        healthcheck = {
            "test": [str(a) for a in hc["test"]],
            "interval": str(hc.get("interval", "30s")),
            "timeout": str(hc.get("timeout", "10s")),
            "retries": int(hc.get("retries", 3)),
            "start_period": f"{service.health.load_timeout_s}s",
        }
    cache = c.get("cache") or None
    jit = c.get("jit_cache") or None
    environment = {str(k): str(v) for k, v in ((cache or {}).get("environment") or {}).items()}
    if jit_cache and jit:
        if cache is None:
            cache = {"target": jit["target"]}
        environment |= {str(k): str(v) for k, v in (jit.get("environment") or {}).items()}
    ipc, shm = role.ipc, role.shm_size
    if ipc == "host" and gpu_count(service) == 1 and c.get("single_gpu_shm_size"):
        ipc, shm = None, str(c["single_gpu_shm_size"])
    return {
        "port": port,
        "healthcheck": healthcheck,
        "user": c.get("user") or None,
        "ulimits": {str(k): int(v) for k, v in (c.get("ulimits") or {}).items()},
        "cache_volume": f"{project_name(service)}-cache" if cache else None,
        "cache_target": cache["target"] if cache else None,
        "environment": environment,
        "ipc": ipc,
        "shm_size": shm,
    }


def _escape_dollars(x: Any) -> Any:
    if isinstance(x, str):
        return x.replace("$", "$$")
    if isinstance(x, dict):
        return {k: _escape_dollars(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_escape_dollars(v) for v in x]
    return x


def compose_override_text(service: Service) -> str:
    """``compose_overrides`` as a second compose file, merged by compose (``-f compose.yml -f
    compose.override.yml``) and checked by ``docker compose config`` on the host before the switch."""
    body = yaml.safe_dump({"services": {"engine": _escape_dollars(service.compose_overrides)}},
                          sort_keys=True, default_flow_style=False, allow_unicode=False)
    return (f"# compose_overrides of service {service.name} from the inventory, merged over {COMPOSE_FILE}.\n"
            "# Dollar signs are doubled: compose interpolates nothing.\n" + body)


def service_dir(settings: HostSettings, service: Service) -> str:
    return f"{settings.root.rstrip('/')}/services/{service.name}"


def unit_name(service: Service | str) -> str:
    name = service if isinstance(service, str) else service.name
    return f"llmfleet-{name}.service"


def duration_s(value: Any) -> float | None:
    """A compose duration (``30s``, ``1m30s``, ``1.5h``; a bare number is seconds) in seconds; None
    when it is not one (``docker compose config`` on the host judges it before any switch)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _DURATION_UNIT_S[u] for n, u in parts)


def stop_grace_s(service: Service) -> int:
    """The role's ``stop_grace_period`` in seconds: 30, or for a gateway its ``timeout_s`` and 5 more:
    its soft stop lets every request in flight (a stream may last ``timeout_s``) finish, and its
    ``hard-stop-after`` ends the rest, so the stop never cuts a stream that is still in time."""
    if service.gateway is not None:
        return service.gateway.timeout_s + 5
    return STOP_GRACE_S


def unit_stop_timeout_s(service: Service) -> int:
    """The unit's ``TimeoutStopSec``: its stop (``docker stop``) waits the container's
    ``stop_grace_period`` (``stop_grace_s`` unless ``compose_overrides`` sets another); a longer one
    than 30 s gets the same margin over it, so systemd never kills the stop half-way."""
    grace = duration_s(service.compose_overrides.get("stop_grace_period", stop_grace_s(service)))
    if grace is None:
        return UNIT_STOP_TIMEOUT_S
    return max(UNIT_STOP_TIMEOUT_S, int(grace + 0.999) + UNIT_STOP_TIMEOUT_S - STOP_GRACE_S)


def project_name(service: Service | str) -> str:
    name = service if isinstance(service, str) else service.name
    return f"llmfleet-{name}"


def content_hash(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return h.hexdigest()


def service_inputs(service: Service) -> dict[str, Any]:
    """The service as the inventory gave it (only the keys it set): secret *references* only, never values."""
    return service.model_dump(mode="json", exclude_unset=True)


def render(
    service: Service,
    settings: HostSettings,
    image: ImageRef,
    plan: Plan | PlanSummary | None = None,
    *,
    api_key: str | None = None,
    bind_address: str | None = None,
    roles_dir: Dirs = None,
    templates_dir: Dirs = None,
    head: HeadOverlay | None = None,
    gateway: Any = None,
) -> Rendered:
    role = load_role(service.engine, roles_dir)
    head = head or HeadOverlay()
    _check_api_key(service, api_key)
    merged = merge_engine_args(plan_engine_args(plan), list(service.engine_args), role)
    box = container_settings(role, service, jit_cache=jit_cache_for(image, plan) is not None)
    bind = bind_address or settings.bind_address_for(service)
    sdir = service_dir(settings, service)
    args = _engine_args(service, role, merged, head, box, bind, sdir)
    compose_text = _compose_text(service, role, image, head, gateway, args, box, bind, sdir)
    unit_text = _unit_text(service, sdir, templates_dir)
    env_text = _env_text(service, role, api_key, args, gateway, templates_dir)

    unit_file = unit_name(service)
    files = {COMPOSE_FILE: compose_text, unit_file: unit_text, ENV_FILE: env_text}
    modes = {COMPOSE_FILE: 0o644, unit_file: 0o644, ENV_FILE: 0o600}
    if service.compose_overrides:
        files[COMPOSE_OVERRIDE_FILE] = compose_override_text(service)
        modes[COMPOSE_OVERRIDE_FILE] = 0o644
    secret_files = {ENV_FILE}
    if gateway is not None and service.engine == "gateway":
        from llmfleet.release import gateway_config

        for name, text in gateway_config.render_files(gateway.spec).items():
            files[name], modes[name] = text, 0o644
        if gateway.tls_pem is not None:
            files[gateway_config.TLS_PEM], modes[gateway_config.TLS_PEM] = gateway.tls_pem, 0o600
            secret_files.add(gateway_config.TLS_PEM)
    from llmfleet.health import watchdog

    for name, (text, mode) in watchdog.release_files(
            service, settings, key_env=role.api_key_env if api_key is not None else None).items():
        files[name], modes[name] = text, mode
    # The hash covers the image too (it is in compose) and the secret (so a rotated key is a change);
    # only the hash, never the value, leaves this function.
    return Rendered(
        service=service.name,
        engine=service.engine,
        files=files,
        modes=modes,
        secret_files=frozenset(secret_files),
        engine_args=args,
        image=image,
        content_hash=content_hash(files),
        inputs=service_inputs(service),
        plan=plan_summary(plan),
    )


def _check_api_key(service: Service, api_key: str | None) -> None:
    if service.api_key is not None and api_key is None:
        raise UsageError(f"service {service.name}: api_key is configured but its value was not resolved")
    if api_key is not None and (not api_key or _SECRET_FORBIDDEN.search(api_key)):
        raise UsageError(
            f"service {service.name}: the API key is empty or holds a quote, newline or NUL; use another key"
        )


def _engine_args(service: Service, role: Role, merged: list[str], head: HeadOverlay, box: dict[str, Any], bind: str,
                 sdir: str) -> list[str]:
    """The engine's command line: the role's base arguments filled in, then the plan's and the service's
    (``merged``), then a head's own; on the host network the healthcheck probes the bind address (``box``)."""
    fill = {"model": role.model_target, "port": str(box["port"]), "served_name": service.public_name,
            "listen": "0.0.0.0", "bind": f"[{bind}]" if ":" in bind else bind, "service_dir": sdir}
    if head.host_network:  # no published port: the engine itself listens on the bind address
        fill |= {"port": str(service.port), "listen": bind}
        if box["healthcheck"]:
            from llmfleet.health.watchdog import probe_address

            box["healthcheck"]["test"] = [t.replace(f"127.0.0.1:{box['port']}", f"{probe_address(bind)}:{service.port}")
                                          for t in box["healthcheck"]["test"]]
    base: list[str] = []
    for group in role.base_args:
        base.extend(tok.format(**fill) for tok in group)
    return base + merged + list(head.args)


def _gpu_request(service: Service) -> Any:
    if service.engine in ("node-exporter", "gateway"):  # reads the host / proxies: no GPU
        return None
    if service.gpus == "all":
        return "all"
    return [int(g) for g in service.gpus]


def _compose_text(service: Service, role: Role, image: ImageRef, head: HeadOverlay, gateway: Any, args: list[str],
                  box: dict[str, Any], bind: str, sdir: str) -> str:
    environment = box["environment"] | dict(service.env) | dict(head.environment)
    if gateway is not None and service.engine == "gateway":  # HAProxy's large buffers from the heap
        from llmfleet.release import gateway_config

        environment = gateway_config.allocator_env(gateway_config.buffer_size(gateway.spec.max_body_bytes)) | environment
    ctx = {
        "service_name": service.name,
        "engine": service.engine,
        "project": project_name(service),
        "container": project_name(service),
        "image": image.pull_ref,
        "entrypoint": list(head.entrypoint) if head.entrypoint else None,
        "args": args,
        "environment": dict(sorted(environment.items())),
        "port": service.port,
        "container_port": box["port"],
        "bind_address": bind,
        "host_network": head.host_network,
        "model_path": service.model_path,
        "model_target": role.model_target,
        "ipc": box["ipc"],
        "shm_size": box["shm_size"],
        "gpu_request": _gpu_request(service),
        "healthcheck": box["healthcheck"],
        "log_max_size": LOG_MAX_SIZE,
        "log_max_file": LOG_MAX_FILE,
        "user": box["user"],
        "ulimits": box["ulimits"],
        "cache_volume": box["cache_volume"],
        "cache_target": box["cache_target"],
        "host_root_mount": role.container.get("host_root_mount"),
        "service_dir": sdir,
        "stop_grace_s": stop_grace_s(service),
    }
    return _template(role.template).render(**ctx)


def _unit_text(service: Service, sdir: str, templates_dir: Dirs) -> str:
    return _template(template_text("llmfleet-service.unit.j2", templates_dir)).render(
        service_name=service.name,
        engine=service.engine,
        unit_path=f"{UNIT_DIR}/{unit_name(service)}",
        service_dir=sdir,
        project=project_name(service),
        container=project_name(service),
        compose_files=[COMPOSE_FILE] + ([COMPOSE_OVERRIDE_FILE] if service.compose_overrides else []),
        docker=DOCKER,
        start_interval=max(600, 2 * service.health.load_timeout_s),
        start_burst=5,
        restart_sec=10,
        timeout_start=service.health.load_timeout_s + 120,
        timeout_stop=unit_stop_timeout_s(service),
    )


def _env_text(service: Service, role: Role, api_key: str | None, args: list[str], gateway: Any,
              templates_dir: Dirs) -> str:
    secrets = {role.api_key_env: api_key_value(role, api_key, args)} if api_key is not None else {}
    if service.engine == "gateway":
        if gateway is None:
            raise UsageError(f"service {service.name}: a gateway is rendered from its plan (release.gateway_plan)")
        secrets |= dict(sorted(gateway.env.items()))  # the replicas' keys, referenced by haproxy.cfg
    return _template(template_text("service.env.j2", templates_dir)).render(service_name=service.name, secrets=secrets)
