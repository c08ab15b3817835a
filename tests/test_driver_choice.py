"""Which driver branch a host gets: a table over cards x images x distributions (driver_choice)."""

from __future__ import annotations

import pytest

from llmfleet.errors import UsageError
from llmfleet.knowledge import compat
from llmfleet.knowledge.driver_choice import (
    Distro,
    ProvisioningCatalog,
    catalog_warnings,
    choose_driver,
    headers_packages,
    load_provisioning,
    runtime_packages,
    runtime_suites,
    toolkit_packages,
    toolkit_security_gap,
)

CAT = compat.load_engine_catalog()
PROV = load_provisioning()
TODAY = "2026-11-30"  # after R535's end of life (2026-06): forward compatibility is refused there

V100, P40, T4 = "Tesla V100-SXM2-32GB", "Tesla P40", "Tesla T4"
RTX3090, RTX4090, A10, L4 = "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090", "NVIDIA A10", "NVIDIA L4"
CARDS = (V100, P40, T4, RTX3090, RTX4090, A10, L4)
OLD_CARDS = {V100, P40}  # Volta, Pascal: no branch after R580 drives them
GEFORCE = {RTX3090, RTX4090}

DEB12, DEB13 = Distro("debian", "12"), Distro("debian", "13")
U2204, U2404 = Distro("ubuntu", "22.04"), Distro("ubuntu", "24.04")
DISTROS = (DEB12, DEB13, U2204, U2404)

# One image per CUDA version, all with the same kernels (SASS 6.0-8.9, from llamacpp:b5000-cu122), so
# only the CUDA version differs; min_driver is CUDA's own (engines.yaml cuda_toolkits, last update).
IMAGES = {"12.1": "llamacpp:t-cu121", "12.4": "llamacpp:t-cu124", "12.8": "llamacpp:t-cu128",
          "12.9": "llamacpp:t-cu129", "13.0": "llamacpp:t-cu130"}


def _with_test_images() -> compat.EngineCatalog:
    base = CAT.images["llamacpp:b5000-cu122"]
    extra = {key: base.model_copy(update={"key": key, "cuda": f"{cuda}.0",
                                          "min_driver": CAT.cuda_toolkits[cuda][-1]})
             for cuda, key in IMAGES.items()}
    return CAT.model_copy(update={"images": {**CAT.images, **extra}})


TCAT = _with_test_images()


def _archive_only(prov: ProvisioningCatalog) -> ProvisioningCatalog:
    """The distributions' own archives only (no NVIDIA CUDA repository): Debian 12 R535/R470, 13 R550/R535."""
    dists = {k: d.model_copy(update={"drivers": [e for e in d.drivers if "CUDA repository" not in e.origin]})
             for k, d in prov.distributions.items()}
    return prov.model_copy(update={"distributions": dists})


ARCHIVE = _archive_only(PROV)


def _choose(cards, images, distro, **kw):
    return choose_driver(cards, images, distro, catalog=TCAT, today=TODAY, **kw)


# ------------------------------------------------------------------------------------------------
# The full catalog: every distribution has a branch that runs CUDA 13.0 natively, so the highest
# long-term-support/production branch that still drives the card wins.


def _expected_full(card: str, distro: Distro) -> int:
    if distro == U2404:
        return 580 if card in OLD_CARDS else 595  # R595 (production until 2027-03) drops Volta/Pascal
    return 580


@pytest.mark.parametrize("distro", DISTROS, ids=str)
@pytest.mark.parametrize("cuda", list(IMAGES))
@pytest.mark.parametrize("card", CARDS)
def test_full_catalog_table(card, cuda, distro):
    choice = _choose([card], [IMAGES[cuda]], distro)
    assert choice.branch == _expected_full(card, distro)
    assert choice.why.startswith(f"R{choice.branch}: ") and card in choice.why and "\n" not in choice.why
    assert f"{IMAGES[cuda]} natively" in choice.why
    assert not [w for w in choice.warnings if "compatibility" in w]
    if card in OLD_CARDS:
        assert "last branch 580" in choice.why
    if distro.id == "ubuntu":
        assert f"nvidia-headless-{choice.branch}-server" in choice.packages
        assert f"nvidia-utils-{choice.branch}-server" in choice.hold
    else:
        assert "nvidia-driver" in choice.packages and "nvidia-kernel-dkms" in choice.hold
        assert choice.kernel_modules == "proprietary"  # Volta/Pascal never run the open modules


# ------------------------------------------------------------------------------------------------
# The distributions' own archives: Debian 12 packages R535 (and Tesla R470), Debian 13 R550 (and
# Tesla R535). Images newer than the branch run only through minor-version compatibility: chosen,
# with a WARN saying so.

ARCHIVE_NATIVE = {(DEB12, "12.1"): 535, (DEB13, "12.1"): 550, (DEB13, "12.4"): 550}
ARCHIVE_MINOR = {(DEB12, "12.4"): 535, (DEB12, "12.8"): 535, (DEB12, "12.9"): 535,
                 (DEB13, "12.8"): 550, (DEB13, "12.9"): 550}


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize(("distro", "cuda"), [*ARCHIVE_NATIVE, *ARCHIVE_MINOR], ids=str)
def test_archive_only_table(card, distro, cuda):
    choice = _choose([card], [IMAGES[cuda]], distro, provisioning=ARCHIVE)
    native = (distro, cuda) in ARCHIVE_NATIVE
    assert choice.branch == (ARCHIVE_NATIVE if native else ARCHIVE_MINOR)[(distro, cuda)]
    # R535's end of life (2026-06, confirmed) is past: forward compatibility is refused there, minor-version
    # compatibility remains; R550's (2025-02) is unconfirmed, so a data-center card keeps forward compatibility
    kind = "forward" if distro == DEB13 and card not in GEFORCE else "minor-version"
    compat_warns = [w for w in choice.warnings if f"through {kind} compatibility" in w]
    assert bool(compat_warns) is not native
    assert ("natively" in choice.why) is native
    if not native:
        assert f"through {kind} compatibility" in choice.why


@pytest.mark.parametrize("distro", [DEB12, DEB13], ids=str)
@pytest.mark.parametrize("card", sorted(GEFORCE))
def test_archive_only_cuda13_on_geforce_has_no_branch(card, distro):
    # no branch of CUDA 13 in the archive, and forward compatibility covers data-center parts only
    with pytest.raises(UsageError, match=rf"no driver branch packaged for {distro} .*drives every card and runs every image"):
        _choose([card], [IMAGES["13.0"]], distro, provisioning=ARCHIVE)


def test_unsupported_distribution_names_the_supported_ones():
    for distro in (Distro("rhel", "9"), Distro("debian", "11"), Distro("ubuntu", "20.04")):
        with pytest.raises(UsageError) as err:
            _choose([T4], [IMAGES["12.1"]], distro)
        msg = str(err.value)
        assert "\n" not in msg and f"{distro}" in msg
        assert "debian 12, debian 13, ubuntu 22.04, ubuntu 24.04" in msg


def test_codename_is_accepted():
    assert _choose([T4], [IMAGES["12.1"]], Distro("debian", "bookworm")).branch == 580


# ------------------------------------------------------------------------------------------------
# Pinned branches


def test_pinned_branch_that_drops_the_card_is_refused():
    with pytest.raises(UsageError) as err:
        _choose([V100], [IMAGES["13.0"]], U2404, pinned_branch=595)
    assert str(err.value) == ("R595 drops Tesla V100-SXM2-32GB (Volta): the last branch that drives it is 580")


def test_pinned_branch_not_packaged_is_refused():
    with pytest.raises(UsageError, match=r"R590 is not packaged for debian 12 .*\(packaged: R580, R570, R535, R470\)"):
        _choose([T4], [IMAGES["12.1"]], DEB12, pinned_branch=590)


def test_pinned_branch_too_old_for_the_image_is_refused():
    with pytest.raises(UsageError, match=r"^R470 is too old for llamacpp:t-cu121 \(CUDA 12\.1\.0 needs driver >= 530\.30\.02\)"):
        _choose([RTX4090], [IMAGES["12.1"]], DEB12, pinned_branch=470, provisioning=ARCHIVE)


def test_pinned_branch_below_the_best_is_kept_and_says_so():
    choice = _choose([T4], [IMAGES["12.8"]], DEB12, pinned_branch=535)
    assert choice.branch == 535 and choice.version == "535.247.01"
    assert choice.why.startswith("R535: pinned by the inventory")
    assert any("minor-version compatibility" in w for w in choice.warnings)
    assert any("past its end of life (2026-06)" in w for w in choice.warnings)
    assert choice.pinned == ("nvidia-driver=535.247.01-1~deb12u1", "nvidia-kernel-dkms=535.247.01-1~deb12u1")


def test_every_card_must_be_driven():
    # a host with a T4 and a V100: R595 would drive the T4 but drops the V100
    choice = _choose([T4, V100], [IMAGES["13.0"]], U2404)
    assert choice.branch == 580 and T4 in choice.why and V100 in choice.why


# ------------------------------------------------------------------------------------------------
# Warnings: what the catalog cannot confirm is said, never silently passed


def test_unknown_card_and_image_are_warned_not_refused():
    choice = _choose(["NVIDIA Imaginary X1", T4], ["vllm:9.9.9", IMAGES["12.1"]], DEB13)
    assert choice.branch == 580
    assert any("'NVIDIA Imaginary X1' is not in catalog/gpus.yaml" in w for w in choice.warnings)
    assert any("'vllm:9.9.9' is not in catalog/engines.yaml" in w for w in choice.warnings)


def test_unconfirmed_entry_warns():
    choice = _choose([T4], [IMAGES["12.8"]], DEB12)
    assert choice.confidence == "U"
    assert any(w.startswith("WARN R580 on debian 12") and "unconfirmed (confidence U)" in w for w in choice.warnings)
    confirmed = _choose([T4], [IMAGES["12.1"]], U2404)
    assert confirmed.confidence == "H" and not [w for w in confirmed.warnings if "confidence U" in w]


def test_branch_without_a_version_warns_and_pins_nothing():
    choice = _choose([L4], [IMAGES["12.9"]], U2204)
    assert choice.branch == 580 and choice.version is None and choice.pinned == ()
    assert any("no version in the catalog" in w for w in choice.warnings)


def test_cpu_images_do_not_constrain_the_branch():
    choice = _choose([P40], ["llamacpp:lab-cpu", IMAGES["12.1"]], DEB12, provisioning=ARCHIVE)
    assert choice.branch == 535 and "lab-cpu" not in choice.why


# ------------------------------------------------------------------------------------------------
# Packages


def test_headers_follow_the_distribution_rule():
    assert headers_packages(DEB12, "6.1.0-37-amd64") == ("linux-headers-amd64", "linux-headers-6.1.0-37-amd64")
    assert headers_packages(DEB12, None) == ("linux-headers-amd64",)
    assert headers_packages(U2404, "6.8.0-60-generic") == ("linux-headers-6.8.0-60-generic",)
    choice = _choose([T4], [IMAGES["12.1"]], DEB12, kernel_release="6.1.0-37-amd64")
    assert choice.packages[:2] == ("linux-headers-amd64", "linux-headers-6.1.0-37-amd64")
    assert not [h for h in choice.hold if h.startswith("linux-headers")]
    assert "nvidia-persistenced" in choice.packages and choice.persistence_unit == "nvidia-persistenced.service"


@pytest.mark.parametrize("distro", DISTROS, ids=str)
def test_toolkit_is_pinned_at_the_security_fixed_release(distro):
    assert toolkit_packages(distro) == ("nvidia-container-toolkit=1.19.1-1", "nvidia-container-toolkit-base=1.19.1-1",
                                        "libnvidia-container-tools=1.19.1-1", "libnvidia-container1=1.19.1-1")


def test_toolkit_security_gap_names_each_missed_cve():
    gap = toolkit_security_gap("1.17.7-1")
    assert gap is not None and "CVE-2026-24260" in gap and "CVE-2025-23266" in gap and "CVE-2024-0132" not in gap
    assert toolkit_security_gap("1.19.1-1") is None and toolkit_security_gap("1.20.0") is None
    assert toolkit_security_gap("garbage") is None


def test_runtime_packages_per_distribution():
    assert runtime_packages(DEB12) == ("docker.io=20.10.24+dfsg1-1+deb12u1+b6", "docker-compose=2.26.1-4")
    assert runtime_suites(DEB12) == {"docker.io": "bookworm", "docker-compose": "trixie"}
    assert runtime_packages(DEB13) == ("docker.io=26.1.5+dfsg1-9+deb13u1+b1", "docker-compose=2.26.1-4")
    assert runtime_packages(U2404) == ("docker.io", "docker-compose-v2=2.24.6+ds1-0ubuntu2")
    assert any("docker.io on ubuntu 24.04 is unconfirmed" in w for w in catalog_warnings(U2404))
    assert catalog_warnings(DEB12) == ()


def test_every_catalog_entry_has_an_openable_source():
    tk = PROV.toolkit
    pairs = [(tk.source, tk.confidence), (tk.packages_source, tk.packages_confidence),
             (tk.deb_version_source, tk.deb_version_confidence), (tk.configure_source, tk.configure_confidence)]
    pairs += [(f.source, f.confidence) for f in tk.security_floors]
    for d in PROV.distributions.values():
        pairs += [(d.headers.source, d.headers.confidence), (d.persistence.source, d.persistence.confidence)]
        pairs += [(e.source, e.confidence) for e in d.drivers]
        pairs += [(r.source, r.confidence) for r in (d.runtime.engine, d.runtime.compose)]
    for source, confidence in pairs:
        assert "https://" in source and confidence in ("H", "M", "U"), source
        assert "../shared" not in source


def test_catalog_branches_are_known_to_the_engine_catalog():
    # every packaged branch has a CUDA row in engines.yaml, so the choice never guesses what it supports
    for d in PROV.distributions.values():
        for e in d.drivers:
            assert compat.branch_cuda(f"{e.branch}.0", CAT.driver_branches) is not None
            if e.version:
                assert compat.version_tuple(e.version)[0] == e.branch  # type: ignore[index]
