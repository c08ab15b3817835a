tail -n 50 /opt/llmfleet/services/chat/cluster.jsonl 2>/dev/null | sed 's/^/@@cluster-set /'
echo '@@end'
