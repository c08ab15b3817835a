bad=0
h=$(sha256sum -- /srv/models/m.gguf 2>/dev/null | cut -c1-64)
if [ "$h" = aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa ]; then echo "@@sha OK m.gguf $h"; else echo "@@sha BAD m.gguf ${h:-unreadable}"; bad=1; fi
[ "$bad" = 0 ] || exit 3
