"""The shell of ``bundle.create --packages-from HOST``: a connected staging host downloads the packages
provisioning would install on the chosen hosts; they come back as one offline repository archive.

Two round trips and a stream: the staging host's facts (its distribution, architecture, installed
packages), the download and index in a work folder (``offline.download_script``), the folder as a tar
stream on stdout into the bundle (hashed on the way), the work folder removed. Nothing on the staging
host changes outside that folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmfleet.errors import LlmfleetError, RemoteError, UsageError
from llmfleet.host import ssh
from llmfleet.inventory.services import HostSettings
from llmfleet.provision import desired as D
from llmfleet.provision import facts as F
from llmfleet.provision import offline as OFF

Log = Callable[[str], None]
DOWNLOAD_TIMEOUT_S = 3600.0
STREAM_STALL_S = 120.0


@dataclass(frozen=True)
class Fetched:
    distro: str
    version: str
    arch: str
    path: Path
    sha256: str
    size: int
    packages: tuple[str, ...]
    source: str


def wanted(targets: Sequence[tuple[str, HostSettings, Sequence[D.ManagedFile]]], facts: F.ProvisionFacts,
           user: str) -> list[tuple[str, list[str], str | None]]:
    """(host, package specs, driver pin text) per target host, as provisioning would choose them on a
    host with the staging host's distribution, architecture and kernel and the target's own card
    (``llmfleet_gpu``: the air-gapped host is not reached)."""
    blank = dataclasses.replace(facts, gpus=[], smi="absent", driver_running=None)
    out: list[tuple[str, list[str], str | None]] = []
    for name, hs, files in targets:
        want = D.desired_state(name, hs, blank, user=user, extra_files=files)
        pin = next((f.content for f in want.files if f.path == D.DRIVER_PIN_FILE), None)
        out.append((name, [p.spec for p in want.packages], pin))
    return out


def fetch(remote: ssh.Link, staging: str, staging_settings: HostSettings,
          targets: Sequence[tuple[str, HostSettings, Sequence[D.ManagedFile]]], dest_dir: Path, *, log: Log,
          mark: Callable[[], str] = F.new_mark) -> Fetched:
    """The offline repository for ``targets`` written to ``dest_dir/<distro>-<version>-<arch>.tar``."""
    user = str(getattr(remote, "user", None) or "root")
    m = mark()
    res = remote.run(F.facts_script(m, D.facts_query(staging_settings, user)), sudo=True, timeout=120)
    facts = F.parse_facts(res.stdout, m, rc=res.rc, stderr=res.stderr)
    if not facts.complete:
        raise RemoteError(f"--packages-from {staging}: its facts came back cut short: {'; '.join(facts.errors)[:300]}")
    distro, version = facts.distro
    arch = facts.arch or "amd64"
    try:
        want = wanted(targets, facts, user)
    except UsageError as exc:
        raise UsageError(f"--packages-from {staging}: {exc}") from None
    installed = {name: v for _, specs, _ in want for spec in specs
                 if (v := facts.installed(name := spec.split("=", 1)[0])) is not None}
    OFF.refuse_provisioned(staging, installed)
    groups = OFF.download_groups(want)
    work = OFF.WORK_PREFIX + secrets.token_hex(6)
    sources = OFF.staging_sources([(f.path, f.content) for _, _, files in targets for f in files
                                   if f.step == "sources" and f.path != D.DRIVER_PIN_FILE], work, D.KEYRING_DIR)
    log(f"{staging} ({distro} {version} {arch}): downloading {sum(len(g.specs) for g in groups)} package(s) and "
        f"what they need beyond the host's own packages, for {', '.join(h for g in groups for h in g.hosts)}")
    t0 = time.monotonic()
    res = remote.run(OFF.download_script(work, groups, list(dict.fromkeys(sources))), sudo=True,
                     timeout=DOWNLOAD_TIMEOUT_S)
    debs, failed = OFF.parse_download(res.stdout)
    if failed or res.rc != 0:
        _cleanup(remote, work)
        raise RemoteError(f"--packages-from {staging}: {failed or (res.stderr or res.stdout).strip()[-400:]}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    name = f"{distro}-{version}-{arch}"
    path = dest_dir / f"{name}.tar"
    sha, size = _stream(remote, staging, OFF.archive_command(work), path)
    log(f"{staging}: {len(debs)} package(s), {size / 1e6:.1f} MB, in {time.monotonic() - t0:.1f} s -> {path.name}")
    return Fetched(distro, version, arch, path, sha, size, tuple(f"{n}={v}" for n, v, _ in debs), staging)


def _cleanup(remote: ssh.Link, work: str) -> None:
    try:
        remote.run(OFF.cleanup_command(work), sudo=True, timeout=60)
    except LlmfleetError:
        pass


def _stream(remote: ssh.Link, staging: str, command: str, path: Path) -> tuple[str, int]:
    """The command's stdout into ``path`` (a ``.part`` first), hashed; raises ``RemoteError`` on a
    failure or a stream that stalls."""
    opener = getattr(remote, "open_command", None)
    if opener is None:
        raise RemoteError(f"--packages-from {staging}: the connection cannot stream")
    part = path.with_name(path.name + ".part")
    h, n = hashlib.sha256(), 0
    chan = opener(command, sudo=True)
    try:
        chan.settimeout(STREAM_STALL_S)
        with part.open("wb") as fh:
            while True:
                try:
                    chunk = chan.recv(1 << 20)
                except TimeoutError:
                    raise RemoteError(f"--packages-from {staging}: the archive stream stalled for "
                                      f"{STREAM_STALL_S:.0f} s at {n:,} bytes") from None
                if not chunk:
                    break
                h.update(chunk)
                n += len(chunk)
                fh.write(chunk)
        rc = chan.recv_exit_status()
        err = b""
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
    finally:
        chan.close()
    if rc != 0:
        part.unlink(missing_ok=True)
        raise RemoteError(f"--packages-from {staging}: the archive failed (exit {rc}): "
                          f"{err.decode(errors='replace').strip()[-300:]}")
    part.replace(path)
    return "sha256:" + h.hexdigest(), n
