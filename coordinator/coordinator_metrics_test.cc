// The coordinator core driven directly (coordinator_test_fixture.h): metric points, series and
// live gauges, exported results, training progress, RPC metrics.
#include "coordinator/coordinator_test_fixture.h"

namespace stemma::coordinator {
namespace {

TEST_F(CoordinatorTest, MetricEventsAreStoredQueryableAndLiveGaugesFollowTheJob) {
  Worker w = Connect("w0");
  v1::SubmitRequest req;
  *req.add_jobs() = Spec("cpt-uk", "family", "cpt");
  std::string id = coord_->Submit(req)->job_ids(0);
  v1::Assignment a = Assigned(w);
  auto send = [&](const std::string& attempt, const std::string& name, int64_t step, double v) {
    v1::AttemptEvent e;
    e.set_attempt_id(attempt);
    e.mutable_metric()->set_name(name);
    e.mutable_metric()->set_step(step);
    e.mutable_metric()->set_value(v);
    (*e.mutable_metric()->mutable_labels())["split"] = "train";
    coord_->Event(w.id, w.session, e);
  };
  for (int step = 1; step <= 3; ++step) {
    send(a.attempt_id(), "loss", step, 3.0 - step * 0.5);
    send(a.attempt_id(), "tokens_per_s", step, 1000 * step);
  }
  send(absl::StrCat(id, ".9"), "loss", 4, 99);  // not its attempt: refused, not stored
  EXPECT_EQ(Gauge("stemma_train_loss", "family", "cpt"), 1.5);
  EXPECT_EQ(Gauge("stemma_train_tokens_per_second", "family", "cpt"), 3000);
  EXPECT_EQ(Gauge("stemma_train_step", "family", "cpt"), 3);

  v1::QueryMetricsRequest q;
  q.add_job_ids(id);
  auto all = coord_->QueryMetrics(q);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->points_size(), 6);
  EXPECT_EQ(all->points(0).name(), "loss");
  EXPECT_EQ(all->points(0).attempt(), 1);
  EXPECT_EQ(all->points(0).labels().at("split"), "train");
  EXPECT_EQ(all->points(5).step(), 3);
  EXPECT_EQ(all->points(0).job_name(), Get(id).spec().name()) << "points name their job";
  q.set_name_pattern("loss");
  q.set_last_only(true);
  auto last = coord_->QueryMetrics(q);
  ASSERT_TRUE(last.ok());
  ASSERT_EQ(last->points_size(), 1);
  EXPECT_DOUBLE_EQ(last->points(0).value(), 1.5);

  v1::AttemptEvent fin;
  fin.set_attempt_id(a.attempt_id());
  fin.set_event_seq(1);
  fin.mutable_finished()->set_exit_code(0);
  coord_->Event(w.id, w.session, fin);
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
  EXPECT_FALSE(Gauge("stemma_train_loss", "family", "cpt").has_value());  // ended: removed

  v1::QueryMetricsRequest by_experiment;
  by_experiment.set_experiment("family");
  auto exp = coord_->QueryMetrics(by_experiment);
  ASSERT_TRUE(exp.ok());
  EXPECT_EQ(exp->points_size(), 6);
  by_experiment.set_experiment("nope");
  EXPECT_EQ(coord_->QueryMetrics(by_experiment).status().code(), absl::StatusCode::kNotFound);
  v1::QueryMetricsRequest unknown;
  unknown.add_job_ids("j-999");
  EXPECT_EQ(coord_->QueryMetrics(unknown).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coord_->QueryMetrics({}).status().code(), absl::StatusCode::kInvalidArgument);
}

// A worker packs an attempt's points into MetricBatch events; stored and answered they are
// the same series as one Metric event per point (what older workers send).
TEST_F(CoordinatorTest, MetricBatchesStoreTheSameSeriesAsOneEventPerPoint) {
  Worker w = Connect("w0", 2);
  v1::SubmitRequest req;
  *req.add_jobs() = Spec("single", "fam", "cpt");
  *req.add_jobs() = Spec("packed", "fam", "cpt2");
  auto ids = coord_->Submit(req);
  ASSERT_TRUE(ids.ok());
  v1::Assignment a1 = Assigned(w);
  v1::Assignment a2 = Assigned(w);
  if (a1.job_id() != ids->job_ids(0)) std::swap(a1, a2);
  struct P {
    std::string name;
    int64_t step;
    double value;
    std::string split;  // "" : no labels
  };
  std::vector<P> points;
  for (int step = 1; step <= 4; ++step) {
    points.push_back({"loss", step, 3.0 - step * 0.25, ""});
    points.push_back({"tokens_per_s", step, 1000.0 * step, ""});
    points.push_back({"heldout", step, 2.0 + step, step % 2 == 0 ? "uk" : ""});
  }
  // What arrives together is applied in one pass (one transaction): two deliveries, split
  // mid-step, for both kinds of worker.
  const std::vector<std::pair<size_t, size_t>> deliveries = {{0, 5}, {5, points.size()}};
  for (auto [from, to] : deliveries) {
    std::vector<v1::AttemptEvent> events(to - from);
    std::vector<const v1::AttemptEvent*> ptrs;
    for (size_t i = from; i < to; ++i) {
      const P& p = points[i];
      v1::AttemptEvent& e = events[i - from];
      e.set_attempt_id(a1.attempt_id());
      e.mutable_metric()->set_name(p.name);
      e.mutable_metric()->set_step(p.step);
      e.mutable_metric()->set_value(p.value);
      e.mutable_metric()->set_time_ms(7000 + p.step);
      if (!p.split.empty()) (*e.mutable_metric()->mutable_labels())["split"] = p.split;
      ptrs.push_back(&e);
    }
    coord_->Events(w.id, w.session, absl::MakeConstSpan(ptrs));
  }
  // The same points as one batch per delivery, names interned per batch.
  for (auto [from, to] : deliveries) {
    v1::AttemptEvent e;
    e.set_attempt_id(a2.attempt_id());
    auto* b = e.mutable_metrics();
    std::map<std::string, uint32_t> names;
    bool labelled = false;
    for (size_t i = from; i < to; ++i) labelled |= !points[i].split.empty();
    for (size_t i = from; i < to; ++i) {
      const P& p = points[i];
      auto [it, fresh] = names.emplace(p.name, static_cast<uint32_t>(names.size()));
      if (fresh) b->add_names(p.name);
      b->add_name_index(it->second);
      b->add_steps(p.step);
      b->add_values(p.value);
      b->add_times_ms(7000 + p.step);
      if (labelled) {
        if (p.split.empty()) {
          b->add_label_index(0);
        } else {
          (*b->add_label_sets()->mutable_labels())["split"] = p.split;
          b->add_label_index(static_cast<uint32_t>(b->label_sets_size()));
        }
      }
    }
    coord_->Event(w.id, w.session, e);
  }
  // A batch whose columns disagree is refused whole.
  v1::AttemptEvent bad;
  bad.set_attempt_id(a2.attempt_id());
  bad.mutable_metrics()->add_names("loss");
  bad.mutable_metrics()->add_name_index(0);
  bad.mutable_metrics()->add_name_index(0);
  bad.mutable_metrics()->add_steps(9);
  bad.mutable_metrics()->add_values(0.5);
  coord_->Event(w.id, w.session, bad);
  EXPECT_EQ(Gauge("stemma_train_loss", "fam", "cpt2"), 2.0);
  EXPECT_EQ(Gauge("stemma_train_step", "fam", "cpt2"), 4);
  EXPECT_EQ(Gauge("stemma_train_tokens_per_second", "fam", "cpt2"), 4000);

  auto query = [&](const std::string& id, bool last_only) {
    v1::QueryMetricsRequest q;
    q.add_job_ids(id);
    q.set_last_only(last_only);
    auto r = coord_->QueryMetrics(q);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<std::string> out;
    for (v1::MetricPoint p : r->points()) {
      p.clear_job_id();
      p.clear_job_name();  // which job: the series are compared
      out.push_back(p.ShortDebugString());
    }
    return out;
  };
  for (bool last_only : {false, true}) {
    SCOPED_TRACE(last_only);
    const std::vector<std::string> single = query(a1.job_id(), last_only);
    if (last_only) {
      EXPECT_GE(single.size(), 3u);  // a point per series
    } else {
      EXPECT_EQ(single.size(), points.size());
    }
    EXPECT_EQ(query(a2.job_id(), last_only), single);
  }
}

TEST_F(CoordinatorTest, EvalResultsAndRegisteredCheckpointsAreExportedAsTheyLand) {
  Worker w = Connect("w0", 0, /*allow_exec=*/true);
  const auto registered = [&](const std::string& op) {
    return SeriesValue(metrics_, "stemma_registry_checkpoints_registered_total",
                       {{"operation", op}});
  };
  // Created at 0: the first registration is an increase Prometheus can see.
  EXPECT_EQ(registered("cpt"), 0);
  EXPECT_EQ(registered("soup"), 0);
  EXPECT_EQ(registered("other"), 0);
  RunToSuccess(w, Spec("cpt", "fam", "cpt"), 1, {}, {MakeCheckpoint("cpt-a", "w-1")});
  RunToSuccess(w, Spec("cpt2", "fam", "cpt"), 2, {}, {MakeCheckpoint("cpt-b", "w-2")});
  RunToSuccess(w, Spec("soup", "fam", "soup"), 3, {}, {MakeCheckpoint("soup", "w-3", {}, "soup")});
  RunToSuccess(w, Spec("odd", "fam", "odd"), 4, {}, {MakeCheckpoint("odd", "w-4", {}, "made-up")});
  EXPECT_EQ(registered("cpt"), 2);
  EXPECT_EQ(registered("soup"), 1);
  EXPECT_EQ(registered("other"), 1);  // an operation no engine command names: bounded labels

  // An eval cell of a matrix stage: its points land as they arrive, labelled by its cell.
  v1::JobSpec eval = Spec("eval-dense[family=slavic]", "fam", "eval-dense");
  eval.mutable_eval()->set_model((dir_ / "soup").string());
  auto* task = eval.mutable_eval()->add_tasks();
  task->set_language("uk");
  task->set_data((dir_ / "tok").string());
  task->mutable_perplexity()->set_heldout_fraction(0.2);
  const std::map<std::string, std::string> cell = {{"experiment", "fam"},
                                                   {"stage", "eval-dense"},
                                                   {"cell", "eval-dense[family=slavic]"},
                                                   {"metric", "ppl/uk"}};
  RunToSuccess(w, eval, 5, {{"ppl/uk", 0, 12.5}, {"ppl/uk", 0, 11.25}, {"bpb/uk", 0, 1.5}}, {});
  EXPECT_EQ(SeriesValue(metrics_, "stemma_eval_score", cell),
            11.25);  // the last, kept after the end
  EXPECT_EQ(SeriesValue(metrics_, "stemma_eval_score",
                        {{"cell", "eval-dense[family=slavic]"}, {"metric", "bpb/uk"}}),
            1.5);
  // Training jobs' measured values are not eval results.
  RunToSuccess(w, Spec("cpt3", "fam", "cpt"), 6, {{"heldout_loss/uk", 0, 3.0}}, {});
  EXPECT_FALSE(SeriesValue(metrics_, "stemma_eval_score", {{"stage", "cpt"}}).has_value());
}

TEST_F(CoordinatorTest, TrainingProgressFollowsTheJobsProgressEvents) {
  Worker w = Connect("w0");
  v1::SubmitRequest req;
  *req.add_jobs() = Spec("cpt-uk", "family", "cpt");
  const std::string id = coord_->Submit(req)->job_ids(0);
  v1::Assignment a = Assigned(w);
  const std::map<std::string, std::string> stage = {{"experiment", "family"}, {"stage", "cpt"}};
  auto progress = [&](double fraction) {
    v1::AttemptEvent e;
    e.set_attempt_id(a.attempt_id());
    e.mutable_progress()->set_fraction(fraction);
    e.mutable_progress()->set_step(static_cast<int64_t>(fraction * 100));
    coord_->Event(w.id, w.session, e);
  };
  progress(0.1);  // before any training point: no series yet
  EXPECT_FALSE(SeriesValue(metrics_, "stemma_train_progress_ratio", stage).has_value());
  v1::AttemptEvent loss;
  loss.set_attempt_id(a.attempt_id());
  loss.mutable_metric()->set_name("loss");
  loss.mutable_metric()->set_step(25);
  loss.mutable_metric()->set_value(2.5);
  coord_->Event(w.id, w.session, loss);
  progress(0.25);
  EXPECT_EQ(SeriesValue(metrics_, "stemma_train_progress_ratio", stage), 0.25);
  progress(0);  // a progress without a fraction changes nothing
  EXPECT_EQ(SeriesValue(metrics_, "stemma_train_progress_ratio", stage), 0.25);
  Report(w, a, 0, 1);
  EXPECT_EQ(Get(id).state(), v1::SUCCEEDED);
  EXPECT_FALSE(SeriesValue(metrics_, "stemma_train_progress_ratio", stage).has_value());  // ended
}

TEST(CoordinatorMetricsTest, RpcCodesAreCreatedAtZeroForEveryMethodAndUnknownMethodsAreBounded) {
  CoordinatorMetrics m;
  const auto count = [&](const std::string& method, const std::string& code) {
    return SeriesValue(m, "stemma_rpc_requests_total", {{"method", method}, {"code", code}});
  };
  for (const char* method :
       {"Submit", "ListJobs", "Watch", "SubmitExperiment", "Session", "other"}) {
    EXPECT_EQ(count(method, "OK"), 0) << method;
    EXPECT_EQ(count(method, "UNAUTHENTICATED"), 0) << method;
    EXPECT_EQ(count(method, "DATA_LOSS"), 0) << method;
  }
  m.RpcEnded("GetJob", absl::StatusCode::kNotFound);
  m.RpcEnded("GetJob", absl::StatusCode::kNotFound);
  m.RpcEnded("Submit", absl::StatusCode::kOk);
  m.RpcEnded("/some.Service/Probe", absl::StatusCode::kUnimplemented);
  EXPECT_EQ(count("GetJob", "NOT_FOUND"), 2);
  EXPECT_EQ(count("GetJob", "OK"), 0);
  EXPECT_EQ(count("Submit", "OK"), 1);
  EXPECT_EQ(count("other", "UNIMPLEMENTED"), 1);
  EXPECT_FALSE(count("/some.Service/Probe", "UNIMPLEMENTED").has_value());
  EXPECT_EQ(SeriesValue(m, "stemma_store_commit_errors_total", {}), 0);
  m.StoreCommitFailed();
  EXPECT_EQ(SeriesValue(m, "stemma_store_commit_errors_total", {}), 1);
}

}  // namespace
}  // namespace stemma::coordinator
