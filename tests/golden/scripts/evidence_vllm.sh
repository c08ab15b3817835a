echo @@log
docker logs llmfleet-chat 2>&1 | grep -a -E -e 'Model loading took|Loading model weights took|KV cache memory|KV cache size|Maximum concurrency|backend|Kernel for|MoE config|configuration from .* for MoE|vLLM API server version|LLM engine \(v|GPU blocks|CPU blocks' | head -n 100
echo "@@pids $(docker top llmfleet-chat -eo pid 2>/dev/null | tr -s ' \n' '  ')"
echo @@smi
out=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>&1); rc=$?
printf '%s\n' "$out" | head -n 64
echo "@@smi-rc $rc"
