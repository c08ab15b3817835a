sh -s -- llmfleet-0123abcd /opt/llmfleet '/srv/models/m it'"'"'s.gguf'
