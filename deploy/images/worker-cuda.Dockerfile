# The GPU worker image: stemma-worker and stemma-engine (its torch-free front and
# stemma-engine-torch) built against the CUDA LibTorch of the pinned torch wheel (PyPI's Linux wheel carries its CUDA libraries as nvidia-* wheels).
# The NVIDIA driver and nvidia-smi come from the node (NVIDIA container toolkit, through
# the device plugin), not from this image. Build from the repository root:
#   docker build -f deploy/images/worker-cuda.Dockerfile -t stemma/worker-cuda:0.1.0 .
FROM debian:12.11 AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY deploy/images/build-packages.txt /tmp/build-packages.txt
# hadolint ignore=DL3008
RUN apt-get update \
    && sed 's/#.*//' /tmp/build-packages.txt | xargs apt-get install -y --no-install-recommends \
       python3 python3-venv libssl-dev libsentencepiece-dev libicu-dev zlib1g-dev libzstd-dev \
    && rm -rf /var/lib/apt/lists/*
# The CUDA toolkit. A CUDA LibTorch's CMake config (Caffe2/public/cuda.cmake) enables the CUDA
# language and calls find_package(CUDAToolkit REQUIRED) for nvcc, cudart, the driver stub,
# cuBLAS, cuRAND, cuFFT and NVRTC before anything of ours configures: without a toolkit the
# engine's configure stops there. The engine compiles no CUDA code; the toolkit is for the
# build stage only (the runtime stage takes the wheel's CUDA libraries). Same major version as
# the wheel's CUDA (torch 2.15.0 from PyPI: CUDA 13; a 13.0 toolkit configures it), from
# NVIDIA's Debian 12 repository.
ARG CUDA_APT_VERSION=13-0
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && curl -fsSL -o /tmp/cuda-keyring.deb \
       https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
    && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
    && apt-get update \
    && apt-get install -y --no-install-recommends "cuda-toolkit-${CUDA_APT_VERSION}" \
    && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:${PATH} CUDACXX=/usr/local/cuda/bin/nvcc
# LibTorch with CUDA: the same torch version scripts/setup pins for the CPU build. Its
# nvidia-nccl dependency brings nccl.h (site-packages/nvidia/nccl/include), which
# engine/CMakeLists.txt finds for the NCCL collectives.
RUN python3 -m venv /opt/torch \
    && /opt/torch/bin/pip install --no-cache-dir torch==2.15.0 pyarrow==26.0.1
WORKDIR /src
COPY . .
# The image must carry a CUDA engine with NCCL: the build fails here otherwise (the
# configure only warns, so that a CPU or laptop build still goes through).
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DSTEMMA_BUILD_ENGINE=ON \
          -DSTEMMA_PYTHON=/opt/torch/bin/python -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
    && cmake --build /build -j"$(nproc)" --target stemma-worker stemma-engine stemma_sentencepiece \
    && /build/bin/stemma-engine --version \
    && /build/bin/stemma-engine --version | grep '^cuda: yes' \
    && /build/bin/stemma-engine --version | grep 'nccl: yes'

FROM debian:12.11-slim
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY deploy/images/runtime-packages.txt deploy/images/engine-runtime-packages.txt /tmp/
# hadolint ignore=DL3008
RUN apt-get update \
    && cat /tmp/runtime-packages.txt /tmp/engine-runtime-packages.txt | sed 's/#.*//' \
       | xargs apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/* /tmp/*.txt
# The engine's RUNPATH points into the venv's torch and nvidia packages: keep their paths.
COPY --from=build /opt/torch/lib/python3.11/site-packages/torch/lib /opt/torch/lib/python3.11/site-packages/torch/lib
COPY --from=build /opt/torch/lib/python3.11/site-packages/nvidia /opt/torch/lib/python3.11/site-packages/nvidia
# Parquet inputs of tokenize: Arrow and Parquet from the pyarrow wheel (the engine's RUNPATH).
COPY --from=build /opt/torch/lib/python3.11/site-packages/pyarrow/libarrow.so.2600 /opt/torch/lib/python3.11/site-packages/pyarrow/libparquet.so.2600 /opt/torch/lib/python3.11/site-packages/pyarrow/
# The worker finds stemma-engine beside itself, and stemma-engine (the torch-free front)
# stemma-engine-torch beside itself.
COPY --from=build /build/bin/stemma-worker /build/bin/stemma-engine /build/bin/stemma-engine-torch /build/bin/libstemma_sentencepiece.so /usr/local/bin/
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
EXPOSE 8081 9464
ENTRYPOINT ["/usr/local/bin/stemma-worker"]
