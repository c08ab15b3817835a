"""Which releases the hosts of a service over several hosts ran together, and which set to go back to.

Release ids are per host (each host renders its own release: the head's ``llama-server`` or ``vllm
serve``, each worker's ``rpc-server`` or Ray worker), and a host's release can be reused by a later
deploy with a different partner (a worker unchanged while the head's flags change). So the pairing is
recorded: every committed deploy or rollback of the service appends one line to
``services/<svc>/cluster.jsonl`` on **every** host of it (the last ``KEEP`` lines are kept)::

    {"time": "2026-12-01T10:00:00+00:00", "action": "deploy", "head": "gpu-a",
     "releases": {"gpu-a": "<release id>", "gpu-b": "<release id>"}}

A rollback reads the lines of every host (a worker's copy serves when the head's is gone), and
``shared_target`` picks the set to go back to, as a single host's rollback does: the newest set
older than the one serving now (sets ordered by the first time they were recorded; failing that, the
newest other one), whose release is still on every host and was marked healthy there. Pure; the scripts have golden files.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from llmfleet.knowledge import release_state
from llmfleet.release import store
from llmfleet.release.decide import Refusal, Result

HISTORY = "cluster.jsonl"
KEEP = 50
MARK = "@@cluster-set"


@dataclass(frozen=True)
class ClusterSet:
    """One committed deploy or rollback of the service: each host's release."""

    time: str
    action: str
    head: str
    releases: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.releases.items()))

    def to_dict(self) -> dict[str, Any]:
        return {"time": self.time, "action": self.action, "head": self.head, "releases": dict(self.releases)}


def record(*, now: datetime, action: str, head: str, releases: Mapping[str, str]) -> ClusterSet:
    for rid in releases.values():
        store._check_id(rid)
    return ClusterSet(now.isoformat(timespec="seconds"), action, head, dict(sorted(releases.items())))


def append_script(paths: store.Paths, entry: ClusterSet) -> str:
    """Append the line to the service's history, keeping the last ``KEEP`` lines."""
    line = json.dumps(entry.to_dict(), sort_keys=True, separators=(",", ":"))
    f = shlex.quote(f"{paths.service_dir}/{HISTORY}")
    return "\n".join([
        f"printf '%s\\n' {shlex.quote(line)} >> {f}",
        f"tail -n {KEEP} {f} > {f}.tmp && mv -f {f}.tmp {f}",
    ])


def read_script(paths: store.Paths) -> str:
    """The service's history, one ``@@cluster-set`` line per entry."""
    f = shlex.quote(f"{paths.service_dir}/{HISTORY}")
    return f"tail -n {KEEP} {f} 2>/dev/null | sed 's/^/{MARK} /'\necho '@@end'"


def parse(stdout: str) -> list[ClusterSet]:
    out = []
    for line in stdout.splitlines():
        if not line.startswith(MARK + " "):
            continue
        try:
            d = json.loads(line[len(MARK) + 1:])
        except ValueError:
            continue
        rel = d.get("releases") if isinstance(d, dict) else None
        if not isinstance(rel, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in rel.items()):
            continue
        out.append(ClusterSet(str(d.get("time", "")), str(d.get("action", "")), str(d.get("head", "")),
                              dict(sorted(rel.items()))))
    return out


def merge(histories: Sequence[Sequence[ClusterSet]]) -> list[ClusterSet]:
    """Every host's lines as one history, oldest first, each line once."""
    seen: dict[tuple[Any, ...], ClusterSet] = {}
    for h in histories:
        for e in h:
            seen.setdefault((e.time, e.action, e.key), e)
    return sorted(seen.values(), key=lambda e: (e.time, e.key))


def current_set(states: Mapping[str, release_state.ServiceState | None]) -> dict[str, str | None]:
    return {h: (st.current if st else None) for h, st in states.items()}


def shared_target(service: str, hosts: Sequence[str], states: Mapping[str, release_state.ServiceState | None],
                  history: Sequence[ClusterSet], *, to: str | None = None) -> ClusterSet:
    """The set of releases every host of the service goes back to. ``hosts``: the service's hosts now
    (head and workers); ``to``: a release id of any host (the set that holds it, newest first).
    Raises ``Refusal`` (failed) with one line naming what is missing."""
    names = sorted(hosts)
    where = f"service {service} over {', '.join(names)}"
    now = current_set(states)
    first_seen: dict[tuple[tuple[str, str], ...], str] = {}
    latest: dict[tuple[tuple[str, str], ...], ClusterSet] = {}
    for e in history:
        first_seen.setdefault(e.key, e.time)
        latest[e.key] = e

    def usable(e: ClusterSet) -> str | None:
        """Why the set cannot be gone back to, or None."""
        if sorted(e.releases) != names:
            return f"it was deployed over {', '.join(sorted(e.releases))}"
        for h, rid in sorted(e.releases.items()):
            st = states.get(h)
            info = st.releases.get(rid) if st else None
            if info is None:
                return f"release {rid} is no longer on {h} (pruned?)"
            if not info.healthy:
                return f"release {rid} on {h} was never marked healthy"
            if info.manifest is None or not info.manifest.image_ref:
                return f"release {rid} on {h} has no readable manifest"
        return None

    now_key = tuple(sorted((h, r) for h, r in now.items() if r is not None))
    if to is not None:
        holding = [e for e in latest.values() if to in e.releases.values()]
        if not holding:
            raise Refusal(Result.FAILED, f"{where}: no deploy of the service recorded release {to} "
                                         f"(services/{service}/{HISTORY}); see `invoke releases`")
        pick = max(holding, key=lambda e: first_seen[e.key])
        why = usable(pick)
        if why:
            raise Refusal(Result.FAILED, f"{where}: cannot go back to the releases deployed with {to}: {why}")
        return pick
    # as a single host's rollback: the newest set older than the one serving; failing that, the newest other one
    pivot = first_seen.get(now_key)
    others = sorted((e for k, e in latest.items() if k != now_key), key=lambda e: first_seen[e.key], reverse=True)
    older = [e for e in others if pivot is None or first_seen[e.key] < pivot]
    candidates = older + [e for e in others if e not in older]
    reasons = []
    for e in candidates:
        why = usable(e)
        if why is None:
            return e
        reasons.append(f"{first_seen[e.key]}: {why}")
    detail = f" ({'; '.join(reasons[:3])})" if reasons else (
        "" if history else f" (no deploy of it recorded in services/{service}/{HISTORY}: deployed by an older llmfleet?)")
    raise Refusal(Result.FAILED, f"{where}: the hosts have no common previous release to roll back to{detail}; "
                                 "deploy the version you want instead")
