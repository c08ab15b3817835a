"""End-to-end: the CUDA 11.8 llama.cpp image (dockerfiles/llamacpp-cu118, built by `invoke lab.setup
--cu118`) deployed on the lab's T4 host, which runs driver 470.256.02 (CUDA 11.4).

Preflight there says why it runs (CUDA 11.x minor-version compatibility from 450.80.02, SASS for sm_75)
and why a CUDA 12 image does not; the deploy's health check proves the image, its entrypoint and the
flags the planner gives it with the real server. The lab has no GPU, so ggml-cuda finds no driver
library and the server runs on its CPU backend, as it would on a host whose driver is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmfleet.images import lock as images
from llmfleet.inventory.ansible import settings_for
from llmfleet.lab.setup import CU118_KEY
from llmfleet.release.deploy import DeployOptions, deploy_host
from llmfleet.release.preflight import preflight_host

pytestmark = pytest.mark.lab

HOST = "gpu-t4-01"
SERVICE = "tiny-cu118"


def _service(image: str) -> dict:
    return {"name": SERVICE, "engine": "llamacpp", "model": "tiny-qwen2",
            "model_path": "/srv/models/tiny-qwen2-gguf/tiny-qwen2.gguf", "image": image, "port": 8010,
            "context": 512, "concurrency": 1, "served_name": "tiny-qwen2",
            "health": {"load_timeout_s": 90, "stage_timeout_s": 30, "min_tokps": 2, "max_tokens": 32},
            # the runtime image has no curl for an image-side healthcheck: the deploy probes the port
            "compose_overrides": {"healthcheck": {"test": ["NONE"]}}}


@pytest.fixture(scope="module")
def t4(request):
    # Asked before the lab itself, so a machine without the image skips without booting a lab.
    from tests.lab.conftest import ROOT

    lock_path = ROOT / ".lab" / "images.lock"
    entry = images.load_lock(lock_path).get(CU118_KEY) if lock_path.exists() else None
    if entry is None or not entry.digest:
        pytest.skip(f"{CU118_KEY} is not built and pinned in {lock_path}: run `invoke lab.setup --cu118` "
                    "(a long nvcc build; `--cu118-archs 75-real` for the T4 alone; figures in docs/images.md)")
    lab = request.getfixturevalue("lab")
    lab.ensure_hosts(HOST)
    host_vars = Path(lab.inventory_path) / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / f"{HOST}.yml").write_text(yaml.safe_dump({"llmfleet_services": [_service(CU118_KEY)]}))
    yield lab
    (host_vars / f"{HOST}.yml").unlink()


def _preflight(lab):
    host = lab.inventory().hosts[HOST]
    lock = images.load_lock(images.images_lock_path(host.vars, lab.inventory_path, None))
    return preflight_host(host, settings_for(host), lock=lock, config=lab.config)


def test_preflight_explains_why_cuda_11_8_runs_on_r470(t4):
    found, (report,) = _preflight(t4)
    assert found.driver_version == "470.256.02" and found.cuda_driver_version == "11.4"
    checks = {c.id: c for c in report.checks}
    assert report.ok, [c for c in report.checks if c.status == "fail"]
    driver = checks["cuda-driver"]
    assert driver.status == "warn"
    for said in ("minor-version compatibility", "CUDA 11.x from driver 450.80.02", "SASS for sm_75",
                 "sets no NVIDIA_REQUIRE_CUDA"):
        assert said in driver.message, driver.message
    # the archs preflight judged come from the built binary, recorded by images.inspect
    arch = checks["arch"]
    assert arch.status == "pass" and "SASS for sm_75" in arch.message


def test_deploys_and_answers_end_to_end_on_the_cpu_backend(t4, tmp_path):
    config = dict(t4.config, audit_log=str(tmp_path / "audit.jsonl"))
    lines: list[str] = []
    o = deploy_host(t4.inventory_path, HOST, config=config, options=DeployOptions(who="tester", message="cu118"),
                    log=lines.append)
    assert o.result == "deployed", (o.reason, lines[-20:])
    h = o.health[SERVICE]
    assert h["result"] == "healthy" and h["decode_tokps"] > 0
    assert [s["name"] for s in h["stages"]] == ["unit", "container", "health", "models", "residency", "completion"]
    # no driver library in the lab: ggml-cuda does not load (silently, in a release build) and the server
    # runs on the CPU backend it loaded beside it. The serving process's own memory map says which
    # backend libraries it loaded (this build logs backend loading only at verbosity 4, from a log
    # thread whose last lines a short-lived `--list-devices` run may exit before printing).
    logs = t4.exec(HOST, ["docker", "logs", f"llmfleet-{SERVICE}"], check=False)
    assert "loaded CUDA backend" not in logs.stdout + logs.stderr
    pid = t4.exec(HOST, ["docker", "inspect", "-f", "{{.State.Pid}}", f"llmfleet-{SERVICE}"]).stdout.strip()
    maps = t4.exec(HOST, ["cat", f"/proc/{pid}/maps"]).stdout
    loaded = {line.split()[-1].rsplit("/", 1)[-1] for line in maps.splitlines() if ".so" in line}
    assert any(name.startswith("libggml-cpu") for name in loaded), sorted(loaded)
    assert not any(name.startswith("libggml-cuda") for name in loaded), sorted(loaded)
    probe = t4.exec(HOST, ["docker", "exec", f"llmfleet-{SERVICE}", "/app/llama-server", "-lv", "4", "--list-devices"],
                    check=False)
    text = probe.stdout + probe.stderr
    assert "loaded CUDA backend" not in text and "CUDA0" not in text, text[-2000:]
    digest = images.load_lock(t4.lock_path).get(CU118_KEY).digest
    image = t4.exec(HOST, ["docker", "inspect", "-f", "{{.Image}} {{.Config.Image}}", f"llmfleet-{SERVICE}"]).stdout
    assert digest in image


def test_inspection_reads_the_built_archs_from_the_binary(t4):
    """What the lab lock records (archs_source: inspected) is read from libggml-cuda.so in the image, and
    is what the build was asked for (the image's label; the catalog's list unless --cu118-archs)."""
    from llmfleet.images import fatbin
    from llmfleet.images import inspect as ins
    from llmfleet.images.lint import parse_arch_list
    from llmfleet.knowledge.compat import load_engine_catalog
    from llmfleet.lab import docker
    from llmfleet.lab import images as lab_images

    ref = lab_images.lab_image(lab_images.CU118)
    result = ins.inspect_image(CU118_KEY, ref)
    assert result.cuda == load_engine_catalog().release(CU118_KEY).cuda == "11.8.89"
    asked = ins.parse_config(docker.out(ins.config_argv(ref)[1:]))["labels"]["io.llmfleet.cuda-architectures"]
    sass, ptx = parse_arch_list("CMAKE_CUDA_ARCHITECTURES", asked)
    assert result.archs == tuple(fatbin.lock_archs(sass, ptx)), (asked, result.archs)
    assert "7.5" in result.archs or "7.5+PTX" in result.archs
    assert any(f.endswith("libggml-cuda.so") for f in result.files), result.files
    assert result.engine_version
    locked = images.load_lock(t4.lock_path).get(CU118_KEY)
    assert locked.archs_source == "inspected" and tuple(locked.archs) == result.archs


def test_fatbin_reader_agrees_with_cuobjdump(t4, tmp_path):
    """The project's ELF fatbin reader and NVIDIA's cuobjdump (from the toolkit stage) list the same SASS
    and PTX architectures in the image's libggml-cuda.so."""
    import subprocess

    from llmfleet.images import fatbin
    from llmfleet.lab import images as lab_images

    manifest = lab_images.load_manifest()
    toolkit = manifest.get("cu118-toolkit", {}).get("ref")
    if not toolkit or subprocess.run(["docker", "image", "inspect", toolkit], capture_output=True).returncode:
        pytest.skip("the CUDA 11.8 toolkit image is not here (built by `invoke lab.setup --cu118`)")
    ref = lab_images.lab_image(lab_images.CU118)
    cid = subprocess.run(["docker", "create", ref], capture_output=True, text=True, check=True).stdout.strip()
    try:
        subprocess.run(["docker", "cp", f"{cid}:/app/libggml-cuda.so", str(tmp_path / "libggml-cuda.so")],
                       check=True, capture_output=True)
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    ours = fatbin.fatbin_archs((tmp_path / "libggml-cuda.so").read_bytes())
    listing = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{tmp_path}:/x:ro", toolkit, "sh",
                              "-c", "cuobjdump --list-elf /x/libggml-cuda.so; cuobjdump --list-ptx /x/libggml-cuda.so"],
                             capture_output=True, text=True, timeout=300, check=True).stdout
    assert fatbin.parse_cuobjdump(listing) == ours, listing[-2000:]
    assert "7.5" in ours[0]
