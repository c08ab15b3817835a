"""A driver change gated by serving, one host (the shell around ``provision.run`` and the service ops).

When provisioning would change the driver of a host that already has one (``--check`` first, one round
trip), the change runs as a gated operation:

1. the previous driver's .deb files are kept on the host (``driver_change.keep_script``); a driver that
   cannot be kept refuses the change: there would be no way back;
2. the services that run are stopped (each drained at the gateways in front of it first);
3. the provisioning run: packages, hold, reboot, nvidia-smi must report the target, facts, preflight;
4. the stopped services start again on the new driver and pass their health checks (residency and
   decode speed included, as after a deploy);
5. when 3 or 4 failed after the driver packages changed: the go-back (``Provisioner.go_back``): the kept
   driver installed again and held, a reboot, nvidia-smi must report the previous driver; then the
   services start again. The host is reported ``went back`` (exit 1), with the cause.

A host with no driver yet (nothing serves there) or whose run changes no driver package provisions as
usual. ``ServiceGate`` is injected: the CLI gives the service ops over SSH (release/service_ops.py),
tests give fakes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from llmfleet.provision import driver_change as DC
from llmfleet.provision.run import Outcome, Provisioner

Log = Callable[[str], None]


@dataclass
class ServiceGate:
    """The host's services around a driver change."""

    stop: Callable[[], tuple[list[str], str | None]]  # -> (the services stopped, why stopping failed or None)
    start: Callable[[list[str]], tuple[bool, str]]  # names -> (all healthy, what their health checks said)


def changes_driver(check: Outcome) -> bool:
    """A ``--check`` outcome whose plan changes the driver packages of a host that has a driver."""
    return (check.result == "would change" and check.previous is not None
            and any(s.name == "driver" for s in check.steps))


def _failed_checks(out: Outcome) -> str:
    bad = [f"{c['id']}: {c['message']}" for c in out.checks if c["status"] == "fail"]
    return "; ".join(bad) or out.message


def provision_gated(make: Callable[[bool, bool], Provisioner], services: ServiceGate, log: Log,
                    confirm: Callable[[Outcome], bool] | None = None,
                    clock: Callable[[], float] = time.monotonic) -> Outcome:
    """Provision one host; a driver change runs gated by its services' health (module doc).
    ``make(check, ask)``: a Provisioner (``ask``: with the CLI's reboot confirmation); ``confirm``: asked
    once before the services stop (False refuses the change, nothing touched)."""
    check = make(True, False).provision()
    if not changes_driver(check):
        return check if check.result in ("converged", "refused", "failed") else make(False, True).provision()
    prev = check.previous
    assert prev is not None
    t0 = clock()
    out = _gated(make, services, log, confirm, check, prev)
    out.seconds = check.seconds + (clock() - t0)  # the whole change: services, reboots and health checks included
    return out


def _gated(make: Callable[[bool, bool], Provisioner], services: ServiceGate, log: Log,
           confirm: Callable[[Outcome], bool] | None, check: Outcome, prev: DC.Previous) -> Outcome:
    if confirm is not None and not confirm(check):
        for s in check.steps:
            s.status = "not run"
        check.result, check.message = "refused", "the run changes the driver and reboots the host: not confirmed (pass --yes)"
        return check
    keeper = make(False, False)
    files, missing = keeper.keep_previous(prev)
    gate: dict[str, object] = {"previous": prev.version, "kept": sorted(files)}
    if missing:
        check.result = "refused"
        check.message = (f"the previous driver {prev.version} cannot be kept on the host ({', '.join(missing)}: neither "
                         "in apt's cache nor in its sources): no driver change without a way back; add a source that "
                         "carries it, or change the driver by hand")
        check.gate = gate
        return check
    log(f"kept driver {prev.version} ({len(files)} package(s)) under {prev.folder(keeper.settings.root)}")
    stopped, why = services.stop()
    gate["services"] = stopped
    if why is not None:
        ok, detail = services.start(stopped) if stopped else (True, "")
        check.result = "failed"
        check.message = f"stopping the services before the driver change failed: {why}" + (
            "" if ok else f"; starting them again: {detail}")
        check.gate = gate
        return check
    out = make(False, False).provision()
    out.previous = prev
    out.gate = gate
    target = out.driver.get("version")
    driver_step = next((s for s in out.steps if s.name == "driver"), None)
    if out.ok:
        healthy, detail = services.start(stopped) if stopped else (True, "")
        gate["health"] = detail
        if healthy:
            v = DC.gate_verdict(out.host, target, prev, change_ok=True, change_why="", services_ok=True,
                                services_why=detail)
            out.message = v.message
            return out
        change_ok, change_why = True, ""
        services_ok: bool | None = False
    else:
        change_ok, change_why, services_ok, detail = False, _failed_checks(out), None, ""
    if driver_step is None or driver_step.status == "not run":  # the driver did not move: serve again as before
        ok, again = services.start(stopped) if stopped else (True, "")
        gate["health"] = again
        if not ok:
            out.message += f"; the services did not come back: {again}"
        return out
    log(f"going back to driver {prev.version}: " + (change_why or detail))
    back = make(False, False).go_back(prev, files, target)
    gate["go_back"] = back.to_dict()
    went = back.result == "changed"
    again_ok: bool | None = None
    again_why = ""
    if went and stopped:
        again_ok, again_why = services.start(stopped)
        gate["health_after_go_back"] = again_why
    v = DC.gate_verdict(out.host, target, prev, change_ok=change_ok, change_why=change_why, services_ok=services_ok,
                        services_why=detail, went_back=went, back_why=back.message, serving_again=again_ok,
                        again_why=again_why)
    out.result, out.message = v.result, v.message
    out.rebooted = out.rebooted or back.rebooted
    out.driver["running"] = back.driver.get("running", out.driver.get("running"))
    out.round_trips += back.round_trips
    return out
