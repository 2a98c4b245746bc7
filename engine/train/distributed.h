// Data parallelism for `stemma-engine train`: one process per rank, each holding a full model
// replica; gradients are averaged over ranks after every backward pass.
//
// Rendezvous follows the torchrun convention: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
// Rank 0 hosts a c10d TCPStore on MASTER_ADDR:MASTER_PORT; every rank publishes a listening
// socket there and the ranks connect into a ring (rank r -> rank r+1 mod W). Collectives run
// over that ring: a ring all-reduce (reduce-scatter then all-gather, so each rank sends about
// 2·(W-1)/W of the buffer, independent of W) and a pipelined chain broadcast from rank 0.
//
// Why not c10d::ProcessGroupGloo: libtorch_cpu.so exports it, but the PyPI wheel ships no
// gloo headers, and ProcessGroupGloo.hpp cannot be compiled without them. CUDA tensors use
// c10d::ProcessGroupNCCL when LibTorch has it (STEMMA_DDP_BACKEND=ring forces host staging
// over the ring instead); AllReduceSum always uses the ring.
//
// Tensors are grouped into a few flat buffers ("buckets", STEMMA_DDP_BUCKET_MB, default 64)
// so a step costs a handful of collectives, not one per parameter. Gradients are reduced in
// float32 (float64 for float64 gradients), whatever their storage dtype, so bf16 gradients
// lose no precision in the sum.
//
// Every rank must call the same collectives in the same order with tensors of the same
// shapes; each collective first exchanges a small header with its ring neighbours and throws
// if they disagree (instead of hanging or mixing buffers).
//
// AllGatherAsync starts an all-gather and returns at once (ZeRO-3's prefetch of the next
// layer), ReduceScatterAsync / AllReduceAsync a gradient reduction (overlapping backward): on
// the CPU ring they run on a communication thread of this object, which runs such
// collectives one at a time in the order they were started; every other collective first
// waits for the started ones, so the order on the wire stays the order of the calls.
//
// Errors: FromEnv returns InvalidArgument naming the environment variable for bad settings,
// Unavailable / DeadlineExceeded when the master or a peer cannot be reached within
// STEMMA_DDP_TIMEOUT_S (default 600). The collectives throw std::runtime_error when a peer
// disconnects, times out or disagrees: the job cannot continue then, and the engine's main
// turns the exception into `stemma-engine: error: ...` and a non-zero exit.
//
// Thread-safety: not thread-safe; one thread per process drives the collectives (the
// communication thread is internal).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stemma::engine::train {

class DataParallel {
 public:
  // Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and the optional STEMMA_DDP_TIMEOUT_S,
  // STEMMA_DDP_BUCKET_MB). WORLD_SIZE unset or 1: a single process, every call a no-op.
  // Otherwise blocks until all WORLD_SIZE ranks have joined the ring.
  static absl::StatusOr<std::unique_ptr<DataParallel>> FromEnv();

  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // Overwrites `params` on every rank with rank 0's values (any dtype, any device; in place,
  // without recording autograd history).
  void BroadcastParameters(const std::vector<torch::Tensor>& params);

  // Replaces each gradient by its mean over ranks, in place. Every tensor must be defined
  // (give unused parameters zero gradients first: a rank that skipped one would otherwise
  // desynchronise the replicas).
  void AllReduceMeanGradients(const std::vector<torch::Tensor>& grads);

  // Sum of `value` over ranks (losses, token counts); identical on every rank.
  double AllReduceSum(double value);

  // Sharded data parallel (ZeRO). `flat` is a contiguous 1-D tensor of W·k elements, the same
  // size on every rank; chunk r is flat[r·k, (r+1)·k).
  //
  // ReduceScatter: float32 or float64. Afterwards this rank's chunk holds the sum over ranks
  // of that chunk (the mean when `mean`), and the call returns that chunk (a view of `flat`);
  // the other chunks are left clobbered. Ring (CPU; CUDA tensors staged through the host) or
  // NCCL's _reduce_scatter_base for CUDA tensors.
  at::Tensor ReduceScatter(const at::Tensor& flat, bool mean);
  // AllGather: any dtype. Every rank's chunk r of `flat`, from rank r, in place (each rank
  // keeps its own chunk as it is). Ring, or NCCL's _allgather_base for CUDA tensors.
  void AllGather(const at::Tensor& flat);

  // A collective started by an *Async call. Wait() returns once it has finished on this rank
  // and throws as the synchronous collectives do when it failed; destroying an unfinished
  // one waits for it (without throwing).
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void Wait() = 0;
  };
  // AllGather, started now and finished by the handle's Wait(): until then `flat` must not be
  // read, written or freed. CPU tensors: on the communication thread (see above); CUDA
  // tensors: on NCCL's stream (the caller's stream waits for it in Wait), or synchronously
  // where there is no NCCL. Collective: every rank starts the same ones in the same order.
  std::unique_ptr<Pending> AllGatherAsync(const at::Tensor& flat);
  // ReduceScatter and an in-place all-reduce of one flat tensor, started now (gradient
  // reduction overlapping backward), in the same order with the other collectives as
  // AllGatherAsync. The object keeps `flat` alive until the collective has finished; the
  // caller must not touch it before. Then `done` (may be empty) gets the result: this rank's
  // chunk of `flat` (ReduceScatter) or all of it (AllReduce), divided by the world size when
  // `mean`, computed exactly as the synchronous calls compute it. `done` runs once, on the
  // communication thread (CPU tensors: so that `flat` can be freed as soon as the collective
  // has finished, not when the caller gets to Wait), in Wait (NCCL) or before the call
  // returns (a single process; CUDA tensors without NCCL); it must only write tensors that
  // the caller leaves alone until Wait, and must not call this object. A dropped handle
  // still finishes its collective and `done`. float32 or float64.
  using Done = std::function<void(const at::Tensor& result)>;
  std::unique_ptr<Pending> ReduceScatterAsync(const at::Tensor& flat, bool mean, Done done);
  std::unique_ptr<Pending> AllReduceAsync(const at::Tensor& flat, bool mean, Done done);
  // ReduceScatterAsync with chunks of their own sizes: `flat` is counts[0] elements of rank
  // 0's chunk, then counts[1] of rank 1's, ... (any may be 0); `done` gets this rank's. Each
  // element's sum is added up in the same order as by an equal-chunk ReduceScatter. For a
  // contiguous range of a layout whose ranks own consecutive slices (ZeRO-1/2's buckets in
  // backward order). NCCL: an all-reduce of `flat` (twice the bytes), this rank's part kept.
  std::unique_ptr<Pending> ReduceScatterVAsync(const at::Tensor& flat,
                                               const std::vector<int64_t>& counts, bool mean,
                                               Done done);
  // Waits until every rank has called it, for up to `timeout` (not STEMMA_DDP_TIMEOUT_S):
  // e.g. while one rank writes a checkpoint that may take longer than a collective may.
  void Barrier(std::chrono::milliseconds timeout);

  // LOCAL_RANK (default 0): the index of this rank among those of its machine.
  int local_rank() const { return local_rank_; }

 private:
  class Ring;  // sockets to the neighbours; null when world_size is 1
  class Nccl;  // ProcessGroupNCCL for CUDA tensors; created on first use
  class Comm;  // the communication thread of the *Async calls; created on first use

  // Runs `reduce` (a ring reduction of a CPU tensor in place) on the communication thread,
  // then divides `result` (what the caller gets of it) by the world size when `mean` and
  // hands it to `done`.
  std::unique_ptr<Pending> PostReduction(at::Tensor result, bool mean, Done done,
                                         std::function<absl::Status()> reduce);
  DataParallel(int rank, int world_size, std::unique_ptr<Ring> ring);
  bool UseNccl(const c10::Device& bucket_device);                  // creates nccl_ when it says yes
  void CheckFlat(const at::Tensor& flat, const char* what) const;  // throws when unfit
  void CheckReduceDtype(const at::Tensor& flat, const char* what) const;  // float32 or float64
  void AllReduceFlat(const at::Tensor& flat);  // the sum over ranks, in place (synchronous)
  // Before a synchronous ring collective: waits for the started asynchronous ones (throws
  // when one failed: the ring is then unusable).
  void Quiesce();

  int rank_;
  int world_size_;
  int local_rank_ = 0;
  std::unique_ptr<Ring> ring_;
  std::unique_ptr<Nccl> nccl_;
  std::vector<torch::Tensor> reduce_buckets_;  // reused across steps: [bucket numel] each
  std::unique_ptr<Comm> comm_;                 // declared last: stopped before the ring goes
};

// The device a rank computes on. `cuda` without an index: cuda:`local_rank` of the visible
// devices (the torchrun convention, one process per GPU); an explicit index as given. A CUDA
// device is made the current one (set_device), so NCCL and allocations without a device use
// it. CPU: returned as it is. FailedPrecondition naming LOCAL_RANK (or the device) when that
// device is not visible.
absl::StatusOr<c10::Device> BindDevice(const c10::Device& requested, int local_rank);

}  // namespace stemma::engine::train
