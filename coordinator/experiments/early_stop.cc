#include "coordinator/experiments/early_stop.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace stemma::experiments {
namespace {

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

std::string FormatEarlyStop(const EarlyStopConfig& c) {
  return absl::StrCat(c.metric, "|", c.maximize ? "max" : "min", "|", absl::StrJoin(c.rungs, ","),
                      "|", Number(c.keep), "|", c.min_trials);
}

absl::StatusOr<EarlyStopConfig> ParseEarlyStop(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, '|');
  EarlyStopConfig c;
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("early-stop label '", text, "' does not parse"));
  };
  if (parts.size() != 5 || parts[0].empty() || (parts[1] != "min" && parts[1] != "max"))
    return bad();
  c.metric = parts[0];
  c.maximize = parts[1] == "max";
  for (absl::string_view r : absl::StrSplit(parts[2], ',', absl::SkipEmpty())) {
    int64_t step = 0;
    if (!absl::SimpleAtoi(r, &step) || step < 1) return bad();
    c.rungs.push_back(step);
  }
  if (c.rungs.empty() || !absl::SimpleAtod(parts[3], &c.keep) || !(c.keep > 0 && c.keep < 1) ||
      !absl::SimpleAtoi(parts[4], &c.min_trials) || c.min_trials < 0) {
    return bad();
  }
  return c;
}

RungDecision DecideAtRung(const EarlyStopConfig& config, const std::vector<double>& recorded,
                          double value) {
  RungDecision d;
  d.trials = static_cast<int>(recorded.size());
  d.rank = 1;
  for (double v : recorded) {
    if (config.maximize ? v > value : v < value) ++d.rank;
  }
  const int enough =
      std::max(static_cast<int>(std::ceil(1.0 / config.keep - 1e-9)), config.min_trials);
  if (d.trials < enough) return d;
  d.keep_count = std::max(1, static_cast<int>(std::ceil(config.keep * d.trials - 1e-9)));
  d.stop = d.rank > d.keep_count;
  return d;
}

std::string StopReason(const EarlyStopConfig& config, int rung_index, int64_t rung_step,
                       double value, const RungDecision& d) {
  return absl::StrCat("stopped early at rung ", rung_index + 1, " (step ", rung_step,
                      "): ", config.metric, "=", Number(value), ", not in the top ",
                      Number(config.keep), " of ", d.trials, " (rank ", d.rank, ", ",
                      config.maximize ? "max" : "min", ")");
}

}  // namespace stemma::experiments
