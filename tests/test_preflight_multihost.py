"""Preflight rules for a service split over several GPUs and hosts (pure: facts in, checks out)."""

from __future__ import annotations

import pytest

from llmfleet.inventory.services import Service
from llmfleet.knowledge.facts import Facts, GpuFact
from llmfleet.knowledge.preflight import MULTI_CHECK_IDS, check_service_hosts, parse_topology

V100 = "Tesla V100-SXM2-32GB"
P40 = "Tesla P40"

# nvidia-smi topo -m of a 4 x V100 SXM2 board (NVIDIA/nccl-tests#68)
TOPO_NV = """\tGPU0\tGPU1\tGPU2\tGPU3\tmlx5_0\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV2\tNV2\tNV2\tNODE\t0,2,4,6,8,10\t0
GPU1\tNV2\t X \tNV2\tNV2\tNODE\t0,2,4,6,8,10\t0
GPU2\tNV2\tNV2\t X \tNV2\tNODE\t0,2,4,6,8,10\t0
GPU3\tNV2\tNV2\tNV2\t X \tNODE\t0,2,4,6,8,10\t0
mlx5_0\tNODE\tNODE\tNODE\tNODE\t X \t\t

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""
TOPO_PCIE = """\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tPIX\tNODE\tSYS\t0-11\t0\t\tN/A
GPU1\tPIX\t X \tNODE\tSYS\t0-11\t0\t\tN/A
GPU2\tNODE\tNODE\t X \tSYS\t0-11\t0\t\tN/A
GPU3\tSYS\tSYS\tSYS\t X \t12-23\t1\t\tN/A
"""


def _facts(host, n=4, name=V100, mib=32768, cc="7.0", driver="550.54.15", cuda="12.4", catalog="v100-sxm2-32gb",
           topo=None):
    f = Facts(host=host, driver_version=driver, cuda_driver_version=cuda,
              gpus=[GpuFact(index=i, name=name, memory_total_mib=mib, compute_capability=cc, catalog_id=catalog)
                    for i in range(n)])
    if topo is not None:
        object.__setattr__(f, "__dict__", f.__dict__ | {"gpu_topology": topo})
    return f


def _svc(**kw):
    base = {"name": "big", "engine": "vllm", "model": "llama-3.1-70b-instruct", "model_path": "/srv/models/l70",
            "image": "vllm:x", "quant": "gptq-int4", "context": 8192, "gpus": [0, 1, 2, 3]}
    return Service(**(base | kw))


def _by_id(checks):
    assert [c.id for c in checks] == list(MULTI_CHECK_IDS)
    return {c.id: c for c in checks}


def test_two_identical_hosts_with_nvlink_pass():
    facts = {"gpu-a": _facts("gpu-a"), "gpu-b": _facts("gpu-b")}
    c = _by_id(check_service_hosts(_svc(), facts, head="gpu-a", topology_by_host={"gpu-a": TOPO_NV, "gpu-b": TOPO_NV},
                                   network_gbps=25))
    assert all(x.status == "pass" for x in c.values()), c
    assert "NVLink between every pair" in c["topology"].message and "gpu-a, gpu-b" in c["gpu-count"].message


@pytest.mark.parametrize(("worker", "svc", "check", "status", "needle"), [
    (dict(n=2), {}, "gpu-count", "fail", "gpu-b: no GPU 2, 3"),
    (dict(name=P40, mib=22919, cc="6.1", catalog="p40"), {}, "gpu-identical", "fail", "different cards"),
    (dict(mib=32510), {}, "gpu-identical", "warn", "different memory.total"),
    (dict(cc=None), {}, "gpu-identical", "warn", "compute capability unknown on gpu-b:0"),
    (dict(driver="535.161.08", cuda="12.2"), {}, "driver-match", "warn", "gpu-b 535.161.08"),
    (dict(driver=None), {}, "driver-match", "warn", "driver version unknown on gpu-b"),
    ({}, {"gpus": [0, 1, 2]}, "tp-heads", "pass", "over 3 GPU(s)"),  # 64 heads / 3: refused below with the plan
    ({}, {"model": "qwen2.5-32b-instruct", "gpus": [0, 1, 2]}, "tp-heads", "fail", "40 attention heads"),
    ({}, {"model": "not-a-model"}, "tp-heads", "warn", "not in the catalog"),
])
def test_one_bad_fact_on_the_worker_is_named(worker, svc, check, status, needle):
    if svc.get("gpus") == [0, 1, 2] and svc.get("model") is None:
        # llama 70B: 64 heads do not divide by 3 either
        status, needle = "fail", "64 attention heads"
    facts = {"gpu-a": _facts("gpu-a"), "gpu-b": _facts("gpu-b", **worker)}
    c = _by_id(check_service_hosts(_svc(**svc), facts, head="gpu-a", network_gbps=10))
    assert c[check].status == status and needle in c[check].message, c[check]


def test_gpus_all_takes_the_head_count_and_the_plan_wins():
    facts = {"h": _facts("h", n=4), "w": _facts("w", n=2)}
    c = _by_id(check_service_hosts(_svc(gpus="all"), facts, head="h"))
    assert c["gpu-count"].status == "fail" and "w: 2 GPU(s)" in c["gpu-count"].message

    class Plan:
        gpus = 2

    c = _by_id(check_service_hosts(_svc(gpus="all"), facts, head="h", plan=Plan()))
    assert c["gpu-count"].status == "pass"


@pytest.mark.parametrize(("topo", "gpus", "status", "needle"), [
    (None, [0, 1], "warn", "P2P/NVLink between the service's GPUs is not confirmed"),
    (TOPO_NV, [0, 1], "pass", "NVLink between every pair"),
    (TOPO_PCIE, [0, 1], "warn", "the card is an NVLink part but the links are PCIe"),
    (TOPO_PCIE, [0, 3], "warn", "GPU0-GPU3 SYS"),
    ("garbage", [0, 1], "warn", "not confirmed"),
])
def test_topology(topo, gpus, status, needle):
    facts = {"h": _facts("h", topo=topo)}
    c = _by_id(check_service_hosts(_svc(gpus=gpus), facts, head="h"))
    assert c["topology"].status == status and needle in c["topology"].message, c["topology"]


def test_pcie_topology_on_a_pcie_card_passes():
    facts = {"h": _facts("h", name="Tesla V100-PCIE-32GB", mib=32510, catalog="v100-pcie-32gb")}
    c = _by_id(check_service_hosts(_svc(gpus=[0, 1, 2]), facts, head="h", topology_by_host={"h": TOPO_PCIE}))
    assert c["topology"].status == "pass" and "(PCIe)" in c["topology"].message


def test_one_gpu_per_host_needs_no_topology_but_the_network():
    facts = {"h": _facts("h", n=1), "w": _facts("w", n=1)}
    svc = _svc(engine="llamacpp", quant="q4_k_m", gpus=[0])
    c = _by_id(check_service_hosts(svc, facts, head="h"))
    assert c["topology"].status == "pass" and c["network"].status == "warn"
    assert "llmfleet_network_gbps" in c["network"].fix


def test_parse_topology():
    links = parse_topology(TOPO_NV)
    assert links[(0, 1)] == "NV2" and links[(3, 2)] == "NV2" and (0, 0) not in links and len(links) == 12
    pcie = parse_topology(TOPO_PCIE)
    assert pcie[(0, 1)] == "PIX" and pcie[(0, 2)] == "NODE" and pcie[(2, 3)] == "SYS"
    assert parse_topology("") == parse_topology(None) == parse_topology("no matrix here") == {}


def test_the_plan_check_of_a_split_service_plans_it_over_its_hosts():
    from llmfleet.knowledge.preflight import _plan_check, plan_for

    svc = _svc(engine="llamacpp", quant="q4_k_m", gpus=[0, 1], image="llamacpp:server-cuda-12.8")
    facts = _facts("h", n=2, name=P40, mib=22919, cc="6.1", catalog="p40")
    alone, err = plan_for(svc, facts)
    split, err2 = plan_for(svc, facts, hosts=2)
    assert err is None and err2 is None
    assert _plan_check(svc, alone, None).status == "fail"
    check = _plan_check(svc, split, None)
    assert check.status == "pass" and "2 x Tesla P40 on each of 2 hosts" in check.message


def test_check_host_plans_a_split_service_over_the_hosts_it_is_given():
    from llmfleet.images import lock as images
    from llmfleet.inventory.services import HostSettings
    from llmfleet.release.preflight import check_host

    svc = _svc(engine="llamacpp", quant="q4_k_m", gpus=[0, 1], image="llamacpp:server-cuda-12.8")
    facts = _facts("h", n=2, name=P40, mib=22919, cc="6.1", catalog="p40")
    settings = HostSettings(services=[svc])

    def plan_status(**kw):
        report = check_host("h", settings, facts, lock=images.ImageLock(images={}), allow_unpinned=True,
                            today="2026-01-15", **kw)[0]
        return next(c for c in report.checks if c.id == "plan").status

    assert plan_status() == "fail" and plan_status(hosts_by_service={"big": 2}) == "pass"
