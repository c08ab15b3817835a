"""The deploy and the rollback of a service over several hosts: ``pipeline``'s stages (connect, lock,
pull, the last round trip) with this package's gather (every host's cluster address and facts, the
cluster preflight, each host's render; for a rollback, the set of releases the hosts ran together)
and its switch (``switch``)."""

from __future__ import annotations

import time

from llmfleet.errors import UsageError
from llmfleet.inventory.ansible import Inventory, load_inventory, settings_for
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.knowledge.planner import Plan, summarize
from llmfleet.knowledge.release_state import Manifest
from llmfleet.release import cluster as C
from llmfleet.release import decide, pipeline, store
from llmfleet.release.decide import HostOutcome, Refusal, Result, ServiceStep
from llmfleet.release.executor import HealthFn, HostRun, Log, connect, http_health
from llmfleet.release.multihost.checks import worker_health
from llmfleet.release.multihost.plan import (
    PreparedService,
    cluster_of,
    image_of,
    prepare_service,
    release_endpoint,
    workers_of,
)
from llmfleet.release.multihost.switch import ServiceRun, commit, roll_back_all, switch_all
from llmfleet.release.pipeline import Connector, HostSlot, Item
from llmfleet.release.prepare import DeployOptions, Prepared
from llmfleet.release.render import load_role, render, search_paths
from llmfleet.release.secret import resolve_secret
from llmfleet.release.store import Paths
from llmfleet.settings import Settings

# ---------------------------------------------------------------------------------------------
# deploy: pipeline's stages, with this module's gather (every host's facts, the cluster preflight,
# each host's render) and the switch (workers first, then the head, one verdict, every host back together)


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
        failure, report = switch_all(slots, workers, hh, svc, svc, cluster, res, "deploy")
        if failure is None:
            commit(slots, svc, res, report, "deploy")
            res.result = Result.DEPLOYED
            res.reason = "; ".join(f"{h.name} on {h.item.step.release_id}" for h in [*workers, hh])
            return
        roll_back_all(slots, workers, hh, svc, failure, res)

    pipeline.deploy([slots[n] for n in decide.switch_order(hh.name, [w.name for w in workers])], options, res,
                    what="host", switch=switch)


# ---------------------------------------------------------------------------------------------
# rollback: every host of the service together, to the releases they ran together


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
    cluster = next((c for n, m in manifests.items() if n != res.head and (c := cluster_of(svc.name, m))), None)
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
        h.items = [Item(Prepared(head_svc if h.is_head else svc, key if h.is_head else None, image_of(m)),
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
    failure, report = switch_all(slots, workers, hh, svc, head_svc, cluster, res, "rollback")
    if failure is not None:
        roll_back_all(slots, workers, hh, svc, failure, res, action="rollback")
        res.result = Result.FAILED
        res.reason = f"ROLLBACK FAILED: {res.reason}"
        return
    commit(slots, svc, res, report, "rollback")
    res.result = Result.ROLLED_BACK
    res.reason = "; ".join(f"{h.name}: {h.item.step.previous} -> {h.item.step.release_id}" for h in [*workers, hh])
