// The model side of `stemma-engine analyze`: one forward pass per window of a language's
// tokens, collecting what LAPE and the routing analysis need, and the per-layer residual
// stream of parallel sentences for the alignment analysis. LibTorch stays in the .cc file.
//
// Not thread-safe: one call at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/analyze/lape.h"
#include "engine/analyze/routing.h"
#include "stemma/v1/specs/eval.pb.h"

namespace stemma::engine::analyze {

struct ProfileOptions {
  int64_t seq_len = 0;     // window length (the spec's); the tail shorter than a window is dropped
  int64_t batch_size = 0;  // windows per forward (the spec's)
  bool lape = false;       // count act(gate) > activation_threshold per FFN neuron
  double activation_threshold = 0.0;
  bool routing = false;  // count the top-k experts per MoE layer
  // Called after each forward with (windows done, windows in all).
  std::function<void(int64_t, int64_t)> progress;
};

// Cosine similarity of mean residual activations of parallel sentences.
struct AlignmentResult {
  int64_t sentences = 0;
  // [pair][layer]: the mean over sentences of cos(mean_t h_a, mean_t h_b) at the output of
  // each decoder layer; pairs (a, b), a < b, in language order.
  std::vector<std::pair<int64_t, int64_t>> pairs;
  std::vector<std::vector<double>> cosine;
};

class ModelAnalyzer {
 public:
  // Loads the checkpoint at `dir`. Errors are LoadModel's (naming the file or tensor) and
  // InvalidArgument for a bad device or dtype.
  // The spec gives the device, the dtype and the threads (0 keeps torch's default).
  static absl::StatusOr<std::unique_ptr<ModelAnalyzer>> Load(const std::string& dir,
                                                             const v1::AnalyzeSpec& spec);
  ~ModelAnalyzer();

  int64_t num_layers() const;
  int64_t intermediate_size() const;
  int64_t vocab_size() const;
  bool is_moe() const;
  int64_t num_experts() const;
  int64_t top_k() const;
  std::string model_type() const;
  std::vector<int64_t> moe_layers() const;  // layer indices with a sparse MoE block

  // Runs `tokens` (one language) through the model in windows of options.seq_len (a stream
  // shorter than one window is one window). Fills `lape` (when options.lape; needs a dense
  // model) and `routing` (when options.routing; needs MoE layers). Errors: FailedPrecondition
  // naming the analysis and the model type; Internal for LibTorch errors.
  absl::Status Profile(const std::vector<int32_t>& tokens, const ProfileOptions& options,
                       LapeCounts* lape, RoutingCounts* routing);

  // sentences[i][k]: the tokens of sentence i in language k. Sentences are run in batches of
  // `batch_size` per language (right-padded; the model is causal, so padding after a
  // sentence does not change it). `skip_first` positions of each sentence (a BOS) are left
  // out of the mean.
  absl::StatusOr<AlignmentResult> Align(
      const std::vector<std::vector<std::vector<int32_t>>>& sentences, int64_t batch_size,
      int64_t skip_first);

 private:
  struct State;
  explicit ModelAnalyzer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace stemma::engine::analyze
