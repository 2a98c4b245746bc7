// LAPE (Language Activation Probability Entropy, Tang et al., ACL 2024): which FFN neurons
// are specific to a language. Torch-free: the counts come from analyze_model (a forward pass
// per language); this file turns them into the selection of algorithms.md §2.2.
//
// Definitions (all exact, §2.2 and §10):
//   P[l,j,k] = over_zero_k[l,j] / n_k           activation probability of neuron (l, j)
//   Q[l,j,k] = P / Σ_k P  (0 where Σ_k P = 0)    normalised over languages
//   H[l,j]   = −Σ_k Q log Q  (natural log, 0·log 0 = 0)
//   τ        = the round(N·filter_rate)-th smallest of all N = L·I·K probabilities (1-indexed)
//   H[l,j]   = +∞ when no language has P > τ (strict)
//   selected = the round(L·I·top_rate) smallest H over the (l, j) grid, ties by (l, j) order
//   bar      = the round(N·activation_bar_ratio)-th smallest probability (τ for the defaults)
//   a selected neuron belongs to every language k with P[l,j,k] > bar; a neuron selected
//   with H = +∞ (quota filler) belongs to none. With `exclusive`, a selected neuron above
//   the bar in two or more languages belongs to none of them (counted in num_shared).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/specs/eval.pb.h"

namespace stemma::engine::analyze {

// The selection's parameters are the spec's `lape` section (stemma.v1.LapeOptions, its
// defaults filled): top_rate, filter_rate, activation_bar_ratio, activation_threshold and
// exclusive are read here.

// Counts of one language: how many tokens were seen and, per neuron, on how many of them it
// was active. over_zero is [L * I], layer-major.
struct LapeCounts {
  int64_t tokens = 0;
  std::vector<int64_t> over_zero;
};

struct LapeResult {
  int64_t num_layers = 0;
  int64_t intermediate_size = 0;
  std::vector<std::string> languages;
  // languages[k] -> per layer, the sorted neuron indices assigned to it.
  std::map<std::string, std::vector<std::vector<int64_t>>> neurons;
  double filter_threshold = 0.0;  // τ
  double activation_bar = 0.0;
  int64_t num_selected = 0;         // round(L·I·top_rate)
  int64_t num_unassigned = 0;       // selected neurons that no language got
  int64_t num_shared = 0;           // exclusive: selected neurons dropped for several languages
  std::vector<double> entropy;      // [L * I], +∞ for filtered neurons
  std::vector<double> raw_entropy;  // [L * I], before the filter (0 for a silent neuron)
  std::vector<double> probability;  // [L * I * K], neuron-major: P[l,j,k]
};

// Errors: InvalidArgument when fewer than two languages are given, a language saw no
// tokens, the count vectors do not have L·I entries, or a rate is outside (0, 1].
absl::StatusOr<LapeResult> IdentifyLapeNeurons(const std::vector<std::string>& languages,
                                               const std::vector<LapeCounts>& counts,
                                               int64_t num_layers, int64_t intermediate_size,
                                               const v1::LapeOptions& params);

// The neuron-mask file (format "stemma.neuron_mask/1", docs/eval.md), read by train's
// neuron-mask strategy: {"format", "num_layers", "intermediate_size", "languages":
// {lang: [[j...] per layer]}, "params": {...}, "counts": {lang: [n per layer]}}, and with
// `keep_profile` "profile": {"tokens": {lang: n}, "probability": {lang: [[P per neuron]
// per layer]}, "entropy": [[H per neuron] per layer]} (H before the filter), enough to
// inspect the selection and to re-select exactly (LapeCountsFromMask).
nlohmann::json NeuronMaskJson(const LapeResult& result, const v1::LapeOptions& params,
                              const std::vector<LapeCounts>& counts, bool keep_profile);

// The counts behind a saved neuron-mask file's profile: over_zero = round(P·tokens), which
// is exact (P was written with full double precision from integer counts). `languages`
// selects and orders them (empty: the file's, sorted). InvalidArgument naming `where` when
// the file has no profile (written with keep_profile false), a language is missing, or the
// shapes disagree.
struct SavedProfile {
  int64_t num_layers = 0;
  int64_t intermediate_size = 0;
  std::vector<std::string> languages;
  std::vector<LapeCounts> counts;
  std::string model;  // params.model of the file, if any
};
absl::StatusOr<SavedProfile> LapeCountsFromMask(const nlohmann::json& mask,
                                                const std::vector<std::string>& languages,
                                                const std::string& where);

// The paper's random baseline: for each language and layer, as many neurons as `result`
// assigned it there, drawn uniformly without replacement from the layer's I neurons
// (SplitMix64 keyed by seed, language and layer), in the same file format with
// params.method "random".
nlohmann::json RandomMaskJson(const LapeResult& result, uint64_t seed);

// The union over `languages` (empty: all) of a stemma.neuron_mask/1 file's neuron lists,
// one sorted list per layer. InvalidArgument naming `where` for another format, a missing
// language or an index outside the layer.
absl::StatusOr<std::vector<std::vector<int64_t>>> MaskUnion(
    const nlohmann::json& mask, const std::vector<std::string>& languages,
    const std::string& where);

// The k-th smallest of `values` with k = round(size·ratio) (round half to even, as Python's
// round), clamped to [1, size]; torch.kthvalue semantics. `values` is reordered.
double KthValueByRatio(std::vector<double>& values, double ratio);

}  // namespace stemma::engine::analyze
