if ! printf '%s\n' '1212121212121212121212121212121212121212121212121212121212121212  /opt/llmfleet/bundle/1212121212121212121212121212121212121212121212121212121212121212.tar.part' | sha256sum -c --status; then echo '@@corrupt'; rm -f /opt/llmfleet/bundle/1212121212121212121212121212121212121212121212121212121212121212.tar.part; exit 8; fi
if ! docker load --input /opt/llmfleet/bundle/1212121212121212121212121212121212121212121212121212121212121212.tar.part >/dev/null; then rm -f /opt/llmfleet/bundle/1212121212121212121212121212121212121212121212121212121212121212.tar.part; exit 5; fi
rm -f /opt/llmfleet/bundle/1212121212121212121212121212121212121212121212121212121212121212.tar.part
echo '@@loaded'
docker tag sha256:efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef reg.lab:5000/llamacpp:sha256-cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd || exit 6
id=$(docker image inspect --format '{{.Id}}' reg.lab:5000/llamacpp:sha256-cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd 2>/dev/null || true)
echo "@@id $id"
if [ "$id" != sha256:efefefefefefefefefefefefefefefefefefefefefefefefefefefefefefefef ]; then docker image rm reg.lab:5000/llamacpp:sha256-cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd >/dev/null 2>&1; exit 7; fi
