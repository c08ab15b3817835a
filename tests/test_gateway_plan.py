"""The gateway's view of the fleet from the inventory alone (llmfleet.release.gateway_plan), no Docker, no
SSH: which engine services it fronts and where it reaches them, its clients' keys as hashes, the
replicas' own keys as environment variables, its TLS file, and which gateways front one replica."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from llmfleet.errors import UsageError
from llmfleet.inventory.ansible import Inventory, load_inventory, settings_for
from llmfleet.release import gateway_plan as gp
from llmfleet.release.gateway_config import render_files

SECRETS = {
    "GW_KEY_A": "sk-team-a-not-in-any-file-0001",
    "GW_KEY_B": "sk-team-b-not-in-any-file-0002",
    "CHAT_KEY": "sk-replica-chat-key-0003",
    "CODER_KEY": "sk-replica-coder-key-0004",
    "CERT": "-----BEGIN CERTIFICATE-----\nMIIBcert\n-----END CERTIFICATE-----\n",
    "KEY": "-----BEGIN PRIVATE KEY-----\nMIIBkey\n-----END PRIVATE KEY-----\n",
    "NOT_PEM": "just some text",
}


def resolve(ref, where):
    """The secrets above by their from_env name (nothing read from this machine)."""
    return None if ref is None else SECRETS[ref.from_env]


def engine(name="chat", port=8080, **kw):
    return {"name": name, "engine": "llamacpp", "model": "qwen2.5-7b-instruct", "model_path": "/models/q.gguf",
            "image": "llamacpp:b1", "quant": "Q4_K_M", "port": port, "gpus": [0], **kw}


NODE = {"name": "node", "engine": "node-exporter", "image": "node-exporter:1.9.1"}


def gateway(upstreams=("replicas",), name="gw", **settings):
    gw = {"upstreams": list(upstreams), "api_keys": [{"name": "team-a", "key": {"from_env": "GW_KEY_A"},
                                                       "requests_per_minute": 600}], **settings}
    return {"name": name, "engine": "gateway", "image": "gateway:2.6.12", "gateway": gw}


def make_inventory(tmp_path: Path, hosts: dict[str, dict], groups: dict[str, list[str]]) -> Inventory:
    """hosts: name -> host variables (in host_vars/<name>.yml); groups: name -> its hosts."""
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    tree = {"all": {"children": {g: {"hosts": {h: None for h in members}} for g, members in groups.items()},
                    "hosts": {h: None for h in hosts if not any(h in m for m in groups.values())}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(tree))
    for name, variables in hosts.items():
        (inv / "host_vars" / f"{name}.yml").write_text(yaml.safe_dump(variables))
    return load_inventory(inv)


def fleet(tmp_path, gw=None, **extra_hosts) -> Inventory:
    """A gateway host in front of the group ``replicas`` (gpu-a: two engines and an exporter; gpu-b: one)."""
    hosts = {
        "edge": {"ansible_host": "10.0.0.2", "llmfleet_services": [gw or gateway()]},
        "gpu-a": {"ansible_host": "10.0.0.11",
                  "llmfleet_services": [engine(), engine("coder", 8081, served_name="coder"), NODE]},
        "gpu-b": {"ansible_host": "10.0.0.12", "llmfleet_services": [engine()]},
        **extra_hosts,
    }
    return make_inventory(tmp_path, hosts, {"replicas": ["gpu-a", "gpu-b"], "edges": ["edge"]})


def plan(inv: Inventory, host="edge", service="gw"):
    h = inv.hosts[host]
    (svc,) = [s for s in settings_for(h).services if s.name == service]
    return gp.plan_gateway(inv, h, svc, resolve)


def where(replicas) -> list[tuple[str, str, str, int, str]]:
    return [(r.host, r.service, r.address, r.port, r.served_name) for r in replicas]


# ------------------------------------------------------------------------------------------------
# The replicas


def test_one_replica_per_engine_service_on_the_upstream_hosts_exporters_skipped(tmp_path):
    p = plan(fleet(tmp_path))
    assert where(p.spec.replicas) == [
        ("gpu-a", "chat", "10.0.0.11", 8080, "chat"),
        ("gpu-a", "coder", "10.0.0.11", 8081, "coder"),
        ("gpu-b", "chat", "10.0.0.12", 8080, "chat"),
    ]
    assert p.spec.name == "gw" and p.spec.port == 8443 and p.spec.config_dir == "/opt/llmfleet/services/gw/current"


def test_a_host_named_twice_and_through_a_group_is_fronted_once(tmp_path):
    p = plan(fleet(tmp_path, gateway(["gpu-b", "replicas", "gpu-a"])))
    assert where(p.spec.replicas) == [
        ("gpu-b", "chat", "10.0.0.12", 8080, "chat"),
        ("gpu-a", "chat", "10.0.0.11", 8080, "chat"),
        ("gpu-a", "coder", "10.0.0.11", 8081, "coder"),
    ]


def test_the_gateway_itself_and_another_gateway_are_not_replicas(tmp_path):
    other = {"ansible_host": "10.0.0.3", "llmfleet_services": [gateway(name="gw2"), engine(port=8090)]}
    inv = fleet(tmp_path, gateway(["replicas", "edge", "edge2"]), edge2=other)
    assert [(r.host, r.service) for r in plan(inv).spec.replicas] == [
        ("gpu-a", "chat"), ("gpu-a", "coder"), ("gpu-b", "chat"), ("edge2", "chat")]


def test_the_head_of_a_service_over_several_hosts_is_a_replica(tmp_path):
    head = {"ansible_host": "10.0.0.12", "llmfleet_cluster_address": "10.0.1.12",
            "llmfleet_services": [engine(workers=["gpu-w"])]}
    worker = {"ansible_host": "10.0.0.13", "llmfleet_cluster_address": "10.0.1.13"}
    inv = fleet(tmp_path, **{"gpu-b": head, "gpu-w": worker})
    assert ("gpu-b", "chat", "10.0.0.12", 8080, "chat") in where(plan(inv).spec.replicas)
    assert not [r for r in plan(inv).spec.replicas if r.host == "gpu-w"]


@pytest.mark.parametrize(
    ("bind", "address"),
    [
        ({}, "10.0.0.12"),  # the default, 0.0.0.0: the host's ansible_host
        ({"llmfleet_bind_address": "0.0.0.0"}, "10.0.0.12"),
        ({"llmfleet_bind_address": "::"}, "10.0.0.12"),
        ({"llmfleet_bind_address": "192.168.7.9"}, "192.168.7.9"),  # one address: that address
        ({"bind_address": "192.168.7.10"}, "192.168.7.10"),  # the service's own wins
    ],
)
def test_where_the_gateway_reaches_a_replica(tmp_path, bind, address):
    svc_bind = {"bind_address": bind.pop("bind_address")} if "bind_address" in bind else {}
    gpu_b = {"ansible_host": "10.0.0.12", "llmfleet_services": [engine(**svc_bind)], **bind}
    (rep,) = plan(fleet(tmp_path, gateway(["gpu-b"]), **{"gpu-b": gpu_b})).spec.replicas
    assert rep.address == address


def test_a_loopback_replica_on_the_gateways_own_host_is_reached_on_loopback(tmp_path):
    edge = {"ansible_host": "10.0.0.2",
            "llmfleet_services": [{**gateway(["edge"]), "bind_address": "10.0.0.2"}, engine(bind_address="127.0.0.1")]}
    (rep,) = plan(fleet(tmp_path, edge=edge)).spec.replicas
    assert (rep.host, rep.address) == ("edge", "127.0.0.1")


def test_a_loopback_replica_on_another_host_is_one_line_naming_file_host_service_and_fix(tmp_path):
    gpu_b = {"ansible_host": "10.0.0.12", "llmfleet_services": [engine(bind_address="127.0.0.1")]}
    with pytest.raises(UsageError) as e:
        plan(fleet(tmp_path, **{"gpu-b": gpu_b}))
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith(str(tmp_path / "inv" / "host_vars" / "gpu-b.yml") + ": host gpu-b: service chat: ")
    assert "loopback" in text and "gateway gw on edge cannot reach it" in text
    assert "set bind_address" in text


def test_an_unknown_upstream_is_named_with_did_you_mean(tmp_path):
    with pytest.raises(UsageError) as e:
        plan(fleet(tmp_path, gateway(["replica"])))
    text = str(e.value)
    assert "host edge: service gw: gateway.upstreams: 'replica' is neither a host nor a group" in text
    assert "did you mean 'replicas'?" in text


def test_upstreams_with_no_engine_service_are_refused(tmp_path):
    inv = fleet(tmp_path, gateway(["exporters"]), exporters={"ansible_host": "10.0.0.9", "llmfleet_services": [NODE]})
    with pytest.raises(UsageError, match=r"host edge: service gw: gateway.upstreams exporters hold no engine service"):
        plan(inv)


def test_a_service_that_is_not_a_gateway_is_refused(tmp_path):
    inv = fleet(tmp_path)
    (svc,) = [s for s in settings_for(inv.hosts["gpu-b"]).services]
    with pytest.raises(UsageError, match="not a gateway service"):
        gp.plan_gateway(inv, inv.hosts["gpu-b"], svc, resolve)


# ------------------------------------------------------------------------------------------------
# Keys and TLS


def test_client_keys_become_sha256_hashes_and_the_clear_key_is_nowhere(tmp_path):
    keys = [{"name": "team-a", "key": {"from_env": "GW_KEY_A"}, "requests_per_minute": 600},
            {"name": "team-b", "key": {"from_env": "GW_KEY_B"}}]
    p = plan(fleet(tmp_path, gateway(api_keys=keys)))
    assert [(k.name, k.sha256_hex, k.requests_per_minute) for k in p.spec.keys] == [
        ("team-a", hashlib.sha256(SECRETS["GW_KEY_A"].encode()).hexdigest(), 600),
        ("team-b", hashlib.sha256(SECRETS["GW_KEY_B"].encode()).hexdigest(), None),
    ]
    files = render_files(p.spec)
    for clear in (SECRETS["GW_KEY_A"], SECRETS["GW_KEY_B"]):
        assert clear not in repr(p.spec)
        assert not any(clear in text for text in files.values())
        assert clear not in repr(p.env)


def test_an_empty_client_key_is_refused_naming_it(tmp_path):
    SECRETS["EMPTY"] = ""
    try:
        keys = [{"name": "team-z", "key": {"from_env": "EMPTY"}}]
        with pytest.raises(UsageError, match=r"service gw: gateway.api_keys team-z: the key is empty"):
            plan(fleet(tmp_path, gateway(api_keys=keys)))
    finally:
        del SECRETS["EMPTY"]


def test_replicas_with_an_api_key_carry_one_env_name_per_secret_reference(tmp_path):
    chat_key = {"api_key": {"from_env": "CHAT_KEY"}}
    inv = fleet(tmp_path, **{
        "gpu-a": {"ansible_host": "10.0.0.11", "llmfleet_services": [
            engine(**chat_key), engine("coder", 8081, served_name="coder", api_key={"from_env": "CODER_KEY"})]},
        "gpu-b": {"ansible_host": "10.0.0.12", "llmfleet_services": [engine(**chat_key)]},
    })
    p = plan(inv)
    envs = {(r.host, r.service): r.key_env for r in p.spec.replicas}
    chat_env, coder_env = envs[("gpu-a", "chat")], envs[("gpu-a", "coder")]
    assert envs[("gpu-b", "chat")] == chat_env  # one reference, one variable
    assert chat_env != coder_env and chat_env.startswith("LLMFLEET_UPSTREAM_KEY_")
    assert p.env == {chat_env: SECRETS["CHAT_KEY"], coder_env: SECRETS["CODER_KEY"]}
    cfg = render_files(p.spec)["haproxy.cfg"]
    assert f'"Bearer ${{{chat_env}}}"' in cfg and f'"Bearer ${{{coder_env}}}"' in cfg
    assert SECRETS["CHAT_KEY"] not in cfg and SECRETS["CODER_KEY"] not in cfg


def test_replicas_without_a_key_carry_none(tmp_path):
    p = plan(fleet(tmp_path))
    assert {r.key_env for r in p.spec.replicas} == {None} and p.env == {}


def test_replicas_of_one_name_with_different_keys_are_one_line_naming_the_gateway(tmp_path):
    inv = fleet(tmp_path, **{
        "gpu-b": {"ansible_host": "10.0.0.12", "llmfleet_services": [engine(api_key={"from_env": "CHAT_KEY"})]}})
    with pytest.raises(UsageError) as e:
        plan(inv)
    assert "host edge: service gw: " in str(e.value) and "must share one API key" in str(e.value)
    assert "\n" not in str(e.value)


def test_tls_combines_the_certificate_and_the_key(tmp_path):
    p = plan(fleet(tmp_path, gateway(tls={"cert": {"from_env": "CERT"}, "key": {"from_env": "KEY"}})))
    assert p.spec.tls is True
    assert p.tls_pem == SECRETS["CERT"] + SECRETS["KEY"]
    assert "ssl crt /opt/llmfleet/services/gw/current/tls.pem" in render_files(p.spec)["haproxy.cfg"]
    assert "PRIVATE KEY" not in "".join(render_files(p.spec).values())


def test_without_tls_there_is_no_pem(tmp_path):
    p = plan(fleet(tmp_path))
    assert p.spec.tls is False and p.tls_pem is None


@pytest.mark.parametrize(("cert", "key"), [("NOT_PEM", "KEY"), ("CERT", "NOT_PEM"), ("KEY", "CERT")])
def test_a_tls_file_that_is_not_pem_is_refused(tmp_path, cert, key):
    inv = fleet(tmp_path, gateway(tls={"cert": {"from_env": cert}, "key": {"from_env": key}}))
    with pytest.raises(UsageError, match=r"service gw: gateway.tls: cert must be a PEM certificate chain"):
        plan(inv)


# ------------------------------------------------------------------------------------------------
# The gateways in front of one replica


def test_fronting_finds_every_gateway_in_front_of_a_replica(tmp_path):
    second = {"ansible_host": "10.0.0.3", "llmfleet_services": [gateway(["gpu-b"], name="gw2", admin_port=9911)]}
    inv = fleet(tmp_path, edge2=second)
    fronts = gp.fronting(inv, "gpu-b", "chat")
    assert [(f.host.name, f.service.name, f.backend, f.server, f.admin_port, f.drain_timeout_s) for f in fronts] == [
        ("edge", "gw", "m_chat", "gpu-b__chat", 9901, 120),
        ("edge2", "gw2", "m_chat", "gpu-b__chat", 9911, 120),
    ]
    assert [(f.host.name, f.server) for f in gp.fronting(inv, "gpu-a", "coder")] == [("edge", "gpu-a__coder")]


@pytest.mark.parametrize(("host", "service"), [("gpu-a", "node"), ("edge", "gw"), ("gpu-c", "chat"),
                                               ("gpu-a", "nope")])
def test_fronting_finds_nothing_for_a_service_no_gateway_fronts(tmp_path, host, service):
    inv = fleet(tmp_path, **{"gpu-c": {"ansible_host": "10.0.0.13", "llmfleet_services": [engine()]}})
    assert gp.fronting(inv, host, service) == []


def test_a_gateway_whose_upstreams_are_broken_is_skipped_by_fronting(tmp_path):
    broken = {"ansible_host": "10.0.0.3", "llmfleet_services": [gateway(["no-such-group"], name="gw2")]}
    inv = fleet(tmp_path, edge2=broken)
    assert [(f.host.name, f.service.name) for f in gp.fronting(inv, "gpu-b", "chat")] == [("edge", "gw")]


def test_the_drain_timeout_and_admin_port_come_from_the_gateway(tmp_path):
    inv = fleet(tmp_path, gateway(drain_timeout_s=7, admin_port=9950))
    (front,) = gp.fronting(inv, "gpu-b", "chat")
    assert (front.drain_timeout_s, front.admin_port) == (7, 9950)
