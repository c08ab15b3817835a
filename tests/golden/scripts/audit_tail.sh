if [ -f /opt/llmfleet/audit.jsonl ]; then tail -n 50 /opt/llmfleet/audit.jsonl; else echo '@@none'; fi
