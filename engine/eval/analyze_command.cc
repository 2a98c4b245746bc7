// stemma-engine analyze --spec FILE: LAPE neuron masks, MoE routing statistics with the
// activation-gap expert selection, weight drift between two checkpoints, and cross-lingual
// alignment of parallel sentences (docs/eval.md). Every analysis named in the spec runs; the
// spec is checked as a whole before any model is loaded, and output files are written only
// after every analysis has succeeded (each atomically), so a failed run leaves no outputs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec_file.h"
#include "common/status.h"
#include "engine/eval/analyze_inputs.h"
#include "engine/eval/analyze_model.h"
#include "engine/eval/commands.h"
#include "engine/eval/drift.h"
#include "engine/eval/lape.h"
#include "engine/eval/routing.h"
#include "engine/tokenizer/tokenizer.h"

namespace stemma::engine {
namespace {

using nlohmann::json;
using namespace eval;  // NOLINT: this file is the eval namespace's command front end

// ---- The spec ----

struct LapeSection {
  LapeParams params;
  std::vector<std::string> languages;
};

struct RoutingSection {
  std::vector<std::string> languages;
  SelectionParams select;
};

struct DriftSection {
  std::string base, trained;
};

struct AlignmentSection {
  std::string file;                          // parallel JSONL, or
  std::map<std::string, std::string> texts;  // language -> line-aligned text file
  std::vector<std::string> languages;
  int64_t max_sentences = 1000;
  int64_t batch_size = 8;
  std::optional<bool> add_bos;
};

struct AnalyzeSpec {
  std::string path;
  std::string model, tokenizer, out;
  ModelAnalyzerOptions model_options;
  int64_t seq_len = 512, batch_size = 1, max_tokens = 1'024'000;
  std::map<std::string, LanguageSource> languages;
  std::optional<LapeSection> lape;
  std::optional<RoutingSection> routing;
  std::optional<DriftSection> drift;
  std::optional<AlignmentSection> alignment;
};

// Relative paths in a spec are relative to the spec file's directory (as in eval's specs).
// Absolute, so output events name files the worker can find whatever its directory.
std::string Resolve(const std::string& spec_path, const std::string& path) {
  if (path.empty()) return path;
  std::filesystem::path p(path);
  if (p.is_relative()) p = std::filesystem::path(spec_path).parent_path() / p;
  return std::filesystem::absolute(p).lexically_normal().string();
}

absl::Status FieldError(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

absl::StatusOr<std::string> GetString(const json& obj, const std::string& key,
                                      const std::string& where, bool required) {
  if (!obj.contains(key)) {
    if (required) return FieldError(absl::StrCat(where, key), "missing");
    return std::string();
  }
  if (!obj[key].is_string() || obj[key].get<std::string>().empty()) {
    return FieldError(absl::StrCat(where, key), "must be a non-empty string");
  }
  return obj[key].get<std::string>();
}

absl::Status GetPositive(const json& obj, const std::string& key, const std::string& where,
                         int64_t* value, bool allow_zero = false) {
  if (!obj.contains(key)) return absl::OkStatus();
  if (!obj[key].is_number_integer() || obj[key].get<int64_t>() < (allow_zero ? 0 : 1)) {
    return FieldError(absl::StrCat(where, key),
                      allow_zero ? "must be a non-negative integer" : "must be a positive integer");
  }
  *value = obj[key].get<int64_t>();
  return absl::OkStatus();
}

absl::Status GetNumber(const json& obj, const std::string& key, const std::string& where,
                       double* value) {
  if (!obj.contains(key)) return absl::OkStatus();
  if (!obj[key].is_number()) return FieldError(absl::StrCat(where, key), "must be a number");
  *value = obj[key].get<double>();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> GetStrings(const json& obj, const std::string& key,
                                                    const std::string& where) {
  std::vector<std::string> out;
  if (!obj.contains(key)) return out;
  if (!obj[key].is_array()) return FieldError(absl::StrCat(where, key), "must be a list");
  for (const auto& v : obj[key]) {
    if (!v.is_string()) return FieldError(absl::StrCat(where, key), "must list strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> GetInts(const json& obj, const std::string& key,
                                             const std::string& where) {
  std::vector<int64_t> out;
  if (!obj.contains(key)) return out;
  if (!obj[key].is_array()) return FieldError(absl::StrCat(where, key), "must be a list");
  for (const auto& v : obj[key]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return FieldError(absl::StrCat(where, key), "must list non-negative integers");
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// A section may be written `lape: {}` or just `lape:` (null).
absl::StatusOr<json> Section(const json& spec, const std::string& key, const std::string& file) {
  json section = spec[key].is_null() ? json::object() : spec[key];
  if (!section.is_object()) {
    return FieldError(absl::StrCat(file, ": ", key), "must be a mapping");
  }
  return section;
}

// Languages an analysis uses: `requested` (each must be in the spec's `languages`), or all.
absl::StatusOr<std::vector<std::string>> PickLanguages(const AnalyzeSpec& spec,
                                                       const std::vector<std::string>& requested,
                                                       const std::string& where) {
  if (requested.empty()) {
    std::vector<std::string> all;
    for (const auto& [lang, source] : spec.languages) all.push_back(lang);
    return all;
  }
  for (const auto& lang : requested) {
    if (!spec.languages.count(lang)) {
      return FieldError(where, absl::StrCat("language '", lang, "' is not under 'languages'"));
    }
  }
  return requested;
}

absl::StatusOr<LapeSection> ParseLape(const json& s, const AnalyzeSpec& spec) {
  const std::string where = spec.path + ": lape.";
  RETURN_IF_ERROR(CheckKeys(s,
                            {"top_rate", "filter_rate", "activation_bar_ratio",
                             "activation_threshold", "languages"},
                            spec.path + ": lape"));
  LapeSection lape;
  RETURN_IF_ERROR(GetNumber(s, "top_rate", where, &lape.params.top_rate));
  RETURN_IF_ERROR(GetNumber(s, "filter_rate", where, &lape.params.filter_rate));
  RETURN_IF_ERROR(GetNumber(s, "activation_bar_ratio", where, &lape.params.activation_bar_ratio));
  RETURN_IF_ERROR(GetNumber(s, "activation_threshold", where, &lape.params.activation_threshold));
  for (const auto& [value, field] : {std::pair{lape.params.top_rate, "top_rate"},
                                     std::pair{lape.params.filter_rate, "filter_rate"},
                                     std::pair{lape.params.activation_bar_ratio,
                                               "activation_bar_ratio"}}) {
    if (!(value > 0.0 && value <= 1.0)) {
      return FieldError(absl::StrCat(where, field), "must be in (0, 1]");
    }
  }
  ASSIGN_OR_RETURN(auto requested, GetStrings(s, "languages", where));
  ASSIGN_OR_RETURN(lape.languages, PickLanguages(spec, requested, where + "languages"));
  if (lape.languages.size() < 2) {
    return FieldError(where + "languages", "LAPE needs at least two languages");
  }
  return lape;
}

absl::StatusOr<RoutingSection> ParseRouting(const json& s, const AnalyzeSpec& spec) {
  const std::string where = spec.path + ": routing.";
  RETURN_IF_ERROR(CheckKeys(s, {"languages", "select"}, spec.path + ": routing"));
  RoutingSection routing;
  ASSIGN_OR_RETURN(auto requested, GetStrings(s, "languages", where));
  ASSIGN_OR_RETURN(routing.languages, PickLanguages(spec, requested, where + "languages"));
  if (routing.languages.size() < 2) {
    return FieldError(where + "languages", "the routing analysis needs at least two languages");
  }
  if (!s.contains("select")) return routing;
  const json& sel = s["select"];
  const std::string sw = where + "select.";
  RETURN_IF_ERROR(CheckKeys(sel, {"layers", "alpha", "shared_k", "high_resource", "parents"},
                            spec.path + ": routing.select"));
  ASSIGN_OR_RETURN(routing.select.layers, GetInts(sel, "layers", sw));
  RETURN_IF_ERROR(GetNumber(sel, "alpha", sw, &routing.select.alpha));
  if (sel.contains("shared_k")) {
    ASSIGN_OR_RETURN(routing.select.shared_k, GetInts(sel, "shared_k", sw));
  }
  ASSIGN_OR_RETURN(routing.select.high_resource, GetStrings(sel, "high_resource", sw));
  for (const auto& lang : routing.select.high_resource) {
    if (std::find(routing.languages.begin(), routing.languages.end(), lang) ==
        routing.languages.end()) {
      return FieldError(sw + "high_resource",
                        absl::StrCat("language '", lang, "' is not analysed by routing"));
    }
  }
  if (sel.contains("parents")) {
    if (!sel["parents"].is_object()) return FieldError(sw + "parents", "must be a mapping");
    for (const auto& [low, parent] : sel["parents"].items()) {
      if (!parent.is_string()) {
        return FieldError(absl::StrCat(sw, "parents.", low), "must be a language name");
      }
      routing.select.parents[low] = parent.get<std::string>();
    }
  }
  return routing;
}

absl::StatusOr<DriftSection> ParseDrift(const json& s, const AnalyzeSpec& spec) {
  const std::string where = spec.path + ": drift.";
  RETURN_IF_ERROR(CheckKeys(s, {"base", "trained"}, spec.path + ": drift"));
  DriftSection drift;
  ASSIGN_OR_RETURN(drift.base, GetString(s, "base", where, /*required=*/true));
  ASSIGN_OR_RETURN(drift.trained, GetString(s, "trained", where, /*required=*/false));
  drift.base = Resolve(spec.path, drift.base);
  drift.trained = Resolve(spec.path, drift.trained);
  if (drift.trained.empty()) drift.trained = spec.model;
  if (drift.trained.empty()) {
    return FieldError(where + "trained", "missing (and no top-level 'model' to default to)");
  }
  return drift;
}

absl::StatusOr<AlignmentSection> ParseAlignment(const json& s, const AnalyzeSpec& spec) {
  const std::string where = spec.path + ": alignment.";
  RETURN_IF_ERROR(CheckKeys(
      s, {"file", "texts", "languages", "max_sentences", "batch_size", "add_bos"},
      spec.path + ": alignment"));
  AlignmentSection alignment;
  if (s.contains("file") == s.contains("texts")) {
    return FieldError(spec.path + ": alignment",
                      "give exactly one of 'file' (parallel JSONL) or 'texts' (language -> "
                      "line-aligned text file)");
  }
  ASSIGN_OR_RETURN(alignment.file, GetString(s, "file", where, /*required=*/false));
  alignment.file = Resolve(spec.path, alignment.file);
  if (s.contains("texts")) {
    if (!s["texts"].is_object()) return FieldError(where + "texts", "must be a mapping");
    for (const auto& [lang, path] : s["texts"].items()) {
      if (!path.is_string() || path.get<std::string>().empty()) {
        return FieldError(absl::StrCat(where, "texts.", lang), "must be a path");
      }
      alignment.texts[lang] = Resolve(spec.path, path.get<std::string>());
    }
  }
  ASSIGN_OR_RETURN(alignment.languages, GetStrings(s, "languages", where));
  RETURN_IF_ERROR(GetPositive(s, "max_sentences", where, &alignment.max_sentences, true));
  RETURN_IF_ERROR(GetPositive(s, "batch_size", where, &alignment.batch_size));
  if (s.contains("add_bos")) {
    if (!s["add_bos"].is_boolean()) return FieldError(where + "add_bos", "must be true or false");
    alignment.add_bos = s["add_bos"].get<bool>();
  }
  for (const auto& lang : alignment.languages) {
    if (!alignment.texts.empty() && !alignment.texts.count(lang)) {
      return FieldError(where + "languages", absl::StrCat("language '", lang,
                                                          "' has no file under 'texts'"));
    }
  }
  if (alignment.languages.empty() && !alignment.texts.empty()) {
    for (const auto& [lang, path] : alignment.texts) alignment.languages.push_back(lang);
  } else if (alignment.languages.empty()) {
    ASSIGN_OR_RETURN(alignment.languages, ParallelLanguages(alignment.file));
  }
  if (alignment.languages.size() < 2) {
    return FieldError(where + "languages", "alignment needs at least two languages");
  }
  return alignment;
}

absl::StatusOr<AnalyzeSpec> ParseSpec(const std::string& path) {
  ASSIGN_OR_RETURN(json j, ReadSpecFile(path));
  RETURN_IF_ERROR(CheckKeys(j,
                            {"model", "tokenizer", "out", "device", "dtype", "seq_len",
                             "batch_size", "max_tokens", "languages", "lape", "routing", "drift",
                             "alignment"},
                            path));
  AnalyzeSpec spec;
  spec.path = path;
  const std::string where = path + ": ";
  ASSIGN_OR_RETURN(spec.out, GetString(j, "out", where, /*required=*/true));
  ASSIGN_OR_RETURN(spec.model, GetString(j, "model", where, /*required=*/false));
  ASSIGN_OR_RETURN(spec.tokenizer, GetString(j, "tokenizer", where, /*required=*/false));
  spec.out = Resolve(path, spec.out);
  spec.model = Resolve(path, spec.model);
  spec.tokenizer = Resolve(path, spec.tokenizer);
  if (spec.tokenizer.empty()) spec.tokenizer = spec.model;
  ASSIGN_OR_RETURN(std::string device, GetString(j, "device", where, false));
  if (!device.empty()) spec.model_options.device = device;
  ASSIGN_OR_RETURN(std::string dtype, GetString(j, "dtype", where, false));
  if (!dtype.empty()) spec.model_options.dtype = dtype;
  RETURN_IF_ERROR(GetPositive(j, "seq_len", where, &spec.seq_len));
  RETURN_IF_ERROR(GetPositive(j, "batch_size", where, &spec.batch_size));
  RETURN_IF_ERROR(GetPositive(j, "max_tokens", where, &spec.max_tokens, /*allow_zero=*/true));
  if (j.contains("languages")) {
    if (!j["languages"].is_object() || j["languages"].empty()) {
      return FieldError(where + "languages", "must be a non-empty mapping of language -> source");
    }
    for (const auto& [lang, entry] : j["languages"].items()) {
      ASSIGN_OR_RETURN(LanguageSource source,
                       ParseLanguageSource(lang, entry, absl::StrCat(where, "languages.", lang)));
      source.path = Resolve(path, source.path);
      spec.languages.emplace(lang, std::move(source));
    }
  }
  const bool any = j.contains("lape") || j.contains("routing") || j.contains("drift") ||
                   j.contains("alignment");
  if (!any) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no analysis given (add one of lape, routing, drift, alignment)"));
  }
  if ((j.contains("lape") || j.contains("routing")) && spec.languages.empty()) {
    return FieldError(where + "languages", "missing (lape and routing profile each language)");
  }
  if ((j.contains("lape") || j.contains("routing") || j.contains("alignment")) &&
      spec.model.empty()) {
    return FieldError(where + "model", "missing (the checkpoint to analyse)");
  }
  if (j.contains("lape")) {
    ASSIGN_OR_RETURN(json s, Section(j, "lape", path));
    ASSIGN_OR_RETURN(spec.lape, ParseLape(s, spec));
  }
  if (j.contains("routing")) {
    ASSIGN_OR_RETURN(json s, Section(j, "routing", path));
    ASSIGN_OR_RETURN(spec.routing, ParseRouting(s, spec));
  }
  if (j.contains("drift")) {
    ASSIGN_OR_RETURN(json s, Section(j, "drift", path));
    ASSIGN_OR_RETURN(spec.drift, ParseDrift(s, spec));
  }
  if (j.contains("alignment")) {
    ASSIGN_OR_RETURN(json s, Section(j, "alignment", path));
    ASSIGN_OR_RETURN(spec.alignment, ParseAlignment(s, spec));
  }
  return spec;
}

// ---- Running ----

void Progress(int64_t step, int64_t total, const std::string& message) {
  EmitEvent("progress", {{"step", step}, {"total_steps", total}, {"message", message}});
}

void Metric(const std::string& name, const json& value, json labels = nullptr) {
  json fields = {{"name", name}, {"value", value}};
  if (!labels.is_null()) fields["labels"] = std::move(labels);
  EmitEvent("metric", fields);
}

// Results held until every analysis has run, then written together.
struct Outputs {
  std::vector<std::pair<std::string, json>> files;  // (output name, content)
};

class Analysis {
 public:
  explicit Analysis(AnalyzeSpec spec) : spec_(std::move(spec)) {}

  absl::Status Run() {
    const bool profile = spec_.lape || spec_.routing;
    total_steps_ = (profile ? static_cast<int64_t>(ProfiledLanguages().size()) : 0) +
                   (spec_.drift ? 1 : 0) + (spec_.alignment ? 1 : 0) + 1;
    if (profile || spec_.alignment) RETURN_IF_ERROR(LoadModel());
    if (profile) RETURN_IF_ERROR(ProfileLanguages());
    if (spec_.drift) RETURN_IF_ERROR(RunDrift());
    if (spec_.alignment) RETURN_IF_ERROR(RunAlignment());
    return WriteOutputs();
  }

 private:
  std::vector<std::string> ProfiledLanguages() const {
    std::set<std::string> langs;
    if (spec_.lape) langs.insert(spec_.lape->languages.begin(), spec_.lape->languages.end());
    if (spec_.routing) {
      langs.insert(spec_.routing->languages.begin(), spec_.routing->languages.end());
    }
    return {langs.begin(), langs.end()};
  }

  absl::Status LoadModel() {
    ASSIGN_OR_RETURN(model_, ModelAnalyzer::Load(spec_.model, spec_.model_options));
    // Refuse an analysis the architecture cannot answer before reading any data.
    if (spec_.lape && model_->is_moe()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "lape: ", spec_.model, " (model_type ", model_->model_type(),
          ") has MoE layers; LAPE profiles the neurons of dense FFN layers"));
    }
    if (spec_.routing && !model_->is_moe()) {
      return absl::FailedPreconditionError(
          absl::StrCat("routing: ", spec_.model, " (model_type ", model_->model_type(),
                       ") has no MoE layers to analyse"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<const tokenizer::Tokenizer*> GetTokenizer() {
    if (!tokenizer_) {
      auto loaded = tokenizer::Tokenizer::Load(spec_.tokenizer);
      if (!loaded.ok()) {
        return absl::Status(loaded.status().code(),
                            absl::StrCat("tokenizer ", spec_.tokenizer, ": ",
                                         loaded.status().message()));
      }
      tokenizer_ = std::move(loaded).value();
    }
    return tokenizer_.get();
  }

  absl::Status ProfileLanguages() {
    const std::vector<std::string> langs = ProfiledLanguages();
    std::map<std::string, LapeCounts> lape_counts;
    std::map<std::string, RoutingCounts> routing_counts;
    std::map<std::string, std::set<int32_t>> vocab;
    for (const std::string& lang : langs) {
      const LanguageSource& source = spec_.languages.at(lang);
      const tokenizer::Tokenizer* tok = nullptr;
      if (source.kind != LanguageSource::Kind::kDataset) {
        ASSIGN_OR_RETURN(tok, GetTokenizer());
      }
      ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                       LoadLanguageTokens(source, tok, spec_.max_tokens, model_->vocab_size()));
      ProfileOptions options;
      options.seq_len = spec_.seq_len;
      options.batch_size = spec_.batch_size;
      options.lape = spec_.lape && Contains(spec_.lape->languages, lang);
      options.routing = spec_.routing && Contains(spec_.routing->languages, lang);
      if (spec_.lape) options.activation_threshold = spec_.lape->params.activation_threshold;
      int64_t last_tenth = 0;
      options.progress = [&](int64_t done, int64_t windows) {
        const int64_t tenth = done * 10 / windows;  // at most ten events per language
        if (tenth == last_tenth || done == windows) return;
        last_tenth = tenth;
        EmitEvent("progress", {{"step", step_},
                               {"total_steps", total_steps_},
                               {"fraction", (step_ + static_cast<double>(done) / windows) /
                                                static_cast<double>(total_steps_)},
                               {"message", absl::StrCat("profiling ", lang, ": ", done, "/",
                                                        windows, " windows")}});
      };
      const auto profile_start = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(
          model_->Profile(tokens, options, &lape_counts[lang], &routing_counts[lang]));
      profile_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                        profile_start)
                              .count();
      tokens_profiled_ += std::max(lape_counts[lang].tokens, routing_counts[lang].tokens);
      if (options.routing) {
        const int64_t used = routing_counts[lang].tokens;  // the tokens routed
        vocab[lang].insert(tokens.begin(), tokens.begin() + used);
      }
      Progress(++step_, total_steps_,
               absl::StrCat("profiled ", lang, ": ", tokens.size(), " tokens"));
    }
    if (spec_.lape) RETURN_IF_ERROR(FinishLape(lape_counts));
    if (spec_.routing) RETURN_IF_ERROR(FinishRouting(routing_counts, vocab));
    return absl::OkStatus();
  }

  static bool Contains(const std::vector<std::string>& list, const std::string& value) {
    return std::find(list.begin(), list.end(), value) != list.end();
  }

  absl::Status FinishLape(std::map<std::string, LapeCounts>& by_lang) {
    std::vector<LapeCounts> counts;
    for (const auto& lang : spec_.lape->languages) counts.push_back(std::move(by_lang[lang]));
    ASSIGN_OR_RETURN(LapeResult result,
                     IdentifyLapeNeurons(spec_.lape->languages, counts, model_->num_layers(),
                                         model_->intermediate_size(), spec_.lape->params));
    json mask = NeuronMaskJson(result, spec_.lape->params, counts);
    mask["params"]["model"] = spec_.model;
    for (const auto& lang : result.languages) {
      int64_t total = 0;
      for (const auto& list : result.neurons.at(lang)) total += list.size();
      Metric("lape/neurons", total, {{"language", lang}});
    }
    Metric("lape/filter_threshold", result.filter_threshold);
    outputs_.files.emplace_back("neuron_mask", std::move(mask));
    return absl::OkStatus();
  }

  absl::Status FinishRouting(std::map<std::string, RoutingCounts>& by_lang,
                             std::map<std::string, std::set<int32_t>>& vocab) {
    RoutingInput input;
    input.languages = spec_.routing->languages;
    for (const auto& lang : input.languages) {
      input.counts.push_back(std::move(by_lang[lang]));
      input.vocab.push_back(std::move(vocab[lang]));
    }
    input.moe_layers = model_->moe_layers();
    input.num_experts = model_->num_experts();
    input.top_k = model_->top_k();
    ASSIGN_OR_RETURN(json stats, RoutingStatsJson(input));
    ASSIGN_OR_RETURN(json selection, ExpertSelectionJson(input, spec_.routing->select));
    stats["model"] = spec_.model;
    selection["_meta"]["model"] = spec_.model;
    for (const auto& layer : stats["layers"]) {
      const std::string l = std::to_string(layer["layer"].get<int64_t>());
      for (const auto& [lang, h] : layer["entropy"].items()) {
        Metric("routing/entropy", h, {{"language", lang}, {"layer", l}});
      }
      Metric("routing/mean_jsd", layer["mean_jsd"], {{"layer", l}});
    }
    outputs_.files.emplace_back("routing", std::move(stats));
    outputs_.files.emplace_back("expert_selection", std::move(selection));
    return absl::OkStatus();
  }

  absl::Status RunDrift() {
    ASSIGN_OR_RETURN(json drift, WeightDrift(spec_.drift->base, spec_.drift->trained));
    Metric("drift/total", drift["total"]);
    for (const auto& layer : drift["layers"]) {
      const std::string l = std::to_string(layer["layer"].get<int64_t>());
      Metric("drift/relative", layer["all"],
             {{"layer", l}});
      if (!layer["asymmetry"].is_null()) {
        Metric("drift/asymmetry", layer["asymmetry"], {{"layer", l}});
      }
    }
    Progress(++step_, total_steps_, "weight drift");
    outputs_.files.emplace_back("drift", std::move(drift));
    return absl::OkStatus();
  }

  absl::Status RunAlignment() {
    const AlignmentSection& a = *spec_.alignment;
    std::vector<std::vector<std::string>> sentences;
    if (a.texts.empty()) {
      ASSIGN_OR_RETURN(sentences, ReadParallelSentences(a.file, a.languages, a.max_sentences));
    } else {
      std::vector<std::string> paths;
      for (const auto& lang : a.languages) paths.push_back(a.texts.at(lang));
      ASSIGN_OR_RETURN(sentences, ReadLineAlignedTexts(paths, a.languages, a.max_sentences));
    }
    ASSIGN_OR_RETURN(const tokenizer::Tokenizer* tok, GetTokenizer());
    const bool add_bos = a.add_bos.value_or(tok->bos_id().has_value());
    if (add_bos && !tok->bos_id()) {
      return FieldError(spec_.path + ": alignment.add_bos", "the tokenizer has no BOS token");
    }
    std::vector<std::vector<std::vector<int32_t>>> ids(sentences.size());
    for (size_t i = 0; i < sentences.size(); ++i) {
      for (size_t k = 0; k < a.languages.size(); ++k) {
        std::vector<int32_t> s;
        if (add_bos) s.push_back(*tok->bos_id());
        std::vector<int32_t> text = tok->Encode(sentences[i][k]);
        s.insert(s.end(), text.begin(), text.end());
        for (int32_t id : s) {
          if (id < 0 || id >= model_->vocab_size()) {
            return FieldError(a.file, absl::StrCat("sentence ", i + 1, " (", a.languages[k],
                                                   ") has token ", id,
                                                   " outside the model's vocabulary"));
          }
        }
        ids[i].push_back(std::move(s));
      }
    }
    ASSIGN_OR_RETURN(AlignmentResult result, model_->Align(ids, a.batch_size, add_bos ? 1 : 0));
    json pairs = json::array(), mean = json::array();
    for (int64_t l = 0; l < model_->num_layers(); ++l) {
      double sum = 0.0;
      for (const auto& per_layer : result.cosine) sum += per_layer[l];
      const double m = sum / static_cast<double>(result.cosine.size());
      mean.push_back(m);
      Metric("alignment/cosine", m, {{"layer", std::to_string(l)}});
    }
    for (size_t p = 0; p < result.pairs.size(); ++p) {
      pairs.push_back({{"languages", {a.languages[result.pairs[p].first],
                                      a.languages[result.pairs[p].second]}},
                       {"cosine", result.cosine[p]}});
    }
    json out = {{"format", "stemma.alignment/1"},
                {"model", spec_.model},
                {"file", a.texts.empty() ? json(a.file) : json(a.texts)},
                {"languages", a.languages},
                {"sentences", result.sentences},
                {"add_bos", add_bos},
                {"layers", model_->num_layers()},
                {"mean_cosine", mean},
                {"pairs", pairs},
                {"definition",
                 "per layer l (output of decoder layer l, before the final norm): mean over "
                 "sentences of cos(mean_t h_a, mean_t h_b); BOS excluded from the token mean"}};
    Progress(++step_, total_steps_, "alignment");
    outputs_.files.emplace_back("alignment", std::move(out));
    return absl::OkStatus();
  }

  absl::Status WriteOutputs() {
    std::error_code ec;
    std::filesystem::create_directories(spec_.out, ec);
    if (ec) return absl::InternalError(absl::StrCat("out: cannot create ", spec_.out, ": ",
                                                    ec.message()));
    json written = json::object();
    for (const auto& [name, content] : outputs_.files) {
      const std::string path = (std::filesystem::path(spec_.out) / (name + ".json")).string();
      RETURN_IF_ERROR(WriteJsonAtomically(path, content));
      written[name] = path;
    }
    for (const auto& [name, path] : written.items()) {
      EmitEvent("output", {{"name", name}, {"path", path}});
    }
    Progress(++step_, total_steps_, "outputs written");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    json done = {{"command", "analyze"}, {"outputs", written}, {"seconds", seconds}};
    if (tokens_profiled_ > 0) {  // forward passes of lape/routing only, model load excluded
      done["tokens_profiled"] = tokens_profiled_;
      done["profile_seconds"] = profile_seconds_;
      done["tokens_per_s"] = profile_seconds_ > 0 ? tokens_profiled_ / profile_seconds_ : 0.0;
    }
    EmitEvent("done", done);
    return absl::OkStatus();
  }

  AnalyzeSpec spec_;
  std::unique_ptr<ModelAnalyzer> model_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  Outputs outputs_;
  int64_t step_ = 0, total_steps_ = 0;
  int64_t tokens_profiled_ = 0;  // tokens run through the model by lape/routing
  double profile_seconds_ = 0.0;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

absl::StatusOr<std::string> SpecFlag(int argc, char** argv) {
  std::string spec;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--spec" && i + 1 < argc) {
      spec = argv[++i];
    } else if (arg.rfind("--spec=", 0) == 0) {
      spec = arg.substr(7);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' (usage: stemma-engine analyze --spec FILE)"));
    }
  }
  if (spec.empty()) {
    return absl::InvalidArgumentError("missing --spec FILE (usage: stemma-engine analyze --spec FILE)");
  }
  return spec;
}

absl::Status Analyze(int argc, char** argv) {
  ASSIGN_OR_RETURN(std::string path, SpecFlag(argc, argv));
  ASSIGN_OR_RETURN(AnalyzeSpec spec, ParseSpec(path));
  json analyses = json::array();
  for (const auto& [name, on] : {std::pair{"lape", spec.lape.has_value()},
                                 std::pair{"routing", spec.routing.has_value()},
                                 std::pair{"drift", spec.drift.has_value()},
                                 std::pair{"alignment", spec.alignment.has_value()}}) {
    if (on) analyses.push_back(name);
  }
  EmitEvent("start", {{"command", "analyze"}, {"spec", path}, {"analyses", analyses}});
  Analysis analysis(std::move(spec));
  return analysis.Run();
}

}  // namespace

int RunAnalyze(int argc, char** argv) {
  absl::Status status;
  try {
    status = Analyze(argc, argv);
  } catch (const std::exception& e) {  // anything LibTorch threw outside the guarded calls
    status = absl::InternalError(e.what());
  }
  if (status.ok()) return 0;
  std::fprintf(stderr, "stemma-engine: error: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace stemma::engine
