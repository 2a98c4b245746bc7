#!/usr/bin/env bash
# The control plane built with clang and -Wthread-safety as errors, so that every
# ABSL_GUARDED_BY / EXCLUSIVE_LOCKS_REQUIRED annotation is checked, not only read.
# The coordinator, the worker and common are checked (all guard their state with
# absl::Mutex; libstdc++'s std::mutex has no capability annotations, so state behind one
# would escape the analysis).
# Usage: thread_safety_build.sh SOURCE_DIR BUILD_DIR. The build directory is kept, so later
# runs recompile only what changed (and ccache serves the rest).
set -euo pipefail
src=$1 dir=$2
command -v clang++ >/dev/null || { echo "clang++ is not installed (scripts/setup installs clang)"; exit 77; }
cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DSTEMMA_BUILD_ENGINE=OFF \
  -DCMAKE_CXX_COMPILER=clang++ \
  "-DCMAKE_CXX_FLAGS=-Wthread-safety -Werror=thread-safety-analysis -Werror=thread-safety-reference -Wno-thread-safety-attributes -Wno-unknown-warning-option" >/dev/null
cmake --build "$dir" -j "${STEMMA_BUILD_JOBS:-2}" --target stemma_coordinator_core stemma_coordinator_rpc \
  stemma_common_rpc stemma_experiments stemma_worker_core stemma_worker_session
echo "thread-safety analysis: clean"
