"""llmfleet's per-user cache folders: ``$XDG_CACHE_HOME/llmfleet/<name>`` (default ``~/.cache/llmfleet``).

What is kept there only saves time (the next deploy's guessed connections, compiled templates);
deleting a folder is always safe. A folder is used only while this user owns it and no one else can
write to it: what is read back steers connections or is run as code.
"""

from __future__ import annotations

import marshal
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cache_dir(name: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "llmfleet" / name


def private_dir(name: str, *, create: bool = True) -> Path | None:
    """The cache folder ``name`` (made 0700 when missing and ``create``); None when it is missing, cannot
    be made, or someone other than this user could write to it."""
    path = cache_dir(name)
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = path.stat()
    except OSError:
        return None
    return path if st.st_uid == os.getuid() and not st.st_mode & 0o022 else None


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (0600) through a temporary file and a rename; best effort."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def kept(name: str, key: str, make: Callable[[], Any]) -> Any:
    """``make()``'s value, kept as ``marshal`` data under ``key`` (a content hash of everything the
    value depends on) in the private cache folder ``name`` and read back from there next time. Nothing
    is read or written when the folder is not private to this user; a value ``marshal`` cannot hold is
    returned without being kept."""
    folder = private_dir(name)
    if folder is None:
        return make()
    path = folder / f"{key[:40]}.marshal"
    try:
        return marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        pass
    value = make()
    try:
        blob = marshal.dumps(value)
    except ValueError:
        return value
    write_private(path, blob)
    return value


def kept_object(name: str, key: str, make: Callable[[], Any], kind: type) -> Any:
    """``make()``'s value, an object of ``kind`` kept with ``pickle`` under ``key`` (a content hash of
    everything it depends on, the code's version included) in the private cache folder ``name``: for a
    value built by slow validation, such as a catalog. Read back only from a folder private to this user
    (``private_dir``), and only when it is a ``kind``; anything else is built again."""
    import pickle

    folder = private_dir(name)
    if folder is None:
        return make()
    path = folder / f"{key[:40]}.pickle"
    try:
        value = pickle.loads(path.read_bytes())  # noqa: S301 - this user's private folder, written by us
        if isinstance(value, kind):
            return value
    except Exception:  # noqa: BLE001 - a damaged or foreign entry is built again
        pass
    value = make()
    try:
        write_private(path, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - a value pickle cannot hold is returned without being kept
        pass
    return value
