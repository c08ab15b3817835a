""""Did you mean" for models, quants, cards, hosts, services, tasks and flags; quantized repository ids and
GGUF file names resolve to catalog model + quant when their base is in the catalog, and say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.errors import UsageError
from llmfleet.inventory.ansible import load_inventory
from llmfleet.knowledge.catalog import find_gpu, find_model, find_quant
from llmfleet.knowledge.model_ids import split_quantized
from llmfleet.knowledge.planner import PlanRequest, plan
from llmfleet.suggest import close_matches, did_you_mean

REPO = Path(__file__).resolve().parents[1]


def test_close_matches_ignore_case_and_keep_the_spelling():
    assert close_matches("STATU", ["status", "start", "stop"])[0] == "status"
    assert did_you_mean("zzz", ["status"]) == ""
    assert did_you_mean("gpu-v100-1", ["gpu-v100-01"]) == " (did you mean 'gpu-v100-01'?)"


@pytest.mark.parametrize(("find", "typo", "meant"), [
    (find_model, "qwen2.5-7b-instrcut", "qwen2.5-7b-instruct"),
    (find_model, "Qwen/Qwen2.5-7B-Instuct", "Qwen/Qwen2.5-7B-Instruct"),
    (find_quant, "gptq-in4", "gptq-int4"),
    (find_quant, "q4_k_n", "q4_k_m"),
    (find_gpu, "a10o", "a10"),
])
def test_catalog_lookups_say_did_you_mean(find, typo, meant):
    with pytest.raises(UsageError) as e:
        find(typo)
    msg = str(e.value)
    assert "did you mean" in msg and f"'{meant}'" in msg.split("did you mean", 1)[1].split("?")[0]


def test_a_host_or_group_typo_says_did_you_mean(tmp_path):
    (tmp_path / "hosts.yml").write_text("gpus:\n  hosts:\n    gpu-v100-01:\n    gpu-a10-01:\n")
    inv = load_inventory(str(tmp_path / "hosts.yml"))
    with pytest.raises(UsageError, match=r"--host 'gpu-v100-1' matches no host \(did you mean 'gpu-v100-01'\?\)"):
        inv.select(host="gpu-v100-1", group=None)
    with pytest.raises(UsageError, match=r"did you mean 'gpus'"):
        inv.select(host=None, group="gpu")
    with pytest.raises(UsageError) as e:  # a pattern is not second-guessed
        inv.select(host="nothing-*", group=None)
    assert "did you mean" not in str(e.value)


def test_a_service_typo_says_did_you_mean():
    from llmfleet.release.prepare import DeployOptions, prepare_host
    from llmfleet.settings import Settings

    inv = load_inventory(str(REPO / "inventory/example"))
    host = next(h for h in inv.hosts.values() if h.vars.get("llmfleet_services"))
    name = host.vars["llmfleet_services"][0]["name"]
    with pytest.raises(UsageError, match=rf"did you mean '{name}'"):
        prepare_host(inv, host.name, Settings(), DeployOptions(services=[name + "x"]))


@pytest.mark.parametrize(("given", "model", "quant"), [
    ("Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4", "qwen2.5-32b-instruct", "gptq-int4"),
    ("Qwen/Qwen2.5-7B-Instruct-AWQ", "qwen2.5-7b-instruct", "awq-int4"),
    ("Qwen/Qwen2.5-7B-Instruct-GGUF", "qwen2.5-7b-instruct", "q4_k_m"),
    ("Qwen2.5-7B-Instruct-Q4_K_M.gguf", "qwen2.5-7b-instruct", "q4_k_m"),
    ("qwen2.5-7b-instruct-q8_0.gguf", "qwen2.5-7b-instruct", "q8_0"),
    ("Qwen/Qwen3-32B-FP8", "qwen3-32b", "fp8"),
])
def test_quantized_ids_resolve_to_catalog_model_and_quant(given, model, quant):
    a = split_quantized(given)
    assert a is not None and (a.model, a.quant) == (model, quant)
    assert given in a.said and model in a.said and quant in a.said


@pytest.mark.parametrize("given", ["Qwen/Qwen2.5-7B-Instruct", "unknown-model-AWQ", "tiny-qwen2-gguf", "x.gguf"])
def test_other_names_are_not_second_guessed(given):
    assert split_quantized(given) is None or find_model(given)  # an exact catalog alias wins in the planner


def test_the_plan_uses_the_quant_and_says_what_it_assumed():
    p = plan(PlanRequest(model="Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4", gpu="a100-sxm4-80gb"))
    assert p.model == "qwen2.5-32b-instruct" and p.quant.startswith("gptq-int4")
    assert any("Qwen/Qwen2.5-32B-Instruct-GPTQ-Int4 read as catalog model" in n for n in p.notes)
    g = plan(PlanRequest(model="Qwen2.5-7B-Instruct-Q4_K_M.gguf", gpu="a100-sxm4-80gb"))
    assert g.engine == "llamacpp" and g.quant == "q4_k_m"
    explicit = plan(PlanRequest(model="Qwen/Qwen2.5-7B-Instruct-AWQ", quant="gptq-int4", gpu="a100-sxm4-80gb"))
    assert explicit.quant.startswith("gptq-int4")  # --quant wins over the name


def test_an_unknown_quantized_id_is_still_unknown():
    with pytest.raises(UsageError, match="unknown model 'Nope/Nothing-AWQ'"):
        plan(PlanRequest(model="Nope/Nothing-AWQ", gpu="a100-sxm4-80gb"))


def _two_hosts(tmp_path: Path):
    """A service over two hosts ("big", head h1, worker w1) and a host with a service of its own."""
    import yaml

    big = {"name": "big", "engine": "llamacpp", "model": "m", "model_path": "/srv/models/m.gguf",
           "image": "llamacpp:x", "workers": ["w1"]}
    chat = {"name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/srv/models/m.gguf",
            "image": "llamacpp:x"}
    hosts = {"h1": {"ansible_host": "127.0.0.1", "llmfleet_cluster_address": "10.0.0.1", "llmfleet_services": [big]},
             "w1": {"ansible_host": "127.0.0.1", "llmfleet_cluster_address": "10.0.0.2"},
             "solo": {"ansible_host": "127.0.0.1", "llmfleet_services": [chat]}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return load_inventory(str(tmp_path))


def test_a_service_typo_says_did_you_mean_for_a_service_over_several_hosts(tmp_path):
    from llmfleet.release import multihost as M
    from llmfleet.release.deploy import DeployOptions
    from llmfleet.settings import Settings

    inv = _two_hosts(tmp_path)
    with pytest.raises(UsageError, match=r"has no service 'bgi' \(did you mean 'big'\?\) \(services: big\)"):
        M.prepare_service(inv, "h1", "bgi", Settings(), DeployOptions())
    with pytest.raises(UsageError, match=r"has no service 'bgi' \(did you mean 'big'\?\) \(services: big\)"):
        M.rollback_service(inv, "h1", "bgi", options=DeployOptions(), log=lambda line: None,
                           connector=lambda *a: pytest.fail("connected"))


def test_a_rollback_service_typo_says_did_you_mean(tmp_path):
    from llmfleet.release.deploy import DeployOptions, rollback_host

    inv = _two_hosts(tmp_path)
    with pytest.raises(UsageError, match=r"host solo has no service 'caht' \(did you mean 'chat'\?\) \(services: chat\)"):
        rollback_host(inv, "solo", service="caht", options=DeployOptions(), log=lambda line: None)


def test_stop_start_remove_of_a_service_typo_say_did_you_mean(tmp_path, monkeypatch):
    """The host runs "chat": stopping "caht" touches nothing and the reason names the closest service the
    host runs; logs of a typo name the closest service of the inventory."""
    from llmfleet.host import ssh
    from llmfleet.inventory.ansible import settings_for
    from llmfleet.release import service_ops
    from tests.fake_remote import Command, FakeRemote
    from tests.test_service_ops import _lock_state, _states

    inv = _two_hosts(tmp_path)
    h = inv.hosts["solo"]
    for action in ("stop", "start", "remove"):
        # the lock with the state read (the host runs "chat"), then the last round trip (audit, unlock)
        remote = FakeRemote([Command(None, _lock_state(action, _states()).out), Command(None, "")], name="solo")
        monkeypatch.setattr(ssh, "connect", lambda *a, r=remote, **k: r)
        r = service_ops.service_op(h, settings_for(h), action, ["caht"], config={"audit_log": str(tmp_path / "a")})
        assert (r.result, r.services) == ("absent", {"caht": "absent"}), action
        assert r.reason == "no service caht on the host (did you mean 'chat'?)", action
        remote.assert_done()

    class Ctx(FakeRemote):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

    monkeypatch.setattr(ssh, "connect", lambda *a, **k: Ctx([Command(None, "@@absent\n")], name="solo"))
    with pytest.raises(UsageError, match=r"no service 'caht' deployed there \(did you mean 'chat'\?\)"):
        service_ops.logs(h, settings_for(h), "caht", lines=10, follow=False, seconds=5, config={},
                         on_line=lambda line: None)
