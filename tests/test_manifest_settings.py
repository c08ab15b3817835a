"""The typed seams: a release's Manifest (one writer, one reader, tolerant of what a host returns),
the PlanSummary a deploy keeps of its plan, and the Settings built once from the configuration."""

from __future__ import annotations

import pytest

from llmfleet.errors import UsageError
from llmfleet.knowledge.planner import PlanRequest, PlanSummary, plan, summarize
from llmfleet.knowledge.release_state import Manifest
from llmfleet.release.manifest import build as manifest_build
from llmfleet.settings import DEFAULT_AUDIT_LOG, Settings, SshSettings
from tests.deploy_fixtures import NOW, R1, rendered


def test_manifest_round_trips_through_its_text():
    r = rendered(api_key={"from_env": "K"})
    m = manifest_build(r, R1, host="h1", who="ops@ws", when=NOW, llmfleet_version="1.2", message="canary")
    text = m.to_text()
    assert text.endswith("\n") and text.count("\n") == 1
    back = Manifest.parse(text)
    assert back == m
    assert (back.release, back.who, back.message, back.time) == (R1, "ops@ws", "canary", "2026-11-29T12:00:00+00:00")
    assert back.image_ref == r.image.pull_ref and back.digest == r.image.digest
    assert "sk-secret" not in text and "service.env" not in back.files


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[1, 2]", "null", '"a string"'],
)
def test_a_manifest_that_is_not_an_object_is_none(text):
    assert Manifest.parse(text) is None


def test_a_manifest_with_missing_or_mistyped_keys_reads_as_empty_values():
    m = Manifest.parse('{"release": 5, "image": "x", "engine_args": "-ngl 99", "inputs": [], "plan": "p", "who": "a"}')
    assert m is not None
    assert (m.release, m.image, m.engine_args, m.inputs, m.plan, m.who) == ("", {}, (), {}, None, "a")
    assert m.image_ref is None and m.digest is None and m.plan_summary() is None


def test_the_digest_comes_from_the_reference_when_the_manifest_lacks_it():
    m = Manifest(release=R1, service="chat", image={"ref": "reg.lab:5000/x@sha256:" + "ab" * 32})
    assert m.digest == "sha256:" + "ab" * 32
    assert Manifest(release=R1, service="chat", image={"ref": "reg.lab:5000/x:tag"}).digest is None


def test_plan_summary_from_a_plan_and_back_from_a_manifest():
    p = plan(PlanRequest(model="qwen2.5-7b-instruct", quant="q4_k_m", gpu="v100-sxm2-32gb", engine="llamacpp"))
    s = summarize(p)
    assert s is not None and summarize(s) is s and summarize(None) is None
    assert s.engine_args == tuple(p.engine_args) and s.decode_tokps_realistic == tuple(p.decode_tokps_realistic)
    assert PlanSummary.from_dict(p.to_dict()) == s  # what the manifest stores reads back the same


@pytest.mark.parametrize("data", [None, [], "x"])
def test_plan_summary_of_something_that_is_not_a_plan_is_none(data):
    assert PlanSummary.from_dict(data) is None


def test_plan_summary_ignores_mistyped_figures():
    s = PlanSummary.from_dict({"decode_tokps_realistic": ["a", 2], "decode_tokps_ceiling": True, "gpus": "2"})
    assert s == PlanSummary()


def test_settings_from_the_nested_config_and_from_a_flat_one():
    nested = Settings.of({"inventory": "inv/", "ssh": {"connect_timeout": 3, "user": "ops"}, "pull_timeout": 60})
    flat = Settings.of({"inventory": "inv/", "connect_timeout": 3, "user": "ops", "pull_timeout": 60})
    assert nested == flat
    assert (nested.ssh.connect_timeout, nested.ssh.command_timeout, nested.ssh.user) == (3, 120, "ops")
    assert nested.audit_log == DEFAULT_AUDIT_LOG and nested.images_lock is None
    assert (nested.inventory_timeout, Settings.of({"inventory_timeout": "5"}).inventory_timeout) == (30, 5)
    assert Settings.of(nested) is nested and SshSettings.of(nested) is nested.ssh


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"ssh": {"connect_timeout": "soon"}}, "llmfleet.ssh.connect_timeout: 'soon' is not a number"),
        ({"pull_timeout": -1}, "llmfleet.pull_timeout: -1 must be more than 0"),
        ({"inventory_timeout": 0}, "llmfleet.inventory_timeout: 0 must be more than 0"),
        ({"audit_log": 5}, "llmfleet.audit_log: 5 is not a string"),
    ],
)
def test_a_bad_setting_is_a_usage_error_naming_its_key(config, says):
    with pytest.raises(UsageError, match=says):
        Settings.of(config)
