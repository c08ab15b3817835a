"""TOML inventories, read as ansible-core's ``toml`` plugin reads them (``tomllib``).

Top-level tables are groups with ``hosts`` (table of host tables), ``vars`` (table) and ``children``
(list of group names). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmfleet.errors import InventoryError
from llmfleet.inventory.ansible import Builder, expand_hosts


def parse_toml_inventory(b: Builder, path: Path, text: str) -> None:
    import tomllib  # only for TOML inventories: every command loads an inventory, few are TOML

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(f"{path}: malformed TOML: {exc}") from None
    if not data:
        raise InventoryError(f"{path}: empty TOML file")
    if data.get("plugin"):
        raise InventoryError(f"{path}: inventory plugin configuration, not a TOML inventory")
    try:
        for name, gdata in data.items():
            _group(b, name, gdata, path)
    except ValueError as exc:
        raise InventoryError(f"{path}: {exc}") from None


def _group(b: Builder, name: str, data: Any, path: Path) -> None:
    if data is not None and not isinstance(data, Mapping):
        b.warn(f"{path}: skipping {name!r}: not a valid group definition")
        return
    b.add_group(name)
    for key, value in (data or {}).items():
        if key == "vars":
            if not isinstance(value, Mapping):
                raise ValueError(f"group {name!r}: 'vars' must be a table, got {type(value).__name__}")
            for k, v in value.items():
                b.set_variable(name, k, v, where=f"group {name}")
        elif key == "children":
            if not isinstance(value, list):
                raise ValueError(f"group {name!r}: 'children' must be a list, got {type(value).__name__}")
            for sub in value:
                _group(b, sub, {}, path)
                b.add_child(name, sub)
        elif key == "hosts":
            if not isinstance(value, Mapping):
                raise ValueError(f"group {name!r}: 'hosts' must be a table, got {type(value).__name__}")
            for pattern, hvars in value.items():
                names, port = expand_hosts(pattern)
                b.populate_host_vars(names, hvars if hvars is not None else {}, name, port)
        else:
            b.warn(f"{path}: group {name!r}: skipping unexpected key {key!r} (only vars, children, hosts)")
