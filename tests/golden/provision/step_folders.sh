set -e
install -d -m 0755 -o root -g root -- /opt/llmfleet
install -d -m 0755 -o deploy -g deploy -- /srv/models/tiny-qwen2-gguf
