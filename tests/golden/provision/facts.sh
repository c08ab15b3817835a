M=MARK
sec() { printf '\n==%s== %s\n' "$M" "$1"; }
export LC_ALL=C
T=$(mktemp -d 2>/dev/null) || T=""
bg() { if [ -n "$T" ]; then ( "$@" ) > "$T/$1" 2>&1 & fi; }
shown() { if [ -n "$T" ]; then wait; cat "$T/$1"; else ( "$@" ) 2>&1; fi; }
p_smi() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    out=$(nvidia-smi --query-gpu=driver_version,name --format=csv,noheader 2>&1); rc=$?
    printf '%s\n' "$out" | head -c 8192; echo "rc=$rc"
  else echo absent; fi
}
p_docker() { command -v docker >/dev/null 2>&1 && docker version --format '{{.Server.Version}}' 2>&1 | head -c 512; }
p_compose() { command -v docker >/dev/null 2>&1 && docker compose version --short 2>/dev/null | head -c 512; }
p_units() {
  printf '%s\t%s\t%s\n' docker.service "$(systemctl is-enabled -- docker.service 2>/dev/null)" "$(systemctl is-active -- docker.service 2>/dev/null)"
  printf '%s\t%s\t%s\n' nvidia-persistenced.service "$(systemctl is-enabled -- nvidia-persistenced.service 2>/dev/null)" "$(systemctl is-active -- nvidia-persistenced.service 2>/dev/null)"
  true
}
bg p_smi; bg p_docker; bg p_compose; bg p_units
sec os-release; cat /etc/os-release 2>/dev/null
sec kernel; uname -r
sec arch; dpkg --print-architecture 2>/dev/null
sec dpkg; dpkg-query -W -f='${binary:Package}\t${Version}\t${db:Status-Abbrev}\n' 'nvidia-*' 'libnvidia-*' 'firmware-nvidia-*' 'cuda-drivers*' 'docker*' 'containerd*' runc 'linux-headers-*' nftables 2>/dev/null
sec holds; apt-mark showhold 2>/dev/null
sec dpkg-audit; dpkg --audit 2>&1 | head -c 4096
sec nvidia-smi; shown p_smi
sec docker; shown p_docker
sec compose; shown p_compose
sec ctk; command -v nvidia-ctk >/dev/null 2>&1 && nvidia-ctk --version 2>/dev/null | head -c 512
sec daemon-json; head -c 65536 /etc/docker/daemon.json 2>/dev/null
sec user; id -nG -- deploy 2>/dev/null || echo '@@nouser'
sec paths
stat -c '%F	%a	%U	%G	%n' -- /opt/llmfleet 2>/dev/null || printf 'absent\t\t\t\t%s\n' /opt/llmfleet
stat -c '%F	%a	%U	%G	%n' -- /srv/models 2>/dev/null || printf 'absent\t\t\t\t%s\n' /srv/models
sec files
if [ -f /etc/security/limits.d/90-llmfleet.conf ]; then stat -c '%a	%U	%G	%n' -- /etc/security/limits.d/90-llmfleet.conf; head -c 65536 -- /etc/security/limits.d/90-llmfleet.conf | base64 -w0; echo; else printf 'absent\t\t\t%s\n\n' /etc/security/limits.d/90-llmfleet.conf; fi
if [ -f /etc/systemd/journald.conf ]; then stat -c '%a	%U	%G	%n' -- /etc/systemd/journald.conf; head -c 65536 -- /etc/systemd/journald.conf | base64 -w0; echo; else printf 'absent\t\t\t%s\n\n' /etc/systemd/journald.conf; fi
sec units; shown p_units
sec reboot-required; [ -e /var/run/reboot-required ] && echo yes || echo no
[ -z "$T" ] || rm -rf -- "$T"
sec done
