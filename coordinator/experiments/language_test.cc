// The experiment language beyond scalars: matrix variants (named mappings), variables looked
// up by a matrix key, expressions in where/include/exclude, `extends:` with overrides, the
// errors for an expression where none is evaluated, and the Pareto rule of early stopping.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "coordinator/experiments/early_stop.h"
#include "coordinator/experiments/experiment_plan.h"
#include "coordinator/experiments/extends.h"

namespace stemma::experiments {
namespace {

absl::StatusOr<ExperimentPlan> Expand(std::string_view text,
                                      std::map<std::string, std::string> imports = {}) {
  ExpansionEnv env;
  env.check_job = CheckJobAsSubmitted;
  env.imports = std::move(imports);
  return ExpandExperiment(text, "study.yaml", env);
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

const PlanCell* Cell(const ExperimentPlan& plan, const std::string& name) {
  for (const PlanCell& c : plan.cells) {
    if (c.job_name == name) return &c;
  }
  return nullptr;
}

std::vector<std::string> Names(const ExperimentPlan& plan, const std::string& stage) {
  std::vector<std::string> out;
  for (const PlanCell& c : plan.cells) {
    if (c.stage == stage) out.push_back(c.job_name);
  }
  return out;
}

// One CPT stage over a strategy axis of variants, a per-family learning rate looked up from a
// variable, downstream stages that pick variants with where.
constexpr const char* kStudy = R"Y(name: study
vars:
  base: /ckpt/base
  lr: {slavic: 1.0e-3, romance: 3.0e-3}
  reverted: [vanilla]
  families: [{family: slavic}, {family: romance}]
  row: {vanilla: expert, freeze: "expert, middle frozen", l2sp: "expert, L2-SP"}
stages:
  cpt:
    matrix:
      family: [slavic, romance]
      strategy:
        - {name: vanilla}
        - name: freeze
          train: {strategy: {freeze: {layers: [middle]}}}
        - name: l2sp
          train: {strategy: {l2sp: [{layers: [middle], lambda: 0.05}, {lambda: 0.001}]}}
          labels: {penalty: l2sp}
    resources: {cpus: 1}
    labels: {report.row: "${{ vars.row[matrix.strategy] }} (${{ matrix.family }})"}
    train:
      model: ${{ vars.base }}
      data: {datasets: [{path: "data/${{ matrix.family }}"}], seq_len: 16}
      steps: 10
      optimizer: {lr: "${{ vars.lr[matrix.family] }}", weight_decay: 0.01}
  revert:
    needs: [{stage: cpt, where: {strategy: "${{ vars.reverted }}"}}]
    matrix: {include: "${{ vars.families }}"}
    revert: {base: "${{ vars.base }}", model: "${{ needs.cpt.outputs.model }}", layers: [middle]}
  soup:
    needs: [{stage: cpt, where: {strategy: vanilla}}]
    merge: {method: linear, models: [{path: "${{ needs.cpt.outputs.model }}"}]}
)Y";

TEST(ExperimentLanguage, MatrixVariantsCarryTheirFieldsAndNameTheCell) {
  auto plan = Expand(kStudy);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(Names(*plan, "cpt"),
            (std::vector<std::string>{
                "cpt[family=slavic,strategy=vanilla]", "cpt[family=slavic,strategy=freeze]",
                "cpt[family=slavic,strategy=l2sp]", "cpt[family=romance,strategy=vanilla]",
                "cpt[family=romance,strategy=freeze]", "cpt[family=romance,strategy=l2sp]"}));
  const PlanCell* vanilla = Cell(*plan, "cpt[family=slavic,strategy=vanilla]");
  const PlanCell* freeze = Cell(*plan, "cpt[family=slavic,strategy=freeze]");
  const PlanCell* l2sp = Cell(*plan, "cpt[family=romance,strategy=l2sp]");
  ASSERT_TRUE(vanilla && freeze && l2sp);
  EXPECT_FALSE(vanilla->spec.train().has_strategy());
  ASSERT_TRUE(freeze->spec.train().strategy().has_freeze());
  EXPECT_EQ(freeze->spec.train().strategy().freeze().layers(0), "middle");
  ASSERT_EQ(l2sp->spec.train().strategy().l2sp_size(), 2);
  EXPECT_DOUBLE_EQ(l2sp->spec.train().strategy().l2sp(0).lambda(), 0.05);
  // The variant's fields merge over the stage's: the stage's own fields stay.
  EXPECT_EQ(l2sp->spec.train().data().seq_len(), 16);
  EXPECT_EQ(l2sp->spec.labels().at("penalty"), "l2sp");
  EXPECT_EQ(l2sp->spec.labels().at("strategy"), "l2sp");
  EXPECT_EQ(freeze->spec.labels().at("report.row"), "expert, middle frozen (slavic)");
  EXPECT_EQ(vanilla->spec.labels().count("penalty"), 0u);
}

TEST(ExperimentLanguage, VarsLookedUpByAMatrixKeyAreNotAxes) {
  auto plan = Expand(kStudy);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const PlanCell* slavic = Cell(*plan, "cpt[family=slavic,strategy=vanilla]");
  const PlanCell* romance = Cell(*plan, "cpt[family=romance,strategy=vanilla]");
  ASSERT_TRUE(slavic && romance);
  EXPECT_DOUBLE_EQ(slavic->spec.train().optimizer().lr(), 1.0e-3);
  EXPECT_DOUBLE_EQ(romance->spec.train().optimizer().lr(), 3.0e-3);
  // Not an axis: neither in the cell's name, nor its labels, nor its output path.
  EXPECT_EQ(slavic->spec.labels().count("lr"), 0u);
  EXPECT_EQ(slavic->spec.train().out().find("lr"), std::string::npos) << slavic->spec.train().out();
  // Literal keys, dotted keys and list indexes read the same way.
  auto literal = Expand(Replace(kStudy, "vars.lr[matrix.family]", "vars.lr['romance']"));
  ASSERT_TRUE(literal.ok()) << literal.status();
  EXPECT_DOUBLE_EQ(
      Cell(*literal, "cpt[family=slavic,strategy=vanilla]")->spec.train().optimizer().lr(), 3.0e-3);
  // A key the mapping lacks names the keys it has.
  auto missing = Expand(Replace(kStudy, "romance: 3.0e-3", "celtic: 3.0e-3"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(
                "stages.cpt.train.optimizer.lr: vars.lr[romance]: no key 'romance' (keys: "
                "slavic, celtic)"),
            std::string::npos)
      << missing.status();
}

TEST(ExperimentLanguage, WhereAndIncludeEvaluateExpressions) {
  auto plan = Expand(kStudy);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  // include from a variable: one revert per family, each reading its vanilla expert (where
  // from a variable holding a list).
  EXPECT_EQ(Names(*plan, "revert"),
            (std::vector<std::string>{"revert[family=slavic]", "revert[family=romance]"}));
  const PlanCell* revert = Cell(*plan, "revert[family=romance]");
  ASSERT_NE(revert, nullptr);
  EXPECT_EQ(
      std::vector<std::string>(revert->spec.depends_on().begin(), revert->spec.depends_on().end()),
      (std::vector<std::string>{"cpt[family=romance,strategy=vanilla]"}));
  EXPECT_EQ(Cell(*plan, "soup")->spec.merge().models_size(), 2);
}

TEST(ExperimentLanguage, AnExpressionWhereNoneIsEvaluatedIsAnErrorNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"    needs: [{stage: \"${{ vars.up }}\"}]\n",
       "stages.b.needs[0].stage: expressions are not evaluated here"},
      {"    cache: \"${{ vars.cache }}\"\n", "stages.b.cache: expressions are not evaluated here"},
      {"    needs: [{stage: a, where: {x: \"${{ matrix.x }}\"}}]\n",
       "stages.b.needs[0].where.x: ${{ matrix.x }}: only ${{ vars.X }} is known here"},
      {"    needs: [{stage: a, where: {x: \"${{ vars.nope }}\"}}]\n",
       "stages.b.needs[0].where.x: unknown variable 'nope'"},
      {"    matrix: {search: {method: \"${{ vars.m }}\"}, x: [1]}\n",
       "stages.b.matrix.search.method: expressions are not evaluated here"},
  };
  for (const auto& [line, expected] : cases) {
    const std::string text =
        "name: e\nvars: {up: a, cache: true, m: grid}\nstages:\n  a:\n"
        "    matrix: {x: [1, 2]}\n    noop: {}\n  b:\n" +
        line + "    noop: {}\n";
    auto plan = Expand(text);
    ASSERT_FALSE(plan.ok()) << line;
    EXPECT_NE(plan.status().message().find(expected), std::string::npos)
        << plan.status() << "\nwanted: " << expected;
  }
  auto name = Expand("name: \"${{ vars.n }}\"\nstages:\n  a:\n    noop: {}\n");
  ASSERT_FALSE(name.ok());
  EXPECT_NE(name.status().message().find("line 1: name: expressions are not evaluated here"),
            std::string::npos)
      << name.status();
  auto variant = Expand(
      "name: e\nstages:\n  a:\n    matrix: {v: [{name: x, needs: [b]}]}\n    noop: {}\n"
      "  b:\n    noop: {}\n");
  ASSERT_FALSE(variant.ok());
  EXPECT_NE(variant.status().message().find(
                "stages.a.matrix.v[x].needs: a variant sets the job's fields"),
            std::string::npos)
      << variant.status();
  auto unnamed =
      Expand("name: e\nstages:\n  a:\n    matrix: {v: [{name: x}, {y: 1}]}\n    noop: {}\n");
  ASSERT_FALSE(unnamed.ok());
  EXPECT_NE(
      unnamed.status().message().find("stages.a.matrix.v[1]: a variant is a mapping with a name"),
      std::string::npos)
      << unnamed.status();
  auto not_variant = Expand(
      "name: e\nstages:\n  a:\n    matrix:\n      v: [{name: x}]\n      include: [{v: y}]\n"
      "    noop: {}\n");
  ASSERT_FALSE(not_variant.ok());
  EXPECT_NE(not_variant.status().message().find("'y' is not a variant of axis 'v' (variants: x)"),
            std::string::npos)
      << not_variant.status();
}

TEST(ExperimentLanguage, MergeReplacesListsAndDeletesNullKeys) {
  auto base = LoadYamlDocuments("a: {x: 1, y: [1, 2], z: {k: v}}\nb: 2\n", "base");
  auto over = LoadYamlDocuments("a: {y: [3], z: ~, w: 4}\nc: 5\n", "over");
  ASSERT_TRUE(base.ok() && over.ok());
  const YamlNode merged = MergeYaml((*base)[0], (*over)[0]);
  std::string json;
  AppendYamlAsJson(merged, &json);
  EXPECT_EQ(json, R"({"a":{"x":1,"y":[3],"w":4},"b":2,"c":5})");
}

TEST(ExperimentLanguage, ExtendsAppliesOverridesOverTheBaseFile) {
  const std::string paper = R"Y(extends: study.yaml   # the tiny file
name: study-paper
vars:
  base: /ckpt/gemma
  lr: {romance: 1.0e-4}
stages:
  cpt:
    resources: {memory_mb: 2048}
    train: {steps: 20}
  soup: ~
)Y";
  auto plan = Expand(paper, {{"study.yaml", kStudy}});
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->name, "study-paper");
  EXPECT_EQ(Cell(*plan, "soup"), nullptr) << "a null override deletes the stage";
  const PlanCell* c = Cell(*plan, "cpt[family=romance,strategy=freeze]");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->spec.resources().memory_mb(), 2048);
  EXPECT_DOUBLE_EQ(c->spec.resources().cpus(), 1) << "mappings merge key by key";
  EXPECT_EQ(c->spec.train().steps(), 20);
  EXPECT_EQ(c->spec.train().model(), "/ckpt/gemma");
  EXPECT_EQ(c->spec.train().data().seq_len(), 16);
  EXPECT_DOUBLE_EQ(c->spec.train().optimizer().lr(), 1.0e-4);
  EXPECT_TRUE(c->spec.train().strategy().has_freeze());
  // The slavic rate came from the base's mapping, merged with the override's.
  EXPECT_DOUBLE_EQ(
      Cell(*plan, "cpt[family=slavic,strategy=vanilla]")->spec.train().optimizer().lr(), 1.0e-3);

  auto missing = Expand(paper);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(
                "study.yaml: line 1: extends: 'study.yaml' was not sent with the file"),
            std::string::npos)
      << missing.status();
  auto cycle = Expand("extends: a.yaml\nname: x\n",
                      {{"a.yaml", "extends: b.yaml\n"}, {"b.yaml", "extends: a.yaml\n"}});
  ASSERT_FALSE(cycle.ok());
  EXPECT_NE(
      cycle.status().message().find("the files extend each other: a.yaml -> b.yaml -> a.yaml"),
      std::string::npos)
      << cycle.status();
  auto list = Expand("extends: a.yaml\n", {{"a.yaml", "- 1\n- 2\n"}});
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.status().message().find("'a.yaml' is not one experiment file"), std::string::npos)
      << list.status();
}

// Pareto: two objectives, both minimized.
v1::EarlyStopRule Pareto(double keep = 0.5) {
  v1::EarlyStopRule r;
  r.set_method("pareto");
  for (const char* m : {"heldout_loss/uk", "heldout_loss/en"}) {
    v1::EarlyStopObjective* o = r.add_objectives();
    o->set_metric(m);
    o->set_mode("min");
  }
  r.add_rungs(4);
  r.set_keep(keep);
  return r;
}

TEST(EarlyStopPareto, NonDominatedSortingAndCrowding) {
  // a, b, c trade off (front 0); d is dominated by b only (front 1); e by everything (front
  // 2).
  const std::vector<std::vector<double>> p = {{1, 5}, {2, 2}, {5, 1}, {3, 3}, {6, 6}};
  EXPECT_EQ(ParetoFronts(p, {false, false}), (std::vector<int>{0, 0, 0, 1, 2}));
  // Maximizing the second objective turns the order around.
  EXPECT_EQ(ParetoFronts(p, {false, true}), (std::vector<int>{0, 1, 2, 1, 0}));
  // Equal vectors do not dominate each other.
  EXPECT_EQ(ParetoFronts({{1, 1}, {1, 1}}, {false, false}), (std::vector<int>{0, 0}));
  // The front's extremes are infinitely crowded; b's distance is (5-1)/(5-1) + (5-1)/(5-1).
  const std::vector<double> d = CrowdingDistances(p, {0, 1, 2});
  EXPECT_TRUE(std::isinf(d[0]) && std::isinf(d[2]));
  EXPECT_DOUBLE_EQ(d[1], 2.0);
}

TEST(EarlyStopPareto, KeepsTheBestFrontsAndBreaksTheCutByCrowding) {
  const v1::EarlyStopRule rule = Pareto();
  // The first trial cannot be judged (ceil(1/keep) = 2).
  EXPECT_FALSE(DecideAtRungPareto(rule, {{3, 3}}, 0).stop);
  // Dominated by the one before it: front 1, rank 2 > ceil(0.5·2) = 1.
  RungDecision d = DecideAtRungPareto(rule, {{2, 2}, {3, 3}}, 1);
  EXPECT_TRUE(d.stop);
  EXPECT_EQ(d.front, 1);
  EXPECT_EQ(d.fronts, 2);
  EXPECT_EQ(d.rank, 2);
  // A trade-off is not dominated: front 0 with the others, infinitely crowded (an extreme).
  d = DecideAtRungPareto(rule, {{2, 2}, {3, 3}, {1, 5}}, 2);
  EXPECT_FALSE(d.stop);
  EXPECT_EQ(d.front, 0);
  // Four on one front, keep 2: the two extremes stay; the middle ones are ranked by crowding.
  d = DecideAtRungPareto(rule, {{1, 5}, {5, 1}, {2, 3.9}, {2.1, 3.8}}, 3);
  EXPECT_EQ(d.front, 0);
  EXPECT_TRUE(d.stop) << "rank " << d.rank;
  // A NaN stands in as +inf (the stopper's job): dominated by everything finite.
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(DecideAtRungPareto(rule, {{2, 2}, {inf, 1.5}, {3, 3}, {inf, inf}}, 3).stop);
  EXPECT_NE(StopReasonPareto(rule, 0, 4, {3, 3}, DecideAtRungPareto(rule, {{2, 2}, {3, 3}}, 1))
                .find("heldout_loss/uk=3, heldout_loss/en=3 on Pareto front 2 of 2"),
            std::string::npos);
  EXPECT_TRUE(CheckRule(rule).ok());
  v1::EarlyStopRule one = rule;
  one.mutable_objectives()->RemoveLast();
  EXPECT_FALSE(CheckRule(one).ok()) << "pareto needs two objectives";
}

TEST(EarlyStopPareto, TheFileRuleBecomesEachTrialsTypedRule) {
  const std::string sweep = R"Y(name: es
stages:
  cpt:
    matrix: {lr: [0.1, 0.2]}
    early_stop:
      method: pareto
      objectives: [{metric: heldout_loss/uk}, {metric: heldout_loss/en, mode: max}]
      rungs: [10]
      keep: 0.5
    train:
      model: /m
      data: {datasets: [{path: /d}], seq_len: 10, heldout_fraction: 0.1}
      steps: 50
      eval: {every: 5}
      optimizer: {lr: "${{ matrix.lr }}"}
)Y";
  auto plan = Expand(sweep);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const v1::EarlyStopRule& r = plan->cells[0].spec.early_stop_rule();
  EXPECT_EQ(r.method(), "pareto");
  ASSERT_EQ(r.objectives_size(), 2);
  EXPECT_EQ(r.objectives(0).mode(), "min") << "min is the default";
  EXPECT_EQ(r.objectives(1).mode(), "max");
  EXPECT_TRUE(r.metric().empty());
  EXPECT_TRUE(CheckRule(r).ok());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"objectives: [{metric: heldout_loss/uk}]",
       "stages.cpt.early_stop.objectives: method: pareto needs 2 to 8 objectives"},
      {"objectives: [{metric: heldout_loss/uk}, {metric: accuracy}]",
       "'accuracy' is not a metric the trainer reports"},
      {"objectives: [{metric: heldout_loss/uk}, {metric: loss, mode: up}]",
       "loss: mode must be min or max"},
  };
  for (const auto& [objectives, expected] : cases) {
    auto bad = Expand(Replace(
        sweep, "objectives: [{metric: heldout_loss/uk}, {metric: heldout_loss/en, mode: max}]",
        objectives));
    ASSERT_FALSE(bad.ok()) << objectives;
    EXPECT_NE(bad.status().message().find(expected), std::string::npos)
        << bad.status() << "\nwanted: " << expected;
  }
  auto both = Expand(Replace(sweep, "method: pareto", "method: pareto\n      metric: loss"));
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("stages.cpt.early_stop.metric: method: pareto ranks by "
                                         "objectives"),
            std::string::npos)
      << both.status();
}

}  // namespace
}  // namespace stemma::experiments
