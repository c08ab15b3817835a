"""dockerfiles/lab-llamacpp/build-llama-server.sh run for real (sh, CMake, the compiler that
``lab.setup`` installs) on small llama.cpp-shaped source trees: the unity build of the heavy targets
is used when the tree compiles that way, and a tree that does not is built again file by file."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from llmfleet.lab.images import DOCKERFILES, LLAMA_BUILD_FILES

pytestmark = pytest.mark.lab

SCRIPT = DOCKERFILES / "lab-llamacpp" / LLAMA_BUILD_FILES[0]

TOP = """cmake_minimum_required(VERSION 3.19)
project(fake-llama CXX)
add_library(llama-common STATIC common/a.cpp common/b.cpp)
add_executable(llama-server server.cpp)
target_link_libraries(llama-server PRIVATE llama-common)
add_subdirectory(tools/rpc)
"""
RPC = """set(TARGET ggml-rpc-server)
add_executable(${TARGET} rpc-server.cpp)
"""
# Each file alone is fine; in one translation unit (the unity build) `helper` is defined twice.
A = "static int helper() { return 40; }\nint part_a() { return helper(); }\n"
B_CLASH = "static int helper() { return 2; }\nint part_b() { return helper(); }\n"
B_FINE = "static int helper_b() { return 2; }\nint part_b() { return helper_b(); }\n"
SERVER = '#include <cstdio>\nint part_a(); int part_b();\nint main() { std::printf("%d\\n", part_a() + part_b()); }\n'


def _sdist(tmp: Path, b_source: str) -> Path:
    tree = tmp / "llama_cpp_python-0.0.1" / "vendor" / "llama.cpp"
    files = {"CMakeLists.txt": TOP, "tools/rpc/CMakeLists.txt": RPC, "tools/rpc/rpc-server.cpp": "int main() {}\n",
             "common/a.cpp": A, "common/b.cpp": b_source, "server.cpp": SERVER}
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    sdist = tmp / "fake.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tmp / "llama_cpp_python-0.0.1", arcname="llama_cpp_python-0.0.1")
    return sdist


def _build(tmp: Path, b_source: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    if not (shutil.which("cmake") and shutil.which("g++")):
        pytest.fail("cmake and g++ are missing: `invoke lab.setup` installs them")
    sdist, out = _sdist(tmp, b_source), tmp / "out" / "llama-server"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CMAKE_", "CCACHE_"))} | {"TMPDIR": str(tmp)}
    res = subprocess.run(["sh", str(SCRIPT), str(sdist), str(out), "2"], capture_output=True, text=True,
                         timeout=300, env=env)
    return res, out


def test_a_tree_that_compiles_as_one_unit_is_built_that_way(tmp_path):
    res, out = _build(tmp_path, B_FINE)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "unity build failed" not in res.stderr
    assert "Unity/unity_0_cxx.cxx" in res.stdout  # llama-common compiled as one translation unit
    assert subprocess.run([str(out)], capture_output=True, text=True, timeout=10).stdout == "42\n"
    assert (out.parent / "rpc-server").is_file()
    assert not list(tmp_path.glob("llama-build.*"))  # the temporary build folder is gone


def test_a_tree_that_does_not_compile_as_one_unit_is_built_file_by_file(tmp_path):
    res, out = _build(tmp_path, B_CLASH)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "redefinition" in res.stdout + res.stderr  # the unity attempt did fail
    assert "unity build failed: building llama-server file by file" in res.stderr
    assert subprocess.run([str(out)], capture_output=True, text=True, timeout=10).stdout == "42\n"
    assert (out.parent / "rpc-server").is_file()
