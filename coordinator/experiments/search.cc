#include "coordinator/experiments/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/proto_yaml.h"
#include "common/status.h"

namespace stemma::experiments {
namespace {

// A real drawn in [lo, hi] as the shortest text (3 significant digits, more only when the
// rounding would leave the range): the text is both the cell's name and the spec's value,
// so a trial is what its name says.
std::string ShortReal(double v, double lo, double hi) {
  char buf[64];
  for (int digits = 3; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    double back = 0;
    if (absl::SimpleAtod(buf, &back) && back >= lo && back <= hi) break;
  }
  return buf;
}

// One value of a list or choice axis: a scalar that can be part of a cell's name.
absl::Status CheckValue(const YamlNode& v, std::string_view file, const std::string& path) {
  if (!v.IsScalar()) return SpecError(file, v.line, path, "values must be scalars");
  if (v.scalar.find_first_of(",[]=") != std::string::npos) {
    return SpecError(file, v.line, path,
                     absl::StrCat("value '", v.scalar, "' may not hold ',', '[', ']' or '='"));
  }
  return absl::OkStatus();
}

// The seed and samples of a random search (`n` is the {method: random, ...} mapping).
absl::Status ReadRandom(const YamlNode& n, std::string_view file, const std::string& path,
                        Search* search) {
  const YamlNode* seed = n.IsMap() ? n.Find("seed") : nullptr;
  const YamlNode* samples = n.IsMap() ? n.Find("samples") : nullptr;
  if (seed == nullptr) {
    return SpecError(
        file, n.line, absl::StrCat(path, ".seed"),
        "a random search needs a seed: a seedless random sweep would draw other trials on every "
        "submission and never be memoized");
  }
  if (!seed->IsScalar() || !absl::SimpleAtoi(seed->scalar, &search->seed)) {
    return SpecError(file, seed->line, absl::StrCat(path, ".seed"),
                     "must be a non-negative integer");
  }
  if (samples == nullptr) {
    return SpecError(file, n.line, absl::StrCat(path, ".samples"),
                     "is required: how many trials to draw");
  }
  if (!samples->IsScalar() || !absl::SimpleAtoi(samples->scalar, &search->samples) ||
      search->samples < 1 || search->samples > kMaxSamples) {
    return SpecError(
        file, samples->line, absl::StrCat(path, ".samples"),
        absl::StrCat("'", samples->scalar, "' must be a whole number in 1..", kMaxSamples));
  }
  return absl::OkStatus();
}

// [lo, hi] of a uniform, loguniform or int distribution.
absl::StatusOr<Axis> ReadRange(const std::string& kind, const YamlNode& args, std::string_view file,
                               const std::string& dpath) {
  Axis a;
  if (args.items.size() != 2 || !args.items[0].IsScalar() || !args.items[1].IsScalar()) {
    return SpecError(file, args.line, dpath, "must be [lo, hi]");
  }
  const std::string& lo = args.items[0].scalar;
  const std::string& hi = args.items[1].scalar;
  if (kind == "int") {
    a.dist = Axis::kInt;
    if (!absl::SimpleAtoi(lo, &a.ilo) || !absl::SimpleAtoi(hi, &a.ihi)) {
      return SpecError(file, args.line, dpath,
                       absl::StrCat("[", lo, ", ", hi, "] must be whole numbers"));
    }
    if (a.ilo > a.ihi)
      return SpecError(file, args.line, dpath, absl::StrCat("lo ", lo, " is above hi ", hi));
    if (a.ihi - a.ilo > (int64_t{1} << 52))
      return SpecError(file, args.line, dpath, "the range is too wide (at most 2^52 values)");
    return a;
  }
  a.dist = kind == "uniform" ? Axis::kUniform : Axis::kLogUniform;
  if (!absl::SimpleAtod(lo, &a.lo) || !absl::SimpleAtod(hi, &a.hi) || !std::isfinite(a.lo) ||
      !std::isfinite(a.hi)) {
    return SpecError(file, args.line, dpath, absl::StrCat("[", lo, ", ", hi, "] must be numbers"));
  }
  if (a.lo > a.hi)
    return SpecError(file, args.line, dpath, absl::StrCat("lo ", lo, " is above hi ", hi));
  if (a.dist == Axis::kLogUniform && a.lo <= 0) {
    return SpecError(
        file, args.line, dpath,
        absl::StrCat("lo ", lo, " must be > 0 (a log-uniform range is over positive numbers)"));
  }
  return a;
}

}  // namespace

absl::Status ReadSearch(const YamlNode& n, std::string_view file, const std::string& path,
                        Search* search) {
  search->line = n.line;
  const YamlNode* method = &n;
  if (n.IsMap()) {
    method = n.Find("method");
    for (size_t k = 0; k + 1 < n.items.size(); k += 2) {
      const std::string& key = n.items[k].scalar;
      if (key != "method" && key != "seed" && key != "samples") {
        return SpecError(file, n.items[k].line, absl::StrCat(path, ".", key),
                         "unknown field (allowed: method, seed, samples)");
      }
    }
    if (method == nullptr) {
      return SpecError(file, n.line, absl::StrCat(path, ".method"), "is required: grid or random");
    }
  }
  if (!method->IsScalar() || (method->scalar != "grid" && method->scalar != "random")) {
    return SpecError(file, method->line, n.IsMap() ? absl::StrCat(path, ".method") : path,
                     absl::StrCat("'", method->IsScalar() ? method->scalar : "",
                                  "' is not a search (use grid or random)"));
  }
  search->random = method->scalar == "random";
  if (search->random) return ReadRandom(n, file, path, search);
  if (const YamlNode* seed = n.IsMap() ? n.Find("seed") : nullptr) {
    return SpecError(file, seed->line, absl::StrCat(path, ".seed"),
                     "is for search method random (a grid has no randomness)");
  }
  if (const YamlNode* samples = n.IsMap() ? n.Find("samples") : nullptr) {
    return SpecError(file, samples->line, absl::StrCat(path, ".samples"),
                     "is for search method random (a grid runs every cell)");
  }
  return absl::OkStatus();
}

absl::StatusOr<Axis> ReadDistribution(const YamlNode& n, std::string_view file,
                                      const std::string& path) {
  if (n.size() != 1) {
    return SpecError(file, n.line, path,
                     "a distribution is one of {uniform: [lo, hi]}, {loguniform: [lo, hi]}, "
                     "{int: [lo, hi]}, {choice: [a, b, ...]}");
  }
  const std::string& kind = n.items[0].scalar;
  const YamlNode& args = n.items[1];
  const std::string dpath = absl::StrCat(path, ".", kind);
  if (kind != "uniform" && kind != "loguniform" && kind != "int" && kind != "choice") {
    return SpecError(
        file, n.items[0].line, dpath,
        absl::StrCat("unknown distribution '", kind, "' (use uniform, loguniform, int or choice)"));
  }
  if (!args.IsSequence()) {
    return SpecError(file, args.line, dpath,
                     kind == "choice" ? "must be a list of values" : "must be [lo, hi]");
  }
  if (kind != "choice") return ReadRange(kind, args, file, dpath);
  if (args.items.empty())
    return SpecError(file, args.line, dpath, "is empty: the matrix would have no cells");
  Axis a;
  a.dist = Axis::kList;
  for (const YamlNode& v : args.items) {
    RETURN_IF_ERROR(CheckValue(v, file, dpath));
    a.values.push_back(v.scalar);
  }
  return a;
}

absl::StatusOr<Axis> ListAxis(const std::vector<YamlNode>& items, int line, std::string_view file,
                              const std::string& path) {
  if (items.empty()) return SpecError(file, line, path, "is empty: the matrix would have no cells");
  Axis a;
  a.dist = Axis::kList;
  for (const YamlNode& v : items) {
    RETURN_IF_ERROR(CheckValue(v, file, path));
    a.values.push_back(v.scalar);
  }
  return a;
}

absl::StatusOr<std::vector<Coords>> Grid(const std::vector<Axis>& axes, std::string_view file,
                                         const std::string& mpath) {
  std::vector<Coords> cells = {{}};
  for (const Axis& a : axes) {
    std::vector<std::string> values = a.values;
    if (a.dist == Axis::kUniform || a.dist == Axis::kLogUniform) {
      return SpecError(
          file, a.line, absl::StrCat(mpath, ".", a.name),
          absl::StrCat(
              a.dist == Axis::kUniform ? "uniform" : "loguniform",
              " is a distribution to sample: set search: {method: random, seed: N, samples: N}, "
              "or give a list of values"));
    }
    if (a.dist == Axis::kInt) {
      if (a.ihi - a.ilo >= kMaxSamples) {
        return SpecError(file, a.line, absl::StrCat(mpath, ".", a.name),
                         absl::StrCat("a grid over int [", a.ilo, ", ", a.ihi,
                                      "] would have more than ", kMaxSamples, " values"));
      }
      for (int64_t v = a.ilo; v <= a.ihi; ++v) values.push_back(absl::StrCat(v));
    }
    std::vector<Coords> next;
    for (const Coords& c : cells) {
      for (const std::string& v : values) {
        Coords d = c;
        d.emplace_back(a.name, v);
        next.push_back(std::move(d));
      }
    }
    cells = std::move(next);
    if (cells.size() > 100000)
      return SpecError(file, a.line, mpath, "the grid has more than 100000 cells");
  }
  if (axes.empty()) cells.clear();
  return cells;
}

std::vector<Coords> Sample(const std::vector<Axis>& axes, const Search& search) {
  std::mt19937_64 rng(search.seed);
  // 53 random bits as a real in [0, 1): the same on every platform (std's distributions
  // are not specified bit for bit).
  auto unit = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  auto index = [&](uint64_t n) {
    return std::min<uint64_t>(n - 1, static_cast<uint64_t>(unit() * static_cast<double>(n)));
  };
  std::vector<Coords> cells;
  for (int64_t i = 0; i < search.samples; ++i) {
    Coords c;
    for (const Axis& a : axes) {
      switch (a.dist) {
        case Axis::kList:
          c.emplace_back(a.name, a.values[index(a.values.size())]);
          break;
        case Axis::kInt:
          c.emplace_back(
              a.name, absl::StrCat(a.ilo + static_cast<int64_t>(
                                               index(static_cast<uint64_t>(a.ihi - a.ilo) + 1))));
          break;
        case Axis::kUniform:
          c.emplace_back(a.name, ShortReal(a.lo + unit() * (a.hi - a.lo), a.lo, a.hi));
          break;
        case Axis::kLogUniform: {
          const double l = std::log(a.lo), h = std::log(a.hi);
          c.emplace_back(a.name, ShortReal(std::clamp(std::exp(l + unit() * (h - l)), a.lo, a.hi),
                                           a.lo, a.hi));
          break;
        }
      }
    }
    cells.push_back(std::move(c));
  }
  return cells;
}

bool Has(const Coords& c, const std::string& axis) {
  for (const auto& [a, v] : c) {
    if (a == axis) return true;
  }
  return false;
}

std::string Get(const Coords& c, const std::string& axis) {
  for (const auto& [a, v] : c) {
    if (a == axis) return v;
  }
  return "\x01";  // matches no value
}

}  // namespace stemma::experiments
