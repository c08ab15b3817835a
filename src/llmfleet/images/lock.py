"""Pinned engine images: read ``images.lock`` and turn a service's image key into exact bytes.

``images.lock`` (YAML; the project's in the working directory, else the one shipped in this package) maps ``"ENGINE:VERSION"`` keys to the repository, the
digest, the CUDA version, the compute capabilities the image carries kernels for, and where it came
from. A deploy pulls ``repository@digest`` and never a floating tag, unless the operator passes
``--allow-unpinned``. Mirrors (``llmfleet_image_mirrors``) swap the repository for a private one; the
digest stays the same, so the bytes are the same.

Pure: parsing and resolution only. Reading the file is the one I/O and is kept in ``load_lock``.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from llmfleet import yamlload
from llmfleet.errors import LlmfleetError, UsageError
from llmfleet.images.registry import explicit_registry, parse_reference, split_reference

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# ENGINE:VERSION: an inference engine (vllm, llamacpp), an exporter or the gateway (inventory.services)
_KEY_RE = re.compile(r"^(vllm|llamacpp|node-exporter|dcgm-exporter|gateway):[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_REPO_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")

# The lock shipped with llmfleet (package data): what a project without its own images.lock deploys.
PACKAGED_LOCK = resources.files("llmfleet.images") / "images.lock"
# The project's own lock: images.lock in the working directory (written by images.pin).
PROJECT_LOCK = "images.lock"


@dataclass(frozen=True)
class LockedImage:
    """One entry of images.lock."""

    key: str
    repository: str
    digest: str | None  # None: listed but not pinned yet (``images.pin`` has not resolved it)
    tag: str | None = None
    cuda: str | None = None
    archs: tuple[str, ...] = ()
    source: str | None = None
    verified: dict[str, str] | None = None  # {at, registry, by}: when a registry last confirmed the digest
    digest_source: str | None = None  # where a digest not resolved by images.pin was read
    torch: str | None = None  # the PyTorch version inside (vLLM images)
    torch_cuda: str | None = None  # torch.version.cuda
    torch_archs: tuple[str, ...] = ()  # torch.cuda.get_arch_list() (or the build's TORCH_CUDA_ARCH_LIST)
    archs_source: str | None = None  # catalog | inspected (read from the image by images.inspect)
    engine_version: str | None = None  # the engine's own version string, when inspected
    require_cuda: str | None = None  # the image's NVIDIA_REQUIRE_CUDA, when inspected

    @property
    def engine(self) -> str:
        return self.key.split(":", 1)[0]


@dataclass(frozen=True)
class ImageLock:
    images: dict[str, LockedImage] = field(default_factory=dict)
    path: str = "images.lock"

    def get(self, key: str) -> LockedImage | None:
        return self.images.get(key)


def local_tag(repository: str, digest: str) -> str:
    """The name of an image loaded from a bundle: the repository tagged by the pinned digest
    (``repo:sha256-<hex>``), so another pin is another name and compose never looks it up remotely."""
    return f"{repository}:sha256-{digest.split(':', 1)[1]}"


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
    torch: str | None = None
    torch_cuda: str | None = None
    torch_archs: tuple[str, ...] = ()
    archs_source: str | None = None
    require_cuda: str | None = None  # NVIDIA_REQUIRE_CUDA as read from the image (images.inspect)
    # From a bundle (deploy --bundle): the image is loaded, never pulled; compose names it by its
    # ``local_tag`` and the deploy checks this image ID (its config digest), not a repo digest.
    image_id: str | None = None

    @property
    def pull_ref(self) -> str:
        if self.image_id and self.digest:
            return local_tag(self.repository, self.digest)
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
            "torch": self.torch,
            "torch_cuda": self.torch_cuda,
            "torch_archs": list(self.torch_archs),
            "archs_source": self.archs_source,
            "require_cuda": self.require_cuda,
            **({"image_id": self.image_id} if self.image_id else {}),
        }


def _ref_facts(locked: LockedImage) -> dict[str, Any]:
    """The image facts an ImageRef carries over from its lock entry."""
    return {"cuda": locked.cuda, "archs": locked.archs, "torch": locked.torch, "torch_cuda": locked.torch_cuda,
            "torch_archs": locked.torch_archs, "archs_source": locked.archs_source,
            "require_cuda": locked.require_cuda}


def parse_lock(text: str, path: str = "images.lock", *, keep: bool = False) -> ImageLock:
    """Parse images.lock text. Accepts ``{images: {KEY: {...}}}`` or the bare mapping. Pure unless
    ``keep`` (``load_lock``: the parse through the cache)."""
    try:
        data = yamlload.safe_load(text, keep=keep) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path}:{where} is not valid YAML; fix the syntax") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: top level must be a mapping of ENGINE:VERSION to image entries")
    entries = data.get("images", data) if "images" in data else data
    if not isinstance(entries, dict):
        raise UsageError(f"{path}: top level must be a mapping of ENGINE:VERSION to image entries")
    entries = {k: v for k, v in entries.items() if k not in {"version", "schema"}}
    images: dict[str, LockedImage] = {}
    for key, entry in entries.items():
        key = str(key)
        if not _KEY_RE.match(key):
            raise UsageError(f"{path}: key {key!r} must look like ENGINE:VERSION (engine vllm, llamacpp, node-exporter, dcgm-exporter or gateway)")
        if not isinstance(entry, dict):
            raise UsageError(f"{path}: {key}: entry must be a mapping with repository and digest")
        repo = str(entry.get("repository", "")).strip()
        digest = str(entry.get("digest", "")).strip()
        if not _REPO_RE.match(repo):
            raise UsageError(f"{path}: {key}: repository {repo!r} is not a valid image repository name")
        if "digest" not in entry:
            raise UsageError(f"{path}: {key}: digest is missing; write `digest: null` for an entry not pinned yet")
        raw_digest = entry.get("digest")
        if raw_digest is not None and not DIGEST_RE.match(digest):
            raise UsageError(f"{path}: {key}: digest must be sha256:<64 hex> or null, got {digest!r}; run images.pin")
        verified = entry.get("verified")
        if verified is not None and not (isinstance(verified, dict) and verified.get("at")):
            raise UsageError(f"{path}: {key}: verified must be null or a mapping with at/registry/by")
        archs = entry.get("archs") or ()
        if not isinstance(archs, list | tuple):
            raise UsageError(f"{path}: {key}: archs must be a list of compute capabilities")
        torch_archs = entry.get("torch_archs") or ()
        if not isinstance(torch_archs, list | tuple):
            raise UsageError(f"{path}: {key}: torch_archs must be a list of compute capabilities")
        archs_source = entry.get("archs_source")
        if archs_source is not None and archs_source not in ("catalog", "inspected"):
            raise UsageError(f"{path}: {key}: archs_source must be catalog or inspected, got {archs_source!r}")
        tag = entry.get("tag")
        cuda = entry.get("cuda")
        images[key] = LockedImage(
            key=key,
            repository=repo,
            digest=digest if raw_digest is not None else None,
            tag=str(tag) if tag is not None else None,
            cuda=str(cuda) if cuda is not None else None,
            archs=tuple(str(a) for a in archs),
            source=str(entry["source"]) if entry.get("source") is not None else None,
            verified={str(k): str(v) for k, v in verified.items()} if verified else None,
            digest_source=str(entry["digest_source"]) if entry.get("digest_source") is not None else None,
            torch=str(entry["torch"]) if entry.get("torch") is not None else None,
            torch_cuda=str(entry["torch_cuda"]) if entry.get("torch_cuda") is not None else None,
            torch_archs=tuple(str(a) for a in torch_archs),
            archs_source=str(archs_source) if archs_source is not None else None,
            engine_version=str(entry["engine_version"]) if entry.get("engine_version") is not None else None,
            require_cuda=str(entry["require_cuda"]) if entry.get("require_cuda") is not None else None,
        )
    return ImageLock(images=images, path=path)


def load_lock(path: str | Path | None = None) -> ImageLock:
    """Read images.lock; a missing file is an empty lock (every image then needs --allow-unpinned)."""
    p = Path(path) if path else default_lock_path()
    if not p.is_file():
        return ImageLock(images={}, path=str(p))
    # Parsed once per file content for the process (a fleet run reads the same lock for every host).
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{p}: not a text file (images.lock is YAML); name the lock file, or write one with "
                         "`invoke images.pin`") from None
    except OSError as exc:
        raise UsageError(f"{p}: cannot read it ({exc.strerror or exc}); fix its permissions or name another "
                         "lock") from None
    cached = _LOCK_CACHE.get(str(p))
    if cached is None or cached[0] != text:
        cached = (text, parse_lock(text, path=str(p), keep=True))
        _LOCK_CACHE[str(p)] = cached
    return ImageLock(images=dict(cached[1].images), path=cached[1].path)


_LOCK_CACHE: dict[str, tuple[str, ImageLock]] = {}


def default_lock_path() -> Path:
    """The lock a host uses when neither the inventory nor the configuration names one: images.lock
    in the working directory (the project's, written by ``images.pin``), else the packaged one."""
    own = Path(PROJECT_LOCK)
    if own.is_file():
        return own
    return Path(str(PACKAGED_LOCK))


def packaged_lock_text() -> str:
    return PACKAGED_LOCK.read_text(encoding="utf-8")


def _canonical_repo(repo: str) -> str:
    """Docker's implicit registry and library prefix, so mirror keys match either spelling."""
    if explicit_registry(repo):
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
    unpinned_flag: bool = True,
) -> ImageRef:
    """A service's ``image`` -> the exact reference to pull.

    ``image`` is a key of images.lock (``vllm:0.9.2``), or a full reference with a digest
    (``repo@sha256:...``: pinned by itself), or a floating tag (refused unless ``allow_unpinned``).
    ``unpinned_flag``: whether the caller's task takes --allow-unpinned (a refusal names it only then:
    bundle.create carries pinned images only).
    """
    mirrors = mirrors or {}
    or_flag = ", or pass --allow-unpinned" if unpinned_flag else ""
    locked = lock.get(image)
    if locked is not None and locked.digest is None:
        if not allow_unpinned:
            raise UsageError(
                f"{where}: image {image!r} is listed in {lock.path} without a digest (never resolved); run "
                f"`invoke images.pin {image.replace(':', '=', 1)}` where the registry is reachable{or_flag}"
            )
        return ImageRef(
            key=image, repository=apply_mirror(locked.repository, mirrors), digest=None,
            tag=locked.tag or "latest", pinned=False, upstream_repository=locked.repository,
            **_ref_facts(locked),
        )
    if locked is not None:
        return ImageRef(
            key=image,
            repository=apply_mirror(locked.repository, mirrors),
            digest=locked.digest,
            tag=locked.tag,
            pinned=True,
            upstream_repository=locked.repository,
            **_ref_facts(locked),
        )
    if _KEY_RE.match(image) and "/" not in image:
        known = ", ".join(sorted(lock.images)) or "none"
        raise UsageError(
            f"{where}: image {image!r} is not in {lock.path} (pinned: {known}); run `invoke images.pin "
            f"{image.replace(':', '=', 1)}` or give a full reference (repo@sha256:..."
            + (", or repo:tag with --allow-unpinned)" if unpinned_flag else ")")
        )
    repo, tag, digest = split_reference(image)
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
            f"{where}: image {image!r} is a floating tag; pin it in {lock.path} (`invoke images.pin`)"
            + (" or pass --allow-unpinned" if unpinned_flag else "")
        )
    return ImageRef(
        key=image, repository=apply_mirror(repo, mirrors), digest=None, tag=tag or "latest",
        pinned=False, upstream_repository=repo,
    )


def unpinned_note(ref: ImageRef, lock: ImageLock) -> str | None:
    """What ``render`` says of an image it rendered without a digest (None for a pinned one): the floating
    tag it wrote, that deploy refuses it, and the fix. Pure."""
    if ref.pinned:
        return None
    if lock.get(ref.key) is not None:
        fix = f"`invoke images.pin {ref.key.replace(':', '=', 1)}` writes its digest where the registry is reachable"
    else:
        fix = f"it is pinned in {lock.path} (`invoke images.pin`) or named as repo@sha256:..."
    return (f"image {ref.key!r} is UNPINNED: rendered with the floating tag {ref.pull_ref}, which can change under "
            f"you; deploy refuses it until {fix}, or takes it with --allow-unpinned (not for production)")


# ------------------------------------------------------------------------------------------------
# Writing the lock (pure) and pinning / verifying against registries (shell)

LOCK_HEADER = """\
# images.lock: the exact bytes llmfleet deploys. Written by `invoke images.pin`; checked by
# `invoke images.verify`. Keys are ENGINE:VERSION as in src/llmfleet/knowledge/catalog/engines.yaml (a test
# keeps the two in step). Each entry: repository, tag (what was resolved), digest (sha256 of the
# manifest or index the tag pointed at), cuda and archs (compute capabilities with kernels in the
# image: "7.0" SASS, "8.9+PTX" SASS and PTX, "5.0-virtual" PTX only), for vLLM images torch,
# torch_cuda and torch_archs (the PyTorch build inside: its kernels must cover the card too),
# archs_source (catalog: copied from catalog/engines.yaml; inspected: read from the image by
# `invoke images.inspect`, which preflight prefers), source, and
# verified: when and where a registry last confirmed the digest (null: never confirmed by llmfleet).
# digest: null means listed but not pinned yet: deploy refuses it until `invoke images.pin KEY` runs
# where the registry is reachable. digest_source says where a digest that images.pin did not
# resolve was read; such an entry stays verified: null until `invoke images.verify --record`.
"""


_ENTRY_ORDER = ("repository", "tag", "digest", "digest_source", "cuda", "archs", "torch", "torch_cuda",
                "torch_archs", "archs_source", "engine_version", "require_cuda", "source", "verified")


def entry_dict(img: LockedImage) -> dict[str, Any]:
    """One lock entry as written to the file (keys in a fixed order; empty optional keys dropped)."""
    data: dict[str, Any] = {
        "repository": img.repository,
        "tag": img.tag,
        "digest": img.digest,
        "digest_source": img.digest_source,
        "cuda": img.cuda,
        "archs": list(img.archs),
        "torch": img.torch,
        "torch_cuda": img.torch_cuda,
        "torch_archs": list(img.torch_archs),
        "archs_source": img.archs_source,
        "engine_version": img.engine_version,
        "require_cuda": img.require_cuda,
        "source": img.source,
        "verified": dict(img.verified) if img.verified else None,
    }
    keep = {"repository", "tag", "digest", "verified"}
    return {k: data[k] for k in _ENTRY_ORDER if k in keep or data[k] not in (None, [], "")}


def render_lock(lock: ImageLock, header: str = LOCK_HEADER) -> str:
    """The lock file's text: a fixed header, then entries sorted by key. Byte-identical for equal locks."""
    body = {"version": 1, "images": {k: entry_dict(lock.images[k]) for k in sorted(lock.images)}}
    return header + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=100, allow_unicode=True)


@dataclass(frozen=True)
class PinSpec:
    """What to pin: ``key`` (ENGINE:VERSION) and ``ref`` (``repo:tag`` to resolve).

    ``repository`` is what the lock records when it differs from where ``ref`` is resolved (the lab
    resolves on 127.0.0.1 but hosts pull through the lab network). cuda/archs/source describe the image.
    """

    key: str
    ref: str
    repository: str | None = None
    cuda: str | None = None
    archs: tuple[str, ...] = ()
    source: str | None = None
    torch: str | None = None
    torch_cuda: str | None = None
    torch_archs: tuple[str, ...] = ()


def parse_pin_args(args: list[str], catalog_images: dict[str, Any]) -> list[PinSpec]:
    """``ENGINE=VERSION`` (catalog release) or ``ENGINE=VERSION=REPO:TAG`` (explicit) -> PinSpecs.

    ``catalog_images`` maps catalog keys to releases (objects or dicts with repository, tag, cuda,
    kernels). Pure.
    """
    if not args:
        raise UsageError("images.pin: name at least one ENGINE=VERSION (e.g. vllm=0.10.1.1), or all")
    specs: list[PinSpec] = []
    for arg in args:
        parts = arg.split("=", 2)
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise UsageError(f"images.pin: {arg!r} must be ENGINE=VERSION or ENGINE=VERSION=REPO:TAG")
        key = f"{parts[0]}:{parts[1]}"
        if not _KEY_RE.match(key):
            raise UsageError(f"images.pin: {arg!r}: engine must be vllm, llamacpp, node-exporter, dcgm-exporter or gateway and the version a plain tag")
        rel = catalog_images.get(key)
        if rel is None:
            known = ", ".join(k.replace(":", "=", 1) for k in sorted(catalog_images)) or "none"
            raise UsageError(
                f"images.pin: {key} is not in the engine-release catalog (catalog/engines.yaml); add it there "
                f"first so preflight knows its CUDA and kernels (known: {known})"
            )
        get = rel.get if isinstance(rel, dict) else lambda name, _r=rel: getattr(_r, name, None)
        repo, tag = str(get("repository")), str(get("tag"))
        ref = parts[2] if len(parts) == 3 else f"{repo}:{tag}"
        specs.append(
            PinSpec(
                key=key,
                ref=ref,
                repository=repo if len(parts) == 3 else None,
                cuda=str(get("cuda")) if get("cuda") else None,
                archs=catalog_archs(rel),
                **catalog_torch(rel),
            )
        )
    return specs


def catalog_torch(rel: Any) -> dict[str, Any]:
    """The PyTorch build a catalog release records (vLLM images), as PinSpec/LockedImage fields."""
    tb = rel.get("torch") if isinstance(rel, dict) else getattr(rel, "torch", None)
    if not tb:
        return {}
    get = tb.get if isinstance(tb, dict) else lambda name, _t=tb: getattr(_t, name, None)
    return {"torch": str(get("version")) if get("version") else None,
            "torch_cuda": str(get("cuda")) if get("cuda") else None,
            "torch_archs": tuple(str(a) for a in get("archs") or ())}


def catalog_archs(rel: Any) -> tuple[str, ...]:
    """Compute capabilities an image carries code for, in the lock's notation: ``"7.0"`` SASS only,
    ``"8.9+PTX"`` SASS and PTX, ``"5.0-virtual"`` PTX only (what preflight.parse_archs reads)."""
    kernels = rel.get("kernels") if isinstance(rel, dict) else getattr(rel, "kernels", None)
    if not kernels:
        return ()
    get = kernels.get if isinstance(kernels, dict) else lambda name, _k=kernels: getattr(_k, name, None)
    sass = [str(a) for a in get("sass") or []]
    ptx = [str(a) for a in get("ptx") or []]
    out = [f"{a}+PTX" if a in ptx else a for a in sass]
    out += [f"{a}-virtual" for a in ptx if a not in sass]
    return tuple(out)


def through_mirror(spec: PinSpec, mirrors: dict[str, str]) -> PinSpec:
    """Resolve a spec at the mirror while the lock keeps the public repository. Pure."""
    repo, tag, digest = split_reference(spec.ref)
    ref = apply_mirror(repo, mirrors) + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
    return replace(spec, ref=ref, repository=spec.repository or _canonical_repo(repo))


def pinned(spec: PinSpec, digest: str, *, registry: str, at: str, by: str = "images.pin") -> LockedImage:
    """The lock entry for a resolved spec. Pure."""
    repo, tag, _ = split_reference(spec.ref)
    return LockedImage(
        key=spec.key,
        repository=spec.repository or _canonical_repo(repo),
        digest=digest,
        tag=tag or "latest",
        cuda=spec.cuda,
        archs=spec.archs,
        source=spec.source,
        verified={"at": at, "registry": registry, "by": by},
        torch=spec.torch,
        torch_cuda=spec.torch_cuda,
        torch_archs=spec.torch_archs,
        archs_source="catalog" if (spec.archs or spec.torch_archs) else None,
    )


def merge(lock: ImageLock, entries: list[LockedImage]) -> ImageLock:
    """The lock with ``entries`` added or replaced; other entries untouched. Pure."""
    images = dict(lock.images)
    for e in entries:
        images[e.key] = e
    return ImageLock(images=images, path=lock.path)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_lock(lock: ImageLock, path: str | Path) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a lock."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".images.lock.", dir=str(p.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(render_lock(lock))
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def pin(specs: list[PinSpec] | dict[str, str], client: Any, lock_path: str | Path) -> list[LockedImage]:
    """Resolve each spec's tag to a digest with ``client`` (a ``registry.RegistryClient``) and write
    the entries into the lock at ``lock_path`` (created when missing; other entries kept).

    ``specs`` may be a plain ``{KEY: "repo:tag"}`` mapping. Nothing is written unless every spec
    resolves. Returns the new entries.
    """
    if isinstance(specs, dict):
        specs = [PinSpec(key=k, ref=v) for k, v in specs.items()]
    for spec in specs:
        if not _KEY_RE.match(spec.key):
            raise UsageError(f"pin: key {spec.key!r} must look like ENGINE:VERSION (engine vllm, llamacpp, node-exporter, dcgm-exporter or gateway)")
    at = _now()
    lock = load_lock(lock_path)
    entries = []
    for spec in specs:
        ref = parse_reference(spec.ref)
        digest = client.resolve(ref)
        old = lock.get(spec.key)
        if spec.source is None:  # keep what the lock said about the image's origin
            spec = replace(spec, source=old.source if old and old.source else f"catalog/engines.yaml {spec.key}")
        entry = pinned(spec, digest, registry=ref.registry, at=at)
        if old is not None and old.digest == digest and old.archs_source == "inspected":
            # the same bytes: what images.inspect read from them still holds
            entry = replace(entry, cuda=old.cuda, archs=old.archs, torch=old.torch, torch_cuda=old.torch_cuda,
                            torch_archs=old.torch_archs, archs_source="inspected", engine_version=old.engine_version,
                            require_cuda=old.require_cuda)
        entries.append(entry)
    write_lock(merge(lock, entries), lock_path)
    return entries


@dataclass(frozen=True)
class VerifyResult:
    key: str
    ref: str  # what was asked of the registry (mirror applied)
    status: str  # ok | missing | error | unpinned
    message: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "ref": self.ref, "status": self.status, "message": self.message}


def verify(lock: ImageLock, client: Any, *, mirrors: dict[str, str] | None = None) -> list[VerifyResult]:
    """Ask the registry (the mirror, when one applies) whether every pinned digest still resolves."""
    results = []
    for key in sorted(lock.images):
        img = lock.images[key]
        repo = apply_mirror(img.repository, mirrors or {})
        if img.digest is None:
            results.append(VerifyResult(key, f"{repo}:{img.tag or 'latest'}", "unpinned",
                                        "no digest in the lock; run images.pin"))
            continue
        ref = f"{repo}@{img.digest}"
        try:
            ok = client.exists(ref)
        except LlmfleetError as exc:
            results.append(VerifyResult(key, ref, "error", str(exc)))
            continue
        results.append(VerifyResult(key, ref, "ok" if ok else "missing",
                                    "" if ok else "digest no longer in the registry; re-pin or restore it"))
    return results


def mark_verified(lock: ImageLock, results: list[VerifyResult], *, at: str | None = None) -> ImageLock:
    """The lock with ``verified`` refreshed on entries that resolved. Pure (``at`` given)."""
    at = at or _now()
    images = dict(lock.images)
    for r in results:
        if r.status == "ok":
            old = images[r.key]
            images[r.key] = replace(
                old, verified={"at": at, "registry": parse_reference(r.ref).registry, "by": "images.verify"})
    return ImageLock(images=images, path=lock.path)


def lock_path_for(hostvars: dict[str, Any] | None, inventory_path: str | None, configured: str | None) -> Path:
    """Which lock a host uses: the inventory var ``llmfleet_images_lock`` (relative to the inventory
    folder), else the configured ``llmfleet.images_lock`` (relative to the working directory), else
    ``default_lock_path()`` (images.lock in the working directory, else the one shipped with llmfleet)."""
    var = (hostvars or {}).get("llmfleet_images_lock")
    if var and inventory_path:
        p = Path(str(var)).expanduser()
        if not p.is_absolute():
            base = Path(inventory_path)
            p = (base if base.is_dir() else base.parent) / p
        return p
    return Path(configured).expanduser() if configured else default_lock_path()


def images_lock_path(hostvars: dict[str, Any], inventory_path: str, configured: str | None) -> str | None:
    """Which images.lock a host uses (``lock_path_for``), or None for the default one at the repository
    root."""
    if not hostvars.get("llmfleet_images_lock") and not configured:
        return None
    return str(lock_path_for(hostvars, inventory_path, configured))


# ------------------------------------------------------------------------------------------------
# Building the images upstream does not ship (dockerfiles/NAME/ + image.yaml)

DOCKERFILES_DIR = Path(__file__).resolve().parents[3] / "dockerfiles"
_ARG_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class BuildSpec:
    """``dockerfiles/NAME/image.yaml``: what the image is (catalog key, repository, tag), its bases
    (``bases: {ARG: {image, digest}}``: each base image pinned by a digest passed as build arg ARG),
    and the build args ``images.build`` must be given."""

    name: str
    dir: Path
    catalog_key: str
    repository: str
    tag: str
    bases: dict[str, tuple[str, str | None]]  # build arg -> (image, digest or None)
    required_args: tuple[str, ...] = ()
    args: dict[str, str] = field(default_factory=dict)
    notes: str = ""


def load_build_spec(name: str, root: Path | None = None) -> BuildSpec:
    root = root or DOCKERFILES_DIR
    if not re.match(r"^[a-z0-9][a-z0-9._-]*$", name) or not (root / name / "image.yaml").is_file():
        known = sorted(p.parent.name for p in root.glob("*/image.yaml"))
        raise UsageError(f"images.build: no image {name!r} (a folder dockerfiles/NAME with image.yaml); known: "
                         f"{', '.join(known) or 'none'}")
    path = root / name / "image.yaml"
    try:
        data = yamlload.safe_load(path.read_text(encoding="utf-8"), keep=True) or {}
    except yaml.YAMLError:
        raise UsageError(f"{path}: not valid YAML") from None
    for field_name in ("catalog_key", "repository", "tag", "bases"):
        if not data.get(field_name):
            raise UsageError(f"{path}: {field_name} is required")
    bases: dict[str, tuple[str, str | None]] = {}
    for arg, base in (data.get("bases") or {}).items():
        if not _ARG_RE.match(str(arg)) or not isinstance(base, dict) or not base.get("image"):
            raise UsageError(f"{path}: bases.{arg}: must be an UPPER_CASE build arg with image and digest")
        digest = base.get("digest")
        if digest is not None and not DIGEST_RE.match(str(digest)):
            raise UsageError(f"{path}: bases.{arg}.digest must be sha256:<64 hex> or null")
        bases[str(arg)] = (str(base["image"]), str(digest) if digest else None)
    args = {str(k): str(v) for k, v in (data.get("args") or {}).items()}
    required = tuple(str(a) for a in data.get("required_args") or ())
    for a in (*args, *required):
        if not _ARG_RE.match(a):
            raise UsageError(f"{path}: build arg {a!r} must be UPPER_CASE")
    return BuildSpec(
        name=name, dir=root / name, catalog_key=str(data["catalog_key"]), repository=str(data["repository"]),
        tag=str(data["tag"]), bases=bases, required_args=required, args=args, notes=str(data.get("notes") or ""),
    )


def all_build_specs(root: Path | None = None) -> list[BuildSpec]:
    root = root or DOCKERFILES_DIR
    return [load_build_spec(p.parent.name, root) for p in sorted(root.glob("*/image.yaml"))]


def build_argv(spec: BuildSpec, overrides: dict[str, str] | None = None, *, tag: str | None = None,
               docker: str = "docker") -> list[str]:
    """The ``docker build`` command for a spec. Pure. Refuses (UsageError) when a base digest or a
    required build arg is missing, naming how to supply it."""
    args = dict(spec.args)
    for arg, (_, digest) in spec.bases.items():
        if digest:
            args[arg] = digest
    args.update(overrides or {})
    for arg, (image, _) in spec.bases.items():
        value = args.get(arg)
        if not value:
            raise UsageError(
                f"images.build {spec.name}: base {image} is not pinned: pass --build-arg {arg}=sha256:... "
                f"(or --resolve-base to look it up now), or set bases.{arg}.digest in {spec.dir / 'image.yaml'}"
            )
        if not DIGEST_RE.match(value):
            raise UsageError(f"images.build {spec.name}: {arg} must be sha256:<64 hex>, got {value!r}")
    missing = [a for a in spec.required_args if not args.get(a)]
    if missing:
        raise UsageError(f"images.build {spec.name}: build args {', '.join(missing)} are required; pass "
                         + " ".join(f"--build-arg {a}=..." for a in missing))
    for k in args:
        if not _ARG_RE.match(k):
            raise UsageError(f"images.build: build arg {k!r} must be UPPER_CASE")
    ref = f"{spec.repository}:{tag or spec.tag}"
    argv = [docker, "build", "-t", ref, "-f", str(spec.dir / "Dockerfile")]
    for k in sorted(args):
        argv += ["--build-arg", f"{k}={args[k]}"]
    for arg, (image, _) in sorted(spec.bases.items()):
        argv += ["--label", f"io.llmfleet.base.{arg.lower().replace('_', '-')}={image}@{args[arg]}"]
    argv += ["--label", f"io.llmfleet.catalog-key={spec.catalog_key}", str(spec.dir)]
    return argv
