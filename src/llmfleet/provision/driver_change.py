"""A driver change gated by serving: the previous driver kept on the host, and the way back to it (pure).

Before provisioning changes a host's driver, the packages of the driver it runs now (every installed
``nvidia-*``, ``libnvidia-*``, ``cuda-drivers*`` or ``firmware-nvidia-*`` package at that driver's
upstream version) are kept as .deb files under ``<root>/driver-previous/<version>/`` (from apt's cache,
else ``apt-get download``), with a ``packages`` list beside them. When the host's services do not come
back healthy on the new driver, the go-back installs exactly those files again (``--allow-downgrades``),
removes the new driver's packages that the old one did not have (another branch's names), holds the old
ones, writes provision's apt pin file for them again and the host reboots into them. Nothing here reaches the network at go-back time: an air-gapped
site goes back as a connected one does.

``previous_driver`` reads the facts; ``keep_script`` / ``parse_kept`` and ``go_back_script`` are the exact
shell (every value quoted) and its reader; ``go_back_removals`` computes what the go-back removes from the
facts gathered after the change. ``gate_verdict`` decides a host's outcome from what the change and the
services' health checks said.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmfleet.provision.desired import DRIVER_PIN_FILE, driver_pin_text
from llmfleet.provision.facts import ProvisionFacts, upstream_version
from llmfleet.provision.steps import APT_ENV, APT_INSTALL

q = shlex.quote
DRIVER_PACKAGE = re.compile(r"^(nvidia-|libnvidia-|cuda-drivers|firmware-nvidia-|xserver-xorg-video-nvidia)")
KEEP_DIR = "driver-previous"


@dataclass(frozen=True)
class Previous:
    """The driver a host runs before a change: what a go-back installs again."""

    version: str  # upstream, as nvidia-smi reports it (570.172.08)
    packages: tuple[tuple[str, str], ...]  # (name, Debian version), sorted by name
    held: tuple[str, ...]  # of those, the ones held before the change

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.packages)

    @property
    def pin_text(self) -> str:
        """The apt pin that keeps this driver (provision's pin file, written again by the go-back)."""
        versions = dict(self.packages)
        version = next((versions[n] for n in ("nvidia-driver", *self.names) if n in versions), f"{self.version}-*")
        return driver_pin_text(version, int(self.version.split(".")[0]))

    def folder(self, root: str) -> str:
        return posixpath.join(root, KEEP_DIR, self.version)

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "packages": [f"{n}={v}" for n, v in self.packages], "held": list(self.held)}


def previous_driver(facts: ProvisionFacts, driver_package: str) -> Previous | None:
    """The installed driver (``driver_package``'s version, else the version nvidia-smi reports) and its
    packages; None when no driver is installed (a bare host: nothing serves there to go back to)."""
    have = facts.installed(driver_package)
    version = upstream_version(have) if have else facts.driver_running
    if not version:
        return None
    pkgs = tuple(sorted((name, st.version) for name, st in facts.packages.items()
                        if st.installed and DRIVER_PACKAGE.match(name) and upstream_version(st.version) == version))
    if not pkgs:
        return None
    return Previous(version=version, packages=pkgs, held=tuple(n for n, _ in pkgs if n in facts.holds))


def _deb_glob(name: str, version: str) -> str:
    """apt's cache file name pattern of a package at a version (an epoch's colon is written %3a)."""
    return f"{name}_{version.replace(':', '%3a')}_*.deb"


def keep_script(root: str, prev: Previous) -> str:
    """Keep the previous driver's .deb files on the host (apt's cache, else ``apt-get download``); prints
    ``@@kept NAME FILE`` or ``@@missing NAME`` per package. Idempotent: a file already kept stays."""
    d = prev.folder(root)
    lines = ["set -u", APT_ENV, f"d={q(d)}", 'mkdir -p -- "$d" && chmod 0755 "$d" && cd "$d" || exit 1',
             "updated=0"]
    for name, version in prev.packages:
        pat = _deb_glob(name, version)
        lines += [
            f"f=$(ls -- {pat} 2>/dev/null | head -n 1)",
            f'[ -n "$f" ] || {{ c=$(ls -- /var/cache/apt/archives/{pat} 2>/dev/null | head -n 1); '
            f'[ -z "$c" ] || cp -- "$c" . ; }}',
            f"f=$(ls -- {pat} 2>/dev/null | head -n 1)",
            f'if [ -z "$f" ]; then [ "$updated" = 1 ] || {{ apt-get -q update >/dev/null 2>&1; updated=1; }}; '
            f"apt-get -q download {q(name + '=' + version)} >/dev/null 2>&1; f=$(ls -- {pat} 2>/dev/null | head -n 1); fi",
            f'if [ -n "$f" ]; then echo "@@kept {name} $f"; else echo "@@missing {name}"; fi',
        ]
    listing = "\n".join(f"{n}={v}" for n, v in prev.packages) + "\n"
    lines.append(f"printf '%s' {q(listing)} > packages")
    return "\n".join(lines)


def parse_kept(stdout: str) -> tuple[dict[str, str], list[str]]:
    """``keep_script``'s answer: {package: file kept}, [packages it could not keep]."""
    kept: dict[str, str] = {}
    missing: list[str] = []
    for line in stdout.splitlines():
        parts = line.split(" ", 2)
        if parts[0] == "@@kept" and len(parts) == 3:
            kept[parts[1]] = parts[2]
        elif parts[0] == "@@missing" and len(parts) >= 2:
            missing.append(parts[1])
    return kept, missing


def go_back_removals(prev: Previous, after: ProvisionFacts, target: str | None) -> tuple[str, ...]:
    """The failed driver's own packages that the previous driver did not have (another branch's names,
    such as Ubuntu's ``nvidia-driver-580-server``): installed at the ``target`` version after the change.
    The go-back removes them; a package of another version (the persistence daemon, the toolkit) stays."""
    if not target:
        return ()
    keep = set(prev.names)
    return tuple(sorted(name for name, st in after.packages.items()
                        if st.installed and DRIVER_PACKAGE.match(name) and name not in keep
                        and upstream_version(st.version) == target))


def go_back_script(root: str, prev: Previous, files: Mapping[str, str], remove: Sequence[str],
                   holds_now: Sequence[str]) -> str:
    """Install the kept files of the previous driver again (a downgrade), remove ``remove``, hold what
    was held before. ``files``: package -> file name in the kept folder (``parse_kept``)."""
    d = prev.folder(root)
    unhold = sorted(set(holds_now) | set(prev.held))
    args = [q("./" + files[n]) for n in prev.names if n in files] + [q(n + "-") for n in remove]
    lines = ["set -e", APT_ENV, f"cd -- {q(d)}"]
    if unhold:
        lines.append("apt-mark unhold " + " ".join(q(n) for n in unhold) + " >/dev/null")
    lines.append(f"printf '%s' {q(prev.pin_text)} > {q(DRIVER_PIN_FILE)}")
    lines.append(f"{APT_INSTALL} " + " ".join(args))  # local files: the same install as the steps'
    if prev.held:
        lines.append("apt-mark hold " + " ".join(q(n) for n in prev.held))
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    result: str  # changed | went back | failed
    ok: bool
    message: str


def gate_verdict(host: str, target: str | None, prev: Previous, *, change_ok: bool, change_why: str,
                 services_ok: bool | None, services_why: str, went_back: bool = False,
                 back_why: str = "", serving_again: bool | None = None, again_why: str = "") -> Verdict:
    """One host's driver change from what happened: the change and its checks (``change_ok``), the
    services' start and health checks on the new driver (None: not started), whether the go-back put
    the old driver back (asked only when the change or the services failed) and the services on the old
    driver again."""
    if change_ok and services_ok is not False:
        return Verdict("changed", True, f"driver {prev.version} -> {target}; " + (services_why or "no service to start"))
    why = change_why if not change_ok else f"the services are not healthy on {target}: {services_why}"
    if not went_back:
        return Verdict("failed", False, f"{why}; going back to {prev.version} failed too: {back_why}; fix it on "
                                        f"the host (its files are under {KEEP_DIR}/{prev.version}/ in the llmfleet "
                                        "root)")
    serving = ("its services serve again" if serving_again else
               "no service to start" if serving_again is None else "but its services are not healthy: " + again_why)
    return Verdict("went back", False, f"{why}; back on {prev.version}, {serving}; fix the cause before changing "
                                       f"its driver again (`invoke provision --host {host} --check` shows the change)")
