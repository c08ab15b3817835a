#!/bin/sh
# Build llama-server and the RPC worker (rpc-server) from the llama.cpp tree vendored in the
# llama-cpp-python sdist, with the RPC backend (-DGGML_RPC=ON, tools/rpc/README.md) so llama-server takes
# --rpc and a second lab host can serve layers over the network. RDMA off: plain TCP, as in the lab.
# Usage: build-llama-server.sh SDIST.tar.gz OUT_BINARY [JOBS]   (rpc-server is written beside OUT_BINARY)
# CPU only, GGML_NATIVE=OFF (portable x86-64), no OpenSSL/UI download/tests/examples, static ggml/llama
# libraries and static libstdc++/libgcc: the binary needs only glibc (2.36 on Debian 12).
# -O1, not Release's -O3: the lab checks behaviour, not speed, and -O1 halves the compile (measured on the
# five heaviest files: 141 s at -O3, 73 s at -O1); ggml's hot loops are hand-written SIMD either way.
# Unity build of the heavy C++ targets (unity-build.cmake beside this script, through CMAKE_PROJECT_INCLUDE):
# 4 min 20 s at -O1 on 2 idle cores; file by file took 7 min 2 s at -O0. Should the tree not compile that
# way, it is built again file by file (the compiler cache keeps what the first attempt compiled).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
sdist=$1
out=$2
jobs=${3:-$(nproc)}
work=$(mktemp -d "${TMPDIR:-/tmp}/llama-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work"
src=$(find "$work" -maxdepth 3 -type d -path '*/vendor/llama.cpp' | head -n 1)
[ -n "$src" ] || { echo "no vendor/llama.cpp in $sdist" >&2; exit 1; }
configure() {  # configure BUILD_FOLDER [EXTRA_CMAKE_ARGS...]
  b=$1
  shift
  cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_LLGUIDANCE=OFF -DGGML_RPC=ON -DGGML_RPC_RDMA=OFF \
    -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" "$@"
}
# The worker target is ggml-rpc-server in newer trees, rpc-server in older ones.
rpc_target=ggml-rpc-server
grep -q 'set(TARGET ggml-rpc-server)' "$src/tools/rpc/CMakeLists.txt" 2>/dev/null || rpc_target=rpc-server
build="$work/build"
if [ -f "$here/unity-build.cmake" ] \
    && configure "$build" -DCMAKE_PROJECT_INCLUDE="$here/unity-build.cmake" \
    && cmake --build "$build" --target llama-server "$rpc_target" -j "$jobs"; then
  :
else
  echo "unity build failed: building llama-server file by file" >&2
  build="$work/build-plain"
  configure "$build"
  cmake --build "$build" --target llama-server "$rpc_target" -j "$jobs"
fi
bin=$(find "$build" -type f -name llama-server -perm -u+x | head -n 1)
rpc=$(find "$build" -type f -name "$rpc_target" -perm -u+x | head -n 1)
strip "$bin" "$rpc"
mkdir -p "$(dirname "$out")"
cp "$rpc" "$(dirname "$out")/rpc-server.tmp"
mv "$(dirname "$out")/rpc-server.tmp" "$(dirname "$out")/rpc-server"
cp "$bin" "$out.tmp"
mv "$out.tmp" "$out"
