// stemma metrics JOB|EXPERIMENT: a job's (or every job of an experiment's) metric series.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>

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
};

absl::StatusOr<int> RunMetrics(const GlobalOptions& g, const MetricsOptions& o) {
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
  request.set_name_pattern(o.name);
  request.set_last_only(o.last);
  if (o.limit < 0) return UsageError("--limit must not be negative");
  request.set_limit(o.limit);
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::QueryMetricsResponse response, client.QueryMetrics(request));
  std::vector<v1::MetricPoint> points(response.points().begin(), response.points().end());
  switch (g.format) {
    case OutputFormat::kJson:
    case OutputFormat::kYaml:
      PrintStructured(MetricPointsToJson(points), g.format);
      break;
    case OutputFormat::kCsv:
      std::cout << RenderMetricsCsv(points);
      break;
    default:
      std::cout << RenderMetricsTable(points, g.format == OutputFormat::kWide);
  }
  if (response.truncated()) {
    std::cerr << "stemma: note: the answer was cut at " << points.size()
              << " points (--limit raises it)\n";
  }
  return 0;
}

}  // namespace

void AddMetricsCommand(CLI::App* app, const GlobalOptions* globals, Action* action) {
  auto o = std::make_shared<MetricsOptions>();
  CLI::App* sub = app->add_subcommand(
      "metrics", "Metric series of jobs or an experiment (-o table | csv | json)");
  sub->add_option("target", o->targets, "job ids (j-12) or one experiment name")->required();
  sub->add_option("--name", o->name, "only names matching this glob (e.g. 'heldout_loss/*')");
  sub->add_flag("--last", o->last, "only the last point of each name");
  sub->add_option("--limit", o->limit, "at most this many points (default 100000)");
  sub->callback([=] { *action = [=] { return RunMetrics(*globals, *o); }; });
}

}  // namespace stemma::cli
