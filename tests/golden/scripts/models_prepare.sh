umask 022
mkdir -p -- /srv/models || exit 1
rm -rf -- /srv/models/qwen.llmfleet.part /srv/models/qwen.llmfleet.part.want /srv/models/qwen.llmfleet.part.owner || exit 1
mkdir -p -- /srv/models/qwen.llmfleet.part || exit 1
printf '%s\n' abababababababababababababababab > /srv/models/qwen.llmfleet.part.want || exit 1
printf '%s\n' cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd > /srv/models/qwen.llmfleet.part.owner || exit 1
echo @@prepared
