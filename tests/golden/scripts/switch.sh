set -e
cd /opt/llmfleet/services/chat
test -f releases/20261129T120000Z-abcdef0123/compose.yml
ln -sfn releases/20261129T120000Z-abcdef0123 .current.tmp
mv -T .current.tmp current
install -m 0644 releases/20261129T120000Z-abcdef0123/llmfleet-chat.service /etc/systemd/system/llmfleet-chat.service
systemctl daemon-reload
systemctl reset-failed llmfleet-chat.service >/dev/null 2>&1 || true
systemctl enable llmfleet-chat.service >/dev/null 2>&1 || true
systemctl restart llmfleet-chat.service
echo '@@switched'
