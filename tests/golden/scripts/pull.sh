if ! docker image inspect reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd >/dev/null 2>&1; then
  docker pull --quiet reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd >/dev/null || exit 4
  echo '@@pulled'
fi
echo '@@digests'
docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd
