echo @@log
docker logs llmfleet-chat 2>&1 | grep -a -E -e 'offloaded [0-9]+/[0-9]+ layers|model buffer size|[^A-Za-z]buffer size =|KV buffer size|KV self size|llama_kv_cache[a-z_]*: (size|kv_size)|kv_size =|n_ctx +=|flash_attn +=|Flash Attention|build:? [0-9]+ \([0-9a-f]+\)' | head -n 400
echo "@@pids $(docker top llmfleet-chat -eo pid 2>/dev/null | tr -s ' \n' '  ')"
echo @@smi
out=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>&1); rc=$?
printf '%s\n' "$out" | head -n 64
echo "@@smi-rc $rc"
