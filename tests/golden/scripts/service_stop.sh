[ -d /opt/llmfleet/services/chat ] || { echo '@@absent'; exit 0; }
systemctl stop llmfleet-chat.service >/dev/null 2>&1 || true
systemctl disable llmfleet-chat.service >/dev/null 2>&1 || true
echo "@@unit $(systemctl is-active llmfleet-chat.service 2>/dev/null)"
echo '@@stopped'
