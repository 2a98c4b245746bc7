// What autoscalers and the ML-run alerts read from the coordinator: queued GPU demand by
// size, attempts near their timeout, stalled training jobs, and RPCs under the
// grpc-prometheus names.
#include "coordinator/demand_gauges.h"

#include "coordinator/coordinator_test_fixture.h"

namespace stemma::coordinator {
namespace {

// Moves the fake clock while the workers keep their leases (heartbeats every 500 ms).
class DemandTest : public CoordinatorTest {
 protected:
  void AdvanceAlive(int64_t ms, const std::vector<Worker*>& workers) {
    while (ms > 0) {
      const int64_t step = std::min<int64_t>(ms, 500);
      clock_.Advance(step);
      ms -= step;
      for (Worker* w : workers) {
        v1::Heartbeat hb;
        EXPECT_TRUE(coord_->Heartbeat(w->id, w->session, hb).ok());
      }
    }
  }
};

std::optional<double> Queued(CoordinatorMetrics& m, const std::string& size) {
  return SeriesValue(m, "stemma_scheduler_queued_gpus", {{"per_node", size}});
}

TEST(GpuSizeIndex, RoundsUpToAPowerOfTwo) {
  const std::vector<std::pair<int64_t, std::string>> cases = {
      {1, "1"}, {2, "2"},  {3, "4"},   {4, "4"},     {5, "8"},
      {8, "8"}, {9, "16"}, {32, "32"}, {33, "more"}, {1000, "more"}};
  for (const auto& [gpus, label] : cases) {
    EXPECT_EQ(kGpuSizeLabels[GpuSizeIndex(gpus)], label) << gpus;
  }
}

TEST_F(DemandTest, QueuedGpuDemandIsExportedBySize) {
  for (const char* size : {"1", "2", "4", "8", "16", "32", "more"}) {
    EXPECT_EQ(Queued(metrics_, size), 0) << size;  // created at 0
  }
  v1::SubmitRequest req;
  for (int gpus : {1, 1, 3, 8, 0}) {
    v1::JobSpec* s = req.add_jobs();
    *s = Spec(absl::StrCat("j", req.jobs_size()));
    s->mutable_resources()->set_gpus(gpus);
  }
  req.mutable_jobs(2)->set_nodes(2);  // a gang of two 3-GPU parts: 6 GPUs of size 4
  ASSERT_TRUE(coord_->Submit(req).ok());
  clock_.Advance(2000);
  coord_->RunSchedulerPass();  // no worker: everything stays QUEUED
  EXPECT_EQ(Queued(metrics_, "1"), 2);
  EXPECT_EQ(Queued(metrics_, "2"), 0);
  EXPECT_EQ(Queued(metrics_, "4"), 6);
  EXPECT_EQ(Queued(metrics_, "8"), 8);
  // A worker with 8 GPUs takes what fits; the rest stays asked for.
  Worker w = Connect("w0", 8);
  AdvanceAlive(2000, {&w});
  coord_->RunSchedulerPass();
  AdvanceAlive(2000, {&w});
  coord_->RunSchedulerPass();
  double left = 0;
  for (const char* size : {"1", "4", "8"}) left += Queued(metrics_, size).value_or(-1);
  EXPECT_LT(left, 16);
  EXPECT_GT(left, 0);
}

TEST_F(DemandTest, AttemptsNearTheirTimeoutAreCounted) {
  Worker w = Connect("w0");
  v1::SubmitRequest req;
  *req.add_jobs() = Spec("slow");
  req.mutable_jobs(0)->set_timeout_ms(10000);
  *req.add_jobs() = Spec("untimed");
  ASSERT_TRUE(coord_->Submit(req).ok());
  Assigned(w);
  coord_->RunSchedulerPass();
  AdvanceAlive(5000, {&w});
  coord_->RunSchedulerPass();
  EXPECT_EQ(SeriesValue(metrics_, "stemma_coordinator_attempts_near_timeout", {}), 0);
  EXPECT_NEAR(*SeriesValue(metrics_, "stemma_coordinator_attempt_timeout_ratio_max", {}), 0.5,
              0.01);
  AdvanceAlive(4500, {&w});
  coord_->RunSchedulerPass();
  EXPECT_EQ(SeriesValue(metrics_, "stemma_coordinator_attempts_near_timeout", {}), 1);
  EXPECT_NEAR(*SeriesValue(metrics_, "stemma_coordinator_attempt_timeout_ratio_max", {}), 0.95,
              0.01);
}

TEST_F(DemandTest, ATrainingJobWithoutStepsForLongIsStalled) {
  Worker w = Connect("w0");
  v1::SubmitRequest req;
  *req.add_jobs() = Spec("cpt-uk", "family", "cpt");
  ASSERT_TRUE(coord_->Submit(req).ok());
  v1::Assignment a = Assigned(w);
  const std::map<std::string, std::string> stage = {{"experiment", "family"}, {"stage", "cpt"}};
  auto step = [&](int64_t n) {
    v1::AttemptEvent e;
    e.set_attempt_id(a.attempt_id());
    e.mutable_metric()->set_name("loss");
    e.mutable_metric()->set_step(n);
    e.mutable_metric()->set_value(1.0);
    coord_->Event(w.id, w.session, e);
  };
  auto stalled = [&] {
    AdvanceAlive(1000, {&w});
    coord_->RunSchedulerPass();
    return SeriesValue(metrics_, "stemma_train_stalled_jobs", {}).value_or(-1);
  };
  step(10);
  AdvanceAlive(20000, {&w});
  step(20);  // 2 s per step
  EXPECT_NEAR(*SeriesValue(metrics_, "stemma_train_step_seconds", stage), 2.0, 1e-9);
  EXPECT_NEAR(*SeriesValue(metrics_, "stemma_train_last_step_timestamp_seconds", stage),
              clock_.WallMs() / 1000.0, 1e-3);
  EXPECT_EQ(stalled(), 0);
  AdvanceAlive(250000, {&w});  // 10x the step time, but under the 5-minute floor
  EXPECT_EQ(stalled(), 0);
  AdvanceAlive(60000, {&w});
  EXPECT_EQ(stalled(), 1);
  step(21);  // it moves again
  EXPECT_EQ(stalled(), 0);
  Report(w, a, 0, 1);
  EXPECT_FALSE(SeriesValue(metrics_, "stemma_train_step_seconds", stage).has_value());
  EXPECT_EQ(stalled(), 0);
}

TEST(CoordinatorMetricsTest, RpcsAreAlsoExportedUnderTheGrpcPrometheusNames) {
  CoordinatorMetrics m;
  auto handled = [&](const std::string& service, const std::string& method, const std::string& type,
                     const std::string& code) {
    return SeriesValue(m, "grpc_server_handled_total",
                       {{"grpc_service", service},
                        {"grpc_method", method},
                        {"grpc_type", type},
                        {"grpc_code", code}});
  };
  EXPECT_EQ(handled("stemma.v1.UserService", "Submit", "unary", "OK"), 0);
  EXPECT_EQ(handled("stemma.v1.UserService", "Watch", "server_stream", "Unauthenticated"), 0);
  EXPECT_EQ(handled("stemma.v1.WorkerService", "Session", "bidi_stream", "Canceled"), 0);
  m.RpcEnded("GetJob", absl::StatusCode::kNotFound, 0.002);
  m.RpcEnded("GetJob", absl::StatusCode::kNotFound, 0.004);
  m.RpcEnded("/some.Service/Probe", absl::StatusCode::kUnimplemented, 0.001);
  EXPECT_EQ(handled("stemma.v1.UserService", "GetJob", "unary", "NotFound"), 2);
  EXPECT_EQ(handled("other", "other", "unary", "Unimplemented"), 1);
  uint64_t observed = 0;
  double sum = 0;
  for (const auto& f : m.registry()->Collect()) {
    if (f.name != "grpc_server_handling_seconds") continue;
    for (const auto& metric : f.metric) {
      for (const auto& l : metric.label) {
        if (l.name == "grpc_method" && l.value == "GetJob") {
          observed += metric.histogram.sample_count;
          sum += metric.histogram.sample_sum;
        }
      }
    }
  }
  EXPECT_EQ(observed, 2u);
  EXPECT_NEAR(sum, 0.006, 1e-9);
}

}  // namespace
}  // namespace stemma::coordinator
