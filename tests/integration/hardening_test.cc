// Hardening through real processes (issue 13): engine spec paths confined to the worker's
// roots, jobs no worker can ever run, a coordinator whose disk is full.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/engine_front.h"
#include "common/rpc.h"
#include "stemma/v1/user_service.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

namespace fs = std::filesystem;

// A stand-in stemma-engine found on PATH (used when no real one sits beside the worker):
// it records that it ran and succeeds, so a refused job provably never started it.
std::string FakeEngineDir(const Cluster& c) {
  const std::string dir = c.dir() + "/fake-bin";
  fs::create_directories(dir);
  const std::string engine = dir + "/stemma-engine";
  std::ofstream(engine) << "#!/bin/sh\necho \"$STEMMA_JOB_ID\" >> " << c.dir()
                        << "/engine-ran\nexit 0\n";
  fs::permissions(engine, fs::perms::owner_all);
  return dir;
}

class PathEnv {  // PATH for the processes started while it lives
 public:
  explicit PathEnv(const std::string& first)
      : old_(std::getenv("PATH") ? std::getenv("PATH") : "") {
    ::setenv("PATH", (first + ":" + old_).c_str(), 1);
  }
  ~PathEnv() { ::setenv("PATH", old_.c_str(), 1); }

 private:
  std::string old_;
};

TEST(Confinement, EngineJobPathsOutsideTheWorkersRootsAreRefusedBeforeTheEngineStarts) {
  Cluster c;
  c.StartCoordinator();
  const std::string root = c.dir() + "/srv";
  const std::string corpus = c.dir() + "/corpus";
  const std::string outside = c.dir() + "/outside";
  for (const auto& d : {root + "/models/base", corpus, outside + "/precious"})
    fs::create_directories(d);
  std::ofstream(corpus + "/en.txt") << "hello world\n";
  std::ofstream(outside + "/precious/keep.txt") << "do not delete\n";
  fs::create_directory_symlink(outside, root + "/escape");
  const std::string fake_engine = FakeEngineDir(c);
  PathEnv path(fake_engine);
  Cluster::WorkerOptions w;
  // The fake engine, not a real one beside stemma-worker (which the worker would prefer).
  w.extra = {"--storage-root", root,       "--read-root",
             corpus,           "--engine", fake_engine + "/stemma-engine"};
  c.StartWorker("w0", w);
  c.WaitForWorkers(1);

  auto tokenize = [&](const std::string& name, const std::string& input, const std::string& out,
                      bool overwrite) {
    return "name: " + name + "\nmax_attempts: 3\ntokenize: {tokenizer: models/base, input: [" +
           input + "], format: text, language: en, out: " + out +
           (overwrite ? ", overwrite: true" : "") + "}\n";
  };
  struct Case {
    std::string name, yaml, reason;
  };
  const std::vector<Case> refused = {
      {"abs", "name: abs\nmax_attempts: 3\ninit: {out: /etc/passwd}\n",
       "init.out: /etc/passwd is outside the storage root " + root},
      {"over", tokenize("over", corpus + "/en.txt", outside + "/precious", true),
       "tokenize.out: " + outside + "/precious is outside the storage root " + root},
      {"link", "name: link\nmax_attempts: 3\ninit: {out: escape/model}\n",
       "init.out: escape/model (resolves to " + fs::canonical(outside).string() +
           "/model) is outside the storage root " + root},
      {"input", tokenize("input", outside + "/precious/keep.txt", "data/en", false),
       "tokenize.input[0]: " + outside + "/precious/keep.txt is outside the storage root " + root +
           " and the read root " + corpus},
  };
  std::map<std::string, std::string> ids;
  for (const auto& k : refused) ids[k.name] = c.Submit(k.yaml, k.name + ".yaml").at(0);
  const std::string ok =
      c.Submit(tokenize("ok", corpus + "/en.txt", "data/en", false), "ok.yaml").at(0);

  for (const auto& k : refused) {
    ASSERT_EQ(c.WaitFor(ids[k.name], {"SUCCEEDED", "FAILED"}, 60), "FAILED") << k.name;
    auto job = c.Get(ids[k.name]);
    EXPECT_EQ(job["attempts"], 1) << k.name << ": a refusal is not retried";
    const std::string reason = job["reason"];
    EXPECT_NE(reason.find(k.reason), std::string::npos) << k.name << ": " << reason;
  }
  ASSERT_EQ(c.WaitFor(ok, {"SUCCEEDED", "FAILED"}, 60), "SUCCEEDED") << c.Get(ok).dump();
  // Nothing outside was touched, and the engine ran for the allowed job only.
  EXPECT_EQ(Cluster::ReadFile(outside + "/precious/keep.txt"), "do not delete\n");
  EXPECT_FALSE(fs::exists(outside + "/model"));
  if (fs::exists(c.dir() + "/engine-ran")) {
    EXPECT_EQ(Cluster::ReadFile(c.dir() + "/engine-ran"), ok + "\n");
  }

  // What anyone can see is refused at submit, naming file, line and field; nothing queued.
  const size_t before = c.Cli({"ls", "--all", "-o", "json"}).Json().size();
  for (const std::string& out : {"../../..", "/srv/../etc/x", "a//b"}) {
    auto r =
        c.Cli({"submit", "-f", c.WriteFile("bad.yaml", "name: bad\ninit: {out: '" + out + "'}\n")});
    EXPECT_NE(r.exit_code, 0) << out;
    EXPECT_NE(r.err.find("bad.yaml: line 2: init.out: "), std::string::npos) << r.err;
  }
  EXPECT_EQ(c.Cli({"ls", "--all", "-o", "json"}).Json().size(), before);
}

// A job no registered worker could ever hold says why in get and ls, follows the workers as
// they come and go, and stays QUEUED (a bigger worker may join); then it runs.
// An engine front (common/engine_front.h) without stemma-engine-torch beside it would take
// engine jobs and fail them all: the worker says which file is missing and does not start.
TEST(Engine, AWorkerWhoseFrontHasNoLibTorchEngineDoesNotStart) {
  Cluster c;
  c.StartCoordinator();
  const std::string dir = c.dir() + "/front-only";
  fs::create_directories(dir);
  std::ofstream(dir + "/stemma-engine") << "#!/bin/sh\n# " << engine_front::kFrontMarker << "\n";
  fs::permissions(dir + "/stemma-engine", fs::perms::owner_all);
  Cluster::WorkerOptions w;
  w.extra = {"--engine", dir + "/stemma-engine"};
  c.StartWorker("w0", w);
  EXPECT_EQ(c.WaitExit(c.worker_pid("w0")), 1);
  const std::string log = Cluster::ReadFile(c.dir() + "/worker-w0.log");
  EXPECT_NE(log.find(fs::canonical(dir).string() + "/stemma-engine-torch does not exist"),
            std::string::npos)
      << log;
  EXPECT_EQ(c.Cli({"workers", "-o", "json"}).out.find("w0"), std::string::npos);
}

TEST(Unplaceable, AJobTooBigForEveryWorkerSaysSoAndRunsWhenABigEnoughOneJoins) {
  Cluster c;
  c.lease_ms = 1500;
  c.StartCoordinator();
  Cluster::WorkerOptions small;
  small.gpus = 2;
  small.cpus = 4;
  c.StartWorker("small", small);
  c.WaitForWorkers(1);
  const std::string big =
      c.Submit("name: big\nresources: {gpus: 4}\nnoop: {duration_ms: 1}\n").at(0);
  const std::string wide =
      c.Submit("name: wide\nresources: {cpus: 16}\nnoop: {duration_ms: 1}\n").at(0);
  const std::string gang =
      c.Submit("name: gang\nnodes: 2\nresources: {gpus: 1}\nnoop: {duration_ms: 1}\n").at(0);
  const std::string fits =
      c.Submit("name: fits\nresources: {gpus: 2}\nnoop: {duration_ms: 1}\n").at(0);
  ASSERT_EQ(c.WaitFor(fits, {"SUCCEEDED"}), "SUCCEEDED");
  auto reason = [&](const std::string& id) { return std::string(c.Get(id)["reason"]); };
  EXPECT_EQ(c.State(big), "QUEUED");
  EXPECT_EQ(reason(big), "unplaceable: needs 4 GPUs, the largest worker has 2");
  EXPECT_EQ(reason(wide), "unplaceable: needs 16 CPUs, the largest worker has 4 CPUs");
  EXPECT_EQ(reason(gang),
            "unplaceable: needs 2 workers with 1 GPU, 1 CPU each; 1 registered worker has that");
  EXPECT_EQ(reason(fits), "");
  // The listing carries it too.
  auto ls = c.Cli({"ls"});
  EXPECT_NE(ls.out.find("unplaceable: needs 4 GPUs, the largest worker has 2"), std::string::npos)
      << ls.out;

  // A second small worker makes the gang placeable; the others still cannot run.
  c.StartWorker("small2", small);
  c.WaitForWorkers(2);
  ASSERT_EQ(c.WaitFor(gang, {"SUCCEEDED"}), "SUCCEEDED");
  EXPECT_EQ(reason(big), "unplaceable: needs 4 GPUs, the largest worker has 2");
  // A big worker joins: the big job runs.
  Cluster::WorkerOptions large;
  large.gpus = 8;
  large.cpus = 4;
  c.StartWorker("large", large);
  ASSERT_EQ(c.WaitFor(big, {"SUCCEEDED"}), "SUCCEEDED");
  EXPECT_EQ(reason(wide), "unplaceable: needs 16 CPUs, the largest worker has 4 CPUs");
  // Workers leave (lost after their lease): the reason follows what is registered.
  c.KillWorker("large");
  c.KillWorker("small2");
  const std::string big2 =
      c.Submit("name: big2\nresources: {gpus: 4}\nnoop: {duration_ms: 1}\n").at(0);
  EXPECT_TRUE(c.WaitUntil(
      [&] { return reason(big2) == "unplaceable: needs 4 GPUs, the largest worker has 2"; }, 30))
      << reason(big2);
  EXPECT_EQ(c.State(big2), "QUEUED");
}

// A small tmpfs for the coordinator's data (needs mount: root or CAP_SYS_ADMIN), detached
// when the test ends.
class SmallDisk {
 public:
  SmallDisk(const std::string& dir, const std::string& size) : dir_(dir) {
    fs::create_directories(dir);
    const std::string options = "size=" + size;
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

int JobCount(const Cluster& c) {
  return static_cast<int>(c.Cli({"ls", "--all", "-o", "json"}).Json().size());
}

// The coordinator's disk fills up under a job's log: the log ends with a marker line, the
// job's own end is still recorded, a submit is refused at once with RESOURCE_EXHAUSTED and
// says the disk is full (nothing half-kept), and once space is back submits work again.
TEST(DiskFull, TheCoordinatorsDiskFillingUpIsSaidAndNothingIsHalfCommitted) {
  Cluster c;
  SmallDisk disk(c.coordinator_data(), "24m");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  c.StartCoordinator();
  c.StartWorker("w0");
  c.WaitForWorkers(1);
  const std::string first = c.Submit("name: first\nnoop: {duration_ms: 1}\n").at(0);
  ASSERT_EQ(c.WaitFor(first, {"SUCCEEDED"}), "SUCCEEDED");

  // ~40 MB of log: more than the disk holds.
  const std::string loud = c.Submit(
                                "name: loud\nexec: {argv: [/bin/sh, -c, 'yes "
                                "stemma-log-line-0123456789 | head -c 40000000; echo done']}\n")
                               .at(0);
  ASSERT_EQ(c.WaitFor(loud, {"SUCCEEDED", "FAILED"}, 120), "SUCCEEDED") << c.Get(loud).dump();
  ASSERT_TRUE(c.WaitUntil(
      [&] {
        std::string text = c.Cli({"logs", loud}).out;
        return text.size() > 100 &&
               text.substr(text.size() - 40).find("[stemma: log truncated: disk full]") !=
                   std::string::npos;
      },
      60));
  auto logs = c.Cli({"logs", loud});
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_NE(logs.out.rfind("\n[stemma: log truncated: disk full]\n"), std::string::npos);
  EXPECT_EQ(logs.out.find("done"), std::string::npos);  // nothing after the cut
  EXPECT_NE(Cluster::ReadFile(c.dir() + "/coordinator.log").find("log truncated at"),
            std::string::npos);

  // A submit now: refused at once (a hang would hit the CLI's timeout and say something else).
  const int before = JobCount(c);
  auto refused = c.Cli(
      {"--timeout", "10", "submit", "-f", c.WriteFile("more.yaml", "name: more\nnoop: {}\n")});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("the coordinator's disk is full"), std::string::npos) << refused.err;
  EXPECT_EQ(refused.err.find("may have been committed"), std::string::npos) << refused.err;
  {  // the status code on the wire
    auto stub = v1::UserService::NewStub(
        grpc::CreateChannel(c.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitRequest request;
    request.add_jobs()->mutable_noop()->set_duration_ms(1);
    v1::SubmitResponse response;
    grpc::Status st = stub->Submit(&ctx, request, &response);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  }
  EXPECT_EQ(JobCount(c), before);
  // Reads keep working.
  EXPECT_EQ(c.State(first), "SUCCEEDED");

  // Space comes back (the operator removes the log segments, which the coordinator no longer
  // holds open): submits work again.
  for (const auto& e : fs::directory_iterator(c.coordinator_data() + "/logs")) {
    if (e.path().extension() == ".seg") fs::remove(e.path());
  }
  std::string again_id;
  ASSERT_TRUE(c.WaitUntil(
      [&] {
        auto r = c.Cli({"--timeout", "10", "submit", "-f",
                        c.WriteFile("again.yaml", "name: again\nnoop: {}\n")});
        if (r.exit_code == 0) again_id = r.out.substr(0, r.out.find(' '));
        return r.exit_code == 0;
      },
      30));
  EXPECT_EQ(c.WaitFor(again_id, {"SUCCEEDED"}), "SUCCEEDED");
  EXPECT_EQ(JobCount(c), before + 1);
  c.KillCoordinator(SIGTERM);
  EXPECT_EQ(RunShell("sqlite3 " + c.coordinator_data() + "/stemma.db 'PRAGMA integrity_check'"),
            "ok\n");
}

// `stemma wait` on many jobs resolves them from the listing (not one round trip each, which
// cost more than the jobs over TLS): ids, a name (its most recent job) and an unknown id.
TEST(ManyIds, WaitOnManyJobsResolvesIdsAndNamesAndNamesAnUnknownOne) {
  Cluster c;
  c.StartCoordinator();
  c.StartWorker("w0");
  c.WaitForWorkers(1);
  std::string yaml = "jobs:\n";
  for (int i = 0; i < 40; ++i)
    yaml += "  - {name: n" + std::to_string(i) + ", noop: {duration_ms: 1}}\n";
  std::vector<std::string> ids = c.Submit(yaml);
  ASSERT_EQ(ids.size(), 40u);
  const std::string again = c.Submit("name: n3\nnoop: {duration_ms: 1, exit_code: 3}\n").at(0);
  std::vector<std::string> args = {"wait"};
  args.insert(args.end(), ids.begin(), ids.end());
  auto ok = c.Cli(args);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  args.push_back("n3");  // the most recent n3, which fails
  auto named = c.Cli(args);
  EXPECT_EQ(named.exit_code, 1) << named.err;
  EXPECT_NE(named.err.find(again), std::string::npos) << named.err;
  args.back() = "j-999999";
  auto unknown = c.Cli(args);
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.err.find("j-999999"), std::string::npos) << unknown.err;
}

}  // namespace
}  // namespace stemma::testing
