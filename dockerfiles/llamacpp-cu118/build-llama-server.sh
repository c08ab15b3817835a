#!/bin/sh
# Build llama-server with the CUDA backend (CUDA 11.8, Debian's nvcc) from the llama.cpp tree vendored
# in the llama-cpp-python sdist. Runs inside the `toolkit` stage of this folder's Dockerfile.
# Usage: build-llama-server.sh SDIST.tar.gz OUT_DIR [JOBS]
#
# - CUDA_ARCHITECTURES: SASS for Pascal (60 P100, 61 P40), Volta (70 V100), Turing (75 T4), Ampere
#   (80 A100, 86 A10/RTX 30xx) and sm_86 PTX that newer cards JIT-compile (a 86 without -real = both).
# - GGML_BACKEND_DL: ggml-cuda and ggml-cpu are loaded at run time; when libcuda.so.1 is missing (no
#   driver, no GPU) ggml-cuda is skipped and the server runs on the CPU backend.
# - Host compiler g++-11 for everything (nvcc 11.8 supports gcc <= 11); -O2 host code (device code is
#   optimised by ptxas at its default -O3 either way).
# - GGML_RPC: the RPC backend (libggml-rpc.so, loaded like the others) and the RPC worker, written to
#   OUT_DIR/rpc-server (a service split over several hosts runs it on its workers; tools/rpc/README.md).
#   The worker target is ggml-rpc-server in newer trees, rpc-server in older ones.
# - Compile-time cuts that keep what the server uses: FlashAttention kernels only for the default KV
#   type pairs (GGML_CUDA_FA_ALL_QUANTS=OFF), no NCCL, no tests/examples/UI, no HTTPS client
#   (LLAMA_OPENSSL=OFF: the fleet stages models on the host, the server never downloads).
set -eu
sdist=$1
out=$2
jobs=${3:-$(nproc)}
archs=${CUDA_ARCHITECTURES:-"60-real;61-real;70-real;75-real;80-real;86"}
work=$(mktemp -d "${TMPDIR:-/tmp}/llama-cu118.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work"
src=$(find "$work" -maxdepth 3 -type d -path '*/vendor/llama.cpp' | head -n 1)
[ -n "$src" ] || { echo "no vendor/llama.cpp in $sdist" >&2; exit 1; }
nvcc --version | tail -n 2
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER=gcc-11 -DCMAKE_CXX_COMPILER=g++-11 -DCMAKE_CUDA_HOST_COMPILER=g++-11 \
  -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DCMAKE_CUDA_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$archs" -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_CUDA_NCCL=OFF \
  -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_LLGUIDANCE=OFF -DGGML_RPC=ON -DGGML_RPC_RDMA=OFF
rpc_target=ggml-rpc-server
grep -q 'set(TARGET ggml-rpc-server)' "$src/tools/rpc/CMakeLists.txt" 2>/dev/null || rpc_target=rpc-server
cmake --build "$work/build" --target llama-server "$rpc_target" ggml-cpu ggml-cuda ggml-rpc -j "$jobs"
bin="$work/build/bin"
mkdir -p "$out.tmp"
cp "$bin/llama-server" "$out.tmp/"
cp "$bin/$rpc_target" "$out.tmp/rpc-server"
find "$bin" -maxdepth 1 -name '*.so*' -exec cp -P {} "$out.tmp/" \;
find "$out.tmp" -type f -exec strip --strip-unneeded {} +
rm -rf "$out"
mv "$out.tmp" "$out"
ls -l "$out"
