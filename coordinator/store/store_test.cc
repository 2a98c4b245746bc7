// One suite, both backends.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "coordinator/store/store.h"

namespace stemma::coordinator {
namespace {

struct Backend {
  std::string name;
  bool sqlite;
};
// Test names and ctest listings show the backend, not the struct's bytes.
void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

class StoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("stemma-store-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    store_ = Open();
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::unique_ptr<Store> Open() {
    if (!GetParam().sqlite) return MakeMemoryStore();
    auto s = OpenSqliteStore((dir_ / "stemma.db").string());
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }
  // Memory stores forget on reopen; SQLite ones must not.
  void Reopen() {
    if (GetParam().sqlite) {
      store_.reset();
      store_ = Open();
    }
  }

  static v1::Job MakeJob(const std::string& id, uint64_t seq, v1::JobState state) {
    v1::Job j;
    j.set_id(id);
    j.set_seq(seq);
    j.set_state(state);
    j.mutable_spec()->set_name("job " + id);
    j.mutable_spec()->mutable_noop()->set_duration_ms(5);
    return j;
  }

  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreTest, EmptyStoreLoadsNothing) {
  auto snap = store_->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_TRUE(snap->of<JobsTable>().empty());
  EXPECT_TRUE(snap->of<WorkersTable>().empty());
}

TEST_P(StoreTest, CommittedRecordsSurviveReopenInSubmissionOrder) {
  StoreBatch b;
  b.of<JobsTable>().push_back(MakeJob("j-2", 2, v1::QUEUED));
  b.of<JobsTable>().push_back(MakeJob("j-1", 1, v1::PENDING));
  v1::WorkerInfo w;
  w.set_id("w0");
  w.set_cpus(8);
  w.add_gpus()->set_id(3);
  b.of<WorkersTable>().push_back(w);
  b.of<IdempotencyKeysTable>().push_back({"key-1", {"j-1", "j-2"}});
  ASSERT_TRUE(store_->Commit(b).ok());
  Reopen();
  auto snap = store_->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->of<JobsTable>().size(), 2u);
  EXPECT_EQ(snap->of<JobsTable>()[0].id(), "j-1");
  EXPECT_EQ(snap->of<JobsTable>()[1].id(), "j-2");
  EXPECT_EQ(snap->of<JobsTable>()[1].state(), v1::QUEUED);
  EXPECT_EQ(snap->of<JobsTable>()[0].spec().name(), "job j-1");
  ASSERT_EQ(snap->of<WorkersTable>().size(), 1u);
  EXPECT_EQ(snap->of<WorkersTable>()[0].gpus(0).id(), 3);
  ASSERT_EQ(snap->of<IdempotencyKeysTable>().size(), 1u);
  EXPECT_EQ(snap->of<IdempotencyKeysTable>()[0].second, (std::vector<std::string>{"j-1", "j-2"}));
}

TEST_P(StoreTest, UpsertReplacesTheRecord) {
  StoreBatch b;
  b.of<JobsTable>().push_back(MakeJob("j-1", 1, v1::QUEUED));
  ASSERT_TRUE(store_->Commit(b).ok());
  b.of<JobsTable>()[0].set_state(v1::SUCCEEDED);
  b.of<JobsTable>()[0].set_attempts(2);
  ASSERT_TRUE(store_->Commit(b).ok());
  Reopen();
  auto snap = store_->Load();
  ASSERT_TRUE(snap.ok());
  ASSERT_EQ(snap->of<JobsTable>().size(), 1u);
  EXPECT_EQ(snap->of<JobsTable>()[0].state(), v1::SUCCEEDED);
  EXPECT_EQ(snap->of<JobsTable>()[0].attempts(), 2);
}

TEST_P(StoreTest, ManyJobsInOneTransaction) {
  StoreBatch b;
  for (int i = 1; i <= 5000; ++i) b.of<JobsTable>().push_back(MakeJob("j-" + std::to_string(i), i, v1::QUEUED));
  ASSERT_TRUE(store_->Commit(b).ok());
  Reopen();
  auto snap = store_->Load();
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->of<JobsTable>().size(), 5000u);
  EXPECT_EQ(snap->of<JobsTable>().back().id(), "j-5000");
  auto check = store_->IntegrityCheck();
  ASSERT_TRUE(check.ok());
  EXPECT_EQ(*check, "ok");
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest,
                         ::testing::Values(Backend{"memory", false}, Backend{"sqlite", true}),
                         [](const auto& info) { return info.param.name; });

TEST(SqliteStore, UnwritablePathIsNamed) {
  auto s = OpenSqliteStore("/proc/definitely/not/here/stemma.db");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("/proc/definitely/not/here/stemma.db"), std::string::npos)
      << s.status();
}

TEST(SqliteStore, NotADatabaseIsRefused) {
  auto path = std::filesystem::temp_directory_path() / ("stemma-garbage-" + std::to_string(::getpid()));
  {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("this is not a sqlite database, just some text that is long enough to matter..", f);
    std::fclose(f);
  }
  auto s = OpenSqliteStore(path.string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(path.string()), std::string::npos) << s.status();
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace stemma::coordinator
