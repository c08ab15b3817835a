#!/bin/sh
# The llama-server compile's cache, measured on one part: configure the lab's build (the flags of
# dockerfiles/lab-llamacpp/build-llama-server.sh) in a fresh temporary folder twice, with ccache in a
# cache of its own (not the lab's), and build TARGET (default ggml-base) each time; print both times,
# the ninja step count of llama-server, the load, and ccache's hits.
#   sh bench/compile_cache_bench.sh [SDIST] [TARGET]
set -eu
W=$(mktemp -d "${TMPDIR:-/tmp}/llmfleet-ccbench.XXXXXX")
trap 'rm -rf "$W"' EXIT
sdist=${1:-/var/cache/llmfleet/src/llama_cpp_python-0.3.36.tar.gz}
target=${2:-ggml-base}
export CCACHE_DIR=$W/ccache CCACHE_BASEDIR=$W/tmp CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=2G
export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_GENERATOR=Ninja
mkdir -p "$W/tmp"
for run in 1 2; do
  d=$(mktemp -d "$W/tmp/llama-build.XXXXXX")
  tar -xzf "$sdist" -C "$d"
  src=$(find "$d" -maxdepth 3 -type d -path '*/vendor/llama.cpp' | head -n 1)
  cmake -S "$src" -B "$d/build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_LLGUIDANCE=OFF >/dev/null
  echo "run $run: llama-server is $(ninja -C "$d/build" -n llama-server | grep -c '^\[') ninja steps; load $(cut -d' ' -f1 /proc/loadavg)"
  /usr/bin/time -f "run $run: $target wall %e s, cpu %U+%S s" cmake --build "$d/build" --target "$target" -j 2 >/dev/null
  rm -rf "$d"
done
ccache -s | grep -iE "hits|misses" | head -4
