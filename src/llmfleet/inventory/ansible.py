"""Ansible-compatible YAML inventories: groups, host ranges, group_vars/host_vars, variable merging.

An existing Ansible inventory works unchanged. The rules follow ansible-core (the ``yaml`` inventory
plugin, ``host_group_vars`` vars plugin and the VariableManager's default precedence):

1. inline ``vars`` of every group the host belongs to, groups sorted by (depth, priority, name);
2. ``group_vars/all``, then ``group_vars/<group>`` files, groups in the same order;
3. inline host vars;
4. ``host_vars/<host>`` files.

Dictionaries are replaced, not merged (Ansible's default ``hash_behaviour``), except that a variable
set twice inline on the same group or host is shallowly combined, as Ansible does.

Pure apart from reading the inventory files. Nothing here contacts a host.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llmfleet.errors import InventoryError, UsageError
from llmfleet.inventory.services import HostSettings, host_settings

VARS_EXTENSIONS = ["", ".yml", ".yaml", ".json"]
INVENTORY_EXTENSIONS = {".yml", ".yaml", ".json"}
_IGNORED_DIRS = {"group_vars", "host_vars", "vars_plugins"}


# ---------------------------------------------------------------------------------------------------
# Data model


@dataclass
class Group:
    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    var_sources: dict[str, str] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    depth: int = 0
    priority: int = 1


@dataclass
class Host:
    """A host with its merged variables.

    ``vars`` is what ``ansible-inventory --host NAME`` prints; ``sources`` maps each variable to the
    file (and group or host) that set the winning value, for error messages.
    """

    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return str(self.vars.get("ansible_host", self.name))


@dataclass
class Inventory:
    path: str
    groups: dict[str, Group]
    hosts: dict[str, Host]

    # -- selection (Ansible's --limit patterns) ----------------------------------------------------

    def select(self, host: str | None = None, group: str | None = None) -> list[Host]:
        """Hosts matching ``--host`` and/or ``--group`` patterns, in inventory order.

        A pattern is Ansible's: names or globs separated by ``,`` or ``:``; ``!x`` excludes,
        ``&x`` intersects, ``~regex`` matches host names by regular expression. A pattern that
        matches nothing is a usage error listing what exists.
        """
        if not host and not group:
            raise UsageError("choose hosts with --host NAME or --group NAME (patterns allowed, e.g. 'gpu-v100-*')")
        names: list[str] = list(self.hosts)
        if group:
            names = [n for n in names if n in self._match(group, kind="group")]
        if host:
            names = [n for n in names if n in self._match(host, kind="host")]
        if not names:
            what = f"--host {host!r}" if host else f"--group {group!r}"
            if host and group:
                what = f"--host {host!r} with --group {group!r}"
            raise UsageError(
                f"{self.path}: {what} matches no host; hosts: {', '.join(self.hosts) or '(none)'}; "
                f"groups: {', '.join(g for g in self.groups if g not in ('all',))}"
            )
        return [self.hosts[n] for n in names]

    def _match(self, pattern: str, kind: str) -> set[str]:
        result: set[str] | None = None
        for term in [t for t in re.split(r"[,:]", pattern) if t]:
            op = ""
            if term[0] in "!&":
                op, term = term[0], term[1:]
            matched = self._match_term(term, kind)
            if op == "!":
                result = (set(self.hosts) if result is None else result) - matched
            elif op == "&":
                result = (set() if result is None else result) & matched
            else:
                result = (set() if result is None else result) | matched
        return result or set()

    def _match_term(self, term: str, kind: str) -> set[str]:
        if term.startswith("~"):
            try:
                rx = re.compile(term[1:])
            except re.error as exc:
                raise UsageError(f"bad regular expression in host pattern {term!r}: {exc}") from None
            return {h for h in self.hosts if rx.search(h)}
        out: set[str] = set()
        for gname in self.groups:
            if fnmatch.fnmatchcase(gname, term):
                out.update(self.group_hosts(gname))
        if kind == "host" or not out:
            out.update(h for h in self.hosts if fnmatch.fnmatchcase(h, term))
        return out

    def group_hosts(self, name: str) -> list[str]:
        """All hosts of a group, its descendants' included, in inventory order."""
        if name == "all":
            return list(self.hosts)
        seen: set[str] = set()
        order: list[str] = []

        def walk(g: str) -> None:
            for h in self.groups[g].hosts:
                if h not in seen:
                    seen.add(h)
                    order.append(h)
            for c in self.groups[g].children:
                walk(c)

        walk(name)
        return order

    # -- Ansible-shaped output --------------------------------------------------------------------

    def to_ansible_list(self) -> dict[str, Any]:
        """The document ``ansible-inventory -i PATH --list`` prints."""
        out: dict[str, Any] = {}
        seen: set[str] = set()

        def fmt(gname: str) -> None:
            g = self.groups[gname]
            entry: dict[str, Any] = {"hosts": list(g.hosts)} if gname != "all" else {}
            entry["children"] = list(g.children)
            entry = {k: v for k, v in entry.items() if v}
            if entry:
                out[gname] = entry
            for child in g.children:
                if child not in seen:
                    seen.add(child)
                    fmt(child)

        fmt("all")
        out["_meta"] = {
            "hostvars": {n: h.vars for n, h in self.hosts.items() if h.vars},
            "profile": "inventory_legacy",
        }
        return out

    def settings_for(self, host: Host) -> HostSettings:
        return settings_for(host)


def settings_for(host: Host) -> HostSettings:
    """The validated ``llmfleet_*`` settings of one host (raises InventoryError naming the file)."""
    return host_settings(host.name, host.vars, host.sources)


def check_all(inv: Inventory, hosts: Iterable[Host] | None = None) -> dict[str, HostSettings]:
    """Validate the llmfleet namespace of every (or the given) host; first error wins."""
    return {h.name: settings_for(h) for h in (hosts if hosts is not None else inv.hosts.values())}


# ---------------------------------------------------------------------------------------------------
# Host ranges


def expand_host_pattern(pattern: str) -> list[str]:
    """Expand Ansible host ranges: ``gpu-[01:04]``, ``node-[a:c]``, ``x[1:10:2]``; nested ranges too."""
    if "[" not in pattern:
        return [pattern]
    if "]" not in pattern:
        raise ValueError(f"unclosed host range in {pattern!r}")
    head, rest = pattern.split("[", 1)
    nrange, tail = rest.split("]", 1)
    bounds = nrange.split(":")
    if len(bounds) not in (2, 3):
        raise ValueError(f"host range must be begin:end or begin:end:step in {pattern!r}")
    beg, end = bounds[0] or "0", bounds[1]
    step = int(bounds[2]) if len(bounds) == 3 else 1
    if not end:
        raise ValueError(f"host range must specify end value in {pattern!r}")
    width = 0
    if beg[0] == "0" and len(beg) > 1:
        width = len(beg)
        if len(end) != width:
            raise ValueError(f"host range must specify equal-length begin and end formats in {pattern!r}")
    if beg in string.ascii_letters and end in string.ascii_letters and not beg.isdigit():
        i_beg, i_end = string.ascii_letters.index(beg), string.ascii_letters.index(end)
        if i_beg > i_end:
            raise ValueError(f"host range must have begin <= end in {pattern!r}")
        seq: list[str] = list(string.ascii_letters[i_beg : i_end + 1 : step])
    else:
        try:
            seq = [str(i).zfill(width) if width else str(i) for i in range(int(beg), int(end) + 1, step)]
        except ValueError:
            raise ValueError(f"host range bounds must be numbers or single letters in {pattern!r}") from None
    out: list[str] = []
    for item in seq:
        out.extend(expand_host_pattern(head + item + tail))
    return out


def _split_port(pattern: str) -> tuple[str, int | None]:
    m = re.match(r"^(?P<host>[^:\[\]]+(?:\[[^\]]+\][^:\[\]]*)*):(?P<port>\d+)$", pattern)
    if m and "[" not in pattern.split(":")[-1]:
        return m.group("host"), int(m.group("port"))
    return pattern, None


# ---------------------------------------------------------------------------------------------------
# Loading


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys less loudly than a crash: last wins, like Ansible."""


def _load_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InventoryError(f"{path}: not UTF-8 text") from None
    if path.suffix == ".json":
        try:
            return json.loads(text) if text.strip() else None
        except json.JSONDecodeError as exc:
            raise InventoryError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    try:
        return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 (SafeLoader subclass)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise InventoryError(f"{path}{line}: malformed YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"{path}: malformed YAML: {exc}") from None


class _Builder:
    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.hosts: dict[str, dict[str, Any]] = {}  # inline host vars
        self.host_sources: dict[str, dict[str, str]] = {}
        self.host_groups: dict[str, list[str]] = {}
        self.add_group("all")
        self.add_group("ungrouped")
        self.add_child("all", "ungrouped")

    def add_group(self, name: str) -> Group:
        if name not in self.groups:
            self.groups[name] = Group(name=name)
        return self.groups[name]

    def add_child(self, parent: str, child: str) -> None:
        p, c = self.groups[parent], self.groups[child]
        if child == parent or child in self._ancestors(parent):
            raise ValueError(f"group {child!r} cannot be a child of {parent!r}: that makes a loop")
        if child not in p.children:
            p.children.append(child)
        if parent not in c.parents:
            c.parents.append(parent)
        self._deepen(child, p.depth + 1)

    def _deepen(self, name: str, depth: int) -> None:
        g = self.groups[name]
        if depth > g.depth:
            g.depth = depth
            for c in g.children:
                self._deepen(c, depth + 1)

    def _ancestors(self, name: str) -> set[str]:
        out: set[str] = set()
        stack = list(self.groups[name].parents)
        while stack:
            g = stack.pop()
            if g not in out:
                out.add(g)
                stack.extend(self.groups[g].parents)
        return out

    def add_host(self, name: str, group: str) -> None:
        if name not in self.hosts:
            self.hosts[name] = {}
            self.host_sources[name] = {}
            self.host_groups[name] = []
        g = self.groups[group]
        if name not in g.hosts:
            g.hosts.append(name)

    @staticmethod
    def set_var(target: dict[str, Any], sources: dict[str, str], key: str, value: Any, src: str) -> None:
        if key in target and isinstance(target[key], Mapping) and isinstance(value, Mapping):
            target[key] = {**target[key], **value}
        else:
            target[key] = value
        sources[key] = src


def _parse_group(b: _Builder, name: Any, data: Any, src: Path) -> str | None:
    if not isinstance(name, str):
        raise InventoryError(f"{src}: group name {name!r} must be a string")
    if data is not None and not isinstance(data, Mapping):
        raise InventoryError(
            f"{src}: group {name!r} must be a mapping with 'hosts', 'vars' or 'children', got {type(data).__name__}"
        )
    b.add_group(name)
    if not data:
        return name
    for section in [k for k in data if k in ("vars", "children", "hosts")]:  # file order, as Ansible
        val = data.get(section)
        if isinstance(val, str):
            val = {val: None}
        if val is not None and not isinstance(val, Mapping):
            raise InventoryError(
                f"{src}: group {name!r}: '{section}' must be a mapping, got {type(val).__name__}"
            )
        if not val:
            continue
        if section == "vars":
            for k, v in val.items():
                if k == "ansible_group_priority":
                    try:
                        b.groups[name].priority = int(v)
                    except (TypeError, ValueError):
                        raise InventoryError(
                            f"{src}: group {name!r}: ansible_group_priority must be an integer, got {v!r}"
                        ) from None
                    continue
                _Builder.set_var(b.groups[name].vars, b.groups[name].var_sources, str(k), v, f"{src} (group {name})")
        elif section == "children":
            for child, child_data in val.items():
                _parse_group(b, child, child_data, src)
                try:
                    b.add_child(name, str(child))
                except ValueError as exc:
                    raise InventoryError(f"{src}: {exc}") from None
        else:
            for pattern, hvars in val.items():
                if hvars is not None and not isinstance(hvars, Mapping):
                    raise InventoryError(
                        f"{src}: host {pattern!r} in group {name!r}: variables must be a mapping, got {type(hvars).__name__}"
                    )
                host_pat, port = _split_port(str(pattern))
                try:
                    names = expand_host_pattern(host_pat)
                except ValueError as exc:
                    raise InventoryError(f"{src}: group {name!r}: {exc}") from None
                for hn in names:
                    b.add_host(hn, name)
                    hv, hs = b.hosts[hn], b.host_sources[hn]
                    if port is not None:
                        _Builder.set_var(hv, hs, "ansible_port", port, f"{src} (host {hn})")
                    for k, v in (hvars or {}).items():
                        _Builder.set_var(hv, hs, str(k), v, f"{src} (host {hn})")
    return name


def _inventory_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files: list[Path] = []
    for entry in sorted(os.listdir(path)):
        if entry.startswith(".") or entry in _IGNORED_DIRS or entry.endswith("~"):
            continue
        full = path / entry
        if full.is_dir():
            files.extend(_inventory_files(full))
        elif full.suffix in INVENTORY_EXTENSIONS:
            files.append(full)
    return files


def find_vars_files(base: Path, name: str) -> list[Path]:
    """``group_vars/NAME`` lookup as Ansible's DataLoader.find_vars_files does it."""
    found: list[Path] = []
    for ext in VARS_EXTENSIONS:
        p = base / f"{name}{ext}"
        if p.is_dir():
            found.extend(_dir_vars_files(p))
        elif p.is_file():
            found.append(p)
    return found


def _dir_vars_files(path: Path) -> list[Path]:
    out: list[Path] = []
    for entry in sorted(os.listdir(path)):
        if entry.startswith(".") or entry.endswith("~"):
            continue
        full = path / entry
        ext = os.path.splitext(entry)[1]
        if full.is_dir() and not ext:
            out.extend(_dir_vars_files(full))
        elif full.is_file() and (not ext or ext in VARS_EXTENSIONS):
            out.append(full)
    return out


def _vars_from_files(files: list[Path]) -> tuple[dict[str, Any], dict[str, str]]:
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in files:
        content = _load_yaml(f)
        if content is None:
            continue
        if not isinstance(content, Mapping):
            raise InventoryError(f"{f}: variables file must hold a mapping, got {type(content).__name__}")
        for k, v in content.items():
            data[str(k)] = v
            sources[str(k)] = str(f)
    return data, sources


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read a YAML inventory (a file, or a folder of files) with its group_vars/ and host_vars/."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InventoryError(f"{p}: inventory not found; pass -i PATH or set llmfleet.inventory in invoke.yaml")
    b = _Builder()
    files = _inventory_files(p)
    if not files:
        raise InventoryError(f"{p}: no inventory file (*.yml, *.yaml, *.json) found")
    for f in files:
        data = _load_yaml(f)
        if data is None:
            continue
        if not isinstance(data, Mapping):
            raise InventoryError(f"{f}: an inventory must be a mapping of groups (e.g. 'all:'), got {type(data).__name__}")
        if "plugin" in data:
            raise InventoryError(f"{f}: dynamic inventory plugins ('plugin:') are not supported; use a YAML inventory")
        for gname, gdata in data.items():
            _parse_group(b, gname, gdata, f)

    # reconcile, as Ansible does: top-level groups under all; group-less hosts in ungrouped
    for gname in list(b.groups):
        if gname != "all" and not b._ancestors(gname):
            b.add_child("all", gname)
    for hn in b.hosts:
        member = [g for g in b.groups if hn in b.groups[g].hosts]
        if "ungrouped" in member and set(member) - {"all", "ungrouped"}:
            b.groups["ungrouped"].hosts.remove(hn)
        elif not set(member) - {"all"}:
            if hn not in b.groups["ungrouped"].hosts:
                b.groups["ungrouped"].hosts.append(hn)

    base = p if p.is_dir() else p.parent
    hosts: dict[str, Host] = {}
    file_cache: dict[tuple[str, str], tuple[dict[str, Any], dict[str, str]]] = {}

    def files_vars(kind: str, name: str) -> tuple[dict[str, Any], dict[str, str]]:
        key = (kind, name)
        if key not in file_cache:
            file_cache[key] = _vars_from_files(find_vars_files(base / kind, name))
        return file_cache[key]

    for hn in b.hosts:
        direct = [g for g in b.groups if hn in b.groups[g].hosts]
        member: list[str] = []
        for g in direct:
            for a in [g, *sorted(b._ancestors(g))]:
                if a not in member:
                    member.append(a)
        if "all" not in member:
            member.append("all")
        ordered = sorted(member, key=lambda g: (b.groups[g].depth, b.groups[g].priority, g))
        merged: dict[str, Any] = {}
        sources: dict[str, str] = {}
        # 1. inline group vars (all first: depth 0)
        for g in ordered:
            merged.update(b.groups[g].vars)
            sources.update(b.groups[g].var_sources)
        # 2. group_vars files: all, then the others in the same order
        for g in ["all"] + [g for g in ordered if g != "all"]:
            d, s = files_vars("group_vars", g)
            merged.update(d)
            sources.update(s)
        # 3. inline host vars, 4. host_vars files
        merged.update(b.hosts[hn])
        sources.update(b.host_sources[hn])
        d, s = files_vars("host_vars", hn)
        merged.update(d)
        sources.update(s)
        hosts[hn] = Host(name=hn, vars=merged, groups=[g for g in ordered if g != "all"], sources=sources)

    return Inventory(path=str(path), groups=b.groups, hosts=hosts)
