// Group commit: every state change becomes durable in a store transaction, and bursts of
// changes share one transaction (one fsync).
//
// Callers add records under their own lock (so records reach the store in the order the
// changes were made) and get a ticket; they then wait for the ticket, or let the durable
// hook act on it: after every transaction the committer thread calls the hook with the
// highest durable ticket, so whatever was waiting on those records (messages to workers,
// watch events) goes out together. Records that nobody waits for (Add with urgent=false,
// e.g. a job going RUNNING) do not start a transaction of their own: they join the next
// one, at most kLazyCommitMs later. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/store/store.h"

namespace stemma::coordinator {

class Committer {
 public:
  // Called after each transaction with its duration and number of records, and after
  // each one that failed (ok=false; it is retried).
  using CommitObserver = std::function<void(double seconds, size_t records, bool ok)>;
  // Called on the committer thread after each transaction with the highest durable ticket.
  using DurableHook = std::function<void(uint64_t durable)>;

  Committer(Store* store, CommitObserver observer, DurableHook hook = nullptr);
  ~Committer();  // Stops after committing what was added.

  // How long records added with urgent=false may wait for a transaction to join.
  static constexpr int64_t kLazyCommitMs = 10;

  // Queues records for the next transaction. Later records for the same key replace
  // earlier ones that are not yet committed. Returns the ticket for these records.
  // urgent=false: nothing waits for them, so they may wait up to kLazyCommitMs for other
  // records (one fsync for both); a later Wait on the ticket makes it urgent.
  uint64_t Add(StoreBatch batch, bool urgent = true);
  // The ticket of everything added so far.
  uint64_t LastTicket();
  // Blocks until `ticket` is durable.
  void Wait(uint64_t ticket);

 private:
  void Loop();

  Store* const store_;
  CommitObserver observer_;
  DurableHook hook_;
  absl::Mutex mu_;
  uint64_t added_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t durable_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t urgent_ ABSL_GUARDED_BY(mu_) = 0;  // highest ticket someone waits for
  // When the oldest not-yet-taken lazy record must be committed at the latest, in
  // steady-clock microseconds (a wall-clock step must not hold it back); kNoDeadline when
  // no lazy record waits.
  static constexpr int64_t kNoDeadline = INT64_MAX;
  int64_t lazy_deadline_us_ ABSL_GUARDED_BY(mu_) = kNoDeadline;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Records not yet taken by a transaction, per durable table: state tables merged by key
  // (repeated updates of one job are written once), series tables appended.
  template <typename T, bool = T::kKind == TableKind::kState>
  struct PendingRows {
    absl::flat_hash_map<typename T::Key, typename T::Record> rows;
    void Add(std::vector<typename T::Record>& added) {
      for (auto& r : added) {
        auto key = T::KeyOf(r);
        rows.insert_or_assign(std::move(key), std::move(r));
      }
    }
    void TakeInto(std::vector<typename T::Record>* out) {
      out->reserve(rows.size());
      for (auto& [key, r] : rows) out->push_back(std::move(r));
      rows.clear();
    }
  };
  template <typename T>
  struct PendingRows<T, false> {
    std::vector<typename T::Record> rows;
    void Add(std::vector<typename T::Record>& added) {
      if (rows.empty()) {
        rows = std::move(added);
      } else {
        rows.insert(rows.end(), std::make_move_iterator(added.begin()),
                    std::make_move_iterator(added.end()));
      }
    }
    void TakeInto(std::vector<typename T::Record>* out) {
      *out = std::move(rows);
      rows.clear();
    }
  };
  template <typename List>
  struct Pending;
  template <typename... T>
  struct Pending<TableList<T...>> {
    std::tuple<PendingRows<T>...> tables;
    template <typename Table>
    PendingRows<Table>& of() {
      return std::get<internal::IndexOf<Table, T...>()>(tables);
    }
  };
  Pending<DurableTables> pending_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace stemma::coordinator
