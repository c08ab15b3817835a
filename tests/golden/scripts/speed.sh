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
echo '@@bench-service chat'
for d in /opt/llmfleet/services/chat/releases/*/; do
  [ -f "$d/bench.json" ] || continue
  echo "@@bench $(basename "$d") $(head -c 2000000 "$d/bench.json" | tr -d "\n")"
done
echo '@@end'
echo '@@bench-service embed'
for d in /opt/llmfleet/services/embed/releases/*/; do
  [ -f "$d/bench.json" ] || continue
  echo "@@bench $(basename "$d") $(head -c 2000000 "$d/bench.json" | tr -d "\n")"
done
echo '@@end'
