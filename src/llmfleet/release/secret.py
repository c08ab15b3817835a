"""A service's API key, read on the operator's machine from where the inventory says (never a plain
value in the inventory): an environment variable, a file only its owner can read, or an ansible-vault
encrypted value decrypted with the vault password file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from llmfleet.errors import UsageError
from llmfleet.inventory.services import SecretRef
from llmfleet.inventory.vault import Vault


def resolve_secret(ref: SecretRef | None, where: str, *, field: str = "api_key", public: bool = False) -> str | None:
    """The secret's value (None when the service has none). A missing variable or file, or a file
    others can read, is a usage error naming ``where``, the ``field`` and the fix. ``public``: a value
    that may be readable by others (a TLS certificate), read the same way without the mode check."""
    if ref is None:
        return None
    if ref.vault is not None:  # ansible-vault value: decrypted with the vault password file
        return Vault().decrypt(ref.vault, f"{where}: {field}").strip()
    if ref.from_env is not None:
        value = os.environ.get(ref.from_env)
        if not value:
            raise UsageError(f"{where}: {field}.from_env {ref.from_env} is not set on this machine; export it")
        return value
    path = Path(os.path.expanduser(str(ref.from_file)))
    try:
        st = path.stat()
    except OSError:
        raise UsageError(f"{where}: {field}.from_file {path} does not exist on this machine") from None
    if not public and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"{where}: {field}.from_file {path} is readable by others; chmod 600 {path}")
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UsageError(f"{where}: {field}.from_file {path}: {exc.strerror}") from None
    if not value:
        raise UsageError(f"{where}: {field}.from_file {path} is empty")
    return value


def secret_if_readable(ref: SecretRef | None) -> str | None:
    """The same secret, or None when it cannot be read here (for reads that work without it)."""
    try:
        return resolve_secret(ref, "")
    except UsageError:
        return None
