// DataParallel with real processes on loopback: the test binary re-runs itself as the ranks
// (--gtest_filter=DistributedRank.*, STEMMA_DDP_TEST_RANK_MODE=1) with RANK/WORLD_SIZE/
// MASTER_ADDR/MASTER_PORT set; each rank checks the exact results of the collectives itself
// and the parent asserts that every rank ran its checks and exited 0.
#include "engine/train/distributed.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"
#include "engine/train/rank_processes.h"

extern char** environ;

namespace stemma::engine::train {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Process {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs every command concurrently (each with its own extra environment variables, stdout and
// stderr into a file) and waits for all of them.
std::vector<Process> RunAll(const std::vector<std::vector<std::string>>& commands,
                            const std::vector<std::map<std::string, std::string>>& envs,
                            const fs::path& log_dir) {
  std::vector<pid_t> pids;
  for (size_t i = 0; i < commands.size(); ++i) {
    std::map<std::string, std::string> env_map;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      std::string text = *entry;
      auto eq = text.find('=');
      env_map[text.substr(0, eq)] = text.substr(eq + 1);
    }
    for (const auto& [key, value] : envs[i]) env_map[key] = value;
    std::vector<std::string> env_text;
    for (const auto& [key, value] : env_map) env_text.push_back(key + "=" + value);
    std::vector<char*> env_ptrs, argv_ptrs;
    for (auto& text : env_text) env_ptrs.push_back(text.data());
    env_ptrs.push_back(nullptr);
    std::vector<std::string> argv = commands[i];
    for (auto& arg : argv) argv_ptrs.push_back(arg.data());
    argv_ptrs.push_back(nullptr);

    const std::string log = (log_dir / ("process" + std::to_string(i) + ".log")).string();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, argv_ptrs[0], &actions, nullptr, argv_ptrs.data(), env_ptrs.data()),
              0);
    posix_spawn_file_actions_destroy(&actions);
    pids.push_back(pid);
  }
  std::vector<Process> results(pids.size());
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    results[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    results[i].output = ReadFile(log_dir / ("process" + std::to_string(i) + ".log"));
  }
  return results;
}

std::map<std::string, std::string> RankEnv(int rank, int world_size, int port) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world_size)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"STEMMA_DDP_TIMEOUT_S", "60"}};  // a broken test fails instead of hanging
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "stemma_ddp_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Runs this binary's DistributedRank.<name> as `world_size` ranks; returns their results.
std::vector<Process> RunRanks(const std::string& name, int world_size,
                              std::map<std::string, std::string> extra_env = {}) {
  TempDir logs;
  const int port = FreePort();
  std::vector<std::vector<std::string>> commands;
  std::vector<std::map<std::string, std::string>> envs;
  for (int rank = 0; rank < world_size; ++rank) {
    commands.push_back(
        {fs::read_symlink("/proc/self/exe").string(), "--gtest_filter=DistributedRank." + name});
    auto env = RankEnv(rank, world_size, port);
    env["STEMMA_DDP_TEST_RANK_MODE"] = "1";
    for (const auto& [key, value] : extra_env) env[key] = value;
    envs.push_back(env);
  }
  return RunAll(commands, envs, logs.path());
}

bool InRankMode() { return std::getenv("STEMMA_DDP_TEST_RANK_MODE") != nullptr; }

// ---- What each rank runs (skipped unless started by RunRanks). ----

std::unique_ptr<DataParallel> Join() {
  auto joined = DataParallel::FromEnv();
  if (!joined.ok()) ADD_FAILURE() << joined.status();
  return joined.ok() ? std::move(*joined) : nullptr;
}

// AllGatherAsync (ZeRO-3's prefetch): two started at once and a synchronous collective
// called before either is waited for (it waits for them: the order on the wire is the order
// of the calls); a handle dropped unwaited still finishes its collective.
void CheckAsyncAllGather(DataParallel& dp) {
  const int rank = dp.rank(), world = dp.world_size();
  const int64_t chunk = 300'001;  // 1.2 MB per chunk: many socket writes each
  torch::Tensor a = torch::full({world * chunk}, -1.0f), b = torch::full({world * chunk}, -1.0f);
  a.narrow(0, rank * chunk, chunk).fill_(rank + 2);
  b.narrow(0, rank * chunk, chunk).fill_(10 * rank + 3);
  std::unique_ptr<DataParallel::Pending> first = dp.AllGatherAsync(a);
  std::unique_ptr<DataParallel::Pending> second = dp.AllGatherAsync(b);
  EXPECT_EQ(dp.AllReduceSum(rank + 1.0), world * (world + 1) / 2.0);
  second->Wait();
  first->Wait();
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(torch::equal(a.narrow(0, r * chunk, chunk), torch::full({chunk}, r + 2.0f)))
        << "async all-gather chunk " << r;
    EXPECT_TRUE(torch::equal(b.narrow(0, r * chunk, chunk), torch::full({chunk}, 10.0f * r + 3)))
        << "second async all-gather chunk " << r;
  }
  {
    torch::Tensor c = torch::zeros({world * 3});
    std::unique_ptr<DataParallel::Pending> dropped = dp.AllGatherAsync(c);
  }
  EXPECT_EQ(dp.AllReduceSum(1.0), world) << "the ring still works after the async gathers";
}

// ReduceScatterAsync / AllReduceAsync (gradient reduction overlapping backward), started
// between an AllGatherAsync and a synchronous reduce-scatter and waited for after them: the
// order on the wire is the order of the calls, each `done` runs once with the exact sum or
// mean, and a dropped handle still finishes its collective and its `done`.
void CheckAsyncReductions(DataParallel& dp) {
  const int rank = dp.rank(), world = dp.world_size();
  const double rank_sum = world * (world + 1) / 2.0;  // Σ (r + 1)
  const int64_t big = (int64_t{5} << 20) / 4 + 3;     // a chunk over the ring's 4 MiB piece
  auto base = [&](int64_t n, torch::Dtype dtype) {
    return torch::arange(n, torch::kFloat64).remainder(1013).to(dtype);
  };
  torch::Tensor gathered = torch::full({world * 1001}, -1.0f);
  gathered.narrow(0, rank * 1001, 1001).fill_(rank + 2);
  torch::Tensor scattered = base(world * big, torch::kFloat32) * (rank + 1);
  torch::Tensor reduced = base(3 * big, torch::kFloat64) * (rank + 1);
  torch::Tensor averaged = base(world * 7 + 1, torch::kFloat32) * 2 * (rank + 1);
  torch::Tensor sync = base(world * 5, torch::kFloat64) * (rank + 1);
  torch::Tensor scattered_out = torch::zeros({big}), averaged_out = torch::zeros({world * 7 + 1});
  std::atomic<int> calls{0};
  auto gather = dp.AllGatherAsync(gathered);
  auto scatter = dp.ReduceScatterAsync(scattered, /*mean=*/false, [&](const at::Tensor& mine) {
    scattered_out.copy_(mine);
    ++calls;
  });
  auto all = dp.AllReduceAsync(reduced, /*mean=*/false, nullptr);
  auto mean = dp.AllReduceAsync(averaged, /*mean=*/true, [&](const at::Tensor& result) {
    averaged_out.copy_(result);
    ++calls;
  });
  torch::Tensor sync_mine = dp.ReduceScatter(sync, /*mean=*/false);  // waits for the four
  EXPECT_TRUE(
      torch::equal(sync_mine, base(world * 5, torch::kFloat64).narrow(0, rank * 5, 5) * rank_sum));
  mean->Wait();
  all->Wait();
  scatter->Wait();
  gather->Wait();
  EXPECT_EQ(calls.load(), 2);
  EXPECT_TRUE(torch::equal(
      scattered_out, base(world * big, torch::kFloat32).narrow(0, rank * big, big) * rank_sum))
      << "async reduce-scatter sum";
  EXPECT_TRUE(torch::equal(scattered.narrow(0, rank * big, big), scattered_out)) << "in place";
  EXPECT_TRUE(torch::equal(reduced, base(3 * big, torch::kFloat64) * rank_sum))
      << "async all-reduce sum";
  EXPECT_TRUE(torch::equal(averaged_out, base(world * 7 + 1, torch::kFloat32) * (world + 1)))
      << "async all-reduce mean";
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(torch::equal(gathered.narrow(0, r * 1001, 1001), torch::full({1001}, r + 2.0f)));
  }
  // Dropped unwaited: the collective and its `done` still happen (before the next
  // synchronous collective returns).
  torch::Tensor dropped_out = torch::zeros({4});
  {
    torch::Tensor flat = torch::full({world * 4}, 3.0f * (rank + 1));
    auto dropped = dp.ReduceScatterAsync(flat, /*mean=*/true,
                                         [&](const at::Tensor& mine) { dropped_out.copy_(mine); });
  }
  EXPECT_EQ(dp.AllReduceSum(1.0), world) << "the ring still works after the async reductions";
  EXPECT_TRUE(torch::equal(dropped_out, torch::full({4}, 3.0f * (world + 1) / 2)));
  // Uneven chunks (ZeRO-1/2's contiguous buckets): rank r's chunk has 3r + 1 elements, one
  // of them over the ring's 4 MiB piece, one empty; each rank gets the mean of its own.
  {
    std::vector<int64_t> counts;
    for (int r = 0; r < world; ++r) counts.push_back(r == 1 ? big : r == 2 ? 0 : 3 * r + 1);
    int64_t total = 0, begin = 0;
    for (int r = 0; r < world; ++r) {
      if (r < rank) begin += counts[r];
      total += counts[r];
    }
    torch::Tensor flat = base(total, torch::kFloat32) * 2 * (rank + 1);
    torch::Tensor out;
    auto uneven = dp.ReduceScatterVAsync(flat, counts, /*mean=*/true,
                                         [&](const at::Tensor& mine) { out = mine.clone(); });
    uneven->Wait();
    ASSERT_TRUE(out.defined());
    EXPECT_TRUE(torch::equal(
        out, base(total, torch::kFloat32).narrow(0, begin, counts[rank]) * (world + 1)))
        << "uneven reduce-scatter mean";
  }
  // Not float: refused, naming the call.
  try {
    dp.ReduceScatterAsync(torch::zeros({world * 2}, torch::kInt64), false, nullptr);
    ADD_FAILURE() << "an int64 reduce-scatter was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("ReduceScatterAsync"), std::string::npos) << e.what();
  }
}

// Reduce-scatter and all-gather (ZeRO): integer-valued data, so sums and means are exact.
void CheckShardedCollectives(DataParallel& dp) {
  const int rank = dp.rank(), world = dp.world_size();
  // float32 with chunks larger than the ring's 4 MiB piece, and a float64 one.
  for (const auto& [chunk, dtype] : std::vector<std::pair<int64_t, torch::Dtype>>{
           {(int64_t{5} << 20) / 4 + 3, torch::kFloat32}, {7, torch::kFloat64}}) {
    auto base = torch::arange(world * chunk, torch::kFloat64).remainder(1013);
    torch::Tensor flat = (base * (rank + 1)).to(dtype);
    torch::Tensor mine = dp.ReduceScatter(flat, /*mean=*/false);
    const double factor = world * (world + 1) / 2.0;  // Σ (r + 1)
    torch::Tensor want = (base.narrow(0, rank * chunk, chunk) * factor).to(dtype);
    EXPECT_EQ(mine.numel(), chunk);
    EXPECT_EQ(mine.data_ptr(), flat.narrow(0, rank * chunk, chunk).data_ptr()) << "a view";
    EXPECT_TRUE(torch::equal(mine, want)) << "reduce-scatter sum, chunk " << chunk;
    flat = (base * 2.0 * (rank + 1)).to(dtype);
    mine = dp.ReduceScatter(flat, /*mean=*/true);
    EXPECT_TRUE(torch::equal(mine, (base.narrow(0, rank * chunk, chunk) * (world + 1)).to(dtype)))
        << "reduce-scatter mean, chunk " << chunk;
  }
  // All-gather in place: chunk r is rank r's, whatever the others held there; bf16 and int64.
  for (torch::Dtype dtype : {torch::kBFloat16, torch::kInt64, torch::kFloat32}) {
    const int64_t chunk = dtype == torch::kFloat32 ? 300'001 : 5;
    torch::Tensor flat = torch::full({world * chunk}, -1.0, torch::kFloat64).to(dtype);
    flat.narrow(0, rank * chunk, chunk).fill_(rank + 2);
    dp.AllGather(flat);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(torch::equal(flat.narrow(0, r * chunk, chunk),
                               torch::full({chunk}, r + 2.0, torch::kFloat64).to(dtype)))
          << "all-gather chunk " << r << " dtype " << dtype;
    }
  }
  // A size that does not divide among the ranks is refused, naming the call.
  if (world > 1) {
    try {
      dp.AllGather(torch::zeros({world * 3 + 1}));
      ADD_FAILURE() << "an uneven all-gather was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("AllGather"), std::string::npos) << e.what();
    }
  }
  CheckAsyncAllGather(dp);
  CheckAsyncReductions(dp);
  dp.Barrier(std::chrono::seconds(30));
  EXPECT_EQ(dp.AllReduceSum(1.0), world) << "the ring still works after the barrier";
}

TEST(DistributedRank, Collectives) {
  if (!InRankMode()) GTEST_SKIP() << "runs as a rank of DataParallelTest";
  auto dp = Join();
  ASSERT_NE(dp, nullptr);
  const int rank = dp->rank();
  const int world = dp->world_size();
  ASSERT_EQ(world, std::atoi(std::getenv("WORLD_SIZE")));
  ASSERT_EQ(rank, std::atoi(std::getenv("RANK")));

  // Sum of (rank + 1.5): exact in double.
  double expected_sum = 0;
  for (int r = 0; r < world; ++r) expected_sum += r + 1.5;
  EXPECT_EQ(dp->AllReduceSum(rank + 1.5), expected_sum);

  // Gradients: float32 bigger than one 1 MiB bucket (STEMMA_DDP_BUCKET_MB=1), a
  // non-contiguous view, bf16, float64, and tensors smaller than the world size. Values are
  // rank·1000 + small integers, so every mean is exact.
  auto pattern = [&](torch::IntArrayRef shape, torch::Dtype dtype) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    return (torch::arange(numel, torch::kFloat64).remainder(97) + 2.0 * rank * 10)
        .reshape(shape)
        .to(dtype);
  };
  auto expected = [&](const torch::Tensor& like) {
    double offset_sum = 0;
    for (int r = 0; r < world; ++r) offset_sum += 2.0 * r * 10;
    const double mean_offset = offset_sum / world;
    return (torch::arange(like.numel(), torch::kFloat64).remainder(97) + mean_offset)
        .reshape(like.sizes())
        .to(like.scalar_type());
  };
  torch::Tensor big = pattern({700, 1000}, torch::kFloat32);  // 2.8 MB: several buckets
  // [64, 33] laid out column-major: a non-contiguous gradient.
  torch::Tensor transposed = pattern({64, 33}, torch::kFloat32).t().contiguous().t();
  torch::Tensor half = pattern({5, 7}, torch::kBFloat16);
  torch::Tensor wide = pattern({3}, torch::kFloat64);
  torch::Tensor scalar = pattern({1}, torch::kFloat32);
  std::vector<torch::Tensor> grads = {big, transposed, half, wide, scalar};
  std::vector<torch::Tensor> want;
  for (const auto& g : grads) want.push_back(expected(g));
  for (int round = 0; round < 2; ++round) {  // the second call reuses the cached buckets
    if (round == 1) {
      for (auto& g : grads) g.copy_(pattern(g.sizes(), g.scalar_type()));
    }
    dp->AllReduceMeanGradients(grads);
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(grads[i], want[i])) << "gradient " << i << " round " << round;
    }
  }

  // Broadcast: every rank ends with rank 0's values, parameters that require grad included.
  torch::Tensor weight = torch::full({300, 257}, 7.0f + rank).requires_grad_();
  torch::Tensor bias = torch::full({9}, -3.0f - rank, torch::kBFloat16).requires_grad_();
  torch::Tensor counts = torch::full({4}, 11 + rank, torch::kInt64);
  dp->BroadcastParameters({weight, bias, counts});
  EXPECT_TRUE(torch::equal(weight, torch::full({300, 257}, 7.0f)));
  EXPECT_TRUE(torch::equal(bias, torch::full({9}, -3.0f, torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(counts, torch::full({4}, 11, torch::kInt64)));
  EXPECT_EQ(weight.grad_fn(), nullptr);  // the copy recorded no autograd history

  CheckShardedCollectives(*dp);
  std::printf("rank %d of %d checked its collectives\n", rank, world);
}

// NCCL (or host staging with STEMMA_DDP_BACKEND=ring) on cuda:<rank>: exact means and a
// broadcast, as above. Needs two GPUs (NCCL refuses two ranks on one device).
TEST(DistributedRank, CudaCollectives) {
  if (!InRankMode()) GTEST_SKIP() << "runs as a rank of DataParallelTest";
  auto dp = Join();
  ASSERT_NE(dp, nullptr);
  const int rank = dp->rank(), world = dp->world_size();
  const auto device = torch::Device(torch::kCUDA, rank);
  torch::Tensor flat = torch::full({1000003}, 10.0f * rank, device);  // in place, own bucket
  torch::Tensor half =
      torch::full({17, 3}, 2.0f * rank, torch::dtype(torch::kBFloat16).device(device));
  dp->AllReduceMeanGradients({flat, half});
  const float mean = 10.0f * (world - 1) / 2;
  EXPECT_TRUE(torch::equal(flat.cpu(), torch::full({1000003}, mean)));
  EXPECT_TRUE(torch::equal(half.cpu(), torch::full({17, 3}, mean / 5, torch::kBFloat16)));
  torch::Tensor weight = torch::full({33, 65}, 1.0f + rank, device).requires_grad_();
  dp->BroadcastParameters({weight});
  EXPECT_TRUE(torch::equal(weight.cpu(), torch::full({33, 65}, 1.0f)));
  torch::Tensor sharded = torch::full({world * 1001}, 3.0f * (rank + 1), device);
  torch::Tensor mine = dp->ReduceScatter(sharded, /*mean=*/false);
  EXPECT_TRUE(torch::equal(mine.cpu(), torch::full({1001}, 3.0f * world * (world + 1) / 2)));
  sharded.narrow(0, rank * 1001, 1001).fill_(rank);
  dp->AllGather(sharded);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(
        torch::equal(sharded.narrow(0, r * 1001, 1001).cpu(), torch::full({1001}, 1.0f * r)));
  }
  std::printf("rank %d of %d checked its CUDA collectives\n", rank, world);
}

TEST(DistributedRank, MismatchedCall) {
  if (!InRankMode()) GTEST_SKIP() << "runs as a rank of DataParallelTest";
  auto dp = Join();
  ASSERT_NE(dp, nullptr);
  // Rank 0 reduces 4 floats, rank 1 reduces 5: both must refuse rather than mix buffers.
  std::vector<torch::Tensor> grads = {torch::ones({4 + dp->rank()})};
  try {
    dp->AllReduceMeanGradients(grads);
    ADD_FAILURE() << "mismatched all-reduce succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
    std::printf("rank %d refused: %s\n", dp->rank(), e.what());
  }
}

TEST(DistributedRank, PeerExits) {
  if (!InRankMode()) GTEST_SKIP() << "runs as a rank of DataParallelTest";
  auto dp = Join();
  ASSERT_NE(dp, nullptr);
  if (dp->rank() == 1) std::_Exit(0);  // a crashed peer: its sockets close
  try {
    dp->AllReduceSum(1.0);
    ADD_FAILURE() << "all-reduce with a dead peer succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    std::printf("rank 0 saw: %s\n", e.what());
  }
}

// ---- The tests proper. ----

void ExpectAllPassed(const std::vector<Process>& ranks, const std::string& marker) {
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    EXPECT_EQ(ranks[rank].exit_code, 0) << "rank " << rank << ":\n" << ranks[rank].output;
    EXPECT_NE(ranks[rank].output.find(marker), std::string::npos)
        << "rank " << rank << " did not run its checks:\n"
        << ranks[rank].output;
  }
}

TEST(DataParallelTest, TwoRanksAllReduceAndBroadcastExactly) {
  if (InRankMode()) GTEST_SKIP();
  auto ranks = RunRanks("Collectives", 2, {{"STEMMA_DDP_BUCKET_MB", "1"}});
  ExpectAllPassed(ranks, "checked its collectives");
}

TEST(DataParallelTest, ThreeRanksAllReduceAndBroadcastExactly) {
  if (InRankMode()) GTEST_SKIP();
  // Three ranks exercise the general ring (unequal chunks, a forwarding broadcast hop).
  auto ranks = RunRanks("Collectives", 3, {{"STEMMA_DDP_BUCKET_MB", "1"}});
  ExpectAllPassed(ranks, "checked its collectives");
}

TEST(DataParallelTest, TwoGpuRanksAllReduceAndBroadcastExactly) {
  if (InRankMode()) GTEST_SKIP();
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  ExpectAllPassed(RunRanks("CudaCollectives", 2), "checked its CUDA collectives");
  ExpectAllPassed(RunRanks("CudaCollectives", 2, {{"STEMMA_DDP_BACKEND", "ring"}}),
                  "checked its CUDA collectives");
}

TEST(DataParallelTest, RanksRefuseMismatchedCollectives) {
  if (InRankMode()) GTEST_SKIP();
  ExpectAllPassed(RunRanks("MismatchedCall", 2), "refused: data parallel rank");
}

TEST(DataParallelTest, DeadPeerIsAnErrorNotAHang) {
  if (InRankMode()) GTEST_SKIP();
  auto ranks = RunRanks("PeerExits", 2);
  ExpectAllPassed({ranks[0]}, "rank 0 saw: data parallel rank 0");
}

// Bad environments, checked in this process.
class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (InRankMode()) GTEST_SKIP();
    for (const char* name : kNames) ::unsetenv(name);
  }
  void TearDown() override {
    for (const char* name : kNames) ::unsetenv(name);
  }
  static void Set(const std::map<std::string, std::string>& values) {
    for (const auto& [key, value] : values) ::setenv(key.c_str(), value.c_str(), 1);
  }
  static constexpr const char* kNames[] = {"RANK",
                                           "WORLD_SIZE",
                                           "MASTER_ADDR",
                                           "MASTER_PORT",
                                           "STEMMA_DDP_TIMEOUT_S",
                                           "STEMMA_DDP_BUCKET_MB",
                                           "STEMMA_DDP_BACKEND"};
};

TEST_F(EnvTest, NoEnvironmentIsOneProcessAndNoOps) {
  auto dp = DataParallel::FromEnv();
  ASSERT_TRUE(dp.ok()) << dp.status();
  EXPECT_EQ((*dp)->rank(), 0);
  EXPECT_EQ((*dp)->world_size(), 1);
  EXPECT_EQ((*dp)->AllReduceSum(2.5), 2.5);
  torch::Tensor grad = torch::full({3}, 4.0f);
  (*dp)->AllReduceMeanGradients({grad});
  EXPECT_TRUE(torch::equal(grad, torch::full({3}, 4.0f)));
}

TEST_F(EnvTest, BadSettingsNameTheVariable) {
  struct Case {
    std::map<std::string, std::string> env;
    std::string variable;
  };
  const std::vector<Case> cases = {
      {{{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_PORT", "29500"}}, "MASTER_ADDR"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}}, "MASTER_PORT"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "127.0.0.1"}}, "RANK=2"},
      {{{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}}, "RANK"},
      {{{"WORLD_SIZE", "two"}}, "WORLD_SIZE"},
      {{{"WORLD_SIZE", "0"}}, "WORLD_SIZE"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}},
       "MASTER_PORT"},
      {{{"WORLD_SIZE", "2"},
        {"RANK", "1"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "5"},
        {"STEMMA_DDP_TIMEOUT_S", "soon"}},
       "STEMMA_DDP_TIMEOUT_S"},
      {{{"WORLD_SIZE", "2"},
        {"RANK", "1"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "5"},
        {"STEMMA_DDP_BACKEND", "gloo"}},
       "STEMMA_DDP_BACKEND"},
  };
  for (const Case& c : cases) {
    SetUp();
    Set(c.env);
    auto dp = DataParallel::FromEnv();
    ASSERT_FALSE(dp.ok()) << "expected an error naming " << c.variable;
    EXPECT_EQ(dp.status().code(), absl::StatusCode::kInvalidArgument) << dp.status();
    EXPECT_NE(dp.status().message().find(c.variable), std::string::npos) << dp.status();
  }
}

TEST_F(EnvTest, UnreachableMasterTimesOutNamingIt) {
  Set({{"WORLD_SIZE", "2"},
       {"RANK", "1"},
       {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", std::to_string(FreePort())},
       {"STEMMA_DDP_TIMEOUT_S", "2"}});
  auto dp = DataParallel::FromEnv();
  ASSERT_FALSE(dp.ok());
  EXPECT_EQ(dp.status().code(), absl::StatusCode::kUnavailable) << dp.status();
  EXPECT_NE(dp.status().message().find("MASTER_ADDR=127.0.0.1"), std::string::npos) << dp.status();
}

// ---- stemma-engine train: two ranks against one process with the same global batch ----

// The JSON event lines of a process's output (stderr lines are not JSON objects).
std::vector<nlohmann::json> Events(const std::string& output) {
  std::vector<nlohmann::json> events;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    auto event = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (event.is_object() && event.contains("event")) events.push_back(event);
  }
  return events;
}

std::vector<nlohmann::json> StepEvents(const std::string& output) {
  std::vector<nlohmann::json> steps;
  for (auto& event : Events(output)) {
    if (event["event"] == "step") steps.push_back(event);
  }
  return steps;
}

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// Pseudo-words in paragraphs, the same every run.
std::string Corpus(int paragraphs) {
  std::mt19937 rng(11);
  std::string text;
  for (int p = 0; p < paragraphs; ++p) {
    const int words = 10 + static_cast<int>(rng() % 40);
    for (int w = 0; w < words; ++w) {
      const int letters = 2 + static_cast<int>(rng() % 7);
      for (int l = 0; l < letters; ++l) text += static_cast<char>('a' + rng() % 26);
      text += w + 1 < words ? " " : ".\n\n";
    }
  }
  return text;
}

TEST(DataParallelTest, TwoProcessTrainMatchesOneProcess) {
  if (InRankMode()) GTEST_SKIP();
  TempDir dir;
  const fs::path model = dir.path() / "model", tokens = dir.path() / "tokens";
  const fs::path logs = dir.path() / "logs";
  fs::create_directories(logs);
  auto setup =
      RunAll({{STEMMA_PYTHON, std::string(STEMMA_SOURCE_DIR) + "/tests/engine/ddp_make_model.py",
               model.string(), "3"}},
             {{}}, logs);
  ASSERT_EQ(setup[0].exit_code, 0) << setup[0].output;
  WriteText(dir.path() / "corpus.txt", Corpus(400));
  setup = RunAll({{STEMMA_ENGINE_BIN, "tokenize", "--tokenizer", model.string(), "--input",
                   (dir.path() / "corpus.txt").string(), "--format", "text", "--language", "xx",
                   "--out", tokens.string(), "--eos"}},
                 {{}}, logs);
  ASSERT_EQ(setup[0].exit_code, 0) << setup[0].output;

  // Global batch 4 (2 rows per rank) in 2 accumulated micro-batches, shuffled data, warmup +
  // cosine schedule, clipping and weight decay: the whole update path.
  auto write_spec = [&](const std::string& name) {
    nlohmann::json spec = {
        {"model", model.string()},
        {"out", (dir.path() / ("out-" + name)).string()},
        {"data",
         {{"datasets", {{{"path", tokens.string()}, {"weight", 1.0}}}},
          {"seq_len", 48},
          {"shuffle", true}}},
        {"batch_size", 4},
        {"grad_accum", 2},
        {"steps", 5},
        {"seed", 5},
        {"threads", 1},
        {"optimizer", {{"lr", 1e-3}, {"weight_decay", 0.1}}},
        {"schedule", {{"type", "cosine"}, {"warmup_steps", 2}}},
        {"clip_grad_norm", 1.0},
        {"log_every", 1},
    };
    const fs::path path = dir.path() / (name + ".json");
    WriteText(path, spec.dump(2));
    return path.string();
  };
  const std::string single_spec = write_spec("single"), ddp_spec = write_spec("ddp");
  const std::map<std::string, std::string> one_thread = {{"OMP_NUM_THREADS", "1"}};
  auto single = RunAll({{STEMMA_ENGINE_BIN, "train", "--spec", single_spec}}, {one_thread}, logs);
  if (single[0].output.find("train is not implemented yet") != std::string::npos) {
    GTEST_SKIP() << "this stemma-engine has no train command yet";
  }
  ASSERT_EQ(single[0].exit_code, 0) << single[0].output;

  const int port = FreePort();
  auto rank_env = [&](int rank) {
    auto env = RankEnv(rank, 2, port);
    env["OMP_NUM_THREADS"] = "1";
    return env;
  };
  auto ddp = RunAll({{STEMMA_ENGINE_BIN, "train", "--spec", ddp_spec},
                     {STEMMA_ENGINE_BIN, "train", "--spec", ddp_spec}},
                    {rank_env(0), rank_env(1)}, logs);
  ASSERT_EQ(ddp[0].exit_code, 0) << ddp[0].output;
  ASSERT_EQ(ddp[1].exit_code, 0) << ddp[1].output;

  // Rank 0 reports; its losses are the global batch's, step for step.
  const auto one = StepEvents(single[0].output), two = StepEvents(ddp[0].output);
  ASSERT_EQ(one.size(), 5u) << single[0].output;
  ASSERT_EQ(two.size(), one.size()) << ddp[0].output;
  EXPECT_TRUE(StepEvents(ddp[1].output).empty()) << "only rank 0 prints events";
  for (size_t i = 0; i < one.size(); ++i) {
    const double a = one[i]["loss"], b = two[i]["loss"];
    EXPECT_LE(std::abs(a - b), 1e-5 * std::abs(a)) << "step " << i + 1 << ": " << a << " vs " << b;
    EXPECT_EQ(one[i]["tokens"], two[i]["tokens"]) << "step " << i + 1;
    // The norm of the averaged gradient (before clipping): a sum over ranks would double it.
    const double norm_a = one[i]["grad_norm"], norm_b = two[i]["grad_norm"];
    EXPECT_LE(std::abs(norm_a - norm_b), 1e-5 * norm_a) << "step " << i + 1;
  }

  // The saved models agree to float rounding (the gradient sums differ only in order; Adam's
  // normalisation amplifies that where a gradient is near zero, hence relative to movement).
  auto a = io::CheckpointReader::Open((dir.path() / "out-single").string());
  auto b = io::CheckpointReader::Open((dir.path() / "out-ddp").string());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ((*a)->TensorNames(), (*b)->TensorNames());
  auto base = io::CheckpointReader::Open(model.string());
  ASSERT_TRUE(base.ok()) << base.status();
  for (const std::string& name : (*a)->TensorNames()) {
    torch::Tensor x = *(*a)->Tensor(name), y = *(*b)->Tensor(name);
    torch::Tensor before = *(*base)->Tensor(name);
    const double moved = (x - before).abs().max().item<double>();
    const double differ = (x - y).abs().max().item<double>();
    EXPECT_GT(moved, 0.0) << name << " was not trained";
    EXPECT_LE(differ, 5e-3 * moved) << name << ": moved " << moved << ", runs differ by " << differ;
  }
}

}  // namespace
}  // namespace stemma::engine::train
