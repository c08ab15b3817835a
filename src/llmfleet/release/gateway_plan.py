"""The gateway's view of the fleet, from the inventory alone (nothing contacted): the engine services it
fronts (its ``upstreams``' hosts, groups expanded), where it reaches each one, which key each one wants,
its clients' keys as hashes, and, for a replica about to restart, the gateways that front it.

``plan_gateway`` gives what a gateway release is rendered from (``release.gateway_config``'s spec, the
secret values its env file and TLS file hold); ``fronting`` gives the drain targets of one replica. A
problem is a ``UsageError`` naming the file, host, service and fix, raised before any host is contacted.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass

from llmfleet.errors import UsageError
from llmfleet.inventory.ansible import Host, Inventory, settings_for
from llmfleet.inventory.services import GATEWAY_KIND, SecretRef, Service
from llmfleet.release import gateway_config as gc
from llmfleet.release.render import service_dir
from llmfleet.release.secret import resolve_secret

Resolver = Callable[[SecretRef | None, str], str | None]


@dataclass(frozen=True)
class GatewayPlan:
    spec: gc.GatewaySpec
    env: dict[str, str]  # secret: the replicas' keys by the env names haproxy.cfg references
    tls_pem: str | None  # secret: certificate chain then private key


@dataclass(frozen=True)
class Front:
    """One gateway in front of one replica: where to drain it."""

    host: Host  # the gateway's host
    service: Service  # the gateway service
    backend: str
    server: str

    @property
    def admin_port(self) -> int:
        assert self.service.gateway is not None
        return self.service.gateway.admin_port

    @property
    def drain_timeout_s(self) -> int:
        assert self.service.gateway is not None
        return self.service.gateway.drain_timeout_s


def _where(inv: Inventory, host: Host, service: Service) -> str:
    return f"{host.sources.get('llmfleet_services', str(inv.path))}: host {host.name}: service {service.name}"


def upstream_hosts(inv: Inventory, gateway_host: Host, service: Service) -> list[Host]:
    """The hosts a gateway fronts, groups expanded, in the order given (each once)."""
    assert service.gateway is not None
    out: list[Host] = []
    for item in service.gateway.upstreams:
        if item in inv.hosts:
            names = [item]
        elif item in inv.groups:
            names = inv.group_hosts(item)
        else:
            from llmfleet.suggest import did_you_mean

            raise UsageError(f"{_where(inv, gateway_host, service)}: gateway.upstreams: {item!r} is neither a host "
                             f"nor a group of the inventory{did_you_mean(item, [*inv.hosts, *inv.groups])}")
        out += [inv.hosts[n] for n in names if inv.hosts[n] not in out]
    return out


def key_env(ref: SecretRef) -> str:
    """The env variable that carries a replica's key to the gateway: named by the reference (not the
    key), so replicas sharing one reference share one variable."""
    digest = hashlib.sha256(json.dumps(ref.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:12]
    return f"LLMFLEET_UPSTREAM_KEY_{digest.upper()}"


def reach(gateway_host: Host, host: Host, service: Service) -> str | None:
    """The address the gateway reaches a replica at, or None when it cannot (loopback on another host)."""
    bind = settings_for(host).bind_address_for(service)
    ip = ipaddress.ip_address(bind)
    if ip.is_unspecified:
        return host.address
    if ip.is_loopback:
        return "127.0.0.1" if host.name == gateway_host.name else None
    return bind


def replicas(inv: Inventory, gateway_host: Host, service: Service) -> list[tuple[Host, Service, str]]:
    """(host, engine service, address) for every engine service on the gateway's upstream hosts."""
    out = []
    for h in upstream_hosts(inv, gateway_host, service):
        for svc in settings_for(h).services:
            if not svc.is_engine:
                continue  # an exporter or a gateway (a service over several hosts is listed on its head, which serves)
            address = reach(gateway_host, h, svc)
            if address is None:
                raise UsageError(f"{_where(inv, h, svc)}: listens on loopback, so gateway {service.name} on "
                                 f"{gateway_host.name} cannot reach it: set bind_address (or llmfleet_bind_address) "
                                 "to the host's private address")
            out.append((h, svc, address))
    return out


def plan_gateway(inv: Inventory, host: Host, service: Service, resolve: Resolver | None = None) -> GatewayPlan:
    """What the gateway release is rendered from. Raises ``UsageError`` (nothing contacted).
    ``resolve(ref, where)``: reads a secret (default: ``release.secret.resolve_secret``, which names
    the field and refuses a key file others can read; a certificate may be readable)."""

    def get(ref: SecretRef | None, where: str, field: str, public: bool = False) -> str | None:
        if resolve is not None:
            return resolve(ref, where)
        return resolve_secret(ref, where, field=field, public=public)

    gw = service.gateway
    if service.engine != GATEWAY_KIND or gw is None:
        raise UsageError(f"{_where(inv, host, service)}: not a gateway service")
    where = _where(inv, host, service)
    found = replicas(inv, host, service)
    if not found:
        raise UsageError(f"{where}: gateway.upstreams {', '.join(gw.upstreams)} hold no engine service: "
                         "name the hosts or groups whose services it fronts")
    env: dict[str, str] = {}
    reps: list[gc.Replica] = []
    for h, svc, address in found:
        name = None
        if svc.api_key is not None:
            name = key_env(svc.api_key)
            value = get(svc.api_key, f"host {h.name}: service {svc.name}", "api_key")
            if value is None:
                raise UsageError(f"{_where(inv, h, svc)}: its api_key could not be read for gateway {service.name}")
            env[name] = value
        reps.append(gc.Replica(host=h.name, service=svc.name, address=address, port=svc.port,
                               served_name=svc.public_name, key_env=name, maxconn=max(1, svc.concurrency)))
    keys: list[gc.ClientKey] = []
    for k in gw.api_keys:
        value = get(k.key, f"{where}: gateway.api_keys {k.name}", "key")
        if not value:
            raise UsageError(f"{where}: gateway.api_keys {k.name}: the key is empty")
        keys.append(gc.ClientKey(name=k.name, sha256_hex=hashlib.sha256(value.encode()).hexdigest(),
                                 requests_per_minute=k.requests_per_minute))
    tls_pem = None
    if gw.tls is not None:
        cert = get(gw.tls.cert, f"{where}: gateway.tls", "cert", public=True)
        key = get(gw.tls.key, f"{where}: gateway.tls", "key")
        if not cert or "BEGIN" not in cert or not key or "PRIVATE KEY" not in key:
            raise UsageError(f"{where}: gateway.tls: cert must be a PEM certificate chain and key a PEM private key")
        tls_pem = cert.rstrip("\n") + "\n" + key.rstrip("\n") + "\n"
    settings = settings_for(host)
    try:
        spec = gc.GatewaySpec(name=service.name, bind=settings.bind_address_for(service), port=service.port,
                              admin_port=gw.admin_port, tls=tls_pem is not None,
                              max_body_bytes=gw.max_body_mib * 1024 * 1024, timeout_s=gw.timeout_s,
                              replicas=tuple(reps), keys=tuple(keys),
                              config_dir=f"{service_dir(settings, service)}/current")
        gc.render_files(spec)  # a spec the config cannot hold (replicas of one name with different keys)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return GatewayPlan(spec=spec, env=env, tls_pem=tls_pem)


def fronting(inv: Inventory, host_name: str, service_name: str) -> list[Front]:
    """The gateways (any host of the inventory) whose upstreams hold this replica; empty when none.
    An inventory problem in a gateway that does not front it is not this replica's: skipped."""
    out: list[Front] = []
    for gh in inv.hosts.values():
        try:
            services = settings_for(gh).services
        except Exception:  # noqa: BLE001 - a host whose variables do not load fronts nothing here
            continue
        for gsvc in services:
            if gsvc.engine != GATEWAY_KIND or gsvc.gateway is None:
                continue
            try:
                found = replicas(inv, gh, gsvc)
            except UsageError:
                continue
            for h, svc, _address in found:
                if h.name == host_name and svc.name == service_name:
                    out.append(Front(host=gh, service=gsvc, backend=gc.backend_name(svc.public_name),
                                     server=gc.server_name(h.name, svc.name)))
    return out
