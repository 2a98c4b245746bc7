// stemma metrics JOB|EXPERIMENT: a job's (or an experiment's cells') metric series, each
// point named by its cell.
// stemma metrics export --to mlflow|tensorboard EXPERIMENT: the same into MLflow or
// TensorBoard, through the Python client (python/stemma/export.py).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/command.h"
#include "cli/metrics_view.h"
#include "common/status.h"

namespace stemma::cli {
namespace {

struct MetricsOptions {
  std::vector<std::string> targets;
  std::string name;
  bool last = false;
  int64_t limit = 0;
  std::string revision;  // "" (the latest), N, or "all"
  std::string cell;
};

absl::StatusOr<int> RunMetrics(const GlobalOptions& g, const MetricsOptions& o) {
  if (o.targets.empty()) return UsageError("metrics: give job ids or an experiment name");
  v1::QueryMetricsRequest request;
  for (const std::string& t : o.targets) {
    if (LooksLikeJobId(t)) {
      request.add_job_ids(t);
    } else if (request.experiment().empty()) {
      request.set_experiment(t);
    } else {
      return UsageError(absl::StrCat("'", t, "': give job ids and at most one experiment"));
    }
  }
  if (!o.revision.empty() || !o.cell.empty()) {
    if (request.experiment().empty())
      return UsageError("--revision and --cell select cells of an experiment: name one");
  }
  if (o.revision == "all") {
    request.set_revision(-1);
  } else if (!o.revision.empty()) {
    int r = 0;
    if (!absl::SimpleAtoi(o.revision, &r) || r < 1)
      return UsageError(
          absl::StrCat("--revision: '", o.revision, "' is not a revision (1, 2, ...) or all"));
    request.set_revision(r);
  }
  request.set_cell(o.cell);
  request.set_name_pattern(o.name);
  request.set_last_only(o.last);
  if (o.limit < 0) return UsageError("--limit must not be negative");
  request.set_limit(o.limit);
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::QueryMetricsResponse response, client.QueryMetrics(request));
  std::vector<v1::MetricPoint> points(response.points().begin(), response.points().end());
  // A coordinator older than these flags answers with every revision's points, none named by
  // its cell: say so rather than print them as if selected.
  if ((!o.revision.empty() || !o.cell.empty()) && !points.empty() &&
      std::all_of(points.begin(), points.end(),
                  [](const v1::MetricPoint& p) { return p.job_name().empty(); })) {
    return absl::FailedPreconditionError(
        "the coordinator does not select by --revision or --cell (it is older than this CLI)");
  }
  switch (g.format) {
    case OutputFormat::kJson:
    case OutputFormat::kYaml:
    case OutputFormat::kName:
    case OutputFormat::kJsonPath:
      PrintStructured(MetricPointsToJson(points), g.format);
      break;
    case OutputFormat::kCsv:
      PrintTable(RenderMetricsCsv(points));
      break;
    default:
      PrintTable(RenderMetricsTable(points, g.format == OutputFormat::kWide));
  }
  if (response.truncated()) {
    std::cerr << "stemma: note: the answer was cut at " << points.size()
              << " points (--limit raises it)\n";
  }
  return 0;
}

struct ExportOptions {
  std::string experiment;
  std::string to;
  std::string tracking_uri;
  std::string mlflow_experiment;
  std::string logdir;
  int revision = 0;
  std::string python = "python3";
};

// Imports the Python client's exporter or says how to get it, then runs it with the rest of
// the arguments.
constexpr char kExportBootstrap[] = R"py(import sys
try:
    from stemma.export import main
except ImportError as e:
    sys.exit("stemma: error: metrics export needs the Python client in " + sys.executable +
             " (" + str(e) + "): pip install ./python from a Stemma checkout (docs/python.md)")
sys.exit(main(sys.argv[1:])))py";

// Replaces this process with the Python exporter: the address, timeout and credentials
// travel as its flags and the environment main already exported (STEMMA_CA,
// STEMMA_TOKEN_FILE), which the Python client reads as the CLI does.
absl::StatusOr<int> RunExport(const GlobalOptions& g, const ExportOptions& o) {
  if (o.to != "mlflow" && o.to != "tensorboard") {
    return UsageError(absl::StrCat("--to: '", o.to, "' is not mlflow or tensorboard"));
  }
  if (o.to == "tensorboard" && o.logdir.empty())
    return UsageError("--to tensorboard needs --logdir");
  if (o.to == "mlflow" && !o.logdir.empty()) return UsageError("--logdir is for --to tensorboard");
  std::vector<std::string> args = {o.python,
                                   "-c",
                                   kExportBootstrap,
                                   "--to",
                                   o.to,
                                   "--coordinator",
                                   g.coordinator,
                                   "--timeout",
                                   absl::StrCat(g.request_timeout_s),
                                   "--revision",
                                   absl::StrCat(o.revision)};
  if (!o.tracking_uri.empty()) args.insert(args.end(), {"--tracking-uri", o.tracking_uri});
  if (!o.mlflow_experiment.empty())
    args.insert(args.end(), {"--mlflow-experiment", o.mlflow_experiment});
  if (!o.logdir.empty()) args.insert(args.end(), {"--logdir", o.logdir});
  args.push_back("--");
  args.push_back(o.experiment);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  std::fflush(nullptr);
  ::execvp(argv[0], argv.data());
  return absl::FailedPreconditionError(
      absl::StrCat("metrics export: cannot run ", o.python, ": ", std::strerror(errno),
                   " (it needs Python 3 with the stemma package: pip install ./python; --python "
                   "names another interpreter)"));
}

void AddExportCommand(CLI::App* metrics, const GlobalOptions* globals, Action* action) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* sub = metrics->add_subcommand(
      "export",
      "An experiment's runs into MLflow or TensorBoard: one run per cell, its spec as params, "
      "labels and lineage as tags, metric series as metrics (needs the Python client)");
  sub->add_option("experiment", o->experiment, "experiment name")->required();
  sub->add_option("--to", o->to, "mlflow | tensorboard")->required();
  sub->add_option("--tracking-uri", o->tracking_uri,
                  "MLflow tracking URI (default: MLflow's own, $MLFLOW_TRACKING_URI)");
  sub->add_option("--mlflow-experiment", o->mlflow_experiment,
                  "MLflow experiment name (default: the Stemma experiment's)");
  sub->add_option("--logdir", o->logdir, "TensorBoard log directory: one run directory per cell");
  sub->add_option("--revision", o->revision, "the experiment's revision (default: the latest)");
  sub->add_option("--python", o->python,
                  "the Python with the stemma package (default: python3 on PATH)");
  sub->callback([=] { *action = [=] { return RunExport(*globals, *o); }; });
}

}  // namespace

void AddMetricsCommand(CLI::App* app, const GlobalOptions* globals, Action* action) {
  auto o = std::make_shared<MetricsOptions>();
  CLI::App* sub = app->add_subcommand(
      "metrics", "Metric series of jobs or an experiment (-o table | csv | json)");
  // Not ->required(): `stemma metrics export ...` has no target of its own.
  sub->add_option("target", o->targets, "job ids (j-12) or one experiment name");
  sub->add_option("--name", o->name, "only names matching this glob (e.g. 'heldout_loss/*')");
  sub->add_flag("--last", o->last, "only the last point of each name");
  sub->add_option("--limit", o->limit, "at most this many points (default 100000)");
  sub->add_option("--revision", o->revision,
                  "experiment: this revision's cells (default: the latest), or all");
  sub->add_option("--cell", o->cell,
                  "experiment: only cells whose name matches this glob ('eval-*', "
                  "'cpt[family=slavic]')");
  AddExportCommand(sub, globals, action);
  // CLI11 runs this callback after the chosen subcommand's: it must not replace export's.
  sub->callback([=] {
    if (sub->get_subcommands().empty()) *action = [=] { return RunMetrics(*globals, *o); };
  });
}

}  // namespace stemma::cli
