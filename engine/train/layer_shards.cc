#include "engine/train/layer_shards.h"

#include <ATen/autocast_mode.h>
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/train/overlapped_all_reduce.h"

namespace stemma::engine::train {

// A unit's frozen tensors, sharded like the trainable ones but without optimizer state:
// `flat` [W·k] is resident only while gathered; `master` [k] is this rank's slice.
struct FrozenShard {
  std::vector<torch::Tensor> params;
  torch::Tensor flat, master;
  int64_t chunk = 0;
  std::unique_ptr<DataParallel::Pending> gathering;  // a started, unfinished all-gather
};

struct LayerShards::Unit {
  std::vector<std::string> names;  // every parameter of the unit, in model order
  std::vector<torch::Tensor> params;
  std::unique_ptr<ShardedAdamW> trainable;  // null when the unit trains nothing
  FrozenShard frozen;                       // params empty when nothing is frozen
  bool gathered = true;
  bool gathering = false;            // StartGather ran, FinishGather not yet
  bool reached_in_backward = false;  // a decoder layer that backward has gathered
  bool kept = false;                 // forward's last layer, left gathered for backward
};

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Keeps this rank's chunk of the flat layout of `shard.params` (`indices`: their indices for
// `initial`) as its master and makes the parameters views of an unallocated flat buffer, left
// released: only the chunk is ever read.
void BuildFrozen(FrozenShard& shard, const std::vector<size_t>& indices, int64_t world,
                 int64_t rank, const InitialValues& initial) {
  if (shard.params.empty()) return;
  int64_t numel = 0;
  for (const auto& p : shard.params) {
    TORCH_CHECK(p.scalar_type() == torch::kFloat32, "sharded parameters must be float32");
    numel += p.numel();
  }
  shard.chunk = (numel + world - 1) / world;
  const auto options = shard.params[0].options().requires_grad(false);
  const int64_t lo = rank * shard.chunk, hi = std::clamp(numel, lo, lo + shard.chunk);
  shard.master = torch::empty({shard.chunk}, options);
  shard.master.narrow(0, hi - lo, shard.chunk - (hi - lo)).zero_();  // the padding
  shard.flat = UnallocatedFlat(world * shard.chunk, options);
  int64_t offset = 0;
  for (size_t i = 0; i < shard.params.size(); ++i) {
    torch::Tensor& p = shard.params[i];
    const int64_t begin = std::max(lo, offset), end = std::min(hi, offset + p.numel());
    if (begin < end) {
      auto out = shard.master.narrow(0, begin - lo, end - begin);
      if (initial) {
        initial(indices[i], begin - offset, end - offset, out);
      } else {
        out.copy_(p.detach().reshape(-1).narrow(0, begin - offset, end - begin));
      }
    }
    p.set_data(shard.flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  FreeFlatStorage(shard.flat);
}

}  // namespace

LayerShards::LayerShards(int64_t num_layers, const std::vector<ParamPlan>& plans,
                         const std::vector<torch::Tensor>& params,
                         const v1::TrainOptimizer& options, DataParallel& ranks,
                         int64_t bucket_bytes, const InitialValues& initial)
    : ranks_(ranks), num_layers_(num_layers) {
  const char* prefetch = std::getenv("STEMMA_SHARD_PREFETCH");
  prefetch_ = prefetch == nullptr || std::string(prefetch) != "0";
  overlap_ =
      ShardOverlapEnabled("full", params.empty() ? torch::Device(torch::kCPU) : params[0].device());
  torch::NoGradGuard no_grad;
  std::vector<std::vector<size_t>> members(static_cast<size_t>(num_layers + 1));
  for (size_t i = 0; i < plans.size(); ++i) {
    const int64_t layer = LayerOf(plans[i].name);
    members[layer >= 0 && layer < num_layers ? layer : num_layers].push_back(i);
  }
  // Unit by unit: with `initial` only this rank's slices are ever read; from loaded
  // parameters, each unit's tensors are freed once its slices are kept.
  for (const auto& indices : members) {
    auto unit = std::make_unique<Unit>();
    std::vector<ParamPlan> unit_plans;
    std::vector<torch::Tensor> unit_params;
    std::vector<size_t> trainable, frozen;  // indices into plans
    for (size_t i : indices) {
      unit->names.push_back(plans[i].name);
      unit->params.push_back(params[i]);
      if (plans[i].trainable) {
        unit_plans.push_back(plans[i]);
        unit_params.push_back(params[i]);
        trainable.push_back(i);
      } else {
        params[i].set_requires_grad(false);
        unit->frozen.params.push_back(params[i]);
        frozen.push_back(i);
      }
    }
    if (!unit_plans.empty()) {
      InitialValues unit_initial;
      if (initial) {
        unit_initial = [&initial, &trainable](size_t j, int64_t begin, int64_t end,
                                              const torch::Tensor& out) {
          initial(trainable[j], begin, end, out);
        };
      }
      unit->trainable =
          std::make_unique<ShardedAdamW>(unit_plans, unit_params, options, ranks,
                                         ShardedAdamW::Level::kFull, bucket_bytes, unit_initial);
    }
    BuildFrozen(unit->frozen, frozen, ranks.world_size(), ranks.rank(), initial);
    unit->gathered = false;
    units_.push_back(std::move(unit));
    // Loaded parameters: the unit's tensors are freed now, but glibc keeps freed heap (the
    // train command raises M_TRIM_THRESHOLD so that steps reuse it) and the slices do not
    // refill those holes: a CPU rank would hold the whole fp32 model and its slices at once.
    // Give the free pages back (madvise) unit by unit.
    if (!initial) malloc_trim(0);
  }
}

LayerShards::~LayerShards() = default;

void LayerShards::Gather(Unit& unit, bool bf16) {
  if (unit.gathered && !unit.gathering) return;
  const double start = Now();
  if (unit.gathering) {
    FinishGather(unit);
  } else {
    torch::NoGradGuard no_grad;
    if (unit.trainable) unit.trainable->Gather(bf16);
    FrozenShard& f = unit.frozen;
    if (!f.params.empty()) {
      AllocateFlatStorage(f.flat);
      f.flat.narrow(0, ranks_.rank() * f.chunk, f.chunk).copy_(f.master);
      ranks_.AllGather(f.flat);
    }
    unit.gathered = true;
    ++profile_.gathers;
  }
  const double seconds = Now() - start;
  profile_.gather += seconds;
  phase_collectives_ += seconds;
}

void LayerShards::StartGather(Unit& unit, bool bf16) {
  if (unit.gathered) return;
  const double start = Now();
  torch::NoGradGuard no_grad;
  if (unit.trainable) unit.trainable->StartGather(bf16);
  FrozenShard& f = unit.frozen;
  if (!f.params.empty()) {
    AllocateFlatStorage(f.flat);
    f.flat.narrow(0, ranks_.rank() * f.chunk, f.chunk).copy_(f.master);
    f.gathering = ranks_.AllGatherAsync(f.flat);
  }
  unit.gathered = unit.gathering = true;
  ++profile_.gathers;
  ++profile_.prefetches;
  const double seconds = Now() - start;
  profile_.gather += seconds;
  phase_collectives_ += seconds;
}

void LayerShards::FinishGather(Unit& unit) {
  if (!unit.gathering) return;
  if (unit.trainable) unit.trainable->FinishGather();
  if (unit.frozen.gathering != nullptr) {
    std::unique_ptr<DataParallel::Pending> pending = std::move(unit.frozen.gathering);
    pending->Wait();
  }
  unit.gathering = false;
}

void LayerShards::EndPhase(Phase next) {
  const double now = Now();
  const double compute = now - phase_start_ - phase_collectives_;
  if (phase_ == Phase::kForward) profile_.forward += compute;
  if (phase_ == Phase::kBackward) profile_.backward += compute;
  phase_ = next;
  phase_start_ = now;
  phase_collectives_ = 0;
  last_layer_ = -1;
}

void LayerShards::ReleaseLayers() {
  for (int64_t i = 0; i < num_layers_; ++i) Release(*units_[static_cast<size_t>(i)]);
}

// Backward visits the layers last to first, starting again at the last one forward ran;
// every rank makes the same prefetch decisions, so the collectives stay in the same order.
void LayerShards::GatherLayer(int layer) {
  const bool backward = last_layer_ >= 0 && layer <= last_layer_;
  if (phase_ == Phase::kForward && backward) EndPhase(Phase::kBackward);
  last_layer_ = layer;
  Unit& kept = *units_[static_cast<size_t>(num_layers_ - 1)];
  if (kept.kept && layer != num_layers_ - 1) Release(kept);  // a new forward: not needed
  kept.kept = false;
  Unit& unit = *units_.at(static_cast<size_t>(layer));
  if (backward) unit.reached_in_backward = true;
  Gather(unit, bf16_gathers_);
  const int next = backward ? layer - 1 : layer + 1;
  if (!prefetch_ || next < 0 || next >= num_layers_) return;
  Unit& following = *units_[static_cast<size_t>(next)];
  if (backward && !following.reached_in_backward) return;
  StartGather(following, bf16_gathers_);
}

void LayerShards::GatherInBf16ForAutocast() {
  // On the CPU ring the transfer is hidden behind the prefetch already, and the rounding and
  // widening on the training thread cost more than the halved bytes save (measured: gathers
  // +20 % on 2 CPU ranks): by default only for CUDA.
  const char* knob = std::getenv("STEMMA_SHARD_BF16_GATHER");
  const bool on_cuda =
      !units_.empty() && !units_[0]->params.empty() && units_[0]->params[0].device().is_cuda();
  if (knob != nullptr ? std::string(knob) == "0" : !on_cuda) return;
  bf16_gathers_ = true;
  for (int64_t i = 0; i < num_layers_; ++i) {
    if (auto& trainable = units_[static_cast<size_t>(i)]->trainable) trainable->AllowBf16Gather();
  }
}

// Overlapped, a unit's reduce-scatters run while backward goes on to the next layer; the
// previous unit's are waited for first, so that at most one unit's buckets are in flight.
void LayerShards::ReduceLayer(int layer) {
  auto& trainable = units_.at(layer)->trainable;
  if (!trainable) return;
  const double start = Now();
  FinishReductions();
  trainable->ReduceGrads(overlap_);
  if (overlap_) reducing_ = trainable.get();
  const double seconds = Now() - start;
  profile_.reduce_scatter += seconds;
  phase_collectives_ += seconds;
}

double LayerShards::FinishReductions() {
  if (reducing_ == nullptr) return 0.0;
  const double start = Now();
  ShardedAdamW* unit = reducing_;
  reducing_ = nullptr;
  unit->FinishReduce();
  return Now() - start;
}

void LayerShards::Release(Unit& unit) {
  unit.kept = false;
  if (!unit.gathered) return;
  FinishGather(unit);  // a transfer must not write into freed memory
  if (unit.trainable) unit.trainable->Release();
  if (!unit.frozen.params.empty()) FreeFlatStorage(unit.frozen.flat);
  unit.gathered = false;
  // bf16 copies autocast made of the unit's weights (cached per weight tensor for a whole
  // forward) would otherwise keep every layer's weights alive until the step ends.
  at::autocast::clear_cache();
}

std::shared_ptr<const model::LayerHooks> LayerShards::Hooks() {
  auto hooks = std::make_shared<model::LayerHooks>();
  hooks->gather = [this](int layer) { GatherLayer(layer); };
  hooks->release = [this](int layer) {
    // Forward's last decoder layer stays gathered: backward starts with it (one all-gather
    // fewer per micro-batch, and the one nothing could prefetch). The next gather of another
    // layer, AfterBackward or ReleaseOuter releases it.
    Unit& unit = *units_.at(static_cast<size_t>(layer));
    if (phase_ == Phase::kForward && layer == num_layers_ - 1 && layer > 0) {
      unit.kept = true;
      return;
    }
    Release(unit);
  };
  hooks->grads_ready = [this](int layer) { ReduceLayer(layer); };
  return hooks;
}

void LayerShards::GatherOuter() {
  if (phase_ == Phase::kIdle) EndPhase(Phase::kForward);
  Gather(*units_.back());
}

void LayerShards::ReleaseOuter() {
  ReleaseLayers();
  Release(*units_.back());
  EndPhase(Phase::kIdle);
  // The outer unit's reduce-scatters (AfterBackward) would otherwise be waited for by the
  // step's first collective (the loss sum), outside every phase of the profile.
  profile_.reduce_scatter += FinishReductions();
}

void LayerShards::ZeroGrad() {
  profile_.reduce_scatter += FinishReductions();
  for (auto& unit : units_) {
    if (unit->trainable) unit->trainable->ZeroGrad();
  }
}

void LayerShards::AfterBackward() {
  ReleaseLayers();
  ReduceLayer(static_cast<int>(num_layers_));  // the outer unit
  EndPhase(Phase::kForward);                   // the next micro-batch's
}

FlatAdamW::StepStats LayerShards::Step(double lr, double max_norm) {
  profile_.reduce_scatter += FinishReductions();  // the outer unit's, started by AfterBackward
  const double start = Now();
  double l2sp = 0.0, sum_squares = 0.0;
  for (auto& unit : units_) {
    if (!unit->trainable) continue;
    const ShardedAdamW::LocalSums sums = unit->trainable->PrepareStep();
    l2sp += sums.l2sp;
    sum_squares += sums.sum_squares;
  }
  FlatAdamW::StepStats stats;
  stats.l2sp = ranks_.AllReduceSum(l2sp);
  stats.grad_norm = std::sqrt(ranks_.AllReduceSum(sum_squares));
  const double clip = ShardedAdamW::ClipFactor(stats.grad_norm, max_norm);
  for (auto& unit : units_) {
    if (unit->trainable) unit->trainable->ApplyStep(lr, clip);
  }
  ++step_;
  profile_.optimizer += Now() - start;
  return stats;
}

std::vector<int64_t> LayerShards::UnitElements() const {
  std::vector<int64_t> out;
  for (const auto& unit : units_) {
    out.push_back(unit->trainable ? unit->trainable->num_elements() : 0);
  }
  return out;
}

std::pair<int64_t, int64_t> LayerShards::UnitSlice(int64_t unit) const {
  const auto& trainable = units_.at(static_cast<size_t>(unit))->trainable;
  if (!trainable) return {0, 0};
  return {trainable->slice_begin(), trainable->slice_end()};
}

std::vector<std::pair<std::string, torch::Tensor>> LayerShards::SliceTensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& trainable = units_[u]->trainable;
    if (!trainable || trainable->slice_end() <= trainable->slice_begin()) continue;
    for (auto& [name, tensor] : trainable->SliceTensors()) {
      out.emplace_back(absl::StrCat("u", u, ".", name), tensor);
    }
  }
  return out;
}

void LayerShards::RestoreRange(int64_t unit, const std::string& name, int64_t begin,
                               const torch::Tensor& piece) {
  if (auto& trainable = units_.at(static_cast<size_t>(unit))->trainable) {
    trainable->RestoreRange(name, begin, piece);
  }
}

void LayerShards::FinishRestore(int64_t step) {
  for (auto& unit : units_) {
    if (unit->trainable) unit->trainable->FinishRestore(step);
  }
  step_ = step;
}

void LayerShards::FreeOptimizerState() {
  FinishReductions();
  for (auto& unit : units_) {
    if (unit->trainable) unit->trainable->FreeOptimizerState();
  }
  malloc_trim(0);  // so that publishing's copies have these pages (glibc keeps freed heap)
}

void LayerShards::ForEachParameter(
    const std::function<void(const std::string& name, const torch::Tensor& value)>& visit) {
  torch::NoGradGuard no_grad;
  for (auto& unit : units_) {
    // A layer gathered through bf16 holds rounded weights: gather it again in fp32.
    if (unit->trainable && unit->trainable->gathered_rounded()) Release(*unit);
    const bool was_gathered = unit->gathered;
    Gather(*unit);
    for (size_t i = 0; i < unit->params.size(); ++i) visit(unit->names[i], unit->params[i]);
    if (!was_gathered) Release(*unit);
  }
}

}  // namespace stemma::engine::train
