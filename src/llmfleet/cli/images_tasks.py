"""``invoke images.*``: pin engine images to digests, verify the pins, build the images upstream does
not ship, list what is locked."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from invoke import Collection

from llmfleet.cli.common import cfg, console, err_console, inventory_path, print_json
from llmfleet.cli.flags import fleet_task, hints
from llmfleet.errors import CheckFailed, UsageError


class _Lazy:
    """``llmfleet.images.lock`` imported on first use (yaml and friends: not needed by `invoke --list`)."""

    def __getattr__(self, name: str):
        from llmfleet.images import lock

        return getattr(lock, name)


img = _Lazy()

LOCK_HELP = ("lock file (default: llmfleet.images_lock in invoke.yaml, else images.lock in the working directory, "
             "else the one shipped with llmfleet)")
MIRROR_HELP = ("go through the private mirrors in the inventory's llmfleet_image_mirrors (air-gapped fleets); "
               "the lock keeps the public repository, the digest is the same")


def _lock_path(c, lock: str | None) -> Path:
    """The lock to read: --lock, the configured one, ./images.lock, else the packaged default."""
    return Path(lock).expanduser() if lock else img.lock_path_for(None, None, cfg(c, "images_lock"))


def _writable_lock(path: Path, announce: bool = True) -> Path:
    """Where a change to ``path`` goes: never into the installed package. A project without a lock of
    its own gets ./images.lock, started from the packaged one (comments and entries kept)."""
    if path.resolve() != Path(str(img.PACKAGED_LOCK)).resolve() or _in_checkout():
        return path
    own = Path(img.PROJECT_LOCK)
    if not own.exists():
        own.write_text(img.packaged_lock_text(), encoding="utf-8")
        if announce:
            err_console.print(f"created {own} from the images.lock shipped with llmfleet")
    return own


def _in_checkout() -> bool:
    """llmfleet runs from its own source tree (an editable install): the packaged lock is the project's."""
    return (Path(__file__).resolve().parents[3] / "pyproject.toml").is_file()


def split_words(values: str | None) -> list[str]:
    return [v for v in (values or "").replace(",", " ").split() if v]


def selected_mirrors(c, inventory: str | None, host: str | None, group: str | None) -> dict[str, str]:
    """The union of ``llmfleet_image_mirrors`` over the selected hosts; two hosts mapping one public
    repository to different mirrors is a usage error (say which with --host/--group)."""
    from llmfleet.inventory.ansible import load_inventory, settings_for

    inv = load_inventory(inventory_path(c, inventory))
    hosts = inv.select(host=host, group=group) if (host or group) else list(inv.hosts.values())
    merged: dict[str, str] = {}
    seen: dict[str, str] = {}
    for h in hosts:
        for public, private in settings_for(h).image_mirrors.items():
            if public in merged and merged[public] != private:
                raise UsageError(
                    f"{inv.path}: llmfleet_image_mirrors maps {public} to {merged[public]} on {seen[public]} and to "
                    f"{private} on {h.name}; pick hosts with --host/--group"
                )
            merged[public], seen[public] = private, h.name
    if not merged:
        raise UsageError(f"{inv.path}: --registry-mirror given but no selected host sets llmfleet_image_mirrors")
    return merged


def _dockerfiles(c) -> Path:
    """The dockerfiles/ folder: config ``llmfleet.dockerfiles`` (env INVOKE_LLMFLEET_DOCKERFILES), else the
    one beside llmfleet's source, else ./dockerfiles. A folder that is not there is a usage error."""
    configured = cfg(c, "dockerfiles")
    if configured:
        root = Path(configured).expanduser()
        where = f"{root} (llmfleet.dockerfiles)"
    else:
        root = img.DOCKERFILES_DIR if img.DOCKERFILES_DIR.is_dir() else Path("dockerfiles")
        where = "./dockerfiles"
    if not root.is_dir():
        raise UsageError(f"no dockerfiles folder at {where}: images.build and images.lint read "
                         "dockerfiles/NAME/Dockerfile and image.yaml; run from a folder that has one, or set "
                         "llmfleet.dockerfiles in invoke.yaml")
    return root


def registry_client(insecure: str | None):
    from llmfleet.images.registry import RegistryClient

    return RegistryClient(insecure=split_words(insecure))


def _catalog_images() -> dict:
    from llmfleet.knowledge.compat import load_engine_catalog

    return dict(load_engine_catalog().images)


@fleet_task(
    positional=["refs"],
    help={
        "refs": "ENGINE=VERSION[,ENGINE=VERSION...] from catalog/engines.yaml (e.g. vllm=0.10.1.1), or `all` "
                "for every GPU image there; ENGINE=VERSION=REPO:TAG resolves REPO:TAG instead but records the "
                "catalog's repository",
        "lock": LOCK_HELP,
        "registry_mirror": MIRROR_HELP,
        "inventory": "with --registry-mirror: the inventory whose llmfleet_image_mirrors to use",
        "host": "with --registry-mirror: only these hosts' mirrors (Ansible pattern)",
        "group": "with --registry-mirror: only this group's mirrors (Ansible pattern)",
        "insecure": "registries (host:port, comma-separated) reached over plain HTTP; loopback always is",
        "json": "print the new lock entries as JSON",
        "inspect": "then pull each pinned digest and read what the image carries (as images.inspect) into the lock",
    },
)
def pin(c, refs, inventory=None, lock=None, registry_mirror=False, host=None, group=None, insecure=None, json=False,
        inspect=False):
    """Resolve image tags to digests against their registry and write them into images.lock."""
    catalog = _catalog_images()
    args = split_words(refs)
    if args == ["all"]:
        args = [k.replace(":", "=", 1) for k, r in sorted(catalog.items()) if not r.cpu]
    specs = img.parse_pin_args(args, catalog)
    if registry_mirror:
        mirrors = selected_mirrors(c, inventory, host, group)
        specs = [img.through_mirror(s, mirrors) for s in specs]
    own = Path(img.PROJECT_LOCK)
    fresh = not own.exists()
    path = _writable_lock(_lock_path(c, lock), announce=False)
    created = fresh and own.exists()
    try:
        entries = img.pin(specs, registry_client(insecure), path)
        if inspect:
            entries = _inspect_pinned(entries, specs, path, quiet=json)
    except BaseException:
        if created:  # a failed pin leaves nothing behind (a stale copy would hide later packaged pins)
            own.unlink(missing_ok=True)
        raise
    if created:
        err_console.print(f"created {own} from the images.lock shipped with llmfleet")
    if json:
        print_json({"lock": str(path), "pinned": {e.key: img.entry_dict(e) for e in entries}})
        return
    for e, s in zip(entries, specs, strict=True):
        console.print(f"pinned {e.key}: {s.ref} -> {e.repository}@{e.digest}")
    console.print(f"wrote {path}")


@fleet_task(
    help={
        "lock": LOCK_HELP,
        "registry_mirror": MIRROR_HELP,
        "inventory": "with --registry-mirror: the inventory whose llmfleet_image_mirrors to use",
        "host": "with --registry-mirror: only these hosts' mirrors (Ansible pattern)",
        "group": "with --registry-mirror: only this group's mirrors (Ansible pattern)",
        "insecure": "registries (host:port, comma-separated) reached over plain HTTP; loopback always is",
        "record": "write the time and registry of each successful check into the lock's verified field",
        "json": "print the results as JSON",
    },
)
def verify(c, inventory=None, lock=None, registry_mirror=False, host=None, group=None, insecure=None,
           record=False, json=False):
    """Check that every pinned digest still resolves in its registry (exit 1 if one does not)."""
    path = _lock_path(c, lock)
    if not path.exists():
        raise UsageError(f"{path}: no such lock file; run `invoke images.pin` first or pass --lock")
    lock_data = img.load_lock(path)
    mirrors = selected_mirrors(c, inventory, host, group) if registry_mirror else {}
    results = img.verify(lock_data, registry_client(insecure), mirrors=mirrors)
    failed = [r for r in results if r.status in ("missing", "error")]
    if record:
        img.write_lock(img.mark_verified(lock_data, results), _writable_lock(path))
    if json:
        print_json({"lock": str(path), "ok": not failed, "results": [r.to_dict() for r in results]})
    else:
        from rich.table import Table

        table = Table(title=f"images.verify {path}")
        for col in ("image", "reference", "status", "detail"):
            table.add_column(col, overflow="fold")
        style = {"ok": "green", "missing": "red", "error": "red", "unpinned": "yellow"}
        for r in results:
            table.add_row(r.key, r.ref, f"[{style[r.status]}]{r.status}[/]", r.message)
        console.print(table)
    if failed:
        raise CheckFailed(verify_failure_line(results))


UNREACHABLE = "cannot reach registry"  # images.registry's words for a registry that did not answer


def verify_failure_line(results: list) -> str:
    """The one line images.verify fails with: of the pinned images only (an unpinned entry is not
    checked), those whose digest is gone, those whose registry did not answer (no network, a registry
    down: the digest may well be there) and those the registry refused otherwise, each with its cause."""
    pinned = [r for r in results if r.status != "unpinned"]
    missing = [r for r in pinned if r.status == "missing"]
    unreachable = [r for r in pinned if r.status == "error" and UNREACHABLE in r.message]
    other = [r for r in pinned if r.status == "error" and r not in unreachable]
    n = len(pinned)
    parts = []
    if missing:
        parts.append(f"{len(missing)} of {n} pinned image{'s' if n != 1 else ''} do not resolve "
                     f"(digest gone from the registry: re-pin or restore it): {', '.join(r.key for r in missing)}")
    if unreachable:
        registries = sorted({r.message.split(": " + UNREACHABLE, 1)[0] for r in unreachable})
        parts.append(f"{len(unreachable)} of {n} pinned image{'s' if n != 1 else ''} could not be checked: registry "
                     f"unreachable ({', '.join(registries)}: no network or the registry is down; "
                     f"{unreachable[0].message.split(UNREACHABLE + ': ', 1)[-1]}): "
                     + ", ".join(r.key for r in unreachable))
    if other:
        parts.append(f"{len(other)} of {n} pinned image{'s' if n != 1 else ''} could not be checked: "
                     + ", ".join(f"{r.key} ({r.message})" for r in other))
    return "; ".join(parts)


@fleet_task(
    positional=["name"],
    iterable=["build_arg"],
    help={
        "name": "folder under dockerfiles/ with an image.yaml (e.g. llamacpp-cuda, vllm-volta)",
        "resolve_base": "look up the digests of bases not pinned in image.yaml in their registry now (printed; "
                        "record them in image.yaml)",
        "build_arg": "build arg KEY=VALUE (repeatable), e.g. BASE_DIGEST=sha256:... or LLAMACPP_COMMIT=...; "
                     "overrides image.yaml",
        "tag": "tag to give the built image (default: image.yaml's tag, the catalog's)",
        "dry_run": "print the docker build command and exit",
        "push": "push the built image to its repository afterwards (then `invoke images.pin` it)",
    },
)
def build(c, name, resolve_base=False, build_arg=None, tag=None, dry_run=False, push=False):
    """Build one of the engine images in dockerfiles/ with its base pinned by digest."""
    spec = img.load_build_spec(name, _dockerfiles(c))
    overrides = {}
    for item in build_arg or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--build-arg {item!r} must be KEY=VALUE")
        overrides[key] = value
    if resolve_base:
        client = registry_client(None)
        for arg, (image, digest) in spec.bases.items():
            if not digest and not overrides.get(arg):
                overrides[arg] = client.resolve(image)
                err_console.print(f"{image} resolves to {overrides[arg]}; set bases.{arg}.digest in "
                                  f"{spec.dir / 'image.yaml'} to make this build repeatable")
    argv = img.build_argv(spec, overrides, tag=tag)
    console.print(shlex.join(argv))
    if dry_run:
        return
    res = subprocess.run(argv, check=False)
    if res.returncode != 0:
        raise CheckFailed(f"images.build {name}: docker build exited {res.returncode}")
    ref = argv[argv.index("-t") + 1]
    if push:
        res = subprocess.run(["docker", "push", ref], check=False)
        if res.returncode != 0:
            raise CheckFailed(f"images.build {name}: docker push {ref} exited {res.returncode}")
    from llmfleet.images import inspect as ins

    try:
        result = ins.inspect_image(spec.catalog_key, ref)
        console.print(f"{ref} carries kernels {' '.join(result.archs) or 'none'}"
                      + (f"; torch {result.torch} {' '.join(result.torch_archs)}" if result.torch else ""))
    except CheckFailed as exc:
        err_console.print(f"could not inspect {ref}: {exc}")
    console.print(hints(f"built {ref}; pin it with `invoke images.pin {spec.catalog_key.replace(':', '=', 1)} --inspect`"))


def _inspect_pinned(entries: list, specs: list, path: Path, *, quiet: bool) -> list:
    """Pull each just-pinned digest from where it was resolved, inspect it, record it in the lock."""
    from llmfleet.images import inspect as ins
    from llmfleet.images.registry import split_reference

    out = []
    for e, s in zip(entries, specs, strict=True):
        repo, _, _ = split_reference(s.ref)
        ref = f"{repo}@{e.digest}"
        have = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=False).returncode == 0
        if not have and subprocess.run(["docker", "pull", "-q", ref], capture_output=True, check=False).returncode != 0:
            raise CheckFailed(f"images.pin --inspect: docker pull {ref} failed; the pin is written, the inspection not")
        result = ins.inspect_image(e.key, ref)
        e = ins.apply(e, result)
        img.write_lock(img.merge(img.load_lock(path), [e]), path)
        if not quiet:
            console.print(f"inspected {e.key}: kernels {' '.join(e.archs) or 'none'}"
                          + (f"; torch {e.torch} {' '.join(e.torch_archs)}" if e.torch else ""))
        out.append(e)
    return out


@fleet_task(
    positional=["key"],
    help={
        "key": "the image's ENGINE:VERSION key in the lock (e.g. vllm:0.19.1 or llamacpp:lab-cpu)",
        "ref": "the local image to run (default: the lock's repository@digest, else repository:tag)",
        "lock": LOCK_HELP,
        "pull": "docker pull the image first when it is not here",
        "no_write": "print what the image carries without writing the lock",
        "json": "print the inspection as JSON",
    },
)
def inspect(c, key, ref=None, lock=None, pull=False, no_write=False, json=False):
    """Run an image once (no GPU, no network) and record what it carries in images.lock: torch version,
    its CUDA and arch list, the engine's version and the archs of its compiled kernels
    (archs_source: inspected, which preflight prefers over the catalog)."""
    from llmfleet.images import inspect as ins

    path = _lock_path(c, lock)
    lock_data = img.load_lock(path)
    entry = lock_data.get(key)
    if entry is None and not no_write:
        known = ", ".join(sorted(lock_data.images)) or "none"
        raise UsageError(f"{path}: no entry {key!r} to record the inspection in (entries: {known}); pin it first "
                         f"with `invoke images.pin {key.replace(':', '=', 1)}`, or pass --no-write")
    if not ref:
        if entry is None:
            raise UsageError(f"images.inspect {key}: give --ref IMAGE (the key is not in {path})")
        ref = f"{entry.repository}@{entry.digest}" if entry.digest else f"{entry.repository}:{entry.tag or 'latest'}"
    if pull:
        res = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, check=False)
        if res.returncode != 0 and subprocess.run(["docker", "pull", ref], check=False).returncode != 0:
            raise CheckFailed(f"images.inspect {key}: docker pull {ref} failed")
    with console.status(f"inspecting {ref} (no GPU, no network)"):
        result = ins.inspect_image(key, ref)
    written = None
    if not no_write and entry is not None:
        lock_data = img.merge(lock_data, [ins.apply(entry, result)])
        path = _writable_lock(path)
        img.write_lock(lock_data, path)
        written = str(path)
    if json:
        print_json({**result.to_dict(), "lock": written})
        return
    from rich.table import Table

    table = Table(title=f"images.inspect {key}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    rows = [("image", ref), ("engine version", result.engine_version or "-"), ("CUDA (image env)", result.cuda or "-"),
            ("engine kernels", " ".join(result.archs) or "none"), ("read from", ", ".join(result.files) or "-")]
    from llmfleet.knowledge.engines import for_engine

    if for_engine(result.engine).needs_torch_kernels:
        rows[3:3] = [("torch", f"{result.torch or '-'} (CUDA {result.torch_cuda or 'none'})"),
                     ("torch archs", " ".join(result.torch_archs) or "none")]
    rows += [("note", n) for n in result.notes]
    for what, value in rows:
        table.add_row(what, value)
    console.print(table)
    if written:
        console.print(f"recorded in {written} (archs_source: inspected)")


@fleet_task(
    name="list",
    help={"lock": LOCK_HELP, "json": "print the entries as JSON"},
)
def list_(c, lock=None, json=False):
    """Show the pinned images with their CUDA, architectures and when a registry last confirmed them."""
    path = _lock_path(c, lock)
    if not path.exists():  # a lock named by --lock or the configuration: a typo is not an empty lock
        raise UsageError(f"{path}: no such lock file; run `invoke images.pin` first or pass --lock")
    lock_data = img.load_lock(path)
    catalog = _catalog_images()
    try:
        root = _dockerfiles(c)
    except UsageError:  # no dockerfiles/ here: nothing listed as buildable
        root = None
    builds = {s.catalog_key: s.name for s in img.all_build_specs(root)} if root is not None else {}
    rows = []
    for key in sorted(set(lock_data.images) | {k for k, r in catalog.items() if not r.cpu}):
        e = lock_data.get(key)
        rows.append({
            "key": key,
            "repository": e.repository if e else catalog[key].repository,
            "tag": e.tag if e else catalog[key].tag,
            "digest": e.digest if e else None,
            "cuda": e.cuda if e else catalog[key].cuda if key in catalog else None,
            "archs": list(e.archs) if e else [],
            "torch": e.torch if e else None,
            "torch_archs": list(e.torch_archs) if e else [],
            "archs_source": e.archs_source if e else None,
            "verified": e.verified if e else None,
            "in_lock": e is not None,
            "in_catalog": key in catalog,
            "dockerfile": builds.get(key),
        })
    if json:
        print_json({"lock": str(path), "images": rows})
        return
    from rich.table import Table

    table = Table(title=f"images {path}")
    for col in ("image", "repository:tag", "digest", "cuda", "archs", "verified", "notes"):
        table.add_column(col, overflow="fold")
    for r in rows:
        digest = r["digest"][:19] + "…" if r["digest"] else "[yellow]not pinned[/]"
        notes = []
        if not r["in_lock"]:
            notes.append("[red]not in the lock[/]")
        if not r["in_catalog"]:
            notes.append("[red]not in catalog/engines.yaml[/]")
        if r["dockerfile"]:
            notes.append(f"built from dockerfiles/{r['dockerfile']}")
        verified = f"{r['verified']['at']} ({r['verified'].get('registry', '')})" if r["verified"] else "never"
        if r["torch"]:
            notes.append(f"torch {r['torch']}: {' '.join(r['torch_archs']) or '-'}")
        if r["archs_source"] == "inspected":
            notes.append("inspected from the image")
        table.add_row(r["key"], f"{r['repository']}:{r['tag']}", digest, r["cuda"] or "-",
                      " ".join(r["archs"]) or "-", verified, "; ".join(notes))
    console.print(table)


@fleet_task(help={"json": "print the findings as JSON"})
def lint(c, json=False):
    """Lint every Dockerfile under dockerfiles/ (exit 1 on findings); rules in docs/images.md."""
    from llmfleet.images.lint import lint_tree

    root = _dockerfiles(c)
    findings = lint_tree(root)
    if json:
        print_json({"ok": not findings, "findings": [f.to_dict() for f in findings]})
    else:
        for f in findings:
            console.print(str(f), markup=False)
        if not findings:
            console.print(f"{root}: no findings")
    if findings:
        raise CheckFailed(f"{len(findings)} Dockerfile findings")


ns = Collection("images")
ns.add_task(pin)
ns.add_task(verify)
ns.add_task(build)
ns.add_task(inspect)
ns.add_task(list_)
ns.add_task(lint)
