// Cross-field rules of the train-area engine specs (common/spec_checks.h): init, tokenize,
// train. Each works on a copy with the schema's defaults filled in, so that it gives the same
// answer at submit (where defaults are not filled yet) and in the engine (where they are).
#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/proto_yaml.h"
#include "common/spec_checks.h"
#include "common/status.h"

namespace stemma::spec_checks {
namespace {

template <typename T>
T WithDefaults(const T& spec) {
  T copy = spec;
  FillSpecDefaults(&copy);
  return copy;
}

// checker.Error(field, what), but at the line of `line_field` (a field that was written) when
// `field` itself was not: a missing weight is reported at its dataset's line.
absl::Status ErrorAt(const SpecChecker& checker, const std::string& field,
                     const std::string& line_field, const std::string& what) {
  const SpecContext& c = checker.context();
  const std::string path = c.path.empty() ? field : absl::StrCat(c.path, ".", field);
  const std::string line_path = c.path.empty() ? line_field : absl::StrCat(c.path, ".", line_field);
  const int line = c.lines != nullptr ? c.lines->Line(line_path) : 0;
  return SpecError(c.where, line, path, what);
}

bool IsDevice(const std::string& device) {
  if (device == "cpu" || device == "cuda") return true;
  if (!absl::StartsWith(device, "cuda:") || device.size() == 5) return false;
  return device.find_first_not_of("0123456789", 5) == std::string::npos;
}

absl::Status CheckData(const v1::TrainData& data, int64_t eval_every, const SpecChecker& checker) {
  int with_weight = 0;
  for (const auto& d : data.datasets()) with_weight += d.has_weight() ? 1 : 0;
  const int n = data.datasets_size();
  if (with_weight > 0 && with_weight < n) {
    for (int i = 0; i < n; ++i) {
      if (!data.datasets(i).has_weight()) {
        return ErrorAt(checker, absl::StrCat("data.datasets[", i, "].weight"),
                       absl::StrCat("data.datasets[", i, "].path"),
                       absl::StrCat("is missing while ", with_weight, " of the ", n,
                                    " datasets have one: give every dataset a weight, or none "
                                    "(equal shares)"));
      }
    }
  }
  if (data.has_temperature() && with_weight > 0) {
    for (int i = 0; i < n; ++i) {
      if (data.datasets(i).has_weight()) {
        return checker.Error(absl::StrCat("data.datasets[", i, "].weight"),
                             "weights and data.temperature exclude each other (drop one)");
      }
    }
  }
  if (with_weight == n && n > 0) {
    double sum = 0;
    for (const auto& d : data.datasets()) sum += d.weight();
    if (!(sum > 0)) return checker.Error("data.datasets", "the weights sum to 0");
  }
  if (!data.family_weights().empty()) {
    if (!data.has_temperature()) {
      return checker.Error("data.family_weights",
                           "needs data.temperature (the share inside a family)");
    }
    std::set<std::string> families;
    for (int i = 0; i < n; ++i) {
      const std::string& f = data.datasets(i).family();
      families.insert(f);
      if (!data.family_weights().contains(f)) {
        return ErrorAt(checker, absl::StrCat("data.datasets[", i, "].family"),
                       absl::StrCat("data.datasets[", i, "].path"),
                       f.empty() ? std::string("is needed: data.family_weights is given")
                                 : absl::StrCat("'", f, "' has no weight in data.family_weights"));
      }
    }
    double sum = 0;
    for (const auto& [family, weight] : data.family_weights()) {
      if (!families.contains(family)) {
        return checker.Error(absl::StrCat("data.family_weights.", family),
                             "matches no dataset's family");
      }
      if (weight < 0)
        return checker.Error(absl::StrCat("data.family_weights.", family), "must be >= 0");
      sum += weight;
    }
    if (!(sum > 0)) return checker.Error("data.family_weights", "the weights sum to 0");
  }
  if (eval_every > 0) {
    for (int i = 0; i < n; ++i) {
      if (data.datasets(i).heldout_path().empty() && !(data.heldout_fraction() > 0)) {
        return checker.Error("eval.every",
                             absl::StrCat("needs held-out documents: data.datasets[", i,
                                          "] has no heldout_path and data.heldout_fraction is 0"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckStrategy(const v1::TrainStrategy& s, const SpecChecker& checker) {
  int defaults = 0;
  for (int i = 0; i < s.l2sp_size(); ++i) {
    if (s.l2sp(i).layers_size() == 0 && ++defaults > 1) {
      return checker.Error(absl::StrCat("strategy.l2sp[", i, "]"),
                           "only one rule without 'layers' (the default λ) is allowed");
    }
  }
  if (s.has_neuron_mask() && s.has_expert_subset()) {
    return checker.Error(
        "strategy.expert_subset",
        "neuron_mask and expert_subset cannot be combined (one sparse sub-network)");
  }
  if (s.has_expert_subset() && s.has_aux_loss() &&
      (s.aux_loss().load_balancing() > 0 || s.aux_loss().router_z() > 0)) {
    return checker.Error(
        "strategy.aux_loss",
        "expert_subset (SSFT) trains with cross-entropy only (algorithms.md §4.5): "
        "the aux losses would push tokens off the target experts");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Check(const v1::InitSpec& raw, const SpecChecker& checker) {
  const v1::InitSpec spec = WithDefaults(raw);
  if (spec.has_hidden_size() && spec.has_num_heads() && !spec.has_head_dim() &&
      spec.hidden_size() % spec.num_heads() != 0) {
    return checker.Error("num_heads",
                         absl::StrCat(spec.num_heads(), " does not divide hidden_size ",
                                      spec.hidden_size(), " (or set head_dim)"));
  }
  if (spec.has_num_heads() && spec.has_num_kv_heads() &&
      spec.num_heads() % spec.num_kv_heads() != 0) {
    return checker.Error(
        "num_kv_heads",
        absl::StrCat(spec.num_kv_heads(), " does not divide num_heads ", spec.num_heads()));
  }
  if ((spec.has_num_experts() || spec.has_experts_per_token()) && spec.arch() != "olmoe") {
    return checker.Error(spec.has_num_experts() ? "num_experts" : "experts_per_token",
                         absl::StrCat("applies to arch olmoe only, not ", spec.arch()));
  }
  if (spec.has_num_experts() && spec.has_experts_per_token() &&
      spec.experts_per_token() > spec.num_experts()) {
    return checker.Error(
        "experts_per_token",
        absl::StrCat(spec.experts_per_token(), " is more than num_experts ", spec.num_experts()));
  }
  if (spec.tokenizer().empty())
    return checker.Error("tokenizer", "is empty (bytes, or a tokenizer directory)");
  return absl::OkStatus();
}

absl::Status Check(const v1::TokenizeSpec& raw, const SpecChecker& checker) {
  const v1::TokenizeSpec spec = WithDefaults(raw);
  if (spec.line_docs() && spec.format() != "text") {
    return checker.Error("line_docs", "applies to format text only");
  }
  if (spec.field().empty()) return checker.Error("field", "is empty");
  return absl::OkStatus();
}

absl::Status Check(const v1::TrainSpec& raw, const SpecChecker& checker) {
  v1::TrainSpec spec = raw;
  // Sub-messages get their defaults too (FillSpecDefaults fills only those that are set).
  spec.mutable_optimizer();
  spec.mutable_schedule();
  spec.mutable_eval();
  spec.mutable_data();
  FillSpecDefaults(&spec);
  if (spec.has_steps() == spec.has_max_tokens()) {
    return checker.Error(spec.has_steps() ? "max_tokens" : "steps",
                         "give exactly one of 'steps' and 'max_tokens'");
  }
  if (spec.optimizer().betas_size() != 2) {
    return checker.Error("optimizer.betas", absl::StrCat("needs exactly two numbers [β1, β2], not ",
                                                         spec.optimizer().betas_size()));
  }
  const int64_t tokens_per_step = spec.batch_size() * spec.grad_accum() * spec.data().seq_len();
  const int64_t steps = spec.has_steps() ? spec.steps()
                        : tokens_per_step > 0
                            ? (spec.max_tokens() + tokens_per_step - 1) / tokens_per_step
                            : 0;
  if (steps > 0 && spec.schedule().warmup_steps() > steps) {
    return checker.Error(
        "schedule.warmup_steps",
        absl::StrCat(spec.schedule().warmup_steps(), " exceeds the ", steps, " training steps"));
  }
  if (!IsDevice(spec.device())) {
    return checker.Error("device",
                         absl::StrCat("'", spec.device(), "' is not cpu, cuda or cuda:N"));
  }
  RETURN_IF_ERROR(CheckData(spec.data(), spec.eval().every(), checker));
  RETURN_IF_ERROR(CheckStrategy(spec.strategy(), checker));
  return absl::OkStatus();
}

}  // namespace stemma::spec_checks
