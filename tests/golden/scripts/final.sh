(
printf '%s\n' '{"result":"healthy"}' > /opt/llmfleet/services/chat/releases/20261129T120000Z-abcdef0123/health.json && echo '@@marked'
)
(
cd /opt/llmfleet/services/chat/releases || exit 0
rm -rf -- .tmp-*
rm -rf -- 20261129T110000Z-0123456789
echo '@@pruned'
)
mkdir -p /opt/llmfleet
printf '%s\n' '{"time":"2026-11-29T12:00:00+00:00","who":"alice","host":"h1","action":"deploy","service":"chat","release":"20261129T120000Z-abcdef0123","image_digest":"sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","result":"deployed","detail":"it'"'"'s ok","message":"canary"}' >> /opt/llmfleet/audit.jsonl
chmod 0640 /opt/llmfleet/audit.jsonl 2>/dev/null || true
(
if [ ! -d /opt/llmfleet/locks/deploy ]; then echo '@@notheld'; exit 0; fi
if grep -qF t0k3n /opt/llmfleet/locks/deploy/holder.json 2>/dev/null; then
  rm -f -- /opt/llmfleet/locks/deploy/holder.json && rmdir -- /opt/llmfleet/locks/deploy && echo '@@released'
else
  echo '@@notours'; head -c 4096 /opt/llmfleet/locks/deploy/holder.json 2>/dev/null; exit 3
fi
)
