// registry: the checkpoint registry of one real stemma-coordinator at 10,000 checkpoints.
//   1. A simulated worker (the real WorkerService protocol) runs N noop jobs in G
//      generations; each job reports one checkpoint whose parents are checkpoints of the
//      generations before it in the same experiment (a chain with merges), the first
//      generation's the shared base (registered as external). So the registry holds N + 1
//      artifacts in E experiments, and a lineage from the last generation walks ~G levels.
//   2. Q lineage queries (UserService.Lineage over gRPC) of random checkpoints, timed one
//      at a time from the client.
// Last line: {"checkpoints", "register_per_s", "lineage_p50_ms", "lineage_p99_ms",
// "lineage_nodes_mean", ...}. Target: lineage_p99_ms <= 20.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "stemma/v1/user_service.grpc.pb.h"
#include "stemma/v1/worker_service.grpc.pb.h"

namespace v1 = stemma::v1;
using Clock = std::chrono::steady_clock;

namespace {

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string CkptPath(int i) { return "/bench/ckpt/" + std::to_string(i); }

// --checkpoints N --experiments N --queries N --bin DIR; false (and a message) on another.
bool ParseFlags(int argc, char** argv, int* checkpoints, int* experiments, int* queries,
                std::string* bin) {
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--checkpoints")
      *checkpoints = std::stoi(v);
    else if (k == "--experiments")
      *experiments = std::stoi(v);
    else if (k == "--queries")
      *queries = std::stoi(v);
    else if (k == "--bin")
      *bin = v;
    else {
      std::fprintf(stderr, "registry: unknown flag %s\n", k.c_str());
      return false;
    }
  }
  return true;
}

// Polls ListWorkers for up to ~30 s; true once the coordinator answers.
bool CoordinatorAnswers(v1::UserService::Stub* user) {
  for (int i = 0; i <= 100; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    v1::ListWorkersResponse r;
    if (user->ListWorkers(&ctx, {}, &r).ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The simulated worker's session: answers every assignment at once with a finished attempt
// that publishes checkpoint c<i> (a chain per experiment, every third one past the second
// generation a merge of two), and counts the coordinator's event acks in `acked`.
void AnswerAssignments(grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream,
                       int per_generation, std::atomic<int>* acked) {
  v1::CoordinatorMessage in;
  uint64_t seq = 0;
  while (stream->Read(&in)) {
    if (in.has_event_ack()) {
      ++*acked;
      continue;
    }
    if (!in.has_assign()) continue;
    const v1::Assignment& a = in.assign();
    const int i = std::stoi(a.spec().name().substr(1));  // "c<i>"
    v1::WorkerMessage out;
    auto* started = out.mutable_events()->add_events();
    started->set_attempt_id(a.attempt_id());
    started->mutable_started()->set_pid(1);
    auto* fin = out.mutable_events()->add_events();
    fin->set_attempt_id(a.attempt_id());
    fin->set_event_seq(++seq);
    fin->mutable_finished()->set_exit_code(0);
    auto* art = fin->mutable_finished()->add_artifacts();
    art->set_name("model");
    art->set_type("checkpoint");
    art->set_path(CkptPath(i));
    art->set_manifest_sha256(std::string(56, '0') + std::to_string(10000000 + i).substr(0, 8));
    art->set_bytes(1 << 30);
    if (i < per_generation) {
      art->add_parents("/bench/base");
      art->set_operation("cpt");
    } else {
      art->add_parents(CkptPath(i - per_generation));  // the chain
      if (i >= 2 * per_generation && i % 3 == 0) {
        art->add_parents(CkptPath(i - 2 * per_generation));  // a merge
        art->set_operation("soup");
      } else {
        art->set_operation("cpt");
      }
    }
    stream->Write(out);
  }
}

// `queries` lineage queries of random checkpoints (by path, as a user would name one): their
// latencies in ms, sorted; `nodes` sums the artifacts returned, `failed` counts errors.
std::vector<double> LineageTimesMs(v1::UserService::Stub* user, int queries, int checkpoints,
                                   double* nodes, int* failed) {
  std::mt19937 rng(7);
  std::vector<double> ms;
  for (int q = 0; q < queries; ++q) {
    v1::LineageRequest req;
    req.set_id(CkptPath(rng() % checkpoints));
    grpc::ClientContext ctx;
    v1::LineageResponse resp;
    auto start = Clock::now();
    grpc::Status st = user->Lineage(&ctx, req, &resp);
    ms.push_back(MsSince(start));
    if (!st.ok()) {
      ++*failed;
      continue;
    }
    *nodes += resp.artifacts_size();
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int checkpoints = 10000, experiments = 100, queries = 2000;
  std::string bin = "build/bin";
  if (!ParseFlags(argc, argv, &checkpoints, &experiments, &queries, &bin)) return 2;
  if (checkpoints < 1 || experiments < 1 || queries < 1) {
    std::fprintf(stderr, "registry: --checkpoints, --experiments and --queries must be positive\n");
    return 2;
  }
  char tmpl[] = "/tmp/stemma-registry.XXXXXX";
  std::string dir = mkdtemp(tmpl);
  const std::string addr = "127.0.0.1:" + std::to_string(21000 + getpid() % 20000);
  pid_t coord = fork();
  if (coord == 0) {
    std::string log = dir + "/coordinator.log";
    freopen(log.c_str(), "w", stderr);
    std::string exe = bin + "/stemma-coordinator";
    execl(exe.c_str(), exe.c_str(), "--data", (dir + "/coord").c_str(), "--listen", addr.c_str(),
          "--log-level", "warn", nullptr);
    _exit(127);
  }
  auto cleanup = [&] {
    kill(coord, SIGTERM);
    waitpid(coord, nullptr, 0);
    std::string rm = "rm -rf " + dir;
    std::system(rm.c_str());
  };
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto user = v1::UserService::NewStub(channel);
  if (!CoordinatorAnswers(user.get())) {
    std::fprintf(stderr, "coordinator did not start (see %s/coordinator.log)\n", dir.c_str());
    cleanup();
    return 1;
  }

  // 1. The simulated worker: answers every assignment at once with its checkpoint.
  auto worker = v1::WorkerService::NewStub(channel);
  grpc::ClientContext wctx;
  auto stream = worker->Session(&wctx);
  {
    v1::WorkerMessage reg;
    auto* info = reg.mutable_register_()->mutable_info();
    info->set_id("sim-registry");
    info->set_cpus(100000);
    info->set_memory_mb(1 << 30);
    stream->Write(reg);
  }
  const int per_generation = experiments;
  const int generations = (checkpoints + per_generation - 1) / per_generation;
  std::atomic<int> acked{0};
  std::thread reader([&] { AnswerAssignments(stream.get(), per_generation, &acked); });
  auto t0 = Clock::now();
  for (int g = 0; g < generations; ++g) {
    v1::SubmitRequest req;
    for (int e = 0; e < per_generation; ++e) {
      const int i = g * per_generation + e;
      if (i >= checkpoints) break;
      auto* s = req.add_jobs();
      s->set_name("c" + std::to_string(i));
      s->set_experiment("exp-" + std::to_string(e));
      s->mutable_noop();
    }
    const int want = acked.load() + req.jobs_size();
    grpc::ClientContext ctx;
    v1::SubmitResponse resp;
    grpc::Status st = user->Submit(&ctx, req, &resp);
    if (!st.ok()) {
      std::fprintf(stderr, "submit: %s\n", st.error_message().c_str());
      cleanup();
      return 1;
    }
    // The next generation names these as parents: wait until they are registered.
    auto wait_start = Clock::now();
    while (acked.load() < want) {
      if (MsSince(wait_start) > 60000) {
        std::fprintf(stderr, "registry: generation %d not finished after 60 s\n", g);
        cleanup();
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  const double register_s = MsSince(t0) / 1000;
  std::printf("[registry] %d checkpoints registered in %.2f s (%d generations of %d)\n",
              checkpoints, register_s, generations, per_generation);
  std::fflush(stdout);

  // 2. Lineage queries of random checkpoints (by path, as a user would name one).
  double nodes = 0;
  int failed = 0;
  std::vector<double> ms = LineageTimesMs(user.get(), queries, checkpoints, &nodes, &failed);
  auto pct = [&](double p) {
    return ms[std::min(ms.size() - 1, static_cast<size_t>(p * ms.size()))];
  };
  v1::ListArtifactsRequest lr;
  lr.set_limit(100000);
  grpc::ClientContext lctx;
  lctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListArtifactsResponse all;
  grpc::Status lst = user->ListArtifacts(&lctx, lr, &all);
  wctx.TryCancel();
  reader.join();
  cleanup();
  std::printf("[registry] %d lineage queries, %d failed\n", queries, failed);
  std::printf(
      "{\"checkpoints\": %d, \"artifacts\": %d, \"experiments\": %d, \"register_per_s\": %.0f, "
      "\"queries\": %d, \"lineage_p50_ms\": %.3f, \"lineage_p99_ms\": %.3f, "
      "\"lineage_max_ms\": %.3f, \"lineage_nodes_mean\": %.1f, \"failed\": %d}\n",
      checkpoints, lst.ok() ? all.artifacts_size() : -1, experiments, checkpoints / register_s,
      queries, pct(0.5), pct(0.99), ms.back(), nodes / std::max(1, queries - failed), failed);
  return failed == 0 && lst.ok() ? 0 : 1;
}
