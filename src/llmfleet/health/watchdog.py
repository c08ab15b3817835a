"""Host-side supervision of one service: a systemd timer that probes the engine's /health and
restarts the unit after N failed probes in a row, bounded per hour, with an audit line on the host.

Pure: builds the files a release ships (``watchdog.sh`` and the timer's two units), the install /
uninstall snippets the confirm step and the host-timer revert run, and the status read-back script
with its parser. Values are baked into the script as single-quoted shell words (``shlex.quote``);
service names and the llmfleet root are already restricted by the inventory schema.

The script does nothing while a switch awaits its confirmation (the revert timer owns the unit then),
while the unit is not active (stopped, or failed after systemd's start limit: that it records once in
the audit log, as ``unit-failed``/``start-limit``, so ``status`` shows it). An engine younger than its
load budget (a deploy's restart, or its own) that does not answer /health yet is loading, not down; one
that answers is judged by its work at once. It does not wait for the deploy lock:
a lock left by a vanished controller would otherwise turn the watchdog off until someone breaks it,
and a deploy in progress only restarts engines, which makes them young. The probe goes
from the host to the published port (curl), so it works for images without a shell or curl; where
the host has no curl it reads Docker's healthcheck status instead.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from typing import Any

from llmfleet.inventory.services import HostSettings, Service
from llmfleet.knowledge import engines

SCRIPT = "watchdog.sh"
STATE = "watchdog.state"  # <service dir>/watchdog.state.{fails,restarts,last,gaveup}
MARK = "@@watchdog"
JUDGEMENT_MARK = "@@watchdog-judgement"
# verdicts of the judgement that mean the engine does no work although its unit runs
STUCK = frozenset({"hung", "down"})


def _q(value: object) -> str:
    return shlex.quote(str(value))


def timer_name(service: str) -> str:
    return f"llmfleet-{service}-watchdog"


def service_dir(root: str, service: str) -> str:
    return f"{root.rstrip('/')}/services/{service}"


def probe_address(bind_address: str) -> str:
    """Where the host reaches the published port: loopback for a wildcard bind, else that address."""
    if bind_address in {"0.0.0.0", "::"}:
        return "127.0.0.1"
    return f"[{bind_address}]" if ":" in bind_address else bind_address  # as HostSettings.reach_address_for


_HTTP_PROBE = """why=''
if command -v curl >/dev/null 2>&1; then
  if curl -fsS -o /dev/null --max-time "$PROBE_TIMEOUT" "$URL" 2>/dev/null; then
    judge
  else
    ok=0; verdict=down; why="/health did not answer 200 within $PROBE_TIMEOUT s"
  fi
else
  [ "$(docker inspect --format '{{.State.Health.Status}}' "$CONTAINER" 2>/dev/null)" = unhealthy ] && ok=0 || ok=1
  verdict=unknown; [ "$ok" = 1 ] || { verdict=down; why="Docker healthcheck: unhealthy (no curl on the host)"; }
fi"""

# The judgement by work done (``judge``, run when /health answered): read the engine's /metrics; when
# its progress counters moved since the last probe the engine works. Requests running or waiting with
# the counters standing still for STALL_WINDOW seconds is a failed judgement ("hung"); idle with nothing
# counted since the last probe, a 1-token completion must finish within PROBE_TIMEOUT. An engine whose
# /metrics does not answer while /health does (llama-server answers /metrics from its main loop) fails
# too. Secrets never reach argv: curl reads the Authorization header from its standard input (-K -).
_API = r"""api() {  # path out [curl args...]: HTTP status of a bounded request, body in out
  p=$1; o=$2; shift 2
  if [ -n "$KEY_ENV" ] && [ -r "$SERVICE_DIR/current/service.env" ]; then
    k=$(sed -n "s/^$KEY_ENV='\(.*\)'\$/\1/p" "$SERVICE_DIR/current/service.env" | head -n 1)
    k=${k%%,*}
  else
    k=''
  fi
  if [ -n "$k" ]; then
    printf 'header = "Authorization: Bearer %s"\n' "$(printf '%s' "$k" | sed 's/[\\"]/\\&/g')" |
      curl -sS -K - -o "$o" -w '%{http_code}' --max-time "$PROBE_TIMEOUT" "$@" "$BASE$p" 2>/dev/null
  else
    curl -sS -o "$o" -w '%{http_code}' --max-time "$PROBE_TIMEOUT" "$@" "$BASE$p" 2>/dev/null
  fi
}"""
_JUDGE = _API + r"""
judge() {
  ok=1; verdict=healthy
  [ "$PROGRESS" = 1 ] || return 0
  code=$(api /metrics "$STATE.metrics")
  if [ "$code" != 200 ] && [ "$code" != 404 ]; then
    ok=0; verdict=hung; why="/health answers but /metrics did not within $PROBE_TIMEOUT s (HTTP ${code:-000})"
    return 0
  fi
  set -- $( [ "$code" = 200 ] && awk -v R="$RUNNING" -v W="$WAITING" -v P="$PROGRESS_COUNTERS" '
    function first(names, n,   i) { for (i = 1; i <= n; i++) if (names[i] in seen) return sprintf("%.0f", sum[names[i]]); return "-" }
    BEGIN { nr = split(R, rn, " "); nw = split(W, wn, " "); np = split(P, pn, " ") }
    /^#/ || NF < 2 { next }
    { name = $1; i = index(name, "{"); if (i) name = substr(name, 1, i - 1); sum[name] += $NF; seen[name] = 1 }
    END { p = 0; have = 0; for (i = 1; i <= np; i++) if (pn[i] in seen) { p += sum[pn[i]]; have = 1 }
          printf "%s %s %s\n", first(rn, nr), first(wn, nw), (have ? sprintf("%.0f", p) : "-") }' "$STATE.metrics")
  running=${1:--}; waiting=${2:--}; done_=${3:--}
  now=$(date +%s)
  read -r prev since < "$STATE.progress" 2>/dev/null || { prev=''; since=$now; }
  if [ "$done_" != - ] && [ "$done_" != "$prev" ]; then
    echo "$done_ $now" > "$STATE.progress"; verdict=working; return 0
  fi
  case "$running$waiting" in *-*) busy=0 ;; *) busy=$(awk -v a="$running" -v b="$waiting" 'BEGIN { print (a + b > 0) }') ;; esac
  if [ "$done_" != - ] && [ "$busy" = 1 ]; then
    stalled=$((now - ${since:-$now}))
    verdict=busy
    if [ "$stalled" -ge "$STALL_WINDOW" ]; then
      ok=0; verdict=hung; why="$running requests running, $waiting waiting, 0 tokens generated in $stalled s"
    fi
    return 0
  fi
  verdict=idle
  [ "$IDLE_PROBE" = 1 ] || return 0
  code=$(api /v1/completions "$STATE.reply" -X POST -H 'Content-Type: application/json' -d "$COMPLETION")
  if [ "$code" = 200 ] && grep -q '"choices"' "$STATE.reply" 2>/dev/null; then
    return 0
  fi
  ok=0; verdict=hung
  if [ "$code" = 000 ] || [ -z "$code" ]; then
    why="idle; a 1-token completion did not finish within $PROBE_TIMEOUT s"
  else
    why="idle; a 1-token completion answered HTTP $code"
  fi
}"""


# A worker of a service over several hosts serves no HTTP: it is healthy while its container runs and
# (llama.cpp's rpc-server) a socket listens on its port. Listening, not connecting: rpc-server serves one
# client at a time, so a probe's connection would wait in its accept queue while the head is attached
# (and, repeated, fill that queue).
_WORKER_PROBE = """ok=0; verdict=down; why="container $CONTAINER not running"
[ "$(docker inspect --format '{{.State.Running}}' "$CONTAINER" 2>/dev/null)" = true ] && { ok=1; verdict=healthy; why=''; }
if [ "$ok" = 1 ] && [ -n "$PORT" ] && command -v ss >/dev/null 2>&1; then
  ss -Hltn "( sport = :$PORT )" 2>/dev/null | grep -q . || { ok=0; verdict=down; why="$LISTENER does not listen"; }
fi"""


def script_text(service: Service, settings: HostSettings, *, bind_address: str, key_env: str | None = None) -> str:
    """The watchdog of a service that serves HTTP: /health, then the judgement by work done.
    ``key_env``: the env file's variable holding the service's API key (None: no key)."""
    base = f"http://{probe_address(bind_address)}:{service.port}"
    wd = settings.watchdog
    knows = engines.for_engine(service.engine)
    names = knows.metrics
    completion = json.dumps({"model": service.public_name, "prompt": "ping", "max_tokens": 1, "temperature": 0},
                            separators=(",", ":"))
    target = "\n".join([
        f"BASE={_q(base)}",
        f"URL={_q(base + knows.health_path)}",
        f"KEY_ENV={_q(key_env or '')}",
        f"PROGRESS={1 if wd.progress and knows.progress_metrics else 0}",
        f"STALL_WINDOW={int(wd.stall_window_s)}",
        f"IDLE_PROBE={1 if wd.idle_probe else 0}",
        f"RUNNING={_q(' '.join(names.get('requests_running', ())))}",
        f"WAITING={_q(' '.join(names.get('requests_waiting', ())))}",
        f"PROGRESS_COUNTERS={_q(' '.join(knows.progress_metrics))}",
        f"COMPLETION={_q(completion)}",
    ])
    what = "judgements (/health, then work done)" if wd.progress and knows.progress_metrics else "/health probes"
    return _script(service, settings, what=what, target=target, probe=_JUDGE + "\n\n" + _HTTP_PROBE)


INFLIGHT_POLL_S = 0.5


def inflight_script(service: Service, settings: HostSettings, *, key_env: str | None, timeout_s: float) -> str:
    """On a replica's host, after the gateways drained it: wait until the engine's own metrics show no
    request running or waiting (requests sent straight to it, or still finishing), polling every 0.5 s
    for at most ``timeout_s``. Prints ``@@inflight N`` (what was left; ``-`` when its metrics could not be
    read or name no such counter). The key is read from the release's env file, never from argv."""
    knows = engines.for_engine(service.engine)
    names = knows.metrics
    polls = max(1, int(timeout_s / INFLIGHT_POLL_S))
    head = "\n".join([
        f"SERVICE_DIR={_q(service_dir(settings.root, service.name))}",
        f"BASE={_q('http://' + probe_address(settings.bind_address_for(service)) + ':' + str(service.port))}",
        f"KEY_ENV={_q(key_env or '')}",
        "PROBE_TIMEOUT=5",
        f"RUNNING={_q(' '.join(names.get('requests_running', ())))}",
        f"WAITING={_q(' '.join(names.get('requests_waiting', ())))}",
        'STATE=$(mktemp)',
        'trap \'rm -f "$STATE"\' EXIT',
    ])
    loop = f"""left=-
for _ in $(seq 1 {polls}); do
  code=$(api /metrics "$STATE")
  [ "$code" = 200 ] || break
  left=$(awk -v R="$RUNNING" -v W="$WAITING" '
    BEGIN {{ n = split(R " " W, want, " "); for (i = 1; i <= n; i++) w[want[i]] = 1 }}
    /^#/ || NF < 2 {{ next }}
    {{ name = $1; i = index(name, "{{"); if (i) name = substr(name, 1, i - 1); if (name in w) {{ s += $NF; seen = 1 }} }}
    END {{ if (seen) printf "%.0f\\n", s; else print "-" }}' "$STATE")
  case "$left" in 0|-) break ;; esac
  sleep {INFLIGHT_POLL_S}
done
echo "@@inflight $left"
"""
    return "\n".join([head, _API, loop.rstrip("\n")])


def parse_inflight(stdout: str) -> int | None:
    """``inflight_script``'s answer: the requests still running or waiting, None when unknown."""
    for line in stdout.splitlines():
        if line.startswith("@@inflight "):
            value = line.split(" ", 1)[1].strip()
            return int(value) if value.isdigit() else None
    return None


def worker_script_text(service: Service, settings: HostSettings, *, kind: str, address: str, port: int) -> str:
    """The watchdog of a worker of a service over several hosts (``kind`` rpc: rpc-server on
    ADDRESS:PORT; ray: a Ray worker, judged by its container alone)."""
    container = f"llmfleet-{service.name}"
    runtime = engines.for_cluster_kind(kind)
    if runtime.worker_serves_port:
        what = f"container {container} and {runtime.worker_runtime} {probe_address(address)}:{int(port)}"
        target = f"PORT={int(port)}\nLISTENER={_q(f'{runtime.worker_runtime} {probe_address(address)}:{int(port)}')}"
    else:
        what = f"container {container} ({runtime.worker_runtime})"
        target = "PORT=''"
    return _script(service, settings, what="worker probes (container running"
                   + (f", {runtime.worker_runtime} port listening)" if runtime.worker_serves_port else ")"),
                   target=f"{target}\nURL={_q(what)}", probe=_WORKER_PROBE)


def _script(service: Service, settings: HostSettings, *, what: str, target: str, probe: str) -> str:
    wd = settings.watchdog
    sdir = service_dir(settings.root, service.name)
    return f"""#!/bin/sh
# llmfleet watchdog for service {service.name}: run by {timer_name(service.name)}.timer every {wd.interval_s} s.
# Restarts the unit after {wd.failures} failed {what} in a row, at most {wd.max_restarts_per_hour} times an
# hour (then it only records that it gave up); appends each action to the host's audit log.
set -u
SERVICE={_q(service.name)}
UNIT={_q(f"llmfleet-{service.name}.service")}
CONTAINER={_q(f"llmfleet-{service.name}")}
SERVICE_DIR={_q(sdir)}
AUDIT={_q(settings.root.rstrip('/') + '/audit.jsonl')}
{target}
WHAT={_q(what.split(" (")[0])}
FAILURES={int(wd.failures)}
MAX_PER_HOUR={int(wd.max_restarts_per_hour)}
GRACE={int(service.health.load_timeout_s)}
PROBE_TIMEOUT={int(wd.probe_timeout_s)}
STATE="$SERVICE_DIR/{STATE}"

judged() {{  # verdict detail: the last judgement, for `invoke status`
  printf '{{"time":"%s","verdict":"%s","detail":"%s"}}\\n' "$(date -u +%Y-%m-%dT%H:%M:%S+00:00)" "$1" "$2" \\
    > "$STATE.judgement.tmp" && mv -f "$STATE.judgement.tmp" "$STATE.judgement"
}}

audit() {{  # action result detail
  now=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
  host=$(hostname 2>/dev/null | tr -cd 'A-Za-z0-9._-')
  rel=$(basename "$(readlink "$SERVICE_DIR/current" 2>/dev/null)" 2>/dev/null | tr -cd 'A-Za-z0-9-')
  line=$(printf '{{"time":"%s","who":"watchdog","host":"%s","action":"%s","service":"%s","release":"%s","image_digest":null,"result":"%s","detail":"%s"}}' \\
    "$now" "$host" "$1" "$SERVICE" "$rel" "$2" "$3")
  printf '%s\\n' "$line" >> "$AUDIT"
  printf '%s\\n' "$line" > "$STATE.last"
}}

[ -e "$SERVICE_DIR/.confirm-pending" ] && exit 0
unit_state=$(systemctl is-active "$UNIT" 2>/dev/null)
if [ "$unit_state" = failed ]; then
  # systemd's start limit ended a crash loop: not the watchdog's to restart; recorded once
  [ -e "$STATE.failed" ] || audit unit-failed start-limit "$UNIT failed after $(systemctl show -p NRestarts --value "$UNIT" 2>/dev/null | tr -cd 0-9) automatic restarts (systemd start limit); a deploy, a rollback or systemctl reset-failed starts it again"
  touch "$STATE.failed"
  exit 0
fi
rm -f "$STATE.failed"
[ "$unit_state" = active ] || exit 0
started=$(systemctl show -p ExecMainStartTimestampMonotonic --value "$UNIT" 2>/dev/null)
up=$(cut -d' ' -f1 /proc/uptime)
age=$(awk -v u="$up" -v s="${{started:-0}}" 'BEGIN {{ printf "%d", u - s / 1000000 }}')
young=0; [ "$age" -ge "$GRACE" ] || young=1

{probe}
if [ "$young" = 1 ] && [ "$verdict" = down ]; then
  judged starting "started $age s ago, within its load budget of $GRACE s"
  exit 0
fi
why=$(printf '%s' "$why" | tr -d '"\\' | tr -c '[:print:]' ' ' | head -c 300)
judged "$verdict" "$why"
if [ "$ok" = 1 ]; then
  echo 0 > "$STATE.fails"
  rm -f "$STATE.gaveup"
  exit 0
fi
n=$(( $(cat "$STATE.fails" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$STATE.fails"
[ "$n" -ge "$FAILURES" ] || exit 0

evidence="$n failed $WHAT in a row; last: $why"
now=$(date +%s)
recent=$(awk -v now="$now" '$1 > now - 3600' "$STATE.restarts" 2>/dev/null | wc -l)
if [ "$recent" -ge "$MAX_PER_HOUR" ]; then
  [ -e "$STATE.gaveup" ] || audit watchdog-restart gave-up "$evidence; $recent restarts in the last hour: restart limit reached"
  touch "$STATE.gaveup"
  exit 0
fi
echo "$now" >> "$STATE.restarts"
echo 0 > "$STATE.fails"
rm -f "$STATE.progress"
# a hung engine does not act on SIGTERM: the unit's stop would wait out its stop grace for nothing
docker kill "$CONTAINER" >/dev/null 2>&1 || true
systemctl reset-failed "$UNIT" >/dev/null 2>&1 || true
if systemctl restart "$UNIT"; then
  audit watchdog-restart restarted "$evidence"
  judged restarted "$evidence"
else
  audit watchdog-restart failed "$evidence; systemctl restart failed"
fi
"""


def service_unit_text(service: Service, settings: HostSettings) -> str:
    sdir = service_dir(settings.root, service.name)
    return f"""# Rendered by llmfleet for service {service.name}: one watchdog probe (see {SCRIPT}).
[Unit]
Description=llmfleet watchdog probe for service {service.name}
After=docker.service

[Service]
Type=oneshot
ExecStart=/bin/sh {sdir}/current/{SCRIPT}
TimeoutStartSec=300
"""


def timer_unit_text(service: Service, settings: HostSettings) -> str:
    every = int(settings.watchdog.interval_s)
    return f"""# Rendered by llmfleet for service {service.name}: installed after a confirmed deploy.
[Unit]
Description=llmfleet watchdog timer for service {service.name}

[Timer]
OnActiveSec={every}
OnUnitActiveSec={every}
AccuracySec=1s

[Install]
WantedBy=timers.target
"""


def worker_release_files(service: Service, settings: HostSettings, *, kind: str, address: str,
                         port: int) -> dict[str, tuple[str, int]]:
    """The watchdog files of a worker's release (none when the host turned the watchdog off)."""
    if not settings.watchdog.enabled:
        return {}
    return _files(service, settings, worker_script_text(service, settings, kind=kind, address=address, port=port))


def release_files(service: Service, settings: HostSettings, *, key_env: str | None = None) -> dict[str, tuple[str, int]]:
    """The files a release ships for its watchdog (none when the host turned it off); ``key_env``: the
    env file's variable holding the service's API key, which the judgement's requests carry. An
    exporter ships none: systemd restarts it when it exits, and it has no work to judge."""
    if not settings.watchdog.enabled or not service.is_engine:
        return {}
    return _files(service, settings, script_text(service, settings, bind_address=settings.bind_address_for(service),
                                                 key_env=key_env))


def _files(service: Service, settings: HostSettings, script: str) -> dict[str, tuple[str, int]]:
    name = timer_name(service.name)
    return {
        SCRIPT: (script, 0o755),
        f"{name}.service": (service_unit_text(service, settings), 0o644),
        f"{name}.timer": (timer_unit_text(service, settings), 0o644),
    }


def install_snippet(service_dir_: str, service: str, unit_dir: str = "/etc/systemd/system") -> str:
    """Install and start the watchdog of the release ``current`` points at, with fresh counters; stop
    it when that release ships none (an older release). Runs after a confirmation and a revert."""
    name = timer_name(service)
    cur = f"{service_dir_}/current"
    state = f"{service_dir_}/{STATE}"
    return "\n".join([
        f"rm -f {_q(state + '.fails')} {_q(state + '.restarts')} {_q(state + '.gaveup')} {_q(state + '.failed')}",
        f"if [ -f {_q(cur + '/' + name + '.timer')} ] && [ -f {_q(cur + '/' + SCRIPT)} ]; then",
        # systemd is reloaded (a second or more on a busy host) only for new unit files
        f"  if ! cmp -s {_q(cur + '/' + name + '.service')} {_q(unit_dir + '/' + name + '.service')} || "
        f"! cmp -s {_q(cur + '/' + name + '.timer')} {_q(unit_dir + '/' + name + '.timer')} || "
        f"[ -n \"$(systemctl show -p NeedDaemonReload --value {_q(name + '.service')} {_q(name + '.timer')} "
        "2>/dev/null | grep -vx no)\" ]; then",
        f"    install -m 0644 {_q(cur + '/' + name + '.service')} {_q(unit_dir + '/' + name + '.service')}",
        f"    install -m 0644 {_q(cur + '/' + name + '.timer')} {_q(unit_dir + '/' + name + '.timer')}",
        "    systemctl daemon-reload >/dev/null 2>&1 || true",
        "  fi",
        f"  systemctl enable --no-reload {_q(name + '.timer')} >/dev/null 2>&1 || true",
        f"  systemctl restart {_q(name + '.timer')} >/dev/null 2>&1 && echo '@@watchdog-on' || echo '@@watchdog-off'",
        "else",
        f"  systemctl disable --now {_q(name + '.timer')} >/dev/null 2>&1 || true",
        "  echo '@@watchdog-off'",
        "fi",
    ])


# ---------------------------------------------------------------------------------------------
# Status read-back


def status_script(root: str) -> str:
    """Per service: watchdog restarts since the deploy, systemd's own restarts, the timer's state and
    the last watchdog action (one line of JSON)."""
    base = f"{root.rstrip('/')}/services"
    return "\n".join([
        f"for s in {_q(base)}/*/; do",
        '  [ -d "$s" ] || continue',
        '  name=$(basename "$s")',
        f'  r=$(cat "${{s}}{STATE}.restarts" 2>/dev/null | wc -l)',
        '  n=$(systemctl show -p NRestarts --value "llmfleet-$name.service" 2>/dev/null)',
        '  t=$(systemctl is-active "llmfleet-$name-watchdog.timer" 2>/dev/null)',
        f'  last=$(head -c 2000 "${{s}}{STATE}.last" 2>/dev/null | tr -d "\\n")',
        f'  echo "{MARK} $name ${{r:-0}} ${{n:-0}} ${{t:-unknown}} $last"',
        # the last judgement and its age in seconds by the host's own clock
        f'  j="${{s}}{STATE}.judgement"',
        '  if [ -f "$j" ]; then',
        '    age=$(( $(date +%s) - $(stat -c %Y "$j" 2>/dev/null || date +%s) ))',
        f'    echo "{JUDGEMENT_MARK} $name $age $(head -c 1000 "$j" | tr -d "\\n")"',
        "  fi",
        "done",
    ])


@dataclass(frozen=True)
class Judgement:
    """The watchdog's last judgement of a service: ``verdict`` (working, busy, idle, healthy, hung,
    down, unknown; restarted: it restarted the unit, with the evidence), its evidence and its age in
    seconds when read."""

    verdict: str
    detail: str
    time: str
    age_s: int

    def fresh(self, interval_s: int) -> bool:
        """Recent enough to speak for the engine now: within three timer periods."""
        return 0 <= self.age_s <= 3 * interval_s + 5

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "detail": self.detail, "time": self.time, "age_s": self.age_s}


@dataclass(frozen=True)
class Supervision:
    service: str
    watchdog_restarts: int
    unit_restarts: int
    timer: str
    last: dict[str, Any] | None
    judgement: Judgement | None = None

    @property
    def last_action(self) -> str:
        if not self.last:
            return "-"
        return f"{self.last.get('result', '?')} at {self.last.get('time', '?')}"

    def to_dict(self) -> dict[str, Any]:
        return {"watchdog_restarts": self.watchdog_restarts, "unit_restarts": self.unit_restarts,
                "watchdog_timer": self.timer, "last_watchdog_action": self.last,
                "judgement": self.judgement.to_dict() if self.judgement else None}

    def stuck(self, interval_s: int) -> Judgement | None:
        """The fresh judgement that the engine does no work (hung or down), else None."""
        j = self.judgement
        return j if j is not None and j.verdict in STUCK and j.fresh(interval_s) else None


def _judgement(age: str, text: str) -> Judgement | None:
    try:
        v = json.loads(text)
        seconds = int(age)
    except ValueError:
        return None
    if not isinstance(v, dict):
        return None
    return Judgement(verdict=str(v.get("verdict") or "unknown")[:20], detail=str(v.get("detail") or "")[:300],
                     time=str(v.get("time") or "")[:40], age_s=seconds)


def parse_status(stdout: str) -> dict[str, Supervision]:
    out: dict[str, Supervision] = {}
    judgements: dict[str, Judgement] = {}
    for line in stdout.splitlines():
        if line.startswith(JUDGEMENT_MARK + " "):
            parts = line.split(" ", 3)
            j = _judgement(parts[2], parts[3]) if len(parts) == 4 else None
            if j is not None:
                judgements[parts[1]] = j
            continue
        if not line.startswith(MARK + " "):
            continue
        parts = line.split(" ", 5)
        if len(parts) < 5:
            continue

        def num(x: str) -> int:
            try:
                return int(x.strip())
            except ValueError:
                return 0

        last = None
        if len(parts) == 6 and parts[5].strip():
            try:
                v = json.loads(parts[5])
                last = v if isinstance(v, dict) else None
            except ValueError:
                last = None
        out[parts[1]] = Supervision(parts[1], num(parts[2]), num(parts[3]), parts[4], last)
    return {name: replace(sup, judgement=judgements.get(name)) for name, sup in out.items()}
