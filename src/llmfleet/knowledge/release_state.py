"""What a host holds of its releases, as its state reader reports it: each service's ``current``
release, unit state and kept releases, each with its manifest (``releases/<id>/manifest.json``) and
health mark (``health.json``).

The model and its readers only, pure: the reader script is ``llmfleet.host.probe.state_reader`` (the
host probe sends it; ``llmfleet.release.store.state_script`` runs it alone), and a manifest is written
by ``llmfleet.release.manifest.build``. ``Manifest.parse`` and ``parse_state`` never raise on what a host
returns: a document that is not a JSON object is ``None``, a missing or mistyped key is its empty value.
The manifest is one line of JSON so that the state reader returns many manifests line by line.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from llmfleet.knowledge.planner import PlanSummary

RELEASE_ID_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{10}$")


def release_time(release_id: str) -> datetime:
    return datetime.strptime(release_id.split("-", 1)[0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


def loads_object(text: str) -> dict[str, Any] | None:
    """A JSON object from a host's text; None for anything else."""
    try:
        v = json.loads(text)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


@dataclass(frozen=True)
class Manifest:
    release: str
    service: str
    engine: str = ""
    host: str = ""
    who: str = ""
    time: str = ""
    content_hash: str = ""
    image: dict[str, Any] = field(default_factory=dict)
    engine_args: tuple[str, ...] = ()
    inputs: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] | None = None
    files: dict[str, str] = field(default_factory=dict)
    llmfleet: str = ""
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["engine_args"] = list(self.engine_args)
        if not self.message:
            d.pop("message")
        return d

    def to_text(self) -> str:
        """One line of JSON and a newline: the file's exact content."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")) + "\n"

    @classmethod
    def parse(cls, data: str | dict[str, Any] | None) -> Manifest | None:
        if isinstance(data, str):
            data = loads_object(data)
        if not isinstance(data, dict):
            return None

        def text(key: str) -> str:
            v = data.get(key)
            return v if isinstance(v, str) else ""

        def mapping(key: str) -> dict[str, Any]:
            v = data.get(key)
            return v if isinstance(v, dict) else {}

        args = data.get("engine_args")
        plan = data.get("plan")
        return cls(
            release=text("release"), service=text("service"), engine=text("engine"), host=text("host"),
            who=text("who"), time=text("time"), content_hash=text("content_hash"), image=mapping("image"),
            engine_args=tuple(str(a) for a in args) if isinstance(args, list) else (),
            inputs=mapping("inputs"), plan=plan if isinstance(plan, dict) else None,
            files={str(k): str(v) for k, v in mapping("files").items()}, llmfleet=text("llmfleet"),
            message=text("message"),
        )

    @property
    def image_ref(self) -> str | None:
        ref = self.image.get("ref")
        return ref if isinstance(ref, str) and ref else None

    @property
    def digest(self) -> str | None:
        d = self.image.get("digest")
        if isinstance(d, str) and d:
            return d
        ref = self.image_ref
        return ref.rsplit("@", 1)[1] if ref and "@" in ref else None  # repo@digest (images.registry.split_reference)

    def plan_summary(self) -> PlanSummary | None:
        return PlanSummary.from_dict(self.plan) if self.plan else None


@dataclass
class ReleaseInfo:
    id: str
    manifest: Manifest | None = None
    health: dict[str, Any] | None = None

    @property
    def healthy(self) -> bool:
        """Confirmed healthy: its ``health.json`` says ``healthy``. That mark is written only after a
        health check passed and, for a switch, after the controller's confirmation won against the
        host timer (``llmfleet.release.confirm``); a release a deploy switched to and never confirmed
        (the controller killed, the connection lost) has no mark, one whose check failed is marked
        ``unhealthy``. Only a confirmed release is ever gone back to (``decide.go_back_target``)."""
        return bool(self.health and self.health.get("result") == "healthy")

    @property
    def confirmed_at(self) -> datetime | None:
        """When it was last confirmed healthy: the mark's ``time`` (each health check that passes,
        a go-back's included, writes it anew); a mark without a readable time counts from the
        release's creation (its id). None when it is not confirmed."""
        if not self.healthy:
            return None
        assert self.health is not None
        try:
            t = datetime.fromisoformat(str(self.health.get("time") or ""))
        except ValueError:
            return release_time(self.id) if RELEASE_ID_RE.match(self.id) else datetime.min.replace(tzinfo=UTC)
        return t if t.tzinfo is not None else t.replace(tzinfo=UTC)

    @property
    def image_ref(self) -> str | None:
        return self.manifest.image_ref if self.manifest else None


@dataclass
class ServiceState:
    name: str
    current: str | None = None
    unit: str = "unknown"
    releases: dict[str, ReleaseInfo] = field(default_factory=dict)

    @property
    def current_release(self) -> ReleaseInfo | None:
        return self.releases.get(self.current) if self.current else None


def state_complete(stdout: str) -> bool:
    """The reader ran to its end (a state cut short must not be taken for the whole)."""
    return "@@end" in stdout.splitlines()


def parse_state(stdout: str) -> dict[str, ServiceState]:
    """The reader's section up to its ``@@end``: what a script prints after it (``invoke status`` reads
    each model's manifest next, with ``@@manifest`` lines of its own) is not the releases'."""
    services: dict[str, ServiceState] = {}
    cur: ServiceState | None = None
    rel: ReleaseInfo | None = None
    for line in stdout.splitlines():
        if line == "@@end":
            break
        if line.startswith("@@service "):
            cur = services.setdefault(line[10:].strip(), ServiceState(name=line[10:].strip()))
            rel = None
        elif cur is None:
            continue
        elif line.startswith("@@current"):
            target = line[9:].strip()
            cur.current = target.rstrip("/").rsplit("/", 1)[-1] if target else None
        elif line.startswith("@@unit"):
            cur.unit = line[6:].strip() or "unknown"
        elif line.startswith("@@release "):
            rid = line[10:].strip()
            rel = cur.releases.setdefault(rid, ReleaseInfo(id=rid)) if RELEASE_ID_RE.match(rid) else None
        elif line.startswith("@@manifest ") and rel is not None:
            rel.manifest = Manifest.parse(line[11:])
        elif line.startswith("@@health ") and rel is not None:
            rel.health = loads_object(line[9:])
    return services


@dataclass(frozen=True)
class UnitProbe:
    """A service's unit and container state, as one round trip saw them (the health check's first
    stages and the switch read it; ``release.store.parse_unit_probe`` builds it)."""

    unit: str
    container: str | None
    exit_code: int | None
