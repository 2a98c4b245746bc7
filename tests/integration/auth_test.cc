// Authentication and authorisation with real processes: a coordinator with TLS and a token
// file, workers and the CLI with their own tokens, and a raw gRPC client playing the
// attacker (no token, a bad one, the wrong role, a worker posing as another).
#include "common/auth.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "common/rpc.h"
#include "stemma/v1/user_service.grpc.pb.h"
#include "stemma/v1/worker_service.grpc.pb.h"
#include "tests/integration/cluster.h"
#include "tests/integration/secure_channel.h"

namespace stemma::testing {
namespace {

using grpc::StatusCode;

// One call of `method` with an empty request message, as any client could make it.
grpc::Status RawCall(grpc::Channel* channel, const std::string& method, const std::string& token,
                     std::string* response_bytes = nullptr, int deadline_ms = 3000) {
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status st = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel, grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::NORMAL_RPC),
      &ctx, request, &response);
  if (response_bytes != nullptr && st.ok()) {
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    response_bytes->clear();
    for (const auto& s : slices)
      response_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return st;
}

std::vector<std::string> AllMethods() {
  std::vector<std::string> out;
  for (const auto* file :
       {v1::SubmitRequest::descriptor()->file(), v1::Register::descriptor()->file()}) {
    for (int s = 0; s < file->service_count(); ++s) {
      const auto* service = file->service(s);
      for (int i = 0; i < service->method_count(); ++i) {
        out.push_back("/" + service->full_name() + "/" + service->method(i)->name());
      }
    }
  }
  return out;
}

// `stemma submit` prints "ID NAME" per job: the first job's id.
std::string FirstWord(const std::string& out) { return out.substr(0, out.find_first_of(" \n")); }

std::string Metrics(const Cluster& c) {
  return RunShell("curl -s http://" + c.metrics_address() + "/metrics");
}

// The value of `series` (exact text up to the value) in a Prometheus scrape, or -1.
double MetricValue(const std::string& scrape, const std::string& series) {
  size_t at = scrape.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(scrape.substr(at + series.size() + 2));
}

class SecureCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.EnableTls();
    c_.EnableTokens();
    c_.StartCoordinator();
  }
  Cluster c_;
};

// Every method of every service, with no token, a bad token and each role's token, on ONE
// channel (the role is resolved per call, not per connection): refused unless the table
// allows the role, and the right role gets past authorisation to the handler.
TEST_F(SecureCluster, EveryMethodChecksEachCallAgainstTheTable) {
  const std::map<Role, std::string> tokens = {
      {Role::kAdmin, c_.admin_token()},
      {Role::kUser, c_.CreateToken("user", "alice")},
      {Role::kReadOnly, c_.CreateToken("read-only", "dashboard")},
      {Role::kWorker, c_.CreateToken("worker", "w-probe")},
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // token file reload
  auto channel = OpenChannel(c_.address(), c_.ca());
  int implemented = 0;
  for (const std::string& method : AllMethods()) {
    SCOPED_TRACE(method);
    grpc::Status none = RawCall(channel.get(), method, "");
    if (none.error_code() == StatusCode::UNIMPLEMENTED) {
      // No adapter serves it yet: nothing runs. Every role gets the same answer.
      for (const auto& [role, token] : tokens) {
        EXPECT_EQ(RawCall(channel.get(), method, token).error_code(), StatusCode::UNIMPLEMENTED);
      }
      continue;
    }
    ++implemented;
    EXPECT_EQ(none.error_code(), StatusCode::UNAUTHENTICATED) << none.error_message();
    EXPECT_EQ(RawCall(channel.get(), method, "stm_forged").error_code(),
              StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(RawCall(channel.get(), method, c_.admin_token() + "x").error_code(),
              StatusCode::UNAUTHENTICATED);
    for (const auto& [role, token] : tokens) {
      SCOPED_TRACE(std::string(RoleName(role)));
      grpc::Status st = RawCall(channel.get(), method, token, nullptr, 500);
      if ((AllowedRoles(method) & static_cast<RoleSet>(role)) != 0) {
        EXPECT_NE(st.error_code(), StatusCode::UNAUTHENTICATED) << st.error_message();
        EXPECT_NE(st.error_code(), StatusCode::PERMISSION_DENIED) << st.error_message();
      } else {
        EXPECT_EQ(st.error_code(), StatusCode::PERMISSION_DENIED) << st.error_message();
      }
    }
  }
  EXPECT_GE(implemented, 10);
  // The rules a reader checks first, spelled out.
  const std::string user = "/stemma.v1.UserService/";
  EXPECT_EQ(RawCall(channel.get(), user + "Submit", tokens.at(Role::kReadOnly)).error_code(),
            StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(RawCall(channel.get(), user + "ListJobs", tokens.at(Role::kWorker)).error_code(),
            StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(RawCall(channel.get(), "/stemma.v1.WorkerService/Session", tokens.at(Role::kUser))
                .error_code(),
            StatusCode::PERMISSION_DENIED);
  // An admin call and then a read-only call on the same connection.
  EXPECT_EQ(RawCall(channel.get(), user + "Drain", tokens.at(Role::kAdmin)).error_code(),
            StatusCode::NOT_FOUND);
  EXPECT_EQ(RawCall(channel.get(), user + "Drain", tokens.at(Role::kReadOnly)).error_code(),
            StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(RawCall(channel.get(), user + "Drain", tokens.at(Role::kUser)).error_code(),
            StatusCode::PERMISSION_DENIED);

  // Counted by reason, logged without the token.
  const std::string scrape = Metrics(c_);
  EXPECT_GE(MetricValue(scrape, "stemma_auth_failures_total{reason=\"missing_token\"}"), 10);
  EXPECT_GE(MetricValue(scrape, "stemma_auth_failures_total{reason=\"bad_token\"}"), 20);
  EXPECT_GE(MetricValue(scrape, "stemma_auth_failures_total{reason=\"denied\"}"), 10);
  const std::string log = Cluster::ReadFile(c_.dir() + "/coordinator.log");
  EXPECT_NE(log.find("auth: refused"), std::string::npos);
  for (const auto& [role, token] : tokens) EXPECT_EQ(log.find(token), std::string::npos);
  EXPECT_EQ(log.find("stm_forged"), std::string::npos);
}

TEST_F(SecureCluster, UsersActOnTheirOwnJobsAndSecretsStayWithTheOwner) {
  const std::string alice = c_.CreateToken("user", "alice");
  const std::string bob = c_.CreateToken("user", "bob");
  const std::string viewer = c_.CreateToken("read-only", "viewer");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  // A drained worker: exec jobs are accepted and stay QUEUED, which is all these rules need.
  c_.StartWorker("w0");
  c_.WaitForWorkers(1);
  ASSERT_EQ(c_.Cli({"drain", "w0"}).exit_code, 0);
  const std::string file =
      c_.WriteFile("secret.yaml",
                   "name: with-secret\nlabels: {stemma.owner: bob}\n"
                   "exec: {argv: [/bin/true], env: {HF_TOKEN: hf_supersecret}}\n");
  CliResult submit = c_.CliAs(alice, {"submit", "-f", file, "--idempotency-key", "k1"});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = FirstWord(submit.out);

  auto as_alice = nlohmann::json::parse(c_.CliAs(alice, {"get", id, "-o", "json"}).out);
  EXPECT_EQ(as_alice["spec"]["labels"]["stemma.owner"], "alice");  // not what the file said
  EXPECT_EQ(as_alice["spec"]["exec"]["env"]["HF_TOKEN"], "hf_supersecret");
  // Admins see secrets too (issue 25: "for all but the owner and admins").
  EXPECT_EQ(nlohmann::json::parse(c_.CliAs(c_.admin_token(), {"get", id, "-o", "json"})
                                      .out)["spec"]["exec"]["env"]["HF_TOKEN"],
            "hf_supersecret");
  for (const std::string& other : {bob, viewer}) {
    CliResult get = c_.CliAs(other, {"get", id, "-o", "json"});
    ASSERT_EQ(get.exit_code, 0) << get.err;
    EXPECT_EQ(get.out.find("hf_supersecret"), std::string::npos) << get.out;
    EXPECT_EQ(nlohmann::json::parse(get.out)["spec"]["exec"]["env"]["HF_TOKEN"], "<redacted>");
    CliResult ls = c_.CliAs(other, {"ls", "-o", "json"});
    ASSERT_EQ(ls.exit_code, 0) << ls.err;
    EXPECT_EQ(ls.out.find("hf_supersecret"), std::string::npos);
  }

  // The same idempotency key from another user is another user's key.
  CliResult again = c_.CliAs(bob, {"submit", "-f", file, "--idempotency-key", "k1"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const std::string bobs = FirstWord(again.out);
  EXPECT_NE(bobs, id);
  CliResult replay = c_.CliAs(alice, {"submit", "-f", file, "--idempotency-key", "k1"});
  EXPECT_EQ(FirstWord(replay.out), id);

  CliResult cancel = c_.CliAs(bob, {"cancel", id});
  EXPECT_EQ(cancel.exit_code, 3);  // refused
  EXPECT_NE(cancel.err.find("belongs to alice"), std::string::npos) << cancel.err;
  EXPECT_NE(c_.CliAs(bob, {"logs", id}).exit_code, 0);
  EXPECT_NE(c_.CliAs(viewer, {"cancel", id}).exit_code, 0);
  EXPECT_EQ(c_.State(id), "QUEUED");
  EXPECT_EQ(c_.CliAs(bob, {"cancel", bobs}).exit_code, 0);
  EXPECT_EQ(c_.CliAs(alice, {"logs", id}).exit_code, 0);
  EXPECT_EQ(c_.CliAs(c_.admin_token(), {"cancel", id}).exit_code, 0);  // admins: every job
  EXPECT_EQ(c_.State(id), "CANCELLED");
  EXPECT_GE(MetricValue(Metrics(c_), "stemma_auth_failures_total{reason=\"not_owner\"}"), 2);
}

// The attack from the issue: a client with some credential poses as a worker to take
// jobs, their secrets and their outputs.
TEST_F(SecureCluster, AForgedWorkerCannotTakeOverAWorkerOrReportForIt) {
  c_.StartWorker("w-good");
  c_.WaitForWorkers(1);
  const std::string release = c_.dir() + "/release";
  auto ids = c_.Submit("name: real\nexec: {argv: [/bin/sh, -c, 'while [ ! -e " + release +
                       " ]; do sleep 0.05; done; echo done'], env: {HF_TOKEN: hf_x}}\n");
  ASSERT_EQ(c_.WaitFor(ids[0], {"RUNNING"}), "RUNNING");
  const std::string attempt = ids[0] + ".1";

  const std::string evil = c_.CreateToken("worker", "w-evil");
  const std::string user = c_.CreateToken("user", "mallory");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto channel = OpenChannel(c_.address(), c_.ca());
  auto stub = v1::WorkerService::NewStub(channel);

  auto try_register = [&](const std::string& token, const std::string& as) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto stream = stub->Session(&ctx);
    v1::WorkerMessage reg;
    reg.mutable_register_()->mutable_info()->set_id(as);
    reg.mutable_register_()->mutable_info()->set_cpus(64);
    reg.mutable_register_()->set_incarnation("forged");
    stream->Write(reg);
    v1::CoordinatorMessage reply;
    EXPECT_FALSE(stream->Read(&reply)) << "the coordinator answered a forged Register";
    return stream->Finish();
  };
  EXPECT_EQ(try_register("", "w-good").error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(try_register(user, "w-good").error_code(), StatusCode::PERMISSION_DENIED);
  grpc::Status st = try_register(evil, "w-good");
  EXPECT_EQ(st.error_code(), StatusCode::PERMISSION_DENIED);
  EXPECT_NE(st.error_message().find("cannot register as 'w-good'"), std::string::npos)
      << st.error_message();

  // Registered as itself, it may not report on another worker's attempt.
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + evil);
    auto stream = stub->Session(&ctx);
    v1::WorkerMessage reg;
    reg.mutable_register_()->mutable_info()->set_id("w-evil");
    reg.mutable_register_()->mutable_info()->set_cpus(1);
    reg.mutable_register_()->set_incarnation("evil");
    ASSERT_TRUE(stream->Write(reg));
    v1::CoordinatorMessage reply;
    ASSERT_TRUE(stream->Read(&reply));
    ASSERT_TRUE(reply.has_registered() ||
                (reply.has_batch() && reply.batch().messages(0).has_registered()));
    v1::WorkerMessage forged;
    auto* ev = forged.mutable_event();
    ev->set_attempt_id(attempt);
    ev->set_event_seq(1);
    ev->mutable_finished()->set_exit_code(0);
    ev->mutable_finished()->set_reason("exit 0");
    (*ev->mutable_finished()->mutable_outputs())["model"] = "/forged/model";
    ASSERT_TRUE(stream->Write(forged));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ctx.TryCancel();
    (void)stream->Finish();
  }
  auto job = c_.Get(ids[0]);
  EXPECT_EQ(job["state"], "RUNNING");
  EXPECT_EQ(job["attempts"], 1);
  auto workers = c_.Cli({"workers", "-o", "json"}).Json();
  for (const auto& w : workers) {
    if (w["id"] == "w-good") EXPECT_EQ(w["state"], "ALIVE");
  }
  std::ofstream(release) << "go\n";
  ASSERT_EQ(c_.WaitFor(ids[0], {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  job = c_.Get(ids[0]);
  EXPECT_EQ(job.dump().find("/forged/model"), std::string::npos) << job.dump();
  const std::string scrape = Metrics(c_);
  EXPECT_EQ(MetricValue(scrape, "stemma_auth_failures_total{reason=\"wrong_identity\"}"), 1);
  EXPECT_GE(MetricValue(scrape, "stemma_coordinator_stale_reports_total"), 1);
}

TEST(Auth, ListeningBeyondLoopbackNeedsTlsAndTokensOrSaysInsecure) {
  Cluster c;
  const int port = 20000 + (::getpid() * 13) % 9000;
  auto open = [&](int p) { return "0.0.0.0:" + std::to_string(p); };
  c.set_listen(open(port));
  pid_t plain = c.SpawnCoordinator({});
  EXPECT_EQ(c.WaitExit(plain), 2);
  std::string log = Cluster::ReadFile(c.dir() + "/coordinator.log");
  EXPECT_NE(log.find("reaches beyond loopback without TLS and tokens"), std::string::npos) << log;
  EXPECT_NE(log.find("--insecure"), std::string::npos);

  c.EnableTls();
  c.set_listen(open(port + 1));
  pid_t tls_only = c.SpawnCoordinator({});
  EXPECT_EQ(c.WaitExit(tls_only), 2);
  EXPECT_NE(Cluster::ReadFile(c.dir() + "/coordinator.log").find("without tokens"),
            std::string::npos);

  c.EnableTokens();
  c.set_listen(open(port + 2));
  pid_t secure = c.SpawnCoordinator({});
  EXPECT_EQ(c.WaitExit(secure, 2), -1) << Cluster::ReadFile(c.dir() + "/coordinator.log");
  ::kill(secure, SIGKILL);
  c.WaitExit(secure);

  Cluster plain_cluster;
  plain_cluster.set_listen(open(port + 3));
  pid_t insecure = plain_cluster.SpawnCoordinator({"--insecure"});
  EXPECT_EQ(plain_cluster.WaitExit(insecure, 2), -1);
  EXPECT_NE(Cluster::ReadFile(plain_cluster.dir() + "/coordinator.log").find("INSECURE"),
            std::string::npos);
  ::kill(insecure, SIGKILL);
  plain_cluster.WaitExit(insecure);

  // A worker does not send its token in clear text to a remote coordinator either.
  std::string out =
      RunShell(Cluster::BinDir() + "/stemma-worker --coordinator 10.255.0.1:7070 --data " +
               c.dir() + "/wx 2>&1; echo rc=$?");
  EXPECT_NE(out.find("beyond loopback"), std::string::npos) << out;
  EXPECT_NE(out.find("rc=2"), std::string::npos) << out;
}

TEST(Auth, HealthIsOnItsOwnPortAndTheMainPortServesNothingUnauthenticated) {
  Cluster c;
  c.EnableTls();
  c.EnableTokens();
  const std::string health = "127.0.0.1:" + std::to_string(20000 + (::getpid() * 17) % 9000);
  c.StartCoordinator({"--health-listen", health});
  auto plain = grpc::CreateChannel(health, grpc::InsecureChannelCredentials());
  std::string bytes;
  grpc::Status st = RawCall(plain.get(), "/grpc.health.v1.Health/Check", "", &bytes);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // SERVING
  // The health port has nothing else; the main port has no health service.
  EXPECT_EQ(RawCall(plain.get(), "/stemma.v1.UserService/ListJobs", c.admin_token()).error_code(),
            StatusCode::UNIMPLEMENTED);
  auto secure = OpenChannel(c.address(), c.ca());
  EXPECT_EQ(RawCall(secure.get(), "/grpc.health.v1.Health/Check", "").error_code(),
            StatusCode::UNIMPLEMENTED);
  // /metrics is on its own port too and shows no token.
  const std::string scrape = Metrics(c);
  EXPECT_NE(scrape.find("stemma_coordinator_jobs"), std::string::npos);
  EXPECT_EQ(scrape.find(c.admin_token()), std::string::npos);
}

TEST(Auth, TlsIsRequiredAndItsCertificateRotatesWithoutARestart) {
  Cluster c;
  c.EnableTls();
  c.EnableTokens();
  c.StartCoordinator();
  EXPECT_EQ(c.Cli({"ls"}).exit_code, 0);
  // Plaintext to a TLS port fails, and says where to look.
  CliResult plain = c.CliAs(c.admin_token(), {"ls"}, {"STEMMA_CA="});
  EXPECT_NE(plain.exit_code, 0);
  // A CA that did not sign the server's certificate fails.
  const std::string ca2 = c.MakeCaAndServerCert("2");
  CliResult wrong = c.CliAs(c.admin_token(), {"ls"}, {"STEMMA_CA=" + ca2});
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("TLS"), std::string::npos) << wrong.err;

  // Rotate: the new pair is renamed over the files the coordinator watches.
  std::filesystem::copy_file(c.dir() + "/server-2.key", c.server_key() + ".new");
  std::filesystem::copy_file(c.dir() + "/server-2.pem", c.server_cert() + ".new");
  std::filesystem::rename(c.server_key() + ".new", c.server_key());
  std::filesystem::rename(c.server_cert() + ".new", c.server_cert());
  EXPECT_TRUE(c.WaitUntil(
      [&] { return c.CliAs(c.admin_token(), {"ls"}, {"STEMMA_CA=" + ca2}).exit_code == 0; }, 30))
      << Cluster::ReadFile(c.dir() + "/coordinator.log");
  EXPECT_NE(c.CliAs(c.admin_token(), {"ls"}, {"STEMMA_CA=" + c.ca()}).exit_code, 0);
}

TEST(Auth, MutualTlsWorkerIsNamedByItsCertificate) {
  Cluster c;
  c.EnableTls(/*mtls=*/true);
  c.EnableTokens();
  c.StartCoordinator();
  const std::string cert = c.MakeClientCert("w-cert");
  const std::string key = cert.substr(0, cert.size() - 4) + ".key";
  Cluster::WorkerOptions o;
  o.token = "";  // the certificate is the credential
  o.extra = {"--tls-cert", cert, "--tls-key", key};
  c.StartWorker("w-cert", o);
  c.WaitForWorkers(1);
  // The same certificate under another name is refused.
  c.StartWorker("w-impostor", o);
  EXPECT_TRUE(c.WaitUntil(
      [&] {
        return Cluster::ReadFile(c.dir() + "/worker-w-impostor.log")
                   .find("cannot register as 'w-impostor'") != std::string::npos;
      },
      20))
      << Cluster::ReadFile(c.dir() + "/worker-w-impostor.log");
  auto workers = c.Cli({"workers", "-o", "json"}).Json();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0]["id"], "w-cert");
  // And the CLI, with a token but no certificate, still works on the same port.
  EXPECT_EQ(c.Cli({"ls"}).exit_code, 0);
}

TEST(Auth, CliTokenFileModeIsCheckedAndTokensReloadAndRevoke) {
  Cluster c;
  c.EnableTokens();
  c.StartCoordinator();
  // Created with the CLI: printed once, only its digest in the file.
  CliResult made = c.CliAs(
      "", {"token", "create", "--role", "user", "--subject", "carol", "--file", c.tokens_file()});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  std::string token = made.out.substr(0, made.out.find('\n'));
  EXPECT_EQ(token.rfind("stm_", 0), 0u);
  EXPECT_EQ(Cluster::ReadFile(c.tokens_file()).find(token), std::string::npos);
  EXPECT_NE(Cluster::ReadFile(c.tokens_file()).find("sha256:" + Sha256Hex(token) + " user carol"),
            std::string::npos);

  // From ~/.config/stemma/token, which must be private.
  std::filesystem::create_directories(c.dir() + "/.config/stemma");
  const std::string file = c.dir() + "/.config/stemma/token";
  std::ofstream(file) << token << "\n";
  ::chmod(file.c_str(), 0644);
  CliResult open_mode = c.CliAs("", {"ls"});
  EXPECT_EQ(open_mode.exit_code, 2);  // a bad token file: bad input
  EXPECT_NE(open_mode.err.find(file), std::string::npos) << open_mode.err;
  EXPECT_NE(open_mode.err.find("chmod 600"), std::string::npos) << open_mode.err;
  ::chmod(file.c_str(), 0600);
  EXPECT_TRUE(c.WaitUntil([&] { return c.CliAs("", {"ls"}).exit_code == 0; }, 10));
  CliResult none = c.CliAs("", {"ls"}, {"HOME=/nonexistent"});
  EXPECT_EQ(none.exit_code, 3);  // refused: no token
  EXPECT_NE(none.err.find("no token"), std::string::npos) << none.err;

  // Revoked by removing its line: refused within seconds, without a restart.
  std::string text = Cluster::ReadFile(c.tokens_file());
  std::string kept;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find(" carol") == std::string::npos) kept += line + "\n";
  }
  std::ofstream(c.tokens_file() + ".new") << kept;
  ::chmod((c.tokens_file() + ".new").c_str(), 0600);
  std::filesystem::rename(c.tokens_file() + ".new", c.tokens_file());
  EXPECT_TRUE(c.WaitUntil([&] { return c.CliAs(token, {"ls"}).exit_code != 0; }, 10));
  EXPECT_NE(c.CliAs(token, {"ls"}).err.find("invalid or revoked token"), std::string::npos);
  EXPECT_EQ(c.Cli({"ls"}).exit_code, 0);  // the admin's line is still there
}

// `stemma up`-style zero config is unchanged: loopback, no TLS, no tokens.
TEST(Auth, LoopbackWithoutSecurityStaysZeroConfig) {
  Cluster c;
  c.StartCoordinator();
  c.StartWorker("w0");
  c.WaitForWorkers(1);
  auto ids = c.Submit("noop: {duration_ms: 10}\n");
  EXPECT_EQ(c.WaitFor(ids[0], {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
}

}  // namespace
}  // namespace stemma::testing
