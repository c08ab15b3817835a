set -e
export DEBIAN_FRONTEND=noninteractive
apt-get -y -q -o Dpkg::Options::=--force-confold -o DPkg::Lock::Timeout=300 --no-install-recommends --allow-downgrades --allow-change-held-packages install linux-headers-amd64 linux-headers-6.1.0-28-amd64 nvidia-driver=580.95.05-1 nvidia-kernel-dkms=580.95.05-1 nvidia-persistenced
