// Resumable checkpoints of `stemma-engine train` (run.h): a step-NNNNNNNN directory per
// checkpoint under the run's checkpoint directory, holding the model (a loadable Hugging Face
// checkpoint with its stemma.json), the optimizer moments and RNG (optimizer.safetensors) and
// trainer_state.json (step, tokens, loader position, the optimizer file's sha256).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/engine_contract.h"
#include "common/engine_spec.h"
#include "common/status.h"
#include "engine/io/checkpoint.h"
#include "engine/io/fs.h"
#include "engine/io/safetensors.h"
#include "engine/io/sha256.h"
#include "engine/model/checkpoint.h"
#include "engine/train/run.h"
#include "engine/train/spec.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kStateFile[] = "trainer_state.json";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kStateFormat[] = "stemma.train_state/1";
constexpr char kRngTensor[] = "rng.cpu";

// Complete checkpoints in `dir` (published by rename, so any step-NNNNNNNN directory with
// a trainer_state.json is whole), oldest first.
std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (name.size() != 13 || name.rfind("step-", 0) != 0 ||
        !absl::SimpleAtoi(name.substr(5), &step)) {
      continue;
    }
    if (!fs::exists(entry.path() / kStateFile, ec)) continue;
    out.emplace_back(step, entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string StepDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

nlohmann::json SpecAsJson(const v1::TrainSpec& spec) {
  return json::parse(SpecToJson(spec), nullptr, /*allow_exceptions=*/false);
}

io::ManifestProducer Producer(const Run& run, int64_t stopped_at_step) {
  io::ManifestProducer p;
  if (const char* job = std::getenv(std::string(engine_contract::kEnvJobId).c_str())) p.job = job;
  if (const char* attempt = std::getenv(std::string(engine_contract::kEnvAttemptId).c_str())) {
    p.attempt = attempt;
  }
  p.command = "train";
  p.params = {{"spec", SpecAsJson(*run.spec)}, {"spec_sha256", run.spec_sha256}};
  // Stopped early: the model is the one after this step, not after the spec's steps.
  if (stopped_at_step > 0) p.params["stopped_at_step"] = stopped_at_step;
  return p;
}

absl::Status WriteCheckpoint(Run& run, int64_t step, const std::string& path) {
  const v1::TrainSpec& spec = *run.spec;
  const std::string dir = CheckpointDir(spec);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint.dir ", dir, ": ", ec.message()));
  io::CheckpointWriterOptions options;
  options.source_dir = spec.model();  // tokenizer files, so a checkpoint can be evaluated
  options.parents = {spec.model()};
  options.producer = Producer(run);
  options.overwrite = true;  // a stale one from an attempt that died mid-way past this step
  ASSIGN_OR_RETURN(auto writer, io::CheckpointWriter::Create(path, std::move(options)));
  json config = run.lm->config().raw;
  config["torch_dtype"] = "float32";
  RETURN_IF_ERROR(writer->AddFile("config.json", config.dump(2) + "\n"));
  for (const auto& item : run.lm->named_parameters(/*recurse=*/true)) {
    RETURN_IF_ERROR(writer->AddTensor(item.key(), item.value().detach()));
  }
  // Optimizer moments and the RNG go beside the model; trainer_state.json (hashed in the
  // manifest) records the optimizer file's sha256, so both are covered.
  std::vector<io::TensorToWrite> writes;
  auto state = run.optimizer->StateTensors();
  torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  state.emplace_back(kRngTensor, rng);
  for (auto& [name, tensor] : state) {
    tensor = tensor.to(torch::kCPU).contiguous();  // moments may live on the GPU
    const bool u8 = tensor.scalar_type() == torch::kUInt8;
    writes.push_back(io::TensorToWrite{
        name, u8 ? io::Dtype::kU8 : io::Dtype::kF32, tensor.sizes().vec(), tensor.data_ptr(),
        static_cast<uint64_t>(tensor.numel() * tensor.element_size())});
  }
  ASSIGN_OR_RETURN(io::WriteResult written,
                   io::WriteSafetensors(writer->staging_dir() + "/" + kOptimizerFile, writes));
  json trainer_state = {
      {"format", kStateFormat},
      {"step", step},
      {"total_steps", run.total_steps},
      {"tokens", run.tokens},
      {"batch_size", spec.batch_size()},
      {"grad_accum", spec.grad_accum()},
      {"optimizer_step", run.optimizer->step_count()},
      {"optimizer_file", {{"name", kOptimizerFile}, {"sha256", written.sha256}}},
      {"loader", run.loader->state().ToJson()},
      {"spec_sha256", run.spec_sha256},
      {"trainable_params", run.plan.trainable_params},
  };
  RETURN_IF_ERROR(writer->AddFile(kStateFile, trainer_state.dump(2) + "\n"));
  return writer->Commit();
}

// Staging directories of checkpoints whose writer died (a killed attempt): nobody else
// writes into this checkpoint directory, so they can go.
void RemoveStaleStaging(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.find(".tmp-") != std::string::npos) {
      io::RemoveTree(entry.path().string()).IgnoreError();
    }
  }
}

void PruneCheckpoints(const std::string& dir, int64_t keep) {
  if (keep <= 0) return;
  auto all = ListCheckpoints(dir);
  for (size_t i = 0; i + keep < all.size(); ++i) {
    io::RemoveTree(all[i].second).IgnoreError();
  }
}

// Loads the newest checkpoint into `run`; returns its step (0 when there is none).
absl::StatusOr<int64_t> Resume(Run& run) {
  const v1::TrainSpec& spec = *run.spec;
  auto all = ListCheckpoints(CheckpointDir(spec));
  if (all.empty()) return 0;
  const std::string& dir = all.back().second;
  auto where = [&](const absl::Status& s) {
    return absl::Status(s.code(),
                        absl::StrCat("resuming from checkpoint ", dir, ": ", s.message()));
  };
  ASSIGN_OR_RETURN(std::string state_text, io::ReadFile(dir + "/" + kStateFile));
  json state = json::parse(state_text, nullptr, false);
  if (state.is_discarded() || !state.is_object() || state.value("format", "") != kStateFormat) {
    return where(
        absl::DataLossError(absl::StrCat(kStateFile, " is not a ", kStateFormat, " file")));
  }
  for (const char* key : {"batch_size", "grad_accum"}) {
    const int64_t want = std::string(key) == "batch_size" ? spec.batch_size() : spec.grad_accum();
    if (state.value(key, int64_t{-1}) != want) {
      return where(absl::FailedPreconditionError(
          absl::StrCat("it was written with ", key, " ", state.value(key, int64_t{-1}),
                       ", the spec says ", want, " (the data order would change)")));
    }
  }
  // The model weights (verified against the manifest by the reader).
  auto reader = io::CheckpointReader::Open(dir);
  if (!reader.ok()) return where(reader.status());
  absl::Status loaded =
      model::LoadWeights(run.lm, [&](const std::string& name) { return (*reader)->Tensor(name); });
  if (!loaded.ok()) return where(loaded);
  // The optimizer moments and RNG, checked against the hash the state file recorded.
  const std::string opt_path = dir + "/" + kOptimizerFile;
  ASSIGN_OR_RETURN(std::string sha, io::Sha256File(opt_path));
  if (sha != state["optimizer_file"].value("sha256", "")) {
    return where(absl::DataLossError(
        absl::StrCat(kOptimizerFile, " does not match its sha256 in ", kStateFile, " (damaged)")));
  }
  auto opt_file = io::SafetensorsFile::Open(opt_path);
  if (!opt_file.ok()) return where(opt_file.status());
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  torch::Tensor rng;
  for (const io::TensorInfo& info : (*opt_file)->tensors()) {
    if (info.dtype != io::Dtype::kU8 && info.dtype != io::Dtype::kF32) {
      return where(absl::DataLossError(
          absl::StrCat(kOptimizerFile, ": tensor '", info.name, "' has an unexpected dtype")));
    }
    auto dtype = info.dtype == io::Dtype::kU8 ? torch::kUInt8 : torch::kFloat32;
    auto t = torch::from_blob((*opt_file)->Data(info), info.shape, torch::dtype(dtype)).clone();
    if (info.name == kRngTensor) {
      rng = t;
    } else {
      tensors.emplace_back(info.name, t);
    }
  }
  const int64_t step = state.value("step", int64_t{0});
  absl::Status restored = run.optimizer->RestoreState(tensors, state.value("optimizer_step", step));
  if (!restored.ok()) return where(restored);
  if (rng.defined()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng);
  }
  auto loader_state = data::LoaderState::FromJson(state["loader"]);
  if (!loader_state.ok()) return where(loader_state.status());
  absl::Status loader_ok = run.loader->Restore(*loader_state);
  if (!loader_ok.ok()) return where(loader_ok);
  run.tokens = state.value("tokens", int64_t{0});
  return step;
}

}  // namespace stemma::engine::train
