// The study report's model (docs/report.md): what the coordinator and the artifact files
// said about an experiment (ReportInput), turned into the paper-shaped table, the
// acquisition/forgetting summary and the plot series (Report). Pure: no RPCs, no file
// reads; cli/report_command.cc gathers the input. Thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/report/svg_plot.h"

namespace stemma::cli::report {

// One cell of the experiment's revision (GetExperiment) with its job's labels.
struct Cell {
  std::string job_name;  // eval-dense[family=slavic]
  std::string stage;
  std::string kind;                           // eval, train, analyze, ...
  std::map<std::string, std::string> coords;  // matrix axis → value
  std::map<std::string, std::string> labels;  // the job's labels (report.row, ...)
  std::string job_id;
  std::string state;  // PENDING, RUNNING, SUCCEEDED, FAILED, ... ("" before submission)
  std::string reason;
  // The job whose metric points are this cell's: its own, or for a memoized cell the job
  // that ran ("memoized from j-7").
  std::string metrics_job;
  std::vector<std::string> needs;  // the cells it waits for (job names or ids)
  // Analyze cells: the outputs its spec asks for (mask, routing, drift, alignment); empty:
  // not known (every analysis plot is then considered).
  std::vector<std::string> analyses;
};

// One metric point (QueryMetrics).
struct Point {
  std::string name;  // bpb/ru, loss
  int64_t step = 0;
  double value = 0;
  std::string language;  // the point's `language` label, if any
  std::string type;      // the point's `type` label (perplexity, choice, translation)
};

// A language of the study. role: "held_in" | "held_out" | "general".
struct Language {
  std::string code;
  std::string family;  // "" when unknown
  std::string role;
  std::string name;
};

// A parsed JSON file an analyze cell wrote (output mask, routing, drift, alignment, ...).
struct AnalysisFile {
  std::string cell;    // job name of the analyze cell
  std::string output;  // mask, routing, drift, ...
  std::string path;
  nlohmann::json content;
};

struct ReportInput {
  std::string experiment;
  int revision = 0;
  std::vector<Cell> cells;                           // in the experiment's order
  std::map<std::string, std::vector<Point>> points;  // job id → its points, as reported
  // From the corpus manifest; empty: inferred (every language but en held-in, families
  // from cells whose matrix has `language` and `family` axes).
  std::vector<Language> corpus_languages;
  std::string corpus_path;                        // where the manifest was read ("" none)
  std::map<std::string, nlohmann::json> results;  // eval cell job name → its results JSON
  std::vector<AnalysisFile> analyses;
  std::vector<std::string> notes;  // what the gatherer could not read, ...
};

struct ReportOptions {
  // Metric selectors (docs/report.md: a metric name, a full column name, a glob, "all").
  // Empty: bpb (ppl when there is no bpb), acc, chrf.
  // Their order is the columns' metric order.
  std::vector<std::string> metrics;
  // --columns a,b,c: only the columns these select, in this order. A selector is a column
  // key (bpb/ru), a task or language (ru, tchoice_ru), a family (slavic), a role (held-in,
  // held-out, general) or a glob over keys. Empty: every column, in the default order.
  std::vector<std::string> columns;
  bool by_family = false;  // --by-family: a family's languages of one role as one column
};

// A table column: one metric of one language (or the mean over a family's languages of
// one role).
struct Column {
  std::string key;       // "bpb/ru" or "bpb/slavic/held_in": unique
  std::string title;     // "ru" or "slavic held-in"
  std::string metric;    // bpb
  std::string language;  // ru ("" for a family column)
  std::string family;
  std::string role;  // held_in | held_out | general | other
  bool lower_is_better = true;
  std::vector<std::string> names;  // the metric names it averages (bpb/ru, ...)
};

struct Value {
  std::optional<double> value;
  std::optional<double> delta;  // value − the baseline's value
  bool best = false;
};

struct Row {
  std::string title;
  std::string job_name, job_id, stage, group, state, reason;
  bool baseline = false;
  bool in_table = true;
  std::optional<double> alpha;  // sweep point
  std::string range;
  std::string checkpoint_sha256;          // from the results JSON, when read
  std::map<std::string, Value> values;    // column key → value
  std::map<std::string, double> metrics;  // every metric name → its last value
  // What the row is meant to teach (docs/report.md "Targets"): families and/or language
  // codes; empty: every held-in language. target_from says where it came from.
  std::vector<std::string> target;
  std::string target_from;
};

// A row's gains on one family's languages.
struct FamilyGain {
  std::optional<double> acquisition;  // its held-in languages
  std::optional<double> transfer;     // its held-out languages
};

// Acquisition, transfer and forgetting of a row on the perplexity metric (docs/report.md).
struct Summary {
  std::string row;
  bool baseline = false;
  std::string target;  // "romance", "slavic+romance"; "" : every held-in language
  // mean over the target's held-in languages (every held-in language without a target) of
  // baseline − row
  std::optional<double> acquisition;
  std::optional<double> transfer;              // the same over the target's held-out languages
  std::optional<double> forgetting;            // row − baseline on the general language(s)
  std::vector<std::string> held_in, held_out;  // the languages acquisition/transfer used
  std::map<std::string, FamilyGain> families;  // family → the row's gains on it
  bool pareto = false;
};

// A plot: its SVG description, or why it was left out.
struct Plot {
  std::string file;     // acquisition_forgetting.svg
  std::string caption;  // one sentence: what it shows
  SvgPlot svg;
  std::string omitted;  // non-empty: not drawn, and why
};

struct Report {
  std::string experiment;
  int revision = 0;
  std::string baseline;           // the baseline row's title ("" none)
  std::string perplexity_metric;  // bpb or ppl ("" when the study has neither)
  bool roles_from_corpus = false;
  // Where the roles came from, for the header: "from the corpus manifest", "from the
  // report.held_in label", "assumed: no corpus manifest", ...
  std::string roles_source;
  std::vector<Language> languages;
  std::vector<std::string> families;  // in language order
  // The summary has a column group per family (the study has several families with
  // held-in languages).
  bool family_groups = false;
  std::vector<Column> columns;
  std::vector<Row> rows;  // table rows first (groups in order), then sweep points
  std::vector<Summary> summary;
  std::vector<Plot> plots;
  std::map<std::string, int> states;  // cells by state
  int cells = 0;
  std::vector<std::string> notes;
};

Report BuildReport(const ReportInput& input, const ReportOptions& options);

// True when lower values of `metric` are better (ppl, bpb, *loss).
bool LowerIsBetter(const std::string& metric);

// The matrix coordinates in a cell name ("eval[family=slavic,alpha=0.5]" → family, alpha);
// empty for a stage without a matrix. (GetExperiment does not send them for stored
// revisions; the name always has them.)
std::map<std::string, std::string> CoordsFromName(const std::string& job_name);

// The source job of a memoized cell ("memoized from j-7" → "j-7"), else "".
std::string MemoizedFrom(const std::string& reason);

// Languages from a corpus manifest ("format": "stemma.corpus/1", languages [{code, family,
// role, name}]); role "base" becomes "general". InvalidArgument-style message in `*error`
// naming the field when the manifest is malformed (then the result is empty).
std::vector<Language> CorpusLanguages(const nlohmann::json& manifest, std::string* error);

// "2.512", "270.3", "0.2500": a value for a table.
std::string FormatNumber(double v);
// "+0.120" / "-3.4": a signed delta with the decimals FormatNumber would use for `scale`.
std::string FormatDelta(double delta, double scale);

}  // namespace stemma::cli::report
