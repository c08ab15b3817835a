"""Ansible inventories as ansible-core resolves them: groups, host ranges, group_vars/host_vars, precedence.

An existing Ansible inventory works unchanged. Every ``-i`` source is read the way ``ansible-inventory``
reads it (``llmfleet.inventory.sources``: YAML, INI, TOML, executable scripts, host lists, folders,
the ``constructed`` plugin), into one ``Builder`` that mirrors ansible-core's ``InventoryData``. Host
variables then merge in ansible-core's default order (``VariableManager``, ``host_group_vars``):

1. inline vars of ``all``, then of every other group of the host, sorted by (depth, priority, name);
2. ``group_vars/all`` beside each source, in source order;
3. ``group_vars/<group>`` beside each source (source by source, groups in the same order);
4. inline host vars;
5. ``host_vars/<host>`` beside each source.

A dictionary set again replaces the old one (``hash_behaviour=replace``, ansible-core's default).

Pure apart from reading the inventory files (and running an executable inventory). Nothing here
contacts a host.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llmfleet import yamlload
from llmfleet.errors import InventoryError, UsageError
from llmfleet.inventory.services import HostSettings, host_settings
from llmfleet.inventory.values import UnsafeText, VaultValue, ansible_json, from_ansible_json

VARS_EXTENSIONS = ["", ".yml", ".yaml", ".json"]


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
    file (and group or host) that set the winning value, for error messages. ``inventory_file`` is
    the source the host was first read from (Ansible's ``inventory_file``).
    """

    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    inventory_file: str | None = None

    @property
    def address(self) -> str:
        return str(self.vars.get("ansible_host", self.name))

    @property
    def inventory_dir(self) -> str | None:
        return os.path.dirname(self.inventory_file) if self.inventory_file else None


@dataclass
class Inventory:
    path: str
    groups: dict[str, Group]
    hosts: dict[str, Host]
    sources: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

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
            from llmfleet.suggest import did_you_mean

            hint = did_you_mean(host, self.hosts) if host and not re.search(r"[*?\[!&~,:]", host) else ""
            if group and not host and not re.search(r"[*?\[!&~,:]", group):
                hint = did_you_mean(group, [g for g in self.groups if g != "all"])
            raise UsageError(
                f"{self.path}: {what} matches no host{hint}; hosts: {', '.join(self.hosts) or '(none)'}; "
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
            "hostvars": {n: ansible_json(h.vars, unsafe_tags=True) for n, h in self.hosts.items() if h.vars},
            "profile": "inventory_legacy",
        }
        return out

    def host_json(self, name: str) -> dict[str, Any]:
        """The document ``ansible-inventory -i PATH --host NAME`` prints."""
        return ansible_json(self.hosts[name].vars, unsafe_tags=False)

    def settings_for(self, host: Host) -> HostSettings:
        return settings_for(host)


def settings_for(host: Host) -> HostSettings:
    """The validated ``llmfleet_*`` settings of one host (raises InventoryError naming the file).

    ``{{ var }}`` references in llmfleet's variables are resolved first, as Ansible would.
    """
    from llmfleet.inventory.templating import resolve_namespace

    return host_settings(host.name, resolve_namespace(host), host.sources)


def check_all(inv: Inventory, hosts: Iterable[Host] | None = None) -> dict[str, HostSettings]:
    """Validate the llmfleet namespace of every (or the given) host; first error wins."""
    return {h.name: settings_for(h) for h in (hosts if hosts is not None else inv.hosts.values())}


# ---------------------------------------------------------------------------------------------------
# Host ranges and addresses


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


_BRACKETED_PORT = re.compile(r"^\[(?P<host>[^\]]+)\]:(?P<port>\d+)$")
_HOST_PORT = re.compile(r"^(?P<host>[^:\[\]]+(?:\[[^\]]+\][^:\[\]]*)*):(?P<port>\d+)$")


def split_port(pattern: str) -> tuple[str, int | None]:
    """``host:port`` / ``[v6-or-range]:port`` into (host, port), as ansible's parse_address does."""
    m = _BRACKETED_PORT.match(pattern)
    if m:
        return m.group("host"), int(m.group("port"))
    m = _HOST_PORT.match(pattern)
    if m and "[" not in pattern.split(":")[-1]:
        return m.group("host"), int(m.group("port"))
    return pattern, None


def expand_hosts(pattern: str) -> tuple[list[str], int | None]:
    """An inventory host key (``web[01:03]:2222``) into host names and a port."""
    host, port = split_port(pattern)
    return (expand_host_pattern(host) if "[" in host else [host]), port


# ---------------------------------------------------------------------------------------------------
# The inventory being built (ansible-core's InventoryData)


class Builder:
    """Groups, hosts and inline variables as the inventory plugins add them, in Ansible's order."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.hosts: dict[str, dict[str, Any]] = {}  # inline host vars
        self.host_sources: dict[str, dict[str, str]] = {}
        self.host_files: dict[str, str | None] = {}
        self.current_source: str | None = None
        self.warnings: list[str] = []
        self.add_group("all")
        self.add_group("ungrouped")
        self.add_child("all", "ungrouped")

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def add_group(self, name: Any) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError(f"invalid group name {name!r}: must be a non-empty string")
        if name not in self.groups:
            self.groups[name] = Group(name=name)
        return name

    def add_host(self, name: Any, group: str | None = None, port: int | None = None) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError(f"invalid host name {name!r}: must be a non-empty string (quote numbers)")
        if group is not None and group not in self.groups:
            raise ValueError(f"group {group!r} is not in the inventory")
        if name not in self.hosts:
            self.hosts[name] = {}
            self.host_sources[name] = {}
            self.host_files[name] = self.current_source
            if port is not None:
                self.set_variable(name, "ansible_port", int(port), where=f"host {name}")
        if group is not None and name not in self.groups[group].hosts:
            self.groups[group].hosts.append(name)
        return name

    def add_child(self, parent: str, child: str) -> None:
        if parent not in self.groups:
            raise ValueError(f"{parent!r} is not a known group")
        if child in self.groups:
            p, c = self.groups[parent], self.groups[child]
            if child == parent or child in self.ancestors(parent):
                raise ValueError(f"group {child!r} cannot be a child of {parent!r}: that makes a loop")
            if child not in p.children:
                p.children.append(child)
            if parent not in c.parents:
                c.parents.append(parent)
            self._deepen(child, p.depth + 1)
        elif child in self.hosts:
            if child not in self.groups[parent].hosts:
                self.groups[parent].hosts.append(child)
        else:
            raise ValueError(f"{child!r} is not a known host nor group")

    def _deepen(self, name: str, depth: int) -> None:
        g = self.groups[name]
        if depth > g.depth:
            g.depth = depth
            for c in g.children:
                self._deepen(c, depth + 1)

    def ancestors(self, name: str) -> set[str]:
        out: set[str] = set()
        stack = list(self.groups[name].parents)
        while stack:
            g = stack.pop()
            if g not in out:
                out.add(g)
                stack.extend(self.groups[g].parents)
        return out

    def set_variable(self, entity: str, key: Any, value: Any, where: str = "") -> None:
        """Set one inline variable of a group or host (a group's name wins over a host's, as in Ansible)."""
        key = str(key)
        src = f"{self.current_source} ({where})" if self.current_source and where else (self.current_source or where)
        if entity in self.groups:
            g = self.groups[entity]
            if key == "ansible_group_priority":
                try:
                    g.priority = int(value)
                except (TypeError, ValueError):
                    raise ValueError(f"group {entity!r}: ansible_group_priority must be an integer, got {value!r}") from None
                return
            g.vars[key] = value
            g.var_sources[key] = src
        elif entity in self.hosts:
            self.hosts[entity][key] = value
            self.host_sources[entity][key] = src
        else:
            raise ValueError(f"{entity!r} is not a known group or host")

    def populate_host_vars(self, names: list[str], variables: Any, group: str | None, port: int | None) -> None:
        if not isinstance(variables, Mapping):
            raise ValueError(f"host variables must be a mapping, got {type(variables).__name__}")
        for hn in names:
            self.add_host(hn, group, port)
            for k, v in variables.items():
                self.set_variable(hn, k, v, where=f"host {hn}")

    def host_groups(self, host: str) -> list[str]:
        """Groups holding the host directly, and their ancestors."""
        out: list[str] = []
        for g in self.groups:
            if host in self.groups[g].hosts:
                for a in [g, *sorted(self.ancestors(g))]:
                    if a not in out:
                        out.append(a)
        return out

    def reconcile(self) -> None:
        """Top-level groups go under ``all``; hosts in no other group go to ``ungrouped``."""
        self.current_source = None
        for gname in list(self.groups):
            if gname != "all" and not self.ancestors(gname):
                self.add_child("all", gname)
        for hn in self.hosts:
            member = self.host_groups(hn)
            if "ungrouped" in member and set(member) - {"all", "ungrouped"}:
                self.groups["ungrouped"].hosts.remove(hn)
            elif not set(member) - {"all"} and hn not in self.groups["ungrouped"].hosts:
                self.groups["ungrouped"].hosts.append(hn)


# ---------------------------------------------------------------------------------------------------
# YAML files (inventories and vars files)


# How many nodes YAML aliases may add when expanded (each use of ``*name`` counts the whole anchored
# value again). PyYAML shares an aliased value instead of copying it, so loading an alias bomb ("billion
# laughs": nine anchors of nine aliases each) is cheap, but anything that walks the values afterwards
# (templating, schema validation, --json output) expands it: 9^9 nodes, gigabytes and minutes. Real
# inventories use aliases for a handful of shared blocks, far below this.
MAX_ALIAS_EXPANSION = 100_000


class _YamlLoader(yamlload.SafeLoader):
    """SafeLoader (libyaml's when there) with Ansible's tags: ``!vault`` (opaque secret) and ``!unsafe`` (never templated);
    a document whose aliases expand beyond ``MAX_ALIAS_EXPANSION`` nodes is refused before any value
    is built."""

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        check_alias_expansion(node)
        return self.construct_document(node)


class AliasBombError(yaml.YAMLError):
    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark


def check_alias_expansion(root: yaml.Node, limit: int = MAX_ALIAS_EXPANSION) -> int:
    """The expanded size of a composed YAML document (nodes, every alias use counted in full).

    Raises ``AliasBombError`` naming the key path and the mark of the first value whose aliases add
    more than ``limit`` nodes, or of a value that contains itself (a recursive alias). Iterative and
    memoised on the shared nodes: linear in the document's text, whatever the expansion.
    """
    size: dict[int, int] = {}
    unique: set[int] = set()
    open_: set[int] = set()
    # (node, key path, children pushed?)
    stack: list[tuple[yaml.Node, str, bool]] = [(root, "", False)]
    while stack:
        node, path, expanded = stack.pop()
        nid = id(node)
        if expanded:
            open_.discard(nid)
            total = 1 + sum(size[id(c)] for c in _children(node))
            size[nid] = total
            unique.add(nid)
            if total - len(unique) > limit:
                raise AliasBombError(
                    f"YAML aliases{' under ' + path if path else ''} expand to {total:,} values (more than "
                    f"{limit:,} from aliases; an alias bomb?); write the values out or use fewer aliases",
                    node.start_mark)
            continue
        if nid in size:
            continue
        if nid in open_:
            raise AliasBombError(f"YAML alias{' under ' + path if path else ''} refers to a value that contains "
                                 "it (a recursive alias)", node.start_mark)
        open_.add(nid)
        stack.append((node, path, True))
        # children pushed last first: values are visited in document order, so a shared value is
        # named by the key that defines its anchor
        if isinstance(node, yaml.MappingNode):
            for k, v in reversed(node.value):
                key = k.value if isinstance(k, yaml.ScalarNode) else "?"
                sub = (f"{path}.{key}" if path else str(key))[:200]
                stack.append((v, sub, False))
                stack.append((k, sub, False))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in reversed(list(enumerate(node.value))):
                stack.append((v, f"{path}[{i}]"[:200], False))
    return size[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [x for kv in node.value for x in kv]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _vault(loader: yaml.SafeLoader, node: yaml.Node) -> VaultValue:
    return VaultValue(str(loader.construct_scalar(node)))  # type: ignore[arg-type]


def _unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return UnsafeText(str(loader.construct_scalar(node)))
    if isinstance(node, yaml.SequenceNode):
        return [UnsafeText(x) if isinstance(x, str) else x for x in loader.construct_sequence(node, deep=True)]
    return loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]


_YamlLoader.add_constructor("!vault", _vault)
_YamlLoader.add_constructor("!vault-encrypted", _vault)
_YamlLoader.add_constructor("!unsafe", _unsafe)


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InventoryError(f"{path}: not UTF-8 text") from None


def load_yaml(path: Path, text: str | None = None) -> Any:
    """A YAML (or JSON) file as Ansible's loader reads it; errors name the file and line."""
    text = read_text(path) if text is None else text
    if path.suffix == ".json":
        try:
            return from_ansible_json(json.loads(text)) if text.strip() else None
        except json.JSONDecodeError as exc:
            raise InventoryError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    try:
        return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 (SafeLoader subclass)
    except AliasBombError as exc:
        line = f":{exc.mark.line + 1}" if exc.mark else ""
        raise InventoryError(f"{path}{line}: {exc.message}") from None
    except RecursionError:
        raise InventoryError(f"{path}: YAML nested too deeply; flatten the values") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise InventoryError(f"{path}{line}: malformed YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"{path}: malformed YAML: {exc}") from None


def parse_yaml_inventory(b: Builder, path: Path, data: Any) -> None:
    """Ansible's ``yaml`` inventory plugin: top-level keys are groups."""
    if not data:
        raise InventoryError(f"{path}: empty YAML file")
    if not isinstance(data, Mapping):
        raise InventoryError(f"{path}: an inventory must be a mapping of groups (e.g. 'all:'), got {type(data).__name__}")
    if data.get("plugin"):
        raise InventoryError(f"{path}: inventory plugin configuration ('plugin: {data.get('plugin')}'), not a YAML inventory")
    for gname, gdata in data.items():
        _parse_yaml_group(b, gname, gdata, path)


def _parse_yaml_group(b: Builder, name: Any, data: Any, src: Path) -> str | None:
    if data is not None and not isinstance(data, Mapping):
        b.warn(f"{src}: skipping {name!r}: not a valid group definition (a mapping with hosts, vars, children)")
        return None
    try:
        b.add_group(name)
    except ValueError as exc:
        raise InventoryError(f"{src}: {exc}") from None
    if not data:
        return name
    data = dict(data)
    for section in ("vars", "children", "hosts"):
        if section in data:
            if isinstance(data[section], str):
                data[section] = {data[section]: None}
            if data[section] is not None and not isinstance(data[section], Mapping):
                raise InventoryError(
                    f"{src}: group {name!r}: '{section}' must be a mapping, got {type(data[section]).__name__}"
                )
    for key, val in data.items():  # file order, as Ansible
        if val is None:
            continue
        if not isinstance(val, Mapping):
            b.warn(f"{src}: group {name!r}: skipping key {key!r}: not a mapping")
            continue
        try:
            if key == "vars":
                for k, v in val.items():
                    b.set_variable(name, k, v, where=f"group {name}")
            elif key == "children":
                for child, child_data in val.items():
                    sub = _parse_yaml_group(b, child, child_data, src)
                    if sub is not None:
                        b.add_child(name, sub)
            elif key == "hosts":
                for pattern, hvars in val.items():
                    if not isinstance(pattern, str):
                        raise ValueError(f"host pattern {pattern!r} must be a string; quote numbers")
                    names, port = expand_hosts(pattern)
                    if hvars is not None and not isinstance(hvars, Mapping):
                        raise ValueError(
                            f"host {pattern!r}: variables must be a mapping, got {type(hvars).__name__}"
                        )
                    b.populate_host_vars(names, hvars or {}, name, port)
            else:
                b.warn(f"{src}: group {name!r}: skipping unexpected key {key!r} (only vars, children, hosts)")
        except ValueError as exc:
            prefix = "" if str(exc).startswith("group ") else f"group {name!r}: "
            raise InventoryError(f"{src}: {prefix}{exc}") from None
    return name


# ---------------------------------------------------------------------------------------------------
# group_vars / host_vars


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


def _vars_from_files(
    files: list[Path], vault: Any = None, warn: Any = None
) -> tuple[dict[str, Any], dict[str, str]]:
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in files:
        text = read_text(f)
        if text.lstrip().startswith("$ANSIBLE_VAULT;"):
            # a whole vars file encrypted with ansible-vault (group_vars/all/vault.yml)
            from llmfleet.inventory.values import VaultValue

            if vault is None or not vault.path:
                if warn is not None:
                    warn(f"{f}: vault-encrypted; its variables are not loaded (give --vault-password-file "
                         "or set ANSIBLE_VAULT_PASSWORD_FILE)")
                continue
            text = vault.decrypt(VaultValue(text), str(f))
        content = load_yaml(f, text)
        if content is None:
            continue
        if not isinstance(content, Mapping):
            raise InventoryError(f"{f}: variables file must hold a mapping, got {type(content).__name__}")
        for k, v in content.items():
            data[str(k)] = v
            sources[str(k)] = str(f)
    return data, sources


def sort_groups(b: Builder, names: Iterable[str]) -> list[str]:
    return sorted(names, key=lambda g: (b.groups[g].depth, b.groups[g].priority, g))


def resolve(b: Builder, var_dirs: Sequence[Path], path: str, sources: list[str], vault: Any = None) -> Inventory:
    """Merge every host's variables (see the module docstring) into an Inventory."""
    b.reconcile()
    hosts: dict[str, Host] = {}
    cache: dict[tuple[Path, str, str], tuple[dict[str, Any], dict[str, str]]] = {}

    def files_vars(base: Path, kind: str, name: str) -> tuple[dict[str, Any], dict[str, str]]:
        key = (base, kind, name)
        if key not in cache:
            folder = base / kind
            cache[key] = _vars_from_files(find_vars_files(folder, name), vault, b.warn) if folder.is_dir() else ({}, {})
        return cache[key]

    for hn in b.hosts:
        member = [g for g in b.host_groups(hn) if g != "all"]
        ordered = sort_groups(b, member)
        merged: dict[str, Any] = {}
        srcs: dict[str, str] = {}
        for g in ["all", *ordered]:
            merged.update(b.groups[g].vars)
            srcs.update(b.groups[g].var_sources)
        for base in var_dirs:
            d, s = files_vars(base, "group_vars", "all")
            merged.update(d)
            srcs.update(s)
        for base in var_dirs:
            for g in ordered:
                d, s = files_vars(base, "group_vars", g)
                merged.update(d)
                srcs.update(s)
        merged.update(b.hosts[hn])
        srcs.update(b.host_sources[hn])
        for base in var_dirs:
            d, s = files_vars(base, "host_vars", hn)
            merged.update(d)
            srcs.update(s)
        hosts[hn] = Host(name=hn, vars=merged, groups=ordered, sources=srcs, inventory_file=b.host_files.get(hn))
    return Inventory(path=path, groups=b.groups, hosts=hosts, sources=list(sources), warnings=list(b.warnings))


def load_inventory(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    vault_password_file: str | None = None,
    script_timeout: float | None = None,
) -> Inventory:
    """Read one or several ``-i`` sources (files, folders, scripts, host lists) as ansible-inventory does.

    An inventory script runs for at most ``script_timeout`` seconds (None: llmfleet.inventory.script's
    default, 30 s).

    Vars files encrypted whole with ansible-vault are decrypted with the vault password file
    (``vault_password_file``, else ``ANSIBLE_VAULT_PASSWORD_FILE``); without one they are skipped
    with a warning."""
    from llmfleet.inventory.sources import load_sources

    if isinstance(path, str | os.PathLike):
        args = [os.fspath(path)]
    else:
        args = [os.fspath(p) for p in path]
    if not args:
        raise UsageError("no inventory given: pass -i PATH or set llmfleet.inventory in invoke.yaml")
    from llmfleet.inventory.script import TIMEOUT_S
    from llmfleet.inventory.vault import Vault

    return load_sources(args, cwd=Path(cwd) if cwd is not None else None, vault=Vault(vault_password_file),
                        script_timeout=TIMEOUT_S if script_timeout is None else script_timeout)
