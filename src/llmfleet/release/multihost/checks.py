"""Is every worker there: a worker's start check (its unit active and, for rpc-server, its port open
on the host itself), the head reaching every worker's endpoint before it switches (one bounded TCP
connect each, one round trip), and the join check once the head is healthy (llama.cpp: each worker an
RPC device in the head's log, or connected from the head's address; vLLM: Ray's live node count)."""

from __future__ import annotations

import time
from collections.abc import Callable

from llmfleet.errors import RemoteError
from llmfleet.health import check as health
from llmfleet.release import cluster as C
from llmfleet.release.executor import HealthFn, HealthTarget, HostRun, short
from llmfleet.release.pipeline import HostSlot
from llmfleet.release.render import load_role

# ---------------------------------------------------------------------------------------------
# Worker health: the unit runs and (rpc) its port answers from the host itself


WORKER_POLL_S = 0.5


def worker_health(member: C.Member, port: int, kind: str,
                  others: dict[str, tuple[str, int]] | None = None) -> HealthFn:
    """A worker's start check; ``others``: the endpoint of another release (the previous one, when going
    back) by release id: it listens where its own render put it, which a deploy may have changed."""
    def check(run: HostRun, target: HealthTarget) -> health.HealthReport:
        addr, p = (others or {}).get(target.release_id, (member.address, port))
        return _worker_check(run, target, C.Member(member.host, addr, member.interface), p, kind)

    return check


def _worker_check(run: HostRun, target: HealthTarget, member: C.Member, port: int, kind: str) -> health.HealthReport:
    t0 = time.monotonic()
    deadline = t0 + target.service.health.stage_timeout_s
    unit, port_open = "unknown", None
    while True:
        res = run.run(C.worker_probe_script(target.paths, member, port, kind), timeout=30)
        unit, port_open = C.parse_worker_probe(res.stdout)
        if unit == "active" and port_open is not False:
            break
        if unit == "failed" or time.monotonic() > deadline:
            break
        time.sleep(WORKER_POLL_S)
    ok = unit == "active" and port_open is not False
    what = f"unit {unit}" + ("" if port_open is None else
                             f", {member.address}:{port} {'accepts connections' if port_open else 'closed'}")
    stage = health.StageResult("worker", ok, round(time.monotonic() - t0, 2), what)
    return health.HealthReport(ok, [stage])


# ---------------------------------------------------------------------------------------------
# From the head: its workers reachable before it switches, joined once it runs


def reach_workers(hh: HostSlot, cluster: C.Cluster) -> str | None:
    """From the head, once the workers run their new release and before the head switches: a bounded
    TCP connect to every worker endpoint (``cluster.reach_script``, one round trip); a failure's reason
    (nothing switched on the head: it is armed, and going back disarms it). Nothing to check when the
    cluster renders no fixed worker port (Ray)."""
    targets = C.reach_targets(cluster)
    if not targets:
        return None
    try:
        with hh.run.stage(f"{cluster.service}: head reaches workers"):
            res = hh.run.run(C.reach_script(targets), timeout=60)
    except RemoteError as exc:
        return f"{hh.name}: {exc}"
    reach = C.parse_reach(res.stdout, targets)
    failure = C.reach_failure(hh.name, reach, cluster.head.address)
    if failure is None and res.rc != 0:
        failure = f"{hh.name}: the check of the workers' ports failed (exit {res.rc}): {short(res.stderr or res.stdout, 200)}"
    if failure is None:
        said = ", ".join(f"{r.host} {r.endpoint} {r.status}" + (f" ({r.detail})" if r.detail else "") for r in reach)
        hh.run.log(f"{cluster.service}: head reaches its workers: {said}")
    return failure


def join_check(cluster: C.Cluster) -> Callable[[HostSlot, C.Cluster, dict[str, HostSlot]],
                                                tuple[bool, str, dict[str, object]]]:
    """How the head learns its workers joined: the engine's runtime says who connects to whom."""
    return _joined_ray if cluster.runtime.workers_join_head else _joined_rpc


def _joined_rpc(hh: HostSlot, cluster: C.Cluster, slots: dict[str, HostSlot]) -> tuple[bool, str, dict[str, object]]:
    """llama.cpp: the head's log names each worker's RPC device, or the worker holds an established
    connection from the head's address."""
    devices = C.rpc_devices(hh.run.run(C.rpc_log_script(hh.item.paths), timeout=30).stdout)
    peers: dict[str, list[str]] = {}
    for w in cluster.workers:
        peers[w.host] = C.parse_rpc_peers(slots[w.host].run.run(C.rpc_peers_script(cluster.port), timeout=30).stdout)
    missing = [h for h in C.missing_rpc_workers(cluster, devices) if cluster.head.address not in peers[h]]
    return (not missing, f"missing RPC devices of {', '.join(missing)}",
            {"rpc_devices": devices, "rpc_peers": peers, "missing": missing})


def _joined_ray(hh: HostSlot, cluster: C.Cluster, slots: dict[str, HostSlot]) -> tuple[bool, str, dict[str, object]]:
    """vLLM over Ray: Ray's live node count, asked in the head's container."""
    python = str(load_role(cluster.runtime.name).cluster.get("python", "python3"))
    nodes = C.parse_ray_nodes(hh.run.run(C.ray_nodes_script(hh.item.paths, python), timeout=60).stdout)
    return (nodes is not None and nodes >= cluster.size, f"Ray sees {nodes} live node(s), want {cluster.size}",
            {"ray_nodes": nodes, "want": cluster.size})
