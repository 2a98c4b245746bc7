// OverlappedAllReduce: `parallel.shard: none` (plain data parallel) with the gradient
// all-reduce overlapping the last micro-batch's backward, as PyTorch DDP's reducer does.
//
// - Buckets. The trainable parameters, last to first (the order backward finishes them),
//   are cut into buckets of at most `bucket_bytes` of fp32 (a larger tensor gets its own).
//   Each bucket has a flat fp32 buffer that persists across steps (4 bytes per trainable
//   element, as the flat gradient copy of the synchronous path).
// - Hooks (ReadyBuckets, below). Armed for the last micro-batch's backward: once every
//   parameter of a bucket is final and every bucket before it was started, the bucket's
//   gradients are copied into its buffer and its all-reduce is started
//   (DataParallel::AllReduceAsync).
// - Finish, after that backward: starts the buckets not started yet (zeros for parameters
//   without a gradient, as FlatAdamW::FlatGrads gives), waits for all of them and points
//   each parameter's .grad at its view of the bucket, now the mean over ranks. The
//   optimizer's step then sees the same gradients as after AllReduceMeanGradients: at two
//   ranks bit for bit (a sum of two is exact in any order), at more up to the order of the
//   additions (another cut into ring chunks).
//
// Thread-safety: none; one training loop drives it (hooks run while it waits in backward()).
// Every rank must arm and finish at the same micro-batches (collective).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/train/distributed.h"

namespace stemma::engine::train {

// Whether gradient reductions overlap backward at parallel.shard `shard` (none here,
// optimizer and gradients in ShardedAdamW, full in LayerShards) for parameters on `device`.
// STEMMA_SHARD_OVERLAP=1 / 0 forces it on / off at every level. By default on CUDA at every
// level (NCCL runs on its own stream, as DDP's and FSDP's reductions do), and on a CPU at
// every level but gradients, where it measured slower. Median step-time ratio on/off on 2 CPU
// ranks (interleaved pairs, 2026-12-03; docs/train.md): a 55.6 M model with 16-token rows,
// whose steps the ring's traffic dominates (6 pairs): none 1.02, optimizer 0.97, gradients
// 1.10 (5 pairs of 6 above 1), full 0.78; tests/bench/sharded's 4.3 M model, one bucket
// (9 pairs): none 0.90, optimizer 0.95, gradients 0.92, full 0.92. Overlapped, gradients
// reduce contiguous ranges with uneven chunks (one way on the ring at W = 2, each into a
// bucket allocated afresh) instead of equal-chunk buckets; optimizer does the same in place
// in its flat gradient, once per step.
bool ShardOverlapEnabled(const std::string& shard, const torch::Device& device);

// ReadyBuckets: the bucket bookkeeping of an overlapped reduction. Each parameter gets an
// autograd post-accumulate-grad hook; while armed, a hook marks its parameter final, and
// every bucket whose parameters are all final is started — strictly in bucket order, so
// every rank starts the same collectives in the same order even where their backward passes
// differ (a parameter without a gradient on one rank, e.g. an MoE expert no token reached,
// never fires: its bucket and those after it start in StartRest). A hook may fire again
// without a new gradient (an activation-checkpointed layer's parameters: the recompute's
// backward accumulates, then the checkpoint function's own edge brings none); a gradient
// that changes after its bucket has started is a broken invariant (the bucket was reduced
// incomplete): c10::Error. Hooks run on the thread that runs the parameter's backward (the
// caller's for CPU tensors, autograd's device thread for CUDA ones).
class ReadyBuckets {
 public:
  // `members[b]`: indices into `params` of bucket b's parameters; `start(b)` starts bucket b
  // (once per armed backward, from a hook or from StartRest). Registers the hooks.
  ReadyBuckets(std::vector<torch::Tensor> params, std::vector<std::vector<size_t>> members,
               std::function<void(size_t bucket)> start);
  ~ReadyBuckets();  // removes the hooks
  ReadyBuckets(const ReadyBuckets&) = delete;
  ReadyBuckets& operator=(const ReadyBuckets&) = delete;

  // The next backward's final gradients start their buckets.
  void Arm();
  // After that backward: starts the buckets not started yet, in order, and disarms.
  void StartRest();
  bool armed() const { return armed_; }
  // The hook of parameter `index`.
  void GradReady(size_t index);

 private:
  std::vector<torch::Tensor> params_;
  std::vector<std::vector<size_t>> members_;
  std::function<void(size_t)> start_;
  std::vector<size_t> bucket_of_;  // per parameter
  std::vector<bool> final_;        // per parameter: its hook fired while armed
  std::vector<int64_t> waiting_;   // per bucket: parameters not final yet
  // Per parameter: its .grad (tensor, version) once its bucket started; null if none.
  std::vector<std::pair<const void*, int64_t>> started_grad_;
  std::pair<const void*, int64_t> GradState(size_t index) const;
  void Start(size_t bucket);  // start_, then records its parameters' GradState
  size_t next_ = 0;           // the first bucket not started
  bool armed_ = false;
};

class OverlappedAllReduce {
 public:
  // `params`: the model's parameters in its order; those that require grad (float32, one
  // device) are reduced. `ranks` is kept by reference and must outlive this. Registers the
  // hooks.
  OverlappedAllReduce(const std::vector<torch::Tensor>& params, DataParallel& ranks,
                      int64_t bucket_bytes);
  // Removes the hooks (waits for started all-reduces).
  ~OverlappedAllReduce();
  OverlappedAllReduce(const OverlappedAllReduce&) = delete;
  OverlappedAllReduce& operator=(const OverlappedAllReduce&) = delete;

  // The next backward is the last of the step: its final gradients are reduced as they come.
  void Arm() { ready_->Arm(); }
  // After that backward (collective): every parameter's .grad is the mean over ranks.
  void Finish();

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_, in the bucket's layout order
    int64_t numel = 0;
    torch::Tensor flat;  // [numel] fp32, allocated on first use
    std::unique_ptr<DataParallel::Pending> reducing;
  };
  void Start(Bucket& bucket);

  std::vector<torch::Tensor> params_;
  std::vector<int64_t> offset_;  // per parameter: elements into its bucket
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;  // in the order they are started
  DataParallel& ranks_;
  std::unique_ptr<ReadyBuckets> ready_;  // last: its hooks go first
};

}  // namespace stemma::engine::train
