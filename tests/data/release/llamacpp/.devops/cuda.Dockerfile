# A shortened stand-in for ggml-org/llama.cpp .devops/cuda.Dockerfile at commit 00d6946 (the lines
# catalog.release reads, rewritten for the tests).
ARG UBUNTU_VERSION=24.04
ARG CUDA_VERSION=12.8.1
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build
ARG CUDA_DOCKER_ARCH=default
RUN cmake -B build -DGGML_NATIVE=OFF -DGGML_CUDA=ON -DGGML_BACKEND_DL=ON . && cmake --build build
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS base
FROM base AS server
COPY --from=build /app/full/llama-server /app
ENTRYPOINT [ "/app/llama-server" ]
