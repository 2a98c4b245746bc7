// stemma report EXPERIMENT: the study's paper-shaped table and plots (docs/report.md). This
// file gathers: the experiment's cells (GetExperiment), their jobs' labels and outputs
// (ListJobs, GetJob), metric points (QueryMetrics), registered outputs (ListArtifacts), and
// the files those name where this machine can read them. cli/report/ builds and renders.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/command.h"
#include "cli/report/report_model.h"
#include "cli/report/report_writers.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/status.h"

namespace stemma::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ReportCommandOptions {
  std::string experiment;
  int revision = 0;
  std::string out;
  std::string format;
  std::vector<std::string> metrics;
  std::vector<std::string> columns;
  bool by_family = false;
};

constexpr char kFooter[] = R"(
Rows are the experiment's eval cells (and exec cells with a results output); columns are <metric>/<task> metric points of those
evals (default metrics: bpb, else ppl; acc; chrf). Stage labels the report reads:
  report.row        the row's title (may use ${{ matrix.X }})    default: cell name without "eval-"
  report.baseline   "true": deltas are against this row          default: the stage eval-base
  report.group      a group heading (experts, dense, reverted, ...)
  report.alpha      interpolation weight of a sweep point        default: matrix axis alpha
  report.range      layer range of a sweep point                 default: matrix axis range
  report.table      "false" leaves a row out of the table (sweep points are out unless "true")
  report.target     what a row teaches: a family or languages ("${{ matrix.family }}", "fr,es");
                    on the eval stage or on the train stage it reads (default: a matrix
                    coordinate naming a family; none: every held-in language)
  report.held_in    languages the study teaches, "ru,uk" (on any cell; default: the corpus's)
  report.held_out   its held-out relatives, likewise
  report.general    the general language(s) forgetting is measured on (default: the corpus's
                    base language, else en)
Language roles (held-in, held-out, general) come from the corpus manifest (an artifact of
type corpus; of several, the one naming the most languages) and the labels above; without
either, every language but en is held-in and en is general. Acquisition and transfer of a row
are measured on its target's held-in and held-out languages, forgetting on the general
language; with several families the summary also has a column group per family. A perplexity task named other than its language
(instruct_en-fr) is a column group of its own ("task"), outside acquisition and forgetting.
With --out DIR: report.md, report.html (self-contained), report.csv, report.json and one
.svg per plot. See docs/report.md.)";

// The JSON file at `path`, or why not (unreadable here, or not JSON).
absl::StatusOr<json> ReadJson(const std::string& path) {
  absl::StatusOr<std::string> text = files::ReadFile(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat(path, ": not readable from here"));
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return j;
}

// The outputs an analyze spec asks for, by the names the report reads them under.
std::vector<std::string> AnalysesOf(const v1::AnalyzeSpec& a) {
  std::vector<std::string> out;
  if (a.has_lape()) out.push_back("mask");
  if (a.has_routing()) out.push_back("routing");
  if (a.has_drift()) out.push_back("drift");
  if (a.has_alignment()) out.push_back("alignment");
  return out;
}

class Gatherer {
 public:
  Gatherer(CoordinatorClient* client, const ReportCommandOptions& o) : client_(client), o_(o) {}

  absl::StatusOr<report::ReportInput> Gather() {
    v1::GetExperimentRequest req;
    req.set_name(o_.experiment);
    req.set_revision(o_.revision);
    ASSIGN_OR_RETURN(v1::GetExperimentResponse exp, client_->GetExperiment(req));
    in_.experiment = exp.experiment().name();
    in_.revision = exp.experiment().revision();
    RETURN_IF_ERROR(LoadJobs(exp));
    for (const v1::ExperimentCell& ec : exp.cells()) {
      report::Cell c;
      c.job_name = ec.job_name();
      c.stage = ec.stage();
      c.kind = ec.kind();
      c.coords.insert(ec.coords().begin(), ec.coords().end());
      if (c.coords.empty()) c.coords = report::CoordsFromName(c.job_name);
      c.job_id = ec.job_id();
      c.state = StateName(ec.state());
      c.reason = ec.reason();
      c.needs.assign(ec.needs().begin(), ec.needs().end());
      if (const v1::Job* job = JobOf(c.job_id)) {
        c.labels.insert(job->spec().labels().begin(), job->spec().labels().end());
        if (job->spec().has_analyze()) c.analyses = AnalysesOf(job->spec().analyze());
        // An exec cell that declares a results output (an evaluation of one's own, e.g.
        // lm-evaluation-harness) is a row like an eval cell (issue 23).
        for (const auto& [name, out] : job->spec().exec().outputs()) {
          if (out.type() != "results") continue;
          c.kind = "eval";
          results_output_[c.job_name] = name;
          break;
        }
      }
      c.metrics_job = MetricsJob(c.job_id);
      in_.cells.push_back(std::move(c));
    }
    RETURN_IF_ERROR(LoadMetrics());
    RETURN_IF_ERROR(LoadArtifacts());
    LoadCorpus();
    LoadFiles();
    return std::move(in_);
  }

 private:
  absl::Status LoadJobs(const v1::GetExperimentResponse& exp) {
    v1::ListJobsRequest req;
    req.set_experiment(in_.experiment);
    req.set_page_size(1000);
    while (true) {
      ASSIGN_OR_RETURN(v1::ListJobsResponse page, client_->ListJobs(req));
      for (const v1::Job& j : page.jobs()) jobs_[j.id()] = j;
      if (page.next_page_token().empty() || page.jobs_size() == 0) break;
      req.set_page_token(page.next_page_token());
    }
    for (const v1::ExperimentCell& c : exp.cells()) {
      if (!c.job_id().empty() && !jobs_.count(c.job_id())) (void)JobOf(c.job_id());
    }
    return absl::OkStatus();
  }

  // The job, fetched once when ListJobs did not return it (a memo source of another
  // experiment); null when it cannot be had.
  const v1::Job* JobOf(const std::string& id) {
    if (id.empty()) return nullptr;
    auto it = jobs_.find(id);
    if (it != jobs_.end()) return &it->second;
    absl::StatusOr<v1::Job> job = client_->GetJob(id);
    if (!job.ok()) return nullptr;
    return &(jobs_[id] = *job);
  }

  // The job that ran for this one: memoized jobs point at their source, which may itself
  // have been memoized.
  std::string MetricsJob(const std::string& id) {
    std::string current = id;
    for (int hop = 0; hop < 16 && !current.empty(); ++hop) {
      const v1::Job* job = JobOf(current);
      if (job == nullptr) break;
      const std::string from = report::MemoizedFrom(job->reason());
      if (from.empty() || from == current) break;
      current = from;
    }
    return current;
  }

  absl::Status LoadMetrics() {
    std::vector<std::string> evals, trains;
    for (const report::Cell& c : in_.cells) {
      if (c.metrics_job.empty()) continue;
      if (c.kind == "eval") evals.push_back(c.metrics_job);
      if (c.kind == "train") trains.push_back(c.metrics_job);
    }
    for (const auto& [ids, pattern, last] : {std::tuple{&evals, std::string(), true},
                                             std::tuple{&trains, std::string("loss"), false}}) {
      if (ids->empty()) continue;
      v1::QueryMetricsRequest q;
      for (const std::string& id : *ids) q.add_job_ids(id);
      q.set_name_pattern(pattern);
      q.set_last_only(last);
      q.set_limit(5'000'000);
      ASSIGN_OR_RETURN(v1::QueryMetricsResponse r, client_->QueryMetrics(q));
      if (r.truncated())
        in_.notes.push_back(
            absl::StrCat("the metric answer was cut at ", r.points_size(), " points"));
      for (const v1::MetricPoint& p : r.points()) {
        report::Point pt;
        pt.name = p.name();
        pt.step = p.step();
        pt.value = p.value();
        if (auto it = p.labels().find("language"); it != p.labels().end()) pt.language = it->second;
        if (auto it = p.labels().find("type"); it != p.labels().end()) pt.type = it->second;
        in_.points[p.job_id()].push_back(std::move(pt));
      }
    }
    return absl::OkStatus();
  }

  absl::Status LoadArtifacts() {
    v1::ListArtifactsRequest req;
    req.set_experiment(in_.experiment);
    req.set_limit(100000);
    ASSIGN_OR_RETURN(v1::ListArtifactsResponse r, client_->ListArtifacts(req));
    artifacts_.assign(r.artifacts().begin(), r.artifacts().end());
    return absl::OkStatus();
  }

  // The path of output `name` of the cell: the registry's, else the job's outputs.
  std::string OutputPath(const report::Cell& c, const std::string& name) {
    for (const std::string& id : {c.job_id, c.metrics_job}) {
      for (const v1::Artifact& a : artifacts_) {
        if (a.job_id() == id && a.name() == name && a.state() != v1::ARTIFACT_DELETED)
          return a.path();
      }
    }
    if (const v1::Job* job = JobOf(c.job_id)) {
      if (auto it = job->outputs().find(name); it != job->outputs().end()) return it->second;
    }
    return "";
  }

  void LoadCorpus() {
    std::vector<std::string> paths;
    for (const v1::Artifact& a : artifacts_) {
      if (a.type() == "corpus" && a.state() != v1::ARTIFACT_DELETED) paths.push_back(a.path());
    }
    for (const report::Cell& c : in_.cells) {
      if (c.kind != "prepare") continue;
      if (const v1::Job* job = JobOf(c.job_id)) {
        for (const auto& [name, path] : job->outputs()) {
          if (std::find(paths.begin(), paths.end(), path) == paths.end()) paths.push_back(path);
        }
      }
    }
    // Several manifests (a study's corpus and, say, an instruction set): every language any
    // of them names, its role from the one that names the most languages (the study's own).
    std::vector<std::pair<std::string, std::vector<report::Language>>> read;
    for (const std::string& path : paths) {
      const std::string manifest =
          fs::is_directory(path) ? (fs::path(path) / "manifest.json").string() : path;
      absl::StatusOr<json> j = ReadJson(manifest);
      if (!j.ok()) {
        in_.notes.push_back(
            absl::StrCat("corpus manifest ", j.status().message(), "; language roles are assumed"));
        continue;
      }
      std::string error;
      std::vector<report::Language> langs = report::CorpusLanguages(*j, &error);
      if (!error.empty()) {
        in_.notes.push_back(absl::StrCat(manifest, ": ", error, "; language roles are assumed"));
        continue;
      }
      read.emplace_back(manifest, std::move(langs));
    }
    std::stable_sort(read.begin(), read.end(), [](const auto& a, const auto& b) {
      return a.second.size() > b.second.size();
    });
    for (auto& [manifest, langs] : read) {
      if (in_.corpus_path.empty()) in_.corpus_path = manifest;
      for (report::Language& l : langs) {
        const bool known = std::any_of(in_.corpus_languages.begin(), in_.corpus_languages.end(),
                                       [&](const report::Language& k) { return k.code == l.code; });
        if (!known) in_.corpus_languages.push_back(std::move(l));
      }
    }
    if (read.size() > 1) {
      in_.notes.push_back(absl::StrCat(read.size(), " corpus manifests; roles from ",
                                       in_.corpus_path, " (the one naming the most languages)"));
    }
  }

  void LoadFiles() {
    int unreadable = 0;
    for (const report::Cell& c : in_.cells) {
      if (c.state != "SUCCEEDED") continue;
      if (c.kind == "eval") {
        auto declared = results_output_.find(c.job_name);
        const std::string path =
            OutputPath(c, declared == results_output_.end() ? "results" : declared->second);
        if (path.empty()) continue;
        absl::StatusOr<json> j = ReadJson(path);
        if (j.ok()) {
          in_.results[c.job_name] = std::move(*j);
        } else {
          ++unreadable;
          in_.notes.push_back(absl::StrCat("results of ", c.job_name, ": ", j.status().message(),
                                           " (the table uses its metric points)"));
        }
      } else if (c.kind == "analyze") {
        for (const char* name : {"mask", "routing", "drift", "alignment", "selection"}) {
          const std::string path = OutputPath(c, name);
          if (path.empty()) continue;
          absl::StatusOr<json> j = ReadJson(path);
          if (!j.ok()) {
            ++unreadable;
            in_.notes.push_back(absl::StrCat(name, " of ", c.job_name, ": ", j.status().message()));
            continue;
          }
          in_.analyses.push_back({c.job_name, name, path, std::move(*j)});
        }
      }
    }
    if (unreadable > 0) {
      in_.notes.push_back(
          absl::StrCat(unreadable,
                       " output file(s) could not be read where this command runs: "
                       "run it where the workers' storage root is mounted for the analysis plots"));
    }
  }

  CoordinatorClient* client_;
  const ReportCommandOptions& o_;
  report::ReportInput in_;
  std::map<std::string, v1::Job> jobs_;
  std::vector<v1::Artifact> artifacts_;
  std::map<std::string, std::string> results_output_;  // exec cell -> its results output
};

absl::StatusOr<int> RunReport(const GlobalOptions& g, const ReportCommandOptions& o) {
  std::string format = o.format;
  if (format.empty())
    format = g.format == OutputFormat::kJson  ? "json"
             : g.format == OutputFormat::kCsv ? "csv"
                                              : "md";
  if (format == "markdown") format = "md";
  if (format != "md" && format != "html" && format != "csv" && format != "json") {
    return UsageError(absl::StrCat("--format: '", o.format, "' is not md, html, csv or json"));
  }
  if (o.revision < 0) return UsageError("--revision must not be negative");
  CoordinatorClient client(g.coordinator, g.timeout());
  Gatherer gatherer(&client, o);
  ASSIGN_OR_RETURN(report::ReportInput input, gatherer.Gather());
  report::ReportOptions options;
  options.metrics = o.metrics;
  options.by_family = o.by_family;
  for (const std::string& c : o.columns) {
    // The words of earlier versions: `--columns families` is --by-family, `languages` the
    // default columns.
    if (c == "families") {
      options.by_family = true;
    } else if (c != "languages") {
      options.columns.push_back(c);
    }
  }
  const report::Report r = report::BuildReport(input, options);

  if (o.out.empty()) {
    if (format == "md") std::cout << report::RenderMarkdown(r, false);
    if (format == "html") std::cout << report::RenderHtml(r);
    if (format == "csv") std::cout << report::RenderCsv(r);
    if (format == "json") std::cout << report::ReportToJson(r).dump(2) << "\n";
    return 0;
  }
  const fs::path dir(o.out);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat(o.out, ": cannot create the directory: ", ec.message()));
  std::vector<std::pair<std::string, std::string>> files = {
      {"report.md", report::RenderMarkdown(r, true)},
      {"report.html", report::RenderHtml(r)},
      {"report.csv", report::RenderCsv(r)},
      {"report.json", report::ReportToJson(r).dump(2) + "\n"}};
  for (const report::Plot& p : r.plots) {
    if (p.omitted.empty()) files.emplace_back(p.file, report::RenderSvg(p.svg, true));
  }
  for (const auto& [name, content] : files)
    // Readers see the old file or the whole new one.
    RETURN_IF_ERROR(files::WriteFileAtomic((dir / name).string(), content));
  if (format == "md") {
    std::cout << report::RenderMarkdown(r, true) << "\nwritten to " << o.out << ":";
    for (const auto& [name, content] : files) std::cout << " " << name;
    std::cout << "\nopen " << (dir / "report.html").string() << " in a browser\n";
  } else if (format == "json") {
    std::cout << report::ReportToJson(r).dump(2) << "\n";
  } else if (format == "csv") {
    std::cout << report::RenderCsv(r);
  } else {
    std::cout << (dir / "report.html").string() << "\n";
  }
  return 0;
}

}  // namespace

void AddReportCommand(CLI::App* app, const GlobalOptions* globals, Action* action) {
  auto o = std::make_shared<ReportCommandOptions>();
  CLI::App* sub = app->add_subcommand("report",
                                      "An experiment's study report: the results table with "
                                      "deltas, acquisition vs forgetting, plots");
  sub->add_option("experiment", o->experiment, "experiment name")->required();
  sub->add_option("--revision", o->revision, "revision (default: the latest)");
  sub->add_option("--out", o->out,
                  "write report.md, report.html, report.csv, report.json and the plots (SVG) here");
  sub->add_option("--format", o->format, "what goes to stdout: md (default) | html | csv | json");
  sub->add_option(
         "--metric", o->metrics,
         "metrics to show, in this order (repeatable): a name (ppl, acc_norm), a column (bpb/ru), "
         "a glob, or all")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--columns", o->columns,
                  "only these columns, in this order (comma-separated or repeated): a column "
                  "(bpb/ru), a task or language (ru), a family (slavic), a role (held-in), a glob")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_flag("--by-family", o->by_family,
                "one column per family and role: the mean over its languages (slavic held-in)");
  sub->footer(kFooter);
  sub->callback([=] { *action = [=] { return RunReport(*globals, *o); }; });
}

}  // namespace stemma::cli
