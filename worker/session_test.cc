// The session against an in-process fake coordinator: registration, assignment, event
// order (Started, log, Finished), acks, and resumption after the stream breaks.
#include "worker/session.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "common/clock.h"

namespace stemma::worker {
namespace {

namespace fs = std::filesystem;
constexpr auto kWait = std::chrono::seconds(30);  // "eventually", never a timing assertion

class FakeCoordinator final : public v1::WorkerService::Service {
 public:
  grpc::Status Session(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    v1::WorkerMessage first;
    if (!stream->Read(&first) || !first.has_register_()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected Register");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ctx_ = ctx;
      stream_ = stream;
    }
    v1::CoordinatorMessage reply;
    v1::Registered* reg = reply.mutable_registered();
    reg->set_worker_id(first.register_().info().id());
    reg->set_lease_ms(10000);
    {
      std::lock_guard<std::mutex> lock(mu_);
      reg->set_heartbeat_interval_ms(heartbeat_interval_ms_);
      for (const auto& k : keep_) *reg->add_keep() = k;
      reg->set_accepts_batches(accepts_batches_);
    }
    Send(reply);
    {
      std::lock_guard<std::mutex> lock(mu_);
      registers_.push_back(first.register_());  // after Registered: tests may now assign
      cv_.notify_all();
    }
    v1::WorkerMessage msg;
    while (stream->Read(&msg)) {
      if (msg.has_heartbeat()) {
        bool ack_it;
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++heartbeats_;
          ack_it = ack_heartbeats_;
          cv_.notify_all();
        }
        if (ack_it) {
          v1::CoordinatorMessage ack;
          ack.mutable_heartbeat_ack()->set_seq(msg.heartbeat().seq());
          Send(ack);
        }
        continue;
      }
      // One event, or a batch of them (what the worker had pending at once).
      std::vector<v1::AttemptEvent> events;
      if (msg.has_events()) {
        events.assign(msg.events().events().begin(), msg.events().events().end());
        std::lock_guard<std::mutex> lock(mu_);
        ++batches_received_;
      } else {
        events.push_back(msg.event());
      }
      for (const v1::AttemptEvent& event : events) {
        bool ack_it = false;
        {
          std::lock_guard<std::mutex> lock(mu_);
          events_.push_back(event);
          message_of_.push_back(messages_);
          ack_it = auto_ack_ && event.has_finished();
          cv_.notify_all();
        }
        if (ack_it) {
          v1::CoordinatorMessage ack;
          ack.mutable_event_ack()->set_event_seq(event.event_seq());
          Send(ack);
        }
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++messages_;
    }
    std::lock_guard<std::mutex> lock(mu_);
    stream_ = nullptr;
    ctx_ = nullptr;
    ++streams_ended_;
    cv_.notify_all();
    return grpc::Status::OK;
  }

  void Send(const v1::CoordinatorMessage& msg) {
    std::lock_guard<std::mutex> lock(write_mu_);
    std::unique_lock<std::mutex> state(mu_);
    auto* stream = stream_;
    state.unlock();
    if (stream != nullptr) stream->Write(msg);
  }
  void Drop() {
    std::lock_guard<std::mutex> lock(mu_);
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  bool WaitFor(const std::function<bool()>& pred) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWait, pred);
  }
  void SetKeep(std::vector<v1::RunningAttempt> keep) {
    std::lock_guard<std::mutex> lock(mu_);
    keep_ = std::move(keep);
  }
  void SetAutoAck(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    auto_ack_ = on;
  }
  // Answers the next Register as a coordinator that takes no EventBatch would.
  void SetAcceptsBatches(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    accepts_batches_ = on;
  }

  // A coordinator that only listens: heartbeats are counted, never acked.
  void SetAckHeartbeats(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    ack_heartbeats_ = on;
  }
  void SetHeartbeatIntervalMs(int64_t ms) {
    std::lock_guard<std::mutex> lock(mu_);
    heartbeat_interval_ms_ = ms;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::Register> registers_;
  int heartbeats_ = 0;     // Heartbeat messages received, all streams
  int streams_ended_ = 0;  // streams that ended after Registered
  std::vector<v1::AttemptEvent> events_;
  std::vector<int> message_of_;  // per event in events_: the stream message it came in
  int messages_ = 0;             // event-carrying messages received
  int batches_received_ = 0;     // of them, EventBatch messages

 private:
  std::mutex write_mu_;
  grpc::ServerContext* ctx_ = nullptr;
  grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream_ = nullptr;
  std::vector<v1::RunningAttempt> keep_;
  bool auto_ack_ = true;
  bool accepts_batches_ = true;
  bool ack_heartbeats_ = true;
  int64_t heartbeat_interval_ms_ = 100;
};

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("session_test." + std::to_string(getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_GT(port, 0);
    config_.coordinator = "127.0.0.1:" + std::to_string(port);
    config_.data_dir = dir_.string();
    config_.worker_id = "w-test";
    config_.allow_exec = true;
    config_.kill_grace_ms = 200;
    Clock* clock = fake_clock_ ? &clock_ : nullptr;
    executor_ = std::make_unique<Executor>(config_, nullptr, clock);
    session_ =
        std::make_unique<Session>(config_, executor_.get(), nullptr, ClientSecurity{}, clock);
    thread_ = std::thread([this] { session_->Run(); });
  }
  void TearDown() override {
    session_->Stop();
    thread_.join();
    session_.reset();
    executor_.reset();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    fs::remove_all(dir_);
  }

  static v1::CoordinatorMessage Assignment(const std::string& id, std::vector<std::string> argv) {
    v1::CoordinatorMessage msg;
    v1::Assignment* a = msg.mutable_assign();
    a->set_job_id("j");
    a->set_attempt_id(id);
    a->set_world_size(1);
    for (auto& s : argv) a->mutable_spec()->mutable_exec()->add_argv(s);
    return msg;
  }
  void Assign(const std::string& id, std::vector<std::string> argv) {
    fake_.Send(Assignment(id, std::move(argv)));
  }
  // Events of one attempt, in arrival order (call with fake_.mu_ held).
  std::vector<v1::AttemptEvent> EventsOf(const std::string& id) {
    std::vector<v1::AttemptEvent> out;
    for (const auto& e : fake_.events_) {
      if (e.attempt_id() == id) out.push_back(e);
    }
    return out;
  }
  int FinishedCount(const std::string& id) {
    int n = 0;
    for (const auto& e : EventsOf(id)) n += e.has_finished() ? 1 : 0;
    return n;
  }
  std::string LogOf(const std::string& id, int64_t from) {
    std::string log;
    for (const auto& e : EventsOf(id)) {
      if (e.has_log() && e.log().offset() >= from) {
        EXPECT_EQ(e.log().offset(), from + static_cast<int64_t>(log.size()));
        log += e.log().data();
      }
    }
    return log;
  }
  bool WaitForgotten(const std::string& id) {
    for (int i = 0; i < 3000; ++i) {
      if (!executor_->Get(id).has_value()) return true;
      usleep(10'000);
    }
    return false;
  }

  bool fake_clock_ = false;  // the executor and the session run on clock_
  FakeClock clock_;
  fs::path dir_;
  FakeCoordinator fake_;
  std::unique_ptr<grpc::Server> server_;
  WorkerConfig config_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Session> session_;
  std::thread thread_;
};

TEST_F(SessionTest, RunsAnAssignmentAndShipsEventsInOrder) {
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 1; }));
  EXPECT_EQ(fake_.registers_[0].info().id(), "w-test");
  EXPECT_TRUE(fake_.registers_[0].info().allow_exec());
  EXPECT_FALSE(fake_.registers_[0].incarnation().empty());

  Assign("a1", {"/bin/echo", "hello world"});
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("a1") == 1; }));
  {
    std::lock_guard<std::mutex> lock(fake_.mu_);
    std::vector<v1::AttemptEvent> events = EventsOf("a1");
    ASSERT_GE(events.size(), 3u);
    EXPECT_TRUE(events.front().has_started());
    EXPECT_GT(events.front().started().pid(), 0);
    EXPECT_TRUE(events.back().has_finished());
    EXPECT_GT(events.back().event_seq(), 0u);
    EXPECT_EQ(events.back().finished().reason(), "exit 0");
    EXPECT_EQ(LogOf("a1", 0), "hello world\n");
  }
  EXPECT_TRUE(WaitForgotten("a1"));  // acked
}

TEST_F(SessionTest, ResumesLogAndFinishedAfterReconnect) {
  fake_.SetAutoAck(false);
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 1; }));
  Assign("a2", {"/bin/echo", "0123456789"});
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("a2") == 1; }));

  v1::RunningAttempt keep;
  keep.set_attempt_id("a2");
  keep.set_log_offset(4);
  fake_.SetKeep({keep});
  fake_.SetAutoAck(true);
  fake_.Drop();
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("a2") == 2; }));
  std::lock_guard<std::mutex> lock(fake_.mu_);
  ASSERT_EQ(fake_.registers_.size(), 2u);
  ASSERT_EQ(fake_.registers_[1].running_size(), 1);
  EXPECT_EQ(fake_.registers_[1].running(0).attempt_id(), "a2");
  EXPECT_EQ(fake_.registers_[1].running(0).log_offset(), 11);
  EXPECT_EQ(fake_.registers_[1].incarnation(), fake_.registers_[0].incarnation());
  std::vector<v1::AttemptEvent> events = EventsOf("a2");
  // After the reconnect: the log from offset 4, then Finished with a newer seq.
  std::vector<v1::AttemptEvent> after;
  uint64_t first_seq = 0;
  for (const auto& e : events) {
    if (first_seq != 0) after.push_back(e);
    if (e.has_finished() && first_seq == 0) first_seq = e.event_seq();
  }
  ASSERT_GE(after.size(), 2u);
  EXPECT_TRUE(after[0].has_log());
  EXPECT_EQ(after[0].log().offset(), 4);
  EXPECT_EQ(after[0].log().data(), "456789\n");
  EXPECT_TRUE(after.back().has_finished());
  EXPECT_GT(after.back().event_seq(), first_seq);
}

// A part of two ranks: each rank's log ships with its local rank, the Register reports every
// rank's offset, and a reconnect resumes each log where the coordinator's copy ends.
TEST_F(SessionTest, EveryRanksLogShipsAndResumesAfterReconnect) {
  fake_.SetAutoAck(false);
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 1; }));
  v1::CoordinatorMessage msg = Assignment("r2", {"/bin/sh", "-c", "echo rank$LOCAL_RANK-abcdef"});
  msg.mutable_assign()->mutable_spec()->mutable_resources()->set_ranks_per_part(2);
  fake_.Send(msg);
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("r2") == 1; }));
  auto log_of = [&](int local, int64_t from) {
    std::string log;
    for (const auto& e : EventsOf("r2")) {
      if (e.has_log() && e.log().local_rank() == local && e.log().offset() >= from)
        log += e.log().data();
    }
    return log;
  };
  {
    std::lock_guard<std::mutex> lock(fake_.mu_);
    EXPECT_EQ(log_of(0, 0), "rank0-abcdef\n");
    EXPECT_EQ(log_of(1, 0), "rank1-abcdef\n");
  }
  v1::RunningAttempt keep;
  keep.set_attempt_id("r2");
  keep.set_log_offset(13);  // rank 0's whole log
  (*keep.mutable_local_log_offsets())[1] = 6;
  fake_.SetKeep({keep});
  fake_.SetAutoAck(true);
  fake_.Drop();
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("r2") == 2; }));
  std::lock_guard<std::mutex> lock(fake_.mu_);
  ASSERT_EQ(fake_.registers_.size(), 2u);
  ASSERT_EQ(fake_.registers_[1].running_size(), 1);
  EXPECT_EQ(fake_.registers_[1].running(0).log_offset(), 13);
  EXPECT_EQ(fake_.registers_[1].running(0).local_log_offsets().at(1), 13);
  // After the reconnect only rank 1's rest was sent again, then Finished.
  std::vector<v1::AttemptEvent> after;
  bool reconnected = false;
  for (const auto& e : EventsOf("r2")) {
    if (reconnected) after.push_back(e);
    reconnected |= e.has_finished();
  }
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0].log().local_rank(), 1);
  EXPECT_EQ(after[0].log().offset(), 6);
  EXPECT_EQ(after[0].log().data(), "abcdef\n");
  EXPECT_TRUE(after[1].has_finished());
}

TEST_F(SessionTest, KillsAttemptsTheCoordinatorDoesNotKeep) {
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 1; }));
  Assign("a3", {"/bin/sleep", "100"});
  int64_t pid = 0;
  ASSERT_TRUE(fake_.WaitFor([&] {
    for (const auto& e : EventsOf("a3")) {
      if (e.has_started()) pid = e.started().pid();
    }
    return pid > 0;
  }));
  fake_.Drop();  // reconnects; the fake keeps nothing
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 2; }));
  EXPECT_EQ(fake_.registers_[1].running_size(), 1);
  EXPECT_TRUE(WaitForgotten("a3"));
  bool gone = false;
  for (int i = 0; i < 1000 && !gone; ++i) {
    gone = kill(-static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    if (!gone) usleep(10'000);
  }
  EXPECT_TRUE(gone);
}

TEST_F(SessionTest, CancelFromTheCoordinator) {
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 1; }));
  Assign("a4", {"/bin/sleep", "100"});
  ASSERT_TRUE(fake_.WaitFor([&] {
    for (const auto& e : EventsOf("a4")) {
      if (e.has_started()) return true;
    }
    return false;
  }));
  v1::CoordinatorMessage cancel;
  cancel.mutable_cancel()->set_attempt_id("a4");
  cancel.mutable_cancel()->set_reason("by user");
  fake_.Send(cancel);
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("a4") == 1; }));
  std::lock_guard<std::mutex> lock(fake_.mu_);
  EXPECT_EQ(EventsOf("a4").back().finished().reason(), "cancelled: by user");
}

TEST_F(SessionTest, RunsEveryMessageOfACoordinatorBatchInOrder) {
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 1; }));
  v1::CoordinatorMessage batch;
  *batch.mutable_batch()->add_messages() = Assignment("b1", {"/bin/echo", "one"});
  *batch.mutable_batch()->add_messages() = Assignment("b2", {"/bin/sleep", "100"});
  v1::CoordinatorMessage* cancel = batch.mutable_batch()->add_messages();
  cancel->mutable_cancel()->set_attempt_id("b2");
  cancel->mutable_cancel()->set_reason("changed my mind");
  fake_.Send(batch);
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("b1") == 1 && FinishedCount("b2") == 1; }));
  std::lock_guard<std::mutex> lock(fake_.mu_);
  EXPECT_EQ(EventsOf("b1").back().finished().reason(), "exit 0");
  EXPECT_EQ(LogOf("b1", 0), "one\n");
  EXPECT_EQ(EventsOf("b2").back().finished().reason(), "cancelled: changed my mind");
}

TEST_F(SessionTest, EventsPendingTogetherLeaveInOneMessage) {
  // Two attempts finish while nothing acks them; after a reconnect both Finished events
  // are pending at once, so they go out as one EventBatch.
  fake_.SetAutoAck(false);
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 1; }));
  Assign("c1", {"/bin/true"});
  Assign("c2", {"/bin/true"});
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("c1") == 1 && FinishedCount("c2") == 1; }));
  std::vector<v1::RunningAttempt> keep(2);
  keep[0].set_attempt_id("c1");
  keep[1].set_attempt_id("c2");
  fake_.SetKeep(keep);
  fake_.SetAutoAck(true);
  fake_.Drop();
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("c1") == 2 && FinishedCount("c2") == 2; }));
  EXPECT_TRUE(WaitForgotten("c1"));
  EXPECT_TRUE(WaitForgotten("c2"));
  std::lock_guard<std::mutex> lock(fake_.mu_);
  int message[2] = {-1, -1};
  for (size_t i = 0; i < fake_.events_.size(); ++i) {
    const v1::AttemptEvent& e = fake_.events_[i];
    if (e.has_finished()) message[e.attempt_id() == "c1" ? 0 : 1] = fake_.message_of_[i];
  }
  EXPECT_EQ(message[0], message[1]);
}

TEST_F(SessionTest, ACoordinatorWithoutBatchesGetsOneMessagePerEvent) {
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 1; }));
  EXPECT_TRUE(fake_.registers_[0].accepts_batches());
  fake_.SetAcceptsBatches(false);
  fake_.Drop();
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 2; }));
  int before;
  {
    std::lock_guard<std::mutex> lock(fake_.mu_);
    before = fake_.batches_received_;
  }
  Assign("d1", {"/bin/echo", "one"});
  Assign("d2", {"/bin/echo", "two"});
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("d1") == 1 && FinishedCount("d2") == 1; }));
  std::lock_guard<std::mutex> lock(fake_.mu_);
  EXPECT_EQ(fake_.batches_received_, before);
  EXPECT_EQ(LogOf("d1", 0), "one\n");
  EXPECT_EQ(LogOf("d2", 0), "two\n");
}

// An attempt's metric points travel packed (MetricBatch, never a message per point), all of
// them before its Finished, in the order the engine printed them.
TEST_F(SessionTest, MetricPointsTravelPackedBeforeFinished) {
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 1; }));
  Assign("m1",
         {"/bin/sh", "-c",
          "i=1; while [ $i -le 50 ]; do "
          "echo \"{\\\"event\\\":\\\"step\\\",\\\"step\\\":$i,\\\"loss\\\":$i.5,\\\"lr\\\":0.1}\"; "
          "i=$((i+1)); done"});
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("m1") == 1; }));
  std::lock_guard<std::mutex> lock(fake_.mu_);
  std::vector<v1::AttemptEvent> events = EventsOf("m1");
  ASSERT_TRUE(events.back().has_finished());
  EXPECT_EQ(events.back().finished().reason(), "exit 0");
  std::vector<std::pair<std::string, int64_t>> points;  // (name, step)
  std::vector<double> losses;
  int batches = 0;
  for (const v1::AttemptEvent& e : events) {
    EXPECT_FALSE(e.has_metric()) << "one message per point";
    if (!e.has_metrics()) continue;
    ++batches;
    const auto& b = e.metrics();
    ASSERT_EQ(b.steps_size(), b.name_index_size());
    ASSERT_EQ(b.values_size(), b.name_index_size());
    for (int i = 0; i < b.name_index_size(); ++i) {
      const std::string& name = b.names(static_cast<int>(b.name_index(i)));
      points.emplace_back(name, b.steps(i));
      if (name == "loss") losses.push_back(b.values(i));
    }
  }
  ASSERT_EQ(points.size(), 100u);
  EXPECT_LE(batches, 50);
  for (int64_t step = 1; step <= 50; ++step) {
    EXPECT_EQ(points[2 * (step - 1)], std::make_pair(std::string("loss"), step));
    EXPECT_EQ(points[2 * (step - 1) + 1], std::make_pair(std::string("lr"), step));
    EXPECT_DOUBLE_EQ(losses[step - 1], step + 0.5);
  }
}

// The session's timing runs on its Clock: heartbeats fall due, a silent coordinator is given
// up at the lease and the reconnect waits out its backoff only as that clock moves.
class SessionClockTest : public SessionTest {
 protected:
  SessionClockTest() {
    fake_clock_ = true;
    fake_.SetAckHeartbeats(false);  // only the registration and event acks count as contact
    fake_.SetHeartbeatIntervalMs(1);
  }
  int Heartbeats() {
    std::lock_guard<std::mutex> lock(fake_.mu_);
    return fake_.heartbeats_;
  }
  size_t Registers() {
    std::lock_guard<std::mutex> lock(fake_.mu_);
    return fake_.registers_.size();
  }
};

TEST_F(SessionClockTest, HeartbeatsSilenceAndBackoffFollowTheClock) {
  ASSERT_TRUE(
      fake_.WaitFor([&] { return fake_.registers_.size() == 1 && fake_.heartbeats_ == 1; }));
  // A job's whole life takes the pump round several times; with the clock standing still no
  // second heartbeat falls due, though the interval is 1 ms.
  Assign("c1", {"/bin/true"});
  ASSERT_TRUE(fake_.WaitFor([&] { return FinishedCount("c1") == 1; }));
  ASSERT_TRUE(WaitForgotten("c1"));  // the ack came: the last contact, at the clock's now
  EXPECT_EQ(Heartbeats(), 1);

  clock_.Advance(1);
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.heartbeats_ == 2; }));
  // 9,001 ms of silence: within the 10,000 ms lease, the stream stays (the heartbeat proves
  // the pump looked after the clock moved).
  clock_.Advance(9000);
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.heartbeats_ == 3; }));
  EXPECT_EQ(Registers(), 1u);
  {
    std::lock_guard<std::mutex> lock(fake_.mu_);
    EXPECT_EQ(fake_.streams_ended_, 0);
  }

  // Past the lease: the worker gives the stream up...
  clock_.Advance(1000);
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.streams_ended_ == 1; }));
  // ...and reconnects only once its backoff (50-100 ms after a registered stream) has passed
  // on its clock: give a wall-clock backoff the time to show itself, then move the clock.
  usleep(300'000);
  EXPECT_EQ(Registers(), 1u);
  clock_.Advance(100);
  ASSERT_TRUE(fake_.WaitFor([&] { return fake_.registers_.size() == 2; }));
}

TEST(ReconnectBackoff, DoublesWithJitterUpToTheCapAndResets) {
  ReconnectBackoff backoff(42);
  int64_t d = ReconnectBackoff::kMinMs;
  for (int i = 0; i < 12; ++i) {
    const int64_t delay = backoff.NextDelayMs();
    EXPECT_GE(delay, d / 2) << "try " << i;
    EXPECT_LE(delay, d) << "try " << i;
    d = std::min(ReconnectBackoff::kMaxMs, d * 2);
  }
  EXPECT_EQ(d, ReconnectBackoff::kMaxMs);
  backoff.Reset();
  const int64_t first = backoff.NextDelayMs();
  EXPECT_GE(first, ReconnectBackoff::kMinMs / 2);
  EXPECT_LE(first, ReconnectBackoff::kMinMs);
  // The jitter differs between workers (seeds), not between runs of one seed.
  ReconnectBackoff a(7), b(7);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a.NextDelayMs(), b.NextDelayMs());
}

}  // namespace
}  // namespace stemma::worker
