"""The host side of ``deploy --bundle``: put a bundle's images on a host's engine without a registry.

Per host, before the deploy: one round trip asks which image IDs the engine already has
(``present_script``); each missing archive is sent to ``<root>/bundle/<sha256>.tar.part`` (the
resumable sender of ``llmfleet.host.transfer``; a copy cut short resumes), checked against its
sha256 on the host and ``docker load``-ed; then every image gets its local tag and its image ID is
read back and compared with the config digest the bundle recorded (``load_script``). An image
already there (same image ID) is not sent again. Scripts sit beside their parsers; the
golden files in tests/golden/scripts/ pin their text.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
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


def staged_path(root: str, archive_sha256: str) -> str:
    """Where an archive is received on the host: named by its own sha256, so a copy cut short is
    resumed only into the very same file."""
    return f"{staging_dir(root)}/{archive_sha256.split(':', 1)[1]}.tar.part"


def present_script(image_ids: Sequence[str], staged: Sequence[str] = ()) -> str:
    """One line per image ID: ``@@have ID`` when the engine holds an image with that ID, else
    ``@@missing ID``; one ``@@staged SIZE PATH`` per staging file already on the host (a resume point)."""
    lines = [f"if {DOCKER} image inspect {q(i)} >/dev/null 2>&1; then echo {q('@@have ' + i)}; "
             f"else echo {q('@@missing ' + i)}; fi" for i in image_ids]
    lines += [f"if n=$(stat -c %s -- {q(p)} 2>/dev/null); then echo \"@@staged $n \"{q(p)}; fi" for p in staged]
    return "\n".join(lines or ["true"])


def parse_present(stdout: str) -> set[str]:
    return {ln.split(" ", 1)[1].strip() for ln in stdout.splitlines() if ln.startswith("@@have ")}


def parse_staged(stdout: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for ln in stdout.splitlines():
        parts = ln.split(" ", 2)
        if len(parts) == 3 and parts[0] == "@@staged" and parts[1].isdigit():
            out[parts[2]] = int(parts[1])
    return out


def load_script(archive: str | None, image_id: str, tag: str, archive_sha256: str | None = None) -> str:
    """``docker load`` the archive (when given: first checked against its sha256 on the host, removed
    after), name the image by ``tag``, print the image ID now under that tag (``@@id``); a tag that
    does not name ``image_id`` is removed again (exit 7), so a wrong image is never left under the
    name compose runs. A damaged archive is removed unloaded (``@@corrupt``, exit 8)."""
    fmt = "{{.Id}}"
    lines = []
    if archive is not None:
        if archive_sha256 is not None:
            check = f"{archive_sha256.split(':', 1)[1]}  {archive}"
            lines.append(f"if ! printf '%s\\n' {q(check)} | sha256sum -c --status; then "
                         f"echo '@@corrupt'; rm -f {q(archive)}; exit 8; fi")
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

def locked(remote: Any, ph: Any, settings: Any, action: str, message: str, body: Callable[[], list[Loaded]], *,
           log: Log, make_run: Callable[..., Any] | None = None) -> list[Loaded]:
    """``body`` under the host's deploy lock (``release.executor.HostRun.lock``, the one lock path:
    refused at once naming the holder when another writer holds it, as the deploy this load belongs
    to would be; a stale lock of this machine taken over). Its audit line (``bundle.load``: loaded,
    failed or refused) and the unlock go in one last round trip."""
    from llmfleet.errors import LlmfleetError
    from llmfleet.release import store
    from llmfleet.release.decide import Refusal
    from llmfleet.release.executor import HostRun, now_utc

    run = (make_run or HostRun)(ph.host.name, ph.settings, remote, settings=settings, log=log, message=message)
    result, detail = "failed", ""
    try:
        run.lock(action)
        out = body()
        result, detail = "loaded", f"{message}: " + ", ".join(f"{x.key} {'sent' if x.sent else 'present'}"
                                                              for x in out)
        return out
    except Refusal as exc:
        result, detail = "refused", exc.reason
        raise
    except LlmfleetError as exc:
        detail = str(exc)
        raise
    finally:
        rec = store.audit_record(now=now_utc(), who=run.who, host=ph.host.name, action="bundle.load", service=None,
                                 release=None, digest=None, result=result, detail=detail)
        held = run.lock_token is not None
        try:
            remote.run(store.final_script(ph.settings.root, [], [*run.audit, rec], run.lock_token), sudo=True,
                       timeout=60)
        except LlmfleetError as exc:
            log(f"warning: the audit line and unlock did not complete: {exc}"
                + (f"; the next deploy from this machine takes the lock over, others need `invoke lock.release "
                   f"--host {ph.host.name} --yes`" if held else ""))
        finally:
            run.forget_lock()

Send = Callable[..., Any]  # (remote, local file, remote staging path, offset, size): arrives whole or raises
Log = Callable[[str], None]
SEND_ATTEMPTS = 3


def send_file(remote: Any, local: Path, dest: str, offset: int, size: int) -> Any:
    """One archive to a host through ``llmfleet.host.transfer.send_file`` (resumable from ``offset``)."""
    from llmfleet.host.transfer import send_file as send

    return send(remote, str(local), dest, offset=offset, size=size, sudo=True)


@dataclass(frozen=True)
class Loaded:
    key: str
    image_id: str
    tag: str
    sent: bool  # the archive went over SSH (the engine did not have the image)


def _send(remote: Any, local: Path, dest: str, size: int, offset: int, send: Send) -> None:
    """Send with resumes: after a cut, the host's staging size is read again and the copy goes on."""
    from llmfleet.host.transfer import TransferError

    for attempt in range(SEND_ATTEMPTS):
        try:
            send(remote, local, dest, offset if 0 <= offset <= size else 0, size)
            return
        except TransferError:
            if attempt == SEND_ATTEMPTS - 1:
                raise
            res = remote.run(present_script([], [dest]), sudo=True, timeout=30)
            offset = parse_staged(res.stdout).get(dest, 0)


def load_images(remote: Any, root: str, bundle_dir: Path, wanted: list[bc.BundleImage],
                files: dict[str, bc.FileEntry], *, send: Send, log: Log) -> list[Loaded]:
    """Every image of ``wanted`` on the host's engine under its local tag with its bundle's image ID.
    Raises ``RemoteError`` naming the image on the first failure (images loaded before stay: they
    are content-addressed and change nothing that runs)."""
    parts = {i.key: staged_path(root, files[i.archive].sha256) for i in wanted}
    res = remote.run(present_script(sorted({i.image_id for i in wanted}), sorted(set(parts.values()))), sudo=True,
                     timeout=60)
    if res.rc != 0:
        raise RemoteError(f"host {remote.name}: cannot ask the engine for its images: "
                          f"{(res.stderr or res.stdout).strip()[:300]}")
    have, staged = parse_present(res.stdout), parse_staged(res.stdout)
    out = []
    for image in wanted:
        archive, entry = None, files[image.archive]
        if image.image_id not in have:
            archive = parts[image.key]
            offset = staged.get(archive, 0)
            log(f"{image.key}: sending {image.archive} ({entry.size / 1e6:.1f} MB"
                + (f", resuming at {offset / 1e6:.1f} MB" if offset else "") + ")")
            _send(remote, bundle_dir / image.archive, archive, entry.size, offset, send)
        res = remote.run(load_script(archive, image.image_id, image.tag, entry.sha256 if archive else None),
                         sudo=True, timeout=LOAD_TIMEOUT)
        answer = parse_load(res.stdout)
        if res.rc != 0 or not answer.ok(image.image_id):
            why = ("the archive arrived damaged (its sha256 differs on the host); it was removed, run again"
                   if "@@corrupt" in res.stdout.splitlines() else
                   f"the engine holds image ID {answer.image_id} under {image.tag}, not {image.image_id}"
                   if answer.image_id else (res.stderr or res.stdout).strip()[:300] or f"exit {res.rc}")
            raise RemoteError(f"host {remote.name}: {image.key}: loading {image.archive} failed: {why}")
        have.add(image.image_id)
        log(f"{image.key}: {'loaded from the bundle' if archive else 'already on the host'}, image ID "
            f"{image.image_id[:19]} verified, tagged {image.tag}")
        out.append(Loaded(image.key, image.image_id, image.tag, archive is not None))
    return out


def load_hosts(prepared: list[Any], settings: Any, source: Any, *, forks: int, send: Send,
               log: Callable[[str], None], accept_new_host_keys: bool = False, task: str = "deploy") -> dict[str, str]:
    """``load_images`` on every prepared host (``release.prepare.PreparedHost``, its images localized
    from ``source``, a ``bundle.check.Verified``), ``forks`` at a time, each under the host's deploy
    lock (``locked``; ``task``: the deploy or upgrade it is part of, as the lock's holder says). Returns host -> why it failed, for the hosts whose images are not all in place
    (nothing was switched on them)."""
    from llmfleet.host import ssh
    from llmfleet.host.group import run_on_hosts

    def one(ph: Any) -> list[Loaded]:
        wanted = source.images_for([p.image for p in ph.services])
        if not wanted:
            return []
        name = ph.host.name
        with ssh.connect(ph.host, config=settings, accept_new_host_keys=accept_new_host_keys) as remote:
            return locked(remote, ph, settings, f"{task} --bundle", f"images from {source.dir}",
                          lambda: load_images(remote, ph.settings.root, source.dir, wanted,
                                              {f.path: f for f in source.bundle.files}, send=send,
                                              log=lambda m: log(f"{name}: {m}")),
                          log=lambda m: log(f"{name}: {m}"))

    failed: dict[str, str] = {}
    for r in run_on_hosts(one, prepared, forks=forks, thread_name="llmfleet-bundle"):
        if not r.ok:
            failed[r.host.host.name] = str(r.exception) if r.exception is not None else (r.error or "?")
    return failed
