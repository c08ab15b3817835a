"""Models in a bundle: carried with the manifest ``llmfleet.models`` writes beside a model, and pushed
to the hosts by ``llmfleet.models.push`` (the shell; the layout and checks are ``contents``).

``bundle.create`` copies each model whose ``model_source`` is a path on this machine to
``models/<model_path without its leading />`` and writes the model's manifest beside the copy
(``models.local.build_local``: every file's size and sha256; ``source`` names the bundle folder, never
this machine's path). A model whose source is a host or a Hugging Face repository is not carried
(the log says so): the site must already hold it. ``deploy --bundle`` pushes each carried model to
the hosts whose services name its ``model_path``, from the bundle, through ``models.push`` (a
verified copy on the host is skipped, a hand copy adopted by ``sha256sum``, a missing one sent).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmfleet.bundle import contents as bc
from llmfleet.errors import UsageError
from llmfleet.inventory.ansible import Inventory, settings_for

Log = Callable[[str], None]


def sources(inv: Inventory, chosen: dict[str, list[str]]) -> dict[str, tuple[str | None, str]]:
    """model_path -> (the local path it comes from, or None when its source is not a local path; the
    first service naming it), over ``chosen`` (host -> service names). Two services naming one
    model_path with different sources: usage error."""
    out: dict[str, tuple[str | None, str]] = {}
    for name, names in chosen.items():
        for s in settings_for(inv.hosts[name]).services:
            if s.name not in names or s.model_path is None:  # an exporter has no model
                continue
            src = s.model_source
            local = os.path.expanduser(src.path) if src is not None and src.path else None
            where = f"host {name}: service {s.name}"
            seen = out.get(s.model_path)
            if seen is not None and seen[0] != local:
                raise UsageError(f"{inv.path}: {where} and {seen[1]} share model_path {s.model_path} but name "
                                 "different model_source values")
            out.setdefault(s.model_path, (local, where))
    return out


def bundle_dir_of(model_path: str) -> str:
    return bc.safe_path(f"{bc.MODELS_DIR}/{model_path.strip('/')}", "model_path")


def carry(inv: Inventory, chosen: dict[str, list[str]], out: Path,
          log: Log) -> tuple[list[bc.BundleModel], list[bc.FileEntry]]:
    """Copy each locally sourced model into the bundle with its manifest beside it."""
    from llmfleet.knowledge import model_manifest as M
    from llmfleet.models import local as L

    models: list[bc.BundleModel] = []
    files: list[bc.FileEntry] = []
    for model_path, (local, where) in sorted(sources(inv, chosen).items()):
        if local is None:
            log(f"{model_path}: not carried ({where} has no model_source path on this machine); the site's hosts "
                "must already hold it")
            continue
        if not os.path.exists(local):
            raise UsageError(f"{where}: model_source {local} does not exist on this machine")
        rel = bundle_dir_of(model_path)
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if os.path.isdir(local):
            shutil.copytree(local, dest, symlinks=False)
        else:
            shutil.copyfile(local, dest)
        try:
            manifest = L.build_local(str(dest), model_path, source={"bundle": rel})
        except ValueError as exc:
            raise UsageError(f"{where}: model_source {local}: {exc}") from None
        mrel = rel + M.SUFFIX
        text = manifest.to_json().encode()
        (out / mrel).write_bytes(text)
        files.append(bc.FileEntry(mrel, len(text), "sha256:" + hashlib.sha256(text).hexdigest()))
        for f in manifest.files:  # a file model's one entry is the copy itself; a folder's, its files
            files.append(bc.FileEntry(f"{rel}/{f.path}" if manifest.kind == "dir" else rel, f.size, "sha256:" + f.sha256))
        models.append(bc.BundleModel(name=where.split("service ", 1)[1], dir=rel, host_path=model_path,
                                     manifest=mrel))
        log(f"{model_path}: carried from {local} ({manifest.total_size / 1e6:.1f} MB, {len(manifest.files)} file(s))")
    return models, files


def push_models(prepared: list[Any], settings: Any, source: Any, *, forks: int, log: Log,
                accept_new_host_keys: bool = False, task: str = "deploy") -> dict[str, str]:
    """``models.push`` of every carried model to the prepared hosts whose services name its model_path,
    from the bundle, each under the host's deploy lock as ``models.push`` takes it, but refused at once
    (as the ``task`` it is part of would be) when another writer holds it. Returns host -> why it failed."""
    from llmfleet.models import push
    from llmfleet.release.who import default_who

    by_path = {m.host_path: m for m in source.bundle.models}
    jobs: list[Any] = []
    for ph in prepared:
        paths: dict[str, list[str]] = {}
        for p in ph.services:
            if p.service.model_path in by_path:
                paths.setdefault(p.service.model_path, []).append(p.service.name)
        for model_path, names in paths.items():
            origin = push.Origin("local", str(Path(source.dir) / by_path[model_path].dir))
            jobs.append(push.Job(ph.host, ph.settings, model_path.rstrip("/") or "/", names, origin,
                                 ph.services[0].service.engine))
    if not jobs:
        return {}
    inv = prepared[0].inventory
    options = push.Options(forks=forks, accept_new_host_keys=accept_new_host_keys, who=default_who(), lock_wait=0,
                           lock_action=f"{task} --bundle (models.push)")
    outcomes = push.push(inv, jobs, config=settings, options=options)
    failed: dict[str, str] = {}
    for o in outcomes:
        log(push.line(o) if o.ok else f"{o.host}: {o.model_path}: {push.line(o)}")
        if not o.ok:
            failed.setdefault(o.host, f"model {o.model_path}: {o.error or o.reason or o.result}")
    return failed
