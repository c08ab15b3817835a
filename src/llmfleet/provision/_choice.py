"""Stand-in for ``llmfleet.knowledge.driver_choice`` (its interface as the provisioning design gives it)
until that module exists; deleted then. Debian 12 only, one fixed rule: the pinned branch, else R535."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmfleet.errors import UsageError

SUPPORTED = (("debian", "12"), ("debian", "13"), ("ubuntu", "22.04"), ("ubuntu", "24.04"))


@dataclass(frozen=True)
class Distro:
    id: str
    version: str


@dataclass(frozen=True)
class DriverChoice:
    branch: int
    packages: tuple[str, ...]
    hold: tuple[str, ...]
    why: str
    source: str
    confidence: str
    warnings: tuple[str, ...] = ()


def choose_driver(cards: Sequence[str], images: Sequence[str], distro: Distro, *,
                  pinned_branch: int | None = None) -> DriverChoice:
    if (distro.id, distro.version) not in SUPPORTED:
        names = ", ".join(f"{i} {v}" for i, v in SUPPORTED)
        raise UsageError(f"{distro.id} {distro.version} is not supported for provisioning (supported: {names})")
    branch = pinned_branch or 535
    pkg = (f"nvidia-tesla-{branch}-driver" if distro.id == "debian" else f"nvidia-headless-{branch}-server")
    return DriverChoice(branch=branch, packages=(pkg, "nvidia-persistenced"), hold=(pkg,),
                        why=f"R{branch}: stand-in rule until the driver catalog lands", source="", confidence="U",
                        warnings=("driver choice by a stand-in rule",))


def toolkit_packages(distro: Distro) -> tuple[str, ...]:
    v = "1.17.8-1"
    return (f"nvidia-container-toolkit={v}", f"nvidia-container-toolkit-base={v}", f"libnvidia-container-tools={v}",
            f"libnvidia-container1={v}")


def runtime_packages(distro: Distro) -> tuple[str, ...]:
    return ("docker.io", "docker-compose")
