"""The ``constructed`` inventory plugin: groups and variables computed from what earlier sources set.

A YAML file with ``plugin: constructed`` (or ``ansible.builtin.constructed``), given after the sources
it reads (``-i hosts.yml -i constructed.yml``), adds for each host, as ansible-core does:
``compose`` (new variables from Jinja expressions), ``groups`` (membership from conditionals) and
``keyed_groups`` (a group per value of an expression: ``prefix``, ``separator``, ``default_value``,
``trailing_separator``, ``parent_group``; ``leading_separator`` at the top level). Expressions see the
host's inline group and host variables. ``strict: false`` (the default) skips an expression that
fails, as Ansible does; ``strict: true`` makes it an error. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmfleet.errors import InventoryError
from llmfleet.inventory.ansible import Builder, sort_groups
from llmfleet.inventory.templating import TemplateError, evaluate_expression
from llmfleet.inventory.values import UnsafeText

NAMES = ("constructed", "ansible.builtin.constructed")
_INVALID = re.compile(r"^[\d\W]|[^\w]")


def safe_group_name(name: str) -> str:
    """Constructed group names get invalid characters replaced by ``_`` (ansible-core's
    ``to_safe_group_name(force=True)``, unlike names written in INI/YAML files)."""
    return _INVALID.sub("_", name)
_OPTIONS = {"plugin", "strict", "compose", "groups", "keyed_groups", "leading_separator", "use_vars_plugins",
            "use_extra_vars"}


def _untrusted(value: Any) -> Any:
    """Template results are not trusted templates themselves (ansible-inventory prints them unsafe)."""
    if isinstance(value, str):
        return UnsafeText(value)
    if isinstance(value, list | tuple):
        return [_untrusted(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _untrusted(v) for k, v in value.items()}
    return value


def _host_vars(b: Builder, host: str) -> dict[str, Any]:
    member = b.host_groups(host)
    if "all" not in member:
        member.append("all")
    out: dict[str, Any] = {}
    for g in sort_groups(b, member):
        out.update(b.groups[g].vars)
    out.update(b.hosts[host])
    out.update({
        "inventory_hostname": host,
        "inventory_hostname_short": host.split(".", 1)[0],
        "group_names": sorted(g for g in member if g != "all"),
    })
    return out


def parse_constructed(b: Builder, path: Path, config: Mapping[str, Any]) -> None:
    unknown = sorted(set(config) - _OPTIONS)
    if unknown:
        b.warn(f"{path}: constructed: ignoring unsupported option(s) {', '.join(unknown)}")
    if config.get("use_vars_plugins"):
        raise InventoryError(f"{path}: constructed: use_vars_plugins is not supported; remove it")
    strict = bool(config.get("strict", False))
    compose = config.get("compose") or {}
    groups = config.get("groups") or {}
    keyed = config.get("keyed_groups") or []
    leading = config.get("leading_separator", True)
    if not isinstance(compose, Mapping) or not isinstance(groups, Mapping) or not isinstance(keyed, list):
        raise InventoryError(f"{path}: constructed: compose and groups must be mappings, keyed_groups a list")

    def fail(msg: str) -> None:
        raise InventoryError(f"{path}: {msg}")

    for host in list(b.hosts):
        variables = _host_vars(b, host)
        for varname, expr in compose.items():
            try:
                value = evaluate_expression(str(expr), variables)
            except TemplateError as exc:
                if strict:
                    fail(f"could not set {varname} for host {host}: {exc}")
                continue
            b.set_variable(host, varname, _untrusted(value), where=f"host {host}, constructed")
        variables = _host_vars(b, host)
        for gname, cond in groups.items():
            try:
                result = evaluate_expression(str(cond), variables)
            except TemplateError as exc:
                if strict:
                    fail(f"could not add host {host} to group {gname}: {exc}")
                continue
            if result:
                gname = b.add_group(safe_group_name(str(gname)))
                b.add_child(gname, host)
        for entry in keyed:
            if not entry or not isinstance(entry, Mapping):
                continue
            try:
                key = evaluate_expression(str(entry.get("key")), variables)
            except TemplateError as exc:
                if strict:
                    fail(f"could not generate group for host {host} from {entry.get('key')!r}: {exc}")
                continue
            default = entry.get("default_value")
            trailing = entry.get("trailing_separator")
            if trailing is not None and default is not None:
                fail("keyed_groups: default_value and trailing_separator are mutually exclusive")
            use_default = key in (None, "") and default is not None
            if not (key or use_default):
                if strict and key not in ([], {}):
                    fail(f"keyed_groups: key {entry.get('key')!r} is empty for host {host}")
                continue
            prefix = entry.get("prefix", "")
            sep = entry.get("separator", "_")
            parent = entry.get("parent_group")
            if isinstance(parent, str) and "{{" in parent:
                try:
                    parent = evaluate_expression(parent.strip().removeprefix("{{").removesuffix("}}"), variables)
                except TemplateError as exc:
                    if strict:
                        fail(f"could not generate parent group {parent!r}: {exc}")
                    continue
            names: list[str] = []
            if use_default:
                names.append(str(default))
            elif isinstance(key, str):
                names.append(key)
            elif isinstance(key, list):
                names.extend(str(default) if n in (None, "") and default is not None else str(n) for n in key)
            elif isinstance(key, Mapping):
                for k, v in key.items():
                    bare = f"{k}{sep}{v}"
                    if v in (None, ""):
                        if default is not None:
                            bare = f"{k}{sep}{default}"
                        elif trailing is False:
                            bare = str(k)
                    names.append(bare)
            else:
                fail(f"keyed_groups: key {entry.get('key')!r} gave a {type(key).__name__}; "
                     "expected a string, a list or a mapping")
            for bare in names:
                this_sep = "" if prefix == "" and leading is False else sep
                gname = b.add_group(safe_group_name(f"{prefix}{this_sep}{bare}"))
                b.add_host(host, gname)
                if parent:
                    pname = b.add_group(safe_group_name(str(parent)))
                    b.add_child(pname, gname)
