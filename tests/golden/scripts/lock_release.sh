if [ ! -d /opt/llmfleet/locks/deploy ]; then echo '@@notheld'; exit 0; fi
if grep -qF t0k3n /opt/llmfleet/locks/deploy/holder.json 2>/dev/null; then
  rm -f -- /opt/llmfleet/locks/deploy/holder.json && rmdir -- /opt/llmfleet/locks/deploy && echo '@@released'
else
  echo '@@notours'; head -c 4096 /opt/llmfleet/locks/deploy/holder.json 2>/dev/null; exit 3
fi
