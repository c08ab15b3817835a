"""``bundle.verify``: the files of a bundle folder against its ``bundle.json`` (local reads only:
no host, no network). Sizes first (cheap: a missing or truncated file is named at once), then the
sha256 of every file whose size matches."""

from __future__ import annotations

from pathlib import Path

from llmfleet.bundle import contents as bc
from llmfleet.errors import UsageError
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


def problems(bundle: bc.Bundle, bundle_dir: str | Path) -> list[bc.Problem]:
    root = Path(bundle_dir)
    found = bc.structure_problems(bundle)
    sized: list[bc.FileEntry] = []
    for entry in bundle.files:
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


def lock_sha256(path: str | Path) -> str:
    return file_sha256(Path(path))
