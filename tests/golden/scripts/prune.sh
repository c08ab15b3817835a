cd /opt/llmfleet/services/chat/releases || exit 0
rm -rf -- .tmp-*
rm -rf -- 20261129T110000Z-0123456789
echo '@@pruned'
