// Search over a stage's matrix: the axes a `matrix:` gives (lists of values and
// distributions) and the cells a grid or a seeded random search makes of them. Pure: no
// store, no clock, no files.
//
//   matrix:
//     search: {method: random, seed: 7, samples: 8}   # or: search: grid (the default)
//     lr: {loguniform: [1e-5, 1e-3]}                    # uniform, loguniform, int, choice
//     warmup: [0, 100]                                  # a list is a choice
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/yaml_json.h"

namespace stemma::experiments {

// A cell's matrix coordinates: axis → value, in matrix order.
using Coords = std::vector<std::pair<std::string, std::string>>;

// The most cells a random search draws, and the most values a grid enumerates of an int axis.
inline constexpr int64_t kMaxSamples = 10000;

struct Search {
  bool random = false;
  uint64_t seed = 0;
  int64_t samples = 0;
  int line = 0;
};

struct Axis {
  enum Dist { kList, kUniform, kLogUniform, kInt };
  std::string name;
  int line = 0;
  Dist dist = kList;
  std::vector<std::string> values;  // kList (and choice)
  double lo = 0, hi = 0;            // kUniform, kLogUniform
  int64_t ilo = 0, ihi = 0;         // kInt (inclusive)
};

// Errors are InvalidArgument "<file>: line L: <path>: <problem>".
// `search:` of a matrix at `path`: a method name, or {method, seed, samples}.
absl::Status ReadSearch(const YamlNode& n, std::string_view file, const std::string& path,
                        Search* search);
// A distribution axis: {uniform: [lo, hi]}, {loguniform: [lo, hi]}, {int: [lo, hi]} or
// {choice: [a, b, ...]}.
absl::StatusOr<Axis> ReadDistribution(const YamlNode& n, std::string_view file,
                                      const std::string& path);
// A list axis from its values (written at `line`): one or more scalars without ',', '[', ']'
// or '=' (they name cells).
absl::StatusOr<Axis> ListAxis(const std::vector<YamlNode>& items, int line, std::string_view file,
                              const std::string& path);

// The product of the axes, first axis outermost. Only lists, choices and integer ranges
// can be enumerated. No axes: no cells.
absl::StatusOr<std::vector<Coords>> Grid(const std::vector<Axis>& axes, std::string_view file,
                                         const std::string& mpath);

// `search.samples` cells, each axis drawn independently in matrix order from a 64-bit
// Mersenne Twister seeded with `search.seed` (the same file always draws the same cells).
std::vector<Coords> Sample(const std::vector<Axis>& axes, const Search& search);

// The value of `axis` in `c`; Has() says whether it has one.
bool Has(const Coords& c, const std::string& axis);
std::string Get(const Coords& c, const std::string& axis);  // "\x01" (matches no value) if absent

}  // namespace stemma::experiments
