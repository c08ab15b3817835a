set -e
umask 077
(umask 022 && mkdir -p -- /etc/security/limits.d)
printf '%s' IyBXcml0dGVuIGJ5IGxsbWZsZWV0IHByb3Zpc2lvbjogZW5naW5lcyBwaW4gaG9zdCBtZW1vcnkgZm9yIEdQVSB0cmFuc2ZlcnMgKG5vIG1lbWxvY2sgbGltaXQpLgpkZXBsb3kgc29mdCBtZW1sb2NrIHVubGltaXRlZApkZXBsb3kgaGFyZCBtZW1sb2NrIHVubGltaXRlZAo= | base64 -d > /etc/security/limits.d/90-llmfleet.conf.llmfleet-new
chown root:root /etc/security/limits.d/90-llmfleet.conf.llmfleet-new
chmod 0644 /etc/security/limits.d/90-llmfleet.conf.llmfleet-new
mv -f -- /etc/security/limits.d/90-llmfleet.conf.llmfleet-new /etc/security/limits.d/90-llmfleet.conf
(umask 022 && mkdir -p -- /etc/systemd/journald.conf.d)
printf '%s' IyBXcml0dGVuIGJ5IGxsbWZsZWV0IHByb3Zpc2lvbjogdGhlIGpvdXJuYWwga2VlcHMgdGhlIGVuZ2luZXMnIG91dHB1dCAob25lIHVuaXQgcGVyIHNlcnZpY2UpLCBib3VuZGVkLgpbSm91cm5hbF0KU3lzdGVtTWF4VXNlPTJHClJ1bnRpbWVNYXhVc2U9NTEyTQpSYXRlTGltaXRJbnRlcnZhbFNlYz0zMHMKUmF0ZUxpbWl0QnVyc3Q9MjAwMDAK | base64 -d > /etc/systemd/journald.conf.d/90-llmfleet.conf.llmfleet-new
chown root:root /etc/systemd/journald.conf.d/90-llmfleet.conf.llmfleet-new
chmod 0644 /etc/systemd/journald.conf.d/90-llmfleet.conf.llmfleet-new
mv -f -- /etc/systemd/journald.conf.d/90-llmfleet.conf.llmfleet-new /etc/systemd/journald.conf.d/90-llmfleet.conf
systemctl restart systemd-journald.service
