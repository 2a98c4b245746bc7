// submit, ls, get, cancel, retry.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/command.h"
#include "cli/metrics_view.h"
#include "common/job_spec.h"
#include "common/label_selector.h"
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
  if (IsStructured(g.format)) {
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
  std::string selector;
  std::string owner;
  std::string experiment;
  int limit = 100;
  bool all = false;
  bool archived = false;
};

constexpr int kMaxPageSize = 1000;

absl::StatusOr<v1::ListJobsRequest> ListRequest(const ListOptions& o) {
  v1::ListJobsRequest request;
  ASSIGN_OR_RETURN(std::vector<v1::JobState> states, ParseStates(o.states));
  for (v1::JobState s : states) request.add_states(s);
  if (!o.kind.empty()) {
    ASSIGN_OR_RETURN(std::string kind, ParseKind(o.kind));
    request.set_kind(kind);
  }
  ASSIGN_OR_RETURN(auto labels, ParseLabels(o.labels));
  request.mutable_labels()->insert(labels.begin(), labels.end());
  if (!o.selector.empty()) {
    // Checked here too, so that a typo is a usage error before anything is sent.
    absl::StatusOr<LabelSelector> parsed = LabelSelector::Parse(o.selector);
    if (!parsed.ok()) return UsageError(absl::StrCat("-l: ", parsed.status().message()));
    request.set_selector(o.selector);
  }
  request.set_owner(o.owner);
  request.set_experiment(o.experiment);
  request.set_include_archived(o.archived);
  return request;
}

// Every job the request matches (`limit` > 0: at most that many), page after page.
absl::StatusOr<std::vector<v1::Job>> ListAll(CoordinatorClient& client, v1::ListJobsRequest request,
                                             int limit) {
  request.set_page_size(limit > 0 ? std::min(limit, kMaxPageSize) : kMaxPageSize);
  std::vector<v1::Job> jobs;
  while (true) {
    ASSIGN_OR_RETURN(v1::ListJobsResponse page, client.ListJobs(request));
    for (auto& job : *page.mutable_jobs()) jobs.push_back(std::move(job));
    if (page.next_page_token().empty()) break;
    if (limit > 0 && static_cast<int>(jobs.size()) >= limit) break;
    request.set_page_token(page.next_page_token());
  }
  if (limit > 0 && static_cast<int>(jobs.size()) > limit) jobs.resize(limit);
  return jobs;
}

nlohmann::json JobsToJson(const std::vector<v1::Job>& jobs) {
  nlohmann::json array = nlohmann::json::array();
  for (const auto& job : jobs) array.push_back(JobToJson(job));
  return array;
}

absl::StatusOr<int> RunList(const GlobalOptions& g, const ListOptions& o) {
  if (o.limit <= 0 && !o.all) return UsageError("--limit must be positive");
  ASSIGN_OR_RETURN(v1::ListJobsRequest request, ListRequest(o));
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, ListAll(client, request, o.all ? 0 : o.limit));
  if (IsStructured(g.format)) {
    PrintStructured(JobsToJson(jobs), g.format);
  } else {
    PrintTable(RenderJobsTable(jobs, g.format == OutputFormat::kWide, NowMs()));
  }
  return 0;
}

// `cancel` and `retry` answer with "ID STATE" for people.
void PrintJobStates(const GlobalOptions& g, const std::vector<v1::Job>& jobs) {
  if (IsStructured(g.format)) {
    PrintStructured(jobs.size() == 1 ? JobToJson(jobs[0]) : JobsToJson(jobs), g.format);
    return;
  }
  for (const v1::Job& job : jobs) std::cout << job.id() << " " << StateName(job.state()) << "\n";
}

absl::StatusOr<int> RunGet(const GlobalOptions& g, const std::string& id) {
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::JobResponse response, client.GetJobWithHistory(id));
  const v1::Job& job = response.job();
  std::vector<v1::Attempt> history(response.history().begin(), response.history().end());
  // The job's last metric values; a coordinator without metric series has none.
  v1::QueryMetricsRequest last;
  last.add_job_ids(job.id());
  last.set_last_only(true);
  last.set_limit(1000);
  auto metrics = client.QueryMetrics(last);
  std::vector<v1::MetricPoint> points;
  if (metrics.ok()) points.assign(metrics->points().begin(), metrics->points().end());
  if (IsStructured(g.format)) {
    nlohmann::json j = JobToJson(job);
    j["metrics"] = nlohmann::json::object();
    for (const auto& p : points)
      j["metrics"][p.name()] = {{"value", p.value()}, {"step", p.step()}};
    j["history"] = AttemptsToJson(history);
    PrintStructured(j, g.format);
    return 0;
  }
  std::cout << RenderJobDetails(job, NowMs());
  if (!points.empty()) std::cout << "metrics:    " << RenderLastValues(points) << "\n";
  if (!history.empty()) {
    std::cout << "\nattempts:\n";
    std::cout << TerminalSafe(RenderAttemptsTable(history));
  }
  return 0;
}

// cancel and retry: one or more ids, or every job a selection matches (-l, --experiment,
// --owner, --all), after a confirmation.
struct BulkOptions {
  std::vector<std::string> ids;
  std::string selector;
  std::string experiment;
  std::string owner;
  bool all = false;
  bool yes = false;
  std::string reason;
};

// "cancel 12 jobs? [y/N]" on a terminal; without one, --yes is required.
absl::Status Confirm(const std::string& verb, size_t count, bool yes) {
  if (yes) return absl::OkStatus();
  if (::isatty(STDIN_FILENO) == 0) {
    return UsageError(absl::StrCat("refusing to ", verb, " ", count,
                                   " jobs without --yes (stdin is not a terminal)"));
  }
  std::cerr << verb << " " << count << " jobs? [y/N] " << std::flush;
  std::string answer;
  std::getline(std::cin, answer);
  if (answer == "y" || answer == "Y" || answer == "yes") return absl::OkStatus();
  return absl::AbortedError(absl::StrCat("nothing done: ", verb, " not confirmed"));
}

absl::StatusOr<int> RunBulk(const GlobalOptions& g, const BulkOptions& o, bool cancel) {
  const char* verb = cancel ? "cancel" : "retry";
  const char* past = cancel ? "cancelled" : "retried";
  const bool selection = !o.selector.empty() || !o.experiment.empty() || !o.owner.empty() || o.all;
  if (selection == !o.ids.empty()) {
    return UsageError(absl::StrCat(verb,
                                   ": give job ids, or select jobs with -l, --experiment, "
                                   "--owner or --all (not both)"));
  }
  CoordinatorClient client(g.coordinator, g.timeout());
  std::vector<std::string> ids;
  if (selection) {
    ListOptions list;
    list.selector = o.selector;
    list.experiment = o.experiment;
    list.owner = o.owner;
    list.states = cancel ? std::vector<std::string>{"pending,queued,assigned,running"}
                         : std::vector<std::string>{"failed,cancelled"};
    ASSIGN_OR_RETURN(v1::ListJobsRequest request, ListRequest(list));
    ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, ListAll(client, request, 0));
    if (jobs.empty()) {
      std::cerr << "no " << (cancel ? "unfinished" : "failed or cancelled")
                << " jobs match; nothing to " << verb << "\n";
      if (IsStructured(g.format)) PrintStructured(nlohmann::json::array(), g.format);
      return 0;
    }
    RETURN_IF_ERROR(Confirm(verb, jobs.size(), o.yes));
    for (const v1::Job& job : jobs) ids.push_back(job.id());
  } else {
    for (const std::string& id : o.ids) {
      ASSIGN_OR_RETURN(v1::Job named, client.GetJob(id));  // an id or a job name
      ids.push_back(named.id());
    }
  }
  std::vector<v1::Job> done;
  std::vector<std::string> refused;
  absl::Status first;
  for (const std::string& id : ids) {
    absl::StatusOr<v1::Job> job = cancel ? client.Cancel(id, o.reason) : client.Retry(id);
    if (job.ok()) {
      done.push_back(*std::move(job));
      continue;
    }
    if (ids.size() == 1) return job.status();
    // An unreachable coordinator stops the rest; a refusal of one job does not.
    if (ExitCodeFor(job.status()) == kExitUnreachable) return job.status();
    if (first.ok()) first = job.status();
    refused.push_back(absl::StrCat(id, ": ", job.status().message()));
  }
  PrintJobStates(g, done);
  if (refused.empty()) return 0;
  for (const std::string& line : refused)
    std::cerr << "stemma: not " << past << ": " << line << "\n";
  return absl::Status(first.code(), absl::StrCat(refused.size(), " of ", ids.size(), " jobs not ",
                                                 past, " (", refused.front(), ")"));
}

void AddBulkFlags(CLI::App* sub, BulkOptions* o, const char* what) {
  sub->add_option("ids", o->ids, "job ids or names");
  sub->add_option("-l,--selector", o->selector,
                  absl::StrCat("every ", what,
                               " job whose labels match: k=v, k!=v, "
                               "'k in (a,b)', 'k notin (a,b)', k, !k, joined by commas"));
  sub->add_option("--experiment", o->experiment, absl::StrCat("every ", what, " job of it"));
  sub->add_option("--owner", o->owner, absl::StrCat("every ", what, " job this user submitted"));
  sub->add_flag("--all", o->all, absl::StrCat("every ", what, " job"));
  sub->add_flag("-y,--yes", o->yes,
                "do not ask \"N jobs? [y/N]\" (required when stdin is not a terminal)");
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
    sub->add_option("-l,--selector", o->selector,
                    "label selector: k=v, k!=v, 'k in (a,b)', 'k notin (a,b)', k, !k, joined "
                    "by commas (all must hold)");
    sub->add_option("--label", o->labels, "key=value that must match (repeatable)");
    sub->add_option("--owner", o->owner, "only jobs this user submitted");
    sub->add_option("--experiment", o->experiment, "only jobs of this experiment");
    sub->add_flag("--archived", o->archived, "archived jobs too (stemma gc jobs)");
    sub->add_option("--limit", o->limit, "at most this many jobs (default 100)");
    sub->add_flag("--all", o->all, "every matching job, page after page");
    sub->callback([=] { *action = [=] { return RunList(*globals, *o); }; });
  }
  {
    auto id = std::make_shared<std::string>();
    CLI::App* sub =
        app->add_subcommand("get", "Show one job, its last metric values and every attempt");
    sub->add_option("id", *id, "job id")->required();
    sub->callback([=] { *action = [=] { return RunGet(*globals, *id); }; });
  }
  {
    auto o = std::make_shared<BulkOptions>();
    CLI::App* sub = app->add_subcommand("cancel",
                                        "Cancel jobs: by id, or every unfinished job "
                                        "of a selection after a confirmation");
    AddBulkFlags(sub, o.get(), "unfinished");
    sub->add_option("--reason", o->reason, "recorded as the jobs' reason");
    sub->callback([=] { *action = [=] { return RunBulk(*globals, *o, true); }; });
  }
  {
    auto o = std::make_shared<BulkOptions>();
    CLI::App* sub = app->add_subcommand(
        "retry", "Run failed or cancelled jobs again: by id, or every one of a selection");
    AddBulkFlags(sub, o.get(), "failed or cancelled");
    sub->callback([=] { *action = [=] { return RunBulk(*globals, *o, false); }; });
  }
}

}  // namespace stemma::cli
