for d in /opt/llmfleet/services/chat/releases/*/; do
  [ -f "$d/bench.json" ] || continue
  echo "@@bench $(basename "$d") $(head -c 2000000 "$d/bench.json" | tr -d "\n")"
done
echo '@@end'
