// MoE routing statistics per language (algorithms.md §4.2–4.4), torch-free: the top-k
// counts come from analyze_model; this file computes usage distributions, router entropy,
// Jensen–Shannon divergence, the language-specialisation score, vocabulary overlap, and the
// activation-gap expert selection (SEFT/SSFT file).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::analyze {

// Routing counts of one language: counts[m][e] = how many (token, chosen expert) pairs of the
// m-th MoE layer went to expert e (each token adds top_k to a layer's total).
struct RoutingCounts {
  int64_t tokens = 0;
  std::vector<std::vector<int64_t>> counts;  // [num MoE layers][num_experts]
};

// q[e] = count[e] / Σ count (Σ = 0 -> divide by 1).
std::vector<double> UsageDistribution(const std::vector<int64_t>& counts);
// −Σ q ln q with 0·ln 0 = 0.
double Entropy(const std::vector<double>& q);
// ½KL(p‖m) + ½KL(q‖m), m = (p+q)/2, natural log; in [0, ln 2]. (scipy's jensenshannon,
// squared.)
double JensenShannon(const std::vector<double>& p, const std::vector<double>& q);
// Normalised information gain of the language given the expert, log2 (§4.3); rows are
// languages, columns experts. 0 when H(L) = 0.
double SpecializationScore(const std::vector<std::vector<int64_t>>& table);
// |A ∩ B| / |A ∪ B|; 0 for two empty sets.
double Jaccard(const std::set<int32_t>& a, const std::set<int32_t>& b);

struct SelectionParams {
  std::vector<int64_t> layers;    // model layer indices (default: the last two MoE layers)
  std::optional<double> alpha;    // minimum activation gap (default DefaultAlpha(E))
  std::vector<int64_t> shared_k;  // default DefaultSharedK(E)
  // The anchors; default every language in neither `parents` nor `targets`.
  std::vector<std::string> high_resource;
  std::map<std::string, std::string> parents;  // low-resource language -> its HR parent
  // Languages without an anchor: each ranked against the anchors by its own routing.
  std::vector<std::string> targets;
  // Seed of the random_ssft_k<K> baselines (as many experts per layer as ssft_k<K>, drawn
  // uniformly without replacement).
  uint64_t random_seed = 0;
};

// The paper's defaults (64 experts: alpha 0.01, shared pools of 1, 3 and 5) scaled to E
// experts: alpha = 0.64 / E (the same gap relative to a uniform share 1/E), and
// round(k·E/64) for k in {1, 3, 5}, within 1..E−1, duplicates dropped (E = 4: [1]).
double DefaultAlpha(int64_t num_experts);
std::vector<int64_t> DefaultSharedK(int64_t num_experts);

struct RoutingInput {
  std::vector<std::string> languages;
  std::vector<RoutingCounts> counts;     // per language
  std::vector<std::set<int32_t>> vocab;  // token ids seen, per language
  std::vector<int64_t> moe_layers;       // model layer index of each counted MoE layer
  int64_t num_experts = 0;
  int64_t top_k = 0;
};

// routing.json: per layer and language the distribution and entropy, the JSD matrix and its
// pairwise mean, the specialisation score, and the vocabulary-overlap matrix.
// InvalidArgument when fewer than two languages are given or a language saw no tokens.
absl::StatusOr<nlohmann::json> RoutingStatsJson(const RoutingInput& input);

// The expert-selection file (algorithms.md §4.4; docs/eval.md):
//   {"_meta": {...}, "shared_experts": {"k5": {"14": [...]}},
//    "<lang>": {"seft": {"14": [...]}, "ssft_k5": {"14": [...]}}}
// with an entry for every anchor (high-resource) language, every language in `parents` and
// every target. Anchors are ranked among the anchors (with a single anchor: among it and
// the targets); a target among the anchors and itself, so it changes no anchor's list.
// InvalidArgument naming the field for a layer that is not an MoE layer, fewer than two
// languages to compare, a parent that is not an anchor, a shared_k of E or more, or a
// language not analysed.
absl::StatusOr<nlohmann::json> ExpertSelectionJson(const RoutingInput& input,
                                                   const SelectionParams& params);

}  // namespace stemma::engine::analyze
