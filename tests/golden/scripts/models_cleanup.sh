rm -rf -- /srv/models/m.gguf.llmfleet.part /srv/models/m.gguf.llmfleet.part.want /srv/models/m.gguf.llmfleet.part.owner /srv/models/m.gguf.llmfleet.old
echo @@cleaned
