"""Host states and rendered releases for the deploy decision and executor tests (no host needed).

``svc_state`` writes a service's state the way the host's state reader returns it, from a compact
description: ``{release_id: (content_hash, healthy)}``, the current release and the unit state.
"""

from __future__ import annotations

from datetime import UTC, datetime

from llmfleet.images.lock import ImageLock, LockedImage, resolve
from llmfleet.inventory.services import HostSettings, host_settings
from llmfleet.knowledge.planner import PlanSummary
from llmfleet.knowledge.release_state import Manifest, ReleaseInfo, ServiceState
from llmfleet.release.render import Rendered, render

DIGEST = "sha256:" + "cd" * 32
OLD_DIGEST = "sha256:" + "ab" * 32
REPO = "reg.lab:5000/llamacpp"
LOCK = ImageLock(images={"llamacpp:b1": LockedImage("llamacpp:b1", REPO, DIGEST, "b1"),
                         "llamacpp:b0": LockedImage("llamacpp:b0", REPO, OLD_DIGEST, "b0")})
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
ROOT = "/opt/llmfleet"
R1, R2, R3, R4, R5, R6, R7 = (f"2026110{i}T000000Z-{i:010x}" for i in range(1, 8))


def host(**svc) -> HostSettings:
    base = {"name": "chat", "engine": "llamacpp", "model": "tiny", "model_path": "/srv/models/t.gguf",
            "image": "llamacpp:b1", "port": 8080}
    base.update(svc)
    return host_settings("h1", {"llmfleet_services": [base], "llmfleet_root": ROOT})


def rendered(**svc) -> Rendered:
    hs = host(**svc)
    s = hs.services[0]
    return render(s, hs, resolve(s.image, LOCK), PlanSummary(engine_args=("-ngl", "99")),
                  api_key="sk-secret-123" if s.api_key else None)


def manifest(rid: str, content_hash: str, *, ref: str = f"{REPO}@{OLD_DIGEST}", args: tuple[str, ...] = ()) -> Manifest:
    return Manifest(release=rid, service="chat", engine="llamacpp", content_hash=content_hash,
                    image={"ref": ref, "digest": ref.rsplit("@", 1)[-1]}, engine_args=args)


def svc_state(releases: dict[str, tuple[str | None, bool]], current: str | None = None, unit: str = "active",
              name: str = "chat", refs: dict[str, str] | None = None) -> ServiceState:
    """``releases``: id -> (content hash or None for an unreadable manifest, healthy?)."""
    st = ServiceState(name=name, current=current, unit=unit)
    for rid, (chash, healthy) in releases.items():
        m = None
        if chash is not None:
            m = manifest(rid, chash, **({"ref": refs[rid]} if refs and rid in refs else {}))
        st.releases[rid] = ReleaseInfo(rid, m, {"result": "healthy", "decode_tokps": 50.0} if healthy else None)
    return st
