// Parts of several ranks (one process per GPU, as torchrun starts them): every rank runs with
// its environment and its own log, one rank's failure ends the others, and cancel reaches
// every rank. Real processes (/bin/sh), no coordinator.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "worker/executor.h"

namespace stemma::worker {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kWaitMs = 30'000;  // "finishes eventually", never a timing assertion

class ExecutorRanksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("executor_ranks_test." + std::to_string(getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    config_.data_dir = dir_.string();
    config_.allow_exec = true;
    config_.kill_grace_ms = 300;
    executor_ = std::make_unique<Executor>(config_, metrics_.get());
  }
  void TearDown() override {
    executor_.reset();
    fs::remove_all(dir_);
  }

  // An exec job of `ranks` processes on `ranks` GPUs (ids 4, 5, ...) running `script`.
  static v1::Assignment Ranks(const std::string& id, int ranks, const std::string& script) {
    v1::Assignment a;
    a.set_job_id("j-" + id);
    a.set_attempt_id(id);
    a.set_world_size(1);
    for (const char* arg : {"/bin/sh", "-c"}) a.mutable_spec()->mutable_exec()->add_argv(arg);
    a.mutable_spec()->mutable_exec()->add_argv(script);
    a.mutable_spec()->mutable_resources()->set_gpus(ranks);
    a.mutable_spec()->mutable_resources()->set_ranks_per_part(ranks);
    for (int g = 0; g < ranks; ++g) a.add_gpu_ids(4 + g);
    return a;
  }

  std::string Log(const std::string& id, int local) {
    std::ifstream in(dir_ / "attempts" / id /
                     (local == 0 ? "log" : "log." + std::to_string(local)));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // The pid a rank printed as "pid=N" first thing; 0 until it has.
  int64_t PidOf(const std::string& id, int local) {
    const std::string log = Log(id, local);
    int64_t pid = 0;
    if (log.rfind("pid=", 0) != 0) return 0;
    const std::string line = log.substr(4, log.find('\n') - 4);
    return absl::SimpleAtoi(line, &pid) ? pid : 0;
  }
  std::vector<int64_t> WaitPids(const std::string& id, int ranks) {
    std::vector<int64_t> pids(ranks, 0);
    for (int i = 0; i < 3000; ++i) {
      bool all = true;
      for (int r = 0; r < ranks; ++r) all &= (pids[r] = PidOf(id, r)) > 0;
      if (all) break;
      usleep(10'000);
    }
    return pids;
  }
  // True once the process and its group are gone (no zombie either); waits for it.
  static bool Gone(int64_t pid) {
    for (int i = 0; i < 1000; ++i) {
      if (kill(-static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH &&
          kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
        return true;
      }
      usleep(10'000);
    }
    return false;
  }

  fs::path dir_;
  WorkerConfig config_;
  std::unique_ptr<Metrics> metrics_ = Metrics::CreateDetached();
  std::unique_ptr<Executor> executor_;
};

TEST_F(ExecutorRanksTest, EveryRankRunsWithItsEnvironmentAndLog) {
  const std::string script =
      "echo rank=$RANK local=$LOCAL_RANK of=$LOCAL_WORLD_SIZE world=$WORLD_SIZE "
      "gpus=$CUDA_VISIBLE_DEVICES master=$MASTER_ADDR:$MASTER_PORT";
  ASSERT_TRUE(executor_->Launch(Ranks("four", 4, script)).ok());
  ASSERT_TRUE(executor_->WaitFinished("four", kWaitMs));
  const AttemptSnapshot s = *executor_->Get("four");
  EXPECT_EQ(s.result.reason(), "exit 0");
  EXPECT_EQ(s.result.exit_code(), 0);
  ASSERT_EQ(s.more_logs.size(), 3u);
  std::string master;
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE(r);
    const std::string log = Log("four", r);
    const std::string want = "rank=" + std::to_string(r) + " local=" + std::to_string(r) +
                             " of=4 world=4 gpus=4,5,6,7 master=";
    EXPECT_EQ(log.rfind(want, 0), 0u) << log;
    const std::string m = log.substr(log.find("master="));
    if (r == 0) master = m;
    EXPECT_EQ(m, master);  // one rendezvous for all
    EXPECT_NE(m, "master=:\n");
    const int64_t bytes = r == 0 ? s.log_bytes : s.more_logs[r - 1].log_bytes;
    EXPECT_EQ(bytes, static_cast<int64_t>(log.size()));
    if (r > 0) EXPECT_EQ(s.more_logs[r - 1].local_rank, r);
    std::string shipped;
    ASSERT_TRUE(executor_->LogSince("four", 0, 1 << 20, &shipped, r));
    EXPECT_EQ(shipped, log);
  }
}

TEST_F(ExecutorRanksTest, OneRankFailingEndsTheOthersAndNamesItself) {
  const std::string script =
      "echo pid=$$; if [ $LOCAL_RANK = 2 ]; then "
      "while [ ! -s log ] || [ ! -s log.1 ] || [ ! -s log.3 ]; do sleep 0.05; done; "
      "echo dying; exit 3; fi; exec sleep 100";
  ASSERT_TRUE(executor_->Launch(Ranks("crash", 4, script)).ok());
  const std::vector<int64_t> pids = WaitPids("crash", 4);
  ASSERT_TRUE(executor_->WaitFinished("crash", kWaitMs));
  const AttemptSnapshot s = *executor_->Get("crash");
  EXPECT_EQ(s.result.reason(), "rank 2: exit 3");
  EXPECT_EQ(s.result.exit_code(), 3);
  EXPECT_TRUE(s.result.retryable());
  EXPECT_NE(Log("crash", 2).find("dying"), std::string::npos);
  for (int64_t pid : pids) {
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(Gone(pid)) << pid;
  }
}

TEST_F(ExecutorRanksTest, CancelReachesEveryRank) {
  ASSERT_TRUE(
      executor_->Launch(Ranks("cancel", 3, "echo pid=$$; sleep 100 & exec sleep 100")).ok());
  const std::vector<int64_t> pids = WaitPids("cancel", 3);
  executor_->Cancel("cancel", "user asked");
  ASSERT_TRUE(executor_->WaitFinished("cancel", kWaitMs));
  EXPECT_EQ(executor_->Get("cancel")->result.reason(), "cancelled: user asked");
  for (int64_t pid : pids) {
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(Gone(pid)) << pid;
  }
}

TEST_F(ExecutorRanksTest, TheAttemptEndsWhenTheLastRankDoes) {
  // Rank 0 is done first; rank 1 still finishes its work and the attempt succeeds.
  const std::string script =
      "if [ $LOCAL_RANK = 1 ]; then while [ ! -s log ]; do sleep 0.05; done; sleep 0.2; "
      "echo late; fi; echo done";
  ASSERT_TRUE(executor_->Launch(Ranks("late", 2, script)).ok());
  ASSERT_TRUE(executor_->WaitFinished("late", kWaitMs));
  EXPECT_EQ(executor_->Get("late")->result.reason(), "exit 0");
  EXPECT_EQ(Log("late", 1), "late\ndone\n");
}

TEST_F(ExecutorRanksTest, TimeoutReachesEveryRank) {
  v1::Assignment a = Ranks("slow", 2, "echo pid=$$; exec sleep 100");
  a.mutable_spec()->set_timeout_ms(300);
  ASSERT_TRUE(executor_->Launch(a).ok());
  const std::vector<int64_t> pids = WaitPids("slow", 2);
  ASSERT_TRUE(executor_->WaitFinished("slow", kWaitMs));
  EXPECT_EQ(executor_->Get("slow")->result.reason(), "timeout after 300 ms");
  for (int64_t pid : pids) {
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(Gone(pid)) << pid;
  }
}

}  // namespace
}  // namespace stemma::worker
