set -e
umask 022
mkdir -p /opt/llmfleet/services/chat/releases
if [ -d /opt/llmfleet/services/chat/releases/20261129T120000Z-abcdef0123 ]; then cat >/dev/null; echo '@@exists'; exit 0; fi
rm -rf -- /opt/llmfleet/services/chat/releases/.tmp-*
trap 'rm -rf -- /opt/llmfleet/services/chat/releases/.tmp-20261129T120000Z-abcdef0123' EXIT
mkdir -m 0750 /opt/llmfleet/services/chat/releases/.tmp-20261129T120000Z-abcdef0123
tar -x --no-same-owner -f - -C /opt/llmfleet/services/chat/releases/.tmp-20261129T120000Z-abcdef0123
chmod 0600 /opt/llmfleet/services/chat/releases/.tmp-20261129T120000Z-abcdef0123/service.env
mv -T /opt/llmfleet/services/chat/releases/.tmp-20261129T120000Z-abcdef0123 /opt/llmfleet/services/chat/releases/20261129T120000Z-abcdef0123
echo '@@uploaded'
