#!/bin/sh
# llmfleet watchdog for service chat: run by llmfleet-chat-watchdog.timer every 30 s.
# Restarts the unit after 3 failed worker probes (container running, rpc-server port listening) in a row, at most 3 times an
# hour (then it only records that it gave up); appends each action to the host's audit log.
set -u
SERVICE=chat
UNIT=llmfleet-chat.service
CONTAINER=llmfleet-chat
SERVICE_DIR=/opt/llmfleet/services/chat
AUDIT=/opt/llmfleet/audit.jsonl
PORT=50052
LISTENER='rpc-server 10.0.0.12:50052'
URL='container llmfleet-chat and rpc-server 10.0.0.12:50052'
WHAT='worker probes'
FAILURES=3
MAX_PER_HOUR=3
GRACE=900
PROBE_TIMEOUT=10
STATE="$SERVICE_DIR/watchdog.state"

judged() {  # verdict detail: the last judgement, for `invoke status`
  printf '{"time":"%s","verdict":"%s","detail":"%s"}\n' "$(date -u +%Y-%m-%dT%H:%M:%S+00:00)" "$1" "$2" \
    > "$STATE.judgement.tmp" && mv -f "$STATE.judgement.tmp" "$STATE.judgement"
}

audit() {  # action result detail
  now=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
  host=$(hostname 2>/dev/null | tr -cd 'A-Za-z0-9._-')
  rel=$(basename "$(readlink "$SERVICE_DIR/current" 2>/dev/null)" 2>/dev/null | tr -cd 'A-Za-z0-9-')
  line=$(printf '{"time":"%s","who":"watchdog","host":"%s","action":"%s","service":"%s","release":"%s","image_digest":null,"result":"%s","detail":"%s"}' \
    "$now" "$host" "$1" "$SERVICE" "$rel" "$2" "$3")
  printf '%s\n' "$line" >> "$AUDIT"
  printf '%s\n' "$line" > "$STATE.last"
}

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
age=$(awk -v u="$up" -v s="${started:-0}" 'BEGIN { printf "%d", u - s / 1000000 }')
young=0; [ "$age" -ge "$GRACE" ] || young=1

ok=0; verdict=down; why="container $CONTAINER not running"
[ "$(docker inspect --format '{{.State.Running}}' "$CONTAINER" 2>/dev/null)" = true ] && { ok=1; verdict=healthy; why=''; }
if [ "$ok" = 1 ] && [ -n "$PORT" ] && command -v ss >/dev/null 2>&1; then
  ss -Hltn "( sport = :$PORT )" 2>/dev/null | grep -q . || { ok=0; verdict=down; why="$LISTENER does not listen"; }
fi
if [ "$young" = 1 ] && [ "$verdict" = down ]; then
  judged starting "started $age s ago, within its load budget of $GRACE s"
  exit 0
fi
why=$(printf '%s' "$why" | tr -d '"\' | tr -c '[:print:]' ' ' | head -c 300)
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
