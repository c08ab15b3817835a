echo "@@unit $(systemctl is-active llmfleet-chat.service 2>/dev/null)"
if timeout 3 bash -c "exec 3<>/dev/tcp/10.0.0.12/50052" 2>/dev/null; then echo '@@port open'; else echo '@@port closed'; fi
