#include "engine/train/trainer.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "common/status.h"
#include "engine/data/loader.h"
#include "engine/io/fs.h"
#include "engine/io/manifest.h"
#include "engine/io/sha256.h"
#include "engine/model/checkpoint.h"
#include "engine/model/guard.h"
#include "engine/train/run.h"
#include "engine/train/spec.h"

namespace stemma::engine::train {
namespace {

namespace fs = std::filesystem;
using model::TorchGuard;

// Early stopping and preemption (common/engine_contract.h kStopFile, kPreemptFile): the files
// the worker writes into the attempt directory when the coordinator stops this trial or gives
// its resources to a higher-priority job. Checked after every step by rank 0 (access() calls);
// under data parallel every rank learns the answer from one sum, so all act after the same
// step.
class StopRequest {
 public:
  enum class Kind { kNone, kStop, kPreempt };
  StopRequest() {
    if (const char* dir = std::getenv(std::string(engine_contract::kEnvWorkdir).c_str());
        dir != nullptr && *dir) {
      stop_path_ = absl::StrCat(dir, "/", std::string(engine_contract::kStopFile));
      preempt_path_ = absl::StrCat(dir, "/", std::string(engine_contract::kPreemptFile));
    }
  }
  Kind Requested(DataParallel& ranks) const {
    double asked = 0;
    if (ranks.rank() == 0 && !stop_path_.empty()) {
      if (access(preempt_path_.c_str(), F_OK) == 0) {
        asked = 2;
      } else if (access(stop_path_.c_str(), F_OK) == 0) {
        asked = 1;
      }
    }
    const double sum = ranks.AllReduceSum(asked);
    return sum > 1.5 ? Kind::kPreempt : sum > 0.5 ? Kind::kStop : Kind::kNone;
  }

 private:
  std::string stop_path_;
  std::string preempt_path_;
};

// One loader per dataset over its held-out split, in index order; the rows it yields first
// are the evaluation set, drawn once so every evaluation sees the same tokens.
absl::Status BuildHeldOut(Run& run, const data::MixtureSpec& mixture, data::LoaderOptions options) {
  options.split = data::Split::kHeldOut;
  options.shuffle = false;
  const int64_t rows = run.spec->eval().batches() * EvalBatchSize(*run.spec);
  std::map<std::string, int> seen;
  for (size_t i = 0; i < mixture.components.size(); ++i) {
    const auto& component = mixture.components[i];
    data::MixtureSpec one;
    one.components.push_back({component.dataset, 1.0, component.family, component.heldout});
    auto loader = data::Loader::Create(std::move(one), options);
    if (!loader.ok()) {
      return absl::Status(loader.status().code(),
                          absl::StrCat(run.source, ": eval: data.datasets[", i, "] (",
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
  const v1::TrainSpec& spec = *run.spec;
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
  options.seq_len = spec.data().seq_len();
  options.seed = spec.seed();
  options.split = data::Split::kTrain;
  options.heldout_fraction = spec.data().heldout_fraction();
  options.heldout_last = spec.data().heldout_split() == "last";
  options.split_seed = spec.data().split_seed();
  options.shuffle = spec.data().shuffle();
  // The held-out sets share the opened datasets (components hold them by shared_ptr).
  if (spec.eval().every() > 0) RETURN_IF_ERROR(BuildHeldOut(run, mixture, options));
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
  ASSIGN_OR_RETURN(run.plan, BuildPlan(run.spec->strategy(), shape, infos, run.source));
  return absl::OkStatus();
}

// The `output` event of the published model, with what the checkpoint registry records
// (type, manifest sha256, bytes, parents; engine/events.h).
void EmitOutput(const EventWriter& events, const std::string& out) {
  events.Emit(OutputEventOrBare("model", out, kOutputCheckpoint, "cpt"));
}

// A previous attempt of this very spec already published `out`: report it again.
bool AlreadyDone(const v1::TrainSpec& spec, const std::string& spec_sha256) {
  auto text = io::ReadFile(spec.out() + "/" + io::kManifestName);
  if (!text.ok()) return false;
  auto manifest = io::ParseManifest(*text, spec.out());
  return manifest.ok() && manifest->producer.command == "train" &&
         manifest->producer.params.value("spec_sha256", "") == spec_sha256;
}

// Every layer range as written and as resolved for this model ("middle" → "2:7").
EventDetails LayerRangesEvent(const Run& run) {
  EventDetails out = EventDetails::array();
  auto add = [&](const google::protobuf::RepeatedPtrField<std::string>& texts,
                 const std::string& field) {
    absl::StatusOr<std::vector<LayerRange>> ranges = ParseLayerRanges(texts, field);
    if (!ranges.ok()) return;  // checked by the spec's rules
    for (size_t i = 0; i < ranges->size(); ++i) {
      auto r = ResolveLayerRange((*ranges)[i], run.lm->config().num_hidden_layers, field);
      out.push_back({{"field", absl::StrCat(field, "[", i, "]")},
                     {"range", (*ranges)[i].text},
                     {"layers", r.ok() ? FormatLayerRange(*r) : std::string("?")}});
    }
  };
  const v1::TrainStrategy& strategy = run.spec->strategy();
  add(strategy.freeze().layers(), "strategy.freeze.layers");
  for (int i = 0; i < strategy.l2sp_size(); ++i) {
    add(strategy.l2sp(i).layers(), absl::StrCat("strategy.l2sp[", i, "].layers"));
  }
  return out;
}

// The `start` event and, as metric points too (so a study's report and the registry see how
// much a strategy touched), the trainable fraction and count.
void EmitStart(const Run& run, int64_t start_step, const EventWriter& events) {
  const v1::TrainSpec& spec = *run.spec;
  v1::EngineEvent start =
      CommandEvent(engine_contract::kEventStart, "train",
                   {{"spec", run.source},
                    {"model", spec.model()},
                    {"arch", std::string(model::ArchName(run.lm->config().arch))},
                    {"out", spec.out()},
                    {"tokens_per_step", run.tokens_per_step},
                    {"resumed_from_step", start_step},
                    {"world_size", run.ranks->world_size()},
                    {"device", spec.device()},
                    {"precision", spec.precision()},
                    {"threads", at::get_num_threads()},
                    {"total_params", run.plan.total_params},
                    {"trainable_params", run.plan.trainable_params},
                    {"trainable_fraction", run.plan.trainable_fraction()},
                    {"num_layers", run.lm->config().num_hidden_layers},
                    {"layer_ranges", LayerRangesEvent(run)}});
  start.set_total_steps(static_cast<double>(run.total_steps));
  events.Emit(start);
  events.Emit(MetricEvent("trainable_fraction", run.plan.trainable_fraction(), start_step));
  events.Emit(
      MetricEvent("trainable_params", static_cast<double>(run.plan.trainable_params), start_step));
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// How long SetUp took to load the model and to build the optimizer (or shards), for
// STEMMA_TRAIN_PROFILE. Under parallel.shard the weights are read while the shards are built
// (load_model is then the headers only); setup_rss_anon_kib is RssAnon once SetUp is done.
struct SetUpTimes {
  double load_model = 0, build_optimizer = 0;
  int64_t setup_rss_anon_kib = 0;
};

// The model of spec.model. shard none: loaded whole (every rank keeps all of it anyway).
// Sharded: built weightless (engine/model/weightless.h) with `initial` reading the checkpoint's
// elements [begin, end) of parameter i (plan order) into the optimizer's or the shards' buffers,
// so that under `full` a rank reads only its slices and under optimizer | gradients no second
// fp32 copy of the trainable weights exists.
absl::Status LoadForTraining(Run& run, const model::LoadOptions& load,
                             model::TensorLookup* weights) {
  const v1::TrainSpec& spec = *run.spec;
  if (spec.parallel().shard() == "none") {
    ASSIGN_OR_RETURN(run.lm, model::LoadModel(spec.model(), load));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(model::UnloadedModel opened, model::OpenModel(spec.model(), load));
  run.lm = std::move(opened.lm);
  *weights = std::move(opened.weights);
  return absl::OkStatus();
}

// InitialValues over a weightless model's checkpoint (LoadForTraining): zero-copy views of the
// memory-mapped tensors, converted to the buffer's dtype and device by the copy.
InitialValues FromCheckpoint(const Run& run, const model::TensorLookup& weights) {
  return [&run, &weights](size_t i, int64_t begin, int64_t end, const torch::Tensor& out) {
    const std::string& name = run.plan.params.at(i).name;
    absl::StatusOr<torch::Tensor> source = weights(name);
    TORCH_CHECK(source.ok(), "reading tensor '", name, "': ", source.status().message());
    out.copy_(source->reshape(-1).narrow(0, begin, end - begin));
  };
}

// optimizer | gradients from a weightless model: the frozen parameters are plain module
// tensors every rank holds whole; they get memory and the checkpoint's values.
void LoadFrozen(Run& run, const std::vector<torch::Tensor>& params, const InitialValues& initial) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (run.plan.params[i].trainable) continue;
    torch::Tensor value = torch::empty(params[i].sizes(), params[i].options());
    initial(i, 0, value.numel(), value.view(-1));
    params[i].set_data(value);
  }
}

// The optimizer (shard none), ShardedAdamW (optimizer | gradients) or LayerShards (full) over
// the model's parameters, with their values from `weights` when the model is weightless.
absl::Status BuildOptimizer(Run& run, const model::TensorLookup& weights) {
  const v1::TrainSpec& spec = *run.spec;
  std::vector<torch::Tensor> params;
  RETURN_IF_ERROR(BuildPlanFor(run, &params));
  const std::string& shard = spec.parallel().shard();
  const InitialValues initial = weights ? FromCheckpoint(run, weights) : InitialValues();
  return TorchGuard("setting up the optimizer", [&] {
    if (shard == "full") {
      run.full = std::make_unique<LayerShards>(run.lm->config().num_hidden_layers, run.plan.params,
                                               params, spec.optimizer(), *run.ranks,
                                               spec.parallel().bucket_mb() << 20, initial);
      run.lm->model->SetLayerHooks(run.full->Hooks());
      if (run.autocast_bf16) run.full->GatherInBf16ForAutocast();
    } else if (shard == "optimizer" || shard == "gradients") {
      run.sharded = std::make_unique<ShardedAdamW>(
          run.plan.params, params, spec.optimizer(), *run.ranks,
          shard == "optimizer" ? ShardedAdamW::Level::kOptimizer : ShardedAdamW::Level::kGradients,
          spec.parallel().bucket_mb() << 20, initial);
      if (initial) LoadFrozen(run, params, initial);
      if (run.ranks->world_size() > 1 && ShardOverlapEnabled(shard, run.device)) {
        run.sharded->OverlapReduction();
      }
    } else {
      run.optimizer = std::make_unique<FlatAdamW>(run.plan.params, params, spec.optimizer());
      if (run.ranks->world_size() > 1 && ShardOverlapEnabled(shard, run.device)) {
        run.overlap = std::make_unique<OverlappedAllReduce>(params, *run.ranks,
                                                            spec.parallel().bucket_mb() << 20);
      }
    }
    return absl::OkStatus();
  });
}

// Everything before the first step: the datasets, the device, the model, its plan and
// optimizer, the loader, and the newest checkpoint. Returns the step to resume after.
absl::StatusOr<int64_t> SetUp(Run& run, SetUpTimes& times) {
  const v1::TrainSpec& spec = *run.spec;
  // Inputs that only the engine can check, before any work: the datasets open.
  auto mixture = data::OpenMixture(spec.data());
  if (!mixture.ok()) {
    return absl::Status(mixture.status().code(),
                        absl::StrCat(run.source, ": ", mixture.status().message()));
  }
  run.device = torch::Device(spec.device());  // checked by the spec's rules
  if (run.device.is_cuda() && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        absl::StrCat(run.source, ": device: ", spec.device(),
                     " was asked for, but LibTorch sees no CUDA GPU "
                     "(a CPU-only LibTorch, no driver, or CUDA_VISIBLE_DEVICES empty)"));
  }
  ASSIGN_OR_RETURN(run.device, BindDevice(run.device, run.ranks->local_rank()));
  run.autocast_bf16 = spec.precision() == "bfloat16";
  model::LoadOptions load;
  load.device = run.device;
  auto start = std::chrono::steady_clock::now();
  model::TensorLookup weights;  // sharded: the checkpoint, mapped until the shards are built
  RETURN_IF_ERROR(LoadForTraining(run, load, &weights));
  times.load_model = SecondsSince(start);
  start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(BuildOptimizer(run, weights));
  weights = nullptr;  // unmaps the files
  times.build_optimizer = SecondsSince(start);
  RestrictRouters(run);
  RETURN_IF_ERROR(BuildLoader(run, std::move(*mixture)));
  int64_t start_step = 0;
  // A run without periodic checkpoints still has the one a preemption saved.
  if (spec.checkpoint().every() > 0 || io::PathExists(CheckpointDir(spec))) {
    if (run.ranks->rank() == 0) RemoveStaleStaging(CheckpointDir(spec));
    ASSIGN_OR_RETURN(start_step, Resume(run));
  }
  if (start_step > run.total_steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint at step ", start_step, " is past the spec's ", run.total_steps, " steps"));
  }
  // Every rank loaded the same files; under `full` each keeps only its slices of them.
  if (!run.full) {
    run.ranks->BroadcastParameters(run.sharded ? run.sharded->parameters()
                                               : run.optimizer->parameters());
  }
  run.lm->model->SetActivationCheckpointing(spec.activation_checkpointing());
  run.lm->train();
  return start_step;
}

// What the steps of this process did, for the `done` event.
struct Progress {
  int64_t start_step = 0;
  int64_t steps_this_run = 0;
  int64_t stopped_at_step = 0;  // early stopping: the step whose model is published
  double train_seconds = 0.0;
  double last_loss = 0.0;
};

// The `step` event of `step` (every log_every steps, the last, and the first of every run,
// so a run always shows its starting loss).
void EmitStep(const Run& run, int64_t step, const StepResult& r, double seconds,
              const EventWriter& events) {
  v1::EngineEvent e = NewEvent(engine_contract::kEventStep);
  e.set_step(static_cast<double>(step));
  e.set_total_steps(static_cast<double>(run.total_steps));
  auto series = [&e](const char* name, double value) {
    v1::EngineEvent::Series* s = e.add_series();
    s->set_name(name);
    s->set_value(value);
  };
  series("loss", r.loss);
  series("lr", r.lr);
  series("grad_norm", r.stats.grad_norm);
  series("tokens", static_cast<double>(run.tokens));
  series("tokens_per_s", seconds > 0 ? run.tokens_per_step / seconds : 0.0);
  if (run.spec->strategy().l2sp_size() > 0) series("l2sp", r.stats.l2sp);
  if (run.lm->config().is_moe()) {
    series("load_balancing", r.load_balancing);
    series("router_z", r.router_z);
  }
  events.Emit(e);
}

// How long the other ranks wait for rank 0 to finish writing a checkpoint. Longer than
// STEMMA_DDP_TIMEOUT_S (a collective's limit): writing a large model takes minutes.
constexpr std::chrono::hours kCheckpointWait{2};

// The checkpoint of `step`. shard none: rank 0 writes it while the others wait in a barrier
// with kCheckpointWait (not in the next step's collective, whose timeout is the ring's);
// sharded: every rank writes its slice (WriteShardedCheckpoint).
absl::Status Checkpoint(Run& run, int64_t step, const EventWriter& events) {
  const v1::TrainSpec& spec = *run.spec;
  const std::string path = CheckpointDir(spec) + "/" + StepDirName(step);
  const bool sharded = run.sharded || run.full;
  if (sharded) {
    RETURN_IF_ERROR(TorchGuard("writing checkpoint " + path,
                               [&] { return WriteShardedCheckpoint(run, step, path); }));
  } else if (run.ranks->rank() == 0) {
    RETURN_IF_ERROR(
        TorchGuard("writing checkpoint " + path, [&] { return WriteCheckpoint(run, step, path); }));
  }
  if (!sharded) run.ranks->Barrier(kCheckpointWait);
  if (run.ranks->rank() != 0) return absl::OkStatus();
  PruneCheckpoints(CheckpointDir(spec), spec.checkpoint().keep());
  v1::EngineEvent checkpoint = NewEvent(engine_contract::kEventCheckpoint);
  checkpoint.set_step(static_cast<double>(step));
  checkpoint.set_path(path);
  events.Emit(checkpoint);
  return absl::OkStatus();
}

// Out of device (or host) memory in a step: the same attempt would run out again, so the
// error is one the worker does not retry (FailedPrecondition), and says what would fit.
absl::Status OutOfMemory(const Run& run, int64_t step, const c10::OutOfMemoryError& e) {
  std::string what = e.what_without_backtrace();
  what = what.substr(0, what.find('\n'));
  return absl::FailedPreconditionError(absl::StrCat(
      "out of memory on ", run.device.str(), " at step ", step, " (batch_size ",
      run.spec->batch_size(), " over ", run.ranks->world_size(), " rank(s), seq_len ",
      run.spec->data().seq_len(), ", parallel.shard ", run.spec->parallel().shard(),
      "): not retried, the same attempt would fail again; lower batch_size (raise grad_accum), "
      "shard more (parallel.shard) or use more GPUs: ",
      what));
}

// Steps start_step+1 .. total_steps, with evaluations and checkpoints as the spec asks.
// kStopped when --stop-after-step ends the run early (as if preempted), kPreempted after a
// preemption's checkpoint.
absl::StatusOr<RunResult> RunSteps(Run& run, const RunOptions& options, Progress& progress,
                                   const EventWriter& events) {
  using Clock = std::chrono::steady_clock;
  const v1::TrainSpec& spec = *run.spec;
  const int64_t total = run.total_steps, eval_every = spec.eval().every();
  const int64_t checkpoint_every = spec.checkpoint().every();
  const StopRequest stop_request;
  for (int64_t step = progress.start_step + 1; step <= total; ++step) {
    const auto begin = Clock::now();
    StepResult r;
    RETURN_IF_ERROR(TorchGuard(absl::StrCat("step ", step), [&]() -> absl::Status {
      try {
        ASSIGN_OR_RETURN(r, TrainStep(run, step));
      } catch (const c10::OutOfMemoryError& e) {
        return OutOfMemory(run, step, e);
      }
      return absl::OkStatus();
    }));
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    progress.train_seconds += seconds;
    ++progress.steps_this_run;
    run.tokens += run.tokens_per_step;
    progress.last_loss = r.loss;
    if (step % spec.log_every() == 0 || step == total || step == progress.start_step + 1) {
      EmitStep(run, step, r, seconds, events);
    }
    if (eval_every > 0 && (step % eval_every == 0 || step == total)) {
      RETURN_IF_ERROR(TorchGuard(absl::StrCat("held-out evaluation at step ", step), [&] {
        EvaluateHeldOut(run, step, events);
        return absl::OkStatus();
      }));
    }
    const bool checkpoint_due =
        checkpoint_every > 0 && step % checkpoint_every == 0 && step < total;
    if (checkpoint_due) RETURN_IF_ERROR(Checkpoint(run, step, events));
    if (options.stop_after_step == step && step < total) return RunResult::kStopped;
    if (step == total) break;
    const StopRequest::Kind asked = stop_request.Requested(*run.ranks);
    if (asked == StopRequest::Kind::kPreempt) {
      // The resumable checkpoint of this step now, unless it was just written: the next
      // attempt loses no step.
      if (!checkpoint_due) RETURN_IF_ERROR(Checkpoint(run, step, events));
      if (run.ranks->rank() == 0) {
        std::fprintf(stderr, "train: preempted after step %lld; resumable checkpoint %s/%s\n",
                     static_cast<long long>(step), CheckpointDir(spec).c_str(),
                     StepDirName(step).c_str());
      }
      return RunResult::kPreempted;
    }
    if (asked == StopRequest::Kind::kStop) {
      progress.stopped_at_step = step;  // early stopping: publish this step's model as `out`
      break;
    }
  }
  return RunResult::kFinished;
}

// Under parallel.shard: full, rank 0 writes the model to `out` tensor by tensor while every
// rank gathers it one unit at a time (collective): no process holds more than one decoder
// layer of it (or the embeddings and head) at once. A rank 0 that cannot write still takes
// part in every gather, so that the others finish; it returns the error afterwards.
absl::Status PublishGathered(Run& run, const model::SaveOptions& save) {
  const bool writes = run.ranks->rank() == 0;
  std::unique_ptr<model::StreamedModelWriter> writer;
  absl::Status status;
  if (writes) {
    ClearRouterRestriction(run);
    auto created = model::StreamedModelWriter::Create(run.lm, run.spec->out(), save);
    if (created.ok()) {
      writer = std::move(*created);
    } else {
      status = created.status();
    }
  }
  RETURN_IF_ERROR(TorchGuard("gathering the model to publish", [&] {
    run.full->FreeOptimizerState();  // no step follows
    run.full->ForEachParameter([&](const std::string& name, const torch::Tensor& value) {
      // A throw here would take rank 0 out of the gathers the other ranks wait in: rank 0
      // keeps gathering after a failed write (its status says why) and reports at the end.
      if (writer != nullptr && status.ok()) {
        status = TorchGuard(absl::StrCat("writing tensor '", name, "'"),
                            [&] { return writer->Write(name, value); });
      }
    });
    return absl::OkStatus();
  }));
  if (!writes) return absl::OkStatus();
  if (status.ok()) status = writer->Commit();
  return status;
}

// Rank 0 writes the model to `out` (in save_dtype) and announces it. Under `full` every rank
// takes part in gathering the weights.
absl::Status Publish(Run& run, int64_t stopped_at_step, const EventWriter& events) {
  const v1::TrainSpec& spec = *run.spec;
  model::SaveOptions save;
  save.dtype = spec.save_dtype() == "bfloat16"  ? torch::kBFloat16
               : spec.save_dtype() == "float16" ? torch::kFloat16
                                                : torch::kFloat32;
  save.parents = {spec.model()};
  save.producer = Producer(run, stopped_at_step);
  save.overwrite = spec.overwrite();
  save.source_dir = spec.model();
  absl::Status saved;
  if (run.full) {
    saved = PublishGathered(run, save);
  } else if (run.ranks->rank() == 0) {
    ClearRouterRestriction(run);
    saved = model::SaveModel(run.lm, spec.out(), save);
  }
  if (run.ranks->rank() != 0) return saved;
  if (!saved.ok()) {
    return absl::Status(saved.code(), absl::StrCat("writing ", spec.out(), ": ", saved.message()));
  }
  EmitOutput(events, spec.out());
  return absl::OkStatus();
}

// The value of a "Name:   123 kB" line of /proc/self/status in KiB (0 when absent).
int64_t StatusKib(const char* name) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  int64_t kib = 0;
  const size_t length = std::strlen(name);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, name, length) == 0 && line[length] == ':') {
      kib = std::strtoll(line + length + 1, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kib;
}

// STEMMA_TRAIN_PROFILE=1: one line per rank on stderr, "train profile: {json}", saying where
// the time went (seconds) and the memory at the end (KiB). Under parallel.shard: full the
// steps are split into forward and backward compute, gathers, reduce-scatters and the
// optimizer (LayerShards::Profile); `other` is the rest of the steps' time (data, loss sums).
void PrintProfile(const Run& run, const SetUpTimes& times, const Progress& p) {
  if (std::getenv("STEMMA_TRAIN_PROFILE") == nullptr) return;
  nlohmann::json j = {{"rank", run.ranks->rank()},
                      {"load_model_s", times.load_model},
                      {"build_optimizer_s", times.build_optimizer},
                      {"setup_rss_anon_kib", times.setup_rss_anon_kib},
                      {"steps", p.steps_this_run},
                      {"steps_s", p.train_seconds},
                      {"rss_anon_kib", StatusKib("RssAnon")},
                      {"vm_hwm_kib", StatusKib("VmHWM")}};
  if (run.full) {
    const LayerShards::Profile& f = run.full->profile();
    j["forward_s"] = f.forward;
    j["backward_s"] = f.backward;
    j["gather_s"] = f.gather;
    j["gathers"] = f.gathers;
    j["prefetches"] = f.prefetches;
    j["reduce_scatter_s"] = f.reduce_scatter;
    j["optimizer_s"] = f.optimizer;
    j["other_s"] =
        p.train_seconds - f.forward - f.backward - f.gather - f.reduce_scatter - f.optimizer;
  }
  std::fprintf(stderr, "train profile: %s\n", j.dump().c_str());
}

void EmitDone(const Run& run, const Progress& p, const EventWriter& events) {
  events.Emit(CommandEvent(
      engine_contract::kEventDone, "train",
      {{"out", run.spec->out()},
       {"steps", p.stopped_at_step > 0 ? p.stopped_at_step : run.total_steps},
       {"stopped_at_step", p.stopped_at_step},
       {"steps_this_run", p.steps_this_run},
       {"resumed_from_step", p.start_step},
       {"tokens", run.tokens},
       {"final_loss", p.last_loss},
       {"tokens_per_s",
        p.train_seconds > 0 ? p.steps_this_run * run.tokens_per_step / p.train_seconds : 0.0},
       {"train_seconds", p.train_seconds},
       {"total_params", run.plan.total_params},
       {"trainable_params", run.plan.trainable_params},
       {"trainable_fraction", run.plan.trainable_fraction()}}));
}

absl::StatusOr<RunResult> TrainImpl(const v1::TrainSpec& spec, const RunOptions& options,
                                    const EventWriter& parent_events) {
  Run run;
  run.spec = &spec;
  run.source = options.source;
  run.spec_sha256 = io::Sha256Hex(SpecAsJson(spec).dump());
  run.total_steps = TotalSteps(spec);
  run.tokens_per_step = TokensPerStep(spec);
  ASSIGN_OR_RETURN(run.ranks, DataParallel::FromEnv());
  const EventWriter events(parent_events.enabled() && run.ranks->rank() == 0);
  if (spec.batch_size() % run.ranks->world_size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(run.source, ": batch_size ", spec.batch_size(),
                                                   " is not divisible by WORLD_SIZE ",
                                                   run.ranks->world_size()));
  }
  // threads 0: the job's CPUs ($STEMMA_CPUS), so a one-CPU job runs one thread.
  if (const int64_t threads = EffectiveThreads(spec.threads()); threads > 0) {
    at::set_num_threads(static_cast<int>(threads));
  }
  torch::manual_seed(spec.seed());

  if (!spec.overwrite() && AlreadyDone(spec, run.spec_sha256)) {
    EmitOutput(events, spec.out());
    events.Emit(CommandEvent(engine_contract::kEventDone, "train",
                             {{"out", spec.out()}, {"already_done", true}}));
    return RunResult::kFinished;
  }
  if (io::PathExists(spec.out()) && !spec.overwrite()) {
    return absl::AlreadyExistsError(absl::StrCat(run.source, ": out: ", spec.out(),
                                                 " already exists (set overwrite: true to "
                                                 "replace it)"));
  }
  // The directory `out` goes into (e.g. models/ under the storage root) is made now, not
  // found missing after the last step.
  if (std::error_code ec; !fs::create_directories(fs::path(spec.out()).parent_path(), ec) && ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        run.source, ": out: cannot create the directory of ", spec.out(), ": ", ec.message()));
  }
  Progress progress;
  SetUpTimes times;
  ASSIGN_OR_RETURN(progress.start_step, SetUp(run, times));
  times.setup_rss_anon_kib = StatusKib("RssAnon");
  EmitStart(run, progress.start_step, events);
  if (spec.eval().every() > 0 && progress.start_step == 0) {
    RETURN_IF_ERROR(TorchGuard("held-out evaluation before step 1", [&] {
      EvaluateHeldOut(run, 0, events);
      return absl::OkStatus();
    }));
  }
  ASSIGN_OR_RETURN(RunResult result, RunSteps(run, options, progress, events));
  if (result == RunResult::kStopped || result == RunResult::kPreempted) return result;
  PrintProfile(run, times, progress);
  RETURN_IF_ERROR(Publish(run, progress.stopped_at_step, events));
  EmitDone(run, progress, events);
  return RunResult::kFinished;
}

}  // namespace

absl::StatusOr<RunResult> Train(const v1::TrainSpec& spec, const RunOptions& options,
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
