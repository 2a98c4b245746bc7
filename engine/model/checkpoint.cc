#include "engine/model/checkpoint.h"

#include <c10/util/Exception.h>
#include <torch/types.h>

#include <exception>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "engine/io/checkpoint.h"
#include "engine/model/guard.h"

namespace stemma::engine::model {
namespace {

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

const char* DtypeJsonName(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kFloat16:
      return "float16";
    default:
      return "float32";
  }
}

}  // namespace

std::vector<std::string> ParameterNames(CausalLM& lm) {
  std::vector<std::string> names;
  for (const auto& item : lm->named_parameters(/*recurse=*/true)) names.push_back(item.key());
  return names;
}

absl::Status LoadWeights(CausalLM& lm, const TensorLookup& lookup) {
  torch::NoGradGuard no_grad;
  const bool gemma = lm->config().arch == Arch::kGemma3;
  for (auto& item : lm->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    absl::StatusOr<torch::Tensor> source = lookup(name);
    if (!source.ok() && absl::IsNotFound(source.status()) && gemma) {
      // Multimodal Gemma3: the text decoder under language_model.* (the checkpoint layout)
      // or model.language_model.* (what newer transformers save).
      source = lookup("language_model." + name);
      if (!source.ok() && absl::IsNotFound(source.status()) && absl::StartsWith(name, "model.")) {
        source = lookup("model.language_model." + name.substr(6));
      }
      if (!source.ok() && absl::IsNotFound(source.status())) {
        source = absl::NotFoundError(absl::StrCat("checkpoint has no tensor '", name, "'"));
      }
    }
    if (!source.ok()) return source.status();
    torch::Tensor& param = item.value();
    if (source->sizes() != param.sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' has shape ", ShapeString(source->sizes()),
                       " in the checkpoint, ", "the config wants ", ShapeString(param.sizes())));
    }
    RETURN_IF_ERROR(TorchGuard(absl::StrCat("copying tensor '", name, "'"), [&] {
      param.copy_(*source);
      return absl::OkStatus();
    }));
  }
  return absl::OkStatus();
}

absl::StatusOr<CausalLM> LoadModel(const std::string& dir, const LoadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<io::CheckpointReader> reader, io::CheckpointReader::Open(dir));
  if (reader->config().is_null()) {
    return absl::NotFoundError(absl::StrCat(dir, ": no config.json"));
  }
  absl::StatusOr<ModelConfig> config = ParseModelConfig(reader->config());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(dir, "/config.json: ", config.status().message()));
  }
  CausalLM lm{nullptr};
  RETURN_IF_ERROR(TorchGuard("building the model", [&] {
    lm = CausalLM(*std::move(config));
    lm->to(options.device, options.dtype);
    return absl::OkStatus();
  }));
  const io::CheckpointReader& r = *reader;
  absl::Status status = LoadWeights(lm, [&](const std::string& name) {
    if (!r.Has(name)) {
      return absl::StatusOr<torch::Tensor>(
          absl::NotFoundError(absl::StrCat(dir, ": checkpoint has no tensor '", name, "'")));
    }
    return r.Tensor(name);
  });
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat(dir, ": ", status.message()));
  lm->eval();
  return lm;
}

absl::Status SaveModel(CausalLM& lm, const std::string& dir, const SaveOptions& options) {
  io::CheckpointWriterOptions writer_options;
  writer_options.overwrite = options.overwrite;
  writer_options.source_dir = options.source_dir;
  writer_options.parents = options.parents;
  writer_options.producer = options.producer;
  ASSIGN_OR_RETURN(std::unique_ptr<io::CheckpointWriter> writer,
                   io::CheckpointWriter::Create(dir, std::move(writer_options)));
  nlohmann::json config = lm->config().raw;
  config["torch_dtype"] = DtypeJsonName(options.dtype);
  if (config.contains("dtype")) config["dtype"] = DtypeJsonName(options.dtype);
  RETURN_IF_ERROR(writer->AddFile("config.json", config.dump(2) + "\n"));
  for (const auto& item : lm->named_parameters(/*recurse=*/true)) {
    torch::Tensor tensor = item.value();
    if (options.tensors) {
      ASSIGN_OR_RETURN(tensor, options.tensors(item.key()));
    }
    RETURN_IF_ERROR(TorchGuard(absl::StrCat("converting tensor '", item.key(), "'"), [&] {
      tensor = tensor.detach().to(options.dtype).contiguous();
      return absl::OkStatus();
    }));
    RETURN_IF_ERROR(writer->AddTensor(item.key(), tensor));
  }
  return writer->Commit();
}

absl::StatusOr<CausalLM> InitModel(const ModelConfig& config, uint64_t seed) {
  CausalLM lm{nullptr};
  RETURN_IF_ERROR(TorchGuard("initialising the model", [&] {
    lm = CausalLM(config);
    lm->InitWeights(seed);
    return absl::OkStatus();
  }));
  return lm;
}

}  // namespace stemma::engine::model
