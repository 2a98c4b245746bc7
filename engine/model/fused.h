// Fused CPU kernels for the element-wise parts of a decoder layer: RMSNorm, rotary embedding
// and the SwiGLU product, each one autograd function with a hand-written backward.
//
// Why: eager LibTorch runs RMSNorm as six tensor passes forward and about a dozen backward,
// RoPE as five (a negation, a concatenation, two products, a sum), SiLU-times-up as two plus
// three; each pass streams a [tokens, width] tensor through memory and opens an OpenMP
// region. One loop per direction does the same arithmetic in one or two passes. The matrix
// products are untouched, so the results match the composite ops to rounding (see
// fused_test in model_test).
//
// Scope: fp32, CPU, contiguous tensors (`Applies`). Anything else (bf16 autocast, CUDA,
// strided views) takes the composite path in modules.cc, which stays the reference.
#pragma once

#include <torch/types.h>

#include <vector>

namespace stemma::engine::model::fused {

// True when the fused kernels take `x`: a float32 CPU tensor (and STEMMA_FUSED is not 0).
bool Applies(const torch::Tensor& x);

// x [..., D] -> x * rsqrt(mean(x^2) + eps) * f, where f = weight (or 1 + weight when
// one_plus), weight [D]; both float32 on the CPU.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                      bool one_plus);

// Rotary embedding on x [B, T, n, hd] (heads not yet moved in front of T): out = x * cos +
// rotate_half(x) * sin, with cos/sin [T, hd] (no gradient flows into them).
torch::Tensor Rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// silu(g) * u for g, u of one shape.
torch::Tensor SiluMul(const torch::Tensor& g, const torch::Tensor& u);

// Linear layers that read the same input (q/k/v; gate/up) as one matrix product over their
// weights stacked [Σ out_i, in], when the weights lie back to back in one buffer — as
// FlatAdamW lays out a layer's trainable weights — so no copy is needed. One product packs
// the input once instead of once per layer, and the backward's input gradient is one product
// instead of several plus their sum. Returns {} when the weights are not laid out so (or
// not fp32 CPU, or CPU autocast is on): the caller then runs the layers one by one.
//
// GroupedLinear: x [..., in] -> y_i [..., out_i] = x W_i^T + b_i (biases all or none).
std::vector<torch::Tensor> GroupedLinear(const torch::Tensor& x,
                                         const std::vector<torch::Tensor>& weights,
                                         const std::vector<torch::Tensor>& biases);
// GatedUp: x [..., H] -> silu(x Wg^T) * (x Wu^T) [..., I], bias-free; undefined when the
// weights are not laid out so.
torch::Tensor GatedUp(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up);

}  // namespace stemma::engine::model::fused
