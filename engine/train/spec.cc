#include "engine/train/spec.h"

#include <cmath>
#include <numbers>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/spec_file.h"
#include "common/status.h"

namespace stemma::engine::train {
namespace {

using json = nlohmann::json;

std::string_view Sv(absl::string_view s) { return std::string_view(s.data(), s.size()); }

absl::Status FieldError(absl::string_view where, absl::string_view field, absl::string_view what) {
  // "file: data.seq_len: ..." inside a section, "file: steps: ..." at the top level.
  const bool top = !where.empty() && where.back() == ':';
  return absl::InvalidArgumentError(absl::StrCat(where, top ? " " : ".", field, ": ", what));
}

// Typed optional fields: `out` keeps its default when the key is absent or null.
absl::Status ReadDouble(const json& obj, const char* key, absl::string_view where, double* out) {
  if (!obj.contains(key) || obj[key].is_null()) return absl::OkStatus();
  const json& v = obj[key];
  if (!v.is_number()) return FieldError(where, key, "must be a number");
  *out = v.get<double>();
  if (!std::isfinite(*out)) return FieldError(where, key, "must be finite");
  return absl::OkStatus();
}

absl::Status ReadInt(const json& obj, const char* key, absl::string_view where, int64_t min,
                     int64_t* out) {
  if (!obj.contains(key) || obj[key].is_null()) return absl::OkStatus();
  const json& v = obj[key];
  if (!v.is_number_integer()) return FieldError(where, key, "must be an integer");
  *out = v.get<int64_t>();
  if (*out < min) return FieldError(where, key, absl::StrCat("must be >= ", min));
  return absl::OkStatus();
}

absl::Status ReadBool(const json& obj, const char* key, absl::string_view where, bool* out) {
  if (!obj.contains(key) || obj[key].is_null()) return absl::OkStatus();
  if (!obj[key].is_boolean()) return FieldError(where, key, "must be true or false");
  *out = obj[key].get<bool>();
  return absl::OkStatus();
}

absl::Status ReadString(const json& obj, const char* key, absl::string_view where,
                        std::string* out) {
  if (!obj.contains(key) || obj[key].is_null()) return absl::OkStatus();
  if (!obj[key].is_string()) return FieldError(where, key, "must be a string");
  *out = obj[key].get<std::string>();
  return absl::OkStatus();
}

absl::Status RequireObject(const json& obj, absl::string_view where) {
  if (!obj.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": must be a map"));
  return absl::OkStatus();
}

std::string Resolve(const std::string& base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return base_dir + "/" + path;
}

// A range list: one string ("9:28") or a list of them.
absl::StatusOr<std::vector<LayerRange>> ReadRanges(const json& v, absl::string_view where) {
  std::vector<LayerRange> ranges;
  if (v.is_string() || v.is_number_integer()) {
    ASSIGN_OR_RETURN(LayerRange r, ParseLayerRange(v.is_string() ? v.get<std::string>()
                                                                 : std::to_string(v.get<int64_t>()),
                                                   where));
    ranges.push_back(r);
    return ranges;
  }
  if (!v.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": must be a layer range (\"9:28\") or a list of them"));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    std::string at = absl::StrCat(where, "[", i, "]");
    if (!v[i].is_string() && !v[i].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": must be a layer range like \"9:28\""));
    }
    ASSIGN_OR_RETURN(LayerRange r,
                     ParseLayerRange(v[i].is_string() ? v[i].get<std::string>()
                                                      : std::to_string(v[i].get<int64_t>()),
                                     at));
    ranges.push_back(r);
  }
  return ranges;
}

absl::Status ParseOptimizer(const json& j, absl::string_view where, OptimizerSpec& o) {
  RETURN_IF_ERROR(RequireObject(j, where));
  RETURN_IF_ERROR(CheckKeys(j, {"lr", "betas", "eps", "weight_decay"}, Sv(where)));
  RETURN_IF_ERROR(ReadDouble(j, "lr", where, &o.lr));
  if (o.lr <= 0) return FieldError(where, "lr", "must be > 0");
  if (j.contains("betas")) {
    const json& b = j["betas"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number()) {
      return FieldError(where, "betas", "must be a list of two numbers");
    }
    o.beta1 = b[0].get<double>();
    o.beta2 = b[1].get<double>();
    if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1)) {
      return FieldError(where, "betas", "must lie in [0, 1)");
    }
  }
  RETURN_IF_ERROR(ReadDouble(j, "eps", where, &o.eps));
  if (o.eps <= 0) return FieldError(where, "eps", "must be > 0");
  RETURN_IF_ERROR(ReadDouble(j, "weight_decay", where, &o.weight_decay));
  if (o.weight_decay < 0) return FieldError(where, "weight_decay", "must be >= 0");
  return absl::OkStatus();
}

absl::Status ParseSchedule(const json& j, absl::string_view where, ScheduleSpec& s) {
  RETURN_IF_ERROR(RequireObject(j, where));
  RETURN_IF_ERROR(CheckKeys(j, {"type", "warmup_steps", "min_lr_ratio"}, Sv(where)));
  std::string type = "cosine";
  RETURN_IF_ERROR(ReadString(j, "type", where, &type));
  if (type == "cosine") {
    s.kind = ScheduleSpec::Kind::kCosine;
  } else if (type == "constant") {
    s.kind = ScheduleSpec::Kind::kConstant;
  } else if (type == "linear") {
    s.kind = ScheduleSpec::Kind::kLinear;
  } else {
    return FieldError(where, "type", absl::StrCat("'", type, "' is not cosine, linear or constant"));
  }
  RETURN_IF_ERROR(ReadInt(j, "warmup_steps", where, 0, &s.warmup_steps));
  RETURN_IF_ERROR(ReadDouble(j, "min_lr_ratio", where, &s.min_lr_ratio));
  if (s.min_lr_ratio < 0 || s.min_lr_ratio > 1) {
    return FieldError(where, "min_lr_ratio", "must lie in [0, 1]");
  }
  return absl::OkStatus();
}

absl::Status ParseStrategy(const json& j, absl::string_view where, const std::string& base_dir,
                           StrategySpec& s) {
  RETURN_IF_ERROR(RequireObject(j, where));
  RETURN_IF_ERROR(CheckKeys(
      j, {"freeze", "l2sp", "neuron_mask", "expert_subset", "frozen_experts", "aux_loss"}, Sv(where)));
  if (j.contains("freeze")) {
    const std::string at = absl::StrCat(where, ".freeze");
    const json& f = j["freeze"];
    RETURN_IF_ERROR(RequireObject(f, at));
    RETURN_IF_ERROR(CheckKeys(f, {"layers", "embeddings", "head", "final_norm"}, at));
    if (f.contains("layers")) {
      ASSIGN_OR_RETURN(s.freeze.layers, ReadRanges(f["layers"], absl::StrCat(at, ".layers")));
    }
    RETURN_IF_ERROR(ReadBool(f, "embeddings", at, &s.freeze.embeddings));
    RETURN_IF_ERROR(ReadBool(f, "head", at, &s.freeze.head));
    RETURN_IF_ERROR(ReadBool(f, "final_norm", at, &s.freeze.final_norm));
  }
  if (j.contains("l2sp")) {
    const json& l = j["l2sp"];
    const std::string at = absl::StrCat(where, ".l2sp");
    if (!l.is_array()) return absl::InvalidArgumentError(absl::StrCat(at, ": must be a list"));
    int defaults = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      const std::string item = absl::StrCat(at, "[", i, "]");
      RETURN_IF_ERROR(RequireObject(l[i], item));
      RETURN_IF_ERROR(CheckKeys(l[i], {"layers", "lambda"}, item));
      L2spRule rule;
      if (!l[i].contains("lambda")) return FieldError(item, "lambda", "is required");
      RETURN_IF_ERROR(ReadDouble(l[i], "lambda", item, &rule.lambda));
      if (rule.lambda < 0) return FieldError(item, "lambda", "must be >= 0");
      if (l[i].contains("layers")) {
        ASSIGN_OR_RETURN(rule.layers, ReadRanges(l[i]["layers"], absl::StrCat(item, ".layers")));
      } else if (++defaults > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(item, ": only one rule without 'layers' (the default λ) is allowed"));
      }
      s.l2sp.push_back(std::move(rule));
    }
  }
  if (j.contains("neuron_mask")) {
    const std::string at = absl::StrCat(where, ".neuron_mask");
    const json& n = j["neuron_mask"];
    RETURN_IF_ERROR(RequireObject(n, at));
    RETURN_IF_ERROR(CheckKeys(n, {"file", "languages"}, at));
    NeuronMaskSpec mask;
    RETURN_IF_ERROR(ReadString(n, "file", at, &mask.file));
    if (mask.file.empty()) return FieldError(at, "file", "is required");
    mask.file = Resolve(base_dir, mask.file);
    if (n.contains("languages")) {
      const json& langs = n["languages"];
      if (langs.is_string()) {
        mask.languages.push_back(langs.get<std::string>());
      } else if (langs.is_array()) {
        for (const json& lang : langs) {
          if (!lang.is_string()) return FieldError(at, "languages", "must be a list of strings");
          mask.languages.push_back(lang.get<std::string>());
        }
      } else {
        return FieldError(at, "languages", "must be a list of strings");
      }
    }
    s.neuron_mask = std::move(mask);
  }
  if (j.contains("expert_subset")) {
    const std::string at = absl::StrCat(where, ".expert_subset");
    const json& e = j["expert_subset"];
    RETURN_IF_ERROR(RequireObject(e, at));
    RETURN_IF_ERROR(CheckKeys(e, {"file", "language", "set", "train_routers"}, at));
    ExpertSubsetSpec subset;
    RETURN_IF_ERROR(ReadString(e, "file", at, &subset.file));
    RETURN_IF_ERROR(ReadString(e, "language", at, &subset.language));
    RETURN_IF_ERROR(ReadString(e, "set", at, &subset.set));
    RETURN_IF_ERROR(ReadBool(e, "train_routers", at, &subset.train_routers));
    if (subset.file.empty()) return FieldError(at, "file", "is required");
    if (subset.language.empty()) return FieldError(at, "language", "is required");
    if (subset.set.empty()) return FieldError(at, "set", "is required (e.g. ssft_k5)");
    subset.file = Resolve(base_dir, subset.file);
    s.expert_subset = std::move(subset);
  }
  if (j.contains("frozen_experts")) {
    const json& f = j["frozen_experts"];
    if (!f.is_array()) return FieldError(where, "frozen_experts", "must be a list of expert ids");
    for (const json& id : f) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) {
        return FieldError(where, "frozen_experts", "must be a list of non-negative expert ids");
      }
      s.frozen_experts.push_back(id.get<int64_t>());
    }
  }
  if (j.contains("aux_loss")) {
    const std::string at = absl::StrCat(where, ".aux_loss");
    const json& a = j["aux_loss"];
    RETURN_IF_ERROR(RequireObject(a, at));
    RETURN_IF_ERROR(CheckKeys(a, {"load_balancing", "router_z"}, at));
    RETURN_IF_ERROR(ReadDouble(a, "load_balancing", at, &s.aux_loss.load_balancing));
    RETURN_IF_ERROR(ReadDouble(a, "router_z", at, &s.aux_loss.router_z));
    if (s.aux_loss.load_balancing < 0) return FieldError(at, "load_balancing", "must be >= 0");
    if (s.aux_loss.router_z < 0) return FieldError(at, "router_z", "must be >= 0");
  }
  if (s.neuron_mask && s.expert_subset) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": neuron_mask and expert_subset cannot be combined (one sparse sub-network)"));
  }
  if (s.expert_subset && (s.aux_loss.load_balancing > 0 || s.aux_loss.router_z > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".aux_loss: expert_subset (SSFT) trains with cross-entropy only "
               "(algorithms.md §4.5): the aux losses would push tokens off the target experts"));
  }
  return absl::OkStatus();
}

absl::Status ParseData(const json& j, absl::string_view where, const std::string& base_dir,
                       DataSpec& d) {
  RETURN_IF_ERROR(RequireObject(j, where));
  RETURN_IF_ERROR(CheckKeys(j,
                            {"datasets", "temperature", "family_weights", "seq_len",
                             "heldout_fraction", "split_seed", "shuffle"},
                            Sv(where)));
  if (!j.contains("seq_len")) return FieldError(where, "seq_len", "is required");
  RETURN_IF_ERROR(ReadInt(j, "seq_len", where, 1, &d.seq_len));
  RETURN_IF_ERROR(ReadDouble(j, "heldout_fraction", where, &d.heldout_fraction));
  if (d.heldout_fraction < 0 || d.heldout_fraction >= 1) {
    return FieldError(where, "heldout_fraction", "must lie in [0, 1)");
  }
  int64_t split_seed = 0;
  RETURN_IF_ERROR(ReadInt(j, "split_seed", where, 0, &split_seed));
  d.split_seed = static_cast<uint64_t>(split_seed);
  RETURN_IF_ERROR(ReadBool(j, "shuffle", where, &d.shuffle));
  d.mixture = json::object();
  for (const char* key : {"datasets", "temperature", "family_weights"}) {
    if (j.contains(key)) d.mixture[key] = j[key];
  }
  // Dataset paths are resolved here, so the loader sees absolute (or cwd-relative) paths.
  if (d.mixture.contains("datasets") && d.mixture["datasets"].is_array()) {
    for (json& ds : d.mixture["datasets"]) {
      if (ds.is_object() && ds.contains("path") && ds["path"].is_string()) {
        ds["path"] = Resolve(base_dir, ds["path"].get<std::string>());
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ParseCheckpoint(const json& j, absl::string_view where, const std::string& base_dir,
                             CheckpointSpec& c) {
  RETURN_IF_ERROR(RequireObject(j, where));
  RETURN_IF_ERROR(CheckKeys(j, {"every", "dir", "keep"}, Sv(where)));
  RETURN_IF_ERROR(ReadInt(j, "every", where, 0, &c.every));
  RETURN_IF_ERROR(ReadString(j, "dir", where, &c.dir));
  c.dir = Resolve(base_dir, c.dir);
  RETURN_IF_ERROR(ReadInt(j, "keep", where, 0, &c.keep));
  return absl::OkStatus();
}

absl::Status ParseEval(const json& j, absl::string_view where, EvalSpec& e) {
  RETURN_IF_ERROR(RequireObject(j, where));
  RETURN_IF_ERROR(CheckKeys(j, {"every", "batches", "batch_size"}, Sv(where)));
  RETURN_IF_ERROR(ReadInt(j, "every", where, 0, &e.every));
  RETURN_IF_ERROR(ReadInt(j, "batches", where, 1, &e.batches));
  RETURN_IF_ERROR(ReadInt(j, "batch_size", where, 1, &e.batch_size));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LayerRange> ParseLayerRange(absl::string_view text, absl::string_view where) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": bad layer range '", text, "' (", why,
                     "; want a:b for layers a..b-1, a single layer, a: or :b)"));
  };
  LayerRange r;
  r.text = std::string(text);
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  auto number = [&](const std::string& s, int64_t* out) {
    return !s.empty() && s[0] != '-' && s[0] != '+' && absl::SimpleAtoi(s, out);
  };
  if (parts.size() == 1) {
    if (!number(parts[0], &r.begin)) return bad("not a non-negative integer");
    r.end = r.begin + 1;
    return r;
  }
  if (parts.size() != 2) return bad("more than one ':'");
  if (parts[0].empty()) {
    r.begin = 0;
  } else if (!number(parts[0], &r.begin)) {
    return bad("start is not a non-negative integer");
  }
  if (parts[1].empty()) {
    r.end = -1;
  } else if (!number(parts[1], &r.end)) {
    return bad("end is not a non-negative integer");
  } else if (r.end <= r.begin) {
    return bad("empty: end must be greater than start");
  }
  return r;
}

absl::StatusOr<LayerRange> ResolveLayerRange(const LayerRange& range, int64_t num_layers,
                                             absl::string_view where) {
  LayerRange r = range;
  if (r.end < 0) r.end = num_layers;
  if (r.begin >= num_layers || r.end > num_layers || r.begin >= r.end) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": layer range '", range.text, "' is outside the model's ",
                     num_layers, " layers (0..", num_layers - 1, "; a:b means a..b-1)"));
  }
  return r;
}

double LearningRate(const OptimizerSpec& optimizer, const ScheduleSpec& schedule, int64_t step,
                    int64_t total_steps) {
  const double peak = optimizer.lr;
  const int64_t warmup = schedule.warmup_steps;
  if (step <= warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup);
  if (schedule.kind == ScheduleSpec::Kind::kConstant) return peak;
  const double floor = peak * schedule.min_lr_ratio;
  const int64_t decay_steps = total_steps - warmup;
  // Progress 0 at the first step after warmup, 1 at the last step.
  const double progress =
      decay_steps <= 1 ? 1.0
                       : static_cast<double>(step - warmup - 1) / static_cast<double>(decay_steps - 1);
  const double shape = schedule.kind == ScheduleSpec::Kind::kCosine
                           ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress))
                           : 1.0 - progress;
  return floor + (peak - floor) * shape;
}

absl::StatusOr<TrainSpec> ParseTrainSpec(const json& doc, const std::string& source,
                                         const std::string& base_dir) {
  TrainSpec s;
  s.source = source;
  s.raw = doc;
  const std::string w = source + ":";  // top-level fields
  RETURN_IF_ERROR(RequireObject(doc, source));
  RETURN_IF_ERROR(CheckKeys(doc,
                            {"model", "out", "data", "batch_size", "grad_accum", "steps",
                             "max_tokens", "seed", "threads", "optimizer", "schedule",
                             "clip_grad_norm", "strategy", "checkpoint", "save_dtype",
                             "overwrite", "log_every", "device", "precision", "eval"},
                            source));
  RETURN_IF_ERROR(ReadString(doc, "model", w, &s.model));
  if (s.model.empty()) return FieldError(w, "model", "is required (the base checkpoint directory)");
  s.model = Resolve(base_dir, s.model);
  RETURN_IF_ERROR(ReadString(doc, "out", w, &s.out));
  if (s.out.empty()) return FieldError(w, "out", "is required (the output checkpoint directory)");
  s.out = Resolve(base_dir, s.out);
  if (!doc.contains("data")) return FieldError(w, "data", "is required");
  RETURN_IF_ERROR(ParseData(doc["data"], absl::StrCat(source, ": data"), base_dir, s.data));
  RETURN_IF_ERROR(ReadInt(doc, "batch_size", w, 1, &s.batch_size));
  RETURN_IF_ERROR(ReadInt(doc, "grad_accum", w, 1, &s.grad_accum));
  RETURN_IF_ERROR(ReadInt(doc, "steps", w, 1, &s.steps));
  RETURN_IF_ERROR(ReadInt(doc, "max_tokens", w, 1, &s.max_tokens));
  if ((s.steps > 0) == (s.max_tokens > 0)) {
    return FieldError(w, "steps", "give exactly one of 'steps' and 'max_tokens'");
  }
  if (s.steps == 0) s.steps = (s.max_tokens + s.tokens_per_step() - 1) / s.tokens_per_step();
  int64_t seed = 0;
  RETURN_IF_ERROR(ReadInt(doc, "seed", w, 0, &seed));
  s.seed = static_cast<uint64_t>(seed);
  int64_t threads = 0;
  RETURN_IF_ERROR(ReadInt(doc, "threads", w, 0, &threads));
  s.threads = static_cast<int>(threads);
  if (doc.contains("optimizer")) {
    RETURN_IF_ERROR(ParseOptimizer(doc["optimizer"], absl::StrCat(source, ": optimizer"), s.optimizer));
  }
  if (doc.contains("schedule")) {
    RETURN_IF_ERROR(ParseSchedule(doc["schedule"], absl::StrCat(source, ": schedule"), s.schedule));
  }
  if (s.schedule.warmup_steps > s.steps) {
    return FieldError(absl::StrCat(source, ": schedule"), "warmup_steps",
                      absl::StrCat("exceeds the ", s.steps, " training steps"));
  }
  RETURN_IF_ERROR(ReadDouble(doc, "clip_grad_norm", w, &s.clip_grad_norm));
  if (s.clip_grad_norm < 0) return FieldError(w, "clip_grad_norm", "must be >= 0 (0: off)");
  if (doc.contains("strategy")) {
    RETURN_IF_ERROR(
        ParseStrategy(doc["strategy"], absl::StrCat(source, ": strategy"), base_dir, s.strategy));
  }
  if (doc.contains("checkpoint")) {
    RETURN_IF_ERROR(ParseCheckpoint(doc["checkpoint"], absl::StrCat(source, ": checkpoint"), base_dir,
                                    s.checkpoint));
  }
  if (s.checkpoint.dir.empty()) s.checkpoint.dir = s.out + ".checkpoints";
  if (doc.contains("eval")) {
    const std::string where = absl::StrCat(source, ": eval");
    RETURN_IF_ERROR(ParseEval(doc["eval"], where, s.eval));
    if (s.eval.every > 0 && s.data.heldout_fraction <= 0) {
      return FieldError(where, "every",
                        "needs held-out documents: set data.heldout_fraction > 0");
    }
  }
  if (s.eval.batch_size == 0) s.eval.batch_size = s.batch_size;
  RETURN_IF_ERROR(ReadString(doc, "save_dtype", w, &s.save_dtype));
  if (s.save_dtype != "float32" && s.save_dtype != "bfloat16" && s.save_dtype != "float16") {
    return FieldError(w, "save_dtype", "must be float32, bfloat16 or float16");
  }
  RETURN_IF_ERROR(ReadBool(doc, "overwrite", w, &s.overwrite));
  RETURN_IF_ERROR(ReadInt(doc, "log_every", w, 1, &s.log_every));
  RETURN_IF_ERROR(ReadString(doc, "device", w, &s.device));
  {
    const bool cuda_n = absl::StartsWith(s.device, "cuda:") && s.device.size() > 5 &&
                        s.device.find_first_not_of("0123456789", 5) == std::string::npos;
    if (s.device != "cpu" && s.device != "cuda" && !cuda_n) {
      return FieldError(w, "device", "must be cpu, cuda or cuda:N");
    }
  }
  RETURN_IF_ERROR(ReadString(doc, "precision", w, &s.precision));
  if (s.precision != "float32" && s.precision != "bfloat16") {
    return FieldError(w, "precision", "must be float32 or bfloat16");
  }
  return s;
}

absl::StatusOr<TrainSpec> LoadTrainSpec(const std::string& path) {
  ASSIGN_OR_RETURN(json doc, ReadSpecFile(path));
  std::string base_dir;
  if (auto slash = path.rfind('/'); slash != std::string::npos) base_dir = path.substr(0, slash);
  return ParseTrainSpec(doc, path, base_dir.empty() ? "." : base_dir);
}

}  // namespace stemma::engine::train
