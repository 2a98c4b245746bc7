// Decoder layer ranges, one convention for every engine command (train's freeze and L2-SP,
// revert, interpolate, analyze): half-open like Python slices.
//
//   "9:28"   layers 9..27        "7"      layer 7 alone
//   "9:"     9 to the last       ":9"     0..8
//   "middle" the middle block: for L layers, [round(9·L/34), L − round(6·L/34)), the rule of
//            the family-expert paper's 34-layer model (first 9 and last 6 layers outside it)
//            scaled to L. 34 layers → 9:28; 8 → 2:7; 16 → 4:13; 32 → 8:26.
//
// Torch-free: the CLI and the coordinator check ranges against a model's config.json with
// the same code the engine uses.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace stemma {

struct LayerRange {
  int64_t begin = 0;    // -1: from layer 0 (":b")
  int64_t end = -1;     // -1: through the last layer ("a:")
  bool middle = false;  // "middle": resolved with the model's layer count
  std::string text;     // as written, for errors and events
};

// Parses one range. InvalidArgument "<where>: ..." for anything else (negative numbers,
// "5:3", "a:b:c", words other than middle).
absl::StatusOr<LayerRange> ParseLayerRange(std::string_view text, std::string_view where);

// The middle block [begin, end) of a model with `num_layers` layers (see above).
LayerRange MiddleLayers(int64_t num_layers);

// The concrete [begin, end) within `num_layers` layers; InvalidArgument naming `where` and
// the model's layer count for an empty range or one past the last layer.
absl::StatusOr<LayerRange> ResolveLayerRange(const LayerRange& range, int64_t num_layers,
                                             std::string_view where);

// "2:7" (the resolved half-open form).
std::string FormatLayerRange(const LayerRange& range);

}  // namespace stemma
