#include "engine/analyze/drift.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <cctype>
#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "engine/io/checkpoint.h"

namespace stemma::engine::analyze {
namespace {

using nlohmann::json;

// Squared norms of the change and of the base over a group of tensors.
struct Sums {
  double diff2 = 0.0;
  double base2 = 0.0;
  void Add(const Sums& other) {
    diff2 += other.diff2;
    base2 += other.base2;
  }
};

json Relative(const Sums& s) {
  if (s.base2 == 0.0) return s.diff2 == 0.0 ? json(0.0) : json(nullptr);
  return std::sqrt(s.diff2) / std::sqrt(s.base2);
}

std::optional<double> RelativeValue(const Sums& s) {
  if (s.base2 == 0.0) return std::nullopt;
  return std::sqrt(s.diff2) / std::sqrt(s.base2);
}

// Elements per float64 chunk: bounds the extra memory to ~256 MiB whatever the tensor size.
constexpr int64_t kChunk = 1 << 24;

Sums TensorSums(const torch::Tensor& trained, const torch::Tensor& base) {
  Sums sums;
  auto t = trained.reshape({-1}), b = base.reshape({-1});
  for (int64_t start = 0; start < t.numel(); start += kChunk) {
    const int64_t end = std::min(t.numel(), start + kChunk);
    auto bd = b.slice(0, start, end).to(torch::kFloat64);
    auto td = t.slice(0, start, end).to(torch::kFloat64);
    sums.diff2 += (td - bd).pow(2).sum().item<double>();
    sums.base2 += bd.pow(2).sum().item<double>();
  }
  return sums;
}

// "…layers.{i}.{module}.weight" -> {i, module}; nullopt for tensors outside the layers.
std::optional<std::pair<int64_t, std::string>> LayerModule(absl::string_view name) {
  const size_t at = name.find("layers.");
  if (at == absl::string_view::npos || (at > 0 && name[at - 1] != '.')) return std::nullopt;
  absl::string_view rest = name.substr(at + 7);
  size_t digits = 0;
  while (digits < rest.size() && std::isdigit(static_cast<unsigned char>(rest[digits]))) ++digits;
  if (digits == 0 || digits >= rest.size() || rest[digits] != '.') return std::nullopt;
  const int64_t layer = std::stoll(std::string(rest.substr(0, digits)));
  absl::string_view module = rest.substr(digits + 1);
  if (!absl::ConsumeSuffix(&module, ".weight")) absl::ConsumeSuffix(&module, ".bias");
  return std::make_pair(layer, std::string(module));
}

// The groups a layer's module belongs to besides itself and "all".
std::vector<std::string> Groups(const std::string& module) {
  std::vector<std::string> groups;
  if (absl::StartsWith(module, "self_attn.")) groups.push_back("attention");
  if (absl::StartsWith(module, "mlp.")) groups.push_back("mlp");
  if (absl::StrContains(module, "norm")) groups.push_back("norms");
  const bool dense_or_expert =
      absl::StartsWith(module, "mlp.") &&
      (module.find('.', 4) == std::string::npos || absl::StartsWith(module, "mlp.experts."));
  if (dense_or_expert && absl::EndsWith(module, "gate_proj")) groups.push_back("gate");
  if (dense_or_expert && absl::EndsWith(module, "up_proj")) groups.push_back("up");
  if (dense_or_expert && absl::EndsWith(module, "down_proj")) groups.push_back("down");
  if (module == "mlp.gate") groups.push_back("router");
  return groups;
}

// The masked part of a dense FFN weight: rows of gate/up, columns of down; nullopt for any
// other tensor.
std::optional<std::pair<int64_t, std::string>> MaskedPart(const std::string& name) {
  auto lm = LayerModule(name);
  if (!lm || !absl::EndsWith(name, ".weight")) return std::nullopt;
  for (const char* m : {"gate_proj", "up_proj", "down_proj"}) {
    if (lm->second == absl::StrCat("mlp.", m)) {
      return std::make_pair(lm->first, std::string(m).substr(0, std::string(m).find('_')));
    }
  }
  return std::nullopt;
}

using LayerSums = std::map<int64_t, std::map<std::string, Sums>>;

// One entry per layer: the relative drift of each group and module, the FFN asymmetry, and
// the same over the mask's neurons where the mask has the layer.
json LayerEntries(const LayerSums& layer_groups, const LayerSums& layer_modules,
                  const LayerSums& masked, const std::vector<std::vector<int64_t>>* mask) {
  json layers = json::array();
  for (const auto& [layer, groups] : layer_groups) {
    json entry = {{"layer", layer}};
    for (const auto& [group, sums] : groups) entry[group] = Relative(sums);
    json modules = json::object();
    if (auto lm = layer_modules.find(layer); lm != layer_modules.end())
      for (const auto& [module, sums] : lm->second) modules[module] = Relative(sums);
    entry["modules"] = modules;
    auto rel = [&](const char* g) -> std::optional<double> {
      auto it = groups.find(g);
      return it == groups.end() ? std::nullopt : RelativeValue(it->second);
    };
    const auto gate = rel("gate"), up = rel("up"), down = rel("down");
    entry["asymmetry"] = nullptr;
    if (gate && up && down && (*gate + *up) > 0.0) {
      entry["asymmetry"] = *down / ((*gate + *up) / 2.0);
    }
    if (auto it = masked.find(layer); it != masked.end()) {
      json m = {{"neurons", (*mask)[layer].size()}};
      for (const auto& [group, sums] : it->second) m[group] = Relative(sums);
      auto mrel = [&](const char* g) -> std::optional<double> {
        auto f = it->second.find(g);
        return f == it->second.end() ? std::nullopt : RelativeValue(f->second);
      };
      const auto mg = mrel("gate"), mu = mrel("up"), md = mrel("down");
      m["asymmetry"] = nullptr;
      if (mg && mu && md && (*mg + *mu) > 0.0) m["asymmetry"] = *md / ((*mg + *mu) / 2.0);
      entry["masked"] = m;
    }
    layers.push_back(entry);
  }
  return layers;
}

}  // namespace

absl::StatusOr<json> WeightDrift(const std::string& base_dir, const std::string& trained_dir,
                                 const std::vector<std::vector<int64_t>>* mask) {
  ASSIGN_OR_RETURN(auto base, io::CheckpointReader::Open(base_dir));
  ASSIGN_OR_RETURN(auto trained, io::CheckpointReader::Open(trained_dir));
  std::map<int64_t, std::map<std::string, Sums>> layer_modules, layer_groups;
  std::map<std::string, Sums> others;
  std::map<int64_t, std::map<std::string, Sums>> masked;  // layer -> gate/up/down/all
  Sums total, masked_total;
  json only_in_base = json::array(), only_in_trained = json::array();
  int64_t compared = 0;
  for (const std::string& name : base->TensorNames()) {
    if (!trained->Has(name)) only_in_base.push_back(name);
  }
  for (const std::string& name : trained->TensorNames()) {
    if (!base->Has(name)) {
      only_in_trained.push_back(name);
      continue;
    }
    ASSIGN_OR_RETURN(torch::Tensor t, trained->Tensor(name));
    ASSIGN_OR_RETURN(torch::Tensor b, base->Tensor(name));
    if (t.sizes() != b.sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("drift: tensor ", name, " has shape ", c10::str(t.sizes()), " in ",
                       trained_dir, " but ", c10::str(b.sizes()), " in ", base_dir));
    }
    Sums sums;
    try {
      sums = TensorSums(t, b);
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("drift: ", name, ": ", e.what_without_backtrace()));
    }
    ++compared;
    total.Add(sums);
    if (auto part =
            mask != nullptr ? MaskedPart(name) : std::optional<std::pair<int64_t, std::string>>();
        part && part->first < static_cast<int64_t>(mask->size()) && !(*mask)[part->first].empty()) {
      const auto& ids = (*mask)[part->first];
      const int64_t dim = part->second == "down" ? 1 : 0;  // down: columns; gate/up: rows
      if (t.dim() != 2 || ids.back() >= t.size(dim)) {
        return absl::InvalidArgumentError(absl::StrCat("drift.mask: neuron ", ids.back(),
                                                       " of layer ", part->first, " is past ", name,
                                                       " (shape ", c10::str(t.sizes()), ")"));
      }
      Sums part_sums;
      try {
        auto index = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kInt64);
        part_sums = TensorSums(t.index_select(dim, index), b.index_select(dim, index));
      } catch (const c10::Error& e) {
        return absl::InternalError(absl::StrCat("drift: ", name, ": ", e.what_without_backtrace()));
      }
      masked[part->first][part->second].Add(part_sums);
      masked[part->first]["all"].Add(part_sums);
      masked_total.Add(part_sums);
    }
    if (auto lm = LayerModule(name)) {
      const auto& [layer, module] = *lm;
      layer_modules[layer][module].Add(sums);
      layer_groups[layer]["all"].Add(sums);
      for (const std::string& group : Groups(module)) layer_groups[layer][group].Add(sums);
    } else {
      std::string key = name;
      if (absl::EndsWith(key, ".weight")) key.resize(key.size() - 7);
      others[key].Add(sums);
    }
  }
  if (compared == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("drift: ", base_dir, " and ", trained_dir, " have no tensor name in common"));
  }

  json layers = LayerEntries(layer_groups, layer_modules, masked, mask);
  if (mask != nullptr) {
    for (size_t l = 0; l < mask->size(); ++l) {
      if (!(*mask)[l].empty() && !masked.count(static_cast<int64_t>(l))) {
        return absl::InvalidArgumentError(
            absl::StrCat("drift.mask: layer ", l, " has masked neurons but ", trained_dir,
                         " has no dense mlp.{gate,up,down}_proj in that layer"));
      }
    }
  }
  json other = json::object();
  for (const auto& [key, sums] : others) other[key] = Relative(sums);
  json result = {
      {"format", "stemma.drift/1"},
      {"base", base_dir},
      {"trained", trained_dir},
      {"total", Relative(total)},
      {"layers", layers},
      {"other", other},
      {"only_in_base", only_in_base},
      {"only_in_trained", only_in_trained},
      {"definitions",
       {{"relative", "||theta - theta0||_2 / ||theta0||_2 over the group, float64"},
        {"asymmetry", "relative(down) / mean(relative(gate), relative(up)) per layer"},
        {"masked",
         "the same over the mask's rows of gate_proj/up_proj and columns of down_proj only"}}}};
  if (mask != nullptr) result["masked_total"] = Relative(masked_total);
  return result;
}

}  // namespace stemma::engine::analyze
