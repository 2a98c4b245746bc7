#include "engine/eval/lape.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace stemma::engine::eval {
namespace {

absl::Status CheckRate(double value, const char* field) {
  if (!(value > 0.0 && value <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lape.", field, ": must be in (0, 1], got ", value));
  }
  return absl::OkStatus();
}

// Python's round() (half to even) of a non-negative value, as identify.py computes k.
int64_t RoundHalfEven(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

}  // namespace

double KthValueByRatio(std::vector<double>& values, double ratio) {
  const int64_t n = static_cast<int64_t>(values.size());
  const int64_t k = std::clamp<int64_t>(RoundHalfEven(static_cast<double>(n) * ratio), 1, n);
  std::nth_element(values.begin(), values.begin() + (k - 1), values.end());
  return values[k - 1];
}

absl::StatusOr<LapeResult> IdentifyLapeNeurons(const std::vector<std::string>& languages,
                                               const std::vector<LapeCounts>& counts,
                                               int64_t num_layers, int64_t intermediate_size,
                                               const LapeParams& params) {
  if (languages.size() < 2 || counts.size() != languages.size()) {
    return absl::InvalidArgumentError(
        "lape: needs at least two languages (the entropy is taken across languages)");
  }
  for (const auto& [value, field] :
       {std::pair{params.top_rate, "top_rate"}, std::pair{params.filter_rate, "filter_rate"},
        std::pair{params.activation_bar_ratio, "activation_bar_ratio"}}) {
    if (absl::Status s = CheckRate(value, field); !s.ok()) return s;
  }
  const int64_t neurons = num_layers * intermediate_size;
  const int64_t num_langs = static_cast<int64_t>(languages.size());
  for (int64_t k = 0; k < num_langs; ++k) {
    if (counts[k].tokens <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("lape: language '", languages[k], "' has no tokens"));
    }
    if (static_cast<int64_t>(counts[k].over_zero.size()) != neurons) {
      return absl::InvalidArgumentError(absl::StrCat("lape: language '", languages[k], "' has ",
                                                     counts[k].over_zero.size(),
                                                     " neuron counts, expected ", neurons));
    }
  }

  // P[n * K + k], neuron-major like the [L, I, K] tensor of identify.py.
  std::vector<double> prob(neurons * num_langs);
  for (int64_t n = 0; n < neurons; ++n) {
    for (int64_t k = 0; k < num_langs; ++k) {
      prob[n * num_langs + k] =
          static_cast<double>(counts[k].over_zero[n]) / static_cast<double>(counts[k].tokens);
    }
  }
  LapeResult result;
  result.num_layers = num_layers;
  result.intermediate_size = intermediate_size;
  result.languages = languages;
  {
    std::vector<double> scratch = prob;
    result.filter_threshold = KthValueByRatio(scratch, params.filter_rate);
    result.activation_bar = params.activation_bar_ratio == params.filter_rate
                                ? result.filter_threshold
                                : KthValueByRatio(scratch, params.activation_bar_ratio);
  }

  constexpr double kInf = std::numeric_limits<double>::infinity();
  result.entropy.assign(neurons, 0.0);
  for (int64_t n = 0; n < neurons; ++n) {
    const double* p = &prob[n * num_langs];
    const double total = std::accumulate(p, p + num_langs, 0.0);
    double h = 0.0;
    bool passes_filter = false;
    for (int64_t k = 0; k < num_langs; ++k) {
      const double q = total > 0.0 ? p[k] / total : 0.0;  // never-firing neuron: NaN -> 0
      if (q > 0.0) h -= q * std::log(q);
      passes_filter |= p[k] > result.filter_threshold;
    }
    result.entropy[n] = passes_filter ? h : kInf;
  }

  // The smallest entropies; a stable order makes ties deterministic (by layer, then neuron).
  result.num_selected = std::min<int64_t>(
      neurons, RoundHalfEven(static_cast<double>(neurons) * params.top_rate));
  std::vector<int64_t> order(neurons);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return result.entropy[a] < result.entropy[b]; });

  for (const auto& lang : languages) {
    result.neurons[lang].assign(num_layers, {});
  }
  for (int64_t i = 0; i < result.num_selected; ++i) {
    const int64_t n = order[i];
    bool assigned = false;
    if (result.entropy[n] != kInf) {
      for (int64_t k = 0; k < num_langs; ++k) {
        if (prob[n * num_langs + k] > result.activation_bar) {
          result.neurons[languages[k]][n / intermediate_size].push_back(n % intermediate_size);
          assigned = true;
        }
      }
    }
    if (!assigned) ++result.num_unassigned;
  }
  for (auto& [lang, layers] : result.neurons) {
    for (auto& list : layers) std::sort(list.begin(), list.end());
  }
  return result;
}

nlohmann::json NeuronMaskJson(const LapeResult& result, const LapeParams& params,
                              const std::vector<LapeCounts>& counts) {
  nlohmann::json languages = nlohmann::json::object();
  nlohmann::json per_layer = nlohmann::json::object();
  nlohmann::json tokens = nlohmann::json::object();
  for (size_t k = 0; k < result.languages.size(); ++k) {
    const std::string& lang = result.languages[k];
    const auto& layers = result.neurons.at(lang);
    languages[lang] = layers;
    nlohmann::json n = nlohmann::json::array();
    for (const auto& list : layers) n.push_back(list.size());
    per_layer[lang] = n;
    tokens[lang] = counts[k].tokens;
  }
  return {
      {"format", "stemma.neuron_mask/1"},
      {"num_layers", result.num_layers},
      {"intermediate_size", result.intermediate_size},
      {"languages", languages},
      {"params",
       {{"method", "lape"},
        {"top_rate", params.top_rate},
        {"filter_rate", params.filter_rate},
        {"activation_bar_ratio", params.activation_bar_ratio},
        {"activation_threshold", params.activation_threshold},
        {"filter_threshold", result.filter_threshold},
        {"activation_bar", result.activation_bar},
        {"num_selected", result.num_selected},
        {"num_unassigned", result.num_unassigned},
        {"tokens", tokens}}},
      {"counts", per_layer},
  };
}

}  // namespace stemma::engine::eval
