// The worker table: registered workers, their resources and what is allocated on them,
// leases, and drain. Not thread-safe: the coordinator's mutex guards it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/store/store.h"
#include "stemma/v1/user_service.pb.h"

namespace stemma::coordinator {

// Resources held by one part of a live attempt.
struct Allocation {
  std::vector<int32_t> gpu_ids;
  double cpus = 0;
  int64_t memory_mb = 0;
};

// What heartbeats touch, kept apart from the rest so that a heartbeat never waits for the
// coordinator's main lock. Shared by the worker table and the heartbeat index.
struct Liveness {
  std::atomic<int64_t> last_heartbeat_mono{0};
  std::atomic<uint64_t> session{0};  // the open session's id (0: none)
  std::atomic<bool> lost{false};
};

struct WorkerEntry {
  v1::WorkerInfo info;     // as registered; state kept current
  bool connected = false;  // a session stream is open
  uint64_t session = 0;    // id of the open session
  std::shared_ptr<Liveness> live = std::make_shared<Liveness>();
  std::vector<bool> gpu_used;  // indexed like info.gpus()
  double cpus_used = 0;
  int64_t memory_used_mb = 0;
  std::map<std::string, Allocation> allocations;  // key: "<attempt id>/<rank>"

  bool schedulable() const { return connected && info.state() == v1::WORKER_ALIVE; }
  int free_gpus() const;
  double free_cpus() const { return info.cpus() - cpus_used; }
  int64_t free_memory_mb() const { return info.memory_mb() - memory_used_mb; }
};

class WorkerTable {
 public:
  void Load(const StoreSnapshot& snapshot, int64_t now_mono, int64_t grace_ms);

  WorkerEntry* Find(const std::string& id);
  const WorkerEntry* Find(const std::string& id) const;
  // Adds or refreshes a worker on registration. Keeps its allocations.
  WorkerEntry& Upsert(const v1::WorkerInfo& info);

  // Takes `gpus` whole GPUs (lowest ids first), cpus and memory on the worker.
  Allocation Allocate(WorkerEntry& w, const std::string& key, int gpus, double cpus,
                      int64_t memory_mb);
  // Restores a known allocation (start-up). Returns false if it no longer fits.
  bool Restore(WorkerEntry& w, const std::string& key, const Allocation& a);
  void Free(WorkerEntry& w, const std::string& key);

  // The worker's record as users see it (with what is in use).
  v1::WorkerInfo View(const WorkerEntry& w, int64_t now_mono) const;

  // Ordered by id (stable placement order and listings), with stable addresses.
  std::map<std::string, WorkerEntry>& all() { return workers_; }
  const std::map<std::string, WorkerEntry>& all() const { return workers_; }

 private:
  std::map<std::string, WorkerEntry> workers_;
};

inline std::string AllocationKey(const std::string& attempt_id, int rank) {
  return attempt_id + "/" + std::to_string(rank);
}

}  // namespace stemma::coordinator
