"""The gateway as a service (engine: gateway), no Docker, no SSH: its inventory schema, its preflight
checks (who may use it), and its rendered release (compose in the host's network with the service's folder
read-only, HAProxy's files, its secrets only in 0600 files and masked in diffs)."""

from __future__ import annotations

import pytest
import yaml

from llmfleet.errors import InventoryError, UsageError
from llmfleet.images import lock as images
from llmfleet.inventory.ansible import settings_for
from llmfleet.inventory.services import GATEWAY_KIND, HostSettings, Service, host_settings
from llmfleet.knowledge.preflight import gateway_bind_check
from llmfleet.release import gateway_config as gc
from llmfleet.release.preflight import check_host
from llmfleet.release.render import ENV_FILE, SECRET_MASK, render
from tests.test_gateway_plan import SECRETS, engine, fleet, gateway, resolve
from tests.test_preflight import DIGEST, TODAY, facts_for

GW = {"name": "gw", "engine": "gateway", "image": "gateway:2.6.12", "gateway": {"upstreams": ["replicas"]}}
KEY = {"name": "team-a", "key": {"from_env": "GW_KEY_A"}}
TLS = {"cert": {"from_file": "~/gw.crt"}, "key": {"from_file": "~/gw.key"}}
LOCK = images.ImageLock(images={"gateway:2.6.12": images.LockedImage(
    key="gateway:2.6.12", repository="docker.io/library/haproxy", digest=DIGEST, tag="2.6.12")})


def one(service: dict, **hostvars) -> Service:
    return host_settings("edge", {"llmfleet_services": [service], **hostvars}).services[0]


def refusal(service: dict) -> str:
    with pytest.raises(InventoryError) as e:
        one(service)
    text = str(e.value)
    assert "\n" not in text
    return text


# ------------------------------------------------------------------------------------------------
# The inventory


def test_a_gateway_gets_its_defaults():
    s = one(GW)
    assert (s.engine, s.port, s.is_engine, s.is_exporter) == (GATEWAY_KIND, 8443, False, False)
    assert s.gateway is not None
    assert (s.gateway.upstreams, s.gateway.api_keys, s.gateway.tls) == (["replicas"], [], None)
    assert (s.gateway.max_body_mib, s.gateway.timeout_s, s.gateway.drain_timeout_s, s.gateway.admin_port) == (
        4, 600, 120, 9901)


def test_a_port_given_wins_over_the_default():
    assert one({**GW, "port": 9443}).port == 9443


def test_a_gateway_service_needs_its_gateway_settings():
    text = refusal({k: v for k, v in GW.items() if k != "gateway"})
    assert "host edge: service gw: llmfleet_services[0].gateway: required field is missing" in text


def test_gateway_settings_on_an_engine_are_refused():
    text = refusal({**engine(), "gateway": {"upstreams": ["replicas"]}})
    assert "service chat: llmfleet_services[0].gateway: " in text
    assert "only an engine: gateway service takes gateway (this is llamacpp)" in text


@pytest.mark.parametrize(("field", "value"), [
    ("model", "qwen2.5-7b-instruct"), ("model_path", "/models/q.gguf"), ("quant", "Q4_K_M"), ("served_name", "x"),
    ("api_key", {"from_env": "K"}), ("concurrency", 4), ("workers", ["gpu-b"]), ("context", 4096),
])
def test_what_only_an_engine_takes_is_refused_on_a_gateway_naming_the_field(field, value):
    text = refusal({**GW, field: value})
    assert f"service gw: llmfleet_services[0].{field}: " in text
    assert "a gateway service has no model; remove it" in text and "gateway, allow_unauthenticated" in text


@pytest.mark.parametrize(("field", "value"), [("gpus", [0]), ("engine_args", ["--x"])])
def test_gpus_and_engine_args_are_refused_on_a_gateway(field, value):
    text = refusal({**GW, field: value})
    assert f"service gw: llmfleet_services[0].{field}: " in text and "a gateway service has no model" in text


def test_gateway_settings_on_an_engine_name_what_was_given_not_none():
    text = refusal({**engine(), "gateway": {"upstreams": ["replicas"]}})
    assert "got None" not in text and "remove it" in text


def test_a_gateway_takes_allow_unauthenticated():
    assert one({**GW, "allow_unauthenticated": True}).allow_unauthenticated is True


@pytest.mark.parametrize(("settings", "says"), [
    ({"upstreams": []}, "gateway.upstreams: List should have at least 1 item"),
    ({"upstreams": ["replicas"], "api_keys": [KEY, {**KEY, "key": {"from_env": "B"}}]},
     "gateway.api_keys: Value error, key name team-a is listed twice"),
    ({"upstreams": ["replicas"], "api_keys": [{"name": "team-a", "key": "sk-in-clear"}]},
     "gateway.api_keys[0].key: "),
    ({"upstreams": ["replicas"], "admin_port": 80}, "gateway.admin_port: "),
    ({"upstreams": ["replicas"], "max_body_mib": 65}, "gateway.max_body_mib: "),
    ({"upstreams": ["replicas"], "tls": {"cert": {"from_file": "~/gw.crt"}}}, "gateway.tls.key: required field"),
    ({"upstreams": ["replicas"], "listen": 1}, "gateway.listen: unknown key"),
])
def test_bad_gateway_settings_are_one_line_naming_the_field(settings, says):
    assert says in refusal({**GW, "gateway": settings})


# ------------------------------------------------------------------------------------------------
# The preflight: who may use it


@pytest.mark.parametrize(
    ("bind", "settings", "allow", "status", "said"),
    [
        ("127.0.0.1", {}, None, "pass", "listens on 127.0.0.1:8443 (plain HTTP) (loopback: reachable from the host only)"),
        ("10.0.0.5", {}, None, "fail", "listens on 10.0.0.5:8443 (plain HTTP) without client keys: anyone who reaches"),
        ("0.0.0.0", {}, True, "warn", "without client keys (allow_unauthenticated: true)"),
        ("10.0.0.5", {"api_keys": [KEY]}, None, "warn", "with 1 client key: keys and prompts cross the network in clear"),
        ("10.0.0.5", {"api_keys": [KEY], "tls": TLS}, None, "pass", "listens on 10.0.0.5:8443 (TLS) with 1 client key"),
        ("0.0.0.0", {"api_keys": [KEY, {**KEY, "name": "team-b"}], "tls": TLS}, None, "pass", "with 2 client keys"),
    ],
)
def test_gateway_bind_check(bind, settings, allow, status, said):
    service = {**GW, "bind_address": bind, "gateway": {"upstreams": ["replicas"], **settings}}
    if allow is not None:
        service["allow_unauthenticated"] = allow
    check = gateway_bind_check(Service.model_validate(service), HostSettings())
    assert (check.id, check.status) == ("bind", status)
    assert said in check.message
    if status != "pass":
        assert check.fix


def test_the_hosts_allow_unauthenticated_counts_for_the_gateway():
    s = Service.model_validate({**GW, "bind_address": "10.0.0.5"})
    assert gateway_bind_check(s, HostSettings(allow_unauthenticated=True)).status == "warn"


def test_a_gateways_preflight_has_no_plan_and_no_model():
    s = Service.model_validate({**GW, "bind_address": "10.0.0.5", "gateway": {"upstreams": ["x"], "api_keys": [KEY],
                                                                              "tls": TLS}})
    (report,) = check_host("edge", HostSettings(services=[s]), facts_for("v100-535"), lock=LOCK, today=TODAY)
    assert [(c.id, c.status) for c in report.checks] == [
        ("image", "pass"), ("docker", "pass"), ("compose", "pass"), ("disk-image", "pass"), ("port", "pass"),
        ("bind", "pass"), ("port-admin", "pass"), ("port-metrics", "pass")]


@pytest.mark.parametrize(("taken", "check_id"), [(9901, "port-admin"), (9902, "port-metrics")])
def test_the_runtime_api_and_metrics_ports_must_be_free(taken, check_id):
    s = Service.model_validate({**GW, "bind_address": "127.0.0.1"})
    facts = facts_for("v100-535")
    facts.ports = [*facts.ports, taken]
    (report,) = check_host("edge", HostSettings(services=[s]), facts, lock=LOCK, today=TODAY)
    (check,) = [c for c in report.checks if c.id == check_id]
    assert check.status == "fail" and f"port {taken} is in use" in check.message
    assert "gateway.admin_port" in check.fix


# ------------------------------------------------------------------------------------------------
# The rendered release


def rendered(tmp_path, **settings):
    chat_key = {"api_key": {"from_env": "CHAT_KEY"}}
    inv = fleet(tmp_path, gateway(**settings), **{
        "gpu-a": {"ansible_host": "10.0.0.11", "llmfleet_services": [engine(**chat_key)]},
        "gpu-b": {"ansible_host": "10.0.0.12", "llmfleet_services": [engine(**chat_key)]},
    })
    from llmfleet.release.gateway_plan import plan_gateway

    host = inv.hosts["edge"]
    hs = settings_for(host)
    (svc,) = hs.services
    plan = plan_gateway(inv, host, svc, resolve)
    r = render(svc, hs, images.resolve(svc.image, LOCK), gateway=plan)
    return r, plan, yaml.safe_load(r.files["compose.yml"])["services"]["engine"]


def test_compose_runs_haproxy_in_the_hosts_network_with_its_folder_read_only(tmp_path):
    r, _, c = rendered(tmp_path)
    assert c["image"] == f"docker.io/library/haproxy@{DIGEST}"
    assert c["network_mode"] == "host" and "ports" not in c
    assert c["command"] == ["-W", "-db", "-f", "/opt/llmfleet/services/gw/current/haproxy.cfg"]
    (vol,) = c["volumes"]
    # the service's folder at its own path: `current` (the release HAProxy reads) resolves inside too
    assert (vol["type"], vol["source"], vol["target"], vol["read_only"]) == (
        "bind", "/opt/llmfleet/services/gw", "/opt/llmfleet/services/gw", True)
    assert c["env_file"] == ["service.env"]
    assert "deploy" not in c  # no GPU reserved
    assert c["cap_drop"] == ["ALL"] and c["restart"] == "no"
    assert c["labels"]["io.llmfleet.engine"] == "gateway"


def test_haproxys_large_buffers_come_from_the_heap_not_a_fresh_mmap_per_request(tmp_path):
    _, plan, c = rendered(tmp_path, max_body_mib=4)
    assert gc.buffer_size(plan.spec.max_body_bytes) > 4 << 20  # tune.bufsize: above glibc's default 128 KiB
    assert c["environment"] == {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}
    _, plan, c = rendered(tmp_path / "big", max_body_mib=40)
    assert c["environment"]["MALLOC_TRIM_THRESHOLD_"] == str(4 * gc.buffer_size(40 << 20))


def test_the_stop_lets_streams_finish_for_the_gateways_timeout_and_the_unit_waits_longer(tmp_path):
    r, _, c = rendered(tmp_path, timeout_s=900)
    assert c["stop_grace_period"] == "905s"
    assert "TimeoutStopSec=965" in r.files["llmfleet-gw.service"]
    _, _, c = rendered(tmp_path / "default")
    assert c["stop_grace_period"] == "605s"


def rendered_on_port(tmp_path, port):
    inv = fleet(tmp_path, {**gateway(), "port": port})
    from llmfleet.release.gateway_plan import plan_gateway

    host = inv.hosts["edge"]
    hs = settings_for(host)
    (svc,) = hs.services
    r = render(svc, hs, images.resolve(svc.image, LOCK), gateway=plan_gateway(inv, host, svc, resolve))
    return yaml.safe_load(r.files["compose.yml"])["services"]["engine"]


def test_a_port_below_1024_gets_the_one_capability_that_binds_it(tmp_path):
    c = rendered_on_port(tmp_path / "a", 443)
    assert c["cap_drop"] == ["ALL"] and c["cap_add"] == ["NET_BIND_SERVICE"]
    assert "cap_add" not in rendered_on_port(tmp_path / "b", 8443)


def test_the_release_holds_haproxys_files_and_no_watchdog(tmp_path):
    r, plan, _ = rendered(tmp_path)
    assert sorted(r.files) == sorted(["compose.yml", "llmfleet-gw.service", ENV_FILE, *gc.render_files(plan.spec)])
    assert not any("watchdog" in name for name in r.files)
    assert r.files["haproxy.cfg"] == gc.render_files(plan.spec)["haproxy.cfg"]
    assert "server gpu-a__chat 10.0.0.11:8080" in r.files["haproxy.cfg"]
    assert r.files["models.map"].splitlines()[1:] == ["chat m_chat"]
    assert r.secret_files == frozenset({ENV_FILE})


def test_the_replicas_key_is_only_in_the_env_file_and_masked_there(tmp_path):
    r, plan, _ = rendered(tmp_path)
    clear = SECRETS["CHAT_KEY"]
    (env_name,) = plan.env
    assert f"{env_name}='{clear}'" in r.files[ENV_FILE] and r.modes[ENV_FILE] == 0o600
    assert [name for name, text in r.files.items() if clear in text] == [ENV_FILE]
    assert f'"Bearer ${{{env_name}}}"' in r.files["haproxy.cfg"]
    masked = r.masked_files()
    assert not any(clear in text for text in masked.values())
    assert env_name in masked[ENV_FILE]


def test_no_client_key_is_in_the_release_in_clear(tmp_path):
    r, _, _ = rendered(tmp_path)
    assert not any(SECRETS["GW_KEY_A"] in text for text in r.files.values())


def test_the_tls_pem_is_a_0600_secret_file_masked_in_diffs(tmp_path):
    r, plan, _ = rendered(tmp_path, tls={"cert": {"from_env": "CERT"}, "key": {"from_env": "KEY"}})
    assert r.files["tls.pem"] == plan.tls_pem == SECRETS["CERT"] + SECRETS["KEY"]
    assert r.modes["tls.pem"] == 0o600
    assert r.secret_files == frozenset({ENV_FILE, "tls.pem"})
    masked = r.masked_files()["tls.pem"]
    assert masked.startswith(SECRET_MASK) and "BEGIN" not in masked and "MIIB" not in masked
    assert [name for name, text in r.files.items() if "PRIVATE KEY" in text] == ["tls.pem"]
    assert "ssl crt /opt/llmfleet/services/gw/current/tls.pem" in r.files["haproxy.cfg"]


def test_a_changed_certificate_changes_the_masked_text(tmp_path):
    a, _, _ = rendered(tmp_path / "a", tls={"cert": {"from_env": "CERT"}, "key": {"from_env": "KEY"}})
    SECRETS["CERT2"] = SECRETS["CERT"].replace("MIIBcert", "MIIBcert2")
    try:
        b, _, _ = rendered(tmp_path / "b", tls={"cert": {"from_env": "CERT2"}, "key": {"from_env": "KEY"}})
    finally:
        del SECRETS["CERT2"]
    assert a.masked_files()["tls.pem"] != b.masked_files()["tls.pem"]


def test_a_gateway_rendered_without_its_plan_is_refused():
    s = one({**GW, "bind_address": "127.0.0.1"})
    with pytest.raises(UsageError, match="service gw: a gateway is rendered from its plan"):
        render(s, HostSettings(services=[s]), images.resolve(s.image, LOCK))
