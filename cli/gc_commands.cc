// `stemma gc jobs`: archive (or, with --delete, forget) finished jobs older than a time,
// through the coordinator's CollectJobs (JobTable::Collect decides what may go).
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/command.h"
#include "common/job_spec.h"
#include "common/status.h"

namespace stemma::cli {
namespace {

struct GcJobsOptions {
  double older_than_s = 0;
  std::vector<std::string> states;
  std::string experiment;
  bool apply = false;
  bool forget = false;
};

// The selected jobs as the listing has them (for their names and times).
absl::StatusOr<std::vector<v1::Job>> Describe(CoordinatorClient& client,
                                              const v1::GcJobsRequest& gc,
                                              const v1::GcJobsResponse& response) {
  const std::set<std::string> ids(response.job_ids().begin(), response.job_ids().end());
  std::vector<v1::Job> jobs;
  if (ids.empty()) return jobs;
  v1::ListJobsRequest request;
  request.set_finished_before_ms(gc.finished_before_ms());
  request.set_experiment(gc.experiment());
  request.set_include_archived(true);
  request.set_page_size(1000);
  while (true) {
    ASSIGN_OR_RETURN(v1::ListJobsResponse page, client.ListJobs(request));
    for (auto& job : *page.mutable_jobs()) {
      if (ids.count(job.id())) jobs.push_back(std::move(job));
    }
    if (page.next_page_token().empty()) break;
    request.set_page_token(page.next_page_token());
  }
  return jobs;
}

absl::StatusOr<int> RunGcJobs(const GlobalOptions& g, const GcJobsOptions& o) {
  if (!(o.older_than_s > 0)) return UsageError("--older-than must be a duration such as 30d");
  v1::GcJobsRequest request;
  request.set_finished_before_ms(NowMs() - static_cast<int64_t>(o.older_than_s * 1000));
  ASSIGN_OR_RETURN(std::vector<v1::JobState> states, ParseStates(o.states));
  for (v1::JobState s : states) {
    if (!IsTerminal(s)) {
      return UsageError(absl::StrCat("--state ", StateName(s),
                                     ": only finished jobs (succeeded, failed, cancelled) are "
                                     "collected"));
    }
    request.add_states(s);
  }
  request.set_experiment(o.experiment);
  request.set_apply(o.apply);
  request.set_forget(o.forget);
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::GcJobsResponse response, client.CollectJobs(request));
  const char* what = o.forget ? "delete" : "archive";
  if (IsStructured(g.format)) {
    nlohmann::json items = nlohmann::json::array();
    for (const std::string& id : response.job_ids()) items.push_back({{"id", id}});
    PrintStructured(
        g.format == OutputFormat::kName
            ? items
            : nlohmann::json{{"action", what}, {"applied", response.applied()}, {"items", items}},
        g.format);
    return 0;
  }
  absl::StatusOr<std::vector<v1::Job>> jobs = Describe(client, request, response);
  if (jobs.ok() && !jobs->empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const v1::Job& job : *jobs) {
      rows.push_back({job.id(), job.spec().name().empty() ? "-" : job.spec().name(),
                      StateName(job.state()), FormatTimestamp(job.finished_ms()),
                      job.spec().experiment().empty() ? "-" : job.spec().experiment()});
    }
    PrintTable(RenderTable({"ID", "NAME", "STATE", "FINISHED", "EXPERIMENT"}, rows));
  }
  std::cout << (response.applied() ? (o.forget ? "deleted " : "archived ")
                                   : absl::StrCat("would ", what, " "))
            << response.job_ids_size() << " jobs";
  if (!response.applied() && response.job_ids_size() > 0) std::cout << " (--apply to do it)";
  std::cout << "\n";
  return 0;
}

}  // namespace

void AddGcCommands(CLI::App* app, const GlobalOptions* globals, Action* action) {
  CLI::App* gc = app->add_subcommand("gc", "Clean up: gc jobs archives old finished jobs");
  gc->require_subcommand(1);
  auto o = std::make_shared<GcJobsOptions>();
  CLI::App* jobs = gc->add_subcommand(
      "jobs",
      "Archive finished jobs older than a time (hidden from ls unless --archived; their "
      "artifacts stay registered). Never touches unfinished jobs or jobs an unfinished job "
      "depends on; a user's gc sees only its own and its projects' jobs. A dry run unless "
      "--apply");
  jobs->add_option("--older-than", o->older_than_s,
                   "jobs that finished longer ago than this: 30d, 12h, 90m")
      ->required()
      ->transform(DurationFlag());
  jobs->add_option("--state", o->states,
                   "only these finished states (repeatable or comma list; default all three)");
  jobs->add_option("--experiment", o->experiment, "only jobs of this experiment");
  jobs->add_flag("--apply", o->apply, "do it (default: print what would be done)");
  jobs->add_flag("--delete", o->forget,
                 "forget the jobs instead of archiving them (their records, attempt "
                 "history and logs; a job is deleted only with every job that depends on it)");
  jobs->callback([=] { *action = [=] { return RunGcJobs(*globals, *o); }; });
}

}  // namespace stemma::cli
