"""The ``ansible_*`` connection variables llmfleet honours, and a warning for each one it ignores.

llmfleet connects with its own SSH client, so only some of Ansible's connection settings apply. The
ones it honours are listed in ``HONOURED`` (and docs/inventory.md); any other connection variable a
host sets (``ansible_become_password``, ``ansible_ssh_pipelining``, ...) would silently not apply, so
it is a warning naming the variable. Pure.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmfleet.errors import InventoryError

if TYPE_CHECKING:
    from llmfleet.inventory.ansible import Host

# variable -> what llmfleet does with it
HONOURED: dict[str, str] = {
    "ansible_host": "address to connect to (alias: ansible_ssh_host)",
    "ansible_ssh_host": "address to connect to",
    "ansible_port": "SSH port (alias: ansible_ssh_port)",
    "ansible_ssh_port": "SSH port",
    "ansible_user": "login user (alias: ansible_ssh_user)",
    "ansible_ssh_user": "login user",
    "ansible_ssh_private_key_file": "private key (alias: ansible_private_key_file)",
    "ansible_private_key_file": "private key",
    "ansible_become": "run remote commands through sudo -n",
    "ansible_become_user": "the user sudo runs commands as (default root)",
    "ansible_become_method": "only sudo is supported; another method is an error",
    "ansible_connection": "ssh, paramiko or smart (all mean SSH here); another plugin is an error",
    "ansible_ssh_common_args": "-J, -i, -p, -l, -F and -o HostName/Port/User/IdentityFile/ProxyJump/ProxyCommand "
                               "are applied; other arguments are warned about",
    "ansible_ssh_extra_args": "as ansible_ssh_common_args",
    "ansible_timeout": "SSH connect timeout in seconds (alias: ansible_ssh_timeout)",
    "ansible_ssh_timeout": "SSH connect timeout in seconds",
}

# Connection settings of Ansible's ssh/paramiko connection, become and shell plugins (variable names
# from ansible-core's plugin documentation); a host setting one of these not in HONOURED is warned about.
_CONNECTION_VAR = re.compile(
    r"^ansible_(ssh_|paramiko_|become_|sudo_|su_|scp_|sftp_|shell_|control_path|host_key|password|pass$|"
    r"pipelining|connection|timeout|private_key|port|user|host$|remote_|pty|persistent_)"
)

SUPPORTED_CONNECTIONS = {"ssh", "paramiko", "smart", "paramiko_ssh", "ansible.builtin.ssh", "ansible.builtin.paramiko_ssh"}


def is_connection_var(name: str) -> bool:
    return bool(_CONNECTION_VAR.match(name))


def inventory_warnings(hosts: list[Host]) -> list[str]:
    """Connection variables ignored across an inventory: one line per variable and file, naming the hosts."""
    by: dict[tuple[str, str], list[str]] = {}
    order: list[tuple[str, str]] = []
    for h in hosts:
        for name in sorted(h.vars):
            if name in HONOURED or not is_connection_var(name):
                continue
            key = (name, h.sources.get(name, "inventory"))
            if key not in by:
                by[key] = []
                order.append(key)
            by[key].append(h.name)
    args: dict[tuple[str, str, str], list[str]] = {}
    for h in hosts:
        for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            text = h.vars.get(name)
            if isinstance(text, str) and "{{" not in text:
                try:
                    ignored = parse_ssh_args(text)[2]
                except InventoryError:
                    continue  # reported when the host is checked or connected to
                if ignored:
                    args.setdefault((name, h.sources.get(name, "inventory"), " ".join(ignored)), []).append(h.name)

    def shown(names: list[str]) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    out = []
    for name, src in order:
        out.append(f"{src}: {name} is ignored (host {shown(by[(name, src)])}): llmfleet connects with its own "
                   "SSH client; see docs/inventory.md for the variables it honours")
    for (name, src, text), names in args.items():
        out.append(f"{src}: {name}: {text} ignored (host {shown(names)}): llmfleet applies -J, -i, -p, -l, -F "
                   "and -o HostName/Port/User/IdentityFile/ProxyJump/ProxyCommand")
    return out


def connection_warnings(host: Host) -> list[str]:
    """One line per connection variable (or ssh argument) this host sets that llmfleet ignores."""
    out: list[str] = []
    for name in sorted(host.vars):
        if name in HONOURED or not is_connection_var(name):
            continue
        where = host.sources.get(name)
        at = f"{where}: " if where else ""
        out.append(f"{at}host {host.name}: {name} is ignored (llmfleet connects with its own SSH client; "
                   "see docs/inventory.md for the variables it honours)")
    for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        text = host.vars.get(name)
        if isinstance(text, str) and "{{" not in text:
            try:
                ignored = parse_ssh_args(text)[2]
            except InventoryError as exc:
                out.append(f"host {host.name}: {name}: {exc}")
                continue
            if ignored:
                out.append(f"host {host.name}: {name}: {' '.join(ignored)} ignored (llmfleet applies -J, -i, -p, -l, -F "
                           "and -o HostName/Port/User/IdentityFile/ProxyJump/ProxyCommand)")
    return out


# ---------------------------------------------------------------------------------------------------
# Connection settings of one host, resolved (templated) from its variables


@dataclass(frozen=True)
class ConnectionSettings:
    """How to reach one host, from its ``ansible_*`` variables with ``{{ }}`` resolved."""

    address: str
    port: int | None
    user: str | None
    key_file: str | None
    become: bool
    become_user: str
    timeout: int | None = None
    # OpenSSH options from ansible_ssh_common_args / ansible_ssh_extra_args (-o, -J, -i, -p, -l),
    # applied like ssh's command-line options: over the ssh config files
    ssh_options: dict[str, list[str]] = field(default_factory=dict)
    config_file: str | None = None
    ignored_args: tuple[str, ...] = ()


# OpenSSH options llmfleet's SSH client applies; others (StrictHostKeyChecking, ServerAliveInterval,
# ControlMaster, ...) are reported as ignored
USED_SSH_OPTIONS = {"hostname", "port", "user", "identityfile", "proxyjump", "proxycommand"}
_FLAG_OPTION = {"-J": "proxyjump", "-i": "identityfile", "-p": "port", "-l": "user"}


def parse_ssh_args(text: str) -> tuple[dict[str, list[str]], str | None, list[str]]:
    """ssh command-line options -> (options, -F file, ignored arguments)."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise InventoryError(f"cannot parse ssh arguments {text!r}: {exc}") from None
    opts: dict[str, list[str]] = {}
    config_file = None
    ignored: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        flag, val = a[:2], a[2:]
        if flag in ("-o", "-F", *_FLAG_OPTION) and not val:
            if i + 1 >= len(argv):
                raise InventoryError(f"ssh argument {a} needs a value in {text!r}")
            val = argv[i + 1]
            i += 1
        i += 1
        if flag == "-o":
            m = re.match(r"^\s*([A-Za-z]+)\s*(?:=\s*|\s+)(.*)$", val)
            if not m:
                raise InventoryError(f"ssh option -o {val!r} must be Key=Value")
            key, value = m.group(1).lower(), m.group(2).strip().strip('"')
            if key not in USED_SSH_OPTIONS:
                ignored.append(f"-o {val}")
                continue
            if key in ("identityfile", "certificatefile"):
                opts.setdefault(key, []).append(value)
            else:
                opts.setdefault(key, [value])
        elif flag == "-F":
            config_file = val
        elif flag in _FLAG_OPTION:
            key = _FLAG_OPTION[flag]
            if key == "identityfile":
                opts.setdefault(key, []).append(val)
            else:
                opts.setdefault(key, [val])
        else:
            ignored.append(a)
    return opts, config_file, ignored


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on", "y", "t"}
    return bool(value)


def connection_settings(host: Host, default_user: str | None = None) -> ConnectionSettings:
    """The connection settings of one host; an error names the variable and the file that set it."""
    from llmfleet.inventory.templating import Resolver

    r = Resolver(host)

    def var(*names: str) -> Any:
        for n in names:
            if n in host.vars:
                value = r.var(n)
                if isinstance(value, str) and ("{{" in value or "{%" in value):
                    raise InventoryError(f"{r.where(n)}: {n}: still holds Jinja after rendering: {value!r}")
                return value
        return None

    def where(n: str) -> str:
        return r.where(n)

    connection = var("ansible_connection")
    if connection is not None and str(connection) not in SUPPORTED_CONNECTIONS:
        raise InventoryError(
            f"{where('ansible_connection')}: ansible_connection={connection}: llmfleet reaches hosts over SSH only "
            "(ssh, paramiko, smart)"
        )
    method = var("ansible_become_method")
    if method is not None and str(method) not in ("sudo", "ansible.builtin.sudo"):
        raise InventoryError(f"{where('ansible_become_method')}: ansible_become_method={method}: only sudo is supported")
    port = var("ansible_port", "ansible_ssh_port")
    try:
        port = int(port) if port is not None else None
    except (TypeError, ValueError):
        name = "ansible_port" if "ansible_port" in host.vars else "ansible_ssh_port"
        raise InventoryError(f"{where(name)}: {name} must be a number, got {port!r}") from None
    timeout = var("ansible_timeout", "ansible_ssh_timeout")
    try:
        timeout = int(timeout) if timeout is not None else None
    except (TypeError, ValueError):
        raise InventoryError(f"host {host.name}: ansible_timeout must be a number of seconds, got {timeout!r}") from None
    options: dict[str, list[str]] = {}
    config_file = None
    ignored: list[str] = []
    for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        text = var(name)
        if text:
            o, f, ig = parse_ssh_args(str(text))
            for k, v in o.items():
                if k in ("identityfile", "certificatefile"):
                    options.setdefault(k, []).extend(v)
                else:
                    options.setdefault(k, v)
            config_file = config_file or f
            ignored.extend(ig)
    address = var("ansible_host", "ansible_ssh_host")
    user = var("ansible_user", "ansible_ssh_user")
    key = var("ansible_ssh_private_key_file", "ansible_private_key_file")
    return ConnectionSettings(
        address=str(address) if address is not None else host.name,
        port=port,
        user=str(user) if user is not None else default_user,
        key_file=str(key) if key is not None else None,
        become=_as_bool(var("ansible_become") or False),
        become_user=str(var("ansible_become_user") or "root"),
        timeout=timeout,
        ssh_options=options,
        config_file=config_file,
        ignored_args=tuple(ignored),
    )
