if ! docker load --input /opt/llmfleet/bundle/llamacpp_b1.tar >/dev/null; then rm -f /opt/llmfleet/bundle/llamacpp_b1.tar; exit 5; fi
rm -f /opt/llmfleet/bundle/llamacpp_b1.tar
echo '@@loaded'
docker tag sha256:efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef reg.lab:5000/llamacpp:sha256-cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd || exit 6
id=$(docker image inspect --format '{{.Id}}' reg.lab:5000/llamacpp:sha256-cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd 2>/dev/null || true)
echo "@@id $id"
if [ "$id" != sha256:efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef ]; then docker image rm reg.lab:5000/llamacpp:sha256-cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd >/dev/null 2>&1; exit 7; fi
