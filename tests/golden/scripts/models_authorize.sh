umask 077
mkdir -p "$HOME/.ssh" || exit 1
printf "%s\n" 'restrict,from="10.0.0.7",command="umask 022; mkdir -p -- /srv/models || exit 1; : > /srv/models/m.gguf.llmfleet.part || exit 1; cat >> /srv/models/m.gguf.llmfleet.part; rc=$?; echo \"@@received $(stat -c %s -- /srv/models/m.gguf.llmfleet.part 2>/dev/null)\"; exit $rc" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB llmfleet-transfer-0123abcd' >> "$HOME/.ssh/authorized_keys" || exit 1
echo "@@authorized"
