#include "engine/train/spec.h"

#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "common/engine_spec.h"
#include "common/proto_yaml.h"
#include "common/status.h"
#include "common/yaml_json.h"

namespace stemma::engine::train {
namespace {

absl::StatusOr<std::vector<LayerRange>> Ranges(
    const google::protobuf::RepeatedPtrField<std::string>& texts, const std::string& where) {
  std::vector<LayerRange> out;
  for (int i = 0; i < texts.size(); ++i) {
    ASSIGN_OR_RETURN(LayerRange r, ParseLayerRange(texts[i], absl::StrCat(where, "[", i, "]")));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

double LearningRate(const OptimizerSpec& optimizer, const ScheduleSpec& schedule, int64_t step,
                    int64_t total_steps) {
  const double peak = optimizer.lr;
  const int64_t warmup = schedule.warmup_steps;
  if (step <= warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup);
  if (schedule.kind == ScheduleSpec::Kind::kConstant) return peak;
  const double floor = peak * schedule.min_lr_ratio;
  const int64_t decay_steps = total_steps - warmup;
  // Progress 0 at the first step after warmup, 1 at the last step.
  const double progress = decay_steps <= 1 ? 1.0
                                           : static_cast<double>(step - warmup - 1) /
                                                 static_cast<double>(decay_steps - 1);
  const double shape = schedule.kind == ScheduleSpec::Kind::kCosine
                           ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress))
                           : 1.0 - progress;
  return floor + (peak - floor) * shape;
}

absl::StatusOr<TrainSpec> TrainSpecFromProto(v1::TrainSpec p, const std::string& source) {
  // The schema is the one place defaults live: make every sub-message present and fill it.
  p.mutable_data();
  p.mutable_optimizer();
  p.mutable_schedule();
  p.mutable_strategy()->mutable_freeze();
  p.mutable_strategy()->mutable_aux_loss();
  p.mutable_checkpoint();
  p.mutable_eval();
  FillSpecDefaults(&p);

  TrainSpec s;
  s.source = source;
  s.model = p.model();
  s.out = p.out();
  const v1::TrainData& d = p.data();
  s.data.mixture = d;
  s.data.seq_len = d.seq_len();
  s.data.heldout_fraction = d.heldout_fraction();
  s.data.heldout_last = d.heldout_split() == "last";
  s.data.split_seed = d.split_seed();
  s.data.shuffle = d.shuffle();
  s.batch_size = p.batch_size();
  s.grad_accum = p.grad_accum();
  s.max_tokens = p.max_tokens();
  s.steps = p.has_steps() ? p.steps()
                          : (p.max_tokens() + s.tokens_per_step() - 1) /
                                std::max<int64_t>(s.tokens_per_step(), 1);
  s.seed = p.seed();
  s.threads = p.threads();

  const v1::TrainOptimizer& o = p.optimizer();
  s.optimizer.lr = o.lr();
  if (o.betas_size() == 2) {
    s.optimizer.beta1 = o.betas(0);
    s.optimizer.beta2 = o.betas(1);
  }
  s.optimizer.eps = o.eps();
  s.optimizer.weight_decay = o.weight_decay();
  const v1::TrainSchedule& sc = p.schedule();
  s.schedule.kind = sc.type() == "constant" ? ScheduleSpec::Kind::kConstant
                    : sc.type() == "linear" ? ScheduleSpec::Kind::kLinear
                                            : ScheduleSpec::Kind::kCosine;
  s.schedule.warmup_steps = sc.warmup_steps();
  s.schedule.min_lr_ratio = sc.min_lr_ratio();
  s.clip_grad_norm = p.clip_grad_norm();

  const v1::TrainStrategy& st = p.strategy();
  ASSIGN_OR_RETURN(s.strategy.freeze.layers,
                   Ranges(st.freeze().layers(), "strategy.freeze.layers"));
  s.strategy.freeze.embeddings = st.freeze().embeddings();
  s.strategy.freeze.head = st.freeze().head();
  s.strategy.freeze.final_norm = st.freeze().final_norm();
  s.strategy.freeze.shared = st.freeze().shared();
  s.strategy.freeze.attention = st.freeze().attention();
  s.strategy.freeze.norms = st.freeze().norms();
  for (int i = 0; i < st.l2sp_size(); ++i) {
    L2spRule rule;
    ASSIGN_OR_RETURN(rule.layers,
                     Ranges(st.l2sp(i).layers(), absl::StrCat("strategy.l2sp[", i, "].layers")));
    rule.lambda = st.l2sp(i).lambda();
    s.strategy.l2sp.push_back(std::move(rule));
  }
  if (st.has_neuron_mask()) {
    NeuronMaskSpec mask;
    mask.file = st.neuron_mask().file();
    mask.languages.assign(st.neuron_mask().languages().begin(), st.neuron_mask().languages().end());
    s.strategy.neuron_mask = std::move(mask);
  }
  if (st.has_expert_subset()) {
    const v1::TrainExpertSubset& e = st.expert_subset();
    s.strategy.expert_subset = ExpertSubsetSpec{e.file(), e.language(), e.set(), e.train_routers()};
  }
  s.strategy.frozen_experts.assign(st.frozen_experts().begin(), st.frozen_experts().end());
  s.strategy.aux_loss.load_balancing = st.aux_loss().load_balancing();
  s.strategy.aux_loss.router_z = st.aux_loss().router_z();

  s.checkpoint.every = p.checkpoint().every();
  s.checkpoint.dir = p.checkpoint().dir().empty() ? s.out + ".checkpoints" : p.checkpoint().dir();
  s.checkpoint.keep = p.checkpoint().keep();
  s.eval.every = p.eval().every();
  s.eval.batches = p.eval().batches();
  s.eval.batch_size = p.eval().has_batch_size() ? p.eval().batch_size() : s.batch_size;
  s.save_dtype = p.save_dtype();
  s.device = p.device();
  s.precision = p.precision();
  s.overwrite = p.overwrite();
  s.log_every = p.log_every();

  s.raw = nlohmann::json::parse(SpecToJson(p), nullptr, /*allow_exceptions=*/false);
  return s;
}

absl::StatusOr<TrainSpec> ParseTrainSpecText(std::string_view text, const std::string& source) {
  ASSIGN_OR_RETURN(std::vector<YamlNode> docs, LoadYamlDocuments(text, source));
  if (docs.size() != 1 || !docs[0].IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the spec must be one mapping"));
  }
  v1::TrainSpec proto;
  FieldLines lines;
  RETURN_IF_ERROR(ReadYamlInto(docs[0], &proto, source, "", &lines));
  FillSpecDefaults(&proto);
  SpecContext context;
  context.where = source;
  context.lines = &lines;
  RETURN_IF_ERROR(ValidateEngineSpec(proto, context));
  return TrainSpecFromProto(std::move(proto), source);
}

}  // namespace stemma::engine::train
