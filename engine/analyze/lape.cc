#include "engine/analyze/lape.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"

namespace stemma::engine::analyze {
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
                                               const v1::LapeOptions& params) {
  if (languages.size() < 2 || counts.size() != languages.size()) {
    return absl::InvalidArgumentError(
        "lape: needs at least two languages (the entropy is taken across languages)");
  }
  for (const auto& [value, field] :
       {std::pair{params.top_rate(), "top_rate"}, std::pair{params.filter_rate(), "filter_rate"},
        std::pair{params.activation_bar_ratio(), "activation_bar_ratio"}}) {
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
    result.filter_threshold = KthValueByRatio(scratch, params.filter_rate());
    result.activation_bar = params.activation_bar_ratio() == params.filter_rate()
                                ? result.filter_threshold
                                : KthValueByRatio(scratch, params.activation_bar_ratio());
  }

  constexpr double kInf = std::numeric_limits<double>::infinity();
  result.entropy.assign(neurons, 0.0);
  result.raw_entropy.assign(neurons, 0.0);
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
    result.raw_entropy[n] = h;
    result.entropy[n] = passes_filter ? h : kInf;
  }

  // The smallest entropies; a stable order makes ties deterministic (by layer, then neuron).
  result.num_selected =
      std::min<int64_t>(neurons, RoundHalfEven(static_cast<double>(neurons) * params.top_rate()));
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
      int64_t above = 0;
      for (int64_t k = 0; k < num_langs; ++k)
        above += prob[n * num_langs + k] > result.activation_bar;
      if (params.exclusive() && above > 1) {
        ++result.num_shared;
        continue;
      }
      for (int64_t k = 0; k < num_langs; ++k) {
        if (prob[n * num_langs + k] > result.activation_bar) {
          result.neurons[languages[k]][n / intermediate_size].push_back(n % intermediate_size);
          assigned = true;
        }
      }
    }
    if (!assigned) ++result.num_unassigned;
  }
  result.probability = std::move(prob);
  for (auto& [lang, layers] : result.neurons) {
    for (auto& list : layers) std::sort(list.begin(), list.end());
  }
  return result;
}

nlohmann::json NeuronMaskJson(const LapeResult& result, const v1::LapeOptions& params,
                              const std::vector<LapeCounts>& counts, bool keep_profile) {
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
  nlohmann::json out = {
      {"format", "stemma.neuron_mask/1"},
      {"num_layers", result.num_layers},
      {"intermediate_size", result.intermediate_size},
      {"languages", languages},
      {"params",
       {{"method", "lape"},
        {"top_rate", params.top_rate()},
        {"filter_rate", params.filter_rate()},
        {"activation_bar_ratio", params.activation_bar_ratio()},
        {"activation_threshold", params.activation_threshold()},
        {"exclusive", params.exclusive()},
        {"num_shared", result.num_shared},
        {"filter_threshold", result.filter_threshold},
        {"activation_bar", result.activation_bar},
        {"num_selected", result.num_selected},
        {"num_unassigned", result.num_unassigned},
        {"tokens", tokens}}},
      {"counts", per_layer},
  };
  if (keep_profile) {
    const int64_t L = result.num_layers, I = result.intermediate_size;
    const size_t K = result.languages.size();
    nlohmann::json probability = nlohmann::json::object();
    for (size_t k = 0; k < K; ++k) {
      nlohmann::json layers = nlohmann::json::array();
      for (int64_t l = 0; l < L; ++l) {
        std::vector<double> row(I);
        for (int64_t j = 0; j < I; ++j) row[j] = result.probability[(l * I + j) * K + k];
        layers.push_back(std::move(row));
      }
      probability[result.languages[k]] = std::move(layers);
    }
    nlohmann::json entropy = nlohmann::json::array();
    for (int64_t l = 0; l < L; ++l) {
      entropy.push_back(std::vector<double>(result.raw_entropy.begin() + l * I,
                                            result.raw_entropy.begin() + (l + 1) * I));
    }
    out["profile"] = {
        {"tokens", tokens},
        {"probability", std::move(probability)},
        {"entropy", std::move(entropy)},
        {"definitions",
         {{"probability",
           "P[l][j] = tokens with act(gate_j) > activation_threshold / tokens, per language"},
          {"entropy",
           "-sum_k Q ln Q, Q = P / sum_k P over the languages (before the activity filter)"}}}};
  }
  return out;
}

namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

absl::Status MaskError(const std::string& where, const std::string& field,
                       const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, ": ", what));
}

}  // namespace

absl::StatusOr<SavedProfile> LapeCountsFromMask(const nlohmann::json& mask,
                                                const std::vector<std::string>& languages,
                                                const std::string& where) {
  if (!mask.is_object() || mask.value("format", "") != "stemma.neuron_mask/1") {
    return MaskError(where, "format", "not a stemma.neuron_mask/1 file");
  }
  if (!mask.contains("profile") || !mask["profile"].is_object()) {
    return MaskError(
        where, "profile",
        "missing: the file was written with lape.keep_profile false (or before profiles "
        "were kept); profile the model again");
  }
  SavedProfile saved;
  saved.num_layers = mask.value("num_layers", int64_t{0});
  saved.intermediate_size = mask.value("intermediate_size", int64_t{0});
  if (saved.num_layers <= 0 || saved.intermediate_size <= 0) {
    return MaskError(where, "num_layers", "missing or not positive");
  }
  if (mask.contains("params") && mask["params"].is_object() && mask["params"].contains("model") &&
      mask["params"]["model"].is_string()) {
    saved.model = mask["params"]["model"].get<std::string>();
  }
  const nlohmann::json& profile = mask["profile"];
  const nlohmann::json tokens = profile.value("tokens", nlohmann::json::object());
  const nlohmann::json probability = profile.value("probability", nlohmann::json::object());
  saved.languages = languages;
  if (saved.languages.empty()) {
    for (const auto& [lang, _] : probability.items()) saved.languages.push_back(lang);
  }
  for (const std::string& lang : saved.languages) {
    if (!probability.contains(lang) || !tokens.contains(lang) ||
        !tokens[lang].is_number_integer()) {
      return MaskError(where, absl::StrCat("profile.probability.", lang),
                       "missing (not profiled in this file)");
    }
    LapeCounts counts;
    counts.tokens = tokens[lang].get<int64_t>();
    const nlohmann::json& layers = probability[lang];
    if (!layers.is_array() || static_cast<int64_t>(layers.size()) != saved.num_layers) {
      return MaskError(where, absl::StrCat("profile.probability.", lang),
                       "must hold one list per layer");
    }
    counts.over_zero.reserve(saved.num_layers * saved.intermediate_size);
    for (int64_t l = 0; l < saved.num_layers; ++l) {
      const nlohmann::json& row = layers[l];
      if (!row.is_array() || static_cast<int64_t>(row.size()) != saved.intermediate_size) {
        return MaskError(where, absl::StrCat("profile.probability.", lang, "[", l, "]"),
                         absl::StrCat("must hold ", saved.intermediate_size, " probabilities"));
      }
      for (const auto& p : row) {
        if (!p.is_number() || p.get<double>() < 0 || p.get<double>() > 1) {
          return MaskError(where, absl::StrCat("profile.probability.", lang, "[", l, "]"),
                           "holds a value that is not a probability");
        }
        counts.over_zero.push_back(
            std::llround(p.get<double>() * static_cast<double>(counts.tokens)));
      }
    }
    saved.counts.push_back(std::move(counts));
  }
  return saved;
}

nlohmann::json RandomMaskJson(const LapeResult& result, uint64_t seed) {
  nlohmann::json languages = nlohmann::json::object(), per_layer = nlohmann::json::object();
  const int64_t I = result.intermediate_size;
  int64_t total = 0;
  for (const std::string& lang : result.languages) {
    const auto& layers = result.neurons.at(lang);
    nlohmann::json lists = nlohmann::json::array(), sizes = nlohmann::json::array();
    for (int64_t l = 0; l < result.num_layers; ++l) {
      const int64_t n = static_cast<int64_t>(layers[l].size());
      uint64_t state = seed ^ Fnv1a(lang) ^ (0x632be59bd9b4e019ULL * static_cast<uint64_t>(l + 1));
      std::vector<int64_t> ids(I);
      std::iota(ids.begin(), ids.end(), 0);
      for (int64_t i = 0; i < n; ++i) {  // partial Fisher–Yates
        const int64_t pick =
            i + static_cast<int64_t>(SplitMix64(state) % static_cast<uint64_t>(I - i));
        std::swap(ids[i], ids[pick]);
      }
      std::vector<int64_t> chosen(ids.begin(), ids.begin() + n);
      std::sort(chosen.begin(), chosen.end());
      total += n;
      lists.push_back(std::move(chosen));
      sizes.push_back(n);
    }
    languages[lang] = std::move(lists);
    per_layer[lang] = std::move(sizes);
  }
  return {{"format", "stemma.neuron_mask/1"},
          {"num_layers", result.num_layers},
          {"intermediate_size", result.intermediate_size},
          {"languages", languages},
          {"params",
           {{"method", "random"},
            {"seed", seed},
            {"matches", "the LAPE selection's size per language and layer (neuron_mask.json)"},
            {"neurons", total}}},
          {"counts", per_layer}};
}

absl::StatusOr<std::vector<std::vector<int64_t>>> MaskUnion(
    const nlohmann::json& mask, const std::vector<std::string>& languages,
    const std::string& where) {
  if (!mask.is_object() || mask.value("format", "") != "stemma.neuron_mask/1") {
    return MaskError(where, "format", "not a stemma.neuron_mask/1 file");
  }
  const int64_t L = mask.value("num_layers", int64_t{0});
  const int64_t I = mask.value("intermediate_size", int64_t{0});
  if (L <= 0 || I <= 0 || !mask.contains("languages") || !mask["languages"].is_object()) {
    return MaskError(where, "languages", "missing (or num_layers / intermediate_size)");
  }
  std::vector<std::string> wanted = languages;
  if (wanted.empty()) {
    for (const auto& [lang, _] : mask["languages"].items()) wanted.push_back(lang);
  }
  std::vector<std::set<int64_t>> sets(L);
  for (const std::string& lang : wanted) {
    if (!mask["languages"].contains(lang))
      return MaskError(where, absl::StrCat("languages.", lang), "not in the file");
    const nlohmann::json& layers = mask["languages"][lang];
    if (!layers.is_array() || static_cast<int64_t>(layers.size()) != L) {
      return MaskError(where, absl::StrCat("languages.", lang), "must hold one list per layer");
    }
    for (int64_t l = 0; l < L; ++l) {
      for (const auto& id : layers[l]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= I) {
          return MaskError(where, absl::StrCat("languages.", lang, "[", l, "]"),
                           absl::StrCat("holds an index outside 0..", I - 1));
        }
        sets[l].insert(id.get<int64_t>());
      }
    }
  }
  std::vector<std::vector<int64_t>> out;
  for (const auto& s : sets) out.emplace_back(s.begin(), s.end());
  return out;
}

}  // namespace stemma::engine::analyze
