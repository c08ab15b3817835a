"""A service over several hosts: what the head and each worker run, and how to tell the workers joined.

Pure. The engines' own distributed runtimes, nothing home-made:

- llama.cpp: ``rpc-server --host ADDR --port PORT`` on each worker (tools/rpc/README.md), and
  ``llama-server --rpc w1:PORT,w2:PORT`` on the head. A worker has joined when the head's log names
  its RPC device (``using device RPC0 (ADDR:PORT) ...``, src/llama.cpp; printed only at higher log
  verbosity in newer builds) or when the worker holds an established connection from the head's
  address to its rpc-server (the head keeps one open per endpoint while its model is loaded).
- vLLM: a Ray cluster (docs/serving/parallelism_scaling.md, examples/online_serving/run_cluster.sh):
  ``ray start --head --node-ip-address=HEAD --port=6379`` then ``vllm serve`` on the head, ``ray start
  --block --address=HEAD:6379`` on each worker; host networking, the host's IPC namespace, VLLM_HOST_IP,
  NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME. The join check counts Ray's live nodes.

Both runtimes accept anyone who reaches their ports: every address here is a host's address on the
private cluster network (``services.cluster_address_problem`` refuses the rest).
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.health import watchdog
from llmfleet.images.lock import ImageRef
from llmfleet.inventory.services import HostSettings, Service, cluster_address_problem
from llmfleet.knowledge import engines
from llmfleet.knowledge.engines import EngineKnowledge
from llmfleet.release import render as R
from llmfleet.release.store import Paths

WORKER_TEMPLATE = "worker.yml.j2"
ROLE_LABEL = "io.llmfleet.role"


@dataclass(frozen=True)
class Member:
    """One host of a multi-host service: its inventory name and its address on the cluster network."""

    host: str
    address: str
    interface: str | None = None


@dataclass(frozen=True)
class Cluster:
    """Who runs what: the head (serves the API) and the workers, in the inventory's order."""

    service: str
    kind: str  # the engine's runtime (engines' cluster_kind): rpc | ray
    port: int
    head: Member
    workers: tuple[Member, ...]

    @property
    def runtime(self) -> EngineKnowledge:
        """The engine whose runtime this is: what differs by it is asked of its knowledge."""
        return engines.for_cluster_kind(self.kind)

    @property
    def size(self) -> int:
        return 1 + len(self.workers)

    @property
    def hosts(self) -> list[str]:
        """Every host of the service in the fixed order locks are taken in (sorted by name)."""
        return sorted([self.head.host, *(w.host for w in self.workers)])

    def endpoint(self, member: Member) -> str:
        return f"{_host_part(member.address)}:{self.port}"

    @property
    def endpoints(self) -> list[str]:
        """The workers' rpc-server endpoints, in the workers' order (the order of ``--rpc``)."""
        return [self.endpoint(w) for w in self.workers]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "port": self.port, "head": self.head.__dict__,
                "workers": [w.__dict__ for w in self.workers]}


def _host_part(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def multihost_engines(roles_dir: R.Dirs = None) -> list[str]:
    """Engines whose role describes a cluster (``cluster:`` in its defaults.yml)."""
    return [e for e in R.known_roles(roles_dir) if R.load_role(e, roles_dir).cluster.get("kind")]


def cluster_port(service: Service, role: R.Role) -> int:
    return int(service.cluster_port or role.cluster["port"])


def member_for(host: str, settings: HostSettings, discovered: str | None = None) -> Member:
    """A host's cluster address: ``llmfleet_cluster_address``, else the address read from
    ``llmfleet_cluster_interface`` on the host (``discovered``). Raises a usage error naming the fix."""
    address = settings.cluster_address or discovered
    if address is None:
        if settings.cluster_interface:
            raise UsageError(f"host {host}: interface {settings.cluster_interface} "
                             f"(llmfleet_cluster_interface) has no IPv4 address")
        raise UsageError(f"host {host}: a multi-host service needs the host's address on the private cluster "
                         "network: set llmfleet_cluster_address (an IP) or llmfleet_cluster_interface (a NIC)")
    problem = cluster_address_problem(address)
    if problem:
        src = "llmfleet_cluster_address" if settings.cluster_address else (
            f"the address of llmfleet_cluster_interface {settings.cluster_interface}")
        raise UsageError(f"host {host}: {src}: {problem}")
    return Member(host, str(ipaddress.ip_address(address)), settings.cluster_interface)


def rpc_image_problem(service: Service, catalog: Any = None) -> str | None:
    """A llama.cpp service with workers on an image the engine catalog says has no RPC worker (or no
    RPC backend in its llama-server): one line naming the service, the image and the fix. None when
    every image of the service ships it or is not known either way (the workers' start tells then)."""
    if catalog is None:
        from llmfleet.knowledge.compat import load_engine_catalog

        catalog = load_engine_catalog()
    for field, key in (("image", service.image), ("worker_image", service.worker_image or service.image)):
        rel = catalog.release(key)
        rpc = getattr(rel, "rpc_server", None)
        if rpc is not None and not rpc.ships:
            return (f"service {service.name}: {field} {key} has no rpc-server / RPC backend (engine catalog: "
                    f"{rpc.source}), which a llama.cpp service with workers needs on the head and every worker: "
                    "use an image built with -DGGML_RPC=ON that ships /app/rpc-server (catalog rpc_server.ships: "
                    "true, e.g. llamacpp:b5000-cu122 from dockerfiles/llamacpp-cuda), or remove workers")
    return None


def make_cluster(service: Service, role: R.Role, head: Member, workers: list[Member]) -> Cluster:
    kind = role.cluster.get("kind")
    if not kind:
        raise UsageError(f"service {service.name}: the {service.engine} role has no multi-host support "
                         "(no cluster: section); remove workers")
    if not workers:
        raise UsageError(f"service {service.name}: no workers")
    if engines.for_cluster_kind(str(kind)).checks_worker_image:
        problem = rpc_image_problem(service)
        if problem:
            raise UsageError(problem)
    return Cluster(service.name, str(kind), cluster_port(service, role), head, tuple(workers))


# ---------------------------------------------------------------------------------------------
# Addresses read on the hosts


def address_script(interface: str) -> str:
    """The interface's first global IPv4 address (one line ``@@addr A.B.C.D`` or ``@@addr`` for none)."""
    return (f"a=$(ip -4 -o addr show dev {shlex.quote(interface)} scope global 2>/dev/null "
            "| awk '{print $4}' | head -n 1); echo \"@@addr ${a%%/*}\"")


def parse_address(stdout: str) -> str | None:
    for line in stdout.splitlines():
        if line.startswith("@@addr"):
            value = line[6:].strip()
            return value or None
    return None


# ---------------------------------------------------------------------------------------------
# Rendering


def _env(cluster: Cluster, member: Member) -> dict[str, str]:
    return cluster.runtime.cluster_env(member.address, member.interface)


def _has(args: list[str], role: R.Role, name: str) -> bool:
    f = role.flag(name)
    names = set(f.names) if f else {name}
    return any(a.split("=", 1)[0] in names for a in args)


def ray_head_command(cluster: Cluster, role: R.Role) -> str:
    """The head container's shell: start Ray's head, wait (bounded) until every worker joined, then
    exec the OpenAI server with the container's arguments ("$@")."""
    c = role.cluster
    ray, py = str(c.get("ray", "ray")), str(c.get("python", "python3"))
    server = " ".join(shlex.quote(str(a)) for a in c.get("server", ["python3", "-m",
                                                                     "vllm.entrypoints.openai.api_server"]))
    tries = max(1, int(c.get("join_timeout_s", 600)) // 5)
    count = (f"{py} -c 'import ray; ray.init(address=\"auto\", logging_level=\"ERROR\"); "
             "print(sum(1 for n in ray.nodes() if n[\"Alive\"]))' 2>/dev/null")
    return "\n".join([
        "set -e",
        f"{ray} start --head --node-ip-address={cluster.head.address} --port={cluster.port} --disable-usage-stats",
        "i=0",
        f"until [ \"$({count} || echo 0)\" -ge {cluster.size} ]; do",
        f"  i=$((i+1)); if [ $i -gt {tries} ]; then echo 'llmfleet: Ray nodes missing after "
        f"{tries * 5} s (want {cluster.size})' >&2; exit 1; fi",
        "  sleep 5",
        "done",
        f"echo 'llmfleet: Ray cluster has {cluster.size} nodes'",
        f"exec {server} \"$@\"",
    ])


def head_overlay(service: Service, role: R.Role, cluster: Cluster, plan_args: list[str]) -> R.HeadOverlay:
    """What the head's render adds for its workers: the engine's flags for them; where the workers join
    the head's runtime (Ray), the head's container starts it and waits for them first."""
    merged = list(plan_args) + list(service.engine_args)
    runtime = cluster.runtime
    args = runtime.cluster_head_args(endpoints=cluster.endpoints, size=cluster.size,
                                     given=lambda flag: _has(merged, role, flag))
    if not runtime.workers_join_head:
        return R.HeadOverlay(args=tuple(args))
    return R.HeadOverlay(args=tuple(args), entrypoint=("/bin/sh", "-c", ray_head_command(cluster, role),
                                                       "llmfleet-ray-head"),
                         environment=tuple(sorted(_env(cluster, cluster.head).items())), host_network=True)


def worker_argv(cluster: Cluster, member: Member, role: R.Role) -> tuple[list[str] | None, list[str]]:
    """(entrypoint, command) of a worker's container: the worker server on its port (the head connects
    to it), or (the workers join the head) a wait for the head's runtime port, then the runtime."""
    if not cluster.runtime.workers_join_head:
        entry = [str(a) for a in role.cluster.get("worker_entrypoint", ["/app/rpc-server"])]
        return entry, ["--host", member.address, "--port", str(cluster.port)]
    c = role.cluster
    ray, py = str(c.get("ray", "ray")), str(c.get("python", "python3"))
    tries = max(1, int(c.get("join_timeout_s", 600)) // 5)
    head = f"{_host_part(cluster.head.address)}:{cluster.port}"
    # Workers start before the head (deploy order): wait, bounded, until the head's Ray port answers.
    probe = (f"{py} -c 'import socket; socket.create_connection((\"{cluster.head.address}\", {cluster.port}), 3)'"
             " 2>/dev/null")
    cmd = "\n".join([
        "i=0",
        f"until {probe}; do",
        f"  i=$((i+1)); if [ $i -gt {tries} ]; then echo 'llmfleet: Ray head {head} not reachable' >&2; exit 1; fi",
        "  sleep 5",
        "done",
        f"exec {ray} start --block --address={head} --node-ip-address={member.address} --disable-usage-stats",
    ])
    return ["/bin/sh", "-c", cmd], []


def render_worker(service: Service, settings: HostSettings, image: ImageRef, cluster: Cluster, member: Member,
                  *, roles_dir: R.Dirs = None, templates_dir: R.Dirs = None) -> R.Rendered:
    """One worker's release: compose (the role's ``templates/worker.yml.j2``) with the service's
    ``compose_overrides`` as its second file, as on the head (e.g. a memlock limit the hosts need), the
    unit, an empty env file.

    Its watchdog (``watchdog.worker_script_text``) judges what a worker has instead of HTTP /health:
    its container runs and, for rpc-server, its port accepts a connection on the cluster address."""
    role = R.load_role(service.engine, roles_dir)
    if role.worker_template is None:
        raise UsageError(f"service {service.name}: the {service.engine} role has no templates/{WORKER_TEMPLATE}")
    entry, command = worker_argv(cluster, member, role)
    box = R.container_settings(role, service)
    gpu_request: Any = "all" if service.gpus == "all" else [int(g) for g in service.gpus]
    ctx = {
        "service_name": service.name,
        "engine": service.engine,
        "project": R.project_name(service),
        "container": R.project_name(service),
        "image": image.pull_ref,
        "entrypoint": entry,
        "args": command,
        "environment": dict(sorted((box["environment"] | dict(service.env) | _env(cluster, member)).items())),
        "model_path": service.model_path,
        "model_target": role.model_target,
        "gpu_request": gpu_request,
        "log_max_size": R.LOG_MAX_SIZE,
        "log_max_file": R.LOG_MAX_FILE,
        "user": box["user"],
        "ulimits": box["ulimits"],
        "cache_volume": box["cache_volume"],
        "cache_target": box["cache_target"],
        "head": cluster.head.host,
        "endpoint": cluster.endpoint(member),
    }
    compose_text = R._template(role.worker_template).render(**ctx)
    unit_text = R._template(R.template_text("llmfleet-service.unit.j2", templates_dir)).render(
        service_name=service.name,
        engine=f"{service.engine} worker (head {cluster.head.host})",
        unit_path=f"{R.UNIT_DIR}/{R.unit_name(service)}",
        service_dir=R.service_dir(settings, service),
        project=R.project_name(service),
        container=R.project_name(service),
        compose_files=[R.COMPOSE_FILE] + ([R.COMPOSE_OVERRIDE_FILE] if service.compose_overrides else []),
        docker=R.DOCKER,
        start_interval=600,
        start_burst=5,
        restart_sec=10,
        timeout_start=service.health.load_timeout_s + 120,
        timeout_stop=R.UNIT_STOP_TIMEOUT_S,
    )
    env_text = R._template(R.template_text("service.env.j2", templates_dir)).render(service_name=service.name,
                                                                                     secrets={})
    unit_file = R.unit_name(service)
    files = {R.COMPOSE_FILE: compose_text, unit_file: unit_text, R.ENV_FILE: env_text}
    modes = {R.COMPOSE_FILE: 0o644, unit_file: 0o644, R.ENV_FILE: 0o600}
    if service.compose_overrides:  # the service's container settings hold for its workers' containers too
        files[R.COMPOSE_OVERRIDE_FILE], modes[R.COMPOSE_OVERRIDE_FILE] = R.compose_override_text(service), 0o644
    for name, (text, mode) in watchdog.worker_release_files(service, settings, kind=cluster.kind,
                                                            address=member.address, port=cluster.port).items():
        files[name], modes[name] = text, mode
    inputs = R.service_inputs(service) | {"cluster": cluster.to_dict(), "role": "worker"}
    return R.Rendered(service=service.name, engine=service.engine, files=files, modes=modes,
                      secret_files=frozenset({R.ENV_FILE}), engine_args=[*(entry or []), *command], image=image,
                      content_hash=R.content_hash(files), inputs=inputs, plan=None)


# ---------------------------------------------------------------------------------------------
# Did every worker join? (run on the hosts; parsed here)


def worker_probe_script(paths: Paths, member: Member, port: int, kind: str) -> str:
    """A worker's unit state, and (a worker that serves a port: rpc-server) whether it accepts
    connections on ADDR:PORT."""
    lines = [f"echo \"@@unit $(systemctl is-active {shlex.quote(paths.unit)} 2>/dev/null)\""]
    if engines.for_cluster_kind(kind).worker_serves_port:
        addr = shlex.quote(member.address)
        lines.append(f"if timeout 3 bash -c \"exec 3<>/dev/tcp/{addr}/{int(port)}\" 2>/dev/null; "
                     "then echo '@@port open'; else echo '@@port closed'; fi")
    return "\n".join(lines)


def parse_worker_probe(stdout: str) -> tuple[str, bool | None]:
    unit, port = "unknown", None
    for line in stdout.splitlines():
        if line.startswith("@@unit"):
            unit = line[6:].strip() or "unknown"
        elif line.startswith("@@port"):
            port = line[6:].strip() == "open"
    return unit, port


# ---------------------------------------------------------------------------------------------
# Can the head reach its workers? (run on the head before it switches; parsed here)

REACH_TIMEOUT_S = 3


def reach_targets(cluster: Cluster) -> list[tuple[str, str, int]]:
    """(worker host, address, port) the head must reach before it switches. llama.cpp: each worker's
    rpc-server endpoint (the head's llama-server connects to it). Ray: none, since its worker ports
    (node manager, object manager) and NCCL's are picked at random on the workers, so no fixed port is
    rendered to check; the workers reach the head's Ray port themselves (their start waits for it)."""
    if not cluster.runtime.worker_serves_port:
        return []
    return [(w.host, w.address, cluster.port) for w in cluster.workers]


def reach_script(targets: list[tuple[str, str, int]], timeout_s: int = REACH_TIMEOUT_S) -> str:
    """On the head: a bounded TCP connect to every worker endpoint (bash's /dev/tcp under timeout(1);
    no Python on the host). One line per target, by its index: ``@@reach N ok|refused|timeout|
    unreachable|error|unchecked [detail]``; exits 3 when one is not reachable (so a chained round trip
    stops before the head's release is touched). ``unchecked``: bash or timeout(1) missing. Only the
    address (an IP, ``member_for`` checked it) and the port reach the script, quoted."""
    t = int(timeout_s)
    lines = ["bad=0"]
    for i, (_host, addr, port) in enumerate(targets):
        connect = shlex.quote(f"exec 3<>/dev/tcp/{addr}/{int(port)}")
        lines += [
            f"err=$(timeout {t} bash -c {connect} 2>&1 </dev/null); rc=$?",
            "err=$(printf '%s' \"$err\" | tr '\\n' ' ' | cut -c1-200)",
            "case \"$rc:$err\" in",
            f"  0:*) echo '@@reach {i} ok' ;;",
            f"  124:*|137:*) echo '@@reach {i} timeout'; bad=1 ;;",
            f"  126:*|127:*) echo \"@@reach {i} unchecked $err\" ;;",
            f"  *[Rr]efused*) echo '@@reach {i} refused'; bad=1 ;;",
            f"  *[Nn]o\\ route*|*[Uu]nreachable*) echo \"@@reach {i} unreachable $err\"; bad=1 ;;",
            f"  *) echo \"@@reach {i} error $err\"; bad=1 ;;",
            "esac",
        ]
    lines.append('if [ "$bad" != 0 ]; then exit 3; fi')
    return "\n".join(lines)


@dataclass(frozen=True)
class Reach:
    host: str
    address: str
    port: int
    status: str  # ok | refused | timeout | unreachable | error | unchecked | missing
    detail: str = ""

    @property
    def endpoint(self) -> str:
        return f"{_host_part(self.address)}:{self.port}"


def parse_reach(stdout: str, targets: list[tuple[str, str, int]]) -> list[Reach]:
    """``reach_script`` output -> one ``Reach`` per target, in the targets' order (``missing``: no line
    came back for it, e.g. the connection dropped)."""
    seen: dict[int, tuple[str, str]] = {}
    for line in stdout.splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[0] == "@@reach" and parts[1].isdigit():
            seen.setdefault(int(parts[1]), (parts[2], parts[3].strip() if len(parts) > 3 else ""))
    out = []
    for i, (h, a, p) in enumerate(targets):
        status, detail = seen.get(i, ("missing", ""))
        out.append(Reach(h, a, int(p), status, detail))
    return out


def reach_failure(head: str, reach: list[Reach], head_address: str) -> str | None:
    """One line for the first worker the head cannot reach (None when every one answered or could not
    be checked): what failed and the fix."""
    for r in reach:
        if r.status in ("ok", "unchecked"):
            continue
        why = r.status + (f": {r.detail}" if r.detail else "")
        return (f"head {head} cannot reach worker {r.host} at {r.endpoint} ({why}): open TCP port {r.port} on "
                f"{r.host} to {head_address} (firewall), or set {r.host}'s llmfleet_cluster_address to an address "
                f"{head} reaches")
    return None


_RPC_DEVICE = re.compile(r"using device (RPC\d+) \(([^)]*)\)")


def rpc_devices(log_text: str) -> dict[str, str]:
    """RPC devices the head's llama-server uses, from its log: device name -> description (the
    endpoint, ``ADDR:PORT``). The last load wins (the log may hold earlier starts)."""
    found: dict[str, str] = {}
    for line in log_text.splitlines():
        m = _RPC_DEVICE.search(line)
        if m:
            if m.group(1) in found and m.group(1) == "RPC0":
                found = {}
            found[m.group(1)] = m.group(2).strip()
    return found


def missing_rpc_workers(cluster: Cluster, devices: dict[str, str]) -> list[str]:
    """Workers whose endpoint no RPC device of the head names."""
    seen = " ".join(devices.values())
    return [w.host for w in cluster.workers if cluster.endpoint(w) not in seen]


def rpc_log_script(paths: Paths, lines: int = 400) -> str:
    """The head's recent log lines that name RPC devices (journal, else the container log)."""
    n = int(lines)
    return "\n".join([
        f"out=$(journalctl -u {shlex.quote(paths.unit)} -n {n} --no-pager -o cat 2>/dev/null || true)",
        f"[ -n \"$out\" ] || out=$(docker logs --tail {n} {shlex.quote(paths.container)} 2>&1 || true)",
        "printf '%s\\n' \"$out\" | grep -a -E 'using device RPC' || true",  # -a: a log is text, NULs or not
        "echo '@@end'",
    ])


def rpc_peers_script(port: int) -> str:
    """On a worker: the peers of every established connection to its rpc-server's port (the head's
    llama-server keeps one open per RPC endpoint while its model is loaded)."""
    return (f"ss -Htn state established '( sport = :{int(port)} )' 2>/dev/null | awk '{{print \"@@peer \" $4}}'\n"
            "echo '@@end'")


def parse_rpc_peers(stdout: str) -> list[str]:
    """Peer addresses (no port; IPv4-mapped IPv6 unwrapped) from ``rpc_peers_script``."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("@@peer "):
            addr = line[7:].strip().rsplit(":", 1)[0].strip("[]")
            out.append(addr.removeprefix("::ffff:"))
    return out


def ray_nodes_script(paths: Paths, python: str = "python3") -> str:
    """Ray's live node count, asked inside the head's container."""
    code = ("import ray; ray.init(address='auto', logging_level='ERROR'); "
            "print('@@nodes', sum(1 for n in ray.nodes() if n['Alive']))")
    return f"docker exec {shlex.quote(paths.container)} {shlex.quote(python)} -c {shlex.quote(code)} 2>&1 | tail -n 3"


def parse_ray_nodes(stdout: str) -> int | None:
    for line in stdout.splitlines():
        if line.startswith("@@nodes"):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None
