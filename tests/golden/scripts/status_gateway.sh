llmfleet_release_state() {
  base="$1/services"
  if [ -d "$base" ]; then
    for s in "$base"/*/; do
      [ -d "$s" ] || continue
      name=$(basename "$s")
      case "$name" in *[!A-Za-z0-9_-]*|"") continue ;; esac
      echo "@@service $name"
      echo "@@current $(readlink "$s/current" 2>/dev/null | tr -d '\n')"
      echo "@@unit $(systemctl is-active "llmfleet-$name.service" 2>/dev/null)"
      for d in "$s"releases/*/; do
        [ -d "$d" ] || continue
        rid=$(basename "$d")
        case "$rid" in *[!0-9A-Za-z-]*|"") continue ;; esac
        echo "@@release $rid"
        if [ -f "$d/manifest.json" ]; then echo "@@manifest $(head -c 65536 "$d/manifest.json" | tr -d '\n')"; fi
        if [ -f "$d/health.json" ]; then echo "@@health $(head -c 16384 "$d/health.json" | tr -d '\n')"; fi
      done
    done
  fi
  echo '@@end'
}
llmfleet_release_state /opt/llmfleet
# llmfleet GPU health reader: the kernel log's NVRM Xid lines since boot, and the NVIDIA display and 3D
# devices on the PCI bus (llmfleet.host.gpu_health parses both).
llmfleet_gpu_xids() {
    if dmesg >/dev/null 2>&1; then
        echo "source=dmesg"
        dmesg 2>/dev/null | llmfleet_xid_lines
    elif [ -n "$(journalctl -k -b -n 1 -q --no-pager 2>/dev/null)" ]; then
        echo "source=journalctl"
        journalctl -k -b -q --no-pager -o short-monotonic 2>/dev/null | llmfleet_xid_lines
    else
        echo "source=none"
        dmesg 2>&1 | head -n 1
    fi
    return 0
}
llmfleet_xid_lines() {
    if command -v awk >/dev/null 2>&1; then
        grep -e 'NVRM: Xid' -e 'fallen off the bus' | awk '
            { n++; k = "?"
              if (match($0, /Xid \((PCI:)?[0-9A-Fa-f:.]+\): *[0-9]+/)) k = substr($0, RSTART, RLENGTH)
              else if (match($0, /GPU (at )?(PCI:)?[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f.]+/)) k = substr($0, RSTART, RLENGTH)
              if (!(k in c)) { if (m >= 256) { skipped++; next }; o[++m] = k }
              c[k]++; l[k] = substr($0, 1, 400) }
            END { for (i = 1; i <= m; i++) printf "count=%d %s\n", c[o[i]], l[o[i]]
                  printf "lines=%d\n", n
                  if (skipped) printf "skipped=%d\n", skipped }'
    else
        grep -e 'NVRM: Xid' -e 'fallen off the bus' | tail -n 200
    fi
}
llmfleet_gpu_pci() {
    if command -v lspci >/dev/null 2>&1; then
        echo "source=lspci"
        lspci -D -n -d 10de: 2>&1 | head -n 256
    elif [ -d /sys/bus/pci/devices ]; then
        echo "source=sysfs"
        for d in /sys/bus/pci/devices/*; do
            [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
            c=$(cat "$d/class" 2>/dev/null)
            v=$(cat "$d/device" 2>/dev/null)
            r=$(cat "$d/revision" 2>/dev/null)
            c=${c#0x}
            echo "${d##*/} $(printf '%.4s' "$c"): 10de:${v#0x} (rev ${r#0x})"
        done | head -n 256
    else
        echo "source=none"
    fi
    return 0
}
echo '@@gpu-health-q'
(if command -v timeout >/dev/null 2>&1; then timeout 20 nvidia-smi -q; else nvidia-smi -q; fi) 2>&1 | head -c 1048576
echo
echo '@@gpu-health-xid'
llmfleet_gpu_xids 2>/dev/null | head -c 262144
echo '@@gpu-health-pci'
llmfleet_gpu_pci 2>/dev/null
echo '@@gpu-health-end'
echo '@@gpu'
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 64 || true
(
for s in /opt/llmfleet/services/*/; do
  [ -d "$s" ] || continue
  name=$(basename "$s")
  r=$(cat "${s}watchdog.state.restarts" 2>/dev/null | wc -l)
  n=$(systemctl show -p NRestarts --value "llmfleet-$name.service" 2>/dev/null)
  t=$(systemctl is-active "llmfleet-$name-watchdog.timer" 2>/dev/null)
  last=$(head -c 2000 "${s}watchdog.state.last" 2>/dev/null | tr -d "\n")
  echo "@@watchdog $name ${r:-0} ${n:-0} ${t:-unknown} $last"
  j="${s}watchdog.state.judgement"
  if [ -f "$j" ]; then
    age=$(( $(date +%s) - $(stat -c %Y "$j" 2>/dev/null || date +%s) ))
    echo "@@watchdog-judgement $name $age $(head -c 1000 "$j" | tr -d "\n")"
  fi
done
) 2>/dev/null || true
docker ps -a --filter label=io.llmfleet.role=worker --format '@@worker-container {{.Names}} {{.State}}' 2>/dev/null | head -n 64 || true
ss -Hltn 2>/dev/null | awk '{n = split($4, a, ":"); print "@@listen " a[n]}' | sort -u | head -n 512 || true
echo '@@gateway 0'
llmfleet_gw=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || { echo "llmfleet: no HAProxy runtime API on 127.0.0.1:$1" >&2; exit 3; }; printf "%s\n" "$2" >&3; cat <&3' llmfleet-gateway-admin 9901 'show stat' 2>&1); llmfleet_gw_rc=$?
printf '%s\n' "$llmfleet_gw" | head -c 1048576
echo; echo "@@gateway-end $llmfleet_gw_rc"
echo '@@gateway 1'
llmfleet_gw=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" || { echo "llmfleet: no HAProxy runtime API on 127.0.0.1:$1" >&2; exit 3; }; printf "%s\n" "$2" >&3; cat <&3' llmfleet-gateway-admin 9911 'show stat' 2>&1); llmfleet_gw_rc=$?
printf '%s\n' "$llmfleet_gw" | head -c 1048576
echo; echo "@@gateway-end $llmfleet_gw_rc"
