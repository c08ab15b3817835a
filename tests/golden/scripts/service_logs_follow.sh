if journalctl -u llmfleet-chat.service -n 1 --no-pager -o cat 2>/dev/null | grep -a -q .; then
  exec timeout 30 journalctl -u llmfleet-chat.service -n 100 -f --no-pager -o cat
else
  exec timeout 30 docker logs -f --tail 100 llmfleet-chat 2>&1
fi
