if [ -d /opt/llmfleet/locks/deploy ]; then echo '@@held'; head -c 4096 /opt/llmfleet/locks/deploy/holder.json 2>/dev/null; echo;
else echo '@@free'; fi
