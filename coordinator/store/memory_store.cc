#include <fnmatch.h>

#include <algorithm>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/store/store.h"

namespace stemma::coordinator {

bool MetricNameMatches(const std::string& pattern, const std::string& name) {
  return pattern.empty() || ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

bool AppendRunPoints(const MetricRun& run, const MetricQuery& query,
                     std::vector<v1::MetricPoint>* out) {
  if (run.size() == 0) return true;
  for (size_t i = query.last_only ? run.size() - 1 : 0; i < run.size(); ++i) {
    if (out->size() >= query.limit) return false;
    out->push_back(MetricPointsTable::Point(run, i));
  }
  return true;
}

namespace {

// State tables keep one record per key; series tables every row in commit order.
template <typename T, bool = T::kKind == TableKind::kState>
struct MemoryTable {
  std::map<typename T::Key, typename T::Record> rows;
  void Put(const typename T::Record& r) { rows[T::KeyOf(r)] = r; }
  void LoadInto(std::vector<typename T::Record>* out) const {
    for (const auto& [key, r] : rows) out->push_back(r);
    std::stable_sort(out->begin(), out->end(), &T::LoadsBefore);
  }
};
template <typename T>
struct MemoryTable<T, false> {
  std::vector<typename T::Record> rows;
  void Put(const typename T::Record& r) { rows.push_back(r); }
  void LoadInto(std::vector<typename T::Record>*) const {}
};

template <typename List>
struct MemoryTables;
template <typename... T>
struct MemoryTables<TableList<T...>> {
  std::tuple<MemoryTable<T>...> tables;
  template <typename Table>
  MemoryTable<Table>& of() {
    return std::get<internal::IndexOf<Table, T...>()>(tables);
  }
};

// Thread-compatible like every Store, and ReadMetrics thread-safe (one mutex for all).
class MemoryStore final : public Store {
 public:
  absl::StatusOr<StoreSnapshot> Load() override {
    absl::MutexLock lock(&mu_);
    StoreSnapshot snap;
    snap.ForEach([&](auto table, auto& rows) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // under mu_
      tables_.of<decltype(table)>().LoadInto(&rows);
    });
    return snap;
  }

  absl::Status Commit(const StoreBatch& batch) override {
    absl::MutexLock lock(&mu_);
    batch.ForEach([&](auto table, const auto& rows) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // under mu_
      auto& t = tables_.of<decltype(table)>();
      for (const auto& r : rows) t.Put(r);
    });
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> IntegrityCheck() override { return std::string("ok"); }

  absl::StatusOr<std::vector<v1::MetricPoint>> ReadMetrics(const MetricQuery& query,
                                                           bool* truncated) override {
    absl::MutexLock lock(&mu_);
    std::vector<v1::MetricPoint> out;
    bool cut = false;
    const auto& rows = tables_.of<MetricPointsTable>().rows;
    for (const std::string& job : query.job_ids) {
      // Runs in commit order; with last_only the last run of each name, ordered by that
      // run's position (as the SQLite store orders them).
      std::vector<size_t> hits;
      absl::flat_hash_map<std::string, size_t> last;  // name -> position of its last run
      for (size_t i = 0; i < rows.size(); ++i) {
        const MetricRun& r = rows[i];
        if (r.job_id != job || !MetricNameMatches(query.name_pattern, r.name)) continue;
        if (query.last_only) {
          last[r.name] = i;
        } else {
          hits.push_back(i);
        }
      }
      for (const auto& [name, i] : last) hits.push_back(i);
      std::sort(hits.begin(), hits.end());
      for (size_t i : hits) {
        if (!AppendRunPoints(rows[i], query, &out)) {
          cut = true;
          break;
        }
      }
      if (cut) break;
    }
    if (truncated) *truncated = cut;
    return out;
  }

 private:
  absl::Mutex mu_;
  MemoryTables<DurableTables> tables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Store> MakeMemoryStore() { return std::make_unique<MemoryStore>(); }

}  // namespace stemma::coordinator
