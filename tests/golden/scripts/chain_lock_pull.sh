echo '@@step 0'
(
mkdir -p /opt/llmfleet/locks || exit 2
if mkdir /opt/llmfleet/locks/deploy 2>/dev/null; then
  printf '%s\n' '{"action":"deploy","from":"alice@ws1","message":"it'"'"'s a canary","pid":4242,"time":"2026-11-29T12:00:00+00:00","token":"t0k3n","who":"alice"}' > /opt/llmfleet/locks/deploy/holder.json && echo '@@acquired'
else
  echo '@@held'
  head -c 4096 /opt/llmfleet/locks/deploy/holder.json 2>/dev/null
  exit 3
fi
) </dev/null
rc=$?
printf '\n@@step-rc 0 %s\n' "$rc"
if [ "$rc" != 0 ]; then exit "$rc"; fi
echo '@@step 1'
(
if ! digests=$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd 2>/dev/null); then
  docker pull --quiet reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd >/dev/null || exit 4
  echo '@@pulled'
  digests=$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd)
fi
echo '@@digests'
printf '%s\n' "$digests"
) </dev/null
rc=$?
printf '\n@@step-rc 1 %s\n' "$rc"
if [ "$rc" != 0 ]; then exit "$rc"; fi
