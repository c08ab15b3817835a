rm -f /opt/llmfleet/services/chat/watchdog.state.fails /opt/llmfleet/services/chat/watchdog.state.restarts /opt/llmfleet/services/chat/watchdog.state.gaveup /opt/llmfleet/services/chat/watchdog.state.failed
if [ -f /opt/llmfleet/services/chat/current/llmfleet-chat-watchdog.timer ] && [ -f /opt/llmfleet/services/chat/current/watchdog.sh ]; then
  if ! cmp -s /opt/llmfleet/services/chat/current/llmfleet-chat-watchdog.service /etc/systemd/system/llmfleet-chat-watchdog.service || ! cmp -s /opt/llmfleet/services/chat/current/llmfleet-chat-watchdog.timer /etc/systemd/system/llmfleet-chat-watchdog.timer || [ -n "$(systemctl show -p NeedDaemonReload --value llmfleet-chat-watchdog.service llmfleet-chat-watchdog.timer 2>/dev/null | grep -vx no)" ]; then
    install -m 0644 /opt/llmfleet/services/chat/current/llmfleet-chat-watchdog.service /etc/systemd/system/llmfleet-chat-watchdog.service
    install -m 0644 /opt/llmfleet/services/chat/current/llmfleet-chat-watchdog.timer /etc/systemd/system/llmfleet-chat-watchdog.timer
    systemctl daemon-reload >/dev/null 2>&1 || true
  fi
  systemctl enable --no-reload llmfleet-chat-watchdog.timer >/dev/null 2>&1 || true
  systemctl restart llmfleet-chat-watchdog.timer >/dev/null 2>&1 && echo '@@watchdog-on' || echo '@@watchdog-off'
else
  systemctl disable --now llmfleet-chat-watchdog.timer >/dev/null 2>&1 || true
  echo '@@watchdog-off'
fi
