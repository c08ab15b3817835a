out=$(journalctl -u llmfleet-chat.service -n 200 --no-pager -o cat 2>/dev/null || true)
if [ -n "$out" ]; then printf '%s\n' "$out";
else docker logs --tail 200 llmfleet-chat 2>&1 || true; fi
