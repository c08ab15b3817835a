"""The health floor ``invoke plan`` shows: the one a deploy of the plan would gate on, from the deploy's
own function (``health.check.decode_floor``), with the inventory file that set it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmfleet.knowledge.plan_answer import AnswerFloor

if TYPE_CHECKING:
    from llmfleet.inventory.services import HostSettings, Service
    from llmfleet.knowledge.planner import Plan

# decode_floor's words for an inventory setting -> the variable that holds it
_VARIABLES = (("the service's health.", "llmfleet_services"),
              ("the host's llmfleet_health_min_tokps", "llmfleet_health_min_tokps"),
              ("the host's llmfleet_health_floor_fraction", "llmfleet_health_floor_fraction"))


def floor_origin(source: str, sources: dict[str, str]) -> str:
    """The inventory file that set the figure ``decode_floor`` names in ``source`` (``Host.sources``:
    variable -> file); empty when the floor is not the inventory's."""
    for words, variable in _VARIABLES:
        if words in source:
            return sources.get(variable, "")
    return ""


def deploy_floor(p: Plan, service: Service | None = None, settings: HostSettings | None = None,
                 records: list[Any] | None = None, *, image: str | None = None, lab: bool = False,
                 sources: dict[str, str] | None = None) -> AnswerFloor:
    """The floor a deploy of ``p`` would apply: ``health.decode_floor`` for ``service`` on a host with
    ``settings`` (no service: one with the default health settings, no host settings), with the fleet's
    gate from ``records`` (``speed_cache.load()``) for ``image`` (the service's image key; default the
    plan's), as the deploy builds it. ``p`` must be planned as the deploy plans it (no speed overlay)."""
    from llmfleet.health import check as health
    from llmfleet.health import speed_history
    from llmfleet.inventory.services import HealthSettings, Service
    from llmfleet.knowledge.planner import summarize

    summary = summarize(p)
    # no service: what the deploy reads of one (its health settings) at their defaults
    svc = service if service is not None else Service.model_construct(
        name="plan", engine="llamacpp" if p.engine == "llamacpp" else "vllm", image=p.image or "", health=HealthSettings())
    key_image = image if image is not None else (str(service.image) if service is not None and service.image else p.image)
    fleet = speed_history.gate_for(summary, key_image, cached=records or [], lab=lab) if records else None
    floor = health.decode_floor(svc, settings, summary, fleet)
    return AnswerFloor(floor.tokps, floor.source, floor_origin(floor.source, sources or {}))
