// A shared cluster from the worker's side (issue 25), with real processes over TLS and
// tokens: exec jobs that try to read the worker's credential, a second session opened with
// a copy of a worker's token, a worker writing into another worker's attempt log, and the
// modes of the files that hold secrets.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/rpc.h"
#include "stemma/v1/user_service.grpc.pb.h"
#include "stemma/v1/worker_service.grpc.pb.h"
#include "tests/integration/cluster.h"
#include "tests/integration/secure_channel.h"

namespace stemma::testing {
namespace {

using grpc::StatusCode;

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

int Mode(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
}

// A session of a raw client registering as `id` with `token`: the registration's status
// (OK once a Registered arrives; the stream then stays open until `ctx` ends).
struct RawSession {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream;

  grpc::Status Register(v1::WorkerService::Stub* stub, const std::string& token,
                        const std::string& id) {
    ctx.AddMetadata("authorization", "Bearer " + token);
    stream = stub->Session(&ctx);
    v1::WorkerMessage reg;
    reg.mutable_register_()->mutable_info()->set_id(id);
    reg.mutable_register_()->mutable_info()->set_cpus(64);
    reg.mutable_register_()->set_incarnation("copied-token");
    reg.mutable_register_()->set_accepts_batches(true);
    stream->Write(reg);
    v1::CoordinatorMessage reply;
    if (stream->Read(&reply)) return grpc::Status::OK;
    return stream->Finish();
  }
};

class TenancyWorker : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.EnableTls();
    c_.EnableTokens();
    c_.StartCoordinator();
  }
  // A job that waits for `release` (a file in the test's directory), then prints "done".
  std::string SubmitWaiting(const std::string& release) {
    auto ids = c_.Submit("name: waits\nexec: {argv: [/bin/sh, -c, 'while [ ! -e " + release +
                         " ]; do sleep 0.05; done; echo done']}\n");
    EXPECT_EQ(ids.size(), 1u);
    return ids.empty() ? "" : ids[0];
  }
  Cluster c_;
};

// The attack: an exec job looks for the worker's token through its parent's
// working directory, command line, environment and file, and through $STEMMA_TOKEN.
TEST_F(TenancyWorker, ExecJobsCannotReadTheWorkersToken) {
  const std::string probe =
      "name: probe\nexec: {argv: [/bin/sh, -c, \"cd /proc/$PPID/cwd && tr '\\\\0' '\\\\n' "
      "</proc/$PPID/cmdline | grep -A1 -- --token-file | tail -1 | xargs cat; "
      "tr '\\\\0' '\\\\n' </proc/$PPID/cmdline | grep -A1 -- --token-file | tail -1 | xargs cat; "
      "cat /proc/$PPID/environ; ls -l /proc/$PPID/fd/ /proc/$PPID/cwd/; "
      "cat TOKENFILE; echo env=$STEMMA_TOKEN; env | grep -i token; echo probe-done\"]}\n";
  auto run_probe = [&](const std::string& worker, const std::string& token_file) {
    std::string yaml = probe;
    yaml.replace(yaml.find("TOKENFILE"), 9, token_file);
    auto ids = c_.Submit(yaml, "probe-" + worker + ".yaml");
    EXPECT_EQ(c_.WaitFor(ids[0], {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
    CliResult logs = c_.Cli({"logs", ids[0]});
    EXPECT_EQ(logs.exit_code, 0) << logs.err;
    EXPECT_NE(logs.out.find("probe-done"), std::string::npos) << logs.out;
    return logs.out;
  };

  // w1 reads its token from a file (the harness writes DIR/token-w1).
  c_.StartWorker("w1");
  c_.WaitForWorkers(1);
  const std::string w1_file = c_.dir() + "/token-w1";
  const std::string w1_token = Trimmed(Cluster::ReadFile(w1_file));
  ASSERT_EQ(w1_token.rfind("stm_", 0), 0u);
  const std::string log1 = run_probe("w1", w1_file);
  EXPECT_EQ(log1.find(w1_token), std::string::npos) << log1;
  c_.KillWorker("w1", SIGTERM);
  ASSERT_TRUE(c_.WaitUntil(
      [&] {
        for (const auto& w : c_.Cli({"workers", "-o", "json"}).Json()) {
          if (w["id"] == "w1" && w["state"] == "ALIVE") return false;
        }
        return true;
      },
      30));

  // w2 is given its token in $STEMMA_TOKEN.
  Cluster::WorkerOptions env_token;
  const std::string w2_token = c_.CreateToken("worker", "w2");
  env_token.token = "";
  env_token.env = {"STEMMA_TOKEN=" + w2_token};
  c_.StartWorker("w2", env_token);
  c_.WaitForWorkers(1);
  const std::string log2 = run_probe("w2", "/nonexistent");
  EXPECT_EQ(log2.find(w2_token), std::string::npos) << log2;
}

// A copy of w1's token opens a second session while w1 is alive: refused, and w1's
// running attempt is untouched. A real restart of w1 is still reconciled.
TEST_F(TenancyWorker, ASecondSessionUnderAWorkersIdentityIsRefused) {
  c_.StartWorker("w1");
  c_.WaitForWorkers(1);
  const std::string token = Trimmed(Cluster::ReadFile(c_.dir() + "/token-w1"));
  const std::string release = c_.dir() + "/release";
  const std::string id = SubmitWaiting(release);
  ASSERT_EQ(c_.WaitFor(id, {"RUNNING"}), "RUNNING");

  auto channel = OpenChannel(c_.address(), c_.ca());
  auto stub = v1::WorkerService::NewStub(channel);
  for (int i = 0; i < 2; ++i) {
    RawSession fake;
    fake.ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status st = fake.Register(stub.get(), token, "w1");
    EXPECT_EQ(st.error_code(), StatusCode::FAILED_PRECONDITION) << st.error_message();
    EXPECT_NE(st.error_message().find("already has a live session"), std::string::npos)
        << st.error_message();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  auto job = c_.Get(id);
  EXPECT_EQ(job["state"], "RUNNING");
  EXPECT_EQ(job["attempts"], 1);
  std::ofstream(release) << "go\n";
  ASSERT_EQ(c_.WaitFor(id, {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  EXPECT_EQ(c_.Get(id)["attempts"], 1);
  EXPECT_NE(c_.Cli({"logs", id}).out.find("done"), std::string::npos);

  // The worker process restarts: its running attempt is reconciled away as before.
  std::filesystem::remove(release);
  const std::string second = SubmitWaiting(release);
  ASSERT_EQ(c_.WaitFor(second, {"RUNNING"}), "RUNNING");
  c_.KillWorker("w1", SIGKILL);
  Cluster::WorkerOptions same;
  same.token = token;
  c_.StartWorker("w1", same);
  ASSERT_TRUE(c_.WaitUntil(
      [&] {
        auto j = c_.Get(second);
        return j.value("attempts", 0) >= 2 ||
               j.value("reason", "").find("restarted") != std::string::npos;
      },
      30))
      << c_.Get(second).dump();
  std::ofstream(release) << "go\n";
}

// A worker, registered as itself, writes log bytes into another worker's attempt: refused.
TEST_F(TenancyWorker, AWorkerCannotWriteAnotherWorkersAttemptLog) {
  c_.StartWorker("w-good");
  c_.WaitForWorkers(1);
  const std::string release = c_.dir() + "/release";
  const std::string id = SubmitWaiting(release);
  ASSERT_EQ(c_.WaitFor(id, {"RUNNING"}), "RUNNING");

  const std::string evil = c_.CreateToken("worker", "w-evil");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the token file reload
  auto channel = OpenChannel(c_.address(), c_.ca());
  auto stub = v1::WorkerService::NewStub(channel);
  {
    RawSession s;
    ASSERT_TRUE(s.Register(stub.get(), evil, "w-evil").ok());
    v1::WorkerMessage forged;
    auto* ev = forged.mutable_event();
    ev->set_attempt_id(id + ".1");
    ev->set_event_seq(1);
    ev->mutable_log()->set_offset(0);
    ev->mutable_log()->set_data("FORGED LINE\n");
    ASSERT_TRUE(s.stream->Write(forged));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    s.ctx.TryCancel();
    (void)s.stream->Finish();
  }
  std::ofstream(release) << "go\n";
  ASSERT_EQ(c_.WaitFor(id, {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  const std::string logs = c_.Cli({"logs", id}).out;
  EXPECT_EQ(logs.find("FORGED"), std::string::npos) << logs;
  EXPECT_NE(logs.find("done"), std::string::npos) << logs;
}

// The database and its WAL, the coordinator's log segments and the worker's attempt logs
// are created owner-only.
TEST_F(TenancyWorker, FilesHoldingSecretsAreOwnerOnly) {
  c_.StartWorker("w1");
  c_.WaitForWorkers(1);
  auto ids = c_.Submit(
      "name: secret\nexec: {argv: [/bin/sh, -c, 'echo $HF_TOKEN'], env: {HF_TOKEN: hf_x}}\n");
  ASSERT_EQ(c_.WaitFor(ids[0], {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  const std::string db = c_.coordinator_data() + "/stemma.db";
  for (const std::string& path : {db, db + "-wal", db + "-shm"}) {
    EXPECT_EQ(Mode(path), 0600) << path;
  }
  int segments = 0, attempt_logs = 0;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(c_.coordinator_data() + "/logs")) {
    if (!e.is_regular_file()) continue;
    ++segments;
    EXPECT_EQ(Mode(e.path().string()), 0600) << e.path();
  }
  for (const auto& e : std::filesystem::recursive_directory_iterator(c_.worker_data("w1"))) {
    if (!e.is_regular_file() || e.path().filename() != "log") continue;
    ++attempt_logs;
    EXPECT_EQ(Mode(e.path().string()), 0600) << e.path();
  }
  EXPECT_GE(segments, 1);
  EXPECT_GE(attempt_logs, 1);
}

// Idempotency keys of cancel and retry: a retry sent again with its key (the answer was lost)
// is answered and does not grow the attempt budget twice; keys are per caller, so carol's
// cancel with the key bob used is carried out for carol (not refused as a reused key).
TEST_F(TenancyWorker, OperationKeysAnswerAgainAndArePerCaller) {
  c_.StartWorker("w1");
  c_.WaitForWorkers(1);
  const std::string bob = c_.CreateToken("user", "bob");
  const std::string carol = c_.CreateToken("user", "carol");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the token file reload
  auto submit = [&](const std::string& token, const std::string& yaml) {
    CliResult r = c_.CliAs(token, {"submit", "-f", c_.WriteFile("job.yaml", yaml)});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out.substr(0, r.out.find_first_of(" \n"));
  };
  const std::string failing = submit(bob, "name: f\nnoop: {exit_code: 1}\nmax_attempts: 1\n");
  const std::string waiting = submit(carol, "name: w\nnoop: {duration_ms: 60000}\n");
  ASSERT_EQ(c_.WaitFor(failing, {"SUCCEEDED", "FAILED"}), "FAILED");
  auto stub = v1::UserService::NewStub(OpenChannel(c_.address(), c_.ca()));
  auto retry = [&](v1::JobResponse* resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + bob);
    v1::RetryRequest req;
    req.set_id(failing);
    req.set_idempotency_key("key-1");
    return stub->Retry(&ctx, req, resp);
  };
  v1::JobResponse first, again;
  ASSERT_TRUE(retry(&first).ok());
  ASSERT_EQ(c_.WaitFor(failing, {"SUCCEEDED", "FAILED"}), "FAILED");
  grpc::Status st = retry(&again);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(again.job().attempt_budget(), first.job().attempt_budget());
  EXPECT_EQ(c_.Get(failing)["attempts"], 2);
  EXPECT_EQ(c_.State(failing), "FAILED");

  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + carol);
  v1::CancelRequest cancel;
  cancel.set_id(waiting);
  cancel.set_idempotency_key("key-1");
  v1::JobResponse cancelled;
  st = stub->Cancel(&ctx, cancel, &cancelled);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(cancelled.job().id(), waiting);
  EXPECT_EQ(c_.State(waiting), "CANCELLED");
}

TEST(TenancyWorkerKeys, ATlsKeyOthersCanReadIsRefusedNamingTheFile) {
  Cluster c;
  c.EnableTls();
  ASSERT_EQ(::chmod(c.server_key().c_str(), 0644), 0);
  const pid_t pid = c.SpawnCoordinator({});
  EXPECT_NE(c.WaitExit(pid), 0);
  const std::string log = Cluster::ReadFile(c.dir() + "/coordinator.log");
  EXPECT_NE(log.find(c.server_key()), std::string::npos) << log;
  EXPECT_NE(log.find("chmod 600"), std::string::npos) << log;
}

// A CLI that trusts another CA, or talks plaintext to a TLS coordinator: the handshake fails,
// and the message says it is TLS (not "start one with 'stemma up'", which sends the user
// after a coordinator that is running).
TEST_F(TenancyWorker, ATlsHandshakeFailureSaysItIsTls) {
  const std::string other_ca = c_.MakeCaAndServerCert("other");
  // Another CA, then no CA at all (a plaintext client: the coordinator closes the connection).
  for (const std::string& ca : {"STEMMA_CA=" + other_ca, std::string("STEMMA_CA=")}) {
    CliResult r = c_.CliAs(c_.admin_token(), {"ls"}, {ca});
    EXPECT_NE(r.exit_code, 0) << ca;
    EXPECT_NE(r.err.find("TLS"), std::string::npos) << ca << ": " << r.err;
    EXPECT_EQ(r.err.find("stemma up"), std::string::npos) << ca << ": " << r.err;
  }
}

}  // namespace
}  // namespace stemma::testing
