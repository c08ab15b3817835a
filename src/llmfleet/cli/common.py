"""Shared plumbing for task modules: error handling, output, host selection.

Task modules stay thin: parse flags, call the package, print. Everything here is about that shell.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from invoke.exceptions import Exit
from rich.console import Console
from rich.markup import escape

from llmfleet.errors import LlmfleetError

# Piped or logged output (CI, `| tee`) has no terminal width; rich would squeeze tables into 80
# columns. Use a wide fixed width there unless COLUMNS says otherwise.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
console = Console(stderr=False, highlight=False, soft_wrap=True, width=_WIDTH)
err_console = Console(stderr=True, highlight=False, soft_wrap=True, width=_WIDTH)


INVENTORY_HELP = ("inventory source: file, folder, script or 'h1,h2,' host list; repeat -i to merge several "
                  "(default: llmfleet.inventory in invoke.yaml)")


def _show_warning(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
    from llmfleet.inventory.values import InventoryWarning

    if issubclass(category, InventoryWarning):
        err_console.print(f"[yellow]warning[/yellow]: {escape(str(message))}")
    else:
        _default_show_warning(message, category, filename, lineno, file, line)


_default_show_warning = warnings.showwarning
warnings.showwarning = _show_warning  # inventory warnings print as one "warning:" line on stderr


def cfg(c, key: str, default: Any = None) -> Any:
    """Read ``llmfleet.<key>`` from Invoke's config (invoke.yaml, env INVOKE_LLMFLEET_*, -f files)."""
    node = c.config.get("llmfleet", {}) or {}
    for part in key.split("."):
        if not isinstance(node, dict) and not hasattr(node, "get"):
            return default
        node = node.get(part, None)
        if node is None:
            return default
    return node


def inventory_path(c, inventory: str | list[str] | None) -> str | list[str]:
    """The ``-i`` sources: one path (str), or a list when ``-i`` was repeated."""
    if isinstance(inventory, list | tuple):
        inventory = list(inventory) if len(inventory) > 1 else (inventory[0] if inventory else None)
    if inventory:
        return inventory
    default = cfg(c, "inventory", "inventory/lab/")
    return list(default) if isinstance(default, list | tuple) and len(default) > 1 else default


def repeatable_inventory(collection) -> None:
    """Make ``-i/--inventory`` repeatable on every task that takes it (Ansible merges several -i)."""
    import inspect

    for t in collection.tasks.values():
        if "inventory" in inspect.signature(t.body).parameters and "inventory" not in t.iterable:
            t.iterable = [*t.iterable, "inventory"]
    for sub in collection.collections.values():
        repeatable_inventory(sub)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def handles_errors(fn: Callable) -> Callable:
    """Turn llmfleet errors into Invoke's Exit: one line on stderr, the error's exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LlmfleetError as exc:
            raise Exit(f"error: {exc}", code=exc.exit_code) from None
        except KeyboardInterrupt:
            raise Exit("interrupted", code=130) from None

    return wrapper


def ssh_config(c) -> dict[str, Any]:
    """The ``llmfleet.ssh`` section of the config, as a plain dict for ``llmfleet.host.ssh.connect``."""
    section = cfg(c, "ssh", {}) or {}
    return {k: section.get(k) for k in ("connect_timeout", "command_timeout", "user", "known_hosts", "config_file")}
