[ -d /opt/llmfleet/services/chat ] && echo '@@present' || echo '@@absent'
