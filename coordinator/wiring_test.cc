// Wiring of upstream outputs into experiment cells (coordinator/wiring.h), on cells expanded
// from experiment files as the coordinator gets them.
#include "coordinator/wiring.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "common/job_spec.h"
#include "coordinator/experiments/experiment_plan.h"

namespace stemma::coordinator {
namespace {

using experiments::ExpansionEnv;
using experiments::ExperimentPlan;
using experiments::OutputToken;
using experiments::PlanCell;

// As the coordinator expands: each cell checked as a submitted job.
absl::StatusOr<ExperimentPlan> Expand(std::string_view text, std::string_view file) {
  ExpansionEnv env;
  env.check_job = CheckJobAsSubmitted;
  return experiments::ExpandExperiment(text, file, env);
}

// A 3 × 2 matrix with exclude and include, one-to-one edges (a revert per dense expert),
// fan-in (a soup over every expert), a subset (a soup over the dense experts only) and an
// order-only need.
constexpr const char* kStudy = R"(name: study
vars:
  base: /ckpt/base
  steps: 12
stages:
  cpt:
    matrix:
      family: [slavic, germanic, romance]
      strategy: [dense, freeze]
      exclude: [{family: romance, strategy: freeze}]
      include: [{family: indic, strategy: dense}]
    resources: {cpus: 1}
    train:
      model: ${{ vars.base }}
      data: {datasets: [{path: "data/${{ matrix.family }}"}], seq_len: 16}
      steps: ${{ vars.steps }}
  revert:
    needs: [{stage: cpt, where: {strategy: dense}}]
    matrix: {family: [slavic, germanic]}
    revert: {base: "${{ vars.base }}", model: "${{ needs.cpt.outputs.model }}", layers: [middle]}
  soup:
    needs: [cpt]
    merge: {method: linear, models: [{path: "${{ needs.cpt.outputs.model }}"}]}
  dense-soup:
    needs: [{stage: cpt, where: {strategy: dense}}]
    merge: {method: linear, models: [{path: "${{ needs.cpt.outputs.model }}"}]}
  report:
    needs: [soup, revert]
    noop: {duration_ms: 1}
)";

std::map<std::string, const PlanCell*> ByName(const ExperimentPlan& plan) {
  std::map<std::string, const PlanCell*> out;
  for (const PlanCell& c : plan.cells) out[c.job_name] = &c;
  return out;
}

TEST(Wiring, ReplacesTokensWithReportedOutputs) {
  auto plan = Expand(kStudy, "study.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  v1::JobSpec soup = ByName(*plan).at("soup")->spec;
  google::protobuf::Map<std::string, std::string> outputs;
  auto lookup =
      [&](const std::string& job) -> const google::protobuf::Map<std::string, std::string>* {
    outputs.clear();
    outputs["model"] = "/store/" + job;
    return &outputs;
  };
  ASSERT_TRUE(WireInputs(&soup, lookup).ok());
  EXPECT_EQ(soup.merge().models(0).path(), "/store/cpt[family=slavic,strategy=dense]");
  v1::JobSpec revert = ByName(*plan).at("revert[family=slavic]")->spec;
  auto missing = WireInputs(
      &revert, [](const std::string&) -> const google::protobuf::Map<std::string, std::string>* {
        static const google::protobuf::Map<std::string, std::string> none;
        return &none;
      });
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("without reporting its 'model' output"), std::string::npos)
      << missing;
}

constexpr const char* kSweep = R"(name: es
stages:
  cpt:
    matrix: {lr: [0.1, 0.2, 0.3]}
    early_stop: {metric: heldout_loss/en, rungs_tokens: [100, 400], keep: 0.5}
    train:
      model: /m
      data: {datasets: [{path: /d}], seq_len: 10, heldout_fraction: 0.1}
      batch_size: 2
      steps: 50
      eval: {every: 5}
      optimizer: {lr: "${{ matrix.lr }}"}
  eval:
    needs: [cpt]
    matrix: {lr: [0.1, 0.2, 0.3]}
    eval: {model: "${{ needs.cpt.outputs.model }}", tasks: [{type: perplexity, language: en, data: /d, split: all}]}
  soup:
    needs: [cpt]
    merge: {method: linear, models: [{path: "${{ needs.cpt.outputs.model }}"}]}
)";

TEST(Wiring, TrialsCarryTheConfigAndDependentsDropStoppedReads) {
  auto plan = Expand(kSweep, "es.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto cells = ByName(*plan);
  // Tokens become steps: 20 tokens a step, so 100 → step 5 and 400 → step 20.
  const v1::EarlyStopRule& rule = cells.at("cpt[lr=0.2]")->spec.early_stop_rule();
  EXPECT_EQ(rule.metric(), "heldout_loss/en");
  EXPECT_EQ(rule.mode(), "min");
  EXPECT_EQ(std::vector<int64_t>(rule.rungs().begin(), rule.rungs().end()),
            (std::vector<int64_t>{5, 20}));
  EXPECT_DOUBLE_EQ(rule.keep(), 0.5);
  EXPECT_EQ(rule.min_trials(), 0);
  EXPECT_FALSE(cells.at("soup")->spec.has_early_stop_rule());
  const std::set<std::string> stopped = {"cpt[lr=0.2]"};
  std::string which;
  v1::JobSpec soup = cells.at("soup")->spec;
  ASSERT_TRUE(DropReadsOf(&soup, stopped, &which)) << "a fan-in keeps the survivors";
  ASSERT_EQ(soup.merge().models_size(), 2);
  EXPECT_EQ(soup.merge().models(1).path(), OutputToken("cpt[lr=0.3]", "model"));
  v1::JobSpec eval = cells.at("eval[lr=0.2]")->spec;
  EXPECT_FALSE(DropReadsOf(&eval, stopped, &which)) << "a one-to-one reader has nothing to run on";
  EXPECT_EQ(which, "cpt[lr=0.2]");
  v1::JobSpec other = cells.at("eval[lr=0.1]")->spec;
  EXPECT_TRUE(DropReadsOf(&other, stopped, &which));
  v1::JobSpec all = cells.at("soup")->spec;
  EXPECT_FALSE(DropReadsOf(&all, {"cpt[lr=0.1]", "cpt[lr=0.2]", "cpt[lr=0.3]"}, &which))
      << "nothing left to soup";
}

}  // namespace
}  // namespace stemma::coordinator
