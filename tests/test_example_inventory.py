"""The example fleet in inventory/example/ reads like a real one: it validates, and every service it
declares fits its card according to the planner (an example that would be refused is no example)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.inventory.ansible import load_inventory
from llmfleet.knowledge.planner import plan_for_service

EXAMPLE = Path(__file__).resolve().parents[1] / "inventory" / "example"


def _services():
    inv = load_inventory(str(EXAMPLE))
    for name in sorted(inv.hosts):
        settings = inv.settings_for(inv.hosts[name])
        for svc in settings.services:
            yield pytest.param(settings, svc, id=f"{name}/{svc.name}")


def test_example_inventory_validates():
    inv = load_inventory(str(EXAMPLE))
    assert "gpu-v100-01" in inv.hosts
    assert inv.hosts["gpu-v100-01"].vars["llmfleet_gpu"].startswith("Tesla V100-SXM2-32GB")


@pytest.mark.parametrize(("settings", "service"), list(_services()))
def test_every_example_service_fits_its_card(settings, service):
    plan = plan_for_service(service, settings.gpu, 1)
    assert plan.fits, f"{service.name}: {plan.to_dict().get('reasons') or plan.to_dict()}"
    assert plan.resident


@pytest.mark.parametrize(("settings", "service"), list(_services()))
def test_every_example_image_is_locked_catalogued_and_has_kernels_for_the_card(settings, service):
    from llmfleet.images.lock import load_lock
    from llmfleet.knowledge.catalog import find_gpu
    from llmfleet.knowledge.compat import check_architecture, load_engine_catalog

    assert load_lock().get(service.image) is not None, f"{service.image} is not in images.lock"
    rel = load_engine_catalog().release(service.image)
    assert rel is not None, f"{service.image} is not in catalog/engines.yaml"
    card = find_gpu(settings.gpu)
    verdict = check_architecture(rel, card.name, card.compute_capability)
    assert verdict.status == "pass", verdict.message


@pytest.mark.parametrize(("settings", "service"), list(_services()))
def test_every_example_service_is_published_safely(settings, service):
    """The example shows the safe form: off loopback, every service has an API key."""
    from llmfleet.knowledge.preflight import bind_check

    check = bind_check(service, settings)
    assert check.status == "pass", check.message
    assert service.api_key is not None
