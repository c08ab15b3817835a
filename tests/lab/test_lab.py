"""End-to-end: the lab's hosts are real SSH hosts with their own Docker engine and a simulated GPU."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.lab
ROOT = Path(__file__).resolve().parents[2]


def test_ssh_as_deploy_with_sudo_and_own_hostname(lab):
    r = lab.connect("gpu-v100-01")
    try:
        assert r.run("hostname").stdout.strip() == "gpu-v100-01"
        # deploy logs in with the lab key; become (sudo -n) gives root
        assert r.run("id -u").stdout.strip() == "0"
        assert r.run("cat /etc/os-release").stdout.count("bookworm") >= 1
    finally:
        r.close()
    from llmfleet.host import ssh
    from llmfleet.inventory.ansible import Host

    h = lab.inventory().hosts["gpu-v100-01"]
    for user, want in (("deploy", "deploy"), ("root", "root")):
        plain = Host(name=h.name, vars={**h.vars, "ansible_user": user, "ansible_become": False}, groups=h.groups)
        with ssh.connect(plain, config=lab.config) as r:
            assert r.run("id -un").stdout.strip() == want


def test_unknown_host_key_is_refused_without_the_recorded_key(lab, tmp_path):
    from llmfleet.errors import RemoteError
    from llmfleet.host import ssh

    cfg = dict(lab.config, known_hosts=str(tmp_path / "empty_known_hosts"))
    with pytest.raises(RemoteError, match="unknown host key"):
        ssh.connect(lab.inventory().hosts["gpu-v100-01"], config=cfg)


def test_host_keys_differ_per_host(lab):
    a = lab.exec("gpu-v100-01", ["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).stdout.split()[1]
    b = lab.exec("gpu-t4-01", ["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).stdout.split()[1]
    assert a != b


def test_each_host_has_its_own_docker_engine(lab):
    ids = {h: lab.exec(h, ["docker", "info", "--format", "{{.ID}} {{.Name}}"]).stdout.split() for h in
           ("gpu-v100-01", "gpu-t4-01")}
    assert ids["gpu-v100-01"][1] == "gpu-v100-01" and ids["gpu-t4-01"][1] == "gpu-t4-01"
    assert ids["gpu-v100-01"][0] != ids["gpu-t4-01"][0]
    # a container started on one host is invisible on the other
    name = f"iso-{int(time.time())}"
    lab.exec("gpu-v100-01", ["docker", "create", "--name", name, lab_image_for(lab, "llamacpp:lab-cpu"), "--version"],
             timeout=120)
    try:
        assert name in lab.exec("gpu-v100-01", ["docker", "ps", "-a", "--format", "{{.Names}}"]).stdout
        assert name not in lab.exec("gpu-t4-01", ["docker", "ps", "-a", "--format", "{{.Names}}"]).stdout
    finally:
        lab.exec("gpu-v100-01", ["docker", "rm", "-f", name], check=False)


def test_compose_v2_and_gpu_requests_accepted(lab):
    out = lab.exec("gpu-v100-01", ["docker", "compose", "version", "--short"]).stdout.strip()
    assert out.startswith("2.")
    daemon = json.loads(lab.exec("gpu-v100-01", ["cat", "/etc/docker/daemon.json"]).stdout)
    assert daemon["insecure-registries"] == [lab.registry_inner]
    assert all(not d.startswith(("8.8.", "1.1.", "9.9.")) for d in daemon["dns"])


def lab_image_for(lab, key: str) -> str:
    from llmfleet.images.lock import load_lock

    img = load_lock(lab.lock_path).get(key)
    assert img and img.digest, f"{key} not pinned in {lab.lock_path}: run invoke lab.setup"
    return f"{img.repository}@{img.digest}"


def test_registry_serves_by_digest_and_hosts_pull_by_digest(lab):
    from llmfleet.images.lock import load_lock
    from llmfleet.images.registry import RegistryClient

    img = load_lock(lab.lock_path).get("llamacpp:lab-cpu")
    repo_path = img.repository.split("/", 1)[1]
    # the registry answers for the pinned digest on loopback
    resp = httpx.head(f"http://{lab.registry}/v2/{repo_path}/manifests/{img.digest}",
                      headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"}, timeout=10)
    assert resp.status_code == 200
    assert resp.headers["docker-content-digest"] == img.digest
    assert RegistryClient().resolve(f"{lab.registry}/{repo_path}@{img.digest}") == img.digest
    # an unknown digest is a 404, not a silent fallback
    bad = "sha256:" + "0" * 64
    assert httpx.head(f"http://{lab.registry}/v2/{repo_path}/manifests/{bad}", timeout=10).status_code == 404
    # a host pulls it by digest through the lab network
    ref = f"{img.repository}@{img.digest}"
    lab.exec("gpu-t4-01", ["docker", "pull", ref], timeout=180)
    got = lab.exec("gpu-t4-01", ["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", ref]).stdout
    assert img.digest in got


@pytest.mark.parametrize(
    "host,name,total,cc",
    [
        ("gpu-v100-01", "Tesla V100-SXM2-32GB", "32768", "7.0"),
        ("gpu-4090-01", "NVIDIA GeForce RTX 4090", "24564", "8.9"),
    ],
)
def test_simulator_answers_per_card(lab, host, name, total, cc):
    out = lab.exec(host, ["nvidia-smi", "--query-gpu=index,name,memory.total,compute_cap",
                          "--format=csv,noheader,nounits"]).stdout.strip()
    assert out == f"0, {name}, {total}, {cc}"


def test_simulator_r470_refuses_compute_cap(lab):
    proc = lab.exec("gpu-t4-01", ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv"], check=False)
    assert proc.returncode == 2
    assert 'Field "compute_cap" is not a valid field to query.' in proc.stdout
    ok = lab.exec("gpu-t4-01", ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).stdout
    assert ok.strip() == "Tesla T4, 470.256.02"
    banner = lab.exec("gpu-t4-01", ["nvidia-smi"]).stdout
    assert "Driver Version: 470.256.02" in banner and "CUDA Version: 11.4" in banner


def test_simulator_dead_driver_mode(lab):
    lab.set_driver_dead("gpu-4090-01", True)
    try:
        proc = lab.exec("gpu-4090-01", ["nvidia-smi", "-L"], check=False)
        assert proc.returncode == 9
        assert "couldn't communicate with the NVIDIA driver" in proc.stdout
    finally:
        lab.set_driver_dead("gpu-4090-01", False)
    assert lab.exec("gpu-4090-01", ["nvidia-smi", "-L"]).stdout.startswith("GPU 0: NVIDIA GeForce RTX 4090")


def test_models_staged(lab):
    out = lab.exec("gpu-v100-01", ["sh", "-c", f"head -c 4 {lab.gguf_path}; ls {lab.hf_path}"]).stdout
    assert out.startswith("GGUF")
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert f in out


def test_restarted_host_keeps_its_identity_and_answers_ssh(lab):
    host = "gpu-p40-01"
    lab.ensure_hosts(host)
    before = lab.exec(host, ["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).stdout
    lab.stop_host(host)
    lab.start_host(host)
    assert lab.exec(host, ["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).stdout == before
    with lab.connect(host) as r:  # the recorded key still matches: strict checking passes
        out = r.run("nvidia-smi -L", check=True).stdout
    assert out.count("Tesla P40") == 2


def test_status(lab):
    from llmfleet.lab import hosts

    rows = {r.name: r for r in hosts.status(lab.name)}
    assert set(lab.hosts) <= set(rows)
    for name in lab.hosts:
        r = rows[name]
        assert r.state == "running" and r.ssh is True and r.port == lab.port(name)
        bare = lab.inventory().hosts[name].vars.get("lab_bare")  # other test files may have started bare hosts
        assert r.ip and r.gpu and ("(bare)" in r.gpu if bare else "driver" in r.gpu), (name, r.gpu)


def test_any_inventory_describes_its_lab_through_the_cli(lab, tmp_path):
    """`lab.up -i PATH` brings up the hosts another inventory describes; status and down by name."""
    import secrets
    import subprocess
    import sys

    from llmfleet.lab.hosts import free_ports

    port = free_ports(1)[0]
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        "all:\n  hosts:\n    edge-l4-01:\n"
        f"      ansible_host: 127.0.0.1\n      ansible_port: {port}\n      ansible_user: deploy\n"
        f"      ansible_ssh_private_key_file: {lab.key_path}\n"
        "      lab_gpu: NVIDIA L4\n      lab_driver: '550'\n      lab_gpu_count: 4\n")
    name = f"llmfleet-c{secrets.token_hex(3)}"
    kh = tmp_path / "known_hosts"
    env = {**os.environ, "INVOKE_LLMFLEET_SSH_KNOWN_HOSTS": str(kh)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "invoke", *args],
                              capture_output=True, text=True, timeout=120, env=env, cwd=str(ROOT))

    try:
        up = cli("lab.up", "-i", str(inv), "--name", name, "--json")
        assert up.returncode == 0, up.stderr
        assert json.loads(up.stdout)["hosts"] == ["edge-l4-01"]
        assert f"[127.0.0.1]:{port} ssh-ed25519 " in kh.read_text()
        out = subprocess.run(["docker", "exec", f"{name}-edge-l4-01", "nvidia-smi", "-L"], capture_output=True,
                             text=True, timeout=30).stdout
        assert out.count("NVIDIA L4") == 4
        st = cli("lab.status", "--name", name, "--json")
        assert st.returncode == 0, st.stderr
        rows = json.loads(st.stdout)["hosts"]
        assert [(r["name"], r["state"], r["port"], r["ssh"]) for r in rows] == [("edge-l4-01", "running", port, True)]
        # idle memory budget, on a host that has just booted and pulled nothing (other tests'
        # hosts may have pulled and run engines)
        from llmfleet.lab import hosts

        time.sleep(2)
        mem = {r.name: r.mem_mib for r in hosts.status(name)}["edge-l4-01"]
        assert 0 < mem < 100, f"edge-l4-01: {mem} MiB idle (budget 100 MiB)"
        bad = cli("lab.up", "-i", str(inv), "--name", name, "--hosts", "nope")
        assert bad.returncode == 2 and "no host 'nope'" in bad.stderr
        # the inventory now says another driver: lab.up recreates the host, with new host keys recorded
        old_keys = kh.read_text()
        (inv / "hosts.yml").write_text((inv / "hosts.yml").read_text().replace("lab_driver: '550'",
                                                                               "lab_driver: '470'"))
        again = cli("lab.up", "-i", str(inv), "--name", name)
        assert again.returncode == 0, again.stderr
        assert "recreated" in again.stdout
        out = subprocess.run(["docker", "exec", f"{name}-edge-l4-01", "nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout
        assert out.split() == ["470.256.02"] * 4
        assert kh.read_text() != old_keys and kh.read_text().count(f"[127.0.0.1]:{port} ") == 3
    finally:
        down = cli("lab.down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert f"[127.0.0.1]:{port}" not in kh.read_text()
    assert cli("lab.status", "--name", name, "--json").stdout.count("edge-l4-01") == 0
