"""Pinned engine images: read ``images.lock`` and turn a service's image key into exact bytes.

``images.lock`` (YAML, at the repository root) maps ``"ENGINE:VERSION"`` keys to the repository, the
digest, the CUDA version, the compute capabilities the image carries kernels for, and where it came
from. A deploy pulls ``repository@digest`` and never a floating tag, unless the operator passes
``--allow-unpinned``. Mirrors (``llmfleet_image_mirrors``) swap the repository for a private one; the
digest stays the same, so the bytes are the same.

Pure: parsing and resolution only. Reading the file is the one I/O and is kept in ``load_lock``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llmfleet.errors import UsageError

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_KEY_RE = re.compile(r"^(vllm|llamacpp):[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_REPO_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")

DEFAULT_LOCK_PATH = Path(__file__).resolve().parents[2] / "images.lock"


@dataclass(frozen=True)
class LockedImage:
    """One entry of images.lock."""

    key: str
    repository: str
    digest: str
    tag: str | None = None
    cuda: str | None = None
    archs: tuple[str, ...] = ()
    source: str | None = None

    @property
    def engine(self) -> str:
        return self.key.split(":", 1)[0]


@dataclass(frozen=True)
class ImageLock:
    images: dict[str, LockedImage] = field(default_factory=dict)
    path: str = "images.lock"

    def get(self, key: str) -> LockedImage | None:
        return self.images.get(key)


@dataclass(frozen=True)
class ImageRef:
    """What a release runs: ``pull_ref`` is what the host pulls and what compose names."""

    key: str
    repository: str  # the repository pulled from (the mirror when one applies)
    digest: str | None  # None only for an allowed unpinned tag
    tag: str | None
    pinned: bool
    upstream_repository: str
    cuda: str | None = None
    archs: tuple[str, ...] = ()

    @property
    def pull_ref(self) -> str:
        if self.digest:
            return f"{self.repository}@{self.digest}"
        return f"{self.repository}:{self.tag or 'latest'}"

    @property
    def short_digest(self) -> str:
        return self.digest.split(":", 1)[1][:12] if self.digest else "unpinned"

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "ref": self.pull_ref,
            "repository": self.repository,
            "upstream_repository": self.upstream_repository,
            "digest": self.digest,
            "tag": self.tag,
            "pinned": self.pinned,
            "cuda": self.cuda,
            "archs": list(self.archs),
        }


def parse_lock(text: str, path: str = "images.lock") -> ImageLock:
    """Parse images.lock text. Accepts ``{images: {KEY: {...}}}`` or the bare mapping."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path}:{where} is not valid YAML; fix the syntax") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: top level must be a mapping of ENGINE:VERSION to image entries")
    entries = data.get("images", data) if "images" in data else data
    entries = {k: v for k, v in entries.items() if k not in {"version", "schema"}}
    images: dict[str, LockedImage] = {}
    for key, entry in entries.items():
        key = str(key)
        if not _KEY_RE.match(key):
            raise UsageError(f"{path}: key {key!r} must look like ENGINE:VERSION (engine vllm or llamacpp)")
        if not isinstance(entry, dict):
            raise UsageError(f"{path}: {key}: entry must be a mapping with repository and digest")
        repo = str(entry.get("repository", "")).strip()
        digest = str(entry.get("digest", "")).strip()
        if not _REPO_RE.match(repo):
            raise UsageError(f"{path}: {key}: repository {repo!r} is not a valid image repository name")
        if not DIGEST_RE.match(digest):
            raise UsageError(f"{path}: {key}: digest must be sha256:<64 hex>, got {digest!r}; run images.pin")
        archs = entry.get("archs") or ()
        if not isinstance(archs, list | tuple):
            raise UsageError(f"{path}: {key}: archs must be a list of compute capabilities")
        tag = entry.get("tag")
        cuda = entry.get("cuda")
        images[key] = LockedImage(
            key=key,
            repository=repo,
            digest=digest,
            tag=str(tag) if tag is not None else None,
            cuda=str(cuda) if cuda is not None else None,
            archs=tuple(str(a) for a in archs),
            source=str(entry["source"]) if entry.get("source") is not None else None,
        )
    return ImageLock(images=images, path=path)


def load_lock(path: str | Path | None = None) -> ImageLock:
    """Read images.lock; a missing file is an empty lock (every image then needs --allow-unpinned)."""
    p = Path(path) if path else DEFAULT_LOCK_PATH
    if not p.exists():
        return ImageLock(images={}, path=str(p))
    return parse_lock(p.read_text(encoding="utf-8"), path=str(p))


def _split_reference(ref: str) -> tuple[str, str | None, str | None]:
    """``repo[:tag][@digest]`` -> (repo, tag, digest)."""
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
    tag = None
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        ref, tag = ref.rsplit(":", 1)
    return ref, tag, digest


def _canonical_repo(repo: str) -> str:
    """Docker's implicit registry and library prefix, so mirror keys match either spelling."""
    first = repo.split("/", 1)[0]
    if "." in first or ":" in first or first == "localhost":
        return repo
    if "/" not in repo:
        return f"docker.io/library/{repo}"
    return f"docker.io/{repo}"


def apply_mirror(repository: str, mirrors: dict[str, str]) -> str:
    """Longest matching prefix (on a path boundary) of the repository is replaced by its mirror."""
    canon = _canonical_repo(repository)
    best: tuple[int, str, str] | None = None
    for public, private in mirrors.items():
        for candidate in {public, _canonical_repo(public)}:
            cand = candidate.rstrip("/")
            for name in (repository, canon):
                if name == cand or name.startswith(cand + "/"):
                    if best is None or len(cand) > best[0]:
                        best = (len(cand), cand, private.rstrip("/"))
                    break
    if best is None:
        return repository
    _, prefix, private = best
    name = repository if (repository == prefix or repository.startswith(prefix + "/")) else canon
    mirrored = private + name[len(prefix):]
    if not _REPO_RE.match(mirrored):
        raise UsageError(f"llmfleet_image_mirrors: {prefix!r} -> {private!r} gives an invalid name {mirrored!r}")
    return mirrored


def resolve(
    image: str,
    lock: ImageLock,
    *,
    mirrors: dict[str, str] | None = None,
    allow_unpinned: bool = False,
    where: str = "inventory",
) -> ImageRef:
    """A service's ``image`` -> the exact reference to pull.

    ``image`` is a key of images.lock (``vllm:0.9.2``), or a full reference with a digest
    (``repo@sha256:...``: pinned by itself), or a floating tag (refused unless ``allow_unpinned``).
    """
    mirrors = mirrors or {}
    locked = lock.get(image)
    if locked is not None:
        return ImageRef(
            key=image,
            repository=apply_mirror(locked.repository, mirrors),
            digest=locked.digest,
            tag=locked.tag,
            pinned=True,
            upstream_repository=locked.repository,
            cuda=locked.cuda,
            archs=locked.archs,
        )
    if _KEY_RE.match(image) and "/" not in image:
        known = ", ".join(sorted(lock.images)) or "none"
        raise UsageError(
            f"{where}: image {image!r} is not in {lock.path} (pinned: {known}); run `invoke images.pin "
            f"{image.replace(':', '=', 1)}` or give a full reference (repo@sha256:..., or repo:tag with --allow-unpinned)"
        )
    repo, tag, digest = _split_reference(image)
    if not _REPO_RE.match(repo) or (tag is not None and not _TAG_RE.match(tag)):
        raise UsageError(f"{where}: image {image!r} is neither a key of {lock.path} nor a valid image reference")
    if digest is not None:
        if not DIGEST_RE.match(digest):
            raise UsageError(f"{where}: image {image!r}: digest must be sha256:<64 hex>")
        return ImageRef(
            key=image, repository=apply_mirror(repo, mirrors), digest=digest, tag=tag,
            pinned=True, upstream_repository=repo,
        )
    if not allow_unpinned:
        raise UsageError(
            f"{where}: image {image!r} is a floating tag; pin it in {lock.path} (`invoke images.pin`) "
            f"or pass --allow-unpinned"
        )
    return ImageRef(
        key=image, repository=apply_mirror(repo, mirrors), digest=None, tag=tag or "latest",
        pinned=False, upstream_repository=repo,
    )
