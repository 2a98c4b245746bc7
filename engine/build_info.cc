#include "engine/build_info.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <string>

// The same test engine/train/distributed.cc makes to compile ProcessGroupNCCL in.
#if defined(USE_C10D_NCCL) && __has_include(<nccl.h>)
#define STEMMA_BUILD_HAS_NCCL 1
#else
#define STEMMA_BUILD_HAS_NCCL 0
#endif

#ifndef STEMMA_BUILD_TYPE
#define STEMMA_BUILD_TYPE "unknown"
#endif
#ifndef STEMMA_TORCH_CUDA
#define STEMMA_TORCH_CUDA ""
#endif

namespace stemma::engine {

std::string BuildInfo() {
  std::string info = "stemma-engine\n";
  info += "build: " STEMMA_BUILD_TYPE;
#if defined(__clang__)
  info += ", clang " __clang_version__;
#elif defined(__GNUC__)
  info += ", gcc " __VERSION__;
#endif
  info += "\ntorch: " TORCH_VERSION "\n";
  const std::string cuda = STEMMA_TORCH_CUDA;
  if (cuda.empty()) {
    info += "cuda: no (LibTorch without CUDA)\n";
  } else {
    info += "cuda: yes (built against CUDA " + cuda + "; " +
            std::to_string(torch::cuda::device_count()) + " GPU(s) visible)\n";
  }
  info += "collectives: ring (TCP, CPU tensors and host-staged CUDA tensors); nccl: ";
  info += STEMMA_BUILD_HAS_NCCL ? "yes\n" : "no\n";
  return info;
}

}  // namespace stemma::engine
