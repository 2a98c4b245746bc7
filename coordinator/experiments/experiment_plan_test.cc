#include "coordinator/experiments/experiment_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "coordinator/experiments/cost.h"
#include "coordinator/experiments/early_stop.h"

namespace stemma::experiments {
namespace {

// As the coordinator expands: each cell checked as a submitted job (models' sizes unknown).
absl::StatusOr<ExperimentPlan> Expand(std::string_view text, std::string_view file) {
  ExpansionEnv env;
  env.check_job = CheckJobAsSubmitted;
  return ExpandExperiment(text, file, env);
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

std::vector<std::string> Deps(const PlanCell& c) {
  return std::vector<std::string>(c.spec.depends_on().begin(), c.spec.depends_on().end());
}

TEST(ExperimentPlan, MatrixIncludeExcludeAndPerLegEdges) {
  auto plan = Expand(kStudy, "study.yaml");
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
  EXPECT_EQ(slavic.spec.train().out(),
            "experiments/study/cpt/family=slavic/strategy=dense/${{ self.id }}");
  EXPECT_TRUE(Deps(slavic).empty());

  // One-to-one: each revert waits only for its own family's dense expert.
  const PlanCell& revert = *cells.at("revert[family=germanic]");
  EXPECT_EQ(Deps(revert), (std::vector<std::string>{"cpt[family=germanic,strategy=dense]"}));
  EXPECT_EQ(revert.spec.revert().model(),
            OutputToken("cpt[family=germanic,strategy=dense]", "model"));
  EXPECT_EQ(revert.spec.revert().layers(0), "middle");

  // Fan-in: one models item per expert, in the cpt stage's order.
  const PlanCell& soup = *cells.at("soup");
  ASSERT_EQ(soup.spec.merge().models_size(), 6);
  EXPECT_EQ(soup.spec.merge().models(5).path(),
            OutputToken("cpt[family=indic,strategy=dense]", "model"));
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
      {"unknown output",
       head + "  a:\n    init: {out: /m}\n  b:\n    needs: [a]\n    revert: {base: /m, model: "
              "\"${{ needs.a.outputs.results }}\"}\n",
       "line 7: stages.b.revert.model: stage 'a' (init) has no output 'results' (outputs: model)"},
      {"unknown variable", head + "  a:\n    init: {out: \"${{ vars.where }}\"}\n",
       "line 4: stages.a.init.out: unknown variable 'where'"},
      {"matrix key",
       head + "  a:\n    matrix: {x: [1, 2]}\n    init: {out: \"/m/${{ matrix.y }}\"}\n",
       "line 5: stages.a.init.out: matrix key 'y' is not defined for this cell (axes: x)"},
      {"engine field",
       head + "  a:\n    matrix: {x: [1]}\n    init:\n      out: /m\n      hidden_size: 2\n",
       "line 7: stages.a.init.hidden_size: 2 must be >= 8"},
      {"typo in spec", head + "  a:\n    init:\n      out: /m\n      hiden: 2\n",
       "line 6: stages.a.init.hiden: unknown field"},
      {"empty matrix", head + "  a:\n    matrix: {x: []}\n    noop: {}\n",
       "line 4: stages.a.matrix.x: is empty"},
      {"all excluded", head + "  a:\n    matrix: {x: [1], exclude: [{x: 1}]}\n    noop: {}\n",
       "line 4: stages.a.matrix: has no cells"},
      {"not in needs",
       head + "  a:\n    init: {out: /m}\n  b:\n    revert: {base: /m, model: \"${{ "
              "needs.a.outputs.model }}\"}\n",
       "line 6: stages.b.revert.model: stage 'a' is not in this stage's needs"},
      {"scalar fan-in",
       head + "  a:\n    matrix: {x: [1, 2]}\n    init: {out: /m}\n  b:\n    needs: [a]\n    "
              "revert: {base: /m, model: \"${{ needs.a.outputs.model }}\"}\n",
       "line 8: stages.b.revert.model: reads 2 cells of stage 'a'"},
      {"two kinds", head + "  a:\n    noop: {}\n    init: {out: /m}\n",
       "line 5: stages.a.init: a stage runs one kind of job"},
      {"no name", "stages:\n  a:\n    noop: {}\n", "name: is required"},
  };
  for (const Case& c : cases) {
    auto plan = Expand(c.yaml, "bad.yaml");
    ASSERT_FALSE(plan.ok()) << c.name;
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << c.name;
    EXPECT_NE(plan.status().message().find("bad.yaml"), std::string::npos)
        << c.name << ": " << plan.status();
    EXPECT_NE(plan.status().message().find(c.expected), std::string::npos)
        << c.name << ": " << plan.status() << "\nwanted: " << c.expected;
  }
}

TEST(ExperimentPlan, ListVariablesBecomeAxesAndSpliceIntoLists) {
  auto plan = Expand(R"(name: sweep
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
)",
                     "sweep.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->cells.size(), 2u);
  EXPECT_EQ(plan->cells[1].job_name, "t[lr=0.0003]");
  EXPECT_DOUBLE_EQ(plan->cells[1].spec.train().optimizer().lr(), 0.0003);
  ASSERT_EQ(plan->cells[0].spec.train().strategy().freeze().layers_size(), 2);
  EXPECT_EQ(plan->cells[0].spec.train().strategy().freeze().layers(1), "6");
}

constexpr const char* kRandom = R"(name: rs
stages:
  t:
    matrix:
      search: {method: random, seed: 7, samples: 12}
      lr: {loguniform: [1.0e-5, 1.0e-2]}
      warmup: {int: [0, 3]}
      dropout: {uniform: [0.0, 0.5]}
      opt: [adamw, lion]
    train:
      model: /m
      data: {datasets: [{path: /d}], seq_len: 8}
      steps: 20
      schedule: {warmup_steps: "${{ matrix.warmup }}"}
      optimizer: {lr: "${{ matrix.lr }}"}
)";

TEST(ExperimentPlan, RandomSearchIsDeterministicGivenTheSeedAndNamesCellsByValue) {
  auto a = Expand(kRandom, "rs.yaml");
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Expand(kRandom, "rs.yaml");
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->cells.size(), 12u) << "continuous axes make repeats (kept once) all but impossible";
  std::set<std::string> lists;
  for (size_t i = 0; i < a->cells.size(); ++i) {
    const PlanCell& c = a->cells[i];
    EXPECT_EQ(c.job_name, b->cells[i].job_name) << "the same seed draws the same trials";
    ASSERT_EQ(c.coords.size(), 4u);
    // The name's value is the spec's value: a trial is what its name says.
    const double lr = std::stod(c.coords[0].second);
    EXPECT_DOUBLE_EQ(c.spec.train().optimizer().lr(), lr) << c.job_name;
    EXPECT_GE(lr, 1e-5);
    EXPECT_LE(lr, 1e-2);
    EXPECT_LE(c.coords[0].second.size(), 8u) << "short: " << c.job_name;
    const int warmup = std::stoi(c.coords[1].second);
    EXPECT_GE(warmup, 0);
    EXPECT_LE(warmup, 3);
    EXPECT_EQ(c.spec.train().schedule().warmup_steps(), warmup);
    const double dropout = std::stod(c.coords[2].second);
    EXPECT_GE(dropout, 0.0);
    EXPECT_LE(dropout, 0.5);
    lists.insert(c.coords[3].second);
  }
  EXPECT_EQ(lists, (std::set<std::string>{"adamw", "lion"})) << "a list is a choice under random";
  // Another seed, other trials.
  std::string other = kRandom;
  other.replace(other.find("seed: 7"), 7, "seed: 8");
  auto c = Expand(other, "rs.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->cells[0].job_name, a->cells[0].job_name);
}

TEST(ExperimentPlan, GridSearchEnumeratesIntRangesAndChoices) {
  auto plan = Expand(R"(name: g
stages:
  t:
    matrix:
      search: grid
      n: {int: [1, 3]}
      c: {choice: [x, y]}
    noop: {}
)",
                     "g.yaml");
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> names;
  for (const PlanCell& c : plan->cells) names.push_back(c.job_name);
  EXPECT_EQ(names, (std::vector<std::string>{"t[n=1,c=x]", "t[n=1,c=y]", "t[n=2,c=x]", "t[n=2,c=y]",
                                             "t[n=3,c=x]", "t[n=3,c=y]"}));
}

TEST(ExperimentPlan, BadSearchesGetOneErrorNamingFileLineAndField) {
  const std::string head = "name: bad\nstages:\n  t:\n    matrix:\n";
  const std::string tail = "    noop: {}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"      search: {method: random, samples: 4}\n      x: [1, 2]\n",
       "line 5: stages.t.matrix.search.seed: a random search needs a seed: a seedless random sweep "
       "would draw "
       "other trials on every submission and never be memoized"},
      {"      search: {method: random, seed: 1, samples: 4}\n      x: {normal: [0, 1]}\n",
       "line 6: stages.t.matrix.x.normal: unknown distribution 'normal' (use uniform, loguniform, "
       "int or choice)"},
      {"      search: {method: random, seed: 1, samples: 4}\n      x: {uniform: [2, 1]}\n",
       "line 6: stages.t.matrix.x.uniform: lo 2 is above hi 1"},
      {"      search: {method: random, seed: 1, samples: 4}\n      x: {int: [5, 1]}\n",
       "line 6: stages.t.matrix.x.int: lo 5 is above hi 1"},
      {"      search: {method: random, seed: 1, samples: 4}\n      x: {loguniform: [0, 1]}\n",
       "line 6: stages.t.matrix.x.loguniform: lo 0 must be > 0"},
      {"      search: {method: random, seed: 1, samples: 0}\n      x: [1, 2]\n",
       "line 5: stages.t.matrix.search.samples: '0' must be a whole number in 1..10000"},
      {"      search: {method: random, seed: 1, samples: 20000}\n      x: [1, 2]\n",
       "line 5: stages.t.matrix.search.samples: '20000' must be a whole number in 1..10000"},
      {"      search: {method: annealing}\n      x: [1]\n",
       "line 5: stages.t.matrix.search.method: 'annealing' is not a search (use grid or random)"},
      {"      search: grid\n      x: {uniform: [0, 1]}\n",
       "line 6: stages.t.matrix.x: uniform is a distribution to sample"},
      {"      search: {method: grid, seed: 3}\n      x: [1]\n",
       "line 5: stages.t.matrix.search.seed: is for search method random"},
      {"      search: {method: random, seed: 1, samples: 2}\n",
       "stages.t.matrix.search: a random search needs at least one axis"},
  };
  for (const auto& [matrix, expected] : cases) {
    auto plan = Expand(head + matrix + tail, "bad.yaml");
    ASSERT_FALSE(plan.ok()) << matrix;
    EXPECT_EQ(plan.status().message().rfind("bad.yaml: ", 0), 0u) << plan.status();
    EXPECT_NE(plan.status().message().find(expected), std::string::npos)
        << plan.status() << "\nwanted: " << expected;
  }
  auto stage_level =
      Expand("name: bad\nstages:\n  t:\n    search: random\n    noop: {}\n", "bad.yaml");
  ASSERT_FALSE(stage_level.ok());
  EXPECT_NE(
      stage_level.status().message().find(
          "bad.yaml: line 4: stages.t.search: a search samples a matrix, and this stage has none"),
      std::string::npos)
      << stage_level.status();
}

TEST(EarlyStop, AshaRuleAsDocumented) {
  v1::EarlyStopRule c;
  c.set_metric("loss");
  c.add_rungs(3);
  c.add_rungs(6);
  c.set_keep(0.5);
  // The first trial at a rung cannot be judged; from ceil(1/keep) = 2 on, the top ceil(keep·n).
  EXPECT_FALSE(DecideAtRung(c, {1}, 1).stop);
  RungDecision d = DecideAtRung(c, {1, 4}, 4);
  EXPECT_TRUE(d.stop);
  EXPECT_EQ(d.rank, 2);
  EXPECT_EQ(d.keep_count, 1);
  EXPECT_FALSE(DecideAtRung(c, {1, 4, 2}, 2).stop) << "rank 2 of 3 is in the top ceil(1.5) = 2";
  EXPECT_TRUE(DecideAtRung(c, {1, 4, 2, 3}, 3).stop);
  c.set_min_trials(3);
  EXPECT_FALSE(DecideAtRung(c, {1, 4}, 4).stop) << "min_trials raises the bar";
  c.set_mode("max");
  c.set_min_trials(0);
  EXPECT_TRUE(DecideAtRung(c, {5, 1}, 1).stop);
  EXPECT_FALSE(DecideAtRung(c, {1, 5}, 5).stop);
  // The rule travels typed, in the job's spec.
  v1::JobSpec job;
  *job.mutable_early_stop_rule() = c;
  v1::JobSpec parsed;
  ASSERT_TRUE(parsed.ParseFromString(job.SerializeAsString()));
  EXPECT_EQ(std::vector<int64_t>(parsed.early_stop_rule().rungs().begin(),
                                 parsed.early_stop_rule().rungs().end()),
            (std::vector<int64_t>{3, 6}));
  EXPECT_TRUE(Maximize(parsed.early_stop_rule()));
  EXPECT_DOUBLE_EQ(Keep(parsed.early_stop_rule()), 0.5);
  EXPECT_TRUE(CheckRule(parsed.early_stop_rule()).ok());
  c.clear_rungs();
  EXPECT_FALSE(CheckRule(c).ok()) << "a rule without rungs";
}

TEST(ExperimentPlan, GpuHoursReadModelSizesThroughTheEnv) {
  constexpr const char* kTrain = R"(name: cost
models: {/declared: {params: 1000000000}}
stages:
  a:
    matrix: {m: [/declared, /on-disk, /unknown]}
    train: {model: "${{ matrix.m }}", data: {datasets: [{path: /d}], seq_len: 1000}, steps: 1000}
)";
  ExpansionEnv env;
  std::vector<std::string> asked;
  env.model_params = [&](const std::string& path) -> std::optional<int64_t> {
    asked.push_back(path);
    if (path == "/on-disk") return 2000000000;
    return std::nullopt;
  };
  auto plan = ExpandExperiment(kTrain, "cost.yaml", env);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(asked, (std::vector<std::string>{"/on-disk", "/unknown"}))
      << "a declared model is never looked up";
  // 6 · (1e9 + 2e9) · 1e6 tokens at 160 TFLOP/s.
  EXPECT_NEAR(plan->gpu_hours_estimate, 6.0 * 3e9 * 1e6 / 160e12 / 3600.0, 1e-9);
  EXPECT_EQ(plan->unknown_cost_cells, 1);
  EXPECT_EQ(ParamsFromConfig(R"({"hidden_size": 8, "vocab_size": 10, "intermediate_size": 16})", 2)
                .value_or(-1),
            2 * (4 * 8 * 8 + 3 * 8 * 16) + 2 * 10 * 8);
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

TEST(EarlyStop, BadConfigsGetOneErrorNamingFileLineAndField) {
  auto with = [](const std::string& es, const std::string& kind = "train") {
    std::string t = kSweep;
    t.replace(t.find("{metric: heldout_loss/en, rungs_tokens: [100, 400], keep: 0.5}"), 62, es);
    if (kind != "train") t = "name: es\nstages:\n  s:\n    early_stop: " + es + "\n    noop: {}\n";
    return Expand(t, "es.yaml");
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{metric: accuracy, rungs: [5], keep: 0.5}",
       "line 5: stages.cpt.early_stop.metric: 'accuracy' is not a metric the trainer reports"},
      {"{metric: loss, rungs: [5], keep: 1.5}",
       "stages.cpt.early_stop.keep: '1.5' must be a fraction in (0, 1)"},
      {"{metric: loss, rungs: [10, 5]}", "stages.cpt.early_stop.rungs: must ascend"},
      {"{metric: loss, rungs: [50]}",
       "rung at step 50 is not before the end of training (50 steps) in cell cpt[lr=0.1]"},
      {"{metric: loss}",
       "stages.cpt.early_stop.rungs: give exactly one of rungs (steps) and rungs_tokens"},
      {"{metric: loss, rungs: [5], mode: up}", "stages.cpt.early_stop.mode: must be min or max"},
      {"{metric: loss, rungs: [5], patience: 3}", "stages.cpt.early_stop.patience: unknown field"},
  };
  for (const auto& [es, expected] : cases) {
    auto plan = with(es);
    ASSERT_FALSE(plan.ok()) << es;
    EXPECT_NE(plan.status().message().find(expected), std::string::npos)
        << plan.status() << "\nwanted: " << expected;
  }
  auto noop = with("{metric: loss, rungs: [5]}", "noop");
  ASSERT_FALSE(noop.ok());
  EXPECT_NE(noop.status().message().find(
                "es.yaml: line 4: stages.s.early_stop: early stopping needs a train stage"),
            std::string::npos)
      << noop.status();
}

}  // namespace
}  // namespace stemma::experiments
