"""Prometheus file_sd targets from the inventory and the hosts' release state (fleet.prom_targets, pure),
and the folder they are written to (fleet.prom_write)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from llmfleet.errors import UsageError
from llmfleet.fleet import prom_targets as pt
from llmfleet.fleet import prom_write
from llmfleet.fleet.status import HostStatus, parse_driver
from llmfleet.inventory.ansible import Host
from llmfleet.inventory.services import HostSettings
from llmfleet.knowledge.release_state import Manifest, ReleaseInfo, ServiceState

REL = "20261201T100000Z-abcdef1234"


def svc(name="chat", engine="llamacpp", **kw):
    base = {"name": name, "engine": engine, "model": "qwen2.5-7b-instruct", "model_path": "/models/q.gguf",
            "image": "llamacpp:b1", "quant": "Q4_K_M", "port": 8080, "gpus": [0]}
    return base | kw


def host(name="gpu-v100-01", services=(), groups=("prod", "v100"), **hostvars):
    v = {"ansible_host": "10.0.0.5", "llmfleet_services": list(services), **hostvars}
    return Host(name=name, vars=v, groups=["all", *groups])


def settings(h: Host) -> HostSettings:
    from llmfleet.inventory.ansible import settings_for

    return settings_for(h)


def state(name="chat", release=REL, health=None, unit="active"):
    st = ServiceState(name=name, current=release, unit=unit)
    if release:
        st.releases[release] = ReleaseInfo(release, Manifest(release=release, service=name, engine="llamacpp"), health)
    return st


def read(h: Host, states, gpus=("Tesla V100-SXM2-32GB",), driver="570.124.06"):
    return HostStatus(host=h.name, reachable=True, gpus=list(gpus), driver=driver, states={s.name: s for s in states})


def targets_of(h, states, **kw):
    return pt.host_targets(h, settings(h), read(h, states, **kw))


def test_a_deployed_service_is_one_target_with_the_fleet_labels():
    h = host(services=[svc(served_name="qwen-chat")], llmfleet_bind_address="0.0.0.0")
    ht = targets_of(h, [state(health={"result": "healthy", "floor_tokps": 41.25})])
    (t,) = ht.targets
    assert t.address == "10.0.0.5:8080"
    assert t.job == "engines"
    assert t.labels == {
        "host": "gpu-v100-01", "group": "v100", "groups": ",prod,v100,", "service": "chat", "engine": "llamacpp",
        "model": "qwen2.5-7b-instruct", "quant": "Q4_K_M", "card": "Tesla V100-SXM2-32GB", "driver": "570.124.06",
        "release": REL, "served_model_name": "qwen-chat", "floor_tokps": "41.2", "driver_drives_card": "true",
    }
    assert ht.unreachable == [] and ht.skipped == []


@pytest.mark.parametrize(("bind", "address"), [
    (None, "10.0.0.5:8080"),  # the default (0.0.0.0): the host's address
    ("0.0.0.0", "10.0.0.5:8080"),
    ("192.168.7.9", "192.168.7.9:8080"),  # a private address: that address
    ("::", "10.0.0.5:8080"),
    ("fd00::7", "[fd00::7]:8080"),
])
def test_the_address_prometheus_scrapes(bind, address):
    kw = {"llmfleet_bind_address": bind} if bind else {}
    (t,) = targets_of(host(services=[svc()], **kw), [state()]).targets
    assert t.address == address


@pytest.mark.parametrize("bind", ["127.0.0.1", "::1"])
def test_a_loopback_engine_is_listed_unreachable_with_the_fix(bind):
    ht = targets_of(host(services=[svc()], llmfleet_bind_address=bind), [state()])
    assert ht.targets == []
    (u,) = ht.unreachable
    assert u.service == "chat" and "loopback" in u.reason and bind in u.reason
    assert "llmfleet_bind_address" in u.fix and "api_key" in u.fix and "firewall" in u.fix


@pytest.mark.parametrize(("engine", "job", "source"), [
    ("llamacpp", "auth-env-chat_key", "env CHAT_KEY"),  # llama-server's /metrics needs the key
    ("vllm", "engines", ""),  # vLLM's /metrics does not
])
def test_a_key_holding_service_goes_to_the_job_of_its_key_source(engine, job, source, monkeypatch):
    monkeypatch.setenv("CHAT_KEY", "s3cret-value")
    h = host(services=[svc(engine=engine, image="x:y", api_key={"from_env": "CHAT_KEY"})])
    (t,) = targets_of(h, [state()]).targets
    assert (t.job, t.key_source) == (job, source)
    files = pt.files_for_host(targets_of(h, [state()]))
    jobs = pt.scrape_jobs("/srv/sd", [k.split("/")[0] for k in files])
    everything = json.dumps(files) + jobs + json.dumps(t.to_dict())
    assert "s3cret-value" not in everything
    if engine == "llamacpp":
        assert "credentials_file: /etc/prometheus/llmfleet-keys/env-chat_key" in jobs
        assert "files: ['/srv/sd/auth-env-chat_key/*.json']" in jobs


def test_a_file_key_source_names_the_file_not_its_content():
    h = host(services=[svc(api_key={"from_file": "/home/ops/keys/chat.key"})])
    (t,) = targets_of(h, [state()]).targets
    assert t.job == "auth-file-chat.key" and t.key_source == "file /home/ops/keys/chat.key"


@pytest.mark.parametrize(("st", "reason"), [
    (None, "not deployed"),
    (ServiceState(name="chat", current=None), "not deployed"),
])
def test_a_service_without_a_current_release_is_skipped(st, reason):
    ht = targets_of(host(services=[svc()]), [st] if st else [])
    assert ht.targets == [] and reason in ht.skipped[0]["reason"]


def test_a_stopped_service_stays_a_target_so_prometheus_reports_it_down():
    (t,) = targets_of(host(services=[svc()]), [state(unit="inactive")]).targets
    assert t.labels["release"] == REL


def test_services_only_on_the_host_are_not_targets():
    ht = targets_of(host(services=[svc()]), [state(), state(name="old")])
    assert [t.service for t in ht.targets] == ["chat"]


def test_a_host_not_read_gets_its_inventory_services_with_release_unknown():
    h = host(services=[svc()], llmfleet_gpu="Tesla V100-SXM2-32GB")
    ht = pt.host_targets(h, settings(h), None)
    (t,) = ht.targets
    assert not ht.read and t.labels["release"] == "unknown" and t.labels["card"] == "Tesla V100-SXM2-32GB"
    assert "driver" not in t.labels


@pytest.mark.parametrize(("driver", "card", "drives"), [
    ("580.95.05", "Tesla V100-SXM2-32GB", "true"),  # R580: the last branch for Volta
    ("590.44.01", "Tesla V100-SXM2-32GB", "false"),  # after it: nvidia-smi lists no V100
    ("590.44.01", "NVIDIA L4", "true"),
    (None, "Tesla V100-SXM2-32GB", None),
])
def test_driver_drives_card_label(driver, card, drives):
    # a dropped card is not listed by nvidia-smi: the inventory's llmfleet_gpu names it
    h = host(services=[svc()], llmfleet_gpu=card)
    ht = pt.host_targets(h, settings(h), read(h, [state()], gpus=(), driver=driver))
    assert ht.targets[0].labels.get("driver_drives_card") == drives


@pytest.mark.parametrize(("gpus", "service_gpus", "card"), [
    (["Tesla T4", "NVIDIA L4"], [1], "NVIDIA L4"),
    (["Tesla T4", "Tesla T4"], "all", "2x Tesla T4"),
    (["Tesla T4", "Tesla T4"], [0, 1], "2x Tesla T4"),
])
def test_the_card_label_is_the_service_cards(gpus, service_gpus, card):
    ht = targets_of(host(services=[svc(gpus=service_gpus)]), [state()], gpus=gpus)
    assert ht.targets[0].labels["card"] == card


@pytest.mark.parametrize(("raw", "clean"), [
    ("plain", "plain"),
    ("two\nlines\x00", "two lines"),
    ("x" * 500, "x" * pt.LABEL_MAX),
    (None, ""),
])
def test_label_values_are_sanitised(raw, clean):
    assert pt.sanitise(raw) == clean


def test_file_sd_document_is_what_prometheus_reads():
    h = host(services=[svc(), svc(name="embed", port=8081)])
    doc = json.loads(pt.file_sd(targets_of(h, [state(), state(name="embed")]).targets))
    assert [g["targets"] for g in doc] == [["10.0.0.5:8080"], ["10.0.0.5:8081"]]
    assert all(set(g) == {"targets", "labels"} for g in doc)
    assert all(isinstance(v, str) for g in doc for v in g["labels"].values())


def test_exporters_are_targets_of_their_own_job_with_the_hosts_labels_and_no_model():
    h = host(services=[svc(), {"name": "node-exporter", "engine": "node-exporter", "image": "node-exporter:1.9.1"},
                       {"name": "dcgm", "engine": "dcgm-exporter", "image": "dcgm-exporter:4.2.3-4.1.3", "gpus": [0]}],
             llmfleet_bind_address="10.0.0.5")
    ht = targets_of(h, [state(), state(name="node-exporter"), state(name="dcgm")])
    by = {t.service: t for t in ht.targets}
    assert (by["chat"].job, by["node-exporter"].job, by["dcgm"].job) == ("engines", "exporters", "exporters")
    assert by["node-exporter"].address == "10.0.0.5:9100" and by["dcgm"].address == "10.0.0.5:9400"
    for name in ("node-exporter", "dcgm"):
        labels = by[name].labels
        assert labels["host"] == "gpu-v100-01" and labels["card"] == "Tesla V100-SXM2-32GB"
        assert labels["driver"] == "570.124.06" and labels["release"] == REL and labels["group"] == "v100"
        assert not {"model", "quant", "served_model_name", "floor_tokps"} & set(labels), labels
    files = pt.files_for_host(ht)
    assert [g["labels"]["service"] for g in json.loads(files["exporters/gpu-v100-01.json"])] == ["dcgm", "node-exporter"]
    jobs = pt.scrape_jobs("/etc/prometheus/llmfleet", ["engines", "exporters"])
    assert "job_name: llmfleet-exporters" in jobs and jobs.count("credentials_file") == 0


def test_a_gateway_is_scraped_at_its_metrics_port_in_its_own_job():
    gw = {"name": "gw", "engine": "gateway", "image": "gateway:2.6.12", "port": 8443,
          "gateway": {"upstreams": ["gpu-v100-01"], "admin_port": 9901}}
    h = host(services=[gw], llmfleet_bind_address="10.0.0.5")
    (t,) = targets_of(h, [state(name="gw")]).targets
    assert (t.job, t.address) == ("gateways", "10.0.0.5:9902")
    assert t.labels["engine"] == "gateway" and "served_model_name" not in t.labels
    assert "job_name: llmfleet-gateways" in pt.scrape_jobs("/etc/prometheus/llmfleet", ["gateways"])


def test_a_host_always_has_its_plain_file_so_gone_services_disappear():
    files = pt.files_for_host(pt.HostTargets(host="gpu/01"))
    assert files == {"engines/gpu_01.json": "[]\n", "exporters/gpu_01.json": "[]\n", "gateways/gpu_01.json": "[]\n",
                     "rules/gpu_01.yml": "groups: []\n"}


def test_floor_rules_carry_each_release_floor_as_a_number():
    h = host(services=[svc(), svc(name="embed", port=8081)])
    ht = targets_of(h, [state(health={"result": "healthy", "floor_tokps": 33.3}), state(name="embed")])
    text = pt.host_rules(ht)
    assert text.count("record: llmfleet:decode_floor_tokps") == 1  # embed's release has no floor
    assert "expr: vector(33.3)" in text
    assert f'labels: {{"host": "gpu-v100-01", "release": "{REL}", "service": "chat"}}' in text


@pytest.mark.parametrize(("health", "listed"), [
    (None, True),  # switched to, never confirmed
    ({"result": "healthy"}, False),
    ({"result": "unhealthy"}, False),  # its check failed: a deploy went back or stopped it, and said so
])
def test_an_unconfirmed_release_gets_the_end_of_its_revert_timer(health, listed):
    h = host(services=[svc()], llmfleet_confirm_timeout_s=600)
    ht = targets_of(h, [state(health=health)])
    if not listed:
        assert ht.unconfirmed == [] and "release_unconfirmed" not in pt.host_rules(ht)
        return
    from datetime import UTC, datetime

    start = int(datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC).timestamp())
    assert ht.unconfirmed == [{"service": "chat", "release": REL, "deadline": start + 600}]
    assert f"expr: vector({start + 600})" in pt.host_rules(ht)


def test_parse_driver_from_nvidia_smi_q():
    assert parse_driver("x\nDriver Version                            : 535.183.01\nCUDA Version : 12.2\n") == "535.183.01"
    assert parse_driver("no nvidia-smi here") is None


# ------------------------------------------------------------------------------------------- writer


def test_write_atomic_replaces_whole_files_readable_by_prometheus(tmp_path):
    p = tmp_path / "engines" / "h.json"
    assert prom_write.write_atomic(p, "[]\n") is True
    assert prom_write.write_atomic(p, "[]\n") is False  # unchanged: not written again
    assert p.read_text() == "[]\n"
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o644
    assert [x.name for x in p.parent.iterdir()] == ["h.json"]  # no temporary file left behind


def test_write_host_moves_a_target_whose_job_changed(tmp_path):
    res = prom_write.WriteResult()
    h = host(services=[svc(api_key={"from_env": "K"})])
    prom_write.write_host(tmp_path, targets_of(h, [state()]), res)
    assert sorted(res.written) == ["auth-env-k/gpu-v100-01.json", "engines/gpu-v100-01.json",
                                   "exporters/gpu-v100-01.json", "gateways/gpu-v100-01.json", "rules/gpu-v100-01.yml"]
    res = prom_write.WriteResult()
    prom_write.write_host(tmp_path, targets_of(host(services=[svc()]), [state()]), res)
    assert res.removed == ["auth-env-k/gpu-v100-01.json"]
    assert json.loads((tmp_path / "engines/gpu-v100-01.json").read_text())[0]["labels"]["service"] == "chat"


def test_out_must_be_a_folder(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError, match="not a folder"):
        prom_write.check_out_dir(f)
    with pytest.raises(UsageError, match="does not exist"):
        prom_write.check_out_dir(tmp_path / "no" / "such")


class _Remote:
    def __init__(self, out):
        self.out = out

    def run(self, script, sudo=False):
        from llmfleet.host.ssh import Result

        return Result(command="status", rc=0, stdout=self.out, stderr="")

    def close(self):
        pass


def test_write_targets_reads_each_host_once_and_keeps_files_of_a_host_not_read(tmp_path):
    from llmfleet.errors import LlmfleetError

    up, down = host("up", services=[svc()]), host("down", services=[svc()])
    state_out = "\n".join(["@@service chat", f"@@current releases/{REL}", "@@unit active", f"@@release {REL}",
                           "@@health " + json.dumps({"result": "healthy", "floor_tokps": 20}), "@@end",
                           "Driver Version   : 575.57.08", "@@gpu", "Tesla T4"]) + "\n"
    calls = []

    def connect(h, config=None):
        calls.append(h.name)
        if h.name == "down":
            raise LlmfleetError("ssh: connection refused")
        return _Remote(state_out)

    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "down.json").write_text("[old]")
    res = prom_write.write_targets([up, down], tmp_path, connect=connect)
    assert sorted(calls) == ["down", "up"]
    assert res.kept == [{"host": "down", "error": "ssh: connection refused"}]
    assert (tmp_path / "engines" / "down.json").read_text() == "[old]"
    assert (tmp_path / "scrape-jobs.yml").read_text().count("job_name: llmfleet-engines") == 1
    (g,) = json.loads((tmp_path / "engines" / "up.json").read_text())
    assert g["labels"]["release"] == REL and g["labels"]["card"] == "Tesla T4"
    assert g["labels"]["driver"] == "575.57.08" and g["labels"]["floor_tokps"] == "20.0"


# ------------------------------------------------------------------------------------------- the rollout hook


@pytest.mark.parametrize(("results", "folder", "rewritten"), [
    ({"a": "deployed", "b": "unchanged"}, "sd", ["a"]),
    ({"a": "rolled_back", "b": "failed"}, "sd", ["a", "b"]),  # a failed run may have gone back
    ({"a": "check", "b": "refused"}, "sd", None),
    ({"a": "deployed"}, None, None),  # llmfleet.prometheus_targets not set: nothing read, nothing written
])
def test_a_rollout_rewrites_the_changed_hosts_targets(results, folder, rewritten, monkeypatch, tmp_path):
    from types import SimpleNamespace

    from llmfleet.cli import monitoring_tasks
    from llmfleet.settings import Settings

    seen = []
    monkeypatch.setattr(prom_write, "write_targets",
                        lambda hosts, out, config=None: seen.append([h.name for h in hosts]) or prom_write.WriteResult())
    hosts = [host(n) for n in results]
    outcomes = [SimpleNamespace(host=n, result=r) for n, r in results.items()]
    settings = Settings.of({"prometheus_targets": str(tmp_path / folder) if folder else None})
    monitoring_tasks.refresh_after(hosts, outcomes, settings)
    assert seen == ([rewritten] if rewritten else [])
