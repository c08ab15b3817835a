"""Drain instead of drop: before a replica's unit restarts (deploy, rollback, stop, remove), every gateway
that fronts it takes it out of rotation and its requests in flight finish; after its health check (or its
go-back) it is put back, and the gateway's own checks let traffic in once it answers.

The gateways are found in the inventory (``gateway_plan.fronting``); each is reached over its own SSH
connection and told through HAProxy's runtime API on its loopback (``gateway_config``'s commands).
Waiting is bounded by the gateway's ``drain_timeout_s`` and a count of polls. A gateway that cannot be
reached does not stop the rollout: the run's log says the replica was not drained there, and HAProxy's
health checks and retries (before anything is sent) are what then protect its clients.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmfleet.errors import LlmfleetError
from llmfleet.release import gateway_config as gc
from llmfleet.release.gateway_plan import Front, fronting

if TYPE_CHECKING:
    from llmfleet.inventory.ansible import Host, Inventory
    from llmfleet.inventory.services import Service
    from llmfleet.release.executor import HostRun

POLL_S = 0.5
MAX_POLLS = 7200  # bounds every wait whatever the timeout (an hour at 0.5 s)

Connect = Callable[[Any], Any]  # a gateway Host -> an open host.ssh link (run(script, sudo, timeout))


@dataclass
class Drained:
    """What one drain did at one gateway (for the run's log and JSON)."""

    gateway: str  # host/service
    server: str
    drained: bool
    in_flight_left: int | None = None
    seconds: float = 0.0
    error: str = ""
    note: str = ""

    def sentence(self) -> str:
        if self.error:
            return f"not drained at gateway {self.gateway}: {self.error}"
        left = "" if not self.in_flight_left else f", {self.in_flight_left} request(s) still in flight at the timeout"
        note = f" ({self.note})" if self.note else ""
        return f"drained at gateway {self.gateway} in {self.seconds:.1f}s{left}{note}"


def _run(link: Any, front: Front, command: str, timeout: float = 20) -> str:
    res = link.run(gc.admin_script(front.admin_port, command), sudo=True, timeout=timeout)
    if res.rc != 0:
        raise LlmfleetError(f"runtime API on {front.host.name}: exit {res.rc}: {(res.stderr or res.stdout).strip()[:200]}")
    return str(res.stdout)


def in_flight(text: str, front: Front) -> int | None:
    state = gc.parse_show_stat(text).get((front.backend, front.server))
    return None if state is None else state.current_sessions


def drain_one(link: Any, front: Front, *, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> Drained:
    """Take the replica out of rotation at one gateway and wait until its sessions there end (or the
    gateway's drain timeout). A gateway that refuses the command (HAProxy answers "No such server."
    with exit 0) is reported not drained; a wait whose ``show stat`` failed after the drain took is
    still reported drained (it must be put back), with what went wrong."""
    name = f"{front.host.name}/{front.service.name}"
    t0 = clock()
    refused = gc.command_error(_run(link, front, gc.drain_command(front.backend, front.server)))
    if refused:
        return Drained(name, front.server, False, error=f"HAProxy refused the drain of "
                       f"{front.backend}/{front.server}: {refused[:200]}")
    left: int | None = None
    note = ""
    deadline = t0 + front.drain_timeout_s
    for _ in range(MAX_POLLS):
        try:
            left = in_flight(_run(link, front, gc.show_stat_command()), front)
        except LlmfleetError as exc:
            note = f"its requests in flight could not be read ({exc}); not waited for"
            break
        if left is None:
            note = f"{front.backend}/{front.server} is not in the gateway's show stat; not waited for"
            break
        if not left or clock() >= deadline:
            break
        sleep(POLL_S)
    return Drained(name, front.server, True, left, round(clock() - t0, 3), note=note)


@dataclass
class Drainer:
    """The gateways in front of one host's replicas, connected on first use, closed by ``close``."""

    inventory: Inventory
    host: str
    connect: Connect
    log: Callable[[str], None] = lambda line: None
    links: dict[str, Any] = field(default_factory=dict)
    done: list[Drained] = field(default_factory=list)

    def fronts(self, service: str) -> list[Front]:
        return fronting(self.inventory, self.host, service)

    def _link(self, front: Front) -> Any:
        if front.host.name not in self.links:
            self.links[front.host.name] = self.connect(front.host)
        return self.links[front.host.name]

    @contextmanager
    def drained(self, service: str, settle: Callable[[float], str] | None = None) -> Iterator[list[Drained]]:
        """Out of rotation at every gateway in front of ``service`` while the block runs; back after it,
        whatever happened in it. ``settle(seconds)``, once a gateway took the drain: waits up to the
        gateways' longest drain timeout for the engine's own metrics to show nothing in flight (requests
        sent straight to it) and says what it saw."""
        fronts = self.fronts(service)
        out: list[Drained] = []
        taken: list[Front] = []
        for front in fronts:
            try:
                d = drain_one(self._link(front), front)
                if d.drained:
                    taken.append(front)
            except LlmfleetError as exc:
                d = Drained(f"{front.host.name}/{front.service.name}", front.server, False, error=str(exc))
            out.append(d)
            self.log(f"{service}: {d.sentence()}")
        self.done += out
        self._settle(service, taken, settle)
        try:
            yield out
        finally:
            for front in taken:
                try:
                    _run(self._link(front), front, gc.ready_command(front.backend, front.server))
                    self.log(f"{service}: back in rotation at gateway {front.host.name}/{front.service.name} "
                             "(its health checks let traffic in once it answers)")
                except LlmfleetError as exc:
                    self.log(f"{service}: NOT put back in rotation at gateway {front.host.name}: {exc}; "
                             f"it rejoins at the gateway's next deploy, or by its runtime API: set server {front.backend}/{front.server} state ready")

    def drain(self, service: str, settle: Callable[[float], str] | None = None) -> list[Drained]:
        """Out of rotation at every gateway in front of ``service``, and left so (a stop, a remove):
        ``ready`` puts it back (a start). ``settle`` as for ``drained``."""
        out = []
        taken: list[Front] = []
        for front in self.fronts(service):
            try:
                d = drain_one(self._link(front), front)
            except LlmfleetError as exc:
                d = Drained(f"{front.host.name}/{front.service.name}", front.server, False, error=str(exc))
            if d.drained:
                taken.append(front)
            out.append(d)
            self.log(f"{service}: {d.sentence()}")
        self.done += out
        self._settle(service, taken, settle)
        return out

    def _settle(self, service: str, taken: list[Front], settle: Callable[[float], str] | None) -> None:
        if taken and settle is not None:
            try:
                self.log(f"{service}: {settle(max(f.drain_timeout_s for f in taken))}")
            except LlmfleetError as exc:
                self.log(f"{service}: the engine's own requests in flight were not read: {exc}")

    def ready(self, service: str) -> None:
        """Back in rotation at every gateway in front of ``service`` (its checks let traffic in once it
        answers)."""
        for front in self.fronts(service):
            try:
                _run(self._link(front), front, gc.ready_command(front.backend, front.server))
                self.log(f"{service}: back in rotation at gateway {front.host.name}/{front.service.name}")
            except LlmfleetError as exc:
                self.log(f"{service}: NOT put back in rotation at gateway {front.host.name}: {exc}")

    def close(self) -> None:
        for link in self.links.values():
            try:
                link.close()
            except Exception:  # noqa: BLE001,S110 - closing a broken connection must not hide the result
                pass
        self.links.clear()


def for_run(run: HostRun, inventory: Inventory | None) -> Drainer | None:
    """The drainer for one host's run, or None when no service of the inventory is a gateway (then
    nothing is looked up or contacted)."""
    if inventory is None:
        return None
    from llmfleet.inventory.ansible import settings_for

    def has_gateway(h: Host) -> bool:
        try:
            return any(s.engine == "gateway" for s in settings_for(h).services)
        except LlmfleetError:
            return False

    if not any(has_gateway(h) for h in inventory.hosts.values()):
        return None
    from llmfleet.host import ssh

    return Drainer(inventory, run.host, lambda h: ssh.connect(h, config=run.settings.ssh), log=run.log)


def engine_settle(run: HostRun, svc: Service, has_key: bool) -> Callable[[float], str]:
    """After the gateways drained ``svc``: the wait for what its engine still has in flight, read from its
    own metrics on the host (requests sent straight to it are not the gateways' to count)."""
    from llmfleet.health import watchdog
    from llmfleet.release.render import load_role

    def settle(timeout_s: float) -> str:
        key_env = load_role(svc.engine).api_key_env if has_key else None
        t0 = time.monotonic()
        res = run.run(watchdog.inflight_script(svc, run.host_settings, key_env=key_env, timeout_s=timeout_s),
                      timeout=timeout_s + 30)
        left = watchdog.parse_inflight(res.stdout)
        took = time.monotonic() - t0
        if left is None:
            return f"the engine's own metrics name no requests in flight to wait for ({took:.1f}s)"
        if left:
            return f"the engine still had {left} request(s) running or waiting after {took:.1f}s (the drain timeout)"
        return f"the engine's own metrics show nothing in flight ({took:.1f}s)"

    return settle
