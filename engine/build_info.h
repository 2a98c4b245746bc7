// What this stemma-engine was built with, for `stemma-engine --version`: the build type and
// compiler, the LibTorch version, whether LibTorch has CUDA (and how many GPUs this process
// sees), and the collectives data parallelism can use — the engine's own TCP ring always,
// NCCL when it was compiled in (a CUDA LibTorch and nccl.h found at build time; see
// engine/CMakeLists.txt).
#pragma once

#include <string>

namespace stemma::engine {

// Several lines, each "key: value", ending in a newline.
std::string BuildInfo();

}  // namespace stemma::engine
