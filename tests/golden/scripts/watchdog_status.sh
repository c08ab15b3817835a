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
