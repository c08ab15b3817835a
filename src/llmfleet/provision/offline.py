"""Packages for an air-gapped site: an offline apt repository carried in a bundle (pure).

``bundle.create --packages-from HOST`` asks a connected *staging* host, installed like the air-gapped
ones (same distribution release, architecture and base packages) and not yet provisioned, to download
what provisioning would install on it (``download_script``: the host's own apt sources plus the
inventory's ``llmfleet_apt_sources``, the driver's pin, the host's own dpkg status, all in a work folder:
nothing on the staging host changes) and to index it (a flat ``Packages`` file from ``dpkg-deb -f``,
with each file's size and sha256). The folder comes back as one tar archive, listed in the bundle's
manifest with its sha256.

``provision --bundle DIR`` then sends that archive to each host whose distribution and architecture it
was built for (the resumable sender; checked against its sha256 on the host), unpacks it into
``<root>/packages/<sha256[:12]>/`` (``unpack_script``) and runs every apt command of the run against
that folder alone (``apt_options``: its own source list, no other source, no list cleaned). The
source is marked trusted: the archive's integrity is its sha256 from the verified bundle, checked on
the host before it is unpacked; apt then checks each package against the index's SHA256.
"""

from __future__ import annotations

import base64
import posixpath
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmfleet.errors import UsageError

q = shlex.quote
LIST_NAME = "llmfleet-bundle.list"
NO_PARTS = "sources.list.d"  # an empty folder beside the list: no other source is read
WORK_PREFIX = "/var/tmp/llmfleet-packages-"
OFFLINE_WHAT = "offline-repo"


@dataclass(frozen=True)
class OfflineRepo:
    """One offline repository of a bundle: what it was built for, its archive here, its hash and size."""

    distro: str  # os-release ID (debian, ubuntu)
    version: str  # os-release VERSION_ID (12, 24.04)
    arch: str  # dpkg architecture (amd64)
    archive: Path
    sha256: str  # sha256:<hex>
    size: int
    packages: tuple[str, ...] = ()  # name=version of each .deb it carries

    @property
    def label(self) -> str:
        return f"{self.distro} {self.version} {self.arch}"


def repo_dir(root: str, sha256: str) -> str:
    """Where a bundle's repository is unpacked on a host: named by its archive's hash."""
    return f"{root.rstrip('/')}/packages/{sha256.split(':', 1)[-1][:12]}"


def staged_archive(root: str, sha256: str) -> str:
    """Where the archive is received first (resumable, as the bundle's image archives)."""
    return f"{root.rstrip('/')}/bundle/{sha256.split(':', 1)[-1]}.tar.part"


def apt_options(directory: str) -> str:
    """apt-get options that read the offline repository at ``directory`` and no other source."""
    return (f"-o Dir::Etc::SourceList={q(directory + '/' + LIST_NAME)} "
            f"-o Dir::Etc::SourceParts={q(directory + '/' + NO_PARTS)} -o APT::Get::List-Cleanup=0")


def list_line(directory: str) -> str:
    return f"deb [trusted=yes] file:{directory} ./\n"


def pick(repos: Sequence[OfflineRepo], host: str, distro: tuple[str, str], arch: str, bundle: str) -> OfflineRepo:
    """The repository built for the host's distribution and architecture, else a one-line refusal."""
    for r in repos:
        if (r.distro, r.version, r.arch) == (distro[0], distro[1], arch):
            return r
    have = ", ".join(r.label for r in repos) or "none"
    raise UsageError(f"host {host}: bundle {bundle} carries no packages for {distro[0]} {distro[1]} {arch} (it has: "
                     f"{have}); build it with `bundle.create --packages-from HOST` naming a connected host of that "
                     "release")


# ---------------------------------------------------------------------------------------------
# The host side of provision --bundle


def present_script(directory: str, staged: str) -> str:
    """``@@repo`` when the repository is unpacked at ``directory``; ``@@staged SIZE`` for a partial copy."""
    return (f"if [ -s {q(directory + '/Packages.ok')} ]; then echo @@repo; fi\n"
            f"if n=$(stat -c %s -- {q(staged)} 2>/dev/null); then echo \"@@staged $n\"; fi\ntrue")


def parse_present(stdout: str) -> tuple[bool, int]:
    have, staged = False, 0
    for ln in stdout.splitlines():
        if ln.strip() == "@@repo":
            have = True
        elif ln.startswith("@@staged ") and ln.split()[1].isdigit():
            staged = int(ln.split()[1])
    return have, staged


def unpack_script(staged: str, sha256: str, directory: str) -> str:
    """Check the received archive's sha256 (a damaged one is removed: ``@@corrupt``), unpack it into
    ``directory`` (a fresh folder beside it first, then moved in place), write its source list, then
    mark it complete (``Packages.ok``); prints ``@@unpacked N`` (the .deb files it holds)."""
    hexd = sha256.split(":", 1)[-1]
    tmp = directory + ".new"
    return "\n".join([
        "set -e", "umask 022",
        f"got=$(sha256sum -- {q(staged)} | cut -d' ' -f1)",
        f"if [ \"$got\" != {q(hexd)} ]; then rm -f -- {q(staged)}; echo @@corrupt; exit 3; fi",
        f"rm -rf -- {q(tmp)} {q(directory)}",
        f"mkdir -p -- {q(tmp + '/' + NO_PARTS)}",
        f"tar -x --no-same-owner -f {q(staged)} -C {q(tmp)}",
        f"printf '%s' {q(base64.b64encode(list_line(directory).encode()).decode())} | base64 -d > "
        f"{q(tmp + '/' + LIST_NAME)}",
        f"chmod -R go-w,a+rX -- {q(tmp)}",
        f"mv -- {q(tmp)} {q(directory)}",
        f"echo {q(sha256)} > {q(directory + '/Packages.ok')}",
        f"rm -f -- {q(staged)}",
        f"echo \"@@unpacked $(ls -- {q(directory)} | grep -c '[.]deb$' || true)\"",
    ])


def parse_unpacked(stdout: str) -> int | None:
    """The number of packages ``unpack_script`` unpacked; -1 for a damaged archive; None without an answer."""
    for ln in stdout.splitlines():
        if ln.strip() == "@@corrupt":
            return -1
        if ln.startswith("@@unpacked ") and ln.split()[1].isdigit():
            return int(ln.split()[1])
    return None


# ---------------------------------------------------------------------------------------------
# The staging host's side of bundle.create --packages-from


@dataclass(frozen=True)
class DownloadGroup:
    """Package specs downloaded together under one driver pin (hosts whose driver choice agrees)."""

    specs: tuple[str, ...]
    pin: str | None
    hosts: tuple[str, ...]


def download_groups(wanted: Sequence[tuple[str, Sequence[str], str | None]]) -> list[DownloadGroup]:
    """(host, its package specs, its driver pin text) per target host -> one group per distinct pin,
    the specs of its hosts merged in order."""
    groups: dict[str | None, tuple[list[str], list[str]]] = {}
    for host, specs, pin in wanted:
        got, hosts = groups.setdefault(pin, ([], []))
        got += [s for s in specs if s not in got]
        hosts.append(host)
    return [DownloadGroup(tuple(specs), pin, tuple(hosts)) for pin, (specs, hosts) in groups.items()]


def _write(path: str, content: str) -> str:
    return f"printf '%s' {q(base64.b64encode(content.encode()).decode())} | base64 -d > {q(path)}"


def download_script(work: str, groups: Sequence[DownloadGroup], sources: Sequence[tuple[str, str]]) -> str:
    """Download each group's specs (``name`` or ``name=version``, under its driver pin) and what they
    need beyond the staging host's installed packages into ``work/repo`` and index it (``Packages``);
    one ``@@deb NAME VERSION FILE`` line per package. ``sources``: (file name in the work folder, text)
    of the inventory's sources and their keys (``staging_sources``). Changes nothing on the host outside
    ``work``: apt reads copies of its status and sources there and writes its lists and cache there."""
    if not work.startswith(WORK_PREFIX) or "/" in work[len(WORK_PREFIX):]:
        raise ValueError(f"work folder {work!r} is not under {WORK_PREFIX}")
    dirs = (("Dir::State::status", "status"), ("Dir::State::Lists", "lists"), ("Dir::Cache", "cache"),
            ("Dir::Cache::archives", "archives"), ("Dir::Etc::SourceList", "sources.list"),
            ("Dir::Etc::SourceParts", "parts"), ("Dir::Etc::Preferences", "preferences"))
    opts = " ".join(f"-o {k}={q(work + '/' + v)}" for k, v in dirs)
    opts += " -o Debug::NoLocking=1 -o APT::Install-Recommends=0 -o APT::Sandbox::User=root"
    lines = [
        "set -e", "export DEBIAN_FRONTEND=noninteractive", "umask 022", f"w={q(work)}",
        'rm -rf -- "$w"', 'mkdir -p -- "$w"', 'cd "$w"',
        "mkdir -p lists/partial archives/partial cache parts keys repo",
        "cp /var/lib/dpkg/status status",
        "if [ -f /etc/apt/sources.list ]; then cp /etc/apt/sources.list sources.list; else : > sources.list; fi",
        "for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do "
        'if [ -e "$f" ]; then cp -- "$f" parts/; fi; done',
        ": > preferences",
    ]
    for name, text in sources:
        lines.append(_write(f"{work}/{name}", text))
    lines.append(f"if ! apt-get -q {opts} update > log 2>&1; then echo '@@failed update'; tail -n 8 log; exit 3; fi")
    for i, g in enumerate(groups):
        prefs = f"{work}/prefs-{i}"
        lines.append(f"mkdir -p {q(prefs)}")
        if g.pin:
            lines.append(_write(f"{prefs}/90-llmfleet-nvidia-driver", g.pin))
        lines.append(f"if ! apt-get -q -y {opts} -o Dir::Etc::PreferencesParts={q(prefs)} --download-only install "
                     f"{' '.join(q(s) for s in g.specs)} > log 2>&1; then echo '@@failed download'; tail -n 8 log; "
                     "exit 3; fi")
    lines += [
        'for f in archives/*.deb; do if [ -e "$f" ]; then mv -- "$f" repo/; fi; done',
        "cd repo",
        ": > Packages",
        'for f in *.deb; do [ -e "$f" ] || continue; dpkg-deb -f "$f" >> Packages; '
        'printf "Filename: %s\\nSize: %s\\nSHA256: %s\\n\\n" "$f" "$(stat -c %s -- "$f")" '
        '"$(sha256sum -- "$f" | cut -d" " -f1)" >> Packages; '
        'echo "@@deb $(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version) $f"; done',
    ]
    return "\n".join(lines)


def parse_download(stdout: str) -> tuple[list[tuple[str, str, str]], str | None]:
    """(name, version, file) per downloaded package; the failure (which apt call, its last lines) or None."""
    debs: list[tuple[str, str, str]] = []
    failed: str | None = None
    rest: list[str] = []
    for ln in stdout.splitlines():
        parts = ln.split(" ", 3)
        if parts[0] == "@@deb" and len(parts) == 4:
            debs.append((parts[1], parts[2], parts[3]))
        elif parts[0] == "@@failed":
            failed = " ".join(parts[1:])
        elif failed is not None and ln.strip():
            rest.append(ln.strip())
    if failed is not None:
        shown = [ln for ln in rest if not ln.startswith(("Reading ", "Building ", "Get:", "Hit:", "Ign:"))]
        failed = f"apt-get {failed} failed: " + (" | ".join(shown[-4:]) or "no output")
    return debs, failed


def archive_command(work: str) -> str:
    """The repository folder as a tar stream on stdout; the work folder removed after."""
    if not work.startswith(WORK_PREFIX):
        raise ValueError(f"work folder {work!r} is not under {WORK_PREFIX}")
    return f"tar -C {q(work + '/repo')} -cf - . && rm -rf -- {q(work)}"


def cleanup_command(work: str) -> str:
    if not work.startswith(WORK_PREFIX):
        raise ValueError(f"work folder {work!r} is not under {WORK_PREFIX}")
    return f"rm -rf -- {q(work)}"


def staging_sources(files: Sequence[tuple[str, str]], work: str, keyring_dir: str) -> list[tuple[str, str]]:
    """The inventory's source files (host path, text) moved into the work folder: keys under ``keys/``,
    sources under ``parts/`` with their ``Signed-By`` pointing at the moved keys."""
    out: list[tuple[str, str]] = []
    for path, text in files:
        name = posixpath.basename(path)
        if path.startswith(keyring_dir + "/"):
            out.append((f"keys/{name}", text))
        elif path.endswith((".sources", ".list")):
            out.append((f"parts/{name}", text.replace(f"{keyring_dir}/", f"{work}/keys/")))
    return out


def refuse_provisioned(host: str, installed: dict[str, str]) -> None:
    """A staging host that already has some of the packages would leave their dependencies out of the
    bundle: refused in one line."""
    if installed:
        shown = ", ".join(f"{n} {v}" for n, v in sorted(installed.items())[:4])
        raise UsageError(f"--packages-from {host}: the host already has {shown}{' ...' if len(installed) > 4 else ''}; "
                         "name a connected host installed like the air-gapped ones and not yet provisioned (the "
                         "bundle carries what provisioning installs beyond that host's own packages)")
