"""Which NVIDIA driver branch a host gets, and under which package names (pure, no I/O).

Facts come from two catalogs and are never copied between them: ``catalog/provisioning.yaml`` says
which branches each supported distribution packages (names, versions, headers, persistence daemon,
the pinned container toolkit, Docker and compose), ``catalog/engines.yaml`` (through
``llmfleet.knowledge.compat``) says which branch drives which card generation and which driver runs
which image's CUDA (natively, minor-version or forward compatibility). ``choose_driver`` keeps the
branches the distribution packages that drive every card and run every image, and prefers the
highest long-term-support or production branch, saying why in one line.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from llmfleet.errors import UsageError
from llmfleet.knowledge import compat
from llmfleet.knowledge.catalog import Gpu, find_gpu
from llmfleet.knowledge.compat import EngineCatalog, EngineRelease
from llmfleet.knowledge.yaml_model import load_model, read_catalog

PROVISIONING_PATH = Path(__file__).resolve().parent / "catalog" / "provisioning.yaml"
Confidence = Literal["H", "M", "U"]


@dataclass(frozen=True)
class Distro:
    id: str  # "debian" | "ubuntu"
    version: str  # "12", "24.04"

    @property
    def key(self) -> str:
        return f"{self.id}-{self.version}"

    def __str__(self) -> str:
        return f"{self.id} {self.version}"


@dataclass(frozen=True)
class DriverChoice:
    branch: int
    packages: tuple[str, ...]  # what to install for the driver: headers, driver packages, persistence daemon
    hold: tuple[str, ...]  # what `apt-mark hold` keeps on this branch
    why: str  # one line
    source: str
    confidence: str
    warnings: tuple[str, ...]
    # Added: the upstream version nvidia-smi reports after the reboot (None: the catalog does not pin
    # one; the archive's current release of the branch is installed), `name=deb_version` for the
    # driver packages where the catalog knows the version, where the packages come from, the kernel
    # modules they build, and the persistence daemon's unit.
    version: str | None = None
    pinned: tuple[str, ...] = ()
    origin: str = ""
    kernel_modules: str = "proprietary"
    persistence_unit: str = ""


# ------------------------------------------------------------------------------------------------
# Catalog


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class SecurityFloor(_Model):
    below: str
    cve: str
    confidence: Confidence
    source: str


class Toolkit(_Model):
    version: str
    deb_version: str
    packages: list[str]
    confidence: Confidence
    source: str
    packages_confidence: Confidence
    packages_source: str
    deb_version_confidence: Confidence
    deb_version_source: str
    repository: str
    security_floors: list[SecurityFloor] = Field(default_factory=list)
    configure: str
    configure_confidence: Confidence
    configure_source: str


class Headers(_Model):
    packages: list[str]
    rule: str
    confidence: Confidence
    source: str


class Persistence(_Model):
    package: str
    unit: str
    confidence: Confidence
    source: str


class DriverPackage(_Model):
    branch: int
    origin: str
    version: str | None
    deb_version: str | None
    packages: list[str]
    kernel_modules: Literal["proprietary", "open"]
    confidence: Confidence
    source: str


class RuntimePackage(_Model):
    package: str
    deb_version: str | None
    suite: str
    confidence: Confidence
    source: str


class Runtime(_Model):
    engine: RuntimePackage
    compose: RuntimePackage


class Distribution(_Model):
    id: Literal["debian", "ubuntu"]
    version: str
    codename: str
    components: list[str]
    headers: Headers
    persistence: Persistence
    drivers: list[DriverPackage]
    runtime: Runtime


class Note(_Model):
    confidence: Confidence
    source: str


class ProvisioningCatalog(_Model):
    toolkit: Toolkit
    distributions: dict[str, Distribution]
    transitional_note: Note | None = None

    def supported(self) -> str:
        return ", ".join(f"{d.id} {d.version}" for d in self.distributions.values())

    def distribution(self, distro: Distro) -> Distribution:
        """The catalog entry for a distribution (its version or codename); a one-line UsageError naming
        the supported ones otherwise."""
        for d in self.distributions.values():
            if d.id == str(distro.id).strip().lower() and str(distro.version).strip().lower() in (d.version, d.codename):
                return d
        raise UsageError(f"unsupported distribution {str(distro)[:60]!r}: llmfleet provisions {self.supported()}; "
                         "run the host on one of these")


def parse_provisioning(text: str, path: str = "provisioning.yaml", *, keep: bool = False) -> ProvisioningCatalog:
    return load_model(ProvisioningCatalog, text, path, keep=keep)


@functools.lru_cache(maxsize=4)
def load_provisioning(path: str | None = None) -> ProvisioningCatalog:
    p = Path(path) if path else PROVISIONING_PATH
    text = read_catalog(p, "the provisioning catalog")
    return parse_provisioning(text, str(p), keep=True)


# ------------------------------------------------------------------------------------------------
# Toolkit and runtime packages


def _unconfirmed(what: str, confidence: str, source: str) -> list[str]:
    return [f"WARN {what} is unconfirmed (confidence U): {source}"] if confidence == "U" else []


def toolkit_packages(distro: Distro, prov: ProvisioningCatalog | None = None) -> tuple[str, ...]:
    """The NVIDIA Container Toolkit packages pinned as ``name=deb_version`` (all at one version)."""
    prov = prov or load_provisioning()
    prov.distribution(distro)
    tk = prov.toolkit
    return tuple(f"{name}={tk.deb_version}" for name in tk.packages)


def runtime_packages(distro: Distro, prov: ProvisioningCatalog | None = None) -> tuple[str, ...]:
    """Docker engine and compose v2 for the distribution, ``name=deb_version`` where the catalog knows
    the version, the bare name where it does not (``catalog_warnings`` says so)."""
    rt = (prov or load_provisioning()).distribution(distro).runtime
    return tuple(f"{p.package}={p.deb_version}" if p.deb_version else p.package for p in (rt.engine, rt.compose))


def runtime_suites(distro: Distro, prov: ProvisioningCatalog | None = None) -> dict[str, str]:
    """package -> the suite it comes from (Debian 12 takes compose v2 from trixie)."""
    rt = (prov or load_provisioning()).distribution(distro).runtime
    return {p.package: p.suite for p in (rt.engine, rt.compose)}


def catalog_warnings(distro: Distro, prov: ProvisioningCatalog | None = None) -> tuple[str, ...]:
    """WARN lines for the toolkit and runtime entries of this distribution no source confirms."""
    prov = prov or load_provisioning()
    d = prov.distribution(distro)
    tk = prov.toolkit
    out = _unconfirmed(f"nvidia-container-toolkit {tk.version}", tk.confidence, tk.source)
    out += _unconfirmed(f"nvidia-container-toolkit package version {tk.deb_version}", tk.deb_version_confidence,
                        tk.deb_version_source)
    for p in (d.runtime.engine, d.runtime.compose):
        out += _unconfirmed(f"{p.package} on {distro}", p.confidence, p.source)
        if p.deb_version is None:
            out.append(f"WARN {p.package} on {distro}: no version in the catalog, so it is installed unpinned "
                       f"(the archive's current one) ({p.source})")
    return tuple(out)


def toolkit_security_gap(installed: str | None, prov: ProvisioningCatalog | None = None) -> str | None:
    """One line naming every CVE an installed toolkit version misses (each security floor it is below);
    None when it is at or above every floor, or the version does not parse."""
    have = compat.version_tuple((installed or "").split("-", 1)[0].split("~", 1)[0])
    if have is None:
        return None
    missed = [f for f in (prov or load_provisioning()).toolkit.security_floors
              if have < (compat.version_tuple(f.below) or ())]
    if not missed:
        return None
    cves = ", ".join(f"{f.cve} (fixed in {f.below}: {f.source})" for f in missed)
    return f"nvidia-container-toolkit {installed} misses {cves}"


def headers_packages(distro: Distro, kernel_release: str | None, arch: str = "amd64",
                     prov: ProvisioningCatalog | None = None) -> tuple[str, ...]:
    """Kernel headers for DKMS by the distribution's rule; without the running kernel's release only
    the architecture meta package (Debian) is named."""
    h = (prov or load_provisioning()).distribution(distro).headers
    out = []
    for tmpl in h.packages:
        if "{kernel}" in tmpl and not kernel_release:
            continue
        out.append(tmpl.format(arch=arch, kernel=kernel_release or ""))
    return tuple(out)


# ------------------------------------------------------------------------------------------------
# Choosing the branch


@dataclass(frozen=True)
class _Card:
    label: str  # the nvidia-smi name
    gpu: Gpu


@dataclass(frozen=True)
class _Judged:
    entry: DriverPackage
    driver: str  # the version judged
    fails: tuple[str, ...]
    card_drops: tuple[str, ...]
    notes: tuple[str, ...]  # why it runs an image only through compatibility
    how: tuple[str, ...]  # per image: "natively" | "through ... compatibility"


def _cards(cards: Sequence[str], warnings: list[str]) -> list[_Card]:
    out: list[_Card] = []
    for name in dict.fromkeys(str(c).strip() for c in cards if str(c).strip()):
        try:
            gpu = find_gpu(name)
        except UsageError:
            warnings.append(f"WARN card {name[:80]!r} is not in catalog/gpus.yaml: which branches drive it is not "
                            "known, so the branch is chosen without it (add it to gpus.yaml)")
            continue
        if all(c.gpu.id != gpu.id for c in out):
            out.append(_Card(name, gpu))
    return out


def _images(images: Sequence[str], cat: EngineCatalog, warnings: list[str]) -> list[EngineRelease]:
    from llmfleet.inventory.services import NON_ENGINE_KINDS

    out: list[EngineRelease] = []
    for key in dict.fromkeys(str(i).strip() for i in images if str(i).strip()):
        rel = cat.release(key)
        if rel is None:
            warnings.append(f"WARN image {key[:80]!r} is not in catalog/engines.yaml: the driver its CUDA needs is not "
                            "known, so the branch is chosen without it")
        elif not rel.cpu and rel.engine not in NON_ENGINE_KINDS:
            out.append(rel)
    return out


def _arch(gpu: Gpu) -> str:
    return gpu.arch.capitalize()


def _judge(entry: DriverPackage, cards: list[_Card], rels: list[EngineRelease], cat: EngineCatalog,
           toolkit_version: str, today: str | None) -> _Judged:
    # a branch whose version the catalog does not pin is judged as its current release
    driver = entry.version or f"{entry.branch}.9999.99"
    drops: list[str] = []
    for c in cards:
        v = compat.check_driver_drives_card(cat, driver, c.label, c.gpu.compute_capability, entry.kernel_modules)
        if v is not None:
            support = cat.driver_card_support
            last = f": the last branch that drives it is {support.last_branch}" if support else ""
            drops.append(f"R{entry.branch} drops {c.label} ({_arch(c.gpu)}){last}")
    fails: list[str] = []
    notes: list[str] = []
    how: list[str] = []
    targets: list[_Card | None] = list(cards) or [None]
    for rel in rels:
        worst = "natively"
        for t in targets:
            v = compat.check_cuda_driver(
                rel, cat, driver=driver, cuda_driver=None, gpu_name=t.label if t else None,
                cc=t.gpu.compute_capability if t else None, data_center=t.gpu.data_center if t else None,
                toolkit_version=toolkit_version, runtimes=["nvidia"], default_runtime=None, today=today,
                kernel_modules=entry.kernel_modules)
            if v.status == "fail":
                if not any(d for d in drops):
                    fails.append(f"R{entry.branch} is too old for {rel.key} (CUDA {rel.cuda} needs driver >= "
                                 f"{rel.min_driver}): {v.message}")
                worst = "fail"
                break
            if v.status == "warn":
                kind = ("through forward compatibility" if "forward compatibility (" in v.message
                        else "through minor-version compatibility" if "minor-version" in v.message
                        else "with a warning")
                if worst == "natively":
                    worst = kind
                notes.append(f"R{entry.branch} runs {rel.key} on {t.label if t else 'the card'} {kind}: {v.message}")
        how.append(f"{rel.key} {worst}")
    return _Judged(entry, driver, tuple(dict.fromkeys(fails)), tuple(drops), tuple(notes), tuple(how))


def _designation(branch: int, cat: EngineCatalog, today: str | None) -> tuple[int, str]:
    """(rank, words): 2 a long-term-support or production branch before its end of life, 1 one past it
    or not listed, 0 a new-feature branch."""
    b = cat.forward_compat.branches.get(branch)
    if b is None:
        return 1, "a branch NVIDIA lists no support period for"
    if b.designation == "NFB":
        return 0, "a new-feature branch"
    words = "long-term-support branch" if b.designation == "LTSB" else "production branch"
    if today and b.eol < str(today)[:7]:
        return 1, f"{words} past its end of life ({b.eol})"
    return 2, words


def _why(j: _Judged, cards: list[_Card], cat: EngineCatalog, distro: Distro, words: str, pinned: bool) -> str:
    support = cat.driver_card_support
    below = compat.cc_tuple(support.below_cc) if support else None
    names = []
    for c in cards:
        cc = compat.cc_tuple(c.gpu.compute_capability)
        if support and below and cc and cc < below:
            names.append(f"{c.label} ({_arch(c.gpu)}, last branch {support.last_branch})")
        else:
            names.append(f"{c.label} ({_arch(c.gpu)})")
    drives = f" that still drives {', '.join(names)}" if names else ""
    runs = f" and runs {', '.join(j.how)}" if j.how else ""
    head = (f"R{j.entry.branch}: pinned by the inventory ({words}) on {distro}" if pinned
            else f"R{j.entry.branch}: the highest {words} packaged for {distro}")
    version = f"; installs {j.entry.version}" if j.entry.version else ""
    return f"{head}{drives}{runs}{version}"


def _packages(entry: DriverPackage, dist: Distribution, headers: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    persist = dist.persistence.package.format(branch=entry.branch)
    driver_pkgs = list(dict.fromkeys([*entry.packages, persist]))
    hold = tuple(p for p in driver_pkgs if p in entry.packages or str(entry.branch) in p)
    return tuple(dict.fromkeys([*headers, *driver_pkgs])), hold


def choose_driver(cards: Sequence[str], images: Sequence[str], distro: Distro, *,
                  pinned_branch: int | None = None, catalog: EngineCatalog | None = None,
                  provisioning: ProvisioningCatalog | None = None, today: str | None = None,
                  kernel_release: str | None = None, arch: str = "amd64") -> DriverChoice:
    """The driver branch for a host with these cards (nvidia-smi names or gpus.yaml ids) serving these
    images (engines.yaml keys) on this distribution. Raises a one-line UsageError for an unsupported
    distribution, a pinned branch the distribution does not package, that drops a card or is too old for
    an image, or when no packaged branch satisfies every card and image. ``today`` (YYYY-MM-DD) judges
    branch ends of life; ``kernel_release`` (uname -r) names the running kernel's headers."""
    prov = provisioning or load_provisioning()
    dist = prov.distribution(distro)
    cat = catalog or compat.load_engine_catalog()
    warnings: list[str] = []
    card_list = _cards(cards, warnings)
    rels = _images(images, cat, warnings)
    entries = sorted(dist.drivers, key=lambda e: -e.branch)
    packaged = ", ".join(f"R{e.branch}" for e in entries)
    if pinned_branch is not None:
        entries = [e for e in entries if e.branch == pinned_branch]
        if not entries:
            raise UsageError(f"R{pinned_branch} is not packaged for {distro} in catalog/provisioning.yaml "
                             f"(packaged: {packaged}); pin one of these")
    judged = [_judge(e, card_list, rels, cat, prov.toolkit.version, today) for e in entries]
    ok = [j for j in judged if not j.fails and not j.card_drops]
    if pinned_branch is not None and not ok:
        j = judged[0]
        raise UsageError((j.card_drops or j.fails)[0][:400])
    if not ok:
        reasons = "; ".join(((j.card_drops or j.fails)[0])[:160] for j in judged)
        raise UsageError(f"no driver branch packaged for {distro} ({packaged}) drives every card and runs every "
                         f"image: {reasons}")

    def rank(j: _Judged) -> tuple[bool, int, int]:
        native = all(h.endswith(" natively") for h in j.how)
        return native, _designation(j.entry.branch, cat, today)[0], j.entry.branch

    best = max(ok, key=rank)
    entry = best.entry
    words = _designation(entry.branch, cat, today)[1]
    if _designation(entry.branch, cat, today)[0] < 2:
        fits = "" if pinned_branch is not None else (f": no long-term-support or production branch packaged for "
                                                     f"{distro} fits")
        warnings.append(f"WARN R{entry.branch} is a {words}{fits}")
    warnings += [f"WARN {n}" for n in dict.fromkeys(best.notes)]
    warnings += _unconfirmed(f"R{entry.branch} on {distro} ({entry.origin})", entry.confidence, entry.source)
    if entry.version is None:
        warnings.append(f"WARN R{entry.branch} on {distro}: no version in the catalog; it was judged as the branch's "
                        "current release, and apt installs the archive's current one (read nvidia-smi after the reboot)")
    headers = headers_packages(distro, kernel_release, arch, prov)
    packages, hold = _packages(entry, dist, headers)
    pinned = tuple(f"{p}={entry.deb_version}" for p in entry.packages) if entry.deb_version else ()
    return DriverChoice(
        branch=entry.branch, packages=packages, hold=hold,
        why=_why(best, card_list, cat, distro, words, pinned_branch is not None),
        source=entry.source, confidence=entry.confidence, warnings=tuple(dict.fromkeys(warnings)),
        version=entry.version, pinned=pinned, origin=entry.origin, kernel_modules=entry.kernel_modules,
        persistence_unit=dist.persistence.unit,
    )
