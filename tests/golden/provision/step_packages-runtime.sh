set -e
export DEBIAN_FRONTEND=noninteractive
apt-get -q update
apt-get -y -q -o Dpkg::Options::=--force-confold --no-install-recommends --allow-downgrades --allow-change-held-packages install docker.io docker-compose
