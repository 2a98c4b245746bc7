// Hugging Face checkpoint directories <-> CausalLM: load a model (config.json plus
// safetensors, single file or sharded), save one that transformers loads unchanged, and
// create a random one (`stemma-engine init`).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/io/checkpoint.h"
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
  // How the checkpoint is checked against its stemma.json. kOncePerJob: every rank of a
  // multi-rank train or eval loads the same model, so rank 0 hashes the files and the other
  // ranks only check their sizes (a damaged file still fails rank 0 and with it the attempt).
  io::CheckpointReaderOptions::Verify verify = io::CheckpointReaderOptions::Verify::kOncePerJob;
};

// Reads DIR/config.json and the weights. Errors: those of ParseModelConfig and LoadWeights,
// and the reader's (missing or damaged files, named).
absl::StatusOr<CausalLM> LoadModel(const std::string& dir, const LoadOptions& options = {});

// A model whose weights are read later, piece by piece (the sharded trainer: each rank reads
// only its slices; issue 26). `lm` is built weightless (weightless.h: every parameter has its
// shape, options.dtype and options.device, and no memory); `weights` looks a parameter up by
// its name (the Gemma3 multimodal fallbacks of LoadWeights included) and gives the checkpoint
// tensor with the file's dtype, zero-copy over the memory-mapped file, so only the bytes read
// are paged in (file-backed, not anonymous memory). The files stay mapped while `weights` (or a
// tensor it gave) is alive.
struct UnloadedModel {
  CausalLM lm{nullptr};
  TensorLookup weights;
};

// As LoadModel, without reading any tensor: every parameter is checked against the
// checkpoint's headers (present, same shape), with LoadWeights' errors.
absl::StatusOr<UnloadedModel> OpenModel(const std::string& dir, const LoadOptions& options = {});

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

// SaveModel for a model whose weights no process holds at once (parallel.shard: full, which
// gathers one layer at a time): Create declares every parameter of `lm` (its shapes only; lm's
// tensors are never read) and the files SaveModel writes besides; Write converts one
// parameter's whole value to options.dtype and writes it straight into its safetensors file
// (io::CheckpointWriter::WriteTensor), so nothing is kept; Commit publishes `dir` atomically
// once every parameter was written. The same files and bytes as SaveModel. options.tensors
// is not used. Errors as SaveModel's; Write: InvalidArgument for an unknown name or shape.
// Not thread-safe.
class StreamedModelWriter {
 public:
  static absl::StatusOr<std::unique_ptr<StreamedModelWriter>> Create(CausalLM& lm,
                                                                     const std::string& dir,
                                                                     const SaveOptions& options);
  ~StreamedModelWriter();
  absl::Status Write(const std::string& name, const torch::Tensor& value);
  absl::Status Commit();

 private:
  StreamedModelWriter() = default;
  std::unique_ptr<io::CheckpointWriter> writer_;
  torch::ScalarType dtype_ = torch::kFloat32;
};

// A model with HF-style random weights (CausalLMImpl::InitWeights) for `config`.
absl::StatusOr<CausalLM> InitModel(const ModelConfig& config, uint64_t seed);

// The checkpoint keys of a model with this config, in registration order.
std::vector<std::string> ParameterNames(CausalLM& lm);

}  // namespace stemma::engine::model
