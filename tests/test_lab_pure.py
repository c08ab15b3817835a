"""Pure parts of the lab: simulated-card config, host specs and docker argv, known_hosts, models."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from llmfleet.errors import UsageError
from llmfleet.inventory.ansible import load_inventory
from llmfleet.lab import cards, hosts, setup
from llmfleet.lab import engine as lab_engine

ROOT = Path(__file__).resolve().parents[1]
LAB_INV = ROOT / "inventory" / "lab"


@pytest.mark.parametrize("gpu,driver,count,mem,cc", [
    ("Tesla V100-SXM2-32GB", "535.183.01", 1, 32768, "7.0"),
    ("Tesla V100-PCIE-16GB", "535", 2, None, "7.0"),
    ("NVIDIA GeForce RTX 4090", "550.127.05", 1, 24564, "8.9"),
    ("Tesla T4", "470.256.02", 1, None, "7.5"),
    ("Tesla P40", "535", 2, None, "6.1"),
])
def test_sim_config_from_catalog(gpu, driver, count, mem, cc):
    cfg = cards.gpu_sim_config("gpu-x", gpu, driver, count)
    assert len(cfg["gpus"]) == count
    assert {g["name"] for g in cfg["gpus"]} == {gpu}
    assert {g["compute_cap"] for g in cfg["gpus"]} == {cc}
    if mem:
        assert cfg["gpus"][0]["memory_total_mib"] == mem
    assert cfg["driver_version"].startswith(driver.split(".")[0] + ".")
    assert len({g["uuid"] for g in cfg["gpus"]}) == count
    # deterministic per host, different between hosts
    assert cfg == cards.gpu_sim_config("gpu-x", gpu, driver, count)
    assert cfg["gpus"][0]["uuid"] != cards.gpu_sim_config("gpu-y", gpu, driver, count)["gpus"][0]["uuid"]


@pytest.mark.parametrize("gpu,driver,count,msg", [
    ("Tesla V100", "535", 1, "not in the GPU catalog"),
    ("Tesla T4", "r470", 1, "lab_driver must look like"),
    ("Tesla T4", "470", 9, "lab_gpu_count must be an integer 0-8"),
    ("Tesla T4", "470", "2", "lab_gpu_count must be an integer 0-8"),
])
def test_sim_config_errors_name_the_field(gpu, driver, count, msg):
    with pytest.raises(UsageError, match=msg):
        cards.gpu_sim_config("gpu-x", gpu, driver, count)


def test_lab_inventory_describes_the_issue_hosts():
    inv = load_inventory(str(LAB_INV))
    specs = {s.name: s for s in hosts.host_specs(inv, "t")}
    assert specs["gpu-v100-01"].gpu == "Tesla V100-SXM2-32GB" and specs["gpu-v100-01"].driver.startswith("535.")
    assert specs["gpu-v100-02"].gpu == "Tesla V100-PCIE-16GB"
    assert specs["gpu-4090-01"].gpu == "NVIDIA GeForce RTX 4090" and specs["gpu-4090-01"].driver.startswith("550.")
    assert specs["gpu-t4-01"].gpu == "Tesla T4" and specs["gpu-t4-01"].driver.startswith("470.")
    assert specs["gpu-p40-01"].gpu == "Tesla P40"
    assert len([n for n in specs if n.startswith("lab-node-")]) >= 6
    assert len({s.port for s in specs.values()}) == len(specs)
    services = {n: inv.hosts[n].vars["llmfleet_services"] for n in specs}
    assert services["gpu-v100-01"][0]["engine"] == "llamacpp"
    assert services["gpu-4090-01"][0]["engine"] == "vllm"
    # the multi-host pair: the head serves, the worker has no service of its own
    assert services["gpu-p40-11"][0]["workers"] == ["gpu-p40-12"] and services.pop("gpu-p40-12") == []
    assert services["gpu-4090-11"][0]["workers"] == ["gpu-4090-12"] and services.pop("gpu-4090-12") == []
    assert specs["gpu-p40-11"].gpu_count == specs["gpu-p40-12"].gpu_count == 2
    for n, svc in services.items():
        assert inv.hosts[n].vars["ansible_user"] == "deploy" and inv.hosts[n].vars["ansible_become"] is True
        assert svc[0]["image"] in ("llamacpp:lab-cpu", "vllm:lab-cpu")
        assert svc[0]["model_path"].startswith("/srv/models/")


def _inv(tmp_path: Path, body: str) -> str:
    (tmp_path / "hosts.yml").write_text(body)
    return str(tmp_path)


@pytest.mark.parametrize("body,msg", [
    ("all:\n  hosts:\n    a: {ansible_host: 127.0.0.1, ansible_port: 2201}\n", "no host sets lab_gpu"),
    ("all:\n  hosts:\n    a: {ansible_host: 127.0.0.1, lab_gpu: Tesla T4}\n", "ansible_port must be an integer"),
    ("all:\n  hosts:\n    a: {ansible_host: 10.0.0.1, ansible_port: 2201, lab_gpu: Tesla T4}\n",
     "ansible_host must be 127.0.0.1"),
    ("all:\n  vars: {ansible_host: 127.0.0.1, lab_gpu: Tesla T4}\n  hosts:\n    a: {ansible_port: 2201}\n"
     "    b: {ansible_port: 2201}\n", "both use ansible_port 2201"),
    ("all:\n  hosts:\n    a: {ansible_host: 127.0.0.1, ansible_port: 2201, lab_gpu: Tesla X}\n",
     "not in the GPU catalog"),
])
def test_host_spec_errors(tmp_path, body, msg):
    with pytest.raises(UsageError, match=msg):
        hosts.host_specs(load_inventory(_inv(tmp_path, body)), "t")


def test_unknown_host_named(tmp_path):
    inv = load_inventory(str(LAB_INV))
    with pytest.raises(UsageError, match="no host 'gpu-nope'"):
        hosts.host_specs(inv, "t", ["gpu-nope"])


@pytest.mark.parametrize("mode", ["privileged", "restricted"])
def test_run_argv(mode):
    spec = hosts.HostSpec(name="gpu-t4-01", port=2204, gpu="Tesla T4", driver="470.256.02", gpu_count=1, lab="lab1")
    argv = hosts.run_argv(spec, image="img:1", mode=mode, network="lab1", public_key="ssh-ed25519 AAAA lab")
    assert argv[:2] == ["run", "-d"] and argv[-1] == "img:1"
    assert argv[argv.index("--hostname") + 1] == "gpu-t4-01"
    assert argv[argv.index("--name") + 1] == "lab1-gpu-t4-01"
    assert "127.0.0.1:2204:22" in argv  # sshd only on loopback
    assert ("--privileged" in argv) == (mode == "privileged")
    if mode == "restricted":
        assert argv[argv.index("--cap-drop") + 1] == "SYS_RESOURCE"
    assert argv[argv.index("--cgroupns") + 1] == "private"
    env = dict(a.split("=", 1) for a in (argv[i + 1] for i, x in enumerate(argv) if x == "-e"))
    sim = json.loads(env["LAB_GPU_JSON"])
    assert sim["gpus"][0]["name"] == "Tesla T4" and sim["driver_version"] == "470.256.02"
    assert "470.256.02" in env["LAB_DRIVER_VERSION_FILE"]
    assert env["LAB_AUTHORIZED_KEY"] == "ssh-ed25519 AAAA lab"
    assert any(a.startswith("type=volume,src=lab1-gpu-t4-01-docker,dst=/var/lib/docker") for a in argv)


def test_inner_daemon_json_stays_in_the_lab():
    d = hosts.daemon_json()
    assert d["insecure-registries"] == ["lab-registry:5000"]
    import ipaddress

    for dns in d["dns"]:
        assert ipaddress.ip_address(dns) in ipaddress.ip_network(d["bip"], strict=False)
    bip = ipaddress.ip_network(d["bip"], strict=False)
    for pool in d["default-address-pools"]:
        net = ipaddress.ip_network(pool["base"])
        assert not net.overlaps(bip)
        # never the outer engine's default pools (172.17-31/16, 192.168/16)
        assert not net.overlaps(ipaddress.ip_network("172.16.0.0/12"))
        assert not net.overlaps(ipaddress.ip_network("192.168.0.0/16"))


def test_known_hosts_replaces_entries_of_a_recreated_host():
    pub = "ssh-ed25519 AAAAnew root@gpu\necdsa-sha2-nistp256 AAAAec root@gpu\nnot a key\n"
    lines = hosts.known_hosts_lines(2201, pub)
    assert lines == ["[127.0.0.1]:2201 ssh-ed25519 AAAAnew", "[127.0.0.1]:2201 ecdsa-sha2-nistp256 AAAAec"]
    existing = "[127.0.0.1]:2201 ssh-ed25519 AAAAold\n[127.0.0.1]:2202 ssh-ed25519 AAAAother\nexample.com ssh-rsa X\n"
    merged = hosts.merge_known_hosts(existing, 2201, lines)
    assert "AAAAold" not in merged
    assert "[127.0.0.1]:2202 ssh-ed25519 AAAAother" in merged and "example.com ssh-rsa X" in merged
    assert merged.count("[127.0.0.1]:2201 ") == 2
    assert "[127.0.0.1]:2201" not in hosts.merge_known_hosts(merged, 2201, [])


def test_push_digest_parsed_from_docker_push_output():
    out = ("The push refers to repository [127.0.0.1:5000/lab/llama-server]\n5f70bf18a086: Pushed\n"
           "lab: digest: sha256:" + "a" * 64 + " size: 528\n")
    assert setup.parse_push_digest(out) == "sha256:" + "a" * 64
    assert setup.parse_push_digest("error") is None


def test_lab_pins_cover_the_lock_keys():
    keys = {p.key for p in setup.PINS}
    assert {"llamacpp:lab-cpu", "vllm:lab-cpu", "llamacpp:lab-broken"} <= keys
    assert all(p.image in __import__("llmfleet.lab.images", fromlist=["x"]).ALL_IMAGES for p in setup.PINS)


def test_restricted_flags_never_privileged():
    assert "--privileged" not in lab_engine.SYSTEM_CONTAINER_FLAGS["restricted"]
    assert "SYS_RESOURCE" in lab_engine.SYSTEM_CONTAINER_FLAGS["restricted"]


# -- models ---------------------------------------------------------------------------------------


def test_gguf_model_is_deterministic_and_well_formed(tmp_path):
    import gguf

    from llmfleet.lab import models

    a = models.write_gguf(tmp_path / "a.gguf", seed=0)
    b = models.write_gguf(tmp_path / "b.gguf", seed=0)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    assert a.stat().st_size < 2_000_000
    r = gguf.GGUFReader(str(a))
    arch = r.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "qwen2"
    assert r.fields["qwen2.block_count"].parts[-1][0] == 2
    assert "tokenizer.chat_template" in r.fields
    names = {t.name for t in r.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.attn_q.weight", "blk.0.ffn_down.weight"} <= names


def test_hf_model_folder(tmp_path):
    pytest.importorskip("tokenizers")
    from safetensors.numpy import load_file

    from llmfleet.lab import models

    folder = models.write_hf(tmp_path / "hf")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] >= 32  # vLLM CPU attention needs head size >= 32
    weights = load_file(str(folder / "model.safetensors"))
    assert weights["model.embed_tokens.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tok.encode("hello world").ids
    assert tok.decode(ids) == "hello world"
    assert max(ids) < cfg["vocab_size"]


def test_build_all_starts_the_llama_compile_first_and_builds_llama_images_last(monkeypatch, tmp_path):
    import threading

    from llmfleet.lab import images

    monkeypatch.setenv("LLMFLEET_CACHE_DIR", str(tmp_path))
    events: list[str] = []
    started, base_done, overlapped = threading.Event(), threading.Event(), []

    def fake_binary(prog):
        events.append("compile-start")
        started.set()
        overlapped.append(base_done.wait(5))  # still compiling while the base image is built
        return tmp_path / "llama-server"

    def fake_base(prog):
        assert started.wait(5)
        events.append("base")
        base_done.set()
        return images.ImageInfo("base", "b", "sha256:b", True, 0.0)

    def fake_image(key, prog, base_id, timeout=3600, base_ref=images.BASE_IMAGE, binary=None):
        events.append(f"{key}:{binary.name if binary else '-'}:{base_ref}")
        return images.ImageInfo(key, f"lab/{key}", f"sha256:{key}", True, 0.0)

    monkeypatch.setattr(images, "llama_server_binary", fake_binary)
    monkeypatch.setattr(images, "build_base", fake_base)
    monkeypatch.setattr(images, "build_image", fake_image)
    images.build_all(["llamacpp-next", "host", "llamacpp", "broken"], quiet=True)
    assert events[0] == "compile-start" and events[1] == "base" and overlapped == [True]
    assert events[2:4] == [f"host:-:{images.BASE_IMAGE}", f"broken:-:{images.BASE_IMAGE}"]
    assert events[4] == f"llamacpp:llama-server:{images.BASE_IMAGE}"
    assert events[5] == "llamacpp-next:-:lab/llamacpp"
    assert set(images.load_manifest()) == {"base", "host", "llamacpp", "llamacpp-next", "broken"}


@pytest.mark.parametrize("missing,want", [
    ({"docker"}, "docker.io"),
    ({"dockerd"}, "docker.io"),
    ({"debootstrap"}, "debootstrap"),
    ({"cmake"}, "cmake g++ make"),
])
def test_engine_names_what_is_missing_and_how_to_get_it(monkeypatch, missing, want):
    import shutil

    from llmfleet.errors import CheckFailed

    real = shutil.which
    monkeypatch.setattr(lab_engine.shutil, "which",
                        lambda name: None if name in missing else (real(name) or f"/usr/bin/{name}"))
    with pytest.raises(CheckFailed, match=f"missing: {re.escape(want)}.*lab.setup"):
        lab_engine.ensure_engine(install=False)


def test_engine_without_root_says_the_apt_command(monkeypatch):
    from llmfleet.errors import CheckFailed

    monkeypatch.setattr(lab_engine, "_is_root", lambda: False)
    with pytest.raises(CheckFailed, match=r"apt-get install -y docker\.io debootstrap"):
        lab_engine._apt_install(["docker.io", "debootstrap"], log=lambda m: None)


def test_container_mode_can_be_forced(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMFLEET_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LLMFLEET_LAB_MODE", "privileged")
    assert hosts.container_mode() == "privileged"
    assert not (tmp_path / "container-mode").exists()  # a forced mode is not cached as detected


def test_config_hash_tells_a_changed_host_from_the_same_one():
    spec = hosts.HostSpec(name="h", port=2204, gpu="Tesla T4", driver="535", gpu_count=1, lab="l")
    kw = dict(image="img:1", mode="restricted", network="l", public_key="ssh-ed25519 AAAA")
    base = hosts.config_hash(hosts.run_argv(spec, **kw))
    assert base and base == hosts.config_hash(hosts.run_argv(spec, **kw))
    changed = [
        hosts.run_argv(hosts.HostSpec(**{**spec.__dict__, "driver": "470"}), **kw),
        hosts.run_argv(hosts.HostSpec(**{**spec.__dict__, "gpu_count": 2}), **kw),
        hosts.run_argv(hosts.HostSpec(**{**spec.__dict__, "port": 2205}), **kw),
        hosts.run_argv(spec, **{**kw, "image": "img:2"}),
        hosts.run_argv(spec, **{**kw, "mode": "privileged"}),
    ]
    assert len({hosts.config_hash(a) for a in changed} | {base}) == len(changed) + 1


@pytest.mark.parametrize("root,start,want,said", [
    (True, "128", "8192", "raised fs.inotify.max_user_instances 128 -> 8192"),
    (False, "128", "128", "sysctl -w fs.inotify.max_user_instances=8192"),
    (True, "10000", "10000", None),
])
def test_inotify_limit_for_many_hosts(monkeypatch, tmp_path, root, start, want, said):
    f = tmp_path / "max_user_instances"
    f.write_text(start + "\n")
    monkeypatch.setattr(lab_engine, "INOTIFY_INSTANCES", f)
    monkeypatch.setattr(lab_engine, "_is_root", lambda: root)
    logs: list[str] = []
    lab_engine.ensure_kernel_limits(logs.append)
    assert f.read_text().strip() == want
    assert (said in logs[0]) if said else logs == []


def _fake_bin(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def test_an_engine_that_answers_late_is_not_up_yet_not_an_error(monkeypatch, tmp_path):
    # a dockerd on its first start accepts on its socket and answers only once initialised
    from llmfleet.lab import docker as lab_docker

    monkeypatch.setattr(lab_docker, "DOCKER", str(_fake_bin(tmp_path / "docker", "sleep 5")))
    assert lab_engine.daemon_up(timeout=0.5) is None
    monkeypatch.setattr(lab_docker, "DOCKER", str(_fake_bin(tmp_path / "docker2", "echo 20.10.24")))
    assert lab_engine.daemon_up(timeout=5) == "20.10.24"


def test_start_dockerd_waits_for_a_slow_first_start(monkeypatch, tmp_path):
    from llmfleet.lab import docker as lab_docker

    ready = tmp_path / "ready"
    # the stand-in daemon becomes ready after 2 s; until then the client hangs like a real one does
    _fake_bin(tmp_path / "dockerd", f"sleep 2; touch {ready}; sleep 5")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(lab_docker, "DOCKER", str(_fake_bin(
        tmp_path / "docker", f"[ -e {ready} ] && echo 20.10.24 && exit 0; sleep 30")))
    monkeypatch.setattr(lab_engine, "_is_root", lambda: True)
    monkeypatch.setattr(lab_engine, "DOCKERD_LOG", tmp_path / "dockerd.log")
    monkeypatch.setattr(lab_engine, "daemon_up", lambda timeout=10, _real=lab_engine.daemon_up: _real(timeout=1))
    said: list[str] = []
    lab_engine.start_dockerd(said.append)
    assert any("dockerd answered after" in m for m in said)


def test_start_dockerd_reports_a_daemon_that_exits_with_its_log(monkeypatch, tmp_path):
    from llmfleet.errors import CheckFailed
    from llmfleet.lab import docker as lab_docker

    _fake_bin(tmp_path / "dockerd", "echo 'failed to start daemon: pid file found' >&2; exit 1")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(lab_docker, "DOCKER", str(_fake_bin(tmp_path / "docker", "exit 1")))
    monkeypatch.setattr(lab_engine, "_is_root", lambda: True)
    monkeypatch.setattr(lab_engine, "DOCKERD_LOG", tmp_path / "dockerd.log")
    with pytest.raises(CheckFailed, match=r"(?s)dockerd exited with code 1.*pid file found"):
        lab_engine.start_dockerd(lambda m: None)


def test_fault_bench_names_each_deploy_step_by_its_script():
    """The SSH-cut faults stop the controller at a step they recognise by the script it sends."""
    from llmfleet.lab.faults import _step_of
    from llmfleet.release import confirm
    from llmfleet.release import store as S

    paths = S.Paths("/opt/llmfleet", "tiny")
    rid, prev, token = "20261129T120000Z-abcdef0123", "20261129T110000Z-0123456789", "ab" * 16
    assert _step_of(S.upload_script(paths, rid), b"tar") == "upload"
    assert _step_of(confirm.arm_script(paths, release_id=rid, previous=prev, token=token, action="deploy",
                                       timeout=30), None) == "arm"
    assert _step_of(S.switch_script(paths, rid), None) == "switch"
    assert _step_of(confirm.confirm_script(paths, token=token), None) == "confirm"
    # a deploy's release round trip: upload, arm, switch and the container wait chained
    chain = S.chain_script([S.upload_script(paths, rid), confirm.arm_script(
        paths, release_id=rid, previous=prev, token=token, action="deploy", timeout=30),
        S.switch_script(paths, rid)], stdin_step=0)
    assert _step_of(chain, b"tar") == "release"
    for other in (S.state_script("/opt/llmfleet"), S.unit_probe_script(paths), S.lock_acquire_script(
            "/opt/llmfleet", {"token": "t"}), S.final_script("/opt/llmfleet", [], [], "t")):
        assert _step_of(other, None) is None


@pytest.mark.parametrize(
    ("ephemeral", "want"),
    [("32768\t60999\n", (20768, 32768)), ("49152 65535", (37152, 49152)), ("1024 65535", (24, 12024)),
     ("", (20768, 32768)), ("garbage", (20768, 32768))],
)
def test_lab_ports_come_from_below_the_ephemeral_range(ephemeral, want):
    assert hosts.port_range(ephemeral) == want


def test_free_ports_never_hand_out_a_port_another_live_process_reserved(tmp_path):
    path = tmp_path / "reserved.json"
    first = hosts.free_ports(40, reservations=path)
    second = hosts.free_ports(40, reservations=path)
    low, high = hosts.port_range()
    assert len(set(first)) == 40 and not set(first) & set(second)
    assert all(low <= p < high for p in first + second)
    held = json.loads(path.read_text())
    assert {int(p) for p in held} == set(first) | set(second)
    assert set(held.values()) == {os.getpid()}


def test_free_ports_drop_reservations_of_ended_processes(tmp_path):
    path = tmp_path / "reserved.json"
    dead = 2**22 + 12345  # above pid_max's default (4,194,304): no process has it
    low, _ = hosts.port_range()
    path.write_text(json.dumps({str(p): dead for p in range(low, low + 500)}))
    hosts.free_ports(1, reservations=path)
    held = json.loads(path.read_text())
    assert dead not in held.values() and len(held) == 1


def test_free_ports_skip_a_port_something_listens_on(tmp_path, monkeypatch):
    import socket

    low, _ = hosts.port_range()
    with socket.socket() as s:
        s.bind(("127.0.0.1", low))
        s.listen()
        seq = iter([low, low, low + 1])
        monkeypatch.setattr("random.SystemRandom.randrange", lambda self, a, b: next(seq))
        assert hosts.free_ports(1, reservations=tmp_path / "r.json") == [low + 1]


@pytest.mark.parametrize(
    ("stderr", "want"),
    [(b"docker: Error response from daemon: driver failed programming external connectivity on endpoint x: "
      b"Bind for 127.0.0.1:41234 failed: port is already allocated\n\nRun 'docker run --help' for more information\n",
      "Bind for 127.0.0.1:41234 failed: port is already allocated"),
     (b"docker: Error response from daemon: Conflict.\nSee 'docker run --help'.\n", "docker: Error response"),
     (b"Error: No such container: x\n", "No such container"),
     (b"Run 'docker run --help' for more information\n", "Run 'docker run --help'"),
     (b"", "")],
)
def test_docker_errors_name_what_went_wrong_not_the_usage_hint(stderr, want):
    from llmfleet.lab.docker import error_line

    assert want in error_line(stderr)
