// The spawn plan, table-tested without forking: what each kind of assignment would exec,
// with which environment and files, or why it is refused.
#include "worker/spawn_plan.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <set>
#include <string>
#include <vector>

#include "common/engine_contract.h"
#include "common/job_spec.h"

namespace stemma::worker {
namespace {

class SpawnPlanTest : public ::testing::Test {
 protected:
  SpawnPlanTest() {
    worker_env_ = {
        {"HOME", "HOME=/home/w"}, {"PATH", "PATH=/opt/bin:/usr/bin"}, {"LANG", "LANG=C.UTF-8"}};
    context_.attempts_dir = "/data/attempts";
    context_.worker_env = &worker_env_;
    context_.engine = "/opt/stemma/stemma-engine";
    context_.ignored_signals = {SIGPIPE};
    context_.devnull = 7;
    context_.is_executable = [this](const std::string& path) {
      return executables_.count(path) > 0;
    };
    config_.allow_exec = true;
  }

  static v1::Assignment Exec(std::vector<std::string> argv) {
    v1::Assignment a;
    a.set_job_id("j-1");
    a.set_attempt_id("j-1.1");
    a.set_world_size(1);
    for (auto& s : argv) a.mutable_spec()->mutable_exec()->add_argv(s);
    return a;
  }

  static v1::Assignment Torchrun() {
    v1::Assignment a = Exec({"/usr/bin/python3", "train.py"});
    a.mutable_spec()->mutable_exec()->set_launcher("torchrun");
    return a;
  }

  static v1::Assignment Train() {
    v1::Assignment a;
    a.set_job_id("j-2");
    a.set_attempt_id("j-2.3");
    a.set_world_size(1);
    a.mutable_spec()->mutable_train()->set_steps(30);
    return a;
  }

  static v1::Assignment Init() {
    v1::Assignment a;
    a.set_job_id("j-4");
    a.set_attempt_id("j-4.1");
    a.set_world_size(1);
    a.mutable_spec()->mutable_init()->set_out("base");
    return a;
  }

  std::unique_ptr<SpawnPlan> Plan(const v1::Assignment& a) {
    return PlanSpawn(a, config_, context_);
  }

  // The child's whole environment as execve would get it.
  static std::set<std::string> Envp(const SpawnPlan& p) {
    std::set<std::string> out(p.env.begin(), p.env.end());
    for (const char* e : p.inherited) out.insert(e);
    return out;
  }

  std::map<std::string, std::string> worker_env_;
  std::set<std::string> executables_;
  SpawnContext context_;
  WorkerConfig config_;
};

TEST_F(SpawnPlanTest, RefusalsSayWhyAndPlanNothingToRun) {
  struct Case {
    const char* name;
    std::function<void(v1::Assignment*, WorkerConfig*, SpawnContext*)> change;
    std::string refusal;
    bool has_workdir;
  };
  const std::vector<Case> cases = {
      {"slash in id",
       [](v1::Assignment* a, WorkerConfig*, SpawnContext*) { a->set_attempt_id("../x"); },
       "refused: attempt id '../x' is not a valid directory name", false},
      {"dot id", [](v1::Assignment* a, WorkerConfig*, SpawnContext*) { a->set_attempt_id(".."); },
       "refused: attempt id '..' is not a valid directory name", false},
      {"empty id", [](v1::Assignment* a, WorkerConfig*, SpawnContext*) { a->set_attempt_id(""); },
       "refused: attempt id '' is not a valid directory name", false},
      {"exec without --allow-exec",
       [](v1::Assignment*, WorkerConfig* c, SpawnContext*) { c->allow_exec = false; },
       "refused: exec jobs need a worker started with --allow-exec", true},
      {"empty argv",
       [](v1::Assignment* a, WorkerConfig*, SpawnContext*) {
         a->mutable_spec()->mutable_exec()->clear_argv();
       },
       "refused: exec.argv is empty", true},
      {"empty program",
       [](v1::Assignment* a, WorkerConfig*, SpawnContext*) {
         a->mutable_spec()->mutable_exec()->set_argv(0, "");
       },
       "refused: exec.argv is empty", true},
      {"no engine",
       [](v1::Assignment* a, WorkerConfig*, SpawnContext* c) {
         a->mutable_spec()->mutable_train()->set_steps(1);
         c->engine.clear();
       },
       "refused: stemma-engine not found", true},
      {"no kind",
       [](v1::Assignment* a, WorkerConfig*, SpawnContext*) { a->mutable_spec()->Clear(); },
       "refused: the job spec has no kind this worker runs", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::Assignment a = Exec({"/bin/true"});
    WorkerConfig config = config_;
    SpawnContext context = context_;
    c.change(&a, &config, &context);
    std::unique_ptr<SpawnPlan> p = PlanSpawn(a, config, context);
    EXPECT_EQ(p->refusal, c.refusal);
    EXPECT_EQ(!p->workdir.empty(), c.has_workdir);
    if (c.has_workdir) EXPECT_EQ(p->log_path, p->workdir + "/log");
    EXPECT_TRUE(p->argv.empty());
    EXPECT_TRUE(p->files.empty());
  }
}

TEST_F(SpawnPlanTest, NoopSleepsWithoutExecOrEnvironment) {
  v1::Assignment a = Exec({});
  a.mutable_spec()->mutable_noop()->set_duration_ms(-5);
  a.mutable_spec()->mutable_noop()->set_exit_code(3);
  config_.allow_exec = false;  // noop needs no --allow-exec
  std::unique_ptr<SpawnPlan> p = Plan(a);
  EXPECT_EQ(p->refusal, "");
  EXPECT_TRUE(p->noop);
  EXPECT_EQ(p->noop_ms, 0);
  EXPECT_EQ(p->noop_exit, 3);
  EXPECT_EQ(p->workdir, "/data/attempts/j-1.1");
  EXPECT_TRUE(p->env.empty());
  EXPECT_EQ(p->stdin_fd, -1);
}

TEST_F(SpawnPlanTest, ExecGetsTheContractVariablesOverTheWorkersEnvironment) {
  v1::Assignment a = Exec({"/bin/echo", "a b", "$HOME"});
  a.set_rank(2);
  a.set_world_size(4);
  a.add_gpu_ids(1);
  a.add_gpu_ids(3);
  (*a.mutable_spec()->mutable_exec()->mutable_env())["HOME"] = "/job/home";
  (*a.mutable_spec()->mutable_exec()->mutable_env())["FOO"] = "bar";
  std::unique_ptr<SpawnPlan> p = Plan(a);
  ASSERT_EQ(p->refusal, "");
  EXPECT_FALSE(p->noop);
  EXPECT_EQ(p->path, "/bin/echo");
  EXPECT_EQ(p->argv, (std::vector<std::string>{"/bin/echo", "a b", "$HOME"}));  // no shell
  EXPECT_EQ(p->workdir, "/data/attempts/j-1.1");
  EXPECT_EQ(p->stdin_fd, 7);
  EXPECT_EQ(p->reset_signals, std::vector<int>{SIGPIPE});
  EXPECT_EQ(p->Env("STEMMA_JOB_ID"), "j-1");
  EXPECT_EQ(p->Env(std::string(engine_contract::kEnvAttemptId)), "j-1.1");
  EXPECT_EQ(p->Env("STEMMA_RANK"), "2");
  EXPECT_EQ(p->Env("RANK"), "2");
  EXPECT_EQ(p->Env("WORLD_SIZE"), "4");
  EXPECT_EQ(p->Env("STEMMA_WORLD_SIZE"), "4");
  EXPECT_EQ(p->Env("LOCAL_RANK"), "0");
  EXPECT_EQ(p->Env("CUDA_VISIBLE_DEVICES"), "1,3");
  EXPECT_EQ(p->Env("STEMMA_WORKDIR"), "/data/attempts/j-1.1");
  EXPECT_EQ(p->Env("FOO"), "bar");
  EXPECT_EQ(p->Env("MASTER_ADDR"), "");  // no rendezvous
  EXPECT_EQ(p->Env("STEMMA_CPUS"), "");  // engine jobs only
  EXPECT_EQ(p->Env("OMP_WAIT_POLICY"), "");
  // The job's HOME replaces the worker's; the rest of the worker's environment is inherited.
  const std::set<std::string> envp = Envp(*p);
  EXPECT_TRUE(envp.count("HOME=/job/home"));
  EXPECT_FALSE(envp.count("HOME=/home/w"));
  EXPECT_TRUE(envp.count("LANG=C.UTF-8"));
  EXPECT_TRUE(envp.count("PATH=/opt/bin:/usr/bin"));
  EXPECT_TRUE(std::is_sorted(p->env.begin(), p->env.end()));
  EXPECT_EQ(p->exec_error, "stemma-worker: cannot execute /bin/echo: ");
  EXPECT_EQ(p->chdir_error, "stemma-worker: cannot enter /data/attempts/j-1.1\n");
}

TEST_F(SpawnPlanTest, TheWorkersTokenIsNotPassedOnAndJobsAreConfined) {
  worker_env_["STEMMA_TOKEN"] = "STEMMA_TOKEN=stm_worker_secret";
  context_.job_ruleset = 9;
  for (const v1::Assignment& a : {Exec({"/bin/env"}), Train()}) {
    auto p = Plan(a);
    ASSERT_TRUE(p->refusal.empty()) << p->refusal;
    for (const std::string& e : Envp(*p)) EXPECT_EQ(e.find("stm_worker_secret"), std::string::npos);
    EXPECT_EQ(p->ruleset_fd, 9);
    p->Seal();
    EXPECT_EQ(p->child().ruleset_fd, 9);
    EXPECT_GT(p->child().confine_error_len, 0u);
  }
  // A job's own STEMMA_TOKEN (its own secret) is its business.
  v1::Assignment own = Exec({"/bin/env"});
  (*own.mutable_spec()->mutable_exec()->mutable_env())["STEMMA_TOKEN"] = "mine";
  EXPECT_EQ(Plan(own)->Env("STEMMA_TOKEN"), "mine");
  v1::Assignment noop;
  noop.set_attempt_id("j-3.1");
  noop.mutable_spec()->mutable_noop()->set_duration_ms(1);
  EXPECT_EQ(Plan(noop)->ruleset_fd, -1);  // never execs: nothing to confine
}

TEST_F(SpawnPlanTest, ProgramsAreLookedUpOnTheChildsPath) {
  executables_ = {"/usr/bin/tool", "/opt/bin/tool", "/job/bin/tool", "./local"};
  struct Case {
    const char* name;
    std::string program;
    std::string job_path;  // empty: the job sets no PATH
    std::string want;
  };
  const std::vector<Case> cases = {
      {"worker PATH, first match", "tool", "", "/opt/bin/tool"},
      {"job PATH wins", "tool", "/job/bin:/usr/bin", "/job/bin/tool"},
      {"empty entry is the working directory", "local", ":/usr/bin", "./local"},
      {"not found: exec'd as given (ENOENT, exit 127)", "missing", "", "missing"},
      {"a path is not looked up", "bin/tool", "", "bin/tool"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::Assignment a = Exec({c.program});
    if (!c.job_path.empty())
      (*a.mutable_spec()->mutable_exec()->mutable_env())["PATH"] = c.job_path;
    std::unique_ptr<SpawnPlan> p = Plan(a);
    ASSERT_EQ(p->refusal, "");
    EXPECT_EQ(p->path, c.want);
    EXPECT_EQ(p->argv[0], c.program);
  }
  // A worker without PATH looks in the default directories.
  worker_env_.erase("PATH");
  EXPECT_EQ(Plan(Exec({"tool"}))->path, "/usr/bin/tool");
}

TEST_F(SpawnPlanTest, EngineJobsGetCommandSpecFileAndThreads) {
  config_.storage_root = "/storage";
  v1::Assignment a = Train();
  a.mutable_spec()->mutable_resources()->set_cpus(2.5);
  config_.allow_exec = false;  // engine jobs need no --allow-exec
  std::unique_ptr<SpawnPlan> p = Plan(a);
  ASSERT_EQ(p->refusal, "");
  EXPECT_EQ(p->path, "/opt/stemma/stemma-engine");
  EXPECT_EQ(p->argv, (std::vector<std::string>{"/opt/stemma/stemma-engine", "train", "--spec",
                                               "/data/attempts/j-2.3/spec.json"}));
  ASSERT_EQ(p->files.size(), 1u);
  EXPECT_EQ(p->files[0].path, "/data/attempts/j-2.3/spec.json");
  EXPECT_NE(p->files[0].content.find("\"steps\""), std::string::npos) << p->files[0].content;
  EXPECT_EQ(p->files[0].content.back(), '\n');
  EXPECT_EQ(p->Env("STEMMA_CPUS"), "3");  // rounded up
  EXPECT_EQ(p->Env("OMP_NUM_THREADS"), "3");
  EXPECT_EQ(p->Env("OMP_WAIT_POLICY"), "PASSIVE");
  EXPECT_EQ(p->Env(std::string(engine_contract::kEnvStorageRoot)), "/storage");
  EXPECT_EQ(p->Env("STEMMA_ATTEMPT_ID"), "j-2.3");

  // The worker's own OpenMP settings win; no storage root, no variable.
  worker_env_["OMP_WAIT_POLICY"] = "OMP_WAIT_POLICY=ACTIVE";
  worker_env_["OMP_NUM_THREADS"] = "OMP_NUM_THREADS=1";
  config_.storage_root.clear();
  p = Plan(Train());
  EXPECT_EQ(p->Env("OMP_WAIT_POLICY"), "");
  EXPECT_EQ(p->Env("OMP_NUM_THREADS"), "");
  EXPECT_EQ(p->Env("STEMMA_CPUS"), "1");
  EXPECT_EQ(p->Env("STEMMA_STORAGE_ROOT"), "");
  const std::set<std::string> envp = Envp(*p);
  EXPECT_TRUE(envp.count("OMP_WAIT_POLICY=ACTIVE"));
  EXPECT_TRUE(envp.count("OMP_NUM_THREADS=1"));
}

TEST_F(SpawnPlanTest, RendezvousBecomesMasterAddrAndPort) {
  struct Case {
    std::string rendezvous, addr, port;
  };
  const std::vector<Case> cases = {
      {"10.0.0.5:29500", "10.0.0.5", "29500"},
      {"[fd00::1]:29500", "fd00::1", "29500"},
      {"node-7", "node-7", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.rendezvous);
    v1::Assignment a = Exec({"/bin/true"});
    a.set_rendezvous(c.rendezvous);
    std::unique_ptr<SpawnPlan> p = Plan(a);
    EXPECT_EQ(p->Env("MASTER_ADDR"), c.addr);
    EXPECT_EQ(p->Env("MASTER_PORT"), c.port);
    EXPECT_EQ(p->Env("STEMMA_RENDEZVOUS"), c.rendezvous);
  }
}

// torchrun's variables for each process of a part of several ranks: which jobs run several,
// and RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, devices, threads, logs.
TEST_F(SpawnPlanTest, PartsOfSeveralRanksGetTorchrunsVariables) {
  struct Case {
    const char* name;
    v1::Assignment assignment;
    int ranks;  // processes per part
  };
  auto with = [](v1::Assignment a, int gpus, int ranks_per_part, double cpus, int part, int parts) {
    a.mutable_spec()->mutable_resources()->set_gpus(gpus);
    a.mutable_spec()->mutable_resources()->set_ranks_per_part(ranks_per_part);
    a.mutable_spec()->mutable_resources()->set_cpus(cpus);
    for (int g = 0; g < gpus; ++g) a.add_gpu_ids(4 + g);
    a.set_rank(part);
    a.set_world_size(parts);
    if (parts > 1) a.set_rendezvous("10.0.0.5:29600");
    return a;
  };
  const std::vector<Case> cases = {
      {"engine, 4 GPUs, one part", with(Train(), 4, 0, 4, 0, 1), 4},
      {"engine, 2 GPUs, part 1 of 3", with(Train(), 2, 2, 2, 1, 3), 2},
      {"engine on CPU, 2 ranks per part", with(Train(), 0, 2, 2, 0, 1), 2},
      {"engine on CPU, default", with(Train(), 0, 0, 2, 0, 1), 1},
      {"exec with GPUs runs one process unless asked", with(Exec({"/bin/env"}), 4, 0, 1, 0, 1), 1},
      {"exec asking for 4", with(Exec({"/bin/env"}), 4, 4, 1, 0, 1), 4},
      // launcher: torchrun (issue 23): one process per GPU, as train; ranks_per_part on CPU.
      {"exec torchrun, 4 GPUs", with(Torchrun(), 4, 0, 4, 0, 1), 4},
      {"exec torchrun, 2 GPUs, part 1 of 2", with(Torchrun(), 2, 0, 2, 1, 2), 2},
      {"exec torchrun on CPU, 3 ranks per part", with(Torchrun(), 0, 3, 3, 0, 1), 3},
      {"exec torchrun on CPU, default", with(Torchrun(), 0, 0, 1, 0, 1), 1},
      {"other engine commands run one process", with(Init(), 4, 0, 4, 0, 1), 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int part = c.assignment.rank();
    const int parts = c.assignment.world_size();
    // One past the last local rank is refused: the executor asks only for 0..ranks-1.
    EXPECT_NE(PlanSpawn(c.assignment, config_, context_, c.ranks)->refusal, "");
    for (int local = 0; local < c.ranks; ++local) {
      SCOPED_TRACE(local);
      std::unique_ptr<SpawnPlan> p = PlanSpawn(c.assignment, config_, context_, local);
      ASSERT_EQ(p->refusal, "");
      EXPECT_EQ(p->Env("RANK"), std::to_string(part * c.ranks + local));
      EXPECT_EQ(p->Env("STEMMA_RANK"), p->Env("RANK"));
      EXPECT_EQ(p->Env("WORLD_SIZE"), std::to_string(parts * c.ranks));
      EXPECT_EQ(p->Env("LOCAL_RANK"), std::to_string(local));
      EXPECT_EQ(p->Env("LOCAL_WORLD_SIZE"), std::to_string(c.ranks));
      EXPECT_EQ(p->Env("GROUP_RANK"), std::to_string(part));
      const int gpus = c.assignment.spec().resources().gpus();
      std::string devices;
      for (int g = 0; g < gpus; ++g) devices += (g > 0 ? "," : "") + std::to_string(4 + g);
      EXPECT_EQ(p->Env("CUDA_VISIBLE_DEVICES"), devices);  // all of the part's, every rank
      const std::string workdir = "/data/attempts/" + c.assignment.attempt_id();
      EXPECT_EQ(p->log_path,
                local == 0 ? workdir + "/log" : workdir + "/log." + std::to_string(local));
      EXPECT_EQ(p->workdir, workdir);  // shared, with its spec.json
      if (c.ranks > 1 || parts > 1) {
        EXPECT_NE(p->Env("MASTER_ADDR"), "");
        EXPECT_NE(p->Env("MASTER_PORT"), "");
      }
      if (parts > 1) EXPECT_EQ(p->Env("MASTER_ADDR"), "10.0.0.5");
      if (IsEngineJob(c.assignment.spec())) {
        // The part's cores are shared between its ranks; rank 0 writes the one spec.json.
        const int cores = static_cast<int>(c.assignment.spec().resources().cpus()) / c.ranks;
        EXPECT_EQ(p->Env("STEMMA_CPUS"), std::to_string(std::max(1, cores)));
        EXPECT_EQ(p->files.size(), local == 0 ? 1u : 0u);
        EXPECT_EQ(p->argv.back(), workdir + "/spec.json");
      }
    }
  }
  // Without a rendezvous from the coordinator, the ranks of one part agree on this host.
  v1::Assignment single = with(Train(), 2, 0, 2, 0, 1);
  EXPECT_EQ(Plan(single)->Env("MASTER_ADDR"), "127.0.0.1");
  EXPECT_EQ(PlanSpawn(single, config_, context_, 1)->Env("MASTER_PORT"),
            Plan(single)->Env("MASTER_PORT"));
}

// Declared outputs (issue 23): each as STEMMA_OUTPUT_<NAME>, resolved as the worker checks it
// (below the storage root when relative); the storage root itself for the program.
TEST_F(SpawnPlanTest, ExecOutputsArePassedAsVariables) {
  v1::Assignment a = Exec({"/usr/bin/python3", "eval.py"});
  auto& outputs = *a.mutable_spec()->mutable_exec()->mutable_outputs();
  outputs["results"].set_path("bob/eval/results.json");
  outputs["results"].set_type("results");
  outputs["model"].set_path("/abs/model/");
  outputs["model"].set_type("checkpoint");
  config_.storage_root = "/srv/root";
  std::unique_ptr<SpawnPlan> p = Plan(a);
  ASSERT_EQ(p->refusal, "");
  EXPECT_EQ(p->Env("STEMMA_OUTPUT_RESULTS"), "/srv/root/bob/eval/results.json");
  EXPECT_EQ(p->Env("STEMMA_OUTPUT_MODEL"), "/abs/model");
  EXPECT_EQ(p->Env("STEMMA_STORAGE_ROOT"), "/srv/root");
  EXPECT_EQ(p->cwd, "/srv/root");  // relative argv paths mean what output paths mean
  EXPECT_EQ(p->Env("STEMMA_WORKDIR"), "/data/attempts/j-1.1");
  config_.storage_root.clear();  // no root: below the attempt directory, which it runs in
  EXPECT_EQ(Plan(a)->Env("STEMMA_OUTPUT_RESULTS"), "/data/attempts/j-1.1/bob/eval/results.json");
  EXPECT_EQ(Plan(a)->cwd, "");
}

TEST_F(SpawnPlanTest, SealedChildPlanPointsIntoThePlan) {
  v1::Assignment a = Exec({"/bin/echo", "hi"});
  std::unique_ptr<SpawnPlan> p = Plan(a);
  p->Seal();
  const ChildPlan& c = p->child();
  EXPECT_STREQ(c.path, "/bin/echo");
  ASSERT_NE(c.argv, nullptr);
  EXPECT_STREQ(c.argv[0], "/bin/echo");
  EXPECT_STREQ(c.argv[1], "hi");
  EXPECT_EQ(c.argv[2], nullptr);
  size_t n = 0;
  std::set<std::string> envp;
  for (; c.envp[n] != nullptr; ++n) envp.insert(c.envp[n]);
  EXPECT_EQ(n, p->env.size() + p->inherited.size());
  EXPECT_EQ(envp, Envp(*p));
  EXPECT_STREQ(c.workdir, "/data/attempts/j-1.1");
  EXPECT_EQ(c.stdin_fd, 7);
  EXPECT_EQ(c.out_fd, -1);  // the forking thread fills it in
  EXPECT_FALSE(c.noop);
  ASSERT_EQ(c.reset_signal_count, 1u);
  EXPECT_EQ(c.reset_signals[0], SIGPIPE);
  EXPECT_EQ(std::string(c.exec_error, c.exec_error_len), p->exec_error);
  EXPECT_EQ(std::string(c.chdir_error, c.chdir_error_len), p->chdir_error);
}

}  // namespace
}  // namespace stemma::worker

namespace stemma::worker {
namespace {

// Eval's per-task cache lives in the owner's own prefix of the storage root (never shared
// between owners), is off for `cache: false` / `--force`, and only eval jobs get it; every
// engine job gets the build id the worker reports.
TEST_F(SpawnPlanTest, EvalJobsGetTheirOwnersTaskCacheUnlessCachingIsOff) {
  config_.storage_root = "/srv/store";
  config_.engine_build_id = "sha256:0123456789abcdef";
  v1::Assignment eval;
  eval.set_job_id("j-5");
  eval.set_attempt_id("j-5.1");
  eval.set_world_size(1);
  eval.mutable_spec()->mutable_eval()->set_model("m");
  auto p = Plan(eval);
  EXPECT_EQ(p->Env("STEMMA_EVAL_CACHE"), "/srv/store/.stemma-cache/eval");
  EXPECT_EQ(p->Env("STEMMA_ENGINE_BUILD_ID"), "sha256:0123456789abcdef");
  (*eval.mutable_spec()->mutable_labels())["stemma.owner"] = "alice";
  EXPECT_EQ(Plan(eval)->Env("STEMMA_EVAL_CACHE"), "/srv/store/alice/.stemma-cache/eval");
  (*eval.mutable_spec()->mutable_labels())["stemma.cache"] = "false";
  EXPECT_EQ(Plan(eval)->Env("STEMMA_EVAL_CACHE"), "");
  auto train = Plan(Train());
  EXPECT_EQ(train->Env("STEMMA_EVAL_CACHE"), "");
  EXPECT_EQ(train->Env("STEMMA_ENGINE_BUILD_ID"), "sha256:0123456789abcdef");
}

}  // namespace
}  // namespace stemma::worker
