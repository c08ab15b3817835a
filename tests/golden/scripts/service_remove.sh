systemctl stop llmfleet-chat.service >/dev/null 2>&1 || true
systemctl disable llmfleet-chat.service >/dev/null 2>&1 || true
if [ -f /opt/llmfleet/services/chat/current/compose.yml ]; then
  (cd /opt/llmfleet/services/chat/current && docker compose -p llmfleet-chat -f compose.yml down --remove-orphans --timeout 30) >/dev/null 2>&1 || true
fi
ids=$(docker ps -aq --filter label=io.llmfleet.service=chat 2>/dev/null)
[ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1 || true
docker rm -f llmfleet-chat >/dev/null 2>&1 || true
docker network rm llmfleet-chat_default >/dev/null 2>&1 || true
rm -f -- /etc/systemd/system/llmfleet-chat.service
systemctl daemon-reload
systemctl reset-failed llmfleet-chat.service >/dev/null 2>&1 || true
rm -rf -- /opt/llmfleet/services/chat
docker image rm reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd >/dev/null 2>&1 && echo '@@image-removed reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd' || true
left=$(docker ps -aq --filter label=io.llmfleet.service=chat 2>/dev/null)
if [ -e /opt/llmfleet/services/chat ] || [ -e /etc/systemd/system/llmfleet-chat.service ] || [ -n "$left" ]; then echo '@@left'; exit 1; fi
echo '@@removed'
