rm -rf -- /tmp/llmfleet-peer.abc
echo @@peer-cleaned
