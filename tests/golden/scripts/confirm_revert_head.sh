#!/bin/sh
# Armed by llmfleet before the deploy of service chat to release 20261129T120000Z-abcdef0123.
# Run by llmfleet-chat-revert.timer after 960 s unless the controller confirmed first.
set -u
cd /opt/llmfleet/services/chat || exit 1
mv .confirm-pending .confirm-taken 2>/dev/null || exit 0
if [ "$(cat .confirm-taken)" != 0123abcd0123abcd0123abcd0123abcd ]; then rm -f .confirm-taken; exit 0; fi
if [ "$(readlink current 2>/dev/null)" != releases/20261129T120000Z-abcdef0123 ]; then
  # the controller vanished between arming and switching: the old release still serves, untouched
  result=unchanged; detail='host timer: release 20261129T120000Z-abcdef0123 was not confirmed within 960 s but was never made current; the serving release was restarted to attach to its workers again'; target=$(basename "$(readlink current 2>/dev/null)" | tr -cd 'A-Za-z0-9-')
  [ -z "$target" ] || systemctl restart llmfleet-chat.service >/dev/null 2>&1 || { result=failed; detail='host timer: release 20261129T120000Z-abcdef0123 was not confirmed within 960 s but was never made current; the serving release could not be restarted to attach to its workers again'; }
else
(
set -e
cd /opt/llmfleet/services/chat
test -f releases/20261129T110000Z-0123456789/compose.yml
ln -sfn releases/20261129T110000Z-0123456789 .current.tmp
mv -T .current.tmp current
if ! cmp -s releases/20261129T110000Z-0123456789/llmfleet-chat.service /etc/systemd/system/llmfleet-chat.service || [ -n "$(systemctl show -p NeedDaemonReload --value llmfleet-chat.service 2>/dev/null | grep -vx no)" ]; then
  install -m 0644 releases/20261129T110000Z-0123456789/llmfleet-chat.service /etc/systemd/system/llmfleet-chat.service
  systemctl daemon-reload
fi
systemctl reset-failed llmfleet-chat.service >/dev/null 2>&1 || true
systemctl enable --no-reload llmfleet-chat.service >/dev/null 2>&1 || true
systemctl restart llmfleet-chat.service
echo '@@switched'
) >/dev/null 2>&1
rc=$?
target=20261129T110000Z-0123456789
if [ "$rc" = 0 ]; then result=reverted; detail='reverted by host timer: release 20261129T120000Z-abcdef0123 was not confirmed within 960 s; back on 20261129T110000Z-0123456789'; else result=failed; detail='host timer revert FAILED: release 20261129T120000Z-abcdef0123 was not confirmed within 960 s'; fi
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
  "$now" "$host" deploy chat "$target" "$result" "$detail" >> /opt/llmfleet/audit.jsonl
rm -f .confirm-taken .revert.sh
