"""A release's manifest: what the release is and where it came from (``releases/<id>/manifest.json``).

One writer (``Manifest.build`` + ``to_text``) and one reader (``Manifest.parse``). The file is one
line of JSON so that the host's state reader returns many manifests line by line. Secret values never
appear; the env file's hash is left out too (a short key could be guessed from it). ``parse`` never
raises on what a host returns: a document that is not a JSON object is ``None``, a missing or
mistyped key is its empty value.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from llmfleet.images.registry import split_reference
from llmfleet.knowledge.planner import PlanSummary
from llmfleet.release.render import Rendered


def file_hashes(rendered: Rendered) -> dict[str, str]:
    """sha256 of each rendered file that holds no secret."""
    return {name: hashlib.sha256(text.encode()).hexdigest()
            for name, text in sorted(rendered.files.items()) if name not in rendered.secret_files}


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

    @classmethod
    def build(cls, rendered: Rendered, release_id: str, *, host: str, who: str, when: datetime,
              llmfleet_version: str, message: str = "") -> Manifest:
        return cls(
            release=release_id, service=rendered.service, engine=rendered.engine, host=host, who=who,
            time=when.astimezone(UTC).isoformat(timespec="seconds"), content_hash=rendered.content_hash,
            image=rendered.image.to_dict(), engine_args=tuple(rendered.engine_args), inputs=dict(rendered.inputs),
            plan=rendered.plan, files=file_hashes(rendered), llmfleet=llmfleet_version, message=message,
        )

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
            try:
                data = json.loads(data)
            except ValueError:
                return None
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
        return split_reference(self.image_ref)[2] if self.image_ref else None

    def plan_summary(self) -> PlanSummary | None:
        return PlanSummary.from_dict(self.plan) if self.plan else None
