echo "@@unit $(systemctl is-active llmfleet-chat.service 2>/dev/null)"
