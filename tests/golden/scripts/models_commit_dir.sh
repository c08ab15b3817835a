umask 022
set -u
chmod -R u=rwX,go=rX -- /srv/models/qwen.llmfleet.part || exit 1
if [ "$(id -u)" = 0 ]; then chown -R 0:0 -- /srv/models/qwen.llmfleet.part || exit 1; fi
rm -f -- /srv/models/qwen.llmfleet.json || exit 1
rm -rf -- /srv/models/qwen.llmfleet.old || exit 1
if [ -e /srv/models/qwen ] || [ -L /srv/models/qwen ]; then mv -T -- /srv/models/qwen /srv/models/qwen.llmfleet.old || exit 1; fi
mv -T -- /srv/models/qwen.llmfleet.part /srv/models/qwen || exit 1
rm -rf -- /srv/models/qwen.llmfleet.old
rm -f -- /srv/models/qwen.llmfleet.part.want /srv/models/qwen.llmfleet.part.owner
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
' /srv/models/qwen /srv/models/qwen.llmfleet.json || exit 1
if [ "$(id -u)" = 0 ]; then chown 0:0 -- /srv/models/qwen.llmfleet.json; fi
echo @@committed
