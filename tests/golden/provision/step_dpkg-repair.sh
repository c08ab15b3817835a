export DEBIAN_FRONTEND=noninteractive
dpkg --configure -a
apt-get -y -q -o Dpkg::Options::=--force-confold -o DPkg::Lock::Timeout=300 -f install
