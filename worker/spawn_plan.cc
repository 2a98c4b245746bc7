#include "worker/spawn_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/auth.h"
#include "common/engine_contract.h"
#include "common/engine_spec.h"
#include "common/job_ranks.h"
#include "common/job_spec.h"
#include "worker/exec_outputs.h"

namespace stemma::worker {
namespace {

// An attempt id becomes a directory name: no separators, no dot names.
bool IsSafeComponent(const std::string& s) {
  if (s.empty() || s.size() > 255 || s == "." || s == "..") return false;
  return s.find('/') == std::string::npos && s.find('\0') == std::string::npos;
}

std::string Var(std::string_view name) { return std::string(name); }

// The worker's own token, when it came from the environment (main.cc also removes it).
constexpr char kWorkerTokenVariable[] = "STEMMA_TOKEN";

// Eval's per-task cache (engine/eval/task_cache.h): in the owner's own prefix of the storage
// root (writable under the owner's write confinement; never shared between owners, so one
// cannot plant results for another), none for `cache: false` or `--force` (the stemma.cache
// label). The engine build id goes into the task keys as into the coordinator's job keys.
void AddEvalCacheVariables(const v1::JobSpec& spec, const std::string& kind,
                           const WorkerConfig& config,
                           std::map<std::string, std::string, std::less<>>* env) {
  if (!config.engine_build_id.empty()) (*env)["STEMMA_ENGINE_BUILD_ID"] = config.engine_build_id;
  if (kind != "eval" || config.storage_root.empty()) return;
  if (auto no = spec.labels().find("stemma.cache");
      no != spec.labels().end() && no->second == "false") {
    return;
  }
  std::string dir = config.storage_root;
  if (auto owner = spec.labels().find(kOwnerLabel);
      owner != spec.labels().end() && !owner->second.empty()) {
    absl::StrAppend(&dir, "/", owner->second);
  }
  (*env)["STEMMA_EVAL_CACHE"] = absl::StrCat(dir, "/.stemma-cache/eval");
}

}  // namespace

std::string FindInPath(const std::string& name, const std::string& path_env,
                       const std::function<bool(const std::string&)>& is_executable) {
  if (!is_executable) return "";
  for (absl::string_view dir : absl::StrSplit(path_env, ':')) {
    std::string full = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (is_executable(full)) return full;
  }
  return "";
}

SpawnPlan::~SpawnPlan() {
  if (write_ruleset_fd >= 0) close(write_ruleset_fd);
}

std::string SpawnPlan::Env(const std::string& name) const {
  const std::string prefix = name + "=";
  for (const std::string& kv : env) {
    if (kv.compare(0, prefix.size(), prefix) == 0) return kv.substr(prefix.size());
  }
  return "";
}

void SpawnPlan::Seal() {
  argv_ptrs_.clear();
  envp_ptrs_.clear();
  for (std::string& a : argv) argv_ptrs_.push_back(a.data());
  argv_ptrs_.push_back(nullptr);
  for (std::string& e : env) envp_ptrs_.push_back(e.data());
  // execve does not write to the strings.
  for (const char* e : inherited) envp_ptrs_.push_back(const_cast<char*>(e));
  envp_ptrs_.push_back(nullptr);

  ChildPlan& c = child_;
  c = ChildPlan();
  c.path = path.c_str();
  c.argv = argv_ptrs_.data();
  c.envp = envp_ptrs_.data();
  c.workdir = cwd.empty() ? workdir.c_str() : cwd.c_str();
  c.stdin_fd = stdin_fd;
  c.ruleset_fd = ruleset_fd;
  c.write_ruleset_fd = write_ruleset_fd;
  c.confine_error = confine_error.data();
  c.confine_error_len = confine_error.size();
  c.noop = noop;
  c.noop_ms = noop_ms;
  c.noop_exit = noop_exit;
  c.reset_signals = reset_signals.data();
  c.reset_signal_count = reset_signals.size();
  c.chdir_error = chdir_error.data();
  c.chdir_error_len = chdir_error.size();
  c.exec_error = exec_error.data();
  c.exec_error_len = exec_error.size();
}

std::string RankLogPath(const std::string& workdir, int local_rank) {
  return local_rank == 0 ? workdir + "/log" : absl::StrCat(workdir, "/log.", local_rank);
}

// torchrun's variables and the rendezvous: the part is a node of ranks_per_part processes,
// each with its global RANK; every rank sees all the part's GPUs and binds LOCAL_RANK's.
static void AddRankVariables(const v1::Assignment& assignment, int ranks_per_part, int local_rank,
                             const std::string& workdir,
                             std::map<std::string, std::string, std::less<>>* env) {
  auto& e = *env;
  const std::string& id = assignment.attempt_id();
  const int world = std::max(1, assignment.world_size()) * ranks_per_part;
  const int rank = assignment.rank() * ranks_per_part + local_rank;
  e["CUDA_VISIBLE_DEVICES"] = absl::StrJoin(assignment.gpu_ids(), ",");
  e[Var(engine_contract::kEnvJobId)] = assignment.job_id();
  e[Var(engine_contract::kEnvAttemptId)] = id;
  e["STEMMA_RANK"] = e[Var(engine_contract::kEnvRank)] = absl::StrCat(rank);
  e["STEMMA_WORLD_SIZE"] = e[Var(engine_contract::kEnvWorldSize)] = absl::StrCat(world);
  e["LOCAL_RANK"] = absl::StrCat(local_rank);
  e["LOCAL_WORLD_SIZE"] = absl::StrCat(ranks_per_part);
  e["GROUP_RANK"] = absl::StrCat(assignment.rank());
  e[Var(engine_contract::kEnvWorkdir)] = workdir;
  std::string rv = assignment.rendezvous();
  if (rv.empty() && ranks_per_part > 1) {
    // One part of several ranks and no rendezvous from the coordinator (an older one):
    // rank 0 listens on this host, at a port derived from the attempt.
    rv = absl::StrCat("127.0.0.1:", 29500 + std::hash<std::string>()(id) % 20000);
  }
  if (!rv.empty()) {
    const size_t colon = rv.rfind(':');
    std::string host = colon == std::string::npos ? rv : rv.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    e[Var(engine_contract::kEnvMasterAddr)] = host;
    if (colon != std::string::npos) e[Var(engine_contract::kEnvMasterPort)] = rv.substr(colon + 1);
    e["STEMMA_RENDEZVOUS"] = rv;
  }
}

// An exec job's own variables, its declared outputs' paths (exec_outputs.h) and the storage
// root; a job that declares outputs starts in the storage root.
static void AddExecVariables(const v1::ExecSpec& exec, const WorkerConfig& config, SpawnPlan* plan,
                             std::map<std::string, std::string, std::less<>>* env) {
  for (const auto& [k, v] : exec.env()) (*env)[k] = v;
  for (const auto& [name, out] : exec.outputs()) {
    (*env)[ExecOutputVariable(name)] =
        ResolveExecPath(out.path(), config.storage_root, plan->workdir);
  }
  if (config.storage_root.empty()) return;
  (*env)[Var(engine_contract::kEnvStorageRoot)] = config.storage_root;
  if (exec.outputs_size() > 0) {
    plan->cwd = config.storage_root;
    plan->chdir_error = absl::StrCat("stemma-worker: cannot enter ", plan->cwd, "\n");
  }
}

std::unique_ptr<SpawnPlan> PlanSpawn(const v1::Assignment& assignment, const WorkerConfig& config,
                                     const SpawnContext& context, int local_rank) {
  auto plan = std::make_unique<SpawnPlan>();
  const std::string& id = assignment.attempt_id();
  const v1::JobSpec& spec = assignment.spec();
  if (!IsSafeComponent(id)) {
    plan->refusal = absl::StrCat("refused: attempt id '", id, "' is not a valid directory name");
    return plan;
  }
  plan->workdir = absl::StrCat(context.attempts_dir, "/", id);
  plan->log_path = RankLogPath(plan->workdir, local_rank);
  plan->chdir_error = absl::StrCat("stemma-worker: cannot enter ", plan->workdir, "\n");

  const std::string kind = JobKind(spec);
  const bool engine = IsEngineJob(spec);
  const int ranks_per_part = RanksPerPart(spec);
  if (local_rank < 0 || local_rank >= ranks_per_part) {
    plan->refusal = absl::StrCat("refused: local rank ", local_rank, " of a part of ",
                                 ranks_per_part, " ranks");
    return plan;
  }
  if (kind == "noop") {
    plan->noop = true;
    plan->noop_ms = std::max<int64_t>(0, spec.noop().duration_ms());
    plan->noop_exit = spec.noop().exit_code();
    return plan;
  }
  if (kind == "exec") {
    if (!config.allow_exec) {
      plan->refusal = "refused: exec jobs need a worker started with --allow-exec";
      return plan;
    }
    if (spec.exec().argv().empty() || spec.exec().argv(0).empty()) {
      plan->refusal = "refused: exec.argv is empty";
      return plan;
    }
    plan->argv.assign(spec.exec().argv().begin(), spec.exec().argv().end());
  } else if (engine) {
    if (context.engine.empty()) {
      plan->refusal = "refused: stemma-engine not found";
      return plan;
    }
    // The typed spec as JSON, which `stemma-engine <command> --spec` reads with the same
    // schema the coordinator checked it against.
    // One copy for all the part's ranks: the first rank's plan writes it.
    const std::string spec_path = plan->workdir + "/spec.json";
    if (local_rank == 0) plan->files.push_back({spec_path, SpecToJson(*EngineSpecOf(spec)) + "\n"});
    plan->argv = {context.engine, kind, "--spec", spec_path};
  } else {
    plan->refusal = "refused: the job spec has no kind this worker runs";
    return plan;
  }

  // The attempt's own variables; the worker's environment fills in the rest without being
  // copied for every attempt.
  static const std::map<std::string, std::string> kNoEnv;
  const std::map<std::string, std::string>& worker_env =
      context.worker_env != nullptr ? *context.worker_env : kNoEnv;
  std::map<std::string, std::string, std::less<>> env;
  if (kind == "exec") AddExecVariables(spec.exec(), config, plan.get(), &env);
  if (engine) {
    // Attempts share the node's cores. libgomp's default is to spin while waiting, which
    // starves the other attempts (training ran 13x slower with two jobs on two cores), so
    // engine jobs wait passively and use the cores they asked for. A value in the worker's
    // own environment wins.
    if (!worker_env.count("OMP_WAIT_POLICY")) env.emplace("OMP_WAIT_POLICY", "PASSIVE");
    // `cpus` are the part's: its ranks share them.
    const double cpus = spec.resources().cpus() > 0 ? spec.resources().cpus() : 1;
    const int64_t cores =
        std::max<int64_t>(1, static_cast<int64_t>(std::ceil(cpus)) / ranks_per_part);
    if (!worker_env.count("OMP_NUM_THREADS")) env.emplace("OMP_NUM_THREADS", absl::StrCat(cores));
    // A spec's `threads: 0` means the job's cores (common/engine_contract.h).
    env[Var(engine_contract::kEnvCpus)] = absl::StrCat(cores);
    if (!config.storage_root.empty()) {
      env[Var(engine_contract::kEnvStorageRoot)] = config.storage_root;
      if (spec.exec().outputs_size() > 0) {
        plan->cwd = config.storage_root;
        plan->chdir_error = absl::StrCat("stemma-worker: cannot enter ", plan->cwd, "\n");
      }
    }
    AddEvalCacheVariables(spec, kind, config, &env);
  }
  AddRankVariables(assignment, ranks_per_part, local_rank, plan->workdir, &env);
  plan->env.reserve(env.size());
  for (const auto& [k, v] : env) plan->env.push_back(absl::StrCat(k, "=", v));
  plan->inherited.reserve(worker_env.size());
  for (const auto& [k, kv] : worker_env) {
    if (k == kWorkerTokenVariable) continue;
    if (env.find(k) == env.end()) plan->inherited.push_back(kv.c_str());
  }
  plan->reset_signals = context.ignored_signals;
  plan->stdin_fd = context.devnull;
  plan->ruleset_fd = context.job_ruleset;
  plan->confine_error = "stemma-worker: cannot confine the job (Landlock)\n";

  // execvp's PATH lookup, done here (with the child's PATH) rather than in the child.
  const std::string& program = plan->argv[0];
  if (program.find('/') != std::string::npos) {
    plan->path = program;
  } else {
    std::string path_env = "/usr/local/bin:/usr/bin:/bin";
    if (auto it = env.find("PATH"); it != env.end()) {
      path_env = it->second;
    } else if (auto w = worker_env.find("PATH"); w != worker_env.end()) {
      path_env = w->second.substr(5);  // "PATH=..."
    }
    plan->path = FindInPath(program, path_env, context.is_executable);
    if (plan->path.empty()) plan->path = program;  // execve fails: ENOENT, exit 127
  }
  plan->exec_error = absl::StrCat("stemma-worker: cannot execute ", program, ": ");
  return plan;
}

}  // namespace stemma::worker
