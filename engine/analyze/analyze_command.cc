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
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "common/files.h"
#include "common/layer_range.h"
#include "common/status.h"
#include "engine/analyze/analyze_inputs.h"
#include "engine/analyze/analyze_model.h"
#include "engine/analyze/commands.h"
#include "engine/analyze/drift.h"
#include "engine/analyze/lape.h"
#include "engine/analyze/routing.h"
#include "engine/commands.h"
#include "engine/events.h"
#include "engine/tokenizer/tokenizer.h"

namespace stemma::engine {
namespace {

using nlohmann::json;
using namespace analyze;  // NOLINT: this file is the analyze namespace's command front end

// ---- The spec ----
// The typed stemma.v1.AnalyzeSpec, checked by ParseEngineCommandLine and
// spec_checks_eval.cc, its defaults filled; FillRunDefaults adds those that depend on other
// fields or on the job.

absl::Status FieldError(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

std::vector<std::string> List(const google::protobuf::RepeatedPtrField<std::string>& list) {
  return {list.begin(), list.end()};
}

bool Contains(const google::protobuf::RepeatedPtrField<std::string>& list,
              const std::string& value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

// tokenizer: the model; threads: the job's CPUs; drift.trained: the model; the languages
// lape (without a profile) and routing profile: every one listed; alignment's: the texts'.
void FillRunDefaults(v1::AnalyzeSpec* spec) {
  if (spec->tokenizer().empty()) spec->set_tokenizer(spec->model());
  spec->set_threads(EffectiveThreads(spec->threads()));
  google::protobuf::RepeatedPtrField<std::string> listed;
  for (const v1::LanguageSource& l : spec->languages()) *listed.Add() = l.language();
  if (spec->has_lape() && spec->lape().languages().empty() && spec->lape().profile().empty()) {
    *spec->mutable_lape()->mutable_languages() = listed;
  }
  if (spec->has_routing() && spec->routing().languages().empty()) {
    *spec->mutable_routing()->mutable_languages() = listed;
  }
  if (spec->has_drift() && spec->drift().trained().empty()) {
    spec->mutable_drift()->set_trained(spec->model());
  }
  if (spec->has_alignment() && spec->alignment().languages().empty()) {
    v1::AlignmentOptions* a = spec->mutable_alignment();
    for (const v1::AlignedText& t : a->texts()) a->add_languages(t.language());
  }
}

bool LapeRunsTheModel(const v1::AnalyzeSpec& spec) {
  return spec.has_lape() && spec.lape().profile().empty();
}

// What only the engine can check, before any model is loaded: that the files exist and the
// saved profile and the parallel file have what the spec asks of them (a parallel file's
// languages default to its first line's).
absl::Status CheckInputs(const std::map<std::string, LanguageSource>& sources,
                         v1::AnalyzeSpec& spec) {
  std::error_code ec;
  auto is_model = [&](const std::string& dir, const std::string& field) -> absl::Status {
    if (!std::filesystem::exists(std::filesystem::path(dir) / "config.json", ec)) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": ", dir, " has no config.json (is it a checkpoint directory?)"));
    }
    return absl::OkStatus();
  };
  const bool runs_model = LapeRunsTheModel(spec) || spec.has_routing() || spec.has_alignment();
  if (runs_model) RETURN_IF_ERROR(is_model(spec.model(), "model"));
  std::set<std::string> used;
  if (LapeRunsTheModel(spec))
    used.insert(spec.lape().languages().begin(), spec.lape().languages().end());
  if (spec.has_routing()) {
    used.insert(spec.routing().languages().begin(), spec.routing().languages().end());
  }
  for (const auto& lang : used) RETURN_IF_ERROR(CheckLanguageSourceExists(sources.at(lang)));
  if (spec.has_lape() && !spec.lape().profile().empty() &&
      !std::filesystem::is_regular_file(spec.lape().profile(), ec)) {
    return absl::NotFoundError(
        absl::StrCat("lape.profile: ", spec.lape().profile(), ": no such file"));
  }
  if (spec.has_drift()) {
    const v1::DriftOptions& d = spec.drift();
    RETURN_IF_ERROR(is_model(d.base(), "drift.base"));
    RETURN_IF_ERROR(is_model(d.trained(), "drift.trained"));
    if (!d.mask().empty() && !std::filesystem::is_regular_file(d.mask(), ec)) {
      return absl::NotFoundError(absl::StrCat("drift.mask: ", d.mask(), ": no such file"));
    }
  }
  if (spec.has_alignment()) {
    v1::AlignmentOptions& a = *spec.mutable_alignment();
    for (const v1::AlignedText& t : a.texts()) {
      if (!std::filesystem::is_regular_file(t.path(), ec)) {
        return absl::NotFoundError(
            absl::StrCat("alignment.texts (", t.language(), "): ", t.path(), ": no such file"));
      }
    }
    if (a.texts().empty()) {
      if (!std::filesystem::is_regular_file(a.file(), ec)) {
        return absl::NotFoundError(absl::StrCat("alignment.file: ", a.file(), ": no such file"));
      }
      if (a.languages().empty()) {
        ASSIGN_OR_RETURN(std::vector<std::string> found, ParallelLanguages(a.file()));
        for (const std::string& lang : found) a.add_languages(lang);
      }
      if (a.languages_size() < 2) {
        return FieldError("alignment.languages",
                          absl::StrCat(a.file(), " holds fewer than two languages"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ReadJson(const std::string& path, const std::string& field) {
  absl::StatusOr<std::string> text = files::ReadFile(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat(field, ": ", path, ": cannot open"));
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, ": not JSON"));
  return j;
}

// ---- Running ----

void Progress(int64_t step, int64_t total, const std::string& message) {
  v1::EngineEvent event = NewEvent(engine_contract::kEventProgress);
  event.set_step(static_cast<double>(step));
  event.set_total_steps(static_cast<double>(total));
  event.set_message(message);
  EmitEvent(event);
}

// `value` a JSON number (a value left unset otherwise, as null was read); labels' values
// strings or numbers.
void Metric(const std::string& name, const json& value, const json& labels = nullptr) {
  v1::EngineEvent event = NewEvent(engine_contract::kEventMetric);
  event.set_name(name);
  if (value.is_number()) event.set_value(value.get<double>());
  if (labels.is_object()) {
    for (const auto& [key, label] : labels.items()) {
      (*event.mutable_labels())[key] = label.is_string() ? label.get<std::string>() : label.dump();
    }
  }
  EmitEvent(event);
}

// Results held until every analysis has run, then written together.
struct Outputs {
  std::vector<std::pair<std::string, json>> files;  // (output name, content)
};

class Analysis {
 public:
  // `spec` with its run defaults and checked inputs; `layers`: routing.select.layers parsed.
  Analysis(v1::AnalyzeSpec spec, std::map<std::string, LanguageSource> sources,
           std::optional<LayerRange> layers)
      : spec_(std::move(spec)), sources_(std::move(sources)), layers_(std::move(layers)) {}

  absl::Status Run() {
    const bool reselect = spec_.has_lape() && !spec_.lape().profile().empty();
    const bool profile = ProfilesLape() || spec_.has_routing();
    total_steps_ = (profile ? static_cast<int64_t>(ProfiledLanguages().size()) : 0) +
                   (reselect ? 1 : 0) + (spec_.has_drift() ? 1 : 0) +
                   (spec_.has_alignment() ? 1 : 0) + 1;
    if (reselect) RETURN_IF_ERROR(ReselectLape());
    if (profile || spec_.has_alignment()) RETURN_IF_ERROR(LoadModel());
    if (profile) RETURN_IF_ERROR(ProfileLanguages());
    if (spec_.has_drift()) RETURN_IF_ERROR(RunDrift());
    if (spec_.has_alignment()) RETURN_IF_ERROR(RunAlignment());
    return WriteOutputs();
  }

 private:
  bool ProfilesLape() const { return LapeRunsTheModel(spec_); }

  std::vector<std::string> ProfiledLanguages() const {
    std::set<std::string> langs;
    if (ProfilesLape())
      langs.insert(spec_.lape().languages().begin(), spec_.lape().languages().end());
    if (spec_.has_routing()) {
      langs.insert(spec_.routing().languages().begin(), spec_.routing().languages().end());
    }
    return {langs.begin(), langs.end()};
  }

  absl::Status LoadModel() {
    ASSIGN_OR_RETURN(model_, ModelAnalyzer::Load(spec_.model(), spec_));
    // Refuse an analysis the architecture cannot answer before reading any data.
    if (ProfilesLape() && model_->is_moe()) {
      return absl::FailedPreconditionError(
          absl::StrCat("lape: ", spec_.model(), " (model_type ", model_->model_type(),
                       ") has MoE layers; LAPE profiles the neurons of dense FFN layers"));
    }
    if (spec_.has_routing() && !model_->is_moe()) {
      return absl::FailedPreconditionError(absl::StrCat("routing: ", spec_.model(), " (model_type ",
                                                        model_->model_type(),
                                                        ") has no MoE layers to analyse"));
    }
    if (spec_.has_routing()) RETURN_IF_ERROR(ResolveSelection());
    return absl::OkStatus();
  }

  // The selection's parameters, select.layers (a layer range) as the MoE layers it covers.
  absl::Status ResolveSelection() {
    const v1::SelectOptions& sel = spec_.routing().select();
    if (sel.has_alpha()) select_.alpha = sel.alpha();
    select_.shared_k.assign(sel.shared_k().begin(), sel.shared_k().end());
    select_.high_resource = List(sel.high_resource());
    select_.parents.insert(sel.parents().begin(), sel.parents().end());
    select_.targets = List(sel.targets());
    select_.random_seed = sel.random_seed();
    if (!layers_) return absl::OkStatus();  // the last two MoE layers
    ASSIGN_OR_RETURN(LayerRange range,
                     ResolveLayerRange(*layers_, model_->num_layers(), "routing.select.layers"));
    const std::vector<int64_t> moe = model_->moe_layers();
    for (int64_t l = range.begin; l < range.end; ++l) {
      if (std::find(moe.begin(), moe.end(), l) == moe.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("routing.select.layers: \"", layers_->text, "\" includes layer ", l,
                         ", which has no MoE block in ", spec_.model()));
      }
      select_.layers.push_back(l);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<const tokenizer::Tokenizer*> GetTokenizer() {
    if (!tokenizer_) {
      auto loaded = tokenizer::Tokenizer::Load(spec_.tokenizer());
      if (!loaded.ok()) {
        return absl::Status(loaded.status().code(), absl::StrCat("tokenizer ", spec_.tokenizer(),
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
      const LanguageSource& source = sources_.at(lang);
      const tokenizer::Tokenizer* tok = nullptr;
      if (source.kind != LanguageSource::Kind::kDataset) {
        ASSIGN_OR_RETURN(tok, GetTokenizer());
      }
      ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                       LoadLanguageTokens(source, tok, spec_.max_tokens(), model_->vocab_size()));
      ProfileOptions options;
      options.seq_len = spec_.seq_len();
      options.batch_size = spec_.batch_size();
      options.lape = ProfilesLape() && Contains(spec_.lape().languages(), lang);
      options.routing = spec_.has_routing() && Contains(spec_.routing().languages(), lang);
      options.activation_threshold = spec_.lape().activation_threshold();
      int64_t last_tenth = 0;
      options.progress = [&](int64_t done, int64_t windows) {
        const int64_t tenth = done * 10 / windows;  // at most ten events per language
        if (tenth == last_tenth || done == windows) return;
        last_tenth = tenth;
        v1::EngineEvent event = ProgressEvent(
            (step_ + static_cast<double>(done) / windows) / static_cast<double>(total_steps_),
            absl::StrCat("profiling ", lang, ": ", done, "/", windows, " windows"));
        event.set_step(static_cast<double>(step_));
        event.set_total_steps(static_cast<double>(total_steps_));
        EmitEvent(event);
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
    if (spec_.has_routing()) RETURN_IF_ERROR(FinishRouting(routing_counts, vocab));
    return absl::OkStatus();
  }

  absl::Status FinishLape(std::map<std::string, LapeCounts>& by_lang) {
    std::vector<LapeCounts> counts;
    for (const auto& lang : spec_.lape().languages()) counts.push_back(std::move(by_lang[lang]));
    return Lape(List(spec_.lape().languages()), counts, model_->num_layers(),
                model_->intermediate_size(), spec_.model(), "");
  }

  // lape.profile: the counts of an earlier run's neuron_mask.json, selected again.
  absl::Status ReselectLape() {
    const std::string& file = spec_.lape().profile();
    ASSIGN_OR_RETURN(json saved, ReadJson(file, "lape.profile"));
    ASSIGN_OR_RETURN(SavedProfile profile, LapeCountsFromMask(saved, List(spec_.lape().languages()),
                                                              absl::StrCat("lape.profile ", file)));
    if (profile.languages.size() < 2) {
      return FieldError(absl::StrCat("lape.profile ", file), "holds fewer than two languages");
    }
    RETURN_IF_ERROR(Lape(profile.languages, profile.counts, profile.num_layers,
                         profile.intermediate_size,
                         profile.model.empty() ? spec_.model() : profile.model, file));
    Progress(++step_, total_steps_, absl::StrCat("re-selected from ", file));
    return absl::OkStatus();
  }

  absl::Status Lape(const std::vector<std::string>& languages,
                    const std::vector<LapeCounts>& counts, int64_t num_layers,
                    int64_t intermediate_size, const std::string& model,
                    const std::string& profile) {
    ASSIGN_OR_RETURN(LapeResult result, IdentifyLapeNeurons(languages, counts, num_layers,
                                                            intermediate_size, spec_.lape()));
    json mask = NeuronMaskJson(result, spec_.lape(), counts, spec_.lape().keep_profile());
    mask["params"]["model"] = model;
    if (!profile.empty()) mask["params"]["reselected_from"] = profile;
    for (const auto& lang : result.languages) {
      int64_t total = 0;
      for (const auto& list : result.neurons.at(lang)) total += list.size();
      Metric("lape/neurons", total, {{"language", lang}});
    }
    Metric("lape/filter_threshold", result.filter_threshold);
    if (spec_.lape().exclusive()) Metric("lape/shared_dropped", result.num_shared);
    outputs_.files.emplace_back("neuron_mask", std::move(mask));
    if (spec_.lape().random_mask()) {
      json random = RandomMaskJson(result, spec_.lape().random_seed());
      random["params"]["model"] = model;
      outputs_.files.emplace_back("random_mask", std::move(random));
    }
    return absl::OkStatus();
  }

  absl::Status FinishRouting(std::map<std::string, RoutingCounts>& by_lang,
                             std::map<std::string, std::set<int32_t>>& vocab) {
    RoutingInput input;
    input.languages = List(spec_.routing().languages());
    for (const auto& lang : input.languages) {
      input.counts.push_back(std::move(by_lang[lang]));
      input.vocab.push_back(std::move(vocab[lang]));
    }
    input.moe_layers = model_->moe_layers();
    input.num_experts = model_->num_experts();
    input.top_k = model_->top_k();
    ASSIGN_OR_RETURN(json stats, RoutingStatsJson(input));
    ASSIGN_OR_RETURN(json selection, ExpertSelectionJson(input, select_));
    stats["model"] = spec_.model();
    selection["_meta"]["model"] = spec_.model();
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
    const v1::DriftOptions& d = spec_.drift();
    std::optional<std::vector<std::vector<int64_t>>> mask;
    if (!d.mask().empty()) {
      ASSIGN_OR_RETURN(json file, ReadJson(d.mask(), "drift.mask"));
      ASSIGN_OR_RETURN(
          mask, MaskUnion(file, List(d.mask_languages()), absl::StrCat("drift.mask ", d.mask())));
    }
    ASSIGN_OR_RETURN(json drift, WeightDrift(d.base(), d.trained(), mask ? &*mask : nullptr));
    if (mask) {
      drift["mask"] = {{"file", d.mask()}, {"languages", List(d.mask_languages())}};
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
    const v1::AlignmentOptions& a = spec_.alignment();
    const std::vector<std::string> languages = List(a.languages());
    std::map<std::string, std::string> texts;  // language -> line-aligned text file
    for (const v1::AlignedText& t : a.texts()) texts[t.language()] = t.path();
    std::vector<std::vector<std::string>> sentences;
    if (texts.empty()) {
      ASSIGN_OR_RETURN(sentences, ReadParallelSentences(a.file(), languages, a.max_sentences()));
    } else {
      std::vector<std::string> paths;
      for (const auto& lang : languages) paths.push_back(texts.at(lang));
      ASSIGN_OR_RETURN(sentences, ReadLineAlignedTexts(paths, languages, a.max_sentences()));
    }
    ASSIGN_OR_RETURN(const tokenizer::Tokenizer* tok, GetTokenizer());
    const bool add_bos = a.has_add_bos() ? a.add_bos() : tok->bos_id().has_value();
    if (add_bos && !tok->bos_id()) {
      return FieldError("alignment.add_bos",
                        absl::StrCat("the tokenizer (", spec_.tokenizer(), ") has no BOS token"));
    }
    std::vector<std::vector<std::vector<int32_t>>> ids(sentences.size());
    for (size_t i = 0; i < sentences.size(); ++i) {
      for (size_t k = 0; k < languages.size(); ++k) {
        std::vector<int32_t> s;
        if (add_bos) s.push_back(*tok->bos_id());
        std::vector<int32_t> text = tok->Encode(sentences[i][k]);
        s.insert(s.end(), text.begin(), text.end());
        for (int32_t id : s) {
          if (id < 0 || id >= model_->vocab_size()) {
            return FieldError(
                a.file(), absl::StrCat("sentence ", i + 1, " (", languages[k], ") has token ", id,
                                       " outside the model's vocabulary"));
          }
        }
        ids[i].push_back(std::move(s));
      }
    }
    ASSIGN_OR_RETURN(AlignmentResult result, model_->Align(ids, a.batch_size(), add_bos ? 1 : 0));
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
          {{"languages", {languages[result.pairs[p].first], languages[result.pairs[p].second]}},
           {"cosine", result.cosine[p]}});
    }
    json out = {{"format", "stemma.alignment/1"},
                {"model", spec_.model()},
                {"file", texts.empty() ? json(a.file()) : json(texts)},
                {"languages", languages},
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
    std::filesystem::create_directories(spec_.out(), ec);
    if (ec)
      return absl::InternalError(
          absl::StrCat("out: cannot create ", spec_.out(), ": ", ec.message()));
    json written = json::object();
    for (const auto& [name, content] : outputs_.files) {
      const std::string path = (std::filesystem::path(spec_.out()) / (name + ".json")).string();
      RETURN_IF_ERROR(WriteJsonAtomically(path, content));
      // The output's name in events and the registry: the files' stems, except the two that
      // later stages consume by role (train's neuron_mask and expert_subset strategies).
      const std::string output = name == "neuron_mask"        ? "mask"
                                 : name == "expert_selection" ? "selection"
                                                              : name;
      written[output] = path;
    }
    std::vector<std::string> parents;
    for (const std::string& p : {spec_.model(), spec_.drift().base(), spec_.drift().trained()}) {
      if (!p.empty() && std::find(parents.begin(), parents.end(), p) == parents.end())
        parents.push_back(p);
    }
    for (const auto& [name, path] : written.items()) {
      ASSIGN_OR_RETURN(v1::EngineEvent output,
                       OutputEvent(name, path.get<std::string>(), "analyze", parents));
      EmitEvent(output);
    }
    Progress(++step_, total_steps_, "outputs written");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    json done = {{"outputs", written}, {"seconds", seconds}};
    if (tokens_profiled_ > 0) {  // forward passes of lape/routing only, model load excluded
      done["tokens_profiled"] = tokens_profiled_;
      done["profile_seconds"] = profile_seconds_;
      done["tokens_per_s"] = profile_seconds_ > 0 ? tokens_profiled_ / profile_seconds_ : 0.0;
    }
    EmitEvent(CommandEvent(engine_contract::kEventDone, "analyze", done));
    return absl::OkStatus();
  }

  v1::AnalyzeSpec spec_;
  std::map<std::string, LanguageSource> sources_;  // by language
  std::optional<LayerRange> layers_;
  SelectionParams select_;
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
  v1::AnalyzeSpec spec = proto;
  FillRunDefaults(&spec);
  std::map<std::string, LanguageSource> sources;
  for (const v1::LanguageSource& l : spec.languages()) {
    sources.emplace(l.language(), LanguageSourceFromProto(l));
  }
  std::optional<LayerRange> layers;
  if (spec.has_routing() && !spec.routing().select().layers().empty()) {
    ASSIGN_OR_RETURN(layers,
                     ParseLayerRange(spec.routing().select().layers(), "routing.select.layers"));
  }
  RETURN_IF_ERROR(CheckInputs(sources, spec));
  // The analyses run whole on rank 0. The other ranks of a multi-rank part (several GPUs)
  // have checked the same inputs and leave: they would only write the same files again.
  if (const char* rank = std::getenv("RANK"); rank != nullptr && std::string(rank) != "0") {
    std::fprintf(stderr, "stemma-engine analyze: rank %s: the analyses run on rank 0 only\n", rank);
    return absl::OkStatus();
  }
  json analyses = json::array();
  for (const auto& [name, on] :
       {std::pair{"lape", spec.has_lape()}, std::pair{"routing", spec.has_routing()},
        std::pair{"drift", spec.has_drift()}, std::pair{"alignment", spec.has_alignment()}}) {
    if (on) analyses.push_back(name);
  }
  json start = {{"spec", path},
                {"analyses", analyses},
                {"device", spec.device()},
                {"dtype", spec.dtype()},
                {"threads", spec.threads()},
                {"threads_source", proto.threads() > 0  ? "spec"
                                   : spec.threads() > 0 ? "job cpus (STEMMA_CPUS)"
                                                        : "torch default"}};
  if (spec.has_lape() && !spec.lape().profile().empty())
    start["lape_profile"] = spec.lape().profile();
  if (spec.has_routing()) {
    // The resolved selection layers, when config.json says how many layers there are.
    const std::optional<int64_t> model_layers = ModelLayersFromConfig(spec.model());
    if (layers && model_layers) {
      ASSIGN_OR_RETURN(LayerRange r,
                       ResolveLayerRange(*layers, *model_layers, "routing.select.layers"));
      start["select_layers"] = FormatLayerRange(r);
    } else if (model_layers) {
      start["select_layers"] = absl::StrCat("the last two MoE layers of ", *model_layers);
    }
  }
  EmitEvent(CommandEvent(engine_contract::kEventStart, "analyze", start));
  Analysis analysis(std::move(spec), std::move(sources), std::move(layers));
  return analysis.Run();
}

}  // namespace

int RunAnalyze(int argc, char** argv) {
  auto run = [](const SpecCall& call) -> absl::StatusOr<int> {
    RETURN_IF_ERROR(Analyze(*call.spec, call.spec_file));
    return engine_contract::kExitOk;
  };
  return RunSpecCommand({kUsage, {}, run}, argc, argv);
}

}  // namespace stemma::engine
