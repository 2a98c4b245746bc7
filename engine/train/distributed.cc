// DataParallel: rendezvous through c10d's TCPStore, collectives over a TCP ring.
//
// Ring layout: rank r holds two connected sockets, `to_next_` (to rank r+1 mod W, send only)
// and `from_prev_` (from rank r-1 mod W, receive only). With W = 2 both lead to the other
// rank, as two separate connections, so one direction never waits on the other.
//
// All-reduce of n elements: the buffer is cut into W chunks. Reduce-scatter: in step s rank r
// sends chunk (r-s) and receives chunk (r-s-1), which it adds to its own; after W-1 steps it
// holds the full sum of chunk (r+1). All-gather: W-1 more steps pass the finished chunks
// around. Every rank ends with bit-identical values (each chunk is summed once, by one rank,
// and copied), so replicas cannot drift apart through rounding.
//
// CUDA tensors go through c10d::ProcessGroupNCCL when the LibTorch build has it
// (USE_C10D_NCCL, which the CUDA wheel's CMake config defines, and nccl.h on the include
// path): buckets then live on the tensors' device and NCCL reduces them, rendezvousing
// through the same TCPStore. Without NCCL, or with STEMMA_DDP_BACKEND=ring, CUDA tensors are
// copied into host buckets and back (copy_ does the transfer): correct, slower.
#include "engine/train/distributed.h"

#include <ATen/ops/empty.h>
#include <arpa/inet.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#if defined(USE_C10D_NCCL) && __has_include(<nccl.h>)
#define STEMMA_DDP_HAVE_NCCL 1
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#else
#define STEMMA_DDP_HAVE_NCCL 0
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/status.h"

namespace stemma::engine::train {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kHelloMagic = 0x5354524eu;               // "STRN": a ring connection from Stemma
constexpr int64_t kBroadcastChunkBytes = int64_t{4} << 20;  // pipelining unit of the chain

struct EnvConfig {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;
  uint16_t master_port = 0;
  std::chrono::milliseconds timeout{600'000};
  int64_t bucket_bytes = int64_t{64} << 20;
  bool use_nccl = true;  // for CUDA tensors, when built with NCCL
};

// Parses an integer variable; nullopt when unset.
absl::StatusOr<std::optional<int64_t>> IntFromEnv(const char* name, int64_t min, int64_t max) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::optional<int64_t>();
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "='", text,
                                                   "' is not an integer in [", min, ", ", max,
                                                   "]"));
  }
  return std::optional<int64_t>(value);
}

absl::StatusOr<EnvConfig> ReadEnv() {
  EnvConfig config;
  ASSIGN_OR_RETURN(auto world_size, IntFromEnv("WORLD_SIZE", 1, 1 << 16));
  config.world_size = static_cast<int>(world_size.value_or(1));
  ASSIGN_OR_RETURN(auto rank, IntFromEnv("RANK", 0, 1 << 16));
  config.rank = static_cast<int>(rank.value_or(0));
  ASSIGN_OR_RETURN(auto local_rank, IntFromEnv("LOCAL_RANK", 0, 1 << 16));
  config.local_rank = static_cast<int>(local_rank.value_or(0));
  if (config.rank >= config.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable RANK=", config.rank,
                     " must be below WORLD_SIZE=", config.world_size));
  }
  if (config.world_size == 1) return config;
  if (!rank.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable RANK is not set (required when WORLD_SIZE=", config.world_size, ")"));
  }
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable MASTER_ADDR is not set (required when WORLD_SIZE=", config.world_size,
        ")"));
  }
  config.master_addr = addr;
  ASSIGN_OR_RETURN(auto port, IntFromEnv("MASTER_PORT", 1, 65535));
  if (!port.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable MASTER_PORT is not set (required when WORLD_SIZE=", config.world_size,
        ")"));
  }
  config.master_port = static_cast<uint16_t>(*port);
  ASSIGN_OR_RETURN(auto timeout_s, IntFromEnv("STEMMA_DDP_TIMEOUT_S", 1, 86'400));
  if (timeout_s.has_value()) config.timeout = std::chrono::seconds(*timeout_s);
  ASSIGN_OR_RETURN(auto bucket_mb, IntFromEnv("STEMMA_DDP_BUCKET_MB", 1, 1 << 16));
  if (bucket_mb.has_value()) config.bucket_bytes = *bucket_mb << 20;
  if (const char* backend = std::getenv("STEMMA_DDP_BACKEND"); backend != nullptr) {
    const std::string name = backend;
    if (name != "ring" && name != "nccl") {
      return absl::InvalidArgumentError(absl::StrCat("environment variable STEMMA_DDP_BACKEND='",
                                                     name, "' is not 'ring' or 'nccl'"));
    }
    config.use_nccl = name == "nccl";
  }
  return config;
}

absl::Status ErrnoError(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// A socket owned through the files door (closed when dropped).
using Fd = files::UniqueFd;

absl::StatusOr<sockaddr_in> Resolve(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host, "': ", ::gai_strerror(rc)));
  }
  sockaddr_in address = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  address.sin_port = htons(port);
  return address;
}

// The local IPv4 address this host uses to reach the master: what the other ranks can
// connect to (127.0.0.1 on a single machine). A UDP connect sends nothing, it only picks
// the route.
absl::StatusOr<std::string> AddressTowards(const sockaddr_in& master) {
  Fd probe(::socket(AF_INET, SOCK_DGRAM, 0));
  if (!probe.valid()) return ErrnoError("socket");
  if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&master), sizeof master) != 0) {
    return ErrnoError("no route to MASTER_ADDR");
  }
  sockaddr_in local{};
  socklen_t length = sizeof local;
  if (::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0) {
    return ErrnoError("getsockname");
  }
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return std::string(text);
}

void TuneStream(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

// Sends `send` on `out` while receiving `recv` from `in` (either may be empty). Both at once
// so that a ring of ranks, each sending before it reads, never deadlocks on full buffers.
absl::Status Exchange(int out, const char* send, size_t send_bytes, int in, char* recv,
                      size_t recv_bytes, std::chrono::milliseconds timeout) {
  size_t sent = 0, received = 0;
  while (sent < send_bytes || received < recv_bytes) {
    pollfd fds[2];
    int count = 0;
    if (sent < send_bytes) fds[count++] = {out, POLLOUT, 0};
    if (received < recv_bytes) fds[count++] = {in, POLLIN, 0};
    int ready = ::poll(fds, count, static_cast<int>(timeout.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return ErrnoError("poll");
    if (ready == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no progress for ", timeout.count() / 1000,
                       " s (a peer is stuck or slower than STEMMA_DDP_TIMEOUT_S)"));
    }
    for (int i = 0; i < count; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == out && sent < send_bytes) {
        ssize_t n = ::send(out, send + sent, send_bytes - sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) return ErrnoError("send to next rank");
        if (n > 0) sent += static_cast<size_t>(n);
      } else if (fds[i].fd == in && received < recv_bytes) {
        ssize_t n = ::recv(in, recv + received, recv_bytes - received, 0);
        if (n == 0) return absl::UnavailableError("previous rank closed the connection");
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
          return ErrnoError("receive from previous rank");
        }
        if (n > 0) received += static_cast<size_t>(n);
      }
    }
  }
  return absl::OkStatus();
}

// What every collective announces to its neighbours first.
struct Header {
  uint64_t op;     // kind of collective, see Op
  uint64_t bytes;  // payload size
};
enum Op : uint64_t {
  kAllReduceF32 = 1,
  kAllReduceF64 = 2,
  kBroadcast = 3,
  kReduceScatterF32 = 4,
  kReduceScatterF64 = 5,
  kAllGather = 6,
  kBarrier = 7,
  kReduceScatterVF32 = 8,
  kReduceScatterVF64 = 9,
};

[[noreturn]] void Fail(int rank, const absl::Status& status) {
  throw std::runtime_error(absl::StrCat("data parallel rank ", rank, ": ", status.message()));
}

}  // namespace

class DataParallel::Ring {
 public:
  static absl::StatusOr<std::unique_ptr<Ring>> Connect(const EnvConfig& config);

  // Sum of `count` elements at `data` over ranks, in place.
  template <typename T>
  absl::Status AllReduceSum(T* data, int64_t count);
  // Rank 0's `bytes` bytes at `data` to every rank.
  absl::Status Broadcast(char* data, int64_t bytes);
  // `data` holds W chunks of `chunk` elements; afterwards chunk `rank` holds the sum of that
  // chunk over ranks (the other chunks are clobbered).
  template <typename T>
  absl::Status ReduceScatterSum(T* data, int64_t chunk);
  // The same with chunks of `counts[c]` elements each, one after the other (any may be 0).
  template <typename T>
  absl::Status ReduceScatterSumV(T* data, const std::vector<int64_t>& counts);
  // `data` holds W chunks of `chunk_bytes`; chunk r of rank r goes to every rank.
  absl::Status AllGather(char* data, int64_t chunk_bytes);
  // Returns once every rank has called it, waiting up to `timeout` for the slowest.
  absl::Status Barrier(std::chrono::milliseconds timeout);

  int64_t bucket_bytes() const { return config_.bucket_bytes; }
  const EnvConfig& config() const { return config_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

 private:
  explicit Ring(EnvConfig config) : config_(std::move(config)) {}
  int next() const { return (config_.rank + 1) % config_.world_size; }
  int prev() const { return (config_.rank + config_.world_size - 1) % config_.world_size; }
  absl::Status Join(c10d::Store& store);
  absl::Status CheckHeaders(Header mine);
  absl::Status Step(const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                    std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    return Exchange(to_next_.get(), static_cast<const char*>(send), send_bytes, from_prev_.get(),
                    static_cast<char*>(recv), recv_bytes, timeout.value_or(config_.timeout));
  }

  EnvConfig config_;
  c10::intrusive_ptr<c10d::Store> store_;  // kept so rank 0's server outlives the rendezvous
  Fd to_next_;
  Fd from_prev_;
  std::vector<char> scratch_;  // one received chunk during reduce-scatter
};

absl::StatusOr<std::unique_ptr<DataParallel::Ring>> DataParallel::Ring::Connect(
    const EnvConfig& config) {
  auto ring = std::unique_ptr<Ring>(new Ring(config));
  c10d::TCPStoreOptions options;
  options.port = config.master_port;
  options.isServer = config.rank == 0;
  options.numWorkers = config.world_size;
  options.waitWorkers = false;  // the ring handshake below waits for everyone anyway
  options.timeout = config.timeout;
  try {
    ring->store_ = c10::make_intrusive<c10d::TCPStore>(config.master_addr, options);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));  // c10 appends a C++ backtrace
    return absl::UnavailableError(absl::StrCat(
        config.rank == 0 ? "cannot serve the rendezvous on " : "cannot reach the master at ",
        "MASTER_ADDR=", config.master_addr, " MASTER_PORT=", config.master_port, " within ",
        config.timeout.count() / 1000, " s (STEMMA_DDP_TIMEOUT_S): ", what));
  }
  RETURN_IF_ERROR(ring->Join(*ring->store_));
  return ring;
}

// Listens, publishes "address:port" under this rank's key, connects to the next rank and
// accepts the previous one; each connection starts with (magic, sender rank).
absl::Status DataParallel::Ring::Join(c10d::Store& store) {
  const auto deadline = Clock::now() + config_.timeout;
  ASSIGN_OR_RETURN(sockaddr_in master, Resolve(config_.master_addr, config_.master_port));
  ASSIGN_OR_RETURN(std::string own_address, AddressTowards(master));

  Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
  if (!listener.valid()) return ErrnoError("socket");
  sockaddr_in bind_address{};
  bind_address.sin_family = AF_INET;
  bind_address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof bind_address;
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&bind_address), length) != 0 ||
      ::listen(listener.get(), 4) != 0 ||
      ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bind_address), &length) != 0) {
    return ErrnoError("ring listener");
  }
  const std::string key_prefix = "stemma/ddp/ring/";
  const std::string mine = absl::StrCat(own_address, ":", ntohs(bind_address.sin_port));
  std::string next_location;  // "address:port" of the next rank's listener
  try {
    store.set(key_prefix + std::to_string(config_.rank),
              std::vector<uint8_t>(mine.begin(), mine.end()));
    std::vector<uint8_t> theirs = store.get(key_prefix + std::to_string(next()));
    next_location.assign(theirs.begin(), theirs.end());
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", next(), " did not join through MASTER_ADDR=", config_.master_addr,
                     " MASTER_PORT=", config_.master_port, ": ", what.substr(0, what.find('\n'))));
  }
  std::pair<std::string, std::string> host_port = absl::StrSplit(next_location, ':');
  int port = 0;
  if (!absl::SimpleAtoi(host_port.second, &port)) {
    return absl::InternalError(absl::StrCat("bad ring address '", next_location, "' in the store"));
  }
  ASSIGN_OR_RETURN(sockaddr_in next_address, Resolve(host_port.first, port));

  // Connect to the next rank: its listener exists before its key is published.
  to_next_ = Fd(::socket(AF_INET, SOCK_STREAM, 0));
  if (::connect(to_next_.get(), reinterpret_cast<sockaddr*>(&next_address), sizeof next_address) !=
      0) {
    return ErrnoError(absl::StrCat("connect to rank ", next(), " at ", next_location));
  }
  const uint32_t hello[2] = {kHelloMagic, static_cast<uint32_t>(config_.rank)};
  TuneStream(to_next_.get());

  // Accept the previous rank, waiting at most until the deadline (a missing rank is an error,
  // not a hang; a stray client fails the greeting check below).
  pollfd wait_for{listener.get(), POLLIN, 0};
  if (::poll(&wait_for, 1, RemainingMs(deadline)) != 1) {
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", prev(), " did not connect within STEMMA_DDP_TIMEOUT_S"));
  }
  from_prev_ = Fd(::accept(listener.get(), nullptr, nullptr));
  if (!from_prev_.valid()) return ErrnoError("accept");
  TuneStream(from_prev_.get());

  uint32_t greeting[2] = {};
  RETURN_IF_ERROR(Step(hello, sizeof hello, greeting, sizeof greeting));
  if (greeting[0] != kHelloMagic || static_cast<int>(greeting[1]) != prev()) {
    return absl::InternalError(absl::StrCat("unexpected ring connection (expected rank ", prev(),
                                            ", MASTER_PORT shared by two jobs?)"));
  }
  scratch_.reserve(1 << 20);
  return absl::OkStatus();
}

// Each rank sends its header forward and compares the one it receives: equal neighbours all
// round the ring means all ranks agree.
absl::Status DataParallel::Ring::CheckHeaders(Header mine) {
  Header theirs{};
  RETURN_IF_ERROR(Step(&mine, sizeof mine, &theirs, sizeof theirs));
  if (theirs.op != mine.op || theirs.bytes != mine.bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("ranks disagree on the collective: rank ", prev(), " sent op ", theirs.op,
                     " of ", theirs.bytes, " bytes, this rank op ", mine.op, " of ", mine.bytes,
                     " bytes (different models or a rank skipped a step)"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status DataParallel::Ring::AllReduceSum(T* data, int64_t count) {
  const int world = config_.world_size;
  const int rank = config_.rank;
  RETURN_IF_ERROR(CheckHeaders(
      {sizeof(T) == 4 ? kAllReduceF32 : kAllReduceF64, static_cast<uint64_t>(count) * sizeof(T)}));
  auto begin = [&](int chunk) { return count * ((chunk % world + world) % world) / world; };
  auto size = [&](int chunk) {
    int c = (chunk % world + world) % world;
    return count * (c + 1) / world - count * c / world;
  };
  scratch_.resize(static_cast<size_t>(size(0) + 1) * sizeof(T));
  T* incoming = reinterpret_cast<T*>(scratch_.data());
  for (int s = 0; s < world - 1; ++s) {  // reduce-scatter
    const int send = rank - s, recv = rank - s - 1;
    RETURN_IF_ERROR(
        Step(data + begin(send), size(send) * sizeof(T), incoming, size(recv) * sizeof(T)));
    T* target = data + begin(recv);
    for (int64_t i = 0, n = size(recv); i < n; ++i) target[i] += incoming[i];
  }
  for (int s = 0; s < world - 1; ++s) {  // all-gather
    const int send = rank + 1 - s, recv = rank - s;
    RETURN_IF_ERROR(Step(data + begin(send), size(send) * sizeof(T), data + begin(recv),
                         size(recv) * sizeof(T)));
  }
  return absl::OkStatus();
}

// A chain 0 -> 1 -> ... -> W-1 in fixed-size pieces, so rank k forwards piece i while
// rank k-1 already sends piece i+1.
absl::Status DataParallel::Ring::Broadcast(char* data, int64_t bytes) {
  RETURN_IF_ERROR(CheckHeaders({kBroadcast, static_cast<uint64_t>(bytes)}));
  const bool receives = config_.rank != 0;
  const bool forwards = config_.rank != config_.world_size - 1;
  for (int64_t offset = 0; offset < bytes; offset += kBroadcastChunkBytes) {
    const size_t piece = static_cast<size_t>(std::min(kBroadcastChunkBytes, bytes - offset));
    if (receives) RETURN_IF_ERROR(Step(nullptr, 0, data + offset, piece));
    if (forwards) RETURN_IF_ERROR(Step(data + offset, piece, nullptr, 0));
  }
  return absl::OkStatus();
}

// Reduce-scatter in pieces of at most kBroadcastChunkBytes per chunk, so the receive buffer
// stays small: for each piece window, W-1 ring steps in which rank r sends chunk (r-s-1) and
// adds the received chunk (r-s-2) to its own; after the last step it holds chunk r's sum.
template <typename T>
absl::Status DataParallel::Ring::ReduceScatterSum(T* data, int64_t chunk) {
  const int world = config_.world_size, rank = config_.rank;
  RETURN_IF_ERROR(CheckHeaders({sizeof(T) == 4 ? kReduceScatterF32 : kReduceScatterF64,
                                static_cast<uint64_t>(chunk * world) * sizeof(T)}));
  const int64_t piece = std::max<int64_t>(1, kBroadcastChunkBytes / sizeof(T));
  scratch_.resize(static_cast<size_t>(std::min(piece, chunk) + 1) * sizeof(T));
  T* incoming = reinterpret_cast<T*>(scratch_.data());
  auto at = [&](int c) { return data + chunk * ((c % world + world) % world); };
  for (int64_t offset = 0; offset < chunk; offset += piece) {
    const int64_t n = std::min(piece, chunk - offset);
    for (int s = 0; s < world - 1; ++s) {
      RETURN_IF_ERROR(Step(at(rank - s - 1) + offset, n * sizeof(T), incoming, n * sizeof(T)));
      T* target = at(rank - s - 2) + offset;
      for (int64_t i = 0; i < n; ++i) target[i] += incoming[i];
    }
  }
  return absl::OkStatus();
}

// ReduceScatterSum's steps over chunks of their own sizes: chunk c's sum is still added up
// along the ring from rank c+1 to rank c, so its elements get the same sums in the same
// order as in an equal-chunk reduce-scatter. Pieces of a chunk past its end are empty.
template <typename T>
absl::Status DataParallel::Ring::ReduceScatterSumV(T* data, const std::vector<int64_t>& counts) {
  const int world = config_.world_size, rank = config_.rank;
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t c = 0; c < counts.size(); ++c) offsets[c + 1] = offsets[c] + counts[c];
  RETURN_IF_ERROR(CheckHeaders({sizeof(T) == 4 ? kReduceScatterVF32 : kReduceScatterVF64,
                                static_cast<uint64_t>(offsets.back()) * sizeof(T)}));
  const int64_t longest = *std::max_element(counts.begin(), counts.end());
  const int64_t piece = std::max<int64_t>(1, kBroadcastChunkBytes / sizeof(T));
  scratch_.resize(static_cast<size_t>(std::min(piece, longest) + 1) * sizeof(T));
  T* incoming = reinterpret_cast<T*>(scratch_.data());
  auto wrap = [&](int c) { return static_cast<size_t>((c % world + world) % world); };
  auto part = [&](size_t c, int64_t offset) {
    return std::clamp<int64_t>(counts[c] - offset, 0, piece);
  };
  for (int64_t offset = 0; offset < longest; offset += piece) {
    for (int s = 0; s < world - 1; ++s) {
      const size_t send = wrap(rank - s - 1), recv = wrap(rank - s - 2);
      const int64_t n_send = part(send, offset), n_recv = part(recv, offset);
      RETURN_IF_ERROR(
          Step(data + offsets[send] + offset, n_send * sizeof(T), incoming, n_recv * sizeof(T)));
      T* target = data + offsets[recv] + offset;
      for (int64_t i = 0; i < n_recv; ++i) target[i] += incoming[i];
    }
  }
  return absl::OkStatus();
}

// W-1 ring steps: rank r forwards chunk (r-s) and receives chunk (r-s-1).
absl::Status DataParallel::Ring::AllGather(char* data, int64_t chunk_bytes) {
  const int world = config_.world_size, rank = config_.rank;
  RETURN_IF_ERROR(CheckHeaders({kAllGather, static_cast<uint64_t>(chunk_bytes * world)}));
  auto at = [&](int c) { return data + chunk_bytes * ((c % world + world) % world); };
  for (int s = 0; s < world - 1; ++s) {
    RETURN_IF_ERROR(Step(at(rank - s), chunk_bytes, at(rank - s - 1), chunk_bytes));
  }
  return absl::OkStatus();
}

// W-1 ring steps: after step s a rank knows that the s ranks before it have entered, so after
// the last one that all have.
absl::Status DataParallel::Ring::Barrier(std::chrono::milliseconds timeout) {
  for (int step = 0; step < config_.world_size - 1; ++step) {
    Header mine{kBarrier, 0}, theirs{};
    RETURN_IF_ERROR(Step(&mine, sizeof mine, &theirs, sizeof theirs, timeout));
    if (theirs.op != kBarrier) {
      return absl::FailedPreconditionError(
          absl::StrCat("ranks disagree on the collective: rank ", prev(), " sent op ", theirs.op,
                       " while this rank waits in a barrier (a rank skipped a step)"));
    }
  }
  return absl::OkStatus();
}

namespace {

// A collective that had finished when it was returned (a single process; host staging).
class Finished : public DataParallel::Pending {
 public:
  void Wait() override {}
};

}  // namespace

// The communication thread of the *Async collectives: runs the posted ring jobs one at a
// time, in the order they were posted. Thread-safety: Post and Drain are called by the owner's
// thread (the one that drives the collectives) while the communication thread runs jobs; mu_ guards
// the queue and the counts, each job's own mutex its result (so a handle can be waited on
// after this object is gone: the destructor finishes every posted job first).
class DataParallel::Comm {
 public:
  struct Job {
    std::function<absl::Status()> run;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;    // guarded by mu
    absl::Status status;  // guarded by mu
  };
  class Handle : public Pending {
   public:
    Handle(std::shared_ptr<Job> job, int rank) : job_(std::move(job)), rank_(rank) {}
    ~Handle() override { Finish().IgnoreError(); }  // a failure is Wait's to report
    void Wait() override {
      absl::Status status = Finish();
      if (!status.ok()) Fail(rank_, status);
    }

   private:
    absl::Status Finish() {
      std::unique_lock<std::mutex> lock(job_->mu);
      job_->cv.wait(lock, [&] { return job_->done; });
      return job_->status;
    }
    std::shared_ptr<Job> job_;
    int rank_;
  };

  Comm() : thread_([this] { Loop(); }) {}
  ~Comm() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  std::unique_ptr<Pending> Post(std::function<absl::Status()> run, int rank) {
    auto job = std::make_shared<Job>();
    job->run = std::move(run);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(job);
      ++unfinished_;
    }
    cv_.notify_all();
    return std::make_unique<Handle>(std::move(job), rank);
  }
  // Waits until every posted job has finished; the first failure among all jobs so far.
  absl::Status Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return unfinished_ == 0; });
    return failed_;
  }

 private:
  static absl::Status RunJob(Job& job) {
    try {
      c10::NoGradGuard no_grad;  // grad mode is per thread
      return job.run();
    } catch (const std::exception& e) {
      std::string what = e.what();
      return absl::InternalError(what.substr(0, what.find('\n')));  // c10 appends a backtrace
    }
  }
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped, and every posted job has run
      std::shared_ptr<Job> job = std::move(queue_.front());
      queue_.pop_front();
      absl::Status status = failed_;  // after a failure the ring is unusable: fail the rest
      lock.unlock();
      if (status.ok()) status = RunJob(*job);
      job->run = nullptr;  // its captures (a reduced bucket) are freed now, not by the handle
      lock.lock();
      if (!status.ok() && failed_.ok()) failed_ = status;
      {
        std::lock_guard<std::mutex> job_lock(job->mu);
        job->status = status;
        job->done = true;
      }
      job->cv.notify_all();
      --unfinished_;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // guarded by mu_
  int64_t unfinished_ = 0;                  // posted and not finished; guarded by mu_
  bool stop_ = false;                       // guarded by mu_
  absl::Status failed_;                     // guarded by mu_
  std::thread thread_;                      // last: starts once the members above exist
};

// c10d::ProcessGroupNCCL for CUDA buckets, created on first use (so CPU-only runs never
// touch CUDA). Without NCCL in the build it is never created.
class DataParallel::Nccl {
 public:
#if STEMMA_DDP_HAVE_NCCL
  explicit Nccl(const Ring& ring) {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = ring.config().timeout;
    auto store = c10::make_intrusive<c10d::PrefixStore>("stemma/ddp/nccl", ring.store());
    group_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, ring.config().rank,
                                                         ring.config().world_size, options);
  }
  void AllReduceSum(at::Tensor& flat) {
    std::vector<at::Tensor> tensors = {flat};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    group_->allreduce(tensors, options)->wait();  // orders the current stream after it
  }
  void Broadcast(at::Tensor& flat) {
    std::vector<at::Tensor> tensors = {flat};
    c10d::BroadcastOptions options;
    options.rootRank = 0;
    group_->broadcast(tensors, options)->wait();
  }
  // `out` [k] gets the sum over ranks of chunk `rank` of `flat` [W·k].
  void ReduceScatterSum(at::Tensor& flat, at::Tensor& out) {
    c10d::ReduceScatterOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    group_->_reduce_scatter_base(out, flat, options)->wait();
  }
  // Every rank's `chunk` [k] into `flat` [W·k].
  void AllGather(at::Tensor& chunk, at::Tensor& flat) {
    group_->_allgather_base(flat, chunk)->wait();
  }
  // The same, started on NCCL's stream; Wait makes the current stream wait for it.
  std::unique_ptr<Pending> AllGatherAsync(at::Tensor chunk, at::Tensor flat) {
    return std::make_unique<Started>(group_->_allgather_base(flat, chunk), std::move(chunk),
                                     nullptr);
  }
  // Started on NCCL's stream; `then` runs in Wait, after the current stream waits for it.
  std::unique_ptr<Pending> ReduceScatterAsync(at::Tensor flat, at::Tensor out,
                                              std::function<void()> then) {
    c10d::ReduceScatterOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    return std::make_unique<Started>(group_->_reduce_scatter_base(out, flat, options),
                                     std::move(flat), std::move(then));
  }
  std::unique_ptr<Pending> AllReduceAsync(at::Tensor flat, std::function<void()> then) {
    std::vector<at::Tensor> tensors = {flat};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    return std::make_unique<Started>(group_->allreduce(tensors, options), std::move(flat),
                                     std::move(then));
  }

 private:
  class Started : public Pending {
   public:
    Started(c10::intrusive_ptr<c10d::Work> work, at::Tensor input, std::function<void()> then)
        : work_(std::move(work)), input_(std::move(input)), then_(std::move(then)) {}
    // Not waited for: the attempt is failing already, and a destructor must not throw.
    ~Started() override {
      try {
        Wait();
      } catch (const std::exception&) {
      }
    }
    void Wait() override {
      if (!work_) return;
      c10::intrusive_ptr<c10d::Work> work = std::move(work_);
      work->wait();
      std::function<void()> then = std::move(then_);
      then_ = nullptr;
      if (then) then();
      input_ = at::Tensor();
    }

   private:
    c10::intrusive_ptr<c10d::Work> work_;
    at::Tensor input_;            // alive until the collective has read it
    std::function<void()> then_;  // what the caller asked for once it has finished
  };
  c10::intrusive_ptr<c10d::Backend> group_;
#else
  explicit Nccl(const Ring&) {}
  void AllReduceSum(at::Tensor&) {}
  void Broadcast(at::Tensor&) {}
  void ReduceScatterSum(at::Tensor&, at::Tensor&) {}
  void AllGather(at::Tensor&, at::Tensor&) {}
  std::unique_ptr<Pending> AllGatherAsync(at::Tensor, at::Tensor) {
    return std::make_unique<Finished>();
  }
  std::unique_ptr<Pending> ReduceScatterAsync(at::Tensor, at::Tensor, std::function<void()>) {
    return std::make_unique<Finished>();
  }
  std::unique_ptr<Pending> AllReduceAsync(at::Tensor, std::function<void()>) {
    return std::make_unique<Finished>();
  }
#endif
};

DataParallel::DataParallel(int rank, int world_size, std::unique_ptr<Ring> ring)
    : rank_(rank), world_size_(world_size), ring_(std::move(ring)) {}

DataParallel::~DataParallel() = default;

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::FromEnv() {
  ASSIGN_OR_RETURN(EnvConfig config, ReadEnv());
  std::unique_ptr<Ring> ring;
  if (config.world_size > 1) {
    ASSIGN_OR_RETURN(ring, Ring::Connect(config));
  }
  auto group = std::unique_ptr<DataParallel>(
      new DataParallel(config.rank, config.world_size, std::move(ring)));
  group->local_rank_ = config.local_rank;
  return group;
}

absl::StatusOr<c10::Device> BindDevice(const c10::Device& requested, int local_rank) {
  if (!requested.is_cuda()) return requested;
  const int visible = static_cast<int>(torch::cuda::device_count());
  const int index = requested.has_index() ? requested.index() : local_rank;
  if (index >= visible) {
    return absl::FailedPreconditionError(
        absl::StrCat(requested.has_index()
                         ? absl::StrCat("device ", requested.str())
                         : absl::StrCat("LOCAL_RANK=", local_rank, " (device cuda:", index, ")"),
                     ": only ", visible, " CUDA device(s) are visible (CUDA_VISIBLE_DEVICES)"));
  }
  const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
  // The current device: NCCL's communicator and allocations without an explicit device use it.
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
  return device;
}

namespace {

// Consecutive runs of tensors that share a bucket: same bucket dtype and device, at most
// `cap_bytes` (a tensor larger than the cap gets a bucket of its own).
struct Bucket {
  size_t first, last;  // [first, last) into the tensor list
  int64_t numel;
  at::ScalarType dtype;
  at::Device device;  // where the flat buffer lives: the tensors' device, or the CPU
};

std::vector<Bucket> PlanBuckets(const std::vector<at::Tensor>& tensors,
                                at::ScalarType (*bucket_dtype)(const at::Tensor&), bool on_device,
                                int64_t cap_bytes) {
  std::vector<Bucket> buckets;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::ScalarType dtype = bucket_dtype(tensors[i]);
    const at::Device device =
        on_device && tensors[i].is_cuda() ? tensors[i].device() : at::Device(at::kCPU);
    const int64_t numel = tensors[i].numel();
    const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
    if (buckets.empty() || buckets.back().dtype != dtype || buckets.back().device != device ||
        (buckets.back().numel + numel) * element > cap_bytes) {
      buckets.push_back({i, i, 0, dtype, device});
    }
    buckets.back().last = i + 1;
    buckets.back().numel += numel;
  }
  return buckets;
}

at::ScalarType ReduceDtype(const at::Tensor& grad) {
  return grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::ScalarType OwnDtype(const at::Tensor& tensor) { return tensor.scalar_type(); }

// Calls `reduce` with `flat`'s elements as double* or float*: the ring reduces those two.
template <typename Reduce>
absl::Status OnReduceDtype(const at::Tensor& flat, Reduce reduce) {
  return flat.scalar_type() == at::kDouble ? reduce(flat.data_ptr<double>())
                                           : reduce(flat.data_ptr<float>());
}

// Copies tensors[first, last) into `flat` ([numel]), or back when `gather` is false.
void Pack(const std::vector<at::Tensor>& tensors, const Bucket& bucket, at::Tensor& flat,
          bool gather) {
  int64_t offset = 0;
  for (size_t i = bucket.first; i < bucket.last; ++i) {
    const at::Tensor& tensor = tensors[i];
    at::Tensor slot = flat.narrow(0, offset, tensor.numel());
    if (gather) {
      slot.copy_(tensor.reshape(-1));
    } else {
      tensor.copy_(slot.view(tensor.sizes()));
    }
    offset += tensor.numel();
  }
}

void CheckDefined(int rank, const std::vector<at::Tensor>& tensors, const char* what) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) {
      Fail(rank,
           absl::InvalidArgumentError(absl::StrCat(
               what, " ", i, " is undefined (every rank must pass the same defined tensors)")));
    }
  }
}

}  // namespace

bool DataParallel::UseNccl(const c10::Device& bucket_device) {
  if (!STEMMA_DDP_HAVE_NCCL || bucket_device.is_cpu()) return false;
  if (nccl_ == nullptr) nccl_ = std::make_unique<Nccl>(*ring_);
  return true;
}

void DataParallel::BroadcastParameters(const std::vector<torch::Tensor>& params) {
  if (ring_ == nullptr) return;
  Quiesce();
  CheckDefined(rank_, params, "BroadcastParameters: tensor");
  c10::NoGradGuard no_grad;  // parameters are leaves that require grad
  const bool on_device = STEMMA_DDP_HAVE_NCCL && ring_->config().use_nccl;
  for (const Bucket& bucket : PlanBuckets(params, OwnDtype, on_device, ring_->bucket_bytes())) {
    at::Tensor flat =
        at::empty({bucket.numel}, at::TensorOptions().dtype(bucket.dtype).device(bucket.device));
    if (rank_ == 0) Pack(params, bucket, flat, /*gather=*/true);
    if (UseNccl(bucket.device)) {
      nccl_->Broadcast(flat);
    } else {
      absl::Status status = ring_->Broadcast(static_cast<char*>(flat.data_ptr()), flat.nbytes());
      if (!status.ok()) Fail(rank_, status);
    }
    if (rank_ != 0) Pack(params, bucket, flat, /*gather=*/false);
  }
}

void DataParallel::AllReduceMeanGradients(const std::vector<torch::Tensor>& grads) {
  if (ring_ == nullptr) return;
  Quiesce();
  CheckDefined(rank_, grads, "AllReduceMeanGradients: gradient");
  c10::NoGradGuard no_grad;
  const bool on_device = STEMMA_DDP_HAVE_NCCL && ring_->config().use_nccl;
  std::vector<Bucket> buckets = PlanBuckets(grads, ReduceDtype, on_device, ring_->bucket_bytes());
  reduce_buckets_.resize(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bucket = buckets[b];
    const at::Tensor& first = grads[bucket.first];
    // One contiguous tensor of the reduction dtype already where the bucket would live (e.g.
    // a trainer's flat gradient buffer) is reduced where it lies: no copies in and out.
    const bool in_place = bucket.last == bucket.first + 1 && first.device() == bucket.device &&
                          first.is_contiguous() && first.scalar_type() == bucket.dtype;
    at::Tensor& flat = reduce_buckets_[b];
    if (in_place) {
      flat = first.view({-1});
    } else {
      if (!flat.defined() || flat.numel() != bucket.numel || flat.scalar_type() != bucket.dtype ||
          flat.device() != bucket.device) {
        flat = at::empty({bucket.numel},
                         at::TensorOptions().dtype(bucket.dtype).device(bucket.device));
      }
      Pack(grads, bucket, flat, /*gather=*/true);
    }
    if (UseNccl(bucket.device)) {
      nccl_->AllReduceSum(flat);
    } else {
      absl::Status status =
          OnReduceDtype(flat, [&](auto* data) { return ring_->AllReduceSum(data, bucket.numel); });
      if (!status.ok()) Fail(rank_, status);
    }
    flat.div_(world_size_);
    if (in_place) {
      flat = at::Tensor();  // do not keep the caller's tensor alive
    } else {
      Pack(grads, bucket, flat, /*gather=*/false);
    }
  }
}

void DataParallel::CheckFlat(const at::Tensor& flat, const char* what) const {
  if (!flat.defined() || flat.dim() != 1 || !flat.is_contiguous() ||
      flat.numel() % world_size_ != 0) {
    Fail(rank_, absl::InvalidArgumentError(absl::StrCat(
                    what, ": needs a contiguous 1-D tensor whose size is a multiple of the ",
                    world_size_, " ranks",
                    flat.defined() ? absl::StrCat(" (got ", flat.numel(), ")")
                                   : std::string(" (got none)"))));
  }
}

at::Tensor DataParallel::ReduceScatter(const at::Tensor& flat, bool mean) {
  CheckFlat(flat, "ReduceScatter");
  const int64_t chunk = flat.numel() / world_size_;
  at::Tensor mine = flat.narrow(0, rank_ * chunk, chunk);
  if (ring_ == nullptr) return mine;
  Quiesce();
  const at::ScalarType dtype = flat.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble) {
    Fail(rank_, absl::InvalidArgumentError("ReduceScatter: needs float32 or float64"));
  }
  c10::NoGradGuard no_grad;
  if (flat.is_cuda() && ring_->config().use_nccl && UseNccl(flat.device())) {
    at::Tensor out = at::empty({chunk}, flat.options());
    at::Tensor input = flat;
    nccl_->ReduceScatterSum(input, out);
    mine.copy_(out);
  } else {
    // Host staging for CUDA tensors without NCCL; CPU tensors are reduced where they lie.
    at::Tensor host = flat.is_cpu() ? flat : flat.to(at::kCPU);
    absl::Status status =
        OnReduceDtype(host, [&](auto* data) { return ring_->ReduceScatterSum(data, chunk); });
    if (!status.ok()) Fail(rank_, status);
    if (!flat.is_cpu()) mine.copy_(host.narrow(0, rank_ * chunk, chunk));
  }
  if (mean) mine.div_(world_size_);
  return mine;
}

void DataParallel::AllGather(const at::Tensor& flat) {
  CheckFlat(flat, "AllGather");
  if (ring_ == nullptr) return;
  Quiesce();
  c10::NoGradGuard no_grad;
  const int64_t chunk = flat.numel() / world_size_;
  if (flat.is_cuda() && ring_->config().use_nccl && UseNccl(flat.device())) {
    at::Tensor mine = flat.narrow(0, rank_ * chunk, chunk).clone();
    at::Tensor output = flat;
    nccl_->AllGather(mine, output);
    return;
  }
  at::Tensor host = flat.is_cpu() ? flat : flat.to(at::kCPU);
  absl::Status status =
      ring_->AllGather(static_cast<char*>(host.data_ptr()), chunk * host.element_size());
  if (!status.ok()) Fail(rank_, status);
  if (!flat.is_cpu()) flat.copy_(host);
}

std::unique_ptr<DataParallel::Pending> DataParallel::AllGatherAsync(const at::Tensor& flat) {
  CheckFlat(flat, "AllGatherAsync");
  if (ring_ == nullptr) return std::make_unique<Finished>();
  c10::NoGradGuard no_grad;
  const int64_t chunk = flat.numel() / world_size_;
  if (flat.is_cuda() && ring_->config().use_nccl && UseNccl(flat.device())) {
    return nccl_->AllGatherAsync(flat.narrow(0, rank_ * chunk, chunk).clone(), flat);
  }
  if (!flat.is_cpu()) {  // staged through the host: synchronous
    AllGather(flat);
    return std::make_unique<Finished>();
  }
  if (comm_ == nullptr) comm_ = std::make_unique<Comm>();
  Ring* ring = ring_.get();
  char* data = static_cast<char*>(flat.data_ptr());
  const int64_t chunk_bytes = chunk * flat.element_size();
  return comm_->Post([ring, data, chunk_bytes] { return ring->AllGather(data, chunk_bytes); },
                     rank_);
}

void DataParallel::CheckReduceDtype(const at::Tensor& flat, const char* what) const {
  const at::ScalarType dtype = flat.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble) {
    Fail(rank_, absl::InvalidArgumentError(absl::StrCat(what, ": needs float32 or float64")));
  }
}

std::unique_ptr<DataParallel::Pending> DataParallel::ReduceScatterAsync(const at::Tensor& flat,
                                                                        bool mean, Done done) {
  CheckFlat(flat, "ReduceScatterAsync");
  CheckReduceDtype(flat, "ReduceScatterAsync");
  c10::NoGradGuard no_grad;
  const int64_t chunk = flat.numel() / world_size_;
  const int64_t world = world_size_, rank = rank_;
  at::Tensor mine = flat.narrow(0, rank * chunk, chunk);
  if (ring_ != nullptr && flat.is_cuda() && ring_->config().use_nccl && UseNccl(flat.device())) {
    at::Tensor out = at::empty({chunk}, flat.options());
    return nccl_->ReduceScatterAsync(flat, out, [mine, out, mean, world, done] {
      mine.copy_(out);
      if (mean) mine.div_(world);
      if (done) done(mine);
    });
  }
  if (ring_ == nullptr || !flat.is_cpu()) {  // one process, or staged through the host
    at::Tensor result = ReduceScatter(flat, mean);
    if (done) done(result);
    return std::make_unique<Finished>();
  }
  Ring* ring = ring_.get();
  return PostReduction(mine, mean, std::move(done), [ring, flat, chunk] {
    return OnReduceDtype(flat, [&](auto* data) { return ring->ReduceScatterSum(data, chunk); });
  });
}

std::unique_ptr<DataParallel::Pending> DataParallel::ReduceScatterVAsync(
    const at::Tensor& flat, const std::vector<int64_t>& counts, bool mean, Done done) {
  int64_t total = 0;
  bool negative = false;
  for (int64_t count : counts) {
    total += count;
    negative = negative || count < 0;
  }
  if (!flat.defined() || flat.dim() != 1 || !flat.is_contiguous() || negative ||
      static_cast<int>(counts.size()) != world_size_ || total != flat.numel()) {
    Fail(rank_, absl::InvalidArgumentError(
                    "ReduceScatterVAsync: needs a contiguous 1-D tensor of Σ counts elements and "
                    "one count (≥ 0) per rank"));
  }
  CheckReduceDtype(flat, "ReduceScatterVAsync");
  c10::NoGradGuard no_grad;
  int64_t begin = 0;
  for (int r = 0; r < rank_; ++r) begin += counts[static_cast<size_t>(r)];
  at::Tensor mine = flat.narrow(0, begin, counts[static_cast<size_t>(rank_)]);
  if (ring_ != nullptr && flat.is_cuda() && ring_->config().use_nccl && UseNccl(flat.device())) {
    // NCCL has no uneven reduce-scatter: an all-reduce (twice the bytes), this rank's part kept.
    return AllReduceAsync(flat, mean, [mine, done](const at::Tensor&) {
      if (done) done(mine);
    });
  }
  const int64_t world = world_size_;
  if (ring_ == nullptr || !flat.is_cpu()) {  // one process, or staged through the host
    if (ring_ != nullptr) {
      Quiesce();
      at::Tensor host = flat.to(at::kCPU);
      absl::Status status =
          OnReduceDtype(host, [&](auto* data) { return ring_->ReduceScatterSumV(data, counts); });
      if (!status.ok()) Fail(rank_, status);
      mine.copy_(host.narrow(0, begin, mine.numel()));
      if (mean) mine.div_(world);
    }
    if (done) done(mine);
    return std::make_unique<Finished>();
  }
  Ring* ring = ring_.get();
  return PostReduction(mine, mean, std::move(done), [ring, flat, counts] {
    return OnReduceDtype(flat, [&](auto* data) { return ring->ReduceScatterSumV(data, counts); });
  });
}

void DataParallel::AllReduceFlat(const at::Tensor& flat) {
  if (ring_ == nullptr) return;
  Quiesce();
  if (flat.is_cuda() && ring_->config().use_nccl && UseNccl(flat.device())) {
    at::Tensor input = flat;
    nccl_->AllReduceSum(input);
    return;
  }
  at::Tensor host = flat.is_cpu() ? flat : flat.to(at::kCPU);
  absl::Status status =
      OnReduceDtype(host, [&](auto* data) { return ring_->AllReduceSum(data, host.numel()); });
  if (!status.ok()) Fail(rank_, status);
  if (!flat.is_cpu()) flat.copy_(host);
}

std::unique_ptr<DataParallel::Pending> DataParallel::AllReduceAsync(const at::Tensor& flat,
                                                                    bool mean, Done done) {
  if (!flat.defined() || flat.dim() != 1 || !flat.is_contiguous()) {
    Fail(rank_, absl::InvalidArgumentError("AllReduceAsync: needs a contiguous 1-D tensor"));
  }
  CheckReduceDtype(flat, "AllReduceAsync");
  c10::NoGradGuard no_grad;
  const int64_t world = world_size_;
  if (ring_ != nullptr && flat.is_cuda() && ring_->config().use_nccl && UseNccl(flat.device())) {
    return nccl_->AllReduceAsync(flat, [flat, mean, world, done] {
      if (mean) flat.div_(world);
      if (done) done(flat);
    });
  }
  if (ring_ == nullptr || !flat.is_cpu()) {  // one process, or staged through the host
    AllReduceFlat(flat);
    if (mean && ring_ != nullptr) flat.div_(world);
    if (done) done(flat);
    return std::make_unique<Finished>();
  }
  Ring* ring = ring_.get();
  return PostReduction(flat, mean, std::move(done), [ring, flat] {
    return OnReduceDtype(flat, [&](auto* data) { return ring->AllReduceSum(data, flat.numel()); });
  });
}

std::unique_ptr<DataParallel::Pending> DataParallel::PostReduction(
    at::Tensor result, bool mean, Done done, std::function<absl::Status()> reduce) {
  if (comm_ == nullptr) comm_ = std::make_unique<Comm>();
  const int64_t world = world_size_;
  return comm_->Post(
      [result, mean, world, done = std::move(done), reduce = std::move(reduce)]() -> absl::Status {
        RETURN_IF_ERROR(reduce());
        if (mean) result.div_(world);
        if (done) done(result);
        return absl::OkStatus();
      },
      rank_);
}

void DataParallel::Quiesce() {
  if (comm_ == nullptr) return;
  absl::Status status = comm_->Drain();
  if (!status.ok()) Fail(rank_, status);
}

void DataParallel::Barrier(std::chrono::milliseconds timeout) {
  if (ring_ == nullptr) return;
  Quiesce();
  absl::Status status = ring_->Barrier(timeout);
  if (!status.ok()) Fail(rank_, status);
}

double DataParallel::AllReduceSum(double value) {
  if (ring_ == nullptr) return value;
  Quiesce();
  absl::Status status = ring_->AllReduceSum(&value, 1);
  if (!status.ok()) Fail(rank_, status);
  return value;
}

}  // namespace stemma::engine::train
