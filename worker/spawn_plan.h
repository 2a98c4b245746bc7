// The spawn plan: everything the worker decides about an attempt before it forks, computed
// by one pure function from the assignment, the worker's configuration and what the
// executor found about its host (SpawnContext). The plan says what to exec (program, argv,
// environment with the STEMMA_* variables of common/engine_contract.h, working directory,
// stdin, signals to reset), which files the attempt directory gets before the fork
// (spec.json for engine jobs), or why the attempt is refused. No I/O, no clock, no lock:
// table-tested without forking (spawn_plan_test).
//
// Today the worker applies no rlimits, cgroups or cpusets to an attempt; when it does,
// they are decided here too, and the child side (spawn_child.h) only applies them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stemma/v1/worker_service.pb.h"
#include "worker/config.h"
#include "worker/spawn_child.h"

namespace stemma::worker {

// What the executor knows about its host, read once or per launch, that the plan uses.
struct SpawnContext {
  std::string attempts_dir;  // absolute DATA/attempts
  // The worker's environment, name -> "NAME=value": the base of every child's environment.
  // Must outlive the plan (the plan points into it).
  const std::map<std::string, std::string>* worker_env = nullptr;
  // stemma-engine as the executor found it (beside the worker, --engine, PATH); empty: none.
  // Only looked at for engine jobs.
  std::string engine;
  // Signals the worker ignores: the child resets them to their defaults before exec.
  std::vector<int> ignored_signals;
  int devnull = -1;  // the executor's /dev/null, the child's stdin; -1: none
  // The Landlock rule set exec and engine children restrict themselves to
  // (WorkerConfig::job_ruleset_fd); -1: none.
  int job_ruleset = -1;
  // True if `path` names an executable regular file: the PATH lookup of an exec job's
  // program (done before the fork, with the child's PATH, instead of execvp in the child).
  // Null: no lookup (the program name is exec'd as given).
  std::function<bool(const std::string& path)> is_executable;
};

struct SpawnPlan {
  SpawnPlan() = default;
  ~SpawnPlan();
  // The sealed child plan points into this object: it is neither copied nor moved.
  SpawnPlan(const SpawnPlan&) = delete;
  SpawnPlan& operator=(const SpawnPlan&) = delete;

  // Non-empty: the attempt must not run here, and no retry can change that ("refused: ...").
  std::string refusal;

  // The attempt directory, attempts_dir/<attempt id>, and its log. Empty when the attempt id
  // cannot be a directory name (then `refusal` says so).
  std::string workdir;
  std::string log_path;
  // Where the child starts when not in workdir: an exec job that declares outputs runs in the
  // storage root, so that the relative paths of its argv mean what its inputs, code and
  // outputs mean (exec_outputs.h); STEMMA_WORKDIR still names the attempt directory.
  std::string cwd;
  // Files the executor writes into workdir before the fork (engine jobs: spec.json).
  struct File {
    std::string path;
    std::string content;
  };
  std::vector<File> files;

  // A noop job: the child sleeps noop_ms and exits with noop_exit, without exec.
  bool noop = false;
  int64_t noop_ms = 0;
  int noop_exit = 0;

  // Otherwise the program for execve (PATH already looked up), its argv, and the attempt's
  // own variables ("NAME=value", sorted by name); `inherited` are the worker's variables it
  // does not override, pointing into SpawnContext::worker_env.
  std::string path;
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::vector<const char*> inherited;
  std::vector<int> reset_signals;  // the worker's ignored signals, reset before exec
  int stdin_fd = -1;
  int ruleset_fd = -1;        // SpawnContext::job_ruleset for exec and engine jobs
  int write_ruleset_fd = -1;  // the attempt's own write rule set (owned here: closed with it)
  std::string confine_error;  // written to the log when the child cannot restrict itself
  std::string chdir_error;    // written to the log when chdir fails
  std::string exec_error;     // written to the log when execve fails, before the errno text

  // The value of one of the attempt's own variables; empty if it does not set it.
  std::string Env(const std::string& name) const;

  // Builds the pointer arrays the child reads and the child's plan (its out_fd and parent
  // still to be filled in by the forking thread). Call once, after the last change: the
  // child's plan points into this one, which must outlive the child's exec.
  void Seal();
  const ChildPlan& child() const { return child_; }

 private:
  std::vector<char*> argv_ptrs_;
  std::vector<char*> envp_ptrs_;
  ChildPlan child_;
};

// The plan for one attempt. Pure: reads only its arguments.
//
// Refusals, in this order: an attempt id that is not a directory name; an exec job on a
// worker without --allow-exec, or with an empty argv; an engine job without stemma-engine;
// a spec with no kind this worker runs.
//
// The worker's own credential ($STEMMA_TOKEN) is never passed on, whatever the worker's
// environment holds.
//
// A part of several ranks (common/job_ranks.h: RanksPerPart) gets one plan per process,
// `local_rank` 0 .. ranks-1, as torchrun starts them: RANK = part rank x ranks + local rank,
// WORLD_SIZE = parts x ranks, LOCAL_RANK, LOCAL_WORLD_SIZE = ranks, GROUP_RANK = the part's
// rank, MASTER_ADDR/MASTER_PORT from the rendezvous (or 127.0.0.1 and a port derived from
// the attempt id when the coordinator sent none), every rank the part's CUDA_VISIBLE_DEVICES,
// and each OMP_NUM_THREADS/STEMMA_CPUS = the part's cores / ranks. They share the attempt
// directory and its spec.json (written by rank 0's plan); each has its own log
// (RankLogPath).
std::unique_ptr<SpawnPlan> PlanSpawn(const v1::Assignment& assignment, const WorkerConfig& config,
                                     const SpawnContext& context, int local_rank = 0);

// The log of local rank `local_rank` in attempt directory `workdir`: "log" for rank 0 (the
// attempt's log), "log.<n>" for the others.
std::string RankLogPath(const std::string& workdir, int local_rank);

// The first `dir/name` along `path_env` (':'-separated, empty entries meaning ".") for which
// `is_executable` holds; empty if none.
std::string FindInPath(const std::string& name, const std::string& path_env,
                       const std::function<bool(const std::string&)>& is_executable);

}  // namespace stemma::worker
