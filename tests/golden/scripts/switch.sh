set -e
cd /opt/llmfleet/services/chat
test -f releases/20261129T120000Z-abcdef0123/compose.yml
ln -sfn releases/20261129T120000Z-abcdef0123 .current.tmp
mv -T .current.tmp current
if ! cmp -s releases/20261129T120000Z-abcdef0123/llmfleet-chat.service /etc/systemd/system/llmfleet-chat.service || [ -n "$(systemctl show -p NeedDaemonReload --value llmfleet-chat.service 2>/dev/null | grep -vx no)" ]; then
  install -m 0644 releases/20261129T120000Z-abcdef0123/llmfleet-chat.service /etc/systemd/system/llmfleet-chat.service
  systemctl daemon-reload
fi
systemctl reset-failed llmfleet-chat.service >/dev/null 2>&1 || true
systemctl enable --no-reload llmfleet-chat.service >/dev/null 2>&1 || true
systemctl restart llmfleet-chat.service
echo '@@switched'
