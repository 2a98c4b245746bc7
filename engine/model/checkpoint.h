// Hugging Face checkpoint directories <-> CausalLM: load a model (config.json plus
// safetensors, single file or sharded), save one that transformers loads unchanged, and
// create a random one (`stemma-engine init`).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/io/manifest.h"
#include "engine/model/causal_lm.h"
#include "engine/model/config.h"

namespace stemma::engine::model {

// Looks a checkpoint tensor up by its key: NotFound when absent.
using TensorLookup = std::function<absl::StatusOr<torch::Tensor>(const std::string& name)>;

// Copies every parameter of `lm` from `lookup(name)` (converted to the parameter's dtype and
// device). Errors name the tensor: NotFound for a missing one, InvalidArgument for a shape
// mismatch. Gemma3 multimodal checkpoints are accepted: a key missing under its text name is
// looked up as `language_model.<name>` and `model.language_model.<rest>` too.
absl::Status LoadWeights(CausalLM& lm, const TensorLookup& lookup);

struct LoadOptions {
  torch::ScalarType dtype = torch::kFloat32;  // parameter dtype
  torch::Device device = torch::kCPU;
};

// Reads DIR/config.json and the weights. Errors: those of ParseModelConfig and LoadWeights,
// and the reader's (missing or damaged files, named).
absl::StatusOr<CausalLM> LoadModel(const std::string& dir, const LoadOptions& options = {});

struct SaveOptions {
  torch::ScalarType dtype = torch::kFloat32;  // tensors are written in this dtype
  std::vector<std::string> parents;           // parent checkpoint dirs, for the manifest
  io::ManifestProducer producer;              // job, attempt, command, params
  bool overwrite = false;                     // replace an existing `dir`
  // Tokenizer and generation files are copied from here when set.
  std::string source_dir;
  // When set, the tensor written under each parameter name instead of the module's own (e.g.
  // copies gathered from sharded weights, whose module tensors are not resident); converted
  // to `dtype` like the module's.
  TensorLookup tensors;
};

// Writes `lm` as a complete HF checkpoint directory at `dir` through io::CheckpointWriter:
// config.json (lm's ModelConfig::raw, with torch_dtype set), safetensors with exactly the
// parameter names, and the stemma.json manifest. Atomic: nothing new at `dir` on failure.
// AlreadyExists when `dir` exists and !overwrite.
absl::Status SaveModel(CausalLM& lm, const std::string& dir, const SaveOptions& options = {});

// A model with HF-style random weights (CausalLMImpl::InitWeights) for `config`.
absl::StatusOr<CausalLM> InitModel(const ModelConfig& config, uint64_t seed);

// The checkpoint keys of a model with this config, in registration order.
std::vector<std::string> ParameterNames(CausalLM& lm);

}  // namespace stemma::engine::model
