// LayerShards: `parallel.shard: full` (ZeRO-3, FSDP's full shard; docs/train.md "Sharded data
// parallel"). No rank holds the whole model between uses: each rank keeps only its slice of
// every weight, and a decoder layer's weights exist in full only while that layer runs.
//
// - Units. One shard unit per decoder layer (model.layers.{i}.*) and one for everything
//   else (the embeddings, the untied head, the final norm). A unit's trainable tensors are
//   one ShardedAdamW at Level::kFull (fp32 master slice, Adam moments, L2-SP anchor and LAPE
//   masks of the slice only); its frozen tensors (freeze, frozen experts, DeltaMoE's shared
//   tensors, everything outside an SSFT subset or a LAPE mask's tensors) are sharded the same
//   way, without optimizer state: frozen weights cost 4/W bytes per element, not 4.
// - Forward and backward (model::LayerHooks, engine/model/checkpointing.h). Layer i's units
//   are all-gathered into one flat fp32 buffer right before the layer runs and released
//   right after; in backward the layer is gathered again, recomputed (the hooks make every
//   layer checkpointed, whatever activation_checkpointing says), backpropagated, and its
//   gradients are reduce-scattered into the slice at once (grads_ready) and freed. The outer
//   unit stays gathered for a whole step (GatherOuter .. ReleaseOuter: the embedding is used
//   first and the head last) and is reduce-scattered after each micro-batch's backward.
//   Parameter tensors are never replaced: they are views of the unit's buffer, whose storage
//   is freed and allocated again (the tensors keep their shapes; nothing may read a released
//   parameter). Releasing a layer also drops autocast's bf16 copies of its weights.
// - Step. The L2-SP gradient, masks, Σg² and Σλ‖θ − θ_base‖² of every unit's slice; one
//   all-reduce of each sum gives the global norm; clipping and AdamW per slice. No all-gather:
//   the next forward gathers.
// - Prefetch. Right after layer i is gathered for forward, layer i+1's all-gather starts
//   (DataParallel::AllGatherAsync: the CPU ring's communication thread, or NCCL's stream),
//   and in backward layer i-1's, so the transfer overlaps layer i's compute; at most two
//   layers are resident. Backward prefetches only layers it reached in an earlier step (a
//   frozen prefix whose input needs no gradient is never reached). STEMMA_SHARD_PREFETCH=0
//   turns prefetching off (for measuring it). Forward's last layer is not released: backward
//   starts with it (released after backward, or when another layer is gathered first).
// - Overlapped reduction. A layer's reduce-scatters (grads_ready) are started, not waited
//   for (DataParallel::ReduceScatterAsync): they run while backward recomputes and
//   backpropagates the layer before it, each adding its piece into the slice's gradient when
//   it finishes, and its bucket is freed then. The previous unit's are waited for before a
//   unit starts its own (at most one unit's buckets in flight: about one layer's fp32
//   gradients more at peak when the network is slower than a layer's backward), and the
//   outer unit's (started after backward) before the step. Same buckets, same sums:
//   STEMMA_SHARD_OVERLAP=0 reduces synchronously, with identical results (on by default,
//   CPU or CUDA: ShardOverlapEnabled).
//
// The update is elementwise FlatAdamW's, so W ranks train the same weights as one process
// (sharded_train_test). Every method marked collective must be called by all ranks in the
// same order. Thread-safety: none; one training loop drives it.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/checkpointing.h"
#include "engine/train/distributed.h"
#include "engine/train/optimizer.h"
#include "engine/train/plan.h"
#include "engine/train/sharded_optimizer.h"
#include "stemma/v1/specs/train.pb.h"

namespace stemma::engine::train {

class LayerShards {
 public:
  // `params[i]` is the module parameter planned by `plans[i]` (the model's parameter order),
  // float32, on one device; `num_layers` decoder layers. Every parameter becomes a view of
  // its unit's flat buffer, this rank keeps its slices and every unit is released: only the
  // slices are resident. The slices are read from `initial` when set (the parameters may then
  // be unallocated, engine/model/weightless.h: no rank ever holds more than its slices), else
  // from the parameters, unit by unit. `ranks` is kept by reference and must outlive this.
  LayerShards(int64_t num_layers, const std::vector<ParamPlan>& plans,
              const std::vector<torch::Tensor>& params, const v1::TrainOptimizer& options,
              DataParallel& ranks, int64_t bucket_bytes, const InitialValues& initial = {});
  ~LayerShards();
  LayerShards(const LayerShards&) = delete;
  LayerShards& operator=(const LayerShards&) = delete;

  // The decoder layers' gather / release / grads_ready (collective), for SetLayerHooks.
  std::shared_ptr<const model::LayerHooks> Hooks();

  // Compute in bf16 (autocast): the decoder layers' gathers for forward and backward carry
  // their matrices as bf16 (ShardedAdamW::Gather's `bf16`; half the bytes, the same bf16
  // products). By default on CUDA only; STEMMA_SHARD_BF16_GATHER=1 / 0 forces it on / off.
  // Frozen tensors, the outer unit and ForEachParameter stay fp32.
  void GatherInBf16ForAutocast();

  // The embeddings, head and final norm, for the forward's first and last operations and
  // for held-out evaluation (collective).
  void GatherOuter();
  void ReleaseOuter();

  // Clears the gradients before a step's first micro-batch.
  void ZeroGrad();
  // After each micro-batch's backward: reduce-scatters the outer unit's gradients (the decoder
  // layers' went during backward). Collective.
  void AfterBackward();
  // L2-SP, masks, the global norm and clipping, AdamW on every slice. Statistics are global.
  // Collective.
  FlatAdamW::StepStats Step(double lr, double max_norm);
  int64_t step_count() const { return step_; }

  // Checkpoints. Units are numbered 0..num_layers-1 (decoder layers) and num_layers (the
  // rest). UnitElements: each unit's trainable elements (0: none), whose flat layout is that
  // unit's trainable tensors in model order; rank r of W owns elements [r·k, (r+1)·k) with
  // k = ⌈n/W⌉.
  std::vector<int64_t> UnitElements() const;
  // This rank's slices as 1-D float32 views: "u<unit>.values", "u<unit>.exp_avg",
  // "u<unit>.exp_avg_sq" for every unit with trainable elements on this rank.
  std::vector<std::pair<std::string, torch::Tensor>> SliceTensors() const;
  // Restores elements [begin, end) of unit `unit`'s layout from a piece written at any world
  // size (the part that overlaps this rank's slice). `name`: values, exp_avg or exp_avg_sq.
  void RestoreRange(int64_t unit, const std::string& name, int64_t begin,
                    const torch::Tensor& piece);
  void FinishRestore(int64_t step);
  // Owned elements [begin, end) of unit `unit` on this rank.
  std::pair<int64_t, int64_t> UnitSlice(int64_t unit) const;

  // Frees every slice's optimizer state (moments, gradient, anchor) once no step follows, so
  // that publishing has that memory; the weight slices stay.
  void FreeOptimizerState();

  // Every parameter with its full value, unit by unit in the model's order: each unit is
  // gathered while `visit` sees its tensors (valid only during the call) and released after.
  // Collective; for publishing `out`.
  void ForEachParameter(
      const std::function<void(const std::string& name, const torch::Tensor& value)>& visit);

  // Where this rank's time went since construction, in seconds (STEMMA_TRAIN_PROFILE,
  // trainer.cc). forward / backward: the wall time of the micro-batches' forward (from
  // GatherOuter or the previous AfterBackward to backward's first layer) and backward (to
  // AfterBackward), without the gathers and reduce-scatters in them, which are counted
  // apart; optimizer: Step. gather counts every unit's all-gather (a wait for a prefetched
  // one included); reduce_scatter the packing and starting of the reduce-scatters and the
  // waits for started ones.
  struct Profile {
    double forward = 0, backward = 0, gather = 0, reduce_scatter = 0, optimizer = 0;
    int64_t gathers = 0, prefetches = 0;
  };
  const Profile& profile() const { return profile_; }

 private:
  struct Unit;
  enum class Phase { kIdle, kForward, kBackward };
  // `bf16`: a decoder layer's gather for bf16 compute (GatherInBf16ForAutocast).
  void Gather(Unit& unit, bool bf16 = false);       // collective (or finishes a started one)
  void StartGather(Unit& unit, bool bf16 = false);  // collective, asynchronous
  void FinishGather(Unit& unit);                    // waits for a started gather
  void Release(Unit& unit);
  void ReleaseLayers();         // prefetched layers that were not used (waits for their transfer)
  void GatherLayer(int layer);  // the gather hook
  void ReduceLayer(int layer);  // the grads_ready hook
  double FinishReductions();    // waits for the started reduce-scatters; returns the seconds
  void EndPhase(Phase next);    // closes the current phase's clock and opens `next`

  DataParallel& ranks_;
  int64_t num_layers_ = 0;
  std::vector<std::unique_ptr<Unit>> units_;  // layers, then the outer unit
  int64_t step_ = 0;
  bool prefetch_ = true;
  bool overlap_ = true;               // STEMMA_SHARD_OVERLAP
  bool bf16_gathers_ = false;         // GatherInBf16ForAutocast
  ShardedAdamW* reducing_ = nullptr;  // the unit whose reduce-scatters are in flight
  Profile profile_;
  Phase phase_ = Phase::kIdle;
  int last_layer_ = -1;           // the decoder layer gathered last in this phase
  double phase_start_ = 0;        // Now() when the phase began
  double phase_collectives_ = 0;  // seconds of gathers and reduce-scatters since then
};

}  // namespace stemma::engine::train
