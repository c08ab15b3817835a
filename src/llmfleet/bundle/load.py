"""The host side of ``deploy --bundle``: put a bundle's images on a host's engine without a registry.

Per host, before the deploy: one round trip asks which image IDs the engine already has
(``present_script``); each missing archive is sent to ``<root>/bundle/`` (the resumable sender of
``llmfleet.models.transfer``) and ``docker load``-ed; then every image gets its local tag and its
image ID is read back and compared with the config digest the bundle recorded (``load_script``).
An image already there (same image ID) is not sent again. Scripts sit beside their parsers; the
golden files in tests/golden/scripts/ pin their text.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfleet.bundle import contents as bc
from llmfleet.errors import RemoteError

DOCKER = "docker"
LOAD_TIMEOUT = 1800.0  # seconds for one `docker load` (a vLLM image unpacks several GB)
q = shlex.quote


def staging_dir(root: str) -> str:
    return f"{root.rstrip('/')}/bundle"


def staged_path(root: str, image: bc.BundleImage) -> str:
    return f"{staging_dir(root)}/{Path(image.archive).name}"


def present_script(image_ids: list[str]) -> str:
    """One line per image ID: ``@@have ID`` when the engine holds an image with that ID, else ``@@missing ID``."""
    lines = [f"if {DOCKER} image inspect {q(i)} >/dev/null 2>&1; then echo {q('@@have ' + i)}; "
             f"else echo {q('@@missing ' + i)}; fi" for i in image_ids]
    return "\n".join(lines or ["true"])


def parse_present(stdout: str) -> set[str]:
    return {ln.split(" ", 1)[1].strip() for ln in stdout.splitlines() if ln.startswith("@@have ")}


def load_script(archive: str | None, image_id: str, tag: str) -> str:
    """``docker load`` the archive (when given; removed after), name the image by ``tag``, print the
    image ID now under that tag (``@@id``); a tag that does not name ``image_id`` is removed again
    (exit 7), so a wrong image is never left under the name compose runs."""
    fmt = "{{.Id}}"
    lines = []
    if archive is not None:
        lines += [
            f"if ! {DOCKER} load --input {q(archive)} >/dev/null; then rm -f {q(archive)}; exit 5; fi",
            f"rm -f {q(archive)}",
            "echo '@@loaded'",
        ]
    lines += [
        f"{DOCKER} tag {q(image_id)} {q(tag)} || exit 6",
        f"id=$({DOCKER} image inspect --format {q(fmt)} {q(tag)} 2>/dev/null || true)",
        'echo "@@id $id"',
        f"if [ \"$id\" != {q(image_id)} ]; then {DOCKER} image rm {q(tag)} >/dev/null 2>&1; exit 7; fi",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class LoadAnswer:
    loaded: bool  # docker load ran and succeeded
    image_id: str | None  # what the engine has under the tag afterwards

    def ok(self, want: str) -> bool:
        return self.image_id == want


def parse_load(stdout: str) -> LoadAnswer:
    lines = stdout.splitlines()
    got = next((ln.split(" ", 1)[1].strip() for ln in lines if ln.startswith("@@id ")), None)
    return LoadAnswer(loaded="@@loaded" in lines, image_id=got or None)


# ---------------------------------------------------------------------------------------------
# The shell: one host

Send = Callable[[Any, Path, str], Any]  # (remote, local file, remote path): the file arrives intact or raises
Log = Callable[[str], None]


@dataclass(frozen=True)
class Loaded:
    key: str
    image_id: str
    tag: str
    sent: bool  # the archive went over SSH (the engine did not have the image)


def load_images(remote: Any, root: str, bundle_dir: Path, wanted: list[bc.BundleImage], *, send: Send,
                log: Log) -> list[Loaded]:
    """Every image of ``wanted`` on the host's engine under its local tag with its bundle's image ID.
    Raises ``RemoteError`` naming the image on the first failure (images loaded before stay: they
    are content-addressed and change nothing that runs)."""
    ids = sorted({i.image_id for i in wanted})
    res = remote.run(present_script(ids), sudo=True, timeout=60)
    if res.rc != 0:
        raise RemoteError(f"host {remote.name}: cannot ask the engine for its images: "
                          f"{(res.stderr or res.stdout).strip()[:300]}")
    have = parse_present(res.stdout)
    out = []
    for image in wanted:
        archive = None
        if image.image_id not in have:
            archive = staged_path(root, image)
            remote.run(f"mkdir -p {q(staging_dir(root))}", sudo=True, timeout=30, check=True)
            log(f"{image.key}: sending {image.archive} ({image.size / 1e6:.1f} MB)")
            send(remote, bundle_dir / image.archive, archive)
        res = remote.run(load_script(archive, image.image_id, image.tag), sudo=True, timeout=LOAD_TIMEOUT)
        answer = parse_load(res.stdout)
        if res.rc != 0 or not answer.ok(image.image_id):
            why = (f"the engine holds image ID {answer.image_id} under {image.tag}, not {image.image_id}"
                   if answer.image_id else (res.stderr or res.stdout).strip()[:300] or f"exit {res.rc}")
            raise RemoteError(f"host {remote.name}: {image.key}: loading {image.archive} failed: {why}; "
                              "nothing was switched")
        have.add(image.image_id)
        log(f"{image.key}: {'loaded from the bundle' if archive else 'already on the host'}, image ID "
            f"{image.image_id[:19]} verified, tagged {image.tag}")
        out.append(Loaded(image.key, image.image_id, image.tag, archive is not None))
    return out
