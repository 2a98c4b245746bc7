#include "engine/train/plan.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/io/fs.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::train {
namespace {

using json = nlohmann::json;

constexpr char kLayerPrefix[] = "model.layers.";

// What a parameter name says about its role in the network.
struct NameParts {
  int64_t layer = -1;
  int64_t expert = -1;     // mlp.experts.{e}.…
  bool router = false;     // mlp.gate.weight (MoE)
  std::string projection;  // gate_proj | up_proj | down_proj for (expert) MLP tensors
  bool bias = false;
};

NameParts SplitName(const std::string& name) {
  NameParts parts;
  parts.layer = LayerOf(name);
  if (parts.layer < 0) return parts;
  std::string rest = name.substr(name.find('.', sizeof(kLayerPrefix) - 1) + 1);  // after "{i}."
  parts.bias = absl::EndsWith(rest, ".bias");
  if (rest == "mlp.gate.weight") {
    parts.router = true;
    return parts;
  }
  if (absl::StartsWith(rest, "mlp.experts.")) {
    std::string tail = rest.substr(sizeof("mlp.experts.") - 1);
    size_t dot = tail.find('.');
    if (dot != std::string::npos && absl::SimpleAtoi(tail.substr(0, dot), &parts.expert)) {
      rest = "mlp." + tail.substr(dot + 1);
    }
  }
  for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
    if (absl::StartsWith(rest, absl::StrCat("mlp.", proj, "."))) parts.projection = proj;
  }
  return parts;
}

struct ResolvedRanges {
  std::vector<LayerRange> ranges;
  bool Contains(int64_t layer) const {
    return std::any_of(ranges.begin(), ranges.end(),
                       [&](const LayerRange& r) { return layer >= r.begin && layer < r.end; });
  }
};

absl::StatusOr<ResolvedRanges> Resolve(const google::protobuf::RepeatedPtrField<std::string>& texts,
                                       int64_t num_layers, const std::string& where) {
  ASSIGN_OR_RETURN(std::vector<LayerRange> ranges, ParseLayerRanges(texts, where));
  ResolvedRanges out;
  for (size_t i = 0; i < ranges.size(); ++i) {
    ASSIGN_OR_RETURN(LayerRange r,
                     ResolveLayerRange(ranges[i], num_layers, absl::StrCat(where, "[", i, "]")));
    out.ranges.push_back(r);
  }
  return out;
}

absl::StatusOr<json> ReadJsonFile(const std::string& path, const std::string& what) {
  absl::StatusOr<std::string> text = io::ReadFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat(what, " ", path, ": ", text.status().message()));
  }
  json doc = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not a JSON object"));
  }
  return doc;
}

// A JSON list of ids in [0, limit) -> sorted unique ids; errors name `where`.
absl::StatusOr<std::vector<int64_t>> IdList(const json& v, int64_t limit,
                                            const std::string& where) {
  if (!v.is_array())
    return absl::InvalidArgumentError(absl::StrCat(where, ": must be a list of ids"));
  std::set<int64_t> ids;
  for (const json& id : v) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= limit) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": id ", id.dump(), " is not an integer in [0, ", limit, ")"));
    }
    ids.insert(id.get<int64_t>());
  }
  return std::vector<int64_t>(ids.begin(), ids.end());
}

}  // namespace

int64_t ParamPlan::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t ParamPlan::trainable_elements() const {
  if (!trainable) return 0;
  if (mask == Mask::kNone) return numel();
  const int64_t dim = mask == Mask::kRows ? 0 : 1;
  const int64_t per_index = shape.at(dim) == 0 ? 0 : numel() / shape.at(dim);
  return per_index * static_cast<int64_t>(indices.size());
}

int64_t LayerOf(const std::string& name) {
  if (!absl::StartsWith(name, kLayerPrefix)) return -1;
  const size_t start = sizeof(kLayerPrefix) - 1;
  const size_t dot = name.find('.', start);
  int64_t layer = -1;
  if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(start, dot - start), &layer)) {
    return -1;
  }
  return layer;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> LoadNeuronMask(
    const std::string& path, const std::vector<std::string>& languages, const ModelShape& model) {
  ASSIGN_OR_RETURN(json doc, ReadJsonFile(path, "neuron mask file"));
  auto bad = [&](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("neuron mask file ", path, ": ", field, ": ", why));
  };
  if (!doc.contains("format") || doc["format"] != "stemma.neuron_mask/1") {
    return bad("format", "want \"stemma.neuron_mask/1\"");
  }
  if (!doc.contains("num_layers") || doc["num_layers"] != model.num_layers) {
    return bad("num_layers",
               absl::StrCat("does not match the model's ", model.num_layers, " layers"));
  }
  if (!doc.contains("intermediate_size") || doc["intermediate_size"] != model.intermediate_size) {
    return bad("intermediate_size", absl::StrCat("does not match the model's intermediate_size ",
                                                 model.intermediate_size));
  }
  if (!doc.contains("languages") || !doc["languages"].is_object() || doc["languages"].empty()) {
    return bad("languages", "must be a non-empty map of language -> per-layer neuron lists");
  }
  const json& table = doc["languages"];
  std::vector<std::string> wanted = languages;
  if (wanted.empty()) {
    for (const auto& [lang, _] : table.items()) wanted.push_back(lang);
  }
  std::vector<std::set<int64_t>> sets(model.num_layers);
  for (const std::string& lang : wanted) {
    if (!table.contains(lang)) {
      return bad(absl::StrCat("languages.", lang),
                 "not in the file (the spec's neuron_mask.languages names it)");
    }
    const json& layers = table[lang];
    if (!layers.is_array() || static_cast<int64_t>(layers.size()) != model.num_layers) {
      return bad(absl::StrCat("languages.", lang),
                 absl::StrCat("must hold one list per layer (", model.num_layers, ")"));
    }
    for (int64_t l = 0; l < model.num_layers; ++l) {
      ASSIGN_OR_RETURN(
          std::vector<int64_t> ids,
          IdList(layers[l], model.intermediate_size,
                 absl::StrCat("neuron mask file ", path, ": languages.", lang, "[", l, "]")));
      sets[l].insert(ids.begin(), ids.end());
    }
  }
  std::vector<std::vector<int64_t>> out;
  for (const auto& s : sets) out.emplace_back(s.begin(), s.end());
  return out;
}

absl::StatusOr<std::map<int64_t, std::vector<int64_t>>> LoadExpertSubset(
    const std::string& path, const std::string& language, const std::string& set,
    const ModelShape& model) {
  ASSIGN_OR_RETURN(json doc, ReadJsonFile(path, "expert selection file"));
  const std::string where = absl::StrCat("expert selection file ", path, ": ");
  if (!doc.contains(language) || !doc[language].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "no language '", language, "'"));
  }
  const json& sets = doc[language];
  if (!sets.contains(set) || !sets[set].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "language '", language, "' has no set '", set, "'"));
  }
  std::map<int64_t, std::vector<int64_t>> out;
  for (const auto& [key, ids] : sets[set].items()) {
    int64_t layer = -1;
    const std::string field = absl::StrCat(where, language, ".", set, ".", key);
    if (!absl::SimpleAtoi(key, &layer) || layer < 0 || layer >= model.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": layer key is not a layer of the model (0..", model.num_layers - 1, ")"));
    }
    ASSIGN_OR_RETURN(out[layer], IdList(ids, model.num_experts, field));
  }
  if (out.empty())
    return absl::InvalidArgumentError(absl::StrCat(where, language, ".", set, ": no layers"));
  return out;
}

absl::StatusOr<TrainPlan> BuildPlan(const v1::TrainStrategy& strategy, const ModelShape& model,
                                    const std::vector<ParamInfo>& params,
                                    const std::string& spec_source) {
  const std::string where = absl::StrCat(spec_source, ": strategy");
  const int64_t L = model.num_layers;
  ASSIGN_OR_RETURN(ResolvedRanges frozen_layers,
                   Resolve(strategy.freeze().layers(), L, where + ".freeze.layers"));
  std::vector<ResolvedRanges> l2sp_ranges;
  for (int i = 0; i < strategy.l2sp_size(); ++i) {
    ASSIGN_OR_RETURN(ResolvedRanges r, Resolve(strategy.l2sp(i).layers(), L,
                                               absl::StrCat(where, ".l2sp[", i, "].layers")));
    l2sp_ranges.push_back(std::move(r));
  }

  std::vector<std::vector<int64_t>> neurons;
  if (strategy.has_neuron_mask()) {
    if (model.num_experts > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".neuron_mask: needs a dense model (this one has ", model.num_experts,
                       " experts)"));
    }
    const v1::TrainNeuronMask& mask = strategy.neuron_mask();
    const std::vector<std::string> languages(mask.languages().begin(), mask.languages().end());
    ASSIGN_OR_RETURN(neurons, LoadNeuronMask(mask.file(), languages, model));
  }
  TrainPlan plan;
  if (strategy.has_expert_subset()) {
    if (model.num_experts == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".expert_subset: needs an MoE model"));
    }
    const v1::TrainExpertSubset& e = strategy.expert_subset();
    ASSIGN_OR_RETURN(plan.router_experts, LoadExpertSubset(e.file(), e.language(), e.set(), model));
  }
  if (strategy.freeze().shared() && model.num_experts == 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".freeze.shared: needs an MoE model"));
  }
  for (int64_t id : strategy.frozen_experts()) {
    if (model.num_experts == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".frozen_experts: needs an MoE model"));
    }
    if (id >= model.num_experts) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".frozen_experts: expert ", id,
                                                     " is out of range (the model has ",
                                                     model.num_experts, ")"));
    }
  }

  for (const ParamInfo& p : params) {
    ParamPlan pp;
    pp.name = p.name;
    pp.shape = p.shape;
    const NameParts parts = SplitName(p.name);
    pp.trainable = true;
    if (strategy.has_neuron_mask()) {
      pp.trainable = false;
      if (parts.layer >= 0 && !parts.projection.empty() && !neurons[parts.layer].empty()) {
        if (parts.projection == "down_proj") {
          if (!parts.bias) {  // down_proj's bias is per hidden unit, not per neuron
            pp.trainable = true;
            pp.mask = ParamPlan::Mask::kColumns;
          }
        } else {
          pp.trainable = true;
          pp.mask = ParamPlan::Mask::kRows;
        }
        if (pp.trainable) pp.indices = neurons[parts.layer];
      }
    }
    if (strategy.has_expert_subset()) {
      auto it = plan.router_experts.find(parts.layer);
      const bool listed_layer = it != plan.router_experts.end();
      pp.trainable = listed_layer &&
                     ((parts.router && strategy.expert_subset().train_routers()) ||
                      (parts.expert >= 0 &&
                       std::binary_search(it->second.begin(), it->second.end(), parts.expert)));
    }
    if (parts.layer >= 0 && frozen_layers.Contains(parts.layer)) pp.trainable = false;
    if (p.name == "model.embed_tokens.weight" && strategy.freeze().embeddings())
      pp.trainable = false;
    if (p.name == "lm_head.weight" && strategy.freeze().head()) pp.trainable = false;
    if (p.name == "model.norm.weight" && strategy.freeze().final_norm()) pp.trainable = false;
    if (strategy.freeze().shared() && parts.expert < 0 && !parts.router) pp.trainable = false;
    if (strategy.freeze().attention() && absl::StrContains(p.name, ".self_attn."))
      pp.trainable = false;
    if (strategy.freeze().norms() && absl::StrContains(p.name, "norm.weight")) pp.trainable = false;
    if (parts.expert >= 0 &&
        std::find(strategy.frozen_experts().begin(), strategy.frozen_experts().end(),
                  parts.expert) != strategy.frozen_experts().end()) {
      pp.trainable = false;
    }
    if (pp.trainable) {
      for (int i = 0; i < strategy.l2sp_size(); ++i) {
        const bool default_rule = strategy.l2sp(i).layers().empty();
        if (!default_rule && parts.layer >= 0 && l2sp_ranges[i].Contains(parts.layer)) {
          pp.l2sp_lambda = strategy.l2sp(i).lambda();
          break;
        }
        if (default_rule)
          pp.l2sp_lambda = strategy.l2sp(i).lambda();  // unless a later range rule names it
      }
      pp.weight_decay = pp.shape.size() >= 2 && pp.l2sp_lambda == 0.0;
    } else {
      pp.mask = ParamPlan::Mask::kNone;
      pp.indices.clear();
    }
    plan.total_params += pp.numel();
    plan.trainable_params += pp.trainable_elements();
    plan.params.push_back(std::move(pp));
  }
  if (plan.trainable_params == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": leaves no parameter to train (everything is frozen or masked out)"));
  }
  return plan;
}

}  // namespace stemma::engine::train
