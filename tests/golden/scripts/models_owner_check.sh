o=$(head -c 64 -- '/srv/models/m it'"'"'s.gguf.llmfleet.part.owner' 2>/dev/null); if [ "$o" != cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd ]; then echo "@@staging-taken ${o:-none}"; exit 5; fi
grep -qF -- cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd /opt/llmfleet/locks/deploy/holder.json 2>/dev/null || { echo '@@lock-lost'; exit 5; }
