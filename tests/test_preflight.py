"""Preflight checks, table-driven: recorded host facts + a service + the lock -> PASS / WARN / FAIL."""

from __future__ import annotations

import pytest

from llmfleet.images import lock as images
from llmfleet.inventory.services import HostSettings, Service
from llmfleet.knowledge.facts import Container, Disk, ModelFile
from llmfleet.knowledge.preflight import (
    CHECK_IDS,
    parse_archs,
    release_for,
    run_checks,
)
from llmfleet.release.preflight import check_host
from tests.test_facts import _card, body_rc, host_doc, parse, section

DIGEST = "sha256:" + "ab" * 32
LOCK = images.ImageLock(images={
    k: images.LockedImage(key=k, repository=r, digest=DIGEST, tag=t, cuda=c)
    for k, r, t, c in [
        ("vllm:0.19.1", "docker.io/vllm/vllm-openai", "v0.19.1", "12.9.1"),
        ("vllm:0.10.1.1", "docker.io/vllm/vllm-openai", "v0.10.1.1", "12.8.1"),
        ("vllm:0.20.0", "docker.io/vllm/vllm-openai", "v0.20.0", "13.0.2"),
        ("llamacpp:server-cuda-12.8", "ghcr.io/ggml-org/llama.cpp", "server-cuda", "12.8.1"),
        ("llamacpp:b5000-cu122", "registry.example/llmfleet/llama.cpp", "server-b5000-cu122", "12.2.2"),
        ("llamacpp:vendored-0.3.36-cu118", "registry.example/llmfleet/llama.cpp", "server-vendored-0.3.36-cu118",
         "11.8.89"),
    ]
})

GGUF = "/srv/models/qwen2.5-7b-instruct-q4_k_m.gguf"
HF = "/srv/models/qwen2.5-7b-instruct"


def facts_for(card: str):
    """Facts of a host with this recorded card, a working Docker with the nvidia runtime, and the
    models present."""
    f = parse(host_doc(*_card(card)))
    f.models = [
        ModelFile(path=GGUF, kind="file", readable=True, size_bytes=4_683_073_504, magic="GGUF"),
        ModelFile(path=HF, kind="dir", readable=True, size_bytes=15_231_272_152,
                  entries=["config.json", "model-00001-of-00004.safetensors", "tokenizer.json"]),
    ]
    return f


def svc(**kw) -> Service:
    base = {"name": "chat", "engine": "llamacpp", "model": "qwen2.5-7b-instruct", "model_path": GGUF,
            "image": "llamacpp:b5000-cu122", "quant": "q4_k_m", "context": 8192, "port": 8080,
            "bind_address": "127.0.0.1"}
    if kw.get("engine") == "vllm":
        base.update({"model_path": HF, "image": "vllm:0.19.1", "quant": "gptq-int4"})
    base.update(kw)
    return Service.model_validate(base)


# R535 (an LTS branch) is supported until June 2026 (NVIDIA data-center drivers, 615 edition).
TODAY = "2026-01-15"


def run(card: str, service: Service, *, facts=None, lock=LOCK, allow_unpinned=False, today=TODAY):
    f = facts if facts is not None else facts_for(card)
    settings = HostSettings(services=[service])
    (report,) = check_host("gpu-test-01", settings, f, lock=lock, allow_unpinned=allow_unpinned, today=today)
    return report


def by_id(report) -> dict[str, object]:
    return {c.id: c for c in report.checks}


@pytest.mark.parametrize(
    ("card", "service", "check", "status", "said", "fix"),
    [
        # V100 + AWQ: no AWQ kernels on Volta
        ("v100-535", svc(engine="vllm", quant="awq-int4"), "quant", "fail", "does not run on compute capability 7.0",
         "GPTQ"),
        ("v100-535", svc(engine="vllm"), "quant", "pass", "gptq", ""),
        # V100 + bf16 weights: the planner's --dtype float16 makes it run
        ("v100-535", svc(engine="vllm", quant="bf16", context=4096), "dtype", "pass", "cast to float16", ""),
        ("v100-535", svc(engine="vllm", quant="bf16", context=4096, engine_args=["--dtype", "bfloat16"]), "dtype",
         "fail", "--dtype bfloat16 needs bf16", "--dtype float16"),
        # a CUDA 12.8 llama.cpp image on a 535 driver: PTX-only on Volta, minor-version compat does not JIT,
        # and toolkit 1.17.5 loads the compat libcuda only under the nvidia runtime, which is not Docker's
        # default on this host (nvidia-container-toolkit PR #1055)
        ("v100-535", svc(image="llamacpp:server-cuda-12.8"), "cuda-driver", "fail", "not Docker's default runtime",
         ">= 570.124.06"),
        # vLLM under minor-version compatibility: Triton compiles with its own ptxas (triton#5385): WARN
        ("rtx4090-550", svc(image="vllm:0.10.1.1", engine="vllm", env={"NVIDIA_DISABLE_REQUIRE": "1"}), "cuda-driver",
         "warn", "Triton's own ptxas", "upgrade the driver to >= 570.124.06"),
        # ... without NVIDIA_DISABLE_REQUIRE: the CUDA 12.8 base's NVIDIA_REQUIRE_CUDA (catalog cuda_bases.yaml)
        # lists no GeForce exception on R550, and the container toolkit refuses to start it
        ("rtx4090-550", svc(image="vllm:0.10.1.1", engine="vllm"), "cuda-driver", "fail",
         "the NVIDIA container toolkit refuses to start vllm:0.10.1.1 on driver 550.", "NVIDIA_DISABLE_REQUIRE=1"),
        # the image's torch build has no sm_70 (torch 2.7 cu128; vllm#19185)
        ("v100-535", svc(engine="vllm", image="vllm:0.10.1.1"), "arch", "fail", "PyTorch build", "vllm:0.19.1"),
        ("v100-535", svc(engine="vllm", image="vllm:0.20.0"), "arch", "fail", "no kernels", "vllm:0.19.1"),
        # T4 on R470: compute capability from the catalog, CUDA 12 only through forward compatibility
        ("t4-470", svc(), "gpu", "pass", "compute capability 7.5, from catalog", ""),
        ("t4-470", svc(), "cuda-driver", "fail", "not Docker's default runtime", ">= 535.104.05"),
        # ... and the fix says what runs on R470 today and what an upgrade unlocks
        ("t4-470", svc(), "cuda-driver", "fail", "not Docker's default runtime",
         "runs on this driver today: llamacpp:vendored-0.3.36-cu118 (CUDA 11.8.89, through minor-version"),
        ("t4-470", svc(engine="vllm", image="vllm:0.10.1.1"), "cuda-driver", "fail", "CUDA 11.4",
         "published CUDA 11.8 wheels on GitHub releases only (not PyPI, no image)"),
        # the CUDA 11.8 image on R470: minor-version compatibility, SASS for the T4, no runtime refusal
        ("t4-470", svc(image="llamacpp:vendored-0.3.36-cu118"), "cuda-driver", "warn",
         "CUDA 11.x from driver 450.80.02", ">= 520.61.05"),
        ("t4-470", svc(image="llamacpp:vendored-0.3.36-cu118"), "arch", "pass", "SASS for sm_75", ""),
        ("p40-470", svc(), "gpu", "warn", "memory already in use", "stop what holds the GPU memory"),
        ("p40-470", svc(engine="vllm", image="vllm:0.19.1"), "arch", "fail", "no kernels", "llama.cpp"),
        ("rtx4090-550", svc(engine="vllm", quant="fp8", image="vllm:0.19.1"), "quant", "pass", "fp8_w8a8", ""),
        # An explicit FLASH_ATTN cannot hold fp8 on Ada; without one the plan picks a backend that can.
        ("rtx4090-550", svc(engine="vllm", kv_dtype="fp8", engine_args=["--attention-backend", "FLASH_ATTN"]),
         "kv-dtype", "fail", "FLASH_ATTN", "FLASHINFER"),
        ("rtx4090-550", svc(engine="vllm", kv_dtype="fp8"), "kv-dtype", "pass", "FLASHINFER", ""),
        ("rtx4090-550", svc(image="llamacpp:server-cuda-12.8", engine_args=["-fa"]), "attention", "fail",
         "takes -fa on|off|auto", "-fa on"),
        # the plan
        ("v100-535", svc(engine="vllm", model="qwen2.5-32b-instruct", quant="bf16"), "plan", "fail",
         "does not fit: REFUSED", "--quant gptq-int8"),
        ("v100-535", svc(), "plan", "pass", "fits 2 x Tesla V100-SXM2-32GB", ""),
        ("v100-535", svc(gpus=[1]), "plan", "pass", "fits 1 x Tesla V100-SXM2-32GB", ""),
        ("v100-535", svc(model="my-private-model"), "plan", "warn", "unknown model", "catalog/models.yaml"),
        ("v100-535", svc(quant="awq-int4"), "plan", "fail", "llama.cpp serves GGUF files", "`invoke plan` accepts"),
        # image resolution through the lock
        ("v100-535", svc(image="llamacpp:not-pinned"), "image", "fail", "is not in images.lock", "images.pin"),
        ("v100-535", svc(), "image", "pass", f"registry.example/llmfleet/llama.cpp@{DIGEST}", ""),
        # model files
        ("v100-535", svc(model_path="/srv/models/gone.gguf"), "model-files", "warn", "was not probed", "again"),
        ("v100-535", svc(engine="vllm", model_path=GGUF), "model-files", "pass", "GGUF", ""),
        ("v100-535", svc(model_path=HF), "model-files", "fail", "is a dir, not a .gguf file", ".gguf file"),
        ("v100-535", svc(), "disk-model", "pass", "already on the host", ""),
        ("v100-535", svc(), "port", "pass", "port 8080 is free", ""),
        ("v100-535", svc(port=8000), "port", "fail", "in use by a process outside llmfleet", "another port"),
        ("v100-535", svc(), "gpu-runtime", "pass", "nvidia runtime", ""),
        ("v100-535", svc(), "compose", "pass", "2.29.7", ""),
        ("v100-535", svc(gpus=[0, 5]), "gpu", "fail", "asks for GPU(s) 5; the host has 0, 1", "gpus"),
    ],
)
def test_checks(card, service, check, status, said, fix):
    report = run(card, service)
    c = by_id(report)[check]
    assert c.status == status, c
    assert said in c.message, c.message
    assert fix in c.fix, c.fix
    assert report.ok == all(x.status != "fail" for x in report.checks)


def test_a_good_service_passes_and_checks_come_in_the_documented_order():
    report = run("v100-535", svc())
    assert report.ok, [c for c in report.checks if c.status == "fail"]
    ids = [c.id for c in report.checks]
    assert ids == [i for i in CHECK_IDS if i in ids]
    # known-issue only when one applies; model-verified only when the probe read a model manifest;
    # gpu-health only when the probe read the cards' health (these facts predate it)
    assert set(ids) >= set(CHECK_IDS) - {"facts", "known-issue", "model-verified", "gpu-health", "exporter", "model-types"}  # exporter: exporters only; model-types: llama.cpp quants with recorded tensor types


def test_json_shape():
    d = run("v100-535", svc(engine="vllm", quant="awq-int4")).to_dict()
    assert set(d) == {"host", "service", "ok", "checks"}
    assert (d["host"], d["service"], d["ok"]) == ("gpu-test-01", "chat", False)
    assert {c["status"] for c in d["checks"]} <= {"pass", "warn", "fail"}
    assert all(set(c) == {"id", "status", "message", "fix"} for c in d["checks"])


def test_dead_driver_is_a_named_gpu_failure_even_for_a_cpu_image():
    body, rc = body_rc("driver-not-loaded/nvidia-smi.txt")
    f = parse(host_doc(section("nvidia_query", body, rc), section("nvidia_smi", body, rc)))
    lock = images.ImageLock(images={"llamacpp:lab-cpu": images.LockedImage(
        key="llamacpp:lab-cpu", repository="127.0.0.1:5000/lab/llama-server", digest=DIGEST, tag="lab")})
    report = run("", svc(image="llamacpp:lab-cpu", model_path="/srv/models/x.gguf"), facts=f, lock=lock)
    gpu = by_id(report)["gpu"]
    assert gpu.status == "fail" and "driver not loaded (nvidia-smi exit 9" in gpu.message
    assert not report.ok


def test_dead_driver_with_a_gpu_image_skips_the_kernel_checks():
    body, rc = body_rc("driver-not-loaded/nvidia-smi.txt")
    f = parse(host_doc(section("nvidia_query", body, rc)))
    checks = by_id(run("", svc(), facts=f))
    assert checks["gpu"].status == "fail"
    assert checks["arch"].status == "warn" and checks["arch"].message.startswith("not judged")


def test_unpinned_image_is_a_warning_when_allowed():
    report = run("v100-535", svc(image="ghcr.io/ggml-org/llama.cpp:server-cuda"), allow_unpinned=True)
    c = by_id(report)["image"]
    assert c.status == "warn" and "floating tag" in c.message
    assert by_id(report)["arch"].status == "pass"  # judged as the catalog's llamacpp:server-cuda-12.8


def test_unpinned_image_fails_by_default():
    c = by_id(run("v100-535", svc(image="ghcr.io/ggml-org/llama.cpp:server-cuda")))["image"]
    assert c.status == "fail" and "floating tag" in c.message


def test_port_held_by_our_own_container_passes_and_by_another_fails():
    f = facts_for("v100-535")
    f.containers = [Container(name="llmfleet-chat", image="x", state="running", ports=[8000],
                              labels={"io.llmfleet.service": "chat"})]
    c = by_id(run("", svc(port=8000), facts=f))["port"]
    assert c.status == "pass" and "own container llmfleet-chat" in c.message
    f.containers = [Container(name="grafana", image="grafana/grafana", state="running", ports=[8000])]
    c = by_id(run("", svc(port=8000), facts=f))["port"]
    assert c.status == "fail" and "held by container grafana" in c.message


def test_no_docker_and_no_gpu_runtime_fail():
    f = parse(host_doc(*_card("v100-535"), docker="Cannot connect to the Docker daemon at unix:///var/run/docker.sock.",
                       docker_rc=1, tools="nvidia-smi=/usr/bin/nvidia-smi"))
    checks = by_id(run("", svc(), facts=f))
    assert checks["docker"].status == "fail" and "docker socket refused" in checks["docker"].message
    assert checks["gpu-runtime"].status == "fail" and "nvidia-ctk runtime configure" in checks["gpu-runtime"].fix
    assert checks["facts"].status == "warn"


def test_small_disk_fails_the_image_check():
    f = facts_for("v100-535")
    f.disks = [Disk(label="docker_root", path="/var/lib/docker", mount="/", total_mib=20000, free_mib=1000)]
    c = by_id(run("", svc(engine="vllm"), facts=f))["disk-image"]
    assert c.status == "fail" and "1.0 GiB free" in c.message and "prune" in c.fix


def test_image_already_on_the_host_needs_no_disk():
    f = facts_for("v100-535")
    f.disks = []
    f.images = [f"registry.example/llmfleet/llama.cpp@{DIGEST}"]
    c = by_id(run("", svc(), facts=f))["disk-image"]
    assert c.status == "pass" and "already on the host" in c.message


def test_missing_model_needs_disk_for_it():
    f = facts_for("v100-535")
    f.models = [ModelFile(path="/srv/models/new.gguf", kind="missing")]
    f.disks.append(Disk(label="model:/srv/models/new.gguf", path="/srv", total_mib=10000, free_mib=2000))
    checks = by_id(run("", svc(model_path="/srv/models/new.gguf"), facts=f))
    assert checks["model-files"].status == "fail"
    assert checks["disk-model"].status == "fail" and "2.0 GiB free at /srv" in checks["disk-model"].message


def test_hostile_facts_give_findings_not_tracebacks():
    junk = "0, \x1b]0;pwned\x07Tesla V100, x, y, zz, -1, 9999999999999999, 5xx.evil, 7.0; rm -rf /"
    f = parse(host_doc(section("nvidia_query", junk), section("nvidia_smi", "garbage " * 1000)))
    report = run("", svc(), facts=f)
    assert not report.ok
    assert all(len(c.message) < 2000 for c in report.checks)


def test_lock_archs_override_the_catalog_and_the_difference_is_said():
    ref = images.resolve("llamacpp:server-cuda-12.8", images.ImageLock(images={
        "llamacpp:server-cuda-12.8": images.LockedImage(
            key="llamacpp:server-cuda-12.8", repository="ghcr.io/ggml-org/llama.cpp", digest=DIGEST,
            cuda="12.8.1", archs=("7.0", "8.6", "8.9", "9.0+PTX"))}))
    from llmfleet.knowledge.compat import load_engine_catalog

    rel, notes = release_for(ref, load_engine_catalog())
    assert rel.kernels.sass == ["7.0", "8.6", "8.9", "9.0"] and rel.kernels.ptx == ["9.0"]
    assert notes and "judged by the lock" in notes[0]
    checks = {c.id: c for c in run_checks("h", svc(image="llamacpp:server-cuda-12.8"), facts_for("v100-535"), None, ref)}
    assert checks["image"].status == "warn"
    assert "SASS for sm_70" in checks["arch"].message


@pytest.mark.parametrize(
    ("archs", "sass", "ptx"),
    [
        (["7.0", "7.5"], ["7.0", "7.5"], []),
        (["sm_70", "compute_90"], ["7.0"], ["9.0"]),
        (["86-real", "90-virtual", "120a-real"], ["8.6", "12.0a"], ["9.0"]),
        (["12.0+PTX"], ["12.0"], ["12.0"]),
    ],
)
def test_parse_archs(archs, sass, ptx):
    k = parse_archs(archs)
    assert (k.sass, k.ptx) == (sass, ptx)


def test_parse_archs_refuses_junk():
    assert parse_archs(["7.0", "volta"]) is None


def test_images_lock_path(tmp_path):
    inv = tmp_path / "inv"
    inv.mkdir()
    assert images.images_lock_path({"llmfleet_images_lock": "../.lab/images.lock"}, str(inv), None) == str(
        inv / "../.lab/images.lock")
    assert images.images_lock_path({}, str(inv), "/etc/llmfleet/images.lock") == "/etc/llmfleet/images.lock"
    assert images.images_lock_path({}, str(inv / "hosts.yml"), None) is None


def test_forward_compat_on_r470_with_a_toolkit_that_loads_it_is_a_warn_naming_the_unconfirmed_eol():
    """Toolkit 1.17.7+ loads the compat libcuda under --gpus too (cuda-compat-mode=ldconfig,
    nvidia-container-toolkit PR #1082); R470's end of life is not in a primary source, so it cannot
    refuse: the WARN says so."""
    f = facts_for("t4-470")
    f.toolkit.version = "1.17.8"
    c = by_id(run("t4-470", svc(), facts=f))["cuda-driver"]
    assert c.status == "warn" and "forward compatibility" in c.message
    assert "end of life 2024-07 unconfirmed" in c.message and "toolkit 1.17.8: ldconfig" in c.message


# ---------------------------------------------------------------------------------------------
# bind: a port published beyond loopback needs an API key (or an explicit allow_unauthenticated)


@pytest.mark.parametrize(("host_vars", "svc_kw", "status"), [
    ({}, {"bind_address": "127.0.0.1"}, "pass"),
    ({}, {"bind_address": "::1"}, "pass"),
    ({}, {"bind_address": "0.0.0.0"}, "fail"),
    ({}, {"bind_address": "10.1.2.3"}, "fail"),
    ({"bind_address": "10.1.2.3"}, {"bind_address": None}, "fail"),
    ({"bind_address": "127.0.0.1"}, {"bind_address": None}, "pass"),
    ({}, {"bind_address": None}, "fail"),  # default 0.0.0.0
    ({}, {"bind_address": "0.0.0.0", "api_key": {"from_env": "K"}}, "pass"),
    ({}, {"bind_address": "0.0.0.0", "allow_unauthenticated": True}, "warn"),
    ({"allow_unauthenticated": True}, {"bind_address": "0.0.0.0"}, "warn"),
    ({"allow_unauthenticated": True}, {"bind_address": "0.0.0.0", "allow_unauthenticated": False}, "fail"),
])
def test_bind_check(host_vars, svc_kw, status):
    from llmfleet.knowledge.preflight import bind_check

    service = svc(**svc_kw)
    settings = HostSettings(services=[service], **host_vars)
    check = bind_check(service, settings)
    assert check.status == status, check.message
    if status != "pass":
        assert "firewall" in check.message and check.fix


def test_unauthenticated_public_port_refuses_the_preflight():
    report = run("v100-535", svc(bind_address="0.0.0.0"))
    assert not report.ok
    assert by_id(report)["bind"].status == "fail"


def test_vllm_36357_the_v100_releases_carry_the_fix_and_an_unfixed_release_warns_for_multimodal_models():
    """vllm#36357 (multimodal encoder profiling hangs on V100, from v0.17) is fixed by PR #36472 (merged
    2026-03-09), before the v0.19 line: the catalog's V100 vLLM releases say so and get no WARN; a release
    without the fix WARNs with the issue link, for multimodal models only."""
    from llmfleet.knowledge import compat

    cat = compat.load_engine_catalog()
    for key in ("vllm:0.19.1", "vllm:0.19.1-volta"):
        rel = cat.release(key)
        (issue,) = [i for i in rel.known_issues if i.id == "vllm#36357"]
        assert issue.fixed and "36472" in issue.source and issue.url.endswith("/issues/36357")
        assert compat.check_known_issues(rel, "7.0", multimodal=True) is None
    v = run("v100-535", svc(engine="vllm", model="gemma-3-27b-it", quant="gptq-int4"))
    assert "known-issue" not in [c.id for c in v.checks]
    unfixed = cat.release("vllm:0.19.1").model_copy(update={"known_issues": [
        i.model_copy(update={"fixed": False}) for i in cat.release("vllm:0.19.1").known_issues]})
    w = compat.check_known_issues(unfixed, "7.0", multimodal=True)
    assert w is not None and w.status == "warn" and "https://github.com/vllm-project/vllm/issues/36357" in w.message
    assert compat.check_known_issues(unfixed, "7.0", multimodal=False) is None
    assert compat.check_known_issues(unfixed, "8.0", multimodal=True) is None
    checks = run_checks("h", svc(engine="vllm", model="gemma-3-27b-it", quant="gptq-int4"), facts_for("v100-535"),
                        None, release=unfixed)
    assert [c.status for c in checks if c.id == "known-issue"] == ["warn"]
