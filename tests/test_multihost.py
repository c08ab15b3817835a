"""A service over several hosts: the inventory's workers, what each host renders, the join checks' parsers.

Pure (no host): the end-to-end run (two lab hosts, llama.cpp RPC) is tests/lab/test_multihost.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmfleet.errors import InventoryError, UsageError
from llmfleet.images.lock import ImageRef
from llmfleet.inventory.ansible import load_inventory
from llmfleet.inventory.services import Service, cluster_address_problem, host_settings, resolve_workers
from llmfleet.knowledge.planner import PlanSummary
from llmfleet.release import cluster as C
from llmfleet.release import multihost as M
from llmfleet.release import service_ops
from llmfleet.release.check import check_inventory
from llmfleet.release.render import load_role, render

IMAGE = ImageRef(key="llamacpp:x", repository="reg.lab:5000/llama", digest="sha256:" + "ab" * 32, tag="x", pinned=True,
                 upstream_repository="reg.lab:5000/llama")
VIMAGE = ImageRef(key="vllm:x", repository="reg.lab:5000/vllm", digest="sha256:" + "cd" * 32, tag="x", pinned=True,
                  upstream_repository="reg.lab:5000/vllm")


def svc(**kw) -> Service:
    base = {"name": "big", "engine": "llamacpp", "model": "m", "model_path": "/srv/models/m.gguf",
            "image": "llamacpp:x", "workers": ["w1"]}
    return Service.model_validate(base | kw)


# -- inventory -------------------------------------------------------------------------------------

HOSTS = ["head", "w1", "w2", "w3"]
GROUPS = {"pair": ["w1", "w2"], "all_p40": ["head", "w1", "w2"], "empty": []}


@pytest.mark.parametrize("workers,engine,want", [
    (["w1"], "llamacpp", ["w1"]),
    (["w2", "w1"], "llamacpp", ["w2", "w1"]),  # the order given is the --rpc order
    (["pair", "w3"], "vllm", ["w1", "w2", "w3"]),
    (["all_p40"], "llamacpp", ["w1", "w2"]),  # a group holding the head: its other hosts
    (["nope"], "llamacpp", "'nope' is neither a host nor a group"),
    (["head"], "llamacpp", "head is this service's head"),
    (["pair", "w1"], "llamacpp", "host w1 is listed twice"),
    (["empty"], "llamacpp", "holds no host but the head"),
    (["w1"], "tgi", "engine tgi has no multi-host support"),
])
def test_workers_resolve_or_say_why(workers, engine, want):
    s = svc(workers=workers) if engine != "tgi" else svc(workers=workers).model_copy(update={"engine": "tgi"})
    supported = {"llamacpp", "vllm"}
    if isinstance(want, list):
        assert resolve_workers(s, "head", HOSTS, GROUPS.get, supported) == want
    else:
        with pytest.raises(ValueError, match=want):
            resolve_workers(s, "head", HOSTS, GROUPS.get, supported)


def test_a_worker_listed_twice_in_the_service_is_a_schema_error():
    with pytest.raises(InventoryError, match=r"host h: service big: llmfleet_services\[0\]\.workers: .*w1 is listed twice"):
        host_settings("h", {"llmfleet_services": [svc(workers=["w1"]).model_dump() | {"workers": ["w1", "w1"]}]})


@pytest.mark.parametrize("address,problem", [
    ("10.0.0.5", None), ("172.20.1.2", None), ("192.168.88.10", None), ("fd00::5", None),
    ("0.0.0.0", "binds every interface"), ("::", "binds every interface"),
    ("127.0.0.1", "loopback"), ("8.8.8.8", "not a private address"), ("2001:4860::8888", "not a private address"),
    ("gpu-01", "must be an IP address"),
])
def test_cluster_addresses_are_private_unicast_only(address, problem):
    got = cluster_address_problem(address)
    assert (got is None) if problem is None else (problem in got)


def test_a_public_cluster_address_is_refused_in_the_inventory_with_the_reason():
    with pytest.raises(InventoryError, match=r"llmfleet_cluster_address: .*not a private address.*no authentication"):
        host_settings("h", {"llmfleet_cluster_address": "8.8.8.8"})


def _inventory(tmp_path: Path, services_head: list[dict], worker_vars: dict | None = None) -> str:
    doc = {"all": {"children": {"split": {"hosts": {"head": {"ansible_host": "10.0.0.1"},
                                                     "w1": {"ansible_host": "10.0.0.2", **(worker_vars or {})}}}},
                   "vars": {"llmfleet_cluster_interface": "eth0"}}}
    doc["all"]["children"]["split"]["hosts"]["head"]["llmfleet_services"] = services_head
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    return str(tmp_path)


@pytest.mark.parametrize("workers,worker_vars,want", [
    (["w1"], None, None),
    (["w9"], None, "service big: workers: 'w9' is neither a host nor a group"),
    (["head"], None, "service big: workers: head is this service's head"),
    (["w1"], {"llmfleet_services": [{"name": "big", "engine": "llamacpp", "model": "m", "model_path": "/m/x",
                                     "image": "llamacpp:x"}]}, "host w1 has a service of its own named big"),
    (["w1"], {"llmfleet_services": [{"name": "other", "engine": "llamacpp", "model": "m", "model_path": "/m/x",
                                     "image": "llamacpp:x", "port": 50052}]}, "uses port 50052, the cluster port"),
])
def test_inventory_check_reports_bad_workers_on_one_line(tmp_path, workers, worker_vars, want):
    path = _inventory(tmp_path, [svc(workers=workers).model_dump(mode="json", exclude_unset=True)], worker_vars)
    reports = {r.host: r for r in check_inventory(load_inventory(path))}
    errors = [f.message for f in reports["head"].findings if f.level == "error"]
    if want is None:
        assert errors == []
    else:
        assert len(errors) == 1 and want in errors[0] and "\n" not in errors[0], errors
        assert "hosts.yml" in errors[0] and "host head" in errors[0]


def test_the_lab_inventory_has_two_multihost_services():
    inv = load_inventory(str(Path(__file__).resolve().parents[1] / "inventory" / "lab"))
    assert service_ops.multihost_services(inv, list(inv.hosts)) == [("gpu-p40-11", "tiny-split"),
                                                                    ("gpu-4090-11", "tiny-vllm-split")]
    pair = [inv.hosts[h] for h in ("gpu-p40-11", "gpu-p40-12", "gpu-4090-11", "gpu-4090-12")]
    assert all(r.ok for r in check_inventory(inv, pair))


# -- addresses -------------------------------------------------------------------------------------


def test_member_address_from_the_inventory_or_the_interface():
    hs = host_settings("w1", {"llmfleet_cluster_address": "10.0.0.2"})
    assert C.member_for("w1", hs) == C.Member("w1", "10.0.0.2", None)
    hs = host_settings("w1", {"llmfleet_cluster_interface": "eth1"})
    assert C.member_for("w1", hs, "172.18.0.3") == C.Member("w1", "172.18.0.3", "eth1")
    with pytest.raises(UsageError, match="eth1 .* has no IPv4 address"):
        C.member_for("w1", hs, None)
    with pytest.raises(UsageError, match="set llmfleet_cluster_address .* or llmfleet_cluster_interface"):
        C.member_for("w1", host_settings("w1", {}))
    with pytest.raises(UsageError, match="interface eth1: 8.8.8.8 is not a private address"):
        C.member_for("w1", hs, "8.8.8.8")


@pytest.mark.parametrize("out,want", [
    ("@@addr 172.18.0.3\n", "172.18.0.3"), ("@@addr \n", None), ("@@addr\n", None), ("", None),
])
def test_parse_address(out, want):
    assert C.parse_address(out) == want


# -- render: llama.cpp -----------------------------------------------------------------------------


def _cluster(engine: str = "llamacpp", workers=("w1", "w2"), port=None) -> tuple[Service, C.Cluster]:
    s = svc(engine=engine, workers=list(workers), **({"cluster_port": port} if port else {}),
            **({"image": "vllm:x", "model_path": "/srv/models/m"} if engine == "vllm" else {}))
    members = [C.Member(w, f"10.0.0.{i + 2}", "eth1") for i, w in enumerate(workers)]
    return s, C.make_cluster(s, load_role(engine), C.Member("head", "10.0.0.1", "eth1"), members)


def _compose(text: str) -> dict:
    return yaml.safe_load(text)["services"]["engine"]


def test_llamacpp_head_names_every_worker_in_order_and_keeps_its_published_port():
    s, cl = _cluster(workers=("w2", "w1"), port=50100)
    hs = host_settings("head", {"llmfleet_bind_address": "127.0.0.1"})
    r = render(s, hs, IMAGE, PlanSummary(engine_args=("-ngl", "99", "--tensor-split", "1,1,2")),
               head=C.head_overlay(s, load_role("llamacpp"), cl, []))
    args = r.engine_args
    assert args[args.index("--rpc") + 1] == "10.0.0.2:50100,10.0.0.3:50100"
    assert args[args.index("--tensor-split") + 1] == "1,1,2"
    eng = _compose(r.files["compose.yml"])
    assert eng["ports"][0]["host_ip"] == "127.0.0.1" and "network_mode" not in eng


def test_rpc_is_owned_by_llmfleet():
    s, cl = _cluster()
    s = s.model_copy(update={"engine_args": ["--rpc", "1.2.3.4:1"]})
    with pytest.raises(UsageError, match="--rpc is set by llmfleet"):
        render(s, host_settings("head", {}), IMAGE, None, head=C.head_overlay(s, load_role("llamacpp"), cl, []))


def test_llamacpp_worker_runs_rpc_server_on_its_cluster_address_only():
    s, cl = _cluster()
    r = C.render_worker(s, host_settings("w1", {}), IMAGE, cl, cl.workers[0])
    eng = _compose(r.files["compose.yml"])
    assert eng["entrypoint"] == ["/app/rpc-server"]
    assert eng["command"] == ["--host", "10.0.0.2", "--port", "50052"]
    assert eng["network_mode"] == "host" and "ports" not in eng and "volumes" not in eng
    assert eng["labels"]["io.llmfleet.role"] == "worker" and eng["labels"]["io.llmfleet.head"] == "head"
    assert "0.0.0.0" not in r.files["compose.yml"]
    assert eng["cap_drop"] == ["ALL"] and eng["user"] == "65534:65534"
    # its watchdog judges the container and the rpc-server port, not HTTP /health
    assert set(r.files) == {"compose.yml", "llmfleet-big.service", "service.env", "watchdog.sh",
                            "llmfleet-big-watchdog.service", "llmfleet-big-watchdog.timer"}
    wd = r.files["watchdog.sh"]
    assert ("PORT=50052\nLISTENER='rpc-server 10.0.0.2:50052'\nURL='container llmfleet-big and rpc-server 10.0.0.2:50052'\n"
            in wd and "/health" not in wd)
    assert r.files["service.env"].count("=") == 0


def test_worker_release_changes_with_the_head_address_only_where_it_matters():
    s, cl = _cluster()
    a = C.render_worker(s, host_settings("w1", {}), IMAGE, cl, cl.workers[0])
    b = C.render_worker(s, host_settings("w1", {}), IMAGE, cl, cl.workers[0])
    assert a.content_hash == b.content_hash
    cl2 = C.make_cluster(s, load_role("llamacpp"), cl.head, [C.Member("w1", "10.0.0.9", None), cl.workers[1]])
    c = C.render_worker(s, host_settings("w1", {}), IMAGE, cl2, cl2.workers[0])
    assert c.content_hash != a.content_hash


# -- render: vLLM over Ray -------------------------------------------------------------------------


def test_vllm_head_starts_ray_waits_for_the_workers_then_serves():
    s, cl = _cluster("vllm")
    hs = host_settings("head", {"llmfleet_bind_address": "10.0.0.1"})
    plan = PlanSummary(engine_args=("--tensor-parallel-size", "2"))
    r = render(s, hs, VIMAGE, plan, head=C.head_overlay(s, load_role("vllm"), cl, list(plan.engine_args)))
    eng = _compose(r.files["compose.yml"])
    assert eng["network_mode"] == "host" and "ports" not in eng
    assert eng["entrypoint"][:2] == ["/bin/sh", "-c"]
    script = eng["entrypoint"][2].replace("$$", "$")
    assert "ray start --head --node-ip-address=10.0.0.1 --port=6379" in script
    assert "-ge 3 ]" in script and 'exec python3 -m vllm.entrypoints.openai.api_server "$@"' in script
    args = eng["command"]
    assert args[args.index("--host") + 1] == "10.0.0.1" and args[args.index("--port") + 1] == str(s.port)
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--pipeline-parallel-size") + 1] == "3"
    assert args[args.index("--distributed-executor-backend") + 1] == "ray"
    env = eng["environment"]
    assert env["VLLM_HOST_IP"] == "10.0.0.1" and env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert "10.0.0.1:8000/health" in " ".join(eng["healthcheck"]["test"])


def test_vllm_head_keeps_the_planners_pipeline_size():
    s, cl = _cluster("vllm")
    plan_args = ["--pipeline-parallel-size", "3", "--distributed-executor-backend", "ray"]
    overlay = C.head_overlay(s, load_role("vllm"), cl, plan_args)
    assert overlay.args == ()


def test_vllm_worker_joins_the_head_with_the_model_mounted():
    s, cl = _cluster("vllm")
    r = C.render_worker(s, host_settings("w2", {}), VIMAGE, cl, cl.workers[1])
    eng = _compose(r.files["compose.yml"])
    assert eng["entrypoint"][:2] == ["/bin/sh", "-c"]
    script = eng["entrypoint"][2].replace("$$", "$")
    assert "exec ray start --block --address=10.0.0.1:6379 --node-ip-address=10.0.0.3" in script
    # it starts before the head: it waits (bounded) for the head's Ray port first
    assert script.index('socket.create_connection(("10.0.0.1", 6379), 3)') < script.index("ray start")
    assert "if [ $i -gt 120 ]; then" in script
    assert eng["network_mode"] == "host" and eng["ipc"] == "host"
    assert eng["volumes"][0]["source"] == "/srv/models/m" and eng["volumes"][0]["read_only"] is True
    assert eng["environment"]["VLLM_HOST_IP"] == "10.0.0.3"


def test_a_workers_container_gets_the_services_compose_overrides_as_the_head_does():
    # e.g. the memlock limit of hosts whose Docker cannot raise it to unlimited (the role's -1): without
    # it the worker's container never starts ("error setting rlimit type 8: operation not permitted")
    s, cl = _cluster("vllm")
    s = s.model_copy(update={"compose_overrides": {"ulimits": {"memlock": 8388608}}})
    r = C.render_worker(s, host_settings("w1", {}), VIMAGE, cl, cl.workers[0])
    assert yaml.safe_load(r.files["compose.override.yml"]) == {"services": {"engine": {"ulimits": {"memlock": 8388608}}}}
    assert r.modes["compose.override.yml"] == 0o644
    assert "-f compose.yml -f compose.override.yml" in r.files["llmfleet-big.service"]
    plain = C.render_worker(s.model_copy(update={"compose_overrides": {}}), host_settings("w1", {}), VIMAGE, cl,
                            cl.workers[0])
    assert "compose.override.yml" not in plain.files and "compose.override.yml" not in plain.files["llmfleet-big.service"]
    assert plain.content_hash != r.content_hash


def test_single_host_render_is_unchanged_by_the_cluster_support():
    s = svc(workers=[])
    r = render(s, host_settings("h", {}), IMAGE, None)
    args = r.engine_args
    assert args[args.index("--host") + 1] == "0.0.0.0" and "--rpc" not in args


# -- join checks -----------------------------------------------------------------------------------

LOG = """llama_model_load_from_file_impl: using device RPC0 (10.0.0.2:50052) (unknown id) - 5000 MiB free
llama_model_load_from_file_impl: using device RPC1 (10.0.0.3:50052) (unknown id) - 5000 MiB free
"""


@pytest.mark.parametrize("log,missing", [
    (LOG, []),
    (LOG.splitlines()[0], ["w2"]),
    ("", ["w1", "w2"]),
    # an earlier start with both, then a restart that found only one: the last load counts
    (LOG + "llama_model_load_from_file_impl: using device RPC0 (10.0.0.3:50052) (unknown id) - 1 MiB free\n",
     ["w1"]),
])
def test_rpc_join_check_reads_the_heads_devices(log, missing):
    _, cl = _cluster()
    assert C.missing_rpc_workers(cl, C.rpc_devices(log)) == missing


@pytest.mark.parametrize("out,want", [
    ("@@peer 10.0.0.1:41234\n@@peer [::ffff:10.0.0.5]:5000\n@@end\n", ["10.0.0.1", "10.0.0.5"]),
    ("@@peer [fd00::1]:41234\n@@end\n", ["fd00::1"]),
    ("@@end\n", []),
])
def test_rpc_peers_of_a_worker(out, want):
    assert C.parse_rpc_peers(out) == want


@pytest.mark.parametrize("out,want", [("@@nodes 3\n", 3), ("Traceback\nConnectionError\n", None), ("@@nodes x", None)])
def test_ray_node_count(out, want):
    assert C.parse_ray_nodes(out) == want


@pytest.mark.parametrize("out,want", [
    ("@@unit active\n@@port open\n", ("active", True)),
    ("@@unit active\n@@port closed\n", ("active", False)),
    ("@@unit failed\n", ("failed", None)),
])
def test_worker_probe(out, want):
    assert C.parse_worker_probe(out) == want


def test_cluster_hosts_are_locked_in_sorted_order():
    _, cl = _cluster(workers=("w2", "a-first"))
    assert cl.hosts == ["a-first", "head", "w2"]


def test_render_task_shows_the_heads_and_each_workers_files_offline(tmp_path):
    from llmfleet.cli.service_tasks import _render_service
    from llmfleet.images.lock import ImageLock
    from llmfleet.settings import Settings

    ref = "reg.lab:5000/llama@sha256:" + "ab" * 32
    path = _inventory(tmp_path, [svc(image=ref, workers=["w1"]).model_dump(mode="json", exclude_unset=True)],
                      {"llmfleet_cluster_address": "10.0.0.2"})
    inv = load_inventory(path)
    hs = inv.settings_for(inv.hosts["head"])
    doc = _render_service(inv, inv.hosts["head"], hs, hs.services[0], ImageLock(images={}), Settings.of(None))
    args = doc["engine_args"]
    # the head's own address comes from its interface at deploy time; the worker's is in the inventory
    assert args[args.index("--rpc") + 1] == "10.0.0.2:50052"
    worker = _compose(doc["workers"]["w1"]["compose.yml"])
    assert worker["command"] == ["--host", "10.0.0.2", "--port", "50052"]
    assert any("head: its address is read from eth0 at deploy time" in n for n in doc["notes"])


SPLIT_70B = [
    ("llamacpp", "llamacpp:b5000-cu122", "q4_k_m", "/srv/models/l70.gguf", "Tesla P40",
     {"--split-mode", "--tensor-split"}),
    ("vllm", "vllm:0.19.1", "awq-int4", "/srv/models/l70", "NVIDIA A10",
     {"--tensor-parallel-size", "--pipeline-parallel-size", "--distributed-executor-backend"}),
]


@pytest.mark.parametrize("engine,image,quant,path,card,split_flags", SPLIT_70B)
def test_split_plan_flags_are_known_to_the_role_tables(engine, image, quant, path, card, split_flags):
    """A 70B model over 2 hosts x 2 cards: every flag the planner emits is in the role's flag table (so an
    engine_args override replaces it instead of doubling it), and the head's render keeps the plan's."""
    from llmfleet.knowledge.planner import plan_for_service
    from llmfleet.release.render import split_flags as split

    s = Service.model_validate({"name": "l70", "engine": engine, "model": "llama-3.1-70b-instruct", "quant": quant,
                                "model_path": path, "image": image, "gpus": [0, 1], "workers": ["w1"]})
    plan = plan_for_service(s, card, 2, hosts=2)
    role = load_role(engine)
    names = [n for n, _ in split(plan.engine_args, role)]
    assert split_flags <= set(names)
    assert [n for n in names if role.flag(n) is None] == []
    cl = C.make_cluster(s, role, C.Member("head", "10.0.0.1", "eth1"), [C.Member("w1", "10.0.0.2", "eth1")])
    overlay = C.head_overlay(s, role, cl, plan.engine_args)
    r = render(s, host_settings("head", {}), VIMAGE if engine == "vllm" else IMAGE, plan, head=overlay)
    for flag in split_flags:  # once each: the plan's value, not a second copy from the overlay
        assert r.engine_args.count(flag) == 1


def test_inventory_check_plans_a_split_service_over_its_hosts(tmp_path):
    doc = {"name": "l70", "engine": "llamacpp", "model": "llama-3.1-70b-instruct", "quant": "q4_k_m",
           "model_path": "/srv/models/l70.gguf", "image": "llamacpp:b5000-cu122", "gpus": [0, 1], "context": 32768}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    single = _inventory(tmp_path / "a", [doc])  # 2 x P40: ~40 GB of weights and ~10 GB of KV do not fit
    split = _inventory(tmp_path / "b", [doc | {"workers": ["w1"]}])  # 2 x P40 on each of 2 hosts: they do
    for path, fits in ((single, False), (split, True)):
        inv = load_inventory(path)
        for h in inv.hosts.values():
            h.vars["llmfleet_gpu"] = "Tesla P40"
        report = {r.host: r for r in check_inventory(inv)}["head"]
        msgs = [f.message for f in report.findings if "does not fit" in f.message]
        assert (msgs == []) is fits, msgs


# ---------------------------------------------------------------------------------------------
# The head's check that it reaches every worker endpoint, before it switches


def test_reach_targets_are_the_rpc_endpoints_in_order_and_none_for_ray():
    _, cl = _cluster(workers=("w2", "w1"), port=50100)
    assert C.reach_targets(cl) == [("w2", "10.0.0.2", 50100), ("w1", "10.0.0.3", 50100)]
    _, ray = _cluster(engine="vllm")
    assert C.reach_targets(ray) == []


def test_reach_script_quotes_every_value_and_names_no_host():
    text = C.reach_script([("w; rm -rf /", "10.0.0.2", 50052), ("w2", "fd00::2", 50053)], timeout_s=2)
    assert "timeout 2 bash -c 'exec 3<>/dev/tcp/10.0.0.2/50052'" in text
    assert "timeout 2 bash -c 'exec 3<>/dev/tcp/fd00::2/50053'" in text
    assert "rm -rf" not in text and "w2" not in text  # targets are named by index
    assert text.rstrip().endswith('if [ "$bad" != 0 ]; then exit 3; fi')


@pytest.mark.parametrize("out, statuses", [
    ("@@reach 0 ok\n@@reach 1 ok\n", ["ok", "ok"]),
    ("@@reach 0 ok\n@@reach 1 refused\n", ["ok", "refused"]),
    ("@@reach 0 timeout\n", ["timeout", "missing"]),
    ("@@reach 1 unchecked bash: not found\n@@reach 0 unreachable No route to host\n", ["unreachable", "unchecked"]),
    ("junk\n@@reach x ok\n", ["missing", "missing"]),
])
def test_parse_reach(out, statuses):
    targets = [("w1", "10.0.0.2", 50052), ("w2", "10.0.0.3", 50052)]
    assert [r.status for r in C.parse_reach(out, targets)] == statuses


def test_reach_failure_is_one_line_naming_head_worker_endpoint_and_fix():
    targets = [("w1", "10.0.0.2", 50052), ("w2", "fd00::3", 50052)]
    reach = C.parse_reach("@@reach 0 ok\n@@reach 1 refused\n", targets)
    msg = C.reach_failure("head", reach, "10.0.0.1")
    assert msg == ("head head cannot reach worker w2 at [fd00::3]:50052 (refused): open TCP port 50052 on w2 to "
                   "10.0.0.1 (firewall), or set w2's llmfleet_cluster_address to an address head reaches")
    assert "\n" not in msg
    ok = C.parse_reach("@@reach 0 ok\n@@reach 1 unchecked bash: not found\n", targets)
    assert C.reach_failure("head", ok, "10.0.0.1") is None
    assert "(timeout)" in C.reach_failure("head", C.parse_reach("@@reach 0 timeout\n", targets[:1]), "10.0.0.1")


def test_reach_script_runs_against_real_ports():
    # the script itself under sh, against a listening and a closed loopback port
    import shutil
    import socket
    import subprocess

    if shutil.which("bash") is None or shutil.which("timeout") is None:
        pytest.skip("needs bash and timeout(1)")
    with socket.socket() as srv, socket.socket() as probe:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        probe.bind(("127.0.0.1", 0))  # bound, never listening: a closed port
        targets = [("up", "127.0.0.1", srv.getsockname()[1]), ("down", "127.0.0.1", probe.getsockname()[1])]
        res = subprocess.run(["sh", "-c", C.reach_script(targets)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 3, res
    assert [r.status for r in C.parse_reach(res.stdout, targets)] == ["ok", "refused"]
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        res = subprocess.run(["sh", "-c", C.reach_script([("up", "127.0.0.1", srv.getsockname()[1])])],
                             capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and res.stdout.strip() == "@@reach 0 ok"


# ---------------------------------------------------------------------------------------------
# llama.cpp images and rpc-server (engine catalog: rpc_server.ships)


@pytest.mark.parametrize("image, worker_image, refused", [
    ("llamacpp:server-cuda-12.8", None, "image llamacpp:server-cuda-12.8"),  # upstream's server image: no RPC
    ("llamacpp:b5000-cu122", "llamacpp:server-cuda-12.8", "worker_image llamacpp:server-cuda-12.8"),
    ("llamacpp:server-cuda-12.8", "llamacpp:b5000-cu122", "image llamacpp:server-cuda-12.8"),  # the head needs --rpc
    ("llamacpp:b5000-cu122", None, None),
    ("llamacpp:vendored-0.3.36-cu118", None, None),
    ("llamacpp:lab-cpu", None, None),
    ("llamacpp:x", None, None),  # not in the catalog: not known either way
    ("llamacpp:lab-broken", None, None),  # in the catalog, rpc_server not stated
])
def test_an_image_known_to_lack_rpc_server_is_refused_in_one_line(image, worker_image, refused):
    s = svc(image=image, **({"worker_image": worker_image} if worker_image else {}))
    problem = C.rpc_image_problem(s)
    if refused is None:
        assert problem is None
        C.make_cluster(s, load_role("llamacpp"), C.Member("head", "10.0.0.1"), [C.Member("w1", "10.0.0.2")])
        return
    assert problem.startswith(f"service big: {refused} has no rpc-server / RPC backend (engine catalog: ")
    assert "use an image built with -DGGML_RPC=ON that ships /app/rpc-server" in problem and "\n" not in problem
    with pytest.raises(UsageError, match="has no rpc-server"):
        C.make_cluster(s, load_role("llamacpp"), C.Member("head", "10.0.0.1"), [C.Member("w1", "10.0.0.2")])


def test_the_catalogs_rpc_claims_match_the_dockerfiles():
    from llmfleet.knowledge.compat import load_engine_catalog

    cat = load_engine_catalog()
    repo = Path(__file__).resolve().parents[1] / "dockerfiles"
    cuda = (repo / "llamacpp-cuda" / "Dockerfile").read_text()
    assert cat.release("llamacpp:b5000-cu122").rpc_server.ships
    assert "-DGGML_RPC=ON" in cuda and "/out/rpc-server" in cuda and "COPY --from=build /out/llama-server /out/rpc-server /app/" in cuda
    script = (repo / "llamacpp-cu118" / "build-llama-server.sh").read_text()
    assert cat.release("llamacpp:vendored-0.3.36-cu118").rpc_server.ships
    assert "-DGGML_RPC=ON" in script and '"$out.tmp/rpc-server"' in script and "ggml-rpc" in script
    lab = (repo / "lab-llamacpp" / "build-llama-server.sh").read_text()
    assert cat.release("llamacpp:lab-cpu").rpc_server.ships and "-DGGML_RPC=ON" in lab
    # the role runs the worker where those images put it
    assert load_role("llamacpp").cluster["worker_entrypoint"] == ["/app/rpc-server"]
    assert not cat.release("llamacpp:server-cuda-12.8").rpc_server.ships


def test_deploy_and_render_refuse_before_any_connection(tmp_path):
    from llmfleet.cli.service_tasks import _render_service
    from llmfleet.images.lock import ImageLock, LockedImage
    from llmfleet.release.deploy import DeployOptions
    from llmfleet.settings import Settings

    path = _inventory(tmp_path, [svc(image="llamacpp:server-cuda-12.8").model_dump(mode="json", exclude_unset=True)],
                      {"llmfleet_cluster_address": "10.0.0.2"})
    with pytest.raises(UsageError, match=r"host head: service big: image llamacpp:server-cuda-12.8 has no rpc-server"):
        M.prepare_service(path, "head", "big", Settings.of(None), DeployOptions(who="t"))
    inv = load_inventory(path)
    hs = inv.settings_for(inv.hosts["head"])
    lock = ImageLock(images={"llamacpp:server-cuda-12.8": LockedImage(
        key="llamacpp:server-cuda-12.8", repository="ghcr.io/ggml-org/llama.cpp", digest="sha256:" + "ef" * 32,
        tag="server-cuda")})
    with pytest.raises(UsageError, match="image llamacpp:server-cuda-12.8 has no rpc-server"):
        _render_service(inv, inv.hosts["head"], hs, hs.services[0], lock, Settings.of(None))


def test_a_worker_goes_back_to_where_its_previous_release_listens():
    # a deploy that moves the cluster port (or the address) checks the previous release, when going back,
    # on the endpoint its own render put it on
    from llmfleet.knowledge.release_state import Manifest, ReleaseInfo, ServiceState

    _, old = _cluster(workers=("w1", "w2"))
    man = Manifest(release="r1", service="big", inputs={"cluster": old.to_dict(), "role": "worker"})
    st = ServiceState(name="big", current="r1", releases={"r1": ReleaseInfo(id="r1", manifest=man)})
    assert M.release_endpoint(st, "r1", "w2") == ("10.0.0.3", 50052)
    assert M.release_endpoint(st, "r1", "w9") is None
    assert M.release_endpoint(st, "nope", "w2") is None and M.release_endpoint(None, "r1", "w2") is None
    bare = ServiceState(name="big", current="r1", releases={"r1": ReleaseInfo(id="r1", manifest=None)})
    assert M.release_endpoint(bare, "r1", "w2") is None
