mkdir -p /opt/llmfleet
printf '%s\n' '{"time":"2026-11-29T12:00:00+00:00","who":"alice","host":"h1","action":"deploy","service":"chat","release":"20261129T120000Z-abcdef0123","image_digest":"sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","result":"deployed","detail":"it'"'"'s ok","message":"canary"}' >> /opt/llmfleet/audit.jsonl
chmod 0640 /opt/llmfleet/audit.jsonl 2>/dev/null || true
