#include "common/layer_range.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stemma {
namespace {

bool ParseBound(std::string_view text, int64_t* out) {
  if (text.empty() || text.size() > 9) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return absl::SimpleAtoi(std::string(text), out);
}

}  // namespace

absl::StatusOr<LayerRange> ParseLayerRange(std::string_view text, std::string_view where) {
  LayerRange range;
  range.text = std::string(text);
  const std::string w(where);
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat(
        w, ": '", range.text, "' is not a layer range (", why,
        "; ranges are half-open: \"2:6\" is layers 2..5, \"7\" layer 7, \"9:\" to the last, "
        "\":9\" from 0, or \"middle\")"));
  };
  if (text == "middle") {
    range.middle = true;
    return range;
  }
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) {
    if (!ParseBound(text, &range.begin)) return bad("not a layer number");
    range.end = range.begin + 1;
    return range;
  }
  std::string_view left = text.substr(0, colon), right = text.substr(colon + 1);
  if (right.find(':') != std::string_view::npos) return bad("more than one ':'");
  if (left.empty() && right.empty()) return bad("give at least one bound");
  range.begin = -1;
  range.end = -1;
  if (!left.empty() && !ParseBound(left, &range.begin))
    return bad("the start is not a layer number");
  if (!right.empty() && !ParseBound(right, &range.end)) return bad("the end is not a layer number");
  if (range.begin >= 0 && range.end >= 0 && range.end <= range.begin) return bad("it is empty");
  return range;
}

LayerRange MiddleLayers(int64_t num_layers) {
  LayerRange range;
  range.begin = std::llround(9.0 * static_cast<double>(num_layers) / 34.0);
  range.end = num_layers - std::llround(6.0 * static_cast<double>(num_layers) / 34.0);
  if (range.end <= range.begin) {  // very shallow models: the one layer in the middle
    range.begin = num_layers / 2;
    range.end = range.begin + 1;
  }
  range.text = "middle";
  return range;
}

absl::StatusOr<LayerRange> ResolveLayerRange(const LayerRange& range, int64_t num_layers,
                                             std::string_view where) {
  const std::string w(where);
  if (num_layers <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(w, ": the model has no layers"));
  }
  LayerRange out = range.middle ? MiddleLayers(num_layers) : range;
  out.text = range.text;
  out.middle = false;
  if (out.begin < 0) out.begin = 0;
  if (out.end < 0) out.end = num_layers;
  if (out.begin >= num_layers || out.end > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(w, ": layers '", range.text,
                                                   "' reach past the model's ", num_layers,
                                                   " layers (0..", num_layers - 1, ")"));
  }
  if (out.end <= out.begin) {
    return absl::InvalidArgumentError(absl::StrCat(w, ": layers '", range.text, "' are empty"));
  }
  return out;
}

std::string FormatLayerRange(const LayerRange& range) {
  if (range.middle) return "middle";
  std::string out;
  if (range.begin >= 0 && range.end == range.begin + 1) return absl::StrCat(range.begin);
  if (range.begin >= 0) absl::StrAppend(&out, range.begin);
  out += ':';
  if (range.end >= 0) absl::StrAppend(&out, range.end);
  return out;
}

}  // namespace stemma
