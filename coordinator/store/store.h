// Durable coordinator state. Two backends share one interface and one test suite:
// SqliteStore (production) and MemoryStore (fast, deterministic tests).
//
// The coordinator keeps its working set in memory and uses the store for durability:
// Load() once at start-up, then Commit() of batches of records. A committed batch is one
// transaction: all of it survives a crash, or none of it does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stemma/v1/job.pb.h"
#include "stemma/v1/user_service.pb.h"

namespace stemma::coordinator {

// A set of upserts applied atomically. Later puts of the same key win.
struct StoreBatch {
  std::vector<v1::Job> jobs;
  std::vector<v1::WorkerInfo> workers;
  std::vector<std::pair<std::string, std::vector<std::string>>> idempotency_keys;

  bool empty() const { return jobs.empty() && workers.empty() && idempotency_keys.empty(); }
  size_t size() const { return jobs.size() + workers.size() + idempotency_keys.size(); }
};

struct StoreSnapshot {
  std::vector<v1::Job> jobs;  // in submission order (seq)
  std::vector<v1::WorkerInfo> workers;
  std::vector<std::pair<std::string, std::vector<std::string>>> idempotency_keys;
};

// Not thread-safe: the coordinator's committer is the only caller after start-up.
class Store {
 public:
  virtual ~Store() = default;
  // Everything committed so far.
  virtual absl::StatusOr<StoreSnapshot> Load() = 0;
  // One transaction, durable when this returns OK. On error nothing of the batch is kept.
  virtual absl::Status Commit(const StoreBatch& batch) = 0;
  // "ok", or what the backend's consistency check found.
  virtual absl::StatusOr<std::string> IntegrityCheck() = 0;
};

// Opens (creating and migrating as needed) the database at `path`.
// WAL, synchronous=FULL, BEGIN IMMEDIATE, busy timeout. Errors name the file.
absl::StatusOr<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path);

// A store that lives in memory only (tests).
std::unique_ptr<Store> MakeMemoryStore();

// The schema version OpenSqliteStore migrates to.
inline constexpr int kSchemaVersion = 1;

}  // namespace stemma::coordinator
