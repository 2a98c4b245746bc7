#include "engine/model/weightless.h"

#include <ATen/ops/empty.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

namespace stemma::engine::model {
namespace {

thread_local std::optional<at::TensorOptions> weightless_options;

// Gives `param` (a module parameter: its TensorImpl, which autograd and the module keep, stays)
// unallocated data of `sizes`.
void MakeUnallocated(at::Tensor& param, at::IntArrayRef sizes, const at::TensorOptions& options) {
  param.set_data(UnallocatedTensor(sizes, options));
}

}  // namespace

WeightlessScope::WeightlessScope(const at::TensorOptions& options) {
  TORCH_CHECK(!weightless_options.has_value(), "WeightlessScope: scopes do not nest");
  weightless_options = options;
}

WeightlessScope::~WeightlessScope() { weightless_options.reset(); }

std::optional<at::TensorOptions> WeightlessOptions() { return weightless_options; }

at::Tensor UnallocatedTensor(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor t = at::empty({0}, options.requires_grad(std::nullopt));
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

bool IsUnallocated(const at::Tensor& tensor) {
  return tensor.defined() && tensor.numel() > 0 && tensor.storage().data() == nullptr;
}

torch::nn::Linear NewLinear(int64_t in, int64_t out, bool bias) {
  const std::optional<at::TensorOptions> options = WeightlessOptions();
  if (!options) return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
  torch::nn::Linear linear(torch::nn::LinearOptions(1, 1).bias(bias));
  linear->options = torch::nn::LinearOptions(in, out).bias(bias);
  MakeUnallocated(linear->weight, {out, in}, *options);
  if (bias) MakeUnallocated(linear->bias, {out}, *options);
  return linear;
}

torch::nn::Embedding NewEmbedding(int64_t num, int64_t dim) {
  const std::optional<at::TensorOptions> options = WeightlessOptions();
  if (!options) return torch::nn::Embedding(num, dim);
  torch::nn::Embedding embedding(1, 1);
  embedding->options = torch::nn::EmbeddingOptions(num, dim);
  MakeUnallocated(embedding->weight, {num, dim}, *options);
  return embedding;
}

}  // namespace stemma::engine::model
