// submit, ls, get, cancel, retry.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/command.h"
#include "cli/metrics_view.h"
#include "common/job_spec.h"
#include "common/status.h"

namespace stemma::cli {
namespace {

struct SubmitOptions {
  std::vector<std::string> files;
  std::string idempotency_key;
};

absl::StatusOr<int> RunSubmit(const GlobalOptions& g, const SubmitOptions& o) {
  v1::SubmitRequest request;
  for (const std::string& file : o.files) {
    // Checked here, before anything is sent: a bad engine spec is refused with its file,
    // line and field, and nothing is queued.
    ASSIGN_OR_RETURN(std::vector<v1::JobSpec> specs, ReadAndCheckJobsFile(file));
    for (auto& spec : specs) *request.add_jobs() = std::move(spec);
  }
  request.set_idempotency_key(o.idempotency_key);
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::SubmitResponse response, client.Submit(request));
  if (g.format == OutputFormat::kJson || g.format == OutputFormat::kYaml) {
    nlohmann::json j = {{"job_ids", std::vector<std::string>(response.job_ids().begin(),
                                                             response.job_ids().end())}};
    if (response.existing()) j["existing"] = true;
    PrintStructured(j, g.format);
  } else {
    // "id name": the names are what later commands may use instead of ids.
    for (int i = 0; i < response.job_ids_size(); ++i) {
      const std::string& name = i < request.jobs_size() ? request.jobs(i).name() : std::string();
      std::cout << response.job_ids(i) << (name.empty() ? "" : " ") << name << "\n";
    }
  }
  return 0;
}

struct ListOptions {
  std::vector<std::string> states;
  std::string kind;
  std::vector<std::string> labels;
  std::string experiment;
  int limit = 100;
  bool all = false;
};

constexpr int kMaxPageSize = 1000;

absl::StatusOr<int> RunList(const GlobalOptions& g, const ListOptions& o) {
  v1::ListJobsRequest request;
  ASSIGN_OR_RETURN(std::vector<v1::JobState> states, ParseStates(o.states));
  for (v1::JobState s : states) request.add_states(s);
  if (!o.kind.empty()) {
    ASSIGN_OR_RETURN(std::string kind, ParseKind(o.kind));
    request.set_kind(kind);
  }
  ASSIGN_OR_RETURN(auto labels, ParseLabels(o.labels));
  request.mutable_labels()->insert(labels.begin(), labels.end());
  request.set_experiment(o.experiment);
  if (o.limit <= 0 && !o.all) return UsageError("--limit must be positive");
  request.set_page_size(o.all ? kMaxPageSize : std::min(o.limit, kMaxPageSize));

  CoordinatorClient client(g.coordinator, g.timeout());
  std::vector<v1::Job> jobs;
  while (true) {
    ASSIGN_OR_RETURN(v1::ListJobsResponse page, client.ListJobs(request));
    for (auto& job : *page.mutable_jobs()) jobs.push_back(std::move(job));
    if (page.next_page_token().empty()) break;
    if (!o.all && static_cast<int>(jobs.size()) >= o.limit) break;
    request.set_page_token(page.next_page_token());
  }
  if (!o.all && static_cast<int>(jobs.size()) > o.limit) jobs.resize(o.limit);

  switch (g.format) {
    case OutputFormat::kJson:
    case OutputFormat::kYaml: {
      nlohmann::json array = nlohmann::json::array();
      for (const auto& job : jobs) array.push_back(JobToJson(job));
      PrintStructured(array, g.format);
      break;
    }
    default:
      std::cout << RenderJobsTable(jobs, g.format == OutputFormat::kWide, NowMs());
  }
  return 0;
}

void PrintJob(const GlobalOptions& g, const v1::Job& job) {
  if (g.format == OutputFormat::kJson || g.format == OutputFormat::kYaml) {
    PrintStructured(JobToJson(job), g.format);
  } else {
    std::cout << RenderJobDetails(job, NowMs());
  }
}

// `cancel` and `retry` answer with "ID STATE" for people.
void PrintJobState(const GlobalOptions& g, const v1::Job& job) {
  if (g.format == OutputFormat::kJson || g.format == OutputFormat::kYaml) {
    PrintStructured(JobToJson(job), g.format);
  } else {
    std::cout << job.id() << " " << StateName(job.state()) << "\n";
  }
}

}  // namespace

void AddJobCommands(CLI::App* app, const GlobalOptions* globals, Action* action) {
  {
    auto o = std::make_shared<SubmitOptions>();
    CLI::App* sub = app->add_subcommand("submit", "Submit the jobs of one or more YAML files");
    sub->add_option("-f,--file", o->files, "job file (repeatable); all go in one request")
        ->required();
    sub->add_option("--idempotency-key", o->idempotency_key,
                    "the same key returns the same jobs however often it is sent");
    sub->callback([=] { *action = [=] { return RunSubmit(*globals, *o); }; });
  }
  {
    auto o = std::make_shared<ListOptions>();
    CLI::App* sub = app->add_subcommand("ls", "List jobs");
    sub->add_option("--state", o->states,
                    "only these states (repeatable or comma list, e.g. running,queued)");
    sub->add_option("--kind", o->kind, "noop | exec | engine");
    sub->add_option("--label", o->labels, "key=value that must match (repeatable)");
    sub->add_option("--experiment", o->experiment, "only jobs of this experiment");
    sub->add_option("--limit", o->limit, "at most this many jobs (default 100)");
    sub->add_flag("--all", o->all, "every matching job, page after page");
    sub->callback([=] { *action = [=] { return RunList(*globals, *o); }; });
  }
  {
    auto id = std::make_shared<std::string>();
    CLI::App* sub = app->add_subcommand("get", "Show one job");
    sub->add_option("id", *id, "job id")->required();
    sub->callback([=] {
      *action = [=]() -> absl::StatusOr<int> {
        CoordinatorClient client(globals->coordinator, globals->timeout());
        ASSIGN_OR_RETURN(v1::Job job, client.GetJob(*id));
        // The job's last metric values; a coordinator without metric series has none.
        v1::QueryMetricsRequest last;
        last.add_job_ids(job.id());
        last.set_last_only(true);
        last.set_limit(1000);
        auto metrics = client.QueryMetrics(last);
        std::vector<v1::MetricPoint> points;
        if (metrics.ok()) points.assign(metrics->points().begin(), metrics->points().end());
        if (globals->format == OutputFormat::kJson || globals->format == OutputFormat::kYaml) {
          nlohmann::json j = JobToJson(job);
          j["metrics"] = nlohmann::json::object();
          for (const auto& p : points)
            j["metrics"][p.name()] = {{"value", p.value()}, {"step", p.step()}};
          PrintStructured(j, globals->format);
        } else {
          std::cout << RenderJobDetails(job, NowMs());
          if (!points.empty()) std::cout << "metrics:    " << RenderLastValues(points) << "\n";
        }
        return 0;
      };
    });
  }
  {
    auto id = std::make_shared<std::string>();
    auto reason = std::make_shared<std::string>();
    CLI::App* sub = app->add_subcommand("cancel", "Cancel a job");
    sub->add_option("id", *id, "job id")->required();
    sub->add_option("--reason", *reason, "recorded as the job's reason");
    sub->callback([=] {
      *action = [=]() -> absl::StatusOr<int> {
        CoordinatorClient client(globals->coordinator, globals->timeout());
        ASSIGN_OR_RETURN(v1::Job named, client.GetJob(*id));  // an id or a job name
        ASSIGN_OR_RETURN(v1::Job job, client.Cancel(named.id(), *reason));
        PrintJobState(*globals, job);
        return 0;
      };
    });
  }
  {
    auto id = std::make_shared<std::string>();
    CLI::App* sub = app->add_subcommand("retry", "Run a failed or cancelled job again");
    sub->add_option("id", *id, "job id")->required();
    sub->callback([=] {
      *action = [=]() -> absl::StatusOr<int> {
        CoordinatorClient client(globals->coordinator, globals->timeout());
        ASSIGN_OR_RETURN(v1::Job named, client.GetJob(*id));  // an id or a job name
        ASSIGN_OR_RETURN(v1::Job job, client.Retry(named.id()));
        PrintJobState(*globals, job);
        return 0;
      };
    });
  }
}

}  // namespace stemma::cli
