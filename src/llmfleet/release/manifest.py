"""Writing a release's manifest (``releases/<id>/manifest.json``): ``build`` from the rendered files.

The model, its one-line text and its reader (``Manifest``, ``to_text``, ``parse``) are
``llmfleet.knowledge.release_state``, where the host's release state is read too. Secret values never
appear; the env file's hash is left out too (a short key could be guessed from it).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from llmfleet.knowledge.release_state import Manifest
from llmfleet.release.render import Rendered


def file_hashes(rendered: Rendered) -> dict[str, str]:
    """sha256 of each rendered file that holds no secret."""
    return {name: hashlib.sha256(text.encode()).hexdigest()
            for name, text in sorted(rendered.files.items()) if name not in rendered.secret_files}


def build(rendered: Rendered, release_id: str, *, host: str, who: str, when: datetime, llmfleet_version: str,
          message: str = "") -> Manifest:
    """The manifest of a release about to be uploaded: what it is, from what, by whom, when."""
    return Manifest(
        release=release_id, service=rendered.service, engine=rendered.engine, host=host, who=who,
        time=when.astimezone(UTC).isoformat(timespec="seconds"), content_hash=rendered.content_hash,
        image=rendered.image.to_dict(), engine_args=tuple(rendered.engine_args), inputs=dict(rendered.inputs),
        plan=rendered.plan, files=file_hashes(rendered), llmfleet=llmfleet_version, message=message,
    )
