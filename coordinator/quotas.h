// Quotas and fair share: what each subject (the owner of a job) and each project may hold,
// and how much of the cluster each subject has had lately.
//
// Limits, set by the admin in a YAML file (`stemma-coordinator --quotas FILE`, reloaded when
// it changes; docs/operator-guide.md § Quotas and fair share):
//   - max_queued_jobs: jobs waiting (PENDING or QUEUED) at once; a submit that would pass it
//     is refused whole, naming the limit;
//   - max_running_gpus: GPUs held by the subject's running attempts; a job that would pass it
//     waits QUEUED (one that could never fit is refused at submit);
//   - priority: [min, max] a job may ask for; outside it the submit is refused.
// A subject's limits are its own entry's, else the file's `default`; a project's
// max_queued_jobs / max_running_gpus bound the sum over its members as well. Projects and
// their members are listed once, in the projects file (`--projects`, tenancy.h): a quota
// file names projects of that file and sets their limits; `members` there is refused.
//
// Fair share (Slurm's decayed usage): each subject's usage is the worker time its attempts
// held, weighted by parts x max(1, GPUs), plus kMinChargeSeconds per attempt, decaying with
// the configured half-life; running attempts count as they run. Among QUEUED jobs of equal
// priority the scheduler takes the next job of the subject with the least usage (each job
// it places in a pass adds its minimum charge), so one subject's 20,000 jobs do not hold back
// another's one. The per-subject queues it reads are kept here, updated on every transition.
//
// Not thread-safe: the coordinator's mutex guards a Quotas (as it does the job table).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "coordinator/tenancy.h"
#include "stemma/v1/job.pb.h"

namespace stemma::coordinator {

// The subject a job belongs to ("" without authentication). The one place that knows where
// the owner is recorded on a job.
std::string JobOwner(const v1::Job& job);
std::string SpecOwner(const v1::JobSpec& spec);

struct QuotaLimits {
  std::optional<int64_t> max_queued_jobs;
  std::optional<int64_t> max_running_gpus;
  std::optional<std::pair<int64_t, int64_t>> priority;  // [min, max]
};

struct QuotaConfig {
  std::string source;  // the file, for messages ("" without one)
  bool fair_share = true;
  int64_t half_life_ms = 7LL * 24 * 3600 * 1000;  // Slurm's PriorityDecayHalfLife default
  QuotaLimits defaults;
  std::map<std::string, QuotaLimits> subjects;
  struct Project {
    std::vector<std::string> members;  // from the projects file
    QuotaLimits limits;                // max_queued_jobs and max_running_gpus only
  };
  std::map<std::string, Project> projects;
};

// Parses a quota file; each project's members come from `projects` (the projects file).
// INVALID_ARGUMENT "<source>: line L: <field>: <problem>" otherwise, including a project
// that `projects` does not list and a `members` field (the old place of the list).
absl::StatusOr<QuotaConfig> ParseQuotaConfig(const std::string& text, const std::string& source,
                                             const Tenancy& projects = Tenancy());

// A quota file on disk, re-read when it changes (checked at most once a second). Thread-
// compatible: the scheduler thread polls it.
class QuotaFile {
 public:
  // `projects`: the projects file's list (outlives this).
  QuotaFile(std::string path, const Tenancy* projects)
      : path_(std::move(path)), projects_(projects) {}
  // Reads and parses the file (start-up).
  absl::StatusOr<QuotaConfig> Load();
  // The new config when the file changed and parses; nothing otherwise (a bad edit is logged
  // once and the limits in force stay).
  std::optional<QuotaConfig> Poll(int64_t mono_ms);

 private:
  std::string path_;
  const Tenancy* projects_;
  int64_t checked_ms_ = 0;
  struct Stamp {
    int64_t ino = 0, size = 0, mtime_ns = 0;
    bool operator==(const Stamp& o) const {
      return ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
    }
  } stamp_;
};

class Quotas {
 public:
  // Each attempt costs at least this much usage (start-up is not free, and a pass that
  // places several jobs spreads them over subjects).
  static constexpr double kMinChargeSeconds = 1.0;

  explicit Quotas(const Clock* clock) : clock_(clock) {}

  void SetConfig(QuotaConfig config);
  const QuotaConfig& config() const { return config_; }

  // Keeps the accounts and queues in step with the job table (also at load: from
  // JOB_STATE_UNSPECIFIED, rebuilding usage from the jobs' last attempts).
  void OnTransition(const v1::Job& job, v1::JobState from, v1::JobState to);

  // Whether `specs` (one submit request, defaults applied or not) fit the limits of their
  // owners. FAILED_PRECONDITION (queued jobs, GPUs) or INVALID_ARGUMENT (priority) naming
  // the job, the limit, its value and where it is set.
  absl::Status CheckSubmit(const std::vector<const v1::JobSpec*>& specs) const;

  // For the scheduler. QUEUED jobs by priority level (-priority, so the highest first), then
  // owner, then submission order.
  using OwnerQueue = std::set<std::pair<uint64_t, std::string>>;  // (seq, id)
  using Level = absl::flat_hash_map<std::string, OwnerQueue>;
  const std::map<int, Level>& levels() const { return levels_; }
  // The owner's usage now (decayed, running attempts included), in weighted seconds.
  double Usage(const std::string& owner, int64_t now_ms) const;
  // How many more GPUs the owner (by its own limit) or the project may take now; a large
  // number when unlimited.
  int64_t OwnerGpuHeadroom(const std::string& owner) const;
  int64_t ProjectGpuHeadroom(const std::string& project) const;
  // Whether any GPU limit is set (otherwise GpuHeadroom need not be asked).
  bool HasGpuLimits() const { return gpu_limits_; }
  // The projects an owner belongs to.
  const std::vector<std::string>* ProjectsOf(const std::string& owner) const;

  // The weight of a job in usage and fair share: parts x max(1, GPUs).
  static int64_t Weight(const v1::JobSpec& spec);

 private:
  struct Account {
    int64_t waiting = 0;       // PENDING + QUEUED
    int64_t running_gpus = 0;  // GPUs of ASSIGNED/RUNNING parts
    int64_t running_weight = 0;
    int64_t running_start_sum = 0;  // sum of weight x assigned_ms over running attempts
    double usage = 0;               // finished attempts, decayed to usage_ms
    int64_t usage_ms = 0;
  };
  void Charge(Account& a, double amount, int64_t at_ms, int64_t now_ms) const;
  QuotaLimits LimitsOf(const std::string& owner, std::string* where) const;
  void RebuildProjects();

  const Clock* clock_;
  QuotaConfig config_;
  bool gpu_limits_ = false;
  absl::flat_hash_map<std::string, Account> accounts_;
  std::map<int, Level> levels_;
  absl::flat_hash_map<std::string, std::vector<std::string>> projects_of_;
  absl::flat_hash_map<std::string, int64_t> project_waiting_;
  absl::flat_hash_map<std::string, int64_t> project_gpus_;
};

}  // namespace stemma::coordinator
