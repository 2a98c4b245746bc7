// Durable coordinator state. Two backends share one interface and one test suite:
// SqliteStore (production) and MemoryStore (fast, deterministic tests).
//
// The coordinator keeps its working set (the state tables of store/tables.h) in memory and
// uses the store for durability: Load() once at start-up, then Commit() of batches of
// records. A committed batch is one transaction: all of it survives a crash, or none of it
// does. Series tables (metric points) are written the same way but never loaded; queries
// read them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/store/tables.h"

namespace stemma::coordinator {

// Which metric points ReadMetrics returns.
struct MetricQuery {
  std::vector<std::string> job_ids;  // in this order
  std::string name_pattern;          // fnmatch(3) glob over names; empty: every name
  bool last_only = false;            // only the last point of each (job, name)
  size_t limit = 100000;             // at most this many points
};

// Load, Commit and IntegrityCheck are not thread-safe: the coordinator's committer is the
// only caller after start-up. ReadMetrics may be called from any thread, also while a
// Commit runs; it sees committed transactions only.
class Store {
 public:
  virtual ~Store() = default;
  // Every state table's committed rows.
  virtual absl::StatusOr<StoreSnapshot> Load() = 0;
  // One transaction, durable when this returns OK. On error nothing of the batch is kept.
  virtual absl::Status Commit(const StoreBatch& batch) = 0;
  // OK when the store can take new work now; RESOURCE_EXHAUSTED ("the coordinator's disk is
  // full ...") when its disk is (nearly) full. Callers that add work (a submit) ask first and
  // change nothing when refused. A store that found its disk full keeps answering so until
  // space returns. Thread-safe; cheap (one statvfs).
  virtual absl::Status CheckWritable() { return absl::OkStatus(); }
  // "ok", or what the backend's consistency check found.
  virtual absl::StatusOr<std::string> IntegrityCheck() = 0;
  // Metric points of the given jobs, per job in the order asked, then in the order they
  // were committed. `*truncated` (optional) tells whether the limit cut the answer.
  virtual absl::StatusOr<std::vector<v1::MetricPoint>> ReadMetrics(const MetricQuery& query,
                                                                   bool* truncated) = 0;
};

// Opens (creating and migrating as needed) the database at `path`.
// WAL, synchronous=FULL, BEGIN IMMEDIATE, busy timeout. Errors name the file.
// Disk full: the store keeps a reserve file beside the database (PATH.reserve, 8 MiB) and
// CheckWritable refuses new work while less than 4 MiB is free. A commit that still meets
// a full disk (SQLITE_FULL) gives the reserve back and is tried again, so a change already
// made in memory becomes durable rather than half-kept; the reserve is made again once
// there is room for it and the margin.
absl::StatusOr<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path);

// A store that lives in memory only (tests).
std::unique_ptr<Store> MakeMemoryStore();

// True when `name` matches the ReadMetrics pattern (empty matches everything).
bool MetricNameMatches(const std::string& pattern, const std::string& name);
// Appends a run's points (with last_only, its last point) to `out` while the query's limit
// allows; false when the limit cut it.
bool AppendRunPoints(const MetricRun& run, const MetricQuery& query,
                     std::vector<v1::MetricPoint>* out);

}  // namespace stemma::coordinator
