systemctl stop llmfleet-chat.service || true
systemctl disable llmfleet-chat.service >/dev/null 2>&1 || true
rm -f -- /opt/llmfleet/services/chat/current
echo '@@stopped'
