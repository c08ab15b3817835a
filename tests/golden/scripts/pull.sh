if ! digests=$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd 2>/dev/null); then
  docker pull --quiet reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd >/dev/null || exit 4
  echo '@@pulled'
  digests=$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd)
fi
echo '@@digests'
printf '%s\n' "$digests"
