"""Where the host itself reaches a service's published port: the health check's, status's and bench's
SSH tunnels and the watchdog's probes all go there. A service bound to one address of the host (its
private address, for a scraper or a gateway on another machine) is not reachable on 127.0.0.1."""

from __future__ import annotations

import pytest

from llmfleet.fleet import status as S
from llmfleet.health import watchdog
from llmfleet.inventory.services import host_settings
from llmfleet.release import executor as X
from llmfleet.settings import Settings
from tests.fake_remote import FakeRemote


def hs(host_bind: str | None, service_bind: str | None = None):
    svc = {"name": "chat", "engine": "vllm", "model": "m", "model_path": "/m", "image": "vllm:x", "port": 8000,
           "api_key": {"from_env": "CHAT_KEY"}, **({"bind_address": service_bind} if service_bind else {})}
    return host_settings("h1", {"llmfleet_services": [svc], **({"llmfleet_bind_address": host_bind} if host_bind else {})})


@pytest.mark.parametrize(("host_bind", "service_bind", "reach", "probe"), [
    (None, None, "127.0.0.1", "127.0.0.1"),                   # the default wildcard bind
    ("0.0.0.0", None, "127.0.0.1", "127.0.0.1"),
    ("127.0.0.1", None, "127.0.0.1", "127.0.0.1"),
    ("10.0.0.5", None, "10.0.0.5", "10.0.0.5"),               # the host's private address only
    ("0.0.0.0", "10.0.0.7", "10.0.0.7", "10.0.0.7"),          # the service's own bind wins
    ("::", None, "127.0.0.1", "127.0.0.1"),
    ("fd00::5", None, "fd00::5", "[fd00::5]"),
])
def test_the_host_reaches_the_port_where_it_is_bound(host_bind, service_bind, reach, probe):
    settings = hs(host_bind, service_bind)
    svc = settings.services[0]
    assert settings.reach_address_for(svc) == reach
    assert watchdog.probe_address(settings.bind_address_for(svc)) == probe


def test_status_reads_metrics_through_a_tunnel_to_the_bound_address():
    settings = hs("10.0.0.5")
    remote = FakeRemote([])
    S.fetch_metrics(remote, settings.services[0], address=settings.reach_address_for(settings.services[0]))
    assert remote.forwarded_to == ["10.0.0.5"]


def test_the_health_check_tunnels_to_the_bound_address(monkeypatch):
    from llmfleet.health import check as health

    settings = hs("10.0.0.5")
    remote = FakeRemote([])
    seen = []

    class Checker:
        def __init__(self, **kw):
            seen.append(kw["base_url"])

        def run(self):
            return "report"

    monkeypatch.setattr(health, "HealthChecker", Checker)
    run = X.HostRun("h1", settings, remote, settings=Settings(), log=lambda _l: None)
    target = X.HealthTarget(settings.services[0], None, None, "r1", None)  # type: ignore[arg-type]
    assert X.http_health(run, target) == "report"
    assert remote.forwarded_to == ["10.0.0.5"] and seen == ["http://127.0.0.1:1"]
