"""Exporters as services (node exporter, NVIDIA's DCGM exporter), table-driven, no Docker, no SSH: the
inventory schema, where DCGM works (knowledge.exporters), the preflight's checks for an exporter, the
rendered compose files, and the health check that waits for the exporter's own series on /metrics."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from pydantic import ValidationError

from llmfleet.errors import InventoryError
from llmfleet.health import check as H
from llmfleet.images import lock as images
from llmfleet.inventory.ansible import check_all, load_inventory
from llmfleet.inventory.services import HostSettings, Service, host_settings
from llmfleet.knowledge import exporters
from llmfleet.knowledge.facts import Container, GpuFact
from llmfleet.release.preflight import check_host
from llmfleet.release.render import render
from llmfleet.release.store import UnitProbe
from tests.test_gpu_health import healthy, xid
from tests.test_gpu_health import host as gpu_health_of
from tests.test_preflight import DIGEST, TODAY, facts_for
from tests.test_services_schema import inventory_with

NODE = {"name": "node", "engine": "node-exporter", "image": "node-exporter:1.9.1"}
DCGM = {"name": "dcgm", "engine": "dcgm-exporter", "image": "dcgm-exporter:4.2.3-4.1.3"}
LOCK = images.ImageLock(images={
    "node-exporter:1.9.1": images.LockedImage(key="node-exporter:1.9.1", repository="quay.io/prometheus/node-exporter",
                                              digest=DIGEST, tag="v1.9.1"),
    "dcgm-exporter:4.2.3-4.1.3": images.LockedImage(
        key="dcgm-exporter:4.2.3-4.1.3", repository="nvcr.io/nvidia/k8s/dcgm-exporter", digest=DIGEST,
        tag="4.2.3-4.1.3-ubuntu22.04", cuda="12.8.1"),
})


# ------------------------------------------------------------------------------------------------
# The inventory: an exporter is a service with no model


@pytest.mark.parametrize(("service", "port"), [(NODE, 9100), (DCGM, 9400)])
def test_an_exporter_needs_only_name_engine_and_image_and_gets_upstreams_port(tmp_path, service, port):
    (svc,) = check_all(load_inventory(inventory_with(tmp_path, [service])))["gpu-1"].services
    assert svc.port == port and svc.is_exporter
    assert svc.model is None and svc.model_path is None


def test_an_exporters_port_given_in_the_inventory_wins(tmp_path):
    (svc,) = check_all(load_inventory(inventory_with(tmp_path, [{**NODE, "port": 9101}])))["gpu-1"].services
    assert svc.port == 9101


def test_an_exporter_takes_its_roles_flags(tmp_path):
    args = ["--collector.textfile.directory=/var/lib/node_exporter"]
    (svc,) = check_all(load_inventory(inventory_with(tmp_path, [{**NODE, "engine_args": args}])))["gpu-1"].services
    assert svc.engine_args == args


@pytest.mark.parametrize(
    ("service", "field"),
    [
        ({**NODE, "model": "qwen2.5-7b-instruct"}, "model"),
        ({**NODE, "model_path": "/srv/models/q"}, "model_path"),
        ({**DCGM, "quant": "q4_k_m"}, "quant"),
        ({**DCGM, "api_key": {"from_env": "KEY"}}, "api_key"),
        ({**NODE, "workers": ["gpu-2"]}, "workers"),
        ({**DCGM, "context": 8192}, "context"),
    ],
)
def test_an_exporter_with_what_only_an_engine_takes_is_one_line_naming_the_field(tmp_path, service, field):
    inv = load_inventory(inventory_with(tmp_path, [service]))
    with pytest.raises(InventoryError) as err:
        check_all(inv)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(str(tmp_path / "inv" / "host_vars" / "gpu-1.yml") + ": host gpu-1: ")
    assert f"service {service['name']}: llmfleet_services[0].{field}: Value error, a {service['engine']} service has no model; remove it" in text


def test_an_engine_without_a_model_reports_model_and_model_path_with_the_other_missing_fields():
    with pytest.raises(ValidationError) as err:
        Service.model_validate({"name": "chat", "engine": "vllm", "port": "http"})
    found = {(e["loc"], e["type"]) for e in err.value.errors()}
    assert {(("model",), "missing"), (("model_path",), "missing"), (("image",), "missing"),
            (("port",), "int_parsing")} <= found


def test_an_engine_without_a_model_is_refused_by_the_loader_naming_the_field(tmp_path):
    inv = load_inventory(inventory_with(tmp_path, [{"name": "chat", "engine": "llamacpp", "image": "llamacpp:x"}]))
    with pytest.raises(InventoryError, match=r"service chat: llmfleet_services\[0\]\.model: required field is missing"):
        check_all(inv)


# ------------------------------------------------------------------------------------------------
# Where each exporter works (the preflight's `exporter` check)


def gpu(name: str, cc: str | None, data_center: bool | None, index: int = 0) -> GpuFact:
    return GpuFact(index=index, name=name, compute_capability=cc, data_center=data_center)


V100 = gpu("Tesla V100-SXM2-32GB", "7.0", True)
P40 = gpu("Tesla P40", "6.1", True)
T4 = gpu("Tesla T4", "7.5", True)
RTX4090 = gpu("NVIDIA GeForce RTX 4090", "8.9", False)
K40 = gpu("Tesla K40m", "3.5", True)
GTX780 = gpu("NVIDIA GeForce GTX 780", "3.5", False)
DCGM_DOC = "https://docs.nvidia.com/datacenter/dcgm/latest/installation.html"


@pytest.mark.parametrize(
    ("kind", "gpus", "driver", "status", "said", "fix"),
    [
        ("node-exporter", [], None, "pass", ["needs no GPU"], ""),
        ("node-exporter", [V100], "440.33.01", "pass", ["needs no GPU"], ""),
        ("dcgm-exporter", [V100, gpu("Tesla V100-SXM2-32GB", "7.0", True, 1)], "535.183.06", "pass",
         ["DCGM supports 2 GPUs on driver 535.183.06"], ""),
        # Pascal data-center: supported, but its profiling metrics need a data-center Volta or newer
        ("dcgm-exporter", [P40], "535.183.06", "pass", ["Tesla P40: no profiling (DCP) metrics", "7.0+"], ""),
        ("dcgm-exporter", [RTX4090], "550.54.15", "pass", ["not a data-center card", "part of DCGM's functionality",
                                                           DCGM_DOC], ""),
        # R470 is a CUDA 11 branch: supported by DCGM (R450+), but no source confirms DCGM 4 on it
        ("dcgm-exporter", [T4], "470.57.02", "warn", ["R470", "no source read here confirms DCGM 4", "R525"],
         "/metrics"),
        ("dcgm-exporter", [V100], "440.33.01", "fail", ["DCGM needs driver R450 or newer", "440.33.01", DCGM_DOC],
         "upgrade the driver to R450+"),
        ("dcgm-exporter", [], "535.183.06", "fail", ["the host reports none"], "GPU hosts"),
        ("dcgm-exporter", [V100], None, "warn", ["driver version is unknown", "R450+"], "invoke facts"),
        ("dcgm-exporter", [K40], "470.57.02", "fail", ["Tesla K40m (3.5) is older than DCGM supports for data-center "
                                                      "cards (3.7+"], "node-exporter only"),
        ("dcgm-exporter", [GTX780], "470.57.02", "fail", ["older than DCGM supports for non-data-center cards (5.0+"],
         "node-exporter only"),
        # one old card among good ones fails the host: DCGM would export nothing for it
        ("dcgm-exporter", [V100, gpu("Tesla K40m", "3.5", True, 1)], "535.183.06", "fail", ["GPU 1 Tesla K40m"],
         "node-exporter only"),
    ],
)
def test_support(kind, gpus, driver, status, said, fix):
    v = exporters.support(kind, gpus, driver)
    assert v.status == status, v.message
    for words in said:
        assert words in v.message
    assert fix in v.fix


def test_a_supported_volta_card_on_a_confirmed_driver_says_nothing_more():
    v = exporters.support("dcgm-exporter", [V100], "535.183.06")
    assert v.status == "pass" and ";" not in v.message


def test_every_exporter_kind_has_a_health_series_and_a_source():
    for kind in exporters.names():
        ex = exporters.for_kind(kind)
        assert ex.health_series and ex.sources and all(s.startswith("https://") for s in ex.sources)
    assert exporters.for_kind("node-exporter").health_series == "node_boot_time_seconds"
    assert exporters.for_kind("dcgm-exporter").health_series == "DCGM_FI_DEV_"


# ------------------------------------------------------------------------------------------------
# The preflight for an exporter


def preflight(card: str, service: dict, *, facts=None):
    s = Service.model_validate(service)
    f = facts if facts is not None else facts_for(card)
    (report,) = check_host("gpu-test-01", HostSettings(services=[s]), f, lock=LOCK, today=TODAY)
    return report


def by_id(report) -> dict:
    return {c.id: c for c in report.checks}


ENGINE_ONLY_CHECKS = {"plan", "quant", "dtype", "attention", "kv-dtype", "arch", "cuda-driver", "known-issue",
                      "model-files", "model-verified", "disk-model"}


@pytest.mark.parametrize(
    ("card", "service", "with_health", "ids"),
    [
        ("v100-535", {**NODE, "bind_address": "10.0.0.5"}, False,
         ["image", "exporter", "docker", "compose", "disk-image", "port", "bind"]),
        # node exporter reads no GPU: no gpu-runtime, no card health, even where the probe read it
        ("v100-535", {**NODE, "bind_address": "10.0.0.5"}, True,
         ["image", "exporter", "docker", "compose", "disk-image", "port", "bind"]),
        ("v100-535", {**DCGM, "bind_address": "10.0.0.5"}, False,
         ["image", "exporter", "docker", "gpu-runtime", "compose", "disk-image", "port", "bind"]),
        ("v100-535", {**DCGM, "bind_address": "10.0.0.5"}, True,
         ["image", "exporter", "gpu-health", "docker", "gpu-runtime", "compose", "disk-image", "port", "bind"]),
    ],
)
def test_an_exporters_checks_are_its_own_with_no_plan_and_no_model(card, service, with_health, ids):
    f = facts_for(card)
    if with_health:
        f.gpu_health = gpu_health_of()
    report = preflight(card, service, facts=f)
    assert [c.id for c in report.checks] == ids
    assert not ENGINE_ONLY_CHECKS & set(ids)
    assert report.ok, [(c.id, c.status, c.message) for c in report.checks if c.status == "fail"]


@pytest.mark.parametrize(
    ("card", "service", "check", "status", "said", "fix"),
    [
        ("v100-535", NODE, "image", "pass", f"quay.io/prometheus/node-exporter@{DIGEST}", ""),
        ("v100-535", {**NODE, "image": "node-exporter:9.9.9"}, "image", "fail", "is not in images.lock", "images.pin"),
        # an engine's image for an exporter: the image check says they disagree
        ("v100-535", {**NODE, "image": "dcgm-exporter:4.2.3-4.1.3"}, "image", "fail",
         "is a dcgm-exporter image but service node says engine node-exporter", "make engine and image agree"),
        ("v100-535", DCGM, "exporter", "pass", "DCGM supports 2 GPUs on driver 535.183.06", ""),
        ("t4-470", DCGM, "exporter", "warn", "no source read here confirms DCGM 4", "/metrics"),
        ("p40-470", DCGM, "exporter", "warn", "Tesla P40: no profiling (DCP) metrics", "/metrics"),
        ("rtx4090-550", DCGM, "exporter", "pass", "not a data-center card", ""),
        ("v100-535", {**DCGM, "gpus": [0, 5]}, "gpu", "fail", "asks for GPU 5", "gpus"),
        # every interface: WARN (host and GPU details for anyone); a private address or loopback passes
        ("v100-535", NODE, "bind", "warn", "listens on 0.0.0.0:9100", "bind_address"),
        ("v100-535", {**NODE, "bind_address": "10.0.0.5"}, "bind", "pass", "10.0.0.5:9100 (a private address)", ""),
        ("v100-535", {**DCGM, "bind_address": "127.0.0.1"}, "bind", "pass", "loopback", ""),
        ("v100-535", {**DCGM, "bind_address": "93.184.216.34"}, "bind", "warn", "93.184.216.34:9400", "bind_address"),
        ("v100-535", NODE, "port", "pass", "port 9100 is free", ""),
        ("v100-535", DCGM, "gpu-runtime", "pass", "nvidia runtime", ""),
    ],
)
def test_exporter_checks(card, service, check, status, said, fix):
    c = by_id(preflight(card, service)).get(check)
    assert c is not None, f"no {check} check"
    assert c.status == status, c.message
    assert said in c.message
    assert fix in c.fix


def test_a_card_that_failed_fails_the_dcgm_exporters_gpu_health_check():
    f = facts_for("v100-535")
    f.gpu_health = gpu_health_of(healthy(0), healthy(1), xids=(xid(79, gpu=1),))
    c = by_id(preflight("v100-535", {**DCGM, "gpus": [1]}, facts=f))["gpu-health"]
    assert c.status == "fail" and "Xid 79" in c.message


@pytest.mark.parametrize(
    ("containers", "status", "said"),
    [
        # the service's own container in the host's network holds its port: a deploy replaces it
        ([Container(name="llmfleet-node", image="quay.io/prometheus/node-exporter", state="running",
                    labels={"io.llmfleet.service": "node"})], "pass", "this service's own container llmfleet-node"),
        # someone else's process holds it
        ([], "fail", "in use by a process outside llmfleet"),
        ([Container(name="other", image="x", state="running")], "fail", "in use by a process outside llmfleet"),
    ],
)
def test_the_node_exporters_port_held_in_the_host_network(containers, status, said):
    f = facts_for("v100-535")
    f.ports = sorted({*f.ports, 9100})
    f.containers = containers
    c = by_id(preflight("v100-535", {**NODE, "bind_address": "10.0.0.5"}, facts=f))["port"]
    assert c.status == status and said in c.message


# ------------------------------------------------------------------------------------------------
# The rendered release


def rendered(service: dict):
    hs = host_settings("gpu-01", {"llmfleet_services": [service]})
    s = hs.services[0]
    r = render(s, hs, images.resolve(s.image, LOCK))
    return r, yaml.safe_load(r.files["compose.yml"])["services"]["engine"]


@pytest.mark.parametrize("bind", ["10.0.0.5", "127.0.0.1"])
def test_node_exporter_compose_reads_the_host_and_listens_on_the_bind_address(bind):
    r, c = rendered({**NODE, "bind_address": bind, "port": 9101})
    assert c["image"] == f"quay.io/prometheus/node-exporter@{DIGEST}"
    assert c["network_mode"] == "host" and c["pid"] == "host"
    assert "ports" not in c  # in the host's network it listens itself
    assert c["command"] == ["--path.rootfs=/host", f"--web.listen-address={bind}:9101"]
    (vol,) = c["volumes"]
    assert (vol["type"], vol["source"], vol["target"], vol["read_only"]) == ("bind", "/", "/host", True)
    assert "deploy" not in c  # no GPU reserved
    assert c["cap_drop"] == ["ALL"] and c["restart"] == "no"
    assert c["labels"]["io.llmfleet.engine"] == "node-exporter"
    # no watchdog: systemd restarts an exporter, it has no work to judge
    assert sorted(r.files) == ["compose.yml", "llmfleet-node.service", "service.env"]


def test_node_exporter_on_an_ipv6_address_is_bracketed():
    _, c = rendered({**NODE, "bind_address": "fd00::5"})
    assert "--web.listen-address=[fd00::5]:9100" in c["command"]


@pytest.mark.parametrize(
    ("gpus", "devices"),
    [
        ([0, 1], {"driver": "nvidia", "device_ids": ["0", "1"], "capabilities": ["gpu"]}),
        ([3], {"driver": "nvidia", "device_ids": ["3"], "capabilities": ["gpu"]}),
        ("all", {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}),
    ],
)
def test_dcgm_exporter_compose_gets_the_services_gpus_and_publishes_its_port(gpus, devices):
    r, c = rendered({**DCGM, "bind_address": "10.0.0.5", "port": 9401, "gpus": gpus})
    assert c["image"] == f"nvcr.io/nvidia/k8s/dcgm-exporter@{DIGEST}"
    assert c["deploy"]["resources"]["reservations"]["devices"] == [devices]
    assert c["ports"] == [{"target": 9400, "published": "9401", "host_ip": "10.0.0.5", "protocol": "tcp"}]
    assert c["command"] == ["-a", ":9400"]
    assert c["cap_drop"] == ["ALL"] and "cap_add" not in c  # no profiling unless the inventory adds SYS_ADMIN
    assert "network_mode" not in c and "volumes" not in c
    assert sorted(r.files) == ["compose.yml", "llmfleet-dcgm.service", "service.env"]


def test_dcgm_exporters_profiling_is_a_compose_override():
    r, _ = rendered({**DCGM, "compose_overrides": {"cap_add": ["SYS_ADMIN"]}})
    override = yaml.safe_load(r.files["compose.override.yml"])
    assert override["services"]["engine"]["cap_add"] == ["SYS_ADMIN"]


def test_an_exporters_flags_follow_its_roles_own():
    _, c = rendered({**DCGM, "engine_args": ["-f", "/etc/dcgm-exporter/dcp-metrics-included.csv"]})
    assert c["command"] == ["-a", ":9400", "-f", "/etc/dcgm-exporter/dcp-metrics-included.csv"]


# ------------------------------------------------------------------------------------------------
# The health check: /metrics with the exporter's own series


class FakeExporter:
    """A local /metrics endpoint answering ``body`` (set it to change what the next scrape reads)."""

    def __init__(self, body: str, status: int = 200):
        self.body, self.status, self.paths = body, status, []
        me = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                me.paths.append(self.path)
                data = me.body.encode() if self.path == "/metrics" else b"not found"
                self.send_response(me.status if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter_factory():
    made: list[FakeExporter] = []

    def make(body: str, status: int = 200) -> FakeExporter:
        made.append(FakeExporter(body, status))
        return made[-1]

    yield make
    for e in made:
        e.close()


NODE_METRICS = ("# HELP node_boot_time_seconds Node boot time, in unixtime.\n# TYPE node_boot_time_seconds gauge\n"
                "node_boot_time_seconds 1.7e+09\ngo_goroutines 7\n")
DCGM_METRICS = ("# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
                'DCGM_FI_DEV_GPU_TEMP{gpu="0",modelName="Tesla V100-SXM2-32GB"} 41\n'
                'DCGM_FI_DEV_GPU_TEMP{gpu="1",modelName="Tesla V100-SXM2-32GB"} 39\n')
# dcgm-exporter's families announced, no sample (no card seen): not healthy
DCGM_EMPTY = "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"


def metrics_checker(url: str, series: str, *, probe=None, stage_timeout_s: float = 30.0,
                    on_sleep=None) -> H.HealthChecker:
    """A checker on an injected clock: its waits advance the clock, never the test."""
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s
        if on_sleep is not None:
            on_sleep(now[0])

    return H.HealthChecker(probe=probe or (lambda: UnitProbe("active", "running", 0)), base_url=url,
                           served_name="", metrics_series=series, stage_timeout_s=stage_timeout_s,
                           load_timeout_s=900, probe_every_s=5.0, clock=lambda: now[0], sleep=sleep)


@pytest.mark.parametrize(
    ("body", "series", "samples"),
    [(NODE_METRICS, "node_boot_time_seconds", 1), (DCGM_METRICS, "DCGM_FI_DEV_", 2)],
)
def test_an_exporter_with_its_series_passes_unit_container_and_metrics_only(exporter_factory, body, series, samples):
    e = exporter_factory(body)
    rep = metrics_checker(e.url, series).run()
    assert rep.ok, rep.message
    assert [s.name for s in rep.stages] == ["unit", "container", "metrics"]
    assert f"/metrics 200 with {samples} {series}*" in rep.stages[-1].message
    assert set(e.paths) == {"/metrics"}  # no /health, /v1/models or completion asked of an exporter
    assert rep.decode_tokps is None and rep.tokens is None


@pytest.mark.parametrize(
    ("body", "status", "series", "last"),
    [
        ("go_goroutines 7\n", 200, "node_boot_time_seconds", "/metrics 200 without node_boot_time_seconds* series"),
        (DCGM_EMPTY, 200, "DCGM_FI_DEV_", "/metrics 200 without DCGM_FI_DEV_* series"),
        (NODE_METRICS, 500, "node_boot_time_seconds", "/metrics 500"),
    ],
)
def test_metrics_without_the_series_keep_waiting_then_fail_naming_it(exporter_factory, body, status, series, last):
    e = exporter_factory(body, status)
    rep = metrics_checker(e.url, series, stage_timeout_s=20).run()
    assert not rep.ok and rep.failed.name == "metrics"
    assert f"/metrics with {series}* series not reached within 20s" in rep.message
    assert last in rep.message
    assert len(e.paths) > 2  # it asked again until the stage's time was up


def test_the_series_appearing_later_passes(exporter_factory):
    e = exporter_factory("go_goroutines 7\n")

    def later(now: float) -> None:
        if now >= 3.0:
            e.body = DCGM_METRICS

    rep = metrics_checker(e.url, "DCGM_FI_DEV_", on_sleep=later).run()
    assert rep.ok, rep.message
    assert e.paths.count("/metrics") >= 2


def test_an_exporter_that_exits_while_waited_for_fails_before_the_timeout():
    probes = iter([UnitProbe("active", "running", 0)] * 2 + [UnitProbe("activating", "exited", 1)] * 50)
    rep = metrics_checker("http://127.0.0.1:9", "node_boot_time_seconds", probe=lambda: next(probes),
                          stage_timeout_s=600).run()
    assert not rep.ok and rep.failed.name == "metrics"
    assert "exporter stopped" in rep.message and "exit 1" in rep.message


@pytest.mark.parametrize(
    ("text", "prefix", "count"),
    [
        (NODE_METRICS, "node_boot_time_seconds", 1),
        (DCGM_METRICS, "DCGM_FI_DEV_", 2),
        (DCGM_EMPTY, "DCGM_FI_DEV_", 0),
        ("", "DCGM_FI_DEV_", 0),
        (NODE_METRICS, "", 0),
    ],
)
def test_metrics_series_count(text, prefix, count):
    assert H.metrics_series_count(text, prefix) == count

