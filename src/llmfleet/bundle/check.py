"""``bundle.verify``: the files of a bundle folder against its ``bundle.json`` (local reads only:
no host, no network). Sizes first (cheap: a missing or truncated file is named at once), then the
sha256 of every file whose size matches."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmfleet.bundle import contents as bc
from llmfleet.errors import UsageError
from llmfleet.images.lock import ImageRef
from llmfleet.images.registry import file_sha256


def read(bundle_dir: str | Path) -> bc.Bundle:
    root = Path(bundle_dir)
    top = root / bc.TOP
    if not root.is_dir():
        raise UsageError(f"{root}: no such folder; name a bundle folder (bundle.create writes one)")
    if not top.is_file():
        raise UsageError(f"{top}: missing; the folder is not a complete bundle (bundle.create writes it last)")
    try:
        text = top.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{top}: cannot be read ({exc}); copy the bundle again") from None
    return bc.parse_bundle(text, str(top))


def problems(bundle: bc.Bundle, bundle_dir: str | Path, only: set[str] | None = None) -> list[bc.Problem]:
    """What differs between the bundle's files and its manifest (``only``: just these paths)."""
    root = Path(bundle_dir)
    found = bc.structure_problems(bundle)
    sized: list[bc.FileEntry] = []
    for entry in bundle.files:
        if only is not None and entry.path not in only:
            continue
        path = root / entry.path
        size = path.stat().st_size if path.is_file() else None
        problem = bc.compare(entry, size, None)
        if problem is not None:
            found.append(problem)
        else:
            sized.append(entry)
    for entry in sized:
        problem = bc.compare(entry, entry.size, file_sha256(root / entry.path))
        if problem is not None:
            found.append(problem)
    return found


def verify(bundle_dir: str | Path) -> bc.Bundle:
    """The bundle, when every listed file is there with its size and sha256; else ``CheckFailed``
    with one line per file (exit 1). A malformed or missing bundle.json is a usage error (exit 2)."""
    bundle = read(bundle_dir)
    bc.raise_problems(problems(bundle, bundle_dir), str(bundle_dir))
    return bundle


def verified_packages(bundle_dir: str | Path) -> bc.Bundle:
    """The bundle, when its package archives (``provision --bundle`` reads nothing else) are there with
    their sizes and sha256; ``CheckFailed`` naming each file that is not (exit 1). A bundle with no
    packages is refused in one line with the fix."""
    bundle = read(bundle_dir)
    if not bundle.packages:
        raise UsageError(f"{bundle_dir}: the bundle carries no packages; build it with "
                         "`bundle.create --packages-from HOST` (a connected host installed like the air-gapped ones)")
    bc.raise_problems(problems(bundle, bundle_dir, {p.archive for p in bundle.packages}), str(bundle_dir))
    return bundle


def lock_sha256(path: str | Path) -> str:
    return file_sha256(Path(path))


@dataclass
class Verified:
    """A bundle whose files were all checked (``verified``): what ``deploy --bundle`` prepares hosts
    with. ``localize`` turns an image the inventory names into the bundle's loaded image."""

    dir: Path
    bundle: bc.Bundle
    _locks: dict[str, str] = field(default_factory=dict)

    def localize(self, ref: ImageRef, lock_path: Path, where: str) -> ImageRef:
        """``ref`` as a deploy from this bundle runs it: named by its local tag, checked by image ID.
        Refuses (usage error) an inventory on another images.lock, or an image the bundle lacks."""
        key = str(lock_path)
        if key not in self._locks:
            if not Path(lock_path).is_file():
                raise UsageError(f"{lock_path}: no such images.lock; copy the bundle's ({self.dir}/{bc.LOCK}) there "
                                 "or point llmfleet_images_lock at it")
            self._locks[key] = lock_sha256(lock_path)
        bc.lock_matches(self.bundle, self._locks[key], key, str(self.dir))
        image = bc.need_image(self.bundle, ref.key, where, str(self.dir))
        if image.digest != ref.digest:  # cannot happen with the same lock; a hand-edited bundle.json can
            raise UsageError(f"{where}: the bundle's {image.key} is {image.digest}, the lock pins {ref.digest}; "
                             "build the bundle again")
        return replace(ref, repository=ref.upstream_repository, image_id=image.image_id)

    def images_for(self, refs: list[ImageRef]) -> list[bc.BundleImage]:
        """The bundle's images behind these (localized) references, each once."""
        keys = []
        for r in refs:
            if r.image_id and r.key not in keys:
                keys.append(r.key)
        return [i for k in keys if (i := self.bundle.image(k)) is not None]


def verified(bundle_dir: str | Path) -> Verified:
    return Verified(Path(bundle_dir), verify(bundle_dir))


def refuse_spanning(hosts: list[Any], services: list[str] | None, task: str = "deploy") -> None:
    """``deploy --bundle`` (and ``upgrade --bundle``) deploys single-host services: a chosen service
    with workers is refused (usage error) before any host is contacted, rather than left to a pull
    that cannot succeed."""
    from llmfleet.inventory.ansible import settings_for

    for h in hosts:
        for svc in settings_for(h).services:
            if svc.workers and (services is None or svc.name in services):
                raise UsageError(f"host {h.name}: service {svc.name} spans hosts ({', '.join(svc.workers)}): {task} "
                                 f"--bundle deploys single-host services only; leave it out with "
                                 f"{'--service' if task == 'deploy' else '--host PATTERN'}")
