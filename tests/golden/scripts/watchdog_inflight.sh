SERVICE_DIR=/opt/llmfleet/services/chat
BASE=http://127.0.0.1:8080
KEY_ENV=LLAMA_API_KEY
PROBE_TIMEOUT=5
RUNNING=llamacpp:requests_processing
WAITING=llamacpp:requests_deferred
STATE=$(mktemp)
trap 'rm -f "$STATE"' EXIT
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
left=-
for _ in $(seq 1 240); do
  code=$(api /metrics "$STATE")
  [ "$code" = 200 ] || break
  left=$(awk -v R="$RUNNING" -v W="$WAITING" '
    BEGIN { n = split(R " " W, want, " "); for (i = 1; i <= n; i++) w[want[i]] = 1 }
    /^#/ || NF < 2 { next }
    { name = $1; i = index(name, "{"); if (i) name = substr(name, 1, i - 1); if (name in w) { s += $NF; seen = 1 } }
    END { if (seen) printf "%.0f\n", s; else print "-" }' "$STATE")
  case "$left" in 0|-) break ;; esac
  sleep 0.5
done
echo "@@inflight $left"
