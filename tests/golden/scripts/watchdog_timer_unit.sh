# Rendered by llmfleet for service chat: installed after a confirmed deploy.
[Unit]
Description=llmfleet watchdog timer for service chat

[Timer]
OnActiveSec=30
OnUnitActiveSec=30
AccuracySec=1s

[Install]
WantedBy=timers.target
