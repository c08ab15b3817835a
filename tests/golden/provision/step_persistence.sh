set -e
systemctl enable nvidia-persistenced.service
