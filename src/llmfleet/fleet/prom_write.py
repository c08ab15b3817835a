"""Write the Prometheus ``file_sd`` targets folder (the shell around ``fleet.prom_targets``).

Each host is read with ``invoke status``'s one round trip (``fleet.status.query_hosts``, without the
live /metrics read); each file is written whole to a temporary file in the same folder and renamed
over the old one, so Prometheus never reads half a file. A host that cannot be read keeps the files it
has; one that never had any gets its inventory's services with the release ``unknown`` (Prometheus then
reports them down rather than not at all).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.fleet import prom_targets as pt
from llmfleet.fleet.status import query_hosts
from llmfleet.inventory.ansible import Host, settings_for

SCRAPE_JOBS_FILE = "scrape-jobs.yml"


def write_atomic(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` through a temporary file and a rename; False when it was already so."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # noqa: S103 - read by the prometheus user; holds no secret
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def check_out_dir(out: str | os.PathLike[str]) -> Path:
    p = Path(out).expanduser()
    if p.exists() and not p.is_dir():
        raise UsageError(f"--out {out}: not a folder; give the folder Prometheus' file_sd_configs reads")
    if not p.parent.is_dir():
        raise UsageError(f"--out {out}: folder {p.parent} does not exist; create it or give another path")
    return p


@dataclass
class WriteResult:
    hosts: list[pt.HostTargets] = field(default_factory=list)
    written: list[str] = field(default_factory=list)  # files changed (relative to the folder)
    removed: list[str] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)  # {"host", "error"}: not read, files kept
    jobs_file: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**pt.report(self.hosts), "written": self.written, "removed": self.removed, "kept": self.kept,
                "jobs_file": self.jobs_file}


def write_host(out: Path, ht: pt.HostTargets, result: WriteResult) -> None:
    """This host's files, and none of its files in other jobs' folders (a service whose key changed)."""
    files = pt.files_for_host(ht)
    for rel, text in files.items():
        if write_atomic(out / rel, text):
            result.written.append(rel)
    name = f"{pt.safe_file_name(ht.host)}.json"
    for old in sorted(out.glob(f"*/{name}")):
        rel = f"{old.parent.name}/{name}"
        if rel not in files:
            old.unlink(missing_ok=True)
            result.removed.append(rel)


def write_jobs(out: Path, keys_dir: str | None = None, sources: dict[str, str] | None = None) -> str:
    """``scrape-jobs.yml`` for every job folder there is (``sources``: job -> where its key comes from)."""
    jobs = [d.name for d in out.iterdir() if d.is_dir() and (d.name in (pt.PLAIN_JOB, pt.EXPORTER_JOB, pt.GATEWAY_JOB) or d.name.startswith("auth-"))]
    text = pt.scrape_jobs(str(out), jobs, keys_dir=keys_dir or pt.KEYS_DIR, sources=sources)
    write_atomic(out / SCRAPE_JOBS_FILE, text)
    return SCRAPE_JOBS_FILE


def write_targets(hosts: Sequence[Host], out_dir: str | os.PathLike[str], *, config: Any = None, forks: int = 10,
                  timeout: float = 20.0, connect: Callable[..., Any] | None = None,
                  keys_dir: str | None = None) -> WriteResult:
    """Read each host (one round trip) and write its targets files, then the scrape jobs file."""
    out = check_out_dir(out_dir)
    for h in hosts:
        settings_for(h)  # schema errors are usage errors: before any SSH
    read = query_hosts(hosts, config=config, forks=forks, timeout=timeout, metrics=False, connect=connect)
    by_name = {h.name: h for h in hosts}
    result = WriteResult()
    out.mkdir(exist_ok=True)
    for status, settings in read:
        host = by_name[status.host]
        ht = pt.host_targets(host, settings, status if status.reachable else None)
        result.hosts.append(ht)
        if not status.reachable and any(out.glob(f"*/{pt.safe_file_name(status.host)}.json")):
            result.kept.append({"host": status.host, "error": status.error or "no answer"})
            continue
        write_host(out, ht, result)
    result.jobs_file = write_jobs(out, keys_dir, {t.job: t.key_source for h in result.hosts for t in h.targets})
    return result
