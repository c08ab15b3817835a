"""The decode measurements this machine has seen on hosts, kept between runs.

The fleet is the record: each host keeps its releases' health reports and bench results
(``llmfleet.health.speed_history`` reads them). What a run reads from a host replaces what was kept
of that host here; the kept records only add hosts the run did not contact. So two operators on two
machines see the same history once each has read the hosts (``invoke status`` reads them all), and
deleting the cache loses nothing the hosts do not still hold.

Kept in the private cache folder ``speed`` (``llmfleet.cache``: this user's, 0700, written 0600), one
JSON file: per host, when it was read and its records. A record holds the key (card, engine, image
key or digest, model, quant, context class, split), host, service, release id, time, tok/s and where
it came from: no engine argument, no environment, no image reference, nothing secret. Nothing is read
or written when the folder is not private to this user; an unreadable file is an empty cache.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from llmfleet import cache
from llmfleet.health.speed_history import SpeedRecord, records_from_state

CACHE = "speed"
FILE = "records.json"
SCHEMA = "llmfleet.speed-cache/1"
MAX_BYTES = 16 * 1024 * 1024  # a larger file is not read (and is replaced by the next write)


def _read() -> dict[str, Any]:
    folder = cache.private_dir(CACHE, create=False)
    if folder is None:
        return {}
    try:
        path = folder / FILE
        if path.stat().st_size > MAX_BYTES:
            return {}
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    hosts = doc.get("hosts") if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None
    return hosts if isinstance(hosts, dict) else {}


def load(*, exclude: Iterable[str] = ()) -> list[SpeedRecord]:
    """Every kept record (of hosts not in ``exclude``); anything unreadable is left out."""
    skip = set(exclude)
    out: list[SpeedRecord] = []
    for host, entry in sorted(_read().items()):
        if host in skip or not isinstance(entry, dict) or not isinstance(entry.get("records"), list):
            continue
        for d in entry["records"]:
            r = SpeedRecord.from_dict(d)
            if r is not None and r.host == host:
                out.append(r)
    return out


def seen() -> dict[str, str]:
    """Host -> when its records were last read (ISO time)."""
    return {h: e["seen"] for h, e in _read().items() if isinstance(e, dict) and isinstance(e.get("seen"), str)}


def remember(by_host: dict[str, list[SpeedRecord]], now: datetime | None = None) -> bool:
    """Keep what was read now: each host in ``by_host`` gets exactly these records (an empty list: the
    host holds none now). Other hosts' records stay. Best effort: False when nothing was written."""
    hosts = _read()
    # a host that holds no record and had none kept changes nothing: no folder, no write
    by_host = {h: rs for h, rs in by_host.items() if rs or h in hosts}
    if not by_host:
        return False
    folder = cache.private_dir(CACHE)
    if folder is None:
        return False
    when = (now or datetime.now(UTC)).astimezone(UTC).isoformat(timespec="seconds")
    for host, records in by_host.items():
        hosts[str(host)] = {"seen": when, "records": [r.to_dict() for r in records if r.host == host]}
    text = json.dumps({"schema": SCHEMA, "hosts": hosts}, sort_keys=True, separators=(",", ":"))
    cache.write_private(folder / FILE, text.encode())
    return (folder / FILE).exists()


def is_lab(host: Any) -> bool:
    """A lab host (docs/lab.md): its engines run on the CPU for a simulated card."""
    return bool(getattr(host, "vars", {}).get("lab_gpu"))


def remember_hosts(states_by_host: dict[str, Any], labs: Sequence[str] = ()) -> None:
    """Keep the health records in each host's release state just read (``{host: store.parse_state's
    answer}``: a deploy's or status's read). Bench results are not in that state: the bench records
    kept earlier for releases the host still holds stay (``invoke speed`` reads them again). Best
    effort: a run never fails over the cache."""
    try:
        cached_bench = [r for r in load() if r.source == "bench"]
        by_host: dict[str, list[SpeedRecord]] = {}
        for host, states in states_by_host.items():
            present = {(host, name, rid) for name, s in (states or {}).items() for rid in s.releases}
            by_host[host] = [*records_from_state(host, states, lab=host in labs),
                             *(r for r in cached_bench if r.host == host and r.run in present)]
        remember(by_host)
    except Exception:  # noqa: BLE001,S110 - the cache only adds history; a run never fails over it
        pass
