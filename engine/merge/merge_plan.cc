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
#include "common/spec_file.h"
#include "common/status.h"
#include "engine/merge/dtype_convert.h"

namespace stemma::engine::merge {
namespace {

using nlohmann::json;

// How many differences an error lists before "and N more".
constexpr size_t kListed = 8;

// Reads spec fields with errors of the form "<file>: <field>: <problem>".
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}
  const std::string& where() const { return where_; }
  bool Has(const std::string& key) const { return obj_.contains(key) && !obj_[key].is_null(); }
  const json& at(const std::string& key) const { return obj_.at(key); }
  absl::Status Error(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", key, ": ", what));
  }
  absl::StatusOr<std::string> String(const std::string& key) const {
    if (!Has(key)) return Error(key, "is required");
    if (!obj_[key].is_string() || obj_[key].get<std::string>().empty()) {
      return Error(key, "must be a non-empty string");
    }
    return obj_[key].get<std::string>();
  }
  absl::StatusOr<double> Number(const std::string& key, std::optional<double> fallback) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return Error(key, "is required");
    }
    if (!obj_[key].is_number()) return Error(key, "must be a number");
    double v = obj_[key].get<double>();
    if (!std::isfinite(v)) return Error(key, "must be finite");
    return v;
  }
  absl::StatusOr<int64_t> Int(const std::string& key, std::optional<int64_t> fallback) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return Error(key, "is required");
    }
    if (!obj_[key].is_number_integer()) return Error(key, "must be an integer");
    return obj_[key].get<int64_t>();
  }
  absl::StatusOr<bool> Bool(const std::string& key, bool fallback) const {
    if (!Has(key)) return fallback;
    if (!obj_[key].is_boolean()) return Error(key, "must be true or false");
    return obj_[key].get<bool>();
  }

 private:
  const json& obj_;
  std::string where_;
};

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string Listed(const std::vector<std::string>& items) {
  std::vector<std::string> shown(items.begin(), items.begin() + std::min(items.size(), kListed));
  std::string s = absl::StrJoin(shown, ", ");
  if (items.size() > kListed) absl::StrAppend(&s, " and ", items.size() - kListed, " more");
  return s;
}

// "bfloat16" -> kBF16; "source" / absent -> nullopt (keep each tensor's input dtype).
absl::StatusOr<std::optional<io::Dtype>> OutDtypeField(const Fields& f) {
  if (!f.Has("dtype")) return std::optional<io::Dtype>();
  ASSIGN_OR_RETURN(std::string name, f.String("dtype"));
  name = absl::AsciiStrToLower(name);
  if (name == "source") return std::optional<io::Dtype>();
  if (name == "bfloat16" || name == "bf16") return std::optional<io::Dtype>(io::Dtype::kBF16);
  if (name == "float16" || name == "fp16" || name == "f16") return std::optional<io::Dtype>(io::Dtype::kF16);
  if (name == "float32" || name == "fp32" || name == "f32") return std::optional<io::Dtype>(io::Dtype::kF32);
  return f.Error("dtype", "\"" + name + "\" is not one of bfloat16, float16, float32, source");
}

// 5000000000, "5GB", "500MB", "2GiB".
absl::StatusOr<uint64_t> ShardSizeField(const Fields& f) {
  if (!f.Has("shard_size")) return uint64_t{5'000'000'000};
  const json& v = f.at("shard_size");
  if (v.is_number_integer() && v.get<int64_t>() > 0) return v.get<uint64_t>();
  if (v.is_string()) {
    std::string s = absl::AsciiStrToUpper(v.get<std::string>());
    const std::pair<const char*, uint64_t> units[] = {{"GIB", 1ull << 30}, {"MIB", 1ull << 20},
                                                      {"KIB", 1ull << 10}, {"GB", 1000000000ull},
                                                      {"MB", 1000000ull},  {"KB", 1000ull},
                                                      {"B", 1ull}};
    for (const auto& [suffix, scale] : units) {
      if (!absl::EndsWith(s, suffix)) continue;
      double n = 0;
      if (absl::SimpleAtod(s.substr(0, s.size() - std::strlen(suffix)), &n) && n > 0) {
        return static_cast<uint64_t>(n * static_cast<double>(scale));
      }
      break;
    }
  }
  return f.Error("shard_size", "must be a positive byte count (e.g. 5000000000 or \"5GB\")");
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
  Planner(MergePlan& plan, const json& spec, std::string where)
      : plan_(plan), spec_(spec), f_(spec, std::move(where)) {}

  absl::Status Common() {
    ASSIGN_OR_RETURN(dtype_, OutDtypeField(f_));
    ASSIGN_OR_RETURN(plan_.max_shard_bytes, ShardSizeField(f_));
    ASSIGN_OR_RETURN(plan_.overwrite, f_.Bool("overwrite", false));
    ASSIGN_OR_RETURN(plan_.tensor_hashes, f_.Bool("tensor_hashes", false));
    ASSIGN_OR_RETURN(plan_.direct_io, f_.Bool("direct_io", true));
    return absl::OkStatus();
  }

  absl::StatusOr<const SourceCheckpoint*> Open(const std::string& key, const std::string& path) {
    for (const auto& s : plan_.sources) {
      if (s->dir() == path) return s.get();
    }
    auto opened = SourceCheckpoint::Open(path);
    if (!opened.ok()) {
      return absl::Status(opened.status().code(),
                          absl::StrCat(f_.where(), ": ", key, ": ", opened.status().message()));
    }
    plan_.sources.push_back(std::move(*opened));
    return plan_.sources.back().get();
  }

  absl::StatusOr<const SourceCheckpoint*> OpenField(const std::string& key) {
    ASSIGN_OR_RETURN(std::string path, f_.String(key));
    return Open(key, path);
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
      if (!missing.empty()) parts.push_back(absl::StrCat(missing.size(), " tensors missing: ", Listed(missing)));
      if (!extra.empty()) parts.push_back(absl::StrCat(extra.size(), " tensors not in ", ref.dir(), ": ", Listed(extra)));
      if (!shapes.empty()) parts.push_back(absl::StrCat(shapes.size(), " differ: ", Listed(shapes)));
      return absl::InvalidArgumentError(absl::StrCat(f_.where(), ": ", other->dir(), " does not match ",
                                                     ref.dir(), ": ", absl::StrJoin(parts, "; ")));
    }
    return absl::OkStatus();
  }

  // The architecture fields of every config.json agree with `ref`'s.
  absl::Status SameConfigs(const SourceCheckpoint& ref,
                           const std::vector<const SourceCheckpoint*>& others) const {
    static const char* kKeys[] = {"model_type",          "hidden_size",        "num_hidden_layers",
                                  "intermediate_size",   "num_attention_heads", "num_key_value_heads",
                                  "head_dim",            "vocab_size",          "num_experts",
                                  "tie_word_embeddings", "hidden_act",          "hidden_activation"};
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
        return absl::InvalidArgumentError(absl::StrCat(f_.where(), ": config.json of ", other->dir(),
                                                       " is incompatible with ", ref.dir(), ": ",
                                                       Listed(diffs)));
      }
    }
    return absl::OkStatus();
  }

  absl::Status FloatOnly(const std::string& name, io::Dtype dtype) const {
    if (IsFloatDtype(dtype)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(f_.where(), ": tensor \"", name, "\" has dtype ",
                                                   io::DtypeName(dtype), "; only float tensors can be merged"));
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
    o.params = spec_;
    return o;
  }

  int NumLayers(const SourceCheckpoint& src) const {
    const json& c = TextConfig(src.config());
    if (c.is_object() && c.contains("num_hidden_layers") && c["num_hidden_layers"].is_number_integer()) {
      return c["num_hidden_layers"].get<int>();
    }
    int n = 0;
    for (const std::string& name : src.names()) n = std::max(n, LayerOf(name) + 1);
    return n;
  }

  // `layers`, `modules` and `pattern` of `obj`. With none of them, `fallback_layers`
  // ("middle" or "all") applies.
  absl::StatusOr<TensorSelector> Selector(const Fields& f, int num_layers,
                                          const std::string& fallback_layers) const {
    TensorSelector sel;
    const bool any = f.Has("layers") || f.Has("modules") || f.Has("pattern");
    json layers = f.Has("layers") ? f.at("layers") : (any ? json() : json(fallback_layers));
    if (!layers.is_null()) {
      sel.has_layers = true;
      auto range = [&](const json& r) -> absl::Status {
        if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() || !r[1].is_number_integer()) {
          return f.Error("layers", "must be \"middle\", \"all\", [first, last] or a list of [first, last]");
        }
        int a = r[0].get<int>(), b = r[1].get<int>();
        if (a < 0 || b < a || b >= num_layers) {
          return f.Error("layers", absl::StrCat("range [", a, ", ", b, "] is not inside the model's ",
                                                num_layers, " layers (0-indexed, inclusive)"));
        }
        sel.layers.emplace_back(a, b);
        return absl::OkStatus();
      };
      if (layers.is_string() && layers.get<std::string>() == "middle") {
        sel.layers.push_back(MiddleLayers(num_layers));
      } else if (layers.is_string() && layers.get<std::string>() == "all") {
        sel.has_layers = false;  // no layer restriction (non-layer tensors included)
      } else if (layers.is_array() && !layers.empty() && layers[0].is_array()) {
        for (const json& r : layers) RETURN_IF_ERROR(range(r));
      } else {
        RETURN_IF_ERROR(range(layers));
      }
    }
    if (f.Has("modules")) {
      const json& m = f.at("modules");
      if (!m.is_array() || m.empty()) return f.Error("modules", "must be a non-empty list");
      for (const json& v : m) {
        static const std::set<std::string> kModules = {"attention", "mlp", "norms", "embeddings"};
        if (!v.is_string() || !kModules.count(v.get<std::string>())) {
          return f.Error("modules", absl::StrCat(v.dump(), " is not one of attention, mlp, norms, embeddings"));
        }
        sel.modules.push_back(v.get<std::string>());
      }
    }
    if (f.Has("pattern")) {
      ASSIGN_OR_RETURN(sel.pattern, f.String("pattern"));
      try {
        std::regex check(sel.pattern);
      } catch (const std::regex_error& e) {
        return f.Error("pattern", absl::StrCat("not a valid regular expression: ", e.what()));
      }
    }
    return sel;
  }

  absl::Status Merge();
  absl::Status Revert();
  absl::Status Interpolate();
  absl::Status Graft();
  absl::Status Upcycle();

 private:
  MergePlan& plan_;
  const json& spec_;
  Fields f_;
  std::optional<io::Dtype> dtype_;
};

absl::Status Planner::Merge() {
  RETURN_IF_ERROR(CheckKeys(spec_, {"method", "base", "models", "out", "dtype", "normalize", "lambda",
                                    "rescale", "seed", "shard_size", "tensor_hashes", "direct_io", "overwrite"}, f_.where()));
  RETURN_IF_ERROR(Common());
  std::string method = "linear";
  if (f_.Has("method")) {
    ASSIGN_OR_RETURN(method, f_.String("method"));
  }
  // Defaults per method, as mergekit's registry.
  GeneralizedParams g;
  bool normalize = true;
  if (method == "linear") {
  } else if (method == "task_arithmetic") {
    normalize = false;
  } else if (method == "ties") {
    g.sparsify = Sparsify::kMagnitude, g.consensus = true;
  } else if (method == "dare_linear") {
    g.sparsify = Sparsify::kRandom, g.rescale = true, normalize = false;
  } else if (method == "dare_ties") {
    g.sparsify = Sparsify::kRandom, g.consensus = true, g.rescale = true, normalize = false;
  } else {
    return f_.Error("method", "\"" + method + "\" is not one of linear, task_arithmetic, ties, dare_linear, dare_ties");
  }
  ASSIGN_OR_RETURN(g.normalize, f_.Bool("normalize", normalize));
  ASSIGN_OR_RETURN(g.rescale, f_.Bool("rescale", g.rescale));
  ASSIGN_OR_RETURN(g.lambda, f_.Number("lambda", 1.0));
  ASSIGN_OR_RETURN(int64_t seed, f_.Int("seed", 0));
  g.seed = static_cast<uint64_t>(seed);
  const bool linear = method == "linear";
  if (linear && (f_.Has("lambda") || f_.Has("rescale") || f_.Has("seed"))) {
    return f_.Error(f_.Has("lambda") ? "lambda" : f_.Has("rescale") ? "rescale" : "seed",
                    "does not apply to method linear");
  }
  if (linear && f_.Has("base")) return f_.Error("base", "linear does not use a base (use task_arithmetic)");

  if (!f_.Has("models") || !f_.at("models").is_array() || f_.at("models").empty()) {
    return f_.Error("models", "must be a non-empty list of checkpoints");
  }
  std::vector<const SourceCheckpoint*> models;
  std::vector<double> weights, densities;
  const json& list = f_.at("models");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string key = absl::StrCat("models[", i, "]");
    json entry = list[i].is_string() ? json{{"path", list[i]}} : list[i];
    if (!entry.is_object()) return f_.Error(key, "must be a path or {path, weight, density}");
    RETURN_IF_ERROR(CheckKeys(entry, {"path", "weight", "density"}, absl::StrCat(f_.where(), ": ", key)));
    Fields e(entry, absl::StrCat(f_.where(), ": ", key));
    ASSIGN_OR_RETURN(std::string path, e.String("path"));
    ASSIGN_OR_RETURN(const SourceCheckpoint* src, Open(key + ".path", path));
    ASSIGN_OR_RETURN(double w, e.Number("weight", 1.0));
    ASSIGN_OR_RETURN(double d, e.Number("density", 1.0));
    if (d <= 0 || d > 1) return e.Error("density", absl::StrCat("must be in (0, 1], got ", d));
    if (e.Has("density") && g.sparsify == Sparsify::kNone) {
      return e.Error("density", "only ties, dare_linear and dare_ties sparsify");
    }
    models.push_back(src);
    weights.push_back(w);
    densities.push_back(d);
  }
  double weight_sum = 0;
  for (double w : weights) weight_sum += w;
  if (linear && g.normalize && !(weight_sum > 1e-8)) {
    return f_.Error("models", absl::StrCat("weights sum to ", weight_sum,
                                            "; a normalised average needs a positive sum"));
  }
  const SourceCheckpoint* base = nullptr;
  if (!linear) {
    ASSIGN_OR_RETURN(base, OpenField("base"));
  }
  const SourceCheckpoint& ref = base ? *base : *models[0];
  std::vector<const SourceCheckpoint*> all = models;
  RETURN_IF_ERROR(SameTensors(ref, all));
  RETURN_IF_ERROR(SameConfigs(ref, all));
  ASSIGN_OR_RETURN(std::string out, f_.String("out"));

  std::vector<std::string> parents;
  if (base) parents.push_back(base->dir());
  for (const SourceCheckpoint* m : models) parents.push_back(m->dir());
  PlannedOutput o = NewOutput(out, ref, parents);
  o.params = spec_;
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
        return f_.Error(absl::StrCat("models[", i, "].density"),
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

absl::Status Planner::Revert() {
  RETURN_IF_ERROR(CheckKeys(spec_, {"base", "model", "out", "layers", "modules", "pattern", "dtype",
                                    "shard_size", "tensor_hashes", "direct_io", "overwrite"}, f_.where()));
  RETURN_IF_ERROR(Common());
  ASSIGN_OR_RETURN(const SourceCheckpoint* base, OpenField("base"));
  ASSIGN_OR_RETURN(const SourceCheckpoint* model, OpenField("model"));
  RETURN_IF_ERROR(SameTensors(*model, {base}));
  RETURN_IF_ERROR(SameConfigs(*model, {base}));
  ASSIGN_OR_RETURN(TensorSelector sel, Selector(f_, NumLayers(*model), "middle"));
  ASSIGN_OR_RETURN(std::string out, f_.String("out"));
  PlannedOutput o = NewOutput(out, *model, {model->dir(), base->dir()});
  int reverted = 0;
  for (const std::string& name : model->names()) {
    const bool revert = sel.Matches(name);
    const auto t = (revert ? base : model)->Find(name);
    reverted += revert;
    Add(o, name, OutDtype(t.info->dtype), t.info->shape, Copy(t));
  }
  if (reverted == 0) return f_.Error("layers", "the selection matches no tensor");
  o.params["reverted_tensors"] = reverted;
  plan_.outputs.push_back(std::move(o));
  return absl::OkStatus();
}

absl::Status Planner::Interpolate() {
  RETURN_IF_ERROR(CheckKeys(spec_, {"base", "model", "out", "alpha", "alphas", "out_pattern", "ranges",
                                    "layers", "modules", "pattern", "dtype", "shard_size", "tensor_hashes", "direct_io", "overwrite"},
                            f_.where()));
  RETURN_IF_ERROR(Common());
  ASSIGN_OR_RETURN(const SourceCheckpoint* base, OpenField("base"));
  ASSIGN_OR_RETURN(const SourceCheckpoint* model, OpenField("model"));
  RETURN_IF_ERROR(SameTensors(*model, {base}));
  RETURN_IF_ERROR(SameConfigs(*model, {base}));
  const int layers = NumLayers(*model);

  // Each output: (directory, alpha for a tensor name; tensors no range selects keep alpha 1).
  struct Range {
    TensorSelector sel;
    double alpha;
  };
  std::vector<std::pair<std::string, std::vector<Range>>> outputs;
  const int forms = f_.Has("alphas") + f_.Has("alpha") + f_.Has("ranges");
  if (forms != 1) return f_.Error("alphas", "give exactly one of alphas (a sweep), alpha, or ranges");
  if (f_.Has("ranges")) {
    if (f_.Has("layers") || f_.Has("modules") || f_.Has("pattern")) {
      return f_.Error("ranges", "each range carries its own layers/modules/pattern");
    }
    const json& list = f_.at("ranges");
    if (!list.is_array() || list.empty()) return f_.Error("ranges", "must be a non-empty list");
    std::vector<Range> ranges;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = absl::StrCat(f_.where(), ": ranges[", i, "]");
      if (!list[i].is_object()) return f_.Error(absl::StrCat("ranges[", i, "]"), "must be an object");
      RETURN_IF_ERROR(CheckKeys(list[i], {"layers", "modules", "pattern", "alpha"}, where));
      Fields e(list[i], where);
      ASSIGN_OR_RETURN(double alpha, e.Number("alpha", std::nullopt));
      ASSIGN_OR_RETURN(TensorSelector sel, Selector(e, layers, "all"));
      ranges.push_back({sel, alpha});
    }
    ASSIGN_OR_RETURN(std::string out, f_.String("out"));
    outputs.emplace_back(out, ranges);
  } else {
    ASSIGN_OR_RETURN(TensorSelector sel, Selector(f_, layers, "all"));
    std::vector<double> alphas;
    if (f_.Has("alpha")) {
      ASSIGN_OR_RETURN(double a, f_.Number("alpha", std::nullopt));
      alphas.push_back(a);
      ASSIGN_OR_RETURN(std::string out, f_.String("out"));
      outputs.emplace_back(out, std::vector<Range>{{sel, a}});
    } else {
      const json& list = f_.at("alphas");
      if (!list.is_array() || list.empty()) return f_.Error("alphas", "must be a non-empty list of numbers");
      if (f_.Has("out")) return f_.Error("out", "a sweep writes one checkpoint per alpha: use out_pattern");
      ASSIGN_OR_RETURN(std::string pattern, f_.String("out_pattern"));
      if (!absl::StrContains(pattern, "{alpha}")) return f_.Error("out_pattern", "must contain {alpha}");
      std::set<std::string> seen;
      for (const json& a : list) {
        if (!a.is_number() || !std::isfinite(a.get<double>())) return f_.Error("alphas", "must be finite numbers");
        std::string out = absl::StrReplaceAll(pattern, {{"{alpha}", absl::StrCat(a.get<double>())}});
        if (!seen.insert(out).second) return f_.Error("alphas", "repeats " + a.dump());
        outputs.emplace_back(out, std::vector<Range>{{sel, a.get<double>()}});
      }
    }
  }
  for (auto& [out, ranges] : outputs) {
    PlannedOutput o = NewOutput(out, *model, {base->dir(), model->dir()});
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

absl::Status Planner::Graft() {
  RETURN_IF_ERROR(CheckKeys(spec_, {"base", "instruct", "target", "out", "scale", "dtype", "shard_size", "tensor_hashes", "direct_io",
                                    "overwrite"}, f_.where()));
  RETURN_IF_ERROR(Common());
  ASSIGN_OR_RETURN(const SourceCheckpoint* base, OpenField("base"));
  ASSIGN_OR_RETURN(const SourceCheckpoint* instruct, OpenField("instruct"));
  ASSIGN_OR_RETURN(const SourceCheckpoint* target, OpenField("target"));
  ASSIGN_OR_RETURN(double scale, f_.Number("scale", 1.0));
  RETURN_IF_ERROR(SameTensors(*base, {instruct}));
  RETURN_IF_ERROR(SameConfigs(*base, {instruct}));
  ASSIGN_OR_RETURN(std::string out, f_.String("out"));
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
  if (!unmatched.empty()) problems.push_back(absl::StrCat(unmatched.size(), " target tensors have no dense counterpart: ", Listed(unmatched)));
  if (!unused.empty()) problems.push_back(absl::StrCat(unused.size(), " dense tensors have no place in the target (their delta would be lost): ", Listed(unused)));
  if (!bad_shapes.empty()) problems.push_back(absl::StrCat(bad_shapes.size(), " shapes differ: ", Listed(bad_shapes)));
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(f_.where(), ": cannot graft ", instruct->dir(), " - ",
                                                   base->dir(), " onto ", target->dir(), ": ",
                                                   absl::StrJoin(problems, "; ")));
  }
  o.params["grafted_tensors"] = grafted;
  plan_.outputs.push_back(std::move(o));
  return absl::OkStatus();
}

absl::Status Planner::Upcycle() {
  RETURN_IF_ERROR(CheckKeys(spec_, {"model", "out", "experts", "top_k", "norm_topk_prob", "router_init",
                                    "router_aux_loss_coef", "dtype", "shard_size", "tensor_hashes", "direct_io", "overwrite"},
                            f_.where()));
  RETURN_IF_ERROR(Common());
  ASSIGN_OR_RETURN(const SourceCheckpoint* dense, OpenField("model"));
  ASSIGN_OR_RETURN(int64_t experts, f_.Int("experts", std::nullopt));
  ASSIGN_OR_RETURN(int64_t top_k, f_.Int("top_k", 2));
  ASSIGN_OR_RETURN(bool norm_topk, f_.Bool("norm_topk_prob", true));
  ASSIGN_OR_RETURN(double aux_coef, f_.Number("router_aux_loss_coef", 0.01));
  if (experts < 1) return f_.Error("experts", "must be at least 1");
  if (top_k < 1 || top_k > experts) return f_.Error("top_k", absl::StrCat("must be in [1, experts=", experts, "]"));
  Recipe router;
  router.kind = Recipe::Kind::kNormal;
  router.stddev = 0.02;
  std::string router_method = "normal";
  if (f_.Has("router_init")) {
    const json& ri = f_.at("router_init");
    const std::string where = f_.where() + ": router_init";
    if (!ri.is_object()) return f_.Error("router_init", "must be an object {method, std, seed}");
    RETURN_IF_ERROR(CheckKeys(ri, {"method", "std", "seed"}, where));
    Fields r(ri, where);
    if (r.Has("method")) {
    ASSIGN_OR_RETURN(router_method, r.String("method"));
  }
    ASSIGN_OR_RETURN(router.stddev, r.Number("std", 0.02));
    ASSIGN_OR_RETURN(int64_t seed, r.Int("seed", 0));
    router.seed = static_cast<uint64_t>(seed);
    if (router_method == "zeros") {
      router.kind = Recipe::Kind::kZeros;
    } else if (router_method != "normal") {
      return r.Error("method", "\"" + router_method + "\" is not one of normal, zeros");
    }
    if (router.stddev < 0) return r.Error("std", "must be non-negative");
  }
  json config = dense->config();
  if (!config.is_object()) return f_.Error("model", dense->dir() + " has no config.json");
  json& text = config.contains("text_config") && config["text_config"].is_object() ? config["text_config"] : config;
  const std::string type = config.value("model_type", "");
  if (type != "llama" && type != "qwen2" && type != "gemma3_text" && type != "gemma3") {
    return f_.Error("model", absl::StrCat(dense->dir(), ": model_type \"", type,
                                          "\" cannot be upcycled (llama, qwen2, gemma3_text, gemma3)"));
  }
  if (text.contains("num_experts")) return f_.Error("model", dense->dir() + " is already a mixture of experts");
  if (text.value("mlp_bias", false)) return f_.Error("model", dense->dir() + ": MLP biases (mlp_bias) cannot be upcycled");
  text["num_experts"] = experts;
  text["num_experts_per_tok"] = top_k;
  text["norm_topk_prob"] = norm_topk;
  text["router_aux_loss_coef"] = aux_coef;

  ASSIGN_OR_RETURN(std::string out, f_.String("out"));
  PlannedOutput o = NewOutput(out, *dense, {dense->dir()});
  o.files["config.json"] = config.dump(2) + "\n";
  o.params["router_init"] = {{"method", router_method}, {"std", router.stddev}, {"seed", router.seed}};
  static const std::regex kMlp(R"(^(.*layers\.\d+\.mlp\.)(gate|up|down)_proj\.(weight|bias)$)");
  std::map<std::string, int> parts_per_layer;
  for (const std::string& name : dense->names()) {
    const auto t = dense->Find(name);
    std::smatch m;
    if (!std::regex_match(name, m, kMlp)) {
      Add(o, name, OutDtype(t.info->dtype), t.info->shape, Copy(t));
      continue;
    }
    if (m[3] == "bias") return f_.Error("model", "MLP bias " + name + " cannot be upcycled");
    const std::string prefix = m[1], proj = m[2];
    for (int64_t e = 0; e < experts; ++e) {
      Add(o, absl::StrCat(prefix, "experts.", e, ".", proj, "_proj.weight"), OutDtype(t.info->dtype),
          t.info->shape, Copy(t));
    }
    ++parts_per_layer[prefix];
    if (proj == "gate") {  // one router per layer: [experts, hidden]
      RETURN_IF_ERROR(FloatOnly(name, t.info->dtype));
      Add(o, prefix + "gate.weight", OutDtype(t.info->dtype), {experts, t.info->shape.at(1)}, router);
    }
  }
  for (const auto& [prefix, parts] : parts_per_layer) {
    if (parts != 3) return f_.Error("model", prefix + " lacks one of gate_proj, up_proj, down_proj");
  }
  if (parts_per_layer.empty()) return f_.Error("model", dense->dir() + " has no layers.N.mlp.*_proj tensors");
  o.params["moe_layers"] = parts_per_layer.size();
  plan_.outputs.push_back(std::move(o));
  return absl::OkStatus();
}

}  // namespace

bool IsVisionTensor(const std::string& name) {
  return absl::StrContains(name, "vision_tower.") || absl::StrContains(name, "multi_modal_projector.");
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

std::pair<int, int> MiddleLayers(int num_layers) {
  const int first = static_cast<int>(std::lround(9.0 * num_layers / 34.0));
  const int last = static_cast<int>(std::lround(28.0 * num_layers / 34.0)) - 1;
  return {first, std::max(first, last)};
}

bool TensorSelector::Matches(const std::string& name) const {
  if (has_layers) {
    const int layer = LayerOf(name);
    bool in = false;
    for (const auto& [a, b] : layers) in = in || (layer >= a && layer <= b);
    if (!in) return false;
  }
  if (!modules.empty()) {
    if (IsVisionTensor(name)) return false;
    bool in = false;
    for (const std::string& m : modules) {
      if (m == "attention") in = in || absl::StrContains(name, ".self_attn.");
      if (m == "mlp") in = in || absl::StrContains(name, ".mlp.");
      if (m == "norms") in = in || absl::StrContains(name, "norm.");
      if (m == "embeddings") in = in || absl::StrContains(name, "embed_tokens.") || absl::StrContains(name, "lm_head.");
    }
    if (!in) return false;
  }
  if (!pattern.empty() && !std::regex_search(name, std::regex(pattern))) return false;
  return true;
}

absl::StatusOr<MergePlan> PlanFromSpec(const std::string& command, const json& spec,
                                       const std::string& where) {
  if (!spec.is_object()) return absl::InvalidArgumentError(where + ": the spec must be a mapping");
  MergePlan plan;
  Planner planner(plan, spec, where);
  absl::Status s;
  if (command == "merge") s = planner.Merge();
  else if (command == "revert") s = planner.Revert();
  else if (command == "interpolate") s = planner.Interpolate();
  else if (command == "graft") s = planner.Graft();
  else if (command == "upcycle") s = planner.Upcycle();
  else s = absl::InvalidArgumentError("unknown merge command \"" + command + "\"");
  RETURN_IF_ERROR(s);
  for (PlannedOutput& o : plan.outputs) o.params["command"] = command;
  return plan;
}

}  // namespace stemma::engine::merge
