"""The model manifest: what a verified copy of a model is, written beside it on the host.

A model at ``model_path`` (a file ``X`` or a folder ``D``) gets ``X.llmfleet.json`` / ``D.llmfleet.json``
next to it, written by ``invoke models.push`` after ``sha256sum`` on the host agreed with it::

    {"llmfleet_model_manifest": 1,
     "model_path": "/srv/models/qwen.gguf", "kind": "file",
     "files": [{"path": "qwen.gguf", "size": 19851335680, "sha256": "9f...",
                "observed": {"size": 19851335680, "mtime": 1764417600}}],
     "total_size": 19851335680,
     "source": {"path": "/data/models/qwen.gguf", "controller": "ops1"},
     "verified_at": "2026-11-29T12:00:00+00:00", "verified_by": "alice@ops1"}

``files[].path`` is relative to the model folder, or the file's own name for a single-file model.
``observed`` is the size and mtime (whole seconds, as ``stat -c %Y`` prints it) the host reported for
the file right after verification: a later check compares them with ``stat`` alone (cheap) to tell
whether a file changed since, without hashing it again.

Pure (a local model is read and hashed by ``llmfleet.models.local``). ``parse`` never raises on what a
host printed: it returns ``(manifest or None, problems)``.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

FORMAT = 1
FORMAT_KEY = "llmfleet_model_manifest"
SUFFIX = ".llmfleet.json"
PART_SUFFIX = ".llmfleet.part"  # the staging copy beside model_path (same filesystem): a file or a folder
WANT_SUFFIX = ".llmfleet.part.want"  # which manifest the staging copy is being filled for
OWNER_SUFFIX = ".llmfleet.part.owner"  # which push fills it now (its deploy-lock token)
MAX_FILES = 10_000
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
HASH_CHUNK = 4 * 1024 * 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

Kind = Literal["file", "dir"]


def _strip(model_path: str) -> str:
    p = model_path.rstrip("/")
    return p or "/"


def manifest_path(model_path: str) -> str:
    """``/srv/m/x.gguf`` -> ``/srv/m/x.gguf.llmfleet.json``; ``/srv/m/qwen/`` -> ``/srv/m/qwen.llmfleet.json``."""
    return _strip(model_path) + SUFFIX


def part_path(model_path: str) -> str:
    """The staging copy: ``X.llmfleet.part`` (a file model) or ``D.llmfleet.part/`` (a folder)."""
    return _strip(model_path) + PART_SUFFIX


def want_path(model_path: str) -> str:
    return _strip(model_path) + WANT_SUFFIX


def owner_path(model_path: str) -> str:
    return _strip(model_path) + OWNER_SUFFIX


def check_relpath(rel: str) -> str | None:
    """Why ``rel`` cannot be a file of a model (None: it can). Names travel in sh scripts, ``sha256sum``
    check lines and a line-based probe: no newline, backslash, NUL, absolute path or ``..``."""
    if not rel or rel.startswith("/"):
        return f"{rel!r} is not a relative path"
    if any(c in rel for c in "\n\r\\\x00"):
        return f"{rel!r} holds a newline, backslash or NUL"
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return f"{rel!r} has an empty, '.' or '..' component"
    if len(rel) > 1024:
        return f"{rel[:40]!r}... is longer than 1024 characters"
    return None


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    observed_size: int | None = None
    observed_mtime: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "size": self.size, "sha256": self.sha256}
        if self.observed_size is not None and self.observed_mtime is not None:
            d["observed"] = {"size": self.observed_size, "mtime": self.observed_mtime}
        return d


@dataclass(frozen=True)
class Manifest:
    model_path: str
    kind: Kind
    files: tuple[FileEntry, ...]
    source: dict[str, Any] = field(default_factory=dict)
    verified_at: str | None = None
    verified_by: str | None = None
    format: int = FORMAT

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def content(self) -> tuple[tuple[str, int, str], ...]:
        """What the model is, whatever its path, source or verification: (path, size, sha256), sorted."""
        return tuple(sorted((f.path, f.size, f.sha256) for f in self.files))

    @property
    def content_digest(self) -> str:
        """A short name of ``content`` (with the kind): the staging copy is stamped with it."""
        h = hashlib.sha256(self.kind.encode())
        for path, size, sha in self.content:
            h.update(f"\n{path}\t{size}\t{sha}".encode())
        return h.hexdigest()[:32]

    def file(self, rel: str) -> FileEntry | None:
        return next((f for f in self.files if f.path == rel), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            FORMAT_KEY: self.format,
            "model_path": self.model_path,
            "kind": self.kind,
            "files": [f.to_dict() for f in self.files],
            "total_size": self.total_size,
            "source": dict(self.source),
            "verified_at": self.verified_at,
            "verified_by": self.verified_by,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=False)

    def for_path(self, model_path: str) -> Manifest:
        """The same content placed at another model path (a file model's entry takes its new name)."""
        if self.kind == "file":
            name = posixpath.basename(_strip(model_path))
            files = tuple(replace(f, path=name) for f in self.files)
        else:
            files = self.files
        return replace(self, model_path=model_path, files=files)

    def verified(self, *, at: str, by: str, source: Mapping[str, Any] | None = None) -> Manifest:
        """The manifest to write once the host agreed: when, who, where it came from; no observations
        yet (the host adds them as it writes the file)."""
        files = tuple(replace(f, observed_size=None, observed_mtime=None) for f in self.files)
        return replace(self, files=files, verified_at=at, verified_by=by,
                       source=dict(source if source is not None else self.source))


# ---------------------------------------------------------------------------------------------
# Reading what a host holds


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def parse(text: str | bytes | None) -> tuple[Manifest | None, list[str]]:
    """A manifest file's text -> (Manifest or None, problems). Never raises: a host's file may be cut,
    edited or hostile. A manifest with any problem is returned as None (it proves nothing)."""
    if text is None:
        return None, ["no manifest"]
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if len(text) > MAX_MANIFEST_BYTES:
        return None, [f"manifest is {len(text)} bytes, over {MAX_MANIFEST_BYTES}"]
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, [f"manifest is not JSON ({exc.msg} at line {exc.lineno})"]
    if not isinstance(doc, dict):
        return None, ["manifest is not a JSON object"]
    problems: list[str] = []
    fmt = doc.get(FORMAT_KEY)
    if fmt != FORMAT:
        return None, [f"manifest format {fmt!r} is not {FORMAT} (written by another llmfleet version?)"]
    model_path = doc.get("model_path")
    if not isinstance(model_path, str) or not model_path.startswith("/"):
        problems.append("model_path is missing or not absolute")
        model_path = ""
    kind = doc.get("kind")
    if kind not in ("file", "dir"):
        problems.append(f"kind {kind!r} is neither file nor dir")
        kind = "file"
    raw = doc.get("files")
    files: list[FileEntry] = []
    if not isinstance(raw, list) or not raw:
        problems.append("files is missing or empty")
        raw = []
    if len(raw) > MAX_FILES:
        problems.append(f"{len(raw)} files, over {MAX_FILES}")
        raw = raw[:MAX_FILES]
    seen: set[str] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            problems.append(f"files[{i}] is not an object")
            continue
        rel, size, sha = item.get("path"), _int(item.get("size")), item.get("sha256")
        if not isinstance(rel, str):
            problems.append(f"files[{i}].path is not a string")
            continue
        why = check_relpath(rel)
        if why:
            problems.append(why)
            continue
        if rel in seen:
            problems.append(f"{rel} is listed twice")
            continue
        seen.add(rel)
        if size is None:
            problems.append(f"{rel}: size is not a non-negative integer")
            continue
        if not isinstance(sha, str) or not _SHA256.match(sha):
            problems.append(f"{rel}: sha256 is not 64 lowercase hex digits")
            continue
        obs = item.get("observed")
        o_size = _int(obs.get("size")) if isinstance(obs, dict) else None
        o_mtime = _int(obs.get("mtime")) if isinstance(obs, dict) else None
        files.append(FileEntry(rel, size, sha, o_size, o_mtime))
    if kind == "file" and len(files) > 1:
        problems.append(f"a file model lists {len(files)} files")
    total = doc.get("total_size")
    if not problems and total != sum(f.size for f in files):
        problems.append(f"total_size {total!r} is not the sum of the files' sizes")
    source = doc.get("source") if isinstance(doc.get("source"), dict) else {}
    at = doc.get("verified_at") if isinstance(doc.get("verified_at"), str) else None
    by = doc.get("verified_by") if isinstance(doc.get("verified_by"), str) else None
    if problems:
        return None, problems
    return Manifest(model_path, kind, tuple(files), source, at, by), []  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Comparing


@dataclass(frozen=True)
class Comparison:
    """How a host's copy stands against a manifest (``compare``)."""

    same_content: bool  # the host's manifest describes the wanted content (sha256s, sizes, names)
    changed: tuple[str, ...] = ()  # files whose size/mtime now differ from what was observed at verification
    missing: tuple[str, ...] = ()  # files of the manifest the host no longer has
    unobserved: tuple[str, ...] = ()  # files the manifest has no observation for (cannot be judged cheaply)

    @property
    def intact(self) -> bool:
        """Every file of the manifest is there, as it was when verified."""
        return not (self.changed or self.missing or self.unobserved)


def compare(held: Manifest, observed: Mapping[str, tuple[int, int]], wanted: Manifest | None = None) -> Comparison:
    """``held``: the manifest the host has; ``observed``: the files' (size, mtime) now, by relative path;
    ``wanted``: the content that should be there (None: judge only whether ``held`` still holds)."""
    same = wanted is None or (held.kind == wanted.kind and held.content == wanted.content)
    changed, missing, unobserved = [], [], []
    for f in held.files:
        now = observed.get(f.path)
        if now is None:
            missing.append(f.path)
        elif f.observed_size is None or f.observed_mtime is None:
            unobserved.append(f.path)
        elif (now[0], now[1]) != (f.observed_size, f.observed_mtime) or now[0] != f.size:
            changed.append(f.path)
    return Comparison(same, tuple(changed), tuple(missing), tuple(unobserved))


# ---------------------------------------------------------------------------------------------
# The verdict the preflight and status give a host's copy


@dataclass(frozen=True)
class Verdict:
    status: Literal["pass", "warn", "fail"]
    message: str
    state: Literal["verified", "changed", "missing", "no-manifest", "unreadable", "unchecked"]
    file: str | None = None  # the file that changed or is missing (its path on the host)
    verified_at: str | None = None


def judge(model_path: str, manifest_text: str | None, observed: Mapping[str, tuple[int, int] | list[int]],
          *, cut: bool = False) -> Verdict:
    """Is the copy at ``model_path`` the one its manifest vouches for, judged by size and mtime alone
    (no hashing)? PASS verified, FAIL a file changed or went missing, WARN no manifest (a hand copy
    stays deployable) or one that cannot be read."""
    mp = _strip(model_path)
    if manifest_text is None:
        return Verdict("warn", f"{mp}: no manifest: push it with `invoke models.push`", "no-manifest")
    held, problems = parse(manifest_text)
    if held is None:
        return Verdict("warn", f"{mp}: its manifest {manifest_path(mp)} is unreadable ({problems[0]}): push it "
                               "again with `invoke models.push`", "unreadable")
    now = {k: (int(v[0]), int(v[1])) for k, v in observed.items()}
    cmp = compare(held, now)

    def where(rel: str) -> str:
        return mp if held.kind == "file" else f"{mp}/{rel}"

    if cmp.changed:
        rel = cmp.changed[0]
        f = held.file(rel)
        was = f"{f.observed_size:,} bytes, mtime {f.observed_mtime}" if f else "?"
        is_ = f"{now[rel][0]:,} bytes, mtime {now[rel][1]}"
        more = f" (and {len(cmp.changed) - 1} more)" if len(cmp.changed) > 1 else ""
        return Verdict("fail", f"model file {where(rel)} changed since it was verified (size/mtime) or its sha256 "
                               f"does not match its manifest{more}: verified {held.verified_at} at {was}, now {is_}",
                       "changed", where(rel), held.verified_at)
    if cmp.missing and not cut:
        rel = cmp.missing[0]
        return Verdict("fail", f"model file {where(rel)} is missing; its manifest (verified {held.verified_at}) "
                               f"lists {len(held.files)} file(s)", "missing", where(rel), held.verified_at)
    if cmp.missing or cmp.unobserved:
        return Verdict("warn", f"{mp}: verified {held.verified_at}, but "
                               + ("the host listed too many files to check them all" if cut else
                                  f"its manifest records no size/mtime for {cmp.unobserved[0]}"),
                       "unchecked", verified_at=held.verified_at)
    return Verdict("pass", f"{mp}: verified {held.verified_at} ({len(held.files)} file(s), {held.total_size:,} "
                           "bytes; sha256 checked on the host then, size and mtime unchanged since)",
                   "verified", verified_at=held.verified_at)
