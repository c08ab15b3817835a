set -e
apt-mark hold nvidia-container-toolkit nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1 nvidia-driver nvidia-kernel-dkms
