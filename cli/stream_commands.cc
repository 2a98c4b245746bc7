// watch, wait, logs: the commands that hold a server stream open.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/command.h"
#include "common/job_spec.h"
#include "common/status.h"

namespace stemma::cli {
namespace {

// How long a watch keeps trying to get a lost stream back (a coordinator restart) before
// giving up.
constexpr absl::Duration kReconnectFor = absl::Seconds(60);

struct FollowOptions {
  std::vector<std::string> ids;
  double timeout_s = 0;  // wait only; 0 = no limit
  bool quiet = false;    // wait: no event lines
};

// Ids or job names (the most recent job of that name) to ids; an unknown one is an error.
// Many at once are looked up in the job listing (a page per 1,000 jobs) when it is not much
// longer than the list asked for: `stemma wait` on 2,000 ids spent more on 2,000 GetJob round
// trips (each authenticated, over TLS) than the coordinator spent running the jobs.
absl::StatusOr<std::vector<std::string>> ResolveJobIds(CoordinatorClient& client,
                                                       std::vector<std::string> ids) {
  constexpr size_t kFew = 16;
  std::set<std::string> known_ids;
  std::map<std::string, std::string> latest;  // name -> id of its most recent job
  if (ids.size() > kFew) {
    v1::ListJobsRequest request;
    request.set_page_size(1000);
    request.set_mine(true);  // a name is the caller's job: another user's newer one is not it
    for (bool first = true;; first = false) {
      ASSIGN_OR_RETURN(v1::ListJobsResponse page, client.ListJobs(request));
      if (first && page.total() > static_cast<int64_t>(8 * ids.size() + 1000)) {
        break;  // a long listing for a few ids: one lookup each is cheaper
      }
      for (const v1::Job& job : page.jobs()) {  // in submission order
        known_ids.insert(job.id());
        if (!job.spec().name().empty()) latest[job.spec().name()] = job.id();
      }
      if (page.next_page_token().empty()) break;
      request.set_page_token(page.next_page_token());
    }
  }
  for (auto& id : ids) {
    if (known_ids.count(id)) continue;  // an id first, as GetJob does
    if (auto it = latest.find(id); it != latest.end()) {
      id = it->second;
      continue;
    }
    ASSIGN_OR_RETURN(v1::Job job, client.GetJob(id));  // names the unknown one
    id = job.id();
  }
  return ids;
}

// Watches `ids` (every job when empty), printing events unless quiet. With ids, returns
// when all are terminal: 0 if all SUCCEEDED, else 1 (wait also names the failures on
// stderr). Reconnects after a lost stream; the first connection must succeed.
absl::StatusOr<int> Follow(const GlobalOptions& g, const FollowOptions& given) {
  // Job names stand for the most recent job of that name: resolved to ids once, here (which
  // also names an unknown id at once; the coordinator watches unknown ids silently).
  FollowOptions o = given;
  {
    CoordinatorClient client(g.coordinator, g.timeout());
    ASSIGN_OR_RETURN(o.ids, ResolveJobIds(client, o.ids));
  }
  v1::WatchRequest request;
  for (const auto& id : o.ids) request.add_job_ids(id);
  request.set_send_initial(true);
  const absl::Time deadline =
      o.timeout_s > 0 ? absl::Now() + absl::Seconds(o.timeout_s) : absl::InfiniteFuture();

  std::set<std::string> pending(o.ids.begin(), o.ids.end());
  std::map<std::string, v1::Job> finished;
  auto on_event = [&](const v1::JobEvent& event) {
    const v1::Job& job = event.job();
    if (!o.quiet) {
      if (g.format == OutputFormat::kJson) {
        std::cout << EventToJson(event, NowMs()).dump() << std::endl;
      } else if (g.format == OutputFormat::kYaml) {
        std::cout << "---\n" << JsonToYaml(EventToJson(event, NowMs())) << std::flush;
      } else {
        std::cout << RenderEventLine(event, NowMs()) << std::endl;
      }
    }
    if (IsTerminal(job.state()) && pending.erase(job.id()) > 0) finished[job.id()] = job;
    // A retried job leaves its terminal state again.
    if (!IsTerminal(job.state()) && finished.erase(job.id()) > 0) pending.insert(job.id());
    return o.ids.empty() || !pending.empty();
  };

  int64_t received = 0;
  absl::Time lost_since = absl::InfiniteFuture();
  absl::Duration backoff = absl::Milliseconds(200);
  while (true) {
    int64_t before = received;
    // A new connection each time, so a reconnect does not wait out gRPC's backoff.
    CoordinatorClient client(g.coordinator, g.timeout());
    absl::Status status = client.Watch(request, on_event, deadline, &received);
    if (!o.ids.empty() && pending.empty()) break;
    if (status.code() == absl::StatusCode::kDeadlineExceeded && absl::Now() >= deadline) {
      std::vector<std::string> left(pending.begin(), pending.end());
      return absl::DeadlineExceededError(
          absl::StrCat("timed out after ", absl::FormatDuration(absl::Seconds(o.timeout_s)),
                       " waiting for ", absl::StrJoin(left, ", ")));
    }
    bool lost = status.ok() || status.code() == absl::StatusCode::kUnavailable ||
                status.code() == absl::StatusCode::kCancelled;
    // Errors the coordinator means (NOT_FOUND for an unknown id, ...) and a coordinator that
    // was never reached are final.
    if (!lost || received == 0) {
      if (status.ok()) return absl::UnavailableError("the coordinator ended the watch");
      return status;
    }
    if (received > before) {
      lost_since = absl::Now();
      backoff = absl::Milliseconds(200);
    }
    if (absl::Now() - lost_since > kReconnectFor) {
      if (status.ok()) return absl::UnavailableError("the coordinator ended the watch");
      return status;
    }
    absl::SleepFor(std::min(backoff, deadline - absl::Now()));
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }

  int rc = 0;
  for (const auto& [id, job] : finished) {
    if (job.state() == v1::SUCCEEDED) continue;
    rc = 1;
    if (o.quiet) {
      std::string line = absl::StrCat("stemma: error: job ", id);
      if (!job.spec().name().empty()) absl::StrAppend(&line, " (", job.spec().name(), ")");
      absl::StrAppend(&line, " ", StateName(job.state()));
      if (!job.reason().empty()) absl::StrAppend(&line, ": ", job.reason());
      std::cerr << line << "\n";
    }
  }
  return rc;
}

struct LogsOptions {
  std::string id;
  bool follow = false;
  int attempt = 0;
  int rank = -1;  // -1: not given (rank 0's, the job's log)
};

// Job output as it is: into a file or pipe byte for byte; on a terminal through the guard
// (cli/output.h), so that a job's escape sequences do not drive the terminal.
void WriteLog(const std::string& data) {
  static const bool terminal = ::isatty(STDOUT_FILENO) != 0;
  if (terminal) {
    std::cout << data << std::flush;
    return;
  }
  std::fwrite(data.data(), 1, data.size(), stdout);
  std::fflush(stdout);
}

// With --follow, a lost stream (a coordinator restart) is opened again, as `watch` does, and
// what was printed already (bytes per attempt) is skipped: the coordinator streams each
// attempt's log from its start.
absl::StatusOr<int> RunLogs(const GlobalOptions& g, const LogsOptions& o) {
  if (o.attempt < 0) return UsageError("--attempt must be 0 (all) or an attempt number");
  if (o.rank < -1) return UsageError("--rank must be a rank of the job (0, 1, ...)");
  v1::LogsRequest request;
  {
    CoordinatorClient client(g.coordinator, g.timeout());
    ASSIGN_OR_RETURN(v1::Job job, client.GetJob(o.id));  // an id or a job name
    request.set_job_id(job.id());
  }
  request.set_follow(o.follow);
  request.set_attempt(o.attempt);
  if (o.rank >= 0) request.set_rank(o.rank);
  std::map<std::string, size_t> printed;  // attempt id -> bytes printed
  absl::Time last_progress = absl::Now();
  absl::Duration backoff = absl::Milliseconds(200);
  for (bool first = true;; first = false) {
    std::map<std::string, size_t> seen;  // on this stream
    bool progress = false;
    CoordinatorClient client(g.coordinator, g.timeout());
    absl::Status status = client.Logs(request, [&](const v1::LogChunk& chunk) {
      size_t& at = seen[chunk.attempt_id()];
      size_t& done = printed[chunk.attempt_id()];
      const std::string& data = chunk.data();
      const size_t skip = done > at ? std::min(done - at, data.size()) : 0;
      at += data.size();
      if (skip < data.size()) {
        WriteLog(data.substr(skip));
        done = at;
      }
      progress = true;
    });
    if (!o.follow) return status.ok() ? absl::StatusOr<int>(0) : status;
    const bool lost = status.ok() || status.code() == absl::StatusCode::kUnavailable ||
                      status.code() == absl::StatusCode::kCancelled;
    if (!lost || (first && !status.ok() && !progress)) return status;
    if (status.ok()) {
      // The stream ends when the job does, or when the coordinator stops.
      auto job = client.GetJob(request.job_id());
      if (job.ok() && IsTerminal(job->state())) return 0;
      if (!job.ok() && job.status().code() != absl::StatusCode::kUnavailable) {
        return job.status();
      }
    }
    if (progress) {
      last_progress = absl::Now();
      backoff = absl::Milliseconds(200);
    }
    if (absl::Now() - last_progress > kReconnectFor) {
      return status.ok() ? absl::UnavailableError("the coordinator ended the log stream") : status;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

}  // namespace

void AddStreamCommands(CLI::App* app, const GlobalOptions* globals, Action* action) {
  {
    auto o = std::make_shared<FollowOptions>();
    CLI::App* sub = app->add_subcommand(
        "watch", "Print job state changes; with ids, exit when all have finished");
    sub->add_option("ids", o->ids, "job ids (none: every job, until Ctrl-C)");
    sub->callback([=] { *action = [=] { return Follow(*globals, *o); }; });
  }
  {
    auto o = std::make_shared<FollowOptions>();
    o->quiet = true;
    CLI::App* sub =
        app->add_subcommand("wait", "Wait until jobs finish: exit 0 if all succeeded, 1 otherwise");
    sub->add_option("ids", o->ids, "job ids")->required();
    sub->add_option("--timeout-s", o->timeout_s, "give up after this many seconds (0: never)");
    sub->callback([=] { *action = [=] { return Follow(*globals, *o); }; });
  }
  {
    auto o = std::make_shared<LogsOptions>();
    CLI::App* sub = app->add_subcommand("logs", "Print a job's output");
    sub->add_option("id", o->id, "job id")->required();
    sub->add_flag("-f,--follow", o->follow, "keep streaming until the job ends");
    sub->add_option("--attempt", o->attempt, "only this attempt number (default: all)");
    sub->add_option("--rank", o->rank,
                    "the log of this engine process (its RANK) of a job with several "
                    "(default: 0, the job's log)");
    sub->callback([=] { *action = [=] { return RunLogs(*globals, *o); }; });
  }
}

}  // namespace stemma::cli
