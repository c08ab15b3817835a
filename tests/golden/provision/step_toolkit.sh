set -e
export DEBIAN_FRONTEND=noninteractive
apt-get -y -q -o Dpkg::Options::=--force-confold -o DPkg::Lock::Timeout=300 --no-install-recommends --allow-downgrades --allow-change-held-packages install nvidia-container-toolkit=1.19.1-1 nvidia-container-toolkit-base=1.19.1-1 libnvidia-container-tools=1.19.1-1 libnvidia-container1=1.19.1-1
