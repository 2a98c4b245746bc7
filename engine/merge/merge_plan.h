// From a spec (docs/merge.md) to what to write: the opened sources, and for every output
// checkpoint its tensors with one Recipe each. Planning validates everything (names,
// shapes, dtypes, configs, weights) before a single byte is written.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "engine/merge/checkpoint_stream.h"
#include "engine/merge/kernels.h"

namespace stemma::engine::merge {

struct PlannedOutput {
  std::string out;
  std::vector<OutputTensor> tensors;
  std::vector<Recipe> recipes;                 // recipes[i] computes tensors[i]
  std::map<std::string, std::string> files;    // written as given (e.g. a new config.json)
  std::string carry_from;                      // config/tokenizer files copied from here
  std::vector<std::string> parents;
  nlohmann::json params;                       // recorded in stemma.json
};

struct MergePlan {
  std::vector<std::unique_ptr<SourceCheckpoint>> sources;  // own the mappings recipes point into
  std::vector<PlannedOutput> outputs;
  uint64_t max_shard_bytes = 5'000'000'000;
  bool overwrite = false;
  bool tensor_hashes = false;  // per-tensor sha256 in stemma.json
  bool direct_io = true;       // O_DIRECT shard writes where supported
};

// `command` is merge, revert, interpolate, graft or upcycle; `where` names the spec file in
// errors. InvalidArgument names the field; NotFound/DataLoss name the checkpoint.
absl::StatusOr<MergePlan> PlanFromSpec(const std::string& command, const nlohmann::json& spec,
                                       const std::string& where);

// Which tensors an operation touches (revert, interpolate): tensors of the layer ranges,
// of the modules, and matching the pattern; every given criterion must hold.
struct TensorSelector {
  std::vector<std::pair<int, int>> layers;  // inclusive ranges; empty with has_layers: none
  bool has_layers = false;
  std::vector<std::string> modules;         // attention, mlp, norms, embeddings
  std::string pattern;                      // ECMAScript regex, searched in the name
  bool Matches(const std::string& name) const;
};

// The default "middle" range of an L-layer model: layers round(9L/34) .. round(28L/34) - 1,
// which is 9..27 for Gemma-3-4B's 34 layers (the reference split, algorithms.md 0.2).
std::pair<int, int> MiddleLayers(int num_layers);
// Layer index of a decoder tensor ("...layers.12.mlp..." -> 12, any prefix such as
// "language_model."), or -1: non-layer tensors and a multimodal model's vision tower and
// projector, which layer ranges and modules never select (a pattern can).
int LayerOf(const std::string& name);
bool IsVisionTensor(const std::string& name);

}  // namespace stemma::engine::merge
