"""The CUDA 11.8 llama.cpp image (dockerfiles/llamacpp-cu118): its Dockerfile and build script agree
with the catalog entry preflight judges it by, the compile container is run as intended, and the image's
CUDA is read from its label (it deliberately sets no CUDA_VERSION)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from llmfleet.images import inspect as ins
from llmfleet.images.lint import lint, parse_arch_list, profile_for
from llmfleet.lab import images, setup

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "dockerfiles" / "llamacpp-cu118"
DOCKERFILE = (FOLDER / "Dockerfile").read_text()
SCRIPT = (FOLDER / "build-llama-server.sh").read_text()
CATALOG = yaml.safe_load((REPO / "src/llmfleet/knowledge/catalog/engines.yaml").read_text())["images"]
KEY = setup.CU118_KEY


def test_the_lab_pins_it_under_its_catalog_key():
    assert KEY == f"llamacpp:vendored-{images.LLAMA_CPP_PYTHON_VERSION}-cu118"
    rel = CATALOG[KEY]
    assert not rel["cpu"] and rel["engine"] == "llamacpp"
    assert any(p.key == KEY and p.image == images.CU118 for p in setup.PINS)


def test_script_architectures_are_the_catalogs():
    m = re.search(r'archs=\$\{CUDA_ARCHITECTURES:-"([^"]+)"\}', SCRIPT)
    assert m, "build-llama-server.sh names its default CMAKE_CUDA_ARCHITECTURES"
    sass, ptx = parse_arch_list("CMAKE_CUDA_ARCHITECTURES", m.group(1))
    kernels = CATALOG[KEY]["kernels"]
    assert (sorted(sass), sorted(ptx)) == (sorted(kernels["sass"]), sorted(kernels["ptx"]))
    # the Dockerfile's ARG (the runtime image's label) and the lab's default say the same
    assert f'ARG CUDA_ARCHITECTURES="{m.group(1)}"' in DOCKERFILE
    assert 'io.llmfleet.cuda-architectures="${CUDA_ARCHITECTURES}"' in DOCKERFILE
    assert images.CU118_ARCHS == m.group(1)


def test_toolkit_version_is_the_catalogs_cuda():
    cuda = CATALOG[KEY]["cuda"]
    assert f"nvidia-cuda-toolkit={cuda}~" in DOCKERFILE
    assert f'io.llmfleet.cuda-version="{cuda}"' in DOCKERFILE
    assert f"libcudart11.0={cuda}~" in DOCKERFILE


def test_the_runtime_stage_sets_no_cuda_requirement_for_the_nvidia_runtime():
    """CUDA_VERSION without NVIDIA_REQUIRE_CUDA makes the NVIDIA runtime require cuda>=11.8 of the driver
    (nvidia-container-toolkit internal/config/image/cuda_image.go, IsLegacy): an R470 host would refuse it."""
    final = DOCKERFILE.rsplit("\nFROM ", 1)[1]
    env_lines = [ln for ln in final.splitlines() if ln.startswith("ENV ")]
    assert not any("CUDA_VERSION" in ln or "NVIDIA_REQUIRE" in ln for ln in env_lines)
    assert CATALOG[KEY]["nvidia_require_cuda"] is False
    # nothing of the toolkit in the runtime stage
    assert "nvidia-cuda-toolkit" not in final and "g++" not in final


def test_the_dockerfile_passes_the_local_lint_profile():
    assert profile_for(FOLDER / "Dockerfile") == "local"
    assert lint(DOCKERFILE, "Dockerfile", "local") == []


def test_apt_sources_take_the_machines_mirror():
    text = (FOLDER / images.CU118_SOURCES).read_text()
    assert images.MIRROR_PLACEHOLDER in text and "Components: contrib non-free" in text
    assert "http" not in text  # no archive named in the repository


def test_compile_container_argv():
    argv = images.cu118_run_argv("llmfleet-lab/cu118-toolkit:abc", Path("/c/src/sd.tar.gz"),
                                 Path("/r/build-llama-server.sh"), Path("/c/out/k"), Path("/c/ccache-cu118"), 2, None)
    assert argv[:4] == ["run", "--rm", "--network", "none"]
    assert "/c/src/sd.tar.gz:/src/sd.tar.gz:ro" in argv and "/c/ccache-cu118:/ccache" in argv
    assert "CMAKE_CUDA_COMPILER_LAUNCHER=ccache" in argv and "--user" not in argv
    assert f"CUDA_ARCHITECTURES={images.CU118_ARCHS}" in argv
    i = argv.index("llmfleet-lab/cu118-toolkit:abc")
    assert argv[i + 1:] == ["nice", "-n", "10", "sh", "/src/build-llama-server.sh", "/src/sd.tar.gz", "/out/app", "2"]
    as_user = images.cu118_run_argv("t", Path("/s.tgz"), Path("/b.sh"), Path("/o"), Path("/cc"), 1, "1000:1000")
    assert as_user[as_user.index("--user") + 1] == "1000:1000"


@pytest.mark.parametrize(
    ("env", "labels", "cuda"),
    [
        ({"CUDA_VERSION": "12.2.2"}, {}, "12.2.2"),
        ({}, {ins.CUDA_LABEL: "11.8.89"}, "11.8.89"),
        ({"CUDA_VERSION": "12.8.1"}, {ins.CUDA_LABEL: "11.8.89"}, "12.8.1"),
        ({}, {ins.CUDA_LABEL: "eleven"}, None),
        ({}, {}, None),
    ],
)
def test_image_cuda_from_env_or_label(env, labels, cuda):
    assert ins.image_cuda({"env": env, "labels": labels}) == cuda


@pytest.mark.parametrize("archs", [None, "75-real", "60-real;61-real;70-real;75-real;80-real;86", "86", "90a-real"])
def test_arch_lists_accepted(archs):
    assert images.cu118_archs(archs) == (archs or images.CU118_ARCHS)


@pytest.mark.parametrize("archs", ["sm_75", "75;rm -rf /", "7.5", "75-fake"])
def test_arch_lists_refused(archs):
    from llmfleet.errors import UsageError

    with pytest.raises(UsageError, match="CMAKE_CUDA_ARCHITECTURES"):
        images.cu118_archs(archs)


def test_fatbin_reader_and_cuobjdump_agree_on_a_cuda_11_8_build_of_the_images_arch_list():
    """A kernel built with Debian's nvcc 11.8 and the image's CMAKE_CUDA_ARCHITECTURES (tests/data/cuobjdump):
    the project's reader and cuobjdump list the same kernels, and they are the catalog's."""
    from llmfleet.images import fatbin

    data = REPO / "tests" / "data" / "cuobjdump"
    ours = fatbin.fatbin_archs((data / "cu118-archs-libk.so").read_bytes())
    theirs = fatbin.parse_cuobjdump((data / "cu118-archs-libk.listing.txt").read_text())
    assert ours == theirs == (["6.0", "6.1", "7.0", "7.5", "8.0", "8.6"], ["8.6"])
    kernels = CATALOG[KEY]["kernels"]
    assert (ours[0], ours[1]) == (kernels["sass"], kernels["ptx"])
    assert fatbin.lock_archs(*ours) == ["6.0", "6.1", "7.0", "7.5", "8.0", "8.6+PTX"]


def test_build_all_builds_the_toolkit_then_the_binary_then_the_image_with_its_arch_list(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMFLEET_CACHE_DIR", str(tmp_path))
    calls: list[tuple] = []
    base = images.ImageInfo("base", "b:1", "sha256:b", False, 0.0)
    toolkit = images.ImageInfo("cu118-toolkit", "t:1", "sha256:t", True, 1.0)
    monkeypatch.setattr(images, "build_base", lambda prog, force=False: base)
    monkeypatch.setattr(images, "cu118_toolkit", lambda prog, b: calls.append(("toolkit", b.id)) or toolkit)
    monkeypatch.setattr(images, "llama_server_cu118",
                        lambda prog, tk, archs: calls.append(("compile", tk.id, archs)) or tmp_path / "app")

    def build_image(key, prog, base_id, **kw):
        calls.append(("image", key, base_id, kw.get("binary"), kw.get("build_args")))
        return images.ImageInfo(key, f"{key}:1", f"sha256:{key}", True, 2.0)

    monkeypatch.setattr(images, "build_image", build_image)
    result = images.build_all(["base", images.CU118], quiet=True, cu118_arch_list="75-real")
    assert calls == [("toolkit", "sha256:b"), ("compile", "sha256:t", "75-real"),
                     ("image", images.CU118, "sha256:b", tmp_path / "app", {"CUDA_ARCHITECTURES": "75-real"})]
    assert set(result) == {"base", images.CU118, "cu118-toolkit"}
    assert images.load_manifest()[images.CU118]["ref"] == f"{images.CU118}:1"
