// watch, wait, logs: the commands that hold a server stream open.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
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
  double timeout_s = 0;          // 0 = no limit (or the global --timeout)
  double legacy_timeout_s = 0;   // wait --timeout-s (deprecated)
  bool quiet = false;            // wait: no event lines
  double progress_every_s = 30;  // watch into a file or pipe: a progress line per job this often
};

// `watch` for people: a line per state change; progress in place on a terminal (one line,
// rewritten), else at most one line per job every `every_s`. JSON and YAML get every event.
class EventPrinter {
 public:
  EventPrinter(OutputFormat format, double every_s)
      : format_(format),
        every_ms_(static_cast<int64_t>(every_s * 1000)),
        terminal_(::isatty(STDOUT_FILENO) != 0) {}
  ~EventPrinter() { EndInPlace(); }

  void Print(const v1::JobEvent& event) {
    if (format_ == OutputFormat::kJson) {
      std::cout << EventToJson(event, NowMs()).dump() << std::endl;
      return;
    }
    if (format_ == OutputFormat::kYaml) {
      std::cout << "---\n" << JsonToYaml(EventToJson(event, NowMs())) << std::flush;
      return;
    }
    const std::string line = RenderEventLine(event, NowMs());
    if (event.previous() != event.job().state()) {  // a transition
      EndInPlace();
      std::cout << line << std::endl;
      return;
    }
    if (terminal_) {  // progress: rewrite the line in place
      std::cout << "\r" << line;
      if (line.size() < in_place_) std::cout << std::string(in_place_ - line.size(), ' ');
      std::cout << std::flush;
      in_place_ = std::max<size_t>(line.size(), 1);
      return;
    }
    const int64_t now = NowMs();
    int64_t& last = last_progress_[event.job().id()];
    if (now - last < every_ms_) return;
    last = now;
    std::cout << line << std::endl;
  }

 private:
  void EndInPlace() {
    if (in_place_ == 0) return;
    std::cout << "\r" << std::string(in_place_, ' ') << "\r" << std::flush;
    in_place_ = 0;
  }
  OutputFormat format_;
  int64_t every_ms_;
  bool terminal_;
  size_t in_place_ = 0;  // width of the progress line on the terminal now (0: none)
  std::map<std::string, int64_t> last_progress_;
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
  const double timeout_s = g.WaitTimeout(o.timeout_s > 0 ? o.timeout_s : o.legacy_timeout_s);
  const absl::Time deadline =
      timeout_s > 0 ? absl::Now() + absl::Seconds(timeout_s) : absl::InfiniteFuture();

  std::set<std::string> pending(o.ids.begin(), o.ids.end());
  std::map<std::string, v1::Job> finished;
  EventPrinter printer(g.format, o.progress_every_s);
  auto on_event = [&](const v1::JobEvent& event) {
    const v1::Job& job = event.job();
    if (!o.quiet) printer.Print(event);
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
      return WaitTimedOut(absl::StrCat("timed out after ",
                                       absl::FormatDuration(absl::Seconds(timeout_s)),
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
  int tail = -1;  // -1: everything
  double since_s = 0;
  bool timestamps = false;
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

// --timestamps: each line starts with when the coordinator received it.
class LogWriter {
 public:
  explicit LogWriter(bool timestamps) : timestamps_(timestamps) {}
  void Write(const v1::LogChunk& chunk, std::string_view data) {
    if (!timestamps_) {
      WriteLog(std::string(data));
      return;
    }
    bool& at_start = line_start_.try_emplace(chunk.attempt_id(), true).first->second;
    const std::string stamp =
        chunk.time_ms() > 0
            ? absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::FromUnixMillis(chunk.time_ms()),
                               absl::UTCTimeZone())
            : std::string("- ");
    std::string out;
    for (char c : data) {
      if (at_start) out += stamp;
      out += c;
      at_start = c == '\n';
    }
    WriteLog(out);
  }

 private:
  bool timestamps_;
  std::map<std::string, bool> line_start_;  // attempt id -> the next byte starts a line
};

// With --follow, a lost stream (a coordinator restart) is opened again, as `watch` does, and
// what was printed already (bytes per attempt) is skipped: the coordinator streams each
// attempt's log from its start (or, with --tail or --since, from what arrived after the
// last chunk printed).
absl::StatusOr<int> RunLogs(const GlobalOptions& g, const LogsOptions& o) {
  if (o.attempt < 0) return UsageError("--attempt must be 0 (all) or an attempt number");
  if (o.rank < -1) return UsageError("--rank must be a rank of the job (0, 1, ...)");
  if (o.tail < -1) return UsageError("--tail must be a number of lines (0 or more)");
  v1::LogsRequest request;
  {
    CoordinatorClient client(g.coordinator, g.timeout());
    ASSIGN_OR_RETURN(v1::Job job, client.GetJob(o.id));  // an id or a job name
    request.set_job_id(job.id());
  }
  request.set_follow(o.follow);
  request.set_attempt(o.attempt);
  if (o.rank >= 0) request.set_rank(o.rank);
  if (o.tail >= 0) request.set_tail_lines(o.tail == 0 ? -1 : o.tail);
  if (o.since_s > 0) request.set_since_ms(NowMs() - static_cast<int64_t>(o.since_s * 1000));
  const bool windowed = o.tail >= 0 || o.since_s > 0;
  LogWriter writer(o.timestamps);
  std::map<std::string, size_t> printed;  // attempt id -> bytes printed
  int64_t last_time_ms = 0;
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
      const size_t skip = !windowed && done > at ? std::min(done - at, data.size()) : 0;
      at += data.size();
      if (skip < data.size()) {
        writer.Write(chunk, std::string_view(data).substr(skip));
        done = at;
      }
      last_time_ms = std::max(last_time_ms, chunk.time_ms());
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
    if (windowed && last_time_ms > 0) {  // go on after what was printed
      request.set_tail_lines(0);
      request.set_since_ms(last_time_ms + 1);
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
  constexpr const char* kTimeoutHelp =
      "give up after this long: seconds or 90s, 10m, 2h (default: no limit); exit 5";
  {
    auto o = std::make_shared<FollowOptions>();
    CLI::App* sub = app->add_subcommand(
        "watch",
        "Print job state changes (a line each; progress in place on a terminal); with ids, "
        "exit when all have finished");
    sub->add_option("ids", o->ids, "job ids (none: every job, until Ctrl-C)");
    sub->add_option("--timeout", o->timeout_s, kTimeoutHelp)->transform(DurationFlag());
    sub->add_option("--progress-every", o->progress_every_s,
                    "into a file or pipe: at most one progress line per job this often "
                    "(default 30s)")
        ->transform(DurationFlag());
    sub->callback([=] { *action = [=] { return Follow(*globals, *o); }; });
  }
  {
    auto o = std::make_shared<FollowOptions>();
    o->quiet = true;
    CLI::App* sub = app->add_subcommand(
        "wait",
        "Wait until jobs finish: exit 0 if all succeeded, 1 if one did not, 5 on --timeout");
    sub->add_option("ids", o->ids, "job ids")->required();
    sub->add_option("--timeout", o->timeout_s, kTimeoutHelp)->transform(DurationFlag());
    sub->add_option("--timeout-s", o->legacy_timeout_s, "deprecated: --timeout")
        ->group("")
        ->each([](const std::string&) {
          std::cerr << "stemma: warning: wait --timeout-s is deprecated: use --timeout\n";
        });
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
    sub->add_option("--tail", o->tail, "only the last N lines (of each attempt)");
    sub->add_option("--since", o->since_s,
                    "only what arrived in this last while: 90s, 10m, 2h (the coordinator's "
                    "receive times)")
        ->transform(DurationFlag());
    sub->add_flag("--timestamps", o->timestamps,
                  "start each line with the time the coordinator received it (UTC, RFC 3339)");
    sub->callback([=] { *action = [=] { return RunLogs(*globals, *o); }; });
  }
}

}  // namespace stemma::cli
