"""Commit confirmed: a switch the controller does not confirm in time is undone by the host itself.

Before a deploy or rollback switches ``current``, the controller *arms* the host: it checks the new
release's compose files with ``docker compose config``, writes a small revert script into the service
folder, a pending-confirmation token beside it, and starts a transient systemd timer
(``systemd-run --on-active=N``) that runs the script after N seconds. When the health check passes, the
controller *confirms*: it takes the token (an atomic ``mv``) and stops the timer. If the controller
is gone (a laptop asleep, a dropped VPN, a killed ``invoke``), the timer fires: the script takes the
token first, points ``current`` back at the previous release, restarts it and appends an audit line
"reverted by host timer". Whoever moves the token first wins; the other side sees it gone.

Pure: builds the exact shell text and parses the markers (golden files in tests/golden/scripts/confirm_*.sh).
``llmfleet.release.executor`` (``HostRun.arm`` / ``confirm`` / ``disarm``) runs them; ``llmfleet.release.deploy``
calls those around each switch, where ``decide`` says a revert is armed (``arms_revert``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from llmfleet.health import watchdog
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.release import store
from llmfleet.release.render import COMPOSE_FILE, COMPOSE_OVERRIDE_FILE

PENDING = ".confirm-pending"
TAKEN = ".confirm-taken"
REVERT_SCRIPT = ".revert.sh"
ARM_FAILED_RC = 5
_TOKEN_CHARS = frozenset("0123456789abcdef")


def _q(value: object) -> str:
    return shlex.quote(str(value))


def _token(token: str) -> str:
    if not token or len(token) > 64 or set(token) - _TOKEN_CHARS:
        raise ValueError("confirmation token must be lowercase hex")
    return token


def revert_unit(service: str) -> str:
    return f"llmfleet-{service}-revert"


def timeout_s(service: Service, settings: HostSettings) -> int:
    """How long a switch may go unconfirmed: the host's ``llmfleet_confirm_timeout_s``, else the
    service's whole health budget (load, then four stages) plus two minutes for the controller (and a
    gateway's stop grace)."""
    if settings.confirm_timeout_s is not None:
        return int(settings.confirm_timeout_s)
    # a gateway's switch may wait out its old container's streams (render.stop_grace_s)
    grace = service.gateway.timeout_s + 5 if service.gateway is not None else 0
    return int(service.health.load_timeout_s + 4 * service.health.stage_timeout_s + 120 + grace)


# Every host of a service over several hosts is armed before the first of them switches. The workers'
# timers fire first, the head's at least HEAD_AFTER_WORKERS_S later: a head put back (or only restarted)
# by its timer starts against workers that are already back on their previous release.
HEAD_AFTER_WORKERS_S = 60


def cluster_timeouts(service: Service, head: str, settings_by_host: dict[str, HostSettings]) -> dict[str, int]:
    """Per host of a service over several hosts, how long its switch may go unconfirmed: one budget for
    every worker (the largest host budget plus one health stage per worker, checked one after the
    other before the head), and the head ``HEAD_AFTER_WORKERS_S`` more (it is armed last, so its timer
    fires after every worker's)."""
    workers = [h for h in settings_by_host if h != head]
    base = max(timeout_s(service, s) for s in settings_by_host.values())
    base += len(workers) * int(service.health.stage_timeout_s)
    return {h: base + (HEAD_AFTER_WORKERS_S if h == head else 0) for h in settings_by_host}


def compose_check_script(paths: store.Paths, release_id: str) -> str:
    """``docker compose config -q`` over the release's compose files (its overrides merged in)."""
    rel = paths.release(release_id)
    return "\n".join([
        f"cd {_q(rel)} || exit {ARM_FAILED_RC}",
        f"set -- -f {COMPOSE_FILE}",
        f"[ -f {COMPOSE_OVERRIDE_FILE} ] && set -- \"$@\" -f {COMPOSE_OVERRIDE_FILE}",
        f"if ! out=$(docker compose -p {_q(paths.container)} \"$@\" config -q 2>&1); then",
        '  printf \'@@compose-invalid %s\\n\' "$(printf \'%s\' "$out" | tr \'\\n\' \' \' | head -c 600)"',
        f"  exit {ARM_FAILED_RC}",
        "fi",
        "echo '@@compose-valid'",
    ])


def revert_script(paths: store.Paths, *, release_id: str, previous: str | None, token: str, action: str,
                  timeout: int, restart_unswitched: bool = False) -> str:
    """The script the host timer runs: undo the switch to ``release_id`` unless it was confirmed.
    ``previous``: the release to put back, the last one confirmed healthy (``decide.go_back_target``,
    never a release a killed deploy left unconfirmed); None: stop the service.

    ``restart_unswitched`` (the head of a service over several hosts): when the switch was never made,
    restart the release that serves anyway, so that it attaches again to its workers, whose own timers
    put them back before this one fires (``cluster_timeouts``)."""
    _token(token)
    sdir = paths.service_dir
    root = paths.root.rstrip("/")
    if previous is not None:
        back = store.switch_script(paths, previous)
        target = previous
        done = f"reverted by host timer: release {release_id} was not confirmed within {int(timeout)} s; back on {previous}"
    else:
        back = store.stop_script(paths, forget_current=True)
        target = ""
        done = (f"reverted by host timer: release {release_id} was not confirmed within {int(timeout)} s; "
                "no release confirmed healthy to go back to, service stopped")
    failed = f"host timer revert FAILED: release {release_id} was not confirmed within {int(timeout)} s"
    never = (f"host timer: release {release_id} was not confirmed within {int(timeout)} s but was never made "
             f"current; nothing to undo, the serving release was left running")
    unswitched = ""
    if restart_unswitched:
        never = (f"host timer: release {release_id} was not confirmed within {int(timeout)} s but was never made "
                 f"current; the serving release was restarted to attach to its workers again")
        unswitched = (f"\n  [ -z \"$target\" ] || systemctl restart {_q(paths.unit)} >/dev/null 2>&1 || "
                      f"{{ result=failed; detail={_q(never.replace('was restarted', 'could not be restarted'))}; }}")
    rel = f"releases/{store._check_id(release_id)}"
    return f"""#!/bin/sh
# Armed by llmfleet before the {action} of service {paths.service} to release {release_id}.
# Run by {revert_unit(paths.service)}.timer after {int(timeout)} s unless the controller confirmed first.
set -u
cd {_q(sdir)} || exit 1
mv {PENDING} {TAKEN} 2>/dev/null || exit 0
if [ "$(cat {TAKEN})" != {_q(token)} ]; then rm -f {TAKEN}; exit 0; fi
if [ "$(readlink current 2>/dev/null)" != {_q(rel)} ]; then
  # the controller vanished between arming and switching: the old release still serves, untouched
  result=unchanged; detail={_q(never)}; target=$(basename "$(readlink current 2>/dev/null)" | tr -cd 'A-Za-z0-9-'){unswitched}
else
(
{back}
) >/dev/null 2>&1
rc=$?
target={_q(target)}
if [ "$rc" = 0 ]; then result=reverted; detail={_q(done)}; else result=failed; detail={_q(failed)}; fi
fi
(
{watchdog.install_snippet(sdir, paths.service)}
) >/dev/null 2>&1
now=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
host=$(hostname 2>/dev/null | tr -cd 'A-Za-z0-9._-')
printf '{{"time":"%s","who":"host timer","host":"%s","action":"%s","service":"%s","release":"%s","image_digest":null,"result":"%s","detail":"%s"}}\\n' \\
  "$now" "$host" {_q(action)} {_q(paths.service)} "$target" "$result" "$detail" >> {_q(root + '/audit.jsonl')}
rm -f {TAKEN} {REVERT_SCRIPT}
"""


def arm_script(paths: store.Paths, *, release_id: str, previous: str | None, token: str, action: str,
               timeout: int, restart_unswitched: bool = False) -> str:
    """Check the compose files, write the revert script and the token, start the timer.

    Prints ``@@armed``; exits ``ARM_FAILED_RC`` with ``@@compose-invalid`` or ``@@arm-failed`` and
    changes nothing that serves when it cannot arm (the switch is then not made).
    """
    _token(token)
    sdir = paths.service_dir
    unit = revert_unit(paths.service)
    script = revert_script(paths, release_id=release_id, previous=previous, token=token, action=action,
                           timeout=timeout, restart_unswitched=restart_unswitched)
    return "\n".join([
        "(",
        compose_check_script(paths, release_id),
        f") || exit {ARM_FAILED_RC}",
        f"cd {_q(sdir)} || exit {ARM_FAILED_RC}",
        f"systemctl stop {_q(unit + '.timer')} >/dev/null 2>&1 || true",
        f"systemctl reset-failed {_q(unit + '.service')} {_q(unit + '.timer')} >/dev/null 2>&1 || true",
        f"rm -f {TAKEN}",
        f"umask 077 && printf '%s' {_q(script)} > {REVERT_SCRIPT}.tmp && mv -f {REVERT_SCRIPT}.tmp {REVERT_SCRIPT}"
        f" || {{ echo '@@arm-failed cannot write {REVERT_SCRIPT}'; exit {ARM_FAILED_RC}; }}",
        f"printf '%s' {_q(token)} > {PENDING}.tmp && mv -f {PENDING}.tmp {PENDING}",
        f"if ! out=$(systemd-run --unit={_q(unit)} --on-active={int(timeout)} --timer-property=AccuracySec=1s "
        f"--description={_q('llmfleet revert of ' + paths.service + ' unless confirmed')} "
        f"/bin/sh {_q(sdir + '/' + REVERT_SCRIPT)} 2>&1); then",
        f"  rm -f {PENDING}",
        '  printf \'@@arm-failed systemd-run: %s\\n\' "$(printf \'%s\' "$out" | tr \'\\n\' \' \' | head -c 300)"',
        f"  exit {ARM_FAILED_RC}",
        "fi",
        f"echo '@@armed {int(timeout)}'",
    ])


def confirm_script(paths: store.Paths, *, token: str, watchdog_on: bool = True) -> str:
    """Take the token and stop the timer (``@@confirmed``), or report the host timer won
    (``@@too-late``). ``watchdog_on``: then install and start the current release's watchdog."""
    _token(token)
    sdir = paths.service_dir
    unit = revert_unit(paths.service)
    lines = [
        f"cd {_q(sdir)} || exit 1",
        f"if [ \"$(cat {PENDING} 2>/dev/null)\" = {_q(token)} ] && mv {PENDING} {TAKEN}.ok 2>/dev/null; then",
        f"  systemctl stop {_q(unit + '.timer')} >/dev/null 2>&1 || true",
        f"  rm -f {TAKEN}.ok {REVERT_SCRIPT}",
        "  echo '@@confirmed'",
    ]
    if watchdog_on:
        lines.append("  (\n" + watchdog.install_snippet(sdir, paths.service) + "\n  )")
    lines += [
        "else",
        "  echo '@@too-late'",
        "fi",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class ArmOutcome:
    armed: bool
    reason: str


def parse_arm(rc: int, stdout: str) -> ArmOutcome:
    for line in stdout.splitlines():
        if line.startswith("@@armed"):
            return ArmOutcome(True, "")
        if line.startswith("@@compose-invalid"):
            return ArmOutcome(False, "docker compose config rejected the release: " + line[18:].strip())
        if line.startswith("@@arm-failed"):
            return ArmOutcome(False, "cannot arm the host-side revert: " + line[13:].strip())
    return ArmOutcome(False, f"cannot arm the host-side revert (exit status {rc})")


def parse_confirm(stdout: str) -> bool:
    """True when the controller's confirmation won; False when the host timer had already reverted."""
    return "@@confirmed" in stdout
