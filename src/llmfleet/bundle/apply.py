"""What ``deploy --bundle`` and ``upgrade --bundle`` do with a bundle, in one place.

``open_bundle``: before any host is contacted, the services chosen must be single-host ones and every
file of the bundle must match its ``bundle.json`` (``check.verified``); the hosts' preparation then
localizes each image through the returned ``Verified`` (another images.lock, an image the bundle
lacks: a usage error naming it). ``put_in_place``: for a set of prepared hosts, each one's image
archives it lacks (sent, ``docker load``-ed, image ID checked, tagged: ``load.load_hosts``), then its
models (``models.push`` from the bundle: ``models.push_models``); the hosts where either failed come
back as failed outcomes and are left out of the deploy. ``deploy --bundle`` runs it once over every
host, ``upgrade --bundle`` once per batch, just before that batch deploys.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from llmfleet.bundle import check

Log = Callable[[str], None]


def open_bundle(path: str, hosts: Sequence[Any], services: Callable[[str], list[str] | None], *,
                task: str = "deploy") -> check.Verified:
    """The bundle at ``path``, every file checked (exit 1 naming each missing or corrupt one), once
    no chosen service spans hosts (``services(host name)``: the services chosen there, None for all;
    usage error). Nothing is contacted."""
    for h in hosts:
        check.refuse_spanning([h], services(h.name), task=task)
    return check.verified(path)


def put_in_place(verified: check.Verified, prepared: dict[str, Any], settings: Any, *, forks: int, log: Log,
                 accept_new_host_keys: bool = False, task: str = "deploy") -> tuple[dict[str, Any], list[Any]]:
    """Each prepared host's images from the bundle (sent when its engine lacks them, loaded, image ID
    checked, tagged), then its models (models.push from the bundle), each under the host's deploy
    lock, taken as the ``task`` (deploy or upgrade) would take it: refused at once naming the holder
    when another writer holds it. Returns the hosts ready to deploy (name -> ``PreparedHost``) and a
    failed ``HostOutcome`` for each of the others (nothing was switched on them)."""
    from llmfleet.bundle.load import load_hosts, send_file
    from llmfleet.bundle.models import push_models
    from llmfleet.release.decide import HostOutcome, Result

    failed = load_hosts(list(prepared.values()), settings, verified, forks=forks, send=send_file, log=log,
                        accept_new_host_keys=accept_new_host_keys, task=task)
    loaded = [p for h, p in prepared.items() if h not in failed]
    if loaded:
        failed.update(push_models(loaded, settings, verified, forks=forks, log=log,
                                  accept_new_host_keys=accept_new_host_keys, task=task))
    outcomes = [HostOutcome(host=h, result=Result.FAILED, reason=f"{why}; nothing was switched")
                for h, why in failed.items()]
    return {h: p for h, p in prepared.items() if h not in failed}, outcomes
