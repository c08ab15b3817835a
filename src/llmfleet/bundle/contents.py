"""What a bundle holds and how it is checked: pure (no files read, no hosts, no network).

Layout of a bundle folder (every path relative; nothing in it names the machine that built it)::

    bundle.json                      the top manifest: every other file with its size and sha256,
                                     the lock's hash, the images and models, what it was built for, when
    images.lock                      a copy of the lock the images were fetched by
    catalog/*.yaml                   the catalogs llmfleet used when it was built
    images/<engine>_<version>.tar    one image each: loadable by ``docker load`` (see ``image_layout``)
    models/<model_path>              each model with a local model_source, its manifest beside it
                                     (``<model>.llmfleet.json``, llmfleet.knowledge.model_manifest)
    packages/<id>-<version>-<arch>.tar  with ``--packages-from``: an offline apt repository (the .deb
                                     files provisioning installs and their ``Packages`` index) per
                                     distribution release and architecture (llmfleet.provision.offline)

An image archive carries two layouts over one set of blobs (``blobs/sha256/<hex>``): the OCI image
layout (``oci-layout``, ``index.json``) that newer engines import, and the ``manifest.json`` of
``docker save`` (Config, RepoTags, Layers pointing at those blobs) that a classic image store
(Docker 20.10) loads. ``RepoTags`` names the image by its local tag (``local_tag``): a loaded image
has no RepoDigests in a classic store, so compose names it by that tag and the deploy checks its
image ID (the config digest) instead of a digest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from llmfleet.errors import CheckFailed, UsageError
from llmfleet.images import lock as images_lock

FORMAT = "llmfleet-bundle/1"
TOP = "bundle.json"
LOCK = "images.lock"
CATALOG_DIR = "catalog"
IMAGES_DIR = "images"
MODELS_DIR = "models"
PACKAGES_DIR = "packages"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


# ---------------------------------------------------------------------------------------------
# Images: names and the archive layout


def local_tag(repository: str, digest: str) -> str:
    """The name a loaded image gets on a host (``images.lock.local_tag``: ``repo:sha256-<hex>``)."""
    if not _DIGEST.match(digest):
        raise UsageError(f"bundle: image {repository} is not pinned by a sha256 digest ({digest!r}); run images.pin")
    return images_lock.local_tag(repository, digest)


def archive_name(key: str) -> str:
    """``llamacpp:lab-cpu`` -> ``images/llamacpp_lab-cpu.tar``."""
    name = key.replace(":", "_", 1)
    if not _SAFE.match(name):
        raise UsageError(f"bundle: image key {key!r} does not make a file name")
    return f"{IMAGES_DIR}/{name}.tar"


def blob_path(digest: str) -> str:
    return f"blobs/sha256/{digest.split(':', 1)[1]}"


def image_layout(tag: str, manifest_digest: str, manifest_media_type: str, manifest_size: int,
                 config_digest: str, layer_digests: list[str]) -> dict[str, bytes]:
    """The small files of one image archive (the blobs themselves go under ``blob_path``): the OCI
    layout marker and index, and ``docker save``'s manifest.json over the same blobs."""
    repo, _, short = tag.rpartition(":")
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [{
        "mediaType": manifest_media_type, "digest": manifest_digest, "size": manifest_size,
        "annotations": {"io.containerd.image.name": tag, "org.opencontainers.image.ref.name": short},
        "platform": {"architecture": "amd64", "os": "linux"},
    }]}
    save = [{"Config": blob_path(config_digest), "RepoTags": [tag], "Layers": [blob_path(d) for d in layer_digests]}]
    return {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        "manifest.json": json.dumps(save).encode(),
    }


# ---------------------------------------------------------------------------------------------
# The top manifest


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class BundleImage:
    """One image of a bundle: the lock's key, repository and digest (what the tag resolved to), the
    linux/amd64 manifest and the config digest (the image ID once loaded), its archive and local tag."""

    key: str
    repository: str
    digest: str
    manifest: str
    image_id: str
    archive: str
    tag: str
    size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "repository": self.repository, "digest": self.digest, "manifest": self.manifest,
                "image_id": self.image_id, "archive": self.archive, "tag": self.tag, "size": self.size}


@dataclass(frozen=True)
class BundleModel:
    """One model folder of a bundle: where it lies in the bundle (its manifest beside it) and the
    host path the services name."""

    name: str
    dir: str
    host_path: str
    manifest: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dir": self.dir, "host_path": self.host_path, "manifest": self.manifest}


@dataclass(frozen=True)
class BundlePackages:
    """One offline apt repository of a bundle: the distribution release and architecture it was built
    for (on the staging host ``source``), its archive, and each package it carries (name=version)."""

    distro: str
    version: str
    arch: str
    archive: str
    source: str = ""
    packages: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"distro": self.distro, "version": self.version, "arch": self.arch, "archive": self.archive,
                "source": self.source, "packages": list(self.packages)}


def packages_archive(distro: str, version: str, arch: str) -> str:
    """``packages/debian-12-amd64.tar``."""
    name = f"{distro}-{version}-{arch}"
    if not _SAFE.match(name):
        raise UsageError(f"bundle: distribution {distro!r} {version!r} {arch!r} does not make a file name")
    return f"{PACKAGES_DIR}/{name}.tar"


@dataclass(frozen=True)
class Bundle:
    created: str
    llmfleet_version: str
    lock_sha256: str
    built_for: dict[str, Any]
    images: tuple[BundleImage, ...] = ()
    models: tuple[BundleModel, ...] = ()
    files: tuple[FileEntry, ...] = ()
    packages: tuple[BundlePackages, ...] = ()
    format: str = FORMAT
    path: str = TOP  # where it was read from (for messages); not written

    def image(self, key: str) -> BundleImage | None:
        return next((i for i in self.images if i.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "created": self.created,
            "llmfleet_version": self.llmfleet_version,
            "built_for": self.built_for,
            "lock": {"path": LOCK, "sha256": self.lock_sha256},
            "images": [i.to_dict() for i in self.images],
            "models": [m.to_dict() for m in self.models],
            **({"packages": [p.to_dict() for p in self.packages]} if self.packages else {}),
            "files": [f.to_dict() for f in sorted(self.files, key=lambda f: f.path)],
        }

    def render(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"


def safe_path(path: Any, where: str) -> str:
    """A bundle path: relative, POSIX, no ``..``, no empty part; else a usage error naming it."""
    text = str(path) if isinstance(path, str) else ""
    p = PurePosixPath(text)
    if not text or p.is_absolute() or any(part in ("", ".", "..") for part in text.split("/")) or "\\" in text:
        raise UsageError(f"{where}: path {path!r} must be relative inside the bundle (no '..', no leading '/')")
    return text


def parse_bundle(text: str, where: str = TOP) -> Bundle:
    """Read bundle.json; anything malformed is a usage error naming the field."""
    try:
        data = json.loads(text)
    except ValueError:
        raise UsageError(f"{where}: not JSON; the bundle is damaged, build it again (bundle.create)") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else None
        raise UsageError(f"{where}: format {got!r} is not {FORMAT}; build the bundle with this llmfleet (bundle.create)")

    def need(obj: Any, key: str, kind: type, ctx: str) -> Any:
        v = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(v, kind) or isinstance(v, bool):
            raise UsageError(f"{where}: {ctx}{key} is missing or not a {kind.__name__}")
        return v

    def digest(obj: Any, key: str, ctx: str) -> str:
        v = need(obj, key, str, ctx)
        if not _DIGEST.match(v):
            raise UsageError(f"{where}: {ctx}{key} must be sha256:<64 hex>, got {v[:80]!r}")
        return v

    files = []
    for i, f in enumerate(need(data, "files", list, "")):
        ctx = f"files[{i}]."
        files.append(FileEntry(safe_path(need(f, "path", str, ctx), where), need(f, "size", int, ctx),
                               digest(f, "sha256", ctx)))
    images = []
    for i, im in enumerate(data.get("images") or []):
        ctx = f"images[{i}]."
        images.append(BundleImage(key=need(im, "key", str, ctx), repository=need(im, "repository", str, ctx),
                                  digest=digest(im, "digest", ctx), manifest=digest(im, "manifest", ctx),
                                  image_id=digest(im, "image_id", ctx),
                                  archive=safe_path(need(im, "archive", str, ctx), where),
                                  tag=need(im, "tag", str, ctx), size=int(im.get("size") or 0)))
    models = []
    for i, m in enumerate(data.get("models") or []):
        ctx = f"models[{i}]."
        models.append(BundleModel(name=need(m, "name", str, ctx), dir=safe_path(need(m, "dir", str, ctx), where),
                                  host_path=need(m, "host_path", str, ctx),
                                  manifest=safe_path(need(m, "manifest", str, ctx), where)))
    packages = []
    for i, pk in enumerate(data.get("packages") or []):
        ctx = f"packages[{i}]."
        listed = pk.get("packages") if isinstance(pk, dict) else None
        packages.append(BundlePackages(distro=need(pk, "distro", str, ctx), version=need(pk, "version", str, ctx),
                                       arch=need(pk, "arch", str, ctx),
                                       archive=safe_path(need(pk, "archive", str, ctx), where),
                                       source=str(pk.get("source") or ""),
                                       packages=tuple(str(x) for x in listed) if isinstance(listed, list) else ()))
    lock = need(data, "lock", dict, "")
    return Bundle(created=need(data, "created", str, ""), llmfleet_version=str(data.get("llmfleet_version") or ""),
                  lock_sha256=digest(lock, "sha256", "lock."), built_for=data.get("built_for") or {},
                  images=tuple(images), models=tuple(models), files=tuple(files), packages=tuple(packages),
                  path=where)


# ---------------------------------------------------------------------------------------------
# Checks


@dataclass
class Problem:
    path: str
    what: str  # missing | size | sha256 | unlisted

    def line(self, bundle_dir: str) -> str:
        where = f"{bundle_dir.rstrip('/')}/{self.path}"
        return {
            "missing": f"{where}: missing from the bundle (listed in {TOP}); copy the bundle again",
            "size": f"{where}: corrupt (its size differs from {TOP}); copy the bundle again",
            "sha256": f"{where}: corrupt (its sha256 differs from {TOP}); copy the bundle again",
            "unlisted": f"{where}: {TOP} names it for an image or model but lists no size and sha256 for it; "
                        "build the bundle again",
        }[self.what]


@dataclass
class Verdict:
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def structure_problems(bundle: Bundle) -> list[Problem]:
    """Files the images and models name that the file list does not cover."""
    listed = {f.path for f in bundle.files}
    named = ([i.archive for i in bundle.images] + [m.manifest for m in bundle.models]
             + [pk.archive for pk in bundle.packages] + [LOCK])
    return [Problem(p, "unlisted") for p in named if p not in listed]


def compare(entry: FileEntry, size: int | None, sha256: str | None) -> Problem | None:
    """One listed file against what is on disk (``size`` None: missing; ``sha256`` None: not hashed,
    because its size already differs)."""
    if size is None:
        return Problem(entry.path, "missing")
    if size != entry.size:
        return Problem(entry.path, "size")
    if sha256 is not None and sha256 != entry.sha256:
        return Problem(entry.path, "sha256")
    return None


def lock_matches(bundle: Bundle, lock_sha256: str, lock_path: str, bundle_dir: str) -> None:
    """Refuse (usage error, exit 2) a bundle built from another images.lock than the one in use."""
    if lock_sha256 != bundle.lock_sha256:
        raise UsageError(
            f"{lock_path}: this images.lock ({lock_sha256[:19]}) is not the one the bundle was built from "
            f"({bundle.lock_sha256[:19]}, {bundle_dir.rstrip('/')}/{LOCK}); deploy with the bundle's lock "
            f"(llmfleet_images_lock or llmfleet.images_lock), or build a bundle from this one")


def need_image(bundle: Bundle, key: str, where: str, bundle_dir: str) -> BundleImage:
    found = bundle.image(key)
    if found is None:
        known = ", ".join(i.key for i in bundle.images) or "none"
        raise UsageError(f"{where}: image {key!r} is not in the bundle {bundle_dir} (it holds: {known}); "
                         "build a bundle for these hosts (bundle.create)")
    return found


def raise_problems(problems: list[Problem], bundle_dir: str) -> None:
    if problems:
        raise CheckFailed("\n".join(p.line(bundle_dir) for p in problems))
