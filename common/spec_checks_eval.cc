// Cross-field rules of the eval-area engine specs (common/spec_checks.h): which task fields
// go with which task type, unique names, the languages each analysis names, and the
// sections that need a model. What needs the files themselves (a dataset's contents, the
// model's experts) is checked by the engine at start.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/eval_task.h"
#include "common/spec_checks.h"
#include "common/status.h"

namespace stemma::spec_checks {
namespace {

bool Contains(const google::protobuf::RepeatedPtrField<std::string>& list, const std::string& v) {
  return std::find(list.begin(), list.end(), v) != list.end();
}

absl::Status CheckTask(const v1::EvalTask& t, const std::string& at, const SpecChecker& checker) {
  // Which fields go with which type is the schema's (the reader refuses a field of another
  // type); what is left are the rules between fields of one type.
  if (t.kind_case() == v1::EvalTask::KIND_NOT_SET) {
    return checker.Error(absl::StrCat(at, ".type"),
                         "is required (perplexity, choice, translation)");
  }
  if (t.has_perplexity()) {
    const v1::PerplexityTask& p = t.perplexity();
    if (p.split() != "all" && !p.has_heldout_fraction()) {
      return checker.Error(absl::StrCat(at, ".heldout_fraction"),
                           "is required with split: heldout (the training run's "
                           "data.heldout_fraction; or split: all)");
    }
    if (p.split() == "all") {
      for (const auto& [name, set] : {std::pair{"heldout_fraction", p.has_heldout_fraction()},
                                      std::pair{"heldout_split", p.has_heldout_split()},
                                      std::pair{"split_seed", p.has_split_seed()}}) {
        if (set)
          return checker.Error(absl::StrCat(at, ".", name), "does not apply with split: all");
      }
    }
    if (p.heldout_split() == "last" && p.has_split_seed()) {
      return checker.Error(absl::StrCat(at, ".split_seed"),
                           "does not apply to heldout_split: last (no hash)");
    }
  }
  if (t.has_choice() && t.choice().format().empty()) {
    return checker.Error(absl::StrCat(at, ".format"),
                         "is required for a choice task (belebele, piqa, global_piqa)");
  }
  if (t.has_translation() && t.translation().source_language().empty()) {
    return checker.Error(absl::StrCat(at, ".source_language"),
                         "is required for a translation task");
  }
  return absl::OkStatus();
}

// "cpu", "cuda", "cuda:N".
bool ValidDevice(const std::string& device) {
  if (device == "cpu" || device == "cuda") return true;
  int index = 0;
  return device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &index) && index >= 0;
}

// Every name in `list` must be in `known`; `what` says what `known` is.
absl::Status Subset(const google::protobuf::RepeatedPtrField<std::string>& list,
                    const std::vector<std::string>& known, const std::string& field,
                    const std::string& what, const SpecChecker& checker) {
  std::set<std::string> seen;
  for (int i = 0; i < list.size(); ++i) {
    const std::string& lang = list[i];
    if (std::find(known.begin(), known.end(), lang) == known.end()) {
      return checker.Error(
          absl::StrCat(field, "[", i, "]"),
          absl::StrCat("'", lang, "' is not ", what,
                       known.empty() ? "" : absl::StrCat(" (", absl::StrJoin(known, ", "), ")")));
    }
    if (!seen.insert(lang).second) {
      return checker.Error(absl::StrCat(field, "[", i, "]"),
                           absl::StrCat("'", lang, "' is listed twice"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> Names(const google::protobuf::RepeatedPtrField<std::string>& list,
                               const std::vector<std::string>& fallback) {
  if (list.empty()) return fallback;
  return {list.begin(), list.end()};
}

absl::Status CheckSelect(const v1::SelectOptions& s, const std::vector<std::string>& routed,
                         const SpecChecker& checker) {
  const std::string at = "routing.select";
  RETURN_IF_ERROR(
      Subset(s.high_resource(), routed, at + ".high_resource", "a routed language", checker));
  RETURN_IF_ERROR(Subset(s.targets(), routed, at + ".targets", "a routed language", checker));
  for (const auto& t : s.targets()) {
    if (Contains(s.high_resource(), t)) {
      return checker.Error(at + ".targets", absl::StrCat("'", t, "' is also under high_resource"));
    }
    if (s.parents().count(t)) {
      return checker.Error(at + ".targets", absl::StrCat("'", t, "' also has a parent"));
    }
  }
  // The anchors: high_resource, or every routed language that is neither a child nor a target.
  std::vector<std::string> anchors(s.high_resource().begin(), s.high_resource().end());
  if (anchors.empty()) {
    for (const auto& lang : routed) {
      if (!s.parents().count(lang) && !Contains(s.targets(), lang)) anchors.push_back(lang);
    }
  }
  // Sorted, so the error names the same entry every time (a proto map has no order).
  std::vector<std::pair<std::string, std::string>> parents(s.parents().begin(), s.parents().end());
  std::sort(parents.begin(), parents.end());
  for (const auto& [low, parent] : parents) {
    const std::string field = absl::StrCat(at, ".parents.", low);
    if (std::find(routed.begin(), routed.end(), low) == routed.end()) {
      return checker.Error(field, absl::StrCat("'", low, "' is not a routed language"));
    }
    if (Contains(s.high_resource(), low)) {
      return checker.Error(field, absl::StrCat("'", low, "' is also under high_resource"));
    }
    if (std::find(anchors.begin(), anchors.end(), parent) == anchors.end()) {
      return checker.Error(
          field, absl::StrCat("the parent '", parent, "' is not a high-resource language (",
                              absl::StrJoin(anchors, ", "), ")"));
    }
  }
  if (anchors.empty()) {
    return checker.Error(
        at + ".high_resource",
        "no anchor language is left (every routed language has a parent or is a target)");
  }
  if (anchors.size() + s.targets_size() < 2) {
    const std::string field = s.high_resource_size() > 0 ? at + ".high_resource"
                              : s.parents_size() > 0     ? at + ".parents"
                                                         : at;
    return checker.Error(
        field, absl::StrCat("the activation gap compares two languages, but only '", anchors[0],
                            "' is an anchor and there is no target (list a language under "
                            "targets to select for it against '",
                            anchors[0], "')"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Check(const v1::EvalSpec& spec, const SpecChecker& checker) {
  if (spec.tasks_size() == 0) return checker.Error("tasks", "needs at least one task");
  if (spec.has_device() && !ValidDevice(spec.device())) {  // unset: the default, cpu
    return checker.Error("device",
                         absl::StrCat("'", spec.device(), "' is not cpu, cuda or cuda:N"));
  }
  std::set<std::string> names;
  for (int i = 0; i < spec.tasks_size(); ++i) {
    const v1::EvalTask& t = spec.tasks(i);
    const std::string at = absl::StrCat("tasks[", i, "]");
    RETURN_IF_ERROR(CheckTask(t, at, checker));
    const std::string name = EvalTaskName(t);
    if (!names.insert(name).second) {
      return checker.Error(absl::StrCat(at, t.name().empty() ? ".type" : ".name"),
                           absl::StrCat("the task name '", name, "' is used by an earlier task",
                                        t.name().empty() ? " (give each a distinct name)" : ""));
    }
  }
  return absl::OkStatus();
}

absl::Status Check(const v1::AnalyzeSpec& spec, const SpecChecker& checker) {
  if (!spec.has_lape() && !spec.has_routing() && !spec.has_drift() && !spec.has_alignment()) {
    return checker.Error("", "no analysis given (add one of lape, routing, drift, alignment)");
  }
  if (spec.has_device() && !ValidDevice(spec.device())) {  // unset: the default, cpu
    return checker.Error("device",
                         absl::StrCat("'", spec.device(), "' is not cpu, cuda or cuda:N"));
  }
  std::vector<std::string> languages;
  for (int i = 0; i < spec.languages_size(); ++i) {
    const v1::LanguageSource& l = spec.languages(i);
    const std::string at = absl::StrCat("languages[", i, "]");
    const int given = !l.dataset().empty() + !l.text().empty() + !l.jsonl().empty();
    if (given != 1) {
      return checker.Error(
          at, absl::StrCat("give exactly one of dataset, text or jsonl for '", l.language(), "'"));
    }
    if (!l.field().empty() && l.jsonl().empty()) {
      return checker.Error(at + ".field", "applies to a jsonl source only");
    }
    if (std::find(languages.begin(), languages.end(), l.language()) != languages.end()) {
      return checker.Error(at + ".language", absl::StrCat("'", l.language(), "' is listed twice"));
    }
    languages.push_back(l.language());
  }
  const bool profiles = (spec.has_lape() && spec.lape().profile().empty()) || spec.has_routing();
  if (profiles && languages.empty()) {
    return checker.Error("languages",
                         absl::StrCat("is required: ", spec.has_routing() ? "routing" : "lape",
                                      " runs each language's text through the model"));
  }
  if ((profiles || spec.has_alignment()) && spec.model().empty()) {
    const char* who = spec.has_lape() && spec.lape().profile().empty() ? "lape"
                      : spec.has_routing()                             ? "routing"
                                                                       : "alignment";
    return checker.Error("model", absl::StrCat("is required: ", who, " runs the model"));
  }
  if (spec.has_lape()) {
    const v1::LapeOptions& lape = spec.lape();
    if (lape.profile().empty()) {
      RETURN_IF_ERROR(
          Subset(lape.languages(), languages, "lape.languages", "under languages", checker));
      if (Names(lape.languages(), languages).size() < 2) {
        return checker.Error(
            lape.languages().empty() ? "languages" : "lape.languages",
            "LAPE needs at least two languages (the entropy is taken across them)");
      }
    } else if (lape.languages_size() == 1) {
      return checker.Error("lape.languages",
                           "LAPE needs at least two languages (the entropy is taken across them)");
    }
  }
  if (spec.has_routing()) {
    const v1::RoutingOptions& r = spec.routing();
    RETURN_IF_ERROR(
        Subset(r.languages(), languages, "routing.languages", "under languages", checker));
    const std::vector<std::string> routed = Names(r.languages(), languages);
    if (routed.size() < 2) {
      return checker.Error(r.languages().empty() ? "languages" : "routing.languages",
                           "the routing analysis needs at least two languages");
    }
    RETURN_IF_ERROR(CheckSelect(r.select(), routed, checker));
  }
  if (spec.has_drift()) {
    const v1::DriftOptions& d = spec.drift();
    if (d.trained().empty() && spec.model().empty()) {
      return checker.Error("drift.trained", "is required when there is no model to default to");
    }
    if (d.mask_languages_size() > 0 && d.mask().empty()) {
      return checker.Error("drift.mask_languages",
                           "needs drift.mask (the neuron_mask.json to take them from)");
    }
  }
  if (spec.has_alignment()) {
    const v1::AlignmentOptions& a = spec.alignment();
    if (a.file().empty() == a.texts().empty()) {
      return checker.Error(
          "alignment",
          "give exactly one of file (parallel JSONL) or texts (line-aligned text files)");
    }
    std::vector<std::string> texts;
    for (int i = 0; i < a.texts_size(); ++i) {
      if (std::find(texts.begin(), texts.end(), a.texts(i).language()) != texts.end()) {
        return checker.Error(absl::StrCat("alignment.texts[", i, "].language"),
                             absl::StrCat("'", a.texts(i).language(), "' is listed twice"));
      }
      texts.push_back(a.texts(i).language());
    }
    if (!texts.empty()) {
      RETURN_IF_ERROR(
          Subset(a.languages(), texts, "alignment.languages", "under alignment.texts", checker));
    }
    const size_t compared = a.languages_size() > 0 ? a.languages_size() : texts.size();
    if ((a.languages_size() > 0 || !texts.empty()) && compared < 2) {
      return checker.Error(a.languages_size() > 0 ? "alignment.languages" : "alignment.texts",
                           "alignment needs at least two languages");
    }
  }
  return absl::OkStatus();
}

}  // namespace stemma::spec_checks

namespace stemma {

std::string EvalTaskType(const v1::EvalTask& task) {
  if (task.kind_case() == v1::EvalTask::KIND_NOT_SET) return "";
  return v1::EvalTask::descriptor()->FindFieldByNumber(task.kind_case())->name();
}

std::string EvalTaskName(const v1::EvalTask& t) {
  if (!t.name().empty()) return t.name();
  if (t.has_choice()) return absl::StrCat(t.choice().format(), "_", t.language());
  if (t.has_translation())
    return absl::StrCat(t.translation().source_language(), "-", t.language());
  return t.language();
}

void FillEvalTaskDefaults(v1::EvalTask* t) {
  t->set_name(EvalTaskName(*t));
  if (t->has_perplexity()) {
    // Not a rule default: split_seed and heldout_split are refused with split: all and a
    // filled default could not be told from a written one.
    v1::PerplexityTask* p = t->mutable_perplexity();
    if (p->split() == "heldout" && !p->has_heldout_split()) p->set_heldout_split("hash");
  }
  if (t->has_choice() && t->choice().sampler().empty()) {
    t->mutable_choice()->set_sampler(t->choice().format() == "belebele" ? "first_n" : "seeded");
  }
  if (t->has_translation()) {
    v1::TranslationTask* tr = t->mutable_translation();
    if (tr->source_name().empty()) tr->set_source_name(tr->source_language());
    if (tr->target_name().empty()) tr->set_target_name(t->language());
  }
}

}  // namespace stemma
