out=$(journalctl -u llmfleet-chat.service -n 400 --no-pager -o cat 2>/dev/null || true)
[ -n "$out" ] || out=$(docker logs --tail 400 llmfleet-chat 2>&1 || true)
printf '%s\n' "$out" | grep -a -E 'using device RPC' || true
echo '@@end'
