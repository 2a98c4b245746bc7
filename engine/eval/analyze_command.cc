// stemma-engine analyze --spec FILE: LAPE neuron masks (and their random baseline), MoE
// routing statistics with the activation-gap expert selection, weight drift between two
// checkpoints, and cross-lingual alignment of parallel sentences (docs/eval.md,
// docs/engine/analyze.md). Every analysis named in the spec runs; the spec (the typed
// stemma.v1.AnalyzeSpec) is checked as a whole and its input files found before any model
// is loaded (a bad one exits 4), and output files are written only after every analysis has
// succeeded (each atomically), so a failed run leaves no outputs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/layer_range.h"
#include "common/status.h"
#include "engine/eval/analyze_inputs.h"
#include "engine/eval/analyze_model.h"
#include "engine/eval/commands.h"
#include "engine/eval/drift.h"
#include "engine/eval/lape.h"
#include "engine/eval/routing.h"
#include "engine/events.h"
#include "engine/tokenizer/tokenizer.h"

namespace stemma::engine {
namespace {

using nlohmann::json;
using namespace eval;  // NOLINT: this file is the eval namespace's command front end

// ---- The spec ----
// The typed stemma.v1.AnalyzeSpec (checked by ParseEngineCommandLine and
// spec_checks_eval.cc) as the command uses it: defaults resolved, paths absolute.

struct LapeSection {
  LapeParams params;
  std::vector<std::string> languages;  // empty with a profile: the profile's
  bool random_mask = true;
  uint64_t random_seed = 0;
  bool keep_profile = true;
  std::string profile;  // re-select from this neuron_mask.json, no model run
};

struct RoutingSection {
  std::vector<std::string> languages;
  SelectionParams select;
  std::optional<LayerRange> layers;  // select.layers as written; resolved with the model
};

struct DriftSection {
  std::string base, trained;
  std::string mask;                         // neuron_mask.json, or ""
  std::vector<std::string> mask_languages;  // empty: all of the file's
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
  std::vector<std::string> language_order;  // as listed
  std::optional<LapeSection> lape;
  std::optional<RoutingSection> routing;
  std::optional<DriftSection> drift;
  std::optional<AlignmentSection> alignment;
};

absl::Status FieldError(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

std::vector<std::string> List(const google::protobuf::RepeatedPtrField<std::string>& list) {
  return {list.begin(), list.end()};
}

// What the rules already guaranteed is not checked again here; what needs the files is
// (CheckInputsExist).
absl::StatusOr<AnalyzeSpec> FromProto(const v1::AnalyzeSpec& p, const std::string& path) {
  AnalyzeSpec spec;
  spec.path = path;
  spec.model = p.model();
  spec.tokenizer = p.tokenizer().empty() ? p.model() : p.tokenizer();
  spec.out = p.out();
  spec.model_options.device = p.device();
  spec.model_options.dtype = p.dtype();
  spec.model_options.threads = EffectiveThreads(p.threads());
  spec.seq_len = p.seq_len();
  spec.batch_size = p.batch_size();
  spec.max_tokens = p.max_tokens();
  for (const v1::LanguageSource& l : p.languages()) {
    spec.languages.emplace(l.language(), LanguageSourceFromProto(l));
    spec.language_order.push_back(l.language());
  }
  if (p.has_lape()) {
    const v1::LapeOptions& l = p.lape();
    LapeSection lape;
    lape.params.top_rate = l.top_rate();
    lape.params.filter_rate = l.filter_rate();
    lape.params.activation_bar_ratio = l.activation_bar_ratio();
    lape.params.activation_threshold = l.activation_threshold();
    lape.params.exclusive = l.exclusive();
    lape.random_mask = l.random_mask();
    lape.random_seed = l.random_seed();
    lape.keep_profile = l.keep_profile();
    lape.profile = l.profile();
    lape.languages = List(l.languages());
    if (lape.languages.empty() && lape.profile.empty()) lape.languages = spec.language_order;
    spec.lape = std::move(lape);
  }
  if (p.has_routing()) {
    const v1::RoutingOptions& r = p.routing();
    RoutingSection routing;
    routing.languages = r.languages().empty() ? spec.language_order : List(r.languages());
    const v1::SelectOptions& sel = r.select();
    if (!sel.layers().empty()) {
      ASSIGN_OR_RETURN(routing.layers, ParseLayerRange(sel.layers(), "routing.select.layers"));
    }
    if (sel.has_alpha()) routing.select.alpha = sel.alpha();
    routing.select.shared_k.assign(sel.shared_k().begin(), sel.shared_k().end());
    routing.select.high_resource = List(sel.high_resource());
    routing.select.parents.insert(sel.parents().begin(), sel.parents().end());
    routing.select.targets = List(sel.targets());
    routing.select.random_seed = sel.random_seed();
    spec.routing = std::move(routing);
  }
  if (p.has_drift()) {
    DriftSection drift;
    drift.base = p.drift().base();
    drift.trained = p.drift().trained().empty() ? p.model() : p.drift().trained();
    drift.mask = p.drift().mask();
    drift.mask_languages = List(p.drift().mask_languages());
    spec.drift = std::move(drift);
  }
  if (p.has_alignment()) {
    const v1::AlignmentOptions& a = p.alignment();
    AlignmentSection alignment;
    alignment.file = a.file();
    std::vector<std::string> text_order;
    for (const v1::AlignedText& t : a.texts()) {
      alignment.texts[t.language()] = t.path();
      text_order.push_back(t.language());
    }
    alignment.languages = List(a.languages());
    alignment.max_sentences = a.max_sentences();
    alignment.batch_size = a.batch_size();
    if (a.has_add_bos()) alignment.add_bos = a.add_bos();
    if (alignment.languages.empty()) alignment.languages = text_order;
    spec.alignment = std::move(alignment);
  }
  return spec;
}

// What only the engine can check, before any model is loaded: that the files exist and the
// saved profile and the parallel file have what the spec asks of them.
absl::Status CheckInputs(AnalyzeSpec& spec) {
  std::error_code ec;
  auto is_model = [&](const std::string& dir, const std::string& field) -> absl::Status {
    if (!std::filesystem::exists(std::filesystem::path(dir) / "config.json", ec)) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": ", dir, " has no config.json (is it a checkpoint directory?)"));
    }
    return absl::OkStatus();
  };
  const bool runs_model =
      (spec.lape && spec.lape->profile.empty()) || spec.routing || spec.alignment;
  if (runs_model) RETURN_IF_ERROR(is_model(spec.model, "model"));
  std::set<std::string> used;
  if (spec.lape && spec.lape->profile.empty())
    used.insert(spec.lape->languages.begin(), spec.lape->languages.end());
  if (spec.routing) used.insert(spec.routing->languages.begin(), spec.routing->languages.end());
  for (const auto& lang : used) RETURN_IF_ERROR(CheckLanguageSourceExists(spec.languages.at(lang)));
  if (spec.lape && !spec.lape->profile.empty() &&
      !std::filesystem::is_regular_file(spec.lape->profile, ec)) {
    return absl::NotFoundError(
        absl::StrCat("lape.profile: ", spec.lape->profile, ": no such file"));
  }
  if (spec.drift) {
    RETURN_IF_ERROR(is_model(spec.drift->base, "drift.base"));
    RETURN_IF_ERROR(is_model(spec.drift->trained, "drift.trained"));
    if (!spec.drift->mask.empty() && !std::filesystem::is_regular_file(spec.drift->mask, ec)) {
      return absl::NotFoundError(absl::StrCat("drift.mask: ", spec.drift->mask, ": no such file"));
    }
  }
  if (spec.alignment) {
    AlignmentSection& a = *spec.alignment;
    for (const auto& [lang, path] : a.texts) {
      if (!std::filesystem::is_regular_file(path, ec)) {
        return absl::NotFoundError(
            absl::StrCat("alignment.texts (", lang, "): ", path, ": no such file"));
      }
    }
    if (a.texts.empty()) {
      if (!std::filesystem::is_regular_file(a.file, ec)) {
        return absl::NotFoundError(absl::StrCat("alignment.file: ", a.file, ": no such file"));
      }
      if (a.languages.empty()) {
        ASSIGN_OR_RETURN(a.languages, ParallelLanguages(a.file));
      }
      if (a.languages.size() < 2) {
        return FieldError("alignment.languages",
                          absl::StrCat(a.file, " holds fewer than two languages"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ReadJson(const std::string& path, const std::string& field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(field, ": ", path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, ": not JSON"));
  return j;
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
    const bool reselect = spec_.lape && !spec_.lape->profile.empty();
    const bool profile = (spec_.lape && !reselect) || spec_.routing;
    total_steps_ = (profile ? static_cast<int64_t>(ProfiledLanguages().size()) : 0) +
                   (reselect ? 1 : 0) + (spec_.drift ? 1 : 0) + (spec_.alignment ? 1 : 0) + 1;
    if (reselect) RETURN_IF_ERROR(ReselectLape());
    if (profile || spec_.alignment) RETURN_IF_ERROR(LoadModel());
    if (profile) RETURN_IF_ERROR(ProfileLanguages());
    if (spec_.drift) RETURN_IF_ERROR(RunDrift());
    if (spec_.alignment) RETURN_IF_ERROR(RunAlignment());
    return WriteOutputs();
  }

 private:
  bool ProfilesLape() const { return spec_.lape && spec_.lape->profile.empty(); }

  std::vector<std::string> ProfiledLanguages() const {
    std::set<std::string> langs;
    if (ProfilesLape()) langs.insert(spec_.lape->languages.begin(), spec_.lape->languages.end());
    if (spec_.routing) {
      langs.insert(spec_.routing->languages.begin(), spec_.routing->languages.end());
    }
    return {langs.begin(), langs.end()};
  }

  absl::Status LoadModel() {
    ASSIGN_OR_RETURN(model_, ModelAnalyzer::Load(spec_.model, spec_.model_options));
    // Refuse an analysis the architecture cannot answer before reading any data.
    if (ProfilesLape() && model_->is_moe()) {
      return absl::FailedPreconditionError(
          absl::StrCat("lape: ", spec_.model, " (model_type ", model_->model_type(),
                       ") has MoE layers; LAPE profiles the neurons of dense FFN layers"));
    }
    if (spec_.routing && !model_->is_moe()) {
      return absl::FailedPreconditionError(absl::StrCat("routing: ", spec_.model, " (model_type ",
                                                        model_->model_type(),
                                                        ") has no MoE layers to analyse"));
    }
    if (spec_.routing) RETURN_IF_ERROR(ResolveSelectionLayers());
    return absl::OkStatus();
  }

  // select.layers (a layer range) as the MoE layers it covers.
  absl::Status ResolveSelectionLayers() {
    RoutingSection& r = *spec_.routing;
    if (!r.layers) return absl::OkStatus();  // the last two MoE layers
    ASSIGN_OR_RETURN(LayerRange range,
                     ResolveLayerRange(*r.layers, model_->num_layers(), "routing.select.layers"));
    const std::vector<int64_t> moe = model_->moe_layers();
    r.select.layers.clear();
    for (int64_t l = range.begin; l < range.end; ++l) {
      if (std::find(moe.begin(), moe.end(), l) == moe.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("routing.select.layers: \"", r.layers->text, "\" includes layer ", l,
                         ", which has no MoE block in ", spec_.model));
      }
      r.select.layers.push_back(l);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<const tokenizer::Tokenizer*> GetTokenizer() {
    if (!tokenizer_) {
      auto loaded = tokenizer::Tokenizer::Load(spec_.tokenizer);
      if (!loaded.ok()) {
        return absl::Status(loaded.status().code(), absl::StrCat("tokenizer ", spec_.tokenizer,
                                                                 ": ", loaded.status().message()));
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
      options.lape = ProfilesLape() && Contains(spec_.lape->languages, lang);
      options.routing = spec_.routing && Contains(spec_.routing->languages, lang);
      if (spec_.lape) options.activation_threshold = spec_.lape->params.activation_threshold;
      int64_t last_tenth = 0;
      options.progress = [&](int64_t done, int64_t windows) {
        const int64_t tenth = done * 10 / windows;  // at most ten events per language
        if (tenth == last_tenth || done == windows) return;
        last_tenth = tenth;
        EmitEvent(
            "progress",
            {{"step", step_},
             {"total_steps", total_steps_},
             {"fraction",
              (step_ + static_cast<double>(done) / windows) / static_cast<double>(total_steps_)},
             {"message", absl::StrCat("profiling ", lang, ": ", done, "/", windows, " windows")}});
      };
      const auto profile_start = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(model_->Profile(tokens, options, &lape_counts[lang], &routing_counts[lang]));
      profile_seconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - profile_start).count();
      tokens_profiled_ += std::max(lape_counts[lang].tokens, routing_counts[lang].tokens);
      if (options.routing) {
        const int64_t used = routing_counts[lang].tokens;  // the tokens routed
        vocab[lang].insert(tokens.begin(), tokens.begin() + used);
      }
      Progress(++step_, total_steps_,
               absl::StrCat("profiled ", lang, ": ", tokens.size(), " tokens"));
    }
    if (ProfilesLape()) RETURN_IF_ERROR(FinishLape(lape_counts));
    if (spec_.routing) RETURN_IF_ERROR(FinishRouting(routing_counts, vocab));
    return absl::OkStatus();
  }

  static bool Contains(const std::vector<std::string>& list, const std::string& value) {
    return std::find(list.begin(), list.end(), value) != list.end();
  }

  absl::Status FinishLape(std::map<std::string, LapeCounts>& by_lang) {
    std::vector<LapeCounts> counts;
    for (const auto& lang : spec_.lape->languages) counts.push_back(std::move(by_lang[lang]));
    return Lape(spec_.lape->languages, counts, model_->num_layers(), model_->intermediate_size(),
                spec_.model, "");
  }

  // lape.profile: the counts of an earlier run's neuron_mask.json, selected again.
  absl::Status ReselectLape() {
    const std::string& file = spec_.lape->profile;
    ASSIGN_OR_RETURN(json saved, ReadJson(file, "lape.profile"));
    ASSIGN_OR_RETURN(SavedProfile profile, LapeCountsFromMask(saved, spec_.lape->languages,
                                                              absl::StrCat("lape.profile ", file)));
    if (profile.languages.size() < 2) {
      return FieldError(absl::StrCat("lape.profile ", file), "holds fewer than two languages");
    }
    RETURN_IF_ERROR(Lape(profile.languages, profile.counts, profile.num_layers,
                         profile.intermediate_size,
                         profile.model.empty() ? spec_.model : profile.model, file));
    Progress(++step_, total_steps_, absl::StrCat("re-selected from ", file));
    return absl::OkStatus();
  }

  absl::Status Lape(const std::vector<std::string>& languages,
                    const std::vector<LapeCounts>& counts, int64_t num_layers,
                    int64_t intermediate_size, const std::string& model,
                    const std::string& profile) {
    ASSIGN_OR_RETURN(LapeResult result, IdentifyLapeNeurons(languages, counts, num_layers,
                                                            intermediate_size, spec_.lape->params));
    json mask = NeuronMaskJson(result, spec_.lape->params, counts, spec_.lape->keep_profile);
    mask["params"]["model"] = model;
    if (!profile.empty()) mask["params"]["reselected_from"] = profile;
    for (const auto& lang : result.languages) {
      int64_t total = 0;
      for (const auto& list : result.neurons.at(lang)) total += list.size();
      Metric("lape/neurons", total, {{"language", lang}});
    }
    Metric("lape/filter_threshold", result.filter_threshold);
    if (spec_.lape->params.exclusive) Metric("lape/shared_dropped", result.num_shared);
    outputs_.files.emplace_back("neuron_mask", std::move(mask));
    if (spec_.lape->random_mask) {
      json random = RandomMaskJson(result, spec_.lape->random_seed);
      random["params"]["model"] = model;
      outputs_.files.emplace_back("random_mask", std::move(random));
    }
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
    std::optional<std::vector<std::vector<int64_t>>> mask;
    if (!spec_.drift->mask.empty()) {
      ASSIGN_OR_RETURN(json file, ReadJson(spec_.drift->mask, "drift.mask"));
      ASSIGN_OR_RETURN(mask, MaskUnion(file, spec_.drift->mask_languages,
                                       absl::StrCat("drift.mask ", spec_.drift->mask)));
    }
    ASSIGN_OR_RETURN(json drift,
                     WeightDrift(spec_.drift->base, spec_.drift->trained, mask ? &*mask : nullptr));
    if (mask) {
      drift["mask"] = {{"file", spec_.drift->mask}, {"languages", spec_.drift->mask_languages}};
      Metric("drift/masked_total", drift["masked_total"]);
    }
    Metric("drift/total", drift["total"]);
    for (const auto& layer : drift["layers"]) {
      const std::string l = std::to_string(layer["layer"].get<int64_t>());
      Metric("drift/relative", layer["all"], {{"layer", l}});
      if (!layer["asymmetry"].is_null()) {
        Metric("drift/asymmetry", layer["asymmetry"], {{"layer", l}});
      }
      if (layer.contains("masked")) {
        Metric("drift/masked_relative", layer["masked"]["all"], {{"layer", l}});
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
      return FieldError("alignment.add_bos",
                        absl::StrCat("the tokenizer (", spec_.tokenizer, ") has no BOS token"));
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
            return FieldError(
                a.file, absl::StrCat("sentence ", i + 1, " (", a.languages[k], ") has token ", id,
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
      pairs.push_back(
          {{"languages", {a.languages[result.pairs[p].first], a.languages[result.pairs[p].second]}},
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
    if (ec)
      return absl::InternalError(
          absl::StrCat("out: cannot create ", spec_.out, ": ", ec.message()));
    json written = json::object();
    for (const auto& [name, content] : outputs_.files) {
      const std::string path = (std::filesystem::path(spec_.out) / (name + ".json")).string();
      RETURN_IF_ERROR(WriteJsonAtomically(path, content));
      // The output's name in events and the registry: the files' stems, except the two that
      // later stages consume by role (train's neuron_mask and expert_subset strategies).
      const std::string output = name == "neuron_mask"        ? "mask"
                                 : name == "expert_selection" ? "selection"
                                                              : name;
      written[output] = path;
    }
    std::vector<std::string> parents;
    for (const std::string& p : {spec_.model, spec_.drift ? spec_.drift->base : std::string(),
                                 spec_.drift ? spec_.drift->trained : std::string()}) {
      if (!p.empty() && std::find(parents.begin(), parents.end(), p) == parents.end())
        parents.push_back(p);
    }
    for (const auto& [name, path] : written.items()) {
      ASSIGN_OR_RETURN(Event output,
                       OutputEvent(name, path.get<std::string>(), "analyze", parents));
      EventWriter().Emit(output);
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

constexpr char kUsage[] = "stemma-engine analyze --spec FILE [--<field> VALUE ...]";

absl::Status Analyze(const google::protobuf::Message& proto_spec, const std::string& path) {
  const auto& proto = static_cast<const v1::AnalyzeSpec&>(proto_spec);
  ASSIGN_OR_RETURN(AnalyzeSpec spec, FromProto(proto, path));
  RETURN_IF_ERROR(CheckInputs(spec));
  json analyses = json::array();
  for (const auto& [name, on] :
       {std::pair{"lape", spec.lape.has_value()}, std::pair{"routing", spec.routing.has_value()},
        std::pair{"drift", spec.drift.has_value()},
        std::pair{"alignment", spec.alignment.has_value()}}) {
    if (on) analyses.push_back(name);
  }
  json start = {{"command", "analyze"},
                {"spec", path},
                {"analyses", analyses},
                {"device", spec.model_options.device},
                {"dtype", spec.model_options.dtype},
                {"threads", spec.model_options.threads},
                {"threads_source", proto.threads() > 0              ? "spec"
                                   : spec.model_options.threads > 0 ? "job cpus (STEMMA_CPUS)"
                                                                    : "torch default"}};
  if (spec.lape && !spec.lape->profile.empty()) start["lape_profile"] = spec.lape->profile;
  if (spec.routing) {
    // The resolved selection layers, when config.json says how many layers there are.
    const std::optional<int64_t> layers = ModelLayersFromConfig(spec.model);
    if (spec.routing->layers && layers) {
      ASSIGN_OR_RETURN(LayerRange r,
                       ResolveLayerRange(*spec.routing->layers, *layers, "routing.select.layers"));
      start["select_layers"] = FormatLayerRange(r);
    } else if (layers) {
      start["select_layers"] = absl::StrCat("the last two MoE layers of ", *layers);
    }
  }
  EmitEvent("start", start);
  Analysis analysis(std::move(spec));
  return analysis.Run();
}

}  // namespace

int RunAnalyze(int argc, char** argv) {
  absl::StatusOr<EngineInvocation> inv = ParseEngineCommandLine("analyze", argc, argv, {});
  if (!inv.ok()) return ReportEngineFailure(inv.status());
  if (inv->help) {
    std::fputs(EngineHelp("analyze", kUsage).c_str(), stdout);
    return 0;
  }
  absl::Status status;
  try {
    status = Analyze(*inv->spec, inv->spec_file);
  } catch (const std::exception& e) {  // anything LibTorch threw outside the guarded calls
    status = absl::InternalError(e.what());
  }
  if (status.ok()) return 0;
  return ReportEngineFailure(status);
}

}  // namespace stemma::engine
