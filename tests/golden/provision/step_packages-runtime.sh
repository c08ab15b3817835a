set -e
export DEBIAN_FRONTEND=noninteractive
apt-get -y -q -o Dpkg::Options::=--force-confold -o DPkg::Lock::Timeout=300 --no-install-recommends --allow-downgrades --allow-change-held-packages install docker.io=20.10.24+dfsg1-1+deb12u1+b6 docker-compose=2.26.1-4
