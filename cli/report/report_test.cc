// The study report's pure parts with fake inputs: table values, deltas, best marks, the
// acquisition/forgetting summary and its Pareto front, pending cells, missing data, the
// labels, the SVG writer and the four output forms.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "absl/strings/str_cat.h"
#include "cli/report/report_model.h"
#include "cli/report/report_writers.h"
#include "cli/report/svg_plot.h"

namespace stemma::cli::report {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

// An eval cell whose job reported `bpb/<lang>` for each value given.
Cell Eval(const std::string& name, const std::string& id, const std::string& state = "SUCCEEDED") {
  Cell c;
  c.job_name = name;
  c.stage = name.substr(0, name.find('['));
  c.kind = "eval";
  c.job_id = id;
  c.metrics_job = id;
  c.state = state;
  return c;
}

void Add(ReportInput* in, const std::string& job, const std::string& name, double value,
         const std::string& language = "") {
  Point p;
  p.name = name;
  p.value = value;
  p.language = language;
  in->points[job].push_back(p);
}

// base, dense, freeze: bpb on ru (held-in), uk (held-in), en (general), and acc on ru.
struct Study {
  double base_ru = 3.0, base_uk = 3.2, base_en = 2.0, base_acc = 0.25;
  double dense_ru = 2.0, dense_uk = 2.4, dense_en = 2.6, dense_acc = 0.40;
  double freeze_ru = 2.5, freeze_uk = 2.9, freeze_en = 2.1, freeze_acc = 0.30;

  ReportInput Input() const {
    ReportInput in;
    in.experiment = "study";
    in.revision = 2;
    in.cells = {Eval("eval-base", "j-1"), Eval("eval-dense", "j-2"), Eval("eval-freeze", "j-3")};
    const std::vector<std::tuple<std::string, double, double, double, double>> v = {
        {"j-1", base_ru, base_uk, base_en, base_acc},
        {"j-2", dense_ru, dense_uk, dense_en, dense_acc},
        {"j-3", freeze_ru, freeze_uk, freeze_en, freeze_acc}};
    for (const auto& [job, ru, uk, en, acc] : v) {
      Add(&in, job, "bpb/ru", ru, "ru");
      Add(&in, job, "ppl/ru", std::exp2(ru), "ru");
      Add(&in, job, "bpb/uk", uk, "uk");
      Add(&in, job, "bpb/en", en, "en");
      Add(&in, job, "acc/belebele_ru", acc, "ru");
      Add(&in, job, "bpb/all", (ru + uk + en) / 3);
    }
    return in;
  }
};

const Row& RowNamed(const Report& r, const std::string& title) {
  for (const Row& row : r.rows) {
    if (row.title == title) return row;
  }
  ADD_FAILURE() << "no row " << title;
  static Row none;
  return none;
}

const Plot& PlotNamed(const Report& r, const std::string& file) {
  for (const Plot& p : r.plots) {
    if (p.file == file) return p;
  }
  ADD_FAILURE() << "no plot " << file;
  static Plot none;
  return none;
}

const Summary& SummaryOf(const Report& r, const std::string& row) {
  for (const Summary& s : r.summary) {
    if (s.row == row) return s;
  }
  ADD_FAILURE() << "no summary for " << row;
  static Summary none;
  return none;
}

std::vector<std::string> ColumnKeys(const Report& r) {
  std::vector<std::string> keys;
  for (const Column& c : r.columns) keys.push_back(c.key);
  return keys;
}

TEST(ReportTable, ValuesDeltasAndBestPerColumn) {
  Study s;
  Report r = BuildReport(s.Input(), {});
  EXPECT_EQ(r.baseline, "base") << "the stage eval-base is the baseline by default";
  EXPECT_EQ(r.perplexity_metric, "bpb");
  // Default metrics: bpb (not ppl, since bpb exists) and acc; held-in before general; no */all.
  EXPECT_EQ(ColumnKeys(r),
            (std::vector<std::string>{"bpb/ru", "bpb/uk", "bpb/en", "acc/belebele_ru"}));
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_EQ(r.rows[0].title, "base");
  EXPECT_TRUE(r.rows[0].baseline);

  const Row& dense = RowNamed(r, "dense");
  const Row& freeze = RowNamed(r, "freeze");
  EXPECT_DOUBLE_EQ(*dense.values.at("bpb/ru").value, s.dense_ru);
  EXPECT_DOUBLE_EQ(*dense.values.at("bpb/ru").delta, s.dense_ru - s.base_ru);
  EXPECT_DOUBLE_EQ(*freeze.values.at("bpb/en").delta, s.freeze_en - s.base_en);
  // Lower is better for bpb, higher for accuracy.
  EXPECT_TRUE(dense.values.at("bpb/ru").best);
  EXPECT_FALSE(freeze.values.at("bpb/ru").best);
  EXPECT_TRUE(r.rows[0].values.at("bpb/en").best) << "the base forgot nothing";
  EXPECT_FALSE(dense.values.at("bpb/en").best);
  EXPECT_TRUE(dense.values.at("acc/belebele_ru").best);
  EXPECT_FALSE(r.rows[0].values.at("acc/belebele_ru").best);
}

TEST(ReportTable, TrialsStoppedEarlyAreNotedWithTheirValues) {
  Study s;
  ReportInput in = s.Input();
  Cell trial;
  trial.job_name = "cpt[uk=5,en=5]";
  trial.stage = "cpt";
  trial.kind = "train";
  trial.job_id = "j-9";
  trial.state = "SUCCEEDED";
  trial.reason =
      "stopped early at rung 1 (step 3): heldout_loss/uk=5, heldout_loss/en=5 on Pareto front 2 "
      "of 2, not in the best 0.5 of 3 (rank 3)";
  in.cells.push_back(trial);
  Report r = BuildReport(in, {});
  EXPECT_EQ(r.rows.size(), 3u) << "a trial is no row";
  EXPECT_THAT(r.notes, ::testing::Contains("cpt[uk=5,en=5]: " + trial.reason));
}

TEST(ReportTable, TiesAreAllMarkedBest) {
  Study s;
  s.freeze_ru = s.dense_ru;
  Report r = BuildReport(s.Input(), {});
  EXPECT_TRUE(RowNamed(r, "dense").values.at("bpb/ru").best);
  EXPECT_TRUE(RowNamed(r, "freeze").values.at("bpb/ru").best);
}

TEST(ReportSummary, AcquisitionForgettingAndParetoFront) {
  Study s;
  ReportInput in = s.Input();
  // A fourth row that is worse than freeze on both axes: off the front.
  in.cells.push_back(Eval("eval-bad", "j-4"));
  Add(&in, "j-4", "bpb/ru", 2.8, "ru");
  Add(&in, "j-4", "bpb/uk", 3.1, "uk");
  Add(&in, "j-4", "bpb/en", 2.3, "en");
  Report r = BuildReport(in, {});
  const Summary& dense = SummaryOf(r, "dense");
  EXPECT_DOUBLE_EQ(*dense.acquisition, ((s.base_ru - s.dense_ru) + (s.base_uk - s.dense_uk)) / 2);
  EXPECT_DOUBLE_EQ(*dense.forgetting, s.dense_en - s.base_en);
  EXPECT_FALSE(dense.transfer.has_value()) << "no held-out language";
  const Summary& base = SummaryOf(r, "base");
  EXPECT_DOUBLE_EQ(*base.acquisition, 0);
  EXPECT_DOUBLE_EQ(*base.forgetting, 0);
  // dense: most acquisition; freeze: less forgetting; base: none; bad: dominated by freeze.
  EXPECT_TRUE(dense.pareto);
  EXPECT_TRUE(SummaryOf(r, "freeze").pareto);
  EXPECT_TRUE(base.pareto);
  EXPECT_FALSE(SummaryOf(r, "bad").pareto);

  const Plot& p = PlotNamed(r, "acquisition_forgetting.svg");
  EXPECT_EQ(p.omitted, "");
  ASSERT_EQ(p.svg.series.size(), 2u);
  EXPECT_EQ(p.svg.series[0].x.size(), 4u) << "one point per row";
  // The front, by forgetting: base (0), freeze, dense.
  EXPECT_EQ(p.svg.series[1].x,
            (std::vector<double>{0, s.freeze_en - s.base_en, s.dense_en - s.base_en}));
}

TEST(ReportSummary, CorpusRolesGiveTransferAndOrderColumns) {
  Study s;
  ReportInput in = s.Input();
  for (const std::string job : {"j-1", "j-2", "j-3"})
    Add(&in, job, "bpb/be", job == "j-1" ? 3.5 : 3.0, "be");
  std::string error;
  in.corpus_languages = CorpusLanguages(json::parse(R"({"format": "stemma.corpus/1", "languages": [
      {"code": "en", "family": "germanic", "role": "base", "name": "English"},
      {"code": "uk", "family": "slavic", "role": "held_in", "name": "Ukrainian"},
      {"code": "ru", "family": "slavic", "role": "held_in", "name": "Russian"},
      {"code": "be", "family": "slavic", "role": "held_out", "name": "Belarusian"}]})"),
                                        &error);
  ASSERT_EQ(error, "");
  Report r = BuildReport(in, {});
  EXPECT_TRUE(r.roles_from_corpus);
  // Held-in in manifest order (uk, ru), then held-out, then general.
  EXPECT_EQ(ColumnKeys(r),
            (std::vector<std::string>{"bpb/uk", "bpb/ru", "bpb/be", "bpb/en", "acc/belebele_ru"}));
  EXPECT_DOUBLE_EQ(*SummaryOf(r, "dense").transfer, 0.5);
  EXPECT_THAT(r.notes, Not(::testing::Contains(HasSubstr("no corpus manifest"))));
}

// A study teaching fewer languages than its corpus marks held-in says so with a label; a
// perplexity task named other than its language (an instruction set on en) is a column group
// of its own, kept out of acquisition and forgetting.
TEST(ReportSummary, HeldInLabelAndNamedTasksStayOutOfTheLanguageMeans) {
  Study s;
  ReportInput in = s.Input();
  for (const std::string job : {"j-1", "j-2", "j-3"}) {
    Add(&in, job, "bpb/fr", job == "j-1" ? 4.0 : 3.0, "fr");
    Add(&in, job, "bpb/instruct_en-fr", job == "j-1" ? 3.9 : 2.9, "en");
  }
  std::string error;
  in.corpus_languages = CorpusLanguages(json::parse(R"({"format": "stemma.corpus/1", "languages": [
      {"code": "en", "family": "germanic", "role": "base"},
      {"code": "ru", "family": "slavic", "role": "held_in"},
      {"code": "uk", "family": "slavic", "role": "held_in"},
      {"code": "fr", "family": "romance", "role": "held_in"}]})"),
                                        &error);
  ASSERT_EQ(error, "");
  Report without = BuildReport(in, {});
  EXPECT_DOUBLE_EQ(*SummaryOf(without, "dense").acquisition,
                   ((s.base_ru - s.dense_ru) + (s.base_uk - s.dense_uk) + 1.0) / 3);
  Cell corpus;
  corpus.job_name = "corpus";
  corpus.kind = "prepare";
  corpus.labels["report.held_in"] = "ru, uk";
  in.cells.insert(in.cells.begin(), corpus);
  Report r = BuildReport(in, {});
  const Summary& dense = SummaryOf(r, "dense");
  EXPECT_DOUBLE_EQ(*dense.acquisition, ((s.base_ru - s.dense_ru) + (s.base_uk - s.dense_uk)) / 2)
      << "fr is not taught";
  EXPECT_DOUBLE_EQ(*dense.forgetting, s.dense_en - s.base_en)
      << "en only, not the instruction task";
  std::string fr_role, task_role;
  for (const Column& c : r.columns) {
    if (c.key == "bpb/fr") fr_role = c.role;
    if (c.key == "bpb/instruct_en-fr") task_role = c.role;
  }
  EXPECT_EQ(fr_role, "other");
  EXPECT_EQ(task_role, "task");
  EXPECT_EQ(ColumnKeys(r).at(4), "bpb/instruct_en-fr") << "after the languages' columns";
  EXPECT_THAT(r.notes, ::testing::Contains(HasSubstr("report.held_in label of corpus: ru, uk")));
}

TEST(ReportSummary, CorpusManifestErrorsNameTheField) {
  std::string error;
  EXPECT_TRUE(CorpusLanguages(json::parse(R"({"format": "other"})"), &error).empty());
  EXPECT_THAT(error, HasSubstr("format"));
  CorpusLanguages(
      json::parse(
          R"({"format": "stemma.corpus/1", "languages": [{"code": "ru", "role": "train"}]})"),
      &error);
  EXPECT_THAT(error, HasSubstr("languages[0].role"));
  CorpusLanguages(json::parse(R"({"format": "stemma.corpus/1", "languages": [{"role": "base"}]})"),
                  &error);
  EXPECT_THAT(error, HasSubstr("languages[0].code"));
}

TEST(ReportColumns, FamiliesAverageTheirLanguages) {
  Study s;
  ReportInput in = s.Input();
  in.cells.push_back(Cell{"tok[language=ru,family=slavic]",
                          "tok",
                          "tokenize",
                          {{"language", "ru"}, {"family", "slavic"}}});
  in.cells.push_back(Cell{"tok[language=uk,family=slavic]",
                          "tok",
                          "tokenize",
                          {{"language", "uk"}, {"family", "slavic"}}});
  ReportOptions o;
  o.by_family = true;
  o.metrics = {"bpb"};
  Report r = BuildReport(in, o);
  EXPECT_EQ(ColumnKeys(r), (std::vector<std::string>{"bpb/slavic/held_in", "bpb/en"}));
  EXPECT_DOUBLE_EQ(*RowNamed(r, "dense").values.at("bpb/slavic/held_in").value,
                   (s.dense_ru + s.dense_uk) / 2);
  EXPECT_EQ(r.columns[0].title, "slavic held-in");
}

TEST(ReportColumns, MetricSelectors) {
  Study s;
  auto keys = [&](std::vector<std::string> sel) {
    ReportOptions o;
    o.metrics = std::move(sel);
    return ColumnKeys(BuildReport(s.Input(), o));
  };
  EXPECT_EQ(keys({"ppl"}), (std::vector<std::string>{"ppl/ru"}));
  EXPECT_EQ(keys({"bpb/en"}), (std::vector<std::string>{"bpb/en"}));
  EXPECT_EQ(keys({"acc*"}), (std::vector<std::string>{"acc/belebele_ru"}));
  EXPECT_EQ(keys({"all"}).size(), 5u) << "bpb x3, ppl, acc; never */all";
  EXPECT_TRUE(keys({"chrf"}).empty());
}

TEST(ReportRows, PendingRunningAndFailedCells) {
  Study s;
  ReportInput in = s.Input();
  in.cells.push_back(Eval("eval-soup", "j-5", "RUNNING"));
  Add(&in, "j-5", "bpb/ru", 1.0, "ru");  // one task done so far, and the best ru value
  in.cells.push_back(Eval("eval-revert", "", "PENDING"));
  Cell failed = Eval("eval-broken", "j-6", "FAILED");
  failed.reason = "exit 4: bad data";
  in.cells.push_back(failed);
  Report r = BuildReport(in, {});
  ASSERT_EQ(r.rows.size(), 6u);
  const Row& soup = RowNamed(r, "soup");
  EXPECT_EQ(soup.state, "RUNNING");
  EXPECT_TRUE(soup.values.at("bpb/ru").best) << "values reported so far count";
  EXPECT_FALSE(soup.values.at("bpb/en").value.has_value());
  EXPECT_FALSE(SummaryOf(r, "soup").forgetting.has_value());
  EXPECT_FALSE(RowNamed(r, "revert").values.at("bpb/ru").value.has_value());
  const std::string md = RenderMarkdown(r, false);
  EXPECT_THAT(md, HasSubstr("| state |"));
  EXPECT_THAT(md, HasSubstr("PENDING"));
  EXPECT_THAT(md, HasSubstr("FAILED: exit 4: bad data"));
  EXPECT_THAT(md, HasSubstr("1 RUNNING"));
  // The revert row: the title, then "-" in every metric column, then its state.
  EXPECT_THAT(md, HasSubstr("| revert | - | - | - | - | PENDING |"));
}

TEST(ReportRows, LabelsTitleGroupBaselineAndSweep) {
  ReportInput in;
  in.experiment = "fe";
  in.revision = 1;
  Cell base = Eval("eval-base", "j-1");
  Cell ref = Eval("eval-ref", "j-2");
  ref.labels = {{"report.baseline", "true"}, {"report.row", "reference"}};
  Cell expert = Eval("eval-expert[family=slavic]", "j-3");
  expert.coords = {{"family", "slavic"}};
  expert.labels = {{"report.row", "expert (slavic)"}, {"report.group", "experts"}};
  in.cells = {base, ref, expert};
  int id = 10;
  for (const std::string range : {"middle", "outer"}) {
    for (const std::string alpha : {"1.0", "0.0", "0.5"}) {  // out of order on purpose
      Cell c =
          Eval("eval-interp[range=" + range + ",alpha=" + alpha + "]", "j-" + std::to_string(id));
      c.coords = {{"range", range}, {"alpha", alpha}};
      Add(&in, c.job_id, "bpb/ru", 3 - std::stod(alpha) * (range == "middle" ? 1 : 0.5), "ru");
      Add(&in, c.job_id, "bpb/en", 2 + std::stod(alpha) * (range == "middle" ? 0.2 : 0.6), "en");
      in.cells.push_back(c);
      ++id;
    }
  }
  for (const std::string job : {"j-1", "j-2", "j-3"}) {
    Add(&in, job, "bpb/ru", 3.0, "ru");
    Add(&in, job, "bpb/en", 2.0, "en");
  }
  Report r = BuildReport(in, {});
  EXPECT_EQ(r.baseline, "reference") << "report.baseline wins over the stage name";
  EXPECT_FALSE(RowNamed(r, "base").baseline);
  EXPECT_EQ(RowNamed(r, "expert (slavic)").group, "experts");
  EXPECT_EQ(r.rows[0].title, "reference");
  int table = 0, sweep = 0;
  for (const Row& row : r.rows) (row.in_table ? table : sweep)++;
  EXPECT_EQ(table, 3);
  EXPECT_EQ(sweep, 6) << "sweep points stay out of the table";
  for (const Row& row : r.rows) {
    if (!row.in_table) EXPECT_FALSE(row.values.at("bpb/ru").best) << row.title;
  }
  EXPECT_EQ(r.summary.size(), 3u) << "sweep points are not strategies";

  const Plot& held_in = PlotNamed(r, "alpha_held_in.svg");
  ASSERT_EQ(held_in.omitted, "");
  ASSERT_EQ(held_in.svg.series.size(), 2u);
  EXPECT_EQ(held_in.svg.series[0].name, "middle");
  EXPECT_EQ(held_in.svg.series[0].x, (std::vector<double>{0.0, 0.5, 1.0})) << "sorted by α";
  EXPECT_EQ(held_in.svg.series[0].y, (std::vector<double>{3.0, 2.5, 2.0}));
  const Plot& general = PlotNamed(r, "alpha_general.svg");
  ASSERT_EQ(general.svg.series.size(), 2u);
  EXPECT_DOUBLE_EQ(general.svg.series[1].y.back(), 2.6);

  // report.table: "true" keeps a sweep point in the table.
  in.cells[3].labels["report.table"] = "true";
  Report r2 = BuildReport(in, {});
  int table2 = 0;
  for (const Row& row : r2.rows) table2 += row.in_table ? 1 : 0;
  EXPECT_EQ(table2, 4);
}

TEST(ReportRows, MissingDataIsSaidNotGuessed) {
  ReportInput in;
  in.experiment = "bare";
  in.cells = {Eval("eval-a", "j-1"), Eval("eval-b", "j-2")};
  Add(&in, "j-1", "bpb/ru", 3.0, "ru");
  Report r = BuildReport(in, {});
  EXPECT_EQ(r.baseline, "");
  EXPECT_FALSE(RowNamed(r, "a").values.at("bpb/ru").delta.has_value());
  EXPECT_TRUE(r.summary.empty());
  EXPECT_THAT(r.notes, ::testing::Contains(HasSubstr("no baseline row")));
  EXPECT_THAT(r.notes, ::testing::Contains(HasSubstr("eval-b succeeded but no metric point")));
  EXPECT_EQ(PlotNamed(r, "acquisition_forgetting.svg").omitted, "no baseline row");
  // Only the plots the study has: no train, sweep or analyze cells, so no such plot is listed.
  ASSERT_EQ(r.plots.size(), 1u);
  const std::string md = RenderMarkdown(r, false);
  EXPECT_THAT(md, Not(HasSubstr("loss_curves.svg")));
  EXPECT_THAT(md, Not(HasSubstr("lape_neurons.svg")));

  // An experiment with no eval cell at all still renders.
  ReportInput empty;
  empty.experiment = "nothing";
  Report e = BuildReport(empty, {});
  EXPECT_THAT(RenderMarkdown(e, false), HasSubstr("No eval cells yet"));
  EXPECT_THAT(RenderHtml(e), HasSubstr("</html>"));
}

TEST(ReportRows, ResultsFileFillsMetricsAndNamesTheCheckpoint) {
  ReportInput in;
  in.cells = {Eval("eval-base", "j-1")};
  in.results["eval-base"] =
      json::parse(R"({"format": "stemma-eval-v1", "checkpoint": {"sha256": "abc123"},
    "tasks": [{"name": "ru", "type": "perplexity", "language": "ru", "metrics": {"bpb": 2.5, "ppl": 5.6}}]})");
  Report r = BuildReport(in, {});
  EXPECT_EQ(r.rows[0].checkpoint_sha256, "abc123");
  EXPECT_DOUBLE_EQ(*r.rows[0].values.at("bpb/ru").value, 2.5);
}

TEST(ReportPlots, TrainLossAndAnalysisFiles) {
  Study s;
  ReportInput in = s.Input();
  Cell train;
  train.job_name = "cpt-dense[family=slavic]";
  train.kind = "train";
  train.job_id = "j-8";
  train.metrics_job = "j-7";  // memoized: the points are the source job's
  train.state = "SUCCEEDED";
  in.cells.push_back(train);
  for (int step : {10, 0, 5}) {
    Point p;
    p.name = "loss";
    p.step = step;
    p.value = 5.0 - step * 0.1;
    in.points["j-7"].push_back(p);
  }
  Cell analyze;
  analyze.job_name = "analyze";
  analyze.kind = "analyze";
  in.cells.push_back(analyze);
  in.analyses.push_back(
      {"analyze", "mask", "/x/neuron_mask.json", json::parse(R"({"format": "stemma.neuron_mask/1",
      "params": {"method": "lape"}, "counts": {"ru": [1, 4, 9], "uk": [2, 3, 5]}})")});
  in.analyses.push_back(
      {"analyze", "routing", "/x/routing.json", json::parse(R"({"format": "stemma.routing/1",
      "layers": [{"layer": 0, "mean_jsd": 0.1, "entropy": {"ru": 1.2, "en": 1.3}},
                 {"layer": 1, "mean_jsd": 0.3, "entropy": {"ru": 0.8, "en": 1.1}}]})")});
  in.analyses.push_back(
      {"analyze", "drift", "/x/drift.json", json::parse(R"({"format": "stemma.drift/1",
      "layers": [{"layer": 0, "gate": 0.01, "up": 0.02, "down": 0.04, "asymmetry": 2.6667},
                 {"layer": 1, "gate": 0.02, "up": 0.02, "down": 0.01, "asymmetry": null}]})")});
  Report r = BuildReport(in, {});
  const Plot& loss = PlotNamed(r, "loss_curves.svg");
  ASSERT_EQ(loss.omitted, "");
  ASSERT_EQ(loss.svg.series.size(), 1u);
  EXPECT_EQ(loss.svg.series[0].x, (std::vector<double>{0, 5, 10})) << "by step";
  const Plot& lape = PlotNamed(r, "lape_neurons.svg");
  ASSERT_EQ(lape.omitted, "");
  ASSERT_EQ(lape.svg.series.size(), 2u);
  EXPECT_EQ(lape.svg.series[0].y, (std::vector<double>{1, 4, 9}));
  EXPECT_EQ(PlotNamed(r, "routing_jsd.svg").svg.series[0].y, (std::vector<double>{0.1, 0.3}));
  EXPECT_EQ(PlotNamed(r, "routing_entropy.svg").svg.series.size(), 2u);
  const Plot& drift = PlotNamed(r, "drift.svg");
  ASSERT_EQ(drift.svg.series.size(), 3u);
  EXPECT_EQ(drift.svg.series[0].name, "down");
  const Plot& asym = PlotNamed(r, "drift_asymmetry.svg");
  ASSERT_EQ(asym.svg.series.size(), 1u);
  EXPECT_TRUE(std::isnan(asym.svg.series[0].y[1])) << "a null asymmetry is a gap, not a zero";
  EXPECT_NE(PlotNamed(r, "alignment.svg").omitted.find("no alignment.json was read"),
            std::string::npos);
}

// Alignment before and after fine-tuning: one plot, a line per alignment cell.
TEST(ReportPlots, AlignmentIsOneLinePerCheckpoint) {
  Study s;
  ReportInput in = s.Input();
  for (const char* name : {"align-base", "align-full"}) {
    Cell c;
    c.job_name = name;
    c.kind = "analyze";
    in.cells.push_back(c);
  }
  in.analyses.push_back({"align-base", "alignment", "/x/a/alignment.json",
                         json::parse(R"({"format": "stemma.alignment/1",
      "languages": ["en", "uk"], "layers": 3, "mean_cosine": [0.6, 0.1, -0.2]})")});
  in.analyses.push_back({"align-full", "alignment", "/x/b/alignment.json",
                         json::parse(R"({"format": "stemma.alignment/1",
      "languages": ["en", "uk"], "layers": 3, "mean_cosine": [0.7, 0.3, 0.05]})")});
  Report r = BuildReport(in, {});
  const Plot& a = PlotNamed(r, "alignment.svg");
  ASSERT_EQ(a.omitted, "");
  ASSERT_EQ(a.svg.series.size(), 2u);
  EXPECT_EQ(a.svg.series[0].name, "align-base");
  EXPECT_EQ(a.svg.series[1].y, (std::vector<double>{0.7, 0.3, 0.05}));
  EXPECT_EQ(a.svg.series[1].x, (std::vector<double>{0, 1, 2}));
  EXPECT_NE(a.caption.find("en–uk"), std::string::npos) << a.caption;
}

// --- SVG --------------------------------------------------------------------------------

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(Svg, TicksAreRoundAndCoverTheRange) {
  for (const auto& [lo, hi] : std::vector<std::pair<double, double>>{
           {0, 1}, {2.31, 3.07}, {-5, 120}, {0.0001, 0.0009}, {7, 7}}) {
    std::vector<double> t = NiceTicks(lo, hi, 5);
    ASSERT_GE(t.size(), 2u) << lo << " " << hi;
    EXPECT_LE(t.front(), lo);
    EXPECT_GE(t.back(), hi);
    EXPECT_LE(t.size(), 12u);
    const double step = t[1] - t[0];
    for (size_t i = 1; i < t.size(); ++i) EXPECT_NEAR(t[i] - t[i - 1], step, step * 1e-6);
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step)));
    EXPECT_TRUE(std::fabs(mantissa - 1) < 1e-6 || std::fabs(mantissa - 2) < 1e-6 ||
                std::fabs(mantissa - 5) < 1e-6)
        << step;
  }
  EXPECT_EQ(TickText(0.25, 0.25), "0.25");
  EXPECT_EQ(TickText(2.5, 0.5), "2.5");
  EXPECT_EQ(TickText(1000, 200), "1000");
}

TEST(Svg, DrawsSeriesLegendAndEscapesText) {
  SvgPlot p;
  p.title = "loss <by> step & more";
  p.x_label = "step";
  p.y_label = "loss";
  SvgSeries a;
  a.name = "cpt[family=\"slavic\"]";
  a.x = {0, 1, 2, NAN, 4};
  a.y = {5, 4, 3, 2, 1};
  SvgSeries b;
  b.name = "points only";
  b.line = false;
  b.x = {0, 1};
  b.y = {1, 2};
  b.labels = {"base", "dense"};
  p.series = {a, b};
  const std::string inline_svg = RenderSvg(p, false);
  const std::string file_svg = RenderSvg(p, true);
  EXPECT_THAT(file_svg, HasSubstr("xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(inline_svg, Not(HasSubstr("http")));
  EXPECT_EQ(Count(inline_svg, "<path "), 1) << "one line series";
  // 4 finite points + 2 points + one marker per legend entry.
  EXPECT_EQ(Count(inline_svg, "<circle "), 4 + 2 + 2);
  EXPECT_THAT(inline_svg, HasSubstr(" M")) << "the missing point splits the line";
  EXPECT_THAT(inline_svg, HasSubstr("loss &lt;by&gt; step &amp; more"));
  EXPECT_THAT(inline_svg, HasSubstr("cpt[family=&quot;slavic&quot;]"));
  EXPECT_THAT(inline_svg, HasSubstr(">dense</text>"));
  EXPECT_EQ(Count(inline_svg, "<g"), Count(inline_svg, "</g>"));
  EXPECT_EQ(Count(inline_svg, "<svg"), 1);
  EXPECT_THAT(inline_svg, Not(HasSubstr("nan")));

  SvgPlot empty;
  empty.title = "nothing";
  EXPECT_THAT(RenderSvg(empty, true), HasSubstr("no data"));
}

// --- Writers ----------------------------------------------------------------------------

TEST(Writers, HtmlIsSelfContainedAndEscaped) {
  Study s;
  ReportInput in = s.Input();
  in.cells[1].labels["report.row"] = "<script>alert(1)</script>";
  in.notes.push_back("results of eval-x: http://example.org//a not readable; url(x) src=y");
  Report r = BuildReport(in, {});
  const std::string html = RenderHtml(r);
  EXPECT_THAT(
      html, HasSubstr("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'"));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, HasSubstr("&lt;script&gt;"));
  // Outside the CSP meta: nothing that a browser could fetch.
  std::string body = html.substr(html.find("<title>"));
  for (const char* bad :
       {"http:", "https:", "//", "src=", "url(", "href=", "<img", "<link", "@import"}) {
    EXPECT_THAT(body, Not(HasSubstr(bad))) << bad;
  }
  // Every drawn plot is inline.
  int drawn = 0;
  for (const Plot& p : r.plots) {
    if (!p.omitted.empty()) continue;
    ++drawn;
    const std::string id = "id=\"plot-" + p.file.substr(0, p.file.size() - 4) + "\"";
    EXPECT_THAT(html, HasSubstr(id));
  }
  EXPECT_EQ(Count(html, "<svg"), drawn);
  EXPECT_GE(drawn, 1);
  EXPECT_THAT(html, HasSubstr("class=\"num best\""));
}

TEST(Writers, CsvHasOneLinePerRowAndColumn) {
  Study s;
  ReportInput in = s.Input();
  in.cells[2].labels["report.row"] = "freeze, middle";
  Report r = BuildReport(in, {});
  const std::string csv = RenderCsv(r);
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "row,column,metric,value,delta");
  EXPECT_EQ(Count(csv, "\n"), 1 + static_cast<int>(r.rows.size() * r.columns.size()));
  EXPECT_THAT(csv, HasSubstr("\"freeze, middle\",ru,bpb,2.5,-0.5\n"));
  EXPECT_THAT(csv, HasSubstr("base,ru,bpb,3,\n")) << "the baseline has no delta";
}

TEST(Writers, JsonCarriesRowsSummaryAndPlotSeries) {
  Study s;
  Report r = BuildReport(s.Input(), {});
  json j = ReportToJson(r);
  EXPECT_EQ(j["experiment"], "study");
  EXPECT_EQ(j["revision"], 2);
  EXPECT_EQ(j["baseline"], "base");
  ASSERT_EQ(j["rows"].size(), 3u);
  EXPECT_EQ(j["rows"][1]["cells"]["bpb/ru"]["value"], s.dense_ru);
  EXPECT_EQ(j["rows"][1]["cells"]["bpb/ru"]["best"], true);
  EXPECT_EQ(j["summary"].size(), 3u);
  bool found = false;
  for (const auto& p : j["plots"]) {
    if (p["file"] == "acquisition_forgetting.svg") {
      found = true;
      EXPECT_EQ(p["drawn"], true);
      EXPECT_EQ(p["series"][0]["points"].size(), 3u);
    }
  }
  EXPECT_TRUE(found);
}

TEST(Writers, MarkdownShowsDeltasBestAndSummary) {
  Study s;
  Report r = BuildReport(s.Input(), {});
  const std::string md = RenderMarkdown(r, true);
  EXPECT_THAT(md, HasSubstr("| row | ru bpb ↓ | uk bpb ↓ | en bpb ↓ | belebele_ru acc ↑ |"));
  EXPECT_THAT(md, HasSubstr("| base (baseline) | 3.000 | 3.200 | **2.000** | 0.250 |"));
  EXPECT_THAT(md, HasSubstr("| dense | **2.000** (-1.000) | **2.400** (-0.800) | 2.600 (+0.600) | "
                            "**0.400** (+0.150) |"));
  EXPECT_THAT(md, HasSubstr("## Acquisition vs forgetting (bpb)"));
  EXPECT_THAT(md, HasSubstr("[acquisition_forgetting.svg](acquisition_forgetting.svg)"));
  EXPECT_THAT(md, HasSubstr("no corpus manifest"));
}

// --- Targets: acquisition per family ---------------------------------------------------

// Two families with a held-out relative each and English as the base language. The Romance
// expert learns French and Spanish and unlearns Cyrillic (as in the demo).
struct FamilyStudy {
  // bpb per language: ru, uk, bg, fr, es, it, en.
  std::map<std::string, std::vector<double>> v = {
      {"j-1", {3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 2.0}},   // base
      {"j-2", {2.0, 2.2, 2.6, 2.1, 2.3, 2.7, 2.55}},  // dense (no target)
      {"j-3", {1.5, 1.7, 2.2, 3.4, 3.6, 3.5, 2.6}},   // expert[family=slavic]
      {"j-4", {4.0, 4.2, 3.9, 1.6, 1.8, 2.3, 2.5}},   // expert[family=romance]
      {"j-5", {2.5, 2.6, 2.8, 2.4, 2.5, 2.9, 2.2}},   // soup of both experts
      {"j-6", {3.2, 3.3, 3.1, 2.0, 2.2, 2.6, 2.1}},   // reverted romance expert
  };
  static constexpr const char* kLangs[] = {"ru", "uk", "bg", "fr", "es", "it", "en"};

  ReportInput Input() const {
    ReportInput in;
    in.experiment = "families";
    in.revision = 1;
    for (const char* family : {"slavic", "romance"}) {
      Cell cpt;
      cpt.job_name = absl::StrCat("cpt-expert[family=", family, "]");
      cpt.stage = "cpt-expert";
      cpt.kind = "train";
      cpt.coords = {{"family", family}};
      cpt.labels = {{"report.target", family}};
      cpt.state = "SUCCEEDED";
      in.cells.push_back(cpt);
    }
    Cell soup{"soup", "soup", "merge"};
    soup.needs = {"cpt-expert[family=slavic]", "cpt-expert[family=romance]"};
    Cell rev{"rev", "rev", "revert"};
    rev.needs = {"cpt-expert[family=romance]"};
    in.cells.push_back(soup);
    in.cells.push_back(rev);
    in.cells.push_back(Eval("eval-base", "j-1"));
    in.cells.push_back(Eval("eval-dense", "j-2"));
    in.cells.push_back(Eval("eval-expert[family=slavic]", "j-3"));
    in.cells.back().coords = {{"family", "slavic"}};
    in.cells.push_back(Eval("eval-expert[family=romance]", "j-4"));
    in.cells.back().coords = {{"family", "romance"}};
    in.cells.push_back(Eval("eval-soup", "j-5"));
    in.cells.back().needs = {"soup"};
    in.cells.push_back(Eval("eval-rev", "j-6"));
    in.cells.back().needs = {"rev"};
    for (const auto& [job, values] : v) {
      for (size_t i = 0; i < values.size(); ++i)
        Add(&in, job, absl::StrCat("bpb/", kLangs[i]), values[i], kLangs[i]);
    }
    std::string error;
    in.corpus_languages =
        CorpusLanguages(json::parse(R"({"format": "stemma.corpus/1", "languages": [
        {"code": "en", "family": "germanic", "role": "base"},
        {"code": "ru", "family": "slavic", "role": "held_in"},
        {"code": "uk", "family": "slavic", "role": "held_in"},
        {"code": "bg", "family": "slavic", "role": "held_out"},
        {"code": "fr", "family": "romance", "role": "held_in"},
        {"code": "es", "family": "romance", "role": "held_in"},
        {"code": "it", "family": "romance", "role": "held_out"}]})"),
                        &error);
    EXPECT_EQ(error, "");
    return in;
  }
};

TEST(ReportTargets, TheRomanceExpertsAcquisitionIsMeasuredOnRomanceLanguagesOnly) {
  const FamilyStudy f;
  const Report r = BuildReport(f.Input(), {});
  const Summary& romance = SummaryOf(r, "expert[family=romance]");
  EXPECT_EQ(romance.target, "romance");
  EXPECT_EQ(romance.held_in, (std::vector<std::string>{"fr", "es"}));
  EXPECT_EQ(romance.held_out, (std::vector<std::string>{"it"}));
  // fr 3.0 → 1.6, es 3.0 → 1.8: its Cyrillic (ru 4.0, uk 4.2) is not in it.
  EXPECT_DOUBLE_EQ(*romance.acquisition, ((3.0 - 1.6) + (3.0 - 1.8)) / 2);
  EXPECT_DOUBLE_EQ(*romance.transfer, 3.0 - 2.3);
  EXPECT_DOUBLE_EQ(*romance.forgetting, 2.5 - 2.0);
  // Its effect on the other family is in that family's column group.
  ASSERT_TRUE(r.family_groups);
  EXPECT_EQ(r.families, (std::vector<std::string>{"germanic", "slavic", "romance"}));
  EXPECT_DOUBLE_EQ(*romance.families.at("slavic").acquisition, ((3.0 - 4.0) + (3.0 - 4.2)) / 2);
  EXPECT_DOUBLE_EQ(*romance.families.at("slavic").transfer, 3.0 - 3.9);
  EXPECT_DOUBLE_EQ(*romance.families.at("romance").acquisition, *romance.acquisition);

  const Summary& slavic = SummaryOf(r, "expert[family=slavic]");
  EXPECT_EQ(slavic.target, "slavic");
  EXPECT_DOUBLE_EQ(*slavic.acquisition, ((3.0 - 1.5) + (3.0 - 1.7)) / 2);
  // The soup reads both labelled experts: its target is both families (every held-in
  // language); the reverted expert inherits its expert's target through `needs`.
  const Summary& soup = SummaryOf(r, "soup");
  EXPECT_EQ(soup.target, "slavic+romance");
  EXPECT_DOUBLE_EQ(*soup.acquisition, (0.5 + 0.4 + 0.6 + 0.5) / 4);
  const Row& rev = RowNamed(r, "rev");
  EXPECT_EQ(rev.target, (std::vector<std::string>{"romance"}));
  EXPECT_EQ(rev.target_from, "report.target of cpt-expert[family=romance]");
  EXPECT_DOUBLE_EQ(*SummaryOf(r, "rev").acquisition, (1.0 + 0.8) / 2);
  // dense has no target: every held-in language, and a note says so.
  const Summary& dense = SummaryOf(r, "dense");
  EXPECT_EQ(dense.target, "");
  EXPECT_DOUBLE_EQ(*dense.acquisition, (1.0 + 0.8 + 0.9 + 0.7) / 4);
  EXPECT_THAT(r.notes, ::testing::Contains(HasSubstr("no target")));
  EXPECT_THAT(r.notes, ::testing::Contains(HasSubstr(": dense;")));
  // The front uses the per-target values: the Romance expert (1.3, 0.5) dominates dense
  // (0.85, 0.55); measured on every language it would have had 0.1 and been off the front.
  EXPECT_TRUE(romance.pareto);
  EXPECT_TRUE(slavic.pareto);
  EXPECT_FALSE(dense.pareto);
  const Plot& p = PlotNamed(r, "acquisition_forgetting.svg");
  ASSERT_EQ(p.omitted, "");
  const auto& labels = p.svg.series[0].labels;
  const size_t i =
      std::find(labels.begin(), labels.end(), "expert[family=romance]") - labels.begin();
  ASSERT_LT(i, labels.size());
  EXPECT_DOUBLE_EQ(p.svg.series[0].y[i], *romance.acquisition);

  // The writers show the target and a column group per family.
  const std::string md = RenderMarkdown(r, false);
  EXPECT_THAT(md, HasSubstr("| row | target | acquisition ↑ | transfer ↑ | forgetting ↓ | Pareto "
                            "front | slavic acq. ↑ | slavic transfer ↑ | romance acq. ↑ | romance "
                            "transfer ↑ |"));
  EXPECT_THAT(md, HasSubstr("| expert[family=romance] | romance | +1.300 | +0.700 | +0.500 | yes |"
                            " -1.100 | -0.900 | +1.300 | +0.700 |"));
  EXPECT_THAT(md, HasSubstr("| dense | all |"));
  const std::string html = RenderHtml(r);
  EXPECT_THAT(html, HasSubstr("<th colspan=\"2\" class=\"family\">romance</th>"));
  const json j = ReportToJson(r);
  bool found = false;
  for (const auto& row : j["summary"]) {
    if (row["row"] != "expert[family=romance]") continue;
    found = true;
    EXPECT_EQ(row["target"], "romance");
    EXPECT_EQ(row["held_in"], json::array({"fr", "es"}));
    EXPECT_DOUBLE_EQ(row["families"]["slavic"]["acquisition"].get<double>(), -1.1);
  }
  EXPECT_TRUE(found);
}

TEST(ReportTargets, LabelTargetsLanguagesAndUnknownTargetsAreSaid) {
  const FamilyStudy f;
  ReportInput in = f.Input();
  for (Cell& c : in.cells) {
    if (c.job_name == "eval-dense") c.labels["report.target"] = "fr,es";
    if (c.job_name == "eval-soup") c.labels["report.target"] = "klingon";
  }
  const Report r = BuildReport(in, {});
  const Summary& dense = SummaryOf(r, "dense");
  EXPECT_EQ(dense.target, "fr+es");
  EXPECT_DOUBLE_EQ(*dense.acquisition, ((3.0 - 2.1) + (3.0 - 2.3)) / 2);
  EXPECT_FALSE(dense.transfer.has_value()) << "it is not in the target";
  EXPECT_THAT(r.notes,
              ::testing::Contains(HasSubstr("soup: target 'klingon' (label report.target) names no "
                                            "family or language of the study")));
  EXPECT_EQ(SummaryOf(r, "soup").target, "");
}

// Roles from labels alone: the header says so and no note contradicts them.
TEST(ReportRoles, LabelsGiveRolesWithoutACorpusManifest) {
  Study s;
  ReportInput in = s.Input();
  Cell marker;
  marker.job_name = "tok";
  marker.kind = "tokenize";
  marker.labels = {{"report.held_in", "ru"}, {"report.held_out", "uk"}};
  in.cells.push_back(marker);
  Report r = BuildReport(in, {});
  EXPECT_EQ(r.roles_source,
            "from the report.held_in and report.held_out labels; assumed: en general");
  const std::string md = RenderMarkdown(r, false);
  EXPECT_THAT(md, HasSubstr("Languages (from the report.held_in and report.held_out labels; "
                            "assumed: en general): held-in: ru; held-out: uk; general: en."));
  EXPECT_THAT(md, Not(HasSubstr("assumed: no corpus manifest")));
  EXPECT_THAT(r.notes, Not(::testing::Contains(HasSubstr("every language but en"))));
  EXPECT_DOUBLE_EQ(*SummaryOf(r, "dense").transfer, s.base_uk - s.dense_uk);
  EXPECT_DOUBLE_EQ(*SummaryOf(r, "dense").acquisition, s.base_ru - s.dense_ru);

  in.cells.back().labels["report.general"] = "en";
  r = BuildReport(in, {});
  EXPECT_EQ(r.roles_source, "from the report.held_in, report.held_out and report.general labels");
  EXPECT_THAT(r.notes, Not(::testing::Contains(HasSubstr("no corpus manifest"))));
  // Without labels: assumed, and said once.
  r = BuildReport(s.Input(), {});
  EXPECT_EQ(r.roles_source, "assumed: no corpus manifest");
  EXPECT_THAT(r.notes, ::testing::Contains(HasSubstr("every language but en held-in")));
}

TEST(ReportColumns, MetricOrderAndColumnsFlagAreHonoured) {
  Study s;
  ReportOptions o;
  o.metrics = {"acc", "bpb"};
  EXPECT_EQ(ColumnKeys(BuildReport(s.Input(), o)),
            (std::vector<std::string>{"acc/belebele_ru", "bpb/ru", "bpb/uk", "bpb/en"}));
  o.metrics = {};
  o.columns = {"en", "bpb/uk", "ru", "nothing"};
  Report r = BuildReport(s.Input(), o);
  EXPECT_EQ(ColumnKeys(r),
            (std::vector<std::string>{"bpb/en", "bpb/uk", "bpb/ru", "acc/belebele_ru"}));
  EXPECT_THAT(r.notes, ::testing::Contains(HasSubstr("--columns: 'nothing' selects no column")));
  o.columns = {"held-in"};
  EXPECT_EQ(ColumnKeys(BuildReport(s.Input(), o)),
            (std::vector<std::string>{"bpb/ru", "bpb/uk", "acc/belebele_ru"}));
}

// Columns are grouped per family (held-in, then held-out), then the general language.
TEST(ReportColumns, FamiliesAreColumnGroups) {
  const FamilyStudy f;
  const Report r = BuildReport(f.Input(), {});
  EXPECT_EQ(ColumnKeys(r), (std::vector<std::string>{"bpb/ru", "bpb/uk", "bpb/bg", "bpb/fr",
                                                     "bpb/es", "bpb/it", "bpb/en"}));
  EXPECT_THAT(RenderHtml(r), HasSubstr("<th colspan=\"3\" class=\"family\">slavic</th><th "
                                       "colspan=\"3\" class=\"family\">romance</th>"));
}

// The base's pretraining and the CPT runs on their own step axes, CPT named by its row.
TEST(ReportPlots, ContinuedPretrainingHasItsOwnPlotNamedByRow) {
  Study s;
  ReportInput in = s.Input();
  auto train = [&](const std::string& name, const std::string& id, std::vector<std::string> needs,
                   int steps) {
    Cell c;
    c.job_name = name;
    c.kind = "train";
    c.job_id = c.metrics_job = id;
    c.state = "SUCCEEDED";
    c.needs = std::move(needs);
    in.cells.push_back(c);
    for (int step = 0; step < steps; step += 10) {
      Point p;
      p.name = "loss";
      p.step = step;
      p.value = 5.0 - step * 0.001;
      in.points[id].push_back(p);
    }
  };
  train("base", "j-10", {"base-init"}, 300);
  train("cpt-dense", "j-11", {"base", "tok"}, 100);
  train("cpt-freeze", "j-12", {"base"}, 100);
  in.cells[1].needs = {"cpt-dense"};  // eval-dense reads cpt-dense
  in.cells[2].labels["report.row"] = "expert, middle frozen (romance)";
  in.cells[2].needs = {"cpt-freeze"};
  const Report r = BuildReport(in, {});
  const Plot& base = PlotNamed(r, "loss_curves.svg");
  ASSERT_EQ(base.svg.series.size(), 1u);
  EXPECT_EQ(base.svg.series[0].name, "base");
  const Plot& cpt = PlotNamed(r, "loss_cpt.svg");
  ASSERT_EQ(cpt.svg.series.size(), 2u);
  EXPECT_EQ(cpt.svg.series[0].name, "dense");
  EXPECT_EQ(cpt.svg.series[1].name, "expert, middle frozen (romance)");
  EXPECT_EQ(cpt.svg.series[0].x.back(), 90) << "its own steps, not the base's";
}

// The boxes of the SVG's <text> elements in the group `cls` (x, baseline y, text), with the
// width the renderer assumes.
struct TextBox {
  double x0, y0, x1, y1;
  std::string text;
};
std::vector<TextBox> Texts(const std::string& svg, const std::string& cls, double font) {
  std::vector<TextBox> out;
  const size_t g = svg.find("<g class=\"" + cls + "\">");
  if (g == std::string::npos) return out;
  const std::string body = svg.substr(g, svg.find("</g>", g) - g);
  std::regex re(
      "<text x=\"([-0-9.]+)\" y=\"([-0-9.]+)\"( text-anchor=\"(\\w+)\")?[^>]*>([^<]*)</text>");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), re); it != std::sregex_iterator();
       ++it) {
    const double x = std::stod((*it)[1]), y = std::stod((*it)[2]);
    const std::string anchor = (*it)[4], text = (*it)[5];
    int glyphs = 0;
    for (unsigned char c : text) glyphs += (c & 0xC0) != 0x80 ? 1 : 0;
    const double w = glyphs * font * 0.62;
    const double x0 = anchor == "end" ? x - w : anchor == "middle" ? x - w / 2 : x;
    out.push_back({x0, y - font + 1, x0 + w, y + 2, text});
  }
  return out;
}

TEST(Svg, PointLabelsDoNotOverlapAndLegendsStayInside) {
  SvgPlot p;
  p.title = "Acquisition vs forgetting";
  SvgSeries points;
  points.name = "rows";
  points.line = false;
  // Eleven rows close together, long names (the demo's).
  for (int i = 0; i < 11; ++i) {
    points.x.push_back(0.1 + 0.01 * (i % 4));
    points.y.push_back(1.0 + 0.02 * i);
    points.labels.push_back(absl::StrCat("expert, middle frozen (romance) ", i));
  }
  points.x.push_back(3.0);
  points.y.push_back(-2.0);
  points.labels.push_back("base");
  p.series = {points};
  const std::string svg = RenderSvg(p, true);
  const auto labels = Texts(svg, "labels", 11);
  ASSERT_EQ(labels.size(), 12u);
  for (size_t a = 0; a < labels.size(); ++a) {
    for (size_t b = a + 1; b < labels.size(); ++b) {
      const bool overlap = labels[a].x0 < labels[b].x1 && labels[b].x0 < labels[a].x1 &&
                           labels[a].y0 < labels[b].y1 && labels[b].y0 < labels[a].y1;
      EXPECT_FALSE(overlap) << labels[a].text << " / " << labels[b].text;
    }
  }
  EXPECT_GT(Count(svg, "class=\"leader\""), 0) << "moved labels point at their points";

  // A legend of long names: every entry inside the picture, none cut short.
  SvgPlot loss;
  loss.title = "Continued pretraining loss";
  for (const char* name : {"expert, middle frozen (romance)",
                           "expert, L2-SP (slavic)",
                           "dense CPT",
                           "expert (romance)",
                           "expert (slavic)",
                           "a",
                           "b",
                           "c",
                           "d",
                           "e",
                           "f",
                           "g",
                           "h",
                           "i",
                           "j",
                           "k",
                           "l",
                           "m",
                           "n",
                           "o",
                           "p",
                           "q"}) {
    SvgSeries s;
    s.name = name;
    s.x = {0, 10};
    s.y = {5, 4};
    loss.series.push_back(s);
  }
  const std::string l = RenderSvg(loss, true);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(l, m, std::regex("width=\"([0-9.]+)\" height=\"([0-9.]+)\"")));
  const double width = std::stod(m[1]), height = std::stod(m[2]);
  const auto entries = Texts(l, "legend", 12);
  ASSERT_EQ(entries.size(), loss.series.size()) << "every entry drawn";
  for (const auto& e : entries) {
    EXPECT_LE(e.x1, width) << e.text;
    EXPECT_LE(e.y1, height) << e.text;
  }
  EXPECT_EQ(entries[0].text, "expert, middle frozen (romance)");
}

TEST(Report, CoordsFromName) {
  EXPECT_EQ(CoordsFromName("eval-interp[range=middle,alpha=0.5]"),
            (std::map<std::string, std::string>{{"range", "middle"}, {"alpha", "0.5"}}));
  EXPECT_TRUE(CoordsFromName("eval-base").empty());
  EXPECT_EQ(CoordsFromName("tok[language=ru,family=slavic]").at("family"), "slavic");
}

TEST(Report, MemoizedFrom) {
  EXPECT_EQ(MemoizedFrom("memoized from j-7"), "j-7");
  EXPECT_EQ(MemoizedFrom("exit 1"), "");
}

}  // namespace
}  // namespace stemma::cli::report
