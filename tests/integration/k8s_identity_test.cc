// Worker identity from the cluster, end to end: a real coordinator with
// --k8s-token-review against a fake Kubernetes API server (tests/k8s/fake_apiserver.py:
// HTTPS, TokenReview), real workers presenting "projected" tokens. A worker is accepted as
// the pod its token is bound to, an impostor is refused, and the API server going away
// refuses new workers (UNAVAILABLE, counted) without harming the coordinator; when it is
// back they register.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

std::string Metrics(const Cluster& c) {
  return RunShell("curl -s http://" + c.metrics_address() + "/metrics");
}

double MetricValue(const std::string& scrape, const std::string& series) {
  size_t at = scrape.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(scrape.substr(at + series.size() + 2));
}

bool Registered(const Cluster& c, const std::string& name) {
  auto r = c.Cli({"workers", "-o", "json"});
  if (r.exit_code != 0) return false;
  for (const auto& w : r.Json()) {
    if (w.value("id", "") == name && w.value("state", "") == "ALIVE") return true;
  }
  return false;
}

class K8sIdentity : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.EnableTls();
    c_.EnableTokens();
    api_ca_ = c_.MakeCaAndServerCert("api");
    c_.WriteFile("reviews.json", R"({
      "tok-pod-0": {"username": "system:serviceaccount:stemma:stemma-worker", "pod": "stemma-worker-gpu8-0"},
      "tok-pod-1": {"username": "system:serviceaccount:stemma:stemma-worker", "pod": "stemma-worker-gpu8-1"}
    })");
    own_ = c_.WriteFile("own-token", "coordinator-sa-token\n");
    ::chmod(own_.c_str(), 0600);
    StartApiServer();
    c_.StartCoordinator({"--k8s-token-review", url_, "--k8s-ca", api_ca_, "--k8s-token-file", own_,
                         "--k8s-role", "stemma/stemma-worker=worker", "--k8s-review-ttl-s", "1"});
  }
  void TearDown() override { StopApiServer(); }

  void StartApiServer() {
    const std::string port_file = c_.dir() + "/api-port";
    std::filesystem::remove(port_file);
    api_ = fork();
    ASSERT_GE(api_, 0);
    if (api_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const std::string d = c_.dir();
      // Back on the same port as before (the coordinator's --k8s-token-review names it).
      const std::string port = url_.empty() ? "0" : url_.substr(url_.rfind(':') + 1);
      execlp("python3", "python3", STEMMA_FAKE_APISERVER, "--cert", (d + "/server-api.pem").c_str(),
             "--key", (d + "/server-api.key").c_str(), "--port", port.c_str(), "--port-file",
             port_file.c_str(), "--reviews", (d + "/reviews.json").c_str(), "--caller-token",
             "coordinator-sa-token", "--log", (d + "/api-requests.log").c_str(),
             static_cast<char*>(nullptr));
      _exit(127);
    }
    ASSERT_TRUE(c_.WaitUntil([&] { return std::filesystem::exists(port_file); }, 20));
    const std::string port = Cluster::ReadFile(port_file);
    if (url_.empty()) url_ = "https://127.0.0.1:" + port;
    ASSERT_EQ(url_, "https://127.0.0.1:" + port) << "the fake API server came back elsewhere";
  }
  void StopApiServer() {
    if (api_ > 0) {
      kill(api_, SIGKILL);
      waitpid(api_, nullptr, 0);
      api_ = -1;
    }
  }

  Cluster c_;
  std::string api_ca_;
  std::string own_;
  std::string url_;
  pid_t api_ = -1;
};

TEST_F(K8sIdentity, AWorkerIsThePodItsTokenIsBoundToAndAnImpostorIsRefused) {
  c_.StartWorker("stemma-worker-gpu8-0", {.token = "tok-pod-0"});
  ASSERT_TRUE(c_.WaitUntil([&] { return Registered(c_, "stemma-worker-gpu8-0"); }, 30))
      << Cluster::ReadFile(c_.dir() + "/coordinator.log");
  // A job runs there, like on any worker.
  auto ids = c_.Submit("noop: {duration_ms: 10}\n");
  EXPECT_EQ(c_.WaitFor(ids[0], {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  // The coordinator asked with its own token, for the audience stemma.
  const std::string asked = Cluster::ReadFile(c_.dir() + "/api-requests.log");
  EXPECT_NE(asked.find("\"authorization\": \"Bearer coordinator-sa-token\""), std::string::npos);
  EXPECT_NE(asked.find("\"audiences\": [\"stemma\"]"), std::string::npos);

  // pod-1's token presented by a worker that calls itself something else.
  c_.StartWorker("impostor", {.token = "tok-pod-1"});
  ASSERT_TRUE(c_.WaitUntil(
      [&] {
        return MetricValue(Metrics(c_), "stemma_auth_failures_total{reason=\"wrong_identity\"}") >=
               1;
      },
      30));
  EXPECT_FALSE(Registered(c_, "impostor"));
  // An unknown bearer token is refused like a bad Stemma token.
  c_.StartWorker("stemma-worker-gpu8-2", {.token = "tok-nobody"});
  ASSERT_TRUE(c_.WaitUntil(
      [&] {
        return MetricValue(Metrics(c_), "stemma_auth_failures_total{reason=\"bad_token\"}") >= 1;
      },
      30));
  EXPECT_FALSE(Registered(c_, "stemma-worker-gpu8-2"));
  // Users' Stemma tokens never go to the API server.
  EXPECT_EQ(Cluster::ReadFile(c_.dir() + "/api-requests.log").find("stm_"), std::string::npos);
}

TEST_F(K8sIdentity, TheApiServerDownRefusesNewWorkersAndTheyRegisterWhenItIsBack) {
  StopApiServer();
  c_.StartWorker("stemma-worker-gpu8-1", {.token = "tok-pod-1"});
  ASSERT_TRUE(c_.WaitUntil(
      [&] {
        return MetricValue(Metrics(c_),
                           "stemma_auth_failures_total{reason=\"token_review_unavailable\"}") >= 1;
      },
      30));
  EXPECT_FALSE(Registered(c_, "stemma-worker-gpu8-1"));
  const std::string log = Cluster::ReadFile(c_.dir() + "/coordinator.log");
  EXPECT_NE(log.find("token review: POST " + url_), std::string::npos) << log;
  // The coordinator carries on: users are served.
  EXPECT_EQ(c_.Cli({"workers"}).exit_code, 0);
  StartApiServer();
  EXPECT_TRUE(c_.WaitUntil([&] { return Registered(c_, "stemma-worker-gpu8-1"); }, 60))
      << Cluster::ReadFile(c_.dir() + "/worker-stemma-worker-gpu8-1.log");
}

}  // namespace
}  // namespace stemma::testing
