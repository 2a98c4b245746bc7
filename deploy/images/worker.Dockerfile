# The worker image without an engine: stemma-worker on Debian 12 slim, as user 65532. It
# runs noop and exec jobs (and refuses engine jobs: "stemma-engine not found"); GPU nodes
# use worker-cuda.Dockerfile. Build from the repository root:
#   docker build -f deploy/images/worker.Dockerfile -t stemma/worker:0.1.0 .
FROM debian:12.11 AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY deploy/images/build-packages.txt /tmp/build-packages.txt
# hadolint ignore=DL3008
RUN apt-get update \
    && sed 's/#.*//' /tmp/build-packages.txt | xargs apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEMMA_BUILD_ENGINE=OFF \
    && cmake --build /build -j"$(nproc)" --target stemma-worker

FROM debian:12.11-slim
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY deploy/images/runtime-packages.txt /tmp/runtime-packages.txt
# hadolint ignore=DL3008
RUN apt-get update \
    && sed 's/#.*//' /tmp/runtime-packages.txt | xargs apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt
COPY --from=build /build/bin/stemma-worker /usr/local/bin/
USER 65532:65532
EXPOSE 8081 9464
ENTRYPOINT ["/usr/local/bin/stemma-worker"]
