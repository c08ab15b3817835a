"""Which inventory a task reads when ``-i`` is not given, found the way Ansible finds it.

1. ``-i`` (one or several sources);
2. ``llmfleet.inventory`` set in llmfleet's configuration (invoke.yaml, ``-f FILE``, ``INVOKE_LLMFLEET_INVENTORY``);
3. ``ANSIBLE_INVENTORY`` (comma-separated sources, as Ansible reads it);
4. ``[defaults] inventory`` of the first ansible.cfg found in Ansible's order: ``ANSIBLE_CONFIG``,
   ``./ansible.cfg``, ``~/.ansible.cfg``, ``/etc/ansible/ansible.cfg`` (relative paths are relative to
   that file's folder, as in Ansible); an ``ANSIBLE_CONFIG`` naming no readable file is passed over, as
   Ansible passes it over (lib/ansible/config/manager.py, find_ini_config_file), with a warning;
5. ``./inventory`` when it exists;

else one line saying where it looked. Pure apart from reading the environment given and the files
named by it (``find`` takes both as arguments; ``ansible_cfg_paths`` is the search order).
"""

from __future__ import annotations

import configparser
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmfleet.errors import UsageError
from llmfleet.inventory.values import InventoryWarning

SYSTEM_CFG = "/etc/ansible/ansible.cfg"


@dataclass(frozen=True)
class Found:
    sources: list[str]
    origin: str  # where the choice came from, for messages ("ANSIBLE_INVENTORY", "./ansible.cfg", ...)


def ansible_cfg_paths(env: Mapping[str, str], cwd: str, home: str) -> list[str]:
    """The ansible.cfg files Ansible would consider, in its order (the first that exists is used)."""
    out = []
    given = env.get("ANSIBLE_CONFIG")
    if given:
        given = os.path.expanduser(given)
        out.append(os.path.join(given, "ansible.cfg") if os.path.isdir(given) else given)
    out += [os.path.join(cwd, "ansible.cfg"), os.path.join(home, ".ansible.cfg"), SYSTEM_CFG]
    return out


def missing_ansible_config(env: Mapping[str, str]) -> str | None:
    """The warning for an ``ANSIBLE_CONFIG`` that names no readable file (None when it is unset or fine).
    Ansible says nothing and reads the next ansible.cfg in its order."""
    given = env.get("ANSIBLE_CONFIG")
    if not given:
        return None
    path = os.path.expanduser(given)
    path = os.path.join(path, "ansible.cfg") if os.path.isdir(path) else path
    if os.path.isfile(path) and os.access(path, os.R_OK):
        return None
    why = "is not readable" if os.path.exists(path) else "does not exist"
    return (f"ANSIBLE_CONFIG names {path}, which {why}; passed over as Ansible does (next: ./ansible.cfg, "
            f"~/.ansible.cfg, {SYSTEM_CFG}): fix or unset ANSIBLE_CONFIG")


def _split(value: str, base: str | None, home: str) -> list[str]:
    out = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        part = part.replace("~", home, 1) if part.startswith("~") else part
        if base is not None and not os.path.isabs(part):
            part = os.path.normpath(os.path.join(base, part))
        out.append(part)
    return out


def cfg_inventory(path: str, home: str) -> list[str] | None:
    """``[defaults] inventory`` of one ansible.cfg (None when it sets none); paths resolved against its folder."""
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";",))
    try:
        with open(path, encoding="utf-8") as fh:
            parser.read_file(fh)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it ({exc})") from None
    except configparser.Error as exc:
        raise UsageError(f"{path}: not a valid ansible.cfg ({str(exc).splitlines()[0]})") from None
    value = parser.get("defaults", "inventory", fallback=None)
    if value is None:
        value = parser.get("defaults", "hostfile", fallback=None)  # the older name Ansible still reads
    if not value or not value.strip():
        return None
    return _split(value, os.path.dirname(os.path.abspath(path)), home)


def find(given: str | Sequence[str] | None, configured: str | Sequence[str] | None, env: Mapping[str, str],
         cwd: str, home: str) -> Found:
    """The inventory sources to read, and where that choice came from."""
    if given:
        return Found([given] if isinstance(given, str) else list(given), "-i")
    if configured:
        return Found([configured] if isinstance(configured, str) else list(configured), "llmfleet.inventory")
    if env.get("ANSIBLE_INVENTORY", "").strip():
        return _existing(_split(env["ANSIBLE_INVENTORY"], cwd, home), "ANSIBLE_INVENTORY")
    looked = []
    missing = missing_ansible_config(env)
    if missing:
        warnings.warn(missing, InventoryWarning, stacklevel=2)
    for cfg in ansible_cfg_paths(env, cwd, home):
        if os.path.isfile(cfg):
            sources = cfg_inventory(cfg, home)
            if sources:
                return _existing(sources, f"{_short(cfg, cwd, home)} [defaults] inventory")
            looked.append(f"{_short(cfg, cwd, home)} (no [defaults] inventory)")
            break  # Ansible reads only the first ansible.cfg it finds
    local = os.path.join(cwd, "inventory")
    if os.path.exists(local):
        return Found([local], "./inventory")
    where = "; ".join(looked) if looked else "no ansible.cfg (ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, " \
                                             f"{SYSTEM_CFG})"
    raise UsageError(f"no inventory: looked for -i, llmfleet.inventory, ANSIBLE_INVENTORY, {where}, "
                     "./inventory; give -i PATH (a file, a folder or 'host1,host2,')")


def _existing(sources: list[str], origin: str) -> Found:
    if not any(os.path.exists(s) for s in sources):
        raise UsageError(f"inventory {', '.join(sources)} (from {origin}) does not exist; fix it or give -i PATH")
    return Found(sources, origin)


def _short(path: str, cwd: str, home: str) -> str:
    if os.path.dirname(path) == cwd:
        return "./" + os.path.basename(path)
    if path.startswith(home + os.sep):
        return "~" + path[len(home):]
    return path
