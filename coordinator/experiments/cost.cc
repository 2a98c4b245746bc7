#include "coordinator/experiments/cost.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "common/engine_spec.h"
#include "common/job_spec.h"
#include "coordinator/experiments/memory.h"
#include "google/protobuf/message.h"

namespace stemma::experiments {
namespace {

namespace pb = google::protobuf;

// A numeric field of `m` by name as a double (0 when absent or not a number).
double Number(const pb::Message& m, const char* name) {
  const pb::FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(name);
  if (f == nullptr || f->is_repeated()) return 0;
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return static_cast<double>(m.GetReflection()->GetInt64(m, f));
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return m.GetReflection()->GetInt32(m, f);
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return m.GetReflection()->GetDouble(m, f);
    default:
      return 0;
  }
}

// The tokens a train cell sees: max_tokens, else steps · batch · accumulation · sequence.
double TrainTokens(const v1::JobSpec& s) {
  const pb::Message& t = s.train();
  const pb::Descriptor* d = t.GetDescriptor();
  const pb::Reflection* r = t.GetReflection();
  if (double max_tokens = Number(t, "max_tokens"); max_tokens > 0) return max_tokens;
  double seq = 0;
  if (const pb::FieldDescriptor* data = d->FindFieldByName("data");
      data != nullptr && data->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE &&
      r->HasField(t, data)) {
    seq = Number(r->GetMessage(t, data), "seq_len");
  }
  const double batch = std::max(1.0, Number(t, "batch_size"));
  const double accum = std::max(1.0, Number(t, "grad_accum"));
  return Number(t, "steps") * batch * accum * seq;
}

// An init cell's model from its sizes (the byte tokenizer's 259 ids unless vocab_size).
std::optional<int64_t> InitParams(const pb::Message& init) {
  auto get = [&](const char* name) -> int64_t {
    const pb::FieldDescriptor* f = init.GetDescriptor()->FindFieldByName(name);
    if (f == nullptr || f->is_repeated() || !init.GetReflection()->HasField(init, f)) return 0;
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64)
      return init.GetReflection()->GetInt64(init, f);
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT32)
      return init.GetReflection()->GetInt32(init, f);
    return 0;
  };
  const int64_t layers = get("num_layers"), d = get("hidden_size"), ffn = get("intermediate_size");
  if (layers <= 0 || d <= 0 || ffn <= 0) return std::nullopt;  // preset sizes live in the engine
  const int64_t vocab = get("vocab_size") > 0 ? get("vocab_size") : 259;
  const int64_t experts = std::max<int64_t>(1, get("num_experts"));
  return layers * (4 * d * d + experts * 3 * d * ffn) + 2 * vocab * d;
}

// An init cell's model shape: the engine's preset (engine/model/config.cc, PresetConfigJson:
// tiny, or small) for its arch, with the spec's sizes over it.
std::optional<ModelShape> InitShape(const v1::InitSpec& init) {
  const std::string arch = init.arch().empty() ? "llama" : init.arch();
  const bool small = init.preset() == "small", olmoe = arch == "olmoe";
  ModelShape s;
  s.layers = small ? 8 : (arch == "gemma3" ? 3 : 2);
  s.hidden = small ? 128 : 64;
  s.intermediate = olmoe ? (small ? 96 : 32) : (small ? 384 : 128);
  s.vocab = 259;  // the byte tokenizer's; a tokenizer directory's size is not known here
  s.heads = 4;
  s.kv_heads = olmoe ? 4 : 2;
  s.tied = arch == "qwen2" || arch == "gemma3";
  s.sandwich_norms = s.qk_norm = arch == "gemma3";
  if (olmoe) {
    s.qk_norm = true;
    s.experts = 4;
    s.experts_per_tok = 2;
  }
  if (init.has_num_layers()) s.layers = init.num_layers();
  if (init.has_hidden_size()) s.hidden = init.hidden_size();
  if (init.has_intermediate_size()) s.intermediate = init.intermediate_size();
  if (init.has_vocab_size()) s.vocab = init.vocab_size();
  if (init.has_num_heads()) s.heads = init.num_heads();
  if (init.has_num_kv_heads()) s.kv_heads = init.num_kv_heads();
  if (init.has_tie_embeddings()) s.tied = init.tie_embeddings();
  if (init.has_num_experts()) s.experts = init.num_experts();
  if (init.has_experts_per_token()) s.experts_per_tok = init.experts_per_token();
  s.head_dim = init.has_head_dim() ? init.head_dim() : s.hidden / std::max<int64_t>(1, s.heads);
  s.max_positions = init.has_max_position_embeddings() ? init.max_position_embeddings() : 512;
  if (!s.Valid()) return std::nullopt;
  return s;
}

class Estimator {
 public:
  Estimator(const std::map<std::string, v1::ModelSize>& declared, const ExpansionEnv& env)
      : declared_(declared), env_(env) {}

  // Parameters of the model a spec reads: an upstream cell's output (as estimated for that
  // cell), a model declared under `models:`, or the caller's answer.
  std::optional<int64_t> InputParams(const std::string& model) const {
    if (model.rfind("${{ ", 0) == 0) {
      auto it = produced_.find(Upstream(model));
      return it == produced_.end() ? std::nullopt : std::optional<int64_t>(it->second);
    }
    if (auto it = declared_.find(model); it != declared_.end())
      return static_cast<int64_t>(it->second.params());
    if (model.empty() || !env_.model_params) return std::nullopt;
    return env_.model_params(model);
  }

  // The shape of that model, found the same way.
  std::optional<ModelShape> InputShape(const std::string& model) const {
    if (model.rfind("${{ ", 0) == 0) {
      auto it = shapes_.find(Upstream(model));
      return it == shapes_.end() ? std::nullopt : std::optional<ModelShape>(it->second);
    }
    if (auto it = declared_.find(model); it != declared_.end())
      return ShapeFromDeclared(it->second);
    if (model.empty() || !env_.model_shape) return std::nullopt;
    return env_.model_shape(model);
  }

  void Add(PlanCell& c, ExperimentPlan* plan) {
    plan->edges += c.spec.depends_on_size();
    plan->gpus +=
        static_cast<int64_t>(std::max(0, c.spec.resources().gpus())) * std::max(1, c.spec.nodes());
    if (c.spec.has_init()) {
      if (auto p = InitParams(c.spec.init())) produced_[c.job_name] = *p;
      if (auto s = InitShape(c.spec.init())) shapes_[c.job_name] = *s;
      return;
    }
    const pb::Message* engine = EngineSpecOf(c.spec);
    if (engine == nullptr) return;
    // A graft's output has its target's layout (an upcycled MoE), not its base's.
    const std::string input =
        c.spec.has_graft() ? c.spec.graft().target() : FirstInputModel(*engine);
    std::optional<ModelShape> shape = InputShape(input);
    if (c.spec.has_train() || c.spec.has_eval()) {
      c.model_shape = shape;
      if (shape.has_value()) c.memory = EstimateJobMemory(c.spec, *shape);
    }
    if (!c.spec.has_train()) {
      if (c.spec.has_eval()) return;
      // Merges, reverts, grafts keep the size of what they read; an upcycle multiplies the
      // FFN (about two thirds of a block) by its experts.
      if (auto p = InputParams(input)) {
        int64_t n = *p;
        if (c.spec.has_upcycle())
          n += static_cast<int64_t>(
              static_cast<double>(n) * 2.0 / 3.0 *
              static_cast<double>(std::max<int64_t>(0, c.spec.upcycle().experts() - 1)));
        produced_[c.job_name] = n;
      }
      if (shape.has_value()) {
        shapes_[c.job_name] = c.spec.has_upcycle()
                                  ? Upcycled(*shape, c.spec.upcycle().experts(),
                                             std::max<int64_t>(1, c.spec.upcycle().top_k()))
                                  : *shape;
      }
      return;
    }
    // 6·N·D: parameters from the model it reads (those a token runs), tokens from the budget.
    std::optional<int64_t> params = InputParams(input);
    if (params.has_value()) produced_[c.job_name] = *params;
    if (shape.has_value()) shapes_[c.job_name] = *shape;
    const double tokens = TrainTokens(c.spec);
    if (!params.has_value() || tokens <= 0) {
      ++plan->unknown_cost_cells;
      return;
    }
    double active = static_cast<double>(*params);
    if (shape.has_value() && shape->experts > 0) active *= shape->ActiveParams() / shape->Params();
    plan->gpu_hours_estimate += 6.0 * active * tokens / (400e12 * 0.4) / 3600.0;
  }

 private:
  // The cell a "${{ <job>.outputs.<name> }}" token reads.
  static std::string Upstream(const std::string& token) {
    const size_t dot = token.rfind(".outputs.");
    return dot == std::string::npos ? "" : token.substr(4, dot - 4);
  }

  const std::map<std::string, v1::ModelSize>& declared_;
  const ExpansionEnv& env_;
  std::map<std::string, int64_t> produced_;   // cell → estimated parameters of its output
  std::map<std::string, ModelShape> shapes_;  // cell → shape of its output
};

}  // namespace

void EstimateCost(const std::map<std::string, v1::ModelSize>& declared, const ExpansionEnv& env,
                  ExperimentPlan* plan) {
  Estimator estimator(declared, env);
  for (PlanCell& c : plan->cells) estimator.Add(c, plan);
}

std::optional<int64_t> ParamsFromConfig(std::string_view config_json, int64_t layers) {
  absl::StatusOr<std::vector<YamlNode>> docs = LoadYamlDocuments(config_json, "config.json");
  if (!docs.ok() || docs->empty()) return std::nullopt;
  const YamlNode* root = &(*docs)[0];
  if (const YamlNode* t = root->Find("text_config"); t != nullptr && t->IsMap()) root = t;
  auto get = [&](const char* key) -> int64_t {
    const YamlNode* n = root->Find(key);
    int64_t v = 0;
    if (n != nullptr && n->IsScalar()) (void)absl::SimpleAtoi(n->scalar, &v);
    return v;
  };
  const int64_t d = get("hidden_size"), v = get("vocab_size"), ffn = get("intermediate_size");
  const int64_t experts = std::max<int64_t>(1, get("num_experts"));
  if (d <= 0) return std::nullopt;
  const int64_t block = 4 * d * d + experts * 3 * d * std::max<int64_t>(ffn, 1);
  return layers * block + 2 * v * d;
}

}  // namespace stemma::experiments
