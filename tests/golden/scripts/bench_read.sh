for d in /opt/llmfleet/services/chat/releases/20261129T110000Z-0123456789/ /opt/llmfleet/services/chat/releases/20261129T120000Z-abcdef0123/; do
  [ -f "$d/bench.json" ] || continue
  echo "@@bench $(basename "$d") $(head -c 2000000 "$d/bench.json" | tr -d "\n")"
done
echo '@@end'
