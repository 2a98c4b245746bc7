# The GPU worker image: stemma-worker and stemma-engine built against the CUDA LibTorch of
# the pinned torch wheel (PyPI's Linux wheel carries its CUDA libraries as nvidia-* wheels).
# The NVIDIA driver and nvidia-smi come from the node (NVIDIA container toolkit, through
# the device plugin), not from this image. Build from the repository root:
#   docker build -f deploy/images/worker-cuda.Dockerfile -t stemma/worker-cuda:0.1.0 .
FROM debian:12.11 AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY deploy/images/build-packages.txt /tmp/build-packages.txt
# hadolint ignore=DL3008
RUN apt-get update \
    && sed 's/#.*//' /tmp/build-packages.txt | xargs apt-get install -y --no-install-recommends \
       python3 python3-venv libssl-dev libsentencepiece-dev libicu-dev \
    && rm -rf /var/lib/apt/lists/*
# LibTorch with CUDA: the same torch version scripts/setup pins for the CPU build.
RUN python3 -m venv /opt/torch \
    && /opt/torch/bin/pip install --no-cache-dir torch==2.15.0
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DSTEMMA_BUILD_ENGINE=ON \
          -DSTEMMA_PYTHON=/opt/torch/bin/python \
    && cmake --build /build -j"$(nproc)" --target stemma-worker stemma-engine stemma_sentencepiece

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
# The worker finds stemma-engine beside itself.
COPY --from=build /build/bin/stemma-worker /build/bin/stemma-engine /build/bin/libstemma_sentencepiece.so /usr/local/bin/
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
EXPOSE 8081 9464
ENTRYPOINT ["/usr/local/bin/stemma-worker"]
