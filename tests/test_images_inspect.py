"""Reading what an image carries: the ELF fatbin reader, cuobjdump's listing, torch's arch flags,
the inspection flow (recorded docker output through a fake runner), and preflight preferring the
inspected facts."""

from __future__ import annotations

import io
import json
import struct
import tarfile

import pytest

from llmfleet.images import fatbin
from llmfleet.images import inspect as ins
from llmfleet.images.lock import ImageRef, LockedImage, parse_lock, render_lock
from llmfleet.knowledge import compat
from llmfleet.knowledge.preflight import release_for

CAT = compat.load_engine_catalog()


# ------------------------------------------------------------------------------------------------
# A small ELF written here: one .nv_fatbin section with two containers (what nvcc links into a
# library built for several architectures), plus an unrelated section.


def _entry(kind: int, sm: int, payload: bytes = b"") -> bytes:
    payload = payload or (b"\x7fELF cubin" if kind == 2 else b".version 8.0\n.target sm_%d\n" % sm)
    payload += b"\0" * (-len(payload) % 8)
    header = struct.pack("<HHIQ", kind, 0x0101, 64, len(payload))
    header += struct.pack("<IIII", 0, len(payload), 0, sm)  # ..., sm_version at offset 28
    header += b"\0" * (64 - len(header))
    return header + payload


def _container(entries: list[tuple[int, int]]) -> bytes:
    body = b"".join(_entry(k, sm) for k, sm in entries)
    return struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body)) + body


def make_elf(sections: dict[bytes, bytes]) -> bytes:
    names = b"\0" + b"".join(n + b"\0" for n in sections) + b".shstrtab\0"
    body = b""
    headers = [b"\0" * 64]  # section 0 is empty
    offset = 64
    name_off = 1
    for name, data in sections.items():
        headers.append(struct.pack("<IIQQQQIIQQ", name_off, 1, 0, 0, offset + len(body), len(data), 0, 0, 8, 0))
        body += data + b"\0" * (-len(data) % 8)
        name_off += len(name) + 1
    headers.append(struct.pack("<IIQQQQIIQQ", name_off, 3, 0, 0, offset + len(body), len(names), 0, 0, 1, 0))
    body += names + b"\0" * (-len(names) % 8)
    shoff = offset + len(body)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    ehdr = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(headers),
                               len(headers) - 1)
    return ehdr + body + b"".join(headers)


GGML_LIKE = make_elf({
    b".text": b"\x90" * 32,
    # llama.cpp's default CUDA 12 build: PTX for 5.0/6.1/7.0/7.5/8.0/9.0, SASS for 8.6/8.9
    # (ggml/src/ggml-cuda/CMakeLists.txt), split over two containers as two object files would be
    b".nv_fatbin": _container([(1, 50), (1, 61), (1, 70), (2, 86)]) + b"\0" * 8
    + _container([(1, 75), (1, 80), (2, 89), (1, 90)]),
})


def test_fatbin_reader_lists_sass_and_ptx_of_every_container():
    sass, ptx = fatbin.fatbin_archs(GGML_LIKE)
    assert sass == ["8.6", "8.9"]
    assert ptx == ["5.0", "6.1", "7.0", "7.5", "8.0", "9.0"]
    assert fatbin.lock_archs(sass, ptx) == ["8.6", "8.9", "5.0-virtual", "6.1-virtual", "7.0-virtual",
                                            "7.5-virtual", "8.0-virtual", "9.0-virtual"]


def test_an_elf_without_fatbin_has_no_archs_and_garbage_is_not_elf():
    assert fatbin.fatbin_archs(make_elf({b".text": b"\x90" * 8})) == ([], [])
    with pytest.raises(fatbin.NotElf):
        fatbin.fatbin_archs(b"#!/bin/sh\necho hi\n")
    with pytest.raises(fatbin.NotElf):
        fatbin.fatbin_archs(GGML_LIKE[:80])  # section table cut off


def test_a_corrupt_entry_stops_that_container_without_raising():
    blob = _container([(2, 70)]) + struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, 64) + b"\xff" * 64
    assert fatbin.fatbin_entries(blob) == [(2, 70)]


def test_cuobjdump_listing_is_parsed():
    # the form of `cuobjdump --list-elf` / `--list-ptx` lines (one line per embedded file)
    text = """ELF file    1: libggml-cuda.1.sm_86.cubin
ELF file    2: libggml-cuda.2.sm_89.cubin
ELF file    3: libggml-cuda.3.sm_120a.cubin
PTX file    1: libggml-cuda.1.sm_50.ptx
PTX file    2: libggml-cuda.2.sm_90.ptx
"""
    assert fatbin.parse_cuobjdump(text) == (["8.6", "8.9", "12.0a"], ["5.0", "9.0"])


def test_torch_arch_flags_become_lock_archs():
    # torch.cuda.get_arch_list() of torch 2.8.0+cu129, as recorded in a public build note:
    # ['sm_70', 'sm_75', 'sm_80', 'sm_86', 'sm_90', 'sm_100', 'sm_120', 'compute_120']
    flags = "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120"
    assert ins.torch_archs_from_flags(flags) == ("7.0", "7.5", "8.0", "8.6", "9.0", "10.0", "12.0+PTX")
    assert ins.torch_archs_from_flags(None) == ()


@pytest.mark.parametrize(("text", "version"), [
    ("version: 5000 (a1b2c3d)\nbuilt with cc (GCC) 12.2.0 for x86_64-linux-gnu\n", "b5000 (a1b2c3d)"),
    ("version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux x86_64\n",
     "0.5.0-dev (build 1, commit 0c1e570)"),
    ("ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n", None),
])
def test_llama_server_version(text, version):
    assert ins.parse_llama_version(text) == version


# ------------------------------------------------------------------------------------------------
# The flow, with recorded docker output


class FakeDocker:
    def __init__(self, config: dict, outputs: dict[str, tuple[int, bytes, bytes]]):
        self.config = config
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], timeout: float) -> tuple[int, bytes, bytes]:
        self.calls.append(argv)
        if argv[1:3] == ["image", "inspect"]:
            return 0, json.dumps(self.config).encode(), b""
        for word, out in self.outputs.items():
            if word in argv:
                return out
        return 0, b"", b""


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_inspecting_a_llamacpp_image_reads_its_cuda_library():
    docker = FakeDocker(
        {"Entrypoint": ["/app/llama-server"], "Env": ["PATH=/usr/bin", "CUDA_VERSION=12.8.1"]},
        {"create": (0, b"c0ffee\n", b""),
         "cp": (0, _tar({"app/llama-server": make_elf({b".text": b"\x90" * 8}), "app/libggml-cuda.so": GGML_LIKE,
                         "app/README.md": b"not elf"}), b""),
         "--version": (0, b"", b"version: 6123 (deadbee)\n")},
    )
    r = ins.inspect_image("llamacpp:server-cuda-12.8", "ghcr.io/ggml-org/llama.cpp@sha256:" + "ab" * 32,
                          runner=docker)
    assert r.cuda == "12.8.1" and r.engine_version == "b6123 (deadbee)"
    assert r.require_cuda is None  # this image's config sets no NVIDIA_REQUIRE_CUDA
    assert r.archs == ("8.6", "8.9", "5.0-virtual", "6.1-virtual", "7.0-virtual", "7.5-virtual", "8.0-virtual",
                       "9.0-virtual")
    assert "app/libggml-cuda.so" in r.files
    assert ["docker", "cp", "c0ffee:/app", "-"] in docker.calls
    assert ["docker", "rm", "-f", "c0ffee"] in docker.calls  # the created container is removed
    assert all("--gpus" not in c for c in docker.calls)


VLLM_PROBE_OUT = (
    "WARNING: something noisy on stdout\n"
    + ins.MARK + json.dumps({
        "torch": "2.7.1+cu128", "torch_cuda": "12.8",
        # torch 2.7 cu128: TORCH_CUDA_ARCH_LIST 7.5;8.0;8.6;9.0;10.0;12.0+PTX (no sm_70)
        "torch_arch_flags": "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120",
        "vllm": "0.10.1.1", "engine_libs": ["/usr/local/lib/python3.12/dist-packages/vllm/_C.abi3.so"],
        "engine_sass": ["7.0", "7.5", "8.0", "8.9", "9.0", "10.0", "12.0"], "engine_ptx": [],
    }) + "\n"
)


def test_inspecting_a_vllm_image_and_preflight_prefers_the_inspected_facts():
    docker = FakeDocker({"Env": ["CUDA_VERSION=12.8.1"]}, {"python3": (0, VLLM_PROBE_OUT.encode(), b"")})
    r = ins.inspect_image("vllm:0.10.1.1", "docker.io/vllm/vllm-openai@sha256:" + "cd" * 32, runner=docker)
    assert (r.torch, r.torch_cuda, r.engine_version) == ("2.7.1+cu128", "12.8", "0.10.1.1")
    assert r.torch_archs == ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0+PTX")
    run = next(c for c in docker.calls if "python3" in c)
    assert run[:6] == ["docker", "run", "--rm", "--network", "none", "--entrypoint"]

    entry = LockedImage("vllm:0.10.1.1", "docker.io/vllm/vllm-openai", "sha256:" + "cd" * 32, "v0.10.1.1",
                        "12.8.1", ("7.0",), archs_source="catalog")
    inspected = ins.apply(entry, r)
    assert inspected.archs_source == "inspected" and inspected.torch == "2.7.1+cu128"
    # the lock writes and reads it back unchanged
    from llmfleet.images.lock import ImageLock
    back = parse_lock(render_lock(ImageLock({entry.key: inspected}))).get(entry.key)
    assert back == inspected

    ref = ImageRef(key=entry.key, repository=entry.repository, digest=entry.digest, tag=entry.tag, pinned=True,
                   upstream_repository=entry.repository, cuda=back.cuda, archs=back.archs, torch=back.torch,
                   torch_cuda=back.torch_cuda, torch_archs=back.torch_archs, archs_source=back.archs_source)
    rel, _ = release_for(ref, CAT)
    assert rel.facts_source == "inspected" and rel.torch.confidence == "H"
    v100 = compat.check_architecture(rel, "Tesla V100-SXM2-32GB", "7.0")
    assert v100.status == "fail" and "inspected from the image" in v100.message
    assert "torch 2.7.1+cu128," in v100.message
    t4 = compat.check_architecture(rel, "Tesla T4", "7.5")
    assert t4.status == "pass" and "inspected from the image" in t4.message


def test_the_image_nvidia_require_cuda_is_read_kept_in_the_lock_and_judged():
    """NVIDIA_REQUIRE_CUDA is read from the image's config, kept in images.lock, and preflight judges it as
    the container toolkit does: a GeForce card on a driver below the image's CUDA is refused."""
    require = ("cuda>=12.8 brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536 "
               "brand=tesla,driver>=550,driver<551 brand=nvidia,driver>=550,driver<551")
    docker = FakeDocker({"Env": ["CUDA_VERSION=12.8.1", "NVIDIA_REQUIRE_CUDA=" + require]},
                        {"python3": (0, VLLM_PROBE_OUT.encode(), b"")})
    r = ins.inspect_image("vllm:0.10.1.1", "docker.io/vllm/vllm-openai@sha256:" + "cd" * 32, runner=docker)
    assert r.require_cuda == require and r.to_dict()["require_cuda"] == require
    entry = LockedImage("vllm:0.10.1.1", "docker.io/vllm/vllm-openai", "sha256:" + "cd" * 32, "v0.10.1.1", "12.8.1")
    from llmfleet.images.lock import ImageLock
    back = parse_lock(render_lock(ImageLock({entry.key: ins.apply(entry, r)}))).get(entry.key)
    assert back.require_cuda == require
    ref = ImageRef(key=entry.key, repository=entry.repository, digest=entry.digest, tag=entry.tag, pinned=True,
                   upstream_repository=entry.repository, cuda=back.cuda, archs=back.archs, torch=back.torch,
                   torch_cuda=back.torch_cuda, torch_archs=back.torch_archs, archs_source=back.archs_source,
                   require_cuda=back.require_cuda)
    rel, _ = release_for(ref, CAT)
    assert rel.require_cuda == require
    host = {"driver": "550.54.15", "cuda_driver": "12.4", "cc": "8.9", "toolkit_version": "1.17.8", "runtimes": ["runc"]}
    v = compat.check_cuda_driver(rel, CAT, gpu_name="NVIDIA GeForce RTX 4090", data_center=False, **host)
    assert v.status == "fail" and "refuses to start" in v.message and "inspected from the image" in v.message
    v = compat.check_cuda_driver(rel, CAT, gpu_name="NVIDIA A100-SXM4-80GB", data_center=True,
                                 **{**host, "cc": "8.0"})
    assert v.status == "warn" and "admits it through 'brand=" in v.message, v


def test_an_image_that_is_not_here_is_a_clear_failure():
    from llmfleet.errors import CheckFailed

    def missing(argv, timeout):
        return 1, b"", b"Error response from daemon: No such image: x\n"

    with pytest.raises(CheckFailed, match="is not here .*pull it first"):
        ins.inspect_image("vllm:0.9.2", "x", runner=missing)


def test_the_probe_script_carries_the_fatbin_reader_and_is_valid_python():
    src = ins.vllm_probe_script()
    compile(src, "<probe>", "exec")
    assert "def fatbin_archs" in src and ins.MARK in src


def test_recorded_cuobjdump_and_torch_flags_of_a_real_wheel():
    """Recorded on an H200 host (tests/data/cuobjdump/README.md): the torch 2.11.0+cu130 wheel has no
    sm_70 and no PTX, which is why vllm:0.20.0 cannot run on a V100."""
    from pathlib import Path

    data = Path(__file__).parent / "data" / "cuobjdump"
    sass, ptx = fatbin.parse_cuobjdump((data / "libtorch_cuda.list-elf.txt").read_text())
    assert sass == ["7.5", "8.0", "8.6", "9.0", "10.0"] and ptx == []
    version, cuda, *flags = (data / "torch-2.11.0-cu130-arch-flags.txt").read_text().split()
    assert (version, cuda) == ("2.11.0+cu130", "13.0")
    archs = ins.torch_archs_from_flags(" ".join(flags))
    assert archs == tuple(CAT.images["vllm:0.20.0"].torch.archs)
    assert "7.0" not in archs


def test_the_volta_build_checks_torch_arch_flags_that_exist_without_a_gpu():
    """torch.cuda.get_arch_list() returns [] when no GPU is visible (measured: torch 2.11.0+cu130 with
    CUDA_VISIBLE_DEVICES= gives `False [] 'sm_75 sm_80 sm_86 sm_90 sm_100 sm_120'` for
    is_available(), get_arch_list(), _cuda_getArchFlags()): a `docker build` has no GPU, so the
    Dockerfile's sm_70 check must read the compiled flags, as images.inspect does."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "dockerfiles" / "vllm-volta" / "Dockerfile").read_text()
    assert "get_arch_list()" not in text
    assert "_cuda_getArchFlags()" in text and "_cuda_getArchFlags" in ins.vllm_probe_script()


class _Client:
    def __init__(self, digest: str):
        self.digest = digest

    def resolve(self, ref):
        return self.digest


def test_re_pinning_the_same_digest_keeps_what_was_inspected_and_a_new_digest_drops_it(tmp_path):
    from llmfleet.images.lock import ImageLock, PinSpec, load_lock, pin, write_lock

    d1, d2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    path = tmp_path / "images.lock"
    inspected = LockedImage("vllm:0.19.1", "docker.io/vllm/vllm-openai", d1, "v0.19.1", "12.9.1", ("7.0", "8.0"),
                            torch="2.10.0+cu129", torch_cuda="12.9", torch_archs=("7.0", "8.0"),
                            archs_source="inspected", engine_version="0.19.1")
    write_lock(ImageLock({inspected.key: inspected}), path)
    spec = PinSpec(key="vllm:0.19.1", ref="docker.io/vllm/vllm-openai:v0.19.1", cuda="12.9.1", archs=("7.0",),
                   torch="2.10.0", torch_cuda="12.9", torch_archs=("7.0",))
    pin([spec], _Client(d1), path)
    e = load_lock(path).get("vllm:0.19.1")
    assert (e.archs_source, e.torch, e.engine_version) == ("inspected", "2.10.0+cu129", "0.19.1")
    pin([spec], _Client(d2), path)  # other bytes: the catalog's facts until inspected again
    e = load_lock(path).get("vllm:0.19.1")
    assert (e.archs_source, e.torch, e.archs, e.engine_version) == ("catalog", "2.10.0", ("7.0",), None)


def test_a_bad_archs_source_is_a_one_line_error():
    from llmfleet.errors import UsageError

    text = ("images:\n  vllm:0.19.1:\n    repository: docker.io/vllm/vllm-openai\n    digest: null\n"
            "    archs_source: guessed\n")
    with pytest.raises(UsageError, match="archs_source must be catalog or inspected"):
        parse_lock(text)


def test_inspect_a_key_the_lock_does_not_have_is_a_usage_error(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from llmfleet.images.lock import ImageLock, write_lock

    write_lock(ImageLock({}), tmp_path / "images.lock")
    res = subprocess.run([sys.executable, "-m", "invoke", "images.inspect", "vllm:0.19.1", "--lock",
                          str(tmp_path / "images.lock")], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "no entry 'vllm:0.19.1'" in res.stderr + res.stdout and "Traceback" not in res.stderr
