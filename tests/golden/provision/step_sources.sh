set -e
umask 077
(umask 022 && mkdir -p -- /etc/apt/preferences.d)
printf '%s' IyBXcml0dGVuIGJ5IGxsbWZsZWV0IHByb3Zpc2lvbjogdGhlIE5WSURJQSBkcml2ZXIgc3RheXMgYXQgNTgwLjk1LjA1LTEgKFI1ODApOyBhcHQgdGFrZXMgdGhpcwojIHZlcnNpb24gZm9yIGVhY2ggb2YgaXRzIHBhY2thZ2VzLCB3aGF0ZXZlciBuZXdlciBvbmUgYSBzb3VyY2Ugb2ZmZXJzLiBUaGV5IGFyZSBoZWxkIHRvby4KUGFja2FnZTogbnZpZGlhLSogbGlibnZpZGlhLSogY3VkYS1kcml2ZXJzKiBmaXJtd2FyZS1udmlkaWEtKiB4c2VydmVyLXhvcmctdmlkZW8tbnZpZGlhKgpQaW46IHZlcnNpb24gNTgwLjk1LjA1LTEKUGluLVByaW9yaXR5OiAxMDAxCg== | base64 -d > /etc/apt/preferences.d/90-llmfleet-nvidia-driver.llmfleet-new
chown root:root /etc/apt/preferences.d/90-llmfleet-nvidia-driver.llmfleet-new
chmod 0644 /etc/apt/preferences.d/90-llmfleet-nvidia-driver.llmfleet-new
mv -f -- /etc/apt/preferences.d/90-llmfleet-nvidia-driver.llmfleet-new /etc/apt/preferences.d/90-llmfleet-nvidia-driver
export DEBIAN_FRONTEND=noninteractive
apt-get -q update
