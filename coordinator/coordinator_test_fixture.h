// The coordinator core driven directly, with a FakeClock, the memory store and fake worker
// channels: the fixture the coordinator_*_test.cc files share.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/artifact_files.h"
#include "coordinator/committer.h"
#include "coordinator/coordinator.h"

namespace stemma::coordinator {

class FakeChannel : public WorkerChannel {
 public:
  bool Send(const v1::CoordinatorMessage& m) override {
    absl::MutexLock l(&mu_);
    sent_.push_back(m);
    return true;
  }
  void Close() override {
    absl::MutexLock l(&mu_);
    closed_ = true;
  }
  // Waits (generously) for a message of the given kind and removes it.
  std::optional<v1::CoordinatorMessage> Take(v1::CoordinatorMessage::MsgCase kind) {
    absl::MutexLock l(&mu_);
    // absl may evaluate a condition several times, on any thread: it must be pure.
    auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& m : sent_) {
        if (m.msg_case() == kind) return true;
      }
      return false;
    };
    mu_.AwaitWithTimeout(absl::Condition(&present), absl::Seconds(10));
    for (auto it = sent_.begin(); it != sent_.end(); ++it) {
      if (it->msg_case() == kind) {
        v1::CoordinatorMessage out = *it;
        sent_.erase(it);
        return out;
      }
    }
    return std::nullopt;
  }
  bool closed() {
    absl::MutexLock l(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::CoordinatorMessage> sent_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("stemma-coord-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    store_ = MakeMemoryStore();
    StartCoordinator();
  }
  void TearDown() override {
    coord_.reset();
    std::filesystem::remove_all(dir_);
  }
  void StartCoordinator() {
    CoordinatorOptions o;
    o.data_dir = dir_.string();
    o.lease_ms = 1000;
    o.heartbeat_ms = 200;
    o.tick_ms = 1000000;  // passes only when kicked or called
    o.verify_artifacts = verify_artifacts_;
    coord_ = std::make_unique<Coordinator>(o, store_.get(), &clock_, &metrics_);
    ASSERT_TRUE(coord_->Start().ok());
  }

  struct Worker {
    std::string id;
    std::shared_ptr<FakeChannel> channel;
    uint64_t session;
    v1::Registered registered;
  };
  Worker Connect(const std::string& id, int gpus = 0, bool allow_exec = false,
                 std::vector<v1::RunningAttempt> running = {}) {
    v1::Register reg;
    reg.mutable_info()->set_id(id);
    reg.mutable_info()->set_cpus(4);
    reg.mutable_info()->set_memory_mb(1024);
    reg.mutable_info()->set_allow_exec(allow_exec);
    for (int i = 0; i < gpus; ++i) reg.mutable_info()->add_gpus()->set_id(i);
    for (auto& r : running) *reg.add_running() = r;
    Worker w{id, std::make_shared<FakeChannel>(), 0, {}};
    auto r = coord_->Register(reg, w.channel, &w.session);
    EXPECT_TRUE(r.ok()) << r.status();
    w.registered = *r;
    return w;
  }
  std::string SubmitNoop(int max_attempts = 3, int gpus = 0) {
    v1::SubmitRequest req;
    auto* s = req.add_jobs();
    s->mutable_noop();
    s->set_max_attempts(max_attempts);
    s->mutable_backoff()->set_initial_ms(10);
    s->mutable_resources()->set_gpus(gpus);
    auto r = coord_->Submit(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r->job_ids(0);
  }
  v1::Assignment Assigned(Worker& w) {
    coord_->RunSchedulerPass();
    auto m = w.channel->Take(v1::CoordinatorMessage::kAssign);
    EXPECT_TRUE(m.has_value());
    return m ? m->assign() : v1::Assignment();
  }
  void Report(Worker& w, const v1::Assignment& a, int exit_code, uint64_t seq,
              bool retryable = true) {
    v1::AttemptEvent started;
    started.set_attempt_id(a.attempt_id());
    started.set_rank(a.rank());
    started.mutable_started()->set_pid(123);
    coord_->Event(w.id, w.session, started);
    v1::AttemptEvent fin;
    fin.set_attempt_id(a.attempt_id());
    fin.set_rank(a.rank());
    fin.set_event_seq(seq);
    fin.mutable_finished()->set_exit_code(exit_code);
    fin.mutable_finished()->set_retryable(retryable);
    coord_->Event(w.id, w.session, fin);
  }
  v1::Job Get(const std::string& id) { return *coord_->GetJob(id); }

  // A job that runs on `w` and ends with exit 0 after reporting `metrics` (name, step,
  // value) and `artifacts`.
  std::string RunToSuccess(Worker& w, v1::JobSpec spec, uint64_t seq,
                           const std::vector<std::tuple<std::string, int64_t, double>>& metrics,
                           const std::vector<v1::OutputArtifact>& artifacts) {
    v1::SubmitRequest req;
    *req.add_jobs() = std::move(spec);
    auto r = coord_->Submit(req);
    EXPECT_TRUE(r.ok()) << r.status();
    const std::string id = r->job_ids(0);
    v1::Assignment a = Assigned(w);
    EXPECT_EQ(a.job_id(), id);
    std::vector<v1::AttemptEvent> events(1);
    events[0].set_attempt_id(a.attempt_id());
    events[0].mutable_started()->set_pid(7);
    for (const auto& [name, step, value] : metrics) {
      auto& e = events.emplace_back();
      e.set_attempt_id(a.attempt_id());
      e.mutable_metric()->set_name(name);
      e.mutable_metric()->set_step(step);
      e.mutable_metric()->set_value(value);
      e.mutable_metric()->set_time_ms(5000 + step);
    }
    auto& fin = events.emplace_back();
    fin.set_attempt_id(a.attempt_id());
    fin.set_event_seq(seq);
    fin.mutable_finished()->set_exit_code(0);
    for (const auto& art : artifacts) *fin.mutable_finished()->add_artifacts() = art;
    std::vector<const v1::AttemptEvent*> ptrs;
    for (const auto& e : events) ptrs.push_back(&e);
    coord_->Events(w.id, w.session, absl::MakeConstSpan(ptrs));
    EXPECT_TRUE(w.channel->Take(v1::CoordinatorMessage::kEventAck).has_value());
    EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
    return id;
  }
  // A checkpoint directory with one weights file and a stemma.json listing it; returns the
  // output as a worker reports it.
  v1::OutputArtifact MakeCheckpoint(const std::string& name, const std::string& weights,
                                    std::vector<std::string> parents = {},
                                    const std::string& operation = "cpt") {
    const std::string path = (dir_ / name).string();
    std::filesystem::create_directories(path);
    WriteFile(path + "/model.safetensors", weights);
    auto sha = Sha256File(path + "/model.safetensors");
    WriteFile(path + "/stemma.json", absl::StrCat(R"({"files": {"model.safetensors": {"sha256": ")",
                                                  *sha, R"(", "bytes": )", weights.size(), "}}}"));
    v1::OutputArtifact out;
    out.set_name("model");
    out.set_type("checkpoint");
    out.set_path(path);
    out.set_manifest_sha256(*Sha256File(path + "/stemma.json"));
    out.set_bytes(static_cast<int64_t>(weights.size()));
    for (auto& p : parents) out.add_parents(p);
    out.set_operation(operation);
    return out;
  }
  static void WriteFile(const std::string& path, const std::string& data) {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(data.c_str(), f);
    std::fclose(f);
  }
  // The value of a gauge series with these labels, if it exists.
  std::optional<double> Gauge(const std::string& name, const std::string& experiment,
                              const std::string& stage) {
    for (const auto& family : metrics_.registry()->Collect()) {
      if (family.name != name) continue;
      for (const auto& m : family.metric) {
        std::map<std::string, std::string> labels;
        for (const auto& l : m.label) labels[l.name] = l.value;
        if (labels["experiment"] == experiment && labels["stage"] == stage) return m.gauge.value;
      }
    }
    return std::nullopt;
  }

  bool verify_artifacts_ = false;
  std::filesystem::path dir_;
  FakeClock clock_;
  CoordinatorMetrics metrics_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Coordinator> coord_;
};

inline v1::JobSpec Spec(const std::string& name, const std::string& experiment = "",
                        const std::string& stage = "") {
  v1::JobSpec s;
  s.set_name(name);
  s.mutable_noop();
  s.set_experiment(experiment);
  if (!stage.empty()) (*s.mutable_labels())["stage"] = stage;
  return s;
}

// The value of the series of `family` whose labels include `want`, if it exists.
inline std::optional<double> SeriesValue(CoordinatorMetrics& metrics, const std::string& family,
                                         const std::map<std::string, std::string>& want) {
  for (const auto& f : metrics.registry()->Collect()) {
    if (f.name != family) continue;
    for (const auto& m : f.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& l : m.label) labels[l.name] = l.value;
      bool match = true;
      for (const auto& [k, v] : want) match = match && labels.count(k) > 0 && labels[k] == v;
      if (match) return f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  return std::nullopt;
}

}  // namespace stemma::coordinator
