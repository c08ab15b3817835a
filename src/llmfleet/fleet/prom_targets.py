"""Prometheus ``file_sd`` targets from the inventory and the hosts' release state (pure).

One target per engine metrics endpoint a host serves from its current release, labelled with what
llmfleet knows of it: host, group(s), service, engine, model, quant, card, driver, release, served
model name, the release's decode floor (its health mark) and whether the host's driver drives its card
at all. Label values are plain text, bounded; no secret is ever a label or in any file written here.

Not every endpoint can be scraped from elsewhere: an engine published on a loopback address answers
only on its host (``Unreachable``, with the reason and the fix). llama-server's ``/metrics`` answers
only with the service's API key (``EngineKnowledge.metrics_need_key``): such targets go into a file of
their own per key source, scraped by a job whose ``authorization.credentials_file`` the operator fills
(``scrape_jobs``: the job text names the file, never the key).

Layout of the targets folder (``files_for_host``), one file per host per job, so a deploy re-writes
only its host's files and Prometheus (``file_sd_configs`` globs) follows without a restart::

    DIR/engines/HOST.json           targets scraped without a key
    DIR/auth-KEYID/HOST.json        targets whose /metrics needs the key named by KEYID
    DIR/rules/HOST.yml              the host's decode floors and unconfirmed releases as recording rules
    DIR/scrape-jobs.yml             the scrape jobs to paste into prometheus.yml
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from llmfleet.errors import UsageError
from llmfleet.fleet.status import HostStatus, card_label
from llmfleet.inventory.ansible import Host
from llmfleet.inventory.services import HostSettings, SecretRef, Service
from llmfleet.knowledge import engines

PLAIN_JOB = "engines"
EXPORTER_JOB = "exporters"  # node and DCGM exporters deployed as services: no key, their own job
GATEWAY_JOB = "gateways"  # the gateways' own metrics (HAProxy's exporter, release.gateway_config.metrics_port)
KEYS_DIR = "/etc/prometheus/llmfleet-keys"  # where the scrape jobs read API keys from (the operator writes them)
LABEL_MAX = 200
LABELS = ("host", "group", "groups", "service", "engine", "model", "quant", "card", "driver", "release",
          "served_model_name", "floor_tokps", "driver_drives_card")
LOOPBACK_FIX = ("publish the engine beyond loopback (llmfleet_bind_address: the host's private address, or "
                "0.0.0.0; with api_key) and let only "
                "the Prometheus server and your clients reach that port (a firewall rule in Docker's DOCKER-USER "
                "chain: published ports bypass the host's INPUT rules), then deploy")
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Target:
    """One scrape target: ``address`` (host:port) in the file of ``job``, with its labels."""

    host: str
    service: str
    address: str
    job: str
    labels: dict[str, str]
    key_source: str = ""  # where the key comes from (env NAME, file PATH, vault): never the key itself

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Unreachable:
    """An endpoint Prometheus cannot scrape from elsewhere, why, and the fix."""

    host: str
    service: str
    reason: str
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HostTargets:
    host: str
    targets: list[Target] = field(default_factory=list)
    unreachable: list[Unreachable] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"service", "reason"}: not deployed, ...
    read: bool = True  # False: the host was not read; targets come from the inventory alone
    unconfirmed: list[dict[str, Any]] = field(default_factory=list)  # {"service", "release", "deadline"}


def sanitise(value: Any) -> str:
    """A label value: printable text on one line, at most ``LABEL_MAX`` characters (empty for None)."""
    if value is None:
        return ""
    text = re.sub(r"[\x00-\x1f\x7f]+", " ", str(value)).strip()
    return text[:LABEL_MAX]


def job_name(job: str) -> str:
    return f"llmfleet-{job}"


def key_id(ref: SecretRef) -> str:
    """A stable, key-free name for where a service's key comes from (the env variable's or the file's
    name; a vaulted value by a digest of its ciphertext, which says nothing of the key)."""
    if ref.from_env:
        raw = f"env-{ref.from_env}"
    elif ref.from_file:
        raw = f"file-{ref.from_file.rstrip('/').rsplit('/', 1)[-1]}"
    else:
        cipher = getattr(ref.vault, "ciphertext", str(ref.vault))
        raw = "vault-" + hashlib.sha256(str(cipher).encode()).hexdigest()[:12]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw).lower()[:80]


def key_source(ref: SecretRef) -> str:
    if ref.from_env:
        return f"env {ref.from_env}"
    if ref.from_file:
        return f"file {ref.from_file}"
    return "vault"


def _groups(host: Host) -> list[str]:
    return [g for g in host.groups if g not in ("all", "ungrouped")]


def _loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _scrape_address(host: Host, bind: str, port: int) -> str:
    """Where Prometheus reaches the port: the address it is bound to, or the host's address for a
    wildcard bind."""
    addr = host.address if bind in ("0.0.0.0", "::", "") else bind
    return f"[{addr}]:{port}" if ":" in addr and not addr.startswith("[") else f"{addr}:{port}"


def _cards(gpus: Sequence[str], service: Service, inventory_gpu: str | None) -> str:
    if service.gpus == "all":
        return card_label(gpus, inventory_gpu)
    picked = [gpus[i] for i in service.gpus if i < len(gpus)]
    return card_label(picked, inventory_gpu)


def drives_card(driver: str | None, card: str | None) -> str:
    """``"false"`` when the driver's branch no longer drives the card (the catalog's
    ``driver_card_support``), ``"true"`` when it does, ``""`` when either is unknown."""
    from llmfleet.knowledge.catalog import find_gpu
    from llmfleet.knowledge.compat import check_driver_drives_card, load_engine_catalog

    if not driver or not card:
        return ""
    try:
        gpu = find_gpu(card)
    except (UsageError, KeyError, LookupError):
        return ""
    verdict = check_driver_drives_card(load_engine_catalog(), driver, card, gpu.compute_capability)
    return "false" if verdict is not None else "true"


def service_labels(host: Host, settings: HostSettings, service: Service, *, release: str, card: str,
                   driver: str | None, floor: float | None, inventory_card: str | None) -> dict[str, str]:
    groups = _groups(host)
    labels = {
        "host": host.name,
        "group": groups[-1] if groups else "",  # the deepest (Host.groups is ordered by depth): its vars win
        "groups": "," + ",".join(groups) + "," if groups else "",
        "service": service.name,
        "engine": service.engine,
        "model": service.model or "",
        "quant": service.quant or "",
        "card": card,
        "driver": driver or "",
        "release": release,
        "served_model_name": service.public_name if service.is_engine else "",
        "floor_tokps": f"{floor:.1f}" if floor is not None else "",
        "driver_drives_card": drives_card(driver, inventory_card or settings.gpu),
    }
    return {k: sanitise(v) for k, v in labels.items() if sanitise(v) != ""}


def _floor(status: HostStatus, name: str) -> float | None:
    st = status.states.get(name)
    info = st.current_release if st else None
    v = info.health.get("floor_tokps") if info is not None and info.health else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def unconfirmed(service: Service, settings: HostSettings, release: str) -> dict[str, Any]:
    """A current release with no health mark: when the host's revert timer should have put it back (the
    release's time, from its id, plus ``confirm.timeout_s``; None when the id tells no time)."""
    from llmfleet.knowledge.release_state import release_time
    from llmfleet.release import confirm

    try:
        start = release_time(release).timestamp()
    except ValueError:
        return {"service": service.name, "release": release, "deadline": None}
    return {"service": service.name, "release": release, "deadline": int(start) + confirm.timeout_s(service, settings)}


def host_targets(host: Host, settings: HostSettings | None, status: HostStatus | None) -> HostTargets:
    """The targets of one host: every inventory service with a current release on the host (a stopped one
    too: Prometheus then reports it down). ``status`` None or unreachable: the inventory's services, with
    the release ``unknown`` (``read`` False)."""
    out = HostTargets(host=host.name, read=bool(status and status.reachable))
    if settings is None:
        return out
    gpus = status.gpus if status is not None and status.reachable else []
    driver = status.driver if status is not None and status.reachable else None
    for svc in settings.services:
        if out.read:
            assert status is not None
            st = status.states.get(svc.name)
            if st is None or not st.current:
                out.skipped.append({"service": svc.name, "reason": "not deployed (no current release)"})
                continue
            release = st.current
            info = st.current_release
            if info is not None and info.health is None:
                out.unconfirmed.append(unconfirmed(svc, settings, release))
        else:
            release = UNKNOWN
        bind = settings.bind_address_for(svc)
        if _loopback(bind):
            out.unreachable.append(Unreachable(
                host=host.name, service=svc.name,
                reason=f"published on loopback ({bind}:{svc.port}): only the host itself can reach /metrics",
                fix=LOOPBACK_FIX))
            continue
        card = _cards(gpus, svc, settings.gpu)
        one_card = None
        if gpus:
            picked = gpus if svc.gpus == "all" else [gpus[i] for i in svc.gpus if i < len(gpus)]
            one_card = picked[0] if picked else None
        labels = service_labels(host, settings, svc, release=release, card=card, driver=driver,
                                floor=_floor(status, svc.name) if out.read and status is not None else None,
                                inventory_card=one_card)
        need_key = (svc.api_key is not None and svc.is_engine
                    and engines.for_engine(svc.engine).metrics_need_key)
        plain = EXPORTER_JOB if svc.is_exporter else PLAIN_JOB if svc.is_engine else GATEWAY_JOB
        port = svc.port
        if svc.gateway is not None:  # its metrics, not its clients' port
            from llmfleet.release.gateway_config import metrics_port

            port = metrics_port(svc.gateway.admin_port)
        out.targets.append(Target(
            host=host.name, service=svc.name, address=_scrape_address(host, bind, port),
            job=f"auth-{key_id(svc.api_key)}" if need_key and svc.api_key is not None else plain,
            labels=labels, key_source=key_source(svc.api_key) if need_key and svc.api_key is not None else ""))
    return out


def file_sd(targets: Sequence[Target]) -> str:
    """A ``file_sd`` JSON document: one group per target (each has labels of its own), sorted."""
    groups = [{"targets": [t.address], "labels": dict(sorted(t.labels.items()))}
              for t in sorted(targets, key=lambda t: (t.host, t.service))]
    return json.dumps(groups, indent=2) + "\n"


def safe_file_name(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", host).lstrip(".") or "_"


def files_for_host(ht: HostTargets) -> dict[str, str]:
    """Relative path -> content of every file this host has (the plain job's file always, so a host
    whose services went away is emptied)."""
    by_job: dict[str, list[Target]] = {PLAIN_JOB: [], EXPORTER_JOB: [], GATEWAY_JOB: []}
    for t in ht.targets:
        by_job.setdefault(t.job, []).append(t)
    files = {f"{job}/{safe_file_name(ht.host)}.json": file_sd(ts) for job, ts in sorted(by_job.items())}
    files[f"{HOST_RULES}/{safe_file_name(ht.host)}.yml"] = host_rules(ht)
    return files


HOST_RULES = "rules"


def host_rules(ht: HostTargets) -> str:
    """A rules file of what the alert rules compare with and Prometheus cannot read from a label (it has no
    way to turn a label into a number): each service's decode floor (``llmfleet:decode_floor_tokps``, from
    its release's health mark; LlmfleetDecodeBelowFloor) and, for a current release never confirmed, when
    the host's revert timer should have put it back (``llmfleet:release_unconfirmed_deadline_seconds``, Unix
    time; LlmfleetReleaseUnconfirmed). Labels host, service, release."""
    rules = []
    for t in sorted(ht.targets, key=lambda t: t.service):
        floor = t.labels.get("floor_tokps")
        if not floor:
            continue
        labels = {k: t.labels[k] for k in ("host", "service", "release") if k in t.labels}
        rules += ["      - record: llmfleet:decode_floor_tokps",
                  f"        expr: vector({float(floor)!r})",
                  "        labels: " + json.dumps(labels, sort_keys=True)]
    for u in sorted((u for u in ht.unconfirmed if u["deadline"] is not None), key=lambda u: u["service"]):
        labels = {"host": sanitise(ht.host), "service": sanitise(u["service"]), "release": sanitise(u["release"])}
        rules += ["      - record: llmfleet:release_unconfirmed_deadline_seconds",
                  f"        expr: vector({int(u['deadline'])})",
                  "        labels: " + json.dumps(labels, sort_keys=True)]
    if not rules:
        return "groups: []\n"
    return "\n".join(["groups:", f"  - name: {json.dumps('llmfleet-host-' + ht.host)}", "    rules:", *rules]) + "\n"


def credentials_path(keys_dir: str, job: str) -> str:
    return f"{keys_dir.rstrip('/')}/{job.removeprefix('auth-')}"


def scrape_jobs(out_dir: str, jobs: Sequence[str], *, keys_dir: str = KEYS_DIR,
                interval: str = "15s", sources: dict[str, str] | None = None) -> str:
    """The ``scrape_configs`` entries that read the targets folder: one job for the plain targets and one
    per key source, whose bearer token Prometheus reads from a file the operator writes (mode 0600,
    owned by the prometheus user). The key itself is never written here."""
    lines = ["# Scrape jobs for the targets llmfleet writes (invoke prometheus.targets); paste under",
             "# scrape_configs: in prometheus.yml. Prometheus re-reads the targets files when they change.",
             "# The hosts' floors and unconfirmed releases are recording rules: add them to rule_files (re-read on a reload:",
             "# SIGHUP or POST /-/reload), next to llmfleet's alert rules (invoke prometheus.rules):",
             f"#   rule_files: ['{out_dir.rstrip('/')}/{HOST_RULES}/*.yml', '/etc/prometheus/rules/llmfleet-rules.yml']",
             "scrape_configs:"]
    for job in sorted(set(jobs) | {PLAIN_JOB, EXPORTER_JOB, GATEWAY_JOB}):
        lines += [f"  - job_name: {job_name(job)}",
                  f"    scrape_interval: {interval}",
                  "    metrics_path: /metrics",
                  "    file_sd_configs:",
                  f"      - files: ['{out_dir.rstrip('/')}/{job}/*.json']"]
        if job not in (PLAIN_JOB, EXPORTER_JOB, GATEWAY_JOB):
            src = (sources or {}).get(job, "")
            lines += [f"    # llama-server's /metrics needs the API key ({src or 'its api_key'}): write it, and only it,",
                      "    # into this file (chmod 0600, owned by the prometheus user)",
                      "    authorization:",
                      "      type: Bearer",
                      f"      credentials_file: {credentials_path(keys_dir, job)}"]
    return "\n".join(lines) + "\n"


def report(hosts: Sequence[HostTargets]) -> dict[str, Any]:
    """The ``--json`` document: targets, endpoints Prometheus cannot reach, services skipped, hosts not read."""
    return {
        "targets": [t.to_dict() for h in hosts for t in h.targets],
        "unreachable": [u.to_dict() for h in hosts for u in h.unreachable],
        "skipped": [{"host": h.host, **s} for h in hosts for s in h.skipped],
        "hosts_not_read": [h.host for h in hosts if not h.read],
        "unconfirmed": [{"host": h.host, **u} for h in hosts for u in h.unconfirmed],
    }
