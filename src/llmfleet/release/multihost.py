"""Deploy one service over several hosts: its workers first, then its head; one health verdict; one rollback.

A service with ``workers:`` (``llmfleet.release.cluster`` says what each host runs) is deployed as a unit:

1. prepare (no SSH): the service with this run's overrides, its secret, the image each host pulls;
2. connect to every host of the service; read each host's cluster address (``llmfleet_cluster_address``
   or the IPv4 address of ``llmfleet_cluster_interface``; a public, loopback or wildcard one refuses);
   gather facts on every host; the head's preflight with the plan over all hosts, and
   ``preflight.check_service_hosts`` over all of them (identical cards, drivers, GPU counts, network);
3. render the head's and each worker's release; ``decide`` per host; ``check``/``diff`` stop here;
4. take the deploy lock on every host in a fixed order (sorted host names: two deploys that share hosts
   cannot each hold half); pull on every host while the old releases still serve;
5. upload every host's release and arm every host's revert timer before the first switch (workers,
   then the head, whose timer fires last: ``confirm.cluster_timeouts``); switch the workers (each
   checked: unit active, and for rpc-server its port open on the host itself); then, from the head, a
   bounded TCP connect to every worker's rpc-server endpoint (``cluster.reach_script``, one round trip):
   a worker the head cannot reach stops the deploy there, before the head switches; then the head: its
   staged health check, and the join check (llama.cpp: each worker named as an RPC device in the
   head's log, or holding an established connection from the head's address to its rpc-server; vLLM:
   Ray's live node count, asked in the head's container); then every host confirmed, workers first
   (each confirmation starts that host's watchdog);
6. any failure after the first switch puts every host of the service back: workers first (the head
   needs them to start), then the head, each on its previous release (or stopped when it had none),
   each host's timer stopped just before it goes back; a head that had not switched yet is restarted
   on its release (its workers' old containers are gone);
7. last round trip per host: health marks, prune, audit lines, unlock.

Steps 2 (connect), 3's diff and check, 4 and 7 are ``pipeline``'s stages, the same as a single host's;
the decisions across hosts (lock order, workers first, what a worker change means for the head, when a
head that never switched is restarted going back, the set's result) are ``decide``'s. This module is
the gather (2-3) and the switch (5-6) of a head and its workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from llmfleet import __version__
from llmfleet.errors import LlmfleetError, RemoteError, UsageError
from llmfleet.health import check as health
from llmfleet.images import lock as images
from llmfleet.inventory.ansible import Host, Inventory, load_inventory, settings_for
from llmfleet.inventory.services import HostSettings, Service, resolve_workers
from llmfleet.knowledge import release_state
from llmfleet.knowledge.engines import for_engine
from llmfleet.knowledge.planner import Plan, summarize
from llmfleet.knowledge.release_state import Manifest
from llmfleet.release import cluster as C
from llmfleet.release import decide, pipeline, store
from llmfleet.release.decide import Action, GoBack, HostOutcome, Refusal, Result, ServiceOutcome, ServiceStep
from llmfleet.release.executor import HealthFn, HealthTarget, HostRun, Log, connect, http_health, short
from llmfleet.release.manifest import build as manifest_build
from llmfleet.release.pipeline import Connector, HostSlot, Item
from llmfleet.release.prepare import DeployOptions, Prepared, PreparedHost, apply_overrides
from llmfleet.release.render import load_role, render, search_paths
from llmfleet.release.secret import resolve_secret
from llmfleet.release.store import Paths
from llmfleet.settings import Settings

WORKER_POLL_S = 0.5


# ---------------------------------------------------------------------------------------------
# Which services span hosts (pure over a loaded inventory)


def workers_of(inv: Inventory, head: str, service: Service, roles_dir: Any = None) -> list[str]:
    """The service's worker hosts (groups expanded, inventory order); a usage error names the fix."""
    def group_hosts(name: str) -> list[str] | None:
        return inv.group_hosts(name) if name in inv.groups else None

    try:
        return resolve_workers(service, head, list(inv.hosts), group_hosts, C.multihost_engines(roles_dir))
    except ValueError as exc:
        where = inv.hosts[head].sources.get("llmfleet_services", str(inv.path)) if head in inv.hosts else inv.path
        raise UsageError(f"{where}: host {head}: service {service.name}: {exc}") from None


def worker_conflicts(service: Service, worker: str, settings: HostSettings, port: int) -> list[str]:
    """A worker's own services that collide with the multi-host service (same name, or the cluster port)."""
    out = []
    for s in settings.services:
        if s.name == service.name:
            out.append(f"host {worker} has a service of its own named {service.name}; a worker release "
                       "of the same name would replace it: rename one")
        elif s.port == port:
            out.append(f"host {worker}: service {s.name} uses port {port}, the cluster port of {service.name}; "
                       "set cluster_port")
    return out


# ---------------------------------------------------------------------------------------------
# Preparation (before any SSH)


@dataclass(frozen=True)
class WorkerPrep:
    host: Host
    settings: HostSettings
    image: images.ImageRef


@dataclass(frozen=True)
class PreparedService:
    inventory: Inventory
    head: PreparedHost  # with exactly this service
    workers: tuple[WorkerPrep, ...]

    @property
    def service(self) -> Service:
        return self.head.services[0].service

    @property
    def names(self) -> list[str]:
        return [self.head.host.name, *(w.host.name for w in self.workers)]


def prepare_service(inventory: Inventory | str, head: str, service: str, settings: Settings,
                    options: DeployOptions) -> PreparedService:
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    host = inv.hosts.get(head)
    if host is None:
        raise UsageError(f"{inv.path}: no host {head!r}")
    hs = settings_for(host)
    found = next((s for s in hs.services if s.name == service), None)
    if found is None:
        from llmfleet.suggest import did_you_mean

        names = [s.name for s in hs.services]
        raise UsageError(f"{inv.path}: host {head} has no service {service!r}{did_you_mean(service, names)} "
                         f"(services: {', '.join(names) or 'none'})")
    where = f"host {head}: service {service}"
    svc = apply_overrides(found, options.overrides, where)
    names = workers_of(inv, head, svc)
    role = load_role(svc.engine)
    port = C.cluster_port(svc, role)
    if for_engine(svc.engine).checks_worker_image:  # before any SSH: an image known to lack rpc-server
        problem = C.rpc_image_problem(svc)
        if problem:
            where_file = host.sources.get("llmfleet_services", str(inv.path))
            raise UsageError(f"{where_file}: host {head}: {problem}")
    key = resolve_secret(svc.api_key, where)
    cache: dict[str, images.ImageLock] = {}

    def image_for(h: Host, s: HostSettings, image_key: str) -> images.ImageRef:
        path = images.lock_path_for(h.vars, inv.path, settings.images_lock)
        if str(path) not in cache:
            cache[str(path)] = images.load_lock(path)
        return images.resolve(image_key, cache[str(path)], mirrors=dict(s.image_mirrors),
                              allow_unpinned=options.allow_unpinned, where=f"host {h.name}: service {service}")

    head_ref = image_for(host, hs, svc.image)
    workers = []
    problems: list[str] = []
    for n in names:
        wh = inv.hosts[n]
        ws = settings_for(wh)
        problems += worker_conflicts(svc, n, ws, port)
        workers.append(WorkerPrep(wh, ws, image_for(wh, ws, svc.worker_image or svc.image)))
    if problems:
        raise UsageError(f"{inv.path}: service {service}: {problems[0]}")
    ready = PreparedHost(inv, host, hs, (Prepared(svc, key, head_ref),))
    return PreparedService(inv, ready, tuple(workers))


def offline_cluster(inv: Inventory, head: str, service: Service) -> tuple[C.Cluster, dict[str, HostSettings], list[str]]:
    """The cluster as far as the inventory tells it, for ``invoke render`` (no connection): an address
    read from an interface at deploy time is shown as ``<eth0 of HOST>``. Returns the cluster, each
    worker's settings, and notes."""
    role = load_role(service.engine)
    notes: list[str] = []

    def member(name: str, s: HostSettings) -> C.Member:
        if s.cluster_address:
            return C.member_for(name, s)
        if s.cluster_interface:
            notes.append(f"{name}: its address is read from {s.cluster_interface} at deploy time; shown as a placeholder")
            return C.Member(name, f"<{s.cluster_interface} of {name}>", s.cluster_interface)
        raise UsageError(f"host {name}: service {service.name} spans hosts: set llmfleet_cluster_address or "
                         "llmfleet_cluster_interface")

    workers = workers_of(inv, head, service)
    wsettings = {w: settings_for(inv.hosts[w]) for w in workers}
    cl = C.make_cluster(service, role, member(head, settings_for(inv.hosts[head])),
                        [member(w, wsettings[w]) for w in workers])
    return cl, wsettings, notes


# ---------------------------------------------------------------------------------------------
# The outcome


@dataclass
class ServiceRun:
    """What a deploy of one multi-host service did, on every host of it."""

    service: str
    head: str
    result: Result
    reason: str = ""
    hosts: dict[str, HostOutcome] = field(default_factory=dict)  # host -> its outcome (workers and head)
    cluster: dict[str, object] | None = None
    joined: dict[str, object] = field(default_factory=dict)  # the join check's evidence
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.result in decide.OK_RESULTS

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["hosts"] = {k: v.to_dict() for k, v in self.hosts.items()}
        return d

    def host_outcomes(self) -> list[HostOutcome]:
        """One outcome per host, each carrying the service's verdict (for the deploy table)."""
        out = []
        for name in [self.head, *[h for h in self.hosts if h != self.head]]:
            o = self.hosts.get(name) or HostOutcome(host=name, result=self.result)
            o.result = self.result
            role = "head" if name == self.head else f"worker of {self.head}"
            o.reason = f"{self.service} ({role}): {self.reason}"
            out.append(o)
        return out


# ---------------------------------------------------------------------------------------------
# Worker health: the unit runs and (rpc) its port answers from the host itself


def release_endpoint(state: release_state.ServiceState | None, release_id: str | None, host: str) -> tuple[str, int] | None:
    """(address, port) a worker's release listens on, from its manifest's cluster inputs; None if unknown."""
    info = state.releases.get(release_id) if state and release_id else None
    cl = (info.manifest.inputs.get("cluster") if info and info.manifest else None) or {}
    port = cl.get("port")
    me = next((w for w in cl.get("workers") or [] if isinstance(w, dict) and w.get("host") == host), None)
    if not isinstance(port, int) or not me or not isinstance(me.get("address"), str):
        return None
    return me["address"], port


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


def _join_check(cluster: C.Cluster) -> Callable[[HostSlot, C.Cluster, dict[str, HostSlot]],
                                                tuple[bool, str, dict[str, object]]]:
    """How the head learns its workers joined: the engine's runtime says who connects to whom."""
    return _joined_ray if cluster.runtime.workers_join_head else _joined_rpc


# ---------------------------------------------------------------------------------------------
# deploy: pipeline's stages, with this module's gather (every host's facts, the cluster preflight,
# each host's render) and switch (workers first, then the head, one verdict, every host back together)


def deploy_service(inventory: Inventory | str, head: str, service: str, *,
                   config: Settings | dict[str, object] | None = None, options: DeployOptions, log: Log,
                   prepared: PreparedService | None = None, head_health: HealthFn = http_health,
                   connector: Connector = connect) -> ServiceRun:
    """Deploy one multi-host service (see the module docstring). Never raises for host trouble:
    the result says what happened on every host; a usage error (bad inventory) raises before SSH."""
    settings = Settings.of(config)
    ready = prepared or prepare_service(inventory, head, service, settings, options)
    t0 = time.monotonic()
    res = ServiceRun(service=service, head=head, result=Result.FAILED)
    targets = [(ready.head.host, ready.head.settings, HostOutcome(host=head, result=Result.FAILED))]
    targets += [(w.host, w.settings, HostOutcome(host=w.host.name, result=Result.FAILED)) for w in ready.workers]
    slots = pipeline.run_hosts(targets, "deploy", lambda s: _deploy(ready, s, res, options, head_health),
                               settings=settings, log=log, verdict=res, who=options.who, message=options.message,
                               check=options.check, accept_new_host_keys=options.accept_new_host_keys,
                               service=service, head=head, prefix_log=True, connector=connector,
                               make_run=HostRun)
    for slot in slots.values():
        if slot.out.result == Result.FAILED and res.result != Result.FAILED:
            slot.out.result = res.result
        res.hosts[slot.name] = slot.out
    res.duration_s = round(time.monotonic() - t0, 3)
    return res


def _members(ready: PreparedService, slots: dict[str, HostSlot]) -> tuple[C.Member, list[C.Member]]:
    def member(name: str, s: HostSettings) -> C.Member:
        found = None
        if s.cluster_address is None and s.cluster_interface:
            found = C.parse_address(slots[name].run.run(C.address_script(s.cluster_interface), timeout=30).stdout)
        try:
            return C.member_for(name, s, found)
        except UsageError as exc:
            raise Refusal(Result.REFUSED, f"preflight failed: {exc}") from None

    head = member(ready.head.host.name, ready.head.settings)
    return head, [member(w.host.name, w.settings) for w in ready.workers]


def _cluster_preflight(ready: PreparedService, slots: dict[str, HostSlot], head_run: HostRun,
                       cluster: C.Cluster) -> list[Plan | None]:
    """Facts on every host of the service (one round trip each); the head's preflight with the plan over
    all hosts (``preflight.plan_for(hosts=...)``); then the rules over every host
    (``preflight.check_service_hosts``: GPU count, identical cards, drivers, heads, network)."""
    from llmfleet.host import facts as facts_mod
    from llmfleet.knowledge import preflight
    from llmfleet.knowledge.facts import Facts

    svc, prep = ready.service, ready.head.services[0]
    head_name = ready.head.host.name
    out = slots[head_name].out
    found: dict[str, Facts] = {}
    for name in sorted(slots):
        paths = [svc.model_path] if svc.model_path and (name == head_name or cluster.runtime.workers_load_model) else []
        found[name] = facts_mod.gather(slots[name].run.link, root=slots[name].run.root, model_paths=paths)
    speeds = [s.network_gbps for s in [ready.head.settings, *(w.settings for w in ready.workers)] if s.network_gbps]
    slowest = min(speeds) if speeds else None
    plan, plan_error = preflight.plan_for(svc, found[head_name], ready.head.settings, hosts=cluster.size)
    checks = preflight.run_checks(head_name, svc, found[head_name], plan, prep.image, plan_error=plan_error,
                                  settings=ready.head.settings)
    checks += preflight.check_service_hosts(svc, found, head=head_name, plan=plan, network_gbps=slowest)
    out.preflight.append({"service": svc.name, "hosts": sorted(found), "ok": preflight.ok(checks),
                          "checks": [c.to_dict() for c in checks]})
    bad = [f"{c.id}: {c.message}" + (f" (fix: {c.fix})" if c.fix else "") for c in checks if c.status == "fail"]
    if bad:
        raise Refusal(Result.REFUSED, f"preflight of {svc.name} over {', '.join(sorted(found))} failed: "
                                      + "; ".join(bad))
    warns = sum(c.status == "warn" for c in checks)
    head_run.log(f"preflight passed on {len(found)} hosts ({warns} warning{'s' if warns != 1 else ''})")
    return [plan]


def _deploy(ready: PreparedService, slots: dict[str, HostSlot], res: ServiceRun, options: DeployOptions,
            head_health: HealthFn) -> None:
    svc = ready.service
    prep = ready.head.services[0]
    hh = slots[ready.head.host.name]
    role = load_role(svc.engine)
    # gather + preflight
    head_member, worker_members = _members(ready, slots)
    cluster = C.make_cluster(svc, role, head_member, worker_members)
    res.cluster = cluster.to_dict()
    hh.member = head_member
    plan = _cluster_preflight(ready, slots, hh.run, cluster)[0]

    # render + decide
    search = search_paths(ready.head.host.vars, str(ready.inventory.path), hh.run.settings.search_config)
    overlay = C.head_overlay(svc, role, cluster, [str(a) for a in (getattr(plan, "engine_args", None) or [])])
    rendered = {hh.name: render(svc, ready.head.settings, prep.image, plan, api_key=prep.api_key, head=overlay,
                                roles_dir=search["roles_dir"], templates_dir=search["templates_dir"])}
    hh.run.health_fn = head_health  # its own check, and going back should anything fail before it
    workers: list[HostSlot] = []
    for w, m in zip(ready.workers, worker_members, strict=True):
        wh = slots[w.host.name]
        wh.member = m
        wh.run.health_fn = worker_health(m, cluster.port, cluster.kind)
        wsearch = search_paths(w.host.vars, str(ready.inventory.path), wh.run.settings.search_config)
        rendered[wh.name] = C.render_worker(svc, w.settings, w.image, cluster, m, **wsearch)
        workers.append(wh)
    images_by_host = {hh.name: prep.image} | {w.host.name: w.image for w in ready.workers}
    for name, h in slots.items():
        h.host_states = h.run.read_state()
        st = h.host_states.get(svc.name)
        p = Prepared(svc, prep.api_key if h.is_head else None, images_by_host[name])
        h.items = [pipeline.item_for(h.run, p, summarize(plan) if h.is_head else None, rendered[name], st)]
        previous = h.item.step.previous
        back_to = release_endpoint(st, previous, name) if not h.is_head and h.member else None
        if back_to is not None and previous and h.member is not None:
            h.run.health_fn = worker_health(h.member, cluster.port, cluster.kind, {previous: back_to})
    hh.item.step = decide.head_step(hh.item.step, [w.item.step for w in workers])

    def switch() -> None:
        failure, report = _switch_all(slots, workers, hh, svc, svc, cluster, res, "deploy")
        if failure is None:
            _commit(slots, svc, res, report, "deploy")
            res.result = Result.DEPLOYED
            res.reason = "; ".join(f"{h.name} on {h.item.step.release_id}" for h in [*workers, hh])
            return
        _roll_back_all(slots, workers, hh, svc, failure, res)

    pipeline.deploy([slots[n] for n in decide.switch_order(hh.name, [w.name for w in workers])], options, res,
                    what="host", switch=switch)


def _switch_all(slots: dict[str, HostSlot], workers: list[HostSlot], hh: HostSlot, svc: Service, head_svc: Service,
                cluster: C.Cluster, res: ServiceRun, action: str) -> tuple[str | None, health.HealthReport | None]:
    """Arm every host, switch the workers, reach them from the head, switch and check the head, check the
    join, confirm every host: (the failure's reason or None, the head's health report). Ctrl-C puts
    every host back before it is raised again."""
    try:
        failure = _arm_all(workers, hh, svc, action=action)
        for w in workers:
            if failure:
                break
            failure = _switch(w, svc)
        if failure is None and any(w.item.step.action != Action.UNCHANGED for w in workers):
            failure = _reach_workers(hh, cluster)  # from the head, before it switches
        if failure is None:
            return _switch_head(hh, head_svc, cluster, res, slots)
        return failure, None
    except KeyboardInterrupt:  # Ctrl-C mid-switch: every host back before exiting, as a single-host deploy
        _roll_back_all(slots, workers, hh, svc, "interrupted", res, action=action)
        raise


def _arm_all(workers: list[HostSlot], hh: HostSlot, svc: Service, action: str = "deploy") -> str | None:
    """Upload each host's new release and arm its host timer, every host before the first switch:
    workers in their order, the head last (``confirm.cluster_timeouts``: its timer fires after every
    worker's, and it restarts the head even when the head's switch was never made, so that a head left
    by a lost controller attaches again to workers that their own timers put back). A failure's reason."""
    from llmfleet.release import confirm

    budgets = confirm.cluster_timeouts(svc, hh.name, {h.name: h.run.host_settings for h in [*workers, hh]})
    for h in [*workers, hh]:
        it, run = h.item, h.run
        step = it.step
        try:
            if step.action == Action.NEW:
                assert it.rendered is not None
                it.manifest = manifest_build(it.rendered, step.release_id, host=run.host, who=run.who,
                                             when=run.now(), llmfleet_version=__version__, message=run.message)
                files, modes = store.release_files(it.rendered, it.manifest)
                up = run.run(store.upload_script(it.paths, step.release_id), stdin=store.pack_release(files, modes),
                             timeout=120)
                if not store.parse_upload(up.rc, up.stdout):
                    return (f"{h.name}: upload of release {step.release_id} failed: "
                            f"{short(up.stderr or up.stdout, 300)}")
                run.log(f"{svc.name}: uploaded release {step.release_id}")
            if step.arms_revert:
                h.token = run.arm(it.paths, svc, step.release_id, step.previous, action, timeout=budgets[h.name],
                                  restart_unswitched=h.is_head)
        except RemoteError as exc:
            return f"{h.name}: {exc}"
    return None


def _reach_workers(hh: HostSlot, cluster: C.Cluster) -> str | None:
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


def _switch(h: HostSlot, svc: Service) -> str | None:
    """Switch one host's uploaded, armed release (a worker, or the head before its checks); a failure's reason."""
    it, run = h.item, h.run
    step = it.step
    try:
        if step.switches:
            h.switched = True
            sw = run.switch(it.paths, step.release_id)
            if not store.parse_switch(sw.rc, sw.stdout):
                return f"{h.name}: switch to {step.release_id} failed: {short(sw.stderr or sw.stdout, 300)}"
            run.log(f"{svc.name}: current -> {step.release_id}, unit restarted")
        if not h.is_head:
            rep = run.check_health(HealthTarget(svc, None, it.paths, step.release_id, None), f"worker release "
                                                                                             f"{step.release_id}")
            it.health = rep
            if not rep.ok:
                return f"{h.name}: worker release {step.release_id} is not up: {rep.message}"
            run.log(f"{svc.name}: worker up ({rep.message})")
    except RemoteError as exc:
        return f"{h.name}: {exc}"
    return None


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


def _switch_head(hh: HostSlot, svc: Service, cluster: C.Cluster, res: ServiceRun,
                 slots: dict[str, HostSlot]) -> tuple[str | None, health.HealthReport | None]:
    it = hh.item
    failure = _switch(hh, svc)
    if failure:
        return failure, None
    try:
        report = hh.run.check_health(HealthTarget(svc, it.prepared.api_key, it.paths, it.step.release_id, it.plan,
                                                  engine_args=tuple(it.rendered.engine_args) if it.rendered else
                                                  (it.manifest.engine_args if it.manifest else ())),
                                     f"release {it.step.release_id}")
    except RemoteError as exc:
        return f"{hh.name}: {exc}", None
    it.health = report
    hh.out.health[svc.name] = report.to_dict()
    if not report.ok:
        return f"{hh.name}: release {it.step.release_id} failed: {report.message}", report
    try:
        ok, shortfall, detail = _join_check(cluster)(hh, cluster, slots)
    except RemoteError as exc:
        return f"{hh.name}: join check: {exc}", report
    res.joined = detail
    if not ok:
        return f"{hh.name}: healthy, but not every worker joined: {shortfall}", report
    hh.run.log(f"{svc.name}: every worker joined ({detail})")
    return _confirm_all([slots[w.host] for w in cluster.workers], hh, svc), report


def _confirm_all(workers: list[HostSlot], hh: HostSlot, svc: Service) -> str | None:
    """Confirm every armed host, in the order their timers fire (workers, then the head: the head's
    confirmation is the last one); each confirmation also starts that host's watchdog."""
    for h in [*workers, hh]:
        if h.token is None:
            continue
        try:
            confirmed = h.run.confirm(h.item.paths, svc.name, h.token)
        except RemoteError as exc:
            return f"{h.name}: confirm: {exc}"
        if not confirmed:
            return f"{h.name}: healthy, but the host timer reverted it first"
        h.token = None
    return None


def _commit(slots: dict[str, HostSlot], svc: Service, res: ServiceRun, report: health.HealthReport | None, action: str) -> None:
    """Every host healthy together: the set they now run appended to each host's history
    (``clusterset``), each switched host marked healthy, audited, its outcome; a deploy prunes."""
    from llmfleet.release import clusterset

    any_run = next(iter(slots.values())).run
    entry = clusterset.record(now=any_run.now(), action=action, head=res.head,
                              releases={n: h.item.step.release_id for n, h in slots.items()})
    done = Result.DEPLOYED if action == "deploy" else Result.ROLLED_BACK
    for h in slots.values():
        h.run.defer(clusterset.append_script(Paths(h.run.root, svc.name), entry))
        it = h.item
        rid = it.step.release_id
        rep = report if h.is_head else None
        role = f"{'head' if h.is_head else 'worker'} of a multi-host service"
        if it.step.action != Action.UNCHANGED:
            doc = (rep.to_dict() if rep else (it.health_doc or {})) | {"release": rid, "joined": res.joined}
            h.run.defer(store.mark_healthy_script(it.paths, rid, doc | {"time": h.run.now().isoformat(timespec="seconds"),
                                                                      "who": h.run.who}))
        extra = {"decode_tokps": rep.decode_tokps, "ttft_s": rep.ttft_s} if rep else {}
        result = Result.UNCHANGED if action == "deploy" and it.step.action == Action.UNCHANGED else done
        h.run.record(action=action, service=svc.name, release_id=rid, digest=it.prepared.image.digest, result=result,
                     detail=role if action == "deploy" else f"from {it.step.previous} ({role})", **extra)
        h.out.result = done
        h.out.services[svc.name] = ServiceOutcome(svc.name, done, rid, rid, it.step.previous)
        if action == "deploy" and it.step.action in (Action.NEW, Action.SWITCH) and it.state is not None:
            pipeline.prune_after(h.run, h.host_states or {svc.name: it.state}, [it])


def _roll_back_all(slots: dict[str, HostSlot], workers: list[HostSlot], hh: HostSlot, svc: Service, failure: str,
                   res: ServiceRun, action: str = "deploy") -> None:
    """Every host of the service back to its previous release: workers first, then the head. Each
    host's timer is stopped just before it goes back (the ones not reached yet keep their timers);
    a host armed but never switched is only disarmed."""
    logs = hh.run.engine_log(hh.item.paths) if hh.switched else ""
    hh.run.log(f"{svc.name}: FAILED: {failure}")
    if logs:
        hh.run.log(f"{svc.name}: head engine log: {logs}")
    backs: dict[str, GoBack] = {}
    restart_head = decide.restart_head_going_back(hh.switched, [w.switched for w in workers], hh.item.step.previous)
    for h in [slots[n] for n in decide.switch_order(hh.name, [w.name for w in workers])]:
        it = h.item
        h.run.disarm(it.paths, h.token)
        h.token = None
        if not h.switched and not (h is hh and restart_head):
            continue
        if h.is_head and it.health is not None and not it.health.ok:
            try:
                h.run.run(store.mark_healthy_script(it.paths, it.step.release_id, it.health.to_dict()), timeout=30)
            except LlmfleetError:
                pass
        previous = it.step.previous  # the head restarted for its workers' sake: restarted again
        back = h.run.go_back(it.paths, svc, it.prepared.api_key if h.is_head else None, previous, it.state)
        backs[h.name] = back
        h.run.log(f"{svc.name}: {back.sentence()}")
        h.run.record(action=action, service=svc.name, release_id=it.step.release_id,
                     digest=it.prepared.image.digest, result=back.result, detail=f"{failure}; {back.sentence()}")
        h.out.result = Result(back.result)
        h.out.services[svc.name] = ServiceOutcome(svc.name, Result(back.result), it.step.release_id, back.current,
                                                  previous, failure)
        h.out.releases[svc.name] = back.current or ""
    res.result = decide.cluster_result(list(backs.values()))
    where = ", ".join(f"{n}: {b.sentence()}" for n, b in backs.items()) or "nothing was switched"
    res.reason = f"{failure}; engine log: {logs or '(not read)'}; every host of the service went back: {where}"
    for h in slots.values():
        if h.name not in backs:
            h.out.result = Result.UNCHANGED if h.items and h.item.step.action == Action.UNCHANGED else res.result


# ---------------------------------------------------------------------------------------------
# rollback: every host of the service together, to the releases they ran together


def services_of_hosts(inv: Inventory, names: list[str], service: str | None = None) -> list[tuple[str, str]]:
    """(head, service) of every service with workers that one of ``names`` is the head or a worker of
    (``service``: only that one), each once, in the inventory's order."""
    out: list[tuple[str, str]] = []
    wanted = set(names)
    for head, h in inv.hosts.items():
        for s in settings_for(h).services:
            if not s.workers or (service is not None and s.name != service) or (head, s.name) in out:
                continue
            if head in wanted or wanted & set(workers_of(inv, head, s)):
                out.append((head, s.name))
    return out


def _image_of(manifest: Manifest) -> images.ImageRef:
    """The image a release ran, as its manifest recorded it (what the audit line names)."""
    m = manifest.image
    ref = manifest.image_ref or ""
    return images.ImageRef(key=str(m.get("key") or ref), repository=str(m.get("repository") or ref.split("@")[0]),
                           digest=manifest.digest, tag=m.get("tag") if isinstance(m.get("tag"), str) else None,
                           pinned=bool(m.get("pinned", True)),
                           upstream_repository=str(m.get("upstream_repository") or m.get("repository") or ""))


def _cluster_of(service: str, manifest: Manifest) -> C.Cluster | None:
    """The cluster a worker's release was rendered for (its manifest's inputs)."""
    d = manifest.inputs.get("cluster")
    if not isinstance(d, dict):
        return None
    try:
        head = C.Member(**d["head"])
        workers = tuple(C.Member(**w) for w in d["workers"])
        return C.Cluster(service, str(d["kind"]), int(d["port"]), head, workers)
    except (KeyError, TypeError, ValueError):
        return None


def rollback_service(inventory: Inventory | str, head: str, service: str, *, to: str | None = None,
                     config: Settings | dict[str, object] | None = None, options: DeployOptions, log: Log,
                     head_health: HealthFn = http_health, connector: Connector = connect) -> ServiceRun:
    """Every host of a service over several hosts back to the releases they last ran together before
    the current ones (``clusterset.shared_target``; ``to``: the set holding that release id): locks
    in sorted order, every host armed, workers switched first, then the head's health and join check,
    every host confirmed; a failure puts every host back on what it ran before the rollback."""
    settings = Settings.of(config)
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    host = inv.hosts.get(head)
    if host is None:
        raise UsageError(f"{inv.path}: no host {head!r}")
    if to is not None and not decide.is_release_id(to):
        raise UsageError(f"--to {to!r} is not a release id (like 20261129T120000Z-0123456789); "
                         f"see `invoke releases --host {head}`")
    svc = next((s for s in settings_for(host).services if s.name == service), None)
    if svc is None:
        from llmfleet.suggest import did_you_mean

        names = [s.name for s in settings_for(host).services]
        raise UsageError(f"{inv.path}: host {head} has no service {service!r}{did_you_mean(service, names)} "
                         f"(services: {', '.join(names) or 'none'})")
    names = workers_of(inv, head, svc)
    key = resolve_secret(svc.api_key, f"host {head}: service {service}")
    t0 = time.monotonic()
    res = ServiceRun(service=service, head=head, result=Result.FAILED)
    targets = [(inv.hosts[n], settings_for(inv.hosts[n]), HostOutcome(host=n, result=Result.FAILED))
               for n in [head, *names]]
    slots = pipeline.run_hosts(targets, "rollback", lambda s: _rollback(svc, key, s, res, to, head_health),
                               settings=settings, log=log, verdict=res, who=options.who, message=options.message,
                               accept_new_host_keys=options.accept_new_host_keys, service=service, head=head,
                               prefix_log=True, connector=connector, make_run=HostRun)
    for slot in slots.values():
        slot.out.result = res.result
        res.hosts[slot.name] = slot.out
    res.duration_s = round(time.monotonic() - t0, 3)
    return res


def _rollback(svc: Service, key: str | None, slots: dict[str, HostSlot], res: ServiceRun, to: str | None,
              head_health: HealthFn) -> None:
    from llmfleet.release import clusterset
    from llmfleet.release.executor import service_for_release

    # gather: every host's state and the sets they ran together
    states = {n: h.run.read_state().get(svc.name) for n, h in slots.items()}
    history = clusterset.merge([clusterset.parse(h.run.run(clusterset.read_script(Paths(h.run.root, svc.name)),
                                                           timeout=30).stdout) for h in slots.values()])
    # decide: the set to go back to, checked on every host (its cluster, its images)
    target = clusterset.shared_target(svc.name, list(slots), states, history, to=to)
    manifests: dict[str, Manifest] = {}
    for n, rid in target.releases.items():
        st = states[n]
        assert st is not None  # shared_target checked every host has it
        m = st.releases[rid].manifest
        assert m is not None
        manifests[n] = m
    cluster = next((c for n, m in manifests.items() if n != res.head and (c := _cluster_of(svc.name, m))), None)
    if cluster is None or sorted(cluster.hosts) != sorted(slots):
        raise Refusal(Result.FAILED, f"service {svc.name}: the workers' releases {target.time} name no cluster of "
                                     f"{', '.join(sorted(slots))}; deploy the version you want instead")
    res.cluster = cluster.to_dict()
    for n, h in slots.items():
        m, st, rid = manifests[n], states[n], target.releases[n]
        assert st is not None
        if rid != st.current and not store.parse_image_present(
                h.run.run(store.image_present_script(m.image_ref or ""), timeout=30).stdout):
            raise Refusal(Result.FAILED, f"{n}: service {svc.name}: the image of release {rid} ({m.image_ref}) is "
                                         "no longer on the host; deploy that version instead")
    hh = slots[res.head]
    members = {cluster.head.host: cluster.head} | {w.host: w for w in cluster.workers}
    head_svc = service_for_release(svc, manifests[res.head])
    for n, h in slots.items():
        m, st, rid = manifests[n], states[n], target.releases[n]
        assert st is not None
        h.member = members[n]
        step = ServiceStep(svc.name, decide.rollback_action(rid, st), rid, st.current, (f"{st.current} -> {rid}",))
        h.items = [Item(Prepared(head_svc if h.is_head else svc, key if h.is_head else None, _image_of(m)),
                        m.plan_summary() if h.is_head else None, None, Paths(h.run.root, svc.name), st, step,
                        manifest=m)]
        if not h.is_head:
            h.run.health_fn = worker_health(h.member, cluster.port, cluster.kind)
        h.out.releases[svc.name] = rid
    workers = [slots[w.host] for w in cluster.workers]
    hh.item.step = decide.head_step(hh.item.step, [w.item.step for w in workers])
    for h in slots.values():
        h.out.changes.append(f"{svc.name}: {h.item.step.changes[0]}")
        h.run.log(f"{svc.name}: rollback {h.item.step.changes[0]} ({'head' if h.is_head else 'worker'})")

    # lock (no pull: every image is on its host, checked above), then the switch as a deploy's
    for name in decide.lock_order(list(slots)):
        slots[name].run.lock("rollback")
    hh.run.health_fn = head_health  # its own check, and going back should anything fail before it
    failure, report = _switch_all(slots, workers, hh, svc, head_svc, cluster, res, "rollback")
    if failure is not None:
        _roll_back_all(slots, workers, hh, svc, failure, res, action="rollback")
        res.result = Result.FAILED
        res.reason = f"ROLLBACK FAILED: {res.reason}"
        return
    _commit(slots, svc, res, report, "rollback")
    res.result = Result.ROLLED_BACK
    res.reason = "; ".join(f"{h.name}: {h.item.step.previous} -> {h.item.step.release_id}" for h in [*workers, hh])
