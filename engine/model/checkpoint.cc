#include "engine/model/checkpoint.h"

#include <c10/util/Exception.h>
#include <torch/types.h>

#include <exception>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "engine/io/checkpoint.h"
#include "engine/model/guard.h"
#include "engine/model/weightless.h"

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

absl::StatusOr<ModelConfig> ReadConfig(const io::CheckpointReader& reader) {
  if (reader.config().is_null()) {
    return absl::NotFoundError(absl::StrCat(reader.dir(), ": no config.json"));
  }
  absl::StatusOr<ModelConfig> config = ParseModelConfig(reader.config());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(reader.dir(), "/config.json: ", config.status().message()));
  }
  return config;
}

// The reader's tensors by name, NotFound for an absent one (the caller names the directory).
TensorLookup ReaderLookup(std::shared_ptr<const io::CheckpointReader> reader) {
  return [reader = std::move(reader)](const std::string& name) -> absl::StatusOr<torch::Tensor> {
    if (!reader->Has(name)) {
      return absl::NotFoundError(absl::StrCat("checkpoint has no tensor '", name, "'"));
    }
    return reader->Tensor(name);
  };
}

// `lookup` with LoadWeights' Gemma3 multimodal fallbacks: a parameter missing under its text
// name is looked up as language_model.<name> and model.language_model.<rest>.
TensorLookup ParameterLookup(TensorLookup lookup, bool gemma) {
  if (!gemma) return lookup;
  return [lookup = std::move(lookup)](const std::string& name) -> absl::StatusOr<torch::Tensor> {
    absl::StatusOr<torch::Tensor> source = lookup(name);
    if (source.ok() || !absl::IsNotFound(source.status())) return source;
    source = lookup("language_model." + name);
    if (!source.ok() && absl::IsNotFound(source.status()) && absl::StartsWith(name, "model.")) {
      source = lookup("model.language_model." + name.substr(6));
    }
    if (!source.ok() && absl::IsNotFound(source.status())) {
      source = absl::NotFoundError(absl::StrCat("checkpoint has no tensor '", name, "'"));
    }
    return source;
  };
}

// InvalidArgument naming the tensor when the checkpoint's shape is not the parameter's.
absl::Status CheckShape(const std::string& name, const torch::Tensor& source,
                        const torch::Tensor& param) {
  if (source.sizes() == param.sizes()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", name, "' has shape ", ShapeString(source.sizes()),
                   " in the checkpoint, ", "the config wants ", ShapeString(param.sizes())));
}

}  // namespace

std::vector<std::string> ParameterNames(CausalLM& lm) {
  std::vector<std::string> names;
  for (const auto& item : lm->named_parameters(/*recurse=*/true)) names.push_back(item.key());
  return names;
}

absl::Status LoadWeights(CausalLM& lm, const TensorLookup& lookup) {
  torch::NoGradGuard no_grad;
  const TensorLookup parameter = ParameterLookup(lookup, lm->config().arch == Arch::kGemma3);
  for (auto& item : lm->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    ASSIGN_OR_RETURN(torch::Tensor source, parameter(name));
    torch::Tensor& param = item.value();
    RETURN_IF_ERROR(CheckShape(name, source, param));
    RETURN_IF_ERROR(TorchGuard(absl::StrCat("copying tensor '", name, "'"), [&] {
      param.copy_(source);
      return absl::OkStatus();
    }));
  }
  return absl::OkStatus();
}

absl::StatusOr<UnloadedModel> OpenModel(const std::string& dir, const LoadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<io::CheckpointReader> opened,
                   io::CheckpointReader::Open(dir, {.verify = options.verify}));
  std::shared_ptr<const io::CheckpointReader> reader = std::move(opened);
  ASSIGN_OR_RETURN(ModelConfig config, ReadConfig(*reader));
  UnloadedModel out;
  RETURN_IF_ERROR(TorchGuard("building the model", [&] {
    WeightlessScope weightless(torch::TensorOptions().dtype(options.dtype).device(options.device));
    out.lm = CausalLM(std::move(config));
    return absl::OkStatus();
  }));
  out.weights = ParameterLookup(ReaderLookup(reader), out.lm->config().arch == Arch::kGemma3);
  // The headers only: a zero-copy tensor reads no data until its elements are.
  for (const auto& item : out.lm->named_parameters(/*recurse=*/true)) {
    absl::StatusOr<torch::Tensor> source = out.weights(item.key());
    if (!source.ok()) {
      return absl::Status(source.status().code(),
                          absl::StrCat(dir, ": ", source.status().message()));
    }
    absl::Status shape = CheckShape(item.key(), *source, item.value());
    if (!shape.ok()) return absl::Status(shape.code(), absl::StrCat(dir, ": ", shape.message()));
  }
  out.lm->eval();
  return out;
}

absl::StatusOr<CausalLM> LoadModel(const std::string& dir, const LoadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<io::CheckpointReader> opened,
                   io::CheckpointReader::Open(dir, {.verify = options.verify}));
  std::shared_ptr<const io::CheckpointReader> reader = std::move(opened);
  absl::StatusOr<ModelConfig> config = ReadConfig(*reader);
  if (!config.ok()) return config.status();
  CausalLM lm{nullptr};
  RETURN_IF_ERROR(TorchGuard("building the model", [&] {
    lm = CausalLM(*std::move(config));
    lm->to(options.device, options.dtype);
    return absl::OkStatus();
  }));
  absl::Status status = LoadWeights(lm, ReaderLookup(reader));
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat(dir, ": ", status.message()));
  lm->eval();
  return lm;
}

namespace {

// A writer for `dir` with config.json (lm's, with torch_dtype set) added: SaveModel's files
// besides the tensors.
absl::StatusOr<std::unique_ptr<io::CheckpointWriter>> ModelWriter(CausalLM& lm,
                                                                  const std::string& dir,
                                                                  const SaveOptions& options) {
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
  return writer;
}

// `tensor` as written: detached, in `dtype`, contiguous.
absl::StatusOr<torch::Tensor> Converted(const std::string& name, const torch::Tensor& tensor,
                                        torch::ScalarType dtype) {
  torch::Tensor out;
  RETURN_IF_ERROR(TorchGuard(absl::StrCat("converting tensor '", name, "'"), [&] {
    out = tensor.detach().to(dtype).contiguous();
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace

absl::Status SaveModel(CausalLM& lm, const std::string& dir, const SaveOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<io::CheckpointWriter> writer, ModelWriter(lm, dir, options));
  for (const auto& item : lm->named_parameters(/*recurse=*/true)) {
    torch::Tensor tensor = item.value();
    if (options.tensors) {
      ASSIGN_OR_RETURN(tensor, options.tensors(item.key()));
    }
    ASSIGN_OR_RETURN(tensor, Converted(item.key(), tensor, options.dtype));
    RETURN_IF_ERROR(writer->AddTensor(item.key(), tensor));
  }
  return writer->Commit();
}

absl::StatusOr<std::unique_ptr<StreamedModelWriter>> StreamedModelWriter::Create(
    CausalLM& lm, const std::string& dir, const SaveOptions& options) {
  std::unique_ptr<StreamedModelWriter> out(new StreamedModelWriter());
  out->dtype_ = options.dtype;
  ASSIGN_OR_RETURN(out->writer_, ModelWriter(lm, dir, options));
  const io::Dtype dtype = options.dtype == torch::kBFloat16  ? io::Dtype::kBF16
                          : options.dtype == torch::kFloat16 ? io::Dtype::kF16
                                                             : io::Dtype::kF32;
  for (const auto& item : lm->named_parameters(/*recurse=*/true)) {
    RETURN_IF_ERROR(out->writer_->DeclareTensor(item.key(), dtype, item.value().sizes().vec()));
  }
  return out;
}

absl::Status StreamedModelWriter::Write(const std::string& name, const torch::Tensor& value) {
  ASSIGN_OR_RETURN(torch::Tensor tensor, Converted(name, value, dtype_));
  return writer_->WriteTensor(name, tensor);
}

StreamedModelWriter::~StreamedModelWriter() = default;

absl::Status StreamedModelWriter::Commit() { return writer_->Commit(); }

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
