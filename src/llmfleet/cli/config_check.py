"""Invoke configuration files checked before they are used: one line naming the file (and the line) when
one is missing, unreadable, not YAML/JSON, or holds a key llmfleet does not know.

Pure: ``problem(path, text, ...)`` returns the error line or None; ``check_file`` reads the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from llmfleet.suggest import did_you_mean

SUFFIXES = (".yaml", ".yml", ".json")
# Invoke's own top-level sections (Config.global_defaults()): allowed beside llmfleet's.
INVOKE_SECTIONS = ("run", "runners", "sudo", "tasks", "timeouts")
# Keys llmfleet reads beyond the collection's defaults (llmfleet.settings.Settings.of)
EXTRA_KEYS = {"pull_timeout": None}


def schema(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The keys an llmfleet config may hold: the collection's ``llmfleet`` defaults (nested where they
    are mappings) and Invoke's own sections (not looked into)."""
    return {"llmfleet": {**dict(defaults), **EXTRA_KEYS}, **{k: None for k in INVOKE_SECTIONS}}


def problem(path: str, text: str, known: Mapping[str, Any], *, top_level: bool = True) -> str | None:
    """What is wrong with config file ``path`` holding ``text``, as one line; None when it is fine.
    ``top_level``: also refuse unknown top-level sections (a user-wide ~/.invoke.yaml may serve other
    projects too: only its ``llmfleet`` section is checked)."""
    if path.endswith(".json"):
        try:
            data = json.loads(text or "{}")
        except ValueError as exc:
            return f"{path}: not valid JSON ({exc})"
        return _check_data(path, data, known, top_level)
    import yaml

    try:
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return f"{path}{where}: not valid YAML ({what}); fix the file or pass another with -f"
    if node is None:
        return None
    if not isinstance(node, yaml.MappingNode):
        return f"{path} line {node.start_mark.line + 1}: expected a mapping of settings (llmfleet: ...)"
    return _check_node(path, node, known, "", top_level)


def _check_node(path: str, node: Any, known: Mapping[str, Any], prefix: str, top_level: bool) -> str | None:
    import yaml

    for key_node, value_node in node.value:
        key = str(key_node.value)
        line = key_node.start_mark.line + 1
        if key not in known:
            if not top_level and not prefix:
                continue
            name = f"{prefix}{key}"
            hint = did_you_mean(key, known) or f" (known: {', '.join(sorted(known))})"
            return f"{path} line {line}: unknown setting {name!r}{hint}"
        sub = known[key]
        if isinstance(sub, Mapping):
            if isinstance(value_node, yaml.MappingNode):
                err = _check_node(path, value_node, sub, f"{prefix}{key}.", True)
                if err:
                    return err
            elif not (isinstance(value_node, yaml.ScalarNode) and value_node.tag.endswith(":null")):
                return f"{path} line {line}: {prefix}{key} must be a mapping (e.g. {key}:\\n  {next(iter(sub), 'key')}: ...)"
    return None


def _check_data(path: str, data: Any, known: Mapping[str, Any], top_level: bool, prefix: str = "") -> str | None:
    if data is None:
        return None
    if not isinstance(data, Mapping):
        return f"{path}: {prefix.rstrip('.') or 'the file'} must be a mapping of settings"
    for key, value in data.items():
        if key not in known:
            if not top_level and not prefix:
                continue
            hint = did_you_mean(str(key), known) or f" (known: {', '.join(sorted(known))})"
            return f"{path}: unknown setting {prefix + str(key)!r}{hint}"
        if isinstance(known[key], Mapping) and value is not None:
            err = _check_data(path, value, known[key], True, f"{prefix}{key}.")
            if err:
                return err
    return None


def check_file(path: str, known: Mapping[str, Any], *, must_exist: bool, top_level: bool = True,
               flag: str = "") -> str | None:
    """Read and check one config file; ``flag`` names where it was given (``-f``) for the message."""
    given = f"{flag} {path}" if flag else path
    full = os.path.expanduser(path)
    if not os.path.exists(full):
        return f"{given}: no such config file" if must_exist else None
    if os.path.isdir(full):
        return f"{given}: is a folder; give a config file (.yaml, .yml or .json)"
    if not full.endswith(SUFFIXES):
        return f"{given}: not a config file; give a .yaml, .yml or .json file"
    try:
        with open(full, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        return f"{given}: cannot read it ({exc})"
    return problem(path, text, known, top_level=top_level)
