export DEBIAN_FRONTEND=noninteractive
dpkg --configure -a
apt-get -y -q -o Dpkg::Options::=--force-confold -f install
