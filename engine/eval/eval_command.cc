// stemma-engine eval --spec FILE (docs/eval.md, docs/engine/eval.md): perplexity and bits
// per byte on held-out token shards, k-shot multiple choice (lm-eval's acc / acc_norm),
// k-shot translation with chrF / chrF++. The spec is the typed stemma.v1.EvalSpec, read and
// checked by ParseEngineCommandLine; every input is read and checked before the model is
// loaded (a bad one exits 4, kExitBadInput); results go to stdout as metric events and, at
// the end, to one results JSON file written atomically. What precedes the model — the plan,
// the per-task cache lookup — and the results writer are torch-free (eval_plan.h,
// cached_tasks.h, eval_results.h) and shared with stemma-engine's front, which answers a fully
// cached eval without starting this binary (serve_cached.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/engine_contract.h"
#include "common/status.h"
#include "engine/commands.h"
#include "engine/data/dataset.h"
#include "engine/eval/cached_tasks.h"
#include "engine/eval/choice.h"
#include "engine/eval/chrf.h"
#include "engine/eval/commands.h"
#include "engine/eval/eval_model.h"
#include "engine/eval/eval_plan.h"
#include "engine/eval/eval_ranks.h"
#include "engine/eval/eval_results.h"
#include "engine/eval/eval_text.h"
#include "engine/eval/perplexity.h"
#include "engine/eval/task_cache.h"
#include "engine/eval/translation.h"
#include "engine/events.h"
#include "engine/tokenizer/tokenizer.h"

namespace stemma::engine {
namespace {

using eval::EvalModel;
using eval::EvalRanks;
using eval::Json;

void Emit(const v1::EngineEvent& event) { EventWriter().Emit(event); }

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Progress events: at most ~100 per task. `total` is the exact number of Advance calls
// the task makes; the step never passes it.
class Progress {
 public:
  Progress(std::string task, int64_t total)
      : task_(std::move(task)), total_(std::max<int64_t>(total, 1)) {}
  void Advance() {
    done_ = std::min(done_ + 1, total_);
    if (done_ == total_ || done_ % std::max<int64_t>(1, total_ / 100) == 0) {
      v1::EngineEvent event =
          ProgressEvent(static_cast<double>(done_) / static_cast<double>(total_), task_);
      event.set_step(static_cast<double>(done_));
      event.set_total_steps(static_cast<double>(total_));
      Emit(event);
    }
  }

 private:
  std::string task_;
  int64_t total_, done_ = 0;
};

// How many of `count` items are this rank's.
int64_t MineCount(const EvalRanks& ranks, size_t count) {
  int64_t mine = 0;
  for (size_t i = 0; i < count; ++i) mine += ranks.Mine(static_cast<int64_t>(i)) ? 1 : 0;
  return mine;
}

// One task (its spec with every default filled): its data read and checked by Prepare
// (before the model loads), then Run.
class Task {
 public:
  explicit Task(v1::EvalTask spec) : spec_(std::move(spec)) {}
  virtual ~Task() = default;
  virtual absl::Status Prepare(const tokenizer::Tokenizer& tokenizer) = 0;
  // Computes this rank's share of the items; rank 0 gathers the rest, scores and fills
  // `result` (the other ranks leave it as it is).
  virtual absl::Status Run(EvalModel& model, const v1::EvalSpec& eval_spec, EvalRanks& ranks,
                           Json* result) = 0;
  const v1::EvalTask& spec() const { return spec_; }

  void Metric(const std::string& metric, double value, Json* result) const {
    eval::EmitTaskMetric(spec_, suite_, metric, value, result);
  }
  // The corpus suite the task's data file belongs to (EvalPlan::suites), or null.
  void set_suite(Json suite) { suite_ = std::move(suite); }

 protected:
  v1::EvalTask spec_;
  const tokenizer::Tokenizer* tokenizer_ = nullptr;
  Json suite_;
};

class PerplexityTask : public Task {
 public:
  PerplexityTask(v1::EvalTask spec, std::string seq_len_source)
      : Task(std::move(spec)), seq_len_source_(std::move(seq_len_source)) {}
  absl::Status Prepare(const tokenizer::Tokenizer& tokenizer) override {
    tokenizer_ = &tokenizer;
    ASSIGN_OR_RETURN(dataset_, data::Dataset::Open(spec_.data()));
    const auto& info = dataset_->tokenizer();
    if (info.kind != tokenizer.kind() || info.vocab_size != tokenizer.vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec_.data(), ": made with a ", info.kind, " tokenizer of ", info.vocab_size,
                       " ids, but the eval tokenizer is ", std::string(tokenizer.kind()), " with ",
                       tokenizer.vocab_size(), " (bits per byte decodes the tokens with it)"));
    }
    const v1::PerplexityTask& p = spec_.perplexity();
    eval::PerplexityStreamOptions options;
    options.heldout = p.split() == "heldout";
    options.heldout_fraction = p.heldout_fraction();
    options.split_seed = p.split_seed();
    options.heldout_last = p.heldout_split() == "last";
    options.limit = spec_.limit();
    ASSIGN_OR_RETURN(stream_, eval::BuildPerplexityStream(*dataset_, options, info.vocab_size));
    return absl::OkStatus();
  }

  absl::Status Run(EvalModel& model, const v1::EvalSpec& eval_spec, EvalRanks& ranks,
                   Json* result) override {
    const v1::PerplexityTask& p = spec_.perplexity();
    const int64_t seq_len = p.seq_len();  // ResolveSequenceLengths set and checked it
    if (seq_len > model.max_positions()) {
      return absl::InvalidArgumentError(
          absl::StrCat("task ", spec_.name(), ": seq_len ", seq_len,
                       " exceeds the model's max_position_embeddings ", model.max_positions()));
    }
    if (dataset_->tokenizer().vocab_size > model.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(spec_.data(), ": tokenizer has ",
                                                     dataset_->tokenizer().vocab_size,
                                                     " ids, the model ", model.vocab_size()));
    }
    const auto windows = eval::PerplexityWindows(stream_, seq_len);
    const auto batches = Batches(windows, eval_spec.batch_size());
    Progress progress(spec_.name(), MineCount(ranks, batches.size()));
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::pair<int64_t, nlohmann::json>> mine;  // (batch, [nll per window])
    for (size_t b = 0; b < batches.size(); ++b) {
      if (!ranks.Mine(b)) continue;
      std::vector<std::vector<int32_t>> rows;
      for (size_t i = batches[b].first; i < batches[b].second; ++i) {
        rows.push_back(eval::WindowTokens(stream_, windows[i]));
      }
      ASSIGN_OR_RETURN(auto losses, model.WindowLosses(rows));
      auto nll = nlohmann::json::array();
      for (const auto& loss : losses) nll.push_back(loss.nll);
      mine.emplace_back(b, std::move(nll));
      progress.Advance();
    }
    ASSIGN_OR_RETURN(auto gathered, ranks.Gather(spec_.name(), batches.size(), mine));
    if (!ranks.is_zero()) return absl::OkStatus();
    eval::PerplexityTotals totals;  // summed in window order, as one process would
    for (size_t b = 0; b < batches.size(); ++b) {
      for (size_t i = batches[b].first; i < batches[b].second; ++i) {
        totals.nll += gathered[b].at(i - batches[b].first).get<double>();
        totals.tokens += windows[i].length;
      }
    }
    const double seconds = Seconds(start);
    totals.bytes = eval::DocumentBytes(*dataset_, stream_.documents, *tokenizer_);
    totals_ = totals;
    (*result)["seq_len"] = seq_len;
    (*result)["seq_len_source"] = seq_len_source_;
    (*result)["split"] = p.split();
    if (p.split() == "heldout") {
      (*result)["heldout_split"] = p.heldout_split();
      (*result)["heldout_fraction"] = p.heldout_fraction();
      if (p.heldout_split() == "hash") (*result)["split_seed"] = p.split_seed();
    }
    (*result)["documents"] = stream_.documents.size();
    (*result)["windows"] = windows.size();
    (*result)["tokens"] = totals.tokens;
    (*result)["bytes"] = totals.bytes;
    (*result)["nll"] = totals.nll;
    (*result)["seconds"] = seconds;
    (*result)["tokens_per_s"] = seconds > 0 ? static_cast<double>(totals.tokens) / seconds : 0.0;
    Metric("ppl", totals.Perplexity(), result);
    if (totals.bytes > 0) Metric("bpb", totals.BitsPerByte(), result);
    return absl::OkStatus();
  }

  const eval::PerplexityTotals& totals() const { return totals_; }

  // The forward passes Run makes, as [first, end) window ranges: runs of equal-length
  // windows, `batch` at a time (only the last window may be shorter, and it then makes a
  // batch of its own).
  static std::vector<std::pair<size_t, size_t>> Batches(
      const std::vector<eval::WindowRange>& windows, int64_t batch) {
    std::vector<std::pair<size_t, size_t>> batches;
    for (size_t i = 0; i < windows.size();) {
      size_t j = i;
      while (j < windows.size() && static_cast<int64_t>(j - i) < batch &&
             windows[j].length == windows[i].length) {
        ++j;
      }
      batches.emplace_back(i, j);
      i = j;
    }
    return batches;
  }

 private:
  std::string seq_len_source_;
  std::unique_ptr<data::Dataset> dataset_;
  eval::PerplexityStream stream_;
  eval::PerplexityTotals totals_;
};

// The few-shot pool of a choice or translation task (`Options`: its kind's message):
// `fewshot_data` when given, else the evaluated docs themselves (the evaluated doc is then
// never its own example).
template <typename Options, typename Doc>
absl::Status CheckPool(const v1::EvalTask& spec, const Options& options,
                       const std::vector<Doc>& pool) {
  const bool same = options.fewshot_data().empty();
  const int64_t available = static_cast<int64_t>(pool.size()) - (same ? 1 : 0);
  if (options.k() > available) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task ", spec.name(), ": k is ", options.k(), " but the few-shot pool (",
        same ? spec.data() : options.fewshot_data(), ") has only ", available, " other examples"));
  }
  return absl::OkStatus();
}

template <typename Options>
eval::FewShotSampler Sampler(const Options& options) {
  return options.sampler() == "first_n" ? eval::FewShotSampler::kFirstN
                                        : eval::FewShotSampler::kSeeded;
}

class ChoiceTask : public Task {
 public:
  using Task::Task;
  absl::Status Prepare(const tokenizer::Tokenizer& tokenizer) override {
    tokenizer_ = &tokenizer;
    const v1::ChoiceTask& c = spec_.choice();
    ASSIGN_OR_RETURN(auto format, eval::ChoiceFormatFromName(c.format()));
    ASSIGN_OR_RETURN(docs_, eval::ReadChoiceDocs(spec_.data(), format));
    if (!c.fewshot_data().empty()) {
      ASSIGN_OR_RETURN(pool_, eval::ReadChoiceDocs(c.fewshot_data(), format));
    }
    return CheckPool(spec_, c, pool());
  }

  absl::Status Run(EvalModel& model, const v1::EvalSpec&, EvalRanks& ranks, Json* result) override {
    const v1::ChoiceTask& c = spec_.choice();
    const bool same = c.fewshot_data().empty();
    const int64_t n =
        spec_.limit() > 0 ? std::min<int64_t>(spec_.limit(), docs_.size()) : docs_.size();
    const bool add_bos = c.has_add_bos() ? c.add_bos() : tokenizer_->bos_id().has_value();
    const std::optional<int32_t> bos = add_bos ? tokenizer_->bos_id() : std::nullopt;
    Progress progress(spec_.name(), MineCount(ranks, n));
    std::vector<std::pair<int64_t, nlohmann::json>> mine;  // (doc, log-likelihoods)
    for (int64_t d = 0; d < n; ++d) {
      if (!ranks.Mine(d)) continue;
      std::vector<const eval::ChoiceDoc*> shots;
      for (int64_t i :
           eval::FewShotIndices(pool().size(), c.k(), d, same ? d : -1, Sampler(c), c.seed())) {
        shots.push_back(&pool()[i]);
      }
      const auto& doc = docs_[d];
      const std::string context = eval::ChoiceContext(shots, doc);
      std::vector<int32_t> context_ids;
      std::vector<std::vector<int32_t>> continuations;
      for (const auto& choice : doc.choices) {
        auto pair = eval::EncodePair(*tokenizer_, context, " " + choice, bos);
        context_ids = std::move(pair.context);
        continuations.push_back(std::move(pair.continuation));
      }
      ASSIGN_OR_RETURN(
          auto lls, model.ContinuationLogLikelihoods(context_ids, continuations, c.max_length()));
      mine.emplace_back(d, nlohmann::json(lls));
      progress.Advance();
    }
    ASSIGN_OR_RETURN(auto gathered, ranks.Gather(spec_.name(), n, mine));
    if (!ranks.is_zero()) return absl::OkStatus();
    eval::ChoiceOutcome sum;
    Json details = Json::array();
    for (int64_t d = 0; d < n; ++d) {
      const auto lls = gathered[d].get<std::vector<double>>();
      const auto outcome = eval::ScoreChoices(lls, docs_[d].choices, docs_[d].gold);
      sum.acc += outcome.acc;
      sum.acc_norm += outcome.acc_norm;
      sum.acc_bytes += outcome.acc_bytes;
      details.push_back({{"gold", docs_[d].gold}, {"log_likelihoods", lls}});
    }
    (*result)["format"] = c.format();
    (*result)["k"] = c.k();
    (*result)["sampler"] = c.sampler();
    (*result)["seed"] = c.seed();
    (*result)["add_bos"] = add_bos;
    (*result)["examples"] = n;
    (*result)["docs"] = std::move(details);
    Metric("acc", sum.acc / n, result);
    Metric("acc_norm", sum.acc_norm / n, result);
    Metric("acc_bytes", sum.acc_bytes / n, result);
    return absl::OkStatus();
  }

 private:
  const std::vector<eval::ChoiceDoc>& pool() const {
    return spec_.choice().fewshot_data().empty() ? docs_ : pool_;
  }
  std::vector<eval::ChoiceDoc> docs_, pool_;
};

class TranslationTask : public Task {
 public:
  using Task::Task;
  absl::Status Prepare(const tokenizer::Tokenizer& tokenizer) override {
    tokenizer_ = &tokenizer;
    const v1::TranslationTask& t = spec_.translation();
    ASSIGN_OR_RETURN(pairs_,
                     eval::ReadTranslationPairs(spec_.data(), t.source_field(), t.target_field()));
    if (!t.fewshot_data().empty()) {
      ASSIGN_OR_RETURN(
          pool_, eval::ReadTranslationPairs(t.fewshot_data(), t.source_field(), t.target_field()));
    }
    return CheckPool(spec_, t, pool());
  }

  absl::Status Run(EvalModel& model, const v1::EvalSpec&, EvalRanks& ranks, Json* result) override {
    const v1::TranslationTask& t = spec_.translation();
    const bool same = t.fewshot_data().empty();
    const int64_t n =
        spec_.limit() > 0 ? std::min<int64_t>(spec_.limit(), pairs_.size()) : pairs_.size();
    const int64_t max_prompt = model.max_positions() - t.max_new_tokens();
    if (max_prompt < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "task ", spec_.name(), ": max_new_tokens ", t.max_new_tokens(),
          " leaves no room for a prompt in max_position_embeddings ", model.max_positions()));
    }
    const auto eos = tokenizer_->eos_id();
    Progress progress(spec_.name(), MineCount(ranks, n));
    std::vector<std::pair<int64_t, nlohmann::json>> mine;  // (sentence, generated token ids)
    for (int64_t d = 0; d < n; ++d) {
      if (!ranks.Mine(d)) continue;
      std::vector<const eval::TranslationPair*> shots;
      for (int64_t i :
           eval::FewShotIndices(pool().size(), t.k(), d, same ? d : -1, Sampler(t), t.seed())) {
        shots.push_back(&pool()[i]);
      }
      const auto& pair = pairs_[d];
      std::vector<int32_t> prompt;
      if (tokenizer_->bos_id()) prompt.push_back(*tokenizer_->bos_id());
      const auto body = tokenizer_->Encode(
          eval::TranslationPrompt(shots, pair, t.source_name(), t.target_name()));
      prompt.insert(prompt.end(), body.begin(), body.end());
      // Long prompts lose their oldest tokens (the first shots), as lm-eval truncates left.
      if (static_cast<int64_t>(prompt.size()) > max_prompt) {
        prompt.erase(prompt.begin(), prompt.end() - max_prompt);
      }
      auto stop = [&](std::span<const int32_t> generated) {
        if (eos && generated.back() == *eos) return true;
        return eval::TranslationComplete(Text(generated));
      };
      ASSIGN_OR_RETURN(auto generated, model.Generate(prompt, t.max_new_tokens(), stop));
      mine.emplace_back(d, nlohmann::json(generated));
      progress.Advance();
    }
    ASSIGN_OR_RETURN(auto gathered, ranks.Gather(spec_.name(), n, mine));
    if (!ranks.is_zero()) return absl::OkStatus();
    std::vector<std::string> hypotheses, references;
    Json details = Json::array();
    for (int64_t d = 0; d < n; ++d) {
      const auto generated = gathered[d].get<std::vector<int32_t>>();
      std::string hypothesis = eval::TranslationHypothesis(Text(generated));
      details.push_back({{"hypothesis", hypothesis}, {"reference", pairs_[d].target}});
      hypotheses.push_back(std::move(hypothesis));
      references.push_back(pairs_[d].target);
    }
    (*result)["source_language"] = t.source_language();
    (*result)["k"] = t.k();
    (*result)["sampler"] = t.sampler();
    (*result)["seed"] = t.seed();
    (*result)["max_new_tokens"] = t.max_new_tokens();
    (*result)["examples"] = n;
    (*result)["segments"] = std::move(details);
    Metric("chrf", eval::CorpusChrf(hypotheses, references, eval::ChrfOptions()), result);
    Metric("chrf++", eval::CorpusChrf(hypotheses, references, eval::ChrfPlusPlusOptions()), result);
    return absl::OkStatus();
  }

 private:
  // Generated ids as text, special tokens dropped.
  std::string Text(std::span<const int32_t> ids) const {
    std::vector<int32_t> kept;
    for (int32_t id : ids) {
      if (!tokenizer_->IsSpecial(id)) kept.push_back(id);
    }
    return tokenizer_->Decode(kept);
  }
  const std::vector<eval::TranslationPair>& pool() const {
    return spec_.translation().fewshot_data().empty() ? pairs_ : pool_;
  }
  std::vector<eval::TranslationPair> pairs_, pool_;
};

std::unique_ptr<Task> MakeTask(const v1::EvalTask& spec, const std::string& seq_len_source) {
  if (spec.has_choice()) return std::make_unique<ChoiceTask>(spec);
  if (spec.has_translation()) return std::make_unique<TranslationTask>(spec);
  return std::make_unique<PerplexityTask>(spec, seq_len_source);
}

constexpr char kUsage[] = "stemma-engine eval --spec FILE [--<field> VALUE ...]";

// The plan's tasks, each with its data read and checked (Prepare) before the model loads.
absl::StatusOr<std::vector<std::unique_ptr<Task>>> PrepareTasks(
    const eval::EvalPlan& plan, const tokenizer::Tokenizer& tokenizer) {
  std::vector<std::unique_ptr<Task>> tasks;
  for (int i = 0; i < plan.spec.tasks_size(); ++i) {
    tasks.push_back(MakeTask(plan.spec.tasks(i), plan.seq_len_sources[i]));
    tasks.back()->set_suite(plan.suites[i]);
    RETURN_IF_ERROR(tasks.back()->Prepare(tokenizer));
  }
  return tasks;
}

absl::StatusOr<std::unique_ptr<EvalModel>> LoadModel(const v1::EvalSpec& spec,
                                                     const tokenizer::Tokenizer& tokenizer) {
  eval::EvalModelOptions model_options;
  model_options.dtype = spec.dtype();
  model_options.threads = static_cast<int>(spec.threads());
  model_options.device = spec.device();
  ASSIGN_OR_RETURN(std::unique_ptr<EvalModel> model, EvalModel::Load(spec.model(), model_options));
  if (tokenizer.vocab_size() > model->vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(spec.tokenizer(), ": the tokenizer has ",
                                                   tokenizer.vocab_size(), " ids but the model (",
                                                   spec.model(), ") only ", model->vocab_size()));
  }
  return model;
}

absl::Status Eval(const google::protobuf::Message& proto_spec, const std::string& spec_path) {
  const auto& given = static_cast<const v1::EvalSpec&>(proto_spec);
  // What only the engine can check, before any work: the device, then the model directory
  // and the sequence lengths it implies (PlanEval).
  RETURN_IF_ERROR(EvalModel::CheckDevice(given.device()));
  ASSIGN_OR_RETURN(eval::EvalPlan plan, eval::PlanEval(given, spec_path));
  const v1::EvalSpec& spec = plan.spec;
  Emit(eval::StartEvent(plan));

  ASSIGN_OR_RETURN(Json checkpoint, eval::CheckpointIdentity(spec.model()));
  ASSIGN_OR_RETURN(auto tokenizer, tokenizer::Tokenizer::Load(spec.tokenizer()));
  ASSIGN_OR_RETURN(auto tasks, PrepareTasks(plan, *tokenizer));
  eval::CachedTasks cached = eval::LookUpCachedTasks(eval::TaskCache::FromEnv(), spec, checkpoint);
  cached.tokenizer_kind = std::string(tokenizer->kind());  // stored with what is computed
  // When every task is cached no rank joins and no model loads (all ranks decide the same
  // hits). stemma-engine's front answers such an eval the same way without starting this
  // binary (eval/serve_cached.h); this is the path of a run without the front.
  if (cached.AllHit()) return eval::WriteServedEval(plan, checkpoint, tokenizer->kind(), cached);

  // Every rank joins before the model loads, so a missing rank fails fast and cheaply.
  ASSIGN_OR_RETURN(std::unique_ptr<EvalRanks> ranks, EvalRanks::FromEnv());
  ASSIGN_OR_RETURN(std::unique_ptr<EvalModel> model, LoadModel(spec, *tokenizer));
  eval::EvalResults results(plan, checkpoint, tokenizer->kind(), model->device(),
                            ranks->world_size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (cached.hits[i].has_value()) {
      if (ranks->is_zero()) results.AddServed(i, *cached.hits[i]);
      continue;
    }
    Json result = results.TaskResult(i);
    RETURN_IF_ERROR(tasks[i]->Run(*model, spec, *ranks, &result));
    if (!ranks->is_zero()) continue;  // rank 0 scores and writes
    std::optional<eval::PerplexityTotals> totals;
    if (auto* p = dynamic_cast<PerplexityTask*>(tasks[i].get())) totals = p->totals();
    cached.Store(i, result, totals, spec.out());
    results.AddComputed(std::move(result), totals);
  }
  if (!ranks->is_zero()) return absl::OkStatus();  // its share went to rank 0
  return results.Finish(cached);
}

}  // namespace

int RunEval(int argc, char** argv) {
  auto run = [](const SpecCall& call) -> absl::StatusOr<int> {
    RETURN_IF_ERROR(Eval(*call.spec, call.spec_file));
    return engine_contract::kExitOk;
  };
  return RunSpecCommand({kUsage, {}, run}, argc, argv);
}

}  // namespace stemma::engine
