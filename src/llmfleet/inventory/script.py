"""Executable inventories: run ``PATH --list`` (and ``--host NAME`` when there is no ``_meta``) and
read the JSON, as ansible-core's ``script`` plugin does.

The script runs in the caller's working directory with no shell and nothing on its stdin; a non-zero
exit, non-JSON output or a malformed document is one error naming the script and the last line it wrote
to stderr. It runs for at most ``timeout`` seconds (the ``llmfleet.inventory_timeout`` setting, 30 s by
default; Ansible's own script plugin waits for ever): past it, the script and every process it started
are killed and the load stops with ``ScriptTimeout``, whose line names the script.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmfleet.errors import InventoryError
from llmfleet.inventory.ansible import Builder
from llmfleet.inventory.values import from_ansible_json

TIMEOUT_S = 30.0


class CannotRun(InventoryError):
    """The file could not be started at all (no ``#!`` line, no permission): not a script, Ansible's other
    formats may read it (an INI file with the executable bit, from a Windows share)."""


class ScriptTimeout(InventoryError):
    """An inventory script gave no answer within its time limit: the load stops (not a skipped file)."""


def timeout_message(what: str, timeout: float) -> str:
    """The line for a script (``what``: its command) that ran past ``timeout`` seconds."""
    return (f"{what}: no answer within {timeout:g} s, killed; give a slow inventory script longer with "
            f"llmfleet.inventory_timeout (invoke.yaml)")


def run(cmd: list[str], cwd: Path | None, what: str, timeout: float = TIMEOUT_S) -> Any:
    try:
        # a session of its own: on timeout the whole group goes (a shell script's `sleep` would otherwise
        # hold the output pipe open, and the wait for it would never end)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,  # noqa: S603
                                stderr=subprocess.PIPE, cwd=cwd, start_new_session=True)
    except OSError as exc:
        raise CannotRun(f"{what}: cannot run: {exc.strerror}") from None
    try:
        out, err_bytes = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()
        raise ScriptTimeout(timeout_message(what, timeout)) from None
    finally:
        if proc.returncode is None:  # interrupted (Ctrl-C): the script goes too
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.kill()
            proc.wait()
    err = err_bytes.decode("utf-8", "replace").strip().splitlines()
    tail = f": {err[-1][:300]}" if err else ""
    if proc.returncode != 0:
        raise InventoryError(f"{what}: exited {proc.returncode}{tail}")
    try:
        text = out.decode("utf-8")
    except UnicodeDecodeError:
        raise InventoryError(f"{what}: output is not UTF-8") from None
    if not text.strip():
        return None
    try:
        return from_ansible_json(json.loads(text))
    except json.JSONDecodeError as exc:
        raise InventoryError(f"{what}: output is not JSON (line {exc.lineno}: {exc.msg}){tail}") from None


def parse_script_inventory(b: Builder, path: Path, cwd: Path | None = None, timeout: float = TIMEOUT_S) -> None:
    data = run([str(path), "--list"], cwd, f"{path} --list", timeout)
    if data is None:
        raise InventoryError(f"{path} --list: printed nothing; an inventory script prints its groups as JSON")
    ingest(b, path, data, host_vars_cmd=lambda h: run([str(path), "--host", h], cwd, f"{path} --host {h}", timeout))


def ingest(b: Builder, path: Path | str, data: Any, host_vars_cmd=None) -> None:
    """Add an ``ansible-inventory --list``-shaped document (script or plugin output) to the builder."""
    if not isinstance(data, Mapping):
        raise InventoryError(f"{path}: inventory JSON must be an object of groups, got {type(data).__name__}")
    meta: Any = None
    hosts: list[str] = []
    try:
        for group, gdata in data.items():
            if group == "_meta":
                if not isinstance(gdata, Mapping):
                    raise ValueError("'_meta' must be an object")
                meta = gdata.get("hostvars")
                if not isinstance(meta, Mapping):
                    raise ValueError("'_meta.hostvars' must be an object")
                continue
            b.add_group(group)
            if not isinstance(gdata, Mapping):
                gdata = {"hosts": gdata}
            elif not any(k in gdata for k in ("hosts", "vars", "children")):
                gdata = {"hosts": [group], "vars": gdata}
            if "hosts" in gdata:
                if not isinstance(gdata["hosts"], list):
                    raise ValueError(f"'{group}.hosts' must be a list, got {type(gdata['hosts']).__name__}")
                for h in gdata["hosts"]:
                    b.add_host(h, group)
                    if h not in hosts:
                        hosts.append(h)
            if "vars" in gdata:
                if not isinstance(gdata["vars"], Mapping):
                    raise ValueError(f"'{group}.vars' must be an object, got {type(gdata['vars']).__name__}")
                for k, v in gdata["vars"].items():
                    b.set_variable(group, k, v, where=f"group {group}")
            for child in gdata.get("children") or []:
                b.add_group(child)
                b.add_child(group, child)
        for h in hosts:
            if meta is None:
                got = host_vars_cmd(h) if host_vars_cmd else {}
            else:
                got = meta.get(h, {})
            b.populate_host_vars([h], got or {}, None, None)
    except ValueError as exc:
        raise InventoryError(f"{path}: {exc}") from None
