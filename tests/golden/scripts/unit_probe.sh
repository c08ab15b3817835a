echo "@@unit $(systemctl is-active llmfleet-chat.service 2>/dev/null)"
echo "@@container $(docker inspect --format '{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}' llmfleet-chat 2>/dev/null)"
