"""``bundle.create``: fetch what the chosen hosts' services need into one folder (the shell).

Images come from their registry (or a mirror: the digest stays the same) by the pinned digest in
images.lock, through ``images.registry.RegistryClient``: the linux/amd64 manifest, its config and
layers streamed to a staging folder (``.blobs/``, kept when a run fails so the next one resumes,
removed when the bundle is complete), then one tar per image (``contents.image_layout``). Models
with a local ``model_source`` are copied with their manifest beside them (``bundle.models``). Last,
``bundle.json`` lists every file with its size and sha256 (written last, atomically: a bundle
without it is incomplete).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from llmfleet import __version__
from llmfleet.bundle import contents as bc
from llmfleet.errors import UsageError
from llmfleet.images import lock as images
from llmfleet.images.registry import CHUNK, PLATFORM, RegistryClient, file_sha256, parse_reference
from llmfleet.inventory.ansible import Inventory, settings_for

Log = Callable[[str], None]
STAGING = ".blobs"


@dataclass
class Selection:
    """What a bundle is for: the hosts, their services, the one lock they use, the images."""

    inventory: Inventory
    hosts: list[str]
    services: dict[str, list[str]]
    lock_path: Path
    lock: images.ImageLock
    images: list[images.LockedImage]


def select(inv: Inventory, host_names: list[str], services: list[str] | None, configured_lock: str | None) -> Selection:
    """The images of the chosen hosts' services, by the one images.lock they share.
    Usage errors: hosts on different locks, a service no host has, an image not pinned."""
    lock_path: Path | None = None
    first = ""
    chosen: dict[str, list[str]] = {}
    keys: dict[str, str] = {}  # image key -> where it was named
    for name in host_names:
        host = inv.hosts[name]
        path = images.lock_path_for(host.vars, inv.path, configured_lock)
        if lock_path is None:
            lock_path, first = path, name
        elif path.resolve() != lock_path.resolve():
            raise UsageError(f"{inv.path}: host {name} uses {path} but {first} uses {lock_path}; a bundle carries one "
                             "images.lock: choose hosts of one lock with --host/--group")
        svcs = [s for s in settings_for(host).services if services is None or s.name in services]
        chosen[name] = [s.name for s in svcs]
        for s in svcs:
            where = f"host {name}: service {s.name}"
            for image in filter(None, (s.image, s.worker_image)):
                keys.setdefault(image, where)
    if services:
        missing = [s for s in services if not any(s in v for v in chosen.values())]
        if missing:
            raise UsageError(f"{inv.path}: no chosen host has service {missing[0]!r}; see `invoke inventory --list`")
    if lock_path is None or not keys:
        raise UsageError(f"{inv.path}: the chosen hosts run no llmfleet_services: nothing to bundle")
    lock = images.load_lock(lock_path)
    out: list[images.LockedImage] = []
    for key, where in sorted(keys.items()):
        # refuses floating tags and unpinned entries (a bundle takes no --allow-unpinned: pinned images only)
        ref = images.resolve(key, lock, where=where, unpinned_flag=False)
        locked = lock.get(key)
        if locked is None:
            raise UsageError(f"{where}: image {key!r} is not a key of {lock.path}; a bundle carries pinned images "
                             f"only: pin it (images.pin) and name it by its key")
        assert ref.digest is not None
        out.append(locked)
    return Selection(inv, list(host_names), chosen, lock_path, lock, out)


class _Hashing:
    """A write-only file that hashes and counts what goes through it (tarfile needs write and tell)."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.h, self.n = fh, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.h.update(data)
        self.n += len(data)
        return self.fh.write(data)

    def tell(self) -> int:
        return self.n

    @property
    def digest(self) -> str:
        return "sha256:" + self.h.hexdigest()


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid = size, 0o644, 0, 0, 0
    return info


def write_archive(dest: Path, small: dict[str, bytes], blobs: dict[str, Path]) -> bc.FileEntry:
    """One image tar: the layout files, then every blob under ``blobs/sha256/``; written to
    ``.part`` and renamed. Returns its entry (size and sha256 taken while writing)."""
    import io

    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    with part.open("wb") as raw:
        out = _Hashing(raw)
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            dirs = ["blobs/", "blobs/sha256/"]
            for d in dirs:
                info = tarfile.TarInfo(d.rstrip("/"))
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                tar.addfile(info)
            for digest, path in sorted(blobs.items()):
                with path.open("rb") as fh:
                    tar.addfile(_tarinfo(bc.blob_path(digest), path.stat().st_size), fh)
            for name, data in small.items():
                tar.addfile(_tarinfo(name, len(data)), io.BytesIO(data))
        raw.flush()
        os.fsync(raw.fileno())
    part.replace(dest)
    return bc.FileEntry("", out.n, out.digest)


def fetch_image(client: RegistryClient, locked: images.LockedImage, mirrors: dict[str, str], staging: Path,
                out_dir: Path, log: Log) -> tuple[bc.BundleImage, bc.FileEntry]:
    """One pinned image, fetched by digest (through a mirror when one applies) into its archive."""
    assert locked.digest is not None
    source = f"{images.apply_mirror(locked.repository, mirrors)}@{locked.digest}"
    ref = parse_reference(source)
    manifest = client.image_manifest(ref, PLATFORM)
    descs = [manifest.config, *manifest.layers]
    total = sum(int(d["size"]) for d in descs)
    log(f"{locked.key}: {source} ({PLATFORM} {manifest.digest[:19]}): {len(manifest.layers)} layer(s), "
        f"{total / 1e6:.1f} MB")
    blobs: dict[str, Path] = {}
    done = 0
    for i, d in enumerate(descs, 1):
        digest, size = str(d["digest"]), int(d["size"])
        dest = staging / digest.split(":", 1)[1]
        t0 = time.monotonic()
        client.fetch_blob(ref, digest, dest, size=size)
        done += size
        # a CUDA engine image is gigabytes: each blob says when it is in, so a long fetch is never silent
        log(f"{locked.key}: blob {i}/{len(descs)} {digest[:19]} {size / 1e6:.1f} MB in "
            f"{time.monotonic() - t0:.1f} s ({done / 1e6:.1f} of {total / 1e6:.1f} MB)")
        blobs[digest] = dest
    mpath = staging / manifest.digest.split(":", 1)[1]
    mpath.write_bytes(manifest.body)
    if file_sha256(mpath) != manifest.digest:  # the body was checked on arrival; a full disk is not
        raise UsageError(f"{mpath}: the manifest was not written intact; check the disk")
    blobs[manifest.digest] = mpath
    tag = bc.local_tag(locked.repository, locked.digest)
    small = bc.image_layout(tag, manifest.digest, manifest.media_type, len(manifest.body), manifest.image_id,
                            [str(d["digest"]) for d in manifest.layers])
    name = bc.archive_name(locked.key)
    log(f"{locked.key}: writing {name} ({total / 1e6:.1f} MB, sha256 while written)")
    entry = write_archive(out_dir / name, small, blobs)
    image = bc.BundleImage(key=locked.key, repository=locked.repository, digest=locked.digest,
                           manifest=manifest.digest, image_id=manifest.image_id, archive=name, tag=tag,
                           size=entry.size)
    return image, bc.FileEntry(name, entry.size, entry.sha256)


def _prepare_dir(out: Path) -> None:
    """An empty or missing folder, or an earlier bundle (its files are replaced; its staged blobs
    are reused). Anything else is refused: the bundle never overwrites other files."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a folder; name a new folder for the bundle")
    if out.is_dir() and any(out.iterdir()) and not ((out / bc.TOP).is_file() or (out / STAGING).is_dir()):
        raise UsageError(f"{out}: is not empty and holds no bundle; name an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / bc.TOP).unlink(missing_ok=True)  # incomplete until the last step writes it again
    for sub in (bc.IMAGES_DIR, bc.CATALOG_DIR, bc.MODELS_DIR, bc.PACKAGES_DIR):
        shutil.rmtree(out / sub, ignore_errors=True)
    for name in (bc.LOCK,):
        (out / name).unlink(missing_ok=True)


def _copy(src: Path | Any, dest: Path) -> bc.FileEntry:
    dest.parent.mkdir(parents=True, exist_ok=True)
    h, n = hashlib.sha256(), 0
    with src.open("rb") as fin, dest.open("wb") as fout:
        for chunk in iter(lambda: fin.read(CHUNK), b""):
            h.update(chunk)
            n += len(chunk)
            fout.write(chunk)
    return bc.FileEntry("", n, "sha256:" + h.hexdigest())


def catalog_files() -> list[Any]:
    """The catalogs llmfleet reads (the packaged ones)."""
    root = resources.files("llmfleet.knowledge.catalog")
    return sorted((p for p in root.iterdir() if p.name.endswith(".yaml")), key=lambda p: p.name)


def write_top(out: Path, bundle: bc.Bundle) -> None:
    tmp = out / f".{bc.TOP}.tmp"
    tmp.write_text(bundle.render(), encoding="utf-8")
    os.replace(tmp, out / bc.TOP)


PackagesFetch = Callable[[Path], list[tuple[bc.BundlePackages, bc.FileEntry]]]


def create(sel: Selection, out: Path, *, client: RegistryClient, mirrors: dict[str, str] | None = None,
           log: Log = lambda _m: None, now: datetime | None = None,
           packages: PackagesFetch | None = None) -> bc.Bundle:
    """Write the bundle for ``sel`` into ``out``; returns its top manifest. ``packages``: writes the
    offline apt repositories into ``out`` (``bundle.create --packages-from``) and says what it wrote."""
    _prepare_dir(out)
    staging = out / STAGING
    staging.mkdir(exist_ok=True)
    files: list[bc.FileEntry] = []
    got: list[bc.BundleImage] = []
    for locked in sel.images:
        image, entry = fetch_image(client, locked, mirrors or {}, staging, out, log)
        got.append(image)
        files.append(entry)
    lock_entry = _copy(sel.lock_path, out / bc.LOCK)
    files.append(bc.FileEntry(bc.LOCK, lock_entry.size, lock_entry.sha256))
    for src in catalog_files():
        e = _copy(src, out / bc.CATALOG_DIR / src.name)
        files.append(bc.FileEntry(f"{bc.CATALOG_DIR}/{src.name}", e.size, e.sha256))
    from llmfleet.bundle.models import carry

    carried, model_files = carry(sel.inventory, sel.services, out, log)
    files += model_files
    repos = packages(out) if packages is not None else []
    files += [entry for _, entry in repos]
    when = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    built_for = {"inventory": Path(sel.inventory.path).name if sel.inventory.path else None,
                 "hosts": sel.hosts, "services": sel.services, "platform": PLATFORM,
                 "images": [i.key for i in got]}
    bundle = bc.Bundle(created=when, llmfleet_version=__version__, lock_sha256=lock_entry.sha256,
                       built_for=built_for, images=tuple(got), models=tuple(carried), files=tuple(files),
                       packages=tuple(repo for repo, _ in repos))
    write_top(out, bundle)
    shutil.rmtree(staging, ignore_errors=True)
    return bundle


def write_tarball(out: Path) -> Path:
    """``DIR.tar`` beside the folder: the bundle as one file (uncompressed: the layers already are)."""
    dest = out.with_name(out.name + ".tar")
    part = dest.with_name(dest.name + ".part")
    with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in out.rglob("*") if p.is_file()):
            rel = path.relative_to(out)
            if rel.parts[0] == STAGING:
                continue
            with path.open("rb") as fh:
                tar.addfile(_tarinfo(f"{out.name}/{rel.as_posix()}", path.stat().st_size), fh)
    part.replace(dest)
    return dest
