// Activation checkpointing per decoder layer, and the hooks that sharded training (ZeRO-3,
// `parallel.shard: full`) hangs around each layer.
//
// A checkpointed layer is one autograd function. Forward runs the layer without recording
// a graph and saves only its input hidden state [B, T, H]; backward runs the layer again
// with the gradient on (same autocast state as the forward) and backpropagates through that
// recomputed graph: the layer's parameters receive their gradients in .grad exactly as in
// the plain path (accumulated by autograd), the input receives its gradient through the
// function's output. Peak activation memory becomes one [B, T, H] per checkpointed layer
// plus one layer's full activations, for the price of a second forward of those layers.
//
// What stays right:
// - RoPE tables, causal and sliding-window masks: the tables are inputs of the function, the
//   masks are rebuilt from positions; a recompute is the same computation.
// - MoE layers: the router logits [N, E] are a second output of the function, produced once
//   by the forward. The recompute's own router logits only carry the gradient back; they are
//   never appended to the forward's list, so aux losses and routing statistics are counted
//   once.
// - bf16 autocast: the forward's autocast state (enabled, dtype, for the input's device type)
//   is restored around the recompute.
// - RNG: none is needed. The models have no dropout and no sampling in a layer; routing is
//   top-k of the router's probabilities, deterministic for the saved input.
// Not for decoding with a KV cache (the cache is filled by the forward only).
//
// Thread-safety: none beyond LibTorch's autograd; one forward/backward at a time per model.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace stemma::engine::model {

class DecoderLayerImpl;

// Callbacks around every decoder layer, for weights that are not resident between uses
// (ZeRO-3). Each may be empty. `layer` is the decoder layer's index.
//
// With grad enabled (training) every layer runs checkpointed, whatever the checkpointing
// setting: its weights need not outlive the layer's forward.
//   forward of layer i:   gather(i); run layer i without saving activations; release(i)
//   backward of layer i:  gather(i); recompute layer i; backprop through it (the layer's
//                         parameters' .grad now hold this micro-batch's gradient, added to
//                         what they held); grads_ready(i); release(i)
// Backward visits layers last to first. It reaches a layer only when something before or
// in it needs a gradient (a frozen prefix of layers whose input needs none is not visited:
// no gather, grads_ready or release for it).
// With grad disabled (evaluation, generation) a layer runs plainly between gather(i) and
// release(i).
struct LayerHooks {
  std::function<void(int layer)> gather;
  std::function<void(int layer)> release;
  std::function<void(int layer)> grads_ready;
};

// Runs decoder layer `index` on h [B, T, H] with the RoPE tables of its attention kind
// (cos/sin [1, 1, T, hd]) as one checkpointed autograd function; returns [B, T, H]. For an
// MoE layer its router logits [N, E] are appended to `router_logits` (when not null).
// `hooks` may be null. The layer must outlive the backward pass.
torch::Tensor CheckpointedLayer(const std::shared_ptr<DecoderLayerImpl>& layer, int index,
                                const torch::Tensor& h, const torch::Tensor& cos,
                                const torch::Tensor& sin, std::shared_ptr<const LayerHooks> hooks,
                                std::vector<torch::Tensor>* router_logits);

// The forward's autocast state for one device type, restored around a recompute in
// backward (where autocast is off); clears autocast's weight cache when it leaves.
struct AutocastState {
  bool enabled = false;
  at::ScalarType dtype = at::kBFloat16;
  at::DeviceType device = at::kCPU;

  static AutocastState Current(at::DeviceType device);
};

class AutocastRestore {
 public:
  explicit AutocastRestore(const AutocastState& state);
  ~AutocastRestore();
  AutocastRestore(const AutocastRestore&) = delete;
  AutocastRestore& operator=(const AutocastRestore&) = delete;

 private:
  AutocastState state_, previous_;
};

}  // namespace stemma::engine::model
