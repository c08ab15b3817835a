set -e
systemctl enable --now docker.service
nvidia-ctk runtime configure --runtime=docker
systemctl restart docker.service
