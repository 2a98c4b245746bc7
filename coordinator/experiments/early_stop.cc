#include "coordinator/experiments/early_stop.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace stemma::experiments {
namespace {

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

bool KnownMetric(const std::string& m) {
  return m == "loss" || m == "heldout_loss" ||
         (absl::StartsWith(m, "heldout_loss/") && m.size() > 13);
}

// Pareto: two to eight objectives, each a metric the trainer reports, min or max; no `metric`.
template <typename Error>
absl::Status CheckObjectives(const v1::EarlyStopRule& c, const YamlNode& node, const Error& error) {
  if (node.Find("metric") != nullptr || node.Find("mode") != nullptr) {
    return error(node.Find("metric") != nullptr ? "metric" : "mode",
                 "method: pareto ranks by objectives: [{metric: M, mode: min}, ...] instead");
  }
  if (c.objectives_size() < 2 || c.objectives_size() > 8) {
    return error("objectives",
                 "method: pareto needs 2 to 8 objectives: [{metric: M, mode: min|max}, ...]");
  }
  for (const v1::EarlyStopObjective& o : c.objectives()) {
    if (!KnownMetric(o.metric())) {
      return error("objectives", absl::StrCat("'", o.metric(),
                                              "' is not a metric the trainer reports (use loss, "
                                              "heldout_loss or heldout_loss/<dataset>)"));
    }
    if (!o.mode().empty() && o.mode() != "min" && o.mode() != "max")
      return error("objectives", absl::StrCat(o.metric(), ": mode must be min or max"));
  }
  return absl::OkStatus();
}

// The fields of a rule that do not depend on the cell: metric, mode, keep, min_trials, and
// exactly one list of rungs.
absl::Status CheckWritten(const v1::EarlyStopRule& c, const YamlNode& node, const FieldLines& lines,
                          const std::string& path, std::string_view file) {
  auto error = [&](const char* field, std::string_view what) {
    const std::string fpath = absl::StrCat(path, ".", field);
    return SpecError(file, node.Find(field) != nullptr ? lines.Line(fpath) : node.line, fpath,
                     what);
  };
  if (!c.method().empty() && c.method() != "top" && !IsPareto(c))
    return error("method", "must be top (one metric, the default) or pareto (objectives)");
  if (IsPareto(c)) RETURN_IF_ERROR(CheckObjectives(c, node, error));
  if (!IsPareto(c) && c.objectives_size() > 0)
    return error("objectives", "are for method: pareto (top ranks by one metric)");
  if (node.Find("metric") != nullptr && !KnownMetric(c.metric())) {
    return error("metric", absl::StrCat("'", c.metric(),
                                        "' is not a metric the trainer reports (use loss, "
                                        "heldout_loss or heldout_loss/<dataset>)"));
  }
  if (node.Find("mode") != nullptr && c.mode() != "min" && c.mode() != "max")
    return error("mode", "must be min or max");
  if (c.has_keep() && !(c.keep() > 0 && c.keep() < 1)) {
    return error("keep",
                 absl::StrCat("'", Number(c.keep()),
                              "' must be a fraction in (0, 1): the share kept at each rung"));
  }
  if (c.has_min_trials() && (c.min_trials() < 1 || c.min_trials() > 100000))
    return error("min_trials", "must be a whole number >= 1");
  if (c.metric().empty() && !IsPareto(c))
    return error("metric", "is required (loss, heldout_loss or heldout_loss/<dataset>)");
  if ((node.Find("rungs") == nullptr) == (node.Find("rungs_tokens") == nullptr)) {
    return SpecError(file, node.line, absl::StrCat(path, ".rungs"),
                     "give exactly one of rungs (steps) and rungs_tokens");
  }
  return absl::OkStatus();
}

}  // namespace

double Keep(const v1::EarlyStopRule& rule) { return rule.has_keep() ? rule.keep() : 0.5; }

absl::StatusOr<v1::EarlyStopRule> RuleForTrial(const v1::EarlyStopRule& written,
                                               const YamlNode& node, const FieldLines& lines,
                                               const std::string& path, std::string_view file,
                                               const v1::JobSpec& cell,
                                               const std::string& cell_name) {
  RETURN_IF_ERROR(CheckWritten(written, node, lines, path, file));
  const bool steps = node.Find("rungs") != nullptr;
  const auto& list = steps ? written.rungs() : written.rungs_tokens();
  const std::string lpath = absl::StrCat(path, steps ? ".rungs" : ".rungs_tokens");
  const int line = lines.Line(lpath);
  if (list.empty() || list.size() > 16)
    return SpecError(file, line, lpath, "must be a list of 1 to 16 ascending positive numbers");
  const v1::TrainSpec& t = cell.train();
  const int64_t tokens_per_step = std::max<int64_t>(1, t.has_batch_size() ? t.batch_size() : 1) *
                                  std::max<int64_t>(1, t.has_grad_accum() ? t.grad_accum() : 1) *
                                  std::max<int64_t>(1, t.data().seq_len());
  v1::EarlyStopRule rule;
  if (IsPareto(written)) {
    rule.set_method("pareto");
    for (const v1::EarlyStopObjective& o : written.objectives()) {
      v1::EarlyStopObjective* out = rule.add_objectives();
      out->set_metric(o.metric());
      out->set_mode(o.mode() == "max" ? "max" : "min");
    }
  } else {
    rule.set_metric(written.metric());
    rule.set_mode(written.mode() == "max" ? "max" : "min");
  }
  rule.set_keep(Keep(written));
  if (written.has_min_trials()) rule.set_min_trials(written.min_trials());
  for (int64_t v : list) {
    if (v < 1)
      return SpecError(file, line, lpath,
                       absl::StrCat("'", v, "' must be a positive whole number"));
    // Tokens become the first step whose tokens reach them.
    const int64_t step = steps ? v : (v + tokens_per_step - 1) / tokens_per_step;
    if (!rule.rungs().empty() && step <= rule.rungs(rule.rungs_size() - 1)) {
      return SpecError(
          file, line, lpath,
          steps ? "must ascend" : absl::StrCat("must ascend (", v, " tokens is step ", step, ")"));
    }
    rule.add_rungs(step);
  }
  const int64_t total = t.has_steps() ? t.steps()
                        : t.has_max_tokens()
                            ? (t.max_tokens() + tokens_per_step - 1) / tokens_per_step
                            : 0;
  const int64_t last = rule.rungs(rule.rungs_size() - 1);
  if (total > 0 && last >= total) {
    return SpecError(file, line, lpath,
                     absl::StrCat("rung at step ", last, " is not before the end of training (",
                                  total, " steps) in cell ", cell_name));
  }
  std::vector<std::string> metrics = {rule.metric()};
  for (const v1::EarlyStopObjective& o : rule.objectives()) metrics.push_back(o.metric());
  for (const std::string& m : metrics) {
    if (absl::StartsWith(m, "heldout_loss") && !(t.eval().has_every() && t.eval().every() > 0)) {
      return SpecError(
          file, node.line, absl::StrCat(path, IsPareto(rule) ? ".objectives" : ".metric"),
          absl::StrCat(m, " is reported only with train.eval.every > 0 (in cell ", cell_name, ")"));
    }
  }
  return rule;
}

absl::Status CheckRule(const v1::EarlyStopRule& rule) {
  auto bad = [](const char* field, const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("early_stop_rule.", field, ": ", what));
  };
  if (!rule.method().empty() && rule.method() != "top" && !IsPareto(rule))
    return bad("method", "must be top or pareto");
  if (IsPareto(rule)) {
    if (rule.objectives_size() < 2 || rule.objectives_size() > 8)
      return bad("objectives", "method pareto needs 2 to 8 objectives");
    for (const v1::EarlyStopObjective& o : rule.objectives()) {
      if (!KnownMetric(o.metric()))
        return bad("objectives",
                   "each metric must be loss, heldout_loss or heldout_loss/<dataset>");
      if (!o.mode().empty() && o.mode() != "min" && o.mode() != "max")
        return bad("objectives", "each mode must be min or max");
    }
  } else if (rule.objectives_size() > 0) {
    return bad("objectives", "are for method pareto");
  } else if (!KnownMetric(rule.metric())) {
    return bad("metric", "must be loss, heldout_loss or heldout_loss/<dataset>");
  }
  if (!rule.mode().empty() && rule.mode() != "min" && rule.mode() != "max")
    return bad("mode", "must be min or max");
  if (rule.rungs().empty() || rule.rungs_size() > 16)
    return bad("rungs", "must be 1 to 16 ascending steps");
  for (int i = 0; i < rule.rungs_size(); ++i) {
    if (rule.rungs(i) < 1 || (i > 0 && rule.rungs(i) <= rule.rungs(i - 1)))
      return bad("rungs", "must be 1 to 16 ascending steps");
  }
  if (!rule.rungs_tokens().empty())
    return bad("rungs_tokens", "is for experiment files (a job gives its rungs in steps)");
  if (rule.has_keep() && !(rule.keep() > 0 && rule.keep() < 1))
    return bad("keep", "must be a fraction in (0, 1)");
  if (rule.min_trials() < 0) return bad("min_trials", "must be >= 0");
  return absl::OkStatus();
}

RungDecision DecideAtRung(const v1::EarlyStopRule& rule, const std::vector<double>& recorded,
                          double value) {
  RungDecision d;
  d.trials = static_cast<int>(recorded.size());
  d.rank = 1;
  for (double v : recorded) {
    if (Maximize(rule) ? v > value : v < value) ++d.rank;
  }
  const double keep = Keep(rule);
  const int enough = std::max(static_cast<int>(std::ceil(1.0 / keep - 1e-9)), rule.min_trials());
  if (d.trials < enough) return d;
  d.keep_count = std::max(1, static_cast<int>(std::ceil(keep * d.trials - 1e-9)));
  d.stop = d.rank > d.keep_count;
  return d;
}

std::string StopReason(const v1::EarlyStopRule& rule, int rung_index, int64_t rung_step,
                       double value, const RungDecision& d) {
  return absl::StrCat("stopped early at rung ", rung_index + 1, " (step ", rung_step,
                      "): ", rule.metric(), "=", Number(value), ", not in the top ",
                      Number(Keep(rule)), " of ", d.trials, " (rank ", d.rank, ", ",
                      Maximize(rule) ? "max" : "min", ")");
}

std::vector<int> ParetoFronts(const std::vector<std::vector<double>>& points,
                              const std::vector<bool>& maximize) {
  const size_t n = points.size();
  auto better_or_equal = [&](size_t a, size_t b, size_t k) {
    return maximize[k] ? points[a][k] >= points[b][k] : points[a][k] <= points[b][k];
  };
  auto dominates = [&](size_t a, size_t b) {
    bool strictly = false;
    for (size_t k = 0; k < maximize.size(); ++k) {
      if (!better_or_equal(a, b, k)) return false;
      strictly |= points[a][k] != points[b][k];
    }
    return strictly;
  };
  // NSGA-II's fast non-dominated sort: O(M·n²), n is a rung's trials.
  std::vector<int> front(n, -1), dominated_by(n, 0);
  std::vector<std::vector<size_t>> dominates_list(n);
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      if (a != b && dominates(a, b)) dominates_list[a].push_back(b);
      if (a != b && dominates(b, a)) ++dominated_by[a];
    }
  }
  std::vector<size_t> current;
  for (size_t a = 0; a < n; ++a) {
    if (dominated_by[a] == 0) current.push_back(a);
  }
  for (int f = 0; !current.empty(); ++f) {
    std::vector<size_t> next;
    for (size_t a : current) {
      front[a] = f;
      for (size_t b : dominates_list[a]) {
        if (--dominated_by[b] == 0) next.push_back(b);
      }
    }
    current = std::move(next);
  }
  return front;
}

std::vector<double> CrowdingDistances(const std::vector<std::vector<double>>& points,
                                      const std::vector<int>& members) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> d(members.size(), 0.0);
  if (members.size() <= 2) return std::vector<double>(members.size(), inf);
  const size_t objectives = points[members[0]].size();
  for (size_t k = 0; k < objectives; ++k) {
    std::vector<size_t> order(members.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return points[members[a]][k] < points[members[b]][k];
    });
    const double lo = points[members[order.front()]][k];
    const double hi = points[members[order.back()]][k];
    d[order.front()] = inf;
    d[order.back()] = inf;
    if (!(hi > lo) || !std::isfinite(hi - lo)) continue;
    for (size_t i = 1; i + 1 < order.size(); ++i) {
      d[order[i]] +=
          (points[members[order[i + 1]]][k] - points[members[order[i - 1]]][k]) / (hi - lo);
    }
  }
  return d;
}

RungDecision DecideAtRungPareto(const v1::EarlyStopRule& rule,
                                const std::vector<std::vector<double>>& recorded, size_t self) {
  RungDecision d;
  d.trials = static_cast<int>(recorded.size());
  std::vector<bool> maximize;
  for (const v1::EarlyStopObjective& o : rule.objectives()) maximize.push_back(o.mode() == "max");
  const std::vector<int> front = ParetoFronts(recorded, maximize);
  d.front = front[self];
  std::vector<int> members;
  size_t at = 0;
  for (size_t i = 0; i < recorded.size(); ++i) {
    d.fronts = std::max(d.fronts, front[i] + 1);
    if (front[i] != d.front) continue;
    if (i == self) at = members.size();
    members.push_back(static_cast<int>(i));
  }
  const std::vector<double> crowding = CrowdingDistances(recorded, members);
  d.rank = 1;
  for (size_t i = 0; i < recorded.size(); ++i) d.rank += front[i] < d.front;
  for (double c : crowding) d.rank += c > crowding[at];
  const double keep = Keep(rule);
  const int enough = std::max(static_cast<int>(std::ceil(1.0 / keep - 1e-9)), rule.min_trials());
  if (d.trials < enough) return d;
  d.keep_count = std::max(1, static_cast<int>(std::ceil(keep * d.trials - 1e-9)));
  d.stop = d.rank > d.keep_count;
  return d;
}

std::string ObjectiveValues(const v1::EarlyStopRule& rule, const std::vector<double>& values) {
  std::string out;
  for (int k = 0; k < rule.objectives_size() && k < static_cast<int>(values.size()); ++k)
    absl::StrAppend(&out, k > 0 ? ", " : "", rule.objectives(k).metric(), "=", Number(values[k]));
  return out;
}

std::string StopReasonPareto(const v1::EarlyStopRule& rule, int rung_index, int64_t rung_step,
                             const std::vector<double>& values, const RungDecision& d) {
  return absl::StrCat("stopped early at rung ", rung_index + 1, " (step ", rung_step,
                      "): ", ObjectiveValues(rule, values), " on Pareto front ", d.front + 1,
                      " of ", d.fronts, ", not in the best ", Number(Keep(rule)), " of ", d.trials,
                      " (rank ", d.rank, ")");
}

}  // namespace stemma::experiments
