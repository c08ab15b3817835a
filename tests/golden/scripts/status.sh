llmfleet_release_state() {
  base="$1/services"
  if [ -d "$base" ]; then
    for s in "$base"/*/; do
      [ -d "$s" ] || continue
      name=$(basename "$s")
      case "$name" in *[!A-Za-z0-9_-]*|"") continue ;; esac
      echo "@@service $name"
      echo "@@current $(readlink "$s/current" 2>/dev/null | tr -d '\n')"
      echo "@@unit $(systemctl is-active "llmfleet-$name.service" 2>/dev/null)"
      for d in "$s"releases/*/; do
        [ -d "$d" ] || continue
        rid=$(basename "$d")
        case "$rid" in *[!0-9A-Za-z-]*|"") continue ;; esac
        echo "@@release $rid"
        if [ -f "$d/manifest.json" ]; then echo "@@manifest $(head -c 65536 "$d/manifest.json" | tr -d '\n')"; fi
        if [ -f "$d/health.json" ]; then echo "@@health $(head -c 16384 "$d/health.json" | tr -d '\n')"; fi
      done
    done
  fi
  echo '@@end'
}
llmfleet_release_state /opt/llmfleet
echo '@@gpu'
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 64 || true
(
for s in /opt/llmfleet/services/*/; do
  [ -d "$s" ] || continue
  name=$(basename "$s")
  r=$(cat "${s}watchdog.state.restarts" 2>/dev/null | wc -l)
  n=$(systemctl show -p NRestarts --value "llmfleet-$name.service" 2>/dev/null)
  t=$(systemctl is-active "llmfleet-$name-watchdog.timer" 2>/dev/null)
  last=$(head -c 2000 "${s}watchdog.state.last" 2>/dev/null | tr -d "\n")
  echo "@@watchdog $name ${r:-0} ${n:-0} ${t:-unknown} $last"
  j="${s}watchdog.state.judgement"
  if [ -f "$j" ]; then
    age=$(( $(date +%s) - $(stat -c %Y "$j" 2>/dev/null || date +%s) ))
    echo "@@watchdog-judgement $name $age $(head -c 1000 "$j" | tr -d "\n")"
  fi
done
) 2>/dev/null || true
docker ps -a --filter label=io.llmfleet.role=worker --format '@@worker-container {{.Names}} {{.State}}' 2>/dev/null | head -n 64 || true
ss -Hltn 2>/dev/null | awk '{n = split($4, a, ":"); print "@@listen " a[n]}' | sort -u | head -n 512 || true
