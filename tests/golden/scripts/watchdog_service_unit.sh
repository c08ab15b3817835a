# Rendered by llmfleet for service chat: one watchdog probe (see watchdog.sh).
[Unit]
Description=llmfleet watchdog probe for service chat
After=docker.service

[Service]
Type=oneshot
ExecStart=/bin/sh /opt/llmfleet/services/chat/current/watchdog.sh
TimeoutStartSec=300
