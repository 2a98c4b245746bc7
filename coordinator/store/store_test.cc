// One suite, both backends.
#include "coordinator/store/store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

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
  for (int i = 1; i <= 5000; ++i)
    b.of<JobsTable>().push_back(MakeJob("j-" + std::to_string(i), i, v1::QUEUED));
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

MetricRun SeriesRun(const std::string& job, const std::string& name,
                    std::vector<std::pair<int64_t, double>> points) {
  MetricRun r;
  r.job_id = job;
  r.attempt = 1;
  r.name = name;
  for (auto [step, value] : points) {
    r.steps.push_back(step);
    r.values.push_back(value);
    r.times_ms.push_back(1000 + step);
  }
  return r;
}

TEST_P(StoreTest, MetricPointsAreAppendedNotLoadedAndReadBack) {
  StoreBatch b;
  b.of<JobsTable>().push_back(MakeJob("j-1", 1, v1::RUNNING));
  b.of<MetricPointsTable>().push_back(SeriesRun("j-1", "loss", {{1, 2.5}, {2, 2.0}}));
  b.of<MetricPointsTable>().push_back(
      SeriesRun("j-1", "heldout_loss/uk", {{1, 3.0}, {2, 2.0}, {3, 1.0}}));
  b.of<MetricPointsTable>().push_back(SeriesRun("j-1", "loss", {{3, 1.5}}));
  auto labelled = SeriesRun("j-2", "belebele/uk", {{0, 0.61}});
  labelled.labels = {{"shots", "2"}, {"split", "test"}};
  b.of<MetricPointsTable>().push_back(labelled);
  ASSERT_TRUE(store_->Commit(b).ok());
  // The same point again is a second row: series are append-only.
  StoreBatch again;
  again.of<MetricPointsTable>().push_back(SeriesRun("j-1", "loss", {{3, 1.25}}));
  ASSERT_TRUE(store_->Commit(again).ok());
  Reopen();

  auto snap = store_->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->of<JobsTable>().size(), 1u);
  EXPECT_TRUE(snap->of<MetricPointsTable>().empty());  // not part of the working set

  MetricQuery all;
  all.job_ids = {"j-1"};
  auto points = store_->ReadMetrics(all, nullptr);
  ASSERT_TRUE(points.ok()) << points.status();
  ASSERT_EQ(points->size(), 7u);  // as committed: loss 1-2, heldout 1-3, loss 3, loss 3
  EXPECT_EQ((*points)[0].name(), "loss");
  EXPECT_EQ((*points)[0].step(), 1);
  EXPECT_DOUBLE_EQ((*points)[0].value(), 2.5);
  EXPECT_EQ((*points)[0].time_ms(), 1001);
  EXPECT_EQ((*points)[2].name(), "heldout_loss/uk");
  EXPECT_EQ((*points)[6].step(), 3);
  EXPECT_DOUBLE_EQ((*points)[6].value(), 1.25);

  MetricQuery heldout;
  heldout.job_ids = {"j-1"};
  heldout.name_pattern = "heldout_loss/*";
  points = store_->ReadMetrics(heldout, nullptr);
  ASSERT_TRUE(points.ok());
  ASSERT_EQ(points->size(), 3u);
  EXPECT_EQ((*points)[2].name(), "heldout_loss/uk");

  MetricQuery last;
  last.job_ids = {"j-2", "j-1"};
  last.last_only = true;
  points = store_->ReadMetrics(last, nullptr);
  ASSERT_TRUE(points.ok());
  ASSERT_EQ(points->size(), 3u);  // j-2's one name, then j-1's two
  EXPECT_EQ((*points)[0].job_id(), "j-2");
  EXPECT_EQ((*points)[0].labels().at("shots"), "2");
  EXPECT_EQ((*points)[0].labels().at("split"), "test");
  EXPECT_EQ((*points)[1].name(), "heldout_loss/uk");
  EXPECT_DOUBLE_EQ((*points)[1].value(), 1.0);
  EXPECT_EQ((*points)[2].name(), "loss");  // its last point is the later row
  EXPECT_DOUBLE_EQ((*points)[2].value(), 1.25);

  MetricQuery limited;
  limited.job_ids = {"j-1"};
  limited.limit = 4;
  bool truncated = false;
  points = store_->ReadMetrics(limited, &truncated);
  ASSERT_TRUE(points.ok());
  EXPECT_EQ(points->size(), 4u);
  EXPECT_TRUE(truncated);
}

TEST_P(StoreTest, ArtifactsAreUpsertedAndLoadedInRegistrationOrder) {
  StoreBatch b;
  for (int seq : {2, 1}) {
    v1::Artifact a;
    a.set_id("a-" + std::to_string(seq));
    a.set_seq(seq);
    a.set_path("/ckpt/" + std::to_string(seq));
    a.set_manifest_sha256("sha-" + std::to_string(seq));
    a.set_state(v1::ARTIFACT_PRESENT);
    b.of<ArtifactsTable>().push_back(a);
  }
  b.of<ArtifactsTable>()[0].add_parents("a-1");
  ASSERT_TRUE(store_->Commit(b).ok());
  StoreBatch pin;
  pin.of<ArtifactsTable>().push_back(b.of<ArtifactsTable>()[1]);
  pin.of<ArtifactsTable>()[0].set_pinned(true);
  ASSERT_TRUE(store_->Commit(pin).ok());
  Reopen();
  auto snap = store_->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  const auto& arts = snap->of<ArtifactsTable>();
  ASSERT_EQ(arts.size(), 2u);
  EXPECT_EQ(arts[0].id(), "a-1");
  EXPECT_TRUE(arts[0].pinned());
  EXPECT_EQ(arts[1].parents(0), "a-1");
}

// Who owns a job and an artifact is durable (docs/tenancy.md).
TEST_P(StoreTest, OwnersSurviveReopen) {
  StoreBatch b;
  v1::Job j = MakeJob("j-1", 1, v1::QUEUED);
  j.set_owner("bob");
  b.of<JobsTable>().push_back(j);
  v1::Artifact a;
  a.set_id("a-1");
  a.set_seq(1);
  a.set_path("/srv/bob/base");
  a.set_owner("bob");
  b.of<ArtifactsTable>().push_back(a);
  ASSERT_TRUE(store_->Commit(b).ok());
  Reopen();
  auto snap = store_->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->of<JobsTable>().size(), 1u);
  EXPECT_EQ(snap->of<JobsTable>()[0].owner(), "bob");
  ASSERT_EQ(snap->of<ArtifactsTable>().size(), 1u);
  EXPECT_EQ(snap->of<ArtifactsTable>()[0].owner(), "bob");
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
  auto path =
      std::filesystem::temp_directory_path() / ("stemma-garbage-" + std::to_string(::getpid()));
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

// A database written by the first schema (jobs, workers, keys) opens, gains the new tables
// and keeps its rows.
TEST(SqliteStore, VersionOneDatabaseIsMigrated) {
  if (std::system("command -v sqlite3 >/dev/null") != 0) GTEST_SKIP() << "needs the sqlite3 shell";
  auto dir =
      std::filesystem::temp_directory_path() / ("stemma-migrate-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "stemma.db").string();
  {
    auto s = OpenSqliteStore(path);
    ASSERT_TRUE(s.ok()) << s.status();
    StoreBatch b;
    v1::Job j;
    j.set_id("j-1");
    j.set_seq(1);
    b.of<JobsTable>().push_back(j);
    ASSERT_TRUE((*s)->Commit(b).ok());
  }
  // Back to version 1, as an older coordinator left it.
  std::string sql = "sqlite3 " + path +
                    " 'DROP TABLE metric_points; DROP TABLE artifacts; DROP TABLE "
                    "early_stop_rungs; DROP TABLE attempts; UPDATE schema_version SET version=1'";
  ASSERT_EQ(std::system(sql.c_str()), 0);
  auto s = OpenSqliteStore(path);
  ASSERT_TRUE(s.ok()) << s.status();
  auto snap = (*s)->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->of<JobsTable>().size(), 1u);
  StoreBatch b;
  b.of<MetricPointsTable>().push_back(SeriesRun("j-1", "loss", {{1, 2.0}}));
  EXPECT_TRUE((*s)->Commit(b).ok());
  s->reset();
  std::filesystem::remove_all(dir);
}

// A version 3 database (no owner columns; the owner only in the job's stemma.owner label)
// gains the columns, and its jobs load with their owner.
TEST(SqliteStore, VersionThreeDatabaseGainsOwners) {
  if (std::system("command -v sqlite3 >/dev/null") != 0) GTEST_SKIP() << "needs the sqlite3 shell";
  auto dir =
      std::filesystem::temp_directory_path() / ("stemma-migrate3-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "stemma.db").string();
  {
    auto s = OpenSqliteStore(path);
    ASSERT_TRUE(s.ok()) << s.status();
    StoreBatch b;
    v1::Job j;
    j.set_id("j-1");
    j.set_seq(1);
    (*j.mutable_spec()->mutable_labels())["stemma.owner"] = "carol";
    b.of<JobsTable>().push_back(j);
    ASSERT_TRUE((*s)->Commit(b).ok());
  }
  std::string sql = "sqlite3 " + path +
                    " 'DROP INDEX jobs_by_owner; ALTER TABLE jobs DROP COLUMN owner; ALTER TABLE "
                    "artifacts DROP COLUMN owner; DROP TABLE attempts; "
                    "UPDATE schema_version SET version=3'";
  ASSERT_EQ(std::system(sql.c_str()), 0);
  auto s = OpenSqliteStore(path);
  ASSERT_TRUE(s.ok()) << s.status();
  auto snap = (*s)->Load();
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->of<JobsTable>().size(), 1u);
  EXPECT_EQ(snap->of<JobsTable>()[0].owner(), "carol");
  StoreBatch b;
  v1::Job j = snap->of<JobsTable>()[0];
  b.of<JobsTable>().push_back(j);
  ASSERT_TRUE((*s)->Commit(b).ok());
  s->reset();
  FILE* p = ::popen(("sqlite3 " + path +
                     " 'SELECT owner FROM jobs; SELECT version FROM "
                     "schema_version'")
                        .c_str(),
                    "r");
  ASSERT_NE(p, nullptr);
  char buf[256] = {0};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, p);
  ::pclose(p);
  EXPECT_EQ(std::string(buf, n), "carol\n" + std::to_string(kSchemaVersion) + "\n");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stemma::coordinator
