set -e
usermod -aG docker -- deploy
