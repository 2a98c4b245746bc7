// From a typed spec (stemma/v1/specs/merge.proto, docs/merge.md) to what to write: the
// opened sources, and for every output checkpoint its tensors with one Recipe each. The
// spec's own rules were checked when it was read (common/spec_checks_merge.cc); planning
// checks what needs the checkpoints (names, shapes, dtypes, configs, layer counts) before a
// single byte is written.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/merge/checkpoint_stream.h"
#include "engine/merge/kernels.h"
#include "google/protobuf/message.h"

namespace stemma::engine::merge {

struct PlannedOutput {
  std::string out;
  // The output event's name: "model", or "model_alpha_<α>" for each checkpoint of a sweep
  // (the worker keeps one artifact per name).
  std::string name = "model";
  std::vector<OutputTensor> tensors;
  std::vector<Recipe> recipes;               // recipes[i] computes tensors[i]
  std::map<std::string, std::string> files;  // written as given (e.g. a new config.json)
  std::string carry_from;                    // config/tokenizer files copied from here
  std::vector<std::string> parents;
  nlohmann::json params;  // recorded in stemma.json
};

struct MergePlan {
  std::vector<std::unique_ptr<SourceCheckpoint>> sources;  // own the mappings recipes point into
  std::vector<PlannedOutput> outputs;
  uint64_t max_shard_bytes = 5'000'000'000;
  bool overwrite = false;
  bool tensor_hashes = false;  // per-tensor sha256 in stemma.json
  bool direct_io = true;       // O_DIRECT shard writes where supported
  // Extra fields of the start event: the layer ranges as resolved against the model
  // ("layers": ["2:7"] for "middle" of 8 layers), per-range alphas.
  nlohmann::ordered_json start = nlohmann::ordered_json::object();
};

// `spec` is the command's message (MergeSpec, RevertSpec, InterpolateSpec, GraftSpec or
// UpcycleSpec), defaults filled and rules checked; `where` names the spec file in errors.
// NotFound (a missing checkpoint), InvalidArgument (tensors, shapes, configs that do not
// fit the operation, a layer range past the model's layers), DataLoss (a damaged file): each
// names the field, the checkpoint and the tensor.
absl::StatusOr<MergePlan> PlanFromSpec(const google::protobuf::Message& spec,
                                       const std::string& where);

// Which tensors an operation touches (revert, interpolate): tensors of the layer ranges,
// of the modules, and matching the pattern; every given criterion must hold.
struct TensorSelector {
  std::vector<std::pair<int, int>> layers;  // half-open [begin, end) (common/layer_range.h)
  bool has_layers = false;
  std::vector<std::string> modules;  // attention, mlp, norms, embeddings
  std::string pattern;               // ECMAScript regex, searched in the name
  bool Matches(const std::string& name) const;
};

// Layer index of a decoder tensor ("...layers.12.mlp..." -> 12, any prefix such as
// "language_model."), or -1: non-layer tensors and a multimodal model's vision tower and
// projector, which layer ranges and modules never select (a pattern can).
int LayerOf(const std::string& name);
bool IsVisionTensor(const std::string& name);

}  // namespace stemma::engine::merge
