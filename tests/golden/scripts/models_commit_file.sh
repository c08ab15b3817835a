umask 022
set -u
chmod -R u=rwX,go=rX -- /srv/models/m.gguf.llmfleet.part || exit 1
if [ "$(id -u)" = 0 ]; then chown -R 0:0 -- /srv/models/m.gguf.llmfleet.part || exit 1; fi
rm -f -- /srv/models/m.gguf.llmfleet.json || exit 1
mv -fT -- /srv/models/m.gguf.llmfleet.part /srv/models/m.gguf || exit 1
rm -f -- /srv/models/m.gguf.llmfleet.part.want /srv/models/m.gguf.llmfleet.part.owner
python3 -c 'import json, os, sys
mp, mf = sys.argv[1], sys.argv[2]
doc = json.load(sys.stdin)
for f in doc["files"]:
    st = os.stat(os.path.join(mp, f["path"]) if doc["kind"] == "dir" else mp)
    f["observed"] = {"size": st.st_size, "mtime": int(st.st_mtime)}
tmp = mf + ".tmp"
with open(tmp, "w") as fh:
    fh.write(json.dumps(doc, separators=(",", ":")) + "\n")
os.chmod(tmp, 0o644)
os.replace(tmp, mf)
print("@@manifest-written")
' /srv/models/m.gguf /srv/models/m.gguf.llmfleet.json || exit 1
if [ "$(id -u)" = 0 ]; then chown 0:0 -- /srv/models/m.gguf.llmfleet.json; fi
echo @@committed
