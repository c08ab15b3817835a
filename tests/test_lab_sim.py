"""The nvidia-smi simulator against real nvidia-smi output (tests/data/nvidia-smi, reference H200)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfleet.lab import nvidia_smi_sim as sim
from llmfleet.lab.cards import gpu_sim_config

DATA = Path(__file__).parent / "data" / "nvidia-smi"
H200 = DATA / "h200-580"  # recorded on a real H200
PROBE_FIELDS = "index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version"


def configured(gpu: str, driver: str, rows: list[dict]) -> dict:
    cfg = gpu_sim_config("host", gpu, driver, len(rows))
    for g, r in zip(cfg["gpus"], rows, strict=True):
        g.update(r)
    return cfg


# Each case reproduces the values of one real banner; the simulator must print the same lines.
BANNERS = [
    ("t4-470", "Tesla T4", "470.57.02",
     [dict(pci_bus_id="00000000:00:05.0", temperature_c=49, power_draw_w=28, memory_total_mib=15109,
           persistence=False)]),
    ("p40-470", "Tesla P40", "470.82.00",
     [dict(pci_bus_id=b, temperature_c=t, power_draw_w=p, memory_used_mib=16965, memory_total_mib=22919,
           utilization_pct=100, persistence=False)
      for b, t, p in (("00000000:02:00.0", 56, 192), ("00000000:81:00.0", 39, 182))]),
    ("v100-535", "Tesla V100-SXM2-32GB", "535.183.06",
     [dict(pci_bus_id=b, temperature_c=t, power_draw_w=p)
      for b, t, p in (("00000000:1A:00.0", 40, 43), ("00000000:1C:00.0", 37, 44))]),
    ("rtx4090-550", "NVIDIA GeForce RTX 4090", "550.54.15",
     [dict(pci_bus_id="00000000:05:00.0", temperature_c=29, power_draw_w=17)]),
]


@pytest.mark.parametrize("folder,gpu,driver,rows", BANNERS, ids=[b[0] for b in BANNERS])
def test_banner_matches_real_layout(folder, gpu, driver, rows):
    real = (DATA / folder / "nvidia-smi.txt").read_text().splitlines()
    cfg = configured(gpu, driver, rows)
    ours = sim.render_banner(cfg, "TIMESTAMP").splitlines()
    if real[0].startswith("+"):
        assert not ours[0].startswith("TIMESTAMP")  # R470 prints no timestamp line either
    else:
        real, ours = real[1:], ours[1:]
    # the transcriptions stop after the GPU table; every line they have must match exactly
    assert ours[: len(real)] == real


def test_recorded_h200_output_reproduced():
    cfg = configured("NVIDIA H200", "580.159.04", [dict(
        pci_bus_id="00000000:00:06.0", temperature_c=38, power_draw_w=115, memory_reserved_mib=615,
        uuid="GPU-a860cca5-cc2d-c460-91d7-bdf2cff1b29c", clocks_max_memory_mhz=3201)])
    banner = sim.render_banner(cfg, "Sun Nov 29 09:47:34 2026")
    assert banner == (H200 / "nvidia-smi.txt").read_text()
    fields = ("index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,driver_version,compute_cap,"
              "persistence_mode,power.limit,clocks.max.memory,temperature.gpu,utilization.gpu")
    assert sim.run([f"--query-gpu={fields}", "--format=csv"], cfg, "x") == ((H200 / "query.csv").read_text(), 0)
    noheader = sim.run(["--query-gpu=index,name,memory.total,driver_version,compute_cap",
                        "--format=csv,noheader,nounits"], cfg, "x")
    assert noheader == ((H200 / "query-noheader.csv").read_text(), 0)
    assert sim.run(["--version"], cfg, "x") == ((H200 / "version.txt").read_text(), 0)
    assert sim.run(["-L"], cfg, "x") == ((H200 / "L.txt").read_text(), 0)
    bogus = (H200 / "bogus-field.txt").read_text().split("rc=")
    assert sim.run(["--query-gpu=bogus_field", "--format=csv"], cfg, "x") == (bogus[0], int(bogus[1]))


@pytest.mark.parametrize("driver,has_cc", [("470.256.02", False), ("470", False), ("510.47.03", True),
                                           ("535.183.01", True), ("550", True)])
def test_compute_cap_field_by_driver_branch(driver, has_cc):
    cfg = gpu_sim_config("h", "Tesla T4", driver, 1)
    out, rc = sim.run(["--query-gpu=name,compute_cap", "--format=csv,noheader"], cfg, "x")
    if has_cc:
        assert (out, rc) == ("Tesla T4, 7.5\n", 0)
    else:
        assert (out, rc) == ('Field "compute_cap" is not a valid field to query.\n\n', 2)


def test_r470_answers_like_the_recorded_refusal_and_the_probe_fallback():
    cfg = configured("Tesla T4", "470.57.02", [dict(pci_bus_id="00000000:00:05.0", memory_total_mib=15109)])
    out, rc = sim.run([f"--query-gpu={PROBE_FIELDS},compute_cap", "--format=csv,noheader,nounits"], cfg, "x")
    assert rc == 2 and out.strip() == (DATA / "t4-470" / "compute-cap-refused.txt").read_text().split("rc=")[0].strip()
    out, rc = sim.run([f"--query-gpu={PROBE_FIELDS}", "--format=csv,noheader,nounits"], cfg, "x")
    assert rc == 0
    row = out.strip().split(", ")
    assert row[1] == "Tesla T4" and row[4] == "15109" and row[7] == "470.57.02"
    assert sim.run(["--version"], cfg, "x")[1] == 2  # R470's nvidia-smi has no --version


def test_dead_driver_like_real_message():
    real = (DATA / "driver-not-loaded" / "nvidia-smi.txt").read_text().split("rc=")
    cfg = gpu_sim_config("h", "Tesla T4", "535", 1)
    for argv in ([], ["-L"], [f"--query-gpu={PROBE_FIELDS}", "--format=csv"]):
        out, rc = sim.run(argv, cfg, "x", driver_dead=True)
        assert rc == int(real[1]) == 9
        assert out.strip() == real[0].strip()


@pytest.mark.parametrize("argv,rc", [
    (["--query-gpu=name"], 2),  # --format missing
    (["--query-gpu=name", "--format=xml"], 2),
    (["--bogus"], 2),
    (["-i", "1", "-L"], 0),
])
def test_argument_errors(argv, rc):
    cfg = gpu_sim_config("h", "Tesla P40", "535", 2)
    out, code = sim.run(argv, cfg, "x")
    assert code == rc
    if argv[:2] == ["-i", "1"]:
        assert out.startswith("GPU 1: Tesla P40")


def test_memory_free_is_total_minus_used_and_reserved():
    cfg = gpu_sim_config("h", "Tesla V100-SXM2-32GB", "535", 1)
    total, used, free = sim.run(["--query-gpu=memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"],
                                cfg, "x")[0].strip().split(", ")
    g = cfg["gpus"][0]
    assert int(free) == int(total) - int(used) - g["memory_reserved_mib"]
    assert 0 < g["memory_reserved_mib"] < 300


@pytest.mark.parametrize("driver,cuda", [("470.256.02", "11.4"), ("535.183.01", "12.2"), ("550.127.05", "12.4"),
                                         ("580.95.05", "13.0"), ("535", "12.2")])
def test_cuda_version_in_banner(driver, cuda):
    cfg = gpu_sim_config("h", "Tesla V100-PCIE-16GB", driver, 1)
    assert f"CUDA Version: {cuda}" in sim.render_banner(cfg, "x")


def test_topo_of_one_gpu_reproduces_the_recorded_h200():
    cfg = configured("NVIDIA H200", "580.159.04", [{}])
    out, rc = sim.run(["topo", "-m"], cfg, "x", cpus=16)
    assert rc == 0 and out == (DATA / "topo" / "h200-1gpu-580.txt").read_text()


@pytest.mark.parametrize("gpu, count, pairs", [
    ("Tesla P40", 2, {(0, 1): "PIX"}),  # the lab's gpu-p40-11/12: two PCIe cards on one switch
    ("Tesla P40", 4, {(0, 1): "PIX", (0, 2): "PHB", (2, 3): "PIX"}),
    ("Tesla V100-SXM2-32GB", 4, {(0, 1): "NV2", (1, 3): "NV2"}),
    ("Tesla V100-SXM2-32GB", 8, {(0, 3): "NV2", (0, 4): "SYS", (5, 7): "NV2"}),
])
def test_topo_matrix_parses_like_real_output(gpu, count, pairs):
    from llmfleet.knowledge.preflight import parse_topology

    out, rc = sim.run(["topo", "--matrix"], gpu_sim_config("h", gpu, "535", count), "x")
    links = parse_topology(out)
    assert rc == 0 and len(links) == count * (count - 1)
    for (i, j), kind in pairs.items():
        assert links[(i, j)] == links[(j, i)] == kind


def test_topo_without_matrix_flag_is_refused_and_a_dead_driver_fails():
    cfg = gpu_sim_config("h", "Tesla P40", "535", 2)
    assert sim.run(["topo"], cfg, "x")[1] == 2
    assert sim.run(["topo", "-m"], cfg, "x", driver_dead=True) == (sim.DEAD_DRIVER_MESSAGE, sim.DEAD_DRIVER_RC)


@pytest.mark.parametrize(
    ("argv", "procs", "out", "rc"),
    [
        (["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
         [{"pid": 812, "name": "llama-server", "used_mib": 41}], "812, 41\n", 0),
        (["--query-compute-apps=pid,process_name,used_memory", "--format=csv"],
         [{"pid": 812, "name": "llama-server", "used_mib": 41}],
         "pid, process_name, used_memory [MiB]\n812, llama-server, 41 MiB\n", 0),
        # no engine running: the header only, as the real nvidia-smi prints it
        (["--query-compute-apps=pid,used_memory", "--format=csv"], [], "pid, used_memory [MiB]\n", 0),
        # /proc unreadable: it says so instead of inventing figures
        (["--query-compute-apps=pid,used_memory", "--format=csv"], None, sim.CANNOT_READ_PROCS, 3),
        (["--query-compute-apps=pid,bogus", "--format=csv"], [], 'Field "bogus" is not a valid field to query.\n\n', 2),
        (["--query-compute-apps=pid"], [], "Option --format must be specified when using --query-compute-apps.\n", 2),
    ],
)
def test_compute_apps_from_the_container_processes(argv, procs, out, rc):
    cfg = gpu_sim_config("h", "Tesla V100-SXM2-32GB", "535", 1)
    assert sim.run(argv, cfg, "now", procs=lambda: procs) == (out, rc)


def test_container_processes_reads_only_docker_containers(tmp_path):
    for pid, cg, rss in ((10, "0::/system.slice/docker-abc.scope", 42000), (11, "0::/init.scope", 9000),
                         (12, "0::/docker/def", 0)):
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "cgroup").write_text(cg + "\n")
        (d / "status").write_text(f"Name:\tx\nVmRSS:\t{rss} kB\n")
        (d / "comm").write_text("llama-server\n")
    assert sim.container_processes(str(tmp_path)) == [{"pid": 10, "name": "llama-server", "used_mib": 41}]
    assert sim.container_processes(str(tmp_path / "missing")) is None


# ------------------------------------------------------------------------------------------------
# nvidia-smi -q, dmesg and lspci, and the injected hardware faults (tests/lab/test_gpu_health.py uses them)


def _subsequence(small: list[str], big: list[str]) -> list[str]:
    """The lines of ``small`` not found in ``big`` in the same order (empty: a subsequence)."""
    it = iter(big)
    return [ln for ln in small if not any(ln == b for b in it)]


def test_q_prints_the_recorded_h200_lines():
    cfg = configured("NVIDIA H200", "580.159.04", [dict(
        pci_bus_id="00000000:00:06.0", uuid="GPU-a860cca5-cc2d-c460-91d7-bdf2cff1b29c")])
    out, rc = sim.run(["-q"], cfg, "Sun Nov 29 09:47:34 2026")
    real = (H200 / "q.txt").read_text().splitlines()
    # values the simulator makes up (memory figures, temperature, utilization) aside, every line it prints is
    # the recorded one, in the recorded order
    made_up = ("        Total", "        Reserved", "        Used", "        Free", "        GPU Current Temp",
               "        GPU   ", "        Memory   ")
    ours = [ln for ln in out.splitlines() if not ln.startswith(made_up)]
    assert rc == 0 and _subsequence(ours, real) == []


def _health(cfg: dict, faults: dict | None = None):
    from llmfleet.host.facts import parse_gpu_query
    from llmfleet.host.gpu_health import health_from_sections

    q, _ = sim.run(["-q"], cfg, "now", faults=faults)
    query, _ = sim.run(["--query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,"
                        "driver_version", "--format=csv,noheader,nounits"], cfg, "now", faults=faults)
    gpus, _ = parse_gpu_query(query, [], tuple(PROBE_FIELDS.split(",")))
    dmesg = "source=dmesg\n" + sim.render_dmesg(cfg, faults or {})
    lspci = "source=lspci\n" + sim.render_lspci(cfg, faults or {}, ["-D", "-n", "-d", "10de:"])[0]
    return health_from_sections(q, dmesg, lspci, gpus), gpus


FAULTS = [
    # (fault on GPU 0 of two A10s, driver 550, what the parsed health says)
    ("xid-79", {"xid": [79]}, lambda h: [(e.code, e.gpu_index, e.count) for e in h.xids] == [(79, 0, 1)]),
    ("xid-48-63-64", {"xid": [48, 63, 64]}, lambda h: [e.code for e in h.xids] == [48, 63, 64]),
    ("ecc-volatile", {"ecc_volatile_uncorrectable": 2},
     lambda h: (h.cards[0].ecc_volatile_uncorrectable, h.cards[0].ecc_aggregate_uncorrectable) == (2, 2)),
    ("ecc-aggregate", {"ecc_aggregate_uncorrectable": 5},
     lambda h: (h.cards[0].ecc_volatile_uncorrectable, h.cards[0].ecc_aggregate_uncorrectable) == (0, 5)),
    ("remap-pending", {"remap_pending": True}, lambda h: (h.cards[0].remap_pending, h.cards[1].remap_pending)
     == (True, False)),
    ("remap-failure", {"remap_failure": True}, lambda h: h.cards[0].remap_failure is True),
    ("retired-pending", {"retired_pages_pending": True}, lambda h: h.cards[0].retired_pages_pending is True),
    ("recovery-action-not-printed-before-r570", {"recovery_action": "Reset"},
     lambda h: h.cards[0].recovery_action is None),
    ("pcie-width", {"pcie_width": 4}, lambda h: (h.cards[0].pcie_width_current, h.cards[0].pcie_width_max) == (4, 16)),
    ("pcie-gen-busy", {"pcie_gen": 2, "busy": True},
     lambda h: (h.cards[0].pcie_gen_current, h.cards[0].pcie_gen_max, h.cards[0].idle) == (2, 4, False)),
    ("throttle", {"throttle": ["HW Power Brake Slowdown"]},
     lambda h: h.cards[0].throttle_active == ["HW Power Brake Slowdown"]),
    ("missing", {"missing": True}, lambda h: [(m.pci, m.expected_index) for m in h.missing] == [("0000:18:00.0", 0)]
     and [c.bus_id for c in h.cards] == ["00000000:3B:00.0"] and h.cards[0].index == 0),
]


@pytest.mark.parametrize("fault,check", [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_each_injected_fault_reads_back(fault, check):
    cfg = gpu_sim_config("h", "NVIDIA A10", "550.127.05", 2)
    healthy, _ = _health(cfg)
    assert (healthy.xids, healthy.missing, [c.remap_pending for c in healthy.cards]) == ([], [], [False, False])
    h, _ = _health(cfg, {"0": fault})
    assert check(h), h


def test_recovery_action_is_printed_from_r570():
    cfg = gpu_sim_config("h", "NVIDIA H200", "580", 1)
    h, _ = _health(cfg, {"0": {"recovery_action": "Reset"}})
    assert h.cards[0].recovery_action == "Reset"


def test_a_missing_card_leaves_every_listing_and_the_rest_move_up():
    cfg = gpu_sim_config("h", "Tesla P40", "535", 2)
    faults = {"0": {"missing": True}}
    assert sim.run(["-L"], cfg, "x", faults=faults)[0] == f"GPU 0: Tesla P40 (UUID: {cfg['gpus'][1]['uuid']})\n"
    assert sim.run(["--query-gpu=index,pci.bus_id", "--format=csv,noheader"], cfg, "x", faults=faults) == (
        "0, 00000000:3B:00.0\n", 0)
    q = sim.run(["-q"], cfg, "x", faults=faults)[0]
    assert "Attached GPUs                             : 1" in q and "00000000:18:00.0" not in q
    banner = sim.run([], cfg, "x", faults=faults)[0]
    assert "00000000:18:00.0" not in banner and "00000000:3B:00.0" in banner
    assert sim.render_lspci(cfg, faults, ["-D", "-n", "-d", "10de:"]) == (
        "0000:18:00.0 0302: 10de:1b38 (rev ff)\n0000:3b:00.0 0302: 10de:1b38 (rev a1)\n", 0)


def test_lspci_names_and_the_geforce_audio_function():
    cfg = gpu_sim_config("h", "NVIDIA GeForce RTX 4090", "550", 1)
    assert sim.render_lspci(cfg, {}, []) == ("18:00.0 VGA compatible controller: NVIDIA Corporation Device 2684 "
                                             "(rev a1)\n18:00.1 Audio device: NVIDIA Corporation Device 22ba (rev a1)\n", 0)


def test_dmesg_lines_read_like_the_driver_s():
    cfg = gpu_sim_config("h", "Tesla V100-SXM2-32GB", "535", 2)
    out = sim.render_dmesg(cfg, {"1": {"xid": [79]}}, uptime=1000.0)
    assert out.splitlines()[-2:] == [
        "[  940.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "[  940.000000] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."]
    assert "Xid" not in sim.render_dmesg(cfg, {})


@pytest.mark.parametrize("driver,layout", [
    ("418.67", ["Clocks Throttle Reasons", "Double Bit", "        Pending"]),
    ("470.256.02", ["Clocks Throttle Reasons", "SRAM Uncorrectable      ", "Pending Page Blacklist"]),
    ("535.183.01", ["Clocks Event Reasons", "SRAM Uncorrectable      "]),
    ("580.95.05", ["Clocks Event Reasons", "SRAM Uncorrectable Parity", "GPU Recovery Action"]),
])
def test_q_layout_by_driver_branch_reads_the_same(driver, layout):
    cfg = gpu_sim_config("h", "Tesla V100-SXM2-32GB", driver, 1)
    q = sim.run(["-q"], cfg, "x", faults={"0": {"ecc_volatile_uncorrectable": 1, "retired_pages_pending": True}})[0]
    for words in layout:
        assert words in q, words
    h, _ = _health(cfg, {"0": {"ecc_volatile_uncorrectable": 1, "retired_pages_pending": True}})
    c = h.cards[0]
    assert (c.ecc_volatile_uncorrectable, c.retired_pages_pending, c.idle, c.pcie_width_max) == (1, True, True, 16)


def test_the_lab_helper_writes_only_known_faults():
    from llmfleet.errors import UsageError
    from llmfleet.lab.hosts import gpu_faults_text

    assert gpu_faults_text(None) is None and gpu_faults_text({}) is None
    assert json.loads(gpu_faults_text({1: {"xid": [79], "missing": True}}) or "") == {"1": {"missing": True, "xid": [79]}}
    with pytest.raises(UsageError, match="unknown fault xids; known: xid, missing"):
        gpu_faults_text({0: {"xids": [79]}})
    with pytest.raises(UsageError, match="GPU index"):
        gpu_faults_text({"gpu0": {"xid": [79]}})
