# The coordinator image: stemma-coordinator and the stemma CLI on Debian 12 slim, as user
# 65532, nothing writable but the mounted volumes. Build from the repository root:
#   docker build -f deploy/images/coordinator.Dockerfile -t stemma/coordinator:0.1.0 .
# The base images are pinned to a Debian point release; the runtime package list is the one
# tests/deploy/rootfs_test.py proves sufficient.
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
    && cmake --build /build -j"$(nproc)" --target stemma-coordinator stemma

FROM debian:12.11-slim
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY deploy/images/runtime-packages.txt /tmp/runtime-packages.txt
# hadolint ignore=DL3008
RUN apt-get update \
    && sed 's/#.*//' /tmp/runtime-packages.txt | xargs apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt
COPY --from=build /build/bin/stemma-coordinator /build/bin/stemma /usr/local/bin/
USER 65532:65532
EXPOSE 7070 8081 9464
ENTRYPOINT ["/usr/local/bin/stemma-coordinator"]
CMD ["--data=/var/lib/stemma", "--listen=127.0.0.1:7070"]
