printf '%s\n' '{"decode_tokps":42.5,"result":"healthy"}' > /opt/llmfleet/services/chat/releases/20261129T120000Z-abcdef0123/health.json && echo '@@marked'
