"""Value types an Ansible inventory can hold beyond plain YAML: vault-encrypted and "unsafe" strings.

``VaultValue`` is an ``!vault`` value: opaque until decrypted (``llmfleet.inventory.vault``); its text
never shows in a repr, a log or an error. ``UnsafeText`` is a string Ansible marks as not to be
templated (INI bytes literals, ``!unsafe``). ``ansible_json`` turns resolved variables into the JSON
``ansible-inventory`` prints, where these types have their own encodings. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class InventoryWarning(UserWarning):
    """Something in the inventory llmfleet skips or ignores (shown as a ``warning:`` line by the CLI)."""


class UnsafeText(str):
    """A string never templated (``!unsafe``, or a bytes literal in an INI file)."""

    __slots__ = ()


class VaultValue:
    """An ``!vault`` value: the encrypted envelope, opaque until decrypted."""

    __slots__ = ("ciphertext",)

    def __init__(self, ciphertext: str) -> None:
        self.ciphertext = ciphertext

    def __repr__(self) -> str:
        return "VaultValue(<encrypted>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VaultValue) and other.ciphertext == self.ciphertext

    def __hash__(self) -> int:
        return hash(self.ciphertext)


def ansible_json(value: Any, *, unsafe_tags: bool) -> Any:
    """``value`` as ansible-inventory prints it.

    ``--list`` (profile ``inventory_legacy``) writes an unsafe string as ``{"__ansible_unsafe": s}``
    but ``--host`` writes it plain (``unsafe_tags``); both write a vault value as
    ``{"__ansible_vault": envelope}``.
    """
    if isinstance(value, VaultValue):
        return {"__ansible_vault": value.ciphertext}
    if isinstance(value, UnsafeText):
        return {"__ansible_unsafe": str(value)} if unsafe_tags else str(value)
    if isinstance(value, Mapping):
        return {k: ansible_json(v, unsafe_tags=unsafe_tags) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [ansible_json(v, unsafe_tags=unsafe_tags) for v in value]
    return value


def from_ansible_json(value: Any) -> Any:
    """Decode ``{"__ansible_vault": ...}`` / ``{"__ansible_unsafe": ...}`` objects (script output, JSON vars)."""
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get("__ansible_vault"), str):
            return VaultValue(value["__ansible_vault"])
        if len(value) == 1 and isinstance(value.get("__ansible_unsafe"), str):
            return UnsafeText(value["__ansible_unsafe"])
        return {k: from_ansible_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_ansible_json(v) for v in value]
    return value
