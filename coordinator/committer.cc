#include "coordinator/committer.h"

#include <algorithm>
#include <chrono>

#include "common/logging.h"

namespace stemma::coordinator {
namespace {

int64_t SteadyUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Committer::Committer(Store* store, CommitObserver observer, DurableHook hook)
    : store_(store),
      observer_(std::move(observer)),
      hook_(std::move(hook)),
      thread_([this] { Loop(); }) {}

Committer::~Committer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

uint64_t Committer::Add(StoreBatch batch, bool urgent) {
  absl::MutexLock lock(&mu_);
  // The lambdas run inside ForEach, under mu_.
  batch.ForEach([this](auto table, auto& rows) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (!rows.empty()) pending_.of<decltype(table)>().Add(rows);
  });
  ++added_;
  if (urgent) {
    urgent_ = added_;
  } else if (lazy_deadline_us_ == kNoDeadline) {
    lazy_deadline_us_ = SteadyUs() + kLazyCommitMs * 1000;
  }
  return added_;
}

uint64_t Committer::LastTicket() {
  absl::MutexLock lock(&mu_);
  return added_;
}

void Committer::Wait(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  urgent_ = std::max(urgent_, ticket);
  struct Arg {
    const uint64_t* durable;
    uint64_t ticket;
  } arg{&durable_, ticket};
  mu_.Await(absl::Condition(
      +[](Arg* a) { return *a->durable >= a->ticket; }, &arg));
}

void Committer::Loop() {
  for (;;) {
    StoreBatch batch;
    uint64_t ticket;
    {
      absl::MutexLock lock(&mu_);
      // Commit when someone waits (or at stop); lazy records alone wait for company until
      // their deadline. The deadline is read afresh whenever it moves: a lazy record added
      // while the committer sleeps with no deadline must still go out kLazyCommitMs later.
      for (;;) {
        if (stop_ || urgent_ > durable_) break;
        const int64_t deadline = lazy_deadline_us_;
        const int64_t now = SteadyUs();
        if (added_ > durable_ && now >= deadline) break;
        auto wake = [this, &deadline]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || urgent_ > durable_ || lazy_deadline_us_ != deadline;
        };
        if (deadline == kNoDeadline) {
          mu_.Await(absl::Condition(&wake));
        } else {
          mu_.AwaitWithTimeout(absl::Condition(&wake), absl::Microseconds(deadline - now));
        }
      }
      if (added_ == durable_) {
        if (stop_) return;
        continue;
      }
      ticket = added_;
      batch.ForEach([this](auto table, auto& rows) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        pending_.of<decltype(table)>().TakeInto(&rows);
      });
      lazy_deadline_us_ = kNoDeadline;
    }
    // Retry until the store takes it: the in-memory state is already ahead of the disk,
    // and answering a caller before its change is durable would break the contract.
    for (int tries = 0;; ++tries) {
      auto start = std::chrono::steady_clock::now();
      absl::Status st = store_->Commit(batch);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (observer_) observer_(secs, batch.size(), st.ok());
      if (st.ok()) break;
      if (tries % 50 == 0) spdlog::error("store commit failed, retrying: {}", st.ToString());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    {
      absl::MutexLock lock(&mu_);
      durable_ = ticket;
    }
    if (hook_) hook_(ticket);
  }
}

}  // namespace stemma::coordinator
