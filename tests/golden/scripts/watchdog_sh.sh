#!/bin/sh
# llmfleet watchdog for service chat: run by llmfleet-chat-watchdog.timer every 30 s.
# Restarts the unit after 3 failed judgements (/health, then work done) in a row, at most 3 times an
# hour (then it only records that it gave up); appends each action to the host's audit log.
set -u
SERVICE=chat
UNIT=llmfleet-chat.service
CONTAINER=llmfleet-chat
SERVICE_DIR=/opt/llmfleet/services/chat
AUDIT=/opt/llmfleet/audit.jsonl
BASE=http://127.0.0.1:8080
URL=http://127.0.0.1:8080/health
KEY_ENV=''
PROGRESS=1
STALL_WINDOW=120
IDLE_PROBE=1
RUNNING=llamacpp:requests_processing
WAITING=llamacpp:requests_deferred
PROGRESS_COUNTERS='llamacpp:n_decode_total llamacpp:tokens_predicted_total llamacpp:prompt_tokens_total'
COMPLETION='{"model":"chat","prompt":"ping","max_tokens":1,"temperature":0}'
WHAT=judgements
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

api() {  # path out [curl args...]: HTTP status of a bounded request, body in out
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
}
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
}

why=''
if command -v curl >/dev/null 2>&1; then
  if curl -fsS -o /dev/null --max-time "$PROBE_TIMEOUT" "$URL" 2>/dev/null; then
    judge
  else
    ok=0; verdict=down; why="/health did not answer 200 within $PROBE_TIMEOUT s"
  fi
else
  [ "$(docker inspect --format '{{.State.Health.Status}}' "$CONTAINER" 2>/dev/null)" = unhealthy ] && ok=0 || ok=1
  verdict=unknown; [ "$ok" = 1 ] || { verdict=down; why="Docker healthcheck: unhealthy (no curl on the host)"; }
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
