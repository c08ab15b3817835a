"""The Invoke collection behind both ``invoke`` (via tasks.py) and the ``llmfleet`` console script.

Each task module registers its tasks here; keep task bodies thin and put logic in the package. Task
modules import only Invoke and llmfleet's light modules at their top: rich, pydantic, httpx, jinja2
and paramiko are imported inside the task bodies, so `invoke --list` starts fast.
"""

from __future__ import annotations

import atexit
import gc

from invoke import Collection

from llmfleet.cli import flags

# A command's last act: CPython's final garbage collections walk every object the run made (~0.1 s
# after a deploy, for memory the process is about to give back). Moving them out of the collector's
# reach at exit skips that walk; nothing that matters is left to it (files and connections are closed
# by the code that opened them, the standard streams are flushed by the interpreter).
atexit.register(gc.freeze)
# Start-up creates ~100,000 long-lived objects (modules, classes, models); at CPython's default
# threshold (a young collection every 700 allocations, 140 of them for a deploy) the collector spends
# ~0.1 s walking them. Young collections every 20,000 allocations keep garbage cycles (a fleet run's
# closed connections) collected while costing a fraction of that.
# Measured with both lines removed (docs/bench.md "Start-up tricks"; bench/deploy_bench.py --src,
# bench/startup_bench.py --src, medians of three sittings): a no-change deploy 0.95 -> 1.16 s (CPU
# 0.65 -> 0.90 s), a changed one 2.62 -> 2.93 s, `invoke --list` 0.180 -> 0.201 s. Kept.
gc.set_threshold(20_000, 10, 10)

flags.install()  # usage errors: one line, exit 2 (also under Invoke's own `invoke` program)

from llmfleet.cli import (  # noqa: E402 - after install(): the task modules declare FleetTasks
    bench_tasks,
    bundle_tasks,
    catalog_tasks,
    common,
    deploy_tasks,
    facts_tasks,
    images_tasks,
    inventory_tasks,
    lab_tasks,
    lock_tasks,
    models_tasks,
    monitoring_tasks,
    ops_tasks,
    plan_tasks,
    provision_tasks,
    service_tasks,
    speed_tasks,
)

ns = Collection()
ns.configure(
    {
        "llmfleet": {
            # None: -i, else as Ansible finds it (ANSIBLE_INVENTORY, ansible.cfg, ./inventory)
            "inventory": None,
            "inventory_timeout": 30,  # seconds an inventory script may run (llmfleet.inventory.script)
            "ssh": {
                "connect_timeout": 10,
                "command_timeout": 120,
                "user": None,
                "known_hosts": "~/.local/state/llmfleet/known_hosts",
                "config_file": None,
            },
            "audit_log": "~/.local/state/llmfleet/audit.jsonl",
            "bench_dir": "~/.local/state/llmfleet/bench",  # local copies of bench results
            # None: images.lock in the working directory, else the one shipped with llmfleet
            "images_lock": None,
            "dockerfiles": None,  # None: dockerfiles/ in the repository (images.build, images.lint)
            # Folders searched before the packaged roles/templates (after the inventory's
            # llmfleet_roles_path / llmfleet_templates_path); docs/deploy.md
            "roles_path": None,
            "templates_path": None,
            # a Prometheus file_sd folder deploy/rollback/upgrade/stop/start/remove re-write (docs/monitoring.md)
            "prometheus_targets": None,
            "speed_overlay": None,  # a speed overlay file `invoke plan` shows (`invoke speed --write`; docs/planner.md)
        }
    }
)

ns.add_task(inventory_tasks.inventory)
ns.add_task(facts_tasks.facts)
ns.add_task(facts_tasks.preflight)
ns.add_task(provision_tasks.provision)
ns.add_task(plan_tasks.plan_task)
ns.add_task(service_tasks.render)
ns.add_task(ops_tasks.status)
ns.add_task(ops_tasks.releases)
ns.add_task(ops_tasks.audit)
ns.add_task(ops_tasks.upgrade)
ns.add_task(bench_tasks.bench)
ns.add_task(speed_tasks.speed)
ns.add_collection(images_tasks.ns)
ns.add_task(deploy_tasks.deploy)
ns.add_task(deploy_tasks.rollback)
ns.add_task(service_tasks.logs)
ns.add_task(service_tasks.stop)
ns.add_task(service_tasks.start)
ns.add_task(service_tasks.remove)
ns.add_collection(Collection("lock", lock_tasks.status, lock_tasks.release))
ns.add_collection(lab_tasks.ns)
ns.add_collection(catalog_tasks.ns)
ns.add_collection(models_tasks.ns)
ns.add_collection(bundle_tasks.ns)
ns.add_collection(monitoring_tasks.prometheus_ns)
ns.add_collection(monitoring_tasks.grafana_ns)

common.repeatable_inventory(ns)
