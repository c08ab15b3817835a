"""The lab package repository: what bare lab hosts install from, served inside the lab network.

``http://lab-apt/packages bookworm main non-free non-free-firmware``, signed with a key made at ``invoke lab.setup``
(``/usr/share/keyrings/llmfleet-lab.gpg`` on bare hosts, ``Signed-By`` in their only apt source). It holds:

- Debian's real packages for Docker (``docker.io``), compose v2 (``docker-compose`` from trixie, pinned
  as in dockerfiles/lab-host) and ``nftables`` (``llmfleet_firewall``) with their dependency closure over a minimal Debian: fetched once with
  ``apt-get install --download-only`` in a throwaway container of the lab's debootstrap base, from this
  machine's own Debian mirror (its apt configuration; the repository names none), as an offline site would;
- the NVIDIA SIMULATOR stand-ins of ``llmfleet.lab.standin_debs`` (several driver branches, two container
  toolkit versions, nvidia-ctk), built with dpkg-deb.

One shared server for every lab on this machine (container ``llmfleet-aptrepo``, Python's http.server
in the bare host image, ``--restart unless-stopped``), joined to each lab network under the alias
``lab-apt``, like the registry. Everything is cached under the lab build cache (``aptrepo/``): a second
``lab.setup`` downloads and builds nothing.

Pure: ``parse_control``, ``packages_stanza``, ``packages_index``, ``release_text``, ``host_sources``.
"""

from __future__ import annotations

import base64
import filecmp
import gzip
import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmfleet.errors import CheckFailed
from llmfleet.lab import docker, standin_debs
from llmfleet.lab.paths import BASE_IMAGE, cache_dir
from llmfleet.lab.paths import locked as _locked

ALIAS = "lab-apt"
URL = f"http://{ALIAS}/packages"
SUITE = "bookworm"
# As Debian files them (catalog/provisioning.yaml: debian-12 components): Debian's packages in main, the
# NVIDIA stand-ins in non-free (where Debian's nvidia-driver is), non-free-firmware empty.
COMPONENTS = ("main", "non-free", "non-free-firmware")
ARCHS = ("amd64",)
KEYRING_PATH = "/usr/share/keyrings/llmfleet-lab.gpg"  # on bare hosts
KEYRING_NAME = "llmfleet-lab.gpg"  # also served at URL/llmfleet-lab.gpg
SOURCES_PATH = "/etc/apt/sources.list.d/llmfleet-lab.sources"  # on bare hosts
CONTAINER = "llmfleet-aptrepo"
LABEL = "org.llmfleet.lab.aptrepo"
KEY_UID = "llmfleet lab repository (SIMULATOR signing key) <lab-apt@llmfleet.invalid>"
# What the repository carries of Debian (package[/release] as apt-get install takes it).
DEBIAN_PACKAGES = ("docker.io", "docker-compose/trixie", "nftables")
DOCKERFILES = Path(__file__).resolve().parents[3] / "dockerfiles"

Log = Callable[[str], None]


@dataclass
class RepoReport:
    url: str
    fingerprint: str
    debian: list[str]
    standins: int
    fetched: bool
    seconds: float


# -- pure ------------------------------------------------------------------------------------------


def parse_control(text: str) -> list[tuple[str, str]]:
    """Fields of a control stanza in order (continuation lines kept with their field). Never raises."""
    fields: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        if line[:1] in (" ", "\t") and fields:
            k, v = fields[-1]
            fields[-1] = (k, v + "\n" + line)
        elif ":" in line:
            k, _, v = line.partition(":")
            fields.append((k.strip(), v.strip()))
    return fields


def packages_stanza(control: str, filename: str, size: int, md5: str, sha256: str) -> str:
    """One stanza of a Packages index: the package's control fields with where to fetch it and its
    hashes, inserted before Description (as dpkg-scanpackages writes them)."""
    fields = [(k, v) for k, v in parse_control(control) if k not in ("Filename", "Size", "MD5sum", "SHA256")]
    where = [("Filename", filename), ("Size", str(size)), ("MD5sum", md5), ("SHA256", sha256)]
    idx = next((i for i, (k, _) in enumerate(fields) if k == "Description"), len(fields))
    fields[idx:idx] = where
    return "".join(f"{k}: {v}\n" for k, v in fields)


def pool_name(control: str) -> str:
    """A package's file name in the pool, as Debian names it: ``name_version_arch.deb`` without the
    epoch (apt's own cache writes it as ``%3a``, which a web server would decode)."""
    f = dict(parse_control(control))
    version = f.get("Version", "0").split(":", 1)[-1]
    return f"{f.get('Package', 'unknown')}_{version}_{f.get('Architecture', 'all')}.deb"


def _field(stanza: str, name: str) -> str:
    return next((v for k, v in parse_control(stanza) if k == name), "")


def packages_index(stanzas: list[str]) -> str:
    """A Packages file: stanzas sorted by package name then file, separated by blank lines."""
    ordered = sorted(stanzas, key=lambda s: (_field(s, "Package"), _field(s, "Filename")))
    return "\n".join(ordered)


def release_text(files: dict[str, bytes], *, date: float, suite: str = SUITE,
                 components: tuple[str, ...] = COMPONENTS, archs: tuple[str, ...] = ARCHS) -> str:
    """The suite's Release file over its index files (path relative to dists/<suite>/ -> content)."""
    stamp = time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime(date))
    head = [("Origin", "llmfleet-lab"), ("Label", "llmfleet-lab"), ("Suite", suite), ("Codename", suite),
            ("Date", stamp), ("Architectures", " ".join(archs)), ("Components", " ".join(components)),
            ("Description", "llmfleet lab repository: Debian packages and NVIDIA SIMULATOR stand-ins")]
    out = [f"{k}: {v}" for k, v in head]
    for title, algo in (("MD5Sum", hashlib.md5), ("SHA256", hashlib.sha256)):
        out.append(f"{title}:")
        for path in sorted(files):
            data = files[path]
            out.append(f" {algo(data).hexdigest()} {len(data):>8} {path}")
    return "\n".join(out) + "\n"


def host_sources(url: str = URL, suite: str = SUITE, components: tuple[str, ...] = COMPONENTS,
                 keyring: str = KEYRING_PATH) -> str:
    """The deb822 apt source a bare host has (dockerfiles/lab-bare/llmfleet-lab.sources says the same)."""
    return f"Types: deb\nURIs: {url}\nSuites: {suite}\nComponents: {' '.join(components)}\nSigned-By: {keyring}\n"


def fetch_script(packages: tuple[str, ...]) -> str:
    """What the throwaway base container runs: apt with the trixie pin, download only, into /out."""
    import shlex

    return ("set -e; cp /stage/trixie.sources /etc/apt/sources.list.d/; "
            "cp /stage/trixie-compose.pref /etc/apt/preferences.d/; mkdir -p /out/partial; "
            "apt-get update -qq; "
            "apt-get install -y -qq --download-only --no-install-recommends -o Dir::Cache::archives=/out "
            + " ".join(shlex.quote(p) for p in packages)
            + "; rm -rf /out/partial /out/lock")


# -- I/O -------------------------------------------------------------------------------------------


def root_dir() -> Path:
    return cache_dir() / "aptrepo"


def www_dir() -> Path:
    return root_dir() / "www"


def repo_dir() -> Path:
    return www_dir() / "packages"


def _gpg(home: Path, *args: str, input: bytes | None = None) -> bytes:
    proc = subprocess.run(["gpg", "--batch", "--quiet", "--homedir", str(home), *args], capture_output=True,
                          timeout=120, input=input)
    if proc.returncode != 0:
        raise CheckFailed(f"gpg {' '.join(args[:2])}: {proc.stderr.decode(errors='replace').strip()[-300:]}")
    return proc.stdout


def _fingerprint(home: Path) -> str | None:
    proc = subprocess.run(["gpg", "--batch", "--homedir", str(home), "--with-colons", "--list-secret-keys"],
                          capture_output=True, timeout=60)
    for line in proc.stdout.decode(errors="replace").splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    return None


def ensure_signing_key() -> str:
    """The repository's signing key (made once, kept 0700 in the build cache); returns its fingerprint."""
    if not shutil.which("gpg"):
        raise CheckFailed("gpg not found: the lab repository is signed with gpg (apt-get install -y gnupg)")
    home = root_dir() / "gnupg"
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    fpr = _fingerprint(home)
    if not fpr:
        _gpg(home, "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519",
             "sign", "never")
        fpr = _fingerprint(home)
    if not fpr:
        raise CheckFailed(f"gpg made no key in {home}")
    return fpr


def public_keyring() -> bytes:
    """The binary public keyring hosts verify the repository with (setup must have run)."""
    path = repo_dir() / KEYRING_NAME
    if not path.exists():
        raise CheckFailed("the lab package repository is not set up: run `invoke lab.setup`")
    return path.read_bytes()


def public_keyring_b64() -> str:
    return base64.b64encode(public_keyring()).decode()


def fetch_debian(log: Log = lambda m: None) -> tuple[Path, bool]:
    """Debian's packages for ``DEBIAN_PACKAGES`` and their closure over the base image, downloaded once
    from this machine's mirror; returns (folder of .deb files, fetched now)."""
    from llmfleet.lab.images import debian_mirror, fill_mirror

    stage = {"trixie.sources": fill_mirror((DOCKERFILES / "lab-host" / "trixie.sources").read_text(), debian_mirror()),
             "trixie-compose.pref": (DOCKERFILES / "lab-host" / "trixie-compose.pref").read_text()}
    key = hashlib.sha256(json.dumps([DEBIAN_PACKAGES, stage, docker.image_id(BASE_IMAGE)]).encode()).hexdigest()[:16]
    out = root_dir() / "debian" / key
    if (out / ".complete").exists():
        return out, False
    shutil.rmtree(out, ignore_errors=True)
    (out / "stage").mkdir(parents=True)
    for name, text in stage.items():
        (out / "stage" / name).write_text(text)
    log(f"apt repository: downloading {', '.join(DEBIAN_PACKAGES)} and their dependencies (Debian, this machine's mirror)")
    debs = out / "debs"
    debs.mkdir()
    proc = docker.run(["run", "--rm", "-v", f"{out / 'stage'}:/stage:ro", "-v", f"{debs}:/out", BASE_IMAGE,
                       "sh", "-c", fetch_script(DEBIAN_PACKAGES)], timeout=900, check=False)
    if proc.returncode != 0 or not list(debs.glob("*.deb")):
        err = proc.stderr.decode(errors="replace").strip()[-400:]
        raise CheckFailed(f"apt repository: downloading Debian packages failed: {err}")
    (out / ".complete").write_text("1\n")
    return out, True


def build_standins(log: Log = lambda m: None) -> tuple[Path, int]:
    """Build the stand-in packages once per content; returns (folder, count)."""
    here = Path(__file__).resolve().parent
    debs = standin_debs.all_standins(smi_source=(here / "nvidia_smi_sim.py").read_text(),
                                     ctk_source=(here / "nvidia_ctk_sim.py").read_text(),
                                     kernel_release=platform.release())
    out = root_dir() / "standin" / standin_debs.standins_hash(debs)
    if not (out / ".complete").exists():
        log(f"apt repository: building {len(debs)} NVIDIA SIMULATOR stand-in packages (dpkg-deb)")
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for d in debs:
            standin_debs.build_deb(d, out)
        (out / ".complete").write_text("1\n")
    return out, len(debs)


def _deb_control(path: Path) -> str:
    proc = subprocess.run(["dpkg-deb", "-f", str(path)], capture_output=True, timeout=60)
    if proc.returncode != 0:
        raise CheckFailed(f"dpkg-deb -f {path.name}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode(errors="replace")


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def publish(sources: dict[str, list[Path]], fingerprint: str) -> int:
    """Copy every .deb of ``sources`` (component -> folders) into the pool, write the indexes (an
    empty one for each of ``COMPONENTS`` without packages) and sign them; returns the number of
    packages. Unchanged content leaves the published files as they are."""
    repo = repo_dir()
    indexes: dict[str, bytes] = {}
    count = 0
    for component in COMPONENTS:
        pool = repo / "pool" / component
        pool.mkdir(parents=True, exist_ok=True)
        stanzas = []
        names: set[str] = set()
        for folder in sources.get(component, []):
            for deb in sorted(folder.glob("*.deb")):
                control = _deb_control(deb)
                name = pool_name(control)
                dst = pool / name
                if not dst.exists() or not filecmp.cmp(deb, dst, shallow=False):
                    shutil.copy2(deb, dst)
                names.add(name)
                data = dst.read_bytes()
                stanzas.append(packages_stanza(control, f"pool/{component}/{name}", len(data),
                                               hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()))
        for stale in pool.glob("*.deb"):  # packages no longer carried (a changed stand-in set)
            if stale.name not in names:
                stale.unlink()
        rel = f"{component}/binary-{ARCHS[0]}/Packages"
        indexes[rel] = packages_index(stanzas).encode()
        indexes[rel + ".gz"] = gzip.compress(indexes[rel], mtime=0)
        count += len(stanzas)
    dists = repo / "dists" / SUITE
    if (dists / "InRelease").exists() and all((dists / r).exists() and (dists / r).read_bytes() == data
                                              for r, data in indexes.items() if not r.endswith(".gz")):
        return count
    home = root_dir() / "gnupg"
    release = release_text(indexes, date=time.time()).encode()
    for rel, data in indexes.items():
        _write_atomic(dists / rel, data)
    _write_atomic(dists / "Release", release)
    _write_atomic(dists / "Release.gpg", _gpg(home, "--local-user", fingerprint, "--armor", "--detach-sign",
                                              "--output", "-", input=release))
    _write_atomic(dists / "InRelease", _gpg(home, "--local-user", fingerprint, "--clearsign", "--output", "-",
                                            input=release))
    _write_atomic(repo / KEYRING_NAME, _gpg(home, "--export", fingerprint))
    return count


def ensure_server(log: Log = lambda m: None) -> None:
    """Start the shared repository server if needed (the bare host image's python3, http.server)."""
    from llmfleet.lab.images import lab_image

    with _locked(cache_dir() / ".aptrepo-server.lock"):
        info = docker.inspect("container", CONTAINER)
        if info and not info["State"]["Running"]:
            docker.run(["start", CONTAINER])
        elif not info:
            log(f"starting the lab package repository {CONTAINER} ({URL} on lab networks)")
            docker.run(["run", "-d", "--name", CONTAINER, "--restart", "unless-stopped", "--label", f"{LABEL}=1",
                        "--mount", f"type=bind,src={www_dir()},dst=/srv/apt,readonly",
                        "--entrypoint", "python3", lab_image("bare"), "-m", "http.server", "80",
                        "--directory", "/srv/apt"])


def connect(lab: str) -> None:
    """Make the repository reachable as ``lab-apt`` on a lab network."""
    info = docker.inspect("container", CONTAINER) or {}
    nets = (info.get("NetworkSettings") or {}).get("Networks") or {}
    if lab not in nets:
        docker.run(["network", "connect", "--alias", ALIAS, lab, CONTAINER])


def setup(log: Log = lambda m: None) -> RepoReport:
    """Build (or find cached) and serve the lab package repository."""
    t0 = time.monotonic()
    with _locked(cache_dir() / ".aptrepo.lock"):
        fpr = ensure_signing_key()
        debian, fetched = fetch_debian(log)
        standin, count = build_standins(log)
        publish({"main": [debian / "debs"], "non-free": [standin]}, fpr)
        subprocess.run(["gpgconf", "--homedir", str(root_dir() / "gnupg"), "--kill", "gpg-agent"],
                       capture_output=True, timeout=30, check=False)
    ensure_server(log)
    names = sorted(p.name for p in (debian / "debs").glob("*.deb"))
    return RepoReport(url=URL, fingerprint=fpr, debian=names, standins=count, fetched=fetched,
                      seconds=round(time.monotonic() - t0, 1))
