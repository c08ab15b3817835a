"""Ansible's INI inventory format, parsed as ansible-core's ``ini`` plugin does.

``[group]`` sections hold host lines (``name[:port] key=value ...``, ranges allowed), ``[group:vars]``
hold ``key=value`` lines, ``[group:children]`` name child groups (declared before or after). Lines
before any section belong to ``ungrouped``; ``#`` and ``;`` start comments. Every value, inline or in a
``:vars`` section, is typed the way Ansible types it: ``ast.literal_eval`` when that succeeds (numbers,
``True``, lists, dicts, quoted strings; tuples and sets become lists, ``...`` and complex numbers
stay strings, bytes become unsafe strings), the raw text otherwise. Pure.
"""

from __future__ import annotations

import ast
import re
import shlex
import warnings
from pathlib import Path
from typing import Any

from llmfleet.errors import InventoryError
from llmfleet.inventory.ansible import Builder, expand_hosts
from llmfleet.inventory.values import UnsafeText

_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:\#.*)?$")
_GROUPNAME = re.compile(r"^([^:\]\s]+)\s*(?:\#.*)?$")


def parse_value(text: str) -> Any:
    """One INI value, typed as Ansible types it (``ini`` plugin ``_parse_value``)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value: Any = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = text
    return _coerce(value)


def _coerce(value: Any) -> Any:
    if isinstance(value, bytes):
        return UnsafeText(value.decode("utf-8", "surrogateescape"))
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple | set | frozenset):
        return [_coerce(v) for v in value]
    if isinstance(value, dict):
        return {k: _coerce(v) for k, v in value.items()}
    if value is ...:
        return "..."
    if isinstance(value, complex):
        return str(value)
    return value


class _Error(Exception):
    pass


def parse_ini_inventory(b: Builder, path: Path, text: str) -> None:
    """Add the groups, hosts and variables of one INI file to the builder."""
    pending: dict[str, dict[str, Any]] = {}
    group, state = "ungrouped", "hosts"
    lineno = 0

    def add_pending_children(name: str) -> None:
        for parent in pending[name]["parents"]:
            b.add_child(parent, name)
            if parent in pending and pending[parent]["state"] == "children":
                add_pending_children(parent)
        del pending[name]

    try:
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            m = _SECTION.match(line)
            if m:
                group, state = m.group(1), m.group(2) or "hosts"
                if state not in ("hosts", "children", "vars"):
                    raise _Error(f"section [{':'.join(x for x in m.groups() if x)}] has unknown type {state!r} "
                                 "(use [group], [group:vars] or [group:children])")
                if group not in b.groups:
                    if state == "vars" and group not in pending:
                        pending[group] = {"line": lineno, "state": state, "name": group}
                    b.add_group(group)
                if group in pending and state != "vars":
                    if pending[group]["state"] == "children":
                        add_pending_children(group)
                    elif pending[group]["state"] == "vars":
                        del pending[group]
                continue
            if line.startswith("[") and line.endswith("]"):
                raise _Error(f"invalid section {line!r}: no spaces or other characters allowed in a section name")
            if state == "hosts":
                try:
                    tokens = shlex.split(line, comments=True)
                except ValueError as exc:
                    raise _Error(f"cannot parse host line {line!r}: {exc}") from None
                if not tokens:
                    continue
                pattern = tokens[0]
                try:
                    names, port = expand_hosts(pattern)
                except ValueError as exc:
                    raise _Error(str(exc)) from None
                if pattern.strip().endswith(":") and port is None:
                    raise _Error(f"invalid host pattern {pattern!r}: ending in ':' is reserved for a port")
                if any(n.strip() == "---" for n in names):
                    raise _Error(f"invalid host pattern {pattern!r}: '---' is a sign this is a YAML file")
                variables: dict[str, Any] = {}
                for tok in tokens[1:]:
                    if "=" not in tok:
                        raise _Error(f"expected key=value host variable assignment, got {tok!r}")
                    k, v = tok.split("=", 1)
                    variables[k] = parse_value(v)
                b.populate_host_vars(names, variables, group, port)
            elif state == "vars":
                if "=" not in line:
                    raise _Error(f"expected key=value in [{group}:vars], got {line!r}")
                k, v = (e.strip() for e in line.split("=", 1))
                b.set_variable(group, k, parse_value(v), where=f"group {group}")
            else:
                m = _GROUPNAME.match(line)
                if not m:
                    raise _Error(f"expected a group name in [{group}:children], got {line!r}")
                child = m.group(1)
                if child not in b.groups:
                    if child not in pending:
                        pending[child] = {"line": lineno, "state": "children", "name": child, "parents": [group]}
                    else:
                        pending[child].setdefault("parents", []).append(group)
                else:
                    b.add_child(group, child)
        for decl in pending.values():
            lineno = decl["line"]
            if decl["state"] == "vars":
                raise _Error(f"section [{decl['name']}:vars] is for group {decl['name']!r}, which is not defined")
            raise _Error(f"section [{decl['parents'][-1]}:children] names group {decl['name']!r}, which is not defined")
    except (_Error, ValueError) as exc:
        raise InventoryError(f"{path}:{lineno}: {exc}") from None
