"""Reading the fleet's decode measurements from hosts, and keeping them on this machine.

``speed_script`` reads, in one round trip, a host's release state (the release store's reader:
manifests and health reports) and the bench results kept with each release of the inventory's
services; ``parse_speed`` turns its output into ``SpeedRecord``s (``llmfleet.health.speed_history``).
``query_speeds`` runs it over hosts in parallel, each bounded in time; an unreachable host is a row
with the reason and keeps its cached records. ``remember_status`` keeps what ``invoke status`` read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmfleet.errors import LlmfleetError
from llmfleet.health import speed_cache
from llmfleet.health.speed_cache import is_lab, remember_hosts
from llmfleet.health.speed_history import SpeedRecord, records_from_state
from llmfleet.knowledge import release_state
from llmfleet.release import store as rel

BENCH_MARK = "@@bench-service"


# ---------------------------------------------------------------------------------------------
# Pure


def speed_script(root: str, services: Sequence[str]) -> str:
    """The release state, then ``@@bench-service NAME`` and that service's kept bench results."""
    parts = [rel.state_script(root)]
    for name in services:
        if not rel.SERVICE_NAME_RE.match(name):
            continue
        parts += [f"echo {rel.q(BENCH_MARK + ' ' + name)}", rel.bench_read_script(rel.Paths(root, name))]
    return "\n".join(parts)


def parse_speed(host: str, stdout: str, *, lab: bool = False) -> list[SpeedRecord]:
    """``speed_script``'s output -> the host's records (health reports and bench results)."""
    head, *sections = stdout.split(f"\n{BENCH_MARK} ")
    bench: dict[str, dict[str, Any]] = {}
    for sec in sections:
        name, _, rest = sec.partition("\n")
        bench[name.strip()] = rel.parse_bench(rest)
    return records_from_state(host, release_state.parse_state(head), bench=bench, lab=lab)


# ---------------------------------------------------------------------------------------------
# Shell


@dataclass
class HostSpeeds:
    host: str
    reachable: bool
    error: str = ""
    records: list[SpeedRecord] = field(default_factory=list)
    seconds: float = 0.0


def query_speed(host: Any, *, config: Any = None, connect: Callable[..., Any] | None = None) -> HostSpeeds:
    """Read one host's records. Never raises for the host's own trouble."""
    from llmfleet.host import ssh
    from llmfleet.inventory.ansible import settings_for
    from llmfleet.settings import SshSettings

    t0 = time.monotonic()
    settings = settings_for(host)
    connect = connect or ssh.connect
    try:
        remote = connect(host, config=SshSettings.of(config))
    except LlmfleetError as exc:
        return HostSpeeds(host.name, False, str(exc), seconds=time.monotonic() - t0)
    try:
        res = remote.run(speed_script(settings.root, [s.name for s in settings.services]), sudo=True)
        if not release_state.state_complete(res.stdout.split(f"\n{BENCH_MARK} ", 1)[0]):
            detail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [f"exit {res.rc}"]
            return HostSpeeds(host.name, False, f"state probe failed: {detail[0][:200]}",
                              seconds=time.monotonic() - t0)
        records = parse_speed(host.name, res.stdout, lab=is_lab(host))
    except LlmfleetError as exc:
        return HostSpeeds(host.name, False, str(exc), seconds=time.monotonic() - t0)
    finally:
        try:
            remote.close()
        except Exception:  # noqa: BLE001,S110 - closing a broken connection must not hide the result
            pass
    return HostSpeeds(host.name, True, records=records, seconds=time.monotonic() - t0)


def query_speeds(hosts: Sequence[Any], *, config: Any = None, forks: int = 10, timeout: float = 20.0,
                 connect: Callable[..., Any] | None = None) -> list[HostSpeeds]:
    """Read hosts in parallel (each bounded by ``timeout``) and keep what the reachable ones hold."""
    from llmfleet.host.group import run_on_hosts
    from llmfleet.settings import SshSettings

    ssh_settings = SshSettings.of(config).bounded(timeout)
    results = run_on_hosts(lambda h: query_speed(h, config=ssh_settings, connect=connect), list(hosts),
                           forks=forks, timeout=timeout * 2 + 5)
    out = [r.value if r.ok and r.value is not None else HostSpeeds(r.host.name, False, r.error or "no answer")
           for r in results]
    speed_cache.remember({h.host: h.records for h in out if h.reachable})
    return out


def remember_status(statuses: Sequence[Any], hosts: Sequence[Any] = ()) -> None:
    """Keep the health records ``invoke status`` read (its ``HostStatus`` list; unreachable hosts keep
    what was kept of them)."""
    remember_hosts({st.host: st.states for st in statuses if getattr(st, "reachable", False)},
                   [h.name for h in hosts if is_lab(h)])
