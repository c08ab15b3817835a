"""What a host must have for its services to run: the desired state provisioning converges to (pure).

From the inventory host (its services and their images, its card from nvidia-smi or ``llmfleet_gpu``,
its root and model folders, its SSH login user) and the distribution its facts report: the driver
branch (``choose_driver``: why, in one line), the packages with pinned versions and the ones held, the
files provisioning writes (mode, owner), the deploy user's groups, the folders, the units it enables.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmfleet.errors import UsageError
from llmfleet.inventory.services import AptSource, HostSettings
from llmfleet.knowledge.driver_choice import (
    Distro,
    DriverChoice,
    catalog_warnings,
    choose_driver,
    runtime_packages,
    toolkit_packages,
)
from llmfleet.provision.facts import FactsQuery, ProvisionFacts

DOCKER_UNIT = "docker.service"
PERSISTENCE_UNIT = "nvidia-persistenced.service"
DEPLOY_GROUPS = ("docker",)  # the deploy user runs docker without sudo (status, logs)
LIMITS_FILE = "/etc/security/limits.d/90-llmfleet.conf"
JOURNALD_FILE = "/etc/systemd/journald.conf.d/90-llmfleet.conf"
JOURNALD_RESTART = "systemctl restart systemd-journald.service"
# The engines' output goes to journald through their units (release/templates/llmfleet-service.unit.j2):
# bounded so that a chatty engine cannot fill the disk, and rate-limited above an engine's start-up burst.
JOURNALD_TEXT = """\
# Written by llmfleet provision: the journal keeps the engines' output (one unit per service), bounded.
[Journal]
SystemMaxUse=2G
RuntimeMaxUse=512M
RateLimitIntervalSec=30s
RateLimitBurst=20000
"""


FIREWALL_FILE = "/etc/llmfleet/firewall.nft"
FIREWALL_UNIT = "llmfleet-firewall.service"
FIREWALL_UNIT_FILE = f"/etc/systemd/system/{FIREWALL_UNIT}"
FIREWALL_PACKAGE = "nftables"
FIREWALL_UNIT_TEXT = f"""\
# Written by llmfleet provision (llmfleet_firewall): loads {FIREWALL_FILE}, its own nftables table
[Unit]
Description=llmfleet: the service ports answer only the inventory's addresses
Wants=network-pre.target
Before=network-pre.target docker.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/nft -f {FIREWALL_FILE}
ExecStop=/usr/sbin/nft delete table inet llmfleet

[Install]
WantedBy=multi-user.target
"""


def firewall_text(ports: Sequence[int], allow: Sequence[str]) -> str:
    """The nftables table ``inet llmfleet``: at prerouting, before Docker's DNAT (priority -150), TCP to
    ``ports`` from an address outside ``allow`` is dropped; the host itself (loopback) always passes.
    Prerouting sees both a published container port (before it is translated) and a host-network
    one. Loading it replaces the table whole (created, deleted, defined in one transaction); no other
    table or chain is touched."""
    import ipaddress

    nets = [ipaddress.ip_network(a, strict=False) for a in allow]
    v4 = sorted({str(n) for n in nets if n.version == 4})
    v6 = sorted({str(n) for n in nets if n.version == 6})
    plist = ", ".join(str(p) for p in sorted(set(ports)))

    def a_set(name: str, kind: str, elements: list[str]) -> list[str]:
        return ([f"\tset {name} {{", f"\t\ttype {kind}", "\t\tflags interval", "\t\tauto-merge"]
                + ([f"\t\telements = {{ {', '.join(elements)} }}"] if elements else []) + ["\t}"])

    lines = ["# Written by llmfleet provision from llmfleet_firewall: the service ports answer only these addresses.",
             "table inet llmfleet", "delete table inet llmfleet", "table inet llmfleet {",
             *a_set("allow4", "ipv4_addr", v4), *a_set("allow6", "ipv6_addr", v6),
             "\tchain prerouting {", "\t\ttype filter hook prerouting priority -150; policy accept;"]
    if plist:
        lines += ['\t\tiifname "lo" accept', f"\t\ttcp dport {{ {plist} }} ip saddr @allow4 accept",
                  f"\t\ttcp dport {{ {plist} }} ip6 saddr @allow6 accept", f"\t\ttcp dport {{ {plist} }} drop"]
    return "\n".join(lines + ["\t}", "}"]) + "\n"


def firewall_files(settings: HostSettings) -> tuple[ManagedFile, ...]:
    """The rule's file and its unit (none when ``llmfleet_firewall`` is unset)."""
    if settings.firewall is None:
        return ()
    ports = [svc.port for svc in settings.services]
    return (ManagedFile(FIREWALL_FILE, firewall_text(ports, settings.firewall.allow), step="firewall"),
            ManagedFile(FIREWALL_UNIT_FILE, FIREWALL_UNIT_TEXT, step="firewall"))


DRIVER_PIN_FILE = "/etc/apt/preferences.d/90-llmfleet-nvidia-driver"
DRIVER_PIN_PACKAGES = "nvidia-* libnvidia-* cuda-drivers* firmware-nvidia-* xserver-xorg-video-nvidia*"


def driver_pin_text(version: str, branch: int) -> str:
    """An apt preferences stanza that makes apt take ``version`` (a Debian version, or an upstream one
    followed by ``-*``) for every package of the driver: installing a branch older than the newest a
    source offers needs it (the driver's packages depend on each other at one exact version, and apt
    does not pick an older version of a dependency by itself). The container toolkit's packages
    (``libnvidia-container*``, ``nvidia-container-*``) have other versions: the pin does not touch them."""
    return (f"# Written by llmfleet provision: the NVIDIA driver stays at {version} (R{branch}); apt takes this\n"
            "# version for each of its packages, whatever newer one a source offers. They are held too.\n"
            f"Package: {DRIVER_PIN_PACKAGES}\nPin: version {version}\nPin-Priority: 1001\n")


def driver_pin(choice: DriverChoice, driver_package: str) -> ManagedFile | None:
    """The pin file for the chosen driver (None when the catalog names no version)."""
    versions = dict(_split(spec) for spec in choice.pinned)
    version = versions.get(driver_package) or (f"{choice.version}-*" if choice.version else None)
    if not version:
        return None
    return ManagedFile(DRIVER_PIN_FILE, driver_pin_text(version, choice.branch), step="sources")


KEYRING_DIR = "/etc/apt/keyrings"
SOURCES_DIR = "/etc/apt/sources.list.d"
ARMOR_BEGIN = "-----BEGIN PGP PUBLIC KEY BLOCK-----"


def source_paths(name: str) -> tuple[str, str]:
    """Where a source's key and its deb822 file go on the host."""
    return f"{KEYRING_DIR}/llmfleet-{name}.asc", f"{SOURCES_DIR}/llmfleet-{name}.sources"


def source_files(sources: Sequence[AptSource], keys: Mapping[str, str]) -> tuple[ManagedFile, ...]:
    """The key and the deb822 sources file of each ``llmfleet_apt_sources`` entry (``keys``: name ->
    the armored key's text, read from the inventory folder by the caller)."""
    out: list[ManagedFile] = []
    for i, src in enumerate(sources):
        key_path, list_path = source_paths(src.name)
        lines = [f"# Written by llmfleet provision from the inventory (llmfleet_apt_sources[{i}]: {src.name})",
                 "Types: deb", f"URIs: {' '.join(src.uris)}", f"Suites: {' '.join(src.suites)}"]
        if src.components:
            lines.append(f"Components: {' '.join(src.components)}")
        lines.append(f"Signed-By: {key_path}")
        out += [ManagedFile(key_path, keys[src.name], step="sources"),
                ManagedFile(list_path, "\n".join(lines) + "\n", step="sources")]
    return tuple(out)


def check_key(text: str, where: str) -> str:
    """An ASCII-armored OpenPGP public key, else UsageError naming ``where`` and the fix."""
    if ARMOR_BEGIN not in text[:4096] or "-----END PGP PUBLIC KEY BLOCK-----" not in text:
        raise UsageError(f"{where}: not an ASCII-armored OpenPGP public key; export it with "
                         "`gpg --armor --export KEYID > FILE` (or `gpg --enarmor` a binary keyring)")
    return text


@dataclass(frozen=True)
class OfflineTarget:
    """The bundle's repository a host installs from (provision --bundle): where it is unpacked on the
    host (``offline.repo_dir``), its archive's hash (``Packages.ok`` holds it once unpacked), size, count."""

    directory: str
    sha256: str
    size: int
    count: int

    @property
    def marker(self) -> str:
        return f"{self.directory}/Packages.ok"


@dataclass(frozen=True)
class Package:
    name: str
    version: str | None  # None: the candidate apt offers (then held at what was installed, when held)
    role: str  # runtime | toolkit | driver
    hold: bool = False

    @property
    def spec(self) -> str:
        return f"{self.name}={self.version}" if self.version else self.name


@dataclass(frozen=True)
class ManagedFile:
    path: str
    content: str
    mode: int = 0o644
    owner: str = "root"
    group: str = "root"
    step: str = "files"  # sources (apt sources and keys) | files | firewall
    then: str | None = None  # run once after the step wrote it (a restart that reads it)


@dataclass(frozen=True)
class Folder:
    path: str
    mode: int
    owner: str
    group: str


@dataclass(frozen=True)
class Desired:
    host: str
    distro: Distro
    driver: DriverChoice
    packages: tuple[Package, ...]
    files: tuple[ManagedFile, ...]
    folders: tuple[Folder, ...]
    user: str
    groups: tuple[str, ...]
    persistence_unit: str | None
    cards: tuple[str, ...]
    images: tuple[str, ...]  # image keys of the host's services (the driver choice's input)
    warnings: tuple[str, ...] = field(default_factory=tuple)
    offline: OfflineTarget | None = None  # apt reads only this repository (provision --bundle)

    @property
    def driver_package(self) -> str:
        """The package whose version is the driver nvidia-smi must report after the reboot."""
        return self.driver.hold[0] if self.driver.hold else self.driver.packages[0]


def _split(spec: str) -> tuple[str, str | None]:
    name, sep, version = spec.partition("=")
    return name.strip(), (version.strip() or None) if sep else None


def managed_files(user: str) -> tuple[ManagedFile, ...]:
    limits = ("# Written by llmfleet provision: engines pin host memory for GPU transfers (no memlock limit).\n"
              f"{user} soft memlock unlimited\n{user} hard memlock unlimited\n")
    return (
        ManagedFile(LIMITS_FILE, limits),
        ManagedFile(JOURNALD_FILE, JOURNALD_TEXT, then=JOURNALD_RESTART),
    )


def folders(settings: HostSettings, user: str) -> tuple[Folder, ...]:
    """The llmfleet root (root's) and each service's model folder (the deploy user's)."""
    out = [Folder(settings.root.rstrip("/") or "/", 0o755, "root", "root")]
    seen = {out[0].path}
    for svc in settings.services:
        path = getattr(svc, "model_path", None)
        if not path:
            continue
        folder = posixpath.dirname(path.rstrip("/")) or "/"
        if folder not in seen and folder != "/":
            seen.add(folder)
            out.append(Folder(folder, 0o755, user, user))
    return tuple(out)


def facts_query(settings: HostSettings, user: str, markers: Sequence[str] = ()) -> FactsQuery:
    """What the facts script reads besides its fixed sections (known before the host is contacted);
    ``markers``: the ``Packages.ok`` of each offline repository a bundle may put on the host."""
    return FactsQuery(user=user, folders=tuple(f.path for f in folders(settings, user)),
                      files=(*markers, DRIVER_PIN_FILE, FIREWALL_FILE, FIREWALL_UNIT_FILE, *(p for a in settings.apt_sources for p in source_paths(a.name)),
                             *(f.path for f in managed_files(user))), units=(DOCKER_UNIT, PERSISTENCE_UNIT, FIREWALL_UNIT))


def cards_for(host: str, settings: HostSettings, facts: ProvisionFacts) -> tuple[str, ...]:
    """The host's cards: nvidia-smi's names when a driver runs, else ``llmfleet_gpu``."""
    if facts.gpus:
        return tuple(dict.fromkeys(facts.gpus))
    if settings.gpu:
        return (settings.gpu,)
    raise UsageError(f"host {host}: no card known (nvidia-smi {'absent' if facts.smi == 'absent' else 'fails'} and "
                     "llmfleet_gpu unset); set llmfleet_gpu to the card's nvidia-smi name in the inventory")


def service_images(settings: HostSettings) -> tuple[str, ...]:
    keys: list[str] = []
    for svc in settings.services:
        for key in (svc.image, getattr(svc, "worker_image", None)):
            if key and key not in keys:
                keys.append(key)
    return tuple(keys)


def desired_state(host: str, settings: HostSettings, facts: ProvisionFacts, *, user: str,
                  pinned_branch: int | None = None, extra_files: Sequence[ManagedFile] = (),
                  offline: OfflineTarget | None = None) -> Desired:
    """The desired state of ``host``. Raises ``UsageError`` (one line) for a distribution provisioning
    does not support, a host with no known card, or a driver branch that cannot serve it."""
    os_id, version = facts.distro
    if not os_id:
        raise UsageError(f"host {host}: /etc/os-release names no distribution; provisioning supports "
                         "Debian and Ubuntu hosts")
    distro = Distro(id=os_id, version=version)
    cards = cards_for(host, settings, facts)
    images = service_images(settings)
    try:
        choice = choose_driver(cards, images, distro, pinned_branch=pinned_branch, kernel_release=facts.kernel or None,
                               arch=facts.arch or "amd64")
        runtime, toolkit = runtime_packages(distro), toolkit_packages(distro)
        warnings = choice.warnings + catalog_warnings(distro)
    except UsageError as exc:
        raise UsageError(f"host {host}: {exc}") from None
    held = set(choice.hold)
    versions = dict(_split(spec) for spec in choice.pinned)
    pkgs: list[Package] = []
    if settings.firewall is not None:
        runtime = (*runtime, FIREWALL_PACKAGE)
    for role, specs in (("runtime", runtime), ("toolkit", toolkit), ("driver", choice.packages)):
        for spec in specs:
            name, ver = _split(spec)
            pkgs.append(Package(name, ver or versions.get(name), role, hold=name in held or role == "toolkit"))
    groups = () if user == "root" else DEPLOY_GROUPS
    driver_package = choice.hold[0] if choice.hold else choice.packages[0]
    pin = driver_pin(choice, driver_package)
    return Desired(host=host, distro=distro, driver=choice, packages=tuple(pkgs),
                   files=tuple(extra_files) + ((pin,) if pin else ()) + managed_files(user) + firewall_files(settings), folders=folders(settings, user), user=user,
                   groups=groups, persistence_unit=choice.persistence_unit or PERSISTENCE_UNIT, cards=cards,
                   images=images, warnings=tuple(dict.fromkeys(warnings)), offline=offline)
