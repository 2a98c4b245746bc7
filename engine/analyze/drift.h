// Weight drift between two checkpoints (stemma-engine analyze, `drift`): how far each tensor,
// module and layer moved, streamed tensor by tensor from the memory-mapped files so that
// neither model is ever in memory as a whole.
//
//   relative(X) = ‖θ_X − θ0_X‖₂ / ‖θ0_X‖₂ over the concatenation of the tensors in group X
//   (null when ‖θ0_X‖ = 0), computed in float64.
//   asymmetry(l) = relative(down_l) / mean(relative(gate_l), relative(up_l)), where gate_l,
//   up_l and down_l are layer l's mlp.{gate,up,down}_proj weights, or for an MoE layer all
//   its experts' (mlp.experts.*.{gate,up,down}_proj) together.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::analyze {

// drift.json (docs/eval.md). Errors: the checkpoint reader's (naming the directory or file),
// InvalidArgument naming a tensor whose shape differs, and InvalidArgument when the two
// checkpoints share no tensor. Tensors in only one of them are listed, not compared.
//
// With `mask` (one sorted neuron list per layer, e.g. MaskUnion of a neuron_mask.json), each
// layer with masked neurons also gets "masked": the same relative drift over only the masked
// rows of mlp.gate_proj / mlp.up_proj and columns of mlp.down_proj (`gate`, `up`, `down`,
// `all`, `asymmetry`, `neurons`), and the file "masked_total" — the drift of exactly what a
// sparse fine-tune may change, not diluted by the rest of the tensors. InvalidArgument when
// the mask has more layers than the checkpoint or an index past a tensor's size.
absl::StatusOr<nlohmann::json> WeightDrift(const std::string& base_dir,
                                           const std::string& trained_dir,
                                           const std::vector<std::vector<int64_t>>* mask = nullptr);

}  // namespace stemma::engine::analyze
