// Cross-field rules of the merge-area engine specs (common/spec_checks.h): merge, revert,
// interpolate, graft, upcycle (docs/merge.md). What needs the checkpoints' contents
// (tensor names, shapes, configs) is checked by the engine at start.
#include <cmath>
#include <cstring>
#include <regex>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/spec_checks.h"
#include "common/status.h"

namespace stemma::spec_checks {

// "5GB", "500MB", "2GiB", "5000000000" (bytes) -> bytes; InvalidArgument otherwise. Also
// used by the engine (engine/merge/merge_plan.cc), so the two read shard_size alike.
absl::StatusOr<uint64_t> ParseShardSize(std::string_view text) {
  const std::string s = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(std::string(text)));
  const std::pair<const char*, uint64_t> units[] = {
      {"GIB", 1ull << 30}, {"MIB", 1ull << 20}, {"KIB", 1ull << 10}, {"GB", 1000000000ull},
      {"MB", 1000000ull},  {"KB", 1000ull},     {"B", 1ull},         {"", 1ull}};
  for (const auto& [suffix, scale] : units) {
    if (!absl::EndsWith(s, suffix)) continue;
    double n = 0;
    const std::string number = s.substr(0, s.size() - std::strlen(suffix));
    if (!number.empty() && absl::SimpleAtod(number, &n) && std::isfinite(n) && n >= 1 &&
        n * static_cast<double>(scale) < 1.8e19) {
      return static_cast<uint64_t>(n * static_cast<double>(scale));
    }
    break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", std::string(text), "' is not a byte count (e.g. 5GB, 500MB, 2GiB or 5000000000)"));
}

namespace {

// The checks see the spec with the schema's defaults filled in, so they answer alike at
// submit and in the coordinator (defaults not filled yet) and in the engine (filled).
template <typename T>
T WithDefaults(const T& spec) {
  T copy = spec;
  FillSpecDefaults(&copy);
  return copy;
}

absl::Status CheckShardSize(const std::string& value, const SpecChecker& checker) {
  absl::StatusOr<uint64_t> bytes = ParseShardSize(value);
  if (!bytes.ok()) return checker.Error("shard_size", std::string(bytes.status().message()));
  return absl::OkStatus();
}

absl::Status CheckPattern(const std::string& field, const std::string& pattern,
                          const SpecChecker& checker) {
  if (pattern.empty())
    return checker.Error(field, "is empty (leave it out to select every tensor)");
  try {
    std::regex check(pattern);
  } catch (const std::regex_error& e) {
    return checker.Error(
        field, absl::StrCat("'", pattern, "' is not a valid regular expression: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Check(const v1::MergeSpec& written, const SpecChecker& checker) {
  const v1::MergeSpec spec = WithDefaults(written);
  RETURN_IF_ERROR(CheckShardSize(spec.shard_size(), checker));
  const std::string& method = spec.method();
  const bool linear = method == "linear";
  const bool sparsifies = method == "ties" || method == "dare_linear" || method == "dare_ties";
  if (linear) {
    if (!spec.base().empty())
      return checker.Error("base", "linear does not use a base (use task_arithmetic)");
    if (spec.has_lambda()) return checker.Error("lambda", "does not apply to method linear");
    if (spec.has_rescale()) return checker.Error("rescale", "does not apply to method linear");
    if (spec.has_seed()) return checker.Error("seed", "does not apply to method linear");
  } else if (spec.base().empty()) {
    return checker.Error("base", absl::StrCat("is required by method ", method));
  }
  double weight_sum = 0;
  for (int i = 0; i < spec.models_size(); ++i) {
    const v1::MergeModel& m = spec.models(i);
    if (m.has_density() && !sparsifies) {
      return checker.Error(
          absl::StrCat("models[", i, "].density"),
          absl::StrCat("method ", method,
                       " does not sparsify (only ties, dare_linear and dare_ties)"));
    }
    weight_sum += m.weight();
  }
  const bool normalize = spec.has_normalize() ? spec.normalize() : (linear || method == "ties");
  if (linear && normalize && !(weight_sum > 1e-8)) {
    return checker.Error("models", absl::StrCat("the weights sum to ", weight_sum,
                                                "; a normalised average needs a positive sum"));
  }
  return absl::OkStatus();
}

absl::Status Check(const v1::RevertSpec& written, const SpecChecker& checker) {
  const v1::RevertSpec spec = WithDefaults(written);
  RETURN_IF_ERROR(CheckShardSize(spec.shard_size(), checker));
  if (spec.has_pattern()) RETURN_IF_ERROR(CheckPattern("pattern", spec.pattern(), checker));
  return absl::OkStatus();
}

absl::Status Check(const v1::InterpolateSpec& written, const SpecChecker& checker) {
  const v1::InterpolateSpec spec = WithDefaults(written);
  RETURN_IF_ERROR(CheckShardSize(spec.shard_size(), checker));
  const int forms = spec.has_alpha() + (spec.alphas_size() > 0) + (spec.ranges_size() > 0);
  if (forms != 1) {
    return checker.Error(
        spec.has_alpha()         ? "alpha"
        : spec.alphas_size() > 0 ? "alphas"
                                 : "ranges",
        "give exactly one of alpha (one checkpoint), alphas (a sweep) or ranges (per-range alpha)");
  }
  if (spec.has_pattern()) RETURN_IF_ERROR(CheckPattern("pattern", spec.pattern(), checker));
  if (spec.ranges_size() > 0) {
    if (spec.layers_size() > 0 || spec.modules_size() > 0 || spec.has_pattern()) {
      return checker.Error(spec.layers_size() > 0    ? "layers"
                           : spec.modules_size() > 0 ? "modules"
                                                     : "pattern",
                           "with ranges, each range carries its own layers/modules/pattern");
    }
    for (int i = 0; i < spec.ranges_size(); ++i) {
      const v1::InterpolateRange& r = spec.ranges(i);
      if (r.has_pattern())
        RETURN_IF_ERROR(
            CheckPattern(absl::StrCat("ranges[", i, "].pattern"), r.pattern(), checker));
    }
  }
  if (spec.alphas_size() > 0) {
    if (!spec.out().empty())
      return checker.Error("out", "a sweep writes one checkpoint per alpha: use out_pattern");
    if (spec.out_pattern().empty())
      return checker.Error("out_pattern", "is required with alphas (e.g. /ckpt/interp-{alpha})");
    if (!absl::StrContains(spec.out_pattern(), "{alpha}"))
      return checker.Error("out_pattern", "must contain {alpha}");
    std::set<std::string> seen;
    for (int i = 0; i < spec.alphas_size(); ++i) {
      if (!seen.insert(absl::StrCat(spec.alphas(i))).second) {
        return checker.Error(absl::StrCat("alphas[", i, "]"),
                             absl::StrCat("repeats ", spec.alphas(i)));
      }
    }
  } else {
    if (!spec.out_pattern().empty())
      return checker.Error("out_pattern", "is for a sweep (alphas); use out");
    if (spec.out().empty()) return checker.Error("out", "is required");
  }
  return absl::OkStatus();
}

absl::Status Check(const v1::GraftSpec& written, const SpecChecker& checker) {
  const v1::GraftSpec spec = WithDefaults(written);
  return CheckShardSize(spec.shard_size(), checker);
}

absl::Status Check(const v1::UpcycleSpec& written, const SpecChecker& checker) {
  const v1::UpcycleSpec spec = WithDefaults(written);
  RETURN_IF_ERROR(CheckShardSize(spec.shard_size(), checker));
  if (spec.top_k() > spec.experts()) {
    return checker.Error(
        "top_k", absl::StrCat(spec.top_k(), " is more than experts (", spec.experts(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace stemma::spec_checks
