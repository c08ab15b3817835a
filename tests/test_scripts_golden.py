"""Every remote script llmfleet sends, pinned to its exact text (as Kamal tests its commands by exact
strings, basecamp/kamal test/commands/lock_test.rb): a change to what goes over SSH shows up here as
a diff to review. Inputs are fixed; each golden file is in tests/golden/scripts/.

After an intended change: ``LLMFLEET_UPDATE_GOLDEN=1 pytest tests/test_scripts_golden.py`` rewrites
the files; review them with ``git diff tests/golden``. What the scripts do is tested by running them
in a real ``sh`` (tests/test_release.py, tests/test_status.py, tests/test_facts.py).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from llmfleet.bundle import load as bundle_load
from llmfleet.fleet import speed, status
from llmfleet.health import watchdog
from llmfleet.host import model_scripts, probe
from llmfleet.host import transfer as model_transfer
from llmfleet.inventory.services import host_settings
from llmfleet.knowledge import model_manifest
from llmfleet.knowledge.engines import for_engine
from llmfleet.release import audit, cluster, clusterset, confirm
from llmfleet.release import store as S

GOLDEN = Path(__file__).parent / "golden" / "scripts"
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
ROOT = "/opt/llmfleet"
PATHS = S.Paths(ROOT, "chat")
R1, R2 = "20261129T110000Z-0123456789", "20261129T120000Z-abcdef0123"
REF = "reg.lab:5000/llamacpp@sha256:" + "cd" * 32
HOLDER = S.holder_document(token="t0k3n", who="alice", origin="alice@ws1", action="deploy", message="it's a canary",
                           now=NOW, pid=4242)
CONFIRM_TOKEN = "0123abcd" * 4
HS = host_settings("h1", {"llmfleet_root": ROOT, "llmfleet_services": [
    {"name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/srv/models/m.gguf", "image": "llamacpp:b1",
     "port": 8080}]})
MEMBER = cluster.Member("w1", "10.0.0.12", "eth0")
RECORD = S.audit_record(now=NOW, who="alice", host="h1", action="deploy", service="chat", release=R2,
                        digest="sha256:" + "cd" * 32, result="deployed", detail="it's ok", message="canary")

MODEL_FILE = model_manifest.Manifest("/srv/models/m.gguf", "file", (
    model_manifest.FileEntry("m.gguf", 1234, "a" * 64),))
MODEL_DIR = model_manifest.Manifest("/srv/models/qwen", "dir", (
    model_manifest.FileEntry("config.json", 700, "b" * 64),
    model_manifest.FileEntry("model it's.safetensors", 99, "c" * 64)))
PEER = model_transfer.Peer("gpu-v100-02", 22, "deploy", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC")

SCRIPTS = {
    "state": lambda: S.state_script(ROOT),
    "upload": lambda: S.upload_script(PATHS, R2),
    "pull": lambda: S.pull_script(REF),
    "pull_loaded": lambda: S.pull_script("reg.lab:5000/llamacpp:sha256-" + "cd" * 32, loaded=True),
    "image_present": lambda: S.image_present_script(REF),
    "switch": lambda: S.switch_script(PATHS, R2),
    "gateway_switch": lambda: S.gateway_switch_script(PATHS, R2, "llmfleet-chat"),
    "stop": lambda: S.stop_script(PATHS, forget_current=True),
    "engine_log": lambda: S.logs_script(PATHS, 200),
    "mark_healthy": lambda: S.mark_healthy_script(PATHS, R2, {"result": "healthy", "decode_tokps": 42.5}),
    "unit_probe": lambda: S.unit_probe_script(PATHS),
    "evidence_llamacpp": lambda: S.evidence_script(PATHS, for_engine("llamacpp").load_log_grep),
    "evidence_vllm": lambda: S.evidence_script(PATHS, for_engine("vllm").load_log_grep, 100),
    "unit_wait": lambda: S.unit_wait_script(PATHS, 20),
    "chain_lock_pull": lambda: S.chain_script([S.lock_acquire_script(ROOT, HOLDER), S.pull_script(REF)]),
    "current_files": lambda: S.current_files_script(ROOT, ["chat", "embed"]),
    "prune": lambda: S.prune_script(PATHS, [R1]),
    "image_remove": lambda: S.image_remove_script([REF]),
    "lock_acquire": lambda: S.lock_acquire_script(ROOT, HOLDER),
    "lock_release": lambda: S.lock_release_script(ROOT, "t0k3n"),
    "lock_status": lambda: S.lock_status_script(ROOT),
    "lock_break": lambda: S.lock_break_script(ROOT),
    "audit_append": lambda: S.audit_append_script(ROOT, RECORD),
    "audit_tail": lambda: audit.tail_script(ROOT, 50),
    "bench_write": lambda: S.bench_write_script(PATHS, R2, {"release": R2, "levels": {"1": {"decode_tokps_p50": 41.5}},
                                                            "who": "alice's"}),
    "bench_read": lambda: S.bench_read_script(PATHS, [R1, R2]),
    "bench_read_all": lambda: S.bench_read_script(PATHS),
    "final": lambda: S.final_script(ROOT, [S.mark_healthy_script(PATHS, R2, {"result": "healthy"}),
                                           S.prune_script(PATHS, [R1])], [RECORD], "t0k3n"),
    "status": lambda: status.status_script(ROOT),
    "service_stop": lambda: S.service_stop_script(PATHS),
    "service_start": lambda: S.service_start_script(PATHS),
    "service_remove": lambda: S.service_remove_script(PATHS, [REF]),
    "service_logs_follow": lambda: S.service_logs_script(PATHS, 100, follow=True, seconds=30),
    "service_present": lambda: S.service_present_script(PATHS),
    "host_probe_command": lambda: shlex.join(probe.probe_command("llmfleet-0123abcd", ROOT, ["/srv/models/m it's.gguf"])),
    "host_probe_stdin": lambda: probe.probe_sh().decode(),
    "confirm_arm": lambda: confirm.arm_script(PATHS, release_id=R2, previous=R1, token=CONFIRM_TOKEN, action="deploy",
                                              timeout=900),
    "confirm_arm_first": lambda: confirm.arm_script(PATHS, release_id=R2, previous=None, token=CONFIRM_TOKEN,
                                                    action="rollback", timeout=60),
    "confirm_confirm": lambda: confirm.confirm_script(PATHS, token=CONFIRM_TOKEN),
    "confirm_disarm": lambda: confirm.confirm_script(PATHS, token=CONFIRM_TOKEN, watchdog_on=False),
    "watchdog_install": lambda: watchdog.install_snippet(PATHS.service_dir, "chat"),
    "watchdog_status": lambda: watchdog.status_script(ROOT),
    "watchdog_inflight": lambda: watchdog.inflight_script(HS.services[0], HS, key_env="LLAMA_API_KEY", timeout_s=120),
    "watchdog_sh": lambda: watchdog.script_text(HS.services[0], HS, bind_address="127.0.0.1"),
    "watchdog_worker_rpc": lambda: watchdog.worker_script_text(HS.services[0], HS, kind="rpc", address="10.0.0.12",
                                                               port=50052),
    "watchdog_worker_ray": lambda: watchdog.worker_script_text(HS.services[0], HS, kind="ray", address="10.0.0.12",
                                                               port=6379),
    "watchdog_service_unit": lambda: watchdog.service_unit_text(HS.services[0], HS),
    "watchdog_timer_unit": lambda: watchdog.timer_unit_text(HS.services[0], HS),
    "confirm_compose_check": lambda: confirm.compose_check_script(PATHS, R2),
    "confirm_revert": lambda: confirm.revert_script(PATHS, release_id=R2, previous=R1, token=CONFIRM_TOKEN,
                                                    action="deploy", timeout=900),
    "confirm_revert_head": lambda: confirm.revert_script(PATHS, release_id=R2, previous=R1, token=CONFIRM_TOKEN,
                                                         action="deploy", timeout=960, restart_unswitched=True),
    "confirm_revert_first": lambda: confirm.revert_script(PATHS, release_id=R2, previous=None, token=CONFIRM_TOKEN,
                                                          action="rollback", timeout=60),
    "cluster_address": lambda: cluster.address_script("eth0"),
    "cluster_worker_probe_rpc": lambda: cluster.worker_probe_script(PATHS, MEMBER, 50052, "rpc"),
    "cluster_worker_probe_ray": lambda: cluster.worker_probe_script(PATHS, MEMBER, 6379, "ray"),
    "cluster_rpc_log": lambda: cluster.rpc_log_script(PATHS),
    "cluster_ray_nodes": lambda: cluster.ray_nodes_script(PATHS),
    "cluster_rpc_peers": lambda: cluster.rpc_peers_script(50052),
    "clusterset_append": lambda: clusterset.append_script(PATHS, clusterset.record(
        now=NOW, action="deploy", head="h1", releases={"h1": R2, "w1": R1})),
    "clusterset_read": lambda: clusterset.read_script(PATHS),
    "cluster_reach": lambda: cluster.reach_script([("w1", "10.0.0.12", 50052), ("w2", "fd00::12", 50052)]),
    "speed": lambda: speed.speed_script(ROOT, ["chat", "embed"]),
    "bundle_present": lambda: bundle_load.present_script(["sha256:" + "cd" * 32, "sha256:" + "ef" * 32],
                                                         ["/opt/llmfleet/bundle/" + "12" * 32 + ".tar.part"]),
    "bundle_load": lambda: bundle_load.load_script("/opt/llmfleet/bundle/" + "12" * 32 + ".tar.part",
                                                   "sha256:" + "ef" * 32, "reg.lab:5000/llamacpp:sha256-" + "cd" * 32,
                                                   "sha256:" + "12" * 32),
    "bundle_tag": lambda: bundle_load.load_script(None, "sha256:" + "ef" * 32,
                                                  "reg.lab:5000/llamacpp:sha256-" + "cd" * 32),
    "status_models": lambda: status.status_script(ROOT, ["/srv/models/m it's.gguf", "/srv/models/qwen"]),
    "status_gateway": lambda: status.status_script(ROOT, (), [9901, 9911]),
    "models_probe": lambda: model_scripts.probe_script("/srv/models/m it's.gguf"),
    "models_receive": lambda: model_scripts.receive_script("/srv/models/m it's.gguf.llmfleet.part", 0),
    "models_receive_resume": lambda: model_scripts.receive_script("/srv/models/qwen/model-00001.safetensors", 4096),
    "models_receive_owned": lambda: model_scripts.receive_script(
        "/srv/models/qwen.llmfleet.part/model-00001.safetensors", 4096,
        owner=("/srv/models/qwen.llmfleet.part.owner", "cd" * 16)),
    "models_prepare": lambda: model_scripts.prepare_script("/srv/models/qwen", "dir", "ab" * 16, reset=True,
                                                           owner="cd" * 16),
    "models_owner_check": lambda: model_scripts.owner_check_script("/srv/models/m it's.gguf", "cd" * 16,
                                                                   "/opt/llmfleet/locks/deploy/holder.json"),
    "models_verify": lambda: model_scripts.verify_script("/srv/models/qwen", MODEL_DIR),
    "models_verify_in_place": lambda: model_scripts.verify_script("/srv/models/m.gguf", MODEL_FILE, in_place=True),
    "models_commit_file": lambda: model_scripts.commit_script("/srv/models/m.gguf", "file"),
    "models_commit_dir": lambda: model_scripts.commit_script("/srv/models/qwen", "dir"),
    "models_commit_in_place": lambda: model_scripts.commit_script("/srv/models/m.gguf", "file", move=False),
    "models_cleanup": lambda: model_scripts.cleanup_script("/srv/models/m.gguf"),
    "models_hash_dir": lambda: model_scripts.hash_script("/srv/models/qwen", "dir"),
    "models_hash_file": lambda: model_scripts.hash_script("/srv/models/m it's.gguf", "file"),
    "models_hf_download": lambda: model_scripts.hf_download_script(
        "reg.lab:5000/vllm@sha256:" + "ab" * 32, "Qwen/Qwen2.5-0.5B-Instruct", "c" * 40, "/srv/models/qwen", "dir"),
    "models_peer_setup": lambda: model_transfer.peer_setup_script(PEER),
    "models_peer_send": lambda: model_transfer.peer_send_script("/tmp/llmfleet-peer.abc", "/srv/models/m it's.gguf",
                                                                1024, PEER, 50_000_000),
    "models_peer_cleanup": lambda: model_transfer.peer_cleanup_script("/tmp/llmfleet-peer.abc"),
    "models_authorize": lambda: model_transfer.authorize_script(model_transfer.authorized_line(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB llmfleet-transfer", source_address="10.0.0.7",
        command=model_scripts.receive_script("/srv/models/m.gguf.llmfleet.part", 0), token="0123abcd"), "deploy"),
    "models_deauthorize": lambda: model_transfer.deauthorize_script("0123abcd", "deploy"),
}
# The builders of each module that sends remote scripts (or files that run on the host) and the golden
# files that pin them; a new builder fails test_every_remote_script_builder_has_a_golden_file below.
PINNED_BUILDERS = {
    confirm: {"compose_check_script": "confirm_compose_check", "revert_script": "confirm_revert",
              "arm_script": "confirm_arm", "confirm_script": "confirm_confirm"},
    watchdog: {"script_text": "watchdog_sh", "service_unit_text": "watchdog_service_unit",
               "timer_unit_text": "watchdog_timer_unit",
               "worker_script_text": "watchdog_worker_rpc", "install_snippet": "watchdog_install",
               "status_script": "watchdog_status", "inflight_script": "watchdog_inflight"},
    audit: {"tail_script": "audit_tail"},
    cluster: {"address_script": "cluster_address", "worker_probe_script": "cluster_worker_probe_rpc",
              "rpc_log_script": "cluster_rpc_log", "ray_nodes_script": "cluster_ray_nodes",
              "rpc_peers_script": "cluster_rpc_peers", "reach_script": "cluster_reach"},
    clusterset: {"append_script": "clusterset_append", "read_script": "clusterset_read"},
    speed: {"speed_script": "speed"},
    bundle_load: {"present_script": "bundle_present", "load_script": "bundle_load"},
    model_scripts: {"probe_script": "models_probe", "receive_script": "models_receive",
                    "prepare_script": "models_prepare", "verify_script": "models_verify",
                    "commit_script": "models_commit_file", "cleanup_script": "models_cleanup",
                    "hf_download_script": "models_hf_download", "hash_script": "models_hash_dir",
                    "owner_check_script": "models_owner_check"},
    model_transfer: {"peer_setup_script": "models_peer_setup", "peer_send_script": "models_peer_send",
                     "peer_cleanup_script": "models_peer_cleanup", "authorize_script": "models_authorize",
                     "deauthorize_script": "models_deauthorize"},
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script_text_is_exactly_the_golden_file(name):
    text = SCRIPTS[name]()
    path = GOLDEN / f"{name}.sh"
    if os.environ.get("LLMFLEET_UPDATE_GOLDEN"):
        path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    assert path.exists(), f"no golden file for {name}; run with LLMFLEET_UPDATE_GOLDEN=1 and review it"
    assert text.rstrip("\n") == path.read_text(encoding="utf-8").rstrip("\n")


def test_every_golden_file_belongs_to_a_script():
    assert sorted(p.stem for p in GOLDEN.glob("*.sh")) == sorted(SCRIPTS)


def test_every_script_builder_of_the_release_store_has_a_golden_file():
    builders = sorted(n for n in dir(S) if n.endswith("_script") and callable(getattr(S, n)))
    pinned = {"state_script", "upload_script", "pull_script", "image_present_script", "switch_script", "stop_script",
              "gateway_switch_script",
              "logs_script", "mark_healthy_script", "unit_probe_script", "current_files_script", "prune_script",
              "image_remove_script", "lock_acquire_script", "lock_release_script", "lock_status_script",
              "lock_break_script", "audit_append_script", "final_script", "service_stop_script",
              "service_start_script", "service_remove_script", "service_logs_script", "bench_write_script",
              "bench_read_script", "unit_wait_script", "chain_script", "evidence_script",
              "loaded_image_script", "service_present_script"}
    assert set(builders) <= pinned, f"a new script builder needs a golden file: {sorted(set(builders) - pinned)}"


@pytest.mark.parametrize("module", list(PINNED_BUILDERS), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_remote_script_builder_has_a_golden_file(module):
    builders = sorted(n for n in dir(module) if n.endswith(("_script", "_snippet", "_text"))
                      and callable(getattr(module, n)) and not n.startswith("_"))
    pinned = PINNED_BUILDERS[module]
    assert set(builders) <= set(pinned), f"a new script builder needs a golden file: {sorted(set(builders) - set(pinned))}"
    assert set(pinned.values()) <= set(SCRIPTS)


def test_every_script_builder_of_the_cluster_module_has_a_golden_file():
    builders = sorted(n for n in dir(cluster) if n.endswith("_script") and callable(getattr(cluster, n)))
    assert builders == ["address_script", "ray_nodes_script", "reach_script", "rpc_log_script", "rpc_peers_script",
                        "worker_probe_script"]


@pytest.mark.parametrize("name", ["state", "upload", "switch", "lock_acquire", "audit_append", "status", "final",
                                  "service_remove", "service_logs_follow", "unit_wait", "chain_lock_pull",

                                  "confirm_arm", "confirm_arm_first", "confirm_confirm", "watchdog_install",
                                  "watchdog_sh", "confirm_compose_check", "confirm_revert", "confirm_revert_first",
                                  "confirm_revert_head", "watchdog_worker_rpc", "watchdog_worker_ray",
                                  "cluster_address", "cluster_worker_probe_rpc",
                                  "cluster_rpc_log", "cluster_ray_nodes", "cluster_rpc_peers", "cluster_reach",
                                  "clusterset_append", "clusterset_read", "speed", "pull_loaded",
                                  "bundle_present", "bundle_load", "bundle_tag",
                                  "models_probe", "models_receive", "models_receive_resume", "models_prepare",
                                  "models_receive_owned", "models_owner_check",
                                  "models_verify", "models_verify_in_place", "models_commit_file", "models_commit_dir",
                                  "models_commit_in_place", "models_cleanup", "models_hf_download",
                                  "models_hash_dir", "models_hash_file",
                                  "models_peer_setup", "models_peer_send", "models_peer_cleanup", "models_authorize",
                                  "models_deauthorize", "status_models", "status_gateway"])
def test_golden_scripts_parse_as_posix_sh(name):
    res = subprocess.run(["sh", "-n", str(GOLDEN / f"{name}.sh")], capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr
