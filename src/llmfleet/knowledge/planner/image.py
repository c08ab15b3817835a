"""The catalog image a plan is judged against: the one asked for, else the newest that has kernels for
the card (and runs on the host's driver); why none does; what a driver that does not run it means."""

from __future__ import annotations

import re
from typing import Any

from llmfleet.knowledge import compat
from llmfleet.knowledge.catalog import Gpu
from llmfleet.knowledge.engines import for_engine
from llmfleet.knowledge.engines import names as engine_names
from llmfleet.knowledge.planner.request import PlanRequest


def _judged_release(req: PlanRequest, cat: compat.EngineCatalog, engine: str, gpu: Gpu,
                    release: compat.EngineRelease | None) -> tuple[compat.EngineRelease | None, str]:
    """(the image the flags are judged against, a note on how it was chosen or why it does not run)."""
    if release is not None:
        if req.driver and not release.cpu and _driver_verdict(cat, release, gpu, req.driver).status == "fail":
            return release, _driver_note(cat, release, gpu, req.driver)
        return release, ""
    release = _default_release(cat, engine, gpu, req.driver)
    if release is None:
        return None, (f"no catalog {engine} image has kernels for compute capability {gpu.compute_capability}: "
                      "the engine flags are not checked against a build")
    on_driver = f" that runs on driver {req.driver}" if req.driver else ""
    verdict = _driver_verdict(cat, release, gpu, req.driver) if req.driver else None
    if verdict is not None and verdict.status == "fail":
        return release, (f"no catalog {engine} image with kernels for compute capability {gpu.compute_capability} "
                         f"runs on driver {req.driver}: judged against {release.key}; "
                         + _driver_note(cat, release, gpu, str(req.driver)))
    return release, (f"judged against image {release.key} (no image given: the newest catalog {engine} image "
                     f"with kernels for compute capability {gpu.compute_capability}{on_driver}); "
                     "pass --image KEY for another"
                     + (f"; on this driver: {verdict.message}" if verdict is not None and verdict.status == "warn"
                        else "")
                     + _newer_without_kernels(cat, engine, release, gpu))


def _toolkit_refusal(req: PlanRequest, cat: compat.EngineCatalog, engine: str, gpu: Gpu,
                     release: compat.EngineRelease) -> str:
    """The refusal of a plan whose judged image the NVIDIA container toolkit will not start on the
    host's driver (its NVIDIA_REQUIRE_CUDA: read from the image, images.lock or the catalog's base):
    the image asked for, or the default where no catalog image of the engine with kernels for the card
    starts there; with the toolkit's reason, the fix and what does run. "" otherwise."""
    if not req.driver or release.cpu:
        return ""
    verdict = _driver_verdict(cat, release, gpu, req.driver)
    if verdict.status != "fail" or not verdict.message.startswith(compat.TOOLKIT_REFUSES):
        return ""
    head = "" if req.image else (f"no catalog {engine} image with kernels for compute capability "
                                 f"{gpu.compute_capability} runs on driver {req.driver}: judged against {release.key}; ")
    alternatives = compat.driver_alternatives(release, cat, **_driver_host(gpu, req.driver))
    return "; ".join([f"REFUSED: {head}image {release.key} does not run on this host: {verdict.message}",
                      f"fix: {verdict.fix}", *alternatives])


def _no_image_refusal(cat: Any, engine: str, gpu: Gpu) -> str:
    """Why a plan for an engine none of whose catalog GPU images has kernels for the card is refused:
    the engine's own lowest compute capability (catalog engines.yaml, with its source) where the card is
    below it, and the engines whose catalog images do run there."""
    label = for_engine(engine).label
    cc = gpu.compute_capability
    rules = cat.engines.get(engine)
    floor = ""
    if rules is not None and rules.min_cc and (compat.cc_tuple(cc) or (0, 0)) < (compat.cc_tuple(rules.min_cc) or (0, 0)):
        floor = (f": {label} needs compute capability {rules.min_cc} or higher (catalog engines.yaml, confidence "
                 f"{rules.min_cc_confidence or 'U'}: {rules.min_cc_source or 'no source recorded'})")
    others = [for_engine(e) for e in engine_names() if e != engine and _default_release(cat, e, gpu) is not None]
    fix = ("; serve this card with " + " or ".join(
        f"{k.label} (--engine {k.name}" + (f" and a {k.quant_family.upper()} --quant or file" if k.serves_only_quant_family
                                           else "") + ")" for k in others)
           if others else "; no catalog image of any engine runs on it")
    return (f"REFUSED: no {label} image in the catalog runs on {gpu.name} (compute capability {cc}){floor}"
            + fix)


def _default_release(cat: Any, engine: str, gpu: Gpu, driver: str | None = None) -> Any:
    """The catalog image a plan without --image is judged against: a GPU image of the engine whose
    kernels run on the card; with the host's ``driver`` known, one that runs on that driver first (then
    one only the container toolkit's NVIDIA_REQUIRE_CUDA check refuses, which NVIDIA_DISABLE_REQUIRE=1
    lifts); then builds that keep only the window of sliding-window layers, then the highest version
    (a floating tag such as server-cuda counts as newest)."""
    found = []
    for pos, rel in enumerate(cat.images.values()):
        if rel.engine != engine or rel.cpu or compat.kernel_coverage(rel, gpu.compute_capability) is None:
            continue
        runs = 2 if not driver or _driver_verdict(cat, rel, gpu, driver).status != "fail" else (
            1 if _driver_verdict(cat, rel, gpu, driver, lifted=True).status != "fail" else 0)
        window = rel.kv_layout is not None and rel.kv_layout.sliding_window == "window"
        m = re.match(r"v?(\d+(?:\.\d+)+)", rel.version)
        version = tuple(int(x) for x in m.group(1).split(".")) if m else (1 << 30,)  # a floating tag: newest
        found.append((runs, window, version, -pos, rel))
    return max(found, key=lambda f: f[:4])[4] if found else None


def _release_version(rel: Any) -> tuple[int, ...] | None:
    m = re.match(r"v?(\d+(?:\.\d+)+)", rel.version)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _newer_without_kernels(cat: Any, engine: str, release: Any, gpu: Gpu) -> str:
    """"; vllm:0.20.0 ... vllm:0.33.0 (newer) have no kernels for CC 7.0" where the catalog holds newer
    releases of the engine that do not run on the card: the default is then the last one that does."""
    mine = _release_version(release)
    if mine is None:
        return ""
    newer = []
    for rel in cat.images.values():
        v = _release_version(rel)
        if rel.engine == engine and not rel.cpu and v is not None and v > mine \
                and compat.kernel_coverage(rel, gpu.compute_capability) is None:
            newer.append((v, rel))
    if not newer:
        return ""
    newer.sort(key=lambda n: n[0])
    first, last = newer[0][1], newer[-1][1]
    span = first.key if first is last else f"{first.key} to {last.key}"
    why = ""
    if first.torch is not None and compat.kernels_cover(first.torch.kernels, gpu.compute_capability) is None:
        why = f" (from {first.key} on, the torch build has none either: torch {first.torch.version})"
    n = len(newer)
    return (f"; {release.key} is the newest {engine} release in the catalog that runs on compute capability "
            f"{gpu.compute_capability}: the {n} newer release{'s' if n > 1 else ''} ({span}) "
            f"{'have' if n > 1 else 'has'} no kernels for it{why}")


def _driver_host(gpu: Gpu, driver: str) -> dict[str, Any]:
    """What a plan knows of a host for the driver rule: the driver and the card (nothing of its toolkit
    or runtimes, which only forward compatibility needs: the rule says what it could not judge)."""
    return dict(driver=driver, cuda_driver=None, gpu_name=gpu.name, cc=gpu.compute_capability,
                data_center=gpu.data_center, toolkit_version=None, runtimes=[])


def _driver_verdict(cat: Any, rel: Any, gpu: Gpu, driver: str, *, lifted: bool = False) -> Any:
    """The driver rule on this card; ``lifted``: with NVIDIA_DISABLE_REQUIRE=1 in the service's env."""
    env = {"NVIDIA_DISABLE_REQUIRE": "1"} if lifted else None
    return compat.check_cuda_driver(rel, cat, **_driver_host(gpu, driver), env=env)


def _driver_note(cat: Any, rel: Any, gpu: Gpu, driver: str) -> str:
    """Why ``rel`` does not run on ``driver``, and what does (the preflight's own answer)."""
    verdict = _driver_verdict(cat, rel, gpu, driver)
    alternatives = compat.driver_alternatives(rel, cat, **_driver_host(gpu, driver))
    return "; ".join([f"image {rel.key} does not run on this host: {verdict.message}", *alternatives])
