// The model side of `stemma-engine eval`: a checkpoint loaded for inference, with the three
// computations the tasks need (window NLL for perplexity, continuation log-likelihoods for
// multiple choice, greedy generation for translation). This header is torch-free (the model
// lives behind a pimpl), so the task logic that calls it compiles without LibTorch.
//
// All computation runs under torch::InferenceMode in float32 unless `dtype` says otherwise,
// on `device` (engine/eval/device.h): the weights, the inputs and the accumulators live
// there, and each call copies its results to the host once.
// Thread-safety: not thread-safe; one call at a time. Torch's intra-op pool (`threads`)
// parallelises inside a call.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stemma::engine::eval {

struct EvalModelOptions {
  std::string dtype;           // the spec's: "float32" or "bfloat16"
  int threads = 0;             // torch intra-op threads; 0 keeps torch's default
  std::string device = "cpu";  // the spec's: "cpu", "cuda" or "cuda:N"
};

// Negative log-likelihood of one window's predicted tokens (natural log).
struct WindowLoss {
  double nll = 0;
  int64_t tokens = 0;
};

class EvalModel {
 public:
  // Loads config.json and the weights of checkpoint directory `dir` (engine/model). Errors
  // name the directory, file or tensor; InvalidArgument for a bad dtype or device (naming
  // the field).
  static absl::StatusOr<std::unique_ptr<EvalModel>> Load(const std::string& dir,
                                                         const EvalModelOptions& options);
  ~EvalModel();
  // OK when `device` names a device this process can use (ResolveDevice in device.h):
  // lets the command refuse a bad one before reading its inputs.
  static absl::Status CheckDevice(const std::string& device);

  int64_t vocab_size() const;
  int64_t max_positions() const;  // config.json max_position_embeddings
  std::string device() const;     // where it runs, e.g. "cpu" or "cuda:1"

  // Each window is a row of equal length T >= 2: position 0 is context only, positions
  // 1..T-1 are predicted from the tokens before them. All windows of one call must have the
  // same length; they run as one batch. Logits are produced in chunks of positions, so the
  // full [B, T, V] tensor never exists.
  absl::StatusOr<std::vector<WindowLoss>> WindowLosses(
      const std::vector<std::vector<int32_t>>& windows);

  // For each continuation c: Σ log p(c_j | context, c_<j), lm-eval's loglikelihood. The
  // model input is (context + c)[:-1], left-truncated to max_length tokens (max_length <= 0:
  // max_positions()). The continuations run as one right-padded batch.
  absl::StatusOr<std::vector<double>> ContinuationLogLikelihoods(
      std::span<const int32_t> context, const std::vector<std::vector<int32_t>>& continuations,
      int64_t max_length);

  // Greedy decoding with the KV cache: appends argmax tokens to `prompt` until `stop`
  // (called with the tokens generated so far) returns true or max_new_tokens are made.
  // Returns the generated tokens (the one that triggered the stop included).
  absl::StatusOr<std::vector<int32_t>> Generate(
      std::span<const int32_t> prompt, int64_t max_new_tokens,
      const std::function<bool(std::span<const int32_t>)>& stop);

 private:
  struct Impl;
  explicit EvalModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stemma::engine::eval
