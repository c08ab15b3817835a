a=$(ip -4 -o addr show dev eth0 scope global 2>/dev/null | awk '{print $4}' | head -n 1); echo "@@addr ${a%%/*}"
