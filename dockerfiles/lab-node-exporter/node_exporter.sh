#!/bin/sh
# /bin/node_exporter of the lab image: Debian's node exporter with upstream's defaults. Debian's build
# turns the systemd collector on by default (upstream: off; it needs the host's D-Bus socket and fails
# every scrape without it) and reads text files from /var/lib/prometheus/node-exporter (upstream: no
# directory). The node exporter refuses a flag given twice, so each default is added only when the
# arguments do not set that flag themselves.
systemd=--no-collector.systemd
textfile=--collector.textfile.directory=
for arg in "$@"; do
  case "$arg" in
    --collector.systemd|--no-collector.systemd|--collector.systemd=*) systemd= ;;
    --collector.textfile.directory|--collector.textfile.directory=*) textfile= ;;
  esac
done
exec /usr/bin/prometheus-node-exporter ${systemd:+"$systemd"} ${textfile:+"$textfile"} "$@"
