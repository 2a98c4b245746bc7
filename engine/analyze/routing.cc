#include "engine/analyze/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace stemma::engine::analyze {
namespace {

using nlohmann::json;

double KlTerm(double p, double m) { return p > 0.0 ? p * std::log(p / m) : 0.0; }

double Entropy2(const std::vector<double>& q) {
  double h = 0.0;
  for (double v : q) {
    if (v > 0.0) h -= v * std::log2(v);
  }
  return h;
}

absl::Status CheckInput(const RoutingInput& input) {
  if (input.languages.size() < 2) {
    return absl::InvalidArgumentError(
        "routing: needs at least two languages (divergence and overlap compare languages)");
  }
  for (size_t k = 0; k < input.languages.size(); ++k) {
    if (input.counts[k].tokens <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("routing: language '", input.languages[k], "' has no tokens"));
    }
  }
  return absl::OkStatus();
}

// Index of `layer` among the counted MoE layers, or -1.
int64_t MoeIndex(const RoutingInput& input, int64_t layer) {
  auto it = std::find(input.moe_layers.begin(), input.moe_layers.end(), layer);
  return it == input.moe_layers.end() ? -1 : it - input.moe_layers.begin();
}

int64_t LanguageIndex(const RoutingInput& input, const std::string& lang) {
  auto it = std::find(input.languages.begin(), input.languages.end(), lang);
  return it == input.languages.end() ? -1 : it - input.languages.begin();
}

}  // namespace

std::vector<double> UsageDistribution(const std::vector<int64_t>& counts) {
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const double denom = total > 0 ? static_cast<double>(total) : 1.0;
  std::vector<double> q(counts.size());
  for (size_t e = 0; e < counts.size(); ++e) q[e] = static_cast<double>(counts[e]) / denom;
  return q;
}

double Entropy(const std::vector<double>& q) {
  double h = 0.0;
  for (double v : q) {
    if (v > 0.0) h -= v * std::log(v);
  }
  return h;
}

double JensenShannon(const std::vector<double>& p, const std::vector<double>& q) {
  double js = 0.0;
  for (size_t e = 0; e < p.size(); ++e) {
    const double m = 0.5 * (p[e] + q[e]);
    js += 0.5 * KlTerm(p[e], m) + 0.5 * KlTerm(q[e], m);
  }
  return std::max(js, 0.0);  // rounding can leave -1e-17 for identical inputs
}

double SpecializationScore(const std::vector<std::vector<int64_t>>& table) {
  const size_t langs = table.size(), experts = langs ? table[0].size() : 0;
  double total = 0.0;
  std::vector<double> row(langs, 0.0), col(experts, 0.0);
  for (size_t l = 0; l < langs; ++l) {
    for (size_t e = 0; e < experts; ++e) {
      row[l] += table[l][e];
      col[e] += table[l][e];
      total += table[l][e];
    }
  }
  if (total == 0.0) return 0.0;
  std::vector<double> p_lang(langs);
  for (size_t l = 0; l < langs; ++l) p_lang[l] = row[l] / total;
  const double h_lang = Entropy2(p_lang);
  if (h_lang == 0.0) return 0.0;
  double conditional = 0.0;  // Σ_e p(e)·H(L | E = e)
  for (size_t e = 0; e < experts; ++e) {
    if (col[e] == 0.0) continue;
    std::vector<double> p_given(langs);
    for (size_t l = 0; l < langs; ++l) p_given[l] = table[l][e] / col[e];
    conditional += (col[e] / total) * Entropy2(p_given);
  }
  return (h_lang - conditional) / h_lang;
}

double Jaccard(const std::set<int32_t>& a, const std::set<int32_t>& b) {
  size_t common = 0;
  for (int32_t id : a) common += b.count(id);
  const size_t uni = a.size() + b.size() - common;
  return uni == 0 ? 0.0 : static_cast<double>(common) / static_cast<double>(uni);
}

absl::StatusOr<json> RoutingStatsJson(const RoutingInput& input) {
  if (absl::Status s = CheckInput(input); !s.ok()) return s;
  const size_t num_langs = input.languages.size();
  json tokens = json::object(), layers = json::array(), entropy_mean = json::object();
  std::vector<double> entropy_sum(num_langs, 0.0);
  for (size_t k = 0; k < num_langs; ++k) tokens[input.languages[k]] = input.counts[k].tokens;

  for (size_t m = 0; m < input.moe_layers.size(); ++m) {
    json usage = json::object(), counts = json::object(), entropy = json::object();
    std::vector<std::vector<double>> dist(num_langs);
    std::vector<std::vector<int64_t>> table(num_langs);
    for (size_t k = 0; k < num_langs; ++k) {
      const std::string& lang = input.languages[k];
      table[k] = input.counts[k].counts[m];
      dist[k] = UsageDistribution(table[k]);
      const double h = Entropy(dist[k]);
      entropy_sum[k] += h;
      usage[lang] = dist[k];
      counts[lang] = table[k];
      entropy[lang] = h;
    }
    json jsd = json::array();
    double pair_sum = 0.0;
    for (size_t a = 0; a < num_langs; ++a) {
      json row = json::array();
      for (size_t b = 0; b < num_langs; ++b) {
        const double d = a == b ? 0.0 : JensenShannon(dist[a], dist[b]);
        row.push_back(d);
        if (a < b) pair_sum += d;
      }
      jsd.push_back(row);
    }
    const double pairs = static_cast<double>(num_langs * (num_langs - 1) / 2);
    layers.push_back({{"layer", input.moe_layers[m]},
                      {"counts", counts},
                      {"usage", usage},
                      {"entropy", entropy},
                      {"jsd", jsd},
                      {"mean_jsd", pair_sum / pairs},
                      {"specialization", SpecializationScore(table)}});
  }
  for (size_t k = 0; k < num_langs; ++k) {
    entropy_mean[input.languages[k]] =
        input.moe_layers.empty() ? 0.0 : entropy_sum[k] / input.moe_layers.size();
  }
  json overlap = json::array();
  for (size_t a = 0; a < num_langs; ++a) {
    json row = json::array();
    for (size_t b = 0; b < num_langs; ++b) row.push_back(Jaccard(input.vocab[a], input.vocab[b]));
    overlap.push_back(row);
  }
  return json{{"format", "stemma.routing/1"},
              {"languages", input.languages},
              {"num_experts", input.num_experts},
              {"top_k", input.top_k},
              {"tokens", tokens},
              {"layers", layers},
              {"entropy_mean", entropy_mean},
              {"vocab_overlap", overlap},
              {"definitions",
               {{"usage", "top-k counts of the layer normalised to sum 1"},
                {"entropy", "-sum q ln q (nats)"},
                {"jsd", "0.5 KL(p||m) + 0.5 KL(q||m), m = (p+q)/2, nats, in [0, ln 2]"},
                {"specialization", "normalised information gain of language given expert, log2"},
                {"vocab_overlap", "Jaccard |Va & Vb| / |Va | Vb| of the token ids seen"}}}};
}

double DefaultAlpha(int64_t num_experts) {
  return num_experts > 0 ? 0.64 / static_cast<double>(num_experts) : 0.01;
}

std::vector<int64_t> DefaultSharedK(int64_t num_experts) {
  std::vector<int64_t> out;
  if (num_experts < 2) return out;
  for (int64_t k : {1, 3, 5}) {
    int64_t scaled =
        static_cast<int64_t>(std::nearbyint(static_cast<double>(k * num_experts) / 64.0));
    scaled = std::clamp<int64_t>(scaled, 1, num_experts - 1);
    if (std::find(out.begin(), out.end(), scaled) == out.end()) out.push_back(scaled);
  }
  return out;
}

namespace {

// What the selection compares, resolved from the parameters and checked against the input.
struct SelectionPlan {
  std::vector<int64_t> layers;
  double alpha = 0;
  std::vector<int64_t> shared_k;
  std::vector<std::string> high;  // the anchors
  std::vector<int64_t> high_index, target_index;
  // Who is ranked against whom: anchors among the anchors (a single anchor against the
  // targets); each target against the anchors.
  std::vector<int64_t> anchor_pool;
};

absl::StatusOr<SelectionPlan> PlanSelection(const RoutingInput& input,
                                            const SelectionParams& params) {
  const int64_t E = input.num_experts;
  SelectionPlan plan;
  plan.layers = params.layers;
  if (plan.layers.empty()) {  // the last two MoE layers, as (14, 15) for OLMoE's 16
    const size_t n = input.moe_layers.size();
    plan.layers.assign(input.moe_layers.begin() + (n > 2 ? n - 2 : 0), input.moe_layers.end());
  }
  for (int64_t layer : plan.layers) {
    if (MoeIndex(input, layer) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("routing.select.layers: layer ", layer,
                                                     " is not an MoE layer of the model"));
    }
  }
  plan.alpha = params.alpha.value_or(DefaultAlpha(E));
  plan.shared_k = params.shared_k.empty() ? DefaultSharedK(E) : params.shared_k;
  for (int64_t k : plan.shared_k) {
    if (k >= E) {
      return absl::InvalidArgumentError(absl::StrCat(
          "routing.select.shared_k: ", k, " shared experts of the model's ", E,
          " would be every expert (all-expert fine-tuning, not SSFT); use values below ", E,
          " or leave shared_k unset for the scaled default"));
    }
  }
  auto is_target = [&](const std::string& lang) {
    return std::find(params.targets.begin(), params.targets.end(), lang) != params.targets.end();
  };
  plan.high = params.high_resource;
  if (plan.high.empty()) {
    for (const auto& lang : input.languages) {
      if (!params.parents.count(lang) && !is_target(lang)) plan.high.push_back(lang);
    }
  }
  for (const auto& lang : plan.high) {
    const int64_t k = LanguageIndex(input, lang);
    if (k < 0) {
      return absl::InvalidArgumentError(absl::StrCat("routing.select.high_resource: language '",
                                                     lang, "' is not among the languages"));
    }
    plan.high_index.push_back(k);
  }
  for (const auto& lang : params.targets) {
    const int64_t k = LanguageIndex(input, lang);
    if (k < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("routing.select.targets: language '", lang, "' is not among the languages"));
    }
    plan.target_index.push_back(k);
  }
  if (plan.high_index.empty() || plan.high_index.size() + plan.target_index.size() < 2) {
    return absl::InvalidArgumentError(
        "routing.select: activation-gap selection compares at least two languages (two anchors, "
        "or one anchor and a target)");
  }
  for (const auto& [low, parent] : params.parents) {
    if (std::find(plan.high.begin(), plan.high.end(), parent) == plan.high.end()) {
      return absl::InvalidArgumentError(absl::StrCat("routing.select.parents.", low, ": '", parent,
                                                     "' is not a high-resource language"));
    }
  }
  plan.anchor_pool = plan.high_index;
  if (plan.high_index.size() < 2) {
    plan.anchor_pool.insert(plan.anchor_pool.end(), plan.target_index.begin(),
                            plan.target_index.end());
  }
  return plan;
}

// The selection of one MoE layer: each language's SEFT experts (appended to seft[lang][key]),
// the gaps, and the shared pools (shared[k][key]).
struct LayerSelection {
  json gaps = json::object(), target_gaps = json::object();
};

LayerSelection SelectInLayer(const RoutingInput& input, const SelectionPlan& plan, int64_t layer,
                             std::map<std::string, json>* seft, std::map<int64_t, json>* shared) {
  const int64_t E = input.num_experts;
  const int64_t m = MoeIndex(input, layer);
  const std::string key = std::to_string(layer);
  std::vector<std::vector<double>> usage(input.languages.size());
  for (size_t k = 0; k < input.languages.size(); ++k)
    usage[k] = UsageDistribution(input.counts[k].counts[m]);
  for (auto& [lang, lists] : *seft) lists[key] = json::array();
  // The top language of expert e among `pool` and its gap to the runner-up; nullopt when
  // no language of the pool used e.
  auto rank = [&](const std::vector<int64_t>& pool,
                  int64_t e) -> std::optional<std::pair<int64_t, double>> {
    bool seen = false;
    for (int64_t k : pool) seen |= input.counts[k].counts[m][e] > 0;
    if (!seen) return std::nullopt;
    std::vector<int64_t> order = pool;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return usage[a][e] > usage[b][e]; });
    return std::make_pair(order[0], usage[order[0]][e] - usage[order[1]][e]);
  };
  LayerSelection out;
  std::vector<double> mean(E, 0.0);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t k : plan.high_index) {
      mean[e] += usage[k][e] / static_cast<double>(plan.high_index.size());
    }
    if (auto top = rank(plan.anchor_pool, e)) {
      const std::string& lang = input.languages[top->first];
      out.gaps[std::to_string(e)] = {{"gap", top->second}, {"language", lang}};
      // With one anchor the pool holds the targets too; only an anchor's win counts here.
      if (top->second >= plan.alpha &&
          std::find(plan.high.begin(), plan.high.end(), lang) != plan.high.end()) {
        (*seft)[lang][key].push_back(e);
      }
    }
    for (int64_t t : plan.target_index) {
      std::vector<int64_t> pool = plan.high_index;
      pool.push_back(t);
      auto top = rank(pool, e);
      if (!top || top->first != t) continue;
      out.target_gaps[input.languages[t]][std::to_string(e)] = top->second;
      if (top->second >= plan.alpha) (*seft)[input.languages[t]][key].push_back(e);
    }
  }
  std::vector<int64_t> by_mean(E);
  std::iota(by_mean.begin(), by_mean.end(), 0);
  std::stable_sort(by_mean.begin(), by_mean.end(),
                   [&](int64_t a, int64_t b) { return mean[a] > mean[b]; });
  for (int64_t k : plan.shared_k) {
    (*shared)[k][key] =
        std::vector<int64_t>(by_mean.begin(), by_mean.begin() + std::min<int64_t>(k, E));
  }
  return out;
}

// One source language's sets: its SEFT lists, SEFT + each shared pool, the random baseline
// of each, and every expert of the selected layers.
json SelectionEntry(const std::string& source, const json& seft,
                    const std::map<int64_t, json>& shared, const std::vector<int64_t>& layers,
                    int64_t E, uint64_t random_seed) {
  json e = {{"seft", seft}};
  for (const auto& [k, per_layer] : shared) {
    json ssft = json::object();
    for (const auto& [key, list] : seft.items()) {
      json merged = list;  // SEFT then shared, duplicates kept (readers de-duplicate)
      for (const auto& id : per_layer[key]) merged.push_back(id);
      ssft[key] = merged;
    }
    e[absl::StrCat("ssft_k", k)] = ssft;
    // The paper's random baseline: per layer as many distinct experts as SSFT picks, drawn
    // uniformly (seeded by random_seed, the language and k, so reruns agree).
    uint64_t name_hash = 1469598103934665603ull;  // FNV-1a: the same on every build
    for (unsigned char c : source) name_hash = (name_hash ^ c) * 1099511628211ull;
    std::seed_seq seq{static_cast<uint32_t>(random_seed), static_cast<uint32_t>(random_seed >> 32),
                      static_cast<uint32_t>(k), static_cast<uint32_t>(name_hash),
                      static_cast<uint32_t>(name_hash >> 32)};
    std::mt19937_64 rng(seq);
    json random = json::object();
    for (const auto& [key, list] : ssft.items()) {
      std::set<int64_t> distinct;
      for (const auto& id : list) distinct.insert(id.get<int64_t>());
      std::vector<int64_t> ids(E);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      ids.resize(std::min<size_t>(distinct.size(), ids.size()));
      std::sort(ids.begin(), ids.end());
      random[key] = ids;
    }
    e[absl::StrCat("random_ssft_k", k)] = random;
  }
  // All experts of the selected layers (the all-expert fine-tuning baseline).
  json all = json::object();
  for (int64_t layer : layers) {
    std::vector<int64_t> ids(E);
    std::iota(ids.begin(), ids.end(), 0);
    all[std::to_string(layer)] = ids;
  }
  e["all"] = all;
  return e;
}

}  // namespace

absl::StatusOr<json> ExpertSelectionJson(const RoutingInput& input, const SelectionParams& params) {
  if (absl::Status s = CheckInput(input); !s.ok()) return s;
  ASSIGN_OR_RETURN(const SelectionPlan plan, PlanSelection(input, params));
  const int64_t E = input.num_experts;
  std::map<std::string, json> seft;
  std::map<int64_t, json> shared;
  for (const auto& lang : plan.high) seft[lang] = json::object();
  for (const auto& lang : params.targets) seft[lang] = json::object();
  for (int64_t k : plan.shared_k) shared[k] = json::object();
  json gaps = json::object(), target_gaps = json::object();
  for (int64_t layer : plan.layers) {
    LayerSelection selected = SelectInLayer(input, plan, layer, &seft, &shared);
    gaps[std::to_string(layer)] = std::move(selected.gaps);
    if (!plan.target_index.empty()) target_gaps[std::to_string(layer)] = selected.target_gaps;
  }
  json shared_json = json::object();
  for (const auto& [k, per_layer] : shared) shared_json[absl::StrCat("k", k)] = per_layer;
  auto entry = [&](const std::string& source) {
    return SelectionEntry(source, seft[source], shared, plan.layers, E, params.random_seed);
  };
  json out = json::object();
  for (const auto& lang : plan.high) out[lang] = entry(lang);
  for (const auto& lang : params.targets) out[lang] = entry(lang);
  for (const auto& [low, parent] : params.parents) out[low] = entry(parent);
  out["shared_experts"] = shared_json;
  out["_meta"] = {{"format", "stemma.expert_selection/1"},
                  {"method", "activation_gap"},
                  {"layers", plan.layers},
                  {"alpha", plan.alpha},
                  {"alpha_default", !params.alpha.has_value()},
                  {"shared_k", plan.shared_k},
                  {"shared_k_default", params.shared_k.empty()},
                  {"high_resource", plan.high},
                  {"parents", params.parents},
                  {"targets", params.targets},
                  {"num_experts", E},
                  {"top_k", input.top_k},
                  {"gaps", gaps}};
  if (!plan.target_index.empty()) out["_meta"]["target_gaps"] = target_gaps;
  return out;
}

}  // namespace stemma::engine::analyze
