// ShardedAdamW: FlatAdamW's update (optimizer.h) with the optimizer state sharded over the
// data-parallel ranks, `parallel.shard: optimizer | gradients` (ZeRO stages 1 and 2 in
// DeepSpeed's words; docs/train.md "Parallel training").
//
// - Layout. Trainable parameters become views of one flat fp32 buffer (the compute replica
//   every rank holds), in plan order, padded to W·k elements; rank r owns the elements
//   [r·k, (r+1)·k), "its slice". Only for its slice does a rank keep the Adam moments, the
//   L2-SP anchor, the LAPE masks (one byte per owned masked element, not fp32) and the
//   reduced gradient. The replica is fp32, so the slice's master weights are the replica's
//   own elements: there is no second copy.
// - Gradients. kOptimizer (ZeRO-1): after the last micro-batch the autograd gradients are
//   gathered into a flat [W·k] buffer, which persists, and reduce-scattered in place.
//   kGradients (ZeRO-2): after every micro-batch the gradients are reduce-scattered in
//   buckets of `bucket_mb` straight from the autograd tensors into the slice (accumulated over
//   micro-batches); each parameter's gradient is freed as soon as all of it is packed, and no
//   flat gradient copy exists. A bucket is W equal pieces, piece r from rank r's slice, so
//   one equal-chunk reduce-scatter delivers each rank its piece. Overlapped with backward
//   (OverlapReduction: at W > 1 by default, but for kGradients on a CPU; ShardOverlapEnabled),
//   both levels reduce contiguous ranges instead, as their gradients become final.
// - Step. The L2-SP gradient 2λ(θ − θ_base), the masks, the global gradient norm (Σg² of each
//   slice, all-reduced), clipping and LibTorch's fused AdamW run on the slice only; an
//   in-place all-gather of the flat buffer then gives every rank the updated replica.
//
// - kFull (ZeRO-3, `parallel.shard: full`; used per shard unit by LayerShards, layer_shards.h).
//   The parameters are given one decoder layer (or the embeddings/head/final norm) at a time.
//   The flat buffer is resident only between Gather() and Release(): the parameters stay
//   views of it, and Release frees its storage (the parameter tensors keep their shapes);
//   each rank keeps its slice as its own [k] master copy. Gradients are reduce-scattered by
//   ReduceGrads() (from the layer's grads_ready hook) and the step does no all-gather.
//
// The update is elementwise the same as FlatAdamW's, so a sharded run equals one process with
// the same global batch up to the order of the gradient sums (sharded_train_test).
// Every method that says "collective" must be called by all ranks in the same order.
// Thread-safety: none; one training loop drives it.
#pragma once

#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/train/distributed.h"
#include "engine/train/optimizer.h"
#include "engine/train/overlapped_all_reduce.h"
#include "engine/train/plan.h"
#include "stemma/v1/specs/train.pb.h"

namespace stemma::engine::train {

// The storage of a flat buffer whose views are module parameters, swapped rather than the
// tensor: the views keep their shapes (and autograd its tensors) while nothing is resident.
// Free releases the memory (views must not be read until Allocate); Allocate gives it back,
// uninitialised.
void FreeFlatStorage(const torch::Tensor& flat);
void AllocateFlatStorage(const torch::Tensor& flat);
// A [numel] flat buffer that was never allocated, for taking the parameters' views at
// construction: its storage claims the buffer's size with no memory behind it (views check
// only the size) until FreeFlatStorage puts it in the released state.
torch::Tensor UnallocatedFlat(int64_t numel, const torch::TensorOptions& options);

// Where a sharded optimizer (or LayerShards) takes its parameters' initial values from:
// writes elements [begin, end) of parameter `index`'s value (row-major; an index into the
// constructor's params) into `out` (1-D, end - begin elements, the buffer's dtype and device).
// Unset: the parameters' own values. The trainer reads the checkpoint's tensors through it
// into a weightless model (engine/model/weightless.h), so that only slices are ever loaded.
using InitialValues =
    std::function<void(size_t index, int64_t begin, int64_t end, const torch::Tensor& out)>;

class ShardedAdamW {
 public:
  enum class Level { kOptimizer, kGradients, kFull };

  // As FlatAdamW's constructor; `ranks` (kept by reference, must outlive this) gives W and
  // the rank; `bucket_bytes` caps a kGradients bucket (all W pieces together). The values
  // come from `initial` when set (then the trainable parameters need no memory of their own:
  // kFull reads only this rank's slice, the other levels the replica); the trainable
  // parameters become views of the flat buffer.
  ShardedAdamW(const std::vector<ParamPlan>& plans, const std::vector<torch::Tensor>& params,
               const v1::TrainOptimizer& options, DataParallel& ranks, Level level,
               int64_t bucket_bytes, const InitialValues& initial = {});

  // kOptimizer, kGradients: reduce while backward runs (the trainer asks where
  // ShardOverlapEnabled, overlapped_all_reduce.h; collective). Buckets are then contiguous ranges
  // of the flat layout of at most `bucket_bytes`, last to first (whole tensors; the padding goes
  // with the last tensor), started as soon as their gradients are final (ReadyBuckets,
  // overlapped_all_reduce.h): kGradients in every micro-batch's backward, kOptimizer in the
  // last one's. Each is reduce-scattered with uneven chunks (DataParallel::
  // ReduceScatterVAsync: each rank gets the part of the range in its slice), every element
  // summed in the same order as by the synchronous path, so on the CPU ring the results are
  // the same bit for bit (NCCL has no uneven reduce-scatter: an all-reduce there, whose
  // summation order NCCL picks, so equal within float tolerance). BeforeBackward arms the hooks
  // before each micro-batch's backward; AfterBackward starts the buckets whose hooks did not all
  // fire (parameters without a gradient); the step waits.
  void OverlapReduction();
  void BeforeBackward(bool last);

  // Clears every parameter's .grad and, at the first micro-batch, the reduced gradient.
  void ZeroGrad();
  // After each micro-batch's backward. kGradients: reduce-scatters this micro-batch's
  // gradients into the slice (collective). kOptimizer: after the last one (`last`), gathers
  // and reduce-scatters the flat gradient (collective); otherwise nothing.
  void AfterBackward(bool last);
  // L2-SP, masks, the global norm and clipping, AdamW on the slice, then the all-gather of
  // the weights (collective). Statistics are global (identical on every rank).
  FlatAdamW::StepStats Step(double lr, double max_norm);

  // Step in two halves, for a step over several optimizers (LayerShards) with one global norm:
  // PrepareStep adds the L2-SP gradient and masks the slice's gradient, and returns this
  // rank's Σλ‖θ − θ_base‖² and Σg² (not all-reduced); ApplyStep runs AdamW on the slice with
  // the gradient multiplied by `clip` (1: unclipped). Neither is collective.
  struct LocalSums {
    double l2sp = 0.0, sum_squares = 0.0;
  };
  LocalSums PrepareStep();
  void ApplyStep(double lr, double clip);
  // The clipping factor for a global gradient norm (1 when max_norm <= 0 or not exceeded).
  static double ClipFactor(double grad_norm, double max_norm);

  // kFull. Gather: allocates the flat buffer and all-gathers every rank's slice into it, so
  // the parameters hold their values (collective). Release: frees it (the parameters must not
  // be read until the next Gather). ReduceGrads: reduce-scatters the parameters' .grad (this
  // micro-batch's, zeros where undefined) into the slice's gradient, in buckets, and frees
  // them (collective).
  //
  // bf16 gathers (`bf16` true, after AllowBf16Gather): the tensors of two or more dimensions
  // travel as bf16 (each rank rounds its fp32 slice, round to nearest even) and are widened
  // into the fp32 buffer; the others (norm weights, biases) travel as fp32 in a second
  // all-gather of just those elements. Half the bytes for a layer's matrices, and exact for
  // a compute that only ever uses them as bf16 (autocast's linear and matmul cast a fp32
  // weight to bf16 with the same rounding); the master slice stays fp32. Only for that
  // compute: the parameters hold rounded values until Release (gathered_rounded()).
  void Gather(bool bf16 = false);
  void Release();
  bool gathered() const { return gathered_; }
  bool gathered_rounded() const { return gathered_ && rounded_; }
  void AllowBf16Gather();
  // Gather in two halves, for a prefetch: StartGather allocates the buffer and starts the
  // all-gather (collective, DataParallel::AllGatherAsync); FinishGather waits for it. The
  // parameters must not be read in between. Release waits for a started gather first.
  void StartGather(bool bf16 = false);
  void FinishGather();
  // `overlap`: the buckets' reduce-scatters are started (DataParallel::ReduceScatterAsync) and
  // each adds into the slice's gradient when it has finished, while the caller goes on (the
  // next layer's backward); FinishReduce waits for them. PrepareStep, ZeroGrad, the next
  // ReduceGrads and FreeOptimizerState finish them first. The sums are the same either way.
  void ReduceGrads(bool overlap = false);
  void FinishReduce();
  // Frees the moments, gradient slice and anchor once no step follows (before publishing);
  // the weights stay. Only Gather/Release and SliceTensors' "values" may be used afterwards.
  void FreeOptimizerState();

  std::vector<torch::Tensor> parameters() const;
  int64_t step_count() const { return step_; }
  int64_t num_elements() const { return numel_; }
  // Owned unpadded elements [begin, end) of the flat layout.
  int64_t slice_begin() const { return std::min(rank_ * chunk_, numel_); }
  int64_t slice_end() const { return std::min((rank_ + 1) * chunk_, numel_); }

  // Checkpoint state of the slice: 1-D float32 tensors "values", "exp_avg", "exp_avg_sq"
  // over [slice_begin(), slice_end()) (views).
  std::vector<std::pair<std::string, torch::Tensor>> SliceTensors() const;
  // Restores elements [begin, end) of the flat layout from a checkpoint piece written by any
  // world size: the part that overlaps this rank's slice is copied into the moments (and,
  // for "values", into the replica). The replica is complete once every piece was given and
  // FinishRestore ran (collective: all-gathers the weights).
  void RestoreRange(const std::string& name, int64_t begin, const torch::Tensor& piece);
  void FinishRestore(int64_t step);

 private:
  struct Segment {
    std::string name;
    torch::Tensor param;
    int64_t offset = 0, numel = 0;
    bool decay = false;
    double lambda = 0.0;
    size_t plan = 0;  // index into the constructor's plans
  };
  // The part of a segment inside this rank's slice: flat elements [begin, end).
  struct Piece {
    size_t segment = 0;
    int64_t begin = 0, end = 0;
    torch::Tensor mask;  // bool [end - begin]; undefined when the segment is unmasked
  };
  torch::Tensor BuildPieceMask(const Segment& s, const ParamPlan& plan, int64_t begin,
                               int64_t end) const;
  // Copies the autograd gradients of flat elements [begin, end) into `out` (zeros where a
  // parameter has none, and in the padding); frees a gradient once it was wholly packed.
  void PackGrads(int64_t begin, int64_t end, torch::Tensor out, bool free_packed);
  void ReduceBuckets(bool overlap);  // one micro-batch's gradients into grad_
  void StartRange(size_t bucket);    // OverlapReduction's bucket: pack, reduce-scatter
  torch::Tensor SliceOf(const torch::Tensor& flat, const Piece& p) const {
    return flat.narrow(0, p.begin - rank_ * chunk_, p.end - p.begin);
  }
  void BuildPieces(const std::vector<ParamPlan>& plans);
  void AdamPieces(const std::vector<size_t>& pieces, bool decay, double lr,
                  const std::optional<torch::Tensor>& grad_scale);
  void AdamMasked(const Piece& p, double lr);

  v1::TrainOptimizer options_;
  DataParallel& ranks_;
  Level level_;
  int64_t world_ = 1, rank_ = 0;
  int64_t numel_ = 0, chunk_ = 0;  // unpadded elements; k = ⌈numel / W⌉
  int64_t bucket_bytes_ = 0;
  std::vector<Segment> segments_;
  std::vector<int64_t> packed_;  // per segment: elements packed this micro-batch
  std::vector<Piece> pieces_;
  torch::Tensor values_;  // [W·k] the replica; parameters are views of it (kFull: gathered)
  torch::Tensor master_;  // [k] this rank's slice: a view of values_, or kFull's own copy
  bool gathered_ = true;
  torch::Tensor exp_avg_, exp_avg_sq_;  // [k]
  torch::Tensor grad_;                  // [k] reduced gradient (a view of flat_grads_ at ZeRO-1)
  torch::Tensor flat_grads_;            // [W·k] kOptimizer only
  torch::Tensor anchor_;                // [k] with L2-SP only
  torch::Tensor bucket_;                // kGradients: the reduce-scatter buffer
  bool grad_fresh_ = true;              // the next reduction overwrites grad_
  int64_t step_ = 0;

  std::unique_ptr<DataParallel::Pending> gathering_;  // kFull: a started, unfinished all-gather
  void PackBf16Gather();    // allocates and fills the bf16 gather's wire buffers
  void UnpackBf16Gather();  // widens them into values_ and frees them
  // bf16 gathers (AllowBf16Gather): the flat positions of the fp32-only elements, the
  // positions of their values in wire32_ [W·m] (m: the most any rank owns), and this rank's
  // own as positions in its slice.
  bool bf16_allowed_ = false;
  bool rounded_ = false;                                      // gathered through bf16
  int64_t fp32_chunk_ = 0;                                    // m
  torch::Tensor fp32_positions_, fp32_sources_, fp32_local_;  // int64
  torch::Tensor wire16_, wire32_;  // [W·k] bf16, [W·m] fp32 while a bf16 gather runs
  std::unique_ptr<DataParallel::Pending> gathering32_;
  // OverlapReduction: the buckets' flat element ranges [begin, end), in start order.
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  std::unique_ptr<ReadyBuckets> ready_;
  // Started reduce-scatters whose results add into grad_ (ReduceGrads(true), StartRange);
  // last, so that destroying this waits for them before the tensors above go.
  std::vector<std::unique_ptr<DataParallel::Pending>> reducing_;
};

}  // namespace stemma::engine::train
