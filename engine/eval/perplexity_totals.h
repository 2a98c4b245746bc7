// What perplexity and bits per byte are computed from: a task's summed NLL, predicted tokens
// and document bytes (engine/eval/perplexity.h makes them; the per-task cache stores them so
// that `bpb/all` over served and computed tasks equals a cold run's). Header-only, torch-free.
#pragma once

#include <cmath>
#include <cstdint>

namespace stemma::engine::eval {

struct PerplexityTotals {
  double nll = 0;      // natural log, summed over predicted tokens
  int64_t tokens = 0;  // predicted tokens
  int64_t bytes = 0;   // DocumentBytes
  double Perplexity() const { return std::exp(nll / static_cast<double>(tokens)); }
  double BitsPerByte() const { return nll / (std::log(2.0) * static_cast<double>(bytes)); }
};

}  // namespace stemma::engine::eval
