"""Ansible Vault: decrypt ``!vault`` values (format 1.1/1.2, AES256) with a vault password file.

The password file is the one Ansible takes: ``--vault-password-file PATH`` or
``ANSIBLE_VAULT_PASSWORD_FILE``; an executable file is run and its output is the password, as
``ansible-vault`` does. The envelope is ansible-vault's own: PBKDF2-HMAC-SHA256 (10000 rounds) derives
an AES-256-CTR key, an HMAC-SHA256 key and the counter; the HMAC is checked before decrypting.
Decrypted text lives only in memory. Pure apart from reading (or running) the password file.
"""

from __future__ import annotations

import os
import subprocess
from binascii import Error as HexError
from binascii import unhexlify
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.hmac import HMAC
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

from llmfleet.errors import InventoryError, UsageError
from llmfleet.inventory.values import VaultValue

ENV_PASSWORD_FILE = "ANSIBLE_VAULT_PASSWORD_FILE"


class VaultError(InventoryError):
    """A vault value cannot be decrypted (no password, wrong password, damaged envelope)."""


def password_file(given: str | None = None) -> str | None:
    """The vault password file: the flag's value, else ``ANSIBLE_VAULT_PASSWORD_FILE``, else None."""
    return given or os.environ.get(ENV_PASSWORD_FILE) or None


def read_password(path: str) -> bytes:
    """Read a vault password file (or run it, if executable), as ansible-vault does."""
    p = Path(os.path.expanduser(path))
    if not p.is_file():
        raise UsageError(f"vault password file {p} does not exist")
    if os.access(p, os.X_OK):
        try:
            out = subprocess.run([str(p)], capture_output=True, timeout=60, check=False)  # noqa: S603
        except OSError as exc:
            raise UsageError(f"vault password script {p} cannot run: {exc.strerror}") from None
        if out.returncode != 0:
            raise UsageError(f"vault password script {p} exited {out.returncode}")
        secret = out.stdout.strip(b"\r\n")
    else:
        try:
            secret = p.read_bytes().strip()
        except OSError as exc:
            raise UsageError(f"vault password file {p}: cannot read: {exc.strerror}") from None
    if not secret:
        raise UsageError(f"vault password file {p} is empty")
    return secret


def _unhex(data: bytes, what: str) -> bytes:
    try:
        return unhexlify(data)
    except (HexError, ValueError):
        raise VaultError(f"{what}: damaged vault envelope (not hex)") from None


def decrypt(value: VaultValue, password: bytes, what: str = "vault value") -> str:
    """Plain text of one ``!vault`` value; ``what`` names the variable in errors (never the text)."""
    lines = value.ciphertext.strip().splitlines()
    if not lines or not lines[0].startswith("$ANSIBLE_VAULT;"):
        raise VaultError(f"{what}: not an ansible-vault envelope")
    header = [h.strip() for h in lines[0].split(";")]
    if len(header) < 3 or header[1] not in ("1.1", "1.2") or header[2] != "AES256":
        raise VaultError(f"{what}: unsupported vault format {';'.join(header[1:3])!r} (AES256 1.1/1.2 are)")
    body = _unhex("".join(line.strip() for line in lines[1:]).encode(), what)
    parts = body.split(b"\n", 2)
    if len(parts) != 3:
        raise VaultError(f"{what}: damaged vault envelope")
    salt, mac, ciphertext = _unhex(parts[0], what), _unhex(parts[1], what), _unhex(parts[2], what)
    key = PBKDF2HMAC(algorithm=hashes.SHA256(), length=80, salt=salt, iterations=10000).derive(password)
    key1, key2, iv = key[:32], key[32:64], key[64:80]
    h = HMAC(key2, hashes.SHA256())
    h.update(ciphertext)
    try:
        h.verify(mac)
    except InvalidSignature:
        raise VaultError(f"{what}: the vault password does not decrypt it (wrong password?)") from None
    dec = Cipher(algorithms.AES(key1), modes.CTR(iv)).decryptor()
    unpad = padding.PKCS7(128).unpadder()
    try:
        plain = unpad.update(dec.update(ciphertext) + dec.finalize()) + unpad.finalize()
        return plain.decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        raise VaultError(f"{what}: damaged vault envelope (bad padding or not UTF-8)") from None


class Vault:
    """Decrypts ``!vault`` values with one password file, read once on first use."""

    def __init__(self, password_file_path: str | None = None) -> None:
        self.path = password_file(password_file_path)
        self._secret: bytes | None = None

    def decrypt(self, value: VaultValue, what: str) -> str:
        if not self.path:
            raise VaultError(
                f"{what} is vault-encrypted; give --vault-password-file PATH or set {ENV_PASSWORD_FILE}"
            )
        if self._secret is None:
            self._secret = read_password(self.path)
        return decrypt(value, self._secret, what)
