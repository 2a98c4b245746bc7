// The ranks of a multi-process eval (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun
// and the worker set them): each rank computes its share of every task's items and rank 0
// gathers the per-item results, then scores and writes as one process would. Items are
// dealt round-robin (item i to rank i mod W), and rank 0 combines them in item order, so
// the results are those of one process, bit for bit, whatever the world size.
//
// The gather goes through a c10d TCPStore that rank 0 serves on MASTER_ADDR:MASTER_PORT
// (the eval uses no other collective); a rank sets its share under a key of the round and
// rank 0 waits for every rank's, up to STEMMA_DDP_TIMEOUT_S (default 600 s).
//
// Errors: FromEnv returns InvalidArgument naming the variable for bad settings and
// Unavailable when the store cannot be served or reached; Gather returns DeadlineExceeded
// when a rank's share does not arrive in time, Internal for a malformed share.
// Thread-safety: not thread-safe; one thread per process.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace stemma::engine::eval {

class EvalRanks {
 public:
  // WORLD_SIZE unset or 1: one process (rank 0 of 1), nothing is connected.
  static absl::StatusOr<std::unique_ptr<EvalRanks>> FromEnv();
  ~EvalRanks();
  EvalRanks(const EvalRanks&) = delete;
  EvalRanks& operator=(const EvalRanks&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  bool is_zero() const { return rank_ == 0; }
  // Whether item `index` of a task is this rank's to compute.
  bool Mine(int64_t index) const { return index % world_size_ == rank_; }

  // `mine`: (index, value) for the items this rank computed. Every rank calls it once per
  // round with a distinct `round` name in the same order. Rank 0 gets the `count` values in
  // index order; the other ranks get an empty vector once their share is published.
  absl::StatusOr<std::vector<nlohmann::json>> Gather(
      const std::string& round, int64_t count,
      const std::vector<std::pair<int64_t, nlohmann::json>>& mine);

 private:
  class Store;
  EvalRanks(int rank, int world_size, std::unique_ptr<Store> store);
  int rank_;
  int world_size_;
  std::unique_ptr<Store> store_;  // null for one process
};

}  // namespace stemma::engine::eval
