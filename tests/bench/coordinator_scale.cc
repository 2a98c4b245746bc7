// coordinator_scale: one real stemma-coordinator under load.
//   1. durable submits: C client threads submit single-job requests (each answered only
//      after its commit) until J jobs are queued;
//   2. W simulated workers (callback-API bidi streams speaking the real WorkerService
//      protocol, G fake GPUs each) register, heartbeat every H ms, start what they are
//      assigned and finish it after a random duration, which frees a GPU and triggers the
//      next placement;
//   3. for M seconds it measures heartbeat round trips and scheduling latency (a GPU freed
//      by a Finished report → the next Assignment received by that worker).
// Last line: {"durable_submits_per_s", "heartbeat_p99_ms", "schedule_p99_ms",
// "coordinator_rss_mib", ...}.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "stemma/v1/user_service.grpc.pb.h"
#include "stemma/v1/worker_service.grpc.pb.h"

namespace v1 = stemma::v1;
using Clock = std::chrono::steady_clock;

namespace {

double NowMs() {
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
}

struct Samples {
  std::mutex mu;
  std::vector<double> v;
  std::atomic<bool> recording{false};
  void Add(double x) {
    if (!recording) return;
    std::lock_guard<std::mutex> l(mu);
    v.push_back(x);
  }
  double Pct(double p) {
    std::lock_guard<std::mutex> l(mu);
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return v.size();
  }
};

Samples g_heartbeat, g_schedule;
std::atomic<int64_t> g_assigned{0}, g_finished{0}, g_points{0};

// Finishes due at a time: (due ms, worker index, attempt id).
struct Due {
  double at;
  int worker;
  std::string attempt;
  bool operator>(const Due& o) const { return at > o.at; }
};
std::mutex g_due_mu;
std::priority_queue<Due, std::vector<Due>, std::greater<Due>> g_due;

class SimWorker : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  SimWorker(int index, v1::WorkerService::Stub* stub, int gpus, double min_s, double max_s,
            int metrics_per_job)
      : index_(index),
        rng_(index),
        min_s_(min_s),
        max_s_(max_s),
        metrics_per_job_(metrics_per_job) {
    v1::WorkerMessage reg;
    auto* info = reg.mutable_register_()->mutable_info();
    info->set_id("sim-" + std::to_string(index));
    info->set_host("127.0.0.1");
    info->set_cpus(64);
    info->set_memory_mb(512 * 1024);
    for (int g = 0; g < gpus; ++g) {
      auto* gpu = info->add_gpus();
      gpu->set_id(g);
      gpu->set_model("sim");
    }
    reg.mutable_register_()->set_incarnation(std::to_string(index));
    reg.mutable_register_()->set_accepts_batches(true);  // OnReadDone unpacks them
    stub->async()->Session(&ctx_, this);
    Send(std::move(reg));
    StartRead(&in_);
    StartCall();
  }

  void Send(v1::WorkerMessage m) {
    std::lock_guard<std::mutex> l(mu_);
    if (done_) return;
    out_.push_back(std::move(m));
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
  }

  void Heartbeat() {
    v1::WorkerMessage m;
    uint64_t seq = ++hb_seq_;
    m.mutable_heartbeat()->set_seq(seq);
    {
      std::lock_guard<std::mutex> l(mu_);
      hb_sent_[seq] = NowMs();
    }
    Send(std::move(m));
  }

  void Finish(const std::string& attempt) {
    v1::WorkerMessage m;
    // With --metrics-per-job N the attempt first reports N training steps' metrics (as the
    // worker forwards an engine's step events: one MetricBatch of the attempt's points), in
    // the same message.
    auto* ev = metrics_per_job_ > 0 ? m.mutable_events()->add_events() : m.mutable_event();
    if (metrics_per_job_ > 0) {
      ev->set_attempt_id(attempt);
      auto* batch = ev->mutable_metrics();
      batch->add_names("loss");
      batch->add_names("tokens_per_s");
      const int64_t now = static_cast<int64_t>(NowMs());
      for (int i = 0; i < metrics_per_job_; ++i) {
        batch->add_name_index(i % 2);
        batch->add_steps(i / 2 + 1);
        batch->add_values(i % 2 == 0 ? 3.0 / (1 + i) : 5000 + i);
        batch->add_times_ms(now);
      }
      ev = m.mutable_events()->add_events();
    }
    g_points += metrics_per_job_;
    ev->set_attempt_id(attempt);
    ev->set_event_seq(++event_seq_);
    ev->mutable_finished()->set_exit_code(0);
    ev->mutable_finished()->set_reason("exit 0");
    ev->mutable_finished()->set_retryable(true);
    {
      std::lock_guard<std::mutex> l(mu_);
      freed_at_.push_back(NowMs());
    }
    g_finished++;
    Send(std::move(m));
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> l(mu_);
    out_.pop_front();
    if (!ok) {
      done_ = true;
      out_.clear();
      writing_ = false;
      return;
    }
    if (!out_.empty()) {
      StartWrite(&out_.front());
    } else {
      writing_ = false;
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    const double now = NowMs();
    if (in_.has_batch()) {
      for (const v1::CoordinatorMessage& m : in_.batch().messages()) Handle(m, now);
    } else {
      Handle(in_, now);
    }
    StartRead(&in_);
  }

  void Handle(const v1::CoordinatorMessage& in, double now) {
    if (in.has_heartbeat_ack()) {
      std::lock_guard<std::mutex> l(mu_);
      auto it = hb_sent_.find(in.heartbeat_ack().seq());
      if (it != hb_sent_.end()) {
        g_heartbeat.Add(now - it->second);
        hb_sent_.erase(it);
      }
    } else if (in.has_registered()) {
      registered_ = true;
    } else if (in.has_assign()) {
      g_assigned++;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (!freed_at_.empty()) {
          g_schedule.Add(now - freed_at_.front());
          freed_at_.pop_front();
        }
      }
      v1::WorkerMessage started;
      started.mutable_event()->set_attempt_id(in.assign().attempt_id());
      started.mutable_event()->mutable_started()->set_pid(1000 + index_);
      Send(std::move(started));
      std::uniform_real_distribution<double> d(min_s_, max_s_);
      std::lock_guard<std::mutex> l(g_due_mu);
      g_due.push({now + d(rng_) * 1000, index_, in.assign().attempt_id()});
    }
  }

  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    finished_ = true;
  }

  void Cancel() { ctx_.TryCancel(); }
  bool registered() const { return registered_; }
  bool finished() {
    std::lock_guard<std::mutex> l(mu_);
    return finished_;
  }

 private:
  int index_;
  grpc::ClientContext ctx_;
  v1::CoordinatorMessage in_;
  std::mutex mu_;
  std::deque<v1::WorkerMessage> out_;
  bool writing_ = false;
  bool done_ = false;
  bool finished_ = false;
  std::atomic<bool> registered_{false};
  std::map<uint64_t, double> hb_sent_;
  std::deque<double> freed_at_;
  std::atomic<uint64_t> hb_seq_{0};
  std::atomic<uint64_t> event_seq_{0};
  std::mt19937 rng_;
  double min_s_, max_s_;
  int metrics_per_job_;
};

// p-quantile (upper bucket bound, ms) of a Prometheus histogram from the coordinator's
// /metrics, for the series whose labels contain `match`.
double ServerQuantileMs(const std::string& metrics_addr, const std::string& name,
                        const std::string& match, double q) {
  std::string cmd = "curl -s http://" + metrics_addr + "/metrics";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  std::vector<std::pair<double, double>> buckets;  // (le seconds, cumulative count)
  char line[4096];
  while (fgets(line, sizeof line, p)) {
    std::string l(line);
    if (l.rfind(name + "_bucket{", 0) != 0 || l.find(match) == std::string::npos) continue;
    auto le = l.find("le=\"");
    if (le == std::string::npos) continue;
    std::string bound = l.substr(le + 4, l.find('"', le + 4) - le - 4);
    double b = bound == "+Inf" ? 1e9 : std::stod(bound);
    buckets.emplace_back(b, std::stod(l.substr(l.rfind(' ') + 1)));
  }
  pclose(p);
  if (buckets.empty() || buckets.back().second == 0) return -1;
  double total = buckets.back().second;
  for (const auto& [b, c] : buckets) {
    if (c >= q * total) return b * 1000;
  }
  return -1;
}

// User + system CPU of a process (its threads), in milliseconds.
double CpuMs(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::vector<std::string> f;
  std::string cur;
  for (size_t i = close + 2; i < stat.size(); ++i) {
    if (stat[i] == ' ') {
      f.push_back(cur);
      cur.clear();
    } else {
      cur += stat[i];
    }
  }
  if (f.size() < 13) return -1;  // fields 14 and 15 (utime, stime) are f[11], f[12]
  return (std::stod(f[11]) + std::stod(f[12])) * 1000.0 / sysconf(_SC_CLK_TCK);
}

int64_t RssMib(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(strlen(field))) / 1024;
  }
  return -1;
}

struct Options {
  int jobs = 100000, workers = 1000, gpus = 8, clients = 64, measure_s = 30;
  int heartbeat_ms = 5000;
  int metrics_per_job = 0;
  double min_s = 5, max_s = 25;  // simulated job durations
  std::string bin = "build/bin";
};

// --flag value pairs; false (and a message) on an unknown flag.
bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--jobs")
      o->jobs = std::stoi(v);
    else if (k == "--workers")
      o->workers = std::stoi(v);
    else if (k == "--gpus")
      o->gpus = std::stoi(v);
    else if (k == "--clients")
      o->clients = std::stoi(v);
    else if (k == "--measure-s")
      o->measure_s = std::stoi(v);
    else if (k == "--heartbeat-ms")
      o->heartbeat_ms = std::stoi(v);
    else if (k == "--bin")
      o->bin = v;
    else if (k == "--metrics-per-job")
      o->metrics_per_job = std::stoi(v);
    else if (k == "--min-s")
      o->min_s = std::stod(v);
    else if (k == "--max-s")
      o->max_s = std::stod(v);
    else {
      std::fprintf(stderr, "coordinator_scale: unknown flag %s\n", k.c_str());
      return false;
    }
  }
  return true;
}

// The coordinator under test, its log in DIR/coordinator.log.
pid_t StartCoordinator(const Options& o, const std::string& dir, const std::string& addr,
                       const std::string& metrics_addr) {
  pid_t coord = fork();
  if (coord == 0) {
    std::string log = dir + "/coordinator.log";
    freopen(log.c_str(), "w", stderr);
    std::string exe = o.bin + "/stemma-coordinator";
    std::string hb = std::to_string(o.heartbeat_ms), lease = std::to_string(o.heartbeat_ms * 6);
    execl(exe.c_str(), exe.c_str(), "--data", (dir + "/coord").c_str(), "--listen", addr.c_str(),
          "--heartbeat-ms", hb.c_str(), "--lease-ms", lease.c_str(), "--log-level", "warn",
          "--metrics-listen", metrics_addr.c_str(), nullptr);
    _exit(127);
  }
  return coord;
}

// Submits o.jobs one-job requests from o.clients threads over four connections; returns the
// submits per second and sets the coordinator's CPU microseconds per submit.
double SubmitJobs(const Options& o, const std::string& addr, pid_t coord, double* cpu_us) {
  std::printf("[scale] submitting %d jobs from %d concurrent clients\n", o.jobs, o.clients);
  std::fflush(stdout);
  std::atomic<int> next{0}, errors{0};
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < 4; ++i) {
    grpc::ChannelArguments a;
    a.SetInt("grpc.channel_id", i);  // distinct connections
    channels.push_back(grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), a));
  }
  auto t0 = Clock::now();
  const double submit_cpu0 = CpuMs(coord);
  std::vector<std::thread> threads;
  for (int c = 0; c < o.clients; ++c) {
    threads.emplace_back([&, c] {
      auto stub = v1::UserService::NewStub(channels[c % channels.size()]);
      while (next.fetch_add(1) < o.jobs) {
        v1::SubmitRequest req;
        auto* s = req.add_jobs();
        s->mutable_noop()->set_duration_ms(1);
        s->mutable_resources()->set_gpus(1);
        grpc::ClientContext ctx;
        v1::SubmitResponse resp;
        if (!stub->Submit(&ctx, req, &resp).ok()) errors++;
      }
    });
  }
  for (auto& t : threads) t.join();
  double submit_s = std::chrono::duration<double>(Clock::now() - t0).count();
  double submits_per_s = o.jobs / submit_s;
  *cpu_us = (CpuMs(coord) - submit_cpu0) * 1000.0 / o.jobs;
  std::printf("[scale] %d durable submits in %.2f s: %.0f/s (%d errors)\n", o.jobs, submit_s,
              submits_per_s, errors.load());
  std::fflush(stdout);
  return submits_per_s;
}

// Polls ListWorkers for up to ~30 s; true once the coordinator answers.
bool CoordinatorAnswers(const std::shared_ptr<grpc::Channel>& channel) {
  auto user = v1::UserService::NewStub(channel);
  for (int i = 0; i <= 100; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    v1::ListWorkersResponse r;
    if (user->ListWorkers(&ctx, {}, &r).ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// o.workers simulated workers, waited for (up to a minute) until every one has registered.
std::vector<std::unique_ptr<SimWorker>> StartSimWorkers(const Options& o,
                                                        v1::WorkerService::Stub* stub) {
  std::vector<std::unique_ptr<SimWorker>> sims;
  for (int i = 0; i < o.workers; ++i) {
    sims.push_back(
        std::make_unique<SimWorker>(i, stub, o.gpus, o.min_s, o.max_s, o.metrics_per_job));
  }
  for (int i = 0; i < 600; ++i) {
    int n = 0;
    for (auto& s : sims) n += s->registered();
    if (n == o.workers) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf("[scale] %d workers registered; %lld assignments so far\n", o.workers,
              static_cast<long long>(g_assigned.load()));
  std::fflush(stdout);
  return sims;
}

// Cancels every simulated worker's session and waits (up to 5 s) for them to end.
void StopSimWorkers(std::vector<std::unique_ptr<SimWorker>>& sims) {
  for (auto& s : sims) s->Cancel();
  for (int i = 0; i < 100; ++i) {
    bool all = true;
    for (auto& s : sims) all = all && s->finished();
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) return 2;
  const int jobs = o.jobs, workers = o.workers, gpus = o.gpus, clients = o.clients,
            measure_s = o.measure_s, heartbeat_ms = o.heartbeat_ms,
            metrics_per_job = o.metrics_per_job;
  char tmpl[] = "/tmp/stemma-scale.XXXXXX";
  std::string dir = mkdtemp(tmpl);
  const std::string addr = "127.0.0.1:" + std::to_string(20000 + getpid() % 20000);
  const std::string metrics_addr = "127.0.0.1:" + std::to_string(40000 + getpid() % 20000);
  const pid_t coord = StartCoordinator(o, dir, addr, metrics_addr);
  auto cleanup = [&] {
    kill(coord, SIGTERM);
    waitpid(coord, nullptr, 0);
    std::string rm = "rm -rf " + dir;
    std::system(rm.c_str());
  };

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(4 << 20);
  auto channel = grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args);
  if (!CoordinatorAnswers(channel)) {
    std::fprintf(stderr, "coordinator did not start (see %s/coordinator.log)\n", dir.c_str());
    cleanup();
    return 1;
  }

  // 1. Durable submits.
  double submit_cpu_us = 0;
  const double submits_per_s = SubmitJobs(o, addr, coord, &submit_cpu_us);

  // 2. Simulated workers.
  auto worker_stub = v1::WorkerService::NewStub(channel);
  std::vector<std::unique_ptr<SimWorker>> sims = StartSimWorkers(o, worker_stub.get());

  std::atomic<bool> stop{false};
  std::thread heartbeats([&] {
    // Spread each worker's heartbeats evenly over the interval.
    const double per = static_cast<double>(heartbeat_ms) / workers;
    double start = NowMs();
    for (uint64_t k = 0; !stop; ++k) {
      double at = start + k * per;
      double now = NowMs();
      if (at > now)
        std::this_thread::sleep_for(
            std::chrono::microseconds(static_cast<int64_t>((at - now) * 1000)));
      sims[k % workers]->Heartbeat();
    }
  });
  std::thread finisher([&] {
    while (!stop) {
      std::vector<Due> ready;
      {
        std::lock_guard<std::mutex> l(g_due_mu);
        double now = NowMs();
        while (!g_due.empty() && g_due.top().at <= now) {
          ready.push_back(g_due.top());
          g_due.pop();
        }
      }
      for (auto& d : ready) sims[d.worker]->Finish(d.attempt);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });

  // Warm up until the first placements settle, then measure.
  std::this_thread::sleep_for(std::chrono::seconds(std::max(5, heartbeat_ms / 1000 + 2)));
  int64_t finished_before = g_finished.load();
  int64_t points_before = g_points.load();
  const double cpu_before = CpuMs(coord);
  g_heartbeat.recording = true;
  g_schedule.recording = true;
  std::printf("[scale] measuring for %d s\n", measure_s);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(measure_s));
  g_heartbeat.recording = false;
  g_schedule.recording = false;
  int64_t finished = g_finished.load() - finished_before;
  int64_t points = g_points.load() - points_before;
  const double window_cpu_ms = CpuMs(coord) - cpu_before;
  int64_t rss = RssMib(coord, "VmRSS:");
  int64_t hwm = RssMib(coord, "VmHWM:");
  double server_hb_p99 = ServerQuantileMs(metrics_addr, "stemma_rpc_server_handling_seconds",
                                          "method=\"Heartbeat\"", 0.99);
  double server_event_p99 = ServerQuantileMs(metrics_addr, "stemma_rpc_server_handling_seconds",
                                             "method=\"Event\"", 0.99);
  double server_txn_p99 =
      ServerQuantileMs(metrics_addr, "stemma_store_transaction_seconds", "", 0.99);

  stop = true;
  heartbeats.join();
  finisher.join();
  StopSimWorkers(sims);
  cleanup();

  std::printf(
      "[scale] heartbeats measured: %zu, placements after a freed GPU: %zu, "
      "jobs finished in window: %lld\n",
      g_heartbeat.size(), g_schedule.size(), static_cast<long long>(finished));
  std::printf(
      "{\"jobs\": %d, \"workers\": %d, \"gpus_per_worker\": %d, \"submit_clients\": %d, "
      "\"durable_submits_per_s\": %.0f, \"heartbeat_p50_ms\": %.3f, \"heartbeat_p99_ms\": %.3f, "
      "\"schedule_p50_ms\": %.3f, \"schedule_p99_ms\": %.3f, \"finished_per_s\": %.1f, "
      "\"coordinator_rss_mib\": %lld, \"coordinator_peak_rss_mib\": %lld, "
      "\"server_heartbeat_p99_ms_le\": %.2f, \"server_event_p99_ms_le\": %.2f, "
      "\"store_txn_p99_ms_le\": %.2f, \"coordinator_cpu_ms_per_job\": %.4f, "
      "\"coordinator_cpu_us_per_submit\": %.2f, \"coordinator_cpu_fraction\": %.3f, "
      "\"metrics_per_job\": %d, \"metric_points_per_s\": %.0f}\n",
      jobs, workers, gpus, clients, submits_per_s, g_heartbeat.Pct(0.5), g_heartbeat.Pct(0.99),
      g_schedule.Pct(0.5), g_schedule.Pct(0.99), finished / static_cast<double>(measure_s),
      static_cast<long long>(rss), static_cast<long long>(hwm), server_hb_p99, server_event_p99,
      server_txn_p99, finished > 0 ? window_cpu_ms / finished : -1.0, submit_cpu_us,
      window_cpu_ms / (measure_s * 1000.0), metrics_per_job,
      points / static_cast<double>(measure_s));
  return 0;
}
