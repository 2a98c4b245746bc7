// The worker's session with the coordinator: one bidirectional WorkerService.Session
// stream at a time. Registers (with the attempts it still holds), heartbeats, launches and
// cancels attempts on the coordinator's word, and ships each attempt's Started, log,
// progress and Finished events. When the stream breaks it reconnects with jittered
// exponential backoff (100 ms .. 5 s); running attempts are left alone meanwhile.
//
// Delivery: logs are shipped from the attempt's log file, so nothing is buffered in memory
// and a reconnect resumes from the offset the coordinator reports in Registered.keep.
// Finished is sent after every log byte, with a fresh per-worker event_seq each time it is
// (re)sent, and kept until an EventAck (or HeartbeatAck.acked_event_seq) covers it.
//
// Threading: Run() blocks in the calling thread, which reads the stream; a pump thread per
// stream does every write (heartbeats and events). Stop() may be called from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/rpc.h"
#include "stemma/v1/worker_service.grpc.pb.h"
#include "worker/config.h"
#include "worker/executor.h"
#include "worker/metrics.h"

namespace stemma::worker {

// The delay before the next stream after one that did not register: uniform in [d/2, d],
// d doubling from 100 ms up to 5 s, back to 100 ms after a stream that registered. The
// jitter keeps a fleet from reconnecting at once. Not thread-safe (Run's thread owns it).
class ReconnectBackoff {
 public:
  static constexpr int64_t kMinMs = 100;
  static constexpr int64_t kMaxMs = 5000;
  explicit ReconnectBackoff(uint64_t seed) : rng_(seed) {}
  int64_t NextDelayMs();
  void Reset() { backoff_ms_ = kMinMs; }

 private:
  std::mt19937_64 rng_;
  int64_t backoff_ms_ = kMinMs;
};

class Session {
 public:
  // `executor` and `metrics` must outlive the session. `security`: TLS (CA, client
  // certificate) and the worker's token for every stream; empty means plaintext, no token.
  // `clock` (null: the system's; must outlive the session) decides when heartbeats are due,
  // when a silent coordinator is given up, when a registration has taken too long and when
  // the reconnect backoff is over; the session looks at it at least every 50 ms.
  Session(const WorkerConfig& config, Executor* executor, Metrics* metrics,
          ClientSecurity security = {}, Clock* clock = nullptr);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Connects, registers and serves until Stop(); reconnects whenever the stream breaks.
  void Run();
  // Ends the current stream and makes Run() return. Does not touch the attempts.
  void Stop();

  // The random id of this daemon's life, sent in every Register.
  const std::string& incarnation() const { return incarnation_; }

 private:
  using Stream = grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>;

  // Per attempt, what has gone out on the current stream. Owned by the pump thread, except
  // that OnRegistered rebuilds it before the pump starts shipping.
  struct Shipping {
    int64_t sent = 0;                      // log bytes sent
    std::map<int32_t, int64_t> more_sent;  // further ranks of the part: local rank -> bytes sent
    bool started_sent = false;
    uint64_t progress_sent = 0;  // progress_version sent
    size_t metrics_sent = 0;     // metric points sent (Executor::MetricsSince)
    bool finished_sent = false;
    uint64_t finished_seq = 0;  // event_seq of the Finished sent on this stream
  };

  // One stream's life; true if it got as far as Registered.
  bool RunStream(v1::WorkerService::Stub& stub);
  // One message from the coordinator (batches are unpacked by the caller).
  void Handle(const v1::CoordinatorMessage& msg, bool* registered);
  void OnRegistered(const v1::Registered& registered);
  void OnHeartbeatAck(const v1::HeartbeatAck& ack);
  void OnAck(uint64_t event_seq);
  void Pump(Stream* stream, grpc::ClientContext* ctx);
  // Sends what each attempt has pending; false if the stream broke.
  bool ShipEvents(Stream* stream);
  // Up to kChunksPerTick chunks of one rank's log from *sent (advanced) as LogData events.
  void ShipLog(const AttemptSnapshot& a, int32_t local_rank, const std::string& path, int64_t bytes,
               int64_t* sent, std::vector<v1::AttemptEvent>* out);
  // Writes `events` in order, packed into EventBatch messages when the coordinator takes
  // them; false if the stream broke.
  bool WriteEvents(Stream* stream, std::vector<v1::AttemptEvent>* events);
  bool Write(Stream* stream, const v1::WorkerMessage& msg);
  v1::WorkerMessage MakeRegister();
  // A StopAttempt: writes the attempt's stop file for its engine.
  void RequestStop(const std::string& attempt_id, const std::string& reason);

  const WorkerConfig config_;
  const ClientSecurity security_;
  Executor* const executor_;
  Metrics* const metrics_;
  const std::string incarnation_;

  Clock* const clock_;

  absl::Mutex write_mu_;  // one Write at a time on the stream

  absl::Mutex mu_;
  absl::CondVar cv_;  // wakes the pump and the backoff sleep (with mu_)
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;  // the live stream's
  bool conn_done_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  int64_t heartbeat_interval_ms_ ABSL_GUARDED_BY(mu_) = 1000;
  int64_t silence_limit_ms_ ABSL_GUARDED_BY(mu_) = 15000;
  int64_t last_rx_ms_ ABSL_GUARDED_BY(mu_) = 0;   // monotonic, any coordinator message
  int64_t last_ack_ms_ ABSL_GUARDED_BY(mu_) = 0;  // monotonic, last HeartbeatAck
  uint64_t acked_seq_ ABSL_GUARDED_BY(mu_) = 0;   // highest event ack on this stream
  // Finished events sent on this stream and not yet acked, in event_seq order.
  std::deque<std::pair<uint64_t, std::string>> awaiting_ack_ ABSL_GUARDED_BY(mu_);
  uint64_t heartbeat_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, int64_t> heartbeat_sent_us_ ABSL_GUARDED_BY(mu_);  // seq -> steady us
  std::map<std::string, Shipping> pending_ship_ ABSL_GUARDED_BY(mu_);   // from OnRegistered
  bool coordinator_batches_ ABSL_GUARDED_BY(mu_) = false;  // Registered.accepts_batches
  // The last Registered.session_secret: proves a reconnect is this daemon, not a copy of
  // its token. Only in memory (a restarted daemon has none).
  std::string session_secret_ ABSL_GUARDED_BY(mu_);

  // Pump-owned (one pump at a time; handed over through mu_ at registration).
  std::map<std::string, Shipping> ship_;
  bool batches_ = false;         // the coordinator of this stream takes EventBatch
  uint64_t next_event_seq_ = 0;  // per worker, never reset

  int failures_ = 0;  // streams in a row that did not register (Run's thread only)
};

}  // namespace stemma::worker
