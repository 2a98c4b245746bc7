#include "coordinator/experiments/experiment_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"

namespace stemma::experiments {
namespace {

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

std::vector<std::string> Deps(const PlanCell& c) {
  return std::vector<std::string>(c.spec.depends_on().begin(), c.spec.depends_on().end());
}

TEST(ExperimentPlan, MatrixIncludeExcludeAndPerLegEdges) {
  auto plan = ExpandExperiment(kStudy, "study.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto cells = ByName(*plan);
  // 3 × 2 − 1 excluded + 1 included = 6 cpt cells.
  std::vector<std::string> cpt;
  for (const PlanCell& c : plan->cells) {
    if (c.stage == "cpt") cpt.push_back(c.job_name);
  }
  EXPECT_EQ(cpt, (std::vector<std::string>{
                     "cpt[family=slavic,strategy=dense]", "cpt[family=slavic,strategy=freeze]",
                     "cpt[family=germanic,strategy=dense]", "cpt[family=germanic,strategy=freeze]",
                     "cpt[family=romance,strategy=dense]", "cpt[family=indic,strategy=dense]"}));
  EXPECT_EQ(plan->cells.size(), 6u + 2u + 1u + 1u + 1u);

  const PlanCell& slavic = *cells.at("cpt[family=slavic,strategy=dense]");
  EXPECT_EQ(slavic.spec.experiment(), "study");
  EXPECT_EQ(slavic.spec.labels().at("stage"), "cpt");
  EXPECT_EQ(slavic.spec.labels().at("family"), "slavic");
  EXPECT_EQ(slavic.spec.train().model(), "/ckpt/base");
  EXPECT_EQ(slavic.spec.train().steps(), 12) << "a whole-scalar variable keeps its type";
  EXPECT_EQ(slavic.spec.train().data().datasets(0).path(), "data/slavic");
  EXPECT_EQ(slavic.spec.train().out(), "experiments/study/cpt/family=slavic/strategy=dense/${{ self.id }}");
  EXPECT_TRUE(Deps(slavic).empty());

  // One-to-one: each revert waits only for its own family's dense expert.
  const PlanCell& revert = *cells.at("revert[family=germanic]");
  EXPECT_EQ(Deps(revert), (std::vector<std::string>{"cpt[family=germanic,strategy=dense]"}));
  EXPECT_EQ(revert.spec.revert().model(), OutputToken("cpt[family=germanic,strategy=dense]", "model"));
  EXPECT_EQ(revert.spec.revert().layers(0), "middle");

  // Fan-in: one models item per expert, in the cpt stage's order.
  const PlanCell& soup = *cells.at("soup");
  ASSERT_EQ(soup.spec.merge().models_size(), 6);
  EXPECT_EQ(soup.spec.merge().models(5).path(), OutputToken("cpt[family=indic,strategy=dense]", "model"));
  EXPECT_EQ(Deps(soup).size(), 6u);

  // A subset chosen by coordinates.
  const PlanCell& dense = *cells.at("dense-soup");
  ASSERT_EQ(dense.spec.merge().models_size(), 4);
  for (const auto& m : dense.spec.merge().models()) {
    EXPECT_NE(m.path().find("strategy=dense"), std::string::npos) << m.path();
  }
  // An order-only need waits for every cell of the stage it names.
  EXPECT_EQ(Deps(*cells.at("report")),
            (std::vector<std::string>{"revert[family=germanic]", "revert[family=slavic]", "soup"}));
  EXPECT_EQ(plan->edges, 0 + 2 + 6 + 4 + 3);
  const std::string text = FormatPlan(*plan);
  EXPECT_NE(text.find("11 jobs, 15 edges"), std::string::npos) << text;
}

TEST(ExperimentPlan, WiringReplacesTokensWithReportedOutputs) {
  auto plan = ExpandExperiment(kStudy, "study.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  v1::JobSpec soup = ByName(*plan).at("soup")->spec;
  google::protobuf::Map<std::string, std::string> outputs;
  auto lookup = [&](const std::string& job) -> const google::protobuf::Map<std::string, std::string>* {
    outputs.clear();
    outputs["model"] = "/store/" + job;
    return &outputs;
  };
  ASSERT_TRUE(WireInputs(&soup, lookup).ok());
  EXPECT_EQ(soup.merge().models(0).path(), "/store/cpt[family=slavic,strategy=dense]");
  v1::JobSpec revert = ByName(*plan).at("revert[family=slavic]")->spec;
  auto missing = WireInputs(&revert, [](const std::string&) -> const google::protobuf::Map<std::string, std::string>* {
    static const google::protobuf::Map<std::string, std::string> none;
    return &none;
  });
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("without reporting its 'model' output"), std::string::npos) << missing;
}

TEST(ExperimentPlan, BadFilesGetOneErrorNamingFileLineAndField) {
  struct Case {
    std::string name;
    std::string yaml;
    std::string expected;
  };
  const std::string head = "name: bad\nstages:\n";
  const std::vector<Case> cases = {
      {"cycle", head + "  a:\n    needs: [b]\n    noop: {}\n  b:\n    needs: [a]\n    noop: {}\n",
       "the stages form a cycle: a -> b -> a"},
      {"unknown stage", head + "  a:\n    needs: [nope]\n    noop: {}\n",
       "line 4: stages.a.needs[0]: unknown stage 'nope'"},
      {"unknown output", head + "  a:\n    init: {out: /m}\n  b:\n    needs: [a]\n    revert: {base: /m, model: \"${{ needs.a.outputs.results }}\"}\n",
       "line 7: stages.b.revert.model: stage 'a' (init) has no output 'results' (outputs: model)"},
      {"unknown variable", head + "  a:\n    init: {out: \"${{ vars.where }}\"}\n",
       "line 4: stages.a.init.out: unknown variable 'where'"},
      {"matrix key", head + "  a:\n    matrix: {x: [1, 2]}\n    init: {out: \"/m/${{ matrix.y }}\"}\n",
       "line 5: stages.a.init.out: matrix key 'y' is not defined for this cell (axes: x)"},
      {"engine field", head + "  a:\n    matrix: {x: [1]}\n    init:\n      out: /m\n      hidden_size: 2\n",
       "line 7: stages.a.init.hidden_size: 2 must be >= 8"},
      {"typo in spec", head + "  a:\n    init:\n      out: /m\n      hiden: 2\n",
       "line 6: stages.a.init.hiden: unknown field"},
      {"empty matrix", head + "  a:\n    matrix: {x: []}\n    noop: {}\n",
       "line 4: stages.a.matrix.x: is empty"},
      {"all excluded", head + "  a:\n    matrix: {x: [1], exclude: [{x: 1}]}\n    noop: {}\n",
       "line 4: stages.a.matrix: has no cells"},
      {"not in needs", head + "  a:\n    init: {out: /m}\n  b:\n    revert: {base: /m, model: \"${{ needs.a.outputs.model }}\"}\n",
       "line 6: stages.b.revert.model: stage 'a' is not in this stage's needs"},
      {"scalar fan-in", head + "  a:\n    matrix: {x: [1, 2]}\n    init: {out: /m}\n  b:\n    needs: [a]\n    revert: {base: /m, model: \"${{ needs.a.outputs.model }}\"}\n",
       "line 8: stages.b.revert.model: reads 2 cells of stage 'a'"},
      {"two kinds", head + "  a:\n    noop: {}\n    init: {out: /m}\n",
       "line 5: stages.a.init: a stage runs one kind of job"},
      {"no name", "stages:\n  a:\n    noop: {}\n", "name: is required"},
  };
  for (const Case& c : cases) {
    auto plan = ExpandExperiment(c.yaml, "bad.yaml");
    ASSERT_FALSE(plan.ok()) << c.name;
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << c.name;
    EXPECT_NE(plan.status().message().find("bad.yaml"), std::string::npos) << c.name << ": " << plan.status();
    EXPECT_NE(plan.status().message().find(c.expected), std::string::npos)
        << c.name << ": " << plan.status() << "\nwanted: " << c.expected;
  }
}

TEST(ExperimentPlan, ListVariablesBecomeAxesAndSpliceIntoLists) {
  auto plan = ExpandExperiment(R"(name: sweep
vars: {lrs: [0.001, 0.0003], layers: ["2:4", "6"]}
stages:
  t:
    matrix: {lr: "${{ vars.lrs }}"}
    train:
      model: /m
      data: {datasets: [{path: /d}], seq_len: 8}
      steps: 2
      optimizer: {lr: "${{ matrix.lr }}"}
      strategy: {freeze: {layers: "${{ vars.layers }}"}}
)", "sweep.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->cells.size(), 2u);
  EXPECT_EQ(plan->cells[1].job_name, "t[lr=0.0003]");
  EXPECT_DOUBLE_EQ(plan->cells[1].spec.train().optimizer().lr(), 0.0003);
  ASSERT_EQ(plan->cells[0].spec.train().strategy().freeze().layers_size(), 2);
  EXPECT_EQ(plan->cells[0].spec.train().strategy().freeze().layers(1), "6");
}

}  // namespace
}  // namespace stemma::experiments
