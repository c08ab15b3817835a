"""``invoke bundle.create`` and ``invoke bundle.verify``: one folder an air-gapped site deploys from
(the pinned images as archives, the models with their manifests, images.lock, the catalogs), and its
check against its own ``bundle.json``."""

from __future__ import annotations

from pathlib import Path

from invoke import Collection
from invoke.exceptions import Exit

from llmfleet.cli.common import (
    INVENTORY_HELP,
    cfg,
    console,
    err_console,
    escape,
    new_table,
    print_json,
    select_hosts,
)
from llmfleet.cli.flags import fleet_task
from llmfleet.cli.images_tasks import registry_client, selected_mirrors, split_words

MIRROR_HELP = ("fetch through the private mirrors in the selected hosts' llmfleet_image_mirrors (the digest "
               "stays the same; the bundle records the lock's repository)")


def _mirror_pairs(values: str | None) -> dict[str, str]:
    from llmfleet.errors import UsageError

    out: dict[str, str] = {}
    for item in split_words(values):
        public, sep, private = item.partition("=")
        if not sep or not public or not private:
            raise UsageError(f"--mirror {item!r} must be REPOSITORY_PREFIX=MIRROR_PREFIX (e.g. "
                             "lab-registry:5000=127.0.0.1:5000)")
        out[public] = private
    return out


def _packages_fetch(c, inv, hosts, staging_name, accept_new_host_keys, log):
    """What writes the offline repository into the bundle: every value checked before any host is reached."""
    from llmfleet.bundle import contents as bc
    from llmfleet.cli.common import load_settings
    from llmfleet.cli.provision_tasks import _source_files
    from llmfleet.errors import UsageError
    from llmfleet.inventory.ansible import settings_for

    if staging_name not in inv.hosts:
        raise UsageError(f"--packages-from {staging_name}: no such host in {inv.path}; name a connected inventory host "
                         "installed like the chosen ones")
    staging = inv.hosts[staging_name]
    targets = [(h.name, settings_for(h), _source_files(h, settings_for(h), inv.path)) for h in hosts]
    settings = load_settings(c)

    def fetch(out):
        from llmfleet.host import ssh
        from llmfleet.provision import staging as stage

        with ssh.connect(staging, config=settings, accept_new_host_keys=accept_new_host_keys) as remote:
            got = stage.fetch(remote, staging_name, settings_for(staging), targets, out / bc.PACKAGES_DIR, log=log)
        archive = bc.packages_archive(got.distro, got.version, got.arch)
        return [(bc.BundlePackages(got.distro, got.version, got.arch, archive, got.source, got.packages),
                 bc.FileEntry(archive, got.size, got.sha256))]

    return fetch


@fleet_task(
    positional=["dir"],
    help={
        "dir": "the bundle folder to write (new, empty, or an earlier bundle: its staged blobs are reused)",
        "host": "hosts whose services to bundle: name or Ansible --limit pattern",
        "group": "inventory group whose services to bundle (pattern allowed)",
        "service": "only these services (comma-separated) of the chosen hosts",
        "inventory": INVENTORY_HELP,
        "registry_mirror": MIRROR_HELP,
        "mirror": "fetch REPOSITORY_PREFIX from MIRROR_PREFIX instead (comma-separated PREFIX=MIRROR pairs), "
                  "e.g. a registry reached under another name from this machine",
        "insecure": "registries (host:port, comma-separated) reached over plain HTTP; loopback always is",
        "tar": "also write DIR.tar beside the folder: the whole bundle as one file",
        "json": "print the bundle's top manifest (bundle.json) as JSON",
        "packages_from": "also carry the packages provisioning installs (an offline apt repository), downloaded by "
                         "this inventory host: connected, installed like the chosen hosts (same distribution release "
                         "and architecture) and not yet provisioned; `provision --bundle` installs from it",
        "accept_new_host_keys": "record the --packages-from host's SSH key if unknown (changed keys are refused)",
    },
)
def create(c, dir, host=None, group=None, service=None, inventory=None, registry_mirror=False, mirror=None,
           insecure=None, tar=False, json=False, packages_from=None, accept_new_host_keys=False):
    """Write a bundle: everything the chosen hosts' services need, for a site with no registry and no internet.

    Images by their pinned digest (images.lock) as archives `docker load` accepts, the models whose
    model_source is a path here (with their manifests), a copy of images.lock, the catalogs, and
    bundle.json with every file's size and sha256.
    """
    from llmfleet.bundle import create as bcreate

    inv, hosts = select_hosts(c, inventory, host, group)
    sel = bcreate.select(inv, [h.name for h in hosts], split_words(service) or None, cfg(c, "images_lock"))
    mirrors: dict[str, str] = {}
    if registry_mirror:

        mirrors.update(selected_mirrors(c, inventory, host, group))
    mirrors.update(_mirror_pairs(mirror))
    out = Path(dir).expanduser()
    log = lambda m: err_console.print(escape(m))  # noqa: E731
    packages = _packages_fetch(c, inv, hosts, packages_from, accept_new_host_keys, log) if packages_from else None
    bundle = bcreate.create(sel, out, client=registry_client(insecure), mirrors=mirrors, log=log, packages=packages)
    tarball = bcreate.write_tarball(out) if tar else None
    if json:
        doc = bundle.to_dict()
        if tarball is not None:
            doc["tarball"] = str(tarball)
        print_json(doc)
        return
    t = new_table("image", "image ID", "archive", "size", title=f"bundle {out}")
    for im in bundle.images:
        t.add_row(im.key, im.image_id[:19], im.archive, f"{im.size / 1e6:.1f} MB")
    for m in bundle.models:
        t.add_row(f"model {m.name}", "", m.dir, "")
    sizes = {f.path: f.size for f in bundle.files}
    for pk in bundle.packages:
        t.add_row(f"packages {pk.distro} {pk.version} {pk.arch}", f"{len(pk.packages)} .deb", pk.archive,
                  f"{sizes.get(pk.archive, 0) / 1e6:.1f} MB")
    console.print(t)
    total = sum(f.size for f in bundle.files)
    console.print(f"{len(bundle.files)} files, {total / 1e6:.1f} MB; lock {bundle.lock_sha256[:19]}; "
                  f"hosts: {', '.join(sel.hosts)}" + (f"; tarball {tarball}" if tarball else ""))


@fleet_task(
    positional=["dir"],
    help={
        "dir": "the bundle folder (bundle.create wrote it; a copied DIR.tar unpacked)",
        "json": 'print {"ok", "problems": [{"path", "what"}], "files"}',
    },
)
def verify(c, dir, json=False):
    """Check a bundle's files against its bundle.json: every file there, with its size and sha256.

    No host and no network: run it after copying a bundle to a site. Exit 1 names each missing or
    corrupt file (one line each), 2 when bundle.json itself is missing or malformed.
    """
    from llmfleet.bundle import check

    bundle = check.read(dir)
    problems = check.problems(bundle, dir)
    if json:
        print_json({"ok": not problems, "problems": [{"path": p.path, "what": p.what} for p in problems],
                    "files": len(bundle.files)})
    else:
        for p in problems:
            err_console.print(escape(p.line(str(dir))), soft_wrap=True)
        if not problems:
            console.print(f"bundle {dir}: {len(bundle.files)} files intact; lock {bundle.lock_sha256[:19]}; "
                          f"built {bundle.created} for {', '.join(bundle.built_for.get('hosts') or []) or '?'}")
    if problems:
        raise Exit(code=1)


ns = Collection("bundle")
ns.add_task(create)
ns.add_task(verify)
