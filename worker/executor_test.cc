#include "worker/executor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "common/clock.h"

namespace stemma::worker {
namespace {

namespace fs = std::filesystem;

// Generous: "finishes eventually", never a timing assertion.
constexpr int64_t kWaitMs = 30'000;

class ExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("executor_test." + std::to_string(getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    config_.data_dir = dir_.string();
    config_.allow_exec = true;
    config_.kill_grace_ms = 300;
  }
  void TearDown() override {
    executor_.reset();
    fs::remove_all(dir_);
  }

  Executor& executor() {
    if (!executor_) executor_ = std::make_unique<Executor>(config_, metrics_.get());
    return *executor_;
  }

  static v1::Assignment Noop(const std::string& id, int64_t ms, int code) {
    v1::Assignment a;
    a.set_job_id("j-" + id);
    a.set_attempt_id(id);
    a.set_world_size(1);
    a.mutable_spec()->mutable_noop()->set_duration_ms(ms);
    a.mutable_spec()->mutable_noop()->set_exit_code(code);
    return a;
  }

  static v1::Assignment Exec(const std::string& id, std::vector<std::string> argv) {
    v1::Assignment a;
    a.set_job_id("j-" + id);
    a.set_attempt_id(id);
    a.set_world_size(1);
    for (auto& s : argv) a.mutable_spec()->mutable_exec()->add_argv(s);
    return a;
  }

  // Launches, waits for the end, returns the final snapshot.
  AttemptSnapshot Run(const v1::Assignment& a) {
    EXPECT_TRUE(executor().Launch(a).ok());
    EXPECT_TRUE(executor().WaitFinished(a.attempt_id(), kWaitMs));
    auto s = executor().Get(a.attempt_id());
    EXPECT_TRUE(s.has_value());
    return s.value_or(AttemptSnapshot{});
  }

  std::string Log(const std::string& id) {
    std::ifstream in(dir_ / "attempts" / id / "log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // Waits until the attempt has a pid (forked).
  int64_t WaitPid(const std::string& id) {
    for (int i = 0; i < 3000; ++i) {
      auto s = executor().Get(id);
      if (s && s->pid > 0) return s->pid;
      usleep(10'000);
    }
    return 0;
  }

  // True once no process (not even a zombie) is left in the group; waits for it.
  static bool GroupGone(int64_t pgid) {
    for (int i = 0; i < 1000; ++i) {
      if (kill(-static_cast<pid_t>(pgid), 0) != 0 && errno == ESRCH) return true;
      usleep(10'000);
    }
    return false;
  }

  fs::path dir_;
  WorkerConfig config_;
  std::unique_ptr<Metrics> metrics_ = Metrics::CreateDetached();
  std::unique_ptr<Executor> executor_;
};

TEST_F(ExecutorTest, NoopExitCodes) {
  struct Case {
    int code;
    std::string reason;
    bool retryable;
  };
  for (const Case& c :
       {Case{0, "exit 0", false}, Case{3, "exit 3", true}, Case{255, "exit 255", true}}) {
    SCOPED_TRACE(c.code);
    AttemptSnapshot s = Run(Noop("noop" + std::to_string(c.code), 20, c.code));
    EXPECT_TRUE(s.finished);
    EXPECT_GT(s.pid, 0);
    EXPECT_EQ(s.result.exit_code(), c.code);
    EXPECT_EQ(s.result.reason(), c.reason);
    EXPECT_EQ(s.result.retryable(), c.retryable);
  }
  EXPECT_TRUE(fs::is_directory(dir_ / "attempts" / "noop3"));
}

TEST_F(ExecutorTest, ExecArgvIsPassedLiterallyWithoutShell) {
  const fs::path marker = dir_ / "attempts" / "lit" / "X";
  AttemptSnapshot s = Run(Exec("lit", {"/bin/echo", "a; touch X", "$(touch X)", "`touch X`"}));
  EXPECT_EQ(s.result.reason(), "exit 0");
  EXPECT_EQ(Log("lit"), "a; touch X $(touch X) `touch X`\n");
  EXPECT_EQ(s.log_bytes, static_cast<int64_t>(Log("lit").size()));
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_FALSE(fs::exists("X"));
}

TEST_F(ExecutorTest, PathLookupAndStderrCaptured) {
  AttemptSnapshot s = Run(Exec("ls", {"ls", "/definitely/not/here"}));
  EXPECT_NE(s.result.exit_code(), 0);
  EXPECT_NE(Log("ls").find("/definitely/not/here"), std::string::npos) << Log("ls");
}

TEST_F(ExecutorTest, ChildSeesEnvironment) {
  v1::Assignment a = Exec("env", {"/usr/bin/env"});
  a.add_gpu_ids(1);
  a.add_gpu_ids(3);
  a.set_rank(2);
  a.set_world_size(4);
  a.set_rendezvous("10.0.0.7:29500");
  (*a.mutable_spec()->mutable_exec()->mutable_env())["FOO"] = "bar baz";
  AttemptSnapshot s = Run(a);
  EXPECT_EQ(s.result.reason(), "exit 0");
  const std::string log = Log("env");
  for (const char* want : {"CUDA_VISIBLE_DEVICES=1,3\n", "FOO=bar baz\n", "STEMMA_ATTEMPT_ID=env\n",
                           "STEMMA_JOB_ID=j-env\n", "RANK=2\n", "WORLD_SIZE=4\n", "LOCAL_RANK=0\n",
                           "MASTER_ADDR=10.0.0.7\n", "MASTER_PORT=29500\n", "STEMMA_WORKDIR="}) {
    EXPECT_NE(log.find(want), std::string::npos) << want << " not in\n" << log;
  }
}

TEST_F(ExecutorTest, NoGpusMeansEmptyCudaVisibleDevices) {
  Run(Exec("nogpu", {"/usr/bin/env"}));
  EXPECT_NE(("\n" + Log("nogpu")).find("\nCUDA_VISIBLE_DEVICES=\n"), std::string::npos);
}

TEST_F(ExecutorTest, LargeOutputIsCapturedWhole) {
  AttemptSnapshot s = Run(Exec("big", {"/usr/bin/head", "-c", "300000", "/dev/zero"}));
  EXPECT_EQ(s.result.reason(), "exit 0");
  EXPECT_EQ(s.log_bytes, 300000);
  EXPECT_EQ(fs::file_size(dir_ / "attempts" / "big" / "log"), 300000u);
}

TEST_F(ExecutorTest, MissingProgramExits127) {
  AttemptSnapshot s = Run(Exec("missing", {"/nonexistent/program"}));
  EXPECT_EQ(s.result.exit_code(), 127);
  EXPECT_EQ(s.result.reason(), "exit 127");
  EXPECT_NE(Log("missing").find("cannot execute /nonexistent/program"), std::string::npos);
}

TEST_F(ExecutorTest, ExecRefusedWithoutAllowExecSpawnsNothing) {
  config_.allow_exec = false;
  const fs::path marker = dir_ / "touched";
  AttemptSnapshot s = Run(Exec("refused", {"/usr/bin/touch", marker.string()}));
  EXPECT_TRUE(s.finished);
  EXPECT_EQ(s.pid, 0);
  EXPECT_EQ(s.result.exit_code(), -1);
  EXPECT_EQ(s.result.reason(), "refused: exec jobs need a worker started with --allow-exec");
  EXPECT_FALSE(s.result.retryable());
  usleep(100'000);
  EXPECT_FALSE(fs::exists(marker));
}

TEST_F(ExecutorTest, TimeoutKills) {
  v1::Assignment a = Exec("slow", {"/bin/sleep", "100"});
  a.mutable_spec()->set_timeout_ms(200);
  AttemptSnapshot s = Run(a);
  EXPECT_EQ(s.result.reason(), "timeout after 200 ms");
  EXPECT_TRUE(s.result.retryable());
  EXPECT_TRUE(GroupGone(s.pid));
}

// Timeouts and the SIGTERM -> SIGKILL grace period run on the executor's clock: ten minutes
// each here, passed by moving a FakeClock, not by waiting.
TEST_F(ExecutorTest, TimeoutAndKillGraceFollowTheExecutorsClock) {
  FakeClock clock;
  config_.kill_grace_ms = 600'000;
  executor_ = std::make_unique<Executor>(config_, metrics_.get(), &clock);
  // Ignores SIGTERM (and so does the sleep it becomes): only the SIGKILL ends it.
  v1::Assignment a =
      Exec("stubborn", {"/bin/sh", "-c", "trap '' TERM; echo ready; exec sleep 1000"});
  a.mutable_spec()->set_timeout_ms(600'000);
  ASSERT_TRUE(executor().Launch(a).ok());
  ASSERT_GT(WaitPid("stubborn"), 0);
  for (int i = 0; i < 3000 && Log("stubborn").find("ready") == std::string::npos; ++i)
    usleep(10'000);
  ASSERT_EQ(Log("stubborn"), "ready\n");

  clock.Advance(599'999);
  executor().CheckTimers();
  EXPECT_FALSE(executor().WaitFinished("stubborn", 200));
  clock.Advance(1);  // the timeout: SIGTERM, which the job ignores
  executor().CheckTimers();
  EXPECT_FALSE(executor().WaitFinished("stubborn", 200));
  clock.Advance(599'999);
  executor().CheckTimers();
  EXPECT_FALSE(executor().WaitFinished("stubborn", 200));
  clock.Advance(1);  // the grace period is over: SIGKILL
  executor().CheckTimers();
  ASSERT_TRUE(executor().WaitFinished("stubborn", kWaitMs));
  AttemptSnapshot s = *executor().Get("stubborn");
  EXPECT_EQ(s.result.reason(), "timeout after 600000 ms");
  EXPECT_EQ(s.result.exit_code(), 128 + SIGKILL);
  EXPECT_TRUE(s.result.retryable());
  EXPECT_TRUE(GroupGone(s.pid));
  executor_.reset();  // its threads read `clock`, which this scope is about to destroy
}

TEST_F(ExecutorTest, CancelKillsWholeProcessGroup) {
  ASSERT_TRUE(executor().Launch(Exec("group", {"/bin/sh", "-c", "sleep 100 & sleep 100"})).ok());
  const int64_t pgid = WaitPid("group");
  ASSERT_GT(pgid, 0);
  usleep(100'000);  // let sh start its children (not required for correctness)
  executor().Cancel("group", "user asked");
  ASSERT_TRUE(executor().WaitFinished("group", kWaitMs));
  auto s = executor().Get("group");
  EXPECT_EQ(s->result.reason(), "cancelled: user asked");
  EXPECT_TRUE(GroupGone(pgid));
}

TEST_F(ExecutorTest, CancelEscalatesToSigkill) {
  ASSERT_TRUE(executor()
                  .Launch(Exec("stubborn",
                               {"/bin/sh", "-c", "trap '' TERM; sleep 100 & sleep 100; sleep 100"}))
                  .ok());
  const int64_t pgid = WaitPid("stubborn");
  ASSERT_GT(pgid, 0);
  usleep(100'000);
  executor().Cancel("stubborn", "");
  ASSERT_TRUE(executor().WaitFinished("stubborn", kWaitMs));
  EXPECT_EQ(executor().Get("stubborn")->result.reason(), "cancelled");
  EXPECT_TRUE(GroupGone(pgid));
}

TEST_F(ExecutorTest, LeftoverChildrenAreKilledWhenLeaderExits) {
  AttemptSnapshot s = Run(Exec("leftover", {"/bin/sh", "-c", "sleep 100 & echo done"}));
  EXPECT_EQ(s.result.reason(), "exit 0");
  EXPECT_TRUE(GroupGone(s.pid));
}

TEST_F(ExecutorTest, ProgressLinesAreParsed) {
  AttemptSnapshot s = Run(Exec(
      "progress", {"/bin/echo", R"(STEMMA_PROGRESS {"fraction":0.5,"message":"half","step":7})"}));
  EXPECT_GE(s.progress_version, 1u);
  EXPECT_DOUBLE_EQ(s.progress.fraction(), 0.5);
  EXPECT_EQ(s.progress.message(), "half");
  EXPECT_EQ(s.progress.step(), 7);
}

TEST_F(ExecutorTest, EngineEventLinesBecomeProgressAndOutputs) {
  // What stemma-engine prints (docs/engine-events.md); other lines, partial JSON and unknown
  // events are ignored.
  const char* script =
      "echo 'plain log line'\n"
      "echo '{\"event\":\"start\",\"command\":\"train\"}'\n"
      "echo '{\"event\":\"step\",\"step\":25,\"total_steps\":100,\"loss\":2.5,\"lr\":0.0003}'\n"
      "echo '{\"event\":\"output\",\"name\":\"model\",\"path\":\"/ckpt/final\"}'\n"
      "echo '{\"name\":\"results\",\"event\":\"output\",\"path\":\"/r.json\"}'\n"
      "echo '{\"name\":\"no-event\",\"path\":\"/x\"}'\n"
      "echo '{\"event\":\"step\",\"step\":'\n"
      "echo '{\"event\":\"metric\",\"name\":\"ppl\",\"value\":3}'\n";
  AttemptSnapshot s = Run(Exec("events", {"/bin/sh", "-c", script}));
  EXPECT_EQ(s.result.reason(), "exit 0");
  EXPECT_EQ(s.progress.step(), 25);
  EXPECT_DOUBLE_EQ(s.progress.fraction(), 0.25);
  EXPECT_EQ(s.progress.message(), "loss 2.5 lr 0.0003");
  ASSERT_EQ(s.result.outputs_size(), 2);
  EXPECT_EQ(s.result.outputs().at("model"), "/ckpt/final");
  EXPECT_EQ(s.result.outputs().at("results"), "/r.json");
}

TEST_F(ExecutorTest, EngineMissingIsRefused) {
  config_.engine_path = (dir_ / "no-such-engine").string();
  v1::Assignment a = Noop("engine-missing", 0, 0);
  a.mutable_spec()->mutable_train()->set_model("/m");
  AttemptSnapshot s = Run(a);
  EXPECT_EQ(s.result.reason(), "refused: stemma-engine not found");
  EXPECT_FALSE(s.result.retryable());
}

TEST_F(ExecutorTest, EngineJobsWaitPassivelyOnTheirCores) {
  const fs::path engine = dir_ / "print-env";
  {
    std::ofstream out(engine);
    out << "#!/bin/sh\nenv\n";
  }
  fs::permissions(engine, fs::perms::owner_all);
  config_.engine_path = engine.string();
  v1::Assignment a = Noop("engine-env", 0, 0);
  a.mutable_spec()->mutable_train();
  a.mutable_spec()->mutable_resources()->set_cpus(3);
  AttemptSnapshot s = Run(a);
  EXPECT_EQ(s.result.reason(), "exit 0");
  const std::string log = Log("engine-env");
  EXPECT_NE(log.find("OMP_WAIT_POLICY=PASSIVE\n"), std::string::npos) << log;
  EXPECT_NE(log.find("OMP_NUM_THREADS=3\n"), std::string::npos) << log;
  EXPECT_NE(log.find("STEMMA_CPUS=3\n"), std::string::npos) << log;
  EXPECT_NE(log.find("STEMMA_ATTEMPT_ID=engine-env\n"), std::string::npos) << log;
}

// Exit 4 is the engine's "bad spec or bad input": the same attempt would fail again, so it
// is not retried, and the engine's error line is the reason the user sees.
TEST_F(ExecutorTest, EngineBadInputIsNotRetriedAndCarriesTheEngineMessage) {
  const fs::path engine = dir_ / "bad-input";
  {
    std::ofstream out(engine);
    out << "#!/bin/sh\necho '{\"event\":\"start\"}'\n"
           "echo 'stemma-engine: error: spec.json: line 3: steps: -1 must be >= 0' >&2\nexit 4\n";
  }
  fs::permissions(engine, fs::perms::owner_all);
  config_.engine_path = engine.string();
  v1::Assignment a = Noop("engine-bad", 0, 0);
  a.mutable_spec()->mutable_train();
  AttemptSnapshot s = Run(a);
  EXPECT_EQ(s.result.exit_code(), 4);
  EXPECT_FALSE(s.result.retryable());
  EXPECT_EQ(s.result.reason(), "bad input: spec.json: line 3: steps: -1 must be >= 0");

  // Any other failure stays retryable, with the engine's line after the exit status.
  {
    std::ofstream out(engine);
    out << "#!/bin/sh\necho 'stemma-engine: error: CUDA out of memory' >&2\nexit 1\n";
  }
  v1::Assignment b = Noop("engine-oom", 0, 0);
  b.mutable_spec()->mutable_train();
  AttemptSnapshot t = Run(b);
  EXPECT_TRUE(t.result.retryable());
  EXPECT_EQ(t.result.reason(), "exit 1: CUDA out of memory");
}

TEST_F(ExecutorTest, EngineGetsCommandAndSpecFile) {
  config_.engine_path = "/bin/echo";
  v1::Assignment a = Noop("engine", 0, 0);
  a.mutable_spec()->mutable_init()->set_out("/ckpt/new");
  AttemptSnapshot s = Run(a);
  EXPECT_EQ(s.result.reason(), "exit 0");
  const fs::path spec = fs::absolute(dir_ / "attempts" / "engine" / "spec.json").lexically_normal();
  EXPECT_EQ(Log("engine"), "init --spec " + spec.string() + "\n");
  std::ifstream in(spec);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "{\"out\":\"/ckpt/new\"}");  // the typed spec as JSON, proto field names
}

// Step and metric event lines become metric points for the coordinator's series; a typed
// output event becomes an artifact for the registry (reported only when the attempt succeeds).
TEST_F(ExecutorTest, EngineEventsBecomeMetricPointsAndArtifacts) {
  const fs::path engine = dir_ / "events";
  {
    std::ofstream out(engine);
    out << "#!/bin/sh\n"
           "echo '{\"event\":\"step\",\"step\":1,\"total_steps\":2,\"loss\":2.5,\"lr\":0.001}'\n"
           "echo '{\"event\":\"metric\",\"name\":\"heldout_loss/uk\",\"value\":2.75,\"step\":1,"
           "\"labels\":{\"language\":\"uk\"}}'\n"
           "echo "
           "'{\"event\":\"output\",\"name\":\"model\",\"path\":\"/ckpt/m\",\"type\":\"checkpoint\","
           "\"manifest_sha256\":\"ab12\",\"bytes\":1024,\"parents\":[\"/ckpt/"
           "base\"],\"operation\":\"cpt\"}'\n";
  }
  fs::permissions(engine, fs::perms::owner_all);
  config_.engine_path = engine.string();
  v1::Assignment a = Noop("engine-events", 0, 0);
  a.mutable_spec()->mutable_train();
  AttemptSnapshot s = Run(a);
  EXPECT_EQ(s.result.reason(), "exit 0");
  ASSERT_EQ(s.metric_count, 3u);
  v1::AttemptEvent::MetricBatch points;
  ASSERT_EQ(executor().MetricsSince("engine-events", 0, 100, &points), 3u);
  ASSERT_EQ(points.name_index_size(), 3);
  auto name = [&](int i) { return points.names(static_cast<int>(points.name_index(i))); };
  EXPECT_EQ(name(0), "loss");
  EXPECT_DOUBLE_EQ(points.values(0), 2.5);
  EXPECT_EQ(points.steps(0), 1);
  EXPECT_GT(points.times_ms(0), 0);
  EXPECT_EQ(name(1), "lr");
  EXPECT_EQ(name(2), "heldout_loss/uk");
  ASSERT_EQ(points.label_index_size(), 3);
  ASSERT_GT(points.label_index(2), 0u);
  EXPECT_EQ(points.label_sets(static_cast<int>(points.label_index(2)) - 1).labels().at("language"),
            "uk");
  v1::AttemptEvent::MetricBatch rest;
  EXPECT_EQ(executor().MetricsSince("engine-events", 2, 100, &rest), 1u);
  v1::AttemptEvent::MetricBatch unknown;
  EXPECT_EQ(executor().MetricsSince("no-such-attempt", 0, 100, &unknown), 0u);
  ASSERT_EQ(s.result.artifacts_size(), 1);
  const v1::OutputArtifact& art = s.result.artifacts(0);
  EXPECT_EQ(art.name(), "model");
  EXPECT_EQ(art.type(), "checkpoint");
  EXPECT_EQ(art.manifest_sha256(), "ab12");
  EXPECT_EQ(art.bytes(), 1024);
  ASSERT_EQ(art.parents_size(), 1);
  EXPECT_EQ(art.parents(0), "/ckpt/base");
  EXPECT_EQ(art.operation(), "cpt");
  EXPECT_EQ(s.result.outputs().at("model"), "/ckpt/m");
}

TEST_F(ExecutorTest, DuplicateAndBadIdsAndForget) {
  ASSERT_TRUE(executor().Launch(Noop("dup", 0, 0)).ok());
  EXPECT_EQ(executor().Launch(Noop("dup", 0, 0)).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(executor().WaitFinished("dup", kWaitMs));
  executor().Forget("dup");
  EXPECT_FALSE(executor().Get("dup").has_value());

  AttemptSnapshot bad = Run(Noop("../escape", 0, 0));
  EXPECT_EQ(bad.result.exit_code(), -1);
  EXPECT_FALSE(bad.result.retryable());
}

TEST_F(ExecutorTest, ForgottenDirectoriesAreRecycledUnlessTheJobLeftFiles) {
  ASSERT_TRUE(executor().Launch(Exec("first", {"/bin/echo", "first output"})).ok());
  ASSERT_TRUE(executor().WaitFinished("first", kWaitMs));
  executor().Forget("first");
  EXPECT_TRUE(fs::exists(dir_ / "attempts" / "first"));  // kept until the next attempt
  for (int i = 0; i < 500 && executor().SpareDirs() == 0; ++i)
    absl::SleepFor(absl::Milliseconds(2));
  ASSERT_EQ(executor().SpareDirs(), 1u);  // emptied off the attempt's path, then offered
  AttemptSnapshot second = Run(Exec("second", {"/bin/echo", "second"}));
  EXPECT_EQ(second.result.exit_code(), 0);
  EXPECT_FALSE(fs::exists(dir_ / "attempts" / "first"));  // renamed to "second"
  EXPECT_EQ(Log("second"), "second\n");                   // the reused log starts empty
  // A job that leaves files keeps its directory after Forget.
  AttemptSnapshot maker = Run(Exec("maker", {"/usr/bin/touch", "result.bin"}));
  EXPECT_EQ(maker.result.exit_code(), 0);
  executor().Forget("maker");
  EXPECT_TRUE(fs::exists(dir_ / "attempts" / "maker" / "result.bin"));
  EXPECT_TRUE(fs::exists(dir_ / "attempts" / "maker" / "log"));
}

// The session ships log bytes from memory while they are there; what has left memory (a
// long log) is in the file, byte for byte the same.
TEST_F(ExecutorTest, LogBytesAreServedFromMemoryAndMatchTheFile) {
  AttemptSnapshot small = Run(Exec("small", {"/bin/echo", "hello"}));
  ASSERT_EQ(small.log_bytes, 6);
  std::string got;
  ASSERT_TRUE(executor().LogSince("small", 0, 100, &got));
  EXPECT_EQ(got, "hello\n");
  ASSERT_TRUE(executor().LogSince("small", 2, 2, &got));
  EXPECT_EQ(got, "ll");
  EXPECT_FALSE(executor().LogSince("small", 6, 10, &got)) << "nothing past the end";
  EXPECT_FALSE(executor().LogSince("nope", 0, 10, &got));

  AttemptSnapshot big = Run(Exec("big", {"/bin/sh", "-c", "seq 1 100000"}));
  const std::string file = Log("big");
  ASSERT_EQ(big.log_bytes, static_cast<int64_t>(file.size()));
  ASSERT_GT(file.size(), 512u * 1024);
  EXPECT_FALSE(executor().LogSince("big", 0, 100, &got)) << "the start has left memory";
  ASSERT_TRUE(executor().LogSince("big", big.log_bytes - 1000, 4096, &got));
  EXPECT_EQ(got, file.substr(file.size() - 1000));
}

TEST_F(ExecutorTest, DiscardKillsAndForgets) {
  ASSERT_TRUE(executor().Launch(Exec("discard", {"/bin/sleep", "100"})).ok());
  const int64_t pgid = WaitPid("discard");
  ASSERT_GT(pgid, 0);
  executor().Discard("discard");
  EXPECT_TRUE(executor().Snapshot().empty());
  ASSERT_TRUE(executor().WaitFinished("discard", kWaitMs));
  EXPECT_TRUE(GroupGone(pgid));
}

TEST_F(ExecutorTest, StartOfALongJobIsSignalledWithoutWaitingForItsEnd) {
  // The start is signalled a moment (2 ms) after the fork, by a timer, so that a short job
  // reports start and finish together; a long job must still be reported as started.
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  executor().SetChangeCallback([&] {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    cv.notify_all();
  });
  ASSERT_TRUE(executor().Launch(Exec("long", {"/bin/sleep", "100"})).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return calls > 0; }));
  }
  auto s = executor().Get("long");
  ASSERT_TRUE(s.has_value());
  EXPECT_GT(s->pid, 0);
  EXPECT_FALSE(s->finished);
  executor().SetChangeCallback(nullptr);
  executor().Cancel("long", "done");
  ASSERT_TRUE(executor().WaitFinished("long", kWaitMs));
}

TEST_F(ExecutorTest, ManyAttemptsLaunchedAtOnceAllRun) {
  // The spawner threads fork in parallel; every attempt still runs exactly once.
  constexpr int kN = 60;
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(
        executor()
            .Launch(Exec("many" + std::to_string(i), {"/bin/sh", "-c", "echo $STEMMA_ATTEMPT_ID"}))
            .ok());
  }
  std::set<int64_t> pids;
  for (int i = 0; i < kN; ++i) {
    const std::string id = "many" + std::to_string(i);
    ASSERT_TRUE(executor().WaitFinished(id, kWaitMs)) << id;
    auto s = executor().Get(id);
    EXPECT_EQ(s->result.reason(), "exit 0") << id;
    EXPECT_GT(s->pid, 0) << id;
    pids.insert(s->pid);
    EXPECT_EQ(Log(id), id + "\n");
  }
  EXPECT_EQ(pids.size(), static_cast<size_t>(kN));
}

TEST_F(ExecutorTest, CancelRightAfterLaunchLeavesNoProcess) {
  // A cancel may land before, during or after the fork: each way the attempt ends as
  // cancelled and nothing of it keeps running.
  constexpr int kN = 40;
  for (int i = 0; i < kN; ++i) {
    const std::string id = "quick" + std::to_string(i);
    ASSERT_TRUE(executor().Launch(Exec(id, {"/bin/sleep", "100"})).ok());
    if (i % 4 == 1) usleep(200);  // some land a little later
    executor().Cancel(id, "now");
  }
  for (int i = 0; i < kN; ++i) {
    const std::string id = "quick" + std::to_string(i);
    ASSERT_TRUE(executor().WaitFinished(id, kWaitMs)) << id;
    auto s = executor().Get(id);
    EXPECT_EQ(s->result.reason(), "cancelled: now") << id;
    if (s->pid > 0) EXPECT_TRUE(GroupGone(s->pid)) << id;
  }
  EXPECT_EQ(executor().Running(), 0);
}

TEST_F(ExecutorTest, ShutdownKillsEverything) {
  ASSERT_TRUE(executor().Launch(Exec("a", {"/bin/sleep", "100"})).ok());
  ASSERT_TRUE(executor().Launch(Noop("b", 100'000, 0)).ok());
  const int64_t a = WaitPid("a");
  const int64_t b = WaitPid("b");
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  executor().Shutdown();
  EXPECT_TRUE(GroupGone(a));
  EXPECT_TRUE(GroupGone(b));
  EXPECT_EQ(executor().Running(), 0);
  EXPECT_FALSE(executor().Launch(Noop("c", 0, 0)).ok());
}

}  // namespace
}  // namespace stemma::worker
