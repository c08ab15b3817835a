if [ -d /opt/llmfleet/locks/deploy ]; then echo '@@held'; head -c 4096 /opt/llmfleet/locks/deploy/holder.json 2>/dev/null; echo;
  rm -rf -- /opt/llmfleet/locks/deploy && echo '@@broken'; else echo '@@free'; fi
