bad=0
sync -- /srv/models/qwen.llmfleet.part/config.json 2>/dev/null || true
h=$(sha256sum -- /srv/models/qwen.llmfleet.part/config.json 2>/dev/null | cut -c1-64)
if [ "$h" = bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb ]; then echo "@@sha OK config.json $h"; else echo "@@sha BAD config.json ${h:-unreadable}"; bad=1; rm -f -- /srv/models/qwen.llmfleet.part/config.json; fi
sync -- '/srv/models/qwen.llmfleet.part/model it'"'"'s.safetensors' 2>/dev/null || true
h=$(sha256sum -- '/srv/models/qwen.llmfleet.part/model it'"'"'s.safetensors' 2>/dev/null | cut -c1-64)
if [ "$h" = cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc ]; then echo "@@sha OK model it's.safetensors $h"; else echo "@@sha BAD model it's.safetensors ${h:-unreadable}"; bad=1; rm -f -- '/srv/models/qwen.llmfleet.part/model it'"'"'s.safetensors'; fi
[ "$bad" = 0 ] || exit 3
