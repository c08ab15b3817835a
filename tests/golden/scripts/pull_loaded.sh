if ! id=$(docker image inspect --format '{{.Id}}' reg.lab:5000/llamacpp:sha256-cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd 2>/dev/null); then
  echo '@@absent'
  exit 4
fi
echo "@@id $id"
