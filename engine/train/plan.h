// The training plan: which parameter tensors train, and how. Built from the spec's strategy
// and the model's parameter names and shapes alone (no LibTorch), so every strategy's
// selection logic is unit-tested without a model.
//
// Rules (docs/train.md, "Strategies"), applied per tensor in this order:
//   1. neuron_mask / expert_subset: a sparse sub-network; every tensor outside it is frozen.
//      Neuron mask (algorithms.md §2.4): rows S_l of mlp.gate_proj/up_proj and columns S_l
//      of mlp.down_proj in layer l. Expert subset (§4.5): the listed experts' three
//      projections, plus the routers (mlp.gate.weight) of those layers when train_routers.
//   2. freeze: tensors of the frozen layer ranges, the embedding (and a tied head with it),
//      the untied head, the final norm.
//   3. frozen_experts: mlp.experts.{e}.* of those experts in every layer.
//   4. l2sp: λ per tensor from the first rule naming its layer, else the default rule.
// Weight decay applies to trainable tensors with ≥ 2 dimensions and λ = 0 (algorithms.md
// §1.2: decay toward 0 and L2-SP toward the base would pull against each other).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/train/spec.h"

namespace stemma::engine::train {

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
};

struct ModelShape {
  int64_t num_layers = 0;
  int64_t intermediate_size = 0;  // per expert for MoE
  int64_t num_experts = 0;        // 0: dense
  bool tie_word_embeddings = false;
};

struct ParamPlan {
  std::string name;
  std::vector<int64_t> shape;
  bool trainable = false;
  bool weight_decay = false;
  double l2sp_lambda = 0.0;
  // Element mask of a partly trainable tensor: rows (dim 0) or columns (dim 1) listed in
  // `indices` (sorted, unique) train; everything else keeps its value bit for bit.
  enum class Mask { kNone, kRows, kColumns };
  Mask mask = Mask::kNone;
  std::vector<int64_t> indices;

  int64_t numel() const;
  // Elements the optimizer may change: numel(), the masked rows/columns, or 0.
  int64_t trainable_elements() const;
};

struct TrainPlan {
  std::vector<ParamPlan> params;  // in the model's parameter order
  // SSFT: layer -> experts the router may choose while training (others get -inf logits).
  std::map<int64_t, std::vector<int64_t>> router_experts;
  int64_t total_params = 0;
  int64_t trainable_params = 0;
  double trainable_fraction() const {
    return total_params == 0 ? 0.0 : static_cast<double>(trainable_params) / total_params;
  }
};

// The decoder layer of `name` (model.layers.{i}.…), or -1 for a non-layer tensor.
int64_t LayerOf(const std::string& name);

// Per-layer neuron lists from a stemma.neuron_mask/1 file: the union over `languages` (all
// languages in the file when empty). Errors name the file and field: a missing language,
// num_layers / intermediate_size differing from the model, a neuron id out of range.
absl::StatusOr<std::vector<std::vector<int64_t>>> LoadNeuronMask(
    const std::string& path, const std::vector<std::string>& languages, const ModelShape& model);

// layer -> sorted unique expert ids of `language`.`set` in an expert-selection file
// (algorithms.md §4.4). Errors name the file and the missing key or bad id.
absl::StatusOr<std::map<int64_t, std::vector<int64_t>>> LoadExpertSubset(
    const std::string& path, const std::string& language, const std::string& set,
    const ModelShape& model);

// Builds the plan. InvalidArgument naming the spec field for a layer range outside the
// model, a strategy the architecture cannot take (neuron_mask on an MoE, expert_subset or
// frozen_experts on a dense model, an expert id out of range), or nothing left to train.
absl::StatusOr<TrainPlan> BuildPlan(const v1::TrainStrategy& strategy, const ModelShape& model,
                                    const std::vector<ParamInfo>& params,
                                    const std::string& spec_source = "spec");

}  // namespace stemma::engine::train
