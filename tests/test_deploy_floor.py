"""Every decode-floor source docs/deploy.md lists, walked through the real deploy path: the planner's
plan (or a summary read back), ``run_deploy`` on the scripted remote, the ``HealthTarget`` it builds,
and the floor the health check would apply (``executor.floor_for``, the function ``http_health`` calls).

A regression guard for the seam where a typed plan is passed on: the planner's own floor and the
fleet's history must reach the health check, not fall back silently to a default.
"""

from __future__ import annotations

import json

import pytest

from llmfleet.health.check import HealthReport, StageResult
from llmfleet.images.lock import resolve
from llmfleet.inventory.services import host_settings
from llmfleet.knowledge import release_state
from llmfleet.knowledge.planner import PlanRequest, PlanSummary, plan
from llmfleet.release import confirm
from llmfleet.release import deploy as D
from llmfleet.release import executor as E
from llmfleet.release.manifest import build as manifest_build
from llmfleet.release.render import render
from llmfleet.settings import Settings
from tests.deploy_fixtures import LOCK, NOW, R1, ROOT
from tests.fake_remote import Command, FakeRemote

TOKEN = "0a" * 16
GPU = "v100-sxm2-32gb"
PLAN = plan(PlanRequest(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu=GPU, engine="llamacpp", context=4096,
                        image="llamacpp:b5000-cu122"))
LOW = PLAN.decode_tokps_realistic[0]
HEALTHY = HealthReport(ok=True, stages=[StageResult("completion", True, 0.5, "ok")], decode_tokps=50.0)


def _settings(health: dict | None, host: dict | None) -> tuple:
    svc = {"name": "chat", "engine": "llamacpp", "model": "qwen2.5-7b-instruct", "quant": "q4_k_m",
           "model_path": "/srv/models/q.gguf", "image": "llamacpp:b1", "port": 8080}
    if health is not None:
        svc["health"] = health
    hv = {"llmfleet_services": [svc], "llmfleet_root": ROOT} | {f"llmfleet_{k}": v for k, v in (host or {}).items()}
    hs = host_settings("h1", hv)
    return hs, hs.services[0]


def _state_text(hs, svc, history: list[float]) -> str:
    """The host's state: one earlier healthy release of the same plan per measured speed (another
    port, so another release than the one deployed)."""
    lines = ["@@service chat", "@@current ", "@@unit inactive"]
    for i, tokps in enumerate(history):
        rid = R1[:-1] + str(i)
        old = svc.model_copy(update={"port": 8090 + i})
        m = manifest_build(render(old, hs, resolve(svc.image, LOCK), PLAN), rid, host="h1", who="t", when=NOW,
                           llmfleet_version="0")
        lines += [f"@@release {rid}", "@@manifest " + m.to_text().strip(),
                  "@@health " + json.dumps({"result": "healthy", "decode_tokps": tokps})]
    return "\n".join(lines + ["@@end"])


def _chain(*outs: str) -> str:
    return "".join(f"@@step {i}\n{o}\n@@step-rc {i} 0\n" for i, o in enumerate(outs))


def floor_of_a_deploy(health: dict | None = None, host: dict | None = None, plans: list | None = None,
                      history: tuple[float, ...] = ()):
    hs, svc = _settings(health, host)
    timeout = confirm.timeout_s(svc, hs)
    remote = FakeRemote([
        Command(None, out=_state_text(hs, svc, list(history))),
        Command(None, out=_chain("@@acquired", f"@@pulled\n@@digests\n{resolve(svc.image, LOCK).pull_ref}\n")),
        Command(None, out=_chain("@@uploaded", f"@@compose-valid\n@@armed {timeout}", "@@switched",
                                 "@@unit active\n@@container running 0 0")),
        Command(None, out="@@confirmed\n@@watchdog-on"),
    ])
    seen = []

    def health_fn(run, target):
        seen.append(E.floor_for(run, target))
        return HEALTHY

    run = E.HostRun("h1", hs, remote, settings=Settings.of({"audit_log": "/dev/null"}), log=lambda _: None,
                    health_fn=health_fn, now=lambda: NOW, token=lambda: TOKEN)
    out = D.HostOutcome("h1", D.Result.UNCHANGED)
    ready = D.PreparedHost(None, None, hs, (D.Prepared(svc, None, resolve(svc.image, LOCK)),))  # type: ignore[arg-type]
    D.run_deploy(run, ready, out, D.DeployOptions(), plans=plans if plans is not None else [PLAN])
    assert out.result == "deployed", out.reason
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize(
    ("health", "host", "plans", "history", "tokps", "source_has"),
    [
        ({"min_tokps": 7}, {"health_min_tokps": 300}, None, (100.0,), 7.0, "health.min_tokps"),
        ({"floor_fraction": 0.5}, {"health_min_tokps": 300}, None, (100.0,), 0.5 * LOW, "service's health.floor_fraction"),
        (None, {"health_min_tokps": 9}, None, (100.0,), 9.0, "llmfleet_health_min_tokps"),
        (None, {"health_floor_fraction": 0.1}, None, (100.0,), 0.1 * LOW, "host's llmfleet_health_floor_fraction"),
        # the fleet's own measurements of this card/engine/image/model/quant/context
        (None, None, None, (90.0, 100.0, 110.0), 60.0, "median 100.0 tok/s of 3 healthy runs"),
        # no history: the planner's own floor, carried by the plan's summary
        (None, None, None, (), PLAN.health_floor_tokps, "planner's floor"),
        # a summary without a floor (a release planned by an older llmfleet): the default fraction
        (None, None, [PlanSummary(engine="llamacpp", gpu=GPU, model=PLAN.model, quant=PLAN.quant, context=4096,
                                  decode_tokps_realistic=(40.0, 60.0))], (), 10.0, "0.25 x"),
        # no plan at all: no floor, and the report says so
        (None, None, [None], (), None, "no realistic decode figure"),
    ],
)
def test_every_floor_source_reaches_the_health_check(health, host, plans, history, tokps, source_has):
    floor = floor_of_a_deploy(health, host, plans, history)
    assert floor.tokps == (pytest.approx(tokps) if tokps is not None else None)
    assert source_has in floor.source


def test_the_planners_floor_is_never_above_its_own_realistic_range():
    assert PLAN.health_floor_tokps is not None and 0 < PLAN.health_floor_tokps < LOW


def test_store_parses_what_this_test_feeds_it():
    hs, svc = _settings(None, None)
    st = release_state.parse_state(_state_text(hs, svc, [100.0]))["chat"]
    info = next(iter(st.releases.values()))
    assert info.manifest is not None and PlanSummary.from_dict(info.manifest.plan).health_floor_tokps == \
        pytest.approx(PLAN.health_floor_tokps)


@pytest.mark.parametrize(
    ("health", "host", "history"),
    [
        ({"min_tokps": 7}, {"health_min_tokps": 300}, (100.0,)),
        ({"floor_fraction": 0.5}, {"health_min_tokps": 300}, (100.0,)),
        (None, {"health_min_tokps": 9}, (100.0,)),
        (None, {"health_floor_fraction": 0.1}, (100.0,)),
        ({"floor_fraction": 0}, None, ()),
        (None, None, (90.0, 100.0, 110.0)),
        (None, None, ()),
    ],
)
def test_invoke_plan_shows_the_floor_the_deploy_applies(health, host, history):
    """`invoke plan --host` computes its floor with the deploy's function, from the fleet records the
    deploy would read (here: the host's state, as `invoke status` or a deploy caches it)."""
    from llmfleet.cli.plan_floor import deploy_floor
    from llmfleet.health import speed_history

    hs, svc = _settings(health, host)
    deployed = floor_of_a_deploy(health, host, None, history)
    records = speed_history.records_from_state("h1", release_state.parse_state(_state_text(hs, svc, list(history))))
    shown = deploy_floor(PLAN, svc, hs, records)
    assert (shown.tokps, shown.source) == (deployed.tokps, deployed.source)
