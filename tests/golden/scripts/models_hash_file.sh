part='/srv/models/m it'"'"'s.gguf.llmfleet.part'
[ -f "$part" ] || exit 1
printf '@@hash %s %s %s\n' "$(stat -c %s -- "$part")" "$(sha256sum -- "$part" | cut -c1-64)" 'm it'"'"'s.gguf'
