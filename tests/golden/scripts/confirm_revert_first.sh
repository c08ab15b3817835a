#!/bin/sh
# Armed by llmfleet before the rollback of service chat to release 20261129T120000Z-abcdef0123.
# Run by llmfleet-chat-revert.timer after 60 s unless the controller confirmed first.
set -u
cd /opt/llmfleet/services/chat || exit 1
mv .confirm-pending .confirm-taken 2>/dev/null || exit 0
if [ "$(cat .confirm-taken)" != 0123abcd0123abcd0123abcd0123abcd ]; then rm -f .confirm-taken; exit 0; fi
if [ "$(readlink current 2>/dev/null)" != releases/20261129T120000Z-abcdef0123 ]; then
  # the controller vanished between arming and switching: the old release still serves, untouched
  result=unchanged; detail='host timer: release 20261129T120000Z-abcdef0123 was not confirmed within 60 s but was never made current; nothing to undo, the serving release was left running'; target=$(basename "$(readlink current 2>/dev/null)" | tr -cd 'A-Za-z0-9-')
else
(
systemctl stop llmfleet-chat.service || true
systemctl disable llmfleet-chat.service >/dev/null 2>&1 || true
rm -f -- /opt/llmfleet/services/chat/current
echo '@@stopped'
) >/dev/null 2>&1
rc=$?
target=''
if [ "$rc" = 0 ]; then result=reverted; detail='reverted by host timer: release 20261129T120000Z-abcdef0123 was not confirmed within 60 s; no release confirmed healthy to go back to, service stopped'; else result=failed; detail='host timer revert FAILED: release 20261129T120000Z-abcdef0123 was not confirmed within 60 s'; fi
fi
(
rm -f /opt/llmfleet/services/chat/watchdog.state.fails /opt/llmfleet/services/chat/watchdog.state.restarts /opt/llmfleet/services/chat/watchdog.state.gaveup /opt/llmfleet/services/chat/watchdog.state.failed
if [ -f /opt/llmfleet/services/chat/current/llmfleet-chat-watchdog.timer ] && [ -f /opt/llmfleet/services/chat/current/watchdog.sh ]; then
  if ! cmp -s /opt/llmfleet/services/chat/current/llmfleet-chat-watchdog.service /etc/systemd/system/llmfleet-chat-watchdog.service || ! cmp -s /opt/llmfleet/services/chat/current/llmfleet-chat-watchdog.timer /etc/systemd/system/llmfleet-chat-watchdog.timer || [ -n "$(systemctl show -p NeedDaemonReload --value llmfleet-chat-watchdog.service llmfleet-chat-watchdog.timer 2>/dev/null | grep -vx no)" ]; then
    install -m 0644 /opt/llmfleet/services/chat/current/llmfleet-chat-watchdog.service /etc/systemd/system/llmfleet-chat-watchdog.service
    install -m 0644 /opt/llmfleet/services/chat/current/llmfleet-chat-watchdog.timer /etc/systemd/system/llmfleet-chat-watchdog.timer
    systemctl daemon-reload >/dev/null 2>&1 || true
  fi
  systemctl enable --no-reload llmfleet-chat-watchdog.timer >/dev/null 2>&1 || true
  systemctl restart llmfleet-chat-watchdog.timer >/dev/null 2>&1 && echo '@@watchdog-on' || echo '@@watchdog-off'
else
  systemctl disable --now llmfleet-chat-watchdog.timer >/dev/null 2>&1 || true
  echo '@@watchdog-off'
fi
) >/dev/null 2>&1
now=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
host=$(hostname 2>/dev/null | tr -cd 'A-Za-z0-9._-')
printf '{"time":"%s","who":"host timer","host":"%s","action":"%s","service":"%s","release":"%s","image_digest":null,"result":"%s","detail":"%s"}\n' \
  "$now" "$host" rollback chat "$target" "$result" "$detail" >> /opt/llmfleet/audit.jsonl
rm -f .confirm-taken .revert.sh
