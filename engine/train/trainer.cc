#include "engine/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "common/status.h"
#include "engine/data/loader.h"
#include "engine/io/checkpoint.h"
#include "engine/io/fs.h"
#include "engine/io/safetensors.h"
#include "engine/io/sha256.h"
#include "engine/model/checkpoint.h"
#include "engine/train/optimizer.h"
#include "engine/train/plan.h"

#if __has_include("engine/train/distributed.h")
#include "engine/model/guard.h"
#include "engine/train/distributed.h"
#define STEMMA_TRAIN_HAS_DATA_PARALLEL 1
#endif

namespace stemma::engine::train {
namespace {

using model::TorchGuard;

namespace fs = std::filesystem;
using model::CausalLM;
using json = nlohmann::json;

constexpr char kStateFile[] = "trainer_state.json";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kStateFormat[] = "stemma.train_state/1";
constexpr char kRngTensor[] = "rng.cpu";

// ---- Ranks ----

// The data-parallel group, or a single process when the build has no distributed.h.
class Ranks {
 public:
  static absl::StatusOr<Ranks> FromEnv() {
    Ranks r;
#ifdef STEMMA_TRAIN_HAS_DATA_PARALLEL
    ASSIGN_OR_RETURN(r.dp_, DataParallel::FromEnv());
    r.rank_ = r.dp_->rank();
    r.world_ = r.dp_->world_size();
#else
    const char* world = std::getenv("WORLD_SIZE");
    int64_t w = 1;
    if (world != nullptr && *world != '\0' && (!absl::SimpleAtoi(world, &w) || w > 1)) {
      return absl::UnimplementedError(
          absl::StrCat("WORLD_SIZE=", world, ": this build has no data-parallel support"));
    }
#endif
    return r;
  }
  int rank() const { return rank_; }
  int world() const { return world_; }
  void Broadcast(const std::vector<torch::Tensor>& params) {
#ifdef STEMMA_TRAIN_HAS_DATA_PARALLEL
    if (world_ > 1) dp_->BroadcastParameters(params);
#endif
  }
  void AllReduceMean(const torch::Tensor& flat) {
#ifdef STEMMA_TRAIN_HAS_DATA_PARALLEL
    if (world_ > 1) dp_->AllReduceMeanGradients({flat});
#endif
  }
  double Sum(double value) {
#ifdef STEMMA_TRAIN_HAS_DATA_PARALLEL
    if (world_ > 1) return dp_->AllReduceSum(value);
#endif
    return value;
  }

 private:
  int rank_ = 0;
  int world_ = 1;
#ifdef STEMMA_TRAIN_HAS_DATA_PARALLEL
  std::shared_ptr<DataParallel> dp_;
#endif
};

// ---- Checkpoints ----

std::string StepDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

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

io::ManifestProducer Producer(const TrainSpec& spec, const std::string& spec_sha256,
                              int64_t stopped_at_step = 0) {
  io::ManifestProducer p;
  if (const char* job = std::getenv(std::string(engine_contract::kEnvJobId).c_str())) p.job = job;
  if (const char* attempt = std::getenv(std::string(engine_contract::kEnvAttemptId).c_str())) {
    p.attempt = attempt;
  }
  p.command = "train";
  p.params = {{"spec", spec.raw}, {"spec_sha256", spec_sha256}};
  // Stopped early: the model is the one after this step, not after spec.steps.
  if (stopped_at_step > 0) p.params["stopped_at_step"] = stopped_at_step;
  return p;
}

// Early stopping (common/engine_contract.h kStopFile): the file the worker writes into the
// attempt directory when the coordinator stops this trial. Checked after every step by rank
// 0 (one access() call); under data parallel every rank learns it from one sum, so all stop
// after the same step.
class StopRequest {
 public:
  StopRequest() {
    if (const char* dir = std::getenv(std::string(engine_contract::kEnvWorkdir).c_str());
        dir != nullptr && *dir) {
      path_ = absl::StrCat(dir, "/", std::string(engine_contract::kStopFile));
    }
  }
  bool Requested(Ranks& ranks) const {
    double asked = 0;
    if (ranks.rank() == 0 && !path_.empty() && access(path_.c_str(), F_OK) == 0) asked = 1;
    return ranks.Sum(asked) > 0;
  }

 private:
  std::string path_;
};

struct TrainerState {
  int64_t step = 0;
  int64_t tokens = 0;
  data::LoaderState loader;
  torch::Tensor rng;  // the CPU generator's state
};

// Everything one run holds: the model, its plan and optimizer, the data.
struct Run {
  const TrainSpec* spec = nullptr;
  std::string spec_sha256;
  CausalLM lm{nullptr};
  TrainPlan plan;
  std::unique_ptr<FlatAdamW> optimizer;
  std::unique_ptr<data::Loader> loader;
  Ranks ranks;
  int64_t tokens = 0;
  torch::Device device = torch::kCPU;
  bool autocast_bf16 = false;  // precision: bfloat16
  // eval.every > 0: the fixed held-out rows of each dataset, [rows, seq_len + 1] row-major.
  struct HeldOut {
    std::string name;  // the dataset's language (its directory name if it has none)
    int64_t rows = 0;
    std::vector<int32_t> tokens;
  };
  std::vector<HeldOut> heldout;
};

// Forward and backward of one micro-batch under bf16 autocast when asked: the matrix
// products run in bf16, autocast keeps losses and reductions in fp32, and the fp32 master
// weights receive fp32 gradients.
class AutocastScope {
 public:
  AutocastScope(const Run& run) : type_(run.device.type()), on_(run.autocast_bf16) {
    if (!on_) return;
    was_enabled_ = at::autocast::is_autocast_enabled(type_);
    previous_dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_dtype(type_, at::kBFloat16);
    at::autocast::set_autocast_enabled(type_, true);
  }
  ~AutocastScope() {
    if (!on_) return;
    at::autocast::set_autocast_enabled(type_, was_enabled_);
    at::autocast::set_autocast_dtype(type_, previous_dtype_);
    at::autocast::clear_cache();  // bf16 copies of the weights change every step
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  at::DeviceType type_;
  bool on_;
  bool was_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

absl::Status WriteCheckpoint(Run& run, int64_t step, const std::string& path) {
  const TrainSpec& spec = *run.spec;
  std::error_code ec;
  fs::create_directories(spec.checkpoint.dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("checkpoint.dir ", spec.checkpoint.dir, ": ", ec.message()));
  }
  io::CheckpointWriterOptions options;
  options.source_dir = spec.model;  // tokenizer files, so a checkpoint can be evaluated
  options.parents = {spec.model};
  options.producer = Producer(spec, run.spec_sha256);
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
      {"total_steps", spec.steps},
      {"tokens", run.tokens},
      {"batch_size", spec.batch_size},
      {"grad_accum", spec.grad_accum},
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
void RemoveStaleStaging(const TrainSpec& spec) {
  std::error_code ec;
  if (!fs::is_directory(spec.checkpoint.dir, ec)) return;
  for (const auto& entry : fs::directory_iterator(spec.checkpoint.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.find(".tmp-") != std::string::npos) {
      io::RemoveTree(entry.path().string()).IgnoreError();
    }
  }
}

void PruneCheckpoints(const TrainSpec& spec) {
  if (spec.checkpoint.keep <= 0) return;
  auto all = ListCheckpoints(spec.checkpoint.dir);
  for (size_t i = 0; i + spec.checkpoint.keep < all.size(); ++i) {
    io::RemoveTree(all[i].second).IgnoreError();
  }
}

// Loads the newest checkpoint into `run`; returns its step (0 when there is none).
absl::StatusOr<int64_t> Resume(Run& run) {
  const TrainSpec& spec = *run.spec;
  auto all = ListCheckpoints(spec.checkpoint.dir);
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
    const int64_t want = std::string(key) == "batch_size" ? spec.batch_size : spec.grad_accum;
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

// ---- Setup ----

// One loader per dataset over its held-out split, in index order; the rows it yields first
// are the evaluation set, drawn once so every evaluation sees the same tokens.
absl::Status BuildHeldOut(Run& run, const data::MixtureSpec& mixture, data::LoaderOptions options) {
  const TrainSpec& spec = *run.spec;
  options.split = data::Split::kHeldOut;
  options.shuffle = false;
  const int64_t rows = spec.eval.batches * spec.eval.batch_size;
  std::map<std::string, int> seen;
  for (size_t i = 0; i < mixture.components.size(); ++i) {
    const auto& component = mixture.components[i];
    data::MixtureSpec one;
    one.components.push_back({component.dataset, 1.0, component.family, component.heldout});
    auto loader = data::Loader::Create(std::move(one), options);
    if (!loader.ok()) {
      return absl::Status(loader.status().code(),
                          absl::StrCat(spec.source, ": eval: data.datasets[", i, "] (",
                                       component.dataset->dir(), "): ", loader.status().message(),
                                       " (raise data.heldout_fraction, give the dataset a "
                                       "heldout_path, or turn eval off)"));
    }
    Run::HeldOut set;
    set.name = component.dataset->language();
    if (set.name.empty())
      set.name = std::filesystem::path(component.dataset->dir()).filename().string();
    if (seen[set.name]++ > 0) set.name = absl::StrCat(set.name, "_", i);
    set.rows = rows;
    set.tokens = (*loader)->NextBatch(rows);
    run.heldout.push_back(std::move(set));
  }
  return absl::OkStatus();
}

absl::Status BuildLoader(Run& run, data::MixtureSpec mixture) {
  const TrainSpec& spec = *run.spec;
  const int64_t vocab = run.lm->config().vocab_size;
  for (const auto& c : mixture.components) {
    for (const data::Dataset* ds : {c.dataset.get(), c.heldout.get()}) {
      if (ds == nullptr || ds->tokenizer().vocab_size <= vocab) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("data: dataset ", ds->dir(), " was tokenized with a vocabulary of ",
                       ds->tokenizer().vocab_size, " tokens, the model has ", vocab));
    }
  }
  data::LoaderOptions options;
  options.seq_len = spec.data.seq_len;
  options.seed = spec.seed;
  options.split = data::Split::kTrain;
  options.heldout_fraction = spec.data.heldout_fraction;
  options.heldout_last = spec.data.heldout_last;
  options.split_seed = spec.data.split_seed;
  options.shuffle = spec.data.shuffle;
  // The held-out sets share the opened datasets (components hold them by shared_ptr).
  if (spec.eval.every > 0) RETURN_IF_ERROR(BuildHeldOut(run, mixture, options));
  auto loader = data::Loader::Create(std::move(mixture), options);
  if (!loader.ok()) {
    return absl::Status(loader.status().code(), absl::StrCat("data: ", loader.status().message()));
  }
  run.loader = std::move(*loader);
  return absl::OkStatus();
}

absl::Status BuildPlanFor(Run& run, std::vector<torch::Tensor>* params) {
  const auto& config = run.lm->config();
  ModelShape shape{config.num_hidden_layers, config.intermediate_size, config.num_experts,
                   config.tie_word_embeddings};
  std::vector<ParamInfo> infos;
  for (const auto& item : run.lm->named_parameters(/*recurse=*/true)) {
    infos.push_back(ParamInfo{item.key(), item.value().sizes().vec()});
    params->push_back(item.value());
  }
  ASSIGN_OR_RETURN(run.plan, BuildPlan(run.spec->strategy, shape, infos, run.spec->source));
  return absl::OkStatus();
}

// SSFT (algorithms.md §4.5): the router of each listed layer may only pick the listed
// experts while training. The model's router is a bias-free Linear; giving it an
// (unregistered, so never saved) bias of 0 / -inf makes softmax and top-k see the target
// experts only — the C++ counterpart of the reference code's forward hook.
void RestrictRouters(Run& run) {
  const int64_t experts = run.lm->config().num_experts;
  for (const auto& [layer, ids] : run.plan.router_experts) {
    auto* decoder = run.lm->model->layers[layer]->as<model::DecoderLayerImpl>();
    auto bias = torch::full({experts}, -std::numeric_limits<float>::infinity());
    for (int64_t id : ids) bias[id] = 0.0f;
    decoder->moe->gate->bias = bias.to(decoder->moe->gate->weight.device());
  }
}

void ClearRouterRestriction(Run& run) {
  for (const auto& [layer, ids] : run.plan.router_experts) {
    run.lm->model->layers[layer]->as<model::DecoderLayerImpl>()->moe->gate->bias = torch::Tensor();
  }
}

// ---- One optimizer step ----

struct StepResult {
  double loss = 0.0;  // mean cross-entropy per predicted token over the global batch
  double load_balancing = 0.0, router_z = 0.0;  // means over micro-batches and ranks
  FlatAdamW::StepStats stats;
  double lr = 0.0;
};

// Cross-entropy summed over every predicted token, in fp32: logits [B, T, V], targets [B, T].
torch::Tensor SummedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

absl::StatusOr<StepResult> TrainStep(Run& run, int64_t step) {
  const TrainSpec& spec = *run.spec;
  const int64_t world = run.ranks.world(), rank = run.ranks.rank();
  const int64_t rows = spec.batch_size / world, seq = spec.data.seq_len;
  const int64_t vocab = run.lm->config().vocab_size;
  const double global_tokens = static_cast<double>(spec.tokens_per_step());
  const bool moe = run.lm->config().is_moe();
  const AuxLossSpec& aux = spec.strategy.aux_loss;
  StepResult result;
  double ce_sum = 0.0, lb_sum = 0.0, z_sum = 0.0;
  run.optimizer->ZeroGrad();
  for (int64_t micro = 0; micro < spec.grad_accum; ++micro) {
    std::vector<int32_t> batch = run.loader->NextBatch(spec.batch_size);  // [B, seq + 1]
    auto tokens = torch::from_blob(batch.data(), {spec.batch_size, seq + 1}, torch::kInt32)
                      .narrow(0, rank * rows, rows)
                      .to(torch::kLong);  // [rows, seq + 1], this rank's share
    const int64_t max_id = tokens.max().item<int64_t>();
    if (max_id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("data: token id ", max_id, " at step ", step,
                                                     " is outside the model's vocabulary of ",
                                                     vocab));
    }
    if (run.device != torch::kCPU) tokens = tokens.to(run.device);
    auto inputs = tokens.narrow(1, 0, seq), targets = tokens.narrow(1, 1, seq);
    torch::Tensor ce, loss;
    {
      AutocastScope autocast(run);  // forward only; backward follows the recorded dtypes
      auto out = run.lm->forward(inputs);
      ce = SummedCrossEntropy(out.logits, targets);
      // Scaled so that the mean over ranks of the summed gradients is d(mean CE)/dθ.
      loss = ce * (static_cast<double>(world) / global_tokens);
      if (moe) {
        if (aux.load_balancing > 0)
          loss = loss + out.load_balancing_loss * (aux.load_balancing / spec.grad_accum);
        if (aux.router_z > 0) loss = loss + out.router_z_loss * (aux.router_z / spec.grad_accum);
        lb_sum += out.load_balancing_loss.item<double>();
        z_sum += out.router_z_loss.item<double>();
      }
    }
    loss.backward();
    ce_sum += ce.item<double>();
  }
  if (world > 1) run.ranks.AllReduceMean(run.optimizer->FlatGrads());
  result.loss = run.ranks.Sum(ce_sum) / global_tokens;
  if (moe) {
    const double micro_batches = static_cast<double>(spec.grad_accum * world);
    result.load_balancing = run.ranks.Sum(lb_sum) / micro_batches;
    result.router_z = run.ranks.Sum(z_sum) / micro_batches;
  }
  if (!std::isfinite(result.loss)) {
    return absl::InternalError(absl::StrCat("training diverged at step ", step, ": loss is ",
                                            result.loss,
                                            " (lower optimizer.lr or check the data); "
                                            "no checkpoint written for this step"));
  }
  result.lr = LearningRate(spec.optimizer, spec.schedule, step, spec.steps);
  result.stats = run.optimizer->Step(result.lr, spec.clip_grad_norm);
  if (!std::isfinite(result.stats.grad_norm)) {
    return absl::InternalError(absl::StrCat("training diverged at step ", step,
                                            ": gradient norm is ", result.stats.grad_norm,
                                            " (lower optimizer.lr or check the data); "
                                            "no checkpoint written for this step"));
  }
  return result;
}

// Mean cross-entropy per predicted token on each held-out set, emitted as `metric` events
// (`heldout_loss/<name>`, and `heldout_loss` over all sets' tokens) at `step`. Rows are
// shared among the data-parallel ranks; every rank takes part (the sums are collective).
void EvaluateHeldOut(Run& run, int64_t step, const EventWriter& events) {
  const TrainSpec& spec = *run.spec;
  const int64_t seq = spec.data.seq_len, world = run.ranks.world(), rank = run.ranks.rank();
  torch::NoGradGuard no_grad;
  run.lm->eval();
  ClearRouterRestriction(run);  // the model as it will be saved: the whole router
  double total_ce = 0.0, total_tokens = 0.0;
  for (auto& set : run.heldout) {
    double ce_sum = 0.0;
    for (int64_t first = 0; first < set.rows; first += spec.eval.batch_size) {
      const int64_t rows = std::min(spec.eval.batch_size, set.rows - first);
      // This rank's share of the chunk: rows [begin, end).
      const int64_t begin = first + rows * rank / world, end = first + rows * (rank + 1) / world;
      if (end <= begin) continue;
      auto tokens = torch::from_blob(set.tokens.data() + begin * (seq + 1), {end - begin, seq + 1},
                                     torch::kInt32)
                        .to(torch::kLong);
      if (run.device != torch::kCPU) tokens = tokens.to(run.device);
      AutocastScope autocast(run);
      auto logits = run.lm->forward(tokens.narrow(1, 0, seq)).logits;
      ce_sum += SummedCrossEntropy(logits, tokens.narrow(1, 1, seq)).item<double>();
    }
    ce_sum = run.ranks.Sum(ce_sum);
    const double tokens = static_cast<double>(set.rows * seq);
    total_ce += ce_sum;
    total_tokens += tokens;
    events.Emit({{"event", "metric"},
                 {"name", "heldout_loss/" + set.name},
                 {"value", ce_sum / tokens},
                 {"step", step}});
  }
  events.Emit({{"event", "metric"},
               {"name", "heldout_loss"},
               {"value", total_ce / total_tokens},
               {"step", step}});
  RestrictRouters(run);
  run.lm->train();
}

// The `output` event of the published model, with what the checkpoint registry records
// (type, manifest sha256, bytes, parents; engine/events.h).
void EmitOutput(const EventWriter& events, const std::string& out) {
  absl::StatusOr<Event> output = OutputEvent("model", out, "cpt");
  if (output.ok()) {
    events.Emit(*output);
    return;
  }
  std::fprintf(stderr, "train: output event without manifest fields: %s\n",
               std::string(output.status().message()).c_str());
  events.Emit({{"event", "output"},
               {"name", "model"},
               {"path", out},
               {"type", "checkpoint"},
               {"operation", "cpt"}});
}

// A previous attempt of this very spec already published `out`: report it again.
bool AlreadyDone(const TrainSpec& spec, const std::string& spec_sha256) {
  auto text = io::ReadFile(spec.out + "/" + io::kManifestName);
  if (!text.ok()) return false;
  auto manifest = io::ParseManifest(*text, spec.out);
  return manifest.ok() && manifest->producer.command == "train" &&
         manifest->producer.params.value("spec_sha256", "") == spec_sha256;
}

absl::StatusOr<RunResult> TrainImpl(const TrainSpec& spec, const RunOptions& options,
                                    const EventWriter& parent_events) {
  Run run;
  run.spec = &spec;
  run.spec_sha256 = io::Sha256Hex(spec.raw.dump());
  ASSIGN_OR_RETURN(run.ranks, Ranks::FromEnv());
  const EventWriter events(parent_events.enabled() && run.ranks.rank() == 0);
  if (spec.batch_size % run.ranks.world() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(spec.source, ": batch_size ", spec.batch_size,
                                                   " is not divisible by WORLD_SIZE ",
                                                   run.ranks.world()));
  }
  // threads 0: the job's CPUs ($STEMMA_CPUS), so a one-CPU job runs one thread.
  if (const int64_t threads = EffectiveThreads(spec.threads); threads > 0) {
    at::set_num_threads(static_cast<int>(threads));
  }
  torch::manual_seed(spec.seed);

  if (!spec.overwrite && AlreadyDone(spec, run.spec_sha256)) {
    EmitOutput(events, spec.out);
    events.Emit(
        {{"event", "done"}, {"command", "train"}, {"out", spec.out}, {"already_done", true}});
    return RunResult::kFinished;
  }
  if (io::PathExists(spec.out) && !spec.overwrite) {
    return absl::AlreadyExistsError(absl::StrCat(
        spec.source, ": out: ", spec.out, " already exists (set overwrite: true to replace it)"));
  }

  // The directory `out` goes into (e.g. models/ under the storage root) is made now, not
  // found missing after the last step.
  if (std::error_code ec; !fs::create_directories(fs::path(spec.out).parent_path(), ec) && ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        spec.source, ": out: cannot create the directory of ", spec.out, ": ", ec.message()));
  }
  // Inputs that only the engine can check, before any work: the datasets open.
  auto mixture = data::OpenMixture(spec.data.mixture);
  if (!mixture.ok()) {
    return absl::Status(mixture.status().code(),
                        absl::StrCat(spec.source, ": ", mixture.status().message()));
  }
  run.device = torch::Device(spec.device);  // checked by the spec's rules
  if (run.device.is_cuda() && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        absl::StrCat(spec.source, ": device: ", spec.device,
                     " was asked for, but LibTorch sees no CUDA GPU "
                     "(a CPU-only LibTorch, no driver, or CUDA_VISIBLE_DEVICES empty)"));
  }
  run.autocast_bf16 = spec.precision == "bfloat16";
  model::LoadOptions load;
  load.device = run.device;
  ASSIGN_OR_RETURN(run.lm, model::LoadModel(spec.model, load));
  std::vector<torch::Tensor> params;
  RETURN_IF_ERROR(BuildPlanFor(run, &params));
  RETURN_IF_ERROR(TorchGuard("setting up the optimizer", [&] {
    run.optimizer = std::make_unique<FlatAdamW>(run.plan.params, params, spec.optimizer);
    return absl::OkStatus();
  }));
  RestrictRouters(run);
  RETURN_IF_ERROR(BuildLoader(run, std::move(*mixture)));
  int64_t start_step = 0;
  if (spec.checkpoint.every > 0) {
    if (run.ranks.rank() == 0) RemoveStaleStaging(spec);
    ASSIGN_OR_RETURN(start_step, Resume(run));
  }
  if (start_step > spec.steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint at step ", start_step, " is past the spec's ", spec.steps, " steps"));
  }
  run.ranks.Broadcast(run.optimizer->parameters());
  run.lm->train();

  // Every layer range as written and as resolved for this model ("middle" → "2:7").
  Event layer_ranges = Event::array();
  auto add_ranges = [&](const std::vector<LayerRange>& ranges, const std::string& field) {
    for (size_t i = 0; i < ranges.size(); ++i) {
      auto r = ResolveLayerRange(ranges[i], run.lm->config().num_hidden_layers, field);
      layer_ranges.push_back({{"field", absl::StrCat(field, "[", i, "]")},
                              {"range", ranges[i].text},
                              {"layers", r.ok() ? FormatLayerRange(*r) : std::string("?")}});
    }
  };
  add_ranges(spec.strategy.freeze.layers, "strategy.freeze.layers");
  for (size_t i = 0; i < spec.strategy.l2sp.size(); ++i) {
    add_ranges(spec.strategy.l2sp[i].layers, absl::StrCat("strategy.l2sp[", i, "].layers"));
  }
  events.Emit({{"event", "start"},
               {"command", "train"},
               {"spec", spec.source},
               {"model", spec.model},
               {"arch", std::string(model::ArchName(run.lm->config().arch))},
               {"out", spec.out},
               {"total_steps", spec.steps},
               {"tokens_per_step", spec.tokens_per_step()},
               {"resumed_from_step", start_step},
               {"world_size", run.ranks.world()},
               {"device", spec.device},
               {"precision", spec.precision},
               {"threads", at::get_num_threads()},
               {"total_params", run.plan.total_params},
               {"trainable_params", run.plan.trainable_params},
               {"trainable_fraction", run.plan.trainable_fraction()},
               {"num_layers", run.lm->config().num_hidden_layers},
               {"layer_ranges", layer_ranges}});
  // As metric points too, so a study's report and the registry see how much a strategy touched.
  events.Emit({{"event", "metric"},
               {"name", "trainable_fraction"},
               {"value", run.plan.trainable_fraction()},
               {"step", start_step}});
  events.Emit({{"event", "metric"},
               {"name", "trainable_params"},
               {"value", run.plan.trainable_params},
               {"step", start_step}});

  if (spec.eval.every > 0 && start_step == 0) {
    RETURN_IF_ERROR(TorchGuard("held-out evaluation before step 1", [&] {
      EvaluateHeldOut(run, 0, events);
      return absl::OkStatus();
    }));
  }
  using Clock = std::chrono::steady_clock;
  double train_seconds = 0.0, last_loss = 0.0;
  int64_t steps_this_run = 0;
  const StopRequest stop_request;
  int64_t stopped_at_step = 0;
  for (int64_t step = start_step + 1; step <= spec.steps; ++step) {
    const auto begin = Clock::now();
    StepResult r;
    RETURN_IF_ERROR(TorchGuard(absl::StrCat("step ", step), [&]() -> absl::Status {
      ASSIGN_OR_RETURN(r, TrainStep(run, step));
      return absl::OkStatus();
    }));
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    train_seconds += seconds;
    ++steps_this_run;
    run.tokens += spec.tokens_per_step();
    last_loss = r.loss;
    // The first step of every run too, so a run always shows its starting loss.
    if (step % spec.log_every == 0 || step == spec.steps || step == start_step + 1) {
      Event e = {{"event", "step"},
                 {"step", step},
                 {"total_steps", spec.steps},
                 {"loss", r.loss},
                 {"lr", r.lr},
                 {"grad_norm", r.stats.grad_norm},
                 {"tokens", run.tokens},
                 {"tokens_per_s", seconds > 0 ? spec.tokens_per_step() / seconds : 0.0}};
      if (!spec.strategy.l2sp.empty()) e["l2sp"] = r.stats.l2sp;
      if (run.lm->config().is_moe()) {
        e["load_balancing"] = r.load_balancing;
        e["router_z"] = r.router_z;
      }
      events.Emit(e);
    }
    if (spec.eval.every > 0 && (step % spec.eval.every == 0 || step == spec.steps)) {
      RETURN_IF_ERROR(TorchGuard(absl::StrCat("held-out evaluation at step ", step), [&] {
        EvaluateHeldOut(run, step, events);
        return absl::OkStatus();
      }));
    }
    const bool checkpoint_due =
        spec.checkpoint.every > 0 && step % spec.checkpoint.every == 0 && step < spec.steps;
    if (checkpoint_due && run.ranks.rank() == 0) {
      const std::string path = spec.checkpoint.dir + "/" + StepDirName(step);
      RETURN_IF_ERROR(TorchGuard("writing checkpoint " + path,
                                 [&] { return WriteCheckpoint(run, step, path); }));
      PruneCheckpoints(spec);
      events.Emit({{"event", "checkpoint"}, {"step", step}, {"path", path}});
    }
    if (options.stop_after_step == step && step < spec.steps) return RunResult::kStopped;
    if (step < spec.steps && stop_request.Requested(run.ranks)) {
      stopped_at_step = step;  // early stopping: publish this step's model as `out`
      break;
    }
  }

  if (run.ranks.rank() == 0) {
    ClearRouterRestriction(run);
    model::SaveOptions save;
    save.dtype = spec.save_dtype == "bfloat16"  ? torch::kBFloat16
                 : spec.save_dtype == "float16" ? torch::kFloat16
                                                : torch::kFloat32;
    save.parents = {spec.model};
    save.producer = Producer(spec, run.spec_sha256, stopped_at_step);
    save.overwrite = spec.overwrite;
    save.source_dir = spec.model;
    absl::Status saved = model::SaveModel(run.lm, spec.out, save);
    if (!saved.ok()) {
      return absl::Status(saved.code(), absl::StrCat("writing ", spec.out, ": ", saved.message()));
    }
    EmitOutput(events, spec.out);
  }
  events.Emit({{"event", "done"},
               {"command", "train"},
               {"out", spec.out},
               {"steps", stopped_at_step > 0 ? stopped_at_step : spec.steps},
               {"stopped_at_step", stopped_at_step},
               {"steps_this_run", steps_this_run},
               {"resumed_from_step", start_step},
               {"tokens", run.tokens},
               {"final_loss", last_loss},
               {"tokens_per_s",
                train_seconds > 0 ? steps_this_run * spec.tokens_per_step() / train_seconds : 0.0},
               {"train_seconds", train_seconds},
               {"total_params", run.plan.total_params},
               {"trainable_params", run.plan.trainable_params},
               {"trainable_fraction", run.plan.trainable_fraction()}});
  return RunResult::kFinished;
}

}  // namespace

absl::StatusOr<RunResult> Train(const TrainSpec& spec, const RunOptions& options,
                                const EventWriter& events) {
  absl::StatusOr<RunResult> result = absl::InternalError("unreachable");
  absl::Status s = TorchGuard("train", [&]() -> absl::Status {
    result = TrainImpl(spec, options, events);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return result;
}

}  // namespace stemma::engine::train
