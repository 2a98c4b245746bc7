// The TokenReview client against a fake API server: a real HTTPS server (Python's
// http.server with ssl, tests/k8s/fake_apiserver.py) with a CA and certificate made by
// openssl here, answering TokenReview as the Kubernetes API does.
#include "common/k8s_token_review.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/https_client.h"

namespace stemma {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int Lines(const std::string& path) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

class FakeApiServer : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/stemma-k8s-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    MakeCa("ca", "127.0.0.1");
    MakeCa("other", "127.0.0.1");  // a CA that signed nothing the server has
    std::ofstream(dir_ + "/reviews.json") << R"({
      "tok-w1": {"username": "system:serviceaccount:stemma:stemma-worker", "pod": "stemma-worker-gpu8-0"},
      "chunked-w2": {"username": "system:serviceaccount:stemma:stemma-worker", "pod": "stemma-worker-gpu8-1"},
      "tok-ops": {"username": "system:serviceaccount:stemma:stemma-ops"},
      "tok-nopod": {"username": "system:serviceaccount:stemma:stemma-worker"},
      "tok-other-sa": {"username": "system:serviceaccount:default:builder", "pod": "p"},
      "tok-vault": {"username": "system:serviceaccount:stemma:stemma-worker", "pod": "x",
                    "audiences": ["vault"]},
      "tok-human": {"username": "alice@example.com"}
    })";
    WriteOwnToken("caller-secret");
    StartServer(0);
  }

  void TearDown() override {
    StopServer();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  void MakeCa(const std::string& name, const std::string& ip) {
    std::ofstream(dir_ + "/san.ext") << "subjectAltName=IP:" << ip << "\n";
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
    const std::string cmd = "cd " + dir_ + " && (openssl req -x509" + ec + "-keyout " + name +
                            "-ca.key -out " + name + "-ca.pem -days 2 -subj /CN=test-" + name +
                            "-ca && openssl req" + ec + "-keyout " + name + "-server.key -out " +
                            name + "-server.csr -subj /CN=kubernetes && openssl x509 -req -in " +
                            name + "-server.csr -CA " + name + "-ca.pem -CAkey " + name +
                            "-ca.key -CAcreateserial -out " + name +
                            "-server.pem -days 2 -extfile san.ext) >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }

  void WriteOwnToken(const std::string& token) {
    const std::string path = dir_ + "/own-token";
    std::ofstream(path, std::ios::trunc) << token << "\n";
    ::chmod(path.c_str(), 0600);
  }

  void StartServer(double delay_s) {
    const std::string port_file = dir_ + "/port";
    std::filesystem::remove(port_file);
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const std::string delay = std::to_string(delay_s);
      execlp("python3", "python3", STEMMA_FAKE_APISERVER, "--cert",
             (dir_ + "/ca-server.pem").c_str(), "--key", (dir_ + "/ca-server.key").c_str(),
             "--port-file", port_file.c_str(), "--reviews", (dir_ + "/reviews.json").c_str(),
             "--caller-token", "caller-secret", "--log", (dir_ + "/requests.log").c_str(),
             "--delay-s", delay.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 200 && !std::filesystem::exists(port_file); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(std::filesystem::exists(port_file)) << "the fake API server did not start";
    url_ = "https://127.0.0.1:" + Slurp(port_file);
  }

  void StopServer() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  TokenReviewOptions Options() {
    TokenReviewOptions o;
    o.api_server = url_;
    o.ca_file = dir_ + "/ca-ca.pem";
    o.token_file = dir_ + "/own-token";
    o.roles = {{"stemma/stemma-worker", Role::kWorker}, {"stemma/stemma-ops", Role::kAdmin}};
    o.timeout_ms = 5000;
    return o;
  }

  std::unique_ptr<TokenReviewer> Reviewer(TokenReviewOptions o) {
    auto r = TokenReviewer::Create(std::move(o));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return nullptr;
    (*r)->SetClockForTest([this] { return now_ms_.load(); });
    return std::move(*r);
  }

  std::string dir_;
  std::string url_;
  pid_t pid_ = -1;
  std::atomic<int64_t> now_ms_{1000};
};

TEST_F(FakeApiServer, AWorkerTokenIsThePodItIsBoundTo) {
  auto r = Reviewer(Options());
  ASSERT_NE(r, nullptr);
  absl::StatusOr<TokenIdentity> id = r->Review("tok-w1");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->role, Role::kWorker);
  EXPECT_EQ(id->subject, "stemma-worker-gpu8-0");
  // The review was made with the coordinator's own token, for the audience "stemma".
  const std::string log = Slurp(dir_ + "/requests.log");
  EXPECT_NE(log.find("\"authorization\": \"Bearer caller-secret\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"audiences\": [\"stemma\"]"), std::string::npos) << log;
  EXPECT_NE(log.find("/apis/authentication.k8s.io/v1/tokenreviews"), std::string::npos) << log;
  // A chunked answer reads the same.
  id = r->Review("chunked-w2");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->subject, "stemma-worker-gpu8-1");
}

TEST_F(FakeApiServer, OtherRolesAreTheirServiceAccount) {
  auto r = Reviewer(Options());
  ASSERT_NE(r, nullptr);
  absl::StatusOr<TokenIdentity> id = r->Review("tok-ops");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->role, Role::kAdmin);
  EXPECT_EQ(id->subject, "stemma/stemma-ops");
}

TEST_F(FakeApiServer, RefusesWhatTheClusterOrTheRolesDoNotVouchFor) {
  auto r = Reviewer(Options());
  ASSERT_NE(r, nullptr);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tok-unknown", "does not authenticate this token: invalid bearer token"},
      {"tok-other-sa", "service account default/builder has no role"},
      {"tok-nopod", "must be bound to a pod"},
      {"tok-vault", "token audiences do not match"},
      {"tok-human", "'alice@example.com' is not a service account"},
  };
  for (const auto& [token, why] : cases) {
    absl::StatusOr<TokenIdentity> id = r->Review(token);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kNotFound) << token << ": " << id.status();
    EXPECT_NE(id.status().ToString().find(why), std::string::npos) << token << ": " << id.status();
  }
}

TEST_F(FakeApiServer, AnswersAreCachedForTheirTtl) {
  TokenReviewOptions o = Options();
  o.ttl_ms = 60000;
  o.refused_ttl_ms = 5000;
  auto r = Reviewer(o);
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(r->Review("tok-w1").ok());
  ASSERT_TRUE(r->Review("tok-w1").ok());
  EXPECT_FALSE(r->Review("tok-unknown").ok());
  EXPECT_FALSE(r->Review("tok-unknown").ok());
  EXPECT_EQ(r->calls(), 2);
  EXPECT_EQ(Lines(dir_ + "/requests.log"), 2);
  now_ms_ += 6000;  // the refusal expired, the acceptance did not
  EXPECT_FALSE(r->Review("tok-unknown").ok());
  ASSERT_TRUE(r->Review("tok-w1").ok());
  EXPECT_EQ(r->calls(), 3);
  now_ms_ += 60000;
  ASSERT_TRUE(r->Review("tok-w1").ok());
  EXPECT_EQ(r->calls(), 4);
}

TEST_F(FakeApiServer, ApiServerDownIsUnavailableNotAcceptedAndCachedAnswersHold) {
  auto r = Reviewer(Options());
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(r->Review("tok-w1").ok());
  StopServer();
  absl::StatusOr<TokenIdentity> id = r->Review("tok-ops");
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable) << id.status();
  EXPECT_NE(id.status().message().find("token review: POST " + url_), std::string::npos)
      << id.status();
  EXPECT_NE(id.status().message().find("Connection refused"), std::string::npos) << id.status();
  // Not cached: a second try asks again (and fails again), and the accepted token holds.
  EXPECT_EQ(r->Review("tok-ops").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(r->Review("tok-w1").ok());
  // Back up: the same token is accepted.
  StartServer(0);
  TokenReviewOptions o = Options();
  auto again = Reviewer(o);
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(again->Review("tok-ops").ok());
}

TEST_F(FakeApiServer, ASlowApiServerTimesOut) {
  StopServer();
  StartServer(3);
  TokenReviewOptions o = Options();
  o.timeout_ms = 300;
  auto r = Reviewer(o);
  ASSERT_NE(r, nullptr);
  absl::StatusOr<TokenIdentity> id = r->Review("tok-w1");
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable) << id.status();
  EXPECT_NE(id.status().message().find("timed out"), std::string::npos) << id.status();
}

TEST_F(FakeApiServer, AServerTheCaDidNotSignIsRefused) {
  TokenReviewOptions o = Options();
  o.ca_file = dir_ + "/other-ca.pem";
  auto r = Reviewer(o);
  ASSERT_NE(r, nullptr);
  absl::StatusOr<TokenIdentity> id = r->Review("tok-w1");
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable) << id.status();
  EXPECT_NE(id.status().message().find("certificate did not verify"), std::string::npos)
      << id.status();
  EXPECT_EQ(Lines(dir_ + "/requests.log"), 0);  // nothing was sent
}

TEST_F(FakeApiServer, TheCoordinatorsOwnTokenRefusedSaysWhy) {
  WriteOwnToken("expired-secret");
  auto r = Reviewer(Options());
  ASSERT_NE(r, nullptr);
  absl::StatusOr<TokenIdentity> id = r->Review("tok-w1");
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable) << id.status();
  EXPECT_NE(id.status().message().find("HTTP 401"), std::string::npos) << id.status();
  EXPECT_NE(id.status().message().find("system:auth-delegator"), std::string::npos);
  // The file is read for each review: a rotated token is picked up.
  WriteOwnToken("caller-secret");
  EXPECT_TRUE(r->Review("tok-w1").ok());
}

TEST_F(FakeApiServer, BadOptionsNameTheFlag) {
  TokenReviewOptions o = Options();
  o.api_server = "http://127.0.0.1:6443";
  EXPECT_NE(TokenReviewer::Create(o).status().message().find("--k8s-token-review"),
            std::string::npos);
  o = Options();
  o.roles.clear();
  EXPECT_NE(TokenReviewer::Create(o).status().message().find("--k8s-role"), std::string::npos);
  o = Options();
  o.ca_file = dir_ + "/missing.pem";
  EXPECT_NE(TokenReviewer::Create(o).status().message().find("--k8s-ca"), std::string::npos);
  o = Options();
  o.token_file = dir_ + "/missing-token";
  EXPECT_NE(TokenReviewer::Create(o).status().message().find("--k8s-token-file"),
            std::string::npos);
}

TEST(K8sRole, Parses) {
  std::map<std::string, Role> roles;
  EXPECT_TRUE(ParseK8sRole("stemma/stemma-worker=worker", &roles).ok());
  EXPECT_TRUE(ParseK8sRole("ops/admins=admin", &roles).ok());
  EXPECT_EQ(roles.at("stemma/stemma-worker"), Role::kWorker);
  EXPECT_EQ(roles.at("ops/admins"), Role::kAdmin);
  for (const char* bad :
       {"stemma-worker=worker", "stemma/=worker", "a/b", "a/b=root", "a/b/c=worker"}) {
    absl::Status st = ParseK8sRole(bad, &roles);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("--k8s-role"), std::string::npos) << bad << ": " << st;
  }
}

TEST(HttpsUrl, Splits) {
  auto u = ParseHttpsUrl("https://kubernetes.default.svc");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "kubernetes.default.svc");
  EXPECT_EQ(u->port, "443");
  EXPECT_EQ(u->path, "/");
  u = ParseHttpsUrl("https://[::1]:6443/api");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, "6443");
  EXPECT_EQ(u->path, "/api");
  for (const char* bad :
       {"http://x", "https://", "https://host:0", "https://host:99999", "https://[::1"}) {
    EXPECT_FALSE(ParseHttpsUrl(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace stemma
