[ -f /opt/llmfleet/services/chat/current/compose.yml ] || { echo '@@nocurrent'; exit 0; }
[ -f /etc/systemd/system/llmfleet-chat.service ] || install -m 0644 /opt/llmfleet/services/chat/current/llmfleet-chat.service /etc/systemd/system/llmfleet-chat.service
systemctl daemon-reload
systemctl reset-failed llmfleet-chat.service >/dev/null 2>&1 || true
systemctl enable llmfleet-chat.service >/dev/null 2>&1 || true
systemctl start llmfleet-chat.service
echo "@@unit $(systemctl is-active llmfleet-chat.service 2>/dev/null)"
echo '@@started'
