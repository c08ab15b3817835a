"""The ``lab`` fixture: a running lab for end-to-end tests (session scope, torn down at the end).

Each test session brings up its own uniquely named lab (``llmfleet-t<pid>-<rand>``) from a generated
copy of ``inventory/lab/`` with free loopback ports, so two runs coexist with each other and with the
default lab, and so pytest-xdist workers (``-n 3 --dist loadfile``, as scripts/test.sh runs them) each get
a lab of their own. Images must be built once beforehand (``invoke lab.setup``; ``--vllm`` for vLLM tests).

    def test_x(lab):
        lab.inventory_path          # generated inventory folder (str)
        lab.hosts                   # host names that are up (default: LAB_DEFAULT_HOSTS)
        lab.ensure_hosts("lab-node-01", "lab-node-02")   # bring up more hosts of the lab inventory
        lab.config                  # ssh config dict for llmfleet.host.ssh.connect / deploy_host(config=...)
        lab.inventory()             # llmfleet.inventory.ansible.Inventory of the generated inventory
        lab.connect(host)           # llmfleet.host.ssh.Remote to the host (deploy user, sudo)
        lab.exec(host, argv)        # run argv in the host container (CompletedProcess, text)
        lab.stop_host(host); lab.start_host(host)
        lab.set_driver_dead(host, True)   # nvidia-smi fails like a dead driver
        lab.set_gpu_faults(host, {0: {"xid": [79]}})   # injected hardware faults (None clears them)
        lab.registry                # "127.0.0.1:PORT" (push/resolve from here)
        lab.registry_inner          # "lab-registry:5000" (what hosts pull from)
        lab.lock_path               # images lock with the lab's pinned images
        lab.gguf_path, lab.hf_path  # staged model paths on every host

Environment: LLMFLEET_TEST_LAB_HOSTS (comma list) changes the default hosts; LLMFLEET_TEST_LAB_KEEP=1
keeps the lab after the session (``invoke lab.down --name NAME`` removes it).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from llmfleet.inventory.ansible import load_inventory
from llmfleet.lab import hosts as lab_hosts
from llmfleet.lab import paths

ROOT = Path(__file__).resolve().parents[2]
LAB_DEFAULT_HOSTS = ["gpu-v100-01", "gpu-t4-01", "gpu-4090-01"]


class Lab:
    gguf_path = "/srv/models/tiny-qwen2-gguf/tiny-qwen2.gguf"
    hf_path = "/srv/models/tiny-qwen2-hf"

    def __init__(self, name: str, inventory_path: Path, workdir: Path) -> None:
        self.name = name
        self.inventory_path = str(inventory_path)
        self.workdir = workdir
        self.key_path = ROOT / ".lab" / "id_ed25519"
        self.lock_path = ROOT / ".lab" / "images.lock"
        self.known_hosts = workdir / "known_hosts"
        self.registry = f"127.0.0.1:{paths.registry_port()}"
        self.registry_inner = lab_hosts.REGISTRY_HOST
        self.config = {"connect_timeout": 10, "command_timeout": 120, "user": None,
                       "known_hosts": str(self.known_hosts)}
        self.hosts: list[str] = []
        self.up_seconds: dict[str, float] = {}

    # -- lifecycle ------------------------------------------------------------------------------------

    def ensure_hosts(self, *names: str) -> list[str]:
        missing = [n for n in names if n not in self.hosts]
        if missing:
            res = lab_hosts.up(self.inventory_path, lab=self.name, names=missing, known_hosts=self.known_hosts,
                               key_path=self.key_path)
            self.up_seconds[",".join(missing)] = res.seconds
            self.hosts += missing
        return list(names)

    def down(self) -> None:
        lab_hosts.down(self.name, known_hosts=self.known_hosts)

    # -- access ---------------------------------------------------------------------------------------

    def inventory(self):
        return load_inventory(self.inventory_path)

    def container(self, host: str) -> str:
        return f"{self.name}-{host}"

    def port(self, host: str) -> int:
        return int(self.inventory().hosts[host].vars["ansible_port"])

    def connect(self, host: str):
        from llmfleet.host import ssh

        return ssh.connect(self.inventory().hosts[host], config=self.config)

    def exec(self, host: str, argv: list[str], *, check: bool = True, timeout: float = 60,
             input: str | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(["docker", "exec", *(["-i"] if input is not None else []), self.container(host),
                               *argv], capture_output=True, text=True, timeout=timeout, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(f"{host}: {argv} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        return proc

    def stop_host(self, host: str) -> None:
        subprocess.run(["docker", "stop", "-t", "5", self.container(host)], check=True, capture_output=True,
                       timeout=60)

    def start_host(self, host: str, timeout: float = 60) -> None:
        subprocess.run(["docker", "start", self.container(host)], check=True, capture_output=True, timeout=60)
        spec = lab_hosts.host_specs(self.inventory(), self.name, [host])[0]
        lab_hosts.wait_ready(spec, timeout=timeout)

    def set_driver_dead(self, host: str, dead: bool = True) -> None:
        lab_hosts.set_driver_dead(self.container(host), dead)

    def set_gpu_faults(self, host: str, faults: dict | None) -> None:
        """Hardware faults per GPU index for the host's nvidia-smi, dmesg and lspci simulators
        (``llmfleet.lab.nvidia_smi_sim.FAULT_KEYS``); None clears them."""
        lab_hosts.set_gpu_faults(self.container(host), faults)

    def stage_models(self, host: str) -> None:
        lab_hosts.stage_models(self.container(host), lab_hosts.lab_models())


def _lab_name() -> str:
    return f"llmfleet-t{os.getpid() % 100000}-{secrets.token_hex(2)}"


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    from llmfleet.errors import LlmfleetError
    from llmfleet.lab import engine, images

    try:
        engine.ensure_engine(install=False)
        images.lab_image("host")
        images.lab_image("llamacpp")
    except LlmfleetError as exc:
        pytest.fail(f"the lab is not set up: {exc} (run `invoke lab.setup` once)", pytrace=False)
    if not (ROOT / ".lab" / "images.lock").exists():
        pytest.fail("the lab's images are not pinned: run `invoke lab.setup` once", pytrace=False)
    workdir = tmp_path_factory.mktemp("lab")
    name = _lab_name()
    inventory = lab_hosts.generate_inventory(ROOT / "inventory" / "lab", workdir / "inventory",
                                             key_path=ROOT / ".lab" / "id_ed25519",
                                             lock_path=ROOT / ".lab" / "images.lock")
    the_lab = Lab(name, inventory, workdir)
    wanted = [h.strip() for h in os.environ.get("LLMFLEET_TEST_LAB_HOSTS", "").split(",") if h.strip()]
    t0 = time.monotonic()
    try:
        the_lab.ensure_hosts(*(wanted or LAB_DEFAULT_HOSTS))
        the_lab.up_seconds["session"] = time.monotonic() - t0
        yield the_lab
    finally:
        if os.environ.get("LLMFLEET_TEST_LAB_KEEP") != "1":
            the_lab.down()
