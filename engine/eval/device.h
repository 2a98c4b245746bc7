// The `device` field of the eval and analyze specs as a torch device, checked against what
// this LibTorch build and machine have. Header-only (engine/analyze uses it without linking
// the eval library); include it from .cc files that include LibTorch anyway.
#pragma once

#include <torch/cuda.h>
#include <torch/types.h>

#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stemma::engine::eval {

// "cpu", "cuda" or "cuda:N". Plain "cuda" is this rank's GPU: LOCAL_RANK (torchrun's, set by
// the worker for each rank of a part) modulo the visible GPUs, else GPU 0 — so the ranks of
// one node spread over its GPUs whether or not CUDA_VISIBLE_DEVICES narrows them to one.
// InvalidArgument naming `device` (exit 4, a bad spec) for any other name, for CUDA on a
// machine or build without it, and for an index past the visible GPUs.
inline absl::StatusOr<torch::Device> ResolveDevice(const std::string& name) {
  if (name.empty() || name == "cpu") return torch::Device(torch::kCPU);
  std::optional<torch::Device> device;
  try {
    device.emplace(name);
  } catch (const std::exception&) {
  }
  if (!device.has_value() || !(device->is_cpu() || device->is_cuda())) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", name, "' is not cpu, cuda or cuda:N"));
  }
  if (device->is_cpu()) return torch::Device(torch::kCPU);
  const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
  if (visible == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device: '", name, "' but no CUDA device is visible to this process (a LibTorch ",
        "without CUDA, no GPU, or CUDA_VISIBLE_DEVICES empty); use device: cpu or run it on a ",
        "worker with a GPU (resources.gpus)"));
  }
  int64_t index = 0;
  if (device->has_index()) {
    index = device->index();
  } else if (const char* local = std::getenv("LOCAL_RANK"); local != nullptr) {
    int64_t local_rank = 0;
    if (absl::SimpleAtoi(local, &local_rank) && local_rank >= 0) index = local_rank % visible;
  }
  if (index >= visible) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", name, "' but only ", visible, " CUDA device(s) are visible"));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace stemma::engine::eval
