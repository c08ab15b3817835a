set -e
cd /opt/llmfleet/services/chat
test -f releases/20261129T120000Z-abcdef0123/compose.yml
old=$(readlink current 2>/dev/null || true)
if [ -n "$old" ] && [ -d "$old" ] && cmp -s "$old/compose.yml" releases/20261129T120000Z-abcdef0123/compose.yml && cmp -s "$old/service.env" releases/20261129T120000Z-abcdef0123/service.env && cmp -s "$old/llmfleet-chat.service" releases/20261129T120000Z-abcdef0123/llmfleet-chat.service && cmp -s releases/20261129T120000Z-abcdef0123/llmfleet-chat.service /etc/systemd/system/llmfleet-chat.service && systemctl is-active --quiet llmfleet-chat.service && [ "$(docker inspect -f '{{.State.Running}}' llmfleet-chat 2>/dev/null)" = true ]; then
  ln -sfn releases/20261129T120000Z-abcdef0123 .current.tmp
  mv -T .current.tmp current
  if ! docker exec llmfleet-chat haproxy -c -q -f /opt/llmfleet/services/chat/current/haproxy.cfg >&2; then
    ln -sfn "$old" .current.tmp && mv -T .current.tmp current
    echo 'the new configuration does not load (haproxy -c above); current is back where it was' >&2
    exit 1
  fi
  docker kill -s USR2 llmfleet-chat >/dev/null
  echo '@@reloaded'
else
  handover=
  if [ -n "$old" ] && [ "$(docker inspect -f '{{.State.Running}}' llmfleet-chat 2>/dev/null)" = true ]; then
    docker rm -f llmfleet-chat-handover >/dev/null 2>&1 || true
    img=$(docker inspect -f '{{.Image}}' llmfleet-chat)
    caps=$(docker inspect -f '{{range .HostConfig.CapAdd}} --cap-add={{.}}{{end}}' llmfleet-chat)
    if docker inspect -f '{{range .Config.Env}}{{println .}}{{end}}' llmfleet-chat | docker run -d --rm --name llmfleet-chat-handover --network host --user 0:0 --cap-drop ALL $caps --security-opt no-new-privileges:true --label io.llmfleet.handover=llmfleet-chat.service --mount type=bind,source=/opt/llmfleet/services/chat,target=/opt/llmfleet/services/chat,readonly --env-file /dev/stdin --log-driver json-file --log-opt max-size=10m "$img" -W -db -f /opt/llmfleet/services/chat/current/haproxy.cfg >/dev/null; then
      for _ in $(seq 1 50); do
        if docker logs llmfleet-chat-handover 2>&1 | grep -q 'Loading success'; then handover=1; break; fi
        sleep 0.2
      done
    fi
    if [ -n "$handover" ]; then
      echo '@@handover'
      trap "docker kill -s USR1 llmfleet-chat-handover >/dev/null 2>&1 || true" EXIT  # not left serving if the restart fails
    else
      docker rm -f llmfleet-chat-handover >/dev/null 2>&1 || true
      echo 'the handover HAProxy did not load; restarting without it' >&2
    fi
  fi
  test -f releases/20261129T120000Z-abcdef0123/compose.yml
  ln -sfn releases/20261129T120000Z-abcdef0123 .current.tmp
  mv -T .current.tmp current
  if ! cmp -s releases/20261129T120000Z-abcdef0123/llmfleet-chat.service /etc/systemd/system/llmfleet-chat.service || [ -n "$(systemctl show -p NeedDaemonReload --value llmfleet-chat.service 2>/dev/null | grep -vx no)" ]; then
    install -m 0644 releases/20261129T120000Z-abcdef0123/llmfleet-chat.service /etc/systemd/system/llmfleet-chat.service
    systemctl daemon-reload
  fi
  systemctl reset-failed llmfleet-chat.service >/dev/null 2>&1 || true
  systemctl enable --no-reload llmfleet-chat.service >/dev/null 2>&1 || true
  systemctl restart llmfleet-chat.service
  if [ -n "$handover" ]; then
    for _ in $(seq 1 50); do
      if docker logs llmfleet-chat 2>&1 | grep -q 'Loading success'; then break; fi
      sleep 0.2
    done
    docker kill -s USR1 llmfleet-chat-handover >/dev/null 2>&1 || true
  fi
  echo '@@restarted'
fi
echo '@@switched'
