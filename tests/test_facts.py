"""Host facts: the probe document parser on recorded nvidia-smi output, partial and hostile probes,
and the probe script itself run with stand-in tools."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from llmfleet.host.facts import (
    QUERY_FIELDS,
    default_gpu_lookup,
    parse_banner,
    parse_gpu_query,
    parse_probe_document,
    parse_proc_driver,
)
from llmfleet.host.probe import MAX_DOCUMENT, probe_sh
from llmfleet.knowledge.compat import driver_branches

DATA = Path(__file__).parent / "data" / "nvidia-smi"
MARK = "llmfleet-test0123"


def read(rel: str) -> str:
    return (DATA / rel).read_text(encoding="utf-8")


def body_rc(rel: str) -> tuple[str, int]:
    """A recorded file ending in ``rc=N`` -> (output, exit code)."""
    text = read(rel).rstrip("\n")
    head, _, rc = text.rpartition("\nrc=")
    return head.rstrip("\n"), int(rc)


def section(name: str, body: str, rc: int | None = 0, arg: str = "") -> str:
    return f"=={MARK}== begin {name} {arg}\n{body}\n=={MARK}== end {name} rc={rc}\n"


DOCKER_OK = (
    '{"ServerVersion":"27.5.1","Runtimes":{"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}},'
    '"DefaultRuntime":"runc","DockerRootDir":"/var/lib/docker","CDISpecDirs":["/etc/cdi"],'
    '"ClientInfo":{"Version":"27.5.1"}}'
)


def host_doc(*gpu_sections: str, docker: str | None = DOCKER_OK, docker_rc: int = 0, done: bool = True,
             tools: str = "nvidia-smi=/usr/bin/nvidia-smi\nnvidia-container-runtime-hook=/usr/bin/nvidia-container-runtime-hook\n") -> str:
    parts = [section("meta", "probe_version=1\nkernel=6.1.0-18-amd64\nmachine=x86_64\nuid=0\nsystemd=yes\n"
                             "timeout=yes\nroot=/opt/llmfleet"),
             section("tools", tools.rstrip("\n")), *gpu_sections]
    if docker is not None:
        parts.append(section("docker_info", docker, docker_rc))
    parts.append(section("compose_v2", "2.29.7"))
    parts.append(section("nvidia_ctk", "NVIDIA Container Toolkit CLI version 1.17.5\ncommit: f785e908a7f72149f8912617058644fd84e38cde"))
    parts.append(section("meminfo", "MemTotal:       263855140 kB\nMemFree:        1000 kB\nMemAvailable:   251234560 kB"))
    parts.append(section("df", "path=/var/lib/docker\nFilesystem     1024-blocks      Used Available Capacity Mounted on\n"
                               "/dev/nvme0n1p2  1921724432 400000000 1521724432      21% /", arg="docker_root"))
    parts.append(section("ss", "LISTEN 0      4096         0.0.0.0:22        0.0.0.0:*\n"
                               "LISTEN 0      4096       127.0.0.1:8000      0.0.0.0:*"))
    text = "".join(parts)
    return text + (f"=={MARK}== done\n" if done else "")


def parse(text: str, **kw):
    return parse_probe_document(text, MARK, "h1", gpu_lookup=default_gpu_lookup, driver_branches=driver_branches(), **kw)


# ------------------------------------------------------------------------------------------------
# Recorded and transcribed cards


def _card(folder: str) -> list[str]:
    """The GPU sections the probe would print for one recorded card."""
    banner = section("nvidia_smi", read(f"{folder}/nvidia-smi.txt").rstrip("\n"))
    if (DATA / folder / "query.csv").exists():
        return [section("nvidia_query", read(f"{folder}/query.csv").rstrip("\n")), banner]
    refused, rc = body_rc(f"{folder}/compute-cap-refused.txt")
    return [section("nvidia_query", refused, rc),
            section("nvidia_query_nocc", read(f"{folder}/query-nocc.csv").rstrip("\n")), banner]


@pytest.mark.parametrize(
    ("folder", "count", "name", "cc", "cc_source", "mem", "driver", "cuda", "data_center"),
    [
        ("v100-535", 2, "Tesla V100-SXM2-32GB", "7.0", "driver", 32768, "535.183.06", "12.2", True),
        ("t4-470", 1, "Tesla T4", "7.5", "catalog", 15109, "470.57.02", "11.4", True),
        ("p40-470", 2, "Tesla P40", "6.1", "catalog", 22919, "470.82.00", "11.4", True),
        ("rtx4090-550", 1, "NVIDIA GeForce RTX 4090", "8.9", "driver", 24564, "550.54.15", "12.4", False),
    ],
)
def test_recorded_cards_parse(folder, count, name, cc, cc_source, mem, driver, cuda, data_center):
    f = parse(host_doc(*_card(folder)))
    assert [g.name for g in f.gpus] == [name] * count
    assert {g.compute_capability for g in f.gpus} == {cc}
    assert {g.compute_capability_source for g in f.gpus} == {cc_source}
    assert {g.memory_total_mib for g in f.gpus} == {mem}
    assert {g.data_center for g in f.gpus} == {data_center}
    assert f.driver_version == driver
    assert (f.cuda_driver_version, f.cuda_driver_source) == (cuda, "banner")
    assert f.driver_loaded is True
    # R470's refusal of compute_cap is expected, not a problem to report
    assert not [e for e in f.errors if "compute" in e or "nvidia-smi" in e], f.errors


def test_p40_busy_memory_is_read():
    f = parse(host_doc(*_card("p40-470")))
    assert [(g.index, g.memory_used_mib, g.memory_free_mib) for g in f.gpus] == [(0, 16965, 5954), (1, 16965, 5954)]


def test_h200_recorded_query_with_header_units_and_extra_columns():
    errors: list[str] = []
    gpus, drivers = parse_gpu_query(read("h200-580/query.csv"), errors)
    assert errors == []
    assert drivers == ["580.159.04"]
    (g,) = gpus
    assert (g.name, g.memory_total_mib, g.memory_used_mib, g.memory_free_mib, g.compute_capability) == (
        "NVIDIA H200", 143771, 0, 143156, "9.0")
    assert g.uuid == "GPU-a860cca5-cc2d-c460-91d7-bdf2cff1b29c" and g.pci_bus_id == "00000000:00:06.0"


def test_h200_recorded_noheader_query():
    errors: list[str] = []
    gpus, drivers = parse_gpu_query(read("h200-580/query-noheader.csv"), errors,
                                    ("index", "name", "memory.total", "driver_version", "compute_cap"))
    assert errors == [] and drivers == ["580.159.04"]
    assert (gpus[0].name, gpus[0].memory_total_mib, gpus[0].compute_capability) == ("NVIDIA H200", 143771, "9.0")


def test_h200_banner_and_proc_driver():
    assert parse_banner(read("h200-580/nvidia-smi.txt")) == {"driver": "580.159.04", "cuda": "13.0"}
    assert parse_proc_driver(read("h200-580/proc-driver-version.txt")) == "580.159.04"


def test_h200_whole_document_with_catalog_lookup():
    q = read("h200-580/query.csv").splitlines()[1].split(", ")[:9]  # the probe's fields, in its order
    f = parse(host_doc(section("nvidia_query", ", ".join(q).replace(" MiB", "")),
                       section("nvidia_smi", read("h200-580/nvidia-smi.txt"))))
    (g,) = f.gpus
    assert (g.catalog_id, g.data_center, g.compute_capability_source) == ("h200-141gb", True, "driver")
    assert f.cuda_driver_version == "13.0"


def test_unknown_field_answer_names_the_field():
    body, rc = body_rc("h200-580/bogus-field.txt")
    f = parse(host_doc(section("nvidia_query", body, rc)))
    assert f.gpus == []
    assert any('refused a field: \'Field "bogus_field"' in e for e in f.errors), f.errors


# ------------------------------------------------------------------------------------------------
# Partial probes: what was found, and the failure named


def test_driver_not_loaded_is_named():
    body, rc = body_rc("driver-not-loaded/nvidia-smi.txt")
    f = parse(host_doc(section("nvidia_query", body, rc), section("nvidia_query_nocc", body, rc),
                       section("nvidia_smi", body, rc)))
    assert f.gpus == [] and f.driver_loaded is False and f.driver_version is None
    assert any(e.startswith("driver not loaded (nvidia-smi exit 9") for e in f.errors), f.errors
    assert f.docker.server_version == "27.5.1" and f.ram_total_mib == 263855140 // 1024  # the rest is still read


def test_nvidia_smi_missing_is_named():
    f = parse(host_doc(tools="nvidia-smi=\ndocker=/usr/bin/docker"))
    assert f.gpus == [] and f.nvidia_smi is None
    assert "nvidia-smi not found on PATH and no NVIDIA driver loaded" in f.errors
    assert f.compose.v2 == "2.29.7" and f.ports == [22, 8000]


def test_nvidia_smi_missing_but_module_loaded_reads_proc():
    proc = section("proc_driver", read("h200-580/proc-driver-version.txt").rstrip("\n"))
    f = parse(host_doc(proc, tools="nvidia-smi="))
    assert f.driver_version == "580.159.04" and f.driver_loaded is True
    assert f.cuda_driver_version == "13.0" and f.cuda_driver_source == "driver-branch"
    assert "nvidia-smi not found on PATH (the NVIDIA driver module is loaded)" in f.errors
    assert f.driver_kernel_modules == "open"  # "NVIDIA UNIX Open Kernel Module for x86_64"


def test_proprietary_kernel_modules_are_told_apart_from_the_open_ones():
    body = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.06  Release Build  (dvs-builder@U16)  "
    f = parse(host_doc(section("proc_driver", body), tools="nvidia-smi="))
    assert f.driver_kernel_modules == "proprietary"
    # the lab's simulated hosts: open modules from R560, but only on Turing and newer cards
    from llmfleet.lab.nvidia_smi_sim import render_proc_version
    assert "Open Kernel Module" in render_proc_version({"driver_version": "570.133.07", "gpus": [{"compute_cap": "8.0"}]})
    assert "Open" not in render_proc_version({"driver_version": "570.133.07", "gpus": [{"compute_cap": "7.0"}]})


@pytest.mark.parametrize(
    ("body", "rc", "expected"),
    [
        ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?", 1,
         "docker socket refused (daemon not running?)"),
        ("permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock", 1,
         "docker socket permission denied"),
        ("", 124, "docker info timed out"),
    ],
)
def test_docker_failures_are_named(body, rc, expected):
    f = parse(host_doc(*_card("v100-535"), docker=body, docker_rc=rc))
    assert f.docker.error and f.docker.error.startswith(expected), f.docker.error
    assert f.docker.error in f.errors
    assert len(f.gpus) == 2  # the GPUs were still found


def test_docker_cli_missing():
    f = parse(host_doc(*_card("t4-470"), docker=None))
    assert f.docker.error == "docker CLI not found on PATH"


def test_probe_cut_short_keeps_what_it_read():
    f = parse(host_doc(*_card("rtx4090-550"), done=False), rc=255)
    assert len(f.gpus) == 1
    assert any("probe ended early (exit 255)" in e for e in f.errors)


def test_no_output_at_all():
    f = parse("", rc=127, stderr="sh: 1: sh: not found\n")
    assert f.gpus == [] and f.errors == ["probe produced no sections (exit 127): 'sh: 1: sh: not found'"]


# ------------------------------------------------------------------------------------------------
# Wrong or hostile facts: said back, bounded, never a traceback


def test_garbage_from_nvidia_smi():
    junk = "\x1b[31mSegmentation fault\x1b[0m\n\x00\x01\x02 totally, not, csv\n-1, , , , , , , , "
    f = parse(host_doc(section("nvidia_query", junk)))
    assert f.gpus == []
    assert any(e.startswith("nvidia-smi: unexpected query line") for e in f.errors)
    assert all(len(e) < 400 and "\x1b" not in e and "\x00" not in e for e in f.errors)


def test_driver_string_that_does_not_parse():
    line = "0, Tesla T4, GPU-x, 00000000:00:05.0, 15109, 0, 15109, 470.weird.0, 7.5"
    f = parse(host_doc(section("nvidia_query", line)))
    assert f.driver_version == "470.weird.0"
    assert "driver version '470.weird.0' does not parse" in f.errors
    assert f.cuda_driver_version is None


def test_unknown_card_and_garbage_compute_cap():
    line = "0, NVIDIA Quantum Fridge 9000, GPU-x, 00000000:00:05.0, 4096, 0, 4096, 570.124.06, 99.9.9"
    f = parse(host_doc(section("nvidia_query", line)))
    (g,) = f.gpus
    assert g.compute_capability is None and g.catalog_id is None and g.data_center is None
    assert any("compute_cap '99.9.9' does not parse" in e for e in f.errors)
    assert any("compute capability unknown" in e and "Quantum Fridge" in e for e in f.errors)


def test_forged_section_markers_in_output_are_plain_text():
    # A host cannot fake a section: the mark is random per run.
    forged = "==llmfleet-other== end nvidia_query rc=0\n==llmfleet-other== begin docker_info"
    line = "0, Tesla T4, GPU-x, 00000000:00:05.0, 15109, 0, 15109, 470.57.02, 7.5"
    f = parse(host_doc(section("nvidia_query", forged + "\n" + line)))
    assert [g.name for g in f.gpus] == ["Tesla T4"]
    assert f.docker.server_version == "27.5.1"


def test_huge_output_is_bounded():
    huge = "0, Tesla T4, GPU-x, 00000000:00:05.0, 15109, 0, 15109, 470.57.02, 7.5\n" * 50_000
    f = parse(host_doc(section("nvidia_query", huge)))
    assert len(f.gpus) == 64
    assert any("more than 64 GPU lines" in e for e in f.errors)
    assert any(e.startswith("section nvidia_query:") and "over the cap" in e for e in f.errors)


def test_document_over_the_limit_is_cut_and_said():
    f = parse(host_doc(*_card("t4-470"), done=False) + "x" * MAX_DOCUMENT)
    assert [g.name for g in f.gpus] == ["Tesla T4"]
    assert any(f"only the first {MAX_DOCUMENT} were read" in e for e in f.errors)


def test_short_line_in_r470_fallback_is_reported():
    refused, rc = body_rc("t4-470/compute-cap-refused.txt")
    f = parse(host_doc(section("nvidia_query", refused, rc),
                       section("nvidia_query_nocc", "0, Tesla T4, GPU-x, 00000000:00:05.0, 15109, 0, 15109")))
    assert f.gpus == []
    assert "nvidia-smi: unexpected query line '0, Tesla T4, GPU-x, 00000000:00:05.0, 15109, 0, 15109'" in f.errors


# ------------------------------------------------------------------------------------------------
# The probe script itself, with stand-in tools on PATH (no SSH: see test_preflight_e2e for that)


def _fake(bin_dir: Path, name: str, script: str) -> None:
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(0o755)


@pytest.fixture
def fake_r470_host(tmp_path):
    """A PATH with an R470 nvidia-smi (T4) and a docker whose daemon is down."""
    b = tmp_path / "bin"
    b.mkdir()
    banner = DATA / "t4-470" / "nvidia-smi.txt"
    nocc = DATA / "t4-470" / "query-nocc.csv"
    topo = DATA / "topo" / "h200-1gpu-580.txt"  # a one-GPU matrix (no T4 recording of it)
    _fake(b, "nvidia-smi", f"""
case "$*" in
  *compute_cap*) echo 'Field "compute_cap" is not a valid field to query.'; exit 2 ;;
  *--query-gpu*) cat '{nocc}' ;;
  -L) echo 'GPU 0: Tesla T4 (UUID: GPU-00000000-0000-0000-0000-000000000005)' ;;
  "topo -m") cat '{topo}' ;;
  *) cat '{banner}' ;;
esac
""")
    _fake(b, "docker", """
case "$1" in
  info) echo 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?' >&2; exit 1 ;;
  compose) echo '2.29.7' ;;
  *) exit 1 ;;
esac
""")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 1000)
    return b, model


def test_probe_script_r470_fallback_and_refused_docker(fake_r470_host, tmp_path):
    b, model = fake_r470_host
    env = {"PATH": f"{b}:/usr/bin:/bin", "HOME": str(tmp_path)}
    res = subprocess.run(["sh", "-s", "--", MARK, str(tmp_path / "root"), str(model), str(tmp_path / "missing")],
                         input=probe_sh(), capture_output=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    f = parse(res.stdout.decode())
    assert [(g.name, g.compute_capability, g.compute_capability_source) for g in f.gpus] == [
        ("Tesla T4", "7.5", "catalog")]
    assert (f.driver_version, f.cuda_driver_version) == ("470.57.02", "11.4")
    assert f.gpu_topology and f.gpu_topology.startswith("\tGPU0\tCPU Affinity") and "nvidia_topo" in f.probe_seconds
    assert f.docker.error and f.docker.error.startswith("docker socket refused")
    assert f.compose.v2 == "2.29.7"
    by_path = {m.path: m for m in f.models}
    assert by_path[str(model)].kind == "file" and by_path[str(model)].magic == "GGUF"
    assert by_path[str(model)].size_bytes == 1004
    assert by_path[str(tmp_path / "missing")].kind == "missing"
    assert f.disk(f"model:{model}") is not None
    assert f.ram_total_mib and f.kernel == os.uname().release


def test_probe_script_quotes_hostile_model_paths(tmp_path):
    evil = str(tmp_path / "m; touch PWNED; $(touch PWNED2)")
    res = subprocess.run(["sh", "-s", "--", MARK, str(tmp_path), evil], input=probe_sh(), capture_output=True,
                         env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, timeout=60)
    f = parse(res.stdout.decode())
    assert [m.kind for m in f.models] == ["missing"] and f.models[0].path == evil
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()


def test_query_fields_match_the_probe_script():
    script = probe_sh().decode()
    assert "--query-gpu=" + ",".join(QUERY_FIELDS) in script
    assert "--query-gpu=" + ",".join(QUERY_FIELDS[:-1]) + " " in script


@pytest.fixture
def fake_docker_host(tmp_path):
    """A PATH with a docker whose `docker info` lists the compose plugin; every docker call is logged."""
    b = tmp_path / "bin"
    b.mkdir()
    calls = tmp_path / "docker-calls"
    info = DOCKER_OK.replace('"DockerRootDir":"/var/lib/docker"', f'"DockerRootDir":"{tmp_path}/docker-root"').replace(
        '"ClientInfo":{"Version":"27.5.1"}',
        '"ClientInfo":{"Version":"27.5.1","Plugins":[{"Name":"buildx","Version":"v0.20.0"},'
        '{"Name":"compose","Version":"v2.33.1"}]}')
    _fake(b, "docker", f"""
echo "$1 $2" >>'{calls}'
case "$*" in
  *DockerRootDir*) echo '{tmp_path}/docker-root'; exit 0 ;;
esac
case "$1" in
  info) echo '{info}' ;;
  ps) echo '{{"Names":"llmfleet-chat","Image":"llamacpp:b1","State":"running","Ports":"127.0.0.1:8000->8000/tcp","Labels":""}}' ;;
  image) echo '{{"Repository":"llamacpp","Tag":"b1","Digest":"sha256:{"a" * 64}"}}' ;;
  compose) echo '2.0.0' ;;
  *) exit 1 ;;
esac
""")
    _fake(b, "docker-compose", f"echo 'compose-v1' >>'{calls}'\necho 1.29.2\n")
    (tmp_path / "docker-root").mkdir()
    return b, calls


@pytest.mark.parametrize("tmpdir_ok", [True, False], ids=["groups-at-once", "no-temp-folder-one-by-one"])
def test_probe_script_asks_docker_info_once(fake_docker_host, tmp_path, tmpdir_ok):
    # `docker info` names the root folder and the compose plugin: no second `docker info`, no
    # `docker compose version`, no v1 `docker-compose`; without a temporary folder the groups run one
    # after the other, same facts
    b, calls = fake_docker_host
    env = {"PATH": f"{b}:/usr/bin:/bin", "HOME": str(tmp_path),
           "TMPDIR": str(tmp_path) if tmpdir_ok else str(tmp_path / "no" / "such")}
    res = subprocess.run(["sh", "-s", "--", MARK, str(tmp_path / "root")], input=probe_sh(), capture_output=True,
                         env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    f = parse(res.stdout.decode())
    called = sorted(calls.read_text().splitlines())
    assert f.probe_version == 4 and f.docker.server_version == "27.5.1" and f.compose.v2 == "2.33.1"
    assert f.disk("docker_root").path == f"{tmp_path}/docker-root"
    assert {"docker_info", "docker_ps", "docker_images", "meminfo", "df docker_root"} <= set(f.probe_seconds)
    assert not list(tmp_path.glob("tmp*"))  # the probe's temporary folder is gone
    if not tmpdir_ok:  # one by one: the root folder is asked again, and exit statuses are not kept
        assert called == ["compose version", "compose-v1", "image ls", "info --format", "info --format",
                          "ps --no-trunc"]
        return
    assert called == ["image ls", "info --format", "ps --no-trunc"]
    assert not f.docker.error and not f.errors[1:]
    assert [c.name for c in f.containers] == ["llmfleet-chat"] and "llamacpp:b1" in f.images


def test_section_times_and_docker_listings_of_a_refused_engine():
    doc = host_doc(*_card("v100-535"), docker="Cannot connect to the Docker daemon", docker_rc=1)
    doc = doc.replace(f"=={MARK}== end meminfo rc=0\n", f"=={MARK}== end meminfo rc=0 t=0.07\n")
    doc += section("docker_ps", "Cannot connect to the Docker daemon", 1)
    f = parse(doc)
    assert f.probe_seconds == {"meminfo": 0.07}
    assert f.containers == [] and not any(e.startswith("docker ps") for e in f.errors)  # one error: docker's


# ------------------------------------------------------------------------------------------------
# `nvidia-smi topo -m`: the GPU link matrix (tests/data/nvidia-smi/README.md names each file's origin)


@pytest.mark.parametrize("rel, links, kinds", [
    ("topo/h200-1gpu-580.txt", {}, set()),
    ("topo/v100-sxm2-4gpu-nvlink.txt", 12, {"NV2"}),
    ("topo/pcie-2gpu-phb.txt", {(0, 1): "PHB", (1, 0): "PHB"}, {"PHB"}),
    ("topo/pcie-8gpu-sys.txt", 56, {"SYS"}),
], ids=["h200-one-gpu-recorded", "v100-sxm2-nvlink", "pcie-phb", "pcie-8-sys"])
def test_topology_section_from_real_output(rel, links, kinds):
    from llmfleet.knowledge.preflight import parse_topology

    f = parse(host_doc(*_card("v100-535"), section("nvidia_topo", read(rel).rstrip("\n"))))
    assert f.gpu_topology is not None and "\x1b" not in f.gpu_topology, f.errors
    assert f.gpu_topology.lstrip("\t").startswith("GPU0\t")  # the header's escapes are gone
    got = parse_topology(f.gpu_topology)
    if isinstance(links, int):
        assert len(got) == links
    else:
        assert got == links
    assert set(got.values()) == kinds
    assert not any("topo" in e for e in f.errors)


def test_recorded_header_carries_terminal_escapes():
    # why the parser strips them: the raw header's first cell is not "GPU0"
    raw = read("topo/h200-1gpu-580.txt")
    assert raw.startswith("\t\x1b[4mGPU0\t") and "\x1b[0m\n" in raw


@pytest.mark.parametrize("body, rc, needle", [
    (read("driver-not-loaded/nvidia-smi.txt").strip(), 9, "nvidia-smi topo -m failed: driver not loaded"),
    ("", 127, "nvidia-smi topo -m failed: nvidia-smi exit 127"),
    ("", 124, "nvidia-smi topo -m failed: nvidia-smi timed out"),
    ("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", 0,
     'nvidia-smi topo -m printed no GPU matrix: "Invalid combination'),
])
def test_topology_failure_is_an_error_line_not_a_crash(body, rc, needle):
    f = parse(host_doc(*_card("v100-535"), section("nvidia_topo", body, rc)))
    assert f.gpu_topology is None and f.gpus
    assert any(e.startswith(needle) for e in f.errors), f.errors


def test_topology_cut_short_and_absent():
    cut = f"=={MARK}== begin nvidia_topo \n\tGPU0\tGPU1\nGPU0\t X \tPIX"  # no end line: the probe died here
    f = parse(host_doc(*_card("v100-535"), done=False) + cut)
    assert f.gpu_topology is None and "nvidia-smi topo -m was cut short; GPU links unknown" in f.errors
    f = parse(host_doc(*_card("v100-535")))  # an older probe, or no nvidia-smi: no section, no error about it
    assert f.gpu_topology is None and not any("topo" in e for e in f.errors)
    f = parse(host_doc(section("nvidia_topo", "", 127), tools="nvidia-smi="))  # no GPUs: one error says why
    assert f.gpu_topology is None and not any("topo" in e for e in f.errors)


def test_topology_from_facts_drives_the_preflight_check():
    from llmfleet.inventory.services import Service
    from llmfleet.knowledge.preflight import check_service_hosts

    f = parse(host_doc(*_card("v100-535"), section("nvidia_topo", read("topo/v100-sxm2-4gpu-nvlink.txt"))))
    svc = Service(name="big", engine="vllm", model="llama-3.1-70b-instruct", model_path="/srv/m", image="vllm:x",
                  quant="gptq-int4", context=8192, gpus=[0, 1])
    topo = {c.id: c for c in check_service_hosts(svc, {"h1": f}, head="h1")}["topology"]
    assert topo.status == "pass" and "NV2" in topo.message, topo
    f.gpu_topology = None
    topo = {c.id: c for c in check_service_hosts(svc, {"h1": f}, head="h1")}["topology"]
    assert topo.status == "warn" and "unknown" in topo.message


def test_the_probe_and_what_it_starts_run_at_low_priority(fake_docker_host, tmp_path):
    # the engine the probe checks keeps the host's CPU: every command the probe starts is niced by 10
    # more than the probe's caller (renice on the probe's own shell)
    b, calls = fake_docker_host
    nice = tmp_path / "nice-seen"
    docker = b / "docker"
    docker.write_text(docker.read_text().replace(
        "#!/bin/sh\n", f"#!/bin/sh\nawk '{{print $19}}' /proc/$$/stat >>'{nice}'\n", 1))
    env = {"PATH": f"{b}:/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    caller = os.getpriority(os.PRIO_PROCESS, 0)
    res = subprocess.run(["sh", "-s", "--", MARK, str(tmp_path / "root")], input=probe_sh(), capture_output=True,
                         env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    seen = {int(v) for v in nice.read_text().split()}
    assert seen == {min(caller + 10, 19)}
    assert parse(res.stdout.decode()).docker.server_version == "27.5.1"  # the probe itself still works
