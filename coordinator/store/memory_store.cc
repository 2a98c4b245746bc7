#include <map>

#include "coordinator/store/store.h"

namespace stemma::coordinator {
namespace {

// Thread-compatible, like every Store.
class MemoryStore final : public Store {
 public:
  absl::StatusOr<StoreSnapshot> Load() override {
    StoreSnapshot snap;
    std::vector<const v1::Job*> jobs;
    for (const auto& [id, job] : jobs_) jobs.push_back(&job);
    std::sort(jobs.begin(), jobs.end(),
              [](const v1::Job* a, const v1::Job* b) { return a->seq() < b->seq(); });
    for (const auto* j : jobs) snap.jobs.push_back(*j);
    for (const auto& [id, w] : workers_) snap.workers.push_back(w);
    for (const auto& kv : keys_) snap.idempotency_keys.push_back(kv);
    return snap;
  }

  absl::Status Commit(const StoreBatch& batch) override {
    for (const auto& j : batch.jobs) jobs_[j.id()] = j;
    for (const auto& w : batch.workers) workers_[w.id()] = w;
    for (const auto& [k, ids] : batch.idempotency_keys) keys_[k] = ids;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> IntegrityCheck() override { return std::string("ok"); }

 private:
  std::map<std::string, v1::Job> jobs_;
  std::map<std::string, v1::WorkerInfo> workers_;
  std::map<std::string, std::vector<std::string>> keys_;
};

}  // namespace

std::unique_ptr<Store> MakeMemoryStore() { return std::make_unique<MemoryStore>(); }

}  // namespace stemma::coordinator
