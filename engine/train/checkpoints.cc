// Resumable checkpoints of `stemma-engine train` (run.h): a step-NNNNNNNN directory per
// checkpoint under the run's checkpoint directory, holding the model (a loadable Hugging Face
// checkpoint with its stemma.json), the optimizer moments and RNG (optimizer.safetensors) and
// trainer_state.json (step, tokens, loader position, the optimizer file's sha256).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
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
#include "engine/io/durable.h"
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
// How long ranks wait for the slowest to write its shard (longer than a collective may take).
constexpr std::chrono::hours kShardWriteWait{2};

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

absl::Status RestoreWhole(Run& run, const std::string& dir, const nlohmann::json& state,
                          int64_t optimizer_step);

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
  const int64_t step = state.value("step", int64_t{0});
  const int64_t optimizer_step = state.value("optimizer_step", step);
  if (state.contains("shard")) {
    RETURN_IF_ERROR(RestoreShards(run, dir, state["shard"], optimizer_step));
  } else if (run.sharded || run.full) {
    return where(absl::FailedPreconditionError(
        "it was written with parallel.shard: none; resume it with parallel.shard: none"));
  } else {
    RETURN_IF_ERROR(RestoreWhole(run, dir, state, optimizer_step));
  }
  auto loader_state = data::LoaderState::FromJson(state["loader"]);
  if (!loader_state.ok()) return where(loader_state.status());
  absl::Status loader_ok = run.loader->Restore(*loader_state);
  if (!loader_ok.ok()) return where(loader_ok);
  run.tokens = state.value("tokens", int64_t{0});
  return step;
}

// shard none: the model weights, then the optimizer moments and the RNG.
absl::Status RestoreWhole(Run& run, const std::string& dir, const nlohmann::json& state,
                          int64_t optimizer_step) {
  auto where = [&](const absl::Status& s) {
    return absl::Status(s.code(),
                        absl::StrCat("resuming from checkpoint ", dir, ": ", s.message()));
  };
  // The model weights, checked against the manifest by the reader: hashed by rank 0 only
  // (every rank reads the same files), the other ranks check the files' sizes.
  auto reader =
      io::CheckpointReader::Open(dir, {.verify = io::CheckpointReaderOptions::Verify::kOncePerJob});
  if (!reader.ok()) return where(reader.status());
  absl::Status loaded =
      model::LoadWeights(run.lm, [&](const std::string& name) { return (*reader)->Tensor(name); });
  if (!loaded.ok()) return where(loaded);
  // The optimizer moments and RNG, checked against the hash the state file recorded.
  const std::string opt_path = dir + "/" + kOptimizerFile;
  ASSIGN_OR_RETURN(std::string sha, io::Sha256File(opt_path));
  if (!state.contains("optimizer_file") || sha != state["optimizer_file"].value("sha256", "")) {
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
  absl::Status restored = run.optimizer->RestoreState(tensors, optimizer_step);
  if (!restored.ok()) return where(restored);
  if (rng.defined()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng);
  }
  return absl::OkStatus();
}

namespace {

// "shard-00001-of-00004.safetensors": rank 1's slice of a checkpoint written by 4 ranks.
std::string ShardFileName(int rank, int world) {
  return absl::StrFormat("shard-%05d-of-%05d.safetensors", rank, world);
}

// A checkpoint tensor as the bytes WriteSafetensors takes (on the CPU, contiguous).
io::TensorToWrite ToWrite(const std::string& name, torch::Tensor& tensor) {
  tensor = tensor.to(torch::kCPU).contiguous();
  const bool u8 = tensor.scalar_type() == torch::kUInt8;
  return io::TensorToWrite{name, u8 ? io::Dtype::kU8 : io::Dtype::kF32, tensor.sizes().vec(),
                           tensor.data_ptr(),
                           static_cast<uint64_t>(tensor.numel() * tensor.element_size())};
}

}  // namespace

// Every rank writes `<path>.tmp-shards/shard-r-of-W.safetensors` (its slice of the weights
// and moments, its RNG) and the file's sha256 beside it; after a barrier (every shard
// written) rank 0 adds trainer_state.json with the shards' extents and hashes and publishes
// the directory by rename. A crash leaves only the .tmp-shards directory, which the next
// attempt removes (RemoveStaleStaging).
absl::Status WriteShardedCheckpoint(Run& run, int64_t step, const std::string& path) {
  const v1::TrainSpec& spec = *run.spec;
  const int rank = run.ranks->rank(), world = run.ranks->world_size();
  const std::string staging = path + ".tmp-shards";
  std::error_code ec;
  fs::create_directories(staging, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint.dir ", staging, ": ", ec.message()));
  std::vector<std::pair<std::string, torch::Tensor>> tensors =
      run.full ? run.full->SliceTensors() : run.sharded->SliceTensors();
  tensors.emplace_back(kRngTensor, at::detail::getDefaultCPUGenerator().get_state());
  std::vector<io::TensorToWrite> writes;
  for (auto& [name, tensor] : tensors) writes.push_back(ToWrite(name, tensor));
  const std::string file = ShardFileName(rank, world);
  ASSIGN_OR_RETURN(io::WriteResult written, io::WriteSafetensors(staging + "/" + file, writes));
  RETURN_IF_ERROR(io::WriteFileAtomic(staging + "/" + file + ".sha256", written.sha256));
  run.ranks->Barrier(kShardWriteWait);
  if (rank != 0) return absl::OkStatus();

  json files = json::array();
  json shard = {{"level", spec.parallel().shard()}, {"world_size", world}};
  int64_t n = 0;
  if (run.full) {
    // Per unit: its own flat layout, rank r owning [r·k_u, (r+1)·k_u) (layer_shards.h).
    const std::vector<int64_t> units = run.full->UnitElements();
    for (int64_t u : units) n += u;
    shard["units"] = units;
  } else {
    n = run.sharded->num_elements();
  }
  shard["elements"] = n;
  const int64_t chunk = (n + world - 1) / world;
  for (int r = 0; r < world; ++r) {
    const std::string name = ShardFileName(r, world), sidecar = staging + "/" + name + ".sha256";
    ASSIGN_OR_RETURN(std::string sha, io::ReadFile(sidecar));
    fs::remove(sidecar, ec);
    json entry = {{"name", name}, {"rank", r}, {"sha256", sha}};
    if (!run.full) {
      entry["begin"] = std::min(r * chunk, n);
      entry["end"] = std::min((r + 1) * chunk, n);
    }
    files.push_back(std::move(entry));
  }
  shard["files"] = std::move(files);
  json trainer_state = {
      {"format", kStateFormat},
      {"step", step},
      {"total_steps", run.total_steps},
      {"tokens", run.tokens},
      {"batch_size", spec.batch_size()},
      {"grad_accum", spec.grad_accum()},
      {"optimizer_step", run.full ? run.full->step_count() : run.sharded->step_count()},
      {"shard", shard},
      {"loader", run.loader->state().ToJson()},
      {"spec_sha256", run.spec_sha256},
      {"trainable_params", run.plan.trainable_params},
  };
  RETURN_IF_ERROR(io::WriteFileAtomic(staging + "/" + kStateFile, trainer_state.dump(2) + "\n"));
  // A stale `path` from an attempt that died after this step is replaced.
  if (fs::exists(path, ec)) RETURN_IF_ERROR(io::RemoveTree(path));
  return io::PublishDir(staging, path, /*overwrite=*/false);
}

namespace {

// Opens a shard file of a checkpoint after checking it against its sha256 in the state file.
absl::StatusOr<std::shared_ptr<io::SafetensorsFile>> OpenVerifiedShard(const std::string& dir,
                                                                       const json& entry) {
  const std::string name = entry.value("name", ""), file = dir + "/" + name;
  ASSIGN_OR_RETURN(std::string sha, io::Sha256File(file));
  if (sha != entry.value("sha256", "")) {
    return absl::DataLossError(
        absl::StrCat(name, " does not match its sha256 in ", kStateFile, " (damaged)"));
  }
  return io::SafetensorsFile::Open(file);
}

// "u12.exp_avg" -> (12, "exp_avg"); false for another name.
bool ParseUnitTensor(const std::string& name, int64_t* unit, std::string* what) {
  const size_t dot = name.find('.');
  if (name.size() < 3 || name[0] != 'u' || dot == std::string::npos) return false;
  *what = name.substr(dot + 1);
  return absl::SimpleAtoi(name.substr(1, dot - 1), unit);
}

// parallel.shard: full. Each unit has its own flat layout (layer_shards.h); a file of rank r
// of W holds, for every unit u with n_u elements, [r·k_u, (r+1)·k_u) ∩ [0, n_u), k_u = ⌈n_u/W⌉.
absl::Status RestoreFullShards(Run& run, const std::string& dir, const json& shard,
                               int64_t optimizer_step) {
  auto where = [&](const absl::Status& s) {
    return absl::Status(s.code(),
                        absl::StrCat("resuming from checkpoint ", dir, ": ", s.message()));
  };
  LayerShards& shards = *run.full;
  const std::vector<int64_t> units = shards.UnitElements();
  if (shard.value("units", json::array()) != json(units)) {
    return where(absl::FailedPreconditionError(
        "its trainable elements per layer differ from this run's (was it written with another "
        "strategy or model?)"));
  }
  const int64_t old_world = shard.value("world_size", 1);
  const int rank = run.ranks->rank();
  const int rng_rank = old_world == run.ranks->world_size() ? rank : 0;
  auto range = [&](int64_t u, int64_t r) {  // unit u's elements in old rank r's file
    const int64_t n = units[u], chunk = (n + old_world - 1) / old_world;
    return std::make_pair(std::min(r * chunk, n), std::min((r + 1) * chunk, n));
  };
  torch::Tensor rng;
  for (const json& entry : shard.value("files", json::array())) {
    const int64_t r = entry.value("rank", int64_t{-1});
    bool overlaps = false;
    for (size_t u = 0; u < units.size() && !overlaps; ++u) {
      const auto [begin, end] = range(u, r);
      const auto [mine_begin, mine_end] = shards.UnitSlice(u);
      overlaps = begin < mine_end && end > mine_begin;
    }
    if (!overlaps && r != rng_rank) continue;
    auto opened = OpenVerifiedShard(dir, entry);
    if (!opened.ok()) return where(opened.status());
    for (const io::TensorInfo& info : (*opened)->tensors()) {
      const bool u8 = info.dtype == io::Dtype::kU8;
      auto t = torch::from_blob((*opened)->Data(info), info.shape,
                                torch::dtype(u8 ? torch::kUInt8 : torch::kFloat32));
      int64_t unit = -1;
      std::string what;
      if (info.name == kRngTensor) {
        if (r == rng_rank) rng = t.clone();
        continue;
      }
      if (!ParseUnitTensor(info.name, &unit, &what) || unit < 0 ||
          unit >= static_cast<int64_t>(units.size()) || info.dtype != io::Dtype::kF32 ||
          t.numel() != range(unit, r).second - range(unit, r).first) {
        return where(absl::DataLossError(absl::StrCat(
            entry.value("name", ""), ": tensor '", info.name, "' is not a slice it should hold")));
      }
      shards.RestoreRange(unit, what, range(unit, r).first, t.to(run.device));
    }
  }
  shards.FinishRestore(optimizer_step);
  if (rng.defined()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RestoreShards(Run& run, const std::string& dir, const json& shard,
                           int64_t optimizer_step) {
  auto where = [&](const absl::Status& s) {
    return absl::Status(s.code(),
                        absl::StrCat("resuming from checkpoint ", dir, ": ", s.message()));
  };
  const bool written_full = shard.value("level", "") == "full";
  if (written_full != static_cast<bool>(run.full) || (!run.full && !run.sharded)) {
    return where(absl::FailedPreconditionError(
        absl::StrCat("it was written with parallel.shard: ", shard.value("level", "?"),
                     "; set parallel.shard to ", written_full ? "full" : "optimizer or gradients",
                     " to resume it")));
  }
  if (run.full) return RestoreFullShards(run, dir, shard, optimizer_step);
  ShardedAdamW& optimizer = *run.sharded;
  if (shard.value("elements", int64_t{-1}) != optimizer.num_elements()) {
    return where(absl::FailedPreconditionError(
        absl::StrCat("it trains ", shard.value("elements", int64_t{-1}), " elements, this run ",
                     optimizer.num_elements(), " (was it written with another strategy?)")));
  }
  const int old_world = shard.value("world_size", 0), rank = run.ranks->rank();
  // The RNG: this rank's own at the same world size, else rank 0's.
  const int rng_rank = old_world == run.ranks->world_size() ? rank : 0;
  torch::Tensor rng;
  for (const json& entry : shard.value("files", json::array())) {
    const int64_t begin = entry.value("begin", int64_t{0}), end = entry.value("end", int64_t{0});
    const bool overlaps = begin < optimizer.slice_end() && end > optimizer.slice_begin();
    if (!overlaps && entry.value("rank", -1) != rng_rank) continue;
    const std::string name = entry.value("name", ""), file = dir + "/" + name;
    ASSIGN_OR_RETURN(std::string sha, io::Sha256File(file));
    if (sha != entry.value("sha256", "")) {
      return where(absl::DataLossError(
          absl::StrCat(name, " does not match its sha256 in ", kStateFile, " (damaged)")));
    }
    auto opened = io::SafetensorsFile::Open(file);
    if (!opened.ok()) return where(opened.status());
    for (const io::TensorInfo& info : (*opened)->tensors()) {
      const bool u8 = info.dtype == io::Dtype::kU8;
      auto t = torch::from_blob((*opened)->Data(info), info.shape,
                                torch::dtype(u8 ? torch::kUInt8 : torch::kFloat32));
      if (info.name == kRngTensor) {
        if (entry.value("rank", -1) == rng_rank) rng = t.clone();
      } else if (info.dtype != io::Dtype::kF32 || t.numel() != end - begin) {
        return where(absl::DataLossError(
            absl::StrCat(name, ": tensor '", info.name, "' has the wrong dtype or size")));
      } else if (overlaps) {
        optimizer.RestoreRange(info.name, begin, t.to(run.device));
      }
    }
  }
  optimizer.FinishRestore(optimizer_step);
  if (rng.defined()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng);
  }
  return absl::OkStatus();
}

}  // namespace stemma::engine::train
