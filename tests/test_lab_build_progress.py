"""Lab image builds tell a newcomer where they are: compile steps done/total, lines in a CI log."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.lab.images import LineProgress, compile_env, parse_compile_progress


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("[12/203] Building CXX object src/CMakeFiles/llama.dir/llama-model.cpp.o", (12, 203)),
        ("[ 45%] Building CXX object src/CMakeFiles/llama.dir/llama-vocab.cpp.o", (45, 100)),
        ("[100%] Linking CXX executable ../../bin/llama-server", (100, 100)),
        ("-- Configuring done", None),
        ("In file included from [12/203]", None),
    ],
)
def test_compile_progress_from_ninja_and_make_lines(line, want):
    assert parse_compile_progress(line) == want


def test_compile_env_keeps_a_compiler_cache_under_the_cache_dir_without_touching_the_script():
    env = compile_env(Path("/var/cache/llmfleet"), ccache="/usr/bin/ccache", ninja="/usr/bin/ninja")
    assert env["CMAKE_C_COMPILER_LAUNCHER"] == env["CMAKE_CXX_COMPILER_LAUNCHER"] == "/usr/bin/ccache"
    assert env["CCACHE_DIR"] == "/var/cache/llmfleet/ccache"
    # the build folder is a fresh temporary one each run: paths below it are made relative, so it hits
    assert env["CCACHE_BASEDIR"] == env["TMPDIR"] == "/var/cache/llmfleet/tmp"
    assert env["CMAKE_GENERATOR"] == "Ninja"


def test_compile_env_without_ccache_or_ninja_is_a_plain_build():
    env = compile_env(Path("/c"), ccache=None, ninja=None)
    assert env == {"TMPDIR": "/c/tmp"}


def test_line_progress_prints_start_throttled_updates_and_the_end():
    lines: list[str] = []
    now = [0.0]
    prog = LineProgress(lines.append, every_s=15, clock=lambda: now[0])
    t = prog.add_task("llama.cpp: build llama-server")
    for step in range(1, 200):
        now[0] = step * 0.5  # a step every half second for 100 s
        prog.update(t, completed=step, total=203, detail=f"[{step}/203] Building CXX object x.o")
    now[0] = 101.0
    prog.update(t, completed=203, total=203, detail="done")
    assert lines[0] == "llama.cpp: build llama-server ..."
    assert lines[-1] == "llama.cpp: build llama-server: 203/203 done [101s]"
    middle = lines[1:-1]
    assert 5 <= len(middle) <= 8  # one line per 15 s, not one per step
    assert middle[0].startswith("llama.cpp: build llama-server: 30/203 [30/203] Building CXX object x.o [15s]")
