// coordinator/log_store.h: attempts' logs in shared segment files, read back by offset,
// across a restart, with chunks sent twice written once, a crash's torn record dropped, a
// removed segment said, and logs of older coordinators (one file per attempt) still read.
#include "coordinator/log_store.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace stemma::coordinator {
namespace {

namespace fs = std::filesystem;

class LogStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("log_store_test." + std::to_string(::getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string All(const LogStore& logs, const std::string& job, int attempt) {
    std::string out;
    for (;;) {
      auto part = logs.Read(job, attempt, static_cast<int64_t>(out.size()), 7);
      EXPECT_TRUE(part.ok()) << part.status();
      if (!part.ok() || part->empty()) return out;
      out += *part;
    }
  }
  fs::path dir_;
};

TEST_F(LogStoreTest, InterleavedAttemptsReadBackWholeAndFromAnyOffset) {
  LogStore logs(dir_.string());
  ASSERT_TRUE(logs.Load().ok());
  ASSERT_TRUE(logs.Append("j-1", 1, 0, "hello ").ok());
  ASSERT_TRUE(logs.Append("j-2", 1, 0, "other job\n").ok());
  ASSERT_TRUE(logs.Append("j-1", 2, 0, "second attempt\n").ok());
  ASSERT_TRUE(logs.Append("j-1", 1, 6, "world\n").ok());
  EXPECT_EQ(All(logs, "j-1", 1), "hello world\n");
  EXPECT_EQ(All(logs, "j-1", 2), "second attempt\n");
  EXPECT_EQ(All(logs, "j-2", 1), "other job\n");
  EXPECT_EQ(logs.Size("j-1", 1), 12);
  EXPECT_EQ(*logs.Read("j-1", 1, 4, 5), "o wor");  // across two records
  EXPECT_EQ(*logs.Read("j-1", 1, 12, 5), "");
  EXPECT_EQ(*logs.Read("j-9", 1, 0, 5), "");  // never logged
  EXPECT_EQ(logs.Size("j-9", 1), 0);
  EXPECT_EQ(logs.Segments().size(), 1u);  // no file per job
}

TEST_F(LogStoreTest, AChunkSentTwiceIsWrittenOnceAndAGapIsRefused) {
  LogStore logs(dir_.string());
  ASSERT_TRUE(logs.Load().ok());
  ASSERT_TRUE(logs.Append("j-1", 1, 0, "abcdef").ok());
  ASSERT_TRUE(logs.Append("j-1", 1, 0, "abcdef").ok());  // resent whole
  ASSERT_TRUE(logs.Append("j-1", 1, 3, "defghi").ok());  // overlapping
  EXPECT_EQ(All(logs, "j-1", 1), "abcdefghi");
  absl::Status gap = logs.Append("j-1", 1, 20, "zzz");
  EXPECT_EQ(gap.code(), absl::StatusCode::kOutOfRange) << gap;
  EXPECT_NE(gap.message().find("j-1.1"), std::string::npos) << gap;
  EXPECT_EQ(logs.Append("../x", 1, 0, "no").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(logs.Append("a/b", 1, 0, "no").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LogStoreTest, ARestartedStoreReadsEveryLogAndGoesOnAppending) {
  {
    LogStore logs(dir_.string());
    ASSERT_TRUE(logs.Load().ok());
    for (int j = 0; j < 50; ++j) {
      ASSERT_TRUE(
          logs.Append("j-" + std::to_string(j), 1, 0, "line " + std::to_string(j) + "\n").ok());
    }
    ASSERT_TRUE(logs.Append("j-7", 1, 7, "more\n").ok());
  }
  LogStore again(dir_.string());
  ASSERT_TRUE(again.Load().ok());
  EXPECT_EQ(All(again, "j-7", 1), "line 7\nmore\n");
  EXPECT_EQ(All(again, "j-49", 1), "line 49\n");
  ASSERT_TRUE(again.Append("j-7", 1, 12, "after restart\n").ok());
  ASSERT_TRUE(again.Append("j-7", 1, 0, "line 7\n").ok());  // a worker resending from 0
  EXPECT_EQ(All(again, "j-7", 1), "line 7\nmore\nafter restart\n");
  EXPECT_EQ(again.Segments().size(), 2u);  // a restart starts a segment of its own
}

TEST_F(LogStoreTest, ARecordTornByACrashIsDroppedAndSentAgain) {
  {
    LogStore logs(dir_.string());
    ASSERT_TRUE(logs.Load().ok());
    ASSERT_TRUE(logs.Append("j-1", 1, 0, "kept\n").ok());
    ASSERT_TRUE(logs.Append("j-1", 1, 5, "torn by the crash\n").ok());
  }
  const fs::path seg = dir_ / "00000001.seg";
  const auto size = fs::file_size(seg);
  fs::resize_file(seg, size - 4);  // the last write did not finish
  LogStore again(dir_.string());
  ASSERT_TRUE(again.Load().ok());
  EXPECT_EQ(again.Size("j-1", 1), 5);
  EXPECT_EQ(All(again, "j-1", 1), "kept\n");
  EXPECT_LT(fs::file_size(seg), size - 4);  // the torn record is cut off the segment
  ASSERT_TRUE(again.Append("j-1", 1, 5, "torn by the crash\n").ok());
  EXPECT_EQ(All(again, "j-1", 1), "kept\ntorn by the crash\n");
}

TEST_F(LogStoreTest, ARemovedSegmentIsSaidOnReadAndTheRestStillReads) {
  {
    LogStore logs(dir_.string());
    ASSERT_TRUE(logs.Load().ok());
    ASSERT_TRUE(logs.Append("old", 1, 0, "in the first segment\n").ok());
    ASSERT_TRUE(logs.Append("both", 1, 0, "first half\n").ok());
  }
  {
    LogStore logs(dir_.string());
    ASSERT_TRUE(logs.Load().ok());
    ASSERT_TRUE(logs.Append("both", 1, 11, "second half\n").ok());
    ASSERT_TRUE(logs.Append("new", 1, 0, "in the second segment\n").ok());
  }
  fs::remove(dir_ / "00000001.seg");  // an operator freeing space
  LogStore logs(dir_.string());
  ASSERT_TRUE(logs.Load().ok());
  EXPECT_EQ(All(logs, "new", 1), "in the second segment\n");
  EXPECT_EQ(*logs.Read("both", 1, 11, 100), "second half\n");
  auto gone = logs.Read("both", 1, 0, 100);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  EXPECT_NE(gone.status().message().find("removed"), std::string::npos);
  EXPECT_EQ(*logs.Read("old", 1, 0, 100), "");  // nothing indexed is left of it
}

// `stemma gc jobs --delete`: the forgotten jobs' logs are gone, segments holding nothing else
// are removed (bytes back), a segment shared with a kept log stays, and a restart agrees.
TEST_F(LogStoreTest, DroppedJobsGiveBackTheSegmentsOnlyTheyUsed) {
  {
    LogStore logs(dir_.string());
    ASSERT_TRUE(logs.Load().ok());
    ASSERT_TRUE(logs.Append("old.1", 1, 0, "only old jobs in the first segment\n").ok());
    ASSERT_TRUE(logs.Append("old.1", 1, 0, "and its rank one\n", 1).ok());
    ASSERT_TRUE(logs.Append("old-2", 2, 0, "another old one\n").ok());
  }
  {
    LogStore logs(dir_.string());  // a restart: the next appends open a second segment
    ASSERT_TRUE(logs.Load().ok());
    ASSERT_TRUE(logs.Append("old-2", 3, 0, "its third attempt, beside a kept job\n").ok());
    ASSERT_TRUE(logs.Append("kept", 1, 0, "stays\n").ok());
  }
  {
    LogStore logs(dir_.string());  // and a third, being written when the jobs are dropped
    ASSERT_TRUE(logs.Load().ok());
    ASSERT_TRUE(logs.Append("kept", 2, 0, "written now\n").ok());
    ASSERT_EQ(logs.Segments().size(), 3u);
    const auto first = static_cast<int64_t>(fs::file_size(dir_ / "00000001.seg"));
    const LogStore::Reclaimed r =
        logs.Drop([](std::string_view id) { return id == "old.1" || id == "old-2"; });
    EXPECT_EQ(r.logs, 4);  // old.1 attempt 1 ranks 0 and 1, old-2 attempts 2 and 3
    EXPECT_EQ(r.segments, 1);
    EXPECT_EQ(r.bytes, first);
    EXPECT_FALSE(fs::exists(dir_ / "00000001.seg"));
    EXPECT_TRUE(fs::exists(dir_ / "00000002.seg"));  // "kept" has bytes there
    EXPECT_EQ(logs.Size("old.1", 1), 0);
    EXPECT_EQ(*logs.Read("old-2", 3, 0, 100), "");
    EXPECT_EQ(All(logs, "kept", 1), "stays\n");
    ASSERT_TRUE(logs.Append("kept", 2, 12, "and goes on\n").ok());
    EXPECT_EQ(logs.Drop([](std::string_view) { return false; }).segments, 0);
  }
  LogStore logs(dir_.string());
  ASSERT_TRUE(logs.Load().ok());
  EXPECT_EQ(All(logs, "kept", 1), "stays\n");
  EXPECT_EQ(All(logs, "kept", 2), "written now\nand goes on\n");
  // The dropped records still in the shared segment come back at a restart until dropped
  // again (the coordinator does so at start from the store's tombstones); then nothing more
  // can be removed, since "kept" holds that segment.
  EXPECT_EQ(logs.Size("old-2", 3), 37);
  const LogStore::Reclaimed again = logs.Drop([](std::string_view id) { return id == "old-2"; });
  EXPECT_EQ(again.logs, 1);
  EXPECT_EQ(again.segments, 0);
}

TEST_F(LogStoreTest, DroppingAJobRemovesItsLogsOfAnOlderCoordinator) {
  fs::create_directories(dir_ / "j-old");
  std::ofstream(dir_ / "j-old" / "1.log") << "written by an older coordinator\n";
  std::ofstream(dir_ / "j-old" / "2.log") << "and its second attempt\n";
  fs::create_directories(dir_ / "j-kept");
  std::ofstream(dir_ / "j-kept" / "1.log") << "kept\n";
  LogStore logs(dir_.string());
  ASSERT_TRUE(logs.Load().ok());
  EXPECT_EQ(logs.Size("j-old", 1), 32);
  const LogStore::Reclaimed r = logs.Drop([](std::string_view id) { return id == "j-old"; });
  EXPECT_EQ(r.bytes, 32 + 23);
  EXPECT_FALSE(fs::exists(dir_ / "j-old"));
  EXPECT_EQ(logs.Size("j-old", 2), 0);
  EXPECT_EQ(All(logs, "j-kept", 1), "kept\n");
}

TEST_F(LogStoreTest, LogsOfAnOlderCoordinatorAreReadWhereTheyAreAndContinued) {
  fs::create_directories(dir_ / "j-old");
  std::ofstream(dir_ / "j-old" / "1.log") << "written by an older coordinator\n";
  {
    LogStore logs(dir_.string());
    ASSERT_TRUE(logs.Load().ok());
    EXPECT_EQ(logs.Size("j-old", 1), 32);
    EXPECT_EQ(All(logs, "j-old", 1), "written by an older coordinator\n");
    ASSERT_TRUE(logs.Append("j-old", 1, 32, "and continued\n").ok());
  }
  LogStore logs(dir_.string());
  ASSERT_TRUE(logs.Load().ok());
  EXPECT_EQ(All(logs, "j-old", 1), "written by an older coordinator\nand continued\n");
}

// A part of several engine processes: one log per global rank, apart from each other and
// from rank 0's (the job's log, keyed and stored as logs were before ranks: a record of rank 0
// is byte for byte what older coordinators wrote), across a restart.
TEST_F(LogStoreTest, EachRankHasItsOwnLogAcrossARestart) {
  {
    LogStore logs(dir_.string());
    ASSERT_TRUE(logs.Load().ok());
    ASSERT_TRUE(logs.Append("j-1", 1, 0, "rank zero\n").ok());
    ASSERT_TRUE(logs.Append("j-1", 1, 0, "rank two\n", 2).ok());
    ASSERT_TRUE(logs.Append("j-1", 1, 0, "rank one\n", 1).ok());
    ASSERT_TRUE(logs.Append("j-1", 1, 9, "again\n", 2).ok());
    ASSERT_TRUE(logs.Append("j-1", 1, 0, "rank two\n", 2).ok());  // resent: written once
    EXPECT_EQ(logs.Append("j-1", 1, 0, "x", -1).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(logs.Append("j-1", 1, 0, "x", LogStore::kMaxRank + 1).code(),
              absl::StatusCode::kInvalidArgument);
  }
  LogStore logs(dir_.string());
  ASSERT_TRUE(logs.Load().ok());
  EXPECT_EQ(All(logs, "j-1", 1), "rank zero\n");
  EXPECT_EQ(*logs.Read("j-1", 1, 0, 100, 1), "rank one\n");
  EXPECT_EQ(*logs.Read("j-1", 1, 0, 100, 2), "rank two\nagain\n");
  EXPECT_EQ(*logs.Read("j-1", 1, 0, 100, 3), "");
  EXPECT_EQ(logs.Size("j-1", 1, 2), 15);
  EXPECT_EQ(logs.Size("j-1", 1, 0), logs.Size("j-1", 1));
  ASSERT_TRUE(logs.Append("j-1", 1, 15, "after restart\n", 2).ok());
  EXPECT_EQ(*logs.Read("j-1", 1, 9, 100, 2), "again\nafter restart\n");
}

TEST_F(LogStoreTest, SegmentsRollOverPastTheirSize) {
  LogStore logs(dir_.string());
  ASSERT_TRUE(logs.Load().ok());
  const std::string mib(1 << 20, 'x');
  const int chunks = static_cast<int>(LogStore::kSegmentBytes >> 20) + 2;
  for (int i = 0; i < chunks; ++i) {
    ASSERT_TRUE(logs.Append("big", 1, static_cast<int64_t>(i) << 20, mib).ok());
  }
  EXPECT_EQ(logs.Segments().size(), 2u);
  EXPECT_EQ(logs.Size("big", 1), static_cast<int64_t>(chunks) << 20);
  auto across = logs.Read("big", 1, LogStore::kSegmentBytes - 3, 6);
  ASSERT_TRUE(across.ok());
  EXPECT_EQ(*across, "xxxxxx");
}

}  // namespace
}  // namespace stemma::coordinator
