// More fault tests (issue 13), with a history check after each: a worker cut off from the
// coordinator (a TCP proxy that stops forwarding: no privileges needed), a worker paused
// with SIGSTOP past its lease, the coordinator killed while an experiment is submitted,
// and a checkpoint truncated under the registry.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "common/rpc.h"
#include "stemma/v1/worker_service.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

namespace fs = std::filesystem;

// Forwards TCP between a local port and `target` (HOST:PORT). Partition(true) stops reading
// from both sides (bytes wait in the kernel, as behind a firewall that drops them until the
// network heals); new connections are accepted but get nothing through either.
class TcpProxy {
 public:
  explicit TcpProxy(const std::string& target) {
    const size_t colon = target.rfind(':');
    target_port_ = std::stoi(target.substr(colon + 1));
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(listen_fd_, 64);
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Loop(); });
  }
  ~TcpProxy() {
    stop_ = true;
    thread_.join();
    for (auto& [a, b] : pairs_) ::close(a);
    ::close(listen_fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void Partition(bool on) { partitioned_ = on; }

 private:
  void Loop() {
    char buf[65536];
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      if (!partitioned_) {
        for (auto& [a, b] : pairs_) fds.push_back({a, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (client >= 0) {
          int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          sockaddr_in addr{};
          addr.sin_family = AF_INET;
          addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          addr.sin_port = htons(target_port_);
          if (::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
            pairs_[client] = server;
            pairs_[server] = client;
          } else {
            ::close(client);
            ::close(server);
          }
        }
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const int from = fds[i].fd;
        auto it = pairs_.find(from);
        if (it == pairs_.end()) continue;
        const int to = it->second;
        ssize_t n = ::read(from, buf, sizeof buf);
        bool closed = n <= 0;
        for (ssize_t off = 0; !closed && off < n;) {
          ssize_t w = ::write(to, buf + off, n - off);
          if (w <= 0) closed = true;
          off += w;
        }
        if (closed) {
          ::close(from);
          ::close(to);
          pairs_.erase(from);
          pairs_.erase(to);
        }
      }
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  int target_port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> partitioned_{false};
  std::map<int, int> pairs_;  // fd -> its peer (both directions); the loop's thread only
  std::thread thread_;
};

std::vector<std::string> Lines(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(Cluster::ReadFile(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

double Metric(const Cluster& c, const std::string& name) {
  std::istringstream in(RunShell("curl -s http://" + c.metrics_address() + "/metrics"));
  double total = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) == 0 && (line[name.size()] == ' ' || line[name.size()] == '{')) {
      total += std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return total;
}

// I4 once everything is over: no worker holds anything.
void ExpectNothingAllocated(const Cluster& c) {
  EXPECT_TRUE(c.WaitUntil(
      [&] {
        auto ws = c.Cli({"workers", "-o", "json"}).Json();
        for (const auto& w : ws) {
          if (w.value("cpus_in_use", 0.0) != 0 ||
              !w.value("attempts", nlohmann::json::array()).empty()) {
            return false;
          }
        }
        return true;
      },
      30))
      << c.Cli({"workers", "-o", "json"}).out;
}

// The job's history as the store holds it: SUCCEEDED once, by its last attempt (I2, I3).
void ExpectSucceededOnceBy(const Cluster& c, const std::string& id, int attempt) {
  auto job = c.Get(id);
  EXPECT_EQ(job["state"], "SUCCEEDED") << job.dump();
  EXPECT_EQ(job["attempts"], attempt) << job.dump();
  EXPECT_EQ(job["attempt_id"], id + "." + std::to_string(attempt)) << job.dump();
}

std::string SleepThenRecord(const Cluster& c, const std::string& name, double seconds) {
  return "name: " + name +
         "\nmax_attempts: 3\nbackoff: {initial_ms: 100}\n"
         "exec: {argv: [/bin/sh, -c, 'sleep " +
         std::to_string(seconds) + "; echo $STEMMA_ATTEMPT_ID >> " + c.dir() + "/done']}\n";
}

// F5, shorter than the lease: nothing is requeued, the job just finishes.
TEST(Partition, ShorterThanTheLeaseChangesNothing) {
  Cluster c;
  c.lease_ms = 4000;
  c.StartCoordinator();
  TcpProxy proxy(c.address());
  Cluster::WorkerOptions o;
  o.coordinator = proxy.address();
  c.StartWorker("w0", o);
  c.WaitForWorkers(1);
  const std::string id = c.Submit(SleepThenRecord(c, "short", 2)).at(0);
  ASSERT_EQ(c.WaitFor(id, {"RUNNING"}), "RUNNING");
  proxy.Partition(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_EQ(c.State(id), "RUNNING");
  proxy.Partition(false);
  ASSERT_EQ(c.WaitFor(id, {"SUCCEEDED", "FAILED"}, 60), "SUCCEEDED");
  ExpectSucceededOnceBy(c, id, 1);
  EXPECT_EQ(Lines(c.dir() + "/done"), std::vector<std::string>{id + ".1"});
  ExpectNothingAllocated(c);
}

// F5, longer than the lease: the job is placed again elsewhere; when the network heals the
// cut-off worker's late report is refused, and the job succeeded once, by attempt 2.
TEST(Partition, LongerThanTheLeaseRequeuesAndTheLateReportIsRefused) {
  Cluster c;
  c.lease_ms = 1500;
  c.StartCoordinator();
  TcpProxy proxy(c.address());
  Cluster::WorkerOptions cut;
  cut.coordinator = proxy.address();
  c.StartWorker("w0", cut);
  c.WaitForWorkers(1);
  const std::string id = c.Submit(SleepThenRecord(c, "long", 3)).at(0);
  ASSERT_EQ(c.WaitFor(id, {"RUNNING"}), "RUNNING");
  proxy.Partition(true);
  c.StartWorker("w1");  // direct
  ASSERT_TRUE(c.WaitUntil([&] { return c.Get(id)["attempts"] == 2; }, 30)) << c.Get(id).dump();
  // Attempt 1 ends on the cut-off worker (its child ran on) while nobody hears it.
  ASSERT_TRUE(c.WaitUntil([&] { return Lines(c.dir() + "/done").size() >= 1; }, 30));
  const double stale_before = Metric(c, "stemma_coordinator_stale_reports_total");
  proxy.Partition(false);
  ASSERT_EQ(c.WaitFor(id, {"SUCCEEDED", "FAILED"}, 60), "SUCCEEDED");
  ExpectSucceededOnceBy(c, id, 2);
  // Attempt 1's end is refused either way it comes back: as a report on the old stream
  // (stale, counted) or in the worker's registration after it reconnected (not kept, and
  // the worker forgets it).
  EXPECT_TRUE(c.WaitUntil(
      [&] {
        const std::string log = Cluster::ReadFile(c.dir() + "/coordinator.log");
        return Metric(c, "stemma_coordinator_stale_reports_total") > stale_before ||
               log.find("attempt=" + id + ".1 stale report refused") != std::string::npos ||
               Cluster::ReadFile(c.dir() + "/worker-w0.log")
                       .find("attempt=" + id + ".1 not kept by the coordinator") !=
                   std::string::npos;
      },
      30))
      << "the late report of attempt 1 was not refused";
  // The cut-off worker comes back and holds nothing.
  c.WaitForWorkers(2);
  ExpectNothingAllocated(c);
  const auto done = Lines(c.dir() + "/done");
  EXPECT_EQ(std::set<std::string>(done.begin(), done.end()),
            (std::set<std::string>{id + ".1", id + ".2"}));
}

// Sends `sig` to a process and all its descendants (a whole machine stalling, as a VM pause).
void SignalTree(pid_t root, int sig) {
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    ::kill(p, sig);
    std::istringstream kids(
        RunShell("cat /proc/" + std::to_string(p) + "/task/*/children 2>/dev/null"));
    for (pid_t k; kids >> k;) todo.push_back(k);
  }
}

// F6: a worker (and what it runs) paused past its lease. Its job runs again elsewhere; when
// it resumes it is told its attempt is stale and kills it before it completes, so the job
// ran to completion once; its late reports change nothing.
TEST(Pause, AWorkerStoppedPastItsLeaseLosesItsJobAndItsLateResultsAreRefused) {
  Cluster c;
  c.lease_ms = 1500;
  c.StartCoordinator();
  c.StartWorker("w0");
  c.WaitForWorkers(1);
  const std::string id = c.Submit(SleepThenRecord(c, "paused", 8)).at(0);
  ASSERT_EQ(c.WaitFor(id, {"RUNNING"}), "RUNNING");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  SignalTree(c.worker_pid("w0"), SIGSTOP);
  c.StartWorker("w1");
  ASSERT_TRUE(c.WaitUntil(
      [&] {
        auto j = c.Get(id);
        return j["attempts"] == 2 && j["state"] == "RUNNING";
      },
      30))
      << c.Get(id).dump();
  auto workers = c.Cli({"workers", "-o", "json"}).Json();
  for (const auto& w : workers) {
    if (w["id"] == "w0") EXPECT_EQ(w["state"], "LOST");
  }
  SignalTree(c.worker_pid("w0"), SIGCONT);
  ASSERT_EQ(c.WaitFor(id, {"SUCCEEDED", "FAILED"}, 60), "SUCCEEDED");
  ExpectSucceededOnceBy(c, id, 2);
  c.WaitForWorkers(2);
  ExpectNothingAllocated(c);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // attempt 1 would have ended by now
  EXPECT_EQ(Lines(c.dir() + "/done"), std::vector<std::string>{id + ".2"})
      << "attempt 1 of the paused worker ran to completion";
  ExpectSucceededOnceBy(c, id, 2);
}

// F1 for experiments: the coordinator killed at random moments while `stemma sweep` sends a
// file; after each restart the experiment is there with all its jobs, or not at all
// (8 rounds, kills spread from 0 to 120 ms after the sweep starts).
TEST(ExperimentSubmit, CoordinatorKilledDuringASweepLeavesAllOrNothing) {
  Cluster c;
  c.StartCoordinator();
  std::string yaml = "name: crash\nstages:\n  grid:\n    matrix: {a: [";
  for (int i = 0; i < 60; ++i) yaml += (i ? ", " : "") + std::to_string(i);
  yaml += "], b: [x, y, z]}\n    noop: {duration_ms: 1}\n";
  const std::string file = c.WriteFile("crash.yaml", yaml);
  const unsigned seed = static_cast<unsigned>(::getpid());
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  int present = 0, absent = 0;
  for (int round = 0; round < 8; ++round) {
    CliResult sweep;
    std::thread client([&] { sweep = c.Cli({"--timeout", "20", "sweep", "-f", file}); });
    // Spread over the sweep's life: before it connects, during the commit, after the answer.
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 15 + rng() % 15));
    c.KillCoordinator(SIGKILL);
    client.join();
    c.StartCoordinator();
    auto jobs = c.Cli({"ls", "--all", "-o", "json"}).Json();
    auto exps = c.Cli({"exp", "ls", "-o", "json"});
    ASSERT_EQ(exps.exit_code, 0) << exps.err;
    const bool listed = exps.out.find("\"crash\"") != std::string::npos;
    if (listed) {
      ++present;
      EXPECT_EQ(jobs.size(), 180u) << "the experiment is there but not all of its jobs";
    } else {
      ++absent;
      EXPECT_EQ(jobs.size(), 0u) << "jobs without their experiment";
    }
    if (sweep.exit_code == 0) EXPECT_TRUE(listed) << "acknowledged, then lost";
    // Start the next round from nothing.
    c.KillCoordinator(SIGKILL);
    fs::remove_all(c.coordinator_data());
    c.StartCoordinator();
  }
  std::fprintf(stderr, "history: experiment present after %d kills, absent after %d\n", present,
               absent);
  EXPECT_EQ(c.Cli({"ls", "--all", "-o", "json"}).Json().size(), 0u);
}

// The engine for tests that need one: beside the binaries under test, or $STEMMA_ENGINE.
std::string EngineDir() {
  if (fs::exists(Cluster::BinDir() + "/stemma-engine")) return Cluster::BinDir();
  const char* e = std::getenv("STEMMA_ENGINE");
  if (e != nullptr && fs::exists(e)) return fs::path(e).parent_path().string();
  return "";
}

// F8: a registered checkpoint whose weights are truncated afterwards (a bad copy).
class CorruptCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = EngineDir();
    if (engine_.empty())
      GTEST_SKIP() << "no stemma-engine (build with the engine or set STEMMA_ENGINE)";
    c_.StartCoordinator();
    const std::string root = c_.dir() + "/store";
    fs::create_directories(root);
    const std::string old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
    ::setenv("PATH", (engine_ + ":" + old_path).c_str(), 1);
    Cluster::WorkerOptions w;
    w.cpus = 2;
    w.extra = {"--storage-root", root};
    c_.StartWorker("w0", w);
    ::setenv("PATH", old_path.c_str(), 1);
    c_.WaitForWorkers(1);
    first_ =
        c_.Submit("name: base\ninit: {arch: llama, preset: tiny, seed: 7, out: models/a}\n").at(0);
    ASSERT_EQ(c_.WaitFor(first_, {"SUCCEEDED", "FAILED"}, 300), "SUCCEEDED")
        << c_.Get(first_).dump();
    model_ = c_.Get(first_)["outputs"]["model"];
    auto ls = c_.Cli({"ckpt", "ls", "--job", first_, "-o", "json"});
    ASSERT_EQ(ls.exit_code, 0) << ls.err;
    auto arts = ls.Json();
    ASSERT_EQ(arts.size(), 1u) << ls.out;
    artifact_ = arts[0]["id"];
    ASSERT_EQ(c_.Cli({"ckpt", "verify", artifact_}).exit_code, 0);
    const std::string weights = model_ + "/model.safetensors";
    ASSERT_TRUE(fs::exists(weights));
    fs::resize_file(weights, fs::file_size(weights) / 2);
  }

  std::string engine_, first_, model_, artifact_;
  Cluster c_;
};

TEST_F(CorruptCheckpoint, VerifyNamesTheTruncatedFile) {
  auto verify = c_.Cli({"ckpt", "verify", artifact_});
  EXPECT_EQ(verify.exit_code, 1) << verify.out;
  EXPECT_NE(verify.out.find(artifact_ + " FAILED"), std::string::npos) << verify.out;
  EXPECT_NE(verify.out.find("model.safetensors"), std::string::npos) << verify.out;
}

// Known gap (found here): a memoized hit is checked only for its manifest being present
// (coordinator/experiments OutputsStillThere), not against it, so the same job submitted
// again is served the truncated checkpoint. Enable once the cache check compares at least
// the manifest's file sizes.
TEST_F(CorruptCheckpoint, ATruncatedCheckpointIsNotServedFromTheCache) {
  // The same job with another output directory (the cache key leaves outputs out).
  const std::string second =
      c_.Submit("name: base2\ninit: {arch: llama, preset: tiny, seed: 7, out: models/b}\n").at(0);
  ASSERT_EQ(c_.WaitFor(second, {"SUCCEEDED", "FAILED"}, 300), "SUCCEEDED") << c_.Get(second).dump();
  auto job = c_.Get(second);
  EXPECT_EQ(std::string(job["reason"]).find("memoized"), std::string::npos)
      << "served from a checkpoint that does not verify: " << job.dump();
  EXPECT_NE(std::string(job["outputs"]["model"]), model_);
}

// A simulated worker speaking the real protocol (reliability_perf.md L4): registers with one
// CPU, starts what it is given and never finishes it, heartbeats, and when its stream breaks
// reconnects (jittered backoff) and registers again with what it runs.
class SimWorker {
 public:
  SimWorker(std::string address, std::string id, unsigned seed)
      : address_(std::move(address)), id_(std::move(id)), rng_(seed), thread_([this] { Run(); }) {}
  ~SimWorker() {
    stop_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ctx_) ctx_->TryCancel();
    }
    thread_.join();
  }
  int registrations() const { return registrations_; }
  std::set<std::string> running() {
    std::lock_guard<std::mutex> lock(mu_);
    return running_;
  }

 private:
  void Run() {
    auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    auto stub = v1::WorkerService::NewStub(channel);
    while (!stop_) {
      auto ctx = std::make_shared<grpc::ClientContext>();
      {
        std::lock_guard<std::mutex> lock(mu_);
        ctx_ = ctx;
      }
      auto stream = stub->Session(ctx.get());
      v1::WorkerMessage reg;
      auto* r = reg.mutable_register_();
      r->mutable_info()->set_id(id_);
      r->mutable_info()->set_cpus(1);
      r->mutable_info()->set_memory_mb(1024);
      r->set_incarnation("sim-" + id_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& a : running_) {
          auto* run = r->add_running();
          run->set_attempt_id(a);
          run->set_rank(0);
        }
      }
      std::atomic<bool> open(stream->Write(reg));
      std::mutex write_mu;
      std::thread beats([&] {
        for (uint64_t seq = 1; open && !stop_; ++seq) {
          v1::WorkerMessage hb;
          hb.mutable_heartbeat()->set_seq(seq);
          {
            std::lock_guard<std::mutex> lock(write_mu);
            if (!stream->Write(hb)) break;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
      });
      v1::CoordinatorMessage msg;
      while (open && stream->Read(&msg)) {
        std::vector<const v1::CoordinatorMessage*> all{&msg};
        if (msg.has_batch()) {
          all.clear();
          for (const auto& m : msg.batch().messages()) all.push_back(&m);
        }
        for (const v1::CoordinatorMessage* m : all) {
          if (m->has_registered()) {
            ++registrations_;
            std::lock_guard<std::mutex> lock(mu_);
            std::set<std::string> kept;
            for (const auto& k : m->registered().keep()) kept.insert(k.attempt_id());
            running_ = kept;
          } else if (m->has_assign()) {
            v1::WorkerMessage started;
            auto* e = started.mutable_event();
            e->set_attempt_id(m->assign().attempt_id());
            e->set_event_seq(++event_seq_);
            e->mutable_started()->set_pid(1);
            {
              std::lock_guard<std::mutex> lock(mu_);
              running_.insert(m->assign().attempt_id());
            }
            std::lock_guard<std::mutex> lock(write_mu);
            stream->Write(started);
          }
        }
      }
      open = false;
      beats.join();
      if (stop_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng_() % 400));
    }
  }

  const std::string address_, id_;
  std::mt19937 rng_;
  std::atomic<bool> stop_{false};
  std::atomic<int> registrations_{0};
  uint64_t event_seq_ = 0;
  std::mutex mu_;
  std::shared_ptr<grpc::ClientContext> ctx_;
  std::set<std::string> running_;
  std::thread thread_;
};

double JobsIn(const Cluster& c, const std::string& state) {
  std::istringstream in(RunShell("curl -s http://" + c.metrics_address() + "/metrics"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("stemma_coordinator_jobs{", 0) == 0 &&
        line.find("state=\"" + state + "\"") != std::string::npos) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return 0;
}

// L4: 10,000 jobs queued, 100 workers each running one; the coordinator is killed and
// restarted; every worker reattaches at once (a thundering herd), nothing is requeued
// because of the restart, and the queue is intact.
TEST(ThunderingHerd, EveryWorkerReattachesAfterARestartAndNothingIsRequeued) {
  Cluster c;
  c.lease_ms = 10000;
  c.StartCoordinator();
  std::string yaml = "jobs:\n";
  for (int i = 0; i < 5000; ++i) yaml += "  - {noop: {duration_ms: 600000}}\n";
  const std::string file = c.WriteFile("jobs.yaml", yaml);
  for (int b = 0; b < 2; ++b)
    ASSERT_EQ(c.Cli({"--timeout", "120", "submit", "-f", file}).exit_code, 0);
  constexpr int kWorkers = 100;
  std::vector<std::unique_ptr<SimWorker>> sims;
  for (int i = 0; i < kWorkers; ++i) {
    sims.push_back(std::make_unique<SimWorker>(c.address(), "sim" + std::to_string(i), 1000 + i));
  }
  ASSERT_TRUE(c.WaitUntil([&] { return JobsIn(c, "RUNNING") == kWorkers; }, 60))
      << JobsIn(c, "RUNNING");
  std::set<std::string> before;
  for (auto& s : sims) {
    auto r = s->running();
    EXPECT_EQ(r.size(), 1u);
    before.insert(r.begin(), r.end());
  }
  ASSERT_EQ(before.size(), static_cast<size_t>(kWorkers));

  c.KillCoordinator(SIGKILL);
  c.StartCoordinator();
  ASSERT_TRUE(c.WaitUntil(
      [&] {
        for (auto& s : sims)
          if (s->registrations() < 2) return false;
        return true;
      },
      60))
      << "not every worker re-registered";
  c.WaitForWorkers(kWorkers);
  // Nothing requeued: the same attempts run, each still attempt 1, on the same workers.
  EXPECT_TRUE(c.WaitUntil([&] { return JobsIn(c, "RUNNING") == kWorkers; }, 30))
      << JobsIn(c, "RUNNING");
  EXPECT_EQ(JobsIn(c, "QUEUED"), 10000 - kWorkers);
  std::set<std::string> after;
  for (auto& s : sims) {
    auto r = s->running();
    after.insert(r.begin(), r.end());
  }
  EXPECT_EQ(after, before);
  for (const auto& attempt : before) EXPECT_EQ(attempt.substr(attempt.rfind('.')), ".1") << attempt;
  for (int i = 0; i < kWorkers; i += 25) {
    auto job = c.Get(std::string(*std::next(before.begin(), i))
                         .substr(0, std::next(before.begin(), i)->rfind('.')));
    EXPECT_EQ(job["state"], "RUNNING");
    EXPECT_EQ(job["attempts"], 1);
  }
  sims.clear();
}

}  // namespace
}  // namespace stemma::testing
