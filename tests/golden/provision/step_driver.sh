set -e
export DEBIAN_FRONTEND=noninteractive
apt-get -y -q -o Dpkg::Options::=--force-confold --no-install-recommends --allow-downgrades --allow-change-held-packages install nvidia-tesla-535-driver nvidia-persistenced
