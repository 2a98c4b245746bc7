// Weightless construction (issue 26, slice-only loading): a model built inside a
// WeightlessScope has every parameter with its real shape, dtype and device but no memory
// (a storage of 0 bytes and a null data pointer), and nothing is initialised. The sharded
// trainer builds its model this way and reads each shard unit's tensors from the checkpoint
// straight into the rank's slice (engine/train/layer_shards.h), so no rank ever holds the whole
// model. Nothing may read or write an unallocated parameter's elements until it has been given
// memory (set_data to a real tensor, or its storage allocated); shape-only uses
// (named_parameters, sizes(), options(), views) are fine.
//
// The flag is per thread: build the model on the thread that opened the scope.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <optional>

namespace stemma::engine::model {

// While alive, the modules this thread constructs get unallocated parameters of `options`'
// dtype and device (modules.h, causal_lm.h). Scopes do not nest.
class WeightlessScope {
 public:
  explicit WeightlessScope(const at::TensorOptions& options);
  ~WeightlessScope();
  WeightlessScope(const WeightlessScope&) = delete;
  WeightlessScope& operator=(const WeightlessScope&) = delete;
};

// The options of this thread's open WeightlessScope; nullopt when there is none.
std::optional<at::TensorOptions> WeightlessOptions();

// A contiguous tensor of `sizes` with no memory behind it (see above).
at::Tensor UnallocatedTensor(at::IntArrayRef sizes, const at::TensorOptions& options);
// True for a tensor with elements and no memory (UnallocatedTensor, or a released flat buffer).
bool IsUnallocated(const at::Tensor& tensor);

// torch::nn::Linear / Embedding as the model's modules use them: normal ones, or inside a
// WeightlessScope ones whose options say `in`/`out` (`num`/`dim`) and whose parameters are
// unallocated (LibTorch's constructors always allocate and initialise; these build a 1x1
// module and give it its real shapes).
torch::nn::Linear NewLinear(int64_t in, int64_t out, bool bias);
torch::nn::Embedding NewEmbedding(int64_t num, int64_t dim);

}  // namespace stemma::engine::model
