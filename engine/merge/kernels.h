// Per-tensor merge recipes and the streaming kernels that evaluate them chunk by chunk in
// fp32 (no LibTorch). Every operation of docs/merge.md compiles to one Recipe per output
// tensor; RecipeFiller is the ChunkFiller that WriteCheckpoint calls.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/io/safetensors.h"
#include "engine/merge/checkpoint_stream.h"

namespace stemma::engine::merge {

// A source tensor in a mapped file. `numel` may be smaller than the output's (a vocabulary
// that grew: the input covers the leading rows and contributes nothing beyond them).
struct Input {
  const uint8_t* data = nullptr;
  io::Dtype dtype = io::Dtype::kF32;
  int64_t numel = 0;
};

Input InputOf(const SourceCheckpoint::Tensor& tensor);

// How a sparsified delta keeps its entries (mergekit's sparsification methods).
enum class Sparsify { kNone, kMagnitude, kRandom };

// mergekit's generalized task arithmetic (task_arithmetic, ties, dare_linear, dare_ties).
struct GeneralizedParams {
  Sparsify sparsify = Sparsify::kNone;
  bool consensus = false;  // TIES sign election ("sum")
  bool normalize = false;  // divide by the (masked) weight sum
  bool rescale = false;    // L1-rescale kept entries to the pre-mask L1 norm
  double lambda = 1.0;
  uint64_t seed = 0;  // kRandom
};

struct Term {
  Input x;
  Input y;               // kDelta only: the term is coef * (x - y)
  double coef = 1.0;     // weight (kLinear / kGeneralized) or scale (kDelta)
  double density = 1.0;  // kGeneralized
};

struct Recipe {
  enum class Kind {
    kCopy,         // out = anchor (bytes copied when the dtypes agree)
    kLinear,       // out = sum coef * x
    kDelta,        // out = anchor + sum coef * (x - y)
    kGeneralized,  // out = anchor + lambda * merge(sparsify(x_m - anchor) * w_m)
    kNormal,       // out ~ N(0, stddev^2), seeded per element
    kZeros,
  };
  Kind kind = Kind::kCopy;
  Input anchor;
  std::vector<Term> terms;
  GeneralizedParams generalized;
  double stddev = 0.0;  // kNormal
  uint64_t seed = 0;    // kNormal
};

// Deterministic per-element uniform in [0, 1): a splitmix64 hash of (seed, stream, index).
// The DARE mask keeps element i of model m in tensor T iff
// Uniform(seed, StreamId(T, m), i) < density; kNormal uses two of them (Box-Muller).
double Uniform(uint64_t seed, uint64_t stream, uint64_t index);
uint64_t StreamId(const std::string& tensor, uint64_t model);

// Evaluates recipes[i] into tensors[i]. Not thread-safe (WriteCheckpoint calls it from one
// worker thread). Errors name the tensor.
class RecipeFiller {
 public:
  RecipeFiller(const std::vector<OutputTensor>& tensors, const std::vector<Recipe>& recipes)
      : tensors_(tensors), recipes_(recipes) {}
  absl::Status operator()(size_t index, int64_t begin, int64_t end, bool first, uint8_t* out);

 private:
  // Per-model state of a sparsified delta for the current tensor.
  struct Sparse {
    float threshold = 0;  // magnitude: keep |d| > threshold, or == threshold up to cutoff
    int64_t cutoff = -1;
    double scale = 1.0;   // L1 rescale factor
    uint64_t stream = 0;  // random: StreamId(tensor, model)
  };
  absl::Status Prepare(size_t index);
  void Block(const Recipe& r, int64_t begin, int64_t n, float* acc);
  void GeneralizedBlock(const Recipe& r, int64_t begin, int64_t n, float* acc);
  bool Keep(const Recipe& r, size_t m, int64_t i, float magnitude) const;

  const std::vector<OutputTensor>& tensors_;
  const std::vector<Recipe>& recipes_;
  std::vector<Sparse> sparse_;
  std::vector<float> x_, y_, acc_;
  std::vector<std::vector<float>> deltas_;
  uint64_t name_stream_ = 0;  // StreamId of the current tensor, for kNormal
};

}  // namespace stemma::engine::merge
