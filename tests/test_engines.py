"""Engine knowledge, one module per engine: the interface, the KV layout a build keeps for
sliding-window layers, the Marlin floor as one source, the flags for a plan, and the flag rules the
planner runs its alternatives through."""

from __future__ import annotations

import pytest

from llmfleet.errors import UsageError
from llmfleet.knowledge import compat, engines
from llmfleet.knowledge.engines import llamacpp, vllm
from llmfleet.knowledge.engines.base import PlanFlags

CAT = compat.load_engine_catalog()


def rel(key: str) -> compat.EngineRelease:
    r = CAT.release(key)
    assert r is not None
    return r


def test_every_catalog_engine_has_a_knowledge_module_and_the_interface_says_what_a_new_one_needs():
    assert set(engines.names()) == set(CAT.engines)
    for name in engines.names():
        k = engines.for_engine(name)
        assert k.name == name and k.label and k.health_path.startswith("/")
        # the fields fleet.metrics.EngineMetrics reads, every one named by every engine
        from dataclasses import fields

        from llmfleet.fleet.metrics import EngineMetrics
        assert set(k.metrics) == {f.name for f in fields(EngineMetrics)}
    doc = engines.base.__doc__ or ""
    for must in ("catalog/engines.yaml", "roles/<name>", "EngineKnowledge", "kv_layout", "engine_args", "lab image"):
        assert must in doc, must
    with pytest.raises(UsageError, match="unknown engine 'sglang'"):
        engines.for_engine("sglang")


@pytest.mark.parametrize(
    ("key", "cc", "layout"),
    [
        # llama.cpp keeps the full context on sliding-window layers before its SWA cache (PR #13194,
        # merged 2025-05-20, after b5000): Gemma-2/3 need the full KV there
        ("llamacpp:b5000-cu122", "6.1", "full"),
        ("llamacpp:server-cuda-12.8", "8.6", "window"),
        # vLLM V1 has the hybrid allocator (PR #17996); V0 (below v1_min_cc until 0.10.1) does not (RFC #11382)
        ("vllm:0.10.1.1", "8.0", "window"),
        ("vllm:0.10.1.1", "7.5", "full"),
        ("vllm:0.9.2", "7.5", "full"),
        ("vllm:0.19.1", "7.0", "window"),
    ],
)
def test_kv_layout_per_build_and_card(key, cc, layout):
    r = rel(key)
    got = engines.for_engine(r.engine).kv_layout(r, cc)
    assert got is not None and got.sliding_window == layout, got
    assert got.source and got.confidence in "HMU"


def test_every_gpu_release_says_its_kv_layout_with_a_source():
    for key, r in CAT.images.items():
        if not r.cpu and r.engine in ("vllm", "llamacpp"):  # exporters have no KV cache
            assert r.kv_layout is not None and r.kv_layout.source, key


@pytest.mark.parametrize(
    ("key", "cc", "method"),
    [
        # the Marlin floor is the release's own: 8.0 in 0.10.1.1, 7.5 from the newer fp8.md (s2.4)
        ("vllm:0.10.1.1", "7.5", "gptq"),
        ("vllm:0.10.1.1", "8.0", "gptq_marlin"),
        ("vllm:0.19.1", "7.5", "gptq_marlin"),
        ("vllm:0.19.1", "7.0", "gptq"),
    ],
)
def test_the_marlin_floor_comes_from_the_release(key, cc, method):
    r = rel(key)
    assert compat.quant_method_for(r, CAT.engines["vllm"], "gptq-int4", [], cc) == method
    assert vllm.marlin_min_cc(r) == r.quantizations["gptq_marlin"]


def test_vllm_flags_for_a_plan():
    args = engines.for_engine("vllm").engine_args(PlanFlags(
        quantization="gptq", float16=True, gpu_memory_utilization=0.9, context=8192, concurrency=4, kv_flag="auto",
        gpus=2, attention_backend="FLASH_ATTN"))
    assert args == ["--quantization", "gptq", "--dtype", "float16", "--gpu-memory-utilization", "0.90",
                    "--max-model-len", "8192", "--max-num-seqs", "4", "--kv-cache-dtype", "auto",
                    "--tensor-parallel-size", "2", "--attention-backend", "FLASH_ATTN"]


def test_llamacpp_flags_add_flash_attention_for_a_quantized_v_cache_where_it_is_off_by_default():
    k = engines.for_engine("llamacpp")
    common = {"num_layers": 28, "resident": True, "gpu_layers": 0, "context": 4096, "concurrency": 2,
              "kv_flag": "q8_0", "rules": CAT.engines["llamacpp"]}
    old = k.engine_args(PlanFlags(release=rel("llamacpp:b5000-cu122"), **common))
    new = k.engine_args(PlanFlags(release=rel("llamacpp:server-cuda-12.8"), **common))
    assert old[-1] == "-fa" and "-fa" not in new  # bare switch on b5000; auto is the default on newer builds
    assert old[:6] == ["-ngl", "29", "-c", "8192", "-np", "2"]
    for r, args in ((rel("llamacpp:b5000-cu122"), old), (rel("llamacpp:server-cuda-12.8"), new)):
        v = compat.check_kv_dtype(r, CAT.engines["llamacpp"], "q8_0", args, {}, "6.1")
        assert v.status == "pass", v
        assert compat.check_attention(r, args, {}, "6.1").status == "pass"


@pytest.mark.parametrize(
    ("key", "backend", "kv", "cc", "status"),
    [
        ("vllm:0.19.1", "TRITON_ATTN", "fp8", "7.0", "fail"),   # vllm#26431, #7714
        ("vllm:0.19.1", "TRITON_ATTN", "fp8", "7.5", "fail"),
        ("vllm:0.19.1", "TRITON_ATTN", "fp8", "8.6", "fail"),
        ("vllm:0.19.1", "TRITON_ATTN", "fp8", "8.9", "pass"),
        ("vllm:0.19.1", "FLASH_ATTN", "fp8", "9.0", "pass"),    # FA3, vllm PR #15191
        ("vllm:0.19.1", "FLASH_ATTN", "fp8", "8.0", "fail"),    # FA2
        ("vllm:0.19.1", "FLASH_ATTN", "fp8_e5m2", "9.0", "fail"),
        ("vllm:0.10.1.1", "FLASHINFER", "fp8", "8.0", "warn"),  # unconfirmed (V0, not read): never a silent pass
        ("vllm:0.19.1", "FLASHINFER", "fp8", "8.0", "pass"),    # read: no capability test for fp8 (fixture 0.19.1)
        ("vllm:0.19.1", "TRITON_ATTN", "auto", "7.0", "pass"),
    ],
)
def test_kv_dtype_verdict_is_a_pure_rule(key, backend, kv, cc, status):
    assert vllm.kv_dtype_verdict(rel(key), backend, kv, cc).status == status


@pytest.mark.parametrize(
    ("key", "kv_v", "fa", "status"),
    [
        ("llamacpp:b5000-cu122", "q8_0", None, "fail"),   # off by default: absent -fa counts as off
        ("llamacpp:b5000-cu122", "q8_0", "bare", "pass"),
        ("llamacpp:server-cuda-12.8", "q8_0", None, "pass"),  # -fa auto by default
        ("llamacpp:server-cuda-12.8", "q4_0", "off", "fail"),
        ("llamacpp:server-cuda-12.8", "f16", "off", "pass"),
    ],
)
def test_v_cache_verdict_is_a_pure_rule(key, kv_v, fa, status):
    assert llamacpp.v_cache_verdict(rel(key), CAT.engines["llamacpp"], kv_v, fa).status == status


def test_flag_checks_gives_the_preflight_rules_for_one_set_of_flags():
    """What the planner runs every ranked alternative through: the same rules as the preflight."""
    r = rel("vllm:0.19.1")
    got = compat.flag_checks(r, CAT.engines["vllm"], quant="gptq-int4", kv_dtype="fp8",
                             args=["--dtype", "float16"], env={}, cc="7.5")
    assert set(got) == {"quant", "dtype", "attention", "kv-dtype"}
    assert got["kv-dtype"].status == "fail" and got["quant"].status == "pass"


# ------------------------------------------------------------------------------------ several hosts


def test_every_engine_says_how_it_runs_over_several_hosts_as_its_role_does():
    from llmfleet.release.render import load_role

    for name in engines.names():
        k = engines.for_engine(name)
        role_kind = load_role(name).cluster.get("kind")
        assert k.cluster_kind == role_kind, name  # the role's cluster.kind and the knowledge agree
        assert engines.for_cluster_kind(str(k.cluster_kind)) is k
        # one side connects: the workers to the head's runtime, or the head to each worker's port
        assert k.worker_serves_port is not k.workers_join_head, name
        assert k.worker_runtime
    with pytest.raises(UsageError, match="unknown cluster kind 'mpi'"):
        engines.for_cluster_kind("mpi")


@pytest.mark.parametrize(("name", "kind", "loads_model", "joins_head", "serves_port", "checks_image"), [
    ("llamacpp", "rpc", False, False, True, True),  # the head sends rpc-server its tensors
    ("vllm", "ray", True, True, False, False),  # every Ray stage loads its layers from its own path
])
def test_cluster_facts_per_engine(name, kind, loads_model, joins_head, serves_port, checks_image):
    k = engines.for_engine(name)
    assert (k.cluster_kind, k.workers_load_model, k.workers_join_head, k.worker_serves_port,
            k.checks_worker_image) == (kind, loads_model, joins_head, serves_port, checks_image)


def test_the_heads_flags_for_its_workers():
    ends = ["10.0.0.2:50052", "[fd00::3]:50052"]
    assert llamacpp.KNOWLEDGE.cluster_head_args(endpoints=ends, size=3, given=lambda f: True) == [
        "--rpc", "10.0.0.2:50052,[fd00::3]:50052"]  # always: the endpoints are the deploy's
    v = vllm.KNOWLEDGE
    assert v.cluster_head_args(endpoints=[], size=3, given=lambda f: False) == [
        "--pipeline-parallel-size", "3", "--distributed-executor-backend", "ray"]
    # the service's own flags win
    assert v.cluster_head_args(endpoints=[], size=3, given=lambda f: f == "--pipeline-parallel-size") == [
        "--distributed-executor-backend", "ray"]


def test_the_environment_a_member_needs():
    assert llamacpp.KNOWLEDGE.cluster_env("10.0.0.2", "eth1") == {}
    assert vllm.KNOWLEDGE.cluster_env("10.0.0.2", None) == {"VLLM_HOST_IP": "10.0.0.2",
                                                            "RAY_NODE_IP_ADDRESS": "10.0.0.2"}
    assert vllm.KNOWLEDGE.cluster_env("10.0.0.2", "eth1")["NCCL_SOCKET_IFNAME"] == "eth1"
    assert vllm.KNOWLEDGE.cluster_env("10.0.0.2", "eth1")["GLOO_SOCKET_IFNAME"] == "eth1"


@pytest.mark.parametrize(("name", "hosts", "says"), [
    ("vllm", 1, None), ("llamacpp", 1, None),
    ("vllm", 2, "ray start --head"), ("llamacpp", 3, "the 2 worker(s)"), ("llamacpp", 2, "`rpc-server` on each worker"),
])
def test_what_the_deploy_adds_for_a_split_over_hosts(name, hosts, says):
    adds = engines.for_engine(name).deploy_adds(hosts, 2)
    assert (adds == []) if says is None else any(says in a for a in adds)


# ------------------------------------------------------------------------------------ names and families


def test_engine_names_and_the_engine_of_a_quant_family():
    assert engines.names() == ["vllm", "llamacpp"]  # the order messages list them in
    assert engines.for_quant_family("gguf").name == "llamacpp"
    assert engines.for_quant_family("hf").name == "vllm"
    with pytest.raises(UsageError, match="no engine serves 'onnx'"):
        engines.for_quant_family("onnx")


@pytest.mark.parametrize(("name", "modes", "word", "cross"), [
    ("vllm", ("tensor",), "tensor parallel", "pipeline parallel"),
    ("llamacpp", ("layer", "row"), "layer split", "llama.cpp RPC"),
])
def test_how_an_engine_splits_a_model(name, modes, word, cross):
    k = engines.for_engine(name)
    assert (k.split_modes, k.split_word, k.cross_host_word) == (modes, word, cross)


def test_the_engine_catalog_takes_only_known_engines():
    data = rel("vllm:0.19.1").model_dump()
    assert compat.EngineRelease.model_validate(data).engine == "vllm"
    with pytest.raises(ValueError, match="engine 'sglang' is not one llmfleet knows"):
        compat.EngineRelease.model_validate(data | {"engine": "sglang"})
