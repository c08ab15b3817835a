"""Turning ``-i`` arguments into one inventory, the way ansible-core's InventoryManager does.

Each argument, in order, is one source:

- a string with a comma that is not an existing path is a host list (``-i 'h1,h2:2222,'``), hosts in
  ``ungrouped``;
- a folder: every entry in name order, recursively, except hidden ones, ``group_vars``, ``host_vars``,
  ``vars_plugins`` and Ansible's ignore list (``INVENTORY_IGNORE_EXTS``: ``.pyc .pyo .swp .bak ~ .rpm
  .md .txt .rst .orig .cfg .retry``; overridden by ``ANSIBLE_INVENTORY_IGNORE``, plus the regexes in
  ``ANSIBLE_INVENTORY_IGNORE_REGEX``);
- a file: Ansible's plugins in their default order, the first that accepts it wins:
  ``script`` (readable and executable: run with ``--list``, nothing on stdin, for at most
  ``llmfleet.inventory_timeout`` seconds; one that runs and fails, or gives no answer in time, stops
  the load, in a folder too; one that cannot be started is left to the other formats), ``auto`` (``.yml``/``.yaml`` with ``plugin:``: the
  ``constructed`` plugin here; any other plugin is run through ``ansible-inventory`` when it is
  installed), ``yaml`` (``.yml .yaml .json`` or no extension), ``ini`` (anything but ``.toml``),
  ``toml``.

A source named on the command line that no format accepts is an error listing why each refused it.
A file inside a folder that none accepts is skipped with a warning, as Ansible does, unless its
extension (``.yml .yaml .json .ini .toml``) says what it was meant to be: then it is an error.
``group_vars/`` and ``host_vars/`` are read beside every file or folder source.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path

from llmfleet.errors import InventoryError
from llmfleet.inventory import constructed, ini, script
from llmfleet.inventory import toml as toml_inv
from llmfleet.inventory.ansible import (
    Builder,
    Inventory,
    load_yaml,
    parse_yaml_inventory,
    read_text,
    resolve,
    split_port,
)
from llmfleet.inventory.connection import inventory_warnings
from llmfleet.inventory.values import InventoryWarning

DEFAULT_IGNORE_EXTS = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".cfg", ".retry")
YAML_EXTS = (".yml", ".yaml", ".json")
_STRICT_EXTS = (*YAML_EXTS, ".ini", ".toml")


def ignore_regex(env: Mapping[str, str] | None = None) -> re.Pattern[str]:
    """Ansible's IGNORED pattern for folder entries, from its defaults and environment settings."""
    env = os.environ if env is None else env
    exts: tuple[str, ...] = DEFAULT_IGNORE_EXTS
    if env.get("ANSIBLE_INVENTORY_IGNORE") is not None:
        exts = tuple(e.strip() for e in env["ANSIBLE_INVENTORY_IGNORE"].split(",") if e.strip())
    patterns = [p.strip() for p in env.get("ANSIBLE_INVENTORY_IGNORE_REGEX", "").split(",") if p.strip()]
    parts = [r"^\.", r"^host_vars$", r"^group_vars$", r"^vars_plugins$", *patterns, *(re.escape(e) + "$" for e in exts)]
    return re.compile("|".join(parts))


def is_host_list(arg: str, cwd: Path | None = None) -> bool:
    path = Path(os.path.expanduser(arg))
    if cwd is not None and not path.is_absolute():
        path = cwd / path
    return "," in arg and not path.exists()


def parse_host_list(b: Builder, arg: str) -> None:
    """``-i 'h1, h2:2222,'``: Ansible's ``host_list`` plugin (no ranges)."""
    for item in arg.split(","):
        item = item.strip()
        if not item:
            continue
        host, port = split_port(item)
        if "[" in host:
            host, port = item, None
        if host not in b.hosts:
            b.add_host(host, "ungrouped", port)


class _Refused(Exception):
    """A format declined or failed to parse a file; the message says why."""


def _yaml_data(path: Path):
    return load_yaml(path)


def _try_script(b: Builder, path: Path, cwd: Path | None, timeout: float) -> None:
    script.parse_script_inventory(b, path, cwd, timeout)


def _try_auto(b: Builder, path: Path, cwd: Path | None, timeout: float) -> None:
    try:
        data = _yaml_data(path)
    except InventoryError as exc:
        raise _Refused(str(exc)) from None
    if not isinstance(data, Mapping) or not data.get("plugin"):
        raise _Refused("no 'plugin:' key")
    name = str(data["plugin"])
    if name in constructed.NAMES:
        constructed.parse_constructed(b, path, data)
        return
    exe = shutil.which("ansible-inventory")
    if exe is None:
        raise InventoryError(
            f"{path}: inventory plugin {name!r} runs only inside Ansible, and ansible-inventory is not installed; "
            "install ansible-core, or give an inventory file or script instead"
        )
    script.ingest(b, path, script.run([exe, "-i", str(path), "--list"], cwd, f"ansible-inventory -i {path} --list",
                                      timeout))


def _try_yaml(b: Builder, path: Path, cwd: Path | None, timeout: float) -> None:
    parse_yaml_inventory(b, path, _yaml_data(path))


def _try_ini(b: Builder, path: Path, cwd: Path | None, timeout: float) -> None:
    ini.parse_ini_inventory(b, path, read_text(path))


def _try_toml(b: Builder, path: Path, cwd: Path | None, timeout: float) -> None:
    toml_inv.parse_toml_inventory(b, path, read_text(path))


def _plugins(path: Path) -> list[tuple[str, object]]:
    ext = path.suffix
    out: list[tuple[str, object]] = []
    # Ansible's script plugin takes a readable file that is executable (or starts with #!, which then fails
    # to run unless executable): lib/ansible/plugins/inventory/script.py, verify_file, and the readable check
    # of lib/ansible/plugins/inventory/__init__.py, BaseInventoryPlugin.verify_file
    if os.access(path, os.X_OK) and os.access(path, os.R_OK):
        out.append(("script", _try_script))
    if ext in (".yml", ".yaml"):
        out.append(("auto", _try_auto))
    if not ext or ext in YAML_EXTS:
        out.append(("yaml", _try_yaml))
    if ext != ".toml":
        out.append(("ini", _try_ini))
    else:
        out.append(("toml", _try_toml))
    return out


def _preferred(path: Path, failures: list[tuple[str, str]]) -> str:
    """The refusal that best explains what the file was meant to be."""
    by = dict(failures)
    ext = path.suffix
    for name in (("script",) if "script" in by else ()) + (
        ("auto", "yaml") if ext in YAML_EXTS else ("toml",) if ext == ".toml" else ("ini",) if ext else ()
    ):
        if name in by:
            return by[name]
    return "; ".join(f"as {n}: {m}" for n, m in failures)


def parse_file(b: Builder, path: Path, cwd: Path | None, explicit: bool, timeout: float = script.TIMEOUT_S) -> bool:
    failures: list[tuple[str, str]] = []
    for name, fn in _plugins(path):
        b.current_source = str(path)
        try:
            fn(b, path, cwd, timeout)  # type: ignore[operator]
            return True
        except _Refused as exc:
            if name != "auto":
                failures.append((name, str(exc)))
        except InventoryError as exc:
            if name == "auto":
                raise
            if name == "script" and not isinstance(exc, script.CannotRun):
                # It ran, so it is a script, and it failed (exit status, output, no answer in time): that
                # stops the load, in a folder too. Ansible would warn and read the script's text as INI.
                raise InventoryError(str(exc) if explicit else f"{exc} (an executable in a folder source is "
                                     f"run as an inventory script, as Ansible does)") from None
            failures.append((name, str(exc)))
        finally:
            b.current_source = None
    reason = _preferred(path, failures)
    if explicit or path.suffix in _STRICT_EXTS:
        raise InventoryError(reason if reason.startswith(str(path)) else f"{path}: not an inventory: {reason}")
    b.warn(f"{path}: skipped: not an inventory in any format Ansible reads ({reason})")
    return False


def parse_folder(b: Builder, folder: Path, cwd: Path | None, ignored: re.Pattern[str],
                 timeout: float = script.TIMEOUT_S, _seen: set[str] | None = None) -> int:
    """Every entry of ``folder`` in name order, as Ansible's InventoryManager.parse_source walks a folder
    (lib/ansible/inventory/manager.py): hidden entries, group_vars/host_vars/vars_plugins and the ignored
    extensions skipped, sub-folders recursively (a folder reached twice through links is read once)."""
    seen = set() if _seen is None else _seen
    real = os.path.realpath(folder)
    if real in seen:
        return 0
    seen.add(real)
    parsed = 0
    try:
        entries = sorted(os.listdir(folder))
    except OSError as exc:
        raise InventoryError(f"{folder}: cannot list: {exc.strerror}") from None
    for entry in entries:
        if ignored.search(entry):
            continue
        full = folder / entry
        if full.is_dir():
            parsed += parse_folder(b, full, cwd, ignored, timeout, seen)
        elif full.is_file():
            parsed += parse_file(b, full, cwd, explicit=False, timeout=timeout)
    return parsed


def load_sources(args: list[str], cwd: Path | None = None, vault=None, script_timeout: float = script.TIMEOUT_S
                 ) -> Inventory:
    """Read every ``-i`` source in order into one inventory, then merge host variables."""
    b = Builder()
    var_dirs: list[Path] = []
    ignored = ignore_regex()
    for arg in args:
        if is_host_list(arg, cwd):
            parse_host_list(b, arg)
            continue
        path = Path(os.path.expanduser(arg))
        if cwd is not None and not path.is_absolute():
            path = cwd / path
        if not path.exists():
            raise InventoryError(f"{arg}: inventory not found; pass -i PATH or set llmfleet.inventory in invoke.yaml")
        if path.is_dir():
            if not parse_folder(b, path, cwd, ignored, script_timeout):
                raise InventoryError(f"{path}: no inventory file found in this folder (YAML, INI, TOML or a script)")
            var_dirs.append(path)
        else:
            parse_file(b, path, cwd, explicit=True, timeout=script_timeout)
            var_dirs.append(path.parent)
    # ``path`` is where relative settings (llmfleet_images_lock) are based: the first file or folder
    # source; a host list alone has none.
    files = [a for a in args if not is_host_list(a, cwd)]
    base = files[0] if files else args[0]
    if cwd is not None and files and not Path(base).is_absolute():
        base = str(cwd / base)
    inv = resolve(b, var_dirs, path=base, sources=args, vault=vault)
    inv.warnings.extend(inventory_warnings(list(inv.hosts.values())))
    for w in inv.warnings:
        warnings.warn(w, InventoryWarning, stacklevel=3)
    return inv
