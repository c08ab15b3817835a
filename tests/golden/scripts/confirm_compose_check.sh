cd /opt/llmfleet/services/chat/releases/20261129T120000Z-abcdef0123 || exit 5
set -- -f compose.yml
[ -f compose.override.yml ] && set -- "$@" -f compose.override.yml
if ! out=$(docker compose -p llmfleet-chat "$@" config -q 2>&1); then
  printf '@@compose-invalid %s\n' "$(printf '%s' "$out" | tr '\n' ' ' | head -c 600)"
  exit 5
fi
echo '@@compose-valid'
