"""Jinja in inventory variables: ``{{ other_var }}`` resolved as Ansible would, for what llmfleet reads.

``ansible-inventory`` prints variables unrendered, and so does ``invoke inventory --list/--host``. The
values llmfleet acts on (``llmfleet_*``, and the connection variables: ``ansible_host``,
``ansible_port``, ``ansible_user``, ...) are rendered first, with the host's variables and Ansible's
magic variables (``inventory_hostname``, ``inventory_hostname_short``, ``group_names``, ``groups``,
``inventory_dir``, ``inventory_file``). A string that is one ``{{ expression }}`` keeps the
expression's type (``{{ port }}`` stays an int), as Ansible's native templating does. An undefined
name, a filter Ansible has and llmfleet does not, or a reference loop is one error naming the
variable and the file that set it. Unsafe strings (``!unsafe``, INI bytes) are never rendered.

Rendering runs in Jinja's immutable sandbox: no attribute access to internals, no side effects. Pure.
A value that is one bare variable (``{{ inventory_hostname }}``) is that variable's value, looked up
without Jinja (the same answer; Jinja is loaded only for anything more).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llmfleet.errors import InventoryError
from llmfleet.inventory.values import UnsafeText, VaultValue

if TYPE_CHECKING:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from llmfleet.inventory.ansible import Host, Inventory

NAMESPACE_PREFIX = "llmfleet_"
_WHOLE = re.compile(r"^\s*\{\{(?P<expr>.*?)\}\}\s*$", re.S)
_BARE = re.compile(r"^\s*\{\{\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*\}\}\s*$")
_KEYWORDS = {"true", "false", "none", "True", "False", "None", "loop", "range", "lipsum", "dict", "cycler",
             "joiner", "namespace"}


class TemplateError(InventoryError):
    """A variable's Jinja cannot be resolved."""


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on", "y", "t")


def _ternary(value: Any, true_val: Any, false_val: Any, none_val: Any = None) -> Any:
    if value is None and none_val is not None:
        return none_val
    return true_val if value else false_val


def _regex_replace(value: Any, pattern: str, replacement: str = "", ignorecase: bool = False) -> str:
    return re.sub(pattern, replacement, str(value), flags=re.I if ignorecase else 0)


def _regex_search(value: Any, pattern: str) -> str | None:
    m = re.search(pattern, str(value))
    return m.group(0) if m else None


def _mandatory(value: Any, msg: str | None = None) -> Any:
    import jinja2

    if isinstance(value, jinja2.Undefined):
        raise jinja2.UndefinedError(msg or "mandatory variable not defined")
    return value


@functools.cache
def _env() -> ImmutableSandboxedEnvironment:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters.update({
        "bool": _bool,
        "ternary": _ternary,
        "regex_replace": _regex_replace,
        "regex_search": _regex_search,
        "mandatory": _mandatory,
        "to_json": lambda v: json.dumps(v),
        "quote": lambda v: __import__("shlex").quote(str(v)),
        "basename": lambda v: str(v).rsplit("/", 1)[-1],
        "dirname": lambda v: str(v).rsplit("/", 1)[0] if "/" in str(v) else "",
    })
    return env




def has_template(value: Any) -> bool:
    return isinstance(value, str) and not isinstance(value, UnsafeText) and ("{{" in value or "{%" in value)


def evaluate_expression(expr: str, variables: Mapping[str, Any]) -> Any:
    """A bare Jinja expression's native value (the ``constructed`` plugin's keys, groups, compose)."""
    import jinja2

    try:
        out = _env().compile_expression(expr, undefined_to_none=False)(**dict(variables))
        if isinstance(out, jinja2.Undefined):
            out._fail_with_undefined_error()
        return out
    except jinja2.TemplateError as exc:
        raise TemplateError(str(exc)) from None


def magic_vars(host: Host, inventory: Inventory | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "inventory_hostname": host.name,
        "inventory_hostname_short": host.name.split(".", 1)[0],
        "group_names": sorted(g for g in host.groups if g != "all"),
        "inventory_dir": host.inventory_dir,
        "inventory_file": host.inventory_file,
    }
    if inventory is not None:
        out["groups"] = {g: inventory.group_hosts(g) for g in inventory.groups}
    return out


class Resolver:
    """Renders one host's variables on demand, following references between them."""

    def __init__(self, host: Host, inventory: Inventory | None = None) -> None:
        self.host = host
        self.magic = magic_vars(host, inventory)
        self._done: dict[str, Any] = {}
        self._stack: list[str] = []

    def where(self, name: str) -> str:
        src = self.host.sources.get(name)
        return f"{src}: host {self.host.name}" if src else f"host {self.host.name}"

    def var(self, name: str) -> Any:
        if name in self._done:
            return self._done[name]
        if name in self._stack:
            loop = " -> ".join([*self._stack[self._stack.index(name):], name])
            raise TemplateError(f"{self.where(self._stack[0])}: {self._stack[0]}: variables refer to each other in a loop ({loop})")
        if name in self.host.vars:
            self._stack.append(name)
            try:
                value = self.value(self.host.vars[name], name)
            finally:
                self._stack.pop()
        elif name in self.magic:
            value = self.magic[name]
        else:
            raise KeyError(name)
        self._done[name] = value
        return value

    def value(self, value: Any, name: str) -> Any:
        if isinstance(value, Mapping):
            return {k: self.value(v, name) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v, name) for v in value]
        if not has_template(value):
            return value
        return self.render(value, name)

    def render(self, text: str, name: str) -> Any:
        top = self._stack[0] if self._stack else name
        bare = _BARE.match(text)
        if bare is not None and bare.group("name") not in _KEYWORDS:
            try:
                return self.var(bare.group("name"))
            except KeyError:
                raise TemplateError(f"{self.where(top)}: {name}: '{bare.group('name')}' is undefined "
                                    f"(in {text!r})") from None
        import jinja2
        from jinja2 import meta

        env = _env()
        try:
            refs = sorted(meta.find_undeclared_variables(env.parse(text)))
        except jinja2.TemplateError as exc:
            raise TemplateError(f"{self.where(top)}: {name}: cannot render {text!r}: {exc.message}") from None
        context: dict[str, Any] = {}
        whole = _WHOLE.match(text)
        single = whole is not None and "{{" not in whole.group("expr") and "{%" not in text
        for ref in refs:
            try:
                v = self.var(ref)
            except KeyError:
                continue  # StrictUndefined reports it below, with the name
            if isinstance(v, VaultValue) and not single:
                raise TemplateError(
                    f"{self.where(top)}: {name}: uses vault-encrypted {ref} inside a string; "
                    f"reference it alone ('{{{{ {ref} }}}}')"
                )
            context[ref] = v
        try:
            if single and whole is not None:
                out = env.compile_expression(whole.group("expr"), undefined_to_none=False)(**context)
                if isinstance(out, jinja2.Undefined):
                    out._fail_with_undefined_error()
                return out
            return env.from_string(text).render(context)
        except jinja2.UndefinedError as exc:
            raise TemplateError(f"{self.where(top)}: {name}: {exc.message} (in {text!r})") from None
        except jinja2.TemplateError as exc:
            raise TemplateError(f"{self.where(top)}: {name}: cannot render {text!r}: {exc}") from None
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise TemplateError(f"{self.where(top)}: {name}: cannot render {text!r}: {exc}") from None


def resolve_namespace(host: Host, inventory: Inventory | None = None) -> dict[str, Any]:
    """The host's variables with every ``llmfleet_*`` one rendered; others untouched."""
    r = Resolver(host, inventory)
    return {k: (r.var(k) if k.startswith(NAMESPACE_PREFIX) else v) for k, v in host.vars.items()}
