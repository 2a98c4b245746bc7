// The committer (coordinator/committer.h) over a recording store: batching, order, retries.
#include "coordinator/coordinator_test_fixture.h"

namespace stemma::coordinator {
namespace {

// commits.
class RecordingStore : public Store {
 public:
  absl::StatusOr<StoreSnapshot> Load() override { return StoreSnapshot{}; }
  absl::Status Commit(const StoreBatch& batch) override {
    absl::MutexLock l(&mu_);
    for (const auto& j : batch.of<JobsTable>()) committed_.push_back(j.id());
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> IntegrityCheck() override { return std::string("ok"); }
  absl::StatusOr<std::vector<v1::MetricPoint>> ReadMetrics(const MetricQuery&, bool*) override {
    return std::vector<v1::MetricPoint>();
  }
  std::vector<std::string> committed() {
    absl::MutexLock l(&mu_);
    return committed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> committed_;
};

TEST(CommitterTest, ALazyRecordAddedWhileIdleIsCommittedWithoutCompany) {
  // Nothing waits for a lazy record (a job going RUNNING), but it must still reach the
  // store about kLazyCommitMs later, also when the committer was idle with no deadline.
  RecordingStore store;
  absl::Mutex mu;
  uint64_t durable = 0;
  Committer committer(&store, nullptr, [&](uint64_t t) {
    absl::MutexLock l(&mu);
    durable = t;
  });
  absl::SleepFor(absl::Milliseconds(20));  // let it go idle
  StoreBatch batch;
  batch.of<JobsTable>().emplace_back().set_id("j-7");
  const uint64_t ticket = committer.Add(std::move(batch), /*urgent=*/false);
  bool done = false;
  for (int i = 0; i < 2000 && !done; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
    absl::MutexLock l(&mu);
    done = durable >= ticket;
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(store.committed(), std::vector<std::string>{"j-7"});
}

TEST(CommitterTest, UrgentRecordsAndLaterLazyOnesKeepTheirOrderAndAllArrive) {
  RecordingStore store;
  Committer committer(&store, nullptr);
  StoreBatch a;
  a.of<JobsTable>().emplace_back().set_id("j-1");
  committer.Wait(committer.Add(std::move(a)));
  EXPECT_EQ(store.committed(), std::vector<std::string>{"j-1"});
  StoreBatch b;
  b.of<JobsTable>().emplace_back().set_id("j-2");
  const uint64_t lazy = committer.Add(std::move(b), /*urgent=*/false);
  committer.Wait(lazy);  // waiting makes it urgent
  EXPECT_EQ(store.committed(), (std::vector<std::string>{"j-1", "j-2"}));
}

// Fails the first `failures` commits, then takes them.
class FlakyStore : public RecordingStore {
 public:
  explicit FlakyStore(int failures) : failures_(failures) {}
  absl::Status Commit(const StoreBatch& batch) override {
    if (failures_.fetch_sub(1) > 0) return absl::UnavailableError("disk I/O error");
    return RecordingStore::Commit(batch);
  }

 private:
  std::atomic<int> failures_;
};

TEST(CommitterTest, AFailedCommitIsReportedToTheObserverAndRetriedUntilItSucceeds) {
  FlakyStore store(2);
  absl::Mutex mu;
  std::vector<bool> reported;
  Committer committer(&store, [&](double, size_t records, bool ok) {
    absl::MutexLock l(&mu);
    reported.push_back(ok);
    EXPECT_EQ(records, 1u);
  });
  StoreBatch batch;
  batch.of<JobsTable>().emplace_back().set_id("j-9");
  committer.Wait(committer.Add(std::move(batch)));
  EXPECT_EQ(store.committed(), std::vector<std::string>{"j-9"});
  absl::MutexLock l(&mu);
  EXPECT_EQ(reported, (std::vector<bool>{false, false, true}));
}

}  // namespace
}  // namespace stemma::coordinator
