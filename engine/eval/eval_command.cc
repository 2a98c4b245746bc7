// stemma-engine eval --spec FILE (docs/eval.md, docs/engine/eval.md): perplexity and bits
// per byte on held-out token shards, k-shot multiple choice (lm-eval's acc / acc_norm),
// k-shot translation with chrF / chrF++. The spec is the typed stemma.v1.EvalSpec, read and
// checked by ParseEngineCommandLine; every input is read and checked before the model is
// loaded (a bad one exits 4, kExitBadInput); results go to stdout as metric events and, at
// the end, to one results JSON file written atomically.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "common/engine_spec.h"
#include "common/eval_task.h"
#include "common/status.h"
#include "engine/commands.h"
#include "engine/data/dataset.h"
#include "engine/eval/choice.h"
#include "engine/eval/chrf.h"
#include "engine/eval/commands.h"
#include "engine/eval/eval_model.h"
#include "engine/eval/eval_ranks.h"
#include "engine/eval/eval_text.h"
#include "engine/eval/perplexity.h"
#include "engine/eval/resolve.h"
#include "engine/eval/task_cache.h"
#include "engine/eval/translation.h"
#include "engine/events.h"
#include "engine/io/durable.h"
#include "engine/io/fs.h"
#include "engine/io/manifest.h"
#include "engine/io/sha256.h"
#include "engine/tokenizer/tokenizer.h"

namespace stemma::engine {
namespace {

namespace fs = std::filesystem;
using eval::EvalModel;
using eval::EvalRanks;
using Json = nlohmann::ordered_json;  // the results file keeps the order it is built in

// Invalid UTF-8 (which no input should carry) is replaced rather than thrown on.
std::string Dump(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

void Emit(const v1::EngineEvent& event) { EventWriter().Emit(event); }

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// What a result measured: sha256 of the checkpoint's stemma.json when it has one, else of
// the sorted "<sha256>  <file>\n" lines (sha256sum's format) of config.json and every
// *.safetensors file.
absl::StatusOr<Json> CheckpointIdentity(const std::string& dir) {
  const fs::path manifest = fs::path(dir) / io::kManifestName;
  Json id = {{"path", dir}};
  if (fs::exists(manifest)) {
    ASSIGN_OR_RETURN(std::string hash, io::Sha256File(manifest.string()));
    id["sha256"] = hash;
    id["hash_of"] = io::kManifestName;
    return id;
  }
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "config.json" || entry.path().extension() == ".safetensors") files.push_back(name);
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  std::string listing;
  for (const auto& name : files) {
    ASSIGN_OR_RETURN(std::string hash, io::Sha256File((fs::path(dir) / name).string()));
    absl::StrAppend(&listing, hash, "  ", name, "\n");
  }
  id["sha256"] = io::Sha256Hex(listing);
  id["hash_of"] = "weights";
  return id;
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
    const std::string name = absl::StrCat(metric, "/", spec_.name());
    v1::EngineEvent event = MetricEvent(
        name, value, std::nullopt,
        {{"task", spec_.name()}, {"type", EvalTaskType(spec_)}, {"language", spec_.language()}});
    if (!suite_.is_null()) {
      AddDetails({{"suite", suite_["name"]},
                  {"suite_version", suite_["version"]},
                  {"corpus_content_hash", suite_["corpus_content_hash"]}},
                 &event);
    }
    Emit(event);
    (*result)["metrics"][metric] = value;
  }
  // The corpus suite the task's data file belongs to (SuiteOf), or null.
  void set_suite(Json suite) { suite_ = std::move(suite); }
  const Json& suite() const { return suite_; }

 protected:
  v1::EvalTask spec_;
  const tokenizer::Tokenizer* tokenizer_ = nullptr;
  Json suite_;
};

// A choice or translation file inside a prepared corpus (`stemma-engine prepare`,
// docs/corpus.md): <corpus>/suites/<name>.jsonl listed in suites/suites.json, or
// <corpus>/pairs/<base>-<lang>.jsonl, with <corpus>/manifest.json of format stemma.corpus/*.
// Returns {name, version, file, sha256 (of the file now), corpus, corpus_content_hash}, or
// null for any other file (nothing is refused here: a file outside a corpus is evaluated as
// before).
Json SuiteOf(const std::string& data) {
  const fs::path file = fs::absolute(data).lexically_normal();
  const fs::path dir = file.parent_path();
  const fs::path corpus = dir.parent_path();
  const std::string kind = dir.filename().string();
  if (kind != "suites" && kind != "pairs") return nullptr;
  auto read_json = [](const fs::path& path) -> Json {
    auto text = io::ReadFile(path.string());
    if (!text.ok()) return nullptr;
    Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    return j.is_discarded() || !j.is_object() ? Json(nullptr) : j;
  };
  const Json manifest = read_json(corpus / "manifest.json");
  if (manifest.is_null() || !manifest.contains("format") || !manifest["format"].is_string() ||
      manifest["format"].get<std::string>().rfind("stemma.corpus/", 0) != 0) {
    return nullptr;
  }
  const std::string rel = absl::StrCat(kind, "/", file.filename().string());
  Json suite = nullptr;
  if (kind == "suites") {
    const Json index = read_json(dir / "suites.json");
    if (index.is_null() || !index.contains("suites") || !index["suites"].is_array()) return nullptr;
    for (const auto& s : index["suites"]) {
      if (s.is_object() && s.value("file", "") == rel) {
        suite = {{"name", s.value("name", "")}, {"version", s.value("version", "")}};
      }
    }
  } else if (manifest.contains("suites") && manifest["suites"].is_object()) {
    suite = {{"name", absl::StrCat("pairs_", file.stem().string())},
             {"version", manifest["suites"].value("pairs", "")}};
  }
  if (suite.is_null()) return nullptr;
  suite["file"] = rel;
  auto sha = io::Sha256File(file.string());
  if (sha.ok()) suite["sha256"] = *sha;
  suite["corpus"] = corpus.string();
  suite["corpus_content_hash"] = manifest.value("content_hash", "");
  return suite;
}

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

// The spec as the results file shows it: each task flat, `type` beside its fields, as
// users write it (the proto's JSON nests them under the type's name).
Json SpecContent(const v1::EvalSpec& spec) {
  Json content = Json::parse(SpecToJson(spec));
  if (!content.contains("tasks")) return content;
  for (int i = 0; i < spec.tasks_size(); ++i) {
    Json& task = content["tasks"][i];
    const std::string type = EvalTaskType(spec.tasks(i));
    if (type.empty() || !task.contains(type)) continue;
    Json flat = {{"type", type}};
    for (auto& [key, value] : task.items()) {
      if (key != type) flat[key] = value;
    }
    for (auto& [key, value] : task[type].items()) flat[key] = value;
    task = std::move(flat);
  }
  return content;
}

// Writes `text` to `path` atomically (engine/io/durable.h: temporary file, fsync, rename,
// directory fsync), so readers see the old file or the whole new one.
absl::Status WriteAtomically(const std::string& path, const std::string& text) {
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  return io::WriteFileAtomic(path, text);
}

// The per-task cache (engine/eval/task_cache.h) as this job sees it: per task its key ("":
// not cached) and the entry found, decided before the model loads.
struct CachedTasks {
  std::unique_ptr<eval::TaskCache> cache;
  std::vector<std::string> keys;
  std::vector<Json> identities;
  std::vector<std::optional<Json>> hits;

  bool AllHit() const {
    if (hits.empty()) return false;
    for (const auto& h : hits) {
      if (!h.has_value()) return false;
    }
    return true;
  }
  Json Summary() const {
    int hit = 0;
    for (const auto& h : hits) hit += h.has_value() ? 1 : 0;
    return {
        {"dir", cache->dir()}, {"served", hit}, {"computed", static_cast<int>(hits.size()) - hit}};
  }
  // Stores task i's result as computed now (rank 0); a failure to store is said, not fatal.
  void Store(size_t i, const Json& result, const std::optional<eval::PerplexityTotals>& totals,
             const std::string& out) const {
    if (cache == nullptr || keys[i].empty()) return;
    const char* job = std::getenv(std::string(engine_contract::kEnvJobId).c_str());
    Json entry = {{"key", keys[i]},
                  {"identity", identities[i]},
                  {"result", result},
                  {"computed_by",
                   {{"job", job != nullptr ? job : ""},
                    {"results", out},
                    {"time_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count()}}}};
    if (totals.has_value()) {
      entry["totals"] = {
          {"nll", totals->nll}, {"tokens", totals->tokens}, {"bytes", totals->bytes}};
    }
    if (absl::Status s = cache->Store(keys[i], entry); !s.ok()) {
      std::fprintf(stderr, "stemma-engine: eval: task cache not written: %s\n",
                   std::string(s.message()).c_str());
    }
  }
};

// Looks every task up in the cache named by the environment (none: nothing cached).
CachedTasks LookUpCachedTasks(const v1::EvalSpec& spec, const Json& checkpoint) {
  CachedTasks c;
  c.cache = eval::TaskCache::FromEnv();
  const size_t n = static_cast<size_t>(spec.tasks_size());
  c.keys.assign(n, "");
  c.identities.assign(n, Json());
  c.hits.assign(n, std::nullopt);
  if (c.cache == nullptr || !checkpoint.contains("sha256")) return c;
  const Json content = SpecContent(spec);  // defaults and resolved sequence lengths filled
  const std::string tokenizer = eval::TokenizerIdentity(spec.tokenizer());
  for (size_t i = 0; i < n; ++i) {
    const v1::EvalTask& t = spec.tasks(static_cast<int>(i));
    const std::string fewshot = t.has_choice()        ? t.choice().fewshot_data()
                                : t.has_translation() ? t.translation().fewshot_data()
                                                      : "";
    const std::string data = eval::DataIdentity(t.data());
    const std::string fewshot_id = eval::DataIdentity(fewshot);
    if (data.empty() || (!fewshot.empty() && fewshot_id.empty())) continue;
    c.identities[i] = {{"checkpoint", checkpoint["sha256"]},
                       {"tokenizer", tokenizer},
                       {"task", content["tasks"][i]},
                       {"data", data},
                       {"fewshot", fewshot_id},
                       {"dtype", spec.dtype()},
                       {"device", spec.device()},
                       {"batch_size", spec.batch_size()}};
    c.keys[i] = c.cache->Key(c.identities[i]);
    c.hits[i] = c.cache->Find(c.keys[i]);
  }
  return c;
}

// A cached task's result as this job's: its metrics emitted as if computed, and where it
// came from. Returns the perplexity totals it carries (for bpb/all), if any.
std::optional<eval::PerplexityTotals> FromCache(const Task& task, const Json& entry, Json* result) {
  const Json& stored = entry["result"];
  for (const auto& [key, value] : stored.items()) {
    if (key != "metrics") (*result)[key] = value;
  }
  for (const auto& [metric, value] : stored["metrics"].items()) {
    task.Metric(metric, value.get<double>(), result);
  }
  (*result)["cache"] = {{"served_from", entry["computed_by"]}, {"key", entry["key"]}};
  if (!entry.contains("totals")) return std::nullopt;
  eval::PerplexityTotals t;
  t.nll = entry["totals"]["nll"].get<double>();
  t.tokens = entry["totals"]["tokens"].get<int64_t>();
  t.bytes = entry["totals"]["bytes"].get<int64_t>();
  return t;
}

constexpr char kUsage[] = "stemma-engine eval --spec FILE [--<field> VALUE ...]";

// The start event's task list, and per task its corpus suite (SuiteOf) or null.
Json TaskPlan(const v1::EvalSpec& spec, const std::vector<std::string>& seq_len_sources,
              std::vector<Json>* suites) {
  Json task_plan = Json::array();
  for (int i = 0; i < spec.tasks_size(); ++i) {
    const v1::EvalTask& t = spec.tasks(i);
    Json entry = {{"name", t.name()}, {"type", EvalTaskType(t)}, {"language", t.language()}};
    if (t.has_perplexity()) {
      entry["seq_len"] = t.perplexity().seq_len();
      entry["seq_len_source"] = seq_len_sources[i];
      suites->push_back(nullptr);
    } else {
      suites->push_back(SuiteOf(t.data()));
      if (!suites->back().is_null()) {
        entry["suite"] = suites->back()["name"];
        entry["suite_version"] = suites->back()["version"];
        entry["corpus_content_hash"] = suites->back()["corpus_content_hash"];
      }
    }
    task_plan.push_back(std::move(entry));
  }
  return task_plan;
}

absl::Status Eval(const google::protobuf::Message& proto_spec, const std::string& spec_path) {
  const auto& proto = static_cast<const v1::EvalSpec&>(proto_spec);
  v1::EvalSpec spec = proto;
  eval::FillRunDefaults(spec_path, &spec);
  // What only the engine can check, before any work: the model directory and the
  // sequence lengths it implies.
  RETURN_IF_ERROR(EvalModel::CheckDevice(spec.device()));
  ASSIGN_OR_RETURN(eval::ModelFacts facts, eval::ReadModelFacts(spec.model()));
  std::vector<std::string> seq_len_sources;
  RETURN_IF_ERROR(eval::ResolveSequenceLengths(facts, &spec, &seq_len_sources));
  std::vector<Json> suites;  // per task: its corpus suite, or null
  const Json task_plan = TaskPlan(spec, seq_len_sources, &suites);
  Emit(CommandEvent(engine_contract::kEventStart, "eval",
                    {{"spec", spec_path},
                     {"model", spec.model()},
                     {"dtype", spec.dtype()},
                     {"device", spec.device()},
                     {"threads", spec.threads()},
                     {"threads_source", proto.threads() > 0  ? "spec"
                                        : spec.threads() > 0 ? "job cpus (STEMMA_CPUS)"
                                                             : "torch default"},
                     {"tasks", task_plan}}));

  ASSIGN_OR_RETURN(Json checkpoint, CheckpointIdentity(spec.model()));
  ASSIGN_OR_RETURN(auto tokenizer, tokenizer::Tokenizer::Load(spec.tokenizer()));
  std::vector<std::unique_ptr<Task>> tasks;
  for (int i = 0; i < spec.tasks_size(); ++i) {
    tasks.push_back(MakeTask(spec.tasks(i), seq_len_sources[i]));
    tasks.back()->set_suite(suites[i]);
    RETURN_IF_ERROR(tasks.back()->Prepare(*tokenizer));
  }
  CachedTasks cached = LookUpCachedTasks(spec, checkpoint);

  // Every rank joins before the model loads, so a missing rank fails fast and cheaply. When
  // every task is cached no rank joins and no model loads (all ranks decide the same hits).
  std::unique_ptr<EvalRanks> ranks;
  std::unique_ptr<EvalModel> model;
  if (!cached.AllHit()) {
    ASSIGN_OR_RETURN(ranks, EvalRanks::FromEnv());
    eval::EvalModelOptions model_options;
    model_options.dtype = spec.dtype();
    model_options.threads = static_cast<int>(spec.threads());
    model_options.device = spec.device();
    ASSIGN_OR_RETURN(model, EvalModel::Load(spec.model(), model_options));
    if (tokenizer->vocab_size() > model->vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.tokenizer(), ": the tokenizer has ", tokenizer->vocab_size(),
                       " ids but the model (", spec.model(), ") only ", model->vocab_size()));
    }
  }
  const bool rank_zero = ranks == nullptr || ranks->is_zero();

  Json results = {{"format", "stemma-eval-v1"},
                  {"checkpoint", checkpoint},
                  {"tokenizer", {{"path", spec.tokenizer()}, {"kind", tokenizer->kind()}}},
                  {"spec",
                   {{"path", spec_path.empty() ? "" : fs::absolute(spec_path).string()},
                    {"content", SpecContent(proto)}}},
                  {"dtype", spec.dtype()},
                  {"device", model != nullptr ? model->device() : spec.device()},
                  {"ranks", ranks != nullptr ? ranks->world_size() : 1},
                  {"tasks", Json::array()},
                  {"metrics", Json::object()}};
  eval::PerplexityTotals all;
  int perplexity_tasks = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    Task& task = *tasks[i];
    const v1::EvalTask& t = task.spec();
    Json result = {{"name", t.name()},
                   {"type", EvalTaskType(t)},
                   {"language", t.language()},
                   {"data", t.data()},
                   {"metrics", Json::object()}};
    if (!task.suite().is_null()) result["suite"] = task.suite();
    std::optional<eval::PerplexityTotals> totals;
    if (cached.hits[i].has_value()) {
      if (!rank_zero) continue;
      totals = FromCache(task, *cached.hits[i], &result);
    } else {
      RETURN_IF_ERROR(task.Run(*model, spec, *ranks, &result));
      if (!rank_zero) continue;  // rank 0 scores and writes
      if (auto* p = dynamic_cast<PerplexityTask*>(&task)) totals = p->totals();
      cached.Store(i, result, totals, spec.out());
    }
    for (const auto& [metric, value] : result["metrics"].items()) {
      results["metrics"][absl::StrCat(metric, "/", t.name())] = value;
    }
    if (totals.has_value()) {
      all.nll += totals->nll;
      all.tokens += totals->tokens;
      all.bytes += totals->bytes;
      ++perplexity_tasks;
    }
    results["tasks"].push_back(std::move(result));
  }
  if (!rank_zero) return absl::OkStatus();  // its share went to rank 0
  if (perplexity_tasks > 1) {
    // Micro-average over all languages' tokens (bytes).
    for (const auto& [metric, value] :
         {std::pair{"ppl/all", all.Perplexity()}, std::pair{"bpb/all", all.BitsPerByte()}}) {
      Emit(MetricEvent(metric, value));
      results["metrics"][metric] = value;
    }
  }
  if (cached.cache != nullptr) results["task_cache"] = cached.Summary();
  RETURN_IF_ERROR(WriteAtomically(spec.out(), Dump(results, 2) + "\n"));
  ASSIGN_OR_RETURN(v1::EngineEvent output,
                   OutputEvent("results", spec.out(), "eval", {spec.model()}));
  Emit(output);
  Emit(CommandEvent(engine_contract::kEventDone, "eval",
                    {{"results", spec.out()},
                     {"checkpoint_sha256", checkpoint["sha256"]},
                     {"metrics", results["metrics"]}}));
  return absl::OkStatus();
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
