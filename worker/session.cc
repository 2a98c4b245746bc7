#include "worker/session.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/rpc.h"

namespace stemma::worker {
namespace {

constexpr int64_t kTickMs = 50;                // log flush period (the brief asks <= ~100 ms)
constexpr int64_t kRegisterTimeoutMs = 15000;  // no Registered by then: reconnect
constexpr size_t kLogChunk = 64 * 1024;
constexpr int kChunksPerTick = 16;                    // per attempt, so heartbeats stay on time
constexpr size_t kMetricsPerBatch = 8192;             // metric points per MetricBatch (~200 KB)
constexpr size_t kMetricsPerTick = 32768;             // metric points per attempt per tick
constexpr size_t kBatchBytes = kMaxMessageBytes / 4;  // an EventBatch is split beyond this

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string RandomIncarnation() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(RealClock::Get()->WallMs()));
  return absl::StrFormat("%016x", gen());
}

// Reads up to `n` bytes at `offset`; fewer at end of file.
bool ReadAt(const std::string& path, int64_t offset, size_t n, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->resize(n);
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, out->data() + got, n - got, offset + static_cast<int64_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  close(fd);
  out->resize(got);
  return got > 0;
}

}  // namespace

int64_t ReconnectBackoff::NextDelayMs() {
  const int64_t delay = std::uniform_int_distribution<int64_t>(backoff_ms_ / 2, backoff_ms_)(rng_);
  backoff_ms_ = std::min(kMaxMs, backoff_ms_ * 2);
  return delay;
}

Session::Session(const WorkerConfig& config, Executor* executor, Metrics* metrics,
                 ClientSecurity security, Clock* clock)
    : config_(config),
      security_(std::move(security)),
      executor_(executor),
      metrics_(metrics),
      incarnation_(RandomIncarnation()),
      clock_(clock != nullptr ? clock : RealClock::Get()) {
  // Finishes and progress are shipped at once, starts within 2 ms (together with the
  // finish of a short job), rather than on the next tick.
  executor_->SetChangeCallback([this] { cv_.SignalAll(); });
  if (metrics_ != nullptr) {
    metrics_->SetConnected(false);
    metrics_->SetGpusTotal(static_cast<int>(config_.gpus.size()));
  }
}

Session::~Session() {
  executor_->SetChangeCallback(nullptr);
  Stop();
}

void Session::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  if (ctx_ != nullptr) ctx_->TryCancel();
  cv_.SignalAll();
}

void Session::Run() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // A fresh channel, with its own subchannel, for every stream: a channel whose connection
  // failed fails new calls fast until gRPC's own reconnect backoff expires, and we want
  // our backoff, not gRPC's, to decide when the next try happens.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  ReconnectBackoff backoff(std::random_device{}());
  // One set of credentials for every stream: their certificate files are watched and
  // re-read when they change. main checked them, so this does not fail in practice.
  auto credentials = MakeChannelCredentials(security_, &args);
  if (!credentials.ok()) {
    spdlog::error("session: {}", credentials.status().ToString());
    return;
  }

  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
    }
    auto channel = grpc::CreateCustomChannel(config_.coordinator, *credentials, args);
    auto stub = v1::WorkerService::NewStub(channel);
    if (RunStream(*stub)) {
      backoff.Reset();
      failures_ = 0;
    } else {
      ++failures_;
    }
    const int64_t delay = backoff.NextDelayMs();
    const int64_t until = clock_->MonoMs() + delay;
    absl::MutexLock lock(&mu_);
    if (stop_) break;
    spdlog::debug("session: reconnecting to {} in {} ms", config_.coordinator, delay);
    // By the session's clock, looked at every tick.
    for (int64_t left = delay; !stop_ && left > 0; left = until - clock_->MonoMs()) {
      cv_.WaitWithTimeout(&mu_, absl::Milliseconds(std::min(left, kTickMs)));
    }
    if (stop_) break;
  }
  spdlog::info("session: stopped");
}

bool Session::RunStream(v1::WorkerService::Stub& stub) {
  grpc::ClientContext ctx;
  AddCallCredentials(security_, &ctx);
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return false;
    ctx_ = &ctx;
    conn_done_ = false;
    registered_ = false;
    acked_seq_ = 0;
    awaiting_ack_.clear();
    last_rx_ms_ = clock_->MonoMs();
    last_ack_ms_ = clock_->MonoMs();
    heartbeat_sent_us_.clear();
    pending_ship_.clear();
  }
  std::unique_ptr<Stream> stream = stub.Session(&ctx);
  const v1::WorkerMessage reg = MakeRegister();
  if (Write(stream.get(), reg)) {
    spdlog::debug("session: sent Register worker={} incarnation={} running={}", config_.worker_id,
                  incarnation_, reg.register_().running_size());
  }
  std::thread pump([&] { Pump(stream.get(), &ctx); });

  bool registered = false;
  v1::CoordinatorMessage msg;
  while (stream->Read(&msg)) {
    {
      absl::MutexLock lock(&mu_);
      last_rx_ms_ = clock_->MonoMs();
    }
    if (msg.has_batch()) {
      for (const v1::CoordinatorMessage& m : msg.batch().messages()) Handle(m, &registered);
    } else {
      Handle(msg, &registered);
    }
  }

  {
    absl::MutexLock lock(&mu_);
    conn_done_ = true;
    registered_ = false;
    cv_.SignalAll();
  }
  pump.join();
  const grpc::Status status = stream->Finish();
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    ctx_ = nullptr;
    stopping = stop_;
  }
  if (metrics_ != nullptr) metrics_->SetConnected(false);
  if (!stopping) {
    if (registered) {
      spdlog::warn("session: stream to {} ended: {} ({}); attempts keep running",
                   config_.coordinator, status.error_message(),
                   static_cast<int>(status.error_code()));
    } else if (failures_ % 50 == 0) {  // the first failure in a row, then now and then
      spdlog::warn("session: cannot register with {}: {} ({}); retrying", config_.coordinator,
                   status.error_message(), static_cast<int>(status.error_code()));
    } else {
      spdlog::debug("session: cannot register with {}: {} ({})", config_.coordinator,
                    status.error_message(), static_cast<int>(status.error_code()));
    }
  }
  return registered;
}

void Session::Handle(const v1::CoordinatorMessage& msg, bool* registered) {
  switch (msg.msg_case()) {
    case v1::CoordinatorMessage::kRegistered:
      if (*registered) {
        spdlog::warn("session: ignoring a second Registered");
      } else {
        *registered = true;
        OnRegistered(msg.registered());
      }
      break;
    case v1::CoordinatorMessage::kHeartbeatAck:
      OnHeartbeatAck(msg.heartbeat_ack());
      break;
    case v1::CoordinatorMessage::kAssign: {
      const v1::Assignment& a = msg.assign();
      if (!*registered) {
        spdlog::warn("session: assignment before Registered ignored: attempt={}", a.attempt_id());
        break;
      }
      // debug: the executor logs every start and finish at info already.
      spdlog::debug("session: assigned job={} attempt={} rank={}/{} gpus={}", a.job_id(),
                    a.attempt_id(), a.rank(), a.world_size(), a.gpu_ids_size());
      absl::Status launched = executor_->Launch(a);
      if (!launched.ok()) {
        spdlog::warn("session: attempt={} not launched: {}", a.attempt_id(), launched.ToString());
      }
      break;
    }
    case v1::CoordinatorMessage::kCancel:
      spdlog::info("session: cancel attempt={} reason=\"{}\"", msg.cancel().attempt_id(),
                   msg.cancel().reason());
      executor_->Cancel(msg.cancel().attempt_id(), msg.cancel().reason());
      break;
    case v1::CoordinatorMessage::kEventAck:
      OnAck(msg.event_ack().event_seq());
      break;
    case v1::CoordinatorMessage::kStop:
      if (msg.stop().preempt()) {
        spdlog::info("session: preempt attempt={} by={}", msg.stop().attempt_id(),
                     msg.stop().preempted_by());
        executor_->Preempt(msg.stop().attempt_id(), msg.stop().preempted_by());
      } else {
        RequestStop(msg.stop().attempt_id(), msg.stop().reason());
      }
      break;
    default:
      spdlog::warn("session: unknown message from the coordinator ({})",
                   static_cast<int>(msg.msg_case()));
  }
}

// Early stopping: <attempt dir>/stop, which the engine checks after every step
// (common/engine_contract.h kStopFile); written whole (temporary file and rename).
void Session::RequestStop(const std::string& attempt_id, const std::string& reason) {
  std::optional<AttemptSnapshot> a = executor_->Get(attempt_id);
  if (!a.has_value() || a->finished || a->log_path.empty()) return;
  const std::string dir = a->log_path.substr(0, a->log_path.rfind('/'));
  const std::string tmp = dir + "/.stop.tmp", path = dir + "/stop";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok =
      fd >= 0 && write(fd, reason.data(), reason.size()) == static_cast<ssize_t>(reason.size());
  if (fd >= 0) ok &= close(fd) == 0;
  ok = ok && rename(tmp.c_str(), path.c_str()) == 0;
  spdlog::info("session: stop attempt={} ({}): {}", attempt_id, reason,
               ok ? "asked" : std::strerror(errno));
}

v1::WorkerMessage Session::MakeRegister() {
  v1::WorkerMessage msg;
  v1::Register* reg = msg.mutable_register_();
  v1::WorkerInfo* info = reg->mutable_info();
  info->set_id(config_.worker_id);
  info->set_host(config_.host);
  for (const v1::Gpu& gpu : config_.gpus) *info->add_gpus() = gpu;
  info->set_cpus(config_.cpus);
  info->set_memory_mb(config_.memory_mb);
  for (const auto& [k, v] : config_.labels) (*info->mutable_labels())[k] = v;
  info->set_allow_exec(config_.allow_exec);
  info->set_engine_build_id(config_.engine_build_id);
  info->set_storage_root(config_.storage_root);  // the coordinator confines reported outputs
  reg->set_incarnation(incarnation_);
  reg->set_accepts_batches(true);
  {
    absl::MutexLock lock(&mu_);
    reg->set_session_secret(session_secret_);
  }
  for (const AttemptSnapshot& a : executor_->Snapshot()) {
    v1::RunningAttempt* r = reg->add_running();
    r->set_attempt_id(a.attempt_id);
    r->set_rank(a.rank);
    r->set_log_offset(a.log_bytes);
    for (const AttemptSnapshot::RankLog& l : a.more_logs) {
      (*r->mutable_local_log_offsets())[l.local_rank] = l.log_bytes;
    }
  }
  return msg;
}

void Session::OnRegistered(const v1::Registered& registered) {
  std::map<std::string, const v1::RunningAttempt*> keep;
  for (const v1::RunningAttempt& k : registered.keep()) keep[k.attempt_id()] = &k;

  // Executor calls happen without mu_: its change callback takes no lock, but keep the
  // lock order trivial anyway.
  std::map<std::string, Shipping> ship;
  std::set<std::string> known;
  int discarded = 0;
  for (const AttemptSnapshot& a : executor_->Snapshot()) {
    known.insert(a.attempt_id);
    auto it = keep.find(a.attempt_id);
    if (it == keep.end()) {
      spdlog::info("session: attempt={} not kept by the coordinator; {}", a.attempt_id,
                   a.finished ? "forgetting it" : "killing it");
      executor_->Discard(a.attempt_id);
      ++discarded;
      continue;
    }
    Shipping s;
    s.sent = std::clamp<int64_t>(it->second->log_offset(), 0, a.log_bytes);
    for (const AttemptSnapshot::RankLog& l : a.more_logs) {
      const auto& offsets = it->second->local_log_offsets();
      const auto at = offsets.find(l.local_rank);
      s.more_sent[l.local_rank] =
          std::clamp<int64_t>(at == offsets.end() ? 0 : at->second, 0, l.log_bytes);
    }
    s.started_sent = true;  // the coordinator knows it runs
    ship[a.attempt_id] = s;
  }
  for (const auto& [id, k] : keep) {
    if (known.count(id) > 0) continue;
    spdlog::warn("session: coordinator keeps attempt={} which this worker does not have", id);
    executor_->RecordLost(id, k->rank(), "lost: the worker no longer has this attempt");
    Shipping s;
    s.started_sent = true;
    ship[id] = s;
  }

  {
    absl::MutexLock lock(&mu_);
    heartbeat_interval_ms_ =
        registered.heartbeat_interval_ms() > 0 ? registered.heartbeat_interval_ms() : 1000;
    const int64_t lease =
        registered.lease_ms() > 0 ? registered.lease_ms() : 10 * heartbeat_interval_ms_;
    silence_limit_ms_ = std::max(lease, 3 * heartbeat_interval_ms_);
    pending_ship_ = std::move(ship);
    coordinator_batches_ = registered.accepts_batches();
    session_secret_ = registered.session_secret();
    registered_ = true;
    last_ack_ms_ = clock_->MonoMs();
    cv_.SignalAll();
  }
  if (metrics_ != nullptr) metrics_->SetConnected(true);
  spdlog::info(
      "session: registered with {} as worker={} incarnation={} lease_ms={} heartbeat_ms={} "
      "kept={} discarded={}",
      config_.coordinator, registered.worker_id(), incarnation_, registered.lease_ms(),
      registered.heartbeat_interval_ms(), registered.keep_size(), discarded);
}

void Session::OnHeartbeatAck(const v1::HeartbeatAck& ack) {
  const int64_t now = clock_->MonoMs();
  {
    absl::MutexLock lock(&mu_);
    last_ack_ms_ = now;
    auto it = heartbeat_sent_us_.find(ack.seq());
    if (it != heartbeat_sent_us_.end()) {
      if (metrics_ != nullptr) metrics_->ObserveHeartbeatRtt((NowUs() - it->second) / 1e6);
      heartbeat_sent_us_.erase(heartbeat_sent_us_.begin(), std::next(it));
    }
  }
  if (ack.acked_event_seq() > 0) OnAck(ack.acked_event_seq());
}

void Session::OnAck(uint64_t event_seq) {
  // The acked attempts are forgotten here, on the reading thread, without waking the pump
  // (a thread hand-off per job), and before the assignment that usually follows the ack
  // in the same read: that launch then finds the freed directory to reuse.
  std::vector<std::string> forget;
  {
    absl::MutexLock lock(&mu_);
    acked_seq_ = std::max(acked_seq_, event_seq);
    while (!awaiting_ack_.empty() && awaiting_ack_.front().first <= acked_seq_) {
      forget.push_back(std::move(awaiting_ack_.front().second));
      awaiting_ack_.pop_front();
    }
  }
  for (const std::string& id : forget) executor_->Forget(id);
}

bool Session::Write(Stream* stream, const v1::WorkerMessage& msg) {
  absl::MutexLock lock(&write_mu_);
  return stream->Write(msg);
}

void Session::Pump(Stream* stream, grpc::ClientContext* ctx) {
  ship_.clear();
  bool took_registration = false;
  int64_t next_heartbeat_ms = 0;
  const int64_t started_ms = clock_->MonoMs();
  for (;;) {
    int64_t interval;
    int64_t silence_limit;
    int64_t last_rx;
    int64_t last_ack;
    uint64_t acked;
    {
      absl::MutexLock lock(&mu_);
      cv_.WaitWithTimeout(&mu_, absl::Milliseconds(kTickMs));
      if (conn_done_ || stop_) return;
      if (!registered_) {
        if (clock_->MonoMs() - started_ms > kRegisterTimeoutMs) {
          spdlog::warn("session: no Registered from {} after {} ms; reconnecting",
                       config_.coordinator, kRegisterTimeoutMs);
          ctx->TryCancel();
          return;
        }
        continue;
      }
      if (!took_registration) {
        ship_ = std::move(pending_ship_);
        pending_ship_.clear();
        batches_ = coordinator_batches_;
        took_registration = true;
      }
      interval = heartbeat_interval_ms_;
      silence_limit = silence_limit_ms_;
      last_rx = last_rx_ms_;
      last_ack = last_ack_ms_;
      acked = acked_seq_;
    }
    const int64_t now = clock_->MonoMs();
    if (metrics_ != nullptr) metrics_->SetHeartbeatAge((now - last_ack) / 1000.0);
    if (now - last_rx > silence_limit) {
      spdlog::warn("session: nothing from {} for {} ms; reconnecting", config_.coordinator,
                   now - last_rx);
      ctx->TryCancel();
      return;
    }

    // Acked Finished events: the coordinator has them, so the attempts can be forgotten.
    // (OnAck forgets them already; this covers an ack that raced with the send.)
    for (auto it = ship_.begin(); it != ship_.end();) {
      if (it->second.finished_sent && it->second.finished_seq <= acked) {
        executor_->Forget(it->first);
        it = ship_.erase(it);
      } else {
        ++it;
      }
    }

    if (now >= next_heartbeat_ms) {
      v1::WorkerMessage hb;
      {
        absl::MutexLock lock(&mu_);
        const uint64_t seq = ++heartbeat_seq_;
        hb.mutable_heartbeat()->set_seq(seq);
        hb.mutable_heartbeat()->set_sent_ms(clock_->WallMs());
        heartbeat_sent_us_[seq] = NowUs();
        while (heartbeat_sent_us_.size() > 64) heartbeat_sent_us_.erase(heartbeat_sent_us_.begin());
      }
      next_heartbeat_ms = now + interval;
      if (!Write(stream, hb)) {
        ctx->TryCancel();
        return;
      }
    }
    if (!ShipEvents(stream)) {
      ctx->TryCancel();
      return;
    }
  }
}

bool Session::ShipEvents(Stream* stream) {
  std::vector<AttemptSnapshot> attempts = executor_->Snapshot();
  std::set<std::string> live;
  // Events are written at the end, together (WriteEvents), so that e.g. the Started and
  // Finished of short jobs leave in one write and are applied in one pass at the coordinator.
  std::vector<v1::AttemptEvent> out;
  std::vector<std::pair<uint64_t, std::string>> finished;  // (event_seq, attempt id)
  for (const AttemptSnapshot& a : attempts) {
    live.insert(a.attempt_id);
    Shipping& s = ship_[a.attempt_id];  // new attempts start at offset 0
    v1::AttemptEvent ev;
    ev.set_attempt_id(a.attempt_id);
    ev.set_rank(a.rank);

    if (!s.started_sent && a.pid > 0) {
      ev.mutable_started()->set_pid(a.pid);
      out.push_back(ev);
      s.started_sent = true;
    }
    if (a.progress_version > s.progress_sent) {
      *ev.mutable_progress() = a.progress;
      out.push_back(ev);
      s.progress_sent = a.progress_version;
    }
    // What the attempt reported since the last round leaves as one packed batch (more only
    // past kMetricsPerBatch points), before its Finished.
    for (size_t shipped = 0; a.metric_count > s.metrics_sent && shipped < kMetricsPerTick;) {
      v1::AttemptEvent mev;
      mev.set_attempt_id(a.attempt_id);
      mev.set_rank(a.rank);
      const size_t n = executor_->MetricsSince(a.attempt_id, s.metrics_sent, kMetricsPerBatch,
                                               mev.mutable_metrics());
      if (n == 0) break;
      s.metrics_sent += n;
      shipped += n;
      out.push_back(std::move(mev));
    }
    ShipLog(a, 0, a.log_path, a.log_bytes, &s.sent, &out);
    bool logs_sent = s.sent >= a.log_bytes;
    for (const AttemptSnapshot::RankLog& l : a.more_logs) {
      int64_t& sent = s.more_sent[l.local_rank];
      ShipLog(a, l.local_rank, l.log_path, l.log_bytes, &sent, &out);
      logs_sent &= sent >= l.log_bytes;
    }
    if (a.finished && !s.finished_sent && logs_sent && s.metrics_sent >= a.metric_count) {
      // A fresh seq on every (re)send keeps event_seq increasing along the stream.
      s.finished_seq = ++next_event_seq_;
      ev.set_event_seq(s.finished_seq);
      *ev.mutable_finished() = a.result;
      out.push_back(std::move(ev));
      s.finished_sent = true;
      finished.emplace_back(s.finished_seq, a.attempt_id);
      spdlog::debug("session: sent Finished attempt={} seq={} reason=\"{}\"", a.attempt_id,
                    s.finished_seq, a.result.reason());
    }
  }
  for (auto it = ship_.begin(); it != ship_.end();) {
    it = live.count(it->first) > 0 ? std::next(it) : ship_.erase(it);
  }
  if (!finished.empty()) {
    // Registered before the write, so that OnAck finds them however fast the ack comes.
    absl::MutexLock lock(&mu_);
    for (auto& f : finished) awaiting_ack_.push_back(std::move(f));
  }
  return WriteEvents(stream, &out);
}

void Session::ShipLog(const AttemptSnapshot& a, int32_t local_rank, const std::string& path,
                      int64_t bytes, int64_t* sent, std::vector<v1::AttemptEvent>* out) {
  std::string chunk;
  for (int i = 0; i < kChunksPerTick && *sent < bytes; ++i) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(kLogChunk, bytes - *sent));
    if (!executor_->LogSince(a.attempt_id, *sent, want, &chunk, local_rank) &&
        !ReadAt(path, *sent, want, &chunk)) {
      spdlog::error("session: attempt={} cannot read {} at {}; skipping {} log bytes", a.attempt_id,
                    path, *sent, bytes - *sent);
      *sent = bytes;
      break;
    }
    v1::AttemptEvent ev;
    ev.set_attempt_id(a.attempt_id);
    ev.set_rank(a.rank);
    v1::AttemptEvent::LogData* log = ev.mutable_log();
    log->set_offset(*sent);
    log->set_local_rank(local_rank);
    log->set_data(std::move(chunk));
    *sent += static_cast<int64_t>(log->data().size());
    out->push_back(std::move(ev));
  }
}

bool Session::WriteEvents(Stream* stream, std::vector<v1::AttemptEvent>* events) {
  std::vector<size_t> sizes;
  sizes.reserve(events->size());
  for (const v1::AttemptEvent& ev : *events) sizes.push_back(ev.ByteSizeLong() + 8);
  for (size_t i = 0; i < events->size();) {
    // One stream message: as many events as fit in kBatchBytes (a single one for a
    // coordinator that takes no EventBatch).
    size_t end = i + 1;
    size_t bytes = sizes[i];
    while (batches_ && end < events->size() && bytes + sizes[end] <= kBatchBytes) {
      bytes += sizes[end++];
    }
    v1::WorkerMessage msg;
    if (end - i == 1) {
      *msg.mutable_event() = std::move((*events)[i]);
    } else {
      for (size_t k = i; k < end; ++k) {
        *msg.mutable_events()->add_events() = std::move((*events)[k]);
      }
    }
    if (!Write(stream, msg)) return false;
    i = end;
  }
  return true;
}

}  // namespace stemma::worker
