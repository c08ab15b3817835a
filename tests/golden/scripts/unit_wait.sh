i=0
while :; do
  u=$(systemctl is-active llmfleet-chat.service 2>/dev/null)
  c=$(docker inspect --format '{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}' llmfleet-chat 2>/dev/null)
  case "$u $c" in failed*|*" running "*|*" exited "*|*" dead "*) break ;; esac
  [ "$i" -ge 200 ] && break
  i=$((i + 1))
  sleep 0.1 2>/dev/null || sleep 1
done
echo "@@unit $u"
echo "@@container $c"
