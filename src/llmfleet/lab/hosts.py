"""Lab hosts: one system container per inventory host, the shared lab registry, model staging.

A lab is named (default ``llmfleet-lab``; tests use unique names so two runs coexist). Everything a
lab creates carries the label ``org.llmfleet.lab=<name>``: a bridge network ``<name>``, and per host a
container ``<name>-<host>`` with its own hostname, sshd published on ``127.0.0.1:<ansible_port>``
and a volume ``<name>-<host>-docker`` for the inner engine's /var/lib/docker (overlay2 cannot nest on
the outer overlay2).

The pure part (``host_specs``, ``daemon_json``, ``run_argv``, ``known_hosts_lines``) computes the
exact docker argv and files; ``up``/``down``/``status`` do the Docker I/O.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmfleet.errors import CheckFailed, UsageError
from llmfleet.inventory.ansible import Inventory, load_inventory
from llmfleet.lab import docker, engine
from llmfleet.lab.cards import gpu_sim_config
from llmfleet.lab.nvidia_smi_sim import FAULT_KEYS, FAULTS_PATH, render_proc_version
from llmfleet.lab.paths import (
    HOST_MODELS_DIR,
    REGISTRY_CONTAINER,
    REGISTRY_INNER_PORT,
    REGISTRY_VOLUME,
    STATE_ROOT,
    cache_dir,
    registry_port,
)
from llmfleet.lab.paths import locked as _locked

LABEL = "org.llmfleet.lab"
HOST_LABEL = "org.llmfleet.lab.host"
PORT_LABEL = "org.llmfleet.lab.ssh-port"
GPU_LABEL = "org.llmfleet.lab.gpu"
CONFIG_LABEL = "org.llmfleet.lab.config"
# Name under which hosts reach the registry on every lab network (the images lock records it).
REGISTRY_ALIAS = "lab-registry"
REGISTRY_HOST = f"{REGISTRY_ALIAS}:{REGISTRY_INNER_PORT}"
# Inner engines: networks that never overlap the outer lab network (Docker's 172.x / 192.168.x pools).
INNER_BIP = "10.199.0.1/24"
INNER_POOLS = [{"base": "10.200.0.0/16", "size": 24}]
# DNS for containers an inner engine starts: the inner bridge gateway (the host itself, where nothing
# answers on port 53), so no lookup ever leaves the lab. Lab containers need no DNS.
INNER_DNS = INNER_BIP.split("/")[0]
HOST_MEMORY_LIMIT = os.environ.get("LLMFLEET_LAB_HOST_MEMORY", "6g")
SIM_DEAD_FLAG = "/etc/llmfleet-sim/driver-dead"

Log = Callable[[str], None]


@dataclass(frozen=True)
class HostSpec:
    """One lab host as the inventory describes it."""

    name: str
    port: int
    gpu: str
    driver: str
    gpu_count: int
    lab: str
    bare: bool = False  # lab_bare: no Docker, no NVIDIA bits; installs from the lab package repository

    @property
    def container(self) -> str:
        return f"{self.lab}-{self.name}"

    @property
    def volume(self) -> str:
        return f"{self.container}-docker"


@dataclass
class HostState:
    name: str
    container: str
    state: str  # running | exited | missing | ...
    port: int | None
    ip: str | None = None
    gpu: str | None = None
    mem_mib: float | None = None
    ssh: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class UpResult:
    lab: str
    hosts: list[str]
    seconds: float
    known_hosts: str
    started: list[str] = field(default_factory=list)
    already_running: list[str] = field(default_factory=list)


# -- pure ------------------------------------------------------------------------------------------


def lab_hosts(inv: Inventory) -> list[str]:
    """Hosts of an inventory that describe a lab host (they set ``lab_gpu``)."""
    return [h.name for h in inv.hosts.values() if "lab_gpu" in h.vars]


def host_specs(inv: Inventory, lab: str, names: Iterable[str] | None = None) -> list[HostSpec]:
    """Specs of the named lab hosts (all lab hosts when ``names`` is empty). Validates the lab vars."""
    wanted = list(names or [])
    known = lab_hosts(inv)
    if not known:
        raise UsageError(f"{inv.path}: no host sets lab_gpu; a lab inventory gives each host lab_gpu, lab_driver")
    for n in wanted:
        if n not in inv.hosts:
            raise UsageError(f"{inv.path}: no host {n!r}; lab hosts: {', '.join(known)}")
        if n not in known:
            raise UsageError(f"{inv.path}: host {n} sets no lab_gpu, so it is not a lab host")
    specs = []
    ports: dict[int, str] = {}
    for name in wanted or known:
        v = inv.hosts[name].vars
        where = inv.hosts[name].sources.get("ansible_port", inv.path)
        port = v.get("ansible_port")
        if not isinstance(port, int) or not 1024 <= port <= 65535:
            raise UsageError(f"{where}: host {name}: ansible_port must be an integer 1024-65535 "
                             f"(sshd is published on 127.0.0.1:PORT), got {port!r}")
        if port in ports:
            raise UsageError(f"{inv.path}: hosts {ports[port]} and {name} both use ansible_port {port}")
        ports[port] = name
        addr = str(v.get("ansible_host", name))
        if addr not in ("127.0.0.1", "localhost"):
            raise UsageError(f"{inv.path}: host {name}: a lab host's ansible_host must be 127.0.0.1, got {addr!r}")
        count = v.get("lab_gpu_count", 1)
        bare = v.get("lab_bare", False)
        if not isinstance(bare, bool):
            raise UsageError(f"{inv.path}: host {name}: lab_bare must be true or false, got {bare!r}")
        spec = HostSpec(name=name, port=port, gpu=str(v["lab_gpu"]), driver=str(v.get("lab_driver", "535")),
                        gpu_count=count, lab=lab, bare=bare)
        gpu_sim_config(name, spec.gpu, spec.driver, count)  # validates card, driver, count
        specs.append(spec)
    return specs


def daemon_json() -> dict:
    """The inner engine's /etc/docker/daemon.json."""
    return {
        "bip": INNER_BIP,
        "default-address-pools": INNER_POOLS,
        "dns": [INNER_DNS],
        "insecure-registries": [REGISTRY_HOST],
        "storage-driver": "overlay2",
        "log-driver": "json-file",
        "log-opts": {"max-size": "10m", "max-file": "2"},
        "features": {"buildkit": False},
    }


def run_argv(spec: HostSpec, *, image: str, mode: str, network: str, public_key: str,
             apt_keyring_b64: str = "") -> list[str]:
    """``docker run`` argv for one lab host (mode: 'privileged' or 'restricted', see engine). A bare host
    gets the lab repository's keyring instead of a driver, and comes back by itself after a reboot."""
    sim = gpu_sim_config(spec.name, spec.gpu, spec.driver, spec.gpu_count)
    env = {
        "LAB_AUTHORIZED_KEY": public_key.strip(),
        "LAB_GPU_JSON": json.dumps(sim, separators=(",", ":")),
        "LAB_DAEMON_JSON": json.dumps(daemon_json(), separators=(",", ":")),
    }
    if spec.bare:
        env["LAB_APT_KEYRING"] = apt_keyring_b64
    else:
        env["LAB_DRIVER_VERSION_FILE"] = render_proc_version(sim)
    gpu_label = f"{spec.gpu_count} x {spec.gpu} " + ("(bare)" if spec.bare else f"(driver {spec.driver})")
    argv = ["run", "-d", "--name", spec.container, "--hostname", spec.name,
            "--network", network, "--network-alias", spec.name,
            "--label", f"{LABEL}={spec.lab}", "--label", f"{HOST_LABEL}={spec.name}",
            "--label", f"{PORT_LABEL}={spec.port}",
            "--label", f"{GPU_LABEL}={gpu_label}",
            *(["--restart", "unless-stopped"] if spec.bare else []),
            "-p", f"127.0.0.1:{spec.port}:22",
            # /dev/shm as on a real host (there: half the RAM); vLLM's compose uses the host's IPC
            # namespace and needs more than Docker's 64m. tmpfs pages are allocated only when used.
            "--memory", HOST_MEMORY_LIMIT, "--shm-size", "1g",
            "--mount", f"type=volume,src={spec.volume},dst=/var/lib/docker",
            *engine.SYSTEM_CONTAINER_FLAGS[mode], *engine.COMMON_HOST_FLAGS]
    for k, val in env.items():
        argv += ["-e", f"{k}={val}"]
    argv.append(image)
    # Everything above decides what the host is; the hash lets lab.up tell a changed host from a running one.
    digest = hashlib.sha256(json.dumps(argv).encode()).hexdigest()[:16]
    return [*argv[:2], "--label", f"{CONFIG_LABEL}={digest}", *argv[2:]]


def config_hash(argv: list[str]) -> str | None:
    for i, a in enumerate(argv[:-1]):
        if a == "--label" and argv[i + 1].startswith(CONFIG_LABEL + "="):
            return argv[i + 1].split("=", 1)[1]
    return None


def known_hosts_lines(port: int, pubkeys: str, address: str = "127.0.0.1") -> list[str]:
    """known_hosts lines for a host's public keys (``cat /etc/ssh/ssh_host_*_key.pub`` output)."""
    name = address if port == 22 else f"[{address}]:{port}"
    out = []
    for line in pubkeys.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith(("ssh-", "ecdsa-")):
            out.append(f"{name} {parts[0]} {parts[1]}")
    return out


def merge_known_hosts(existing: str, port: int, lines: list[str], address: str = "127.0.0.1") -> str:
    """Replace every entry for ``[address]:port`` with ``lines`` (a recreated host has new keys)."""
    name = address if port == 22 else f"[{address}]:{port}"
    kept = [ln for ln in existing.splitlines() if ln.split(" ", 1)[0] != name]
    return "".join(ln + "\n" for ln in [*kept, *lines])


def port_range(ephemeral: str | None = None) -> tuple[int, int]:
    """Where lab ports come from: the 12,000 ports below the kernel's ephemeral range
    (``net.ipv4.ip_local_port_range``), so no outgoing connection of the tests or the lab can hold one
    as its source port between the moment it is chosen and the moment docker publishes it."""
    if ephemeral is None:
        try:
            ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        except OSError:
            ephemeral = ""
    try:
        low = int(ephemeral.split()[0])
    except (IndexError, ValueError):
        low = 32768
    high = max(min(low, 65536), 12024)
    return high - 12000, high


PORTS_FILE = STATE_ROOT / "reserved-ports.json"


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_ports(n: int, *, reservations: Path | None = None) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1, reserved for this process.

    Chosen at random below the ephemeral range (``port_range``), never one another live process has
    reserved (a machine-wide file, written under a lock: two test workers starting labs at once never
    pick the same port), never one something already listens on. A reservation ends with its process."""
    import json
    import random

    path = reservations or PORTS_FILE
    low, high = port_range()
    with _locked(path.with_suffix(".lock")):
        try:
            held = {int(k): int(v) for k, v in json.loads(path.read_text()).items()}
        except (OSError, ValueError, AttributeError):
            held = {}
        held = {port: pid for port, pid in held.items() if _alive(pid)}
        ports: list[int] = []
        rng = random.SystemRandom()
        for _ in range(20 * n + 200):
            if len(ports) == n:
                break
            port = rng.randrange(low, high)
            if port in held or port in ports or not _bindable(port):
                continue
            ports.append(port)
        if len(ports) < n:
            raise CheckFailed(f"found only {len(ports)} of {n} free loopback ports in {low}-{high - 1}")
        held.update({port: os.getpid() for port in ports})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({str(k): v for k, v in sorted(held.items())}))
        tmp.replace(path)
    return ports


def generate_inventory(source: Path, dest: Path, *, key_path: Path, lock_path: Path) -> Path:
    """Copy a lab inventory folder to ``dest`` with free ports for every lab host (an overlay file
    ``zz-lab-ports.yml``, read last) and absolute key and lock paths, for a second lab beside the first."""
    import shutil

    import yaml

    shutil.copytree(source, dest)
    inv = load_inventory(str(dest))
    names = lab_hosts(inv)
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    overlay = {"all": {"hosts": {n: {"ansible_port": p} for n, p in ports.items()}}}
    (dest / "zz-lab-ports.yml").write_text(
        "# Generated: free loopback ports for this lab.\n" + yaml.safe_dump(overlay, sort_keys=True))
    all_vars = dest / "group_vars" / "all.yml"
    data = (yaml.safe_load(all_vars.read_text()) or {}) if all_vars.exists() else {}
    data["ansible_ssh_private_key_file"] = str(key_path)
    data["llmfleet_images_lock"] = str(lock_path)
    all_vars.parent.mkdir(parents=True, exist_ok=True)
    all_vars.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


# -- I/O -------------------------------------------------------------------------------------------


def _container_state(name: str) -> dict | None:
    return docker.inspect("container", name)


def ensure_key(key_path: Path) -> str:
    """The lab's SSH key pair (created once, 0600); returns the public key."""
    pub = key_path.with_suffix(".pub")
    with _locked(key_path.with_name(key_path.name + ".lock")):
        if not key_path.exists() or not pub.exists():
            key_path.parent.mkdir(parents=True, exist_ok=True)
            key_path.unlink(missing_ok=True)
            proc = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "llmfleet-lab",
                                   "-f", str(key_path)], capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                raise CheckFailed(f"ssh-keygen failed for {key_path}: {proc.stderr.decode().strip()}")
        os.chmod(key_path, 0o600)
        return pub.read_text().strip()


def ensure_network(lab: str) -> str:
    if not docker.inspect("network", lab):
        docker.run(["network", "create", "--label", f"{LABEL}={lab}", lab])
    return lab


def ensure_registry(log: Log = lambda m: None, image: str | None = None) -> str:
    """Start the shared registry container (published on 127.0.0.1:PORT) if needed; returns 127.0.0.1:PORT."""
    from llmfleet.lab.images import lab_image

    port = registry_port()
    with _locked(cache_dir() / ".registry.lock"):
        info = _container_state(REGISTRY_CONTAINER)
        if info and not info["State"]["Running"]:
            docker.run(["start", REGISTRY_CONTAINER])
        elif not info:
            log(f"starting registry {REGISTRY_CONTAINER} on 127.0.0.1:{port}")
            docker.run(["run", "-d", "--name", REGISTRY_CONTAINER, "--restart", "unless-stopped",
                        "--label", f"{LABEL}.registry=1", "-p", f"127.0.0.1:{port}:{REGISTRY_INNER_PORT}",
                        "--mount", f"type=volume,src={REGISTRY_VOLUME},dst=/var/lib/docker-registry",
                        image or lab_image("registry")])
    wait_http(f"http://127.0.0.1:{port}/v2/", timeout=30)
    return f"127.0.0.1:{port}"


def connect_registry(lab: str) -> None:
    """Make the registry reachable as ``lab-registry:5000`` on the lab network."""
    info = _container_state(REGISTRY_CONTAINER) or {}
    nets = (info.get("NetworkSettings") or {}).get("Networks") or {}
    if lab not in nets:
        docker.run(["network", "connect", "--alias", REGISTRY_ALIAS, lab, REGISTRY_CONTAINER])


def wait_http(url: str, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.3)
    raise CheckFailed(f"{url} did not answer within {timeout:.0f}s ({last})")


def _ssh_banner(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def exec_(container: str, argv: list[str], *, timeout: float = 60, check: bool = True,
          input: bytes | None = None) -> subprocess.CompletedProcess:
    flags = ["-i"] if input is not None else []
    return docker.run(["exec", *flags, container, *argv], timeout=timeout, check=check, input=input)


# Runs inside the host: waits (bounded) for the inner engine's socket and `docker info`.
_ENGINE_WAIT = ("i=0; while [ $i -lt {n} ]; do [ -S /run/docker.sock ] && docker info >/dev/null 2>&1 && exit 0; "
                "i=$((i+1)); sleep 0.1; done; exit 1")


def _stopped(spec: HostSpec) -> None:
    info = _container_state(spec.container)
    if not info or not info["State"]["Running"]:
        st = (info or {}).get("State") or {}
        proc = docker.run(["logs", "--tail", "5", spec.container], check=False)
        logs = (proc.stdout + proc.stderr).decode(errors="replace").strip()[-300:]
        hint = " (out of memory)" if st.get("OOMKilled") else ""
        if "inotify" in logs or "allocate manager object" in logs:
            hint = (" (too many inotify instances: as root, "
                    f"sysctl -w fs.inotify.max_user_instances={engine.INOTIFY_WANTED})")
        raise CheckFailed(f"lab host {spec.name}: container {spec.container} stopped, exit code "
                          f"{st.get('ExitCode', '?')}{hint}: {logs or st.get('Error') or 'no output'}")


def wait_ready(spec: HostSpec, timeout: float = 60) -> None:
    """Until sshd answers on the published port and the inner engine answers ``docker info``.

    Cheap on a busy machine: a socket poll for sshd, then one ``docker exec`` that waits inside the host.
    """
    deadline = time.monotonic() + timeout
    next_check = time.monotonic() + 2
    while not _ssh_banner(spec.port, timeout=0.5):
        if time.monotonic() > deadline:
            raise CheckFailed(f"lab host {spec.name}: sshd not ready within {timeout:.0f}s; "
                              f"see `docker exec {spec.container} journalctl -b --no-pager | tail`")
        if time.monotonic() > next_check:
            _stopped(spec)
            next_check = time.monotonic() + 2
        time.sleep(0.1)
    if spec.bare:
        return  # no Docker engine until provisioning installs one
    left = max(1.0, deadline - time.monotonic())
    proc = exec_(spec.container, ["sh", "-c", _ENGINE_WAIT.format(n=int(left * 10))], timeout=left * 2 + 10,
                 check=False)
    if proc.returncode != 0:
        _stopped(spec)
        raise CheckFailed(f"lab host {spec.name}: the inner Docker engine is not ready within {timeout:.0f}s; "
                          f"see `docker exec {spec.container} journalctl -u docker --no-pager | tail`")


def host_pubkeys(spec: HostSpec) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        proc = exec_(spec.container, ["sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub"], check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.decode()
        time.sleep(0.2)
    raise CheckFailed(f"lab host {spec.name}: no SSH host keys in /etc/ssh after 20s")


def record_host_keys(known_hosts: Path, specs: list[HostSpec], pubkeys: dict[str, str]) -> None:
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    text = known_hosts.read_text() if known_hosts.exists() else ""
    for spec in specs:
        text = merge_known_hosts(text, spec.port, known_hosts_lines(spec.port, pubkeys[spec.name]))
    tmp = known_hosts.with_name(known_hosts.name + f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, known_hosts)


def stage_models(container: str, models: dict[str, Path]) -> None:
    """Copy model folders to /srv/models/<name>/ on a host, as a fleet stages model files."""
    have = exec_(container, ["sh", "-c", 'mkdir -p "$1" && cd "$1" && ls -1', "sh", HOST_MODELS_DIR]).stdout
    missing = [n for n in models if n not in have.decode().split()]
    for name in missing:
        docker.run(["cp", str(models[name]), f"{container}:{HOST_MODELS_DIR}/{name}"], timeout=120)
    if missing:
        exec_(container, ["chmod", "-R", "a+rX", *[f"{HOST_MODELS_DIR}/{n}" for n in missing]])


def lab_models() -> dict[str, Path]:
    """The tiny models, generated once into the cache (deterministic)."""
    from llmfleet.lab import models

    root = cache_dir() / "models"
    marker = root / ".complete"
    with _locked(cache_dir() / ".models.lock"):
        if not marker.exists():
            models.generate(root)
            marker.write_text("1\n")
    return {models.GGUF_NAME: root / models.GGUF_NAME, models.HF_NAME: root / models.HF_NAME}


def container_mode() -> str:
    forced = os.environ.get("LLMFLEET_LAB_MODE")
    if forced in engine.SYSTEM_CONTAINER_FLAGS:
        return forced
    path = cache_dir() / "container-mode"
    try:
        mode = path.read_text().strip()
        if mode in engine.SYSTEM_CONTAINER_FLAGS:
            return mode
    except OSError:
        pass
    mode = engine.detect_container_mode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(mode + "\n")
    return mode


def _start_one(spec: HostSpec, *, image: str, mode: str, network: str, public_key: str,
               apt_keyring_b64: str = "") -> str:
    argv = run_argv(spec, image=image, mode=mode, network=network, public_key=public_key,
                    apt_keyring_b64=apt_keyring_b64)
    info = _container_state(spec.container)
    if info:
        labels = info["Config"].get("Labels") or {}
        if labels.get(CONFIG_LABEL) == config_hash(argv):
            if info["State"]["Running"]:
                return "running"
            docker.run(["start", spec.container], timeout=60)
            return "started"
        # host image, port, card, driver, key or engine settings changed: recreate the host
        # (new host keys, an empty engine), as a reinstalled machine would come back
        docker.run(["rm", "-f", "-v", spec.container], timeout=60)
        docker.run(["volume", "rm", "-f", spec.volume], check=False)
    docker.run(["volume", "create", "--label", f"{LABEL}={spec.lab}", spec.volume])
    docker.run(argv, timeout=60)
    return "recreated (its inventory settings or the host image changed)" if info else "created"


def up(inventory_path: str, *, lab: str, names: Iterable[str] | None = None, known_hosts: Path,
       key_path: Path, log: Log = lambda m: None, stage: bool = True, timeout: float = 90) -> UpResult:
    """Bring up (or reuse) the named lab hosts of an inventory; record their host keys."""
    from llmfleet.lab.images import lab_image

    t0 = time.monotonic()
    inv = load_inventory(inventory_path)
    specs = host_specs(inv, lab, names)
    engine.ensure_engine(log, install=False)
    image = lab_image("host")
    public_key = ensure_key(key_path)
    mode = container_mode()
    ensure_registry(log)
    network = ensure_network(lab)
    connect_registry(lab)
    bare_image, keyring = "", ""
    if any(s.bare for s in specs):  # bare hosts install from the lab package repository (lab-apt)
        from llmfleet.lab import aptrepo

        bare_image, keyring = lab_image("bare"), aptrepo.public_keyring_b64()
        aptrepo.ensure_server(log)
        aptrepo.connect(lab)
    models = lab_models() if stage else {}
    result = UpResult(lab=lab, hosts=[s.name for s in specs], seconds=0.0, known_hosts=str(known_hosts))

    def one(spec: HostSpec) -> tuple[str, str]:
        how = _start_one(spec, image=bare_image if spec.bare else image, mode=mode, network=network,
                         public_key=public_key, apt_keyring_b64=keyring if spec.bare else "")
        what = "bare" if spec.bare else f"driver {spec.driver}"
        log(f"{spec.name}: {how} ({spec.gpu} x{spec.gpu_count}, {what}, ssh 127.0.0.1:{spec.port})")
        wait_ready(spec, timeout=timeout)
        if stage:
            stage_models(spec.container, models)
        log(f"{spec.name}: ready")
        return how, host_pubkeys(spec)

    with ThreadPoolExecutor(max_workers=min(8, len(specs))) as pool:
        outcomes = dict(zip([s.name for s in specs], pool.map(one, specs), strict=True))
    record_host_keys(known_hosts, specs, {n: pk for n, (_, pk) in outcomes.items()})
    result.started = [n for n, (how, _) in outcomes.items() if how != "running"]
    result.already_running = [n for n, (how, _) in outcomes.items() if how == "running"]
    result.seconds = round(time.monotonic() - t0, 2)
    return result


def all_labs() -> dict[str, int]:
    """Every lab on this engine (tests' labs included) and its number of hosts."""
    counts: dict[str, int] = {}
    for cont in docker.containers(LABEL):
        name = cont.labels.get(LABEL, "")
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def lab_containers(lab: str) -> list[docker.Container]:
    return docker.containers(f"{LABEL}={lab}")


def down(lab: str, *, names: Iterable[str] | None = None, known_hosts: Path | None = None,
         log: Log = lambda m: None) -> list[str]:
    """Remove the lab's host containers, their volumes, and (when all go) its network."""
    rows = lab_containers(lab)
    wanted = set(names or [])
    gone = []
    ports = []
    for row in rows:
        host = row.labels.get(HOST_LABEL, row.name)
        if wanted and host not in wanted:
            continue
        ports.append(row.labels.get(PORT_LABEL))
        gone.append(row.name)
    if gone:
        docker.run(["rm", "-f", "-v", *gone], timeout=120)
        docker.run(["volume", "rm", "-f", *[f"{c}-docker" for c in gone]], check=False, timeout=60)
        log(f"removed {len(gone)} host(s): {', '.join(gone)}")
    if not wanted and docker.inspect("network", lab):
        for shared in (REGISTRY_CONTAINER, "llmfleet-aptrepo"):  # the registry and the package repository stay
            if _container_state(shared):
                docker.run(["network", "disconnect", "-f", lab, shared], check=False)
        docker.run(["network", "rm", lab], check=False)
    if known_hosts and known_hosts.exists():
        text = known_hosts.read_text()
        for p in ports:
            if p and p.isdigit():
                text = merge_known_hosts(text, int(p), [])
        record = known_hosts.with_name(known_hosts.name + f".tmp{os.getpid()}")
        fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(record, known_hosts)
    return gone


def _mem_mib(containers: list[str]) -> dict[str, float]:
    return {name: round(size / 1048576, 1) for name, size in docker.memory_usage(containers).items()}


def status(lab: str, *, memory: bool = True) -> list[HostState]:
    rows = lab_containers(lab)
    states = []
    running = []
    for row in rows:
        nets = (row.info.get("NetworkSettings") or {}).get("Networks") or {}
        port = row.labels.get(PORT_LABEL)
        st = HostState(name=row.labels.get(HOST_LABEL, row.name), container=row.name, state=row.state,
                       port=int(port) if port and port.isdigit() else None,
                       ip=(nets.get(lab) or {}).get("IPAddress") or None,
                       gpu=row.labels.get(GPU_LABEL))
        if row.state == "running":
            running.append(row.name)
            st.ssh = _ssh_banner(st.port) if st.port else False
        states.append(st)
    mem = _mem_mib(running) if memory else {}
    for st in states:
        st.mem_mib = mem.get(st.container)
    return sorted(states, key=lambda s: s.name)


def set_driver_dead(container: str, dead: bool) -> None:
    """Make the host's nvidia-smi simulator fail like a dead driver (or recover)."""
    exec_(container, ["touch", SIM_DEAD_FLAG] if dead else ["rm", "-f", SIM_DEAD_FLAG])


def gpu_faults_text(faults: dict[int | str, dict] | None) -> str | None:
    """The simulator's faults file for ``{gpu index: {fault: value}}`` (``nvidia_smi_sim.FAULT_KEYS``);
    None: no fault. Pure; a key the simulator does not know is a usage error."""
    if not faults:
        return None
    out: dict[str, dict] = {}
    for gpu, f in faults.items():
        if not str(gpu).isdigit() or not isinstance(f, dict):
            raise UsageError(f"GPU faults: {gpu!r}: write {{GPU index: {{fault: value}}}}")
        unknown = sorted(set(f) - set(FAULT_KEYS))
        if unknown:
            raise UsageError(f"GPU faults: GPU {gpu}: unknown fault {', '.join(unknown)}; known: {', '.join(FAULT_KEYS)}")
        out[str(int(gpu))] = f
    return json.dumps(out, sort_keys=True)


def set_gpu_faults(container: str, faults: dict[int | str, dict] | None) -> None:
    """Inject hardware faults into the host's simulated cards (nvidia-smi, dmesg and lspci simulators read
    them at every call), or clear them all (None or empty)."""
    text = gpu_faults_text(faults)
    if text is None:
        exec_(container, ["rm", "-f", FAULTS_PATH])
        return
    exec_(container, ["sh", "-c", f"cat > {FAULTS_PATH}.new && mv {FAULTS_PATH}.new {FAULTS_PATH}"],
          input=text.encode())
