#include "engine/train/layer_shards.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace stemma::engine::train {

// A unit's frozen tensors, sharded like the trainable ones but without optimizer state:
// `flat` [W·k] is resident only while gathered; `master` [k] is this rank's slice.
struct FrozenShard {
  std::vector<torch::Tensor> params;
  torch::Tensor flat, master;
  int64_t chunk = 0;
};

struct LayerShards::Unit {
  std::vector<std::string> names;  // every parameter of the unit, in model order
  std::vector<torch::Tensor> params;
  std::unique_ptr<ShardedAdamW> trainable;  // null when the unit trains nothing
  FrozenShard frozen;                       // params empty when nothing is frozen
  bool gathered = true;
};

namespace {

// Moves `params` into one flat buffer (each becomes a view of it), keeps this rank's chunk
// and frees the buffer.
void BuildFrozen(FrozenShard& shard, int64_t world, int64_t rank) {
  if (shard.params.empty()) return;
  int64_t numel = 0;
  for (const auto& p : shard.params) {
    TORCH_CHECK(p.scalar_type() == torch::kFloat32, "sharded parameters must be float32");
    numel += p.numel();
  }
  shard.chunk = (numel + world - 1) / world;
  shard.flat = torch::zeros({world * shard.chunk}, shard.params[0].options().requires_grad(false));
  int64_t offset = 0;
  for (auto& p : shard.params) {
    auto view = shard.flat.narrow(0, offset, p.numel()).view(p.sizes());
    view.copy_(p);
    p.set_data(view);
    offset += p.numel();
  }
  shard.master = shard.flat.narrow(0, rank * shard.chunk, shard.chunk).clone();
  FreeFlatStorage(shard.flat);
}

}  // namespace

LayerShards::LayerShards(int64_t num_layers, const std::vector<ParamPlan>& plans,
                         const std::vector<torch::Tensor>& params,
                         const v1::TrainOptimizer& options, DataParallel& ranks,
                         int64_t bucket_bytes)
    : ranks_(ranks), num_layers_(num_layers) {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<size_t>> members(static_cast<size_t>(num_layers + 1));
  for (size_t i = 0; i < plans.size(); ++i) {
    const int64_t layer = LayerOf(plans[i].name);
    members[layer >= 0 && layer < num_layers ? layer : num_layers].push_back(i);
  }
  // Unit by unit, so that at most one unit exists twice (the loaded tensors and the flat
  // buffer) while the shards are built.
  for (const auto& indices : members) {
    auto unit = std::make_unique<Unit>();
    std::vector<ParamPlan> unit_plans;
    std::vector<torch::Tensor> unit_params;
    for (size_t i : indices) {
      unit->names.push_back(plans[i].name);
      unit->params.push_back(params[i]);
      if (plans[i].trainable) {
        unit_plans.push_back(plans[i]);
        unit_params.push_back(params[i]);
      } else {
        params[i].set_requires_grad(false);
        unit->frozen.params.push_back(params[i]);
      }
    }
    if (!unit_plans.empty()) {
      unit->trainable = std::make_unique<ShardedAdamW>(unit_plans, unit_params, options, ranks,
                                                       ShardedAdamW::Level::kFull, bucket_bytes);
    }
    BuildFrozen(unit->frozen, ranks.world_size(), ranks.rank());
    unit->gathered = false;
    units_.push_back(std::move(unit));
  }
}

LayerShards::~LayerShards() = default;

void LayerShards::Gather(Unit& unit) {
  if (unit.gathered) return;
  torch::NoGradGuard no_grad;
  if (unit.trainable) unit.trainable->Gather();
  FrozenShard& f = unit.frozen;
  if (!f.params.empty()) {
    AllocateFlatStorage(f.flat);
    f.flat.narrow(0, ranks_.rank() * f.chunk, f.chunk).copy_(f.master);
    ranks_.AllGather(f.flat);
  }
  unit.gathered = true;
}

void LayerShards::Release(Unit& unit) {
  if (!unit.gathered) return;
  if (unit.trainable) unit.trainable->Release();
  if (!unit.frozen.params.empty()) FreeFlatStorage(unit.frozen.flat);
  unit.gathered = false;
  // bf16 copies autocast made of the unit's weights (cached per weight tensor for a whole
  // forward) would otherwise keep every layer's weights alive until the step ends.
  at::autocast::clear_cache();
}

std::shared_ptr<const model::LayerHooks> LayerShards::Hooks() {
  auto hooks = std::make_shared<model::LayerHooks>();
  hooks->gather = [this](int layer) { Gather(*units_.at(layer)); };
  hooks->release = [this](int layer) { Release(*units_.at(layer)); };
  hooks->grads_ready = [this](int layer) {
    if (auto& trainable = units_.at(layer)->trainable) trainable->ReduceGrads();
  };
  return hooks;
}

void LayerShards::GatherOuter() { Gather(*units_.back()); }
void LayerShards::ReleaseOuter() { Release(*units_.back()); }

void LayerShards::ZeroGrad() {
  for (auto& unit : units_) {
    if (unit->trainable) unit->trainable->ZeroGrad();
  }
}

void LayerShards::AfterBackward() {
  if (auto& trainable = units_.back()->trainable) trainable->ReduceGrads();
}

FlatAdamW::StepStats LayerShards::Step(double lr, double max_norm) {
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
  for (auto& unit : units_) {
    if (unit->trainable) unit->trainable->FreeOptimizerState();
  }
}

void LayerShards::ForEachParameter(
    const std::function<void(const std::string& name, const torch::Tensor& value)>& visit) {
  torch::NoGradGuard no_grad;
  for (auto& unit : units_) {
    const bool was_gathered = unit->gathered;
    Gather(*unit);
    for (size_t i = 0; i < unit->params.size(); ++i) visit(unit->names[i], unit->params[i]);
    if (!was_gathered) Release(*unit);
  }
}

}  // namespace stemma::engine::train
