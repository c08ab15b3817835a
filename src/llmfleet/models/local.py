"""A model on this machine (the controller side of a push, or a bundle's copy): its files, their
sha256, and the manifest they make (``llmfleet.knowledge.model_manifest``, which stays pure)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from llmfleet.knowledge.model_manifest import HASH_CHUNK, MAX_FILES, FileEntry, Kind, Manifest, check_relpath


def local_files(local_path: str) -> tuple[Kind, list[tuple[str, str, int]]]:
    """(kind, [(relative path, absolute path, size)]) of a local model file or folder, sorted. Raises
    ``ValueError`` with one line for what cannot be pushed (a missing path, a name a host script
    cannot carry, a special file, too many files)."""
    if os.path.isfile(local_path):
        return "file", [(os.path.basename(local_path), local_path, os.path.getsize(local_path))]
    if not os.path.isdir(local_path):
        raise ValueError(f"{local_path} is neither a file nor a folder")
    out: list[tuple[str, str, int]] = []
    for dirpath, dirnames, filenames in os.walk(local_path, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, local_path).replace(os.sep, "/")
            if not os.path.isfile(full):
                raise ValueError(f"{full} is not a regular file")
            why = check_relpath(rel)
            if why:
                raise ValueError(f"{local_path}: {why}")
            out.append((rel, full, os.path.getsize(full)))
            if len(out) > MAX_FILES:
                raise ValueError(f"{local_path} holds more than {MAX_FILES} files")
    if not out:
        raise ValueError(f"{local_path} is an empty folder")
    return "dir", out


def sha256_file(path: str, progress: Callable[[int], None] | None = None) -> str:
    """sha256 of a local file; ``progress(n)`` after each chunk of ``n`` bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(HASH_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return h.hexdigest()


def build_local(local_path: str, model_path: str, *, source: Mapping[str, Any] | None = None,
                progress: Callable[[int], None] | None = None) -> Manifest:
    """The manifest of a local model file or folder, placed at ``model_path`` on the hosts, every file
    hashed here (``progress(n)`` per chunk hashed). Unverified: no ``verified_at`` until a host agrees."""
    kind, entries = local_files(local_path)
    files = []
    for rel, full, size in entries:
        files.append(FileEntry(rel, size, sha256_file(full, progress)))
    m = Manifest(model_path=model_path, kind=kind, files=tuple(files),
                 source=dict(source or {"path": os.path.abspath(local_path)}))
    return m.for_path(model_path)
