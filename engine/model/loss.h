// The output head and the next-token cross-entropy, plain and chunked.
//
// Chunked cross-entropy never holds fp32 logits for the whole micro-batch: it is one autograd
// function over the final hidden states and the head's weight whose forward computes the
// logits of `chunk_tokens` rows at a time (head, softcap, fp32, summed CE) and keeps only the
// sum, and whose backward recomputes each chunk's logits under the forward's autocast state
// and backpropagates through that chunk alone. Peak memory holds one chunk's logits (and
// their gradient) instead of [N, V]; the price is a second head product per chunk in
// backward. The loss is the plain path's sum to float rounding (chunks are summed in order).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>

namespace stemma::engine::model {

// hidden [..., H], weight [V, H] -> logits [..., V] = hidden weightᵀ, then
// tanh(logits / cap) * cap when `softcap` is set (Gemma's final logit softcapping).
torch::Tensor OutputLogits(const torch::Tensor& hidden, const torch::Tensor& weight,
                           std::optional<double> softcap);

// Cross-entropy summed over every target, in fp32: logits [..., V], targets [...] (int64;
// -100 is ignored, as torch's cross_entropy does). A fp32 scalar.
torch::Tensor SummedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets);

// SummedCrossEntropy(OutputLogits(hidden, weight, softcap), targets) over chunks of
// `chunk_tokens` rows of hidden [..., H] (targets [...] of the same leading shape). With
// chunk_tokens 0, or at least the number of rows, it is exactly the plain composition.
// Gradients flow to `hidden` and `weight` (a tied embedding included) as far as they need
// them.
torch::Tensor ChunkedCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                  const torch::Tensor& targets, int64_t chunk_tokens,
                                  std::optional<double> softcap);

}  // namespace stemma::engine::model
