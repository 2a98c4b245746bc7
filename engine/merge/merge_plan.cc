#include "engine/merge/merge_plan.h"

#include <cmath>
#include <optional>
#include <regex>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/engine_spec.h"
#include "common/layer_range.h"
#include "common/status.h"
#include "engine/merge/dtype_convert.h"
#include "stemma/v1/specs/merge.pb.h"

namespace stemma::spec_checks {
// common/spec_checks_merge.cc: the one reader of shard_size ("5GB", "2GiB", bytes).
absl::StatusOr<uint64_t> ParseShardSize(std::string_view text);
}  // namespace stemma::spec_checks

namespace stemma::engine::merge {
namespace {

using nlohmann::json;

// How many differences an error lists before "and N more".
constexpr size_t kListed = 8;

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Listed(const std::vector<std::string>& items) {
  std::vector<std::string> shown(items.begin(), items.begin() + std::min(items.size(), kListed));
  std::string s = absl::StrJoin(shown, ", ");
  if (items.size() > kListed) absl::StrAppend(&s, " and ", items.size() - kListed, " more");
  return s;
}

// "bfloat16" -> kBF16; "source" -> nullopt (keep each tensor's input dtype). The spec's
// choices allow nothing else.
std::optional<io::Dtype> OutDtypeOf(const std::string& name) {
  if (name == "bfloat16") return io::Dtype::kBF16;
  if (name == "float16") return io::Dtype::kF16;
  if (name == "float32") return io::Dtype::kF32;
  return std::nullopt;
}

// The spec as recorded in stemma.json (producer.params): its JSON with proto field names.
json SpecParams(const google::protobuf::Message& spec) {
  json j = json::parse(SpecToJson(spec), nullptr, false);
  return j.is_discarded() ? json::object() : j;
}

// The decoder's config: text_config for multimodal Gemma3, else the top level.
const json& TextConfig(const json& config) {
  if (config.is_object() && config.contains("text_config") && config["text_config"].is_object()) {
    return config["text_config"];
  }
  return config;
}

class Planner {
 public:
  Planner(MergePlan& plan, const google::protobuf::Message& spec, std::string where)
      : plan_(plan), spec_(spec), where_(std::move(where)) {}

  // The output fields every command has.
  template <typename Spec>
  absl::Status Common(const Spec& spec) {
    dtype_ = OutDtypeOf(spec.dtype());
    auto bytes = spec_checks::ParseShardSize(spec.shard_size());
    if (!bytes.ok()) return Error("shard_size", bytes.status().message());
    plan_.max_shard_bytes = *bytes;
    plan_.overwrite = spec.overwrite();
    plan_.tensor_hashes = spec.tensor_hashes();
    plan_.direct_io = spec.direct_io();
    return absl::OkStatus();
  }

  const std::string& where() const { return where_; }
  absl::Status Error(const std::string& key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", key, ": ", what));
  }

  absl::StatusOr<const SourceCheckpoint*> Open(const std::string& key, const std::string& path) {
    for (const auto& s : plan_.sources) {
      if (s->dir() == path) return s.get();
    }
    auto opened = SourceCheckpoint::Open(path);
    if (!opened.ok()) {
      return absl::Status(opened.status().code(),
                          absl::StrCat(where_, ": ", key, ": ", opened.status().message()));
    }
    plan_.sources.push_back(std::move(*opened));
    return plan_.sources.back().get();
  }

  // Output dtype of a tensor computed from `input` (float inputs only take the override).
  io::Dtype OutDtype(io::Dtype input) const {
    return dtype_ && IsFloatDtype(input) ? *dtype_ : input;
  }

  // Every checkpoint has the same tensors with the same shapes as `ref`; the error lists
  // what differs. Float dtypes may differ (mixed-precision inputs are fine).
  absl::Status SameTensors(const SourceCheckpoint& ref,
                           const std::vector<const SourceCheckpoint*>& others) const {
    for (const SourceCheckpoint* other : others) {
      if (other == &ref) continue;
      std::vector<std::string> missing, extra, shapes;
      for (const std::string& name : ref.names()) {
        auto t = other->Find(name);
        if (t.info == nullptr) {
          missing.push_back(name);
        } else if (t.info->shape != ref.Find(name).info->shape) {
          shapes.push_back(absl::StrCat(name, " ", Shape(ref.Find(name).info->shape), " vs ",
                                        Shape(t.info->shape)));
        } else if (!IsFloatDtype(t.info->dtype) && t.info->dtype != ref.Find(name).info->dtype) {
          shapes.push_back(absl::StrCat(name, " dtype ", io::DtypeName(ref.Find(name).info->dtype),
                                        " vs ", io::DtypeName(t.info->dtype)));
        }
      }
      for (const std::string& name : other->names()) {
        if (ref.Find(name).info == nullptr) extra.push_back(name);
      }
      if (missing.empty() && extra.empty() && shapes.empty()) continue;
      std::vector<std::string> parts;
      if (!missing.empty())
        parts.push_back(absl::StrCat(missing.size(), " tensors missing: ", Listed(missing)));
      if (!extra.empty())
        parts.push_back(
            absl::StrCat(extra.size(), " tensors not in ", ref.dir(), ": ", Listed(extra)));
      if (!shapes.empty())
        parts.push_back(absl::StrCat(shapes.size(), " differ: ", Listed(shapes)));
      return absl::InvalidArgumentError(absl::StrCat(where_, ": ", other->dir(), " does not match ",
                                                     ref.dir(), ": ", absl::StrJoin(parts, "; ")));
    }
    return absl::OkStatus();
  }

  // The architecture fields of every config.json agree with `ref`'s.
  absl::Status SameConfigs(const SourceCheckpoint& ref,
                           const std::vector<const SourceCheckpoint*>& others) const {
    static const char* kKeys[] = {
        "model_type",          "hidden_size",         "num_hidden_layers", "intermediate_size",
        "num_attention_heads", "num_key_value_heads", "head_dim",          "vocab_size",
        "num_experts",         "tie_word_embeddings", "hidden_act",        "hidden_activation"};
    const json& a = TextConfig(ref.config());
    for (const SourceCheckpoint* other : others) {
      const json& b = TextConfig(other->config());
      if (other == &ref || a.is_null() || b.is_null()) continue;
      std::vector<std::string> diffs;
      for (const char* key : kKeys) {
        json va = a.contains(key) ? a[key] : json(), vb = b.contains(key) ? b[key] : json();
        if (va != vb) diffs.push_back(absl::StrCat(key, " ", va.dump(), " vs ", vb.dump()));
      }
      if (!diffs.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where_, ": config.json of ", other->dir(),
                                                       " is incompatible with ", ref.dir(), ": ",
                                                       Listed(diffs)));
      }
    }
    return absl::OkStatus();
  }

  absl::Status FloatOnly(const std::string& name, io::Dtype dtype) const {
    if (IsFloatDtype(dtype)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(where_, ": tensor \"", name, "\" has dtype ",
                                                   io::DtypeName(dtype),
                                                   "; only float tensors can be merged"));
  }

  // Adds a tensor to `out`.
  static void Add(PlannedOutput& out, const std::string& name, io::Dtype dtype,
                  std::vector<int64_t> shape, Recipe recipe) {
    out.tensors.push_back(OutputTensor{name, dtype, std::move(shape)});
    out.recipes.push_back(std::move(recipe));
  }

  static Recipe Copy(const SourceCheckpoint::Tensor& t) {
    Recipe r;
    r.kind = Recipe::Kind::kCopy;
    r.anchor = InputOf(t);
    return r;
  }

  PlannedOutput NewOutput(const std::string& out, const SourceCheckpoint& carry,
                          std::vector<std::string> parents) const {
    PlannedOutput o;
    o.out = out;
    o.carry_from = carry.dir();
    o.parents = std::move(parents);
    o.params = SpecParams(spec_);
    return o;
  }

  int NumLayers(const SourceCheckpoint& src) const {
    const json& c = TextConfig(src.config());
    if (c.is_object() && c.contains("num_hidden_layers") &&
        c["num_hidden_layers"].is_number_integer()) {
      return c["num_hidden_layers"].get<int>();
    }
    int n = 0;
    for (const std::string& name : src.names()) n = std::max(n, LayerOf(name) + 1);
    return n;
  }

  // The selection of `layers`, `modules` and `pattern` (`field` names them in errors).
  // With none of them and `middle_by_default`, the middle layers. Layer ranges resolve
  // against the model's `num_layers` (common/layer_range.h); the resolved ranges are
  // appended to `resolved` for the start event.
  template <typename Layers, typename Modules>
  absl::StatusOr<TensorSelector> Selector(const std::string& field, const Layers& layers,
                                          const Modules& modules, const std::string& pattern,
                                          int num_layers, bool middle_by_default,
                                          json* resolved) const {
    TensorSelector sel;
    std::vector<std::string> ranges(layers.begin(), layers.end());
    if (ranges.empty() && modules.empty() && pattern.empty() && middle_by_default)
      ranges.push_back("middle");
    for (size_t i = 0; i < ranges.size(); ++i) {
      const std::string key = absl::StrCat(field, "layers[", i, "]");
      auto parsed = ParseLayerRange(ranges[i], absl::StrCat(where_, ": ", key));
      if (!parsed.ok()) return parsed.status();
      auto range = ResolveLayerRange(*parsed, num_layers, absl::StrCat(where_, ": ", key));
      if (!range.ok()) return range.status();
      sel.layers.emplace_back(static_cast<int>(range->begin), static_cast<int>(range->end));
      sel.has_layers = true;
      if (resolved != nullptr) resolved->push_back(FormatLayerRange(*range));
    }
    sel.modules.assign(modules.begin(), modules.end());
    sel.pattern = pattern;
    return sel;
  }

  absl::Status Merge(const v1::MergeSpec& spec);
  absl::Status Revert(const v1::RevertSpec& spec);
  absl::Status Interpolate(const v1::InterpolateSpec& spec);
  absl::Status Graft(const v1::GraftSpec& spec);
  absl::Status Upcycle(const v1::UpcycleSpec& spec);

 private:
  MergePlan& plan_;
  const google::protobuf::Message& spec_;
  std::string where_;
  std::optional<io::Dtype> dtype_;
};

absl::Status Planner::Merge(const v1::MergeSpec& spec) {
  RETURN_IF_ERROR(Common(spec));
  const std::string& method = spec.method();
  // Defaults per method, as mergekit's registry.
  GeneralizedParams g;
  bool normalize = true;
  if (method == "task_arithmetic") {
    normalize = false;
  } else if (method == "ties") {
    g.sparsify = Sparsify::kMagnitude, g.consensus = true;
  } else if (method == "dare_linear") {
    g.sparsify = Sparsify::kRandom, g.rescale = true, normalize = false;
  } else if (method == "dare_ties") {
    g.sparsify = Sparsify::kRandom, g.consensus = true, g.rescale = true, normalize = false;
  }
  g.normalize = spec.has_normalize() ? spec.normalize() : normalize;
  if (spec.has_rescale()) g.rescale = spec.rescale();
  g.lambda = spec.has_lambda() ? spec.lambda() : 1.0;
  const uint64_t seed = spec.seed();
  g.seed = seed;
  const bool linear = method == "linear";

  std::vector<const SourceCheckpoint*> models;
  std::vector<double> weights, densities;
  for (int i = 0; i < spec.models_size(); ++i) {
    const v1::MergeModel& m = spec.models(i);
    ASSIGN_OR_RETURN(const SourceCheckpoint* src,
                     Open(absl::StrCat("models[", i, "].path"), m.path()));
    models.push_back(src);
    weights.push_back(m.weight());
    densities.push_back(m.has_density() ? m.density() : 1.0);
  }
  double weight_sum = 0;
  for (double w : weights) weight_sum += w;
  const SourceCheckpoint* base = nullptr;
  if (!linear) {
    ASSIGN_OR_RETURN(base, Open("base", spec.base()));
  }
  const SourceCheckpoint& ref = base ? *base : *models[0];
  std::vector<const SourceCheckpoint*> all = models;
  RETURN_IF_ERROR(SameTensors(ref, all));
  RETURN_IF_ERROR(SameConfigs(ref, all));
  const std::string& out = spec.out();

  std::vector<std::string> parents;
  if (base) parents.push_back(base->dir());
  for (const SourceCheckpoint* m : models) parents.push_back(m->dir());
  PlannedOutput o = NewOutput(out, ref, parents);
  o.params["method"] = method;
  o.params["normalize"] = g.normalize;
  if (!linear) {
    o.params["rescale"] = g.rescale;
    o.params["lambda"] = g.lambda;
    o.params["seed"] = seed;
  }
  for (const std::string& name : ref.names()) {
    const auto anchor = ref.Find(name);
    RETURN_IF_ERROR(FloatOnly(name, anchor.info->dtype));
    Recipe r;
    r.kind = linear ? Recipe::Kind::kLinear : Recipe::Kind::kGeneralized;
    r.anchor = InputOf(anchor);
    r.generalized = g;
    for (size_t i = 0; i < models.size(); ++i) {
      Term t;
      t.x = InputOf(models[i]->Find(name));
      t.coef = linear && g.normalize ? weights[i] / weight_sum : weights[i];
      t.density = densities[i];
      if (g.sparsify == Sparsify::kMagnitude && t.density < 1.0 &&
          static_cast<int64_t>(t.density * static_cast<double>(anchor.info->numel())) < 1) {
        return Error(absl::StrCat("models[", i, "].density"),
                     absl::StrCat(t.density, " keeps no element of tensor \"", name, "\" (",
                                  anchor.info->numel(), " elements)"));
      }
      r.terms.push_back(t);
    }
    Add(o, name, OutDtype(anchor.info->dtype), anchor.info->shape, std::move(r));
  }
  plan_.outputs.push_back(std::move(o));
  return absl::OkStatus();
}

absl::Status Planner::Revert(const v1::RevertSpec& spec) {
  RETURN_IF_ERROR(Common(spec));
  ASSIGN_OR_RETURN(const SourceCheckpoint* base, Open("base", spec.base()));
  ASSIGN_OR_RETURN(const SourceCheckpoint* model, Open("model", spec.model()));
  RETURN_IF_ERROR(SameTensors(*model, {base}));
  RETURN_IF_ERROR(SameConfigs(*model, {base}));
  json layers = json::array();
  ASSIGN_OR_RETURN(TensorSelector sel,
                   Selector("", spec.layers(), spec.modules(), spec.pattern(), NumLayers(*model),
                            /*middle_by_default=*/true, &layers));
  plan_.start["layers"] = layers;
  plan_.start["num_layers"] = NumLayers(*model);
  PlannedOutput o = NewOutput(spec.out(), *model, {model->dir(), base->dir()});
  int reverted = 0;
  for (const std::string& name : model->names()) {
    const bool revert = sel.Matches(name);
    const auto t = (revert ? base : model)->Find(name);
    reverted += revert;
    Add(o, name, OutDtype(t.info->dtype), t.info->shape, Copy(t));
  }
  if (reverted == 0) return Error("layers", "the selection matches no tensor");
  o.params["reverted_tensors"] = reverted;
  o.params["layers_resolved"] = layers;
  plan_.outputs.push_back(std::move(o));
  return absl::OkStatus();
}

absl::Status Planner::Interpolate(const v1::InterpolateSpec& spec) {
  RETURN_IF_ERROR(Common(spec));
  ASSIGN_OR_RETURN(const SourceCheckpoint* base, Open("base", spec.base()));
  ASSIGN_OR_RETURN(const SourceCheckpoint* model, Open("model", spec.model()));
  RETURN_IF_ERROR(SameTensors(*model, {base}));
  RETURN_IF_ERROR(SameConfigs(*model, {base}));
  const int layers = NumLayers(*model);
  plan_.start["num_layers"] = layers;

  // Each output: (directory, alpha for a tensor name; tensors no range selects keep alpha 1).
  struct Range {
    TensorSelector sel;
    double alpha;
  };
  std::vector<std::pair<std::string, std::vector<Range>>> outputs;
  if (spec.ranges_size() > 0) {
    std::vector<Range> ranges;
    json shown = json::array();
    for (int i = 0; i < spec.ranges_size(); ++i) {
      const v1::InterpolateRange& r = spec.ranges(i);
      json resolved = json::array();
      ASSIGN_OR_RETURN(TensorSelector sel,
                       Selector(absl::StrCat("ranges[", i, "]."), r.layers(), r.modules(),
                                r.pattern(), layers, /*middle_by_default=*/false, &resolved));
      ranges.push_back({sel, r.alpha()});
      shown.push_back({{"layers", resolved}, {"alpha", r.alpha()}});
    }
    plan_.start["ranges"] = shown;
    outputs.emplace_back(spec.out(), ranges);
  } else {
    json resolved = json::array();
    ASSIGN_OR_RETURN(TensorSelector sel, Selector("", spec.layers(), spec.modules(), spec.pattern(),
                                                  layers, /*middle_by_default=*/false, &resolved));
    plan_.start["layers"] = resolved;
    if (spec.has_alpha()) {
      outputs.emplace_back(spec.out(), std::vector<Range>{{sel, spec.alpha()}});
    } else {
      for (double a : spec.alphas()) {
        outputs.emplace_back(
            absl::StrReplaceAll(spec.out_pattern(), {{"{alpha}", absl::StrCat(a)}}),
            std::vector<Range>{{sel, a}});
      }
    }
  }
  for (auto& [out, ranges] : outputs) {
    PlannedOutput o = NewOutput(out, *model, {base->dir(), model->dir()});
    if (spec.alphas_size() > 0) o.name = absl::StrCat("model_alpha_", ranges[0].alpha);
    json applied = json::array();
    for (const Range& r : ranges) applied.push_back(r.alpha);
    o.params["alpha_per_range"] = applied;
    for (const std::string& name : model->names()) {
      double alpha = 1.0;
      for (const Range& r : ranges) {
        if (r.sel.Matches(name)) {
          alpha = r.alpha;
          break;
        }
      }
      const auto theta = model->Find(name), theta_base = base->Find(name);
      const io::Dtype dtype = OutDtype(theta.info->dtype);
      if (alpha == 1.0 || alpha == 0.0) {  // exact: the trained or the base tensor itself
        Add(o, name, dtype, theta.info->shape, Copy(alpha == 1.0 ? theta : theta_base));
        continue;
      }
      RETURN_IF_ERROR(FloatOnly(name, theta.info->dtype));
      Recipe r;
      r.kind = Recipe::Kind::kDelta;  // base + alpha * (theta - base)
      r.anchor = InputOf(theta_base);
      r.terms.push_back(Term{InputOf(theta), InputOf(theta_base), alpha, 1.0});
      Add(o, name, dtype, theta.info->shape, std::move(r));
    }
    plan_.outputs.push_back(std::move(o));
  }
  return absl::OkStatus();
}

// "…layers.3.mlp.experts.5.up_proj.weight" -> "…layers.3.mlp.up_proj.weight".
std::string DenseNameOf(const std::string& name) {
  static const std::regex kExpert(R"(\.mlp\.experts\.\d+\.)");
  return std::regex_replace(name, kExpert, ".mlp.");
}

bool IsRouter(const std::string& name) {
  static const std::regex kRouter(R"(layers\.\d+\.mlp\.gate\.weight$)");
  return std::regex_search(name, kRouter);
}

absl::Status Planner::Graft(const v1::GraftSpec& spec) {
  RETURN_IF_ERROR(Common(spec));
  ASSIGN_OR_RETURN(const SourceCheckpoint* base, Open("base", spec.base()));
  ASSIGN_OR_RETURN(const SourceCheckpoint* instruct, Open("instruct", spec.instruct()));
  ASSIGN_OR_RETURN(const SourceCheckpoint* target, Open("target", spec.target()));
  const double scale = spec.scale();
  RETURN_IF_ERROR(SameTensors(*base, {instruct}));
  RETURN_IF_ERROR(SameConfigs(*base, {instruct}));
  const std::string& out = spec.out();
  PlannedOutput o = NewOutput(out, *target, {target->dir(), base->dir(), instruct->dir()});
  std::set<std::string> used;
  std::vector<std::string> unmatched, bad_shapes;
  int grafted = 0;
  for (const std::string& name : target->names()) {
    const auto t = target->Find(name);
    const std::string dense = DenseNameOf(name);
    const auto b = base->Find(dense);
    if (b.info == nullptr) {
      if (IsRouter(name)) {  // no dense counterpart: the router keeps its trained value
        Add(o, name, OutDtype(t.info->dtype), t.info->shape, Copy(t));
      } else {
        unmatched.push_back(name);
      }
      continue;
    }
    used.insert(dense);
    const auto& ts = t.info->shape;
    const auto& bs = b.info->shape;
    // Equal shapes, or a vocabulary grown after the base (more rows): the delta applies to
    // the leading rows only.
    const bool grown = ts.size() == bs.size() && !ts.empty() && ts[0] > bs[0] &&
                       std::equal(ts.begin() + 1, ts.end(), bs.begin() + 1);
    if (ts != bs && !grown) {
      bad_shapes.push_back(absl::StrCat(name, " ", Shape(ts), " vs ", dense, " ", Shape(bs)));
      continue;
    }
    RETURN_IF_ERROR(FloatOnly(name, t.info->dtype));
    Recipe r;
    r.kind = Recipe::Kind::kDelta;  // target + scale * (instruct - base)
    r.anchor = InputOf(t);
    r.terms.push_back(Term{InputOf(instruct->Find(dense)), InputOf(b), scale, 1.0});
    Add(o, name, OutDtype(t.info->dtype), ts, std::move(r));
    ++grafted;
  }
  std::vector<std::string> unused;
  for (const std::string& name : base->names()) {
    if (!used.count(name)) unused.push_back(name);
  }
  std::vector<std::string> problems;
  if (!unmatched.empty())
    problems.push_back(absl::StrCat(
        unmatched.size(), " target tensors have no dense counterpart: ", Listed(unmatched)));
  if (!unused.empty())
    problems.push_back(absl::StrCat(
        unused.size(), " dense tensors have no place in the target (their delta would be lost): ",
        Listed(unused)));
  if (!bad_shapes.empty())
    problems.push_back(absl::StrCat(bad_shapes.size(), " shapes differ: ", Listed(bad_shapes)));
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": cannot graft ", instruct->dir(),
                                                   " - ", base->dir(), " onto ", target->dir(),
                                                   ": ", absl::StrJoin(problems, "; ")));
  }
  o.params["grafted_tensors"] = grafted;
  plan_.outputs.push_back(std::move(o));
  return absl::OkStatus();
}

absl::Status Planner::Upcycle(const v1::UpcycleSpec& spec) {
  RETURN_IF_ERROR(Common(spec));
  ASSIGN_OR_RETURN(const SourceCheckpoint* dense, Open("model", spec.model()));
  const int64_t experts = spec.experts();
  const int64_t top_k = spec.top_k();
  const bool norm_topk = spec.norm_topk_prob();
  const double aux_coef = spec.router_aux_loss_coef();
  v1::RouterInit init = spec.router_init();
  FillSpecDefaults(&init);  // an unset router_init: {method: normal, std: 0.02, seed: 0}
  Recipe router;
  router.kind = init.method() == "zeros" ? Recipe::Kind::kZeros : Recipe::Kind::kNormal;
  router.stddev = init.std();
  router.seed = init.seed();
  const std::string& router_method = init.method();
  json config = dense->config();
  if (!config.is_object()) return Error("model", dense->dir() + " has no config.json");
  json& text = config.contains("text_config") && config["text_config"].is_object()
                   ? config["text_config"]
                   : config;
  const std::string type = config.value("model_type", "");
  if (type != "llama" && type != "qwen2" && type != "gemma3_text" && type != "gemma3") {
    return Error("model",
                 absl::StrCat(dense->dir(), ": model_type \"", type,
                              "\" cannot be upcycled (llama, qwen2, gemma3_text, gemma3)"));
  }
  if (text.contains("num_experts"))
    return Error("model", dense->dir() + " is already a mixture of experts");
  if (text.value("mlp_bias", false))
    return Error("model", dense->dir() + ": MLP biases (mlp_bias) cannot be upcycled");
  text["num_experts"] = experts;
  text["num_experts_per_tok"] = top_k;
  text["norm_topk_prob"] = norm_topk;
  text["router_aux_loss_coef"] = aux_coef;

  PlannedOutput o = NewOutput(spec.out(), *dense, {dense->dir()});
  o.files["config.json"] = config.dump(2) + "\n";
  o.params["router_init"] = {
      {"method", router_method}, {"std", router.stddev}, {"seed", router.seed}};
  static const std::regex kMlp(R"(^(.*layers\.\d+\.mlp\.)(gate|up|down)_proj\.(weight|bias)$)");
  std::map<std::string, int> parts_per_layer;
  for (const std::string& name : dense->names()) {
    const auto t = dense->Find(name);
    std::smatch m;
    if (!std::regex_match(name, m, kMlp)) {
      Add(o, name, OutDtype(t.info->dtype), t.info->shape, Copy(t));
      continue;
    }
    if (m[3] == "bias") return Error("model", "MLP bias " + name + " cannot be upcycled");
    const std::string prefix = m[1], proj = m[2];
    for (int64_t e = 0; e < experts; ++e) {
      Add(o, absl::StrCat(prefix, "experts.", e, ".", proj, "_proj.weight"),
          OutDtype(t.info->dtype), t.info->shape, Copy(t));
    }
    ++parts_per_layer[prefix];
    if (proj == "gate") {  // one router per layer: [experts, hidden]
      RETURN_IF_ERROR(FloatOnly(name, t.info->dtype));
      Add(o, prefix + "gate.weight", OutDtype(t.info->dtype), {experts, t.info->shape.at(1)},
          router);
    }
  }
  for (const auto& [prefix, parts] : parts_per_layer) {
    if (parts != 3) return Error("model", prefix + " lacks one of gate_proj, up_proj, down_proj");
  }
  if (parts_per_layer.empty())
    return Error("model", dense->dir() + " has no layers.N.mlp.*_proj tensors");
  o.params["moe_layers"] = parts_per_layer.size();
  plan_.outputs.push_back(std::move(o));
  return absl::OkStatus();
}

}  // namespace

bool IsVisionTensor(const std::string& name) {
  return absl::StrContains(name, "vision_tower.") ||
         absl::StrContains(name, "multi_modal_projector.");
}

int LayerOf(const std::string& name) {
  // A multimodal checkpoint's vision encoder has layers of its own; they are not the
  // decoder's and no layer range selects them.
  if (IsVisionTensor(name)) return -1;
  static const std::regex kLayer(R"((?:^|\.)layers\.(\d+)\.)");
  std::smatch m;
  if (!std::regex_search(name, m, kLayer)) return -1;
  return std::stoi(m[1]);
}

bool TensorSelector::Matches(const std::string& name) const {
  if (has_layers) {
    const int layer = LayerOf(name);
    bool in = false;
    for (const auto& [a, b] : layers) in = in || (layer >= a && layer < b);
    if (!in) return false;
  }
  if (!modules.empty()) {
    if (IsVisionTensor(name)) return false;
    bool in = false;
    for (const std::string& m : modules) {
      if (m == "attention") in = in || absl::StrContains(name, ".self_attn.");
      if (m == "mlp") in = in || absl::StrContains(name, ".mlp.");
      if (m == "norms") in = in || absl::StrContains(name, "norm.");
      if (m == "embeddings")
        in = in || absl::StrContains(name, "embed_tokens.") || absl::StrContains(name, "lm_head.");
    }
    if (!in) return false;
  }
  if (!pattern.empty() && !std::regex_search(name, std::regex(pattern))) return false;
  return true;
}

absl::StatusOr<MergePlan> PlanFromSpec(const google::protobuf::Message& spec,
                                       const std::string& where) {
  MergePlan plan;
  Planner planner(plan, spec, where);
  absl::Status s;
  std::string command;
  if (const auto* m = dynamic_cast<const v1::MergeSpec*>(&spec)) {
    command = "merge", s = planner.Merge(*m);
  } else if (const auto* r = dynamic_cast<const v1::RevertSpec*>(&spec)) {
    command = "revert", s = planner.Revert(*r);
  } else if (const auto* i = dynamic_cast<const v1::InterpolateSpec*>(&spec)) {
    command = "interpolate", s = planner.Interpolate(*i);
  } else if (const auto* g = dynamic_cast<const v1::GraftSpec*>(&spec)) {
    command = "graft", s = planner.Graft(*g);
  } else if (const auto* u = dynamic_cast<const v1::UpcycleSpec*>(&spec)) {
    command = "upcycle", s = planner.Upcycle(*u);
  } else {
    s = absl::InvalidArgumentError(
        absl::StrCat(where, ": ", spec.GetDescriptor()->name(), " is not a merge-area spec"));
  }
  RETURN_IF_ERROR(s);
  for (PlannedOutput& o : plan.outputs) o.params["command"] = command;
  return plan;
}

}  // namespace stemma::engine::merge
