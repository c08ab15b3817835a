"""Residency from evidence: the engines' own load lines parsed (real logs under tests/data/engine-logs),
the verdict against the plan as a table, the evidence round trip's parser, and the health check's
``residency`` stage (a failure quotes the engine's line and stops the check before any speed is
measured; what cannot be read is a WARN, never a crash)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.health import residency as R
from llmfleet.inventory.services import host_settings
from llmfleet.knowledge.engines import for_engine
from llmfleet.knowledge.engines.loadlog import (
    ComputeApps,
    is_host_buffer,
    parse_compute_apps,
    parse_llamacpp,
    parse_vllm,
)
from llmfleet.knowledge.planner import PlanSummary
from llmfleet.release import store

LOGS = Path(__file__).parent / "data" / "engine-logs"
MIB = 1024 * 1024


def log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8", errors="replace")


# A llama.cpp GPU start as the CUDA build prints it at -lv 4 (formats of src/llama-model.cpp,
# src/llama-kv-cache.cpp, src/llama-context.cpp): Llama-3.1-8B shape, Q4_K_M, 33 layers, 2 slots.
GPU_FULL = """\
0.00.004.841 I cmn  common_param: common_params_print_info: build 1 (0c1e570) with GNU 12.2.0 for Linux x86_64
0.00.913.001 I load_tensors: offloading output layer to GPU
0.00.913.002 I load_tensors: offloading 32 repeating layers to GPU
0.00.913.003 I load_tensors: offloaded 33/33 layers to GPU
0.00.913.010 I load_tensors:        CUDA0 model buffer size =  4403.49 MiB
0.00.913.011 I load_tensors:   CPU_Mapped model buffer size =   281.81 MiB
0.01.214.139 I llama_context: n_ctx                 = 8192
0.01.214.141 I llama_context: flash_attn            = auto
0.01.214.199 I llama_kv_cache:      CUDA0 KV buffer size =  1024.00 MiB
0.01.214.375 I llama_kv_cache: size = 1024.00 MiB (  4096 cells,  32 layers,  2/2 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB
0.01.215.181 I resolve_fused_ops: Flash Attention enabled
"""
GPU_PARTIAL = GPU_FULL.replace("offloaded 33/33", "offloaded 20/33").replace(
    "CUDA0 model buffer size =  4403.49", "CUDA0 model buffer size =  2702.11").replace(
    "CPU_Mapped model buffer size =   281.81", "CPU_Mapped model buffer size =  1983.19")
# experts kept on the CPU (--n-cpu-moe): every layer "offloaded", the host buffer says otherwise
GPU_CPU_MOE = GPU_FULL.replace("CUDA0 model buffer size =  4403.49", "CUDA0 model buffer size =  1200.00").replace(
    "CPU_Mapped model buffer size =   281.81", "CPU_Mapped model buffer size =  3485.30")
GPU_NO_DEVICE = "\n".join(ln for ln in GPU_FULL.splitlines() if "offload" not in ln).replace(
    "CUDA0 model buffer size =  4403.49", "CPU_REPACK model buffer size =  4403.49").replace(
    "CUDA0 KV buffer", "CPU KV buffer")

# The plan for that shape: 32 repeating layers, 4.9 GB of weights, the token-embedding table (282 MiB)
# kept in host memory, context 4096 x 2.
PLAN = PlanSummary(engine="llamacpp", resident=True, gpu_layers=32, total_layers=32, context=4096, concurrency=2,
                   weights_bytes=int(4685.3 * MIB), weights_gpu_bytes=int(4403.5 * MIB))

VLLM_LOG = """\
INFO 12-01 10:00:01 [api_server.py:1900] vLLM API server version 0.26.0
INFO 12-01 10:00:20 [cuda.py:300] Using FLASH_ATTN backend.
INFO 12-01 10:00:21 [gptq_marlin.py:300] Using MacheteLinearKernel for GPTQMarlinLinearMethod
INFO 12-01 10:00:40 [gpu_model_runner.py:2600] Model loading took 5.2110 GiB and 18.12 seconds
INFO 12-01 10:00:55 [gpu_worker.py:290] Available KV cache memory: 112.43 GiB
INFO 12-01 10:00:55 [kv_cache_utils.py:1100] GPU KV cache size: 842,016 tokens
INFO 12-01 10:00:55 [kv_cache_utils.py:1104] Maximum concurrency for 32,768 tokens per request: 25.70x
"""
VPLAN = PlanSummary(engine="vllm", context=32768, concurrency=8, weights_bytes=int(5.4 * 1024 * MIB),
                    weights_gpu_bytes=int(5.4 * 1024 * MIB))


# ---------------------------------------------------------------------------------------------
# parsers


def test_llamacpp_lab_log_at_lv4_is_read_whole():
    rep = parse_llamacpp(log("llamacpp-lab-cpu-full-lv4.log"))
    assert (rep.layers_offloaded, rep.layers_total) == (3, 3)
    assert set(rep.model_buffers_mib) == {"CPU_Mapped"} and rep.gpu_weights_mib == 0
    assert rep.kv_cells == 1024 and rep.kv_types == ("f16", "f16") and rep.n_ctx == 1024  # 512 cells x 2 streams
    assert rep.flash_attn == "on" and rep.build and rep.unread == ()
    assert "offloaded 3/3 layers to GPU" in rep.lines["offloaded"]


def test_llamacpp_at_the_default_verbosity_says_what_it_could_not_read():
    rep = parse_llamacpp(log("llamacpp-lab-cpu-full-default.log"))
    assert rep.layers_offloaded is None and not rep.model_buffers_mib
    assert any("offloaded" in u for u in rep.unread) and any("KV" in u for u in rep.unread)


def test_llamacpp_partial_offload_is_read_from_the_lab_log():
    rep = parse_llamacpp(log("llamacpp-lab-cpu-partial-ngl1-lv4.log"))
    assert (rep.layers_offloaded, rep.layers_total) == (1, 3)


def test_the_hosts_grep_keeps_every_line_the_parser_reads():
    """The evidence script fetches only what load_log_grep selects: parsing the grep's selection
    gives the same report as parsing the whole log (the grep run for real, as on the host)."""
    import subprocess

    for name in ("llamacpp-lab-cpu-full-lv4.log", "llamacpp-lab-cpu-partial-ngl1-lv4.log"):
        text = log(name)
        kept = subprocess.run(["grep", "-a", "-E", "-e", for_engine("llamacpp").load_log_grep], input=text,
                              capture_output=True, text=True, check=False).stdout
        assert parse_llamacpp(kept) == parse_llamacpp(text)
    kept = subprocess.run(["grep", "-a", "-E", "-e", for_engine("vllm").load_log_grep], input=VLLM_LOG,
                          capture_output=True, text=True, check=False).stdout
    assert parse_vllm(kept) == parse_vllm(VLLM_LOG)


def test_llamacpp_reads_the_last_start_of_a_restarted_container():
    text = GPU_PARTIAL + GPU_FULL
    assert parse_llamacpp(text).layers_offloaded == 33


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("llm_load_tensors: offloaded 41/41 layers to GPU", "layers_offloaded", 41),
        ("llm_load_tensors:        CUDA0 buffer size =  7605.33 MiB", "model_buffers_mib", {"CUDA0": 7605.33}),
        ("llama_kv_cache_init: kv_size = 4096, offload = 1, type_k = 'q8_0', type_v = 'q8_0', n_layer = 40",
         "kv_types", ("q8_0", "q8_0")),
        ("llama_init_from_model: flash_attn    = 0", "flash_attn", "off"),
        ("\x1b[32mload_tensors: offloaded 7/29 layers to GPU\x1b[0m\r", "layers_total", 29),
        ("garbage \xff\xfe line", "layers_offloaded", None),
        ("", "layers_offloaded", None),
    ],
)
def test_llamacpp_older_builds_and_odd_bytes(text, field, value):
    assert getattr(parse_llamacpp(text), field) == value


def test_vllm_lab_cpu_log_is_read():
    """vLLM 0.32 on the CPU prints the KV tokens and the concurrency on one line, and no weights size."""
    rep = parse_vllm(log("vllm-lab-cpu-0.32.0.log"))
    assert rep.kv_tokens == 2_097_152 and rep.max_concurrency == (512, 4096.0) and rep.build == "0.32.0"
    assert rep.weights_gib is None and any("Model loading took" in u for u in rep.unread)


def test_vllm_load_lines():
    rep = parse_vllm(VLLM_LOG)
    assert rep.weights_gib == pytest.approx(5.211) and rep.kv_tokens == 842016
    assert rep.max_concurrency == (32768, 25.70) and rep.kv_memory_gib == pytest.approx(112.43)
    assert rep.attention_backend == "FLASH_ATTN" and rep.build == "0.26.0"
    assert rep.kernels == ("MacheteLinearKernel for GPTQMarlinLinearMethod",) and rep.unread == ()


@pytest.mark.parametrize(
    ("line", "field", "value"),
    [
        ("Loading model weights took 13.4976 GB", "weights_gib", pytest.approx(13.4976e9 / 1024**3)),
        ("CPU KV cache size: 21,845 tokens", "kv_tokens", 21845),
        ("Using default MoE config. Performance might be sub-optimal!", "kernels", ("MoE: default config",)),
        ("Using AttentionBackendEnum.TRITON_ATTN backend.", "attention_backend", "TRITON_ATTN"),
    ],
)
def test_vllm_variants(line, field, value):
    assert getattr(parse_vllm(line), field) == value


@pytest.mark.parametrize(
    ("text", "rc", "used", "error"),
    [
        ("2211, 5012\n2290, 410\n", 0, {2211: 5012.0, 2290: 410.0}, None),
        ("pid, used_memory [MiB]\n2211, 5012 MiB\n", 0, {2211: 5012.0}, None),
        ("", 0, {}, None),  # no process holds GPU memory
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9, {}, "NVIDIA driver"),
        ("sh: 1: nvidia-smi: not found", 127, {}, "not found"),
        ("[Insufficient Permissions]", 0, {}, "Insufficient"),
    ],
)
def test_compute_apps(text, rc, used, error):
    apps = parse_compute_apps(text, rc)
    assert apps.used_mib == used
    assert (error in apps.error) if error else apps.error is None


@pytest.mark.parametrize("name", ["CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "CUDA0", "CUDA1", "RPC[10.0.0.2:50052]"])
def test_host_buffers(name):
    assert is_host_buffer(name) is (name.startswith("CPU") or name.endswith("_Host"))


def test_evidence_parser_never_raises_and_says_when_it_is_incomplete():
    out = "@@log\nline a\nline b\n@@pids  PID 812 905 \n@@smi\n812, 5000\n@@smi-rc 0\n"
    ev = store.parse_evidence(out)
    assert ev.log == "line a\nline b" and ev.pids == {812, 905} and ev.smi_text == "812, 5000" and ev.smi_rc == 0
    assert ev.complete
    cut = store.parse_evidence("@@log\nline a\n")  # the connection dropped mid-way
    assert not cut.complete and cut.log == "line a" and cut.pids == frozenset()
    assert not store.parse_evidence("").complete


# ---------------------------------------------------------------------------------------------
# the verdict


def _apps(mib: float | None) -> ComputeApps:
    return ComputeApps(used_mib={} if mib is None else {4242: mib})


@pytest.mark.parametrize(
    ("text", "plan", "apps", "mode", "status", "what", "says"),
    [
        # a healthy resident start passes, with the second witness
        (GPU_FULL, PLAN, _apps(6100), "gpu", "pass", None, "33/33 layers offloaded as planned"),
        # layers off the GPU fail whatever the speed, quoting the engine's line
        (GPU_PARTIAL, PLAN, _apps(4200), "gpu", "fail", "layers", "offloaded 20/33 layers to GPU"),
        # experts on the CPU: every layer "offloaded", the host buffer tells
        (GPU_CPU_MOE, PLAN, _apps(2400), "gpu", "fail", "host weights", "CPU_Mapped model buffer size"),
        # the container did not get the GPU
        (GPU_NO_DEVICE, PLAN, _apps(None), "gpu", "fail", "gpu", "no model buffer on any GPU"),
        # the KV cache smaller than context x concurrency
        (GPU_FULL, PlanSummary(**{**PLAN.__dict__, "context": 8192}), _apps(6100), "gpu", "fail", "kv",
         "8,192 x concurrency 2"),
        # another quantization than planned (weights twice the plan)
        (GPU_FULL, PlanSummary(**{**PLAN.__dict__, "weights_bytes": int(2300 * MIB), "weights_gpu_bytes": int(2018 * MIB)}),
         _apps(6100), "gpu", "fail", "weights", "another file or quantization"),
        # nvidia-smi: the engine holds less GPU memory than the weights
        (GPU_FULL, PLAN, _apps(900), "gpu", "fail", "gpu memory", "900 MiB of GPU memory"),
        # nvidia-smi cannot answer: a WARN, the engine's own report still decides
        (GPU_FULL, PLAN, ComputeApps(error="nvidia-smi --query-compute-apps did not answer: x"), "gpu", "warn",
         "gpu memory", "no second witness"),
        # the log rotated away / a build that prints other words
        ("", PLAN, _apps(6100), "gpu", "warn", "log", "residency is unproven"),
        # a lab CPU engine: devices not checked, the layer count still is
        (log("llamacpp-lab-cpu-full-lv4.log"),
         PlanSummary(engine="llamacpp", resident=True, gpu_layers=2, total_layers=2, context=512, concurrency=2),
         _apps(40), "cpu", "pass", None, "CPU by design"),
        (log("llamacpp-lab-cpu-partial-ngl1-lv4.log"),
         PlanSummary(engine="llamacpp", resident=True, gpu_layers=2, total_layers=2, context=512, concurrency=2),
         _apps(40), "cpu", "fail", "layers", "offloaded 1/3 layers to GPU"),
        # the check turned off says so
        (GPU_PARTIAL, PLAN, None, "off", "pass", None, "residency check off"),
        # a planned offload (offload: true) with the planned layer count passes
        (GPU_PARTIAL, PlanSummary(**{**PLAN.__dict__, "resident": False, "gpu_layers": 20,
                                      "weights_gpu_bytes": int(2702 * MIB)}), _apps(3500), "gpu", "pass", None,
         "20/33 layers offloaded as planned"),
        # vLLM: weights and KV tokens as planned
        (VLLM_LOG, VPLAN, _apps(130000), "gpu", "pass", None, "KV cache 842,016 tokens >= 262,144"),
        (VLLM_LOG, PlanSummary(**{**VPLAN.__dict__, "concurrency": 32}), _apps(130000), "gpu", "fail", "kv",
         "GPU KV cache size: 842,016 tokens"),
        # the lab's vLLM CPU engine: KV capacity compared, the missing weights line a WARN naming it
        (log("vllm-lab-cpu-0.32.0.log"), PlanSummary(engine="vllm", context=512, concurrency=2), _apps(900), "cpu",
         "warn", "log", "KV cache 2,097,152 tokens >= 1,024"),
    ],
)
def test_judge(text, plan, apps, mode, status, what, says):
    engine = plan.engine
    rep = for_engine(engine).parse_load_log(text)
    v = R.judge(rep, apps, {4242}, plan, mode)
    assert v.status == status, v.message
    if what:
        assert any(f.what == what and f.status == status for f in v.findings), v.findings
    assert says in v.message


def test_the_verdict_is_recorded_as_data():
    v = R.judge(parse_llamacpp(GPU_PARTIAL), _apps(4200), {4242}, PLAN, "gpu")
    d = v.to_dict()
    assert d["status"] == "fail" and d["engine_report"]["layers_offloaded"] == 20
    assert any(f["what"] == "layers" and "20/33" in f["line"] for f in d["findings"])


def test_the_lab_says_so_explicitly_and_a_service_may_differ():
    hs = host_settings("h", {"llmfleet_health_residency": "cpu", "llmfleet_services": [
        {"name": "a", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf", "image": "llamacpp:x"},
        {"name": "b", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf", "image": "llamacpp:x",
         "port": 8001, "health": {"residency": "gpu"}}]})
    assert [hs.residency_for(s) for s in hs.services] == ["cpu", "gpu"]
    plain = host_settings("h", {"llmfleet_services": [
        {"name": "a", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf", "image": "llamacpp:x"}]})
    assert plain.residency_for(plain.services[0]) == "gpu"


# ---------------------------------------------------------------------------------------------
# the shell: one round trip on a host (the scripted remote), parsed and judged


def _evidence(log_text: str, pids: str = "PID 4242", smi: str = "4242, 6100", rc: int = 0) -> str:
    return f"@@log\n{log_text.rstrip()}\n@@pids {pids}\n@@smi\n{smi}\n@@smi-rc {rc}\n"


@pytest.mark.parametrize(
    ("answer", "engine_args", "status", "says"),
    [
        (_evidence(GPU_FULL), [], "pass", "33/33 layers offloaded as planned"),
        (_evidence(GPU_PARTIAL), [], "fail", "offloaded 20/33 layers to GPU"),
        # the operator asked for a smaller context on the command line: the engine gave what was asked
        (_evidence(GPU_FULL.replace("4096 cells", "1024 cells")), ["-c", "2048"], "pass", ">= 2,048"),
        (_evidence(GPU_FULL.replace("4096 cells", "1024 cells")), [], "fail", "the command line asks 8,192"),
        # a connection that dropped after the log: the second witness is missing, said so
        ("@@log\n" + GPU_FULL, [], "warn", "ended before nvidia-smi answered"),
        (_evidence(GPU_FULL, smi="No devices were found", rc=6), [], "warn", "No devices were found"),
    ],
)
def test_residency_check_on_a_host(answer, engine_args, status, says):
    from llmfleet.release import executor as E
    from llmfleet.settings import Settings
    from tests.fake_remote import Command, FakeRemote

    hs = host_settings("h1", {"llmfleet_services": [
        {"name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf", "image": "llamacpp:x",
         "engine_args": engine_args}]})
    svc = hs.services[0]
    paths = store.Paths("/opt/llmfleet", "chat")
    plan = PlanSummary(**{**PLAN.__dict__, "engine_args": ("-ngl", "33", "-c", "8192", "-np", "2")})
    remote = FakeRemote([Command(store.evidence_script(paths, for_engine("llamacpp").load_log_grep), out=answer)])
    run = E.HostRun("h1", hs, remote, settings=Settings.of({"audit_log": "/dev/null"}), log=lambda _: None)
    v = E.residency_check(run, E.HealthTarget(svc, None, paths, "", plan))
    remote.assert_done()
    assert v.status == status, v.message
    assert says in v.message


def test_a_release_is_judged_by_its_own_command_line_not_todays_inventory():
    """Going back to an earlier release: its manifest's flags (a smaller -c) are what it was asked for,
    not the plan's nor the flags of the inventory being deployed now."""
    from llmfleet.release import executor as E
    from llmfleet.settings import Settings
    from tests.fake_remote import Command, FakeRemote

    hs = host_settings("h1", {"llmfleet_services": [
        {"name": "chat", "engine": "llamacpp", "model": "m", "model_path": "/m.gguf", "image": "llamacpp:x",
         "engine_args": ["-ngl", "1"]}]})
    paths = store.Paths("/opt/llmfleet", "chat")
    plan = PlanSummary(**{**PLAN.__dict__, "engine_args": ("-ngl", "33", "-c", "8192", "-np", "2")})
    answer = _evidence(GPU_FULL.replace("4096 cells", "1024 cells"))
    for args, status in ((("-ngl", "33", "-c", "8192", "-np", "2", "-c", "2048"), "pass"), ((), "fail")):
        remote = FakeRemote([Command(store.evidence_script(paths, for_engine("llamacpp").load_log_grep), out=answer)])
        run = E.HostRun("h1", hs, remote, settings=Settings.of({"audit_log": "/dev/null"}), log=lambda _: None)
        v = E.residency_check(run, E.HealthTarget(hs.services[0], None, paths, "", plan, engine_args=args))
        assert v.status == status, v.message


# ---------------------------------------------------------------------------------------------
# real GPU starts: llama-server from the llama-cpp-python 0.3.36 tree on an H200 (tests/data/engine-logs/README.md)


def _h200(run: str) -> tuple[str, ComputeApps, set[int]]:
    """(log, nvidia-smi's answer, the server's PIDs) of one recorded start: ``run`` as in the file names."""
    csv = LOGS / f"nvidia-smi-compute-apps-llamacpp-{run}.noheader.csv"
    if not csv.exists():
        csv = LOGS / f"nvidia-smi-compute-apps-llamacpp-{run.removesuffix('-lv4')}.noheader.csv"
    apps = parse_compute_apps(csv.read_text())
    return log(f"llamacpp-0.3.36-h200-{run}.log"), apps, set(apps.used_mib)


def _plan_8b():
    from llmfleet.knowledge.planner import PlanRequest, plan, summarize

    return summarize(plan(PlanRequest(model="llama-3.1-8b-instruct", quant="q4_k_m", gpu="h200-141gb",
                                      engine="llamacpp", context=16384, concurrency=4, kv_dtype="q8_0")))


def test_the_planners_weights_match_what_llama_cpp_allocated_on_the_h200():
    """The plan for the 8B Q4_K_M shape puts 4,403 MiB on the GPU and keeps the 282 MiB embedding table
    in host memory; the engine's own buffers on the H200 say the same to the MiB."""
    p = _plan_8b()
    rep = parse_llamacpp(log("llamacpp-0.3.36-h200-full-lv4.log"))
    assert rep.model_buffers_mib == {"CUDA0": 4403.49, "CPU_Mapped": 281.81}
    assert p.weights_gpu_bytes / MIB == pytest.approx(4403.49, abs=1)
    assert (p.weights_bytes - p.weights_gpu_bytes) / MIB == pytest.approx(281.81, abs=1)
    assert rep.kv_cells == 16384 * 4 and rep.kv_types == ("q8_0", "q8_0")


@pytest.mark.parametrize(
    ("name", "status", "says"),
    [
        ("full-lv4", "pass", "33/33 layers offloaded as planned"),
        ("partial-ngl20-lv4", "fail", "offloaded 20/33 layers to GPU"),
        ("full-default", "warn", "residency is unproven"),  # the build's default verbosity hides the lines
    ],
)
def test_real_h200_starts_judged_against_the_plan(name, status, says):
    text, apps, pids = _h200(name)
    v = R.judge(parse_llamacpp(text), apps, pids, _plan_8b(), "gpu")
    assert v.status == status, v.message
    assert says in v.message
    assert v.gpu_memory_mib and v.gpu_memory_mib > 4403  # nvidia-smi's witness: the engine's process


def test_real_h200_moe_experts_on_the_cpu_are_caught_by_the_host_buffer():
    """--n-cpu-moe 4: the engine still says every layer is offloaded; its CPU buffer grew tenfold."""
    full = parse_llamacpp(log("llamacpp-0.3.36-h200-moe-full-lv4.log"))
    gpu, host = full.gpu_weights_mib, full.host_weights_mib
    plan = PlanSummary(engine="llamacpp", resident=True, gpu_layers=full.layers_total - 1,
                       total_layers=full.layers_total - 1, context=4096, concurrency=4,
                       weights_bytes=int((gpu + host) * MIB), weights_gpu_bytes=int(gpu * MIB))
    text, apps, pids = _h200("moe-full-lv4")
    assert R.judge(full, apps, pids, plan, "gpu").status == "pass"
    text, apps, pids = _h200("moe-ncpumoe4-lv4")
    rep = parse_llamacpp(text)
    assert rep.layers_offloaded == rep.layers_total  # the layer count does not show it
    v = R.judge(rep, apps, pids, plan, "gpu")
    assert v.status == "fail" and any(f.what == "host weights" for f in v.findings if f.status == "fail")
    assert "CPU_Mapped model buffer size =  3159.17 MiB" in v.message


@pytest.mark.parametrize(("quant", "name", "weights_gib", "kv_tokens"),
                         [("bf16", "bf16", 15.0, 896_912), ("gptq-int4", "gptq-int4", 5.39, 975_664)])
def test_real_h200_vllm_starts_match_the_plan(quant, name, weights_gib, kv_tokens):
    """vLLM 0.26 on an H200 with the flags render writes (dummy weights of the Llama-3.1-8B shape): its
    weights and KV tokens agree with the plan within 1 %, and the verdict passes. nvidia-smi lists
    the engine-core child, not the API server: every process of the container is looked up."""
    from llmfleet.knowledge.planner import PlanRequest, plan, summarize

    p = summarize(plan(PlanRequest(model="llama-3.1-8b-instruct", quant=quant, gpu="h200-141gb", engine="vllm",
                                   context=16384, concurrency=4)))
    rep = parse_vllm(log(f"vllm-0.26.0-h200-llama8b-{name}.log"))
    assert (rep.weights_gib, rep.kv_tokens) == (weights_gib, kv_tokens)
    assert rep.weights_gib * 1024 == pytest.approx(p.weights_per_gpu_bytes / MIB, rel=0.02)
    assert rep.kv_tokens == pytest.approx(p.kv_cache_tokens, rel=0.01)
    apps = parse_compute_apps((LOGS / f"nvidia-smi-compute-apps-vllm-{name}.noheader.csv").read_text())
    container = set(apps.used_mib) | {1}  # the API server (PID 1 in the container's view) holds no GPU memory
    v = R.judge(rep, apps, container, p, "gpu", args_kv_tokens=for_engine("vllm").kv_tokens_asked(list(p.engine_args)))
    assert v.status == "pass", v.message
    assert "KV cache 975,664" in v.message or "KV cache 896,912" in v.message


def test_the_catalogs_load_log_verbosity_holds_against_the_recorded_logs():
    """Every llama.cpp image names whether its build hides the load lines, with a source and a
    confidence; the builds of the llama-cpp-python 0.3.36 tree say -lv 4, and the logs of that tree
    (the lab's CPU build and the H200's CUDA build) show exactly that: nothing at the default
    verbosity, every line at -lv 4."""
    from llmfleet.knowledge import compat

    cat = compat.load_engine_catalog()
    llama = [r for r in cat.images.values() if r.engine == "llamacpp"]
    assert llama and all(r.load_log is not None and r.load_log.source and r.load_log.confidence for r in llama)
    for key in ("llamacpp:vendored-0.3.36-cu118", "llamacpp:lab-cpu"):
        rel = cat.images[key]
        assert rel.load_log.verbosity == 4 and "0.3.36" in rel.load_log.source
    for default, verbose in (("llamacpp-lab-cpu-full-default.log", "llamacpp-lab-cpu-full-lv4.log"),
                             ("llamacpp-0.3.36-h200-full-default.log", "llamacpp-0.3.36-h200-full-lv4.log")):
        assert parse_llamacpp(log(default)).layers_offloaded is None
        assert parse_llamacpp(log(verbose)).unread == ()
