"""Stand-in NVIDIA packages (SIMULATOR) for the lab package repository: real names and versions, lab payloads.

No reachable registry serves NVIDIA's driver or container toolkit for the lab, and a real driver builds a
kernel module that cannot load in a container. These Debian packages carry the real package names and
versions so that apt and dpkg (install, hold, upgrade, downgrade, remove) run for real; their payloads
drive the lab's simulators:

- driver, one set per version in ``DRIVERS``:
  ``nvidia-kernel-dkms`` ships the "kernel module": ``MODULE_PATH`` holding the driver version; the bare
  host's boot (dockerfiles/lab-bare/lab-entrypoint) "loads" it, so nvidia-smi reports a newly installed
  driver only after a reboot; its postinst notes ``/run/reboot-required`` as Debian's kernel packages do.
  ``nvidia-smi`` ships the nvidia-smi SIMULATOR (llmfleet/lab/nvidia_smi_sim.py). ``nvidia-driver``
  (Debian's name) and ``cuda-drivers-<branch>`` (NVIDIA's CUDA repository's name) are metapackages on both;
  ``nvidia-persistenced`` a stub daemon with its systemd unit. Tesla 470 uses Debian's
  ``nvidia-tesla-470-{driver,kernel-dkms,smi}`` names.
- container toolkit, per ``TOOLKIT_VERSIONS`` (revision ``-1``): ``nvidia-container-toolkit`` (the runtime
  hook STUB: on PATH when dockerd starts, dockerd registers the ``nvidia`` device driver),
  ``nvidia-container-toolkit-base`` (the nvidia-ctk SIMULATOR and the ``nvidia-container-runtime`` STUB, which
  hands everything to runc), ``libnvidia-container-tools`` and ``libnvidia-container1`` (docs only), with
  the real packages' version constraints between them.
- ``linux-headers-amd64`` and ``linux-headers-<kernel release>``: empty stand-ins (no module is built).

Pure: ``all_standins`` computes every package (control fields, files, maintainer scripts); ``control_text``
its control file. ``build_deb`` is the only I/O (dpkg-deb).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from llmfleet.errors import CheckFailed
from llmfleet.lab.nvidia_smi_sim import LOADED_PATH, MODULE_PATH  # the "module" on disk, what a boot loaded

# (driver version, Debian package version): the versions catalog/provisioning.yaml names for Debian 12
# (bookworm's 535 and Tesla 470, NVIDIA's CUDA repository's 570 and 580) and a 550 between them, so
# upgrades and downgrades across branches can be exercised.
DRIVERS = (("470.256.02", "470.256.02-1~deb12u1"), ("535.247.01", "535.247.01-1~deb12u1"),
           ("550.163.01", "550.163.01-1"), ("570.172.08", "570.172.08-1"), ("580.95.05", "580.95.05-1"))
DRIVER_VERSIONS = tuple(v for v, _ in DRIVERS)
TESLA_BRANCHES = ("470",)  # Debian packages these legacy branches as nvidia-tesla-<branch>-*
# The catalog's pin (1.19.1) and older ones (1.17.8 fixed CVE-2025-23266; 1.17.4 is before it).
TOOLKIT_VERSIONS = ("1.17.4", "1.17.8", "1.19.1")
REVISION = "1"
ARCH = "amd64"
MAINTAINER = "llmfleet lab <lab@llmfleet.invalid>"
SIM_NOTE = "SIMULATOR for the llmfleet lab: no GPU and no kernel module here."

_POSTINST_REBOOT = """#!/bin/sh
set -e
# Like Debian's kernel and DKMS packages: the new module is used after the next boot.
if [ "$1" = configure ]; then
  # SIMULATOR of a DKMS build's duration (a real one takes minutes): the seconds in this file, if any.
  if [ -r /etc/llmfleet-sim/dkms-build-seconds ]; then sleep "$(cat /etc/llmfleet-sim/dkms-build-seconds)"; fi
  touch /run/reboot-required
  grep -qx '{name}' /run/reboot-required.pkgs 2>/dev/null || echo '{name}' >> /run/reboot-required.pkgs
fi
exit 0
"""
_PERSISTENCED = """#!/bin/sh
# nvidia-persistenced STUB ({note}) version {version}
case "${{1:-}}" in --version|-v) echo "nvidia-persistenced:  version {version}"; exit 0;; esac
if [ ! -r {loaded} ]; then
  echo "nvidia-persistenced failed to initialize. Check syslog for more details." >&2; exit 1
fi
exec sleep infinity
"""
_PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (SIMULATOR stub)

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""
# The hook STUB injects nothing. One injected failure (SIMULATOR): when CONTAINERS_FAIL_PATH lists the loaded
# driver's version, it fails as libnvidia-container does when it cannot initialise NVML with the driver,
# so no GPU container starts: a host whose services do not come back after a driver change.
CONTAINERS_FAIL_PATH = "/etc/llmfleet-sim/containers-fail-on"
_HOOK = (
    "#!/bin/sh\n# STUB of nvidia-container-runtime-hook ({note}): accepts any call, injects nothing.\n"
    f"f={CONTAINERS_FAIL_PATH}; m={LOADED_PATH}\n"
    'if [ -r "$f" ] && [ -r "$m" ] && grep -qxF -- "$(cat "$m")" "$f"; then\n'
    '  echo "nvidia-container-cli: initialization error: nvml error: unknown error (SIMULATOR: $f)" >&2; exit 1\n'
    "fi\nexit 0\n"
)
_RUNTIME = "#!/bin/sh\n# STUB of nvidia-container-runtime ({note}): hands everything to runc, no GPU injected.\nexec runc \"$@\"\n"
_CLI = ("#!/bin/sh\n# STUB of nvidia-container-cli ({note})\n"
        "case \"${{1:-}}\" in --version) echo 'cli-version: {version}'; echo 'lib-version: {version}';; "
        "*) echo 'nvidia-container-cli: SIMULATOR: no GPU' >&2; exit 1;; esac\n")
_CONFIG_TOML = """# nvidia-container-runtime configuration ({note})
[nvidia-container-cli]
ldconfig = "@/sbin/ldconfig"

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["runc"]
"""


@dataclass(frozen=True)
class DebFile:
    path: str  # absolute path on the host
    content: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class StandinDeb:
    name: str
    version: str  # Debian version with revision, e.g. 535.247.01-1
    summary: str
    section: str = "non-free/libs"
    depends: tuple[str, ...] = ()
    recommends: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    replaces: tuple[str, ...] = ()
    files: tuple[DebFile, ...] = ()
    scripts: tuple[tuple[str, str], ...] = ()  # (postinst|prerm|..., text)
    conffiles: tuple[str, ...] = ()
    architecture: str = ARCH
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version.split(':')[-1]}_{self.architecture}.deb"


def installed_size_kib(deb: StandinDeb) -> int:
    return max(1, sum((len(f.content) + 1023) // 1024 for f in deb.files))


def control_text(deb: StandinDeb) -> str:
    """The DEBIAN/control file of a stand-in package."""
    fields = [("Package", deb.name), ("Version", deb.version), ("Architecture", deb.architecture),
              ("Maintainer", MAINTAINER), ("Installed-Size", str(installed_size_kib(deb))),
              ("Depends", ", ".join(deb.depends)), ("Recommends", ", ".join(deb.recommends)),
              ("Provides", ", ".join(deb.provides)), ("Conflicts", ", ".join(deb.conflicts)),
              ("Replaces", ", ".join(deb.replaces)), ("Section", deb.section), ("Priority", "optional"),
              *sorted(deb.extra.items())]
    lines = [f"{k}: {v}" for k, v in fields if v]
    lines.append(f"Description: {deb.summary} (SIMULATOR)")
    lines.append(f" {SIM_NOTE}")
    lines.append(" Stand-in with the real package's name and version; see llmfleet docs/lab.md.")
    return "\n".join(lines) + "\n"


def _ver(upstream: str) -> str:
    return f"{upstream}-{REVISION}"


def driver_debs(version: str, smi_source: str, deb_version: str | None = None) -> list[StandinDeb]:
    """The stand-in driver packages of one driver version (e.g. 570.172.08) under Debian's and NVIDIA's
    CUDA repository's names: nvidia-driver, nvidia-kernel-dkms, nvidia-smi, nvidia-persistenced and
    cuda-drivers-<branch>. A legacy Tesla branch (``TESLA_BRANCHES``) gets Debian's
    nvidia-tesla-<branch>-{driver,kernel-dkms,smi} names instead."""
    v = deb_version or _ver(version)
    branch = version.split(".")[0]
    tesla = branch in TESLA_BRANCHES
    kname, sname = (f"nvidia-tesla-{branch}-kernel-dkms", f"nvidia-tesla-{branch}-smi") if tesla else (
        "nvidia-kernel-dkms", "nvidia-smi")
    pin = (f"{kname} (= {v})", f"{sname} (= {v})")
    # Only one module and one nvidia-smi at a time: each provides, conflicts with and replaces a virtual
    # package (the Debian idiom for mutually exclusive packages), so apt swaps one branch for another.
    kmod = StandinDeb(
        kname, v, f"NVIDIA binary kernel module, driver {version}", section="non-free/kernel",
        files=(DebFile(MODULE_PATH, f"{version}\n".encode()),),
        scripts=(("postinst", _POSTINST_REBOOT.format(name=kname)),),
        provides=("nvidia-kernel-module",), conflicts=("nvidia-kernel-module",), replaces=("nvidia-kernel-module",))
    smi = StandinDeb(sname, v, f"NVIDIA System Management Interface, driver {version}",
                     section="non-free/utils", depends=(f"{kname} (= {v})",),
                     provides=("nvidia-smi-binary",), conflicts=("nvidia-smi-binary",), replaces=("nvidia-smi-binary",),
                     files=(DebFile("/usr/bin/nvidia-smi", smi_source.encode(), 0o755),))
    if tesla:
        return [kmod, smi, StandinDeb(f"nvidia-tesla-{branch}-driver", v, f"NVIDIA Tesla {branch} driver metapackage",
                                      section="non-free/x11", depends=pin)]
    persist = StandinDeb(
        "nvidia-persistenced", v, "daemon to maintain persistent software state in the NVIDIA driver",
        section="non-free/utils",
        files=(DebFile("/usr/bin/nvidia-persistenced",
                       _PERSISTENCED.format(note=SIM_NOTE, version=version, loaded=LOADED_PATH).encode(), 0o755),
               DebFile("/lib/systemd/system/nvidia-persistenced.service", _PERSISTENCED_UNIT.encode())))
    meta = [
        StandinDeb("nvidia-driver", v, f"NVIDIA metapackage, driver {version}", section="non-free/x11",
                   depends=pin, recommends=("nvidia-persistenced",)),
        StandinDeb(f"cuda-drivers-{branch}", v, f"CUDA driver metapackage, branch {branch}",
                   section="multiverse/devel", depends=(f"nvidia-driver (= {v})",)),
    ]
    return [kmod, smi, persist, *meta]


def toolkit_debs(version: str, ctk_source: str) -> list[StandinDeb]:
    """The stand-in NVIDIA Container Toolkit packages of one version (e.g. 1.17.8), with the real
    packages' dependencies between them."""
    v = _ver(version)
    note = SIM_NOTE
    ctk = ctk_source.replace('VERSION = "@VERSION@"', f'VERSION = "{version}"')
    return [
        StandinDeb("libnvidia-container1", v, "NVIDIA container runtime library", section="utils",
                   files=(DebFile("/usr/share/doc/libnvidia-container1/SIMULATOR", (note + "\n").encode()),)),
        StandinDeb("libnvidia-container-tools", v, "NVIDIA container runtime library (command-line tools)",
                   section="utils", depends=(f"libnvidia-container1 (>= {v})",),
                   files=(DebFile("/usr/bin/nvidia-container-cli",
                                  _CLI.format(note=note, version=version).encode(), 0o755),)),
        StandinDeb("nvidia-container-toolkit-base", v, "NVIDIA Container Toolkit Base", section="utils",
                   files=(DebFile("/usr/bin/nvidia-ctk", ctk.encode(), 0o755),
                          DebFile("/usr/bin/nvidia-container-runtime", _RUNTIME.format(note=note).encode(), 0o755),
                          DebFile("/etc/nvidia-container-runtime/config.toml", _CONFIG_TOML.format(note=note).encode())),
                   conffiles=("/etc/nvidia-container-runtime/config.toml",)),
        StandinDeb("nvidia-container-toolkit", v, "NVIDIA Container toolkit", section="utils",
                   depends=(f"nvidia-container-toolkit-base (= {v})", f"libnvidia-container-tools (= {v})"),
                   files=(DebFile("/usr/bin/nvidia-container-runtime-hook", _HOOK.format(note=note).encode(),
                                  0o755),)),
    ]


def headers_debs(kernel_release: str) -> list[StandinDeb]:
    """Empty kernel headers stand-ins: Debian's ``linux-headers-amd64`` and the running kernel's."""
    if not kernel_release or any(c not in "abcdefghijklmnopqrstuvwxyz0123456789.+-" for c in kernel_release.lower()):
        return []
    rel = kernel_release.lower()
    return [
        StandinDeb(f"linux-headers-{rel}", "1.0-1", f"Header files for Linux {rel}", section="kernel"),
        StandinDeb("linux-headers-amd64", "1.0-1", "Header files for Linux (meta-package)", section="kernel",
                   depends=(f"linux-headers-{rel}",)),
    ]


def all_standins(*, smi_source: str, ctk_source: str, kernel_release: str = "") -> list[StandinDeb]:
    debs: list[StandinDeb] = []
    for v, deb_version in DRIVERS:
        debs += driver_debs(v, smi_source, deb_version)
    for v in TOOLKIT_VERSIONS:
        debs += toolkit_debs(v, ctk_source)
    return debs + headers_debs(kernel_release)


def standins_hash(debs: list[StandinDeb]) -> str:
    """A key over every package's control file, files and scripts (the build cache's key)."""
    h = hashlib.sha256()
    for d in debs:
        h.update(control_text(d).encode())
        for f in d.files:
            h.update(f"{f.path}\0{f.mode:o}\0".encode() + hashlib.sha256(f.content).digest())
        for name, text in d.scripts:
            h.update(f"{name}\0{text}".encode())
    return h.hexdigest()[:16]


# -- I/O -------------------------------------------------------------------------------------------


def build_deb(deb: StandinDeb, out_dir: Path, epoch: int = 1700000000) -> Path:
    """Build one package with dpkg-deb (root-owned files, fixed timestamps); returns its path."""
    if not shutil.which("dpkg-deb"):
        raise CheckFailed("dpkg-deb not found: the lab repository's stand-in packages need dpkg (Debian)")
    out = out_dir / deb.filename
    with tempfile.TemporaryDirectory(prefix="standin.") as tmp:
        root = Path(tmp) / "root"
        (root / "DEBIAN").mkdir(parents=True)
        (root / "DEBIAN" / "control").write_text(control_text(deb))
        if deb.conffiles:
            (root / "DEBIAN" / "conffiles").write_text("".join(p + "\n" for p in deb.conffiles))
        for name, text in deb.scripts:
            p = root / "DEBIAN" / name
            p.write_text(text)
            p.chmod(0o755)
        for f in deb.files:
            p = root / f.path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(f.content)
            p.chmod(f.mode)
        for dirpath, dirs, _ in os.walk(root):
            for d in dirs:
                os.chmod(os.path.join(dirpath, d), 0o755)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
        proc = subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
                              capture_output=True, timeout=120, env=env)
        if proc.returncode != 0:
            raise CheckFailed(f"dpkg-deb --build {deb.filename}: {proc.stderr.decode(errors='replace').strip()}")
    return out
