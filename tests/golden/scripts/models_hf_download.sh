umask 022
rm -rf -- /srv/models/qwen.llmfleet.part /srv/models/qwen.llmfleet.part || exit 1
mkdir -p -- /srv/models/qwen.llmfleet.part || exit 1
docker run --rm --pull missing --user 0:0 -e HF_HUB_DISABLE_TELEMETRY=1 -e HF_HUB_ENABLE_HF_TRANSFER=0 -v /srv/models/qwen.llmfleet.part:/llmfleet-download --entrypoint python3 reg.lab:5000/vllm@sha256:abababababababababababababababababababababababababababababababab -c 'import sys
from huggingface_hub import hf_hub_download, snapshot_download
repo, revision, dest, filename = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
if filename:
    hf_hub_download(repo_id=repo, revision=revision, filename=filename, local_dir=dest)
else:
    snapshot_download(repo_id=repo, revision=revision, local_dir=dest)
print("@@downloaded")
' Qwen/Qwen2.5-0.5B-Instruct cccccccccccccccccccccccccccccccccccccccc /llmfleet-download '' || exit 1
rm -rf -- /srv/models/qwen.llmfleet.part/.cache
