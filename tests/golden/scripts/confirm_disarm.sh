cd /opt/llmfleet/services/chat || exit 1
if [ "$(cat .confirm-pending 2>/dev/null)" = 0123abcd0123abcd0123abcd0123abcd ] && mv .confirm-pending .confirm-taken.ok 2>/dev/null; then
  systemctl stop llmfleet-chat-revert.timer >/dev/null 2>&1 || true
  rm -f .confirm-taken.ok .revert.sh
  echo '@@confirmed'
else
  echo '@@too-late'
fi
